"""A run's pages judged one after another in an activity (``PageJudge``, one per lane
for a source of several resources): judged, their bad records kept, the run's bound
checked, drift recorded once per run and field, the model evolved."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Engine

from artemis.calls import statement, work
from artemis.ledger import PageDone
from artemis.quarantine.judging import BadRecord, Drift, JudgedTask, JudgingContext, Rules, judge
from artemis.quarantine.policy import RecordPolicy, check_bound
from artemis.quarantine.store import RecordSeal, RunPlace, note_drift, run_actions, store_bad
from artemis.sinks.factory import lane_output
from artemis.sinks.records import evolution_plan
from artemis.sources.tree import RECORD_KEY, RESOURCE_KEY

# -- a run's pages judged (what the process activities use) -----------------------------------


@dataclass
class Outcome:
    """One page judged and its rows written: what goes on, and what to count and tell."""

    records: list[dict[str, Any]]
    quarantined: int = 0
    dropped: int = 0
    sample: BadRecord | None = None
    filtered: int = 0  # records the task's process left out on purpose
    new_drift: list[Drift] = field(default_factory=list)
    evolved: list[str] = field(default_factory=list)
    # New fields the model did not take, and why (an invalid name, the column budget,
    # schema.max_new_fields): told in their schema_drift events.
    skipped: dict[str, str] = field(default_factory=dict)
    held: int = 0  # the run's quarantined records in all, after this page
    new: int = 0  # rows this page added (a page judged again adds none)
    seq: int = 0
    bad: list[BadRecord] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)  # not seen before in this activity
    # A page of several lanes: each lane's own judgement (``LanedJudge``).
    parts: dict[str, Outcome] = field(default_factory=dict)

    def told(self) -> Outcome:
        """What is told of the page once it is counted (its quarantine), without its
        records: a stream holds it for the pages below to be delivered."""
        parts = {name: part.told() for name, part in self.parts.items()}
        return dataclasses.replace(self, records=[], parts=parts)

    def done(self, records_in: int, sinks: dict[str, int] | None = None) -> PageDone:
        """The page finished, for its path's ledger: judged (``records_in`` taken in) and,
        with ``sinks``, delivered (each sink's records taken)."""
        return PageDone(
            records_in=records_in,
            records_out=len(self.records),
            quarantined=self.quarantined,
            dropped=self.dropped,
            filtered=self.filtered,
            sent=len(self.records) if sinks is not None else 0,
            sinks=dict(sinks or {}),
        )


@dataclass
class Tally:
    """What a percentage ``max_bad_records`` is of, as a judge starts: the records the
    run had fetched (``fetched``), the total its sources state (``stated``), and whether
    the judge adds each page it judges to ``fetched`` (``counts_pages``: a streaming fetch,
    whose pages are not counted yet)."""

    fetched: int = 0
    stated: int | None = None
    counts_pages: bool = False


class PageJudge:
    """A run's pages judged one after another in one activity (``judge``), the bad records
    kept, the run's bound checked, drift recorded once per run and field (and the model
    evolved when the run's contract says so).

    ``tally``: what the run's bound is of when the activity starts (``Tally``)."""

    def __init__(
        self, task: JudgedTask, ctx: JudgingContext, place: RunPlace, tally: Tally
    ) -> None:
        self.task, self.ctx, self.place = task, ctx, place
        judges = task.judges_records
        self.policy = task.record_policy(ctx) if judges else RecordPolicy(on_bad_record="fail")
        self.spec = task.record_spec(ctx.params) if judges else None
        self.fetched, self.stated = tally.fetched, tally.stated
        self.counts_pages = tally.counts_pages
        self.database_url = ctx.settings.database.url
        self.max_record_bytes = ctx.settings.quarantine.max_record_bytes
        self.max_new_fields = ctx.settings.schema.max_new_fields
        self.seal = RecordSeal(ctx.settings.vault.master_key_file)
        self._noted: set[str] = set()
        self._run_written = False

    def page(self, seq: int, raw: list[Any]) -> Outcome:
        """The page judged (CPU only: the task's process and the model's check)."""
        if self.counts_pages:
            self.fetched += len(raw)
        judged = judge(self.task, self.ctx, seq, raw, Rules(self.policy, self.spec))
        out = Outcome(judged.records, len(judged.bad), judged.fields_dropped)
        out.seq, out.bad, out.filtered = seq, judged.bad, judged.filtered
        out.sample = judged.bad[0] if judged.bad else None
        out.drift = [d for d in judged.drift if d.field not in self._noted]
        self._noted.update(d.field for d in out.drift)
        return out

    @staticmethod
    def brief(outcomes: list[Outcome]) -> bool:
        """Keeping them is a few short statements (no drift: no registry write)."""
        return not any(o.drift for o in outcomes)

    def keep(self, outcomes: list[Outcome]) -> None:
        """Judged pages' rows kept in one transaction, the run's bound checked
        (BAD_RECORDS past it), their drift recorded once per run and field (and the model
        evolved): before any of these pages is counted as delivered."""
        pages = [(o.seq, o.bad) for o in outcomes if o.bad]
        if pages:
            held, new = store_bad(
                self.database_url,
                self.place,
                pages,
                self.max_record_bytes,
                with_run=not self._run_written,
                seal=self.seal,
            )
            self._run_written = True
            for o in outcomes:
                o.held = held
            next(o for o in reversed(outcomes) if o.bad).new = new
            check_bound(held, self.policy, self.fetched, self.stated)
        for out in outcomes:
            if out.drift:
                self._keep_drift(out)

    def _keep_drift(self, out: Outcome) -> None:
        """A page's drift recorded once per run and field; under ``evolve``, the new
        fields the import's rules allow (``evolution_plan``), at most
        ``schema.max_new_fields`` a run, added to the model and the rest recorded
        ``skipped`` with the reason (``out.skipped``)."""
        contract = self.policy.schema_contract
        action = {"evolve": "evolved", "freeze": "frozen"}.get(contract, "discarded")
        added = {d.field: d.type_name or "json | None" for d in out.drift if d.kind == "added"}
        grow: dict[str, str] = {}
        actions: dict[str, str] = {}
        if added and contract == "evolve":
            grow, out.skipped = self._plan(added)
            actions = {name: "skipped" for name in out.skipped}
        out.new_drift = note_drift(
            self.database_url, self.place, out.seq, out.drift, action, actions
        )
        if grow and self.task.evolve_model(self.ctx, grow):
            out.evolved = sorted(grow)

    def _plan(self, added: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """(the fields to add, {field: why skipped}) of ``added``: a field this run
        decided on before keeps its decision (another window's, or a retried attempt's:
        an ``evolved`` one is added again, which changes nothing when it is there); the
        others are held to the rules against the run's model and the fields it added."""
        decided = run_actions(self.database_url, self.place)
        evolved = [name for name, act in decided.items() if act == "evolved"]
        fresh = {k: v for k, v in added.items() if k not in decided}
        assert self.spec is not None  # (drift is found against a model)
        room = max(0, self.max_new_fields - len(evolved))
        grow, skipped = evolution_plan(
            [*self.spec.model.model_fields, *evolved],
            fresh,
            room,
            f"over schema.max_new_fields ({self.max_new_fields} new fields a run)",
        )
        grow.update({k: v for k, v in added.items() if k in evolved})
        return grow, skipped


class LanedJudge:
    """A run of several lanes (``JudgedTask.lanes``: a provenance of several resources):
    each lane's records of a page judged by that lane's own ``PageJudge`` — its record
    model and policy, its quarantine and drift under a run key of its own
    (``{run key}/{lane}``, whose replay runs with the lane's params and output) — and the
    page's outcome their sum, its records still by lane. Drift is told as
    ``{lane}.{field}``."""

    def __init__(
        self,
        task: JudgedTask,
        ctx: JudgingContext,
        place: RunPlace,
        lanes: list[str],
        tally: Tally,
    ) -> None:
        self.judges: dict[str, PageJudge] = {}
        for lane in lanes:
            params = task.lane_params(ctx.params, lane)
            # (a TaskContext, a dataclass: the lane's own copy)
            own = dataclasses.replace(cast(Any, ctx), params=params, rejected=[])
            spot = dataclasses.replace(
                place,
                run_key=f"{place.run_key}/{lane}",
                params={**place.params, "resource": lane, "only": True},
                output=lane_output(place.output, lane),
            )
            self.judges[lane] = PageJudge(task, own, spot, dataclasses.replace(tally))

    @property
    def stated(self) -> int | None:
        return next(iter(self.judges.values())).stated

    @stated.setter
    def stated(self, value: int | None) -> None:
        for each in self.judges.values():
            each.stated = value

    def page(self, seq: int, raw: list[Any]) -> Outcome:
        groups: dict[str, list[Any]] = {}
        for r in raw:
            groups.setdefault(r[RESOURCE_KEY], []).append(r[RECORD_KEY])
        parts = {lane: self.judges[lane].page(seq, recs) for lane, recs in groups.items()}
        records = [
            {RESOURCE_KEY: lane, RECORD_KEY: r} for lane, o in parts.items() for r in o.records
        ]
        out = Outcome(records, sum(o.quarantined for o in parts.values()))
        out.dropped = sum(o.dropped for o in parts.values())
        out.filtered = sum(o.filtered for o in parts.values())
        out.seq, out.parts = seq, parts
        out.bad = [b for o in parts.values() for b in o.bad]
        out.sample = next((o.sample for o in parts.values() if o.sample), None)
        out.drift = [d for o in parts.values() for d in o.drift]
        return out

    @staticmethod
    def brief(outcomes: list[Outcome]) -> bool:
        return PageJudge.brief(outcomes)

    def keep(self, outcomes: list[Outcome]) -> None:
        """Each lane's pages kept by its judge; the pages' outcomes then say the sums."""
        for lane, each in self.judges.items():
            mine = [o.parts[lane] for o in outcomes if lane in o.parts]
            if mine:
                each.keep(mine)
        for o in outcomes:
            o.held = sum(p.held for p in o.parts.values())
            o.new = sum(p.new for p in o.parts.values())
            o.new_drift = [
                Drift(f"{lane}.{d.field}", d.kind, d.example, d.type_name)
                for lane, p in o.parts.items()
                for d in p.new_drift
            ]
            o.evolved = [f"{lane}.{f}" for lane, p in o.parts.items() for f in p.evolved]
            o.skipped = {
                f"{lane}.{k}": v for lane, p in o.parts.items() for k, v in p.skipped.items()
            }


def page_judge(
    task: JudgedTask, ctx: JudgingContext, place: RunPlace, tally: Tally
) -> PageJudge | LanedJudge:
    """The judge of a run's pages: one ``PageJudge``, or one per lane (``LanedJudge``)."""
    lanes = task.lanes(ctx.params) if task.judges_records else None
    if lanes:
        return LanedJudge(task, ctx, place, list(lanes), tally)
    return PageJudge(task, ctx, place, tally)


# What judges a run's pages (``page_judge``).
Judge = PageJudge | LanedJudge


async def keep_judged(db: Engine, judge: Judge, outcomes: list[Outcome]) -> None:
    """Judged pages' bad records and drift kept (``PageJudge.keep``): a few short
    statements on Artemis' database ``db`` (``artemis/calls.py``), or — drift to record, a
    registry write — work of its own."""
    if judge.brief(outcomes):
        await statement(db, judge.keep, outcomes)
    else:
        await work(judge.keep, outcomes)
