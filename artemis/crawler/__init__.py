"""Crawler operations (seed 004, SPEC §10): cookie vault and pool, record locks and
reclaim, idempotent note writes."""
