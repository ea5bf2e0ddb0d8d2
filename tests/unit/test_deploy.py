"""The deployment files match the code: docker-compose.yml, the Dockerfile, Prometheus'
config and alerts, and the Grafana dashboard. Docker cannot run here, so this checks
what can be checked without it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import Metric

from ackline.core.errors import SettingsError
from ackline.core.metrics import Metrics
from ackline.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
_METRIC = re.compile(r"\backline_[a-z0-9_]+")


def _yaml(path: str) -> Any:
    return yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = _yaml("docker-compose.yml")
    assert isinstance(data, dict)
    return data


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _ackline_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in compose["services"].items()
        if str(svc.get("image", "")).startswith("ackline:")
    }


def _one_shot(service: dict[str, Any]) -> bool:
    return str(service.get("restart", "")) == "no"


def exported_metric_names() -> set[str]:
    """Every series name the registry exposes, labelled or not, with type suffixes."""
    names: set[str] = set()
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("_count", "_sum", "_created"),
        "gauge": ("",),
    }
    family: Metric
    for family in Metrics().registry.collect():
        names.update(family.name + s for s in suffixes[family.type])
    return names


def test_exported_names_include_labelled_families() -> None:
    names = exported_metric_names()
    assert "ackline_conflicts_total" in names  # labelled: no samples until used
    assert "ackline_batch_seconds_bucket" in names
    assert "ackline_partition_lag" in names
    assert "ackline_conflicts" not in names


def test_every_ackline_variable_in_compose_is_a_setting(compose: dict[str, Any]) -> None:
    fields = {"ACKLINE_" + name.upper() for name in Settings.model_fields}
    seen = set()
    for name, svc in compose["services"].items():
        for key in _env(svc):
            if key.startswith("ACKLINE_"):
                seen.add(key)
                assert key in fields, f"{name} sets {key}, which is not a setting"
    assert "ACKLINE_DATABASE_URL" in seen


def test_ackline_services_have_valid_settings(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = _ackline_services(compose)
    assert {"migrate", "worker-1", "worker-2"} <= services.keys()
    worker_ids = set()
    for name, svc in services.items():
        env = _env(svc)
        # both endpoints, else ackline looks for the local dev stack inside the container
        assert {"ACKLINE_KAFKA_BOOTSTRAP", "ACKLINE_DATABASE_URL"} <= env.keys(), name
        with monkeypatch.context() as m:
            for key in [k for k in os.environ if k.upper().startswith("ACKLINE_")]:
                m.delenv(key)
            for key, value in env.items():
                m.setenv(key, value)
            try:
                settings = load_settings()
            except SettingsError as exc:
                raise AssertionError(f"{name}: {exc}") from exc
        if svc.get("command") == ["run"]:
            assert settings.metrics_port > 0, name
            assert settings.metrics_host == "0.0.0.0", name  # Prometheus scrapes across
            worker_ids.add(settings.worker_id)
            assert settings.log_format == "json"
    assert len(worker_ids) == 2


def _pinned(image: str) -> bool:
    name, _, tag = image.rpartition("/")[2].partition(":")
    return bool(name) and bool(tag) and tag != "latest"


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        image = svc.get("image")
        assert image, f"{name} has no image"
        assert _pinned(str(image)), f"{name}: image {image} is not pinned"
    images = {str(s["image"]) for s in compose["services"].values()}
    assert "apache/kafka:4.1.1" in images
    # the major version the tests run against (tests/integration/test_versions.py)
    assert any(re.fullmatch(r"postgres:15\.\d+", i) for i in images)
    assert not _pinned("postgres") and not _pinned("postgres:latest")
    assert _pinned("registry:5000/team/img:1.2")


def test_healthchecks_and_depends_on_conditions(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, svc in services.items():
        if not _one_shot(svc):
            test = svc.get("healthcheck", {}).get("test")
            assert test, f"{name} has no healthcheck"
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            condition = spec["condition"]
            if _one_shot(services[dep]):
                assert condition == "service_completed_successfully", (name, dep)
            else:
                assert condition == "service_healthy", (name, dep)
                assert services[dep].get("healthcheck"), dep
    worker = services["worker-1"]["depends_on"]
    assert worker["migrate"]["condition"] == "service_completed_successfully"
    assert worker["topics"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["command"] == ["migrate"]
    assert services["grafana"]["profiles"] == ["dashboards"]


def test_compose_creates_the_topic_the_workers_consume(compose: dict[str, Any]) -> None:
    command = [str(c) for c in compose["services"]["topics"]["command"]]
    topic = command[command.index("--topic") + 1]
    assert _env(compose["services"]["worker-1"])["ACKLINE_TOPIC"] == topic


def test_dockerfile_base_is_pinned_and_installs_the_package() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    base = re.search(r"^FROM\s+(\S+)", text, re.M)
    assert base is not None
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", base[1]), base[1]
    assert 'pip install --constraint constraints.txt ".${EXTRAS}"' in text
    assert 'ENTRYPOINT ["ackline"]' in text
    for package in ("ackline", "schemas", "streams", "sinks", "load"):
        assert f"COPY {package} " in text, package


def test_prometheus_scrapes_the_compose_workers(compose: dict[str, Any]) -> None:
    config = _yaml("deploy/prometheus/prometheus.yml")
    assert "/etc/prometheus/alerts.yml" in config["rule_files"]
    targets = {
        t for job in config["scrape_configs"] for s in job["static_configs"] for t in s["targets"]
    }
    for name in ("worker-1", "worker-2"):
        port = _env(compose["services"][name])["ACKLINE_METRICS_PORT"]
        assert f"{name}:{port}" in targets
    mounts = compose["services"]["prometheus"]["volumes"]
    assert any(
        m.startswith("./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml") for m in mounts
    )


def _alert_rules() -> list[dict[str, Any]]:
    config = _yaml("deploy/prometheus/alerts.yml")
    return [rule for group in config["groups"] for rule in group["rules"]]


def test_alerts_reference_only_exported_metrics() -> None:
    exported = exported_metric_names()
    used = set()
    for rule in _alert_rules():
        assert rule["alert"] and rule["expr"], rule
        for name in _METRIC.findall(str(rule["expr"])):
            assert name in exported, f"alert {rule['alert']} uses {name}, not exported"
            used.add(name)
    assert used  # the regex found something: this test can fail


def test_alerts_cover_the_required_signals() -> None:
    exprs = {rule["alert"]: str(rule["expr"]) for rule in _alert_rules()}
    joined = "\n".join(exprs.values())
    for needed in (
        "ackline_conflicts_total",
        "ackline_rejects_total",
        "ackline_partition_lag",
        "ackline_fenced_batches_total",
        "ackline_last_commit_timestamp_seconds",
    ):
        assert needed in joined, needed
    stalled = exprs["AcklineStalled"]
    assert "ackline_last_commit_timestamp_seconds" in stalled
    assert "ackline_partition_lag" in stalled


def test_dashboard_references_only_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/ackline.json").read_text(encoding="utf-8"))
    exported = exported_metric_names()
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 10
    used = {name for e in exprs for name in _METRIC.findall(e)}
    assert used - exported == set(), used - exported
    assert {"ackline_ingested_rows_total", "ackline_partition_lag"} <= used
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
