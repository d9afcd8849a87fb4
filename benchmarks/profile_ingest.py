"""Where the logger's and the producers' time goes during the ingest benchmark (py-spy).

    python benchmarks/profile_ingest.py [--producers 4] [--ranks-per-producer 1]
                                        [--records 100000] [--out DIR]

Samples every process of ``ingest.py --mode funnel`` with ``py-spy record --subprocesses``
(idle samples left out) and prints, per role, the share of samples by function (self time)
and by call path entry (inclusive). Writes the raw samples beside the summary.
py-spy is not a dependency: ``pip install py-spy``.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import shutil
import subprocess
import sys
import tempfile

from _common import HERE, scratch_env


def _role(frames: list[str]) -> str:
    for frame in frames:
        if "wandb_funnel._logger" in frame:
            return "logger"
        if "--multiprocessing-fork" in frame:
            return "producer"
    return "owner"


def summarize(raw: pathlib.Path, top: int = 15) -> str:
    self_time: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        role, n = _role(frames), int(count)
        code = [f for f in frames if not f.startswith("process ") and "spawn_main" not in f]
        if not code:
            continue
        totals[role] += n
        self_time[role][code[-1]] += n
        for frame in set(code):
            inclusive[role][frame] += n
    out = []
    for role in ("logger", "producer", "owner"):
        total = totals[role]
        if not total:
            continue
        out.append(f"== {role}: {total} samples")
        out.append("  self time:")
        for frame, n in self_time[role].most_common(top):
            out.append(f"    {100 * n / total:5.1f}%  {frame}")
        out.append("  inclusive:")
        for frame, n in inclusive[role].most_common(top + 10):
            if "_bootstrap" in frame or "<module>" in frame or "run_code" in frame:
                continue
            out.append(f"    {100 * n / total:5.1f}%  {frame}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--producers", default="4")
    parser.add_argument("--ranks-per-producer", default="1")
    parser.add_argument("--records", default="100000")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(pathlib.Path(sys.executable).with_name("py-spy"))
    if not pathlib.Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "ingest-profile.raw"
    with tempfile.TemporaryDirectory(prefix="wandb-funnel-profile-") as scratch:
        env = scratch_env(pathlib.Path(scratch), WANDB_FUNNEL_SINK="null")
        subprocess.run(
            [
                spy,
                "record",
                "--subprocesses",
                "--nonblocking",
                "--format",
                "raw",
                "--rate",
                "250",
                "-o",
                str(raw),
                "--",
                sys.executable,
                str(HERE / "ingest.py"),
                "--mode",
                "funnel",
                "--producers",
                args.producers,
                "--ranks-per-producer",
                args.ranks_per_producer,
                "--records",
                args.records,
            ],
            env=env,
            cwd=scratch,
            check=True,
            timeout=600,
        )
    summary = summarize(raw)
    (out / "ingest-profile.txt").write_text(summary + "\n")
    print(summary)


if __name__ == "__main__":
    main()
