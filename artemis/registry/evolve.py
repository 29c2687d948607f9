"""A record model that grows: fields a run saw the source add, added to the provenance's
record model for the runs that start from now (``schema_contract: evolve``). The model
in force is closed now and a copy with the new fields (nullable) opens now, so each run
keeps the model it started with and the next one's table check adds the columns.

A new field is held to the import's rules (``artemis.sinks.records.evolution_plan``: a
valid name, unique whatever its case, within the column budget) against the row in force
when it is written: a model no run could start with is never written."""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError

from artemis.db import get_engine, utcnow
from artemis.errors import ArtemisError
from artemis.logsetup import get_logger
from artemis.registry.models import DEFAULT_RESOURCE, RegProvRecordModel
from artemis.registry.resolve import current_row
from artemis.registry.writes import gray_switch
from artemis.sinks.records import RecordModelDecl, evolution_plan

log = get_logger(__name__)


def evolve_record_model(
    database_url: str,
    provenance_id: int,
    task_type: str | None,
    fields: dict[str, str],
    resource: str = DEFAULT_RESOURCE,
) -> bool:
    """Add ``fields`` (name → declared type) to the record model in force for
    ``task_type``; True when this call changed it. Two runs adding the same field at once
    (a backfill's windows) change it once: the second finds the field there. A field the
    import would refuse (the run checked them against its own model; another run may have
    added one since) is left out and logged."""
    for _ in range(3):
        try:
            with get_engine(database_url).begin() as conn:
                row = current_row(
                    conn, RegProvRecordModel, provenance_id, task_type, utcnow(), resource=resource
                )
                if row is None or row.fields_json is None:
                    return False
                new, skipped = evolution_plan(list(row.fields_json), fields)
                if skipped:
                    log.warning(
                        "record_model_fields_skipped",
                        provenance_id=provenance_id,
                        skipped=dict(list(skipped.items())[:20]),
                        count=len(skipped),
                    )
                if not new:
                    return False
                grown = {**row.fields_json, **new}
                try:
                    RecordModelDecl.model_validate({"key": row.key_json, "fields": grown})
                except ValidationError as e:  # (the plan's rules are the import's: defence)
                    log.warning("record_model_evolve_refused", error=str(e)[:300])
                    return False
                gray_switch(
                    conn,
                    RegProvRecordModel.__tablename__,
                    row.id,
                    {"fields_json": grown},
                    utcnow(),
                )
                log.info("record_model_evolved", provenance_id=provenance_id, fields=sorted(new))
                return True
        except (IntegrityError, ArtemisError) as e:  # another run switched it meanwhile
            log.info("record_model_evolve_raced", error=str(e)[:200])
    return False
