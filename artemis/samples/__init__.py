"""Bundled sample servers (SPEC §13): they behave like the outside world for the demo,
the tests and the benchmarks."""
