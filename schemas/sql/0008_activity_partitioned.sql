-- Time partitions, step 3 of 3 (docs/retention.md): the switch, the key table, the
-- partition functions, retention.
--
-- `activity` becomes a table partitioned by `ingested_on`, the UTC day (of the database's
-- clock) on which the writer's transaction ran. Why ingest time and not `occurred_at`: an
-- event's place and its expiry must not depend on a producer's clock. Every row lands in
-- the partition of today, which exists ahead of time, so no event can find its partition
-- missing because its `occurred_at` is years in the past or the future; there is no
-- DEFAULT partition (which every later CREATE of a partition would have to scan under a
-- lock); old partitions are never written again, so retention drops them without racing
-- a writer, and only the newest partition's indexes are hot. Queries by `occurred_at`
-- scan every partition unless they also bound `ingested_on` (events are ingested soon
-- after they occur).
--
-- Global uniqueness leaves activity (a partitioned table's unique keys must contain the
-- partition key): layer 1 stays `txn_ledger` (txn_id), layer 2 is `event_keys` (event_id,
-- with the body hash and the batch), both unpartitioned and written in the batch's own
-- transaction. Retention and erasure never delete from them: the keys of dropped and
-- erased events stay, so a replay is a counted duplicate, never a new row.
--
-- Under this transaction's locks (milliseconds; they wait for the batch in flight, and
-- the next batch waits for this COMMIT): copy the keys of the batches 0007's copy did not
-- see, rename the old table to `activity_legacy`, create the partitioned `activity`, and
-- attach the old table as its first partition (no scan: 0006/0007 validated its bound)
-- or drop it if it is empty. Writers older than this migration write no `event_keys`
-- rows: `ingested_on` has no default on the new table, so their COPY fails loudly
-- instead (a worker of this version supplies it; see docs/retention.md, "Rollout").

SET LOCAL lock_timeout = '60s';

-- The fence of every batch updates consumer_offsets first: holding it here means no batch
-- is half-way through its transaction while the tables change under it.
LOCK TABLE consumer_offsets IN SHARE ROW EXCLUSIVE MODE;
LOCK TABLE activity IN ACCESS EXCLUSIVE MODE;

-- A view over activity would silently follow the renamed table: refuse.
DO $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM pg_depend AS d JOIN pg_rewrite AS r ON r.oid = d.objid
        WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = 'activity'::regclass
    ) THEN
        RAISE EXCEPTION 'a view depends on activity: drop it, migrate, and create it again'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END
$$;

-- The keys of the batches that committed after 0007's copy read its snapshot.
INSERT INTO event_keys_backfill (event_id, body_hash, batch_id)
SELECT a.event_id, a.body_hash, a.batch_id
FROM activity_conversion AS c
JOIN ingest_batches AS b
    ON b.commit_xid >= pg_snapshot_xmin(c.snap) AND NOT pg_visible_in_snapshot(b.commit_xid, c.snap)
JOIN activity AS a ON a.batch_id = b.batch_id;
DROP TABLE activity_conversion;

-- Layer 2 of dedup: one row per event ever inserted, kept when its activity row goes.
ALTER TABLE event_keys_backfill RENAME TO event_keys;

ALTER TABLE activity RENAME TO activity_legacy;
ALTER INDEX activity_pkey RENAME TO activity_legacy_pkey;
ALTER INDEX activity_request_idx RENAME TO activity_legacy_request_idx;
ALTER INDEX activity_agent_idx RENAME TO activity_legacy_agent_idx;
ALTER INDEX activity_batch_idx RENAME TO activity_legacy_batch_idx;

CREATE TABLE activity (
    event_id       uuid        NOT NULL,
    txn_id         text        NOT NULL,
    type           text        NOT NULL,
    agent_id       text        NOT NULL,
    request_id     text        NOT NULL,
    occurred_at    timestamptz NOT NULL,
    schema_version integer     NOT NULL,
    payload        jsonb       NOT NULL,
    body_hash      bytea       NOT NULL,
    src_topic      text        NOT NULL,
    src_partition  integer     NOT NULL,
    src_offset     bigint      NOT NULL,
    batch_id       bigint      NOT NULL,
    ingested_at    timestamptz NOT NULL DEFAULT now(),
    ingested_on    date        NOT NULL,  -- no default: see the header
    -- named as the old table's, so that the old table attaches as a partition
    CONSTRAINT activity_body_hash_check CHECK (octet_length(body_hash) = 32)
) PARTITION BY RANGE (ingested_on);

-- Which partitions ackline made, and until when each one's rows were ingested (its upper
-- day at 00:00 UTC; for activity_legacy, the moment of this switch). Retention drops a
-- partition once ends_before is older than the retention period.
CREATE TABLE activity_partitions (
    name        text        PRIMARY KEY,
    lower_day   date        NOT NULL,
    upper_day   date        NOT NULL,
    ends_before timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (lower_day < upper_day)
);

-- Whoever could use the old table can use the new one (the roles of later migrations,
-- a dashboard's login); the ingest role's rights are restated below.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT a.privilege_type AS privilege, r.rolname AS grantee
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        JOIN pg_roles AS r ON r.oid = a.grantee
        WHERE c.oid = 'activity_legacy'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON TABLE activity TO %I', g.privilege, g.grantee);
    END LOOP;
END
$$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM activity_legacy LIMIT 1) THEN
        ALTER TABLE activity ATTACH PARTITION activity_legacy
            FOR VALUES FROM (MINVALUE) TO ('0001-01-01');
        INSERT INTO activity_partitions (name, lower_day, upper_day, ends_before)
        VALUES ('activity_legacy', '-infinity', '0001-01-01', clock_timestamp());
        -- Through the parent only, like every partition.
        REVOKE ALL ON TABLE activity_legacy FROM ackline_ingest;
    ELSE
        DROP TABLE activity_legacy;
    END IF;
END
$$;

-- The indexes of the old table, on every partition (the old table's own are attached,
-- not rebuilt). event_id is indexed per partition by ackline_ensure_partitions_at (the
-- old table's unique index cannot be attached to a non-unique parent index).
CREATE INDEX activity_request_idx ON activity (request_id);
CREATE INDEX activity_agent_idx ON activity (agent_id, occurred_at);
CREATE INDEX activity_batch_idx ON activity (batch_id, src_partition, src_offset);

-- Partitions of [at's UTC day, + ahead intervals], made of whole days or whole ISO weeks;
-- a range that an existing partition covers in part (the interval changed) is filled
-- around it. Each is created empty and then attached, which locks the parent in SHARE
-- UPDATE EXCLUSIVE mode only: ingest and readers go on. Serialized by an advisory lock.
-- Returns the partitions it created. The operator's clock: the ingest role calls
-- ackline_ensure_partitions, which passes now(). SECURITY DEFINER, executable by its
-- owner's members only: whoever calls it, ackline_migrator owns what it makes.
CREATE FUNCTION ackline_ensure_partitions_at(at timestamptz, step text, ahead integer)
RETURNS TABLE (partition_name text, from_day date, until_day date)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, public
SET lock_timeout = '10s'
AS $$
DECLARE
    today date := (at AT TIME ZONE 'UTC')::date;
    width integer;
    slot date;
    slot_end date;
    lo date;
    hi date;
    made text;
    -- A partition made by CREATE TABLE … LIKE and ATTACH lands in default_tablespace, not
    -- in its parent's: each one is put where activity is (ackline_activity_tablespace).
    space name := (SELECT t.spcname FROM pg_class AS c JOIN pg_tablespace AS t
                   ON t.oid = c.reltablespace WHERE c.oid = 'public.activity'::regclass);
BEGIN
    IF step = 'day' THEN
        width := 1;
        slot := today;
    ELSIF step = 'week' THEN
        width := 7;
        slot := today - (extract(isodow FROM today)::integer - 1);
    ELSE
        RAISE EXCEPTION 'the partition interval is day or week, not %', step
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ahead IS NULL OR ahead < 0 OR ahead * width > 366 THEN
        RAISE EXCEPTION 'partitions may be made 0 to 366 days ahead, not % intervals of %',
            ahead, step USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_advisory_xact_lock(1094929232);  -- "ACKP"
    -- Forget partitions that were detached or dropped behind ackline's back.
    DELETE FROM activity_partitions AS p
    WHERE NOT EXISTS (
        SELECT 1 FROM pg_inherits AS i
        WHERE i.inhparent = 'public.activity'::regclass
          AND i.inhrelid = to_regclass(format('public.%I', p.name)));
    FOR n IN 0..ahead LOOP
        slot_end := slot + width;
        lo := slot;
        WHILE lo < slot_end LOOP
            SELECT p.upper_day INTO hi FROM activity_partitions AS p
            WHERE p.lower_day <= lo AND lo < p.upper_day;
            IF FOUND THEN
                lo := hi;
                CONTINUE;
            END IF;
            SELECT least(slot_end, min(p.lower_day)) INTO hi FROM activity_partitions AS p
            WHERE p.lower_day > lo;
            made := 'activity_p' || to_char(lo, 'YYYYMMDD');
            EXECUTE format(
                'CREATE TABLE public.%I (LIKE public.activity INCLUDING DEFAULTS '
                'INCLUDING CONSTRAINTS INCLUDING STORAGE)', made);
            IF space IS NOT NULL THEN
                EXECUTE format('ALTER TABLE public.%I SET TABLESPACE %I', made, space);
            END IF;
            EXECUTE format('CREATE INDEX %I ON public.%I (event_id)', made || '_event_idx', made);
            EXECUTE format(
                'ALTER TABLE public.activity ATTACH PARTITION public.%I FOR VALUES FROM (%L) TO (%L)',
                made, lo, hi);
            EXECUTE format('GRANT SELECT ON TABLE public.%I TO ackline_reader', made);
            INSERT INTO activity_partitions (name, lower_day, upper_day, ends_before)
            VALUES (made, lo, hi, hi::timestamp AT TIME ZONE 'UTC');
            partition_name := made;
            from_day := lo;
            until_day := hi;
            RETURN NEXT;
            lo := hi;
        END LOOP;
        slot := slot_end;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION ackline_ensure_partitions_at(timestamptz, text, integer) FROM PUBLIC;

-- Put activity on a tablespace (run by its owner or a superuser, and a member of
-- ackline_migrator): the parent (where partitions made later go) and every partition it
-- has, each rewritten under an ACCESS EXCLUSIVE lock (ingest waits while a partition
-- moves: run it on an empty or small table, or in a quiet hour). The heaps
-- move; the indexes stay where they are (ALTER INDEX … SET TABLESPACE moves one).
CREATE FUNCTION ackline_activity_tablespace(space name)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, public
AS $$
DECLARE
    part regclass;
    moved integer := 0;
BEGIN
    -- Partitions made later are made by ackline_migrator (ackline_ensure_partitions_at).
    EXECUTE format('GRANT CREATE ON TABLESPACE %I TO ackline_migrator', space);
    EXECUTE format('ALTER TABLE public.activity SET TABLESPACE %I', space);
    FOR part IN
        SELECT i.inhrelid::regclass FROM pg_inherits AS i
        WHERE i.inhparent = 'public.activity'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s SET TABLESPACE %I', part, space);
        moved := moved + 1;
    END LOOP;
    RETURN moved;
END
$$;
REVOKE ALL ON FUNCTION ackline_activity_tablespace(name) FROM PUBLIC;

-- What a worker (the ingest role) may run: the same, on the database's clock. Creating
-- empty partitions ahead is all it can do with it.
CREATE FUNCTION ackline_ensure_partitions(step text, ahead integer)
RETURNS TABLE (partition_name text, from_day date, until_day date)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, public
AS $$ SELECT * FROM public.ackline_ensure_partitions_at(now(), step, ahead) $$;
REVOKE ALL ON FUNCTION ackline_ensure_partitions(text, integer) FROM PUBLIC;

-- Retention. The operator's policy: workers with ACKLINE_RETENTION drop partitions only
-- when the operator has set min_keep, and never keep less than it (the ingest role cannot
-- drop anything the operator did not already let go). `ackline retention apply` sets it.
CREATE TABLE retention_policy (
    singleton boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    min_keep  interval    CHECK (min_keep >= interval '0'),
    set_by    text,
    set_at    timestamptz
);
INSERT INTO retention_policy DEFAULT VALUES;

-- One row per dropped partition. snap: the snapshot taken once the partition was
-- detached, so the batches it shows as visible are exactly those whose rows went with it
-- (verify uses it). readers_behind: changefeed readers that had not read all of it (only
-- a forced drop leaves any).
CREATE TABLE retention_drops (
    drop_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition_name text        NOT NULL,
    lower_day      date        NOT NULL,
    upper_day      date        NOT NULL,
    ends_before    timestamptz NOT NULL,
    approx_rows    bigint      NOT NULL,
    forced         boolean     NOT NULL,
    readers_behind text[]      NOT NULL,
    snap           pg_snapshot NOT NULL,
    dropped_by     text        NOT NULL DEFAULT session_user,
    dropped_at     timestamptz NOT NULL DEFAULT now()
);

-- Detach and drop every partition whose rows were all ingested before cutoff, unless a
-- changefeed reader has not read all of its batches (then it is kept and reported, or
-- dropped anyway with force). The dedup keys stay (event_keys, txn_ledger). Detaching
-- locks the parent in ACCESS EXCLUSIVE mode: briefly, after the batch in flight; at most
-- lock_timeout behind a long reader, then the drop fails and is tried again later.
CREATE FUNCTION ackline_drop_partitions_before(cutoff timestamptz, force boolean)
RETURNS TABLE (partition_name text, from_day date, until_day date, dropped boolean,
               readers_behind text[])
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, public
SET lock_timeout = '10s'
AS $$
DECLARE
    p record;
    newest xid8;
    behind text[];
BEGIN
    PERFORM pg_advisory_xact_lock(1094929232);  -- "ACKP"
    FOR p IN
        SELECT ap.name, ap.lower_day, ap.upper_day, ap.ends_before
        FROM activity_partitions AS ap
        JOIN pg_inherits AS i
            ON i.inhrelid = to_regclass(format('public.%I', ap.name))
           AND i.inhparent = 'public.activity'::regclass
        WHERE ap.ends_before <= cutoff
        ORDER BY ap.lower_day
    LOOP
        -- The newest batch whose transaction ran on the partition's days.
        SELECT max(b.commit_xid) INTO newest FROM ingest_batches AS b
        WHERE b.committed_at < p.ends_before
          AND b.committed_at >= (p.lower_day::timestamp AT TIME ZONE 'UTC');
        behind := ARRAY(
            SELECT c.reader FROM feed_cursors AS c
            WHERE newest IS NOT NULL
              AND (c.position < newest OR (c.position = newest AND c.within_batch IS NOT NULL))
            ORDER BY c.reader);
        partition_name := p.name;
        from_day := p.lower_day;
        until_day := p.upper_day;
        readers_behind := behind;
        IF cardinality(behind) > 0 AND NOT force THEN
            dropped := false;
            RETURN NEXT;
            CONTINUE;
        END IF;
        EXECUTE format('ALTER TABLE public.activity DETACH PARTITION public.%I', p.name);
        INSERT INTO retention_drops
            (partition_name, lower_day, upper_day, ends_before, approx_rows, forced,
             readers_behind, snap)
        SELECT p.name, p.lower_day, p.upper_day, p.ends_before,
               greatest(c.reltuples, 0)::bigint, cardinality(behind) > 0, behind,
               pg_current_snapshot()
        FROM pg_class AS c WHERE c.oid = to_regclass(format('public.%I', p.name));
        EXECUTE format('DROP TABLE public.%I', p.name);
        DELETE FROM activity_partitions AS ap WHERE ap.name = p.name;
        dropped := true;
        RETURN NEXT;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION ackline_drop_partitions_before(timestamptz, boolean) FROM PUBLIC;

-- What a worker with ACKLINE_RETENTION runs: drop what is older than its setting or the
-- operator's min_keep, whichever keeps more; nothing while no min_keep is set; never
-- forced (a reader that is behind keeps its partitions).
CREATE FUNCTION ackline_apply_retention(keep interval)
RETURNS TABLE (partition_name text, from_day date, until_day date, dropped boolean,
               readers_behind text[])
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, public
AS $$
DECLARE
    least_keep interval := (SELECT r.min_keep FROM public.retention_policy AS r);
BEGIN
    IF least_keep IS NULL OR keep IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
        SELECT * FROM public.ackline_drop_partitions_before(now() - greatest(keep, least_keep), false);
END
$$;
REVOKE ALL ON FUNCTION ackline_apply_retention(interval) FROM PUBLIC;

-- Erasure (docs/retention.md, "Erasure"; `ackline erase`, role ackline_eraser of 0009):
-- the activity rows of an agent, a request or one event are deleted in one transaction,
-- their keys and hashes stay as tombstones, and the audit row says who erased what, when.
--
-- The audit row: who (the login, even under SET ROLE), what (the selector and its
-- value, how many rows of each kind, the dead-letter records that cannot be erased),
-- when. No content. commit_xid places the erasure in the changefeed: every reader meets
-- one `ackline.erased` notice per erased event at this point of the feed.
CREATE TABLE erasures (
    erasure_id   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    selector     text        NOT NULL CHECK (selector IN ('agent', 'request', 'event')),
    value        text        NOT NULL,
    reason       text        NOT NULL DEFAULT '',
    requested_by text        NOT NULL DEFAULT session_user,
    events       bigint      NOT NULL DEFAULT 0,
    conflicts    bigint      NOT NULL DEFAULT 0,
    rejects      bigint      NOT NULL DEFAULT 0,
    dead_letters jsonb       NOT NULL DEFAULT '[]',
    commit_xid   xid8        NOT NULL DEFAULT pg_current_xact_id(),
    erased_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX erasures_commit_xid_idx ON erasures (commit_xid);

-- Tombstones: the keys, hash and coordinates of each erased event, no content.
CREATE TABLE erased_events (
    event_id      uuid    PRIMARY KEY,
    txn_id        text    NOT NULL,
    body_hash     bytea   NOT NULL,
    batch_id      bigint  NOT NULL,
    src_topic     text    NOT NULL,
    src_partition integer NOT NULL,
    src_offset    bigint  NOT NULL,
    erasure_id    bigint  NOT NULL REFERENCES erasures
);
CREATE INDEX erased_events_erasure_idx
    ON erased_events (erasure_id, batch_id, src_partition, src_offset);

-- An erased conflict keeps its keys, hashes and coordinates; its incoming body goes.
ALTER TABLE conflicts ALTER COLUMN incoming_body DROP NOT NULL;
ALTER TABLE conflicts ADD COLUMN erasure_id bigint;
-- An erased reject keeps its reason and coordinates; its raw key, value, headers and
-- detail go (the dead-letter copy stays in Kafka: the erasure lists its offsets).
ALTER TABLE rejects ADD COLUMN erasure_id bigint;

-- A conflict against an erased event keeps no body either: the writer stores NULL with
-- the erasure's id (a replay must not bring erased content back through the quarantine).

-- Today's partition and the next two days', so a new database ingests at once; workers
-- keep making them ahead (ACKLINE_PARTITION_INTERVAL, ACKLINE_PARTITIONS_AHEAD).
SELECT count(*) FROM ackline_ensure_partitions_at(now(), 'day', 2);

-- Grants (the rule of 0003_roles.sql; 0010_roles.sql restates the whole model).
GRANT SELECT, INSERT ON TABLE activity, event_keys TO ackline_ingest;
GRANT SELECT ON TABLE retention_policy, erased_events TO ackline_ingest;
GRANT EXECUTE ON FUNCTION ackline_ensure_partitions(text, integer) TO ackline_ingest;
GRANT EXECUTE ON FUNCTION ackline_apply_retention(interval) TO ackline_ingest;
GRANT SELECT ON TABLE activity, event_keys, activity_partitions, retention_policy,
    retention_drops, erasures, erased_events TO ackline_reader;

-- Every other role that reads the changefeed (SELECT on ingest_batches and activity: the
-- roles of later migrations, a dashboard's login) reads its erasure notices too.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT rolname FROM pg_roles
        WHERE rolname NOT IN ('ackline_ingest', 'ackline_reader', 'ackline_eraser',
                              'ackline_migrator')
          AND NOT rolsuper AND rolname NOT LIKE 'pg\_%'
          AND has_table_privilege(oid, 'ingest_batches', 'SELECT')
          AND has_table_privilege(oid, 'activity', 'SELECT')
    LOOP
        EXECUTE format('GRANT SELECT ON TABLE erasures, erased_events TO %I', r.rolname);
    END LOOP;
END
$$;
