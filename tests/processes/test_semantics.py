"""What ends up in the run: reduction across ranks, shared-mode keys, rare ranks, late
records, config and summary from workers, bad input at the call site, junk on the socket."""

from __future__ import annotations

import pytest

from tests.conftest import PRELUDE, Scripts, reports
from tests.wandb_reader import only_run

pytestmark = pytest.mark.processes

RANKS = (
    PRELUDE
    + """
def rank_main(rank, barrier, steps, every):
    run = wf.init(rank=rank)
    barrier.wait(60)
    for step in range(0, steps, every):
        run.log({"loss": float(rank * 10 + step), "tput": 1.0, f"only{rank}": step}, step=step)
    run.finish()

def launch(funnel, n, steps=20, every=1, rare=None):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=rank_main,
                         args=(r, barrier, steps, (rare or {}).get(r, every)))
             for r in range(1, n + 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    return [p.exitcode for p in procs]
"""
)


def test_auto_mode_reduces_like_all_gather(scripts: Scripts) -> None:
    """auto: loss logged by every rank is the mean per step (what an all_gather mean gives),
    tput is summed as asked, and a key logged by one rank appears untouched."""
    res = scripts.run(
        RANKS
        + """
if __name__ == "__main__":
    with wf.Funnel(project="t", reduce={"tput": "sum"}) as funnel:
        codes = launch(funnel, 3)
    report(codes=codes)
"""
    )
    assert res.returncode == 0, res.stderr
    assert reports(res.stdout)["codes"] == [0, 0, 0]
    run = only_run(scripts.wandb_dir)
    assert [r["global_step"] for r in run.history] == list(range(20))
    for row in run.history:
        s = row["global_step"]
        assert row["loss"] == pytest.approx(sum(r * 10 + s for r in (1, 2, 3)) / 3)
        assert row["tput"] == 3.0
        assert row["only2"] == s
    assert run.summary["funnel/late_records"] == 0
    assert run.summary["funnel/ranks"] == 3


def test_shared_mode_keeps_every_rank(scripts: Scripts) -> None:
    """shared: every rank's value appears as {key}/rank{rank}, plus the reductions asked for."""
    res = scripts.run(
        RANKS
        + """
if __name__ == "__main__":
    with wf.Funnel(project="t", run_mode="shared", reduce={"loss": "max"}) as funnel:
        launch(funnel, 2, steps=5)
"""
    )
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    for row in run.history:
        s = row["global_step"]
        assert row["loss/rank1"] == 10 + s and row["loss/rank2"] == 20 + s
        assert row["loss"] == 20 + s
        assert "tput" not in row and row["tput/rank1"] == 1.0


def test_rare_rank_lands_at_its_steps_without_stalling(scripts: Scripts) -> None:
    """A rank logging every 50 steps while others log every step: its records land at their
    own steps, merged into those rows, and nothing is late. (The window is wide so that a
    descheduled process on a loaded CI machine cannot make this timing-dependent.)"""
    res = scripts.run(
        RANKS
        + """
if __name__ == "__main__":
    with wf.Funnel(project="t", reorder_window=30) as funnel:
        launch(funnel, 3, steps=200, rare={3: 50})
"""
    )
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert [r["global_step"] for r in run.history] == list(range(200))
    assert run.column("only3") == [(0, 0), (50, 50), (100, 100), (150, 150)]
    assert run.summary["funnel/late_records"] == 0


def test_late_record_is_logged_at_its_step_and_counted(scripts: Scripts) -> None:
    """A record that arrives after its row was written is still logged at its x (the step
    key), not dropped by wandb's step rule, and counted as late."""
    res = scripts.run(
        PRELUDE
        + """
def child():
    wf.log({"late": 5}, step=5)

if __name__ == "__main__":
    with wf.Funnel(project="t", reorder_window=0.1) as funnel:
        for s in range(20):
            funnel.log({"x": s}, step=s)
        funnel.run.flush()
        time.sleep(1.0)  # rows 0..19 are written
        p = mp.get_context("spawn").Process(target=child); p.start(); p.join(60)
    report(stats=funnel.stats)
"""
    )
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert run.column("late") == [(5, 5)]
    assert run.summary["funnel/late_records"] == 1
    assert run.summary["funnel/records"] == 21
    steps = [r["global_step"] for r in run.history]
    assert steps[:20] == list(range(20)) and steps[20] == 5
    # The x-axis declaration that makes this work is in the run.
    assert any(
        m.get("glob_name") == "*" and m.get("step_metric") == "global_step" for m in run.metrics
    )


def test_worker_config_and_summary_reach_the_run(scripts: Scripts) -> None:
    res = scripts.run(
        PRELUDE
        + """
def child():
    run = wf.init(config={"worker_seed": 7})
    run.summary["worker_best"] = 0.9
    run.config.update({"lr": 0.01})
    run.finish()

if __name__ == "__main__":
    with wf.Funnel(project="t", config={"owner": "yes"}) as funnel:
        p = mp.get_context("spawn").Process(target=child); p.start(); p.join(60)
"""
    )
    assert res.returncode == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert run.config["owner"] == "yes" and run.config["worker_seed"] == 7
    assert run.config["lr"] == 0.01
    assert run.summary["worker_best"] == 0.9


def test_bad_input_raises_at_call_site_and_funnel_keeps_working(scripts: Scripts) -> None:
    """Bad log() calls raise TypeError/ValueError naming the problem; later logs still land."""
    res = scripts.run(
        PRELUDE
        + """
import numpy as np
def child(q):
    errors = []
    for bad in ({1: 2}, {"k": object()}, {"k": np.zeros(3)}, "notadict", {"s": "x" * 2000}):
        try:
            wf.log(bad)
        except (TypeError, ValueError) as e:
            errors.append(str(e))
    try:
        wf.log({"x": 1}, step=-1)
    except ValueError as e:
        errors.append(str(e))
    wf.log({"child_ok": 1}, step=0)
    q.put(errors)

if __name__ == "__main__":
    with wf.Funnel(project="t", max_record_bytes=1000) as funnel:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,)); p.start()
        errors = q.get(timeout=60)
        p.join(60)
        funnel.log({"owner_ok": 1}, step=0)
    report(errors=errors)
"""
    )
    assert res.returncode == 0, res.stderr
    errors = reports(res.stdout)["errors"]
    assert len(errors) == 6
    assert "keys must be str" in errors[0]
    assert "'k'" in errors[1] and "'k'" in errors[2]
    assert "must be a dict" in errors[3]
    assert "max_record_bytes=1000" in errors[4]
    assert "step" in errors[5]
    run = only_run(scripts.wandb_dir)
    assert run.column("child_ok") == [(0, 1)] and run.column("owner_ok") == [(0, 1)]
    assert run.summary["funnel/dropped_records"] == 0


def test_junk_on_the_socket_is_counted_and_survived(scripts: Scripts) -> None:
    """Malformed frames, frames from a peer that never said hello, and a hello with the wrong
    token are counted and skipped; the logger keeps serving real ranks."""
    res = scripts.run(
        PRELUDE
        + """
import zmq, msgpack
if __name__ == "__main__":
    with wf.Funnel(project="t") as funnel:
        funnel.log({"before": 1}, step=0)
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 2000)
        s.connect(funnel.address)
        s.send(b"\\xc1garbage")                                     # not msgpack
        s.send(msgpack.packb([1, 2, 0, 1]) + msgpack.packb([0, True, {"evil": 1}]))  # no hello
        s.send(msgpack.packb([1, 1, "wrong-token", os.getpid(), "h", None, None]))
        s.send(msgpack.packb([1, 2, 0, 1]) + msgpack.packb([0, True, {"evil": 2}]))
        s.send_multipart([b"a", b"b"])                               # two frames
        s.close(); ctx.term()
        time.sleep(0.5)
        funnel.log({"after": 1}, step=1)
    report(stats=funnel.stats)
"""
    )
    assert res.returncode == 0, res.stderr
    stats = reports(res.stdout)["stats"]
    assert stats["funnel/junk_frames"] == 4
    assert stats["funnel/rejected_peers"] == 1
    run = only_run(scripts.wandb_dir)
    assert run.column("before") == [(0, 1)] and run.column("after") == [(1, 1)]
    assert "evil" not in {k for row in run.history for k in row}
