"""What can be run: each task code with its summary and the JSON schema of its params
(from the TaskUnit's own ``Params`` model, without the params only Artemis sets)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from artemis.tasks.registry import get_task, task_codes
from starter.api.envelope import envelope
from starter.api.schemas import INVALID, Envelope, TaskType, documented

router = APIRouter(tags=["task types"])


def describe(code: str) -> dict[str, Any]:
    task = get_task(code)  # TASK_NOT_FOUND (404) for an unknown code
    schema = task.Params.model_json_schema()
    for name in task.internal_params:
        schema.get("properties", {}).pop(name, None)
        if name in schema.get("required", []):
            schema["required"].remove(name)
    return TaskType(code=code, summary=task.summary, params_schema=schema).model_dump()


@router.get(
    "/task-types",
    summary="Every task code, its summary and the JSON schema of its params",
    responses={200: {"model": Envelope[list[TaskType]], "description": "the task types"}},
)
async def list_task_types(request: Request) -> JSONResponse:
    return envelope(request, [describe(code) for code in task_codes()])


@router.get(
    "/task-types/{code}",
    summary="One task code, its summary and the JSON schema of its params",
    responses={
        **documented(TaskType),
        404: {"model": Envelope[None], "description": "TASK_NOT_FOUND"},
        **INVALID,
    },
)
async def get_task_type(code: str, request: Request) -> JSONResponse:
    return envelope(request, describe(code))
