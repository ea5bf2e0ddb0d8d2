-- Changefeed: downstream readers follow ingested rows exactly once (README, "Changefeed").

-- The xid8 of the transaction that wrote each batch row. The writer never sets it: the
-- default is evaluated inside the batch's own transaction. Readers consume a batch only
-- once its xid is below pg_snapshot_xmin(pg_current_snapshot()) of their read: every
-- transaction below that horizon has ended, and every xid assigned later is above it,
-- so no batch can ever appear below a position a reader has passed.
-- Batches that existed before this migration all get the migration's own xid.
ALTER TABLE ingest_batches
    ADD COLUMN commit_xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX ingest_batches_commit_xid_idx ON ingest_batches (commit_xid);

-- A batch's events in feed order (the reader joins activity on batch_id).
CREATE INDEX activity_batch_idx ON activity (batch_id, src_partition, src_offset);

-- One row per named reader: what it has consumed. A reader updates its row in the same
-- transaction as its side effects (compare-and-set on version), so both commit or neither.
-- position: every transaction with commit_xid <= position is consumed, unless within_*
-- is set: then the transactions below position, and the events of transaction position
-- up to (batch_id, partition, offset, topic) within_* inclusive.
CREATE TABLE feed_cursors (
    reader           text        PRIMARY KEY CHECK (reader <> ''),
    position         xid8        NOT NULL DEFAULT '0',
    within_batch     bigint,
    within_partition integer,
    within_offset    bigint,
    within_topic     text,
    version          bigint      NOT NULL DEFAULT 0,
    transactions     bigint      NOT NULL DEFAULT 0,
    delivered        bigint      NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((within_batch IS NULL) = (within_partition IS NULL)
       AND (within_batch IS NULL) = (within_offset IS NULL)
       AND (within_batch IS NULL) = (within_topic IS NULL))
);

-- The example reader (`ackline dispatch`): one agent run per request. A row stands in for
-- the real start. deliveries counts the agent.requested events the feed handed to any
-- dispatcher instance for this request (more than one only when a request was emitted
-- again under a new txn_id); it is how the tests see a repeated delivery that the
-- primary key would otherwise absorb.
CREATE TABLE agent_runs (
    request_id  text        PRIMARY KEY,
    event_id    uuid        NOT NULL,
    agent_id    text        NOT NULL,
    feed_xid    xid8        NOT NULL,
    dispatcher  text        NOT NULL,
    deliveries  integer     NOT NULL DEFAULT 1 CHECK (deliveries >= 1),
    started_at  timestamptz NOT NULL DEFAULT now()
);
