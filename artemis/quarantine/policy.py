"""A run's bad-record and drift policy (``on_bad_record``, ``max_bad_records``,
``schema_contract``, ``coerce_types``): its params, its defaults and its bound."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from artemis.config import QuarantineSettings
from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.field_docs import MAX_BAD_RECORDS

# -- the policy ------------------------------------------------------------------------------

OnBadRecord = Literal["quarantine", "fail"]
SchemaContract = Literal["evolve", "freeze", "discard"]
DEFAULT_MAX_BAD = "1%"
# The fewest records a percentage max_bad_records is taken of.
PERCENT_FLOOR = 1000
POLICY_FIELDS = ("on_bad_record", "max_bad_records", "schema_contract", "coerce_types")


class Stage(StrEnum):
    """Where a replay judges a record again from (a row's ``replay_from``; its column is
    ``stage``)."""

    PROCESS = "process"  # the raw record as fetched: processed again, then checked
    MODEL = "model"  # the record as processed (its raw form could not be told): checked


class Check(StrEnum):
    """Which check set a record aside (a row's ``stage`` as shown): the task's ``process``
    step (it failed on the record or turned it down), or the record model's judgement."""

    PROCESS = "process"
    JUDGE = "judge"


# The codes of a model misfit: RECORD_MODEL, and SINK_ERROR, which rows set aside by a
# build before RECORD_MODEL existed carry for the same reason (a record rejected by the
# task's process step has its own code, or SOURCE_CONTRACT).
_JUDGED = frozenset({ErrorCode.RECORD_MODEL.value, ErrorCode.SINK_ERROR.value})


def check_of(error_code: str | None) -> Check:
    """The check a reason's code names: a model misfit is the judge's, the rest process's."""
    return Check.JUDGE if error_code in _JUDGED else Check.PROCESS


def parse_max_bad(value: Any) -> int | float:
    """``100`` → 100 records; ``"1%"`` / ``"0.5 %"`` → 1.0 / 0.5 percent (a float)."""
    if isinstance(value, bool):
        raise ValueError("max_bad_records is a count (e.g. 100) or a percentage ('1%')")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("max_bad_records: a count is 0 or more")
        return value
    text = str(value).strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1].strip())
        except ValueError:
            pct = math.nan
        if not 0 <= pct <= 100:
            raise ValueError(f"max_bad_records {value!r}: a percentage is 0% to 100%")
        return pct
    if text.isdigit():
        return int(text)
    raise ValueError(
        f"max_bad_records {value!r} is neither a count (e.g. 100) nor a percentage ('1%')"
    )


class RecordPolicyParams(BaseModel):
    """A run's bad-record and drift policy, as params (request or ``task_defaults.<code>``):
    None leaves it to the provenance's registry entry, then to the defaults."""

    on_bad_record: OnBadRecord | None = None
    max_bad_records: int | str | None = Field(None, description=MAX_BAD_RECORDS)
    schema_contract: SchemaContract | None = None
    # Read the record model's types laxly ("1.5" a float, "7" an int, "true" a bool).
    coerce_types: bool | None = None

    @field_validator("max_bad_records")
    @classmethod
    def _max_bad(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            limit = parse_max_bad(value)
            # Bounded by the operator's caps where a run is asked for (the context holds
            # the settings): a run's params read back in the worker were checked then.
            settings = (info.context or {}).get("settings")
            if settings is not None:
                check_max_bad_cap(limit, value, settings.quarantine)
        return value


def check_max_bad_cap(limit: int | float, value: Any, caps: QuarantineSettings) -> None:
    """ValueError naming the operator's bound when ``value`` (parsed: ``limit``) allows
    more bad records than ``quarantine.max_bad_records_cap_count`` / ``_cap_pct``."""
    if isinstance(limit, int) and limit > caps.max_bad_records_cap_count:
        raise ValueError(
            f"max_bad_records {value!r} is past the operator's bound "
            f"quarantine.max_bad_records_cap_count ({caps.max_bad_records_cap_count} records)"
        )
    if isinstance(limit, float) and limit > caps.max_bad_records_cap_pct:
        raise ValueError(
            f"max_bad_records {value!r} is past the operator's bound "
            f"quarantine.max_bad_records_cap_pct ({caps.max_bad_records_cap_pct:g}%)"
        )


@dataclass(frozen=True)
class RecordPolicy:
    on_bad_record: OnBadRecord = "quarantine"
    max_bad_records: int | str = DEFAULT_MAX_BAD
    schema_contract: SchemaContract = "discard"
    coerce_types: bool = False

    @classmethod
    def of(cls, *layers: dict[str, Any] | None) -> RecordPolicy:
        """The first value each layer sets (params over the registry), else the defaults."""
        values: dict[str, Any] = {}
        for layer in layers:
            for name in POLICY_FIELDS:
                if name not in values and (layer or {}).get(name) is not None:
                    values[name] = (layer or {})[name]
        return cls(**values)

    @property
    def quarantines(self) -> bool:
        return self.on_bad_record == "quarantine"

    def bound(self, fetched: int, stated: int | None) -> int:
        """How many records the run may quarantine: a count as it is; a percentage of the
        records fetched so far, or of the total the source states, or of PERCENT_FLOOR
        records, whichever is largest (so the second bad record of a run's first page
        does not fail it: a percentage needs records to be one of)."""
        limit = parse_max_bad(self.max_bad_records)
        if isinstance(limit, int):
            return limit
        return math.floor(limit / 100 * max(fetched, stated or 0, PERCENT_FLOOR))

    def describe_bound(self) -> str:
        limit = parse_max_bad(self.max_bad_records)
        if isinstance(limit, int):
            return str(limit)
        return (
            f"{limit:g}% of the records fetched, of the stated total or of "
            f"{PERCENT_FLOOR:,} records, whichever is largest"
        )


def check_bound(count: int, policy: RecordPolicy, fetched: int, stated: int | None) -> None:
    """BAD_RECORDS once the run holds more quarantined records than it may."""
    bound = policy.bound(fetched, stated)
    if count > bound:
        raise ArtemisError(
            ErrorCode.BAD_RECORDS,
            f"{count} records quarantined, more than max_bad_records allows "
            f"({policy.describe_bound()}: {bound} of "
            f"{max(fetched, stated or 0, PERCENT_FLOOR)} records): the "
            "quarantined records are kept (artemis quarantine list)",
            retryable=False,
            details={"quarantined": count, "bound": bound},
        )
