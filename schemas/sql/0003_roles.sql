-- Least privilege: three roles, and who owns the schema (README, "Roles and privileges").
--
--   ackline_migrator  NOLOGIN group role that owns every table, sequence and view. Whoever
--                     runs `ackline migrate` is a superuser or a member of it: from this
--                     migration on, sinks.migrate runs each later migration under
--                     SET LOCAL ROLE ackline_migrator, so what it creates is owned by
--                     ackline_migrator, not by the login that happened to run it.
--   ackline_ingest    LOGIN, the role `ackline run` connects as. INSERT only on the data
--                     tables (append-only by grants: no UPDATE, DELETE or TRUNCATE of
--                     activity or the ledger), SELECT where the writer reads (stored
--                     hashes, offsets, its own batch rows on reconcile), INSERT/UPDATE of
--                     consumer_offsets (claims and the fencing compare-and-set), USAGE of
--                     the batch id sequence. Its TEMP staging table needs TEMPORARY on the
--                     database, which PostgreSQL grants to PUBLIC by default (where a DBA
--                     revoked it: GRANT CONNECT, TEMPORARY ON DATABASE ... TO ackline_ingest).
--   ackline_reader    LOGIN, SELECT only: downstream readers and dashboards.
--
-- Roles are cluster-wide, grants are per database: CREATE ROLE is idempotent (checked in
-- pg_roles, and a concurrent migration of another database creating the same role is
-- tolerated), the GRANTs below apply to this database. LOGIN roles are created without a
-- password: they can log in only where pg_hba trusts them (the local dev stack); set one
-- with `ackline roles set-password ROLE` (or ALTER ROLE ... PASSWORD) in production.
--
-- RULE for every later migration: a migration that adds a table, view or sequence adds its
-- grants in the same file - SELECT to ackline_reader always, and to ackline_ingest exactly
-- what the worker needs (never UPDATE/DELETE/TRUNCATE of event data). Objects are owned by
-- ackline_migrator automatically (SET LOCAL ROLE above). tests/integration/test_privileges.py
-- fails when a table lacks the reader's SELECT or the ingest role holds more than its list.

DO $$
BEGIN
    -- Each CREATE ROLE tolerates a concurrent migration of another database creating it.
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_migrator') THEN
        BEGIN
            CREATE ROLE ackline_migrator NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_ingest') THEN
        BEGIN
            CREATE ROLE ackline_ingest LOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_reader') THEN
        BEGIN
            CREATE ROLE ackline_reader LOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
    -- ALTER ... OWNER TO below needs membership; a superuser has it already.
    IF NOT pg_has_role(current_user, 'ackline_migrator', 'MEMBER') THEN
        EXECUTE format('GRANT ackline_migrator TO %I', current_user);
    END IF;
END
$$;

-- Ownership of what 0001 and 0002 created (a no-op where ackline_migrator owns it already).
GRANT USAGE, CREATE ON SCHEMA public TO ackline_migrator;
ALTER TABLE schema_migrations OWNER TO ackline_migrator;
ALTER TABLE activity OWNER TO ackline_migrator;
ALTER TABLE txn_ledger OWNER TO ackline_migrator;
ALTER TABLE conflicts OWNER TO ackline_migrator;
ALTER TABLE rejects OWNER TO ackline_migrator;
ALTER TABLE consumer_offsets OWNER TO ackline_migrator;
ALTER TABLE ingest_batches OWNER TO ackline_migrator;
ALTER SEQUENCE ingest_batch_id_seq OWNER TO ackline_migrator;
ALTER TABLE feed_cursors OWNER TO ackline_migrator;
ALTER TABLE agent_runs OWNER TO ackline_migrator;

-- The ingest role: append-only on event data.
GRANT USAGE ON SCHEMA public TO ackline_ingest;
GRANT SELECT, INSERT ON TABLE activity, txn_ledger TO ackline_ingest;
GRANT INSERT ON TABLE conflicts, rejects TO ackline_ingest;
-- ON CONFLICT (...) DO NOTHING reads its arbiter columns: SELECT on those columns only.
GRANT SELECT (group_id, src_topic, src_partition, src_offset) ON TABLE conflicts TO ackline_ingest;
GRANT SELECT (group_id, src_topic, src_partition, src_offset) ON TABLE rejects TO ackline_ingest;
GRANT SELECT, INSERT ON TABLE ingest_batches TO ackline_ingest;
GRANT SELECT, INSERT, UPDATE ON TABLE consumer_offsets TO ackline_ingest;
GRANT USAGE ON SEQUENCE ingest_batch_id_seq TO ackline_ingest;

-- The reader role: SELECT only, on every table and view that exists now.
GRANT USAGE ON SCHEMA public TO ackline_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO ackline_reader;
