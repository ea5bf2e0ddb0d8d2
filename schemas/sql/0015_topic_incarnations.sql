-- Which incarnation of a topic a group's DB offsets belong to. A topic deleted and made
-- again under its name starts its offsets at 0; the DB offsets of the old one then
-- pointed into the new log, and once it grew past them a worker resumed there, never
-- ingesting what the new topic held below them (docs/guarantees.md, "A recreated
-- topic"). Kafka gives each incarnation its own topic ID: the worker records it here
-- before it first joins the group and refuses to start when the topic's ID is another;
-- `ackline offsets adopt-topic` moves the group to the new incarnation.
--
-- topic_id: Kafka's form of it (base64, as kafka-topics --describe prints it).
CREATE TABLE topic_incarnations (
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    topic_id    text        NOT NULL CHECK (topic_id <> ''),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic)
);

-- The worker's one write here, through this function: record the topic's ID where none
-- is recorded, then say what is recorded (it may be another worker's, or an older
-- incarnation's) and how many offset rows the group holds for the topic. The ingest role
-- gets no write privilege on the table: it can never replace a recorded ID (only the
-- operator's adopt-topic does), and the roles migration (0010) stays the whole model of
-- its table privileges. INSERT ... ON CONFLICT DO NOTHING: two workers starting together
-- record one ID, and each then reads the one recorded (a later statement of a function
-- sees what committed before it, under READ COMMITTED).
CREATE FUNCTION ackline_record_topic_id(p_group text, p_topic text, p_topic_id text)
RETURNS TABLE (stored text, recorded boolean, offset_rows bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    INSERT INTO public.topic_incarnations (group_id, topic, topic_id)
    VALUES (p_group, p_topic, p_topic_id)
    ON CONFLICT (group_id, topic) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN QUERY
        SELECT t.topic_id, n > 0,
               (SELECT count(*) FROM public.consumer_offsets AS o
                WHERE o.group_id = p_group AND o.topic = p_topic)
        FROM public.topic_incarnations AS t
        WHERE t.group_id = p_group AND t.topic = p_topic;
END
$$;
REVOKE ALL ON FUNCTION ackline_record_topic_id(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ackline_record_topic_id(text, text, text) TO ackline_ingest;

-- The reader role's SELECT on every table (0010 grants it ON ALL TABLES, which doctor
-- expands to the tables there are now).
GRANT SELECT ON TABLE topic_incarnations TO ackline_reader;
