-- Rejects and conflicts were unique on their source coordinates (group, topic, partition,
-- offset), and the writer inserts them ON CONFLICT DO NOTHING so that a batch written
-- again (a crash after COMMIT, a replayed range) keeps one row. A topic deleted and made
-- again reuses those coordinates from offset 0: after `ackline offsets adopt-topic`, a
-- poison record or changed replay of the new incarnation at an offset where the old one
-- had a row was dropped by that DO NOTHING, only counted in its batch row and metrics.
-- The incarnation (Kafka's topic ID, migration 0015) now joins the key.
--
-- src_topic_id: the topic ID the group's DB offsets belonged to when the row was written
-- (topic_incarnations, read in the batch's transaction, whose fence holds those offsets:
-- adopt-topic rewinds them and records the new ID in one transaction). '' where none was
-- recorded: rows written before this migration, or while a worker ran unchecked (the ID
-- unreadable). Not NULL: a unique key treats NULLs as distinct, and a batch written again
-- would then add a row each time.
--
-- The ID goes last in the key: its index still serves a lookup by source coordinates
-- (verify, an operator's query). The migration holds ACCESS EXCLUSIVE on both tables
-- while it builds their new keys (seconds for millions of rows): batches that write a
-- reject or conflict, and readers of these tables, wait for it meanwhile.
--
-- Rollout: a worker of this version writes either schema (its fence says which); workers
-- of earlier versions name the old key in ON CONFLICT, which no longer exists, and their
-- batches with a reject or conflict fail loudly (42P10) instead of writing. So: roll the
-- workers first, then `ackline migrate` (as for 0008).
ALTER TABLE conflicts ADD COLUMN src_topic_id text NOT NULL DEFAULT '';
ALTER TABLE rejects ADD COLUMN src_topic_id text NOT NULL DEFAULT '';

ALTER TABLE conflicts DROP CONSTRAINT conflicts_group_id_src_topic_src_partition_src_offset_key;
ALTER TABLE conflicts ADD CONSTRAINT conflicts_source_key
    UNIQUE (group_id, src_topic, src_partition, src_offset, src_topic_id);
ALTER TABLE rejects DROP CONSTRAINT rejects_group_id_src_topic_src_partition_src_offset_key;
ALTER TABLE rejects ADD CONSTRAINT rejects_source_key
    UNIQUE (group_id, src_topic, src_partition, src_offset, src_topic_id);

-- The writer reads the recorded ID in its INSERTs, and the arbiter's new column.
GRANT SELECT ON TABLE topic_incarnations TO ackline_ingest;
GRANT SELECT (src_topic_id) ON TABLE conflicts, rejects TO ackline_ingest;
