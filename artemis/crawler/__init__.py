"""Crawler operations (docs/operations.md): cookie vault and pool, record locks and
reclaim, idempotent note writes."""
