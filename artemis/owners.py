"""Whose run it is: a run belongs to the API token that started it, and task ids are per
owner. A named token's runs have task ids ``{owner}~{id}``; the runs of bare-string
tokens and of an API without tokens (owner ``default``) keep the id as given. So two
owners may use the same id without meeting, and every key derived from a task id (the
workflow id, sink idempotency keys, staged pages, files) is the owner's own."""

from __future__ import annotations

from artemis.errors import ArtemisError, ErrorCode

# The owner of runs started by a bare-string token or on an API without tokens.
DEFAULT_OWNER = "default"
SEP = "~"
# The roles whose runs may change what every owner's runs share: a provenance's record
# model (``schema_contract: evolve``) and its pointers (an ``update``'s watermark).
SHARED_STATE_ROLES = ("operator", "admin")


def writes_shared(role: str) -> bool:
    """A run started by ``role`` may change a provenance's shared state (docs/security.md,
    "Shared state is the operator's")."""
    return role in SHARED_STATE_ROLES


def owned_task_id(owner: str, task_id: str) -> str:
    """The task id of ``owner``'s run named ``task_id``."""
    return task_id if owner == DEFAULT_OWNER else f"{owner}{SEP}{task_id}"


def owned_lock(owner: str, lock: str) -> str:
    """The name of ``owner``'s execution lock ``lock`` (a crawl's ``workflow_name``): each
    owner holds its own, so nobody can keep another owner's runs from starting, and a
    refusal names only the caller's own holder."""
    return owned_task_id(owner, lock)


def owner_of(task_id: str) -> str:
    """The owner of the run with this (full) task id."""
    owner, sep, _ = task_id.partition(SEP)
    return owner if sep else DEFAULT_OWNER


def task_id_for(caller: str, sees_all: bool, given: str) -> str:
    """The full task id a caller means by ``given``: ``owner~id`` names that owner's run
    (``default~id`` the default owner's), a bare id the caller's own. Another owner's run
    is TASK_NOT_FOUND to a caller who may not see it, the same answer as a run that does
    not exist, so ids cannot be probed."""
    owner, sep, local = given.partition(SEP)
    if not sep:
        owner, local = caller, given
    if not local or SEP in local or (owner != caller and not sees_all):
        raise ArtemisError(ErrorCode.TASK_NOT_FOUND, f"no task with id {given!r}")
    return owned_task_id(owner, local)
