"""`python -m devstack …`, the same as `artemis …`."""

from devstack.cli import main

main()
