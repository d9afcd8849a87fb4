"""The logger process's entry point: read the start message, open the socket and the run,
say ready, serve, and leave nothing behind.

Started by the owner (``_owner.logger_process.LOGGER_BOOTSTRAP``, in a session of its own so
that a terminal's Ctrl-C or a launcher's killpg reaches the owner, which then closes us in
order), or ahead of time (``_owner/prewarm.py``: the slow imports done before the start
message comes). A receiver thread (``receiver.py``) owns the socket; the main thread runs
the loop (``loop.py``), which writes rows to wandb, which may be slow.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, NamedTuple

from wandb_funnel import _private_dir
from wandb_funnel._constants import BATCH_BYTES, ENV_WARM
from wandb_funnel._logger import continuity
from wandb_funnel._logger.continuity import Continuation
from wandb_funnel._logger.leave import leave
from wandb_funnel._logger.loop import Logger
from wandb_funnel._logger.receiver import Receiver
from wandb_funnel._logger.runs import SinkLostError
from wandb_funnel._logger.say import log_to_stderr
from wandb_funnel._outcomes import LoggerExit, Outcome
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import Done, LoggerStart, NodePlan, Saved
from wandb_funnel._protocol.sockets import LoggerSocket
from wandb_funnel.sinks import (
    Opening,
    Sink,
    open_sink,
    opens_online,
    shut_down_own_service,
    warm_up,
)

_PEER_RCV_HWM = 250  # frames queued per peer inside ZeroMQ (up to 64,000 records)
_MAX_QUEUED_RECORDS = 500_000  # records decoded and waiting for the writer: bounds memory


class _Started(NamedTuple):
    sock: LoggerSocket
    receiver: Receiver
    logger: Logger
    opening: Opening
    background: bool  # the run opens after ready is said (online, never raising)


def main() -> int:
    """The logger process: the start message arrives on stdin. Returns the exit code the
    run was finished with (``LoggerExit.NOT_OPENED`` when it could not be opened)."""
    if os.environ.pop(ENV_WARM, None):
        warm_up()  # started ahead of time: the slow imports, before the wait
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return 0  # started ahead of time and never used: the owner is gone or done
    start = _take_over(LoggerStart.from_json(line))
    # A restart: what the dead logger left (its segment's tail read once it is final).
    before = continuity.resume(start.ipc_dir, start.generation)
    # Until serve() installs its handlers, a stray Ctrl-C must not kill a half-made run.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        started = _start(start, before)
    except BaseException as exc:
        _private_dir.remove(start.ipc_dir)
        _write_ready(start.ready_fd, {"error": f"{type(exc).__name__}: {exc}"})
        return LoggerExit.NOT_OPENED
    started.receiver.start()
    ready = {
        "run_id": start.run_id,
        "pid": os.getpid(),
        "tcp": started.sock.tcp_endpoint,
        "run": started.logger.run_info(),
    }
    _write_ready(start.ready_fd, ready)
    return _serve(start, started)


def _take_over(start: LoggerStart) -> LoggerStart:
    """The owner's environment and directory, now (a logger started ahead of time has an
    older copy); wandb-core of its own, not the owner's: the run outlives the owner's
    death, and a core that dies with this logger is replaced with it."""
    if start.env is not None:
        os.environ.clear()
        os.environ.update(start.env)
    if start.cwd is not None:
        try:
            os.chdir(start.cwd)
        except OSError as exc:  # gone meanwhile: the directory it started in will do
            log_to_stderr(f"could not change to the owner's directory {start.cwd!r}: {exc}")
    os.environ.pop("WANDB_SERVICE", None)
    return start


def _start(start: LoggerStart, before: Continuation) -> _Started:
    """The socket, the receiver and the loop; the run too, unless it opens in the background."""
    max_frame = start.options.max_record_bytes + BATCH_BYTES + 4096

    def open_run(
        overrides: dict[str, Any], stats_pid: int | None = None, opening: Opening | None = None
    ) -> Sink:
        # wandb-core samples the process that called wandb.init (the owner), not us.
        # A restarted logger resumes the run: wandb writes a new segment of it.
        resume = {"resume": "allow"} if start.generation else {}
        return open_sink(
            {**start.init_kwargs, **resume, **overrides},
            start.options.step_key,
            start.program,
            stats_pid or start.owner_pid,
            log_to_stderr,
            opening,
            start.generation,
        )

    sock = LoggerSocket(
        start.address,
        _PEER_RCV_HWM,
        max_frame,
        start.topology.tcp_host,
        start.curve,
        start.tcp_endpoint,
    )
    try:
        receiver = Receiver(
            sock,
            start.token,
            max_frame,
            _MAX_QUEUED_RECORDS,
            start.topology.first_auto_rank,
            os.path.join(start.ipc_dir, _private_dir.MEDIA) if start.ipc_dir else None,
            generation=start.generation,
            saved=before.saved,
            used_ranks=before.ranks,
            node=start.topology.node,
            plan=NodePlan(
                start.options.run_mode == "auto" and start.topology.per_rank is None,
                dict(start.options.reduce),
            ),
        )
        logger = Logger(start, receiver, open_run, before)
        # An online run opens in the background: the owner's start (and with it every rank's
        # first log) does not wait for the network; records wait in the receiver's queue.
        # Offline, or where a server that does not answer must raise (as plain wandb.init
        # does), the run is open before the owner's start returns.
        background = start.options.on_network_error == "offline" and opens_online(start.init_kwargs)
        opening = Opening(
            time.monotonic() + start.options.start_timeout,
            start.options.on_network_error,
            logger.open_by,
        )
        if not background:
            logger.open_run(opening)
    except BaseException:
        sock.close()
        raise
    return _Started(sock, receiver, logger, opening, background)


def _serve(start: LoggerStart, started: _Started) -> int:
    """Serve until closed; then DONE to the owner, and the ranks told what is saved."""
    sock, receiver, logger = started.sock, started.receiver, started.logger
    try:
        if started.background:
            logger.watch()
            try:
                logger.open_run(started.opening)
            except SinkLostError:
                leave(LoggerExit.RESTART)  # as below: the owner starts the next logger
        result = logger.serve()
        if result.outcome is Outcome.RESTART:
            # wandb-core is gone: nothing more to finish here. Out at once (wandb's exit
            # hook would wait on the dead core; the receiver thread still owns the socket);
            # the owner starts the next logger.
            leave(result.process_code)
        # wandb-core is this process's own: it writes the end of the run's transaction
        # log when shut down, not when it finds its parent gone (a forced shutdown).
        shut_down_own_service(logger.teardown_budget(), result.exit_code)
        return result.process_code
    finally:
        # The receiver has stopped: the socket is ours now, for the owner's DONE.
        if receiver.closer is not None and not receiver.is_alive():
            stats = logger.final_stats or logger.ledger.funnel(logger.runs)
            sock.reply(receiver.closer, codec.encode_done(Done(stats)))
        if not receiver.is_alive():
            if logger.final_stats is not None:
                # The run is finished and its wandb-core shut down: everything taken in is
                # in the file or counted. Every rank still listening may forget its records
                # (a closing one would otherwise wait for a successor that never comes).
                for identity, peer in receiver.streams.items():
                    frame = codec.encode_saved(Saved(peer.next_seq))
                    sock.reply(identity, frame)
            sock.close()
        # The owner removes the directory once it has read what is left there for it (the
        # run's info: it opened in the background); with the owner gone, nobody else will.
        if os.getppid() != start.owner_pid:
            _private_dir.remove(start.ipc_dir)


def _write_ready(fd: int, payload: dict[str, Any]) -> None:
    try:
        os.write(fd, (json.dumps(payload) + "\n").encode())
    finally:
        os.close(fd)
