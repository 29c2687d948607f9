"""The Temporal codec server protocol (``POST /codec/decode`` and ``/codec/encode``, body
``{"payloads": [...]}`` in proto JSON), so the Temporal UI can show encrypted payloads to
operators. Only when ``temporal.payload_encryption`` is on; behind the API tokens like
every route (the UI can forward its access token)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse
from google.protobuf import json_format
from pydantic import BaseModel, Field
from temporalio.api.common.v1 import Payloads

from artemis.errors import ArtemisError, ErrorCode
from artemis.temporal.codec import codec_for
from starter.api.schemas import INVALID

router = APIRouter(tags=["codec"])


class CodecPayloads(BaseModel):
    """Temporal payloads in proto JSON: ``metadata`` (base64 values) and ``data``."""

    payloads: list[dict[str, Any]] = Field(
        default_factory=list,
        examples=[[{"metadata": {"encoding": "anNvbi9wbGFpbg=="}, "data": "eyJhIjoxfQ=="}]],
    )


ANSWER: dict[int | str, dict[str, Any]] = {
    200: {"model": CodecPayloads, "description": "the payloads, decoded or encoded"}
}


async def _apply(request: Request, body: CodecPayloads, direction: str) -> JSONResponse:
    codec = codec_for(request.app.state.settings)
    if codec is None:
        raise ArtemisError(
            ErrorCode.NOT_FOUND, "payload encryption is off (temporal.payload_encryption)"
        )
    try:
        payloads = json_format.ParseDict(body.model_dump(), Payloads())
    except json_format.ParseError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"body: not Temporal payloads: {e}") from None
    try:
        done = await (codec.decode if direction == "decode" else codec.encode)(payloads.payloads)
    except ValueError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, str(e)) from None
    return JSONResponse(json_format.MessageToDict(Payloads(payloads=done)))


@router.post(
    "/codec/decode",
    summary="Temporal codec server: decrypt payloads",
    responses={**ANSWER, **INVALID},
)
async def decode(request: Request, body: CodecPayloads = Body(...)) -> JSONResponse:
    return await _apply(request, body, "decode")


@router.post(
    "/codec/encode",
    summary="Temporal codec server: encrypt payloads",
    responses={**ANSWER, **INVALID},
)
async def encode(request: Request, body: CodecPayloads = Body(...)) -> JSONResponse:
    return await _apply(request, body, "encode")
