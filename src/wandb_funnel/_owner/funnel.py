"""``wf.Funnel``: the owner. Sets up wandb-core, starts the logger (``logger_process``),
exports the address to the processes started after it, and closes everything in bounded
time on every exit path."""

from __future__ import annotations

import os
import threading
import time
import warnings
from types import TracebackType
from typing import Any

from wandb_funnel import _current, _environ, _private_dir
from wandb_funnel._constants import (
    ENV_LOGGER_PID,
    EXPORTED_ENV,
)
from wandb_funnel._deadline import Deadline
from wandb_funnel._options import FunnelOptions, Topology
from wandb_funnel._outcomes import CloseOutcome
from wandb_funnel._owner import prewarm
from wandb_funnel._owner.logger_process import LoggerProcess, logger_env
from wandb_funnel._owner.run_request import prepare
from wandb_funnel._owner.supervisor import Supervisor
from wandb_funnel._protocol.messages import LoggerStart
from wandb_funnel._protocol.sockets import (
    client_curve,
    new_curve_keys,
    private_ipc_endpoint,
    remove_ipc_dir,
)
from wandb_funnel._worker import lifecycle, stream
from wandb_funnel._worker.run import AttachInfo, Run
from wandb_funnel.errors import FunnelWarning
from wandb_funnel.sinks import Backend, backend


class Funnel:
    """The owner of one wandb run that every process of the job logs into.

    Takes the funnel's options (``FunnelOptions``: ``run_mode``, ``reduce``, ``step_key``,
    ``close_timeout``, ...) and ``wandb.init``'s arguments mixed, as ``wf.init`` does (each
    option from its keyword, else its ``WANDB_FUNNEL_<OPTION>`` variable, else its default),
    or the options as one ``FunnelOptions`` object. ``mode`` defaults to ``"offline"``
    unless ``WANDB_MODE`` is set.

    Args:
        options: the funnel's options, complete (no variable is read), if not given as
            keywords.
        topology: the job's ranks, when a launcher knows them (``wf.init`` in torchrun,
            SLURM or MPI passes it); a plain funnel numbers ranks as they attach.
        **kwargs: funnel options, and ``wandb.init`` arguments for the logger's run.

    Raises:
        TypeError, ValueError: a bad option (a variable's: named with its value) or
            ``wandb.init`` argument, named.
    """

    def __init__(
        self,
        options: FunnelOptions | None = None,
        *,
        topology: Topology | None = None,
        **kwargs: Any,
    ) -> None:
        self._sink: Backend = backend()  # picked again at start(): the sink then is the one
        request = prepare(options, topology, kwargs, self._sink)
        self.options, self.topology = request.options, request.topology
        self._request = request
        self._init_kwargs = request.init_kwargs  # wandb.init's, as the logger gets them
        self._run_id = request.run_id
        self._logger: LoggerProcess | None = None
        self._supervisor: Supervisor | None = None
        self._address: str | None = None
        self._ipc_dir: str | None = None
        self._token = os.urandom(16).hex()  # what secrets.token_hex does, without hashlib
        self._run: Run | None = None
        self._saved_env: dict[str, str | None] = {}
        self._closed = False
        self._curve: dict[str, str] | None = None
        self._run_info: dict[str, Any] | None = None
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
        """The logger process now (a new one after a restart)."""
        if self._supervisor is not None:
            return self._supervisor.logger.pid
        return self._logger.pid if self._logger is not None else None

    @property
    def logger_restarts(self) -> int:
        """How many times the logger died and was started again."""
        return self._supervisor.restarts if self._supervisor is not None else 0

    @property
    def address(self) -> str:
        if self._address is None:
            raise RuntimeError("wandb_funnel: the funnel is not started")
        return self._address

    @property
    def run(self) -> Run:
        """The owner's own run (rank 0, or the launcher's hosting rank)."""
        if self._run is None:
            raise RuntimeError("wandb_funnel: the funnel is not started")
        return self._run

    @property
    def tcp_address(self) -> str | None:
        """The TCP endpoint for ranks on other nodes (None unless listening on TCP)."""
        return self._tcp_address

    # -- start -----------------------------------------------------------------------------
    def start(self) -> Funnel:
        """Start wandb-core and the logger, wait until the run is open, export the address.

        An online run (with ``on_network_error="offline"``, the default) opens in the
        background instead: this returns once the logger listens, and a server that does not
        answer within ``start_timeout`` gets the run recorded offline (``sinks/wandb/network``).

        Raises:
            LoggerStartError: the logger did not open its run within ``start_timeout`` (or,
                online with ``on_network_error="raise"``, W&B did not answer: URL and error).
        """
        if self._logger is not None:
            raise RuntimeError("wandb_funnel: Funnel.start() called twice")
        # One wandb-core per funnel: the logger's, which it starts for its run (a run that
        # must outlive this process: a core started here dies with it). Nothing here starts
        # one (it cost 0.2 s at start, its teardown more at exit, and 50 MB, for nothing).
        self._sink = backend()
        # The run's start, as plain wandb stamps it: in the user's wandb.init (the logger's
        # own init comes a second or more later).
        started = time.time()
        if self.topology.tcp_host is not None:
            self._curve = new_curve_keys()
        self._address, self._ipc_dir = private_ipc_endpoint()
        # Media files are staged here by name (_worker/media.py); it goes with the directory.
        os.mkdir(_private_dir.path(self._ipc_dir, _private_dir.MEDIA), 0o700)
        program = self._sink.program(started)
        warm = prewarm.take()  # a logger started ahead of time, already past its imports
        try:
            try:
                start, self._logger, ready = self._spawn_logger(program, warm)
            except BrokenPipeError:
                if warm is None:
                    raise
                # It died before its start message (killed meanwhile): a logger of now.
                start, self._logger, ready = self._spawn_logger(program, None)
        except BaseException:
            remove_ipc_dir(self._ipc_dir)
            raise
        self._tcp_address = ready.get("tcp")
        self._run_info = ready.get("run") or None
        self._export_env()
        # A new logger binds the same endpoints (ranks on other nodes reconnect to the port).
        self._supervisor = Supervisor(
            # (a restarted logger is started then, with the environment of then)
            start._replace(tcp_endpoint=self._tcp_address, env=None, cwd=None),
            self._logger,
            self.options.max_logger_restarts,
            self._logger_restarted,
        )
        self._run = Run(
            self.attach_info(), requested_rank=self.topology.owner_rank, on_finish=self._finished
        )
        self._run.config._seed(self._init_kwargs.get("config") or {})  # the run opened with it
        lifecycle.add_shutdown_callback(self._close_on_exit, priority=10)
        _current.adopt(self._run)
        return self

    def _spawn_logger(
        self, program: dict[str, Any], warm: prewarm.Warm | None
    ) -> tuple[LoggerStart, LoggerProcess, dict[str, Any]]:
        """Start the logger (or hand ``warm``, one started ahead of time, its start message:
        with this process's environment and directory of now) and wait until the run is
        open; the start message, the logger and its ready line."""
        assert self._address is not None
        ready_r, ready_w = (warm.ready_r, warm.ready_w) if warm else os.pipe()
        start = LoggerStart(
            address=self._address,
            ipc_dir=self._ipc_dir,
            token=self._token,
            owner_pid=os.getpid(),
            ready_fd=ready_w,
            options=self.options,
            topology=self.topology,
            init_kwargs=self._init_kwargs,
            attempt=self._request.attempt,
            curve=self._curve,
            program=program,
            env=logger_env() if warm else None,
            cwd=os.getcwd() if warm else None,
        )
        logger, ready = LoggerProcess.spawn(
            start, ready_r, self.options.start_timeout, proc=warm.proc if warm else None
        )
        return start, logger, ready

    def _logger_restarted(self, logger: LoggerProcess) -> None:
        """On the supervisor's thread: processes started from now on find the new logger."""
        if ENV_LOGGER_PID in self._saved_env:
            os.environ[ENV_LOGGER_PID] = str(logger.pid)

    def attach_info(self, address: str | None = None) -> AttachInfo:
        """How a process reaches this funnel (``address`` defaults to the IPC endpoint)."""
        curve = client_curve(self._curve) if self._curve else None
        return self._request.attach_info(
            address or self.address, self._token, self.logger_pid, curve, self._run_info
        )

    def _export_env(self) -> None:
        self._saved_env = _environ.set_for_children(self.attach_info().to_env(), EXPORTED_ENV)

    def _restore_env(self) -> None:
        _environ.put_back(self._saved_env)
        self._saved_env = {}

    # -- logging as rank 0 -------------------------------------------------------------------
    def log(
        self, data: dict[str, Any], step: int | None = None, commit: bool | None = None
    ) -> None:
        """Log from the owner process, as rank 0 (see ``Run.log``)."""
        self.run.log(data, step=step, commit=commit)

    # -- close ---------------------------------------------------------------------------------
    def _finished(self, exit_code: int | None) -> bool:
        """The owner's run was finished: in the owner, that closes the funnel."""
        if os.getpid() != self.owner_pid:
            return False
        self.close(exit_code)
        return True

    def close(self, exit_code: int | None = None, footer: bool = True) -> None:
        """Drain, order, finish the run, join the logger: all within ``close_timeout``.

        Idempotent. Past the deadline the logger is killed and a warning says what was lost.
        SIGINT/SIGTERM arriving meanwhile are held and re-delivered once the run is closed.
        ``footer=False``: no "Run history:" block (an exit hook's close, as plain wandb's).
        """
        if os.getpid() != self.owner_pid:
            return  # a forked copy of the owner: the funnel is not ours to close
        # Held from before the closed flag is set: a handler that runs before the hold closes
        # the funnel itself (this call then finds it closed); one that lands after waits for
        # the close, never cuts it short.
        with lifecycle.signals_held():
            with self._close_lock:
                if self._closed or self._logger is None:
                    return
                self._closed = True
            code = 0 if exit_code is None else int(exit_code)
            self.exit_code = code
            lifecycle.remove_shutdown_callback(self._close_on_exit)
            close = Deadline(self.options.close_timeout)
            logger = self._logger
            if self._supervisor is not None:
                # No restart from now on; a restart under way may finish within half the time.
                logger = self._supervisor.stop(self.options.close_timeout / 2)
            try:
                self._close_logger(logger, code, close, footer)
            finally:
                # The logger is done and none will follow: the socket goes first, so that a
                # stream still open here does not wait for a successor (its unsaved records).
                remove_ipc_dir(self._ipc_dir)
                stream.close_all("owner closed", max(0.1, close.remaining()), code)
                self._restore_env()
                _current.forget(self._run)

    def _close_logger(
        self, logger: LoggerProcess, code: int, close: Deadline, footer: bool
    ) -> None:
        if logger.returncode is None:
            # Our own streams (rank 0 and any later init() here) say goodbye first.
            for own in stream.open_streams():
                # Not until saved (0.2 s, the transaction log's flush): the run's finish comes
                # next, and the supervisor has stopped (no logger would replace this one).
                budget = min(2.0, close.remaining())
                own.close("owner closed", budget, code, wait_saved=False)
        outcome, self.stats = logger.close(code, close.deadline, footer)
        self._read_what_the_logger_left()
        if outcome is CloseOutcome.ALREADY_EXITED:
            warnings.warn(
                f"wandb-funnel: the logger (pid {logger.pid}) had already exited with code "
                f"{logger.returncode}; the run may be missing its last rows and exit record",
                FunnelWarning,
                stacklevel=4,
            )
        elif outcome is CloseOutcome.KILLED:
            warnings.warn(
                f"wandb-funnel: the logger (pid {logger.pid}) did not finish the run within "
                f"close_timeout={self.options.close_timeout}s and was killed; rows still "
                f"buffered and the run's exit record may be missing",
                FunnelWarning,
                stacklevel=4,
            )

    def _read_what_the_logger_left(self) -> None:
        """Read, before the private directory goes, what the exited logger left there."""
        if self._ipc_dir is None:
            return
        if self.stats is None:
            # A logger out of time inside wandb leaves its accounting here before it exits.
            self.stats = _private_dir.read_json(self._ipc_dir, _private_dir.FINAL_STATS) or None
        run = self._run
        if run is not None and run._info.run_info is None:
            # The run opened in the background: its name and dir stay readable after the
            # close, which removes the file they were read from.
            info = _private_dir.read_json(self._ipc_dir, _private_dir.RUN_INFO)
            if info:
                run._info = run._info._replace(run_info=info)

    def _close_on_exit(self, exit_code: int, reason: str) -> None:
        self.close(exit_code, footer=False)

    def __enter__(self) -> Funnel:
        return self.start() if self._logger is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(lifecycle.exit_code_from_exception(exc))

    def __repr__(self) -> str:
        return f"<wandb_funnel.Funnel run_id={self._run_id!r} address={self._address!r}>"
