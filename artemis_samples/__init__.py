"""Bundled sample servers: they behave like the outside world for the demo,
the tests and the benchmarks."""
