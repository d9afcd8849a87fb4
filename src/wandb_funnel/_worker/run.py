"""``wf.Run``: what ``wf.init`` returns; one rank's view of the single wandb run."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, NamedTuple

from wandb_funnel import _pid
from wandb_funnel._constants import (
    DEFAULT_MAX_MEDIA_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_REPLAY_MAX_BYTES,
    DEFAULT_REPLAY_MAX_RECORDS,
    DEFAULT_STATS_INTERVAL,
    ENV_ADDRESS,
    ENV_CONSOLE,
    ENV_CURVE,
    ENV_HOST,
    ENV_LOGGER_PID,
    ENV_MAX_MEDIA_BYTES,
    ENV_MAX_RECORD_BYTES,
    ENV_REPLAY,
    ENV_RUN_ID,
    ENV_RUN_INFO,
    ENV_STATS_INTERVAL,
    ENV_TOKEN,
    FINAL_FLUSH_TIMEOUT,
    RUN_INFO_FILE,
    RUN_INFO_TIMEOUT,
    WELCOME_TIMEOUT,
)
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import (
    CONFIG,
    FILES,
    METRIC,
    RUN,
    SUMMARY,
    TENSORBOARD,
    UpdateKind,
)
from wandb_funnel._worker import console, files, media, system
from wandb_funnel._worker.lifecycle import exit_code_from_exception, signals_held
from wandb_funnel._worker.run_data import Config, Summary, run_tags, run_text
from wandb_funnel._worker.stream import Stream
from wandb_funnel.errors import ClientClosedError, FunnelWarning

# The call a finished run refuses, by update kind, named as wandb names it in its error.
_UPDATE_CALLS = {
    CONFIG: "_config_callback",
    SUMMARY: "_summary_update_callback",
    METRIC: "define_metric",
}


def _float(text: str | None, default: float) -> float:
    try:
        return float(text) if text else default
    except ValueError:
        return default


def _replay(text: str | None) -> tuple[int, int]:
    records, _, size = (text or "").partition(",")
    size = size.partition(",")[0]
    if records.isdigit() and size.isdigit() and int(records) and int(size):
        return int(records), int(size)
    return DEFAULT_REPLAY_MAX_RECORDS, DEFAULT_REPLAY_MAX_BYTES


class AttachInfo(NamedTuple):
    """Everything a process needs to reach a funnel; what a pickled Run carries."""

    address: str
    token: str
    run_id: str
    max_record_bytes: int
    logger_pid: int | None = None
    logger_host: str | None = None
    curve: dict[str, str] | None = None  # client CURVE keys, when the logger listens on TCP
    run_info: dict[str, Any] | None = None  # the open run's name, project, dir, url, ...
    max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    console: bool = True  # copy this process's stdout/stderr to the run (console != "off")
    stats_interval: float = DEFAULT_STATS_INTERVAL  # system metrics every so many seconds
    # A rank's replay buffer bound (records, bytes): see FunnelOptions.replay_max_records
    replay: tuple[int, int] = (DEFAULT_REPLAY_MAX_RECORDS, DEFAULT_REPLAY_MAX_BYTES)
    restarts: bool = False  # the owner restarts a logger that dies (max_logger_restarts > 0)

    def to_env(self) -> dict[str, str]:
        """The WANDB_FUNNEL_* variables that let processes started later attach."""
        env = {
            ENV_ADDRESS: self.address,
            ENV_TOKEN: self.token,
            ENV_RUN_ID: self.run_id,
            ENV_MAX_RECORD_BYTES: str(self.max_record_bytes),
            ENV_MAX_MEDIA_BYTES: str(self.max_media_bytes),
            ENV_CONSOLE: "1" if self.console else "0",
            ENV_STATS_INTERVAL: repr(float(self.stats_interval)),
            ENV_REPLAY: f"{self.replay[0]},{self.replay[1]},{int(self.restarts)}",
        }
        if self.logger_pid is not None:
            env[ENV_LOGGER_PID] = str(self.logger_pid)
        if self.logger_host is not None:
            env[ENV_HOST] = self.logger_host
        if self.curve:
            env[ENV_CURVE] = json.dumps(self.curve)
        if self.run_info:
            env[ENV_RUN_INFO] = json.dumps(self.run_info)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AttachInfo | None:
        """The funnel named by WANDB_FUNNEL_* in ``environ``, if any."""
        address = environ.get(ENV_ADDRESS)
        token = environ.get(ENV_TOKEN)
        if not address or token is None:
            return None
        pid = environ.get(ENV_LOGGER_PID, "")
        curve = environ.get(ENV_CURVE)
        run_info = environ.get(ENV_RUN_INFO)
        return cls(
            address=address,
            token=token,
            run_id=environ.get(ENV_RUN_ID, ""),
            max_record_bytes=int(environ.get(ENV_MAX_RECORD_BYTES, DEFAULT_MAX_RECORD_BYTES)),
            logger_pid=int(pid) if pid.isdigit() else None,
            logger_host=environ.get(ENV_HOST),
            curve=json.loads(curve) if curve else None,
            run_info=json.loads(run_info) if run_info else None,
            max_media_bytes=int(environ.get(ENV_MAX_MEDIA_BYTES, DEFAULT_MAX_MEDIA_BYTES)),
            console=environ.get(ENV_CONSOLE, "1") != "0",
            stats_interval=_float(environ.get(ENV_STATS_INTERVAL), DEFAULT_STATS_INTERVAL),
            replay=_replay(environ.get(ENV_REPLAY)),
            restarts=environ.get(ENV_REPLAY, "").endswith(",1"),
        )


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(what: str, message: str) -> None:
    """Warn about ``what`` the first time only, in this process."""
    with _warned_lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(f"wandb-funnel: {message}", FunnelWarning, stacklevel=4)


class Run:
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
        self._step = 0
        self._finished = False
        self._config = Config(self._send_config)
        self._summary = Summary(self._send_summary)
        # What this process set with run.name / notes / tags: what it reads back from then on.
        self._set_here: dict[str, Any] = {}

    # -- identity ----------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The wandb run id (the same in every process of the funnel)."""
        return self._info.run_id

    @property
    def rank(self) -> int | None:
        """This stream's rank (asks the logger once when it was assigned; None if it never said)."""
        return self._live_stream().rank(WELCOME_TIMEOUT)

    @property
    def step(self) -> int:
        """The step the next ``log(data)`` without ``step=`` goes to."""
        return self._step

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

    # What the logger's run told about itself when it opened (wandb.Run's properties).
    # An online run opens in the background (its start does not wait for the network): until
    # it has, its name, dir and url are not known, and reading one waits for them, bounded,
    # as plain wandb.init would have waited before returning the run.
    def _run_info(self, key: str, default: Any = None) -> Any:
        if key in self._set_here:
            return self._set_here[key]
        info = self._info.run_info
        if info is None:
            info = self._fetch_run_info()
            if info is not None:
                self._info = self._info._replace(run_info=info)
        return (info or {}).get(key, default)

    def _fetch_run_info(self) -> dict[str, Any] | None:
        """Asked on this process's stream, if it has one; read from the logger's file on its
        node otherwise: reading a property must not make a process a rank."""
        stream = self._stream
        address = self._info.address
        if (stream is None or stream.pid != os.getpid()) and address.startswith("ipc://"):
            path = os.path.join(os.path.dirname(address[len("ipc://") :]), RUN_INFO_FILE)
            return _wait_for_json(path, RUN_INFO_TIMEOUT, self._info.logger_pid)
        return self._live_stream().fetch_run_info(RUN_INFO_TIMEOUT)

    @property
    def name(self) -> str | None:
        return self._run_info("name")  # type: ignore[no-any-return]

    @name.setter
    def name(self, name: str | None) -> None:
        """The run's display name, as ``wandb.Run.name = ...`` sets it, from any rank.

        Raises:
            ValueError: not a str or None (wandb's settings refuse it too).
        """
        self._set_run_attribute("name", lambda: run_text("name", name))

    @property
    def project(self) -> str:
        return str(self._run_info("project", ""))

    @property
    def entity(self) -> str:
        return str(self._run_info("entity", ""))

    @property
    def dir(self) -> str:
        """The run's files directory (on the logger's host)."""
        return str(self._run_info("dir", ""))

    @property
    def url(self) -> str | None:
        return self._run_info("url")  # type: ignore[no-any-return]

    def get_url(self) -> str | None:
        return self.url

    @property
    def path(self) -> str:
        return f"{self.entity}/{self.project}/{self.id}"

    @property
    def group(self) -> str:
        return str(self._run_info("group") or "")

    @property
    def job_type(self) -> str:
        return str(self._run_info("job_type") or "")

    @property
    def notes(self) -> str | None:
        return self._run_info("notes")  # type: ignore[no-any-return]

    @notes.setter
    def notes(self, notes: str | None) -> None:
        """The run's notes, as ``wandb.Run.notes = ...`` sets them, from any rank.

        Raises:
            ValueError: not a str or None (wandb's settings refuse it too).
        """
        self._set_run_attribute("notes", lambda: run_text("notes", notes))

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(self._run_info("tags") or ())

    @tags.setter
    def tags(self, tags: Iterable[str]) -> None:
        """The run's tags, as ``wandb.Run.tags = [...]`` sets them, from any rank: a tag
        that is not a str of 1 to 64 characters is warned about, as wandb warns, and the run
        keeps the tags it had.

        Raises:
            TypeError: ``tags`` is not iterable (wandb's ``tuple(tags)`` raises it too).
        """

        def checked() -> tuple[str, ...] | None:
            value, why = run_tags(tags)
            if value is None:
                self._invalid_tags(why)
            return value

        self._set_run_attribute("tags", checked)

    def _set_run_attribute(self, attr: str, check: Callable[[], Any]) -> None:
        """Set ``attr`` (name, notes, tags) to what ``check()`` makes of the value the user
        gave (None for tags: left as they were): read back from now on in this process,
        applied to the run by the logger. A finished run refuses first, as wandb's does."""
        if self._finished:
            raise self._finished_error(attr)
        value = check()
        if value is None and attr == "tags":
            return
        self._set_here[attr] = value
        self._send_update(RUN, {attr: list(value) if isinstance(value, tuple) else value})

    def _invalid_tags(self, why: str) -> None:
        """Tags the run does not take: said as wandb says it (an installed run prints it
        as wandb's own warning)."""
        warnings.warn(
            f"wandb_funnel: Invalid tag detected: {why} Tags not updated.",
            FunnelWarning,
            stacklevel=5,
        )

    @property
    def offline(self) -> bool:
        return bool(self._run_info("offline", True))

    @property
    def disabled(self) -> bool:
        return False

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
        try:
            frame = codec.encode_record(at, committed, data, self._max_record_bytes)
        except TypeError:
            if not media.contains_media(data):
                raise
            frame = self._encode_with_media(at, committed, data, stream)
        self._step = after
        stream.push(frame)

    def _media_stager(self) -> media.Stager:
        stager = self._stager
        if stager is None or stager.pid != os.getpid():
            directory = media.staging_dir_for(self._info.address)
            stager = self._stager = media.Stager(
                directory, self._info.max_media_bytes, remote=directory is None
            )
        return stager

    def _encode_with_media(
        self, step: int, committed: bool, data: dict[str, Any], stream: Stream
    ) -> bytes:
        """A record holding media: files staged, descriptors packed (``_worker/media.py``).
        From another node the files' bytes are sent now, once the record is good, ahead of
        it: a file that does not fit the queue is then missing at the logger (counted)."""
        enc = self._media_stager().encoding()
        try:
            frame = codec.encode_record(step, committed, data, self._max_record_bytes, enc.default)
        except BaseException:
            enc.rollback()
            raise
        for name, blob in enc.blobs:
            stream.send_blob(name, blob)
        return frame

    # -- files -------------------------------------------------------------------------------
    def log_artifact(
        self,
        artifact_or_path: Any,
        name: str | None = None,
        type: str | None = None,  # noqa: A002  (wandb's own argument name)
        aliases: list[str] | None = None,
        tags: list[str] | None = None,
    ) -> Any:
        """``wandb.Run.log_artifact`` from any rank: a file, a directory or a
        ``wandb.Artifact`` (its local files and references) becomes an artifact of the run.
        Returns the artifact it was given (None for a path).

        Raises:
            ValueError: a path that does not exist.
            TypeError: neither a path nor a wandb.Artifact.
        """
        self._send_files(
            "log_artifact",
            lambda stager, enc: files.artifact_update(
                stager, artifact_or_path, name, type, aliases, tags, self.id, enc
            ),
        )
        return None if isinstance(artifact_or_path, (str, os.PathLike)) else artifact_or_path

    def log_model(
        self, path: Any, name: str | None = None, aliases: list[str] | None = None
    ) -> None:
        """``wandb.Run.log_model``: a model artifact from a file or directory."""
        self.log_artifact(path, name=name, type="model", aliases=aliases)

    def save(
        self,
        glob_str: str | bytes | os.PathLike[str],
        base_path: str | os.PathLike[str] | None = None,
        policy: str = "live",
        glob: bool = True,
    ) -> bool | list[str]:
        """``wandb.Run.save`` from any rank, resolved as wandb 0.31 resolves it
        (``files.plan_save``): a relative glob and ``base_path`` from this process's working
        directory; the same errors, terminal lines and names in the run's files directory;
        and the same return value: those files' paths in ``run.dir`` (the logger puts them
        there just after the call).

        Each matching file is copied now, a snapshot, where wandb symlinks it; a later
        change reaches the run when ``save`` is called again (wandb's own advice when it has
        to copy). ``"live"`` and ``"now"``: the copy reaches the run now; ``"live"`` stays
        ``"live"`` in the run's records, as plain's. ``"end"``: the copy is uploaded when the
        run finishes (the file as it was at the call, not as it is at the end).

        A file that cannot be carried (from a rank on another node, a directory, a file
        gone or unreadable) is warned about here and counted in ``_funnel/dropped_files``;
        it is not in the returned list.

        Raises:
            ValueError: wandb's: a bad policy; a glob above, or the same as, ``base_path``,
                or that starts with ``*`` under it.
        """
        if self._finished:
            raise self._finished_error("save")
        wandb = files.installed_wandb(self)
        notes: list[files.Note] = []
        try:
            plan = files.plan_save(glob_str, base_path, policy, glob, notes)
        finally:
            files.say(notes, wandb)  # what wandb prints before raising, too
        if plan is None:
            return []  # a cloud URL: wandb says so and saves nothing
        stager = self._media_stager()
        files_root = self.dir if stager.directory is not None else ""  # its node only
        existing = files.already_in_run(files_root, plan)
        enc = stager.encoding()
        try:
            data, failed = files.save_update(stager, plan, policy, enc)
            sent = stager.directory is None or self._send_update(FILES, data)
        except BaseException:
            enc.rollback()
            raise
        if not sent:  # the queue was full: said by the stream; nothing of it stays staged
            enc.rollback()
            return []
        if data["entries"] and wandb is not None:  # where wandb says "Symlinked 1 file ..."
            files.say([files.copied_note(len(data["entries"]))], wandb)
        if failed:
            update = files.not_saved_update(failed)
            warnings.warn(
                f"wandb_funnel: save({os.fspath(glob_str)!r}): {update['why']}; counted in "
                f"the run's summary as _funnel/dropped_files",
                FunnelWarning,
                stacklevel=2,
            )
            self._send_update(FILES, update)
        import pathlib

        names = {pathlib.PurePath(entry) for entry, _ in data["entries"]}
        names.update(pathlib.PurePath(name) for name in existing)
        return [os.path.join(files_root, name) for name in sorted(names)]

    def _send_files(
        self, what: str, make: Callable[[media.Stager, media.Encoding], dict[str, Any]]
    ) -> None:
        stager = self._media_stager()
        enc = stager.encoding()
        try:
            data = make(stager, enc)
        except files.FilesRefusedError as exc:
            warnings.warn(
                f"wandb_funnel: {what}() was not carried: {exc}", FunnelWarning, stacklevel=3
            )
            data = {"op": "refused", "what": what, "why": str(exc)}
        except BaseException:
            enc.rollback()
            raise
        try:
            sent = self._send_update(FILES, data)
        except BaseException:
            enc.rollback()
            raise
        if not sent:  # the queue was full: said by the stream; nothing of it stays staged
            enc.rollback()

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


def _wait_for_json(path: str, timeout: float, logger_pid: int | None) -> dict[str, Any] | None:
    """The JSON object at ``path`` once it is there (written whole by the logger), waiting at
    most ``timeout`` seconds, and not at all once the logger is known to be gone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else None
        except FileNotFoundError:
            pass
        except (OSError, ValueError):
            return None
        gone = logger_pid is not None and not _pid.pid_alive(logger_pid)
        if gone or time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
