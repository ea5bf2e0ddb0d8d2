-- ackline schema v1: activity, transaction ledger, conflicts, rejects, offsets, batches.
-- Applied once by `ackline migrate`, inside one transaction, recorded in schema_migrations.

-- Layer 2 of dedup: one row per event, keyed by event_id. Append-only by grants.
CREATE TABLE activity (
    event_id       uuid        PRIMARY KEY,
    txn_id         text        NOT NULL,
    type           text        NOT NULL,
    agent_id       text        NOT NULL,
    request_id     text        NOT NULL,
    occurred_at    timestamptz NOT NULL,
    schema_version integer     NOT NULL,
    payload        jsonb       NOT NULL,
    body_hash      bytea       NOT NULL CHECK (octet_length(body_hash) = 32),
    src_topic      text        NOT NULL,
    src_partition  integer     NOT NULL,
    src_offset     bigint      NOT NULL,
    batch_id       bigint      NOT NULL,
    ingested_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX activity_request_idx ON activity (request_id);
CREATE INDEX activity_agent_idx ON activity (agent_id, occurred_at);

-- Layer 1 of dedup: the first event of each unit of work wins.
CREATE TABLE txn_ledger (
    txn_id        text        PRIMARY KEY,
    event_id      uuid        NOT NULL,
    body_hash     bytea       NOT NULL CHECK (octet_length(body_hash) = 32),
    src_topic     text        NOT NULL,
    src_partition integer     NOT NULL,
    src_offset    bigint      NOT NULL,
    batch_id      bigint      NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);

-- A replay whose body differs from the stored one. The stored row is never touched.
CREATE TABLE conflicts (
    conflict_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    layer           text        NOT NULL CHECK (layer IN ('ledger', 'primary_key')),
    event_id        uuid        NOT NULL,
    txn_id          text        NOT NULL,
    stored_event_id uuid        NOT NULL,
    stored_hash     bytea       NOT NULL,
    incoming_hash   bytea       NOT NULL,
    incoming_body   jsonb       NOT NULL,
    group_id        text        NOT NULL,
    src_topic       text        NOT NULL,
    src_partition   integer     NOT NULL,
    src_offset      bigint      NOT NULL,
    batch_id        bigint      NOT NULL,
    detected_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (group_id, src_topic, src_partition, src_offset)
);

-- Poison: bytes that did not decode or validate, kept with the reason.
CREATE TABLE rejects (
    reject_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reason        text        NOT NULL,
    detail        text        NOT NULL,
    raw_key       bytea,
    raw_value     bytea,
    headers       jsonb       NOT NULL DEFAULT '[]',
    group_id      text        NOT NULL,
    src_topic     text        NOT NULL,
    src_partition integer     NOT NULL,
    src_offset    bigint      NOT NULL,
    dlq_topic     text        NOT NULL,
    dlq_partition integer     NOT NULL,
    dlq_offset    bigint      NOT NULL,
    batch_id      bigint      NOT NULL,
    rejected_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (group_id, src_topic, src_partition, src_offset)
);

-- Offsets live beside the data. next_offset NULL: never committed. Taking a partition
-- bumps epoch; a batch advances next_offset only while epoch is still its own.
CREATE TABLE consumer_offsets (
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL CHECK (partition >= 0),
    next_offset bigint      CHECK (next_offset >= 0),
    epoch       bigint      NOT NULL DEFAULT 0,
    owner       text,
    claimed_at  timestamptz,
    updated_at  timestamptz,
    PRIMARY KEY (group_id, topic, partition)
);

-- One row per committed batch, written in the batch's own transaction.
CREATE SEQUENCE ingest_batch_id_seq;
CREATE TABLE ingest_batches (
    batch_id          bigint      PRIMARY KEY,
    group_id          text        NOT NULL,
    worker            text        NOT NULL,
    ranges            jsonb       NOT NULL,
    events            integer     NOT NULL,
    inserted          integer     NOT NULL,
    duplicates_ledger integer     NOT NULL,
    duplicates_pk     integer     NOT NULL,
    conflicts_ledger  integer     NOT NULL,
    conflicts_pk      integer     NOT NULL,
    rejects           integer     NOT NULL,
    committed_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ingest_batches_group_idx ON ingest_batches (group_id);
