"""Another local user's process, aimed at the funnel named by WANDB_FUNNEL_* in its
environment (run by tests/programs/security.py, as root). It imports everything it needs,
then drops to ``--uid`` for good (real, effective and saved uid and gid) before it touches the
funnel, and prints one JSON line saying what happened to each attempt.

    python security_helper.py --uid 65534 [--api]
"""

from __future__ import annotations

# Everything this helper runs, imported while it can still read it (as root). The modules
# marked F401 are only used through the package: imported lazily there, or there already.
import argparse
import errno
import json
import multiprocessing.util  # noqa: F401
import os
import socket
import time
import warnings
from collections.abc import Callable
from typing import Any

import zmq

import wandb_funnel as wf
from wandb_funnel import _api  # noqa: F401
from wandb_funnel._protocol import codec, sockets  # noqa: F401
from wandb_funnel._protocol.messages import Hello
from wandb_funnel._worker import lifecycle, run, stream  # noqa: F401


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--uid", type=int, required=True, help="the user (and group) to become")
    parser.add_argument("--api", action="store_true", help="also log through the public API")
    args = parser.parse_args()

    os.setgroups([])
    os.setgid(args.uid)
    os.setuid(args.uid)
    out: dict[str, Any] = {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "egid": os.getegid(),
    }
    address = os.environ["_WANDB_FUNNEL_ADDRESS"]
    path = address[len("ipc://") :]

    def attempt(name: str, fn: Callable[[], object]) -> None:
        try:
            fn()
            out[name] = "ok"
        except OSError as exc:
            out[name] = errno.errorcode.get(exc.errno or 0, str(exc.errno))

    def raw_connect() -> None:
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
    token = os.environ["_WANDB_FUNNEL_TOKEN"]
    for frame in (
        codec.encode_hello(Hello(token, os.getpid(), socket.gethostname(), None, None)),
        codec.encode_batch(0, [codec.encode_record(0, True, {"intruder": 1}, 1 << 20)]),
    ):
        try:  # never blocking: a DEALER with no pipe to queue on would wait forever
            d.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            break
    out["zmq_answered"] = bool(d.poll(3000, zmq.POLLIN))
    d.close()
    ctx.term()

    if args.api:  # the public API, as a worker of that user would use it
        t0 = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                for i in range(3):
                    wf.log({"intruder_api": i}, step=i)
                wf.finish()
                out["api"] = "returned"
            except Exception as exc:
                out["api"] = repr(exc)
        out["api_warnings"] = [str(w.message) for w in caught]
        out["api_seconds"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
