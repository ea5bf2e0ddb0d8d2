-- SECURITY DEFINER functions run with their owner's rights, so nothing the caller makes
-- may change what their names mean. Their search_path was `pg_catalog, public`: without
-- pg_temp named, PostgreSQL searches the session's temporary schema FIRST for tables, and
-- every role may create temporary tables. A worker's role could shadow
-- activity_partitions, feed_cursors and retention_drops with temp tables of its own and
-- make ackline_apply_retention drop today's partition, with no audit row and no check of
-- the changefeed readers (a review reproduced it). pg_temp is now named last, as the
-- PostgreSQL manual says ("Writing SECURITY DEFINER Functions Safely"), and the drop
-- function names every table with its schema.
--
-- The drop function also looks at the changefeed readers again once the partition is
-- detached. It looked before only: DETACH waits for the batch in flight, and a batch whose
-- transaction began on the partition's last day (before midnight UTC) could commit into it
-- while DETACH waited, unseen by that look, and be dropped unread. After DETACH no batch
-- can write the partition any more; a reader behind then undoes this partition's detach
-- (a subtransaction) and keeps it, unless forced.

ALTER FUNCTION ackline_reader_exists(text) SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION ackline_ensure_partitions_at(timestamptz, text, integer)
    SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION ackline_ensure_partitions(text, integer)
    SET search_path = pg_catalog, public, pg_temp;
ALTER FUNCTION ackline_apply_retention(interval) SET search_path = pg_catalog, public, pg_temp;

-- The changefeed readers that have not read every batch whose transaction ran on the days
-- [lower_day, ends_before) (0008's test, shared by both looks above). Not SECURITY
-- DEFINER: called by the drop function, with its rights. Volatile (the default): each
-- call reads a snapshot of its own.
CREATE FUNCTION ackline_readers_behind(lower_day date, ends_before timestamptz)
RETURNS text[]
LANGUAGE sql
SET search_path = pg_catalog, public, pg_temp
AS $$
    WITH newest AS (
        SELECT max(b.commit_xid) AS xid FROM public.ingest_batches AS b
        WHERE b.committed_at < ends_before
          AND b.committed_at >= (lower_day::timestamp AT TIME ZONE 'UTC')
    )
    SELECT ARRAY(
        SELECT c.reader FROM public.feed_cursors AS c, newest AS n
        WHERE n.xid IS NOT NULL
          AND (c.position < n.xid OR (c.position = n.xid AND c.within_batch IS NOT NULL))
        ORDER BY c.reader)
$$;
REVOKE ALL ON FUNCTION ackline_readers_behind(date, timestamptz) FROM PUBLIC;

CREATE OR REPLACE FUNCTION ackline_drop_partitions_before(cutoff timestamptz, force boolean)
RETURNS TABLE (partition_name text, from_day date, until_day date, dropped boolean,
               readers_behind text[])
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
SET lock_timeout = '10s'
AS $$
DECLARE
    p record;
    behind text[];
BEGIN
    PERFORM pg_advisory_xact_lock(1094929232);  -- "ACKP"
    FOR p IN
        SELECT ap.name, ap.lower_day, ap.upper_day, ap.ends_before
        FROM public.activity_partitions AS ap
        JOIN pg_catalog.pg_inherits AS i
            ON i.inhrelid = to_regclass(format('public.%I', ap.name))
           AND i.inhparent = 'public.activity'::regclass
        WHERE ap.ends_before <= cutoff
        ORDER BY ap.lower_day
    LOOP
        partition_name := p.name;
        from_day := p.lower_day;
        until_day := p.upper_day;
        behind := public.ackline_readers_behind(p.lower_day, p.ends_before);
        IF cardinality(behind) > 0 AND NOT force THEN
            readers_behind := behind;
            dropped := false;
            RETURN NEXT;
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE format('ALTER TABLE public.activity DETACH PARTITION public.%I', p.name);
            -- DETACH waited for the batch in flight: look again (a new snapshot), now
            -- that no batch can write this partition.
            behind := public.ackline_readers_behind(p.lower_day, p.ends_before);
            IF cardinality(behind) > 0 AND NOT force THEN
                RAISE EXCEPTION 'readers behind' USING ERRCODE = 'AKRB1';
            END IF;
            INSERT INTO public.retention_drops
                (partition_name, lower_day, upper_day, ends_before, approx_rows, forced,
                 readers_behind, snap)
            SELECT p.name, p.lower_day, p.upper_day, p.ends_before,
                   greatest(c.reltuples, 0)::bigint, cardinality(behind) > 0, behind,
                   pg_current_snapshot()
            FROM pg_catalog.pg_class AS c WHERE c.oid = to_regclass(format('public.%I', p.name));
            EXECUTE format('DROP TABLE public.%I', p.name);
            DELETE FROM public.activity_partitions AS ap WHERE ap.name = p.name;
            dropped := true;
        EXCEPTION WHEN SQLSTATE 'AKRB1' THEN
            dropped := false;  -- the detach is undone: the partition stays, attached
        END;
        readers_behind := behind;
        RETURN NEXT;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION ackline_drop_partitions_before(timestamptz, boolean) FROM PUBLIC;

-- The same functions still resolve functions and operators through public (format,
-- to_regclass, =): one there with a closer signature would win over pg_catalog's and run
-- with the owner's rights. PostgreSQL 15 makes databases where PUBLIC may not create in
-- public; a database upgraded from an older version still lets every role do so. Take that
-- right away, as the migrating user (out of ackline_migrator, which does not own the
-- schema, and back in); a user who may not gets a WARNING and should run it as the
-- schema's owner: REVOKE CREATE ON SCHEMA public FROM PUBLIC.
DO $$
DECLARE
    was text := current_user;
BEGIN
    RESET ROLE;
    REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    EXECUTE format('SET LOCAL ROLE %I', was);
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'could not revoke CREATE on schema public from PUBLIC (%)', SQLERRM;
END
$$;
