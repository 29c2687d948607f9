"""Temporal as every process sees it, kept out of the domain package ``artemis/``: the
client and its data converter (``client``), the payload codec (``codec``), how a closed
run ended (``runs``). Shared by the workers, the API and the CLI, so none of them imports
another's package."""
