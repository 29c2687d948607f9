"""A source of several resources in a tree (docs/registry.md "Resources"): root resources
paged as any source, each of their records asking its sub-resources (a GitHub-like API's
repositories → issues → comments), to any depth.

How a walk resumes. A page of a resource is handed over (yielded) only once the
sub-resources of all its records are fetched, its own records with its leaf
sub-resources' (a sub-resource with no sub-resources of its own): those are asked for in
parallel, ``parallel`` requests at a time for the whole walk. A sub-resource that has
sub-resources of its own is walked record by record, and hands its pages over on its
own. The checkpoint after a handed-over page is the path to the next piece of work: at
each level the checkpoint that asks that level's current page again and the record (and
sub-resource) whose subtree comes next. A retried walk asks each level's current page
again (at most the pages in flight, one a level) and skips the subtrees handed over
already: no record is handed over twice, and the checkpoint moves only with a page.

The counts of each resource (records, ignored answers, the totals the source stated)
travel in the checkpoint, so that a resumed walk goes on counting where the handed-over
pages left them, and every handed-over page tells them (``PageInfo.resources``). A
sub-resource's stated total is checked when its walk for one parent record ends: a
shortfall is INCOMPLETE, naming the resource and the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from artemis.completeness import check_complete
from artemis.http import HttpClient
from artemis.sources.base import Page, PageInfo, Source

# The key of a record's resource, and of the record itself, in a page of several
# resources (``TreeSource.enveloped``): what the task's judge and sinks route by.
RESOURCE_KEY = "@resource"
RECORD_KEY = "@record"


@dataclass
class Node:
    """One resource of the tree: its sub-resources, and whether its records land (a
    parent asked only for its values does not)."""

    name: str
    children: list[str] = field(default_factory=list)
    lands: bool = True


# Opens a resource's source for one parent record (None for a root resource).
Opener = Callable[[str, dict[str, Any] | None], Source]
# A sub-resource's record with what it takes from its parent (include_from_parent).
Adopter = Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any]]


@dataclass
class _Walk:
    """One walk's state: the client it asks with, the resources' counts and the position
    handed over last."""

    client: HttpClient
    counts: dict[str, dict[str, Any]]
    # Ignored answers told by the pages handed over so far (``PageInfo.ignored`` is a
    # page's own).
    told: int
    # One frame per level above the page being walked: {"cp": the checkpoint that asks
    # that level's current page again, "rec": the record, "child": its sub-resource}.
    path: list[dict[str, Any]]


@dataclass(frozen=True)
class Walking:
    """How a tree is walked: ``parallel`` leaf sub-resource walks at a time, under the
    source's ``name``, each resource's stated total held to ``tolerance_pct``;
    ``enveloped``: records go as {RESOURCE_KEY: name, RECORD_KEY: record} (several
    resources land), else the one landing resource's records as they are."""

    parallel: int = 1
    name: str = "tree"
    tolerance_pct: float = 0.0
    enveloped: bool = True


class TreeSource(Source):
    """The resources of ``nodes`` walked from ``roots`` (see the module)."""

    def __init__(
        self,
        nodes: dict[str, Node],
        roots: list[str],
        open_source: Opener,
        adopt: Adopter,
        walking: Walking | None = None,
    ) -> None:
        walking = walking or Walking()
        self.nodes, self.roots = nodes, roots
        self.open_source, self.adopt = open_source, adopt
        self.parallel = max(1, walking.parallel)
        self.name = walking.name
        self.tolerance_pct = walking.tolerance_pct
        self.enveloped = walking.enveloped
        self._gate = asyncio.Semaphore(self.parallel)

    def _heavy(self, name: str) -> list[str]:
        return [c for c in self.nodes[name].children if self.nodes[c].children]

    def _leaves(self, name: str) -> list[str]:
        return [c for c in self.nodes[name].children if not self.nodes[c].children]

    async def pages(
        self, client: HttpClient, checkpoint: dict[str, Any] | None
    ) -> AsyncIterator[Page]:
        state = (checkpoint or {}).get("tree") or {}
        counts = {n: _zero() for n in self.nodes} | (state.get("counts") or {})
        walk = _Walk(
            client=client,
            counts=counts,
            told=sum(int(c["ignored"]) for c in counts.values()),
            path=list(state.get("path") or [{"cp": None, "rec": 0, "child": 0}]),
        )
        resume = walk.path[1:]
        # (the top frame's ``child`` past 0: that root resource was walked to its end)
        first_root = int(walk.path[0]["rec"]) + (1 if int(walk.path[0]["child"]) else 0)
        resume = resume if not int(walk.path[0]["child"]) else []
        for i in range(first_root, len(self.roots)):
            top = {"cp": None, "rec": i, "child": 0}
            again = resume if i == first_root else []
            async for page in self._level(self.roots[i], None, [top], again, walk):
                yield page
        # The end of the walk: no page is left, whatever the last one handed over said.
        yield Page([], None, PageInfo(source=self.name, resources=_copy(walk.counts)))

    async def _level(
        self,
        name: str,
        parent: dict[str, Any] | None,
        above: list[dict[str, Any]],
        resume: list[dict[str, Any]],
        walk: _Walk,
    ) -> AsyncIterator[Page]:
        """Every page of resource ``name`` (for ``parent``), each handed over once its
        records' sub-resources are fetched. ``above``: the frames of the levels above;
        ``resume``: where a retried walk stood at this level and below."""
        here = resume[0] if resume else None
        cp = here["cp"] if here else None
        source = self.open_source(name, parent)
        source.resumed = here is not None and cp is not None
        frame = {"cp": cp, "rec": int(here["rec"]) if here else 0, "child": 0}
        frame["child"] = int(here["child"]) if here else 0
        async for page in source.pages(walk.client, cp):
            own = page.records
            if parent is not None:  # what it takes from its parent, its own sub-resources too
                own = [self.adopt(name, parent, r) for r in own]
            async for sub in self._subtrees(name, own, above, frame, resume[1:], walk):
                yield sub
            resume = []
            leaves = await self._leaf_records(name, own, walk)
            # Counted where the page is handed over (a retried walk asks it again).
            walk.counts[name]["records"] += len(own)
            walk.counts[name]["ignored"] += page.info.ignored
            frame = {"cp": page.checkpoint, "rec": 0, "child": 0}
            if page.checkpoint is None:
                self._stated(name, page, walk)
                walk.path = _advanced(above)
            else:
                walk.path = [*above, frame]
            yield self._bundle(name, own, leaves, page, walk)

    async def _subtrees(
        self,
        name: str,
        records: list[dict[str, Any]],
        above: list[dict[str, Any]],
        frame: dict[str, Any],
        resume: list[dict[str, Any]],
        walk: _Walk,
    ) -> AsyncIterator[Page]:
        """The sub-resources of ``records`` that have sub-resources of their own, walked
        one record and one sub-resource at a time from ``frame``'s position."""
        heavy = self._heavy(name)
        start_rec, start_child = int(frame["rec"]), int(frame["child"])
        for i in range(start_rec, len(records)):
            for j, child in enumerate(heavy):
                if i == start_rec and j < start_child:
                    continue
                here = {"cp": frame["cp"], "rec": i, "child": j}
                again = resume if (i, j) == (start_rec, start_child) else []
                record = records[i]
                async for page in self._level(child, record, [*above, here], again, walk):
                    yield page

    async def _leaf_records(
        self, name: str, records: list[dict[str, Any]], walk: _Walk
    ) -> list[tuple[str, dict[str, Any]]]:
        """Every leaf sub-resource of every record of a page, ``parallel`` walks at a
        time: (resource, record) in the order of the records and sub-resources."""
        asks = [(child, r) for r in records for child in self._leaves(name)]
        if not asks:
            return []
        # A task group: the first walk that fails cancels the others.
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._whole(c, r, walk)) for c, r in asks]
        found = [t.result() for t in tasks]
        return [(child, rec) for (child, _), got in zip(asks, found, strict=True) for rec in got]

    async def _whole(self, name: str, parent: dict[str, Any], walk: _Walk) -> list[dict[str, Any]]:
        """All pages of leaf resource ``name`` for one parent record."""
        out: list[dict[str, Any]] = []
        ignored = 0
        last: Page | None = None
        async with self._gate:
            # Opened in its slot: opening every waiting walk's source at once would hold
            # the event loop while the requests in flight have answered.
            source = self.open_source(name, parent)
            async for page in source.pages(walk.client, None):
                last = page
                out.extend(page.records)
                ignored += page.info.ignored
        if last is not None:
            self._stated(name, last, walk)
        walk.counts[name]["records"] += len(out)
        walk.counts[name]["ignored"] += ignored
        return [self.adopt(name, parent, r) for r in out]

    def _stated(self, name: str, last: Page, walk: _Walk) -> None:
        """A sub-resource's walk for one parent ended: its stated total is checked and
        added to the resource's."""
        stated = last.info.expected_total
        if stated is None:
            return
        count = walk.counts[name]
        count["stated"] = int(count.get("stated") or 0) + stated
        where = last.info.request or name
        check_complete(f"{self.name} {name}", stated, last.info.taken, self.tolerance_pct, where)

    def _bundle(
        self,
        name: str,
        own: list[dict[str, Any]],
        leaves: list[tuple[str, dict[str, Any]]],
        page: Page,
        walk: _Walk,
    ) -> Page:
        """A handed-over page: ``name``'s records of ``page`` and its leaf sub-resources',
        with the checkpoint of the walk's next piece of work."""
        records: list[dict[str, Any]] = []
        for resource, record in [(name, r) for r in own] + leaves:
            if not self.nodes[resource].lands:
                continue
            records.append(
                {RESOURCE_KEY: resource, RECORD_KEY: record} if self.enveloped else record
            )
        ignored = sum(int(c["ignored"]) for c in walk.counts.values())
        info = PageInfo(
            source=f"{self.name} {name}",
            ignored=ignored - walk.told,
            request=page.info.request,
            taken=sum(c["records"] for c in walk.counts.values()),
            digest=page.info.digest,
            resources=_copy(walk.counts),
        )
        walk.told = ignored
        checkpoint = {"tree": {"path": walk.path, "counts": _copy(walk.counts)}}
        return Page(records, checkpoint, info)


class NoPages(Source):
    """A resource not asked for one parent record (an update's unchanged parent): one
    empty last page."""

    name = "none"

    async def pages(
        self, client: HttpClient, checkpoint: dict[str, Any] | None
    ) -> AsyncIterator[Page]:
        yield Page([], None)


def _zero() -> dict[str, Any]:
    return {"records": 0, "ignored": 0, "stated": None}


def _copy(counts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {k: dict(v) for k, v in counts.items()}


def _advanced(above: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frames after a level's last page: its parent level goes on at its next
    sub-resource (``child`` + 1; past the last, the next record's first is the same
    piece of work, as ``_subtrees`` counts it)."""
    *rest, parent = above
    return [*rest, {**parent, "child": int(parent["child"]) + 1}]
