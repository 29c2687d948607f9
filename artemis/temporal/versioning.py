"""Worker Versioning: each worker build polls as one Worker Deployment Version.

A task run is pinned to the build it started on, so a build that changes a run's
sequence of commands needs no patch: the runs of the build before it finish on that
build's workers, and new runs start on whichever build is current. The housekeeping
loops move to the current build (they auto-upgrade).

The build id is derived from the code the workflows execute (``code_build_id``): two
builds whose workflow code differs never share an id, so a pinned run never meets
changed code.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import temporalio
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentResponse,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from artemis.errors import ArtemisError, ErrorCode

ROOT = Path(__file__).resolve().parents[2]
# The packages whose modules can be part of what a workflow executes. Activities are
# referenced by workflows by name only: their code runs outside the workflow, so
# ``activities`` is not followed (a renamed activity changes the workflow's source).
FOLLOWED = ("workflows", "artemis")
START = "workflows"


def _module_file(name: str, root: Path = ROOT) -> Path | None:
    parts = name.split(".")
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, name: str, root: Path) -> set[str]:
    """The project modules ``path`` (module ``name``) imports, with their packages."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    modules: set[str] = set()
    for module in found:
        if module.split(".")[0] not in FOLLOWED:
            continue
        parts = module.split(".")
        for i in range(1, len(parts) + 1):  # a module's packages run their __init__
            prefix = ".".join(parts[:i])
            if _module_file(prefix, root) is not None:
                modules.add(prefix)
    return modules


def workflow_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every project module the workflows import, directly or not (``activities`` and
    everything outside ``FOLLOWED`` aside), by name."""
    seen: dict[str, Path] = {}
    todo = [
        f"{START}.{p.stem}" if p.name != "__init__.py" else START
        for p in sorted((root / START).glob("*.py"))
    ]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name, root)
        if path is None:
            continue
        seen[name] = path
        todo.extend(_imports(path, name, root) - seen.keys())
    return seen


@lru_cache(maxsize=4)
def code_build_id(root: Path = ROOT) -> str:
    """The default build id: a digest of every module the workflows execute and of the
    Temporal SDK's version (which decides how a history is replayed)."""
    digest = hashlib.sha256(f"temporalio {temporalio.__version__}\n".encode())
    for name, path in sorted(workflow_modules(root).items()):
        digest.update(f"{name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class Build:
    """The Worker Deployment Version a worker polls as."""

    deployment: str
    build_id: str

    @property
    def version(self) -> WorkerDeploymentVersion:
        return WorkerDeploymentVersion(deployment_name=self.deployment, build_id=self.build_id)

    def config(self) -> WorkerDeploymentConfig:
        return WorkerDeploymentConfig(version=self.version, use_worker_versioning=True)

    def __str__(self) -> str:
        return f"{self.deployment}/{self.build_id}"


def build_of(deployment: str, build_id: str | None) -> Build:
    """The version a worker of ``deployment`` polls as: ``build_id``, else the code's own.
    A ``.`` is refused in either (Temporal joins them with one)."""
    build = Build(deployment, build_id or code_build_id())
    named = (("temporal.deployment_name", deployment), ("worker.build_id", build.build_id))
    for field, value in named:
        if not value or "." in value:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"{field} {value!r} must be non-empty and contain no '.'",
            )
    return build


# What a deployment answers while it is busy or briefly unreachable: asked again. A
# loaded server also cuts a call short (CANCELLED, DEADLINE_EXCEEDED); asking again is
# safe, as a change carries the conflict token of what it read.
BUSY = (
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.CANCELLED,
    RPCStatusCode.DEADLINE_EXCEEDED,
)


async def describe(client: Client, deployment: str) -> DescribeWorkerDeploymentResponse | None:
    """The deployment as Temporal has it; None while no worker of it has polled."""
    try:
        return await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
        )
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


def current_build(info: DescribeWorkerDeploymentResponse | None) -> str | None:
    """The build id new runs start on; None when there is none (unversioned)."""
    if info is None:
        return None
    current = info.worker_deployment_info.routing_config.current_deployment_version
    return current.build_id or None


def _has(info: DescribeWorkerDeploymentResponse | None, build_id: str) -> bool:
    return info is not None and any(
        s.deployment_version.build_id == build_id
        for s in info.worker_deployment_info.version_summaries
    )


async def make_current(
    client: Client,
    build: Build,
    *,
    replace: bool = False,
    polled: bool = True,
    timeout: float = 60.0,
) -> str:
    """Make ``build`` the current version when the deployment has none, or, with
    ``replace``, whatever is current; returns the build current afterwards.

    ``polled``: the build is this process's own, whose workers are starting: it is set
    without waiting for Temporal to have seen them poll. Otherwise (an operator naming a
    build) Temporal must list the build first, so that new runs never go to a build no
    worker serves. Several workers starting at once: the first change wins, the others
    see it done (the conflict token)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pause = 0.05
    while True:
        try:
            info = await describe(client, build.deployment)
        except RPCError as e:
            # Temporal rate-limits the requests to one deployment ("too many requests
            # issued to Worker Deployment"), as when several workers start at once.
            if e.status not in BUSY or loop.time() > deadline:
                raise
            info = None
        else:
            current = current_build(info)
            if current is not None and (current == build.build_id or not replace):
                return current
            if (polled or _has(info, build.build_id)) and await _set_current(
                client, build, info, polled
            ):
                pause = 0.0
        if loop.time() > deadline:
            raise ArtemisError(
                ErrorCode.INTERNAL,
                f"Temporal did not list worker build {build} within {timeout:.0f} s"
                " (is a worker of it running?)",
            )
        await asyncio.sleep(pause)
        pause = min(max(pause * 2, 0.05), 1.0)


async def _set_current(
    client: Client, build: Build, info: DescribeWorkerDeploymentResponse | None, polled: bool
) -> bool:
    """Ask Temporal to make ``build`` current; False when another worker changed the
    deployment first or it is busy (look again)."""
    try:
        await client.workflow_service.set_worker_deployment_current_version(
            SetWorkerDeploymentCurrentVersionRequest(
                namespace=client.namespace,
                deployment_name=build.deployment,
                build_id=build.build_id,
                conflict_token=info.conflict_token if info is not None else b"",
                # a provenance queue the build before polled and this one not yet
                ignore_missing_task_queues=True,
                allow_no_pollers=polled,
            )
        )
    except RPCError as e:
        if e.status not in (
            RPCStatusCode.FAILED_PRECONDITION,
            RPCStatusCode.ABORTED,
            RPCStatusCode.ALREADY_EXISTS,
            *BUSY,
        ):
            raise
        return False
    return True


def worker_build(deployment_name: str | None, task_queue: str, build_id: str | None) -> Build:
    """The version this process's workers poll as, from ``temporal.deployment_name``
    (default: the task queue) and ``worker.build_id`` (default: ``code_build_id``)."""
    return build_of(deployment_name or task_queue, build_id)


async def drainage(client: Client, build: Build) -> str:
    """Whether runs are still pinned to ``build``: UNSPECIFIED while it is current (or
    never was), DRAINING while runs pinned to it are open, DRAINED when none are."""
    from temporalio.api.deployment.v1 import WorkerDeploymentVersion as VersionProto
    from temporalio.api.enums.v1 import VersionDrainageStatus
    from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentVersionRequest

    r = await client.workflow_service.describe_worker_deployment_version(
        DescribeWorkerDeploymentVersionRequest(
            namespace=client.namespace,
            deployment_version=VersionProto(
                deployment_name=build.deployment, build_id=build.build_id
            ),
        )
    )
    status = r.worker_deployment_version_info.drainage_info.status
    return VersionDrainageStatus.Name(status).removeprefix("VERSION_DRAINAGE_STATUS_")


# A worker long-polls for up to a minute: a build polled within this long has a worker.
POLLED_WITHIN_S = 90.0


async def polled_builds(client: Client, task_queue: str) -> set[str]:
    """The builds whose workers poll ``task_queue`` for workflow tasks now."""
    from datetime import UTC, datetime

    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    r = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    now = datetime.now(UTC)
    return {
        p.deployment_options.build_id
        for p in r.pollers
        if p.deployment_options.build_id
        and (now - p.last_access_time.ToDatetime(UTC)).total_seconds() <= POLLED_WITHIN_S
    }


@dataclass(frozen=True)
class BuildState:
    """One build of a deployment as Temporal has it, and whether a worker polls it."""

    build_id: str
    status: str  # CURRENT | RAMPING | DRAINING | DRAINED | INACTIVE
    polled: bool
    created_at: str | None

    @property
    def stranded(self) -> bool:
        """Runs are pinned to it (DRAINING) and no worker of it polls: they wait."""
        return self.status == "DRAINING" and not self.polled


async def builds(client: Client, deployment: str, task_queue: str) -> list[BuildState]:
    """Every build of ``deployment``, newest first."""
    from temporalio.api.enums.v1 import WorkerDeploymentVersionStatus

    info = await describe(client, deployment)
    if info is None:
        return []
    polled = await polled_builds(client, task_queue)
    out = []
    for s in info.worker_deployment_info.version_summaries:
        name = WorkerDeploymentVersionStatus.Name(s.status)
        created = (
            s.create_time.ToDatetime().isoformat() + "Z" if s.HasField("create_time") else None
        )
        out.append(
            BuildState(
                build_id=s.deployment_version.build_id,
                status=name.removeprefix("WORKER_DEPLOYMENT_VERSION_STATUS_"),
                polled=s.deployment_version.build_id in polled,
                created_at=created,
            )
        )
    return sorted(out, key=lambda b: b.created_at or "", reverse=True)
