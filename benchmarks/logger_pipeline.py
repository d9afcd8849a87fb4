"""The logger's own pipeline, without sockets or processes: CPU per record to decode batch
frames, order them into rows and build the rows (4 ranks x 40,000 steps, 3 scalars).

    python benchmarks/logger_pipeline.py
"""

from __future__ import annotations

import time

from wandb_funnel._logger.ordering import Reorderer
from wandb_funnel._logger.reduce import RowBuilder
from wandb_funnel._protocol import codec

RANKS, STEPS, BATCH = 4, 40_000, 64


def main() -> None:
    def packed(step: int) -> bytes:
        data = {"loss": 1.0 / (step + 1), "acc": step * 1e-6, "lr": 3e-4}
        return codec.encode_record(step, True, data, 1 << 20)

    records = [packed(s) for s in range(STEPS)]
    frames = [codec.encode_batch(i, records[i : i + BATCH]) for i in range(0, STEPS, BATCH)]
    t0 = time.process_time()
    batches = {r: [codec.decode(f, 1 << 22).records for f in frames] for r in range(RANKS)}
    t1 = time.process_time()
    order = Reorderer(2.0, 100_000)
    for rank in range(RANKS):
        order.rank_attached(rank)
    rows = []
    now = time.monotonic()
    for i in range(len(frames)):  # round robin across ranks, a batch at a time
        for rank in range(RANKS):
            order.add_batch(rank, batches[rank][i], now)
        rows.extend(order.pop_ready(now, True, 1000))
    rows.extend(order.pop_all())
    t2 = time.process_time()
    builder = RowBuilder("auto", {}, "global_step")
    for row in rows:
        builder.build(row)
    t3 = time.process_time()
    n = RANKS * STEPS
    us = [(b - a) / n * 1e6 for a, b in ((t0, t1), (t1, t2), (t2, t3), (t0, t3))]
    print(
        f"{n} records, {len(rows)} rows; per record: decode {us[0]:.2f} us, order "
        f"{us[1]:.2f} us, build rows {us[2]:.2f} us; total {us[3]:.2f} us "
        f"({n / (t3 - t0):,.0f} records/s on one core)"
    )


if __name__ == "__main__":
    main()
