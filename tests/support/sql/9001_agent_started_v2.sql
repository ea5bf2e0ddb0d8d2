-- agent.started v2 (tests/support/payloads_v2.py): what the database needs for it.
-- activity.payload is jsonb, so no column changes: a read model that covers v1 and v2,
-- and an index for the new field. Additive only: nothing existing is rewritten, and the
-- worker keeps writing while this runs (CREATE VIEW and a partial index on a small set).
-- Owned by ackline_migrator (sinks.migrate sets the role); grants per 0003_roles.sql's rule.

CREATE VIEW agent_starts AS
SELECT event_id,
       request_id,
       agent_id,
       occurred_at,
       schema_version,
       payload ->> 'run_id'                                           AS run_id,
       payload ->> 'model'                                            AS model,
       CASE WHEN schema_version >= 2 THEN payload ->> 'provider' END  AS provider,
       CASE WHEN schema_version >= 2 THEN (payload ->> 'max_tokens')::bigint END AS max_tokens
FROM activity
WHERE type = 'agent.started';

CREATE INDEX activity_started_provider_idx ON activity ((payload ->> 'provider'))
    WHERE type = 'agent.started' AND schema_version >= 2;

GRANT SELECT ON agent_starts TO ackline_reader;
