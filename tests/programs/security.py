"""The owner processes of tests/processes/test_security.py: who can reach a funnel.

    python security.py ipc --nobody 65534      (as root: runs security_helper.py as nobody)
    python security.py tcp
    python security.py job-a                   (until the file $B_DONE exists)
    python security.py job-b --nobody 65534    (with JOB_A_ADDRESS, JOB_A_TOKEN, JOB_A_PID)

Each prints what it saw, and the funnel's stats, as REPORT lines.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import zmq
from _prelude import Scenarios, option, report

import wandb_funnel as wf
from wandb_funnel._constants import ENV_CURVE, ENV_TOKEN
from wandb_funnel._options import Topology
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import Hello
from wandb_funnel._protocol.sockets import new_curve_keys

scenario = Scenarios(__doc__)
HELPER = pathlib.Path(__file__).with_name("security_helper.py")


# The IPC directory goes where TMPDIR says, and the tests' TMPDIR is under pytest's own
# /tmp/pytest-of-<user> (0700), which alone would keep other users out. So the funnel makes
# its directory in /tmp (world-searchable, like any default TMPDIR): then only the funnel's
# own 0700 directory stands in the way (wandb-core is the logger's, started in its own
# process: nothing of wandb's lands in /tmp); the funnel removes its directory when it closes.
def start_in_tmp(funnel: wf.Funnel) -> wf.Funnel:
    tempfile.tempdir = "/tmp"
    try:
        funnel.start()
    finally:
        tempfile.tempdir = None
    return funnel


def run_helper(uid: int, env_overrides: dict[str, str], *args: str) -> dict[str, Any]:
    """Run security_helper.py, which becomes ``uid`` before it tries anything."""
    env = dict(os.environ, **env_overrides)
    proc = subprocess.run(
        [sys.executable, str(HELPER), "--uid", str(uid), *args],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=90,
        check=False,  # its exit status is reported
    )
    lines = proc.stdout.strip().splitlines()
    return {
        "rc": proc.returncode,
        "result": json.loads(lines[-1]) if lines else None,
        "stderr": proc.stderr[-3000:],
    }


@scenario(option("--nobody", type=int, required=True, help="the other user's uid and gid"))
def ipc(args: argparse.Namespace) -> None:
    """Another local user (the helper) tries the funnel's IPC socket."""
    funnel = start_in_tmp(wf.Funnel(project="t"))
    with funnel:
        sock = funnel.address[len("ipc://") :]
        st = os.stat(os.path.dirname(sock))
        funnel.log({"before": 1}, step=0)
        helper = run_helper(args.nobody, {})
        funnel.log({"after": 1}, step=1)
        report(
            dir_mode=st.st_mode & 0o7777,
            dir_uid=st.st_uid,
            dir_gid=st.st_gid,
            uid=os.getuid(),
            gid=os.getgid(),
            sock=sock,
            helper=helper,
        )
    report(stats=funnel.stats, dir_gone=not os.path.exists(os.path.dirname(sock)))


def tcp_worker(address: str) -> None:
    # A rank on "another node": the funnel's TCP address and the job's keys (exported).
    os.environ["_WANDB_FUNNEL_ADDRESS"] = address
    run = wf.init()
    for i in range(5):
        run.log({"tcp_worker": i}, step=i)
    run.finish()


@scenario()
def tcp(args: argparse.Namespace) -> None:
    """Clients without the job's keys try its TCP endpoint; a keyed worker logs through it."""
    # What a launched job does when its run spans nodes (_launched_init): listen on TCP as
    # well, with CURVE. No torchrun needed to get the real listener, keys and ZAP allow-list.
    funnel = wf.Funnel(project="t", topology=Topology(tcp_host="127.0.0.1"))
    with funnel:
        tcp = funnel.tcp_address
        assert tcp is not None
        funnel.log({"before": 1}, step=0)
        keys = json.loads(os.environ[ENV_CURVE])
        token = os.environ[ENV_TOKEN]
        other_job = new_curve_keys()
        own_public, own_secret = zmq.curve_keypair()
        clients: dict[str, tuple[str, str, str] | None] = {
            "no_curve": None,
            # a valid key pair and the right server key, but not the job's client key
            "own_key_pair": (keys["server_public"], own_public.decode(), own_secret.decode()),
            # another job's keys: its server key, its client key pair
            "another_jobs_keys": (
                other_job["server_public"],
                other_job["client_public"],
                other_job["client_secret"],
            ),
        }
        ctx = zmq.Context()
        answered: dict[str, bool] = {}
        attempts = 0
        for _round in range(2):
            for name, curve in clients.items():
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                # One connection attempt each, so each is refused (and counted) exactly once.
                s.setsockopt(zmq.RECONNECT_IVL, -1)
                if curve:
                    s.curve_serverkey = curve[0].encode()
                    s.curve_publickey = curve[1].encode()
                    s.curve_secretkey = curve[2].encode()
                s.connect(tcp)
                hello = Hello(token, os.getpid(), socket.gethostname(), None, None)
                rec = codec.encode_record(0, True, {f"intruder_{name}": 1}, 1 << 20)
                for frame in (codec.encode_hello(hello), codec.encode_batch(0, [rec])):
                    # Never blocking: this DEALER may have no pipe to queue on (its one
                    # connection refused, no reconnect), and a blocking send then waits
                    # forever: py-spy caught this program in Socket.send here, 1 run in 3
                    # (a CI hang). A frame it cannot queue was refused anyway.
                    try:
                        s.send(frame, zmq.NOBLOCK)  # the hello even with the job's token
                    except zmq.Again:
                        break
                answered[name] = answered.get(name, False) or bool(s.poll(700, zmq.POLLIN))
                s.close()
                attempts += 1
        ctx.term()
        p = mp.get_context("spawn").Process(target=tcp_worker, args=(tcp,))
        p.start()
        p.join(60)
        report(tcp=tcp, answered=answered, attempts=attempts, code=p.exitcode)
    report(stats=funnel.stats)


@scenario()
def job_a(args: argparse.Namespace) -> None:
    """Job A: its funnel open (REPORT its address, token and logger pid) until B is done."""
    funnel = start_in_tmp(wf.Funnel(project="t", id="job-a"))
    with funnel:
        funnel.log({"a_before": 1}, step=0)
        report(address=funnel.address, token=os.environ[ENV_TOKEN], pid=funnel.logger_pid)
        deadline = time.monotonic() + 120  # until job B is done (bounded)
        while not os.path.exists(os.environ["B_DONE"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        funnel.log({"a_after": 1}, step=1)
    report(stats=funnel.stats)


def b_worker() -> None:
    run = wf.init()
    for i in range(5):
        run.log({"b_ok": i}, step=i)
    run.finish()


def misdirected() -> None:
    # A worker of job B whose environment points at job A's socket (a stale or copied
    # _WANDB_FUNNEL_ADDRESS): same user, so it connects, but it holds job B's token.
    os.environ["_WANDB_FUNNEL_ADDRESS"] = os.environ["JOB_A_ADDRESS"]
    for i in range(5):
        wf.log({"from_b": i}, step=i)
    wf.finish()


@scenario(option("--nobody", type=int, required=True, help="the other user's uid (as root)"))
def job_b(args: argparse.Namespace) -> None:
    """Job B: a worker of its own, one pointed at job A, and (as root) another user's."""
    funnel = start_in_tmp(wf.Funnel(project="t", id="job-b"))
    with funnel:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=b_worker), ctx.Process(target=misdirected)]
        for p in procs:
            p.start()
        helper = None
        if os.geteuid() == 0:
            # Job B's process of another user, with job A's whole environment (its token too).
            helper = run_helper(
                args.nobody,
                {
                    "_WANDB_FUNNEL_ADDRESS": os.environ["JOB_A_ADDRESS"],
                    "_WANDB_FUNNEL_TOKEN": os.environ["JOB_A_TOKEN"],
                    "_WANDB_FUNNEL_LOGGER_PID": os.environ["JOB_A_PID"],
                },
                "--api",
            )
        for p in procs:
            p.join(90)
        report(address=funnel.address, codes=[p.exitcode for p in procs], helper=helper)
    report(stats=funnel.stats)


if __name__ == "__main__":
    scenario.main()
