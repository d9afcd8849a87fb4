"""The node logger, seen from the rank that starts it (issue 38): the node's first rank.

``NodeLogger.start`` makes the node's private IPC endpoint, starts the node logger in a
session of its own (a launcher's ``killpg`` reaches the ranks, which then finish through it),
and waits, bounded, for its ready line. A thread of the rank keeps it running: a node logger
that dies before it has left on its own (a kill, an OOM) is started again on the same
endpoint, at most ``max_restarts`` times in ``LOGGER_RESTART_WINDOW``, and its successor asks
the node's ranks to resend what the root has not saved (``relay.py``). The rank never waits
for it at exit: it leaves by itself once the node's processes are done.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque

from wandb_funnel import _private_dir
from wandb_funnel._constants import LOGGER_RESTART_WINDOW
from wandb_funnel._protocol.messages import NodeStart
from wandb_funnel._protocol.sockets import private_ipc_endpoint, remove_ipc_dir
from wandb_funnel.errors import LoggerStartError

# As LOGGER_BOOTSTRAP: the package registered from its spec, unexecuted, so that the node
# logger loads its own modules and the protocol's only.
NODE_BOOTSTRAP = (
    "import importlib.util, sys\n"
    "spec = importlib.util.find_spec('wandb_funnel')\n"
    "sys.modules['wandb_funnel'] = importlib.util.module_from_spec(spec)\n"
    "import wandb_funnel._node.__main__\n"
)
_READY_TIMEOUT = 30.0  # seconds for a node logger to bind its sockets (Python, zmq's import)


def _say(message: str) -> None:
    try:
        print(f"wandb-funnel: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _exit_text(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class NodeLogger:
    """This node's logger process, kept running by a thread of the rank that started it."""

    def __init__(self, start: NodeStart, max_restarts: int) -> None:
        self.start_message = start
        self._max = max_restarts
        self._restarts: deque[float] = deque()
        self.proc = self._spawn(start)

    @classmethod
    def start(
        cls,
        *,
        upstream: str,
        curve: dict[str, str] | None,
        token: str,
        node: int,
        max_frame: int,
        max_restarts: int,
    ) -> NodeLogger:
        endpoint, ipc_dir = private_ipc_endpoint(_private_dir.NODE_SOCKET)
        start = NodeStart(endpoint, ipc_dir, upstream, curve, token, node, os.getpid(), max_frame)
        try:
            logger = cls(start, max_restarts)
        except BaseException:
            remove_ipc_dir(ipc_dir)
            raise
        threading.Thread(target=logger._watch, name="wandb-funnel-node-logger", daemon=True).start()
        return logger

    @property
    def endpoint(self) -> str:
        return self.start_message.endpoint

    @property
    def pid(self) -> int:
        return self.proc.pid

    @staticmethod
    def _spawn(start: NodeStart) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", NODE_BOOTSTRAP],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(start.to_json())
            proc.stdin.close()
            ready = _read_line(proc, _READY_TIMEOUT)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        proc.stdout.close()  # its one line is read
        if "ready" not in ready:
            proc.kill()
            proc.wait()
            why = ready.get("error", "no ready line")
            raise LoggerStartError(
                f"wandb_funnel: the node logger of node {start.node} did not start: {why}"
            )
        return proc

    def _watch(self) -> None:
        """Start a new node logger whenever this one dies before leaving on its own."""
        while True:
            code = self.proc.wait()
            if code == 0:
                return  # it left: the node is done
            start = self.start_message
            now = time.monotonic()
            while self._restarts and now - self._restarts[0] > LOGGER_RESTART_WINDOW:
                self._restarts.popleft()
            if len(self._restarts) >= self._max:
                _say(
                    f"the node logger of node {start.node} (pid {self.proc.pid}) "
                    f"{_exit_text(code)}; not restarted ({self._max} restarts in "
                    f"{LOGGER_RESTART_WINDOW:.0f} s): this node's ranks can no longer log"
                )
                remove_ipc_dir(start.ipc_dir)
                return
            self._restarts.append(now)
            dead = self.proc.pid
            self.start_message = start = start._replace(generation=start.generation + 1)
            try:
                self.proc = self._spawn(start)
            except (OSError, LoggerStartError) as exc:
                _say(f"the node logger of node {start.node} could not be restarted: {exc}")
                remove_ipc_dir(start.ipc_dir)
                return
            _say(
                f"the node logger of node {start.node} (pid {dead}) {_exit_text(code)}; a new "
                f"one (pid {self.proc.pid}) took over: this node's ranks resend what was not "
                f"saved"
            )


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, object]:
    """The node logger's first line on stdout, within ``timeout`` seconds."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return {"error": f"no answer within {timeout:.0f} s"}
        chunk = os.read(fd, 4096)
        if not chunk:
            return {"error": f"it exited with code {proc.wait()}"}
        data += chunk
    try:
        line = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return {"error": f"unreadable ready line {data[:200]!r}"}
    return line if isinstance(line, dict) else {"error": "unreadable ready line"}
