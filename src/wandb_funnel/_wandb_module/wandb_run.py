"""The Run that an installed ``wandb.init`` returns: a ``wf.Run`` that libraries see as wandb's.

Libraries check ``isinstance(run, wandb.sdk.wandb_run.Run)`` before they call it (Lightning's
``WandbLogger`` does, to declare its step metric), so the class is built once wandb is loaded,
as a subclass of both: ``wf.Run`` first, so that everything the funnel implements is ours, and
wandb's ``Run`` second, for ``isinstance``. Every other method and property of wandb's Run is
replaced by a stub that warns once and returns None: wandb's own code would find none of the
state it expects, and a training job must never crash on a logging call.

``log`` carries wandb's media (``wandb.Image``, ``Table``, ``Histogram``, ``Html``, ``Video``,
``Audio``, ``wandb.plot.*`` charts: ``_worker/media.py``), and never raises on a value the
funnel cannot carry yet (a numpy array, a matplotlib or plotly figure): that value is left out,
warned about once, and counted in the run's summary (``_funnel/dropped_values``), and the rest
of the row is logged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wandb_funnel._protocol import codec
from wandb_funnel._worker import console, media
from wandb_funnel._worker.run import Run, warn_once

# Telemetry and display helpers that libraries call as a matter of course: no warning.
_SILENT = frozenset({"display", "to_html", "_repr_html_", "_repr_mimebundle_"})
# Properties with an honest answer for a funnel's run.
_PROPERTIES: dict[str, Any] = {
    "starting_step": 0,
    "resumed": False,
    "sweep_id": None,
    "sweep_url": None,
    "project_url": None,
}


class InstalledRunMixin(Run):
    """What an installed run adds to ``wf.Run``: wandb's forgiving ``log``, and counts."""

    _dropped_counts: dict[str, int]
    # wandb's Run checks a frozen flag on every attribute set: log() sets self._step.
    __setattr__ = object.__setattr__

    def log(
        self,
        data: dict[str, Any],
        step: int | None = None,
        commit: bool | None = None,
        sync: bool | None = None,
    ) -> None:
        try:
            Run.log(self, data, step=step, commit=commit)
        except (TypeError, ValueError):
            kept = self._carried_values(data)
            if kept is None:
                raise  # not a value's fault (a bad key, step or commit): the caller's error
            Run.log(self, kept, step=step, commit=commit)

    def _finished_error(self, call: str) -> Exception:
        """wandb's own error for a call on a finished run, worded as wandb words it (code
        that catches wandb's UsageError catches ours)."""
        from wandb.errors import UsageError

        return UsageError(
            f"Run ({self.id}) is finished. The call to `{call}` will be ignored. Please make "
            f"sure that you are using an active run."
        )

    def _invalid_tags(self, why: str) -> None:
        """wandb's own warning for tags it does not take, printed as wandb prints it."""
        import wandb

        with console.uncaptured():  # as plain wandb's: on the terminal, not in the Logs
            wandb.termwarn(f"Invalid tag detected: {why} Tags not updated.")

    def _log(
        self, data: dict[str, Any], step: int | None = None, commit: bool | None = None, **_: Any
    ) -> None:
        """What wandb's own helpers call (``watch``'s hooks log histograms with
        ``commit=False``, into the rank's current step)."""
        self.log(data, step=step, commit=commit)

    @property
    def _torch(self) -> Any:
        """wandb's TorchHistory for this run: ``watch`` registers its hooks there."""
        history = self.__dict__.get("_funnel_torch_history")
        if history is None:
            from wandb.integration.torch import wandb_torch

            history = self.__dict__["_funnel_torch_history"] = wandb_torch.TorchHistory()  # type: ignore[no-untyped-call]
        return history

    def watch(
        self,
        models: Any,
        criterion: Any = None,
        log: str | None = "gradients",
        log_freq: int = 1000,
        idx: int | None = None,
        log_graph: bool = False,
    ) -> Any:
        """``wandb.watch``, from any rank: wandb's own hooks, their gradient and parameter
        histograms logged through the funnel (per rank in shared mode; the lowest rank's in
        auto mode). The graph (``log_graph=True``) is not carried: warned and counted."""
        from wandb.sdk.wandb_watch import _watch

        if log_graph:
            self._unsupported("watch(log_graph=True)")
        return _watch(self, models, criterion, log, log_freq, idx, log_graph=False)  # type: ignore[arg-type]

    def unwatch(self, models: Any = None) -> None:
        from wandb.sdk.wandb_watch import _unwatch

        _unwatch(self, models)  # type: ignore[arg-type]

    def _carried_values(self, data: Any) -> dict[str, Any] | None:
        """``data`` without the values the funnel cannot carry (counted and warned about);
        None when every value can be carried (the error was something else)."""
        if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
            return None
        kept: dict[str, Any] = {}
        dropped: list[str] = []
        for key, value in data.items():
            if media.contains_media(value):
                kept[key] = value  # its own errors (too big, a missing file) are the caller's
                continue
            try:
                codec.encode_record(0, True, {key: value}, self._max_record_bytes)
            except (TypeError, ValueError):
                dropped.append(key)
            else:
                kept[key] = value
        if not dropped:
            return None
        kinds = sorted({type(data[k]).__name__ for k in dropped})
        warn_once(
            "log-values",
            f"log() values of type {', '.join(kinds)} (keys {', '.join(dropped[:5])}) do not "
            f"go through the funnel yet; they were left out and are counted in the run's "
            f"summary as _funnel/dropped_values (this warning is shown once)",
        )
        self._count("_funnel/dropped_values", len(dropped))
        return kept


def _stub_method(name: str) -> Callable[..., None]:
    if name.startswith("_") or name in _SILENT:

        def quiet(self: InstalledRunMixin, *args: Any, **kwargs: Any) -> None:
            return None

        quiet.__name__ = name
        return quiet

    def stub(self: InstalledRunMixin, *args: Any, **kwargs: Any) -> None:
        self._unsupported(name)

    stub.__name__ = name
    return stub


def _stub_property(name: str) -> property:
    if name in _PROPERTIES:
        value = _PROPERTIES[name]
        return property(lambda self: value)

    def get(self: InstalledRunMixin) -> None:
        if not name.startswith("_"):
            self._unsupported(name)

    return property(get)


_classes: dict[type, type] = {}


def installed_run_class(wandb_run_class: type) -> type:
    """``InstalledRunMixin`` + wandb's Run, with a stub for everything else of wandb's."""
    cls = _classes.get(wandb_run_class)
    if cls is not None:
        return cls
    ours = set(dir(InstalledRunMixin))
    namespace: dict[str, Any] = {"__module__": __name__, "__doc__": InstalledRunMixin.__doc__}
    for klass in reversed(wandb_run_class.__mro__[:-1]):  # wandb's own, without object
        for name, attr in vars(klass).items():
            if name.startswith("__") or name in ours:
                continue
            if isinstance(attr, property):
                namespace[name] = _stub_property(name)
            elif callable(attr) or isinstance(attr, (staticmethod, classmethod)):
                namespace[name] = _stub_method(name)
    cls = _classes[wandb_run_class] = type("Run", (InstalledRunMixin, wandb_run_class), namespace)
    return cls


def as_installed(run: Run, wandb: Any) -> Run:
    """``run`` itself, now an instance of the installed class (same state, same object: the
    funnel's references to it stay valid), whose config raises wandb's own ``ConfigError``
    (HF catches that one)."""
    cls = installed_run_class(wandb.Run)
    if type(run) is not cls:
        run.__class__ = cls
        object.__setattr__(run.config, "_error", wandb.sdk.lib.config_util.ConfigError)
    return run
