-- The filter in effect for each processor (docs/processors.md, "Changing a filter").
--
-- A processor's instances share one cursor, and the events a filter drops are passed
-- over: the cursor moves past them. During a rolling deploy that widens a filter, an old
-- instance still running would pass the new types over for the new ones, which then never
-- see them. So the filter that moves the cursor is recorded here: an instance that starts
-- records its own (it takes over), and every batch checks, after its compare-and-set on
-- the cursor row, that the recorded filter is still its own; an instance whose filter is
-- no longer in effect rolls its batch back and stops. The takeover locks the cursor row
-- first, so it waits for a batch in flight and every later batch sees it.
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
