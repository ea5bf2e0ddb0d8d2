"""docs/producing.md runs: every code block of the guide, against a real broker and worker.

The ``python`` blocks run in order as one program (as a reader who copies them would run
them) against a fresh topic; ``json`` blocks must be valid envelopes of the exported JSON
Schema; a worker then ingests the topic, each ``console`` block's command runs and its
output must match the block (every column but the times, and the body hashes, which depend
on the clock); each ``sql`` block must find the rows the guide says it finds. A block of
any other kind fails the test: nothing in the guide is left unchecked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import Services, Worker, db, wait_until
from tests.integration.producing import ROOT, committed_values, json_schema_validator

pytestmark = pytest.mark.integration

GUIDE = ROOT / "docs" / "producing.md"
GUIDE_TOPIC = "agent-activity"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
_CHECKED = {"python", "json", "console", "sql"}


def blocks(kind: str | None = None) -> list[tuple[str, str]]:
    found = [(lang, code) for lang, code in _FENCE.findall(GUIDE.read_text(encoding="utf-8"))]
    return [b for b in found if kind is None or b[0] == kind]


def test_every_block_of_the_guide_is_checked() -> None:
    kinds = [lang for lang, _ in blocks()]
    assert set(kinds) <= _CHECKED, f"blocks no test runs: {set(kinds) - _CHECKED}"
    assert kinds.count("python") >= 5 and kinds.count("console") == 2


def table(text: str) -> list[dict[str, str]]:
    """Rows of an `ackline ... list` table, cut at the columns its dashes line marks."""
    lines = text.rstrip("\n").splitlines()
    dash_line = next(i for i, line in enumerate(lines) if line.startswith("--"))
    spans = [m.span() for m in re.finditer(r"-+", lines[dash_line])]
    spans[-1] = (spans[-1][0], 10_000)
    header = [lines[dash_line - 1][a:b].strip() for a, b in spans]
    return [
        dict(zip(header, (line[a:b].strip() for a, b in spans), strict=True))
        for line in lines[dash_line + 1 :]
    ]


def comparable(row: dict[str, str], topic: str) -> dict[str, str]:
    """A row without what differs between runs: ids (the order in which a worker takes
    partitions), times, the hashes (bodies with a clock-stamped ``occurred_at``) and the
    topic's ID."""
    out = {}
    for column, value in row.items():
        if column == "id":
            assert value.isdigit(), value
        elif column in ("detected", "rejected"):
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", value), value
        elif column.endswith("hash"):
            assert re.fullmatch(r"[0-9a-f]{12}", value), value
        else:
            same = re.sub(r"\(topic ID [A-Za-z0-9_-]{22}\)", "(topic ID X)", value)
            out[column] = same.replace(topic, GUIDE_TOPIC)
    return out


def test_the_guide_runs_as_written(
    services: Services, dsn: str, topic: str, tmp_path: Path
) -> None:
    for _, code in blocks("json"):
        errors = [e.message for e in json_schema_validator().iter_errors(json.loads(code))]
        assert errors == [], code

    group = f"g-{topic}"
    env = {
        **os.environ,
        "ACKLINE_KAFKA_BOOTSTRAP": services.bootstrap,
        "ACKLINE_DATABASE_URL": dsn,
        "ACKLINE_TOPIC": topic,
        "ACKLINE_GROUP_ID": group,
    }
    program = tmp_path / "guide.py"
    program.write_text("\n\n".join(code for _, code in blocks("python")), encoding="utf-8")
    ran = subprocess.run(
        [sys.executable, str(program)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert "the SDK refuses it: invalid agent.started v1 envelope" in ran.stdout

    records = len(committed_values(services.bootstrap, topic))
    worker = Worker(services, dsn, topic, tmp_path)

    def processed() -> int:
        worker.ensure_alive()
        row = db(
            dsn,
            "SELECT coalesce(sum(inserted + duplicates_ledger + duplicates_pk + conflicts_ledger"
            " + conflicts_pk + rejects), 0) AS n FROM ingest_batches",
        )[0]
        return int(row["n"])

    wait_until(lambda: processed() == records, 120, f"the worker to ingest {records} records")

    for _, block in blocks("console"):
        command, _, expected = block.partition("\n")
        assert command.startswith("$ ackline "), command
        out = subprocess.run(
            [sys.executable, "-m", "ackline", *command[len("$ ackline ") :].split()],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        actual = sorted(list(comparable(r, topic).items()) for r in table(out))
        shown = sorted(list(comparable(r, topic).items()) for r in table(expected))
        assert actual == shown, f"{command}:\n{out}"

    for _, sql in blocks("sql"):
        assert [dict(r) for r in db(dsn, sql)] == [{"request_id": "req-2004", "agents": 2}]
    assert worker.stop() == 0
