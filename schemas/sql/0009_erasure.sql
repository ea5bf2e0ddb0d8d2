-- Erasure (docs/retention.md, "Erasure"): remove the bodies of an agent's, a request's or
-- one event's activity in one transaction, keep their keys and hashes as tombstones, and
-- record who erased what and when. A later replay of an erased event meets its keys
-- (txn_ledger, event_keys) and is a counted duplicate, never a new row.
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

GRANT USAGE ON SCHEMA public TO ackline_eraser;
GRANT SELECT, DELETE ON TABLE activity TO ackline_eraser;
GRANT SELECT ON TABLE event_keys, conflicts, rejects TO ackline_eraser;
GRANT UPDATE (incoming_body, erasure_id) ON TABLE conflicts TO ackline_eraser;
GRANT UPDATE (raw_key, raw_value, headers, detail, erasure_id) ON TABLE rejects TO ackline_eraser;
GRANT SELECT, INSERT ON TABLE erasures, erased_events TO ackline_eraser;
GRANT UPDATE (events, conflicts, rejects, dead_letters) ON TABLE erasures TO ackline_eraser;
GRANT SELECT ON TABLE erasures, erased_events TO ackline_reader;

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
