-- A processor tells, as it starts, whether retention dropped events after its cursor
-- (docs/retention.md, "Readers first"): it reads what each drop took from
-- retention_drops and ingest_batches (ackline.sinks.feed.gaps). The processor role
-- already reads ingest_batches (0010); of retention_drops it needs only the columns that
-- say which days went and when, not who dropped them or which readers they left behind.
-- The reader role's SELECT on every table (0010) covers it already.
GRANT SELECT (drop_id, partition_name, lower_day, ends_before, dropped_at, snap)
    ON TABLE retention_drops TO ackline_processor;
