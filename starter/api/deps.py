"""Dependencies shared by the routes: settings and the run service (Temporal client)."""

from __future__ import annotations

from fastapi import Request

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.temporal.client import connect
from starter.service import RunService


async def get_settings(request: Request) -> Settings:
    # async: FastAPI would run a plain function in its thread pool, a thread's round
    # trip on every request for an attribute read
    return request.app.state.settings


async def get_service(request: Request) -> RunService:
    app = request.app
    if app.state.service is None:
        try:
            client = await connect(app.state.settings)
        except ArtemisError:
            raise
        except Exception as e:
            raise ArtemisError(ErrorCode.NOT_READY, f"Temporal unavailable: {e}") from None
        app.state.service = RunService(client, app.state.settings)
    return app.state.service
