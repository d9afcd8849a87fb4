"""What rank health (issue 27) and the saved-point bookkeeping (issue 26) cost the logger:
CPU per record of its pipeline (decode, order, look, build), with and without each, side by
side in alternating rounds (4 ranks x 20,000 steps, 3 scalars; no sockets, no wandb).

    python benchmarks/health_cost.py [--rounds R]

- plain: decode, order into rows, build the rows (``logger_pipeline.py``'s path);
- health: plus ``Health.batch`` per batch and the non-finite look at every value of every row
  (what the logger adds per record for stalls, NaNs and ``wandb-funnel status``);
- saving: plus ``SaveTracker.batch`` per batch and ``written`` per cycle (issue 26).
``log()`` itself is not touched by either: its cost is ``benchmarks/log_cost.py``'s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from wandb_funnel._logger.health import Health
from wandb_funnel._logger.ordering import Reorderer
from wandb_funnel._logger.reduce import RowBuilder
from wandb_funnel._logger.saving import SaveTracker
from wandb_funnel._protocol import codec

RANKS, STEPS, BATCH = 4, 20_000, 256


def _frames() -> list[bytes]:
    def packed(step: int) -> bytes:
        data = {"loss": 1.0 / (step + 1), "acc": step * 1e-6, "lr": 3e-4}
        return codec.encode_record(step, True, data, 1 << 20)

    records = [packed(s) for s in range(STEPS)]
    return [codec.encode_batch(i, records[i : i + BATCH]) for i in range(0, STEPS, BATCH)]


def one_round(frames: list[bytes], health: bool, saving: bool) -> float:
    """Process CPU per record, in microseconds."""
    t0 = time.process_time()
    order = Reorderer(2.0, 100_000)
    watch = Health(300.0)
    saves = SaveTracker()
    for rank in range(RANKS):
        order.rank_attached(rank)
        watch.attached(rank, 0.0)
    builder = RowBuilder("auto", {}, "global_step")
    now = time.monotonic()
    rows_written = 0
    for i, frame in enumerate(frames):  # round robin across ranks, a batch at a time
        for rank in range(RANKS):
            records = codec.decode(frame, 1 << 22).records  # type: ignore[union-attr]
            top = order.add_batch(rank, records, now)
            if saving:
                saves.batch(rank, (i + 1) * BATCH, top, rows_written)
            if health:
                watch.batch(rank, top, len(records), now)
        rows = order.pop_ready(now, True, 1000)
        for row in rows:
            if health:
                for rank, part in row.parts.items():
                    watch.values(rank, row.step, part)
            builder.build(row)
        rows_written += len(rows)
        if saving:
            saves.written(order.last_released_step, rows_written, rows_written * RANKS)
    for row in order.pop_all():
        builder.build(row)
    return (time.process_time() - t0) / (RANKS * STEPS) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    frames = _frames()
    modes = {"plain": (False, False), "health": (True, False), "saving": (False, True)}
    figures: dict[str, list[float]] = {m: [] for m in modes}
    for n in range(args.rounds):
        order = list(modes) if n % 2 == 0 else list(reversed(modes))
        for mode in order:
            figures[mode].append(one_round(frames, *modes[mode]))
    med = {m: statistics.median(v) for m, v in figures.items()}
    out = {
        "records_per_round": RANKS * STEPS,
        "us_per_record": {m: round(v, 3) for m, v in med.items()},
        "health_overhead_pct": round(100 * (med["health"] / med["plain"] - 1), 1),
        "saving_overhead_pct": round(100 * (med["saving"] / med["plain"] - 1), 1),
        "rounds": {m: [round(x, 3) for x in v] for m, v in figures.items()},
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
