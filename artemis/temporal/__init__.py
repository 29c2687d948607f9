"""Temporal's client side, as every process sees it (the domain holds no worker
code; this is none): the client and its data converter (``client``), the payload codec
(``codec``), how a closed run ended (``runs``) and how a failure reads (``failures``).
Shared by the workers, the API and the CLI, so none of them imports another's package."""
