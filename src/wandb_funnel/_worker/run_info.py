"""The attributes of wandb's Run that a funnel's Run answers from the run itself: ``name``,
``project``, ``dir``, ``url``, ``tags`` and the rest, as the logger's run told them when it
opened, and the ones any rank may set (``name``, ``notes``, ``tags``, as wandb sets them).

An online run opens in the background (its start does not wait for the network): until it
has, its name, dir and url are not known, and reading one waits for them, bounded, as plain
``wandb.init`` would have waited before returning the run.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from wandb_funnel import _pid, _private_dir
from wandb_funnel._constants import RUN_INFO_TIMEOUT
from wandb_funnel._protocol.messages import RUN
from wandb_funnel._worker.run_data import run_tags, run_text
from wandb_funnel._worker.run_updates import RunUpdates
from wandb_funnel.errors import FunnelWarning

if TYPE_CHECKING:
    from wandb_funnel._worker.stream import Stream


class RunInfo(RunUpdates):
    """wandb's Run attributes of ``wf.Run`` (a base of it; ``Run`` holds the state)."""

    _set_here: dict[str, Any]  # what this process set: what it reads back from then on
    _stream: Stream | None

    @property
    def id(self) -> str:
        """The wandb run id (the same in every process of the funnel)."""
        return self._info.run_id

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
        directory = _private_dir.of_address(address)
        if (stream is None or stream.pid != os.getpid()) and directory is not None:
            path = _private_dir.path(directory, _private_dir.RUN_INFO)
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
