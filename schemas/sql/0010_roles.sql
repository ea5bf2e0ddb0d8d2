-- The least-privilege model as of this migration, in one file (docs/roles.md).
--
-- `ackline doctor` and `ackline roles` compare a live database with the newest migration
-- whose name says roles (sinks/admin/grants.py): this one restates 0003_roles.sql with
-- what 0004 (processors), 0008 (event_keys, partitions, retention) and 0009 (erasure)
-- added. Every statement
-- is idempotent; nothing here changes a database that ran 0003-0009.
--
--   ackline_migrator  NOLOGIN, owns every table, view, sequence and function (partitions
--                     too: the partition functions run as their owner).
--   ackline_ingest    `ackline run`: appends. INSERT into activity (through the
--                     partitioned parent only), txn_ledger, event_keys, conflicts,
--                     rejects, ingest_batches; SELECT where the writer reads; claims and
--                     the fence on consumer_offsets; EXECUTE of ackline_ensure_partitions
--                     (empty partitions ahead, on the database's clock) and
--                     ackline_apply_retention (never below the operator's min_keep);
--                     SELECT on erased_events (a conflict with an erased event keeps
--                     no body).
--                     No UPDATE, DELETE or TRUNCATE of anything that holds events.
--   ackline_reader    SELECT only, on every table and view.
--   ackline_processor `ackline process` (0004_processors.sql): reads the feed (activity,
--                     ingest_batches, and the erasure notices in erasures and
--                     erased_events), writes its own cursors, status and tables.
--   ackline_eraser    `ackline erase`: DELETE of activity rows, the body columns of
--                     conflicts and rejects, the audit and tombstone rows. Nothing else.

DO $$
DECLARE
    was text := current_user;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_migrator')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_ingest')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_reader')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_processor')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_eraser') THEN
        RESET ROLE;
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_migrator') THEN
            CREATE ROLE ackline_migrator NOLOGIN;
        END IF;
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_ingest') THEN
            CREATE ROLE ackline_ingest LOGIN;
        END IF;
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_reader') THEN
            CREATE ROLE ackline_reader LOGIN;
        END IF;
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_processor') THEN
            CREATE ROLE ackline_processor LOGIN;
        END IF;
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_eraser') THEN
            CREATE ROLE ackline_eraser LOGIN;
        END IF;
        EXECUTE format('SET LOCAL ROLE %I', was);
    END IF;
END
$$;

-- The ingest role: append-only on event data.
GRANT USAGE ON SCHEMA public TO ackline_ingest;
GRANT SELECT, INSERT ON TABLE activity, txn_ledger, event_keys TO ackline_ingest;
GRANT INSERT ON TABLE conflicts, rejects TO ackline_ingest;
-- ON CONFLICT (...) DO NOTHING reads its arbiter columns: SELECT on those columns only.
GRANT SELECT (group_id, src_topic, src_partition, src_offset) ON TABLE conflicts TO ackline_ingest;
GRANT SELECT (group_id, src_topic, src_partition, src_offset) ON TABLE rejects TO ackline_ingest;
GRANT SELECT, INSERT ON TABLE ingest_batches TO ackline_ingest;
GRANT SELECT, INSERT, UPDATE ON TABLE consumer_offsets TO ackline_ingest;
GRANT SELECT ON TABLE retention_policy, erased_events TO ackline_ingest;
GRANT USAGE ON SEQUENCE ingest_batch_id_seq TO ackline_ingest;
GRANT EXECUTE ON FUNCTION ackline_ensure_partitions(text, integer) TO ackline_ingest;
GRANT EXECUTE ON FUNCTION ackline_apply_retention(interval) TO ackline_ingest;

-- The eraser role.
GRANT USAGE ON SCHEMA public TO ackline_eraser;
GRANT SELECT, DELETE ON TABLE activity TO ackline_eraser;
GRANT SELECT ON TABLE event_keys, conflicts, rejects TO ackline_eraser;
GRANT UPDATE (incoming_body, erasure_id) ON TABLE conflicts TO ackline_eraser;
GRANT UPDATE (raw_key, raw_value, headers, detail, erasure_id) ON TABLE rejects TO ackline_eraser;
GRANT SELECT, INSERT ON TABLE erasures, erased_events TO ackline_eraser;
GRANT UPDATE (events, conflicts, rejects, dead_letters) ON TABLE erasures TO ackline_eraser;

-- The processor role (row-level security narrows its feed_cursors and processors rows:
-- 0004_processors.sql).
GRANT USAGE ON SCHEMA public TO ackline_processor;
GRANT SELECT ON TABLE activity, ingest_batches, erasures, erased_events TO ackline_processor;
GRANT SELECT, INSERT, UPDATE ON TABLE feed_cursors TO ackline_processor;
GRANT SELECT, INSERT ON TABLE processors TO ackline_processor;
GRANT UPDATE (failed_at, error, error_event_id, error_cursor, last_instance, last_seen_at)
    ON TABLE processors TO ackline_processor;
GRANT SELECT, INSERT, UPDATE ON TABLE runs, agent_runs TO ackline_processor;
GRANT SELECT, INSERT ON TABLE run_facts TO ackline_processor;
GRANT SELECT ON TABLE runs_stuck TO ackline_processor;
GRANT EXECUTE ON FUNCTION ackline_reader_exists(text) TO ackline_processor;

-- The reader role: SELECT only, on every table and view (partitions get theirs when
-- they are made).
GRANT USAGE ON SCHEMA public TO ackline_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO ackline_reader;
