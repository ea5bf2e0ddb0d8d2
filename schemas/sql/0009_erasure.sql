-- Erasure (docs/retention.md, "Erasure"): the role that may erase. The tables it writes
-- (erasures, erased_events, and the erasure_id columns of conflicts and rejects) are made
-- by 0008, with everything else the writer and the changefeed of this version read.
--
-- Role: ackline_eraser (LOGIN), what `ackline erase` runs as (SET ROLE when the operator
-- is a member, else its own login). It may DELETE activity rows, blank the bodies kept in
-- conflicts and rejects, and write the audit and tombstone rows. The ingest role still
-- cannot delete anything.

-- CREATE ROLE needs the migrating user's CREATEROLE, not ackline_migrator's: step out of
-- the migrator role for it, and back in (sinks.migrate sets it for every migration).
DO $$
DECLARE
    was text := current_user;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_eraser') THEN
        RESET ROLE;
        BEGIN
            CREATE ROLE ackline_eraser LOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
        EXECUTE format('SET LOCAL ROLE %I', was);
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO ackline_eraser;
GRANT SELECT, DELETE ON TABLE activity TO ackline_eraser;
GRANT SELECT ON TABLE event_keys, conflicts, rejects TO ackline_eraser;
GRANT UPDATE (incoming_body, erasure_id) ON TABLE conflicts TO ackline_eraser;
GRANT UPDATE (raw_key, raw_value, headers, detail, erasure_id) ON TABLE rejects TO ackline_eraser;
GRANT SELECT, INSERT ON TABLE erasures, erased_events TO ackline_eraser;
GRANT UPDATE (events, conflicts, rejects, dead_letters) ON TABLE erasures TO ackline_eraser;
