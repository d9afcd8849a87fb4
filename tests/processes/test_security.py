"""Only the job's own processes get in.

- IPC: the socket lives in a fresh 0700 directory owned by the job's user; a process of
  another local user cannot even see the socket, let alone connect or push, even holding the
  job's token.
- TCP (multi-node): CURVE with an allow-list of the job's one client key. A client with no
  keys, one with a key pair of its own, and one holding another job's keys are all refused at
  the handshake and counted; none of their frames reach the logger.
- Another job on the same machine: its workers never reach this funnel: a worker pointed at
  this funnel's socket (same user) is refused for its token, and one of another user cannot
  connect at all.

Running a process as another user needs root. The venv's interpreter lives under /root
(0700), so a child exec'd as ``nobody`` (subprocess's ``user=``) could not even start Python:
the helper (tests/programs/security_helper.py) starts as root, imports everything it needs,
then drops to nobody for good (real, effective and saved uid and gid) before it touches the
funnel. The owner processes are tests/programs/security.py.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time
from typing import Any

import pytest

from tests.conftest import Scripts, leftover_processes, program, reports, wait_for_report
from tests.wandb_reader import only_run

pytestmark = [pytest.mark.processes, pytest.mark.sink("record")]  # the funnel's semantics

NOBODY = 65534
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not IS_ROOT, reason="running a process as another user (nobody) needs root"
)

SECURITY = program("security")  # the owner process of each scenario below


@needs_root
@pytest.mark.timeout(120)
def test_another_user_cannot_reach_the_ipc_socket(scripts: Scripts) -> None:
    """The socket directory is 0700 and owned by the job's user. A process running as nobody,
    holding the funnel's address and token, cannot stat the socket, list the directory or
    connect (EACCES), though it can search the directory's parent; through ZeroMQ its
    hello and records go nowhere (no answer). The run has the owner's records only, and no
    frame of it was even seen by the logger (no junk, no refused peer)."""
    res = scripts.run_file(SECURITY, ["ipc", "--nobody", str(NOBODY)])
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.leftovers == []
    info = reports(res.stdout)
    assert info["dir_mode"] == 0o700
    assert (info["dir_uid"], info["dir_gid"]) == (info["uid"], info["gid"])
    assert info["sock"].startswith("/tmp/wandb-funnel-")
    assert info["dir_gone"] is True

    helper = info["helper"]
    assert helper["rc"] == 0, helper["stderr"]
    result = helper["result"]
    assert (result["uid"], result["euid"], result["gid"], result["egid"]) == (NOBODY,) * 4
    assert result["stat_parent"] == "ok"  # only the funnel's own directory stands in the way
    assert result["stat_socket"] == "EACCES"
    assert result["list_dir"] == "EACCES"
    assert result["raw_connect"] == "EACCES"
    assert result["zmq_answered"] is False

    stats = info["stats"]
    assert stats["_funnel/records"] == 2
    assert stats["_funnel/ranks"] == 1
    assert stats["_funnel/junk_frames"] == 0 and stats["_funnel/rejected_peers"] == 0
    run = only_run(scripts.wandb_dir)
    assert run.column("before") == [(0, 1)] and run.column("after") == [(1, 1)]
    assert not any("intruder" in k for row in run.history for k in row)


@pytest.mark.timeout(120)
def test_tcp_clients_without_the_jobs_keys_are_refused_and_counted(scripts: Scripts) -> None:
    """Over TCP: clients with no CURVE keys, with a key pair of their own (right server key),
    and with another job's keys, each sending a hello with the job's token and a record, get
    no answer; every connection attempt is refused at the handshake and counted exactly once
    in _funnel/rejected_peers; none of their frames reach the logger (no junk); the run has
    none of their records, while a worker holding the job's keys logs over the same TCP
    endpoint and lands."""
    res = scripts.run_file(SECURITY, ["tcp"])
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.leftovers == []
    info = reports(res.stdout)
    assert info["tcp"].startswith("tcp://127.0.0.1:")
    assert info["answered"] == {
        "no_curve": False,
        "own_key_pair": False,
        "another_jobs_keys": False,
    }
    assert info["code"] == 0
    stats = info["stats"]
    assert stats["_funnel/rejected_peers"] == info["attempts"] == 6
    assert stats["_funnel/junk_frames"] == 0
    assert stats["_funnel/ranks"] == 2  # the owner and the keyed worker
    assert stats["_funnel/records"] == 1 + 5
    assert "refused" in res.stderr  # the logger says so
    run = only_run(scripts.wandb_dir)
    assert [v for _, v in run.column("tcp_worker")] == list(range(5))
    assert not any("intruder" in k for row in run.history for k in row)


@pytest.mark.timeout(240)
def test_another_job_cannot_reach_this_funnel(scripts: Scripts, tmp_path: pathlib.Path) -> None:
    """Two jobs on one machine, each with its own funnel. Job B's normal worker lands in B
    only. Job B's worker whose _WANDB_FUNNEL_ADDRESS points at job A's socket (same user)
    reaches A's socket but not A's run: its hello carries B's token and is refused (counted
    once), its frames are junk, and log() neither raises nor hangs (it warns). A process of
    another user with job A's whole environment, token included, cannot connect (EACCES) and
    gets nothing through the public API either. Neither run holds the other's records."""
    flag = tmp_path / "b_done"
    env = {"B_DONE": str(flag)}
    # Job A has a marker and a WANDB_DIR of its own: each job's processes are checked (and
    # its leftovers killed) on their own.
    (tmp_path / "job_a").mkdir()
    job_a = Scripts(tmp_path / "job_a", recording=scripts.recording)
    t0 = time.monotonic()
    proc_a = job_a.start_file(SECURITY, ["job-a"], extra_env=env)
    a: dict[str, Any] = {}
    try:
        a = wait_for_report(proc_a, "address", timeout=90)
        res_b = scripts.run_file(
            SECURITY,
            ["job-b", "--nobody", str(NOBODY)],
            timeout=150,
            extra_env={
                **env,
                "JOB_A_ADDRESS": a["address"],
                "JOB_A_TOKEN": a["token"],
                "JOB_A_PID": str(a["pid"]),
            },
        )
        flag.touch()
        res_a = job_a.finish(proc_a, timeout=90, t0=t0)
    finally:
        flag.touch()
        leftover_processes(job_a.mark, grace=0)
        if "address" in a:  # a logger killed above could not remove its directory in /tmp
            shutil.rmtree(os.path.dirname(a["address"][len("ipc://") :]), ignore_errors=True)
    assert res_b.returncode == 0, res_b.stderr[-4000:]
    assert res_a.returncode == 0, res_a.stderr[-4000:]
    assert res_a.leftovers == [] and res_b.leftovers == []
    a.update(reports(res_a.stdout))
    b = reports(res_b.stdout)

    assert a["address"] != b["address"]  # private sockets, one per funnel
    assert b["codes"] == [0, 0]
    # The misdirected worker said it could not get in.
    assert "did not answer" in res_b.stderr

    # Job A saw the misdirected worker at its socket and let nothing in.
    assert a["stats"]["_funnel/rejected_peers"] == 1  # its one hello, with job B's token
    assert a["stats"]["_funnel/junk_frames"] >= 2  # its records and its goodbye, at least
    assert a["stats"]["_funnel/records"] == 2 and a["stats"]["_funnel/ranks"] == 1
    # Job B never saw it: it was pointed elsewhere.
    assert b["stats"]["_funnel/ranks"] == 1  # b_worker (B's owner logs nothing itself)
    assert b["stats"]["_funnel/records"] == 5
    assert b["stats"]["_funnel/junk_frames"] == 0 and b["stats"]["_funnel/rejected_peers"] == 0

    run_a, run_b = only_run(job_a.wandb_dir), only_run(scripts.wandb_dir)
    assert (run_a.run_id, run_b.run_id) == ("job-a", "job-b")
    keys_a = {k for row in run_a.history for k in row if not k.startswith("_")}
    keys_b = {k for row in run_b.history for k in row if not k.startswith("_")}
    assert keys_a == {"a_before", "a_after"}
    assert keys_b == {"b_ok"}
    assert [v for _, v in run_b.column("b_ok")] == list(range(5))

    if IS_ROOT:
        helper = b["helper"]
        assert helper["rc"] == 0, helper["stderr"]
        result = helper["result"]
        assert result["uid"] == NOBODY
        assert result["stat_socket"] == "EACCES" and result["raw_connect"] == "EACCES"
        assert result["zmq_answered"] is False
        # The public API of that user: it warns that the logger did not answer, and returns.
        assert result["api"] == "returned"
        assert any("did not answer" in w for w in result["api_warnings"])
