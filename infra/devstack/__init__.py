"""The top of the import graph: the embedded dev stack (`stack.py`) and the full `artemis`
command (`cli.py`), which adds the commands that run a worker (`worker`, `dev`, `demo`) to
the starter's CLI. It imports `starter` and `workers`; neither imports it."""
