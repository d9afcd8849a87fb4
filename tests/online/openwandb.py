"""A test-only OpenWandb server: installed on demand, started on 127.0.0.1, read back from disk.

OpenWandb (``openwandb``, CC-BY-NC-4.0) is a third-party W&B-compatible server. It is **never**
a dependency of wandb-funnel: it lives in a venv of its own, ``<repo>/.venv-openwandb``, made
on first use from ``tests/online/server-requirements.txt`` (every version pinned), under a
file lock so that concurrent test sessions make it once. ``WANDB_FUNNEL_OPENWANDB`` may name
an existing ``openwandb`` executable, or a venv holding one, instead.

    server = OpenWandb(data_dir).start()          # `openwandb init`, then `openwandb serve`
    env = server.env()                             # WANDB_MODE, WANDB_BASE_URL, WANDB_API_KEY
    ...                                            # run wandb (or the funnel) with env
    run = server.run("project", run_id)            # what ARRIVED on the server: a ServerRun
    server.pause(); server.resume()                # SIGSTOP / SIGCONT: a server that stalls
    server.restart()                               # killed, back on the same port and data
    server.stop()

Where OpenWandb 0.5.25 keeps a run (``D`` is the data directory; the entity is ``default``):

- ``D/openwandb.db`` (SQLite), table ``runs`` (``run_id`` unique across projects):
  ``state`` is ``running`` until a filestream request with ``complete: true`` arrives, then
  ``finished``, whatever the exit code; ``config_json`` is the config of the last
  ``upsertBucket`` (wandb's ``{key: {"value": v}}`` form, ``_wandb`` included);
  ``summary_json`` merges the filestream's ``wandb-summary.json`` lines, numbers, strings and
  booleans only (media and nested values are dropped).
- ``D/files/<entity>/<project>/<run id>/``: ``wandb-history.jsonl`` (the filestream's history
  lines, appended as they arrive: a line sent twice is stored twice), and every file wandb
  uploads with ``PUT`` (``output.log``, ``wandb-summary.json``, ``config.yaml``,
  ``wandb-metadata.json``, ``requirements.txt``, ``media/...``), each overwritten by its
  upload. ``output.log`` mixes two writers: the upload at ``finish`` replaces the file, and
  the filestream's console lines (with their timestamps) are appended, before or after it.
  wandb-core (plain or funnel) uploads it before its last filestream request, so that
  request's lines follow the upload, stamped: every line of a run shorter than the 15 s
  filestream interval is stored twice (``soak/online_console_repeat.py``).
- The exit code is **not stored**: the filestream's last request carries ``exitcode``, and
  OpenWandb ignores it. The fault proxy (``fault_proxy.py``) records it as it passes; give
  ``run()`` the proxy to fill ``ServerRun.exit_code``.
- ``wandb.Api()`` reads do not work against OpenWandb: read the disk, as this module does.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.online.fault_proxy import FaultProxy

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
REQUIREMENTS = HERE / "server-requirements.txt"
VENV = REPO / ".venv-openwandb"
ENV_VAR = "WANDB_FUNNEL_OPENWANDB"
ENTITY = "default"  # OpenWandb's default team, the entity of every run here
API_KEY = "local" + "0" * 40  # any key of this form is accepted
INSTALL_TIMEOUT = 900.0


class OpenWandbUnavailableError(RuntimeError):
    """OpenWandb could not be installed or started; the message says why (and how to fix)."""


# ---- the server's venv ----------------------------------------------------------------------
def openwandb_executable(install_timeout: float = INSTALL_TIMEOUT) -> pathlib.Path:
    """The ``openwandb`` executable: ``$WANDB_FUNNEL_OPENWANDB`` (an executable, or a venv
    with ``bin/openwandb``) if set, else ``<repo>/.venv-openwandb/bin/openwandb``, made from
    ``server-requirements.txt`` if it is missing or was made from another version of that
    file. Raises ``OpenWandbUnavailableError``."""
    named = os.environ.get(ENV_VAR)
    if named:
        path = pathlib.Path(named).expanduser()
        for candidate in (path, path / "bin" / "openwandb"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        raise OpenWandbUnavailableError(
            f"{ENV_VAR}={named} names neither an openwandb executable nor a venv with "
            "bin/openwandb; unset it to have the tests install OpenWandb into "
            f"{VENV} from {REQUIREMENTS.relative_to(REPO)}"
        )
    return ensure_venv(VENV, REQUIREMENTS, install_timeout)


def _requirements_digest(requirements: pathlib.Path) -> str:
    return hashlib.sha256(requirements.read_bytes()).hexdigest()


def ensure_venv(
    venv: pathlib.Path, requirements: pathlib.Path, timeout: float = INSTALL_TIMEOUT
) -> pathlib.Path:
    """``venv/bin/openwandb``, installing ``requirements`` into a fresh ``venv`` first unless
    ``venv`` was made from these very requirements. Concurrent callers (test sessions, pytest
    workers) wait on one file lock: one installs, the others find it made."""
    exe = venv / "bin" / "openwandb"
    stamp = venv / ".requirements.sha256"
    digest = _requirements_digest(requirements)
    lock_path = venv.with_name(venv.name + ".lock")
    with open(lock_path, "a") as lock:
        deadline = time.monotonic() + timeout
        while True:  # bounded: a stuck installer elsewhere does not hang this one forever
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OpenWandbUnavailableError(
                        f"another process held {lock_path} for {timeout:.0f}s (installing "
                        f"OpenWandb?); remove {venv} and the lock if nothing is"
                    ) from None
                time.sleep(0.5)
        try:
            if exe.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
                return exe
            _install(venv, requirements, deadline)
            stamp.write_text(digest + "\n")
            return exe
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _install(venv: pathlib.Path, requirements: pathlib.Path, deadline: float) -> None:
    if venv.exists():
        shutil.rmtree(venv)
    # A venv without pip of its own (ensurepip alone took 8 s), filled by the test
    # environment's pip; the requirements are a whole pip freeze, so no resolving (--no-deps),
    # and no byte-compiling of what the server imports once: 26 s -> 15 s on 2 cores.
    steps = [
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-compile",
            "-r",
            str(requirements),
        ],
    ]
    for argv in steps:
        left = deadline - time.monotonic()
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=max(left, 1.0), check=False
            )
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(venv, ignore_errors=True)
            raise OpenWandbUnavailableError(
                f"installing OpenWandb: {' '.join(argv)} took longer than {exc.timeout:.0f}s"
            ) from None
        if proc.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise OpenWandbUnavailableError(
                f"installing OpenWandb (the online tests' server) failed: {' '.join(argv)} "
                f"exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n"
                f"(or set {ENV_VAR} to an openwandb executable)"
            )


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1 just now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- what arrived -------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerRun:
    """One run as OpenWandb stored it (see the module's docstring for where each part lives)."""

    entity: str
    project: str
    run_id: str
    display_name: str
    state: str  # "running", or "finished" once a filestream request said complete
    history: list[dict[str, Any]]  # wandb-history.jsonl, one dict a line, in arrival order
    summary: dict[str, Any]  # runs.summary_json: the filestream's scalar summary values
    summary_file: dict[str, Any] | None  # the uploaded wandb-summary.json (at finish)
    config: dict[str, Any]  # runs.config_json unwrapped ({key: value}), without _wandb
    config_raw: dict[str, Any]  # runs.config_json as stored ({key: {"value": v}}, _wandb)
    files: dict[str, int]  # every file under the run's directory: relative path -> size
    exit_code: int | None  # as the fault proxy saw it arrive (OpenWandb does not keep it)
    directory: pathlib.Path = field(repr=False)

    @property
    def steps(self) -> list[int]:
        """``_step`` of every history line, in arrival order (duplicates kept)."""
        return [int(row["_step"]) for row in self.history if "_step" in row]

    @property
    def output_log(self) -> str | None:
        """``output.log`` as stored (the upload and the filestream's lines: see above)."""
        path = self.directory / "output.log"
        return path.read_text(errors="replace") if path.is_file() else None

    def read(self, name: str) -> bytes:
        """A stored file of the run, by its path relative to the run's directory."""
        return (self.directory / name).read_bytes()


class OpenWandb:
    """One OpenWandb server on 127.0.0.1, in a process group of its own."""

    def __init__(
        self,
        data_dir: pathlib.Path,
        *,
        executable: pathlib.Path | None = None,
        port: int | None = None,
        log_path: pathlib.Path | None = None,
    ) -> None:
        self.data_dir = pathlib.Path(data_dir).resolve()
        self.executable = executable
        self._fixed_port = port
        self.port = port or 0
        self.log_path = log_path or self.data_dir.with_name(self.data_dir.name + "-server.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    # -- lifecycle --
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db_path(self) -> pathlib.Path:
        return self.data_dir / "openwandb.db"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "OPENWANDB_"))}
        # OpenWandb's config module makes its data directory on import: keep it off $HOME.
        env["OPENWANDB_DATA_DIR"] = str(self.data_dir)
        return env

    def start(self, timeout: float = 60.0) -> OpenWandb:
        """Install if needed, ``openwandb init`` once, serve, and wait until ``GET /`` is 200."""
        if self.executable is None:
            self.executable = openwandb_executable()
        if not self.db_path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            proc = subprocess.run(
                [str(self.executable), "init", "--data-dir", str(self.data_dir)],
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            if proc.returncode != 0:
                raise OpenWandbUnavailableError(
                    f"openwandb init exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
                )
        for _attempt in range(3):  # a free port can be taken before the server binds it
            if not self._fixed_port:
                self.port = free_port()
            if self._serve(timeout):
                return self
            if self._fixed_port:
                break
        raise OpenWandbUnavailableError(
            f"openwandb serve did not answer GET {self.url}/ within {timeout:.0f}s\n"
            + self.log_tail()
        )

    def _serve(self, timeout: float) -> bool:
        assert self.executable is not None
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes it; closed below
        try:
            self.proc = subprocess.Popen(
                [
                    str(self.executable),
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "--data-dir",
                    str(self.data_dir),
                ],
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as one
            )
        finally:
            log.close()
        self.paused = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if self.answers():
                return True
            time.sleep(0.1)
        self._kill()
        return False

    def answers(self, timeout: float = 1.0) -> bool:
        """Whether ``GET /`` answers 200 now."""
        try:
            with urllib.request.urlopen(self.url + "/", timeout=timeout) as resp:
                return int(resp.status) == 200
        except (OSError, urllib.error.URLError):
            return False

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def _kill(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        self.proc = None
        self.paused = False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the server's process group, then SIGKILL after ``timeout``."""
        if self.proc is None:
            return
        self._signal(signal.SIGTERM)
        if self.paused:
            self._signal(signal.SIGCONT)  # a stopped process acts on SIGTERM once continued
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self._kill(timeout)

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel, nothing is answered."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def restart(self, down_for: float = 0.0, timeout: float = 60.0) -> None:
        """Kill the server (SIGKILL: nothing flushed), stay down ``down_for`` seconds, and
        serve again on the same port and data directory."""
        self._kill()
        if down_for > 0:
            time.sleep(down_for)
        if not self._serve(timeout):
            raise OpenWandbUnavailableError(
                f"openwandb did not come back on {self.url}\n{self.log_tail()}"
            )

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no server log)"

    def __enter__(self) -> OpenWandb:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- clients --
    def env(self, base_url: str | None = None) -> dict[str, str]:
        """What a wandb process needs to run online against this server (or ``base_url``, a
        proxy in front of it)."""
        return {
            "WANDB_MODE": "online",
            "WANDB_BASE_URL": base_url or self.url,
            "WANDB_API_KEY": API_KEY,
        }

    # -- read-back --
    def _query(self, sql: str, args: tuple[Any, ...]) -> list[sqlite3.Row]:
        # Read-only, and a fresh connection each time: the server writes between reads.
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10)
        try:
            conn.row_factory = sqlite3.Row
            return list(conn.execute(sql, args))
        finally:
            conn.close()

    def run_ids(self, project: str, entity: str = ENTITY) -> list[str]:
        """The ids of the project's runs the server has, oldest first."""
        rows = self._query(
            "SELECT r.run_id FROM runs r JOIN projects p ON r.project_id = p.id "
            "JOIN teams t ON p.team_id = t.id WHERE t.name = ? AND p.name = ? ORDER BY r.id",
            (entity, project),
        )
        return [str(r["run_id"]) for r in rows]

    def run(
        self,
        project: str,
        run_id: str,
        entity: str = ENTITY,
        proxy: FaultProxy | None = None,
    ) -> ServerRun:
        """What arrived on the server for one run; ``proxy`` (the fault proxy the run went
        through) supplies the exit code. Raises ``LookupError`` if the server has no such
        run."""
        rows = self._query(
            "SELECT r.* FROM runs r JOIN projects p ON r.project_id = p.id "
            "JOIN teams t ON p.team_id = t.id "
            "WHERE t.name = ? AND p.name = ? AND r.run_id = ?",
            (entity, project, run_id),
        )
        if not rows:
            raise LookupError(f"OpenWandb has no run {entity}/{project}/{run_id}")
        row = rows[0]
        directory = self.data_dir / "files" / entity / project / run_id
        history: list[dict[str, Any]] = []
        history_path = directory / "wandb-history.jsonl"
        if history_path.is_file():
            for line in history_path.read_text().splitlines():
                if line.strip():
                    history.append(json.loads(line))
        summary_path = directory / "wandb-summary.json"
        summary_file = json.loads(summary_path.read_text()) if summary_path.is_file() else None
        config_raw: dict[str, Any] = json.loads(row["config_json"] or "{}")
        config = {
            k: (v["value"] if isinstance(v, dict) and "value" in v else v)
            for k, v in config_raw.items()
            if k != "_wandb"
        }
        files = (
            {
                str(p.relative_to(directory)): p.stat().st_size
                for p in sorted(directory.rglob("*"))
                if p.is_file()
            }
            if directory.is_dir()
            else {}
        )
        return ServerRun(
            entity=entity,
            project=project,
            run_id=run_id,
            display_name=str(row["display_name"]),
            state=str(row["state"]),
            history=history,
            summary=json.loads(row["summary_json"] or "{}"),
            summary_file=summary_file,
            config=config,
            config_raw=config_raw,
            files=files,
            exit_code=None if proxy is None else proxy.exit_codes().get(run_id),
            directory=directory,
        )

    def runs(
        self, project: str, entity: str = ENTITY, proxy: FaultProxy | None = None
    ) -> list[ServerRun]:
        return [self.run(project, r, entity, proxy) for r in self.run_ids(project, entity)]

    def wait_for_run(
        self,
        project: str,
        run_id: str,
        until: Callable[[ServerRun], bool],
        timeout: float = 30.0,
        proxy: FaultProxy | None = None,
    ) -> ServerRun:
        """Poll ``run()`` until ``until(run)`` holds; the last read after ``timeout`` (the
        caller's assertion then says what was missing)."""
        deadline = time.monotonic() + timeout
        last: ServerRun | None = None
        while True:
            with contextlib.suppress(LookupError):
                last = self.run(project, run_id, proxy=proxy)
                if until(last):
                    return last
            if time.monotonic() > deadline:
                if last is None:
                    raise LookupError(f"OpenWandb has no run {project}/{run_id} after {timeout}s")
                return last
            time.sleep(0.2)
