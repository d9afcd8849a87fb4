"""The suite's results as one Markdown table per measurement, and the targets met or not."""

from __future__ import annotations

import statistics
from typing import Any


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _rows(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_f(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def training_rates(results: dict[str, Any]) -> dict[str, float]:
    return {
        mode: statistics.median(r["steps_per_s"] for r in runs)
        for mode, runs in results["training"].items()
    }


def checks(results: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(target, goal, measured, met) for each target of issue 5."""
    t = results["targets"]
    cost = results["log_cost"]
    ingest = results["ingest"]
    mem = results["memory"]["worker"]
    log_us = cost["funnel/3"]["cpu_median_us"]
    rates = training_rates(results)
    overhead = 100 * (1 - rates["funnel"] / rates["none"])
    attach = mem["funnel_import_attach"]
    bare = mem["bare"]
    return [
        (
            "worker CPU per log(), 3 scalars, median",
            f"<= {t['log_us']} us",
            f"{log_us:.2f} us",
            log_us <= t["log_us"],
        ),
        (
            "  vs multiprocessing.Queue funnel (means: its feeder thread pickles later)",
            "<= 1/3",
            f"1/{cost['queue/3']['cpu_mean_us'] / cost['funnel/3']['cpu_mean_us']:.1f}",
            cost["funnel/3"]["cpu_mean_us"] <= cost["queue/3"]["cpu_mean_us"] / 3,
        ),
        (
            "  vs wandb.log",
            "<= 1/100",
            f"1/{cost['wandb/3']['cpu_median_us'] / log_us:.0f}",
            log_us <= cost["wandb/3"]["cpu_median_us"] / 100,
        ),
        (
            "  vs all_gather + rank-0 log (2 ranks, wall)",
            "<= 1/300",
            f"1/{cost['allgather2/3']['wall_median_us'] / log_us:.0f}",
            log_us <= cost["allgather2/3"]["wall_median_us"] / 300,
        ),
        (
            "logger ingest, 4 producers",
            f">= {t['ingest_4']:,}/s",
            f"{ingest['funnel/4']['records_per_s']:,.0f}/s",
            ingest["funnel/4"]["records_per_s"] >= t["ingest_4"],
        ),
        (
            "  vs the Queue funnel",
            ">= 3x",
            f"{ingest['funnel/4']['records_per_s'] / ingest['queue/4']['records_per_s']:.1f}x",
            ingest["funnel/4"]["records_per_s"] >= 3 * ingest["queue/4"]["records_per_s"],
        ),
        (
            "1,024 simulated ranks",
            f">= {t['ingest_1024']:,}/s",
            f"{ingest['funnel/1024 ranks']['records_per_s']:,.0f}/s",
            ingest["funnel/1024 ranks"]["records_per_s"] >= t["ingest_1024"],
        ),
        (
            "exit: end of training to every process gone",
            f"<= {t['exit_s']} s",
            f"{results['end_to_end']['funnel']['exit_latency_s']:.2f} s",
            results["end_to_end"]["funnel"]["exit_latency_s"] <= t["exit_s"],
        ),
        (
            "worker import + attach",
            f"<= {t['import_s']} s",
            f"{attach['seconds']:.3f} s",
            attach["seconds"] <= t["import_s"],
        ),
        (
            "  RSS over bare Python",
            f"<= {t['import_mb']} MB",
            f"{attach['rss_mb'] - bare['rss_mb']:.1f} MB",
            attach["rss_mb"] - bare["rss_mb"] <= t["import_mb"],
        ),
        (
            "  wandb not imported by a worker",
            "not imported",
            "imported" if attach["wandb_imported"] else "not imported",
            not attach["wandb_imported"],
        ),
        (
            "training overhead of logging every step",
            f"<= {t['overhead_pct']}%",
            f"{overhead:.1f}%",
            overhead <= t["overhead_pct"],
        ),
    ]


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        (
            f"Measured {m['date']} on {m['cpus']} CPUs, {m['memory_gb']} GB, Python "
            f"{m['python']} (load average {m['load_average_at_start']:.1f} at the start)."
        ),
        "",
    ]
    lines += ["**Targets**", ""]
    lines += _rows(
        ["target", "goal", "measured", "met"],
        [[a, b, c, "yes" if ok else "**no**"] for a, b, c, ok in checks(results)],
    )

    lines += [
        (
            "**1. CPU per log() call** (whole process: feeder and flusher threads count; "
            "all_gather also shows wall time, which is what training waits for)"
        ),
        "",
    ]
    rows = []
    for key, r in results["log_cost"].items():
        name, fields = key.split("/")
        rows.append(
            [
                name,
                fields,
                r["cpu_median_us"],
                r["cpu_p99_us"],
                r["cpu_mean_us"],
                r["wall_median_us"],
            ]
        )
    lines += _rows(
        ["candidate", "scalars", "CPU median us", "CPU p99 us", "CPU mean us", "wall median us"],
        rows,
    )

    lines += ["**2. Logger ingest** (records/s into ordered, merged rows; null sink)", ""]
    rows = []
    for key, r in results["ingest"].items():
        mode, who = key.split("/")
        rows.append(
            [
                mode,
                who,
                r["records_per_s"],
                r.get("dropped"),
                r.get("late"),
                r.get("logger_peak_rss_mb"),
            ]
        )
    lines += _rows(["mode", "producers", "records/s", "dropped", "late", "logger peak MB"], rows)

    lines += ["**3-4. End to end** (4 ranks into offline wandb)", ""]
    rows = [
        [
            mode,
            r["runs"],
            r["records"],
            r["wandb_log_calls"],
            r["first_log_to_finished_s"],
            r["exit_latency_s"],
        ]
        for mode, r in results["end_to_end"].items()
    ]
    lines += _rows(
        [
            "mode",
            "runs",
            "records",
            "wandb.log calls",
            "first log to finished s",
            "end of training to all exited s",
        ],
        rows,
    )

    r0 = results.get("rank0_only")
    if r0 is not None:
        lines += [
            (
                f"**6. Rank-0-only logging end to end** (torchrun, 2 ranks, {r0['steps']} "
                f"logs from rank 0; plain wandb against the same script with "
                f"`wandb_funnel.install()`; medians of {r0['plain']['runs']} interleaved "
                f"runs)"
            ),
            "",
        ]
        lines += _rows(
            ["mode", "whole job s", "last log to exit s"],
            [[mode, r0[mode]["job_s"], r0[mode]["exit_s"]] for mode in ("plain", "funnel")],
        )
        lines += [f"Funnel / plain, whole job: {r0['ratio_job']:.2f}.", ""]

    media = results.get("media")
    if media is not None:
        lines += [
            (
                f"**7. Images** ({media['images']} images of 64x64 RGB, one per step; plain "
                f"`wandb.log` of `wandb.Image` against a funnel rank logging `wf.Image` or "
                f"`wandb.Image`)"
            ),
            "",
        ]
        lines += _rows(
            ["mode", "cost per image to the logging process us", "images/s into the run"],
            [
                [mode, media[mode]["worker_us"], media[mode]["images_per_s"]]
                for mode in ("plain", "funnel", "funnel-wandb")
            ],
        )
        lines += [
            (
                f"Funnel (`wf.Image`) / plain: cost per image {media['ratio_worker']:.2f}, "
                f"throughput {media['ratio_throughput']:.2f}."
            ),
            "",
        ]

    mem = results["memory"]
    w = mem["worker"]
    lines += ["**5. Memory and import**", ""]
    lines += _rows(
        ["process", "seconds", "RSS MB over bare", "wandb imported"],
        [
            [
                "import wandb_funnel + attach",
                w["funnel_import_attach"]["seconds"],
                w["funnel_import_attach"]["rss_mb"] - w["bare"]["rss_mb"],
                w["funnel_import_attach"]["wandb_imported"],
            ],
            [
                "import wandb",
                w["wandb_import"]["seconds"],
                w["wandb_import"]["rss_mb"] - w["bare"]["rss_mb"],
                True,
            ],
        ],
    )
    s = mem["stalled-rank"]
    lines += [
        (
            f"Logger RSS with one of 8 ranks stalled: {s['logger_rss_mb_first_quarter']:.0f} "
            f"MB in the first quarter of the run, {s['logger_rss_mb_last_quarter']:.0f} MB in "
            f"the last, {s['logger_rss_mb_peak']:.0f} MB peak ({_f(s['records'])} records, "
            f"{_f(s['rows'])} rows)."
        ),
        "",
    ]

    rates = training_rates(results)
    lines += ["**6. DDP training loop** (2 gloo ranks on CPU, torchrun; median of the rounds)", ""]
    lines += _rows(
        ["logging", "steps/s", "overhead"],
        [[mode, rate, f"{100 * (1 - rate / rates['none']):.1f}%"] for mode, rate in rates.items()],
    )
    return "\n".join(lines)
