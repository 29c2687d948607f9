"""`python -m starter.cli …`, the same as `artemis …`."""

from starter.cli import main

main()
