"""`python -m starter.cli …`: the starter's commands (`python -m infra.devstack …` is the full
`artemis`, with `worker`, `dev` and `demo`)."""

from starter.cli import main

main()
