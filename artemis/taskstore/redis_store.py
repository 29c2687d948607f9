"""TaskStorage on Redis: keys ``task:{id}:status|payload|result|error|meta`` written in
one MULTI/EXEC with a TTL (24 h by default); an update is a compare-and-set Lua script
(the version read must still be the stored one, checked and written atomically inside
Redis); expiry scans ``task:*:meta`` with SCAN and deletes in pipelined batches."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis

from artemis.owners import owner_of
from artemis.run_state import Verdict
from artemis.taskstore.base import (
    TERMINAL,
    ConcurrentModification,
    StatusChange,
    StorageUnavailable,
    TaskData,
    TaskNotFound,
    TaskStorage,
    TaskValidationError,
    decode_cursor,
    encode_cursor,
)

_PARTS = ("status", "payload", "result", "error", "meta")
INDEX = "tasks:index"


def _keys(task_id: str) -> list[str]:
    return [f"task:{task_id}:{part}" for part in _PARTS]


# KEYS: the five parts (status, payload, result, error, meta) and the listing index.
# ARGV: the version read, the TTL, the index score, the task id, the five new values.
# Answers 1 when written, 0 when another writer moved the version, -1 when it is gone.
_CAS = """
local meta = redis.call('GET', KEYS[5])
if not meta then return -1 end
if tonumber(cjson.decode(meta)['version']) ~= tonumber(ARGV[1]) then return 0 end
for i = 1, 5 do redis.call('SET', KEYS[i], ARGV[4 + i], 'EX', ARGV[2]) end
redis.call('ZADD', KEYS[6], ARGV[3], ARGV[4])
return 1
"""


# Insert unless present: KEYS as _CAS; ARGV: TTL, index score, task id, the five values.
# Absent as ``load`` sees it: a task missing its status or its meta (expired) is replaced.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('EXISTS', KEYS[5]) == 1 then return 0 end
for i = 1, 5 do redis.call('SET', KEYS[i], ARGV[3 + i], 'EX', ARGV[1]) end
redis.call('ZADD', KEYS[6], ARGV[2], ARGV[3])
return 1
"""


class RedisTaskStorage(TaskStorage):
    def __init__(self, url: str, ttl_hours: int = 24) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.ttl_s = int(ttl_hours * 3600)
        # redis-py's Script: EVALSHA, loading the script again after a server restart.
        self._cas = self.client.register_script(_CAS)
        self._create = self.client.register_script(_CREATE)

    def _encode(self, data: TaskData) -> dict[str, str]:
        d = json.loads(data.model_dump_json())
        meta = {k: d[k] for k in d if k not in ("status", "payload", "result", "error")}
        return {
            "status": d["status"],
            "payload": json.dumps(d["payload"]),
            "result": json.dumps(d["result"]),
            "error": json.dumps(d["error"]),
            "meta": json.dumps(meta),
        }

    def _write(self, pipe: Any, task_id: str, data: TaskData) -> None:
        for part, value in self._encode(data).items():
            pipe.set(f"task:{task_id}:{part}", value, ex=self.ttl_s)
        # The listing index: newest first by creation time (entries of expired tasks are
        # dropped when a listing meets them).
        pipe.zadd(INDEX, {task_id: data.created_at.timestamp()})

    def save(self, task_id: str, data: TaskData) -> None:
        self.same_id(task_id, data)
        try:
            pipe = self.client.pipeline(transaction=True)  # MULTI ... EXEC
            self._write(pipe, task_id, data)
            pipe.execute()
        except redis.ConnectionError as e:
            raise StorageUnavailable(str(e)) from None

    def create(self, task_id: str, data: TaskData) -> bool:
        self.same_id(task_id, data)
        parts = self._encode(data)
        try:
            done = self._create(
                keys=[*_keys(task_id), INDEX],
                args=[
                    self.ttl_s,
                    data.created_at.timestamp(),
                    task_id,
                    *(parts[p] for p in _PARTS),
                ],
            )
        except redis.ConnectionError as e:
            raise StorageUnavailable(str(e)) from None
        return bool(done)

    @staticmethod
    def _decode(values: Any) -> TaskData | None:
        status, payload, result, error, meta = values
        if status is None or meta is None:
            return None
        return TaskData.model_validate(
            {
                **json.loads(meta),
                "status": status,
                "payload": json.loads(payload or "{}"),
                "result": json.loads(result or "null"),
                "error": json.loads(error or "null"),
            }
        )

    def load(self, task_id: str) -> TaskData | None:
        try:
            return self._decode(self.client.mget(_keys(task_id)))
        except redis.ConnectionError as e:
            raise StorageUnavailable(str(e)) from None

    def update_status(
        self, task_id: str, change: StatusChange | str, *, expected_version: int | None = None
    ) -> TaskData:
        asked = StatusChange.of(change)

        def changed(current: TaskData) -> TaskData:
            if expected_version is not None and current.version != expected_version:
                raise ConcurrentModification(
                    f"task {task_id} is at version {current.version}, not {expected_version}"
                )
            return self.transition(current, asked, current.version)[1]

        return self._compare_and_set(task_id, changed)

    def _compare_and_set(self, task_id: str, change: Callable[[TaskData], TaskData]) -> TaskData:
        """Optimistic update in two round trips: read the task, then the CAS script writes
        the changed task only if its stored version is still the one read."""
        keys = _keys(task_id)
        try:
            current = self._decode(self.client.mget(keys))
            if current is None:
                raise TaskNotFound(task_id)
            updated = change(current)
            parts = self._encode(updated)
            done = self._cas(
                keys=[*keys, INDEX],
                args=[
                    current.version,
                    self.ttl_s,
                    updated.created_at.timestamp(),
                    task_id,
                    *(parts[p] for p in _PARTS),
                ],
            )
        except redis.ConnectionError as e:
            raise StorageUnavailable(str(e)) from None
        if done == -1:
            raise TaskNotFound(task_id)
        if done == 0:
            raise ConcurrentModification(f"task {task_id} changed while updating")
        return updated

    def delete(self, task_id: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(*_keys(task_id))
        pipe.zrem(INDEX, task_id)
        pipe.execute()

    def delete_expired(self, before: datetime, batch_size: int = 1000) -> int:
        total = 0
        cursor = 0
        while True:
            cursor, metas = self.client.scan(cursor=cursor, match="task:*:meta", count=batch_size)
            if metas:
                ids = [str(m)[len("task:") : -len(":meta")] for m in metas]
                pipe = self.client.pipeline(transaction=False)
                for task_id in ids:
                    pipe.get(f"task:{task_id}:status")
                    pipe.get(f"task:{task_id}:meta")
                values = pipe.execute()
                doomed = []
                for n, task_id in enumerate(ids):
                    status, meta = values[2 * n], values[2 * n + 1]
                    if status in TERMINAL and meta:
                        done = json.loads(meta).get("completed_at")
                        if done and datetime.fromisoformat(done) < before:
                            doomed.append(task_id)
                if doomed:
                    pipe = self.client.pipeline(transaction=False)
                    for task_id in doomed:
                        pipe.delete(*_keys(task_id))
                        pipe.zrem(INDEX, task_id)
                    pipe.execute()
                    total += len(doomed)
            if cursor == 0:
                self._drop_stale_index(batch_size)
                return total

    def _drop_stale_index(self, batch_size: int) -> None:
        """Index entries whose task keys expired by their TTL (a listing skips them; the
        clean-up, not a read, removes them)."""
        start = 0
        while True:
            ids = [str(t) for t in self.client.zrange(INDEX, start, start + batch_size - 1)]
            if not ids:
                return
            pipe = self.client.pipeline(transaction=False)
            for task_id in ids:
                pipe.exists(f"task:{task_id}:status", f"task:{task_id}:meta")
            stale = [t for t, kept in zip(ids, pipe.execute(), strict=True) if kept < 2]
            if stale:
                self.client.zrem(INDEX, *stale)
            start += len(ids) - len(stale)

    def list(
        self,
        *,
        status: str | None = None,
        code: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        owner: str | None = None,
    ) -> tuple[list[TaskData], str | None]:
        max_score: float | str = "+inf"
        after_id: str | None = None
        if cursor:
            created, after_id = decode_cursor(cursor)
            max_score = created.timestamp()
        items: list[TaskData] = []
        offset = 0
        while len(items) <= limit:
            batch: list[tuple[Any, float]] = list(
                self.client.zrevrangebyscore(
                    INDEX, max_score, "-inf", start=offset, num=200, withscores=True
                )  # type: ignore[arg-type]
            )
            if not batch:
                break
            offset += len(batch)
            pipe = self.client.pipeline(transaction=False)
            for task_id, _ in batch:
                pipe.mget(_keys(str(task_id)))
            for (task_id, score), values in zip(batch, pipe.execute(), strict=True):
                if after_id is not None and score == max_score and str(task_id) >= after_id:
                    continue  # ties on the cursor's second: ids after it were served
                data = self._decode(values)
                if data is None:
                    continue  # its keys expired (the clean-up drops the index entry)
                if (status and data.status != status) or (code and data.task_code != code):
                    continue
                if owner and owner_of(data.task_id) != owner:
                    continue
                items.append(data)
        page = items[:limit]
        nxt = (
            encode_cursor(page[-1].created_at, page[-1].task_id)
            if len(items) > limit and page
            else None
        )
        return page, nxt

    def record_feedback(self, task_id: str, status: str, comment: str | None = None) -> TaskData:
        if status not in tuple(Verdict):
            raise TaskValidationError("feedback status must be success or failed")

        def change(current: TaskData) -> TaskData:
            return current.model_copy(
                update={
                    "feedback": {
                        "status": status,
                        "comment": comment,
                        "at": datetime.now(UTC).isoformat(),
                    },
                    "version": current.version + 1,
                }
            )

        return self._compare_and_set(task_id, change)
