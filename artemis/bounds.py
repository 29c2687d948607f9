"""Bounds of the numbers a request may set. Python's JSON reader accepts ``NaN``,
``Infinity`` and ``1e308``; none of them is a duration a run can honour (a Temporal timer
needs a finite one), so every float a request reaches is finite and has a maximum."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

# The longest outage a run waits out: past a day, an operator, not a timer, decides.
MAX_OUTAGE_TOLERANCE_S = 24 * 3600

# A task's ``outage_tolerance_s`` (request or ``task_defaults.<code>``); None: the
# provenance's, else ``runs.outage_tolerance_s``. 0: fail fast.
OutageTolerance = Annotated[
    float | None, Field(ge=0, le=MAX_OUTAGE_TOLERANCE_S, allow_inf_nan=False)
]
