"""`python -m infra.devstack …`, the same as `artemis …`."""

from starter.cli import main

main()
