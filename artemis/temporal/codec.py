"""Optional encryption of every Temporal payload (``temporal.payload_encryption``).

Workflow inputs, results, activity arguments, heartbeat details and signals are Fernet-
encrypted by the SDK's payload codec before they leave the process, with a key derived
from ``COOKIE_MASTER_KEY`` (purpose ``temporal-payloads``): the Temporal server, its
database and anyone reading a history without the key see ``binary/encrypted`` blobs.
The starter serves the codec endpoints (``POST /codec/decode``, ``/codec/encode``) so the
Temporal UI can show them to operators (``artemis dev`` points the UI at it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from artemis.vault import derive_multi, master_keys

if TYPE_CHECKING:
    from artemis.config import Settings

ENCODING = b"binary/encrypted"
KEY_ID = b"hkdf-sha256-v1"


class FernetPayloadCodec(PayloadCodec):
    def __init__(self, fernet: Fernet | MultiFernet) -> None:
        self.fernet = fernet

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload(
                metadata={"encoding": ENCODING, "encryption-key-id": KEY_ID},
                data=self.fernet.encrypt(p.SerializeToString()),
            )
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            if p.metadata.get("encoding", b"") != ENCODING:
                out.append(p)  # written before encryption was turned on
                continue
            try:
                out.append(Payload.FromString(self.fernet.decrypt(p.data)))
            except InvalidToken:
                raise ValueError(
                    "a Temporal payload does not decrypt with this COOKIE_MASTER_KEY"
                ) from None
        return out


def codec_for(settings: Settings) -> FernetPayloadCodec | None:
    if not settings.temporal.payload_encryption:
        return None
    # Payloads stay in histories: the previous master keys keep them readable after a
    # rotation, new ones are written under COOKIE_MASTER_KEY.
    masters = master_keys(settings.vault.master_key_file)
    return FernetPayloadCodec(derive_multi(masters, "temporal-payloads"))
