"""``wf.Funnel``: the owner side. Starts wandb-core and the logger, exports the address, and
closes everything in bounded time on every exit path."""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import threading
import time
import warnings
from types import TracebackType
from typing import TYPE_CHECKING, Any

from wandb_funnel._constants import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_MAX_PENDING_ROWS,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_REORDER_WINDOW,
    DEFAULT_START_TIMEOUT,
    DEFAULT_STEP_KEY,
    EXPORTED_ENV,
)
from wandb_funnel._logger.reduce import check_reduce, check_run_mode
from wandb_funnel._protocol.sockets import (
    client_curve,
    new_curve_keys,
    private_ipc_endpoint,
    remove_ipc_dir,
)
from wandb_funnel._worker import lifecycle, stream
from wandb_funnel._worker.run import AttachInfo, Run
from wandb_funnel.errors import FunnelWarning, LoggerStartError

if TYPE_CHECKING:
    import subprocess

_KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL for a logger that failed to start
# close(): the logger gets LOGGER_SHARE of close_timeout (half of that for stragglers, then
# writing rows and finishing wandb); the owner stops waiting KILL_MARGIN seconds before the
# deadline, then terminates and kills within that margin: everything ends within close_timeout.
_LOGGER_SHARE = 0.8
_KILL_MARGIN = 0.5
_TEARDOWN_TIMEOUT = 2.0  # seconds an exiting owner waits for wandb-core to shut down


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"wandb_funnel: {name} must be a positive number, got {value!r}")
    return float(value)


def _portable_init_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """wandb.init kwargs as plain JSON data for the logger process (no pickle anywhere)."""
    from wandb_funnel._wandb import settings_to_dict

    out = dict(kwargs)
    if "settings" in out:
        out["settings"] = settings_to_dict(out["settings"])
    argparse = sys.modules.get("argparse")  # not imported here: a config cannot be one then
    if argparse is not None and isinstance(out.get("config"), argparse.Namespace):
        out["config"] = vars(out["config"])
    for key, value in out.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"wandb_funnel: wandb.init argument {key}= must be plain data (dict, list, str, "
                f"number, bool, None) to reach the logger process: {exc}"
            ) from exc
    return out


class Funnel:
    """The owner of one wandb run that every process of the job logs into.

    Args:
        run_mode: ``"auto"`` (keys from one rank appear as they are; keys from several are
            reduced) or ``"shared"`` (every rank's value as ``{key}/rank{rank}``).
        reduce: reducer per key (``"mean"``, ``"sum"``, ``"min"``, ``"max"``, ``"first"``); a
            dict of key or glob to reducer, or one reducer name for every key.
        step_key: the x-axis key every row carries (declared with ``define_metric``).
        close_timeout: seconds that ``close()`` may take in all, whatever wandb does.
        start_timeout: seconds to wait for the logger to open the run.
        reorder_window: seconds a row may wait for a straggling rank.
        max_record_bytes: largest encoded record ``log()`` accepts.
        **wandb_init_kwargs: passed to ``wandb.init`` in the logger (``mode`` defaults to
            ``"offline"`` unless ``WANDB_MODE`` is set).
    """

    def __init__(
        self,
        *,
        run_mode: str = "auto",
        reduce: Any = None,
        step_key: str = DEFAULT_STEP_KEY,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        reorder_window: float = DEFAULT_REORDER_WINDOW,
        max_pending_rows: int = DEFAULT_MAX_PENDING_ROWS,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        **wandb_init_kwargs: Any,
    ) -> None:
        self._run_mode = check_run_mode(run_mode)
        self._reduce = check_reduce(reduce)
        if not isinstance(step_key, str) or not step_key:
            raise ValueError(f"wandb_funnel: step_key must be a non-empty str, got {step_key!r}")
        self._step_key = step_key
        self._close_timeout = _check_positive("close_timeout", close_timeout)
        self._start_timeout = _check_positive("start_timeout", start_timeout)
        if (
            isinstance(reorder_window, bool)
            or not isinstance(reorder_window, (int, float))
            or reorder_window < 0
        ):
            raise ValueError(f"wandb_funnel: reorder_window must be >= 0, got {reorder_window!r}")
        self._reorder_window = float(reorder_window)
        if type(max_pending_rows) is not int or max_pending_rows < 1:
            raise ValueError(
                f"wandb_funnel: max_pending_rows must be an int >= 1, got {max_pending_rows!r}"
            )
        self._max_pending_rows = max_pending_rows
        if type(max_record_bytes) is not int or max_record_bytes < 1:
            raise ValueError(
                f"wandb_funnel: max_record_bytes must be an int >= 1, got {max_record_bytes!r}"
            )
        self._max_record_bytes = max_record_bytes
        if "id" in wandb_init_kwargs and not isinstance(wandb_init_kwargs["id"], str):
            raise TypeError(f"wandb_funnel: id must be a str, got {wandb_init_kwargs['id']!r}")
        if wandb_init_kwargs.get("id") is None:
            from wandb_funnel._wandb import generate_run_id

            wandb_init_kwargs["id"] = generate_run_id()
        self._init_kwargs = _portable_init_kwargs(wandb_init_kwargs)
        self._run_id: str = self._init_kwargs["id"]
        self._proc: subprocess.Popen[bytes] | None = None
        self._address: str | None = None
        self._ipc_dir: str | None = None
        self._token = os.urandom(16).hex()  # what secrets.token_hex does, without hashlib
        self._run: Run | None = None
        self._saved_env: dict[str, str | None] = {}
        self._closed = False
        self._owns_service = False  # this process started wandb-core (see _close_on_exit)
        # Set by the DDP path (_ddp.py) before start(); the defaults are a plain funnel.
        self._owner_rank = 0
        self._first_auto_rank = 1
        self._per_rank: dict[str, Any] | None = None  # run_mode="new": id/group templates
        self._expected_ranks: list[int] = []  # a launched job's ranks, known up front
        self._tcp_host: str | None = None  # also listen on TCP here (ranks on other nodes)
        self._curve: dict[str, str] | None = None
        self._tcp_address: str | None = None
        self._close_lock = threading.RLock()  # close() may re-enter from a signal handler
        self.owner_pid = os.getpid()
        self.stats: dict[str, Any] | None = None
        self.exit_code: int | None = None

    # -- properties ------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def logger_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def address(self) -> str:
        if self._address is None:
            raise RuntimeError("wandb_funnel: the funnel is not started")
        return self._address

    @property
    def run(self) -> Run:
        """The owner's own rank-0 run."""
        if self._run is None:
            raise RuntimeError("wandb_funnel: the funnel is not started")
        return self._run

    # -- start -----------------------------------------------------------------------------
    def start(self) -> Funnel:
        """Start wandb-core and the logger, wait until the run is open, export the address.

        Raises:
            LoggerStartError: the logger did not open its run within ``start_timeout``.
        """
        if self._proc is not None:
            raise RuntimeError("wandb_funnel: Funnel.start() called twice")
        from wandb_funnel._wandb import setup_service

        # Before any process is spawned, so all of them share one wandb-core.
        self._owns_service = setup_service()
        if self._tcp_host is not None:
            self._curve = new_curve_keys()
        self._address, self._ipc_dir = private_ipc_endpoint()
        ready_r, ready_w = os.pipe()
        cfg = {
            "address": self._address,
            "ipc_dir": self._ipc_dir,
            "token": self._token,
            "owner_pid": os.getpid(),
            "ready_fd": ready_w,
            "run_mode": self._run_mode,
            "reduce": self._reduce,
            "step_key": self._step_key,
            "close_timeout": self._close_timeout,
            "reorder_window": self._reorder_window,
            "max_pending_rows": self._max_pending_rows,
            "max_record_bytes": self._max_record_bytes,
            "init_kwargs": self._init_kwargs,
            "first_auto_rank": self._first_auto_rank,
            "per_rank": self._per_rank,
            "expected_ranks": self._expected_ranks,
            "tcp_host": self._tcp_host,
            "curve": self._curve,
        }
        import subprocess  # the owner's alone: a worker's import of this module skips it

        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "wandb_funnel._logger"],
                stdin=subprocess.PIPE,
                pass_fds=(ready_w,),
                start_new_session=True,  # Ctrl-C and killpg reach the owner, which closes us
                close_fds=True,
            )
        finally:
            os.close(ready_w)
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(cfg).encode())
            self._proc.stdin.close()
            ready = self._wait_ready(ready_r)
        except BaseException:
            self._kill_logger()
            remove_ipc_dir(self._ipc_dir)
            raise
        finally:
            os.close(ready_r)
        if "error" in ready:
            self._kill_logger()
            remove_ipc_dir(self._ipc_dir)
            raise LoggerStartError(
                f"wandb_funnel: the logger could not open the run: {ready['error']}"
            )
        self._tcp_address = ready.get("tcp")
        self._export_env()
        self._run = Run(self.attach_info(), requested_rank=self._owner_rank, funnel=self)
        lifecycle.add_shutdown_callback(self._close_on_exit, priority=10)
        from wandb_funnel import _api

        _api.adopt_owner_run(self._run)
        return self

    def _wait_ready(self, fd: int) -> dict[str, Any]:
        deadline = time.monotonic() + self._start_timeout
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise LoggerStartError(
                    f"wandb_funnel: the logger did not open the run within "
                    f"start_timeout={self._start_timeout}s"
                )
            readable, _, _ = select.select([fd], [], [], min(left, 0.5))
            if readable:
                chunk = os.read(fd, 65536)
                if not chunk:
                    code = self._proc.wait(timeout=5) if self._proc else None
                    raise LoggerStartError(
                        f"wandb_funnel: the logger exited (code {code}) before opening the run"
                    )
                data += chunk
        return dict(json.loads(data))

    def attach_info(self, address: str | None = None) -> AttachInfo:
        """How a process reaches this funnel (``address`` defaults to the IPC endpoint)."""
        return AttachInfo(
            address or self.address,
            self._token,
            self._run_id,
            self._max_record_bytes,
            self.logger_pid,
            socket.gethostname(),
            client_curve(self._curve) if self._curve else None,
        )

    @property
    def tcp_address(self) -> str | None:
        """The TCP endpoint for ranks on other nodes (None unless listening on TCP)."""
        return self._tcp_address

    def _export_env(self) -> None:
        values = self.attach_info().to_env()
        self._saved_env = {name: os.environ.get(name) for name in EXPORTED_ENV}
        os.environ.update(values)

    def _restore_env(self) -> None:
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env = {}

    # -- logging as rank 0 -------------------------------------------------------------------
    def log(
        self, data: dict[str, Any], step: int | None = None, commit: bool | None = None
    ) -> None:
        """Log from the owner process, as rank 0 (see ``Run.log``)."""
        self.run.log(data, step=step, commit=commit)

    # -- close ---------------------------------------------------------------------------------
    def close(self, exit_code: int | None = None) -> None:
        """Drain, order, finish the run, join the logger: all within ``close_timeout``.

        Idempotent. Past the deadline the logger is killed and a warning says what was lost.
        SIGINT/SIGTERM arriving meanwhile are held and re-delivered once the run is closed.
        """
        if os.getpid() != self.owner_pid:
            return  # a forked copy of the owner: the funnel is not ours to close
        # Held from before the closed flag is set: a handler that runs before the hold closes
        # the funnel itself (this call then finds it closed); one that lands after waits for
        # the close, never cuts it short.
        with lifecycle.signals_held():
            with self._close_lock:
                if self._closed or self._proc is None:
                    return
                self._closed = True
            code = 0 if exit_code is None else int(exit_code)
            self.exit_code = code
            lifecycle.remove_shutdown_callback(self._close_on_exit)
            deadline = time.monotonic() + self._close_timeout
            try:
                self._close_logger(code, deadline)
            finally:
                stream.close_all("owner closed", max(0.1, deadline - time.monotonic()), code)
                self._restore_env()
                remove_ipc_dir(self._ipc_dir)
                from wandb_funnel import _api

                _api.forget_run(self._run)

    def _close_logger(self, code: int, deadline: float) -> None:
        import subprocess  # already loaded: the logger was started with it

        from wandb_funnel._protocol.codec import decode, encode_close
        from wandb_funnel._protocol.messages import Close, Done
        from wandb_funnel._protocol.sockets import ClientSocket

        proc = self._proc
        assert proc is not None and self._run is not None
        if proc.poll() is not None:
            warnings.warn(
                f"wandb-funnel: the logger (pid {proc.pid}) had already exited with code "
                f"{proc.returncode}; the run may be missing its last rows and exit record",
                FunnelWarning,
                stacklevel=4,
            )
            return
        # Our own streams (rank 0 and any later init() here) say goodbye first.
        for own in stream.open_streams():
            own.close("owner closed", max(0.0, min(2.0, deadline - time.monotonic())), code)
        # CLOSE goes on a socket of its own that never says hello: it is not a rank.
        closer = ClientSocket(
            self.address,
            b"\x02" + os.urandom(11),
            10,
            client_curve(self._curve) if self._curve else None,
        )
        try:
            budget = max(0.0, (deadline - time.monotonic()) * _LOGGER_SHARE)
            closer.send_within(encode_close(Close(self._token, code, budget)), 1.0)
            try:
                proc.wait(timeout=max(0.0, deadline - _KILL_MARGIN - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill_logger(grace=_KILL_MARGIN / 2)
                warnings.warn(
                    f"wandb-funnel: the logger (pid {proc.pid}) did not finish the run within "
                    f"close_timeout={self._close_timeout}s and was killed; rows still buffered "
                    f"and the run's exit record may be missing",
                    FunnelWarning,
                    stacklevel=4,
                )
                return
            reply = closer.recv_within(0.2)
            done = decode(reply, 1 << 20) if reply is not None else None
            if isinstance(done, Done):
                self.stats = done.stats
        finally:
            closer.close(0)

    def _kill_logger(self, grace: float = _KILL_GRACE) -> None:
        import subprocess  # already loaded: the logger was started with it

        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_KILL_GRACE)  # SIGKILL cannot be refused: this is prompt

    def _close_on_exit(self, exit_code: int, reason: str) -> None:
        self.close(exit_code)
        # Never in a forked copy of the owner: its inherited wandb state would tear down the
        # owner's wandb-core, and with it the logger's run.
        if self._owns_service and os.getpid() == self.owner_pid:
            from wandb_funnel._wandb import teardown_service

            teardown_service(_TEARDOWN_TIMEOUT, exit_code)

    def __enter__(self) -> Funnel:
        return self.start() if self._proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(lifecycle.exit_code_from_exception(exc))

    def __repr__(self) -> str:
        return f"<wandb_funnel.Funnel run_id={self._run_id!r} address={self._address!r}>"
