-- Time partitions, step 2 of 3 (docs/retention.md, "Converting a populated database").
--
-- The long work, done while ingest goes on: nothing here takes a lock that an INSERT or a
-- SELECT waits for (VALIDATE CONSTRAINT takes SHARE UPDATE EXCLUSIVE; reading activity
-- takes ACCESS SHARE). Workers keep writing into the unpartitioned table meanwhile.
--
-- 1. Validate 0006's bound: one scan of activity, without blocking writers.
-- 2. Copy the layer-2 dedup key of every stored event (event_id, its body hash and its
--    batch) into the table that becomes `event_keys` in 0008, sorted into its primary key
--    afterwards (an index build, not millions of random inserts). The snapshot the copy
--    read is kept: 0008 copies, under its short lock, the keys of exactly the batches that
--    snapshot did not see (`pg_visible_in_snapshot` on each batch's commit_xid).
--
-- This transaction holds an xid for as long as the copy runs: changefeed readers wait
-- for it (their horizon is the oldest open transaction), they never skip.

ALTER TABLE activity VALIDATE CONSTRAINT activity_legacy_bound;

CREATE TABLE activity_conversion (
    snap     pg_snapshot NOT NULL,
    taken_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE event_keys_backfill (
    event_id  uuid   NOT NULL,
    body_hash bytea  NOT NULL CHECK (octet_length(body_hash) = 32),
    batch_id  bigint NOT NULL
);

-- One statement, one snapshot: the one recorded is the one the copy read.
WITH recorded AS (
    INSERT INTO activity_conversion (snap) SELECT pg_current_snapshot()
)
INSERT INTO event_keys_backfill (event_id, body_hash, batch_id)
SELECT event_id, body_hash, batch_id FROM activity;

ALTER TABLE event_keys_backfill ADD CONSTRAINT event_keys_pkey PRIMARY KEY (event_id);
