"""6. What logging every step costs a small DDP training loop (CPU, gloo, under torchrun).

    python benchmarks/training.py --mode none|funnel|allgather [--nproc 2] [--steps N]

Each mode is launched with ``torchrun --standalone``; rank 0 reports steps/s over the timed
steps (after a warmup). ``funnel`` logs loss and throughput from every rank with ``wf.log``
(rank 0 hosts the logger, wandb offline); ``allgather`` gathers the loss from every rank and
logs it from rank 0 with ``wandb.log`` (offline); ``none`` logs nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _common import report

WARMUP = 50


def train(mode: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817  (torch's usage)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    run = None
    if mode == "funnel":
        import wandb_funnel as wf

        run = wf.init(project="bench")
    elif mode == "allgather" and rank == 0:
        import wandb

        run = wandb.init(project="bench", settings=wandb.Settings(console="off"))
    gathered = [torch.zeros(1) for _ in range(world)]
    t0 = 0.0
    for step in range(WARMUP + steps):
        if step == WARMUP:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if mode == "funnel":
            run.log({"loss": loss.item(), "samples": 32}, step=step)
        elif mode == "allgather":
            dist.all_gather(gathered, loss.detach().reshape(1))
            if run is not None:
                run.log(
                    {"loss": torch.cat(gathered).mean().item(), "samples": 32 * world}, step=step
                )
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        report(mode=mode, ranks=world, steps=steps, steps_per_s=steps / elapsed)
    if run is not None:
        run.finish()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--inner", action="store_true")
    args = parser.parse_args()
    if args.inner:
        train(args.mode, args.steps)
        return
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.nproc}",
            __file__,
            "--inner",
            "--mode",
            args.mode,
            "--steps",
            str(args.steps),
        ],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(out.returncode)


if __name__ == "__main__":
    main()
