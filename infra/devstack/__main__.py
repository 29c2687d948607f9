"""`python -m infra.devstack …`, the same as `artemis …`."""

from infra.devstack.cli import main

main()
