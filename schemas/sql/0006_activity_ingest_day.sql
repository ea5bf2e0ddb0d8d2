-- Time partitions, step 1 of 3 (docs/retention.md, "Converting a populated database").
--
-- `activity` becomes a table partitioned by `ingested_on`, the UTC day its row was
-- ingested (0008). The rows already stored become ONE partition, `activity_legacy`,
-- attached without a scan: PostgreSQL skips the scan when a validated CHECK constraint
-- proves every row is inside the partition's bounds. Those rows get the marker day
-- '-infinity' through a constant column default, which PostgreSQL stores once in the
-- catalog (no rewrite), and the bound is a CHECK added NOT VALID here (no scan) and
-- validated by 0007 under a lock that does not stop ingest. Every row a worker writes
-- into this table until 0008 gets the marker too, so the CHECK can never refuse one.
--
-- Cost: two catalog changes under an ACCESS EXCLUSIVE lock held for milliseconds; the
-- lock waits for the batch in flight, and the next batch waits for this COMMIT.

SET LOCAL lock_timeout = '60s';

ALTER TABLE activity ADD COLUMN ingested_on date NOT NULL DEFAULT '-infinity';
ALTER TABLE activity
    ADD CONSTRAINT activity_legacy_bound CHECK (ingested_on < DATE '0001-01-01') NOT VALID;
