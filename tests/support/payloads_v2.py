"""A v2 payload for ``agent.started``, loaded by a worker with
``ACKLINE_PAYLOAD_PLUGINS=tests.support.payloads_v2:PAYLOADS`` (test_schema_evolution).

v2 adds the model's provider and the token budget of the run; v1 stays as it is.
"""

from __future__ import annotations

from ackline.schemas.envelope import Count, Ident, Payload


class AgentStartedV2(Payload):
    """``agent.started`` v2: a run began serving the request, on this provider and budget."""

    run_id: Ident
    model: Ident
    provider: Ident
    max_tokens: Count


PAYLOADS = {("agent.started", 2): AgentStartedV2}
