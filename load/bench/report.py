"""The bench's outputs: a table for people, ``results.json``, the last-line JSON, a chart.

The chart needs matplotlib, the ``[bench]`` extra (``pip install -e '.[bench]'``); without
it the chart is skipped with a note and everything else is written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Final

PEERS: Final = ("quix", "connect", "faust")
SYSTEMS: Final = ("limit", "ackline", "ackline-faust", *PEERS)
LABELS: Final = {
    "limit": "limit (COPY)",
    "ackline": "ackline",
    "ackline-faust": "ackline on faust",
    "quix": "Quix Streams",
    "connect": "Kafka Connect + Debezium JDBC",
    "faust": "faust (naive)",
}
BACKLOG: Final = Path(__file__).resolve().parent / "backlog.json"


def _get(summary: dict[str, Any], system: str, phase: str, key: str) -> Any:
    return summary["systems"].get(system, {}).get(phase, {}).get(key)


def ratios(summary: dict[str, Any]) -> dict[str, Any]:
    """The headline ratios and which targets are met."""
    eps = {s: _get(summary, s, "ingest", "events_per_s") for s in SYSTEMS}
    ack = eps.get("ackline") or 0.0
    peers = {p: v for p, v in eps.items() if p in PEERS and v}
    best = max(peers, key=lambda p: peers[p]) if peers else None
    out: dict[str, Any] = {f"{s}_events_per_s": round(v or 0.0) for s, v in eps.items()}
    out["ratio_to_limit"] = round(ack / eps["limit"], 3) if eps.get("limit") else None
    out["best_peer"] = best
    out["ratio_to_best_peer"] = round(ack / peers[best], 3) if best else None
    replay = _get(summary, "ackline", "replay", "events_per_s")
    out["replay_ratio"] = round(replay / ack, 3) if replay and ack else None
    lat = summary["systems"].get("ackline", {}).get("latency", {})
    out["ackline_p50_ms"] = lat.get("p50_ms")
    out["ackline_p99_ms"] = lat.get("p99_ms")
    backlog = json.loads(BACKLOG.read_text()) if BACKLOG.is_file() else {}
    out["backlog_peak_rss_mb"] = backlog.get("peak_rss_mb")
    out["targets"] = {
        "ratio_to_limit>=0.7": _met(out["ratio_to_limit"], 0.7),
        "ratio_to_best_peer>=1.5": _met(out["ratio_to_best_peer"], 1.5),
        "replay_ratio>=1.0": _met(out["replay_ratio"], 1.0),
        "p99_ms<=1000_at_half_max": None if lat.get("p99_ms") is None else lat["p99_ms"] <= 1000,
        "backlog_peak_rss_mb<=300": None
        if backlog.get("peak_rss_mb") is None
        else backlog["peak_rss_mb"] <= 300,
    }
    return out


def _met(value: float | None, at_least: float) -> bool | None:
    return None if value is None else value >= at_least


def last_line(summary: dict[str, Any]) -> dict[str, Any]:
    out = ratios(summary)
    runs = summary.get("processors", {}).get("runs", {})
    if "events_per_s" in runs:
        out["runs_processor_events_per_s"] = round(runs["events_per_s"])
    if "scale_out" in summary:
        out["scale_out_events_per_s"] = {
            n: round(r.get("events_per_s", 0)) for n, r in summary["scale_out"].items()
        }
    return out


def fmt(value: Any, spec: str = ",.0f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def table(summary: dict[str, Any]) -> str:
    head = (
        f"{'system':<31} {'events/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU s':>7} "
        f"{'PG CPU s':>8} {'peak RSS MB':>11} {'replay ev/s':>11}"
    )
    lines = [head, "-" * len(head)]
    for s in SYSTEMS:
        entry = summary["systems"].get(s)
        if entry is None:
            continue
        ing, lat, rep = entry.get("ingest", {}), entry.get("latency", {}), entry.get("replay", {})
        if "error" in entry:
            lines.append(f"{LABELS[s]:<31} failed: {entry['error'][:80]}")
            continue
        lines.append(
            f"{LABELS[s]:<31} {fmt(ing.get('events_per_s')):>9} "
            f"{fmt(lat.get('p50_ms'), ',.1f'):>8} "
            f"{fmt(lat.get('p99_ms'), ',.1f'):>8} {fmt(ing.get('cpu_client_s'), ',.1f'):>7} "
            f"{fmt(ing.get('cpu_pg_s'), ',.1f'):>8} {fmt(ing.get('peak_rss_mb'), ',.0f'):>11} "
            f"{fmt(rep.get('events_per_s')):>11}"
        )
    lines.append("")
    for s in SYSTEMS:
        own = summary["systems"].get(s, {}).get("latency_own_half", {})
        if "p99_ms" in own:
            lines.append(
                f"latency, {LABELS[s]} at half its own maximum ({fmt(own['offered_rate'])}/s): "
                f"p50 {fmt(own['p50_ms'], ',.1f')} ms, p99 {fmt(own['p99_ms'], ',.1f')} ms"
            )
    for s in SYSTEMS:
        verdict = summary["systems"].get(s, {}).get("replay", {}).get("notes", {}).get("verdict")
        if verdict:
            lines.append(f"replay, {LABELS[s]}: {verdict}")
    if "scale_out" in summary:
        parts = [
            f"{n} worker{'s' if n != '1' else ''} {fmt(r.get('events_per_s'))}/s "
            f"(PG CPU {fmt(r.get('cpu_pg_s'), ',.0f')} s)"
            for n, r in summary["scale_out"].items()
        ]
        lines.append("scale-out: " + ", ".join(parts))
    runs = summary.get("processors", {}).get("runs")
    if runs is not None:
        lines.append(
            "processor runs (ackline process runs, on ackline's ingested events): "
            + (
                f"failed: {runs['error'][:80]}"
                if "error" in runs
                else f"{fmt(runs.get('events_per_s'))} events/s applied, "
                f"{fmt(runs.get('events'))} events, CPU {fmt(runs.get('cpu_client_s'), ',.1f')} s "
                f"own / {fmt(runs.get('cpu_pg_s'), ',.1f')} s PostgreSQL"
            )
        )
    r = ratios(summary)
    lines.append(
        f"ackline / limit = {fmt(r['ratio_to_limit'], '.2f')}, ackline / best peer "
        f"({r['best_peer']}) = {fmt(r['ratio_to_best_peer'], '.2f')}, replay / first ingest = "
        f"{fmt(r['replay_ratio'], '.2f')}"
    )
    c = summary["conditions"]
    lines.append(
        f"conditions: {c['events']:,} events, {c['partitions']} partitions, {c['cores']} cores, "
        f"load average {c['load_avg_1m_at_start']} at start, {c.get('load_avg_1m_at_end')} at end"
    )
    return "\n".join(lines)


def write(summary: dict[str, Any], results: Path, chart: Path) -> None:
    results.write_text(json.dumps({**summary, "headline": last_line(summary)}, indent=2) + "\n")
    try:
        draw(summary, chart)
    except ImportError:
        print("(chart skipped: matplotlib is not installed; pip install -e '.[bench]')")


def draw(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s for s in SYSTEMS if _get(summary, s, "ingest", "events_per_s")]
    eps = [_get(summary, s, "ingest", "events_per_s") for s in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = [
        "#999999" if s == "limit" else "#2b7bba" if s.startswith("ackline") else "#e08214"
        for s in names
    ]
    left.barh([LABELS[s] for s in names], eps, color=colors)
    left.invert_yaxis()
    left.set_xlabel("events/s (first ingest, backlog drain)")
    left.set_title("Throughput")
    for i, v in enumerate(eps):
        left.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    lat_names = [s for s in SYSTEMS if "p99_ms" in summary["systems"].get(s, {}).get("latency", {})]
    p50 = [summary["systems"][s]["latency"]["p50_ms"] for s in lat_names]
    p99 = [summary["systems"][s]["latency"]["p99_ms"] for s in lat_names]
    y = range(len(lat_names))
    right.barh([i - 0.2 for i in y], p50, height=0.4, label="p50", color="#74add1")
    right.barh([i + 0.2 for i in y], p99, height=0.4, label="p99", color="#d73027")
    right.set_yticks(list(y), [LABELS[s] for s in lat_names])
    right.invert_yaxis()
    right.set_xscale("log")
    right.set_xlabel("produce-to-commit latency, ms (log)")
    rate = next((summary["systems"][s]["latency"].get("offered_rate") for s in lat_names), None)
    right.set_title(f"Latency at {rate:,} events/s offered" if rate else "Latency")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["draw", "fmt", "last_line", "ratios", "table", "write"]
