"""Bad records and schema drift: where a run's records are judged, once per record,
before any sink.

A page goes through the task's ``process`` and then the record model's check. A record
that either rejects is *bad*: with ``on_bad_record: quarantine`` (the default) it is
kept aside in ``quarantined_record`` with the reason (field path, error code, message),
the rest of its page goes on to every sink, and ``max_bad_records`` (a count, or a
percentage of the records fetched) bounds how many a run may set aside before it fails
``BAD_RECORDS``; with ``fail`` the first bad record fails the run. A page on which
*every* record breaks the same rule is not bad records but a source that changed under
us: ``SOURCE_CONTRACT``, whatever the policy.

A field the model does not name is drift: recorded once per run and field in
``schema_drift`` (with an example value), and then, by ``schema_contract``: ``discard``
drops it (the default), ``freeze`` fails the run ``SOURCE_CONTRACT``, ``evolve`` drops it
from this run and adds it to the provenance's record model (as nullable) for the next
runs — when the import's rules allow its name, at most ``schema.max_new_fields`` a run;
the others are recorded ``skipped`` with the reason. A field the model names that no
record of a page carries is drift too.

What the rows show is redacted as log lines are (``artemis.redact``): the reason, the
record key, the drift example. A record that holds a secret value (a key the source
echoes) is shown redacted and kept sealed for its replay (``RecordSeal``).

Quarantined records are replayed by their own run (``workflows/quarantine_replay.py``):
each one judged again by the task and model in force then, and landed under an
idempotency key of its own, fixed per quarantine row.
"""
