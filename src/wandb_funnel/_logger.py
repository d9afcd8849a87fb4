"""The logger process: receive -> decode -> order -> sink, and always finish the run.

Started by the owner (``python -m wandb_funnel._logger``, in a session of its own so that a
terminal's Ctrl-C or a launcher's killpg reaches the owner, which then closes us in order).
It ends when the owner sends CLOSE, when it is signalled directly, or when the owner vanishes
(it polls its parent pid): in each case it waits, bounded, for ranks that are still sending,
writes every buffered row, records the accounting in the summary and finishes the run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import _codec
from ._config import (
    BATCH_BYTES,
    EXIT_OWNER_LOST,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    LOGGER_TICK,
)
from ._lifecycle import pid_alive
from ._ordering import Reorderer, Row
from ._records import (
    Ack,
    Close,
    ConfigUpdate,
    Done,
    Goodbye,
    Hello,
    RecordBatch,
    SummaryUpdate,
    Welcome,
)
from ._reduce import RowBuilder
from ._transport import LoggerSocket, remove_ipc_dir
from .sinks import Sink

_LIVENESS_PERIOD = 0.25  # seconds between checks that ranks and the owner still live
_DRAIN_BATCH = 2_000  # frames taken per wake-up before rows are written out
_PEER_RCV_HWM = 1_000  # frames queued per peer inside ZeroMQ: bounds the logger's memory
_SIGNAL_BUDGET = 5.0  # seconds to finish when the logger itself is signalled
# A rank whose pid is dead is declared gone only once nothing has arrived from it for this
# long: a rank that exits right after a burst may have thousands of frames still queued.
_GONE_QUIET = 1.0
# Once closing, the logger exits by itself this long after its budget, whatever wandb does:
# nobody else may be left to kill it (the owner may be dead).
_WATCHDOG_GRACE = 1.0


def _log(message: str) -> None:
    print(f"wandb-funnel logger: {message}", file=sys.stderr, flush=True)


@dataclass(slots=True)
class _Peer:
    """What the logger knows of one stream (one rank of one process)."""

    rank: int
    pid: int
    host: str
    pid_start: int | None
    last_seen: float
    next_seq: int = 0
    received: int = 0
    finished: bool = False
    gone: bool = False

    @property
    def active(self) -> bool:
        return not (self.finished or self.gone)


class Logger:
    """One funnel's logger: owns the socket, the reorder buffer and the sink."""

    def __init__(self, cfg: dict[str, Any], sink: Sink, sock: LoggerSocket) -> None:
        self._token: str = cfg["token"]
        self._owner_pid: int = cfg["owner_pid"]
        self._close_timeout: float = cfg["close_timeout"]
        self._max_frame = int(cfg["max_record_bytes"]) + BATCH_BYTES + 4096
        self._sink = sink
        self._sock = sock
        self._ipc_dir: str | None = cfg.get("ipc_dir")
        self._order = Reorderer(cfg["reorder_window"], cfg["max_pending_rows"])
        self._builder = RowBuilder(cfg["run_mode"], cfg["reduce"], cfg["step_key"])
        self._host = socket.gethostname()
        self._peers: dict[bytes, _Peer] = {}
        self._used_ranks: set[int] = set()
        self._next_rank = 1
        self._closing: tuple[int, float, str] | None = None  # (exit code, straggler deadline, why)
        self._closer: bytes | None = None
        self._signal_code: int | None = None
        self._sink_broken: str | None = None
        # Accounting, reported in the run's summary.
        self.records = 0  # records written into the run
        self.dropped = 0  # records numbered by a worker that never made it into the run
        self.junk_frames = 0
        self.rejected_peers = 0
        self.dead_ranks: list[int] = []

    # -- the loop ------------------------------------------------------------------------------
    def serve(self) -> int:
        """Run until closed; returns the exit code the run was finished with."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        next_check = 0.0
        while True:
            now = time.monotonic()
            deadline = self._order.next_deadline()
            wait = LOGGER_TICK if deadline is None else min(LOGGER_TICK, max(0.0, deadline - now))
            if self._sock.wait(wait):
                self._drain(_DRAIN_BATCH)
            now = time.monotonic()
            self._write(self._order.pop_ready(now))
            if now >= next_check:
                next_check = now + _LIVENESS_PERIOD
                self._check_liveness()
            if self._signal_code is not None and self._closing is None:
                self._begin_close(self._signal_code, _SIGNAL_BUDGET, "signalled")
            if self._closing is not None:
                _, straggler_deadline, _ = self._closing
                if not any(p.active for p in self._peers.values()) or now >= straggler_deadline:
                    break
        return self._finish()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signal_code = EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM

    def _begin_close(self, exit_code: int, budget: float, why: str) -> None:
        # Half the budget for stragglers, the rest to write rows and finish wandb.
        budget = max(0.0, budget)
        self._closing = (exit_code, time.monotonic() + budget / 2, why)
        watchdog = threading.Timer(budget + _WATCHDOG_GRACE, self._give_up, args=(budget,))
        watchdog.daemon = True
        watchdog.start()

    def _give_up(self, budget: float) -> None:
        _log(
            f"could not finish the run within its {budget:.1f}s budget (wandb stalled?); "
            f"exiting: rows not yet written and the run's exit record are lost"
        )
        remove_ipc_dir(self._ipc_dir)
        os._exit(3)

    def _drain(self, limit: int) -> None:
        for _ in range(limit):
            message = self._sock.recv_nowait()
            if message is None:
                return
            identity, frames = message
            if len(frames) != 1:
                self.junk_frames += 1
                continue
            try:
                decoded = _codec.decode(frames[0], self._max_frame)
            except _codec.DecodeError:
                self.junk_frames += 1
                continue
            self._handle(identity, decoded)

    def _handle(self, identity: bytes, message: Any) -> None:
        if isinstance(message, Hello):
            self._hello(identity, message)
            return
        peer = self._peers.get(identity)
        if isinstance(message, Close):
            if message.token != self._token:
                self.rejected_peers += 1
            elif self._closing is None or self._closer is None:
                self._closer = identity
                self._begin_close(message.exit_code, message.budget, "closed by the owner")
            return
        if peer is None:  # never said hello (or was rejected): junk, counted
            self.junk_frames += 1
            return
        peer.last_seen = time.monotonic()
        if isinstance(message, RecordBatch):
            self._records(peer, message)
        elif isinstance(message, Goodbye):
            self._goodbye(peer, message)
            # The receipt lets the worker know (and say) whether anything went missing.
            self._sock.reply(identity, _codec.encode_ack(Ack(peer.received)))
        elif isinstance(message, ConfigUpdate):
            self._sink_call("config", self._sink.update_config, message.data)
        elif isinstance(message, SummaryUpdate):
            self._sink_call("summary", self._sink.update_summary, message.data)
        else:
            self.junk_frames += 1

    def _hello(self, identity: bytes, hello: Hello) -> None:
        if hello.token != self._token:
            self.rejected_peers += 1
            return
        peer = self._peers.get(identity)
        if peer is None:
            rank = hello.requested_rank
            if rank is None or rank in self._used_ranks:
                while self._next_rank in self._used_ranks:
                    self._next_rank += 1
                rank = self._next_rank
            self._used_ranks.add(rank)
            peer = self._peers[identity] = _Peer(
                rank, hello.pid, hello.host, hello.pid_start, time.monotonic()
            )
            self._order.rank_attached(rank)
        self._sock.reply(identity, _codec.encode_welcome(Welcome(peer.rank)))

    def _records(self, peer: _Peer, batch: RecordBatch) -> None:
        if batch.first_seq < peer.next_seq:
            self.junk_frames += 1  # a replay of numbers already seen
            return
        if batch.first_seq > peer.next_seq:  # the worker dropped (and counted) these
            self._drop(batch.first_seq - peer.next_seq, f"rank {peer.rank}: worker queue full")
        peer.next_seq = batch.first_seq + len(batch.records)
        peer.received += len(batch.records)
        now = time.monotonic()
        for rec in batch.records:
            self._order.add(peer.rank, rec.step, rec.committed, rec.data, now)

    def _goodbye(self, peer: _Peer, goodbye: Goodbye) -> None:
        if goodbye.produced > peer.next_seq:
            self._drop(goodbye.produced - peer.next_seq, f"rank {peer.rank}: never delivered")
        peer.finished = True
        self._order.rank_done(peer.rank)

    def _drop(self, count: int, why: str) -> None:
        self.dropped += count
        _log(f"{count} records dropped ({why})")

    def _check_liveness(self) -> None:
        if os.getppid() != self._owner_pid and self._closing is None:
            _log(f"the owner (pid {self._owner_pid}) is gone without closing; finishing the run")
            self._begin_close(EXIT_OWNER_LOST, self._close_timeout, "owner lost")
        now = time.monotonic()
        for peer in self._peers.values():
            if (
                peer.active
                and peer.host == self._host
                and now - peer.last_seen >= _GONE_QUIET
                and not pid_alive(peer.pid, peer.pid_start)
            ):
                peer.gone = True
                self.dead_ranks.append(peer.rank)
                self._order.rank_done(peer.rank)
                _log(
                    f"rank {peer.rank} (pid {peer.pid}) died without finishing; "
                    f"records it had not yet sent are lost"
                )

    # -- writing -------------------------------------------------------------------------------
    def _write(self, rows: list[Row]) -> None:
        for row in rows:
            if self._sink_broken is not None:
                self.dropped += row.records
                continue
            try:
                self._sink.log(self._builder.build(row))
                self.records += row.records
            except Exception as exc:  # wandb-core gone, or a value wandb refuses
                if isinstance(exc, (ConnectionError, BrokenPipeError, OSError)):
                    self._sink_broken = repr(exc)
                    _log(f"wandb stopped taking rows ({exc!r}); counting the rest as dropped")
                else:
                    _log(f"wandb refused the row at step {row.step}: {exc!r}")
                self.dropped += row.records

    def _sink_call(self, what: str, fn: Any, data: dict[str, Any]) -> None:
        if self._sink_broken is None:
            try:
                fn(data)
            except Exception as exc:
                _log(f"wandb refused a {what} update {list(data)!r}: {exc!r}")

    def stats(self) -> dict[str, Any]:
        return {
            "funnel/records": self.records,
            "funnel/late_records": self._order.late_records,
            "funnel/dropped_records": self.dropped,
            "funnel/ranks": len(self._peers),
            "funnel/dead_ranks": len(self.dead_ranks),
            "funnel/junk_frames": self.junk_frames,
            "funnel/rejected_peers": self.rejected_peers,
        }

    def _finish(self) -> int:
        assert self._closing is not None
        exit_code, _, why = self._closing
        self._drain(1_000_000)  # whatever is already queued: bounded by the per-peer HWMs
        for peer in self._peers.values():
            if peer.active:
                _log(
                    f"rank {peer.rank} (pid {peer.pid}) had not finished when the run closed "
                    f"({why}); records it sends from now on are lost"
                )
        self._write(self._order.pop_all())
        stats = self.stats()
        stats["funnel/exit_reason"] = why
        if self.dropped or self._order.late_records:
            _log(
                f"{self.dropped} records dropped, {self._order.late_records} logged late "
                f"(after their step's row was written)"
            )
        self._sink_call("summary", self._sink.update_summary, stats)
        try:
            if self._sink_broken is None:
                self._sink.finish(exit_code)
        except Exception as exc:
            _log(f"wandb could not finish the run: {exc!r}")
        if self._closer is not None:
            self._sock.reply(self._closer, _codec.encode_done(Done(stats)))
        return exit_code


def _write_ready(fd: int, payload: dict[str, Any]) -> None:
    try:
        os.write(fd, (json.dumps(payload) + "\n").encode())
    finally:
        os.close(fd)


def main() -> int:
    """Entry point of ``python -m wandb_funnel._logger``; config arrives as JSON on stdin."""
    cfg = json.loads(sys.stdin.buffer.read())
    ready_fd: int = cfg["ready_fd"]
    # Until the owner closes us, a Ctrl-C meant for the owner must not kill the run half-made.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock: LoggerSocket | None = None
    try:
        from .sinks.wandb import WandbSink

        max_frame = int(cfg["max_record_bytes"]) + BATCH_BYTES + 4096
        sock = LoggerSocket(cfg["address"], _PEER_RCV_HWM, max_frame)
        sink = WandbSink(cfg["init_kwargs"], cfg["step_key"])
    except BaseException as exc:
        if sock is not None:
            sock.close()
        remove_ipc_dir(cfg.get("ipc_dir"))
        _write_ready(ready_fd, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    logger = Logger(cfg, sink, sock)
    _write_ready(ready_fd, {"run_id": sink.run_id, "pid": os.getpid()})
    try:
        return logger.serve()
    finally:
        sock.close()
        remove_ipc_dir(cfg.get("ipc_dir"))


if __name__ == "__main__":
    main()
    # Exit without waiting on anything the wandb SDK left running; the run is finished.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
