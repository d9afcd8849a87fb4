"""``wf.Run``: what ``wf.init`` returns; one rank's view of the single wandb run.

Its parts, each a base of ``Run``: ``RunInfo`` (``run_info.py``: name, dir, url, tags, ... as
wandb's Run has them), ``RunFiles`` (``run_files.py``: media, artifacts and saved files, staged
by name), ``RunUpdates`` (``run_updates.py``: config, summary, define_metric). Here: logging,
the rank's stream, the end, and crossing into another process. ``AttachInfo`` (what a process
needs to reach a funnel) is ``attach.py``'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType
from typing import Any

from wandb_funnel import _pid
from wandb_funnel._constants import FINAL_FLUSH_TIMEOUT, WELCOME_TIMEOUT
from wandb_funnel._protocol import codec
from wandb_funnel._worker import console, media, system
from wandb_funnel._worker.attach import AttachInfo
from wandb_funnel._worker.lifecycle import exit_code_from_exception, signals_held
from wandb_funnel._worker.run_data import Config, Summary
from wandb_funnel._worker.run_files import RunFiles
from wandb_funnel._worker.run_info import RunInfo
from wandb_funnel._worker.run_updates import warn_once
from wandb_funnel._worker.stream import Stream

__all__ = ["AttachInfo", "Run", "warn_once"]  # AttachInfo and warn_once: re-exported


class Run(RunInfo, RunFiles):
    """One rank's handle on the funnel's run, used like the object ``wandb.init`` returns.

    ``log`` follows ``wandb.log``'s step rules for this rank. A Run passed to another process
    (pickled by multiprocessing) attaches that process as a rank of its own. ``finish`` ends
    this rank's stream; only the owner's finish ends the wandb run.
    """

    def __init__(
        self,
        info: AttachInfo,
        requested_rank: int | None,
        on_finish: Callable[[int | None], bool] | None = None,
    ) -> None:
        """``on_finish(exit_code)`` runs once, first thing in ``finish()``; it returns True
        when it has ended this rank's stream itself (the owner's Funnel closing everything),
        False to let ``finish()`` close the stream as usual (a launched rank forgetting the
        variables it exported)."""
        self._info = info
        self._max_record_bytes = info.max_record_bytes  # read by every log()
        self._requested_rank = requested_rank
        self._finish_hook = on_finish
        self._stream: Stream | None = None
        self._stager: media.Stager | None = None  # this process's, made at its first media
        self._packers = media.RecordPackers(self._media_stager)  # log()'s, per thread
        self._step = 0
        self._finished = False
        self._config = Config(self._send_config)
        self._summary = Summary(self._send_summary)
        # What this process set with run.name / notes / tags: what it reads back from then on.
        self._set_here: dict[str, Any] = {}

    @property
    def rank(self) -> int | None:
        """This stream's rank (asks the logger once when it was assigned; None if it never said)."""
        return self._live_stream().rank(WELCOME_TIMEOUT)

    @property
    def step(self) -> int:
        """The step the next ``log(data)`` without ``step=`` goes to."""
        return self._step

    # -- logging -------------------------------------------------------------------------------
    def log(
        self, data: dict[str, Any], step: int | None = None, commit: bool | None = None
    ) -> None:
        """Log ``data`` at ``step`` (this rank's next step when None), like ``wandb.log``.

        Raises:
            TypeError: ``data`` is not a dict, a key is not a str, a value cannot be encoded,
                ``step`` is not an int, or ``commit`` is not a bool.
            ValueError: ``step`` is negative or too large, or the record is over
                ``max_record_bytes``.
            ClientClosedError: the run was finished.
        """
        # The hot path: every call here costs the training loop (2-3.5 us in all here), so the
        # common cases are checked inline and the helpers only run for the rest.
        if self._finished:
            raise self._finished_error("log")
        if commit is not None and type(commit) is not bool:
            raise TypeError(f"wandb_funnel: commit must be a bool or None, got {commit!r}")
        stream = self._stream
        if stream is None or stream.pid != _pid.current:
            # First use in this process: refuse bad data before connecting, so that a call
            # that raises leaves no rank behind holding rows back.
            codec.check_data(data)
            stream = self._live_stream()  # may reset self._step in a new process
        current = self._step
        if step is None:
            at = current
            committed = commit is not False
            after = current + 1 if committed else current
        else:
            at = (
                step
                if type(step) is int and 0 <= step <= codec.MAX_STEP
                else codec.check_step(step)
            )
            committed = commit is True  # an explicit step stays open until a later step
            after = at + 1 if committed else at
            if after < current:
                after = current
        # Encode first (it validates data): a record refused here must not move the step.
        # One pass, media included: the packer stages them as it meets them.
        records = self._packers.here
        try:
            frame = codec.encode_record(
                at, committed, data, self._max_record_bytes, records.hook, records.packer
            )
        except BaseException:
            records.rollback()
            raise
        blobs = self._blobs(records) if records.pending is not None else None
        self._step = after
        stream.push(frame, blobs)

    def _attach(self, timeout: float) -> bool:
        """Connect now and wait (bounded) for the logger's welcome; True once welcomed."""
        return self._live_stream().wait_welcome(timeout)

    def _live_stream(self) -> Stream:
        stream = self._stream
        if stream is not None and stream.pid == _pid.current:
            return stream  # the hot path
        if stream is None or stream.pid != os.getpid():
            # First use here, or an object that came through fork: a stream of our own, a rank
            # of our own, steps from 0. Never the parent's socket.
            inherited = stream is not None
            requested = None if inherited else self._requested_rank
            stream = self._stream = Stream(
                self._info.address,
                self._info.token,
                requested,
                self._info.logger_pid,
                self._info.logger_host,
                self._info.curve,
                *self._info.replay,
                self._info.restarts,
            )
            if inherited:
                self._step = 0
            if self._info.console and os.environ.get("WANDB_CONSOLE") != "off":
                console.start(stream)  # this process's prints reach the run from here on
            system.start(self._info.stats_interval)  # and its system metrics
        return stream

    # -- the end -------------------------------------------------------------------------------
    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:
        """End this rank's stream (the owner's: close the whole funnel). Idempotent.
        ``quiet`` is accepted for callers written for older wandb, and ignored."""
        # Held from before the flag is set: a handler landing in between would otherwise get
        # a finish() that does nothing, while this one has not closed anything yet.
        with signals_held():
            self._finish(exit_code)

    def _finish(self, exit_code: int | None) -> None:
        if self._finished:
            return
        self._finished = True
        if self._finish_hook is not None and self._finish_hook(exit_code):
            return
        stream = self._stream
        if stream is not None and stream.pid == os.getpid():
            stream.close("finished", FINAL_FLUSH_TIMEOUT, exit_code or 0)

    def flush(self) -> None:
        """Send this rank's buffered records now (``log`` batches them)."""
        stream = self._stream
        if stream is not None and stream.pid == os.getpid():
            stream.flush(0.0)

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish(exit_code_from_exception(exc))

    # -- crossing into another process -------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        # The child gets connection details only (no socket, no pickle of our state on the
        # wire): it attaches as a rank of its own on first use.
        info = self._info
        if info.run_info is not None and self._set_here:  # what this process set, too
            set_here = {
                k: list(v) if isinstance(v, tuple) else v for k, v in self._set_here.items()
            }
            info = info._replace(run_info={**info.run_info, **set_here})
        return (_restore, (info,))

    def __repr__(self) -> str:
        state = "finished" if self._finished else "active"
        return f"<wandb_funnel.Run id={self.id!r} rank={self._requested_rank!r} {state}>"


def _restore(info: AttachInfo) -> Run:
    return Run(info, requested_rank=None)
