"""The wandb sink: one wandb run in the logger process (``sinks.Sink``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from wandb_funnel._constants import ORIGINAL_ATTRIBUTE, TRANSACTION_LOG_FLUSH_INTERVAL
from wandb_funnel.sinks.refs import materialize
from wandb_funnel.sinks.wandb import compat
from wandb_funnel.sinks.wandb.media import Maker, log_files
from wandb_funnel.sinks.wandb.settings import settings_to_dict
from wandb_funnel.sinks.wandb.txlog import Tail, log_path

if TYPE_CHECKING:
    from wandb_funnel.sinks import Staging
# What a worker's Run answers for wandb.Run's properties, as the logger's run has them.
_RUN_INFO = (
    "id",
    "name",
    "project",
    "entity",
    "dir",
    "url",
    "group",
    "job_type",
    "notes",
    "tags",
    "offline",
    "resumed",
    "start_time",
    "sweep_id",
)


class WandbSink:
    """Owns one wandb run in the logger process."""

    def __init__(
        self,
        init_kwargs: dict[str, Any],
        step_key: str,
        program: dict[str, Any] | None = None,
        stats_pid: int | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        import sys

        import wandb

        # What the installed wandb lacks (``compat``), each said once: sinks.Degradable.
        self.degraded: dict[str, str] = {}
        self._say = say
        self._wandb = wandb
        kwargs = dict(init_kwargs)
        settings = settings_to_dict(kwargs.pop("settings", None))
        if program:
            # The run records the user's program and arguments, as if the owner had called
            # wandb.init: wandb reads them from WANDB_PROGRAM (unless the user set it, or
            # settings.program) and from sys.argv, which is the logger's own to set.
            if program.get("program") and "program" not in settings:
                # As the user would say it: wandb derives the code paths from it at init.
                os.environ.setdefault("WANDB_PROGRAM", program["program"])
            sys.argv[1:] = [str(a) for a in program.get("args") or []]
        # The ranks' console comes in as text (``output``), recorded as wandb's own capture
        # records it: wrap_raw, so that wandb-core writes output.log (with "off" it does not).
        # The logger prints nothing of its own but its diagnostics. A short transaction-log
        # flush bounds what a crash of the logger or of wandb-core can lose to about a second.
        self.console = settings.get("console") != "off" and os.environ.get("WANDB_CONSOLE") != "off"
        settings["console"] = "wrap_raw" if self.console else "off"
        funnel_settings: dict[str, Any] = {
            "x_transaction_log_flush_interval": TRANSACTION_LOG_FLUSH_INTERVAL
        }
        # Never patch this process's tensorboard or gym (WANDB_SYNC_TENSORBOARD would): the
        # ranks write the events, and their own patch sends the directories here
        # (_init_keywords); patching here would also import torch for nothing.
        settings["sync_tensorboard"] = False
        for name in ("sync_tensorboard", "tensorboard", "monitor_gym"):
            kwargs.pop(name, None)
        # wandb-core's unlabelled system metrics (proc.*) measure x_stats_pid, by default the
        # process that calls wandb.init: here the logger. The run measures the training
        # process instead (the owner's, which called wandb.init), as plain wandb does.
        if stats_pid and "WANDB_X_STATS_PID" not in os.environ:
            funnel_settings["x_stats_pid"] = stats_pid
        compat.add_funnel_settings(settings, funnel_settings, self._degrade)
        self.stats_pid: int | None = _int_or_none(
            settings.get("x_stats_pid", os.environ.get("WANDB_X_STATS_PID"))
        )
        if "mode" not in kwargs and "WANDB_MODE" not in os.environ:
            kwargs["mode"] = "offline"  # the embedded default: works with no network and no login
        kwargs.setdefault("reinit", "create_new")
        self._tensorboard_synced = False
        self._make = Maker(wandb)  # wandb's own objects from the ranks' media descriptors
        # The real wandb.init, even where wandb_funnel.install() has replaced it.
        init = getattr(wandb.init, ORIGINAL_ATTRIBUTE, wandb.init)
        _no_shared_service_notice()
        with _started_at((program or {}).get("start_time")):
            self.run: wandb.Run = init(settings=wandb.Settings(**settings), **kwargs)
        self.run_id: str = self.run.id
        # A resumed run (online: the server's) starts at its last step + 1; wandb drops a
        # log(step=S) below it, so no row is placed there (_logger/steps.py).
        self.starting_step = int(getattr(self.run, "starting_step", 0) or 0)
        # What wandb-core has flushed to the run's transaction log (``saved_rows``).
        self._tail = Tail(log_path(self.run.dir, self.run.id))
        # No define_metric of the funnel's: rows are at their own _step (_logger/steps.py), so
        # the run's axes, and any step metric of the user's, are plain wandb's.
        _record_imports(self.run, (program or {}).get("imports"))
        # Set by the writer when a rank logs the step key itself: it is the user's key then.
        self.user_step_key = False
        # What wandb's footer shows: the user's keys; none at all after without_footer().
        self._footer_keys: Callable[[str], bool] = lambda key: (
            not (key.startswith("_funnel/") or (key == step_key and not self.user_step_key))
        )
        _footer_of_the_users_keys(self.run, lambda key: not self._footer_keys(key))

    def _degrade(self, capability: str, consequence: str) -> None:
        if capability in self.degraded:
            return
        self.degraded[capability] = consequence
        if self._say is not None:
            version = getattr(self._wandb, "__version__", "?")
            self._say(f"this wandb ({version}) has no {capability}: {consequence}")

    def log(
        self, row: dict[str, Any], staging: Staging | None, step: int | None, commit: bool
    ) -> None:
        log = self.run.log
        if staging is None:
            log(row, step=step, commit=commit)
            return
        out, media_keys = materialize(row, staging, self._make)
        try:
            log(out, step=step, commit=commit)
        except ConnectionError:  # wandb-core gone: the writer stops writing
            raise
        except Exception as exc:  # a media file wandb could not take (FileNotFoundError...)
            # A media value wandb refuses costs its keys (counted), not the row's numbers.
            kept = {k: v for k, v in out.items() if k not in media_keys}
            left_out = len(out) - len(kept)
            staging.dropped += left_out
            staging.logged = max(0, staging.logged - left_out)
            staging.warn(
                f"wandb refused media {sorted(media_keys)!r}: {exc!r}; "
                f"the row is logged without them"
            )
            log(kept, step=step, commit=commit)

    def files(self, data: dict[str, Any], staging: Staging) -> None:
        log_files(data, staging, self.run, self._wandb)

    def users_step_key(self) -> None:
        self.user_step_key = True  # the footer shows that key: it is the user's

    def without_footer(self) -> None:
        """No "Run history:" / "Run summary:" at finish: the program never called finish()
        (its exit hook closes the run), and plain wandb's exit hook prints none."""
        self._footer_keys = lambda key: False

    def update_config(self, data: dict[str, Any]) -> None:
        self.run.config.update(data, allow_val_change=True)  # type: ignore[no-untyped-call]

    def update_summary(self, data: dict[str, Any]) -> None:
        self.run.summary.update(data)

    def define_metric(self, data: dict[str, Any]) -> None:
        self.run.define_metric(**data)

    def stats(self, data: dict[str, Any]) -> None:
        """A ``stats`` record, as wandb-core's sampler writes one (wandb's private interface:
        there is no public way in)."""
        compat.publish_stats(self.run, data, self._degrade)  # without it: said once, left out

    def tensorboard(self, log_dir: str, save: bool, root_dir: str) -> None:
        """A rank's tensorboard log directory, handed to wandb as its own tensorboard patch
        hands it (``Run._tensorboard_callback``: a ``tbrecord``); wandb-core then reads the
        tfevents files from disk into the run. The run's telemetry says ``tensorboard_sync``,
        as plain wandb's does."""
        if not self._tensorboard_synced:
            self._tensorboard_synced = True
            from wandb.sdk.lib import telemetry

            with telemetry.context(run=self.run) as tel:
                tel.feature.tensorboard_sync = True
        self.run._tensorboard_callback(log_dir, save=save, root_logdir=root_dir)

    def output(self, stream: str, text: str, timestamp: float) -> None:
        """An ``output_raw`` record, as wandb's console capture writes one, with the time the
        rank wrote the text (wandb's private interface: there is no public way in)."""
        from wandb.proto import wandb_internal_pb2 as pb

        kind = pb.OutputRawRecord.OutputType  # type: ignore[attr-defined]
        record = pb.OutputRawRecord(  # type: ignore[attr-defined]
            output_type=kind.STDERR if stream == "stderr" else kind.STDOUT, line=text
        )
        record.timestamp.FromNanoseconds(int(timestamp * 1e9))
        if not compat.publish_output_raw(self.run, record, self._degrade):
            raise RuntimeError("this wandb has no interface to publish console records")

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        offline = bool(getattr(self.run, "offline", True))
        for name in _RUN_INFO:
            if name == "url" and offline:
                out[name] = None  # wandb warns "URL not available in offline run" on asking
                continue
            try:
                value = getattr(self.run, name)
            except Exception:  # a property that needs the server (offline): left out
                continue
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    def finish(self, exit_code: int) -> None:
        self.run.finish(exit_code=exit_code)

    def saved_rows(self) -> int:
        return self._tail.history_rows()

    def segment(self) -> dict[str, Any]:
        return {"kind": "wandb", "path": self._tail.path, "dir": self.run.dir}

    def update_run(self, data: dict[str, Any]) -> None:
        """Set as the rank set them: wandb's setters publish the run record again (and
        its telemetry says ``set_run_name`` / ``set_run_tags``, as plain wandb's does)."""
        for attr in ("name", "notes", "tags"):
            if attr in data:
                value = data[attr]
                setattr(self.run, attr, tuple(value) if attr == "tags" else value)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _no_shared_service_notice() -> None:
    """wandb.init prints "Using an existing wandb-core service via WANDB_SERVICE." once per
    process that attaches to a service it did not start: true of the logger, which shares the
    owner's, and nothing the user did (plain wandb does not print it). wandb's own once-flag
    (a private module global) is set, so that notice alone stays off the user's terminal;
    every other message of wandb.init still prints. If a later wandb renames the flag, the
    notice comes back, and nothing else changes."""
    try:
        from wandb.sdk import wandb_init
    except ImportError:
        return
    if hasattr(wandb_init, "_shared_service_notice_shown"):
        wandb_init._shared_service_notice_shown = True


def _record_imports(run: Any, imports: Any) -> None:
    """The training process's imports in the run's telemetry, as wandb.init records its
    caller's (``imports_init``; ``imports_finish``, which wandb's import hooks fill from the
    modules already imported, the same). The logger itself imports none of them."""
    if not isinstance(imports, list) or not imports:
        return
    try:
        from wandb.sdk.lib import telemetry

        names = telemetry.list_telemetry_imports() & {n for n in imports if type(n) is str}
        with telemetry.context(run=run) as tel:
            for name in sorted(names):
                setattr(tel.imports_init, name, True)
                setattr(tel.imports_finish, name, True)
    except Exception:  # telemetry must never cost the run: a later wandb may differ
        pass


def _footer_of_the_users_keys(run: Any, funnels: Callable[[str], bool]) -> None:
    """wandb's end-of-run footer ("Run history:", "Run summary:") shows the run's keys in
    sorted order, at most 10 of each: the funnel's step key on late rows (unless a rank logs
    that key itself) would push the user's own values out (``funnels`` says which keys are
    the funnel's; wandb leaves out ``_funnel/*`` itself, as every key that starts with "_").
    They stay in the run's summary; only the footer leaves them out, so it shows what plain
    wandb's shows (the logger reports any drop on the terminal itself). wandb prints the footer from
    ``_final_summary`` and ``_sampled_history``, which ``_on_finish`` fetches for it alone."""
    on_finish = getattr(run, "_on_finish", None)
    if on_finish is None:
        return

    def on_finish_for_the_users_footer() -> None:
        on_finish()
        for response in (
            getattr(run, "_final_summary", None),
            getattr(run, "_sampled_history", None),
        ):
            if response is None:  # not fetched (a finish that failed): nothing is printed
                continue
            try:
                kept = [item for item in response.item if not funnels(item.key)]
                del response.item[:]
                response.item.extend(kept)
            except Exception:  # absent, or shaped otherwise in a later wandb: as it was
                continue

    run._on_finish = on_finish_for_the_users_footer


@contextlib.contextmanager
def _started_at(start_time: Any) -> Iterator[None]:
    """The run's start time is when the user called wandb.init, not when the logger did.

    wandb.init stamps the run's start as it makes the run (``Run._start_time``, which the run
    record carries: the run's start time; and ``x_start_time``, which names the run's
    directory), and no setting overrides either. The logger's wandb.init runs after the
    logger process has started and imported wandb, a second or more after the user's call
    on a loaded box. So, for this call only, both stamps are the owner's (wandb's private
    names: with a later wandb that renamed them, the logger's own start stands). wandb-core's
    runtime clock is not moved by either (it starts when the run record reaches it: see
    docs/DESIGN.md, item 4g)."""
    try:
        from wandb.sdk.wandb_init import _WandbInit
        from wandb.sdk.wandb_run import Run

        make: Any = _WandbInit.make_run_settings
        run_init: Any = Run.__init__
    except (ImportError, AttributeError):
        make = run_init = None
    if type(start_time) not in (int, float) or make is None or run_init is None:
        yield
        return
    when = float(start_time)

    def make_run_settings(self: Any, init_settings: Any) -> Any:
        settings, warnings = make(self, init_settings)
        if getattr(settings, "x_start_time", None) is not None:
            settings.x_start_time = when
        return settings, warnings

    def init_run(self: Any, *args: Any, **kwargs: Any) -> None:
        run_init(self, *args, **kwargs)
        if hasattr(self, "_start_time"):
            self._start_time = when

    _WandbInit.make_run_settings = make_run_settings  # type: ignore[method-assign]
    Run.__init__ = init_run  # type: ignore[method-assign]
    try:
        yield
    finally:
        _WandbInit.make_run_settings = make  # type: ignore[method-assign]
        Run.__init__ = run_init  # type: ignore[method-assign]
