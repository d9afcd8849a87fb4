"""Where the logger's rows go: the Sink protocol, and the one place that picks the sink.

Three sinks implement it: ``sinks.wandb`` (a real wandb run: the only package, with the
``install()`` layer ``_wandb_module``, that imports wandb), ``sinks.null`` (nothing written:
benchmarks) and ``sinks.recording`` (plain JSON lines: ``wandb_funnel.testing.capture_run``).
``WANDB_FUNNEL_SINK`` in the owner's environment picks one (``null``, ``record:DIR``; unset:
wandb); the logger opens it with ``open_sink`` and the owner asks ``backend()`` for what it
needs before and after the run (a run id, the user's settings and program as plain data, and
wandb-core only where the sink is wandb).

This module imports nothing heavy and never wandb: workers import ``sinks.wandb.objects``
(which reads wandb's media objects without importing wandb), and with it this package.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

from wandb_funnel._constants import ENV_SINK, SINK_RECORD_PREFIX, TRUE_STEP_KEY

WANDB, NULL, RECORD = "wandb", "null", "record"
_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


class Staging(Protocol):
    """The logger's staged media files and their accounting, handed to a sink with a row (or a
    files update) whose values refer to them. The sink counts what it logs and what it drops."""

    logged: int  # media values the run got
    dropped: int  # media values that did not reach the run

    def path_of(self, name: Any) -> str:
        """The staged file ``name``, checked (raises ``BadMediaError``)."""

    def warn(self, message: str) -> None:
        """Say what went wrong on the logger's stderr (each message once)."""


class Sink(Protocol):
    """One run's destination: the write path. Called from the logger's single thread only. A
    call that fails raises: the writer counts and reports it (an ``OSError``: the
    destination is gone). A sink that can also say what is on disk is ``Restartable``."""

    run_id: str
    # The lowest step a row can take: a resumed run's (wandb's ``starting_step``: it drops
    # ``log(step=S)`` below it), else 0.
    starting_step: int
    # The process whose system metrics the destination samples itself (wandb-core's
    # ``x_stats_pid``), None where nothing does: that rank's own figures are not repeated.
    stats_pid: int | None

    def log(
        self, row: dict[str, Any], staging: Staging | None, step: int | None, commit: bool
    ) -> None:
        """Write one history row (already merged and reduced), as ``wandb.log(row,
        step=step, commit=commit)`` would: at ``step`` (None: the run's next step), committed
        or left open for what comes next at that step (``_logger/steps.py`` says which).

        ``staging`` is None for a row of plain values. Otherwise the row's values may be
        ``MediaRef``s (``_protocol.messages``), also inside lists and dicts: the sink makes of
        them what it writes (``sinks.refs.materialize``), counting on ``staging``; a media
        value it cannot write costs that value (counted), never the row's numbers."""

    def files(self, data: dict[str, Any], staging: Staging) -> None:
        """A rank's ``log_artifact`` or ``save`` (a FILES update: ``op`` "artifact" or
        "save", ``entries`` [[name in the run, staged name]], ...). Raises when the files
        did not reach the run; the caller counts them and removes what is still staged."""

    def update_config(self, data: dict[str, Any]) -> None: ...

    def update_summary(self, data: dict[str, Any]) -> None: ...

    def define_metric(self, data: dict[str, Any]) -> None:
        """``run.define_metric(**data)``, as a rank asked for it."""

    def output(self, stream: str, text: str, timestamp: float) -> None:
        """Console text (``stream`` is "stdout" or "stderr"), as wandb's capture records it."""

    def stats(self, data: dict[str, Any]) -> None:
        """A ``stats`` record (system metrics), keys already labelled."""

    def tensorboard(self, log_dir: str, save: bool, root_dir: str) -> None:
        """Watch a rank's tensorboard log directory (a ``tbrecord``, as wandb's
        ``sync_tensorboard`` writes one)."""

    def users_step_key(self) -> None:
        """A rank logged the step key itself: it is the user's key from now on (wandb's
        end-of-run footer shows it, as it shows the user's other keys)."""

    def without_footer(self) -> None:
        """No end-of-run footer ("Run history:"): the program never called ``finish()``
        (its exit hook closes the run), as plain wandb's exit hook prints none."""

    def info(self) -> dict[str, Any]:
        """What ``wandb.run`` tells about itself (name, project, dir, url, ...): plain data."""

    def finish(self, exit_code: int) -> None:
        """Finish the run; the caller bounds how long this may take."""

    def update_run(self, data: dict[str, Any]) -> None:
        """``run.name = ...``, ``run.notes = ...``, ``run.tags = [...]`` as a rank set them
        (a RUN update: ``{"name": str | None, "notes": str | None, "tags": [str, ...]}``,
        the keys set; the values already checked as wandb checks them)."""


@runtime_checkable
class Degradable(Protocol):
    """A sink that may go without a capability its backend lacks (an older wandb's:
    ``sinks/wandb/compat.py``), checked with ``isinstance``: ``degraded`` names each, with
    what going without it costs; the sink has said each once. ``_funnel/wandb_degraded``
    counts them."""

    degraded: dict[str, str]


@runtime_checkable
class Restartable(Protocol):
    """What only a logger's restart needs of a sink, checked with ``isinstance``: a sink
    without it is written as far as the rows go, and a logger that dies with it loses what
    its ranks had not been told is saved (they are told once rows are written)."""

    def saved_rows(self) -> int:
        """How many of the rows ``log`` wrote are safe on disk now (wandb: history records
        in the transaction log, which wandb-core flushes every fraction of a second). The
        logger tells the ranks they may forget records only once their rows are."""

    def segment(self) -> dict[str, Any]:
        """Where this run's rows are on disk, as plain data: a logger restarted after this
        one died reads what it left there (``steps_after``)."""


def steps_after(segment: dict[str, Any], skip: int) -> tuple[int, list[Any], int]:
    """What a dead logger's run left on disk: (how many rows, the step of each row after the
    first ``skip``, the step after its last row). A row's step is its ``_step``, or, for a
    late row (written at the next free step), the step it keeps under ``TRUE_STEP_KEY``.
    ``segment`` is that sink's ``Sink.segment()``."""
    path = str(segment.get("path") or "")
    if segment.get("kind") == RECORD:
        from wandb_funnel.sinks.recording import rows_in

        rows = rows_in(path)
        last = rows[-1].get("_step") if rows else None
        return (
            len(rows),
            [row.get(TRUE_STEP_KEY, row.get("_step")) for row in rows[skip:]],
            last + 1 if type(last) is int else 0,
        )
    if segment.get("kind") == WANDB and path:
        from wandb_funnel.sinks.wandb.txlog import Tail, history_steps

        steps, next_step = history_steps(path, skip)
        return Tail(path).history_rows(), steps, next_step
    return 0, [], 0


def chosen() -> tuple[str, str | None]:
    """The sink ``WANDB_FUNNEL_SINK`` names: (``WANDB``, None), (``NULL``, None or the seconds
    each row takes, ``null:0.001``) or (``RECORD``, the directory)."""
    value = os.environ.get(ENV_SINK, "")
    if value in ("", WANDB):
        return WANDB, None
    if value == NULL:
        return NULL, None
    if value.startswith(f"{NULL}:"):  # null:SECONDS, a sink slow on purpose (tests of a close)
        try:
            if float(value[len(NULL) + 1 :]) >= 0:
                return NULL, value[len(NULL) + 1 :]
        except ValueError:
            pass
    if value.startswith(SINK_RECORD_PREFIX) and value[len(SINK_RECORD_PREFIX) :]:
        return RECORD, value[len(SINK_RECORD_PREFIX) :]
    # A typo must not mean "wandb": a test meant to run without it would start wandb-core.
    raise ValueError(
        f"{ENV_SINK}={value!r:.100}: expected {WANDB!r}, {NULL!r}, '{NULL}:SECONDS' (each "
        f"row takes that long) or '{SINK_RECORD_PREFIX}DIRECTORY'"
    )


class Opening(NamedTuple):
    """How the logger waits for an online run's server (the wandb sink's concern only)."""

    deadline: float  # time.monotonic() by which W&B must answer (the start_timeout)
    on_network_error: str  # "offline": record offline under the same id; "raise"
    # None while the funnel runs; once it is closing, the time (monotonic) by which the run
    # must be open (a server that has not answered is then no longer waited for)
    closing: Callable[[], float | None]


def opens_online(init_kwargs: dict[str, Any]) -> bool:
    """Whether the chosen sink talks to a server when it opens (an online wandb run): the
    logger then opens it in the background, and the owner's start does not wait."""
    if chosen()[0] != WANDB:
        return False
    from wandb_funnel.sinks.wandb.network import is_online

    return is_online(init_kwargs)


def open_sink(
    init_kwargs: dict[str, Any],
    step_key: str,
    program: dict[str, Any] | None,
    stats_pid: int | None,
    say: Callable[[str], None],
    opening: Opening | None = None,
    segment: int = 0,
) -> Sink:
    """Open the run the chosen sink writes (in the logger). ``init_kwargs`` are wandb.init's,
    as plain data; ``program`` the user's (``Backend.program``); ``stats_pid`` the process
    the run's system metrics measure; ``say`` prints a diagnostic. With ``opening``, an online
    run waits for its server as it says (``sinks.wandb.network``): offline under the same id
    when the server does not answer in time, unless ``on_network_error="raise"``.
    ``segment`` counts the logger restarts before this one (the run is continued).

    Raises:
        NetworkUnavailableError: (a ``ConnectionError``) W&B did not answer, and ``opening``
            says to raise.
    """
    kind, directory = chosen()
    if kind == NULL:  # the funnel alone, no wandb
        from wandb_funnel.sinks.null import NullSink

        say(f"{ENV_SINK}=null: rows are counted, not written (benchmarks only)")
        return NullSink(init_kwargs["id"], float(directory or 0))
    if kind == RECORD:  # testing.capture_run(): no wandb
        from wandb_funnel.sinks.recording import RecordingSink

        assert directory is not None
        return RecordingSink(directory, init_kwargs, segment)
    from wandb_funnel.sinks.wandb.run import WandbSink  # here: the other sinks never load wandb

    if opening is None or not opens_online(init_kwargs):
        return WandbSink(init_kwargs, step_key, program, stats_pid, say)
    from wandb_funnel.sinks.wandb.network import open_online

    def init(overrides: dict[str, Any]) -> WandbSink:
        return WandbSink({**init_kwargs, **overrides}, step_key, program, stats_pid, say)

    sink, _ = open_online(
        init, init_kwargs, opening.deadline, opening.on_network_error, opening.closing, say
    )
    return sink  # type: ignore[no-any-return]


def warm_up() -> None:
    """Import what the chosen sink needs to open a run (wandb: 0.5 s), ahead of its start
    message: a logger started ahead of time (``_owner/prewarm.py``) does it while it waits."""
    if chosen()[0] == WANDB:
        from wandb_funnel.sinks.wandb.service import import_wandb

        import_wandb()


def shut_down_own_service(timeout: float, exit_code: int) -> bool:
    """In the logger: shut down the wandb-core it started (its runs are finished), waiting at
    most ``timeout`` seconds, so that wandb-core writes the end of every transaction log
    before it exits. The logger leaves through ``os._exit``, which skips wandb's own exit
    hook; without this the core sees its parent gone and stops without its last flush (the
    summary and exit record of a run finished a moment before). No-op where wandb was never
    loaded (the null and recording sinks)."""
    import sys

    if "wandb" not in sys.modules:
        return True
    from wandb_funnel.sinks.wandb.service import teardown_service

    return teardown_service(timeout, exit_code)


def generate_run_id() -> str:
    """An 8-character id like wandb's own, made without importing wandb."""
    import secrets  # here: it loads hashlib and OpenSSL, which a worker never needs

    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))


class Backend:
    """What the owner needs of the chosen sink's side, before and after the run: a run id, the
    user's ``wandb.init`` settings and program as plain data for the logger (whatever the
    sink: they are what the user handed to wandb). wandb-core is the logger's own."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def run_id(self) -> str:
        return generate_run_id()

    def settings(self, settings: Any) -> dict[str, Any]:
        """A ``wandb.Settings`` (or a dict) as the plain dict that travels to the logger."""
        from wandb_funnel.sinks.wandb.settings import settings_to_dict

        return settings_to_dict(settings)

    def program(self, start_time: float | None) -> dict[str, Any]:
        """What ``wandb.init`` would record as this process's program, arguments and imports,
        for the logger's run to record instead of its own."""
        from wandb_funnel.sinks.wandb.settings import user_program

        return user_program(start_time)


def backend() -> Backend:
    """The owner's side of the sink ``WANDB_FUNNEL_SINK`` picks, as it is now."""
    return Backend(chosen()[0])
