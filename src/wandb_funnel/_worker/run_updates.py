"""A Run's updates of the one wandb run, beside its records: ``config`` and ``summary`` (local
mirrors, ``run_data.py``, that send each change), ``define_metric``, a tensorboard directory,
and the funnel's own counts of what it did not carry. Each update leaves on the rank's stream
after everything logged before it; the logger applies it to the run.
"""

from __future__ import annotations

import os
import socket
import threading
import warnings
from typing import TYPE_CHECKING, Any

from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import CONFIG, METRIC, SUMMARY, TENSORBOARD, UpdateKind
from wandb_funnel._worker.run_data import Config, Summary
from wandb_funnel.errors import ClientClosedError, FunnelWarning

if TYPE_CHECKING:
    from wandb_funnel._worker.attach import AttachInfo
    from wandb_funnel._worker.stream import Stream

# The call a finished run refuses, by update kind, named as wandb names it in its error.
_UPDATE_CALLS = {
    CONFIG: "_config_callback",
    SUMMARY: "_summary_update_callback",
    METRIC: "define_metric",
}

_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(what: str, message: str) -> None:
    """Warn about ``what`` the first time only, in this process."""
    with _warned_lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(f"wandb-funnel: {message}", FunnelWarning, stacklevel=4)


class RunUpdates:
    """The updates part of ``wf.Run`` (a base of it; ``Run`` holds the state)."""

    _info: AttachInfo
    _finished: bool
    _config: Config
    _summary: Summary

    if TYPE_CHECKING:

        def _live_stream(self) -> Stream: ...

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def config(self) -> Config:
        """The run's config, as this process has seen it (``wandb.Run.config``'s behaviour)."""
        return self._config

    @property
    def summary(self) -> Summary:
        """The run's summary: what this process sets reaches the run."""
        return self._summary

    def define_metric(
        self,
        name: str,
        step_metric: str | None = None,
        step_sync: bool | None = None,
        hidden: bool | None = None,
        summary: str | None = None,
        goal: str | None = None,
        overwrite: bool | None = None,
    ) -> None:
        """``wandb.Run.define_metric``, applied to the run by the logger.

        A user's step metric (``define_metric("train/*", step_metric="train/global_step")``)
        charts its keys against the user's step, as in wandb; the funnel declares none.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"wandb_funnel: define_metric name must be a non-empty str, got {name!r}"
            )
        if goal is not None and not _wandb_takes_goal():
            # As plain wandb (0.29 and later, where goal is gone) refuses it: at the call.
            raise TypeError(
                "wandb_funnel: define_metric() got an unexpected keyword argument 'goal' "
                "(this wandb's define_metric has none)"
            )
        step_metric = getattr(step_metric, "name", step_metric)  # a wandb Metric object
        args = {
            "name": name,
            "step_metric": step_metric,
            "step_sync": step_sync,
            "hidden": hidden,
            "summary": summary,
            "goal": goal,
            "overwrite": overwrite,
        }
        self._send_update(METRIC, {k: v for k, v in args.items() if v is not None})

    # -- what wandb's integrations call in the calling process --------------------------------
    def _tensorboard_callback(self, logdir: str, save: bool = True, root_logdir: str = "") -> None:
        """What wandb's tensorboard patch (``sync_tensorboard=True``) calls when a writer in
        this process opens a log directory: the logger hands it to the run, whose wandb-core
        reads the tfevents files from disk. From another host than the logger's the files are
        not on its disk (and wandb-core takes only its own host's tfevents files): warned
        once and counted (``_funnel/unsupported_calls``)."""
        if self._info.logger_host not in (None, socket.gethostname()):
            self._unsupported(
                "sync_tensorboard",
                "a tensorboard log directory on another host than the "
                "logger's does not reach the run (its tfevents files are not on the logger's "
                "disk)",
            )
            return
        self._send_update(
            TENSORBOARD,
            {
                "log_dir": os.fspath(logdir),
                "save": bool(save),
                "root_dir": os.fspath(root_logdir or ""),
                "cwd": os.getcwd(),
            },
        )

    def _count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to this process's count ``key`` in the run's summary."""
        counts = self.__dict__.setdefault("_dropped_counts", {})
        counts[key] = counts.get(key, 0) + n
        if self.finished:
            return
        try:
            self.summary.update({key: counts[key]})
        except Exception:  # the count must never be what breaks training
            pass

    def _unsupported(self, name: str, why: str | None = None) -> None:
        """A call the funnel does not carry: warned once, counted in the run's summary."""
        warn_once(
            name,
            f"{why or f'run.{name}() does not go through the funnel yet'}; the call was "
            f"ignored and is counted in the run's summary as _funnel/unsupported_calls "
            f"(shown once)",
        )
        self._count("_funnel/unsupported_calls")

    def _finished_error(self, call: str) -> Exception:
        """What a call on a finished run raises (an installed run raises wandb's own)."""
        what = {"log": "log()", "name": "run.name =", "notes": "run.notes =", "tags": "run.tags ="}
        return ClientClosedError(f"wandb_funnel: {what.get(call, 'update')} on a finished run")

    def _send_config(self, data: dict[str, Any]) -> None:
        self._send_update(CONFIG, data)

    def _send_summary(self, data: dict[str, Any]) -> None:
        self._send_update(SUMMARY, data)

    def _send_update(self, kind: UpdateKind, data: dict[str, Any]) -> bool:
        if self._finished:
            raise self._finished_error(_UPDATE_CALLS.get(kind, "update"))
        frame = codec.encode_update(kind, data, self._info.max_record_bytes)
        return self._live_stream().send_control(frame)


def _wandb_takes_goal() -> bool:
    """Only a call with ``goal`` pays for reading wandb's signature (it imports wandb)."""
    from wandb_funnel.sinks.wandb import compat

    return compat.run_method_takes("define_metric", "goal")
