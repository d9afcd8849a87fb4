"""The soak table: one row per scenario, as text for the terminal, JSON and Markdown.

``COLUMNS`` is the table of a matrix soak; ``user_columns`` that of a user's command, whose
exit codes are reported (as counts) rather than judged."""

from __future__ import annotations

import json
import pathlib
import platform
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from wandb_funnel.soak.iteration import Iteration

COLUMNS = [
    ("scenario", "scenario"),
    ("iterations", "iters"),
    ("failed", "failed"),
    ("hangs", "hangs"),
    ("faults_missed", "faults missed"),
    ("known_aborts", "known aborts"),
    ("exit_p50_s", "exit p50 s"),
    ("exit_p95_s", "exit p95 s"),
    ("exit_max_s", "exit max s"),
    ("sent", "sent"),
    ("logged", "logged"),
    ("dropped", "dropped"),
    ("lost", "lost"),
    ("leftover_processes", "procs left"),
    ("leftover_sockets", "sockets left"),
    ("wandb_sockets", "wandb-core sockets left"),
    ("logger_rss_mb", "logger MB"),
    ("worker_rss_mb", "worker MB"),
    ("plain", "plain wandb"),
]
_ACCOUNTING = [("sent", "sent"), ("logged", "logged"), ("dropped", "dropped"), ("lost", "lost")]


def user_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The table of a user's command: the record balance only where the program counted
    what it sent through the probe (otherwise just what the runs say they dropped)."""
    accounting = _ACCOUNTING if any(row["probe"] for row in rows) else [("dropped", "dropped")]
    return [
        ("scenario", "fault"),
        ("iterations", "iters"),
        ("failed", "failed"),
        ("hangs", "hangs"),
        ("faults_missed", "faults missed"),
        ("owner_exits", "owner exit codes"),
        ("run_exits", "run exit records"),
        ("fault_at_p50_s", "fault at p50 s"),
        ("exit_p50_s", "exit p50 s"),
        ("exit_max_s", "exit max s"),
        ("duration_p50_s", "job p50 s"),
        *accounting,
        ("leftover_processes", "procs left"),
        ("leftover_sockets", "sockets left"),
        ("wandb_sockets", "wandb-core sockets left"),
        ("logger_rss_mb", "logger MB"),
    ]


def _counts(values: Iterable[object]) -> str:
    """``143 x3, -9`` : each value with how often it came, most frequent first."""
    return ", ".join(f"{v} x{n}" if n > 1 else str(v) for v, n in Counter(values).most_common())


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1], 2)


def summarize(iterations: Iterable[Iteration]) -> list[dict[str, Any]]:
    by_name: dict[str, list[Iteration]] = {}
    for it in iterations:
        by_name.setdefault(it.scenario, []).append(it)
    rows = []
    for name, its in by_name.items():
        ours = [i for i in its if not i.plain]
        plain = [i for i in its if i.plain]
        exits = sorted(i.exit_s for i in ours if i.exit_s is not None)
        durations = sorted(i.duration_s for i in ours if i.duration_s is not None)
        fault_at = sorted(i.fault_at_s for i in ours if i.fault_at_s is not None)
        reasons = sorted({i.lost_reason for i in ours if i.lost_reason})
        rows.append(
            {
                "scenario": name,
                "iterations": len(ours),
                "failed": sum(not i.ok for i in ours),
                "hangs": sum(i.hang for i in ours),
                "faults_missed": sum(
                    1 for i in ours if (not i.fault_done or i.fault_after_end) and i.fault
                ),
                "known_aborts": sum(i.known_abort for i in ours),
                "exit_p50_s": _quantile(exits, 0.5),
                "exit_p95_s": _quantile(exits, 0.95),
                "exit_max_s": exits[-1] if exits else None,
                "sent": sum(i.sent for i in ours),
                "logged": sum(i.logged for i in ours),
                "dropped": sum(i.dropped for i in ours),
                "lost": sum(i.lost for i in ours if i.lost > 0),
                "lost_reasons": reasons,
                "leftover_processes": sum(len(i.leftover_processes) for i in ours),
                "leftover_sockets": sum(len(i.leftover_sockets) for i in ours),
                "wandb_sockets": sum(len(i.wandb_sockets) for i in ours),
                "logger_rss_mb": max((i.peak_rss_mb.get("logger", 0) for i in ours), default=0),
                "worker_rss_mb": max((i.peak_rss_mb.get("worker", 0) for i in ours), default=0),
                "worker_rate_per_s": _median([r for i in ours for r in i.rates]),
                "plain": _plain(plain),
                "owner_exits": _counts("hang" if i.hang else i.owner_exit for i in ours),
                "run_exits": _run_exits(ours),
                "runs": sum(len(i.run_exits) for i in ours),
                "fault_at_p50_s": _quantile(fault_at, 0.5),
                "duration_p50_s": _quantile(durations, 0.5),
                "probe": any(i.probe_used for i in ours),
                "problems": [f"#{i.index} seed={i.seed}: {p}" for i in ours for p in i.problems],
            }
        )
    return rows


def _run_exits(its: list[Iteration]) -> str:
    """The exit records the runs carry (``none``: a run without one), and ``no run`` for each
    iteration that wrote no ``.wandb`` file."""
    codes: list[object] = ["none" if c is None else c for i in its for c in i.run_exits]
    codes += ["no run"] * sum(not i.run_exits for i in its)
    return _counts(codes)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values)) if values else None


def _plain(plain: list[Iteration]) -> str:
    if not plain:
        return ""
    hangs = sum(i.hang for i in plain)
    no_exit = sum(1 for i in plain if not i.hang and (not i.run_exits or None in i.run_exits))
    left = sum(1 for i in plain if i.leftover_processes)
    parts = [f"{hangs}/{len(plain)} hang"]
    if no_exit:
        parts.append(f"{no_exit} no exit record")
    if left:
        parts.append(f"{left} left processes")
    return ", ".join(parts)


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def markdown(
    rows: list[dict[str, Any]], header: dict[str, Any], columns: list[tuple[str, str]] | None = None
) -> str:
    columns = COLUMNS if columns is None else columns
    lines = [
        (
            f"Soak: {header['iterations']} iterations, {header['duration_min']} min, "
            f"{header['date']}, {header['machine']}"
        ),
        "",
    ]
    if header.get("aborted_iterations"):
        lines += [
            (
                f"Aborted: {header['aborted_iterations']} running iteration(s) killed by a "
                "second Ctrl-C or SIGTERM, not in the table."
            ),
            "",
        ]
    if header.get("target"):
        lines += [
            (
                f"Command: `{header['target']}`. Exit codes are reported, not judged; a "
                "hang, a process or a funnel socket left behind fails an iteration."
            ),
            "",
        ]
    lines += [
        "| " + " | ".join(title for _, title in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    lines += ["| " + " | ".join(_cell(row[key]) for key, _ in columns) + " |" for row in rows]
    reasons = sorted({r for row in rows for r in row["lost_reasons"]})
    if reasons:
        lines += ["", "Losses with a reason (the fault itself destroys them):"]
        lines += [f"- {r}" for r in reasons]
    rates = [
        (row["scenario"], row["worker_rate_per_s"]) for row in rows if row["worker_rate_per_s"]
    ]
    if rates:
        lines += [
            "",
            "Worker log() rate while the sink falls behind (median, records/s): "
            + ", ".join(f"{name} {rate}" for name, rate in rates),
        ]
    problems = [p for row in rows for p in row["problems"]]
    if problems:
        lines += ["", "Failures:"] + [f"- {p}" for p in problems[:50]]
    return "\n".join(lines) + "\n"


def text(rows: list[dict[str, Any]], columns: list[tuple[str, str]] | None = None) -> str:
    columns = COLUMNS if columns is None else columns
    widths = [max(len(title), *(len(_cell(r[key])) for r in rows)) for key, title in columns]
    out = ["  ".join(t.ljust(w) for (_, t), w in zip(columns, widths, strict=True))]
    out += [
        "  ".join(_cell(row[k]).ljust(w) for (k, _), w in zip(columns, widths, strict=True))
        for row in rows
    ]
    return "\n".join(out)


def machine() -> str:
    import os

    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )


def write(
    out_dir: pathlib.Path,
    rows: list[dict[str, Any]],
    header: dict[str, Any],
    iterations: list[Iteration],
    columns: list[tuple[str, str]] | None = None,
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {**header, "scenarios": rows, "runs": [i.as_dict() for i in iterations]}
    (out_dir / "soak.json").write_text(json.dumps(payload, indent=1))
    (out_dir / "soak.md").write_text(markdown(rows, header, columns))
