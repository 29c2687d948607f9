"""The Temporal codec server protocol (``POST /codec/decode`` and ``/codec/encode``, body
``{"payloads": [...]}`` in proto JSON), so the Temporal UI can show encrypted payloads to
operators. Only when ``temporal.payload_encryption`` is on; behind the API tokens like
every route (the UI can forward its access token)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from artemis.errors import ArtemisError, ErrorCode
from starter.api.envelope import read_json
from workers.codec import codec_for

router = APIRouter(tags=["codec"])


async def _apply(request: Request, direction: str) -> JSONResponse:
    codec = codec_for(request.app.state.settings)
    if codec is None:
        raise ArtemisError(
            ErrorCode.NOT_FOUND, "payload encryption is off (temporal.payload_encryption)"
        )
    raw = await read_json(request)
    try:
        payloads = json_format.ParseDict(raw or {}, Payloads())
    except json_format.ParseError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"body: not Temporal payloads: {e}") from None
    try:
        done = await (codec.decode if direction == "decode" else codec.encode)(payloads.payloads)
    except ValueError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, str(e)) from None
    return JSONResponse(json_format.MessageToDict(Payloads(payloads=done)))


@router.post("/codec/decode", summary="Temporal codec server: decrypt payloads")
async def decode(request: Request) -> JSONResponse:
    return await _apply(request, "decode")


@router.post("/codec/encode", summary="Temporal codec server: encrypt payloads")
async def encode(request: Request) -> JSONResponse:
    return await _apply(request, "encode")
