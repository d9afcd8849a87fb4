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
the helper below starts as root, imports everything it needs, then drops to nobody for good
(real, effective and saved uid and gid) before it touches the funnel.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time

import pytest

from tests.conftest import PRELUDE, Scripts, leftover_processes, reports, wait_for_report
from tests.wandb_reader import only_run

pytestmark = pytest.mark.processes

NOBODY = 65534
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not IS_ROOT, reason="running a process as another user (nobody) needs root"
)

# Another local user's process, aimed at the funnel named by WANDB_FUNNEL_* in its
# environment. Prints one JSON line saying what happened to each attempt.
HELPER = f"""
import errno, json, os, socket, sys, time, warnings
import multiprocessing.util  # imported lazily by the package: import it while we can read it
import zmq
import wandb_funnel as wf
from wandb_funnel import _api
from wandb_funnel._worker import stream
from wandb_funnel._protocol import codec
from wandb_funnel._worker import lifecycle
from wandb_funnel._worker import run
from wandb_funnel._protocol import sockets
from wandb_funnel._protocol.messages import Hello

os.setgroups([])
os.setgid({NOBODY})
os.setuid({NOBODY})
out = {{"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "egid": os.getegid()}}
address = os.environ["WANDB_FUNNEL_ADDRESS"]
path = address[len("ipc://"):]

def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))

def raw_connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    finally:
        s.close()

attempt("stat_socket", lambda: os.stat(path))
attempt("list_dir", lambda: os.listdir(os.path.dirname(path)))
attempt("stat_parent", lambda: os.stat(os.path.dirname(os.path.dirname(path))))
attempt("raw_connect", raw_connect)

# ZeroMQ connects in the background (and retries): connect() and send() succeed locally.
# What matters is whether anything comes back: a valid hello with the job's token would be
# answered by a WELCOME at once.
ctx = zmq.Context()
d = ctx.socket(zmq.DEALER)
d.setsockopt(zmq.LINGER, 0)
d.connect(address)
token = os.environ["WANDB_FUNNEL_TOKEN"]
d.send(codec.encode_hello(Hello(token, os.getpid(), socket.gethostname(), None, None)))
d.send(codec.encode_batch(0, [codec.encode_record(0, True, {{"intruder": 1}}, 1 << 20)]))
out["zmq_answered"] = bool(d.poll(3000, zmq.POLLIN))
d.close()
ctx.term()

if "--api" in sys.argv:  # the public API, as a worker of that user would use it
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for i in range(3):
                wf.log({{"intruder_api": i}}, step=i)
            wf.finish()
            out["api"] = "returned"
        except Exception as exc:
            out["api"] = repr(exc)
    out["api_warnings"] = [str(w.message) for w in caught]
    out["api_seconds"] = time.monotonic() - t0
print(json.dumps(out), flush=True)
"""

# The IPC directory goes where TMPDIR says, and the tests' TMPDIR is under pytest's own
# /tmp/pytest-of-<user> (0700), which alone would keep other users out. So the funnel makes
# its directory in /tmp (world-searchable, like any default TMPDIR): then only the funnel's
# own 0700 directory stands in the way. wandb is set up first, so that nothing else lands in
# /tmp; the funnel removes its directory when it closes.
START_IN_TMP = """
import tempfile, subprocess
from wandb_funnel._wandb import setup_service

def start_in_tmp(funnel):
    setup_service()
    tempfile.tempdir = "/tmp"
    try:
        funnel.start()
    finally:
        tempfile.tempdir = None
    return funnel

def run_helper(env_overrides, *args):
    env = dict(os.environ, **env_overrides)
    proc = subprocess.run([sys.executable, os.environ["HELPER"], *args], env=env, cwd="/",
                          capture_output=True, text=True, timeout=90)
    lines = proc.stdout.strip().splitlines()
    return {"rc": proc.returncode, "result": json.loads(lines[-1]) if lines else None,
            "stderr": proc.stderr[-3000:]}
"""


def _helper(scripts: Scripts) -> dict[str, str]:
    return {"HELPER": str(scripts.write(HELPER))}


IPC = (
    PRELUDE
    + START_IN_TMP
    + """
if __name__ == "__main__":
    funnel = start_in_tmp(wf.Funnel(project="t"))
    with funnel:
        sock = funnel.address[len("ipc://"):]
        st = os.stat(os.path.dirname(sock))
        funnel.log({"before": 1}, step=0)
        helper = run_helper({})
        funnel.log({"after": 1}, step=1)
        report(dir_mode=st.st_mode & 0o7777, dir_uid=st.st_uid, dir_gid=st.st_gid,
               uid=os.getuid(), gid=os.getgid(), sock=sock, helper=helper)
    report(stats=funnel.stats, dir_gone=not os.path.exists(os.path.dirname(sock)))
"""
)


@needs_root
@pytest.mark.timeout(120)
def test_another_user_cannot_reach_the_ipc_socket(scripts: Scripts) -> None:
    """The socket directory is 0700 and owned by the job's user. A process running as nobody,
    holding the funnel's address and token, cannot stat the socket, list the directory or
    connect (EACCES), though it can search the directory's parent; through ZeroMQ its
    hello and records go nowhere (no answer). The run has the owner's records only, and no
    frame of it was even seen by the logger (no junk, no refused peer)."""
    res = scripts.run(IPC, extra_env=_helper(scripts))
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
    assert stats["funnel/records"] == 2
    assert stats["funnel/ranks"] == 1
    assert stats["funnel/junk_frames"] == 0 and stats["funnel/rejected_peers"] == 0
    run = only_run(scripts.wandb_dir)
    assert run.column("before") == [(0, 1)] and run.column("after") == [(1, 1)]
    assert not any("intruder" in k for row in run.history for k in row)


TCP = (
    PRELUDE
    + """
import socket
import zmq
from wandb_funnel._protocol import codec
from wandb_funnel._constants import ENV_CURVE, ENV_TOKEN
from wandb_funnel._protocol.messages import Hello
from wandb_funnel._options import Topology
from wandb_funnel._protocol.sockets import new_curve_keys

def worker(address):
    # A rank on "another node": the funnel's TCP address and the job's keys (exported).
    os.environ["WANDB_FUNNEL_ADDRESS"] = address
    run = wf.init()
    for i in range(5):
        run.log({"tcp_worker": i}, step=i)
    run.finish()

if __name__ == "__main__":
    # What a launched job does when its run spans nodes (_launched_init): listen on TCP as
    # well, with CURVE. No torchrun needed to get the real listener, keys and ZAP allow-list.
    funnel = wf.Funnel(project="t", topology=Topology(tcp_host="127.0.0.1"))
    with funnel:
        tcp = funnel.tcp_address
        funnel.log({"before": 1}, step=0)
        keys = json.loads(os.environ[ENV_CURVE])
        token = os.environ[ENV_TOKEN]
        other_job = new_curve_keys()
        own_public, own_secret = zmq.curve_keypair()
        clients = {
            "no_curve": None,
            # a valid key pair and the right server key, but not the job's client key
            "own_key_pair": (keys["server_public"], own_public.decode(), own_secret.decode()),
            # another job's keys: its server key, its client key pair
            "another_jobs_keys": (other_job["server_public"], other_job["client_public"],
                                  other_job["client_secret"]),
        }
        ctx = zmq.Context()
        answered = {}
        attempts = 0
        for round_ in range(2):
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
                s.send(codec.encode_hello(hello))  # even with the job's token
                rec = codec.encode_record(0, True, {f"intruder_{name}": 1}, 1 << 20)
                s.send(codec.encode_batch(0, [rec]))
                answered[name] = answered.get(name, False) or bool(s.poll(700, zmq.POLLIN))
                s.close()
                attempts += 1
        ctx.term()
        p = mp.get_context("spawn").Process(target=worker, args=(tcp,))
        p.start()
        p.join(60)
        report(tcp=tcp, answered=answered, attempts=attempts, code=p.exitcode)
    report(stats=funnel.stats)
"""
)


@pytest.mark.timeout(120)
def test_tcp_clients_without_the_jobs_keys_are_refused_and_counted(scripts: Scripts) -> None:
    """Over TCP: clients with no CURVE keys, with a key pair of their own (right server key),
    and with another job's keys, each sending a hello with the job's token and a record, get
    no answer; every connection attempt is refused at the handshake and counted exactly once
    in funnel/rejected_peers; none of their frames reach the logger (no junk); the run has
    none of their records, while a worker holding the job's keys logs over the same TCP
    endpoint and lands."""
    res = scripts.run(TCP)
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.leftovers == []
    info = reports(res.stdout)
    assert info["tcp"].startswith("tcp://127.0.0.1:")
    assert info["answered"] == {"no_curve": False, "own_key_pair": False,
                                "another_jobs_keys": False}
    assert info["code"] == 0
    stats = info["stats"]
    assert stats["funnel/rejected_peers"] == info["attempts"] == 6
    assert stats["funnel/junk_frames"] == 0
    assert stats["funnel/ranks"] == 2  # the owner and the keyed worker
    assert stats["funnel/records"] == 1 + 5
    assert "refused" in res.stderr  # the logger says so
    run = only_run(scripts.wandb_dir)
    assert [v for _, v in run.column("tcp_worker")] == list(range(5))
    assert not any("intruder" in k for row in run.history for k in row)


JOB_A = (
    PRELUDE
    + START_IN_TMP
    + """
from wandb_funnel._constants import ENV_TOKEN
if __name__ == "__main__":
    funnel = start_in_tmp(wf.Funnel(project="t", id="job-a"))
    with funnel:
        funnel.log({"a_before": 1}, step=0)
        report(address=funnel.address, token=os.environ[ENV_TOKEN], pid=funnel.logger_pid)
        deadline = time.monotonic() + 120  # until job B is done (bounded)
        while not os.path.exists(os.environ["B_DONE"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        funnel.log({"a_after": 1}, step=1)
    report(stats=funnel.stats)
"""
)

JOB_B = (
    PRELUDE
    + START_IN_TMP
    + """
def b_worker():
    run = wf.init()
    for i in range(5):
        run.log({"b_ok": i}, step=i)
    run.finish()

def misdirected():
    # A worker of job B whose environment points at job A's socket (a stale or copied
    # WANDB_FUNNEL_ADDRESS): same user, so it connects, but it holds job B's token.
    os.environ["WANDB_FUNNEL_ADDRESS"] = os.environ["JOB_A_ADDRESS"]
    for i in range(5):
        wf.log({"from_b": i}, step=i)
    wf.finish()

if __name__ == "__main__":
    funnel = start_in_tmp(wf.Funnel(project="t", id="job-b"))
    with funnel:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=b_worker), ctx.Process(target=misdirected)]
        for p in procs:
            p.start()
        helper = None
        if os.geteuid() == 0:
            # Job B's process of another user, with job A's whole environment (its token too).
            helper = run_helper({"WANDB_FUNNEL_ADDRESS": os.environ["JOB_A_ADDRESS"],
                                 "WANDB_FUNNEL_TOKEN": os.environ["JOB_A_TOKEN"],
                                 "WANDB_FUNNEL_LOGGER_PID": os.environ["JOB_A_PID"]}, "--api")
        for p in procs:
            p.join(90)
        report(address=funnel.address, codes=[p.exitcode for p in procs], helper=helper)
    report(stats=funnel.stats)
"""
)


@pytest.mark.timeout(240)
def test_another_job_cannot_reach_this_funnel(scripts: Scripts, tmp_path: pathlib.Path) -> None:
    """Two jobs on one machine, each with its own funnel. Job B's normal worker lands in B
    only. Job B's worker whose WANDB_FUNNEL_ADDRESS points at job A's socket (same user)
    reaches A's socket but not A's run: its hello carries B's token and is refused (counted
    once), its frames are junk, and log() neither raises nor hangs (it warns). A process of
    another user with job A's whole environment, token included, cannot connect (EACCES) and
    gets nothing through the public API either. Neither run holds the other's records."""
    flag = tmp_path / "b_done"
    env = {**_helper(scripts), "B_DONE": str(flag)}
    # Job A has a marker and a WANDB_DIR of its own: each job's processes are checked (and
    # its leftovers killed) on their own.
    (tmp_path / "job_a").mkdir()
    job_a = Scripts(tmp_path / "job_a")
    t0 = time.monotonic()
    proc_a = job_a.start(JOB_A, extra_env=env)
    a: dict = {}
    try:
        a = wait_for_report(proc_a, "address", timeout=90)
        res_b = scripts.run(
            JOB_B,
            timeout=150,
            extra_env={**env, "JOB_A_ADDRESS": a["address"], "JOB_A_TOKEN": a["token"],
                       "JOB_A_PID": str(a["pid"])},
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
    assert a["stats"]["funnel/rejected_peers"] == 1  # its one hello, with job B's token
    assert a["stats"]["funnel/junk_frames"] >= 2  # its records and its goodbye, at least
    assert a["stats"]["funnel/records"] == 2 and a["stats"]["funnel/ranks"] == 1
    # Job B never saw it: it was pointed elsewhere.
    assert b["stats"]["funnel/ranks"] == 1  # b_worker (B's owner logs nothing itself)
    assert b["stats"]["funnel/records"] == 5
    assert b["stats"]["funnel/junk_frames"] == 0 and b["stats"]["funnel/rejected_peers"] == 0

    run_a, run_b = only_run(job_a.wandb_dir), only_run(scripts.wandb_dir)
    assert (run_a.run_id, run_b.run_id) == ("job-a", "job-b")
    keys_a = {k for row in run_a.history for k in row if not k.startswith("_")}
    keys_b = {k for row in run_b.history for k in row if not k.startswith("_")}
    assert keys_a == {"a_before", "a_after", "global_step"}
    assert keys_b == {"b_ok", "global_step"}
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
