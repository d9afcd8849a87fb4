"""Starting and stopping the logger process, from the owner.

Start: the logger's modules (``LOGGER_BOOTSTRAP``: ``wandb_funnel._logger.__main__``) in a
session of its own (Ctrl-C and a launcher's ``killpg`` reach the owner, which then closes
the logger in order), the start message on its stdin, and a pipe the logger writes one JSON
line to once the run is open (or why it is not).

Stop: CLOSE on a socket of its own, a budget for the logger, then SIGTERM and SIGKILL. Every
wait is bounded: this module's promise is that ``close`` returns by its deadline.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Any

from wandb_funnel._constants import ENV_INSTALL, ENV_WARM
from wandb_funnel._outcomes import CloseOutcome
from wandb_funnel._protocol.codec import decode, encode_close
from wandb_funnel._protocol.messages import Close, Done, LoggerStart
from wandb_funnel._protocol.sockets import CLOSER_PREFIX, ClientSocket, client_curve
from wandb_funnel.errors import LoggerStartError

_KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL for a logger that failed to start
# The logger's own start_timeout runs from when it has started (Python, its imports): the
# owner waits that much longer, so a server that does not answer is reported by the logger,
# by URL and error, rather than as a logger that did not answer.
_START_GRACE = 10.0
# close(): the logger gets LOGGER_SHARE of what is left (half of that for stragglers, then
# writing rows and finishing wandb); the owner stops waiting KILL_MARGIN seconds before the
# deadline, then terminates and kills within that margin: everything ends by the deadline.
_LOGGER_SHARE = 0.8
_KILL_MARGIN = 0.5

# ``python -m wandb_funnel._logger`` would run the package's ``__init__`` first: the public
# API, and with it the worker stack (exit hooks, fork hooks, signal watching) that a logger
# never uses. The package is registered from its spec instead, unexecuted, so the logger
# loads only its own modules and what they import (tests/test_exports.py holds this).
LOGGER_BOOTSTRAP = (
    "import importlib.util, sys\n"
    "spec = importlib.util.find_spec('wandb_funnel')\n"
    "sys.modules['wandb_funnel'] = importlib.util.module_from_spec(spec)\n"
    "import wandb_funnel._logger.__main__\n"
)


def logger_env() -> dict[str, str]:
    """The environment a logger gets: this process's, not installed (it calls the real
    wandb)."""
    return {k: v for k, v in os.environ.items() if k not in (ENV_INSTALL, ENV_WARM)}


class LoggerProcess:
    """The one logger process of a funnel, seen from the owner."""

    def __init__(self, start: LoggerStart, proc: subprocess.Popen[bytes]) -> None:
        self.start_message = start
        self._proc = proc

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    @staticmethod
    def popen(ready_fd: int, warm: bool = False) -> subprocess.Popen[bytes]:
        """The logger process, waiting for its start message on stdin (one JSON line);
        ``warm``: it imports wandb first (started ahead of time: ``_owner/prewarm.py``)."""
        env = logger_env()
        if warm:
            env[ENV_WARM] = "1"
        return subprocess.Popen(
            [sys.executable, "-c", LOGGER_BOOTSTRAP],
            stdin=subprocess.PIPE,
            pass_fds=(ready_fd,),
            start_new_session=True,
            close_fds=True,
            env=env,
        )

    @classmethod
    def spawn(
        cls,
        start: LoggerStart,
        ready_r: int,
        timeout: float,
        grace: float = _START_GRACE,
        proc: subprocess.Popen[bytes] | None = None,
    ) -> tuple[LoggerProcess, dict[str, Any]]:
        """Start the logger (or give ``proc``, one started ahead of time, its start message)
        and wait (bounded) until it has opened the run.

        ``start.ready_fd`` is the write end of a pipe whose read end is ``ready_r``; both are
        closed here. Returns the logger and its ready line (``{"tcp": endpoint or None}``).

        Raises:
            LoggerStartError: the logger exited, failed to open the run, or did not answer
                within ``timeout`` seconds. It is killed first.
        """
        try:
            if proc is None:
                proc = cls.popen(start.ready_fd)
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(start.ready_fd)
        logger = cls(start, proc)
        try:
            assert proc.stdin is not None
            proc.stdin.write(start.to_json() + b"\n")
            proc.stdin.close()
            ready = logger._wait_ready(ready_r, timeout, grace)
        except BaseException:
            logger.kill()
            raise
        finally:
            os.close(ready_r)
        if "error" in ready:
            logger.kill()
            raise LoggerStartError(
                f"wandb_funnel: the logger could not open the run: {ready['error']}"
            )
        return logger, ready

    def _wait_ready(self, fd: int, timeout: float, grace: float = _START_GRACE) -> dict[str, Any]:
        deadline = time.monotonic() + timeout + grace
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise LoggerStartError(
                    f"wandb_funnel: the logger did not open the run within start_timeout={timeout}s"
                )
            readable, _, _ = select.select([fd], [], [], min(left, 0.5))
            if readable:
                chunk = os.read(fd, 65536)
                if not chunk:
                    code = self._proc.wait(timeout=5)
                    raise LoggerStartError(
                        f"wandb_funnel: the logger exited (code {code}) before opening the run"
                    )
                data += chunk
        return dict(json.loads(data))

    def close(
        self, exit_code: int, deadline: float, footer: bool = True
    ) -> tuple[CloseOutcome, dict[str, Any] | None]:
        """Ask the logger to finish the run with ``exit_code``, and make sure it is gone by
        ``deadline`` (a ``time.monotonic()``). ``footer``: wandb's end-of-run footer is
        printed (the program called finish()).

        Returns ``(outcome, stats)``: ``CLOSED`` (stats are the logger's final accounting, or
        None if its reply was lost), ``ALREADY_EXITED`` or ``KILLED``.
        """
        proc = self._proc
        if proc.poll() is not None:
            return CloseOutcome.ALREADY_EXITED, None
        start = self.start_message
        # CLOSE goes on a socket of its own that never says hello: it is not a rank.
        closer = ClientSocket(
            start.address,
            CLOSER_PREFIX + os.urandom(11),
            10,
            client_curve(start.curve) if start.curve else None,
        )
        try:
            budget = max(0.0, (deadline - time.monotonic()) * _LOGGER_SHARE)
            closer.send_within(encode_close(Close(start.token, exit_code, budget, footer)), 1.0)
            try:
                proc.wait(timeout=max(0.0, deadline - _KILL_MARGIN - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(grace=_KILL_MARGIN / 2)
                return CloseOutcome.KILLED, None
            reply = closer.recv_within(0.2)
            done = decode(reply, 1 << 20) if reply is not None else None
            return CloseOutcome.CLOSED, done.stats if isinstance(done, Done) else None
        finally:
            closer.close(0)

    def kill(self, grace: float = _KILL_GRACE) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns once the process is reaped."""
        proc = self._proc
        if proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_KILL_GRACE)  # SIGKILL cannot be refused: this is prompt
