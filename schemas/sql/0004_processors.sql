-- Stream processors (docs/processors.md): named readers of the changefeed whose effects in
-- PostgreSQL commit in the same transaction as their cursor, and the built-in `runs`
-- projection, one row per agent run.
--
-- A processor's cursor is its feed_cursors row (reader = processor name): the same
-- visibility rule and compare-and-set as every changefeed reader. Its control row here
-- says whether an operator paused it and where it stopped on an error.
--
-- Role: ackline_processor (LOGIN), what `ackline process` connects as. It reads the feed
-- (activity, ingest_batches), writes its own cursors (row-level security below: only
-- feed_cursors rows of registered processors, and it may register only a name no other
-- reader holds), its status columns, and the processor tables (runs, run_facts,
-- agent_runs). No UPDATE/DELETE/TRUNCATE of event data, no DELETE anywhere (a rebuild,
-- `ackline processors reset`, is the operator's), and it cannot unpause itself.

-- CREATE ROLE needs the migrating user's CREATEROLE, not ackline_migrator's: step out of
-- the migrator role for it, and back in (sinks.migrate sets it for every migration).
DO $$
DECLARE
    was text := current_user;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_processor') THEN
        RESET ROLE;
        BEGIN
            CREATE ROLE ackline_processor LOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
        EXECUTE format('SET LOCAL ROLE %I', was);
    END IF;
END
$$;

-- One row per processor. paused: set by an operator (`ackline processors pause`), read by
-- every instance before each batch. failed_*/error*: where the processor stopped (the
-- event it raised on is the first one after its cursor); cleared by the first batch that
-- commits past it. last_seen_*: a heartbeat of running instances.
CREATE TABLE processors (
    name           text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'),
    paused         boolean     NOT NULL DEFAULT false,
    paused_at      timestamptz,
    failed_at      timestamptz,
    error          text,
    error_event_id uuid,
    error_cursor   text,
    last_instance  text,
    last_seen_at   timestamptz,
    registered_at  timestamptz NOT NULL DEFAULT now()
);

-- True when a changefeed reader of that name exists (whoever created it). SECURITY
-- DEFINER: it must see rows that row-level security hides from the processor role.
CREATE FUNCTION ackline_reader_exists(reader_name text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$ SELECT EXISTS (SELECT 1 FROM public.feed_cursors WHERE reader = reader_name) $$;
REVOKE ALL ON FUNCTION ackline_reader_exists(text) FROM PUBLIC;

-- Row-level security, narrowing the processor role only. The permissive policies keep
-- every other role exactly where it was (the owner and superusers bypass RLS anyway).
ALTER TABLE feed_cursors ENABLE ROW LEVEL SECURITY;
CREATE POLICY feed_cursors_everyone ON feed_cursors AS PERMISSIVE FOR ALL TO PUBLIC
    USING (true) WITH CHECK (true);
CREATE POLICY feed_cursors_processor_own ON feed_cursors AS RESTRICTIVE FOR ALL
    TO ackline_processor
    USING (EXISTS (SELECT 1 FROM processors AS p WHERE p.name = feed_cursors.reader))
    WITH CHECK (EXISTS (SELECT 1 FROM processors AS p WHERE p.name = feed_cursors.reader));

ALTER TABLE processors ENABLE ROW LEVEL SECURITY;
CREATE POLICY processors_everyone ON processors AS PERMISSIVE FOR ALL TO PUBLIC
    USING (true) WITH CHECK (true);
-- A processor may register a new name only: never one whose cursor some other reader
-- (`ackline tail --commit`, a library Reader) already owns.
CREATE POLICY processors_new_names ON processors AS RESTRICTIVE FOR INSERT
    TO ackline_processor
    WITH CHECK (NOT ackline_reader_exists(name));
GRANT EXECUTE ON FUNCTION ackline_reader_exists(text) TO ackline_processor;

-- The `runs` projection: one row per request (one request, one agent run), a pure
-- function of the SET of the run's events, so any order of arrival and any repetition
-- gives the same row (ackline.sinks.feed.processors.runs_fold). Every column is a
-- semilattice value merged with LEAST/GREATEST/OR, or a count of distinct facts in
-- run_facts; status, ended_at and duration are derived from them.
CREATE TABLE runs (
    request_id     text        PRIMARY KEY,
    agent_id       text        COLLATE "C" NOT NULL,  -- least agent_id of the run's events
    run_id         text        COLLATE "C",           -- least payload run_id
    model          text        COLLATE "C",           -- least model of agent.started
    requested_at   timestamptz,                       -- earliest agent.requested
    started_at     timestamptz,                       -- earliest agent.started
    finished_at    timestamptz,                       -- earliest agent.finished
    failed_at      timestamptz,                       -- earliest agent.failed
    first_event_at timestamptz NOT NULL,
    last_event_at  timestamptz NOT NULL,
    active         boolean     NOT NULL,              -- any event besides agent.requested
    steps          bigint      NOT NULL DEFAULT 0,    -- distinct step numbers
    tool_calls     bigint      NOT NULL DEFAULT 0,    -- distinct call_ids called
    tool_failures  bigint      NOT NULL DEFAULT 0,    -- distinct call_ids with an ok=false result
    messages       bigint      NOT NULL DEFAULT 0,    -- distinct message.posted units (txn_id)
    tokens_in      bigint,                            -- greatest of agent.finished
    tokens_out     bigint,
    error_kind     text        COLLATE "C",           -- least error_kind of agent.failed
    status         text        GENERATED ALWAYS AS (
        CASE WHEN failed_at IS NOT NULL THEN 'failed'
             WHEN finished_at IS NOT NULL THEN 'finished'
             WHEN active THEN 'started'
             ELSE 'requested' END) STORED,
    ended_at       timestamptz GENERATED ALWAYS AS (coalesce(failed_at, finished_at)) STORED,
    duration       interval    GENERATED ALWAYS AS (
        coalesce(failed_at, finished_at) - coalesce(started_at, requested_at)) STORED,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX runs_status_idx ON runs (status, last_event_at);
CREATE INDEX runs_agent_idx ON runs (agent_id, first_event_at);

-- The counted facts of each run, distinct by key: a repeated step, tool call, failure or
-- message adds nothing. kind: step (key: step number), call (call_id), tool_failure
-- (call_id), message (txn_id).
CREATE TABLE run_facts (
    request_id text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('step', 'call', 'tool_failure', 'message')),
    key        text NOT NULL,
    PRIMARY KEY (request_id, kind, key)
);

-- Started runs with no event for N minutes: N is the setting ackline.stuck_minutes
-- (default 15; `SET ackline.stuck_minutes = 5`, or ALTER DATABASE/ROLE ... SET).
CREATE VIEW runs_stuck AS
SELECT r.request_id, r.agent_id, r.run_id, r.model, r.started_at, r.last_event_at,
       now() - r.last_event_at AS idle, r.steps, r.tool_calls, r.tool_failures, r.messages
FROM runs AS r
WHERE r.status = 'started'
  AND r.last_event_at < now() - make_interval(
        mins => coalesce(nullif(current_setting('ackline.stuck_minutes', true), '')::int, 15));

-- Grants (the rule of 0003_roles.sql: SELECT to the reader on everything; the ingest role
-- gets nothing here).
GRANT SELECT ON TABLE processors, runs, run_facts, runs_stuck TO ackline_reader;

GRANT USAGE ON SCHEMA public TO ackline_processor;
GRANT SELECT ON TABLE activity, ingest_batches TO ackline_processor;
GRANT SELECT, INSERT, UPDATE ON TABLE feed_cursors TO ackline_processor;
GRANT SELECT, INSERT ON TABLE processors TO ackline_processor;
GRANT UPDATE (failed_at, error, error_event_id, error_cursor, last_instance, last_seen_at)
    ON TABLE processors TO ackline_processor;
GRANT SELECT, INSERT, UPDATE ON TABLE runs, agent_runs TO ackline_processor;
GRANT SELECT, INSERT ON TABLE run_facts TO ackline_processor;
GRANT SELECT ON TABLE runs_stuck TO ackline_processor;
