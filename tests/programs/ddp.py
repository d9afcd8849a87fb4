"""One DDP rank of tests/processes/test_ddp.py, run under real torchrun (gloo on CPU).

    torchrun --nproc-per-node 2 --standalone ddp.py MODE SCOPE BEHAVIOUR --steps 15

Each rank attaches through ``wf.init`` with run id "base", waits for every rank, logs
``--steps`` steps (loss, tput, and a key of its own), and finishes. BEHAVIOUR:

- ``plain``: just that;
- ``allgather``: also all_gather the loss each step; rank 0 REPORTs the means;
- ``raise``: rank 1 raises at step 5;
- ``slow``: 0.2 s a step; rank 0 REPORTs ready at step 3 (the test then SIGTERMs torchrun);
- ``intruders``: the hosting rank's funnel gets two TCP clients without the job's keys;
- ``media``: at the last step every rank also logs an image (``wf.Image`` and
  ``wandb.Image``), a one-row table (``concat``) and a histogram (``merge``); a rank on the
  other node sends them as bytes.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import zmq
from _prelude import report

import wandb_funnel as wf


def send_intruders(run: wf.Run, funnel: wf.Funnel) -> None:
    """Two clients that do not hold the job's keys knock on the funnel's TCP endpoint."""
    tcp_address = funnel.tcp_address
    assert tcp_address is not None, "the funnel does not listen on TCP"
    ctx = zmq.Context()
    for curve in (False, True):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if curve:  # a client with keys of its own, not the job's
            keys = run._info.curve
            assert keys is not None
            pub, sec = zmq.curve_keypair()
            s.curve_serverkey = keys["server_public"].encode()
            s.curve_publickey, s.curve_secretkey = pub, sec
        s.connect(tcp_address)
        s.send(b"hello?")
        time.sleep(0.5)
        s.close()
    ctx.term()


def log_media(run: wf.Run, rank: int, step: int) -> None:
    import numpy as np
    import wandb

    pixels = np.full((8, 8, 3), 30 * rank, dtype=np.uint8)
    run.log(
        {
            "img": wf.Image(pixels, caption=f"rank {rank}"),
            "wimg": wandb.Image(pixels + 1, caption=f"wandb rank {rank}"),
            "table": wf.Table(columns=["who", "img"], data=[[rank, wf.Image(pixels)]]),
            "hist": wf.Histogram(np_histogram=([rank, 1], [0.0, 1.0, 2.0])),
        },
        step=step,
    )
    stager = run._stager
    assert stager is not None
    report(**{f"media_over_{rank}": "files" if stager.directory else "bytes"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", help="run_mode")
    parser.add_argument("scope", help="rank_scope")
    parser.add_argument(
        "behaviour", choices=["plain", "allgather", "raise", "slow", "intruders", "media"]
    )
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    behaviour = args.behaviour

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # A wide window: 4 ranks on 2 CI cores can be descheduled for seconds, and these tests are
    # about what is merged, not about how long a straggler may hold rows (tested elsewhere).
    run = wf.init(
        project="t",
        id="base",
        run_mode=args.mode,
        rank_scope=args.scope,
        reduce={"tput": "sum", "table": "concat", "hist": "merge"},
        reorder_window=30,
    )
    # As a DDP training step would (its allreduce): no rank logs before every rank attached.
    # The merge at step 0 is promised for ranks that synchronise after init; without this,
    # rank 0 on a loaded box logged all its steps and finished the run before ranks 2 and 3
    # attached.
    dist.barrier()
    report(rank=rank, run_id=run.id)
    gathered = []
    for step in range(args.steps):
        loss = torch.tensor(float((rank * 7 + step * 3) % 11) / 3.0)
        run.log({"loss": loss, "tput": 1.0, f"r{rank}": step}, step=step)
        if behaviour == "media" and step == args.steps - 1:
            log_media(run, rank, step)
        if behaviour == "allgather":
            parts = [torch.zeros(()) for _ in range(world)]
            dist.all_gather(parts, loss)
            gathered.append(float(sum(parts)) / world)
        if behaviour == "raise" and rank == 1 and step == 5:
            raise RuntimeError("rank 1 fails")
        if behaviour == "slow":
            time.sleep(0.2)
            if rank == 0 and step == 3:
                report(ready=True)
    # The hosting rank's run is finished by its Funnel's close (a bound method of the Funnel).
    funnel = getattr(run._finish_hook, "__self__", None)
    if behaviour == "intruders" and isinstance(funnel, wf.Funnel):
        send_intruders(run, funnel)
    if rank == 0 and behaviour == "allgather":
        report(gathered=gathered)
    run.finish()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
