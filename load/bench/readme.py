"""The bench tables of docs/performance.md and the bench's few lines in README.md, generated
from ``results.json`` so that none of them can disagree.

``make bench`` rewrites the block between :data:`START` and :data:`END` in
docs/performance.md, and the one between :data:`SUMMARY_START` and :data:`SUMMARY_END` in
README.md, after it writes the results and the chart; ``python -m ackline.load.bench.readme``
does the same from the committed results (after editing this module).
``tests/unit/test_bench_readme.py`` fails when either block is not the committed
``results.json``'s. The README keeps only the verdict (the ratios, the targets met and
missed): it is a door, and the tables are the page's.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Final

from ackline.load.bench.report import SYSTEMS, TARGETS, fmt, per_event_us, ratios
from ackline.load.errors import LoadError

START: Final = "<!-- bench:start (generated from load/bench/results.json by make bench) -->"
END: Final = "<!-- bench:end -->"
ROOT: Final = Path(__file__).resolve().parents[2]
PAGE: Final = ROOT / "docs" / "performance.md"
RESULTS: Final = Path(__file__).resolve().parent / "results.json"
SUMMARY_START: Final = "<!-- bench-summary:start (generated from load/bench/results.json) -->"
SUMMARY_END: Final = "<!-- bench-summary:end -->"
README: Final = ROOT / "README.md"

ROWS: Final = {
    "limit": "**limit**: asyncpg binary COPY of the decoded rows into `txn_ledger`, "
    "`event_keys` and `activity`, no Kafka",
    "ackline": "**ackline** (`ackline run`, default settings: read_committed, fencing, "
    "two-layer dedup, dead letters)",
    "ackline-faust": "ackline on faust (`--runtime faust`, [faust.md](faust.md))",
    "quix": "Quix Streams, `PostgreSQLSink(on_conflict_do_nothing=True)`",
    "connect": "Kafka Connect standalone + Debezium JDBC sink, upsert",
    "faust": "faust agent, one `INSERT` per event (naive)",
}
LABELS: Final = {
    "ratio_to_limit>=0.7": "≥ 0.7 x the limit",
    "ratio_to_best_peer>=1.5": "≥ 1.5 x the best peer",
    "worker_us_per_event<=20": "worker ≤ 20 µs/event",
    "pg_us_per_event<=30": "PostgreSQL ≤ 30 µs/event",
    "p50_ms_half_load<=50": "p50 ≤ 50 ms at half load",
    "p99_ms_half_load<=250": "p99 ≤ 250 ms at half load",
    "replay_ratio>=1.5": "replay ≥ 1.5 x first ingest",
    "ratio_at_1ms_rtt>=0.8": "≥ 0.8 x loopback at 1 ms RTT",
    "backlog_peak_rss_mb<=300": "peak RSS ≤ 300 MB on a 10M backlog",
}
assert set(LABELS) == set(TARGETS)


def _label(summary: dict[str, Any], system: str) -> str:
    """The row's label, with the settings the run recorded for a peer (none before they
    were recorded: the peers then ran on their defaults)."""
    settings = summary["conditions"].get("peer_settings", {}).get(system)
    return f"{ROWS[system]}, {settings}" if settings else ROWS[system]


def _cell(entry: dict[str, Any], phase: str, key: str, spec: str = ",.0f") -> str:
    return fmt(entry.get(phase, {}).get(key), spec)


def _latency(entry: dict[str, Any]) -> str:
    lat = entry.get("latency", {})
    text = f"{fmt(lat.get('p50_ms'))} / {fmt(lat.get('p99_ms'))}"
    own = entry.get("latency_own_half", {})
    if "p99_ms" in own:
        text += (
            f" (at half its own max, {fmt(own['offered_rate'])}/s: "
            f"{fmt(own['p50_ms'])} / {fmt(own['p99_ms'])})"
        )
    return text


_EXCEPTION: Final = re.compile(r"^[\w.]+(?:Error|Exception): .*", re.MULTILINE)


def _verdict(entry: dict[str, Any]) -> str:
    replay = entry.get("replay", {})
    verdict = str(replay.get("notes", {}).get("verdict", "-"))
    if "error" in replay:  # the system died on the replay: say with what
        found = _EXCEPTION.search(str(replay["error"]))
        verdict = f"died: {found.group(0) if found else str(replay['error'])[:100]}"
    # one table cell: a traceback's newlines would end the row
    return " ".join(verdict.split()).replace("|", "\\|")[:160]


def _system_rows(summary: dict[str, Any]) -> list[str]:
    rate = next(
        (
            summary["systems"][s]["latency"].get("offered_rate")
            for s in SYSTEMS
            if "offered_rate" in summary["systems"].get(s, {}).get("latency", {})
        ),
        None,
    )
    lines = [
        "| system (first ingest, backlog drain) | events/s "
        "| CPU µs/event: own / PostgreSQL "
        f"| peak RSS MB | p50 / p99 ms at {fmt(rate)}/s | replay events/s "
        "| 1 % changed bodies on replay |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for s in SYSTEMS:
        entry = summary["systems"].get(s)
        if entry is None:
            continue
        if "error" in entry:
            lines.append(
                f"| {_label(summary, s)} | failed: {str(entry['error'])[:100]} | | | | | |"
            )
            continue
        ingest = entry.get("ingest", {})
        us = f"{fmt(per_event_us(ingest, 'cpu_client_s'), ',.1f')} / "
        us += fmt(per_event_us(ingest, "cpu_pg_s"), ",.1f")
        limit = s == "limit"
        lines.append(
            f"| {_label(summary, s)} | {_cell(entry, 'ingest', 'events_per_s')} | {us} "
            f"| {_cell(entry, 'ingest', 'peak_rss_mb')} "
            f"| {'-' if limit else _latency(entry)} "
            f"| {'-' if limit else _cell(entry, 'replay', 'events_per_s')} "
            f"| {'-' if limit else _verdict(entry)} |"
        )
    return lines


def _targets(r: dict[str, Any]) -> str:
    met = [LABELS[k] for k, v in r["targets"].items() if v is True]
    missed = [LABELS[k] for k, v in r["targets"].items() if v is False]
    unknown = [LABELS[k] for k, v in r["targets"].items() if v is None]
    return f"Targets met: {', '.join(met) or 'none'}. Missed: {', '.join(missed) or 'none'}." + (
        f" Not measured: {', '.join(unknown)}." if unknown else ""
    )


def _headline(summary: dict[str, Any]) -> list[str]:
    r = ratios(summary)
    best = r["best_peer"]
    lines = [
        f"Headline (`load/bench/results.json`, and the last line of `make bench`): "
        f"**ackline / limit = {fmt(r['ratio_to_limit'], '.2f')}, ackline / best peer "
        f"({best}) = {fmt(r['ratio_to_best_peer'], '.2f')}**; one worker's CPU per event "
        f"{fmt(r['worker_us_per_event'], '.1f')} µs and PostgreSQL's "
        f"{fmt(r['pg_us_per_event'], '.1f')} µs; p50 / p99 at half of its measured maximum "
        f"{fmt(r['p50_ms_half_load'])} / {fmt(r['p99_ms_half_load'])} ms; replay of 100 % "
        f"duplicates / first ingest = {fmt(r['replay_ratio'], '.2f')}; with 1 ms of round "
        f"trip to PostgreSQL and Kafka / on loopback = {fmt(r['ratio_at_1ms_rtt'], '.2f')}; "
        f"peak RSS draining a 10M backlog {fmt(r['backlog_peak_rss_mb'])} MB and a flood of "
        f"1 MiB records {fmt(r['flood_peak_rss_mb'])} MB.",
        "",
        _targets(r),
    ]
    c = summary["conditions"]
    lines += [
        "",
        f"Conditions: {c['events']:,} events, {c['partitions']} partitions, {c['cores']} "
        f"cores, Python {c.get('python', '?')}, started {c.get('started_at', '?')}, "
        f"1-minute load average {c['load_avg_1m_at_start']} at start and "
        f"{c.get('load_avg_1m_at_end')} at end.",
    ]
    return lines


def _limit_line(summary: dict[str, Any]) -> list[str]:
    notes = summary["systems"].get("limit", {}).get("ingest", {}).get("notes", {})
    tried = notes.get("events_per_s_by_connections")
    if not tried:
        return []
    runs = notes.get("runs_by_connections") or {}
    parts = ", ".join(
        f"{n} connection{'s' if n != '1' else ''} {fmt(v)}/s"
        + (f" (runs {' / '.join(fmt(r) for r in runs[n])})" if len(runs.get(n, [])) > 1 else "")
        for n, v in tried.items()
    )
    what = "the best run" if any(len(r) > 1 for r in runs.values()) else "the best"
    return ["", f"The limit is {what} of 1 and N parallel COPY connections ({parts})."]


def _flood_rows(summary: dict[str, Any]) -> list[str]:
    fl = summary.get("flood")
    if fl is None:
        return []
    if "error" in fl:
        return ["", f"Flood of 1 MiB records: failed: {str(fl['error'])[:200]}"]
    n = fl.get("notes", {})
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(n.get("reasons", {}).items()))
    return [
        "",
        f"Flood of 1 MiB records (one worker, default settings, `ACKLINE_BATCH_MAX_BYTES` "
        f"8 MiB): {fmt(fl.get('events'))} records, {fmt(n.get('megabytes'))} MB, drained in "
        f"{fmt(fl.get('wall_s'), ',.0f')} s; **peak RSS {fmt(fl.get('peak_rss_mb'))} MB**; "
        f"{fmt(n.get('rows'))} rows and {fmt(n.get('rejects'))} rejects ({reasons}), as "
        "generated.",
    ]


def _rtt_rows(summary: dict[str, Any]) -> list[str]:
    rt = summary.get("rtt")
    if rt is None:
        return []
    if "error" in rt:
        return ["", f"1 ms of round trip: failed: {str(rt['error'])[:200]}"]
    lines = [
        "",
        "One worker, the same backlog on a second broker, through Toxiproxy to Kafka and "
        "PostgreSQL (a run made twice shows its best, then every run's rate in order):",
        "",
        "| run | events/s | / loopback | worker CPU µs/event | PostgreSQL µs/event "
        "| Toxiproxy CPU s | `SELECT 1` ms | runs, events/s |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    labels = {
        "loopback": "loopback (no proxy)",
        "proxied": "through the proxies, no latency",
        "rtt_1ms": "through the proxies, +1 ms round trip",
    }
    base = rt.get("loopback", {}).get("events_per_s")
    for run, label in labels.items():
        ph = rt.get(run)
        if not ph:
            continue
        rate = ph.get("events_per_s")
        ratio = rate / base if rate and base else None
        lines.append(
            f"| {label} | {fmt(rate)} | {fmt(ratio, '.2f')} "
            f"| {fmt(per_event_us(ph, 'cpu_client_s'), ',.1f')} "
            f"| {fmt(per_event_us(ph, 'cpu_pg_s'), ',.1f')} "
            f"| {fmt(ph.get('notes', {}).get('toxiproxy_cpu_s'), ',.1f')} "
            f"| {fmt(rt.get(f'{run}_select1_ms'), '.2f')} "
            f"| {' / '.join(fmt(r) for r in ph.get('rates') or [rate])} |"
        )
    return lines


def _scale_rows(summary: dict[str, Any]) -> list[str]:
    scale = summary.get("scale_out")
    if not scale:
        return []
    lines = [
        "",
        "Scale-out, the same backlog, a fresh database and group each time:",
        "",
        "| workers | events/s | worker CPU s | PostgreSQL CPU s | PostgreSQL busy |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n, r in scale.items():
        busy = r["cpu_pg_s"] / r["wall_s"] if r.get("wall_s") else None
        lines.append(
            f"| {n} | {fmt(r.get('events_per_s'))} | {fmt(r.get('cpu_client_s'), ',.1f')} "
            f"| {fmt(r.get('cpu_pg_s'), ',.1f')} | {fmt(busy, '.2f')} core |"
        )
    connect = summary.get("scale_out_connect")
    if connect and "error" not in connect:
        parts = ", ".join(
            f"{n} task{'s' if n != '1' else ''} {fmt(r.get('events_per_s'))}/s"
            for n, r in connect.items()
        )
        lines += ["", f"Kafka Connect + Debezium JDBC given the same count of tasks: {parts}."]
    elif connect:
        lines += ["", f"Kafka Connect with 2 tasks: failed: {str(connect['error'])[:200]}"]
    return lines


def block(summary: dict[str, Any]) -> str:
    """The generated block of docs/performance.md, markers included."""
    lines = [
        START,
        "",
        *_system_rows(summary),
        "",
        *_headline(summary),
        *_limit_line(summary),
        *_scale_rows(summary),
        *_flood_rows(summary),
        *_rtt_rows(summary),
    ]
    return "\n".join([*lines, "", END])


def summary_block(summary: dict[str, Any]) -> str:
    """The README's block, markers included: the last line's ratios and the verdict."""
    r = ratios(summary)
    c = summary["conditions"]
    lines = [
        SUMMARY_START,
        f"- Last `make bench` ({c['events']:,} events, {c['partitions']} partitions, "
        f"{c['cores']} cores, started {c.get('started_at', '?')}): one worker drained "
        f"{fmt(summary['systems']['ackline']['ingest'].get('events_per_s'))} events/s, "
        f"**{fmt(r['ratio_to_limit'], '.2f')} x the COPY limit and "
        f"{fmt(r['ratio_to_best_peer'], '.2f')} x the best peer ({r['best_peer']})**; "
        f"CPU per event {fmt(r['worker_us_per_event'], '.1f')} µs in the worker and "
        f"{fmt(r['pg_us_per_event'], '.1f')} µs in PostgreSQL; p50 / p99 at half load "
        f"{fmt(r['p50_ms_half_load'])} / {fmt(r['p99_ms_half_load'])} ms; replay "
        f"{fmt(r['replay_ratio'], '.2f')} x first ingest; {fmt(r['ratio_at_1ms_rtt'], '.2f')} "
        "x loopback at 1 ms of round trip.",
        f"- {_targets(r)}",
        "- The tables, the peers and what bounds each figure: "
        "[docs/performance.md](docs/performance.md).",
        SUMMARY_END,
    ]
    return "\n".join(lines)


def splice(page: str, generated: str, start: str = START, end_marker: str = END) -> str:
    """``page`` with its block between the markers replaced by ``generated``."""
    at, end = page.find(start), page.find(end_marker)
    if at < 0 or end < at:
        raise LoadError(
            f"the page has no bench block: expected the markers {start!r} … {end_marker!r}"
        )
    return page[:at] + generated + page[end + len(end_marker) :]


def _rewrite(path: Path, generated: str, start: str, end_marker: str) -> None:
    text = path.read_text(encoding="utf-8")
    new = splice(text, generated, start, end_marker)
    if new != text:
        path.write_text(new, encoding="utf-8")


def update(results: Path = RESULTS, page: Path = PAGE, readme: Path = README) -> None:
    """Rewrite the bench block of ``page`` (docs/performance.md) and the summary block of
    ``readme`` (README.md) from ``results``."""
    summary = json.loads(results.read_text(encoding="utf-8"))
    _rewrite(page, block(summary), START, END)
    _rewrite(readme, summary_block(summary), SUMMARY_START, SUMMARY_END)


def main() -> int:
    try:
        update()
    except (LoadError, OSError, ValueError, KeyError) as exc:
        print(f"ackline.load.bench.readme: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
