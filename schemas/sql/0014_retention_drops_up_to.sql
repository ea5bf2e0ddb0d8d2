-- What each retention drop took of the changefeed, recorded when it drops: the newest
-- transaction (commit_xid) of the batches that had committed rows of its days when it
-- dropped them. A reader that starts from a cursor before it says so (docs/retention.md,
-- "Readers first"), and `processors reset` refuses a rebuild from there (the feed no
-- longer holds those events). Worked out at each reader's start, it joined every drop with
-- every batch on a time range (no index serves it): 85 s for a year of history (301
-- drops, 3M batches), before every `ackline tail` and every processor's start. Once per
-- drop it is one scan of ingest_batches, beside the one the readers' check makes.
--
-- Only batches visible in the snapshot the drop recorded count: it is taken after DETACH,
-- which waits for any batch in flight on the partition, so every batch that wrote the
-- partition is in it; a batch of the same day that committed after the drop wrote a
-- partition made anew, which the feed still holds. NULL: the drop took no batch's rows.
ALTER TABLE retention_drops ADD COLUMN up_to xid8;

-- The trigger below and ackline_readers_behind (twice per dropped partition, 0011) find a
-- drop's batches by committed_at: each scanned the whole table (about 0.7-1 s at 3M
-- batches, a review measured) while the drop held activity's ACCESS EXCLUSIVE lock, which
-- stops ingest and every reader. The build takes a SHARE lock on ingest_batches, held
-- until this migration commits (the build and the backfill below): a worker's batch
-- waits for it. To keep that short on a large table, build the index beforehand with
-- CREATE INDEX CONCURRENTLY under this name; this migration then keeps it, unless that
-- build failed and left it INVALID (never used): then it is built again here.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index AS i
               WHERE i.indexrelid = to_regclass('public.ingest_batches_committed_at_idx')
                 AND NOT i.indisvalid) THEN
        DROP INDEX public.ingest_batches_committed_at_idx;
    END IF;
END
$$;
CREATE INDEX IF NOT EXISTS ingest_batches_committed_at_idx ON ingest_batches (committed_at);

CREATE FUNCTION ackline_drop_up_to() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    NEW.up_to := (
        SELECT max(b.commit_xid) FROM public.ingest_batches AS b
        WHERE b.inserted > 0
          AND b.committed_at >= (NEW.lower_day::timestamp AT TIME ZONE 'UTC')
          AND b.committed_at < NEW.ends_before
          AND pg_visible_in_snapshot(b.commit_xid, NEW.snap));
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION ackline_drop_up_to() FROM PUBLIC;

CREATE TRIGGER retention_drops_up_to BEFORE INSERT ON retention_drops
    FOR EACH ROW EXECUTE FUNCTION ackline_drop_up_to();

-- The drops made before this migration: one scan of ingest_batches (the newest
-- transaction of each UTC day), then each day that began before the drop's end. A last
-- day that ends_before falls inside is counted whole (the first partition's end is the
-- moment of migration 0008),
-- and a batch of a dropped day that committed after its drop is counted too: a reader is
-- then told of a gap it may not have, never not told of one it has.
WITH days AS (
    SELECT (b.committed_at AT TIME ZONE 'UTC')::date AS day, max(b.commit_xid) AS xid
    FROM ingest_batches AS b
    WHERE b.inserted > 0
    GROUP BY 1
), took AS (
    SELECT d.drop_id, max(days.xid) AS xid
    FROM retention_drops AS d
    JOIN days ON days.day >= d.lower_day
             AND (days.day::timestamp AT TIME ZONE 'UTC') < d.ends_before
    GROUP BY d.drop_id
)
UPDATE retention_drops AS d SET up_to = took.xid FROM took WHERE took.drop_id = d.drop_id;

-- The processor role tells too: the columns that say which days went, how far into the
-- feed, and which stored readers a forced drop left behind (one left at the start is
-- warned, not told as a new reader is; the names of other readers, which feed_cursors'
-- row security hides from it, are then visible to it: names only), not who dropped them.
-- The reader role's SELECT on every table (0010) covers the new column.
GRANT SELECT (drop_id, partition_name, ends_before, readers_behind, up_to)
    ON TABLE retention_drops TO ackline_processor;
