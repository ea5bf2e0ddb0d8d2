"""Deployment files an operator can trust (issue 18, "Alerts that fire"): the alerts
cover lost events, readiness and idle partitions; the dashboard imports into any
Grafana; compose publishes nothing beyond this host unless asked; every install is
pinned by one constraints file."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _alerts() -> dict[str, str]:
    config = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text(encoding="utf-8"))
    return {r["alert"]: str(r["expr"]) for g in config["groups"] for r in g["rules"]}


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "deploy/grafana/ackline.json").read_text("utf-8"))
    return data


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text("utf-8"))
    return data


def test_alerts_on_lost_events_readiness_and_unconsumed_partitions() -> None:
    alerts = _alerts()
    retention = alerts["AcklineRetentionSkipped"]
    assert "increase(ackline_retention_skipped_offsets_total" in retention
    # its series appear only with the first gap: a new series must fire too
    assert "unless ackline_retention_skipped_offsets_total offset" in retention
    ready = alerts["AcklineNotReady"]
    for gauge in (
        "ackline_assigned_partitions",
        "ackline_database_up",
        "ackline_database_checked_timestamp_seconds",
    ):
        assert gauge in ready
    assert "ackline_partitions_not_consumed" in alerts["AcklinePartitionsNotConsumed"]
    unassigned = alerts["AcklinePartitionsUnassigned"]
    assert "ackline_topic_partitions" in unassigned and "ackline_assigned_partitions" in unassigned


def test_no_age_is_computed_from_a_never_set_timestamp() -> None:
    """A worker that never committed exports last_commit 0, and `time() - 0` is 56 years:
    every panel age keeps only timestamps > 0 ("no commit yet" instead)."""
    exprs = [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]
    ages = [e for e in exprs if "ackline_last_commit_timestamp_seconds" in e]
    assert len(ages) >= 2
    for expr in ages:
        assert re.search(r"ackline_last_commit_timestamp_seconds(\{[^}]*\})?\s*>\s*0", expr), expr


def test_dashboard_has_a_datasource_variable_and_no_fixed_uid() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    sources = [p["datasource"] for p in dashboard["panels"]]
    sources += [t["datasource"] for p in dashboard["panels"] for t in p.get("targets", [])]
    sources += [v["datasource"] for v in variables.values() if "datasource" in v]
    assert sources and all(s == {"type": "prometheus", "uid": "${datasource}"} for s in sources)


def test_compose_publishes_on_loopback_unless_asked() -> None:
    published = []
    for name, service in _compose()["services"].items():
        for port in service.get("ports", []):
            published.append((name, str(port)))
            assert str(port).startswith("${PUBLISH_ADDRESS:-127.0.0.1}:"), (name, port)
    assert {name for name, _ in published} >= {"kafka", "postgres", "worker-1"}


def test_compose_topic_has_twelve_partitions_and_migrate_needs_no_kafka() -> None:
    services = _compose()["services"]
    command = [str(c) for c in services["topics"]["command"]]
    assert command[command.index("--partitions") + 1] == "12"
    assert set(services["migrate"]["depends_on"]) == {"postgres"}


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_one_constraints_file_pins_the_image_and_make_install() -> None:
    pins = _pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = list(project["dependencies"])
    for extra in ("dev", "faust"):
        wanted += project["optional-dependencies"][extra]
    for requirement in wanted:
        name = re.split(r"[<>=\[;! ]", requirement, maxsplit=1)[0]
        assert re.sub(r"[-_.]+", "-", name).lower() in pins, f"{name} is not pinned"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "pip install --quiet --disable-pip-version-check -c constraints.txt" in makefile
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "COPY pyproject.toml README.md constraints.txt" in dockerfile
    assert "--constraint constraints.txt" in dockerfile


def test_the_promtool_rule_tests_cover_the_new_alerts() -> None:
    """deploy/prometheus/alerts_test.yml (run by `promtool test rules`, outside make test)
    tests every alert of issue 18 against the rules file beside it."""
    path = ROOT / "deploy/prometheus/alerts_test.yml"
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert spec["rule_files"] == ["alerts.yml"]
    tested = {
        case["alertname"] for test in spec["tests"] for case in test.get("alert_rule_test", [])
    }
    assert tested >= {
        "AcklineConflict",
        "AcklineRetentionSkipped",
        "AcklinePartitionsUnassigned",
        "AcklinePartitionsNotConsumed",
        "AcklineNotReady",
    }
    assert tested <= set(_alerts())
