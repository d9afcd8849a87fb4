"""The exit window: from a program's last line to its process being gone, side by side.

A signal that lands in this window meets the interpreter's exit: its handler may be
swallowed by atexit or never run (issue 10). The funnel's share of the window is what it adds
over the same program without it. Three variants of one program (a short training loop with
persistent DataLoader workers, as in wandb#7590), rounds interleaved:

- ``none``: no wandb, no funnel;
- ``funnel``: ``wf.init`` / ``wf.log`` / ``wf.finish`` (a private funnel: this process owns it);
- ``wandb``: plain ``wandb.init`` / ``log`` / ``finish``.

    python benchmarks/exit_window.py --rounds 8

Prints a table of medians and p90s (ms) and ratios to ``none``; writes nothing else.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from _common import scratch_env

VARIANTS = ("none", "funnel", "wandb")


def child(variant: str) -> None:
    import torch
    from torch.utils.data import DataLoader

    run = None
    if variant == "funnel":
        import wandb_funnel as wf

        run = wf.init(project="exit-window")
    elif variant == "wandb":
        import wandb

        run = wandb.init(project="exit-window")
    loader = DataLoader(list(range(256)), batch_size=8, num_workers=2, persistent_workers=True)
    for step, batch in enumerate(loader):
        loss = float(torch.as_tensor(batch).float().mean())
        if run is not None:
            run.log({"loss": loss}, step=step)
    if run is not None:
        run.finish()
    sys.stdout.write(f"LAST_LINE {time.time()}\n")
    sys.stdout.flush()


def measure(variant: str, directory: pathlib.Path) -> float:
    """Seconds from the child's last line to its exit (its pipes closed and reaped)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", variant],
        cwd=directory,
        env=scratch_env(directory),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    last = None
    for line in proc.stdout:
        if line.startswith("LAST_LINE "):
            last = float(line.split()[1])
    proc.wait(timeout=120)
    gone = time.time()
    if last is None or proc.returncode != 0:
        raise RuntimeError(f"{variant}: exit {proc.returncode}, no last line")
    return gone - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--child", choices=VARIANTS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="exit-window-") as tmp:
        for r in range(args.rounds):
            for variant in VARIANTS:
                directory = pathlib.Path(tmp) / f"{variant}-{r}"
                directory.mkdir()
                times[variant].append(measure(variant, directory))
    base = statistics.median(times["none"])
    print(f"exit window, {args.rounds} interleaved rounds, load {os.getloadavg()[0]:.1f}")
    print("| variant | median ms | p90 ms | median / none |")
    print("|---|---|---|---|")
    for variant in VARIANTS:
        values = sorted(times[variant])
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        med = statistics.median(values)
        print(f"| {variant} | {med * 1000:.0f} | {p90 * 1000:.0f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
