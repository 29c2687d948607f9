"""Dependencies shared by the routes: settings and the run service (Temporal client)."""

from __future__ import annotations

from fastapi import Depends, Path, Request

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.owners import task_id_for
from artemis.temporal.client import connect
from starter.api.auth import principal, require_token
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


async def caller_task_id(
    request: Request, task_id: str = Path(max_length=300), _: None = Depends(require_token)
) -> str:
    """The full task id the caller means by the path's ``task_id`` (``artemis.owners``): its
    own run's for a bare id; another owner's run only for an operator or admin (to a
    client it does not exist: 404)."""
    who = principal(request)
    return task_id_for(who.name, who.sees_all, task_id)
