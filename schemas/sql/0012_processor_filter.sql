-- The filter in effect for each processor (docs/processors.md, "Changing a filter").
--
-- A processor's instances share one cursor, and the events a filter drops are passed
-- over: the cursor moves past them. During a rolling deploy that widens a filter, an old
-- instance still running would pass the new types over for the new ones, which then never
-- see them. So the filter that moves the cursor is recorded here: an instance that starts
-- records its own (it takes over), and a trigger (below) refuses a cursor update from a
-- session whose filter is not the one recorded: that instance's batch rolls back and it
-- stops. The takeover locks the cursor row first, so it waits for a batch in flight and
-- every later batch sees it.
--
-- filter: the fingerprint of the Filter (canonical JSON, e.g.
-- {"agents":null,"types":["agent.requested"]}; ackline.sinks.feed.processors.contract.
-- fingerprint); NULL: never recorded (a processor not run since this migration).
-- filter_at, filter_instance: when and by which instance it was recorded.
-- superseded_filters: every filter a takeover replaced. Such a filter never takes over
-- again by itself: an old instance restarted during a rollout (an orchestrator restarts
-- the one that stopped) would otherwise take over back and pass the new types over until
-- it stopped again. `ackline processors clear-superseded` (the operator's) empties it, for
-- a deliberate rollback.
ALTER TABLE processors
    ADD COLUMN filter             text,
    ADD COLUMN filter_at          timestamptz,
    ADD COLUMN filter_instance    text,
    ADD COLUMN superseded_filters text[] NOT NULL DEFAULT '{}';

-- The processor role records its filter at start (the reader role's SELECT on every
-- column of processors, 0004, covers the new ones).
GRANT UPDATE (filter, filter_at, filter_instance, superseded_filters)
    ON TABLE processors TO ackline_processor;

-- The same rule in the database, for sessions that do not check it themselves (an
-- ackline older than this migration, still running during the rollout that upgrades it,
-- or `ackline tail --commit` given a processor's name): a processor's cursor moves only
-- in a session that names the filter in effect (`ackline.processor_filter`, which
-- instances of this version set on each connection, and the operator's
-- `processors reset` for its own transaction). Every role is held to it. Readers that
-- are not processors (no processors row, or no filter recorded) are not concerned.
-- SQLSTATE AKSP1: the runner stops that processor as superseded.
--
-- The filter is read by a SECURITY DEFINER function, so that a reader role with rights
-- on feed_cursors only (docs/changefeed.md) needs none on processors; the trigger itself
-- runs as the caller. Executable by PUBLIC: it tells a processor's filter, which every
-- role that reads the feed may see in `processors status`.
CREATE FUNCTION ackline_processor_filter(reader_name text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp
AS $$ SELECT p.filter FROM public.processors AS p WHERE p.name = reader_name $$;

CREATE FUNCTION ackline_processor_filter_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    in_effect text := public.ackline_processor_filter(NEW.reader);
    named text := nullif(current_setting('ackline.processor_filter', true), '');
BEGIN
    IF in_effect IS NOT NULL AND in_effect IS DISTINCT FROM named THEN
        RAISE EXCEPTION USING
            ERRCODE = 'AKSP1',
            MESSAGE = format(
                'processor %s: filter %s is in effect, and only it moves the shared cursor; '
                'this session''s is %s',
                NEW.reader, in_effect,
                coalesce(named, 'not named (an ackline older than migration 0012, or a '
                                'reader that is not this processor)')),
            HINT = 'finish the rollout: `ackline processors status` shows the filter in effect';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER feed_cursors_processor_filter
    BEFORE UPDATE ON feed_cursors
    FOR EACH ROW EXECUTE FUNCTION ackline_processor_filter_guard();
