"""What surviving a logger's death costs ``log()``: the replay buffer (issue 26).

    python benchmarks/replay_cost.py [--calls N] [--rounds R]

A rank keeps every batch it sent until the logger says the rows are in wandb's transaction
log (``ReplayBuffer.keep``, once per batch of up to 256 records; the logger's ``Saved``
trims it). This runs ``run.log`` (3 scalars) in one process under a funnel whose logger writes
to the null sink, alternating rounds with the buffer on and with it off (the batch is not
kept: the funnel before issue 26), so the two are measured side by side on the same noisy
machine. Prints per-call process CPU (median of blocks) for each, and the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from _common import cpu_per_call, record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.update(WANDB_DIR=scratch, WANDB_FUNNEL_SINK="null")
        import wandb_funnel as wf
        from wandb_funnel._worker.replay import ReplayBuffer

        keep = ReplayBuffer.keep

        def off(self: ReplayBuffer, first: int, count: int, frame: bytes) -> None:
            return None

        recs = [record(3, i) for i in range(1024)]
        results: dict[str, list[float]] = {"on": [], "off": []}
        held: list[int] = []
        with wf.Funnel(project="bench", close_timeout=30) as funnel:
            run = funnel.run
            step = 0

            def call(i: int) -> None:
                nonlocal step
                run.log(recs[i % 1024], step=step)
                step += 1

            for n in range(args.rounds):
                for mode in ("on", "off") if n % 2 == 0 else ("off", "on"):
                    ReplayBuffer.keep = keep if mode == "on" else off  # type: ignore[method-assign]
                    figures = cpu_per_call(call, args.calls, block=256, warmup=1000)
                    results[mode].append(figures["cpu_median_us"])
                    stream = run._stream
                    if mode == "on" and stream is not None:
                        held.append(stream._replay.records)
            ReplayBuffer.keep = keep  # type: ignore[method-assign]
        on, off_ = statistics.median(results["on"]), statistics.median(results["off"])
        per_batch = _keep_cost()
        out = {
            "calls_per_round": args.calls,
            "rounds": args.rounds,
            "log_cpu_us_replay_on": round(on, 3),
            "log_cpu_us_replay_off": round(off_, 3),
            "difference_us": round(on - off_, 3),
            # The replay work alone, timed directly: once per batch of 256 records, with the
            # buffer full (each batch kept pushes the oldest out) and with the logger's
            # Saved trimming it (each batch kept is forgotten later).
            "keep_per_batch_us": round(per_batch["full"], 3),
            "keep_and_forget_per_batch_us": round(per_batch["trimmed"], 3),
            "replay_us_per_record": round(max(per_batch.values()) / 256, 4),
            "rounds_on": [round(v, 3) for v in results["on"]],
            "rounds_off": [round(v, 3) for v in results["off"]],
            "records_held_at_round_end": held,
            "stats": {k: v for k, v in (funnel.stats or {}).items() if v},
        }
        json.dump(out, sys.stdout, indent=1)
        print()


def _keep_cost() -> dict[str, float]:
    """Microseconds per batch of ``ReplayBuffer.keep`` (and ``saved``) alone: no socket, no
    logger, no noise from either."""
    import timeit

    from wandb_funnel._worker.replay import ReplayBuffer

    frame = b"x" * 256 * 40
    full = ReplayBuffer(65_536, 64 * 1024 * 1024)
    for n in range(300):
        full.keep(n * 256, 256, frame)
    seq = [300 * 256]

    def keep_full() -> None:
        full.keep(seq[0], 256, frame)
        seq[0] += 256

    trimmed = ReplayBuffer(65_536, 64 * 1024 * 1024)
    seq2 = [0]

    def keep_and_forget() -> None:
        trimmed.keep(seq2[0], 256, frame)
        seq2[0] += 256
        trimmed.saved(seq2[0] - 256 * 4)  # Saved lags a few batches behind

    n = 200_000
    return {
        "full": min(timeit.repeat(keep_full, number=n, repeat=5)) / n * 1e6,
        "trimmed": min(timeit.repeat(keep_and_forget, number=n, repeat=5)) / n * 1e6,
    }


if __name__ == "__main__":
    main()
