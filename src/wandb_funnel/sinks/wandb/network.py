"""Opening an online run when W&B may not answer: the logger's run opens in the background
(the owner's start does not wait for it), and a server that does not answer within
``start_timeout`` costs the run its upload, never its rows.

wandb 0.31 alone cannot do this. ``wandb.init`` online against a server that does not answer
retries for ``init_timeout`` (90 s), then raises ``CommError``; and the run's id then stays
taken in that wandb-core ("run ID ... is in use"), so the same id cannot be opened offline in
it. So the logger first asks the server itself (``probe``: one small GraphQL request, as
wandb's login makes, with a short timeout, again every second until the deadline) and calls
``wandb.init`` online only once the server answers, on a thread, while the logger's main
thread watches the deadline and the funnel's close. When the server never answers, or
``wandb.init`` still fails or outlasts the deadline, the run is opened offline under the same
id in a wandb-core of the logger's own (the shared one may hold the id), and the terminal is
told once: the URL, the error, and the ``wandb sync`` command that uploads the run.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

_PROBE_TIMEOUT = 5.0  # seconds one probe request may take
_PROBE_EVERY = 1.0  # seconds between probes of a server that does not answer
_DEFAULT_BASE_URL = "https://api.wandb.ai"
ONLINE_MODES = ("online", "run")  # wandb's modes that talk to the server ("run": online)


class NetworkUnavailableError(ConnectionError):
    """W&B did not answer at ``url`` within the start timeout (``on_network_error="raise"``)."""

    def __init__(self, url: str, error: str) -> None:
        super().__init__(f"W&B at {url} did not answer: {error}")
        self.url = url
        self.error = error


def is_online(init_kwargs: dict[str, Any]) -> bool:
    """Whether ``wandb.init(**init_kwargs)`` in the logger talks to the server: ``mode``
    given, or in the settings, or ``WANDB_MODE``; the funnel's default is offline."""
    settings = init_kwargs.get("settings")
    mode = init_kwargs.get("mode")
    if mode is None and isinstance(settings, dict):
        mode = settings.get("mode")
    if mode is None:
        mode = os.environ.get("WANDB_MODE") or "offline"
    return mode in ONLINE_MODES


def base_url(init_kwargs: dict[str, Any]) -> str:
    """The server wandb would talk to (settings, then ``WANDB_BASE_URL``, then W&B's)."""
    settings = init_kwargs.get("settings")
    url = settings.get("base_url") if isinstance(settings, dict) else None
    return str(url or os.environ.get("WANDB_BASE_URL") or _DEFAULT_BASE_URL).rstrip("/")


def probe(url: str, timeout: float) -> str | None:
    """None when the server at ``url`` answers a GraphQL request (any answer but a 5xx or a
    429: a 401 is an answer), else what went wrong, in words."""
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": "query Probe { serverInfo { __typename } }"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read(1024)
        return None
    except urllib.error.HTTPError as exc:
        if exc.code >= 500 or exc.code == 429:
            return f"HTTP {exc.code} {exc.reason}"
        return None
    except urllib.error.URLError as exc:
        return _reason(exc.reason)
    except (OSError, ValueError) as exc:  # a timeout, a reset, a malformed URL
        return _reason(exc)


def _reason(reason: Any) -> str:
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return "no answer (timed out)"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return str(reason) or type(reason).__name__


def wait_until_answering(
    url: str, deadline: float, closing: Callable[[], float | None]
) -> tuple[str | None, int]:
    """Probe ``url`` until it answers or the ``deadline`` (monotonic) passes, or, once the
    funnel is closing, the time ``closing()`` gives (a server down for a few seconds as the
    job ends still gets the run online); returns (None, tries) once it answers, else (the
    last error, tries)."""

    def left() -> float:
        close_by = closing()
        end = deadline if close_by is None else min(deadline, close_by)
        return end - time.monotonic()

    error = "not asked"
    tries = 0
    while left() > 0:
        tries += 1
        error = probe(url, min(_PROBE_TIMEOUT, left())) or ""
        if not error:
            return None, tries
        pause_until = time.monotonic() + _PROBE_EVERY
        while time.monotonic() < pause_until and left() > 0:
            time.sleep(0.05)
    return error, tries


def open_online(
    init: Callable[[dict[str, Any]], Any],
    init_kwargs: dict[str, Any],
    deadline: float,
    on_network_error: str,
    closing: Callable[[], float | None],
    say: Callable[[str], None],
) -> tuple[Any, str | None]:
    """Open the run online, or offline under the same id when W&B does not answer.

    ``init(overrides)`` opens the sink with ``overrides`` on top of ``init_kwargs``.
    ``closing()`` is None while the funnel runs, and once it is closing the time (monotonic)
    by which the run must be open (the server, and a ``wandb.init`` talking to it, are
    waited for until then, within the close's budget).
    Returns (the sink, None) when the run is online, or (the offline sink, the error).

    Raises:
        NetworkUnavailableError: ``on_network_error="raise"`` and W&B did not answer.
    """
    url = base_url(init_kwargs)
    settings = init_kwargs.get("settings")
    settings = dict(settings) if isinstance(settings, dict) else {}
    error, tries = wait_until_answering(url, deadline, closing)
    if error is None:
        opened, error = _init_online(init, settings, deadline, closing)
        if opened is not None:
            return opened, None
        _own_service()  # the shared wandb-core may hold the run's id now
    elif closing() is not None:
        error = f"{error}; the funnel closed before it answered"  # within its close budget
    waited = f"{tries} tries" if tries != 1 else "1 try"
    if on_network_error == "raise":
        raise NetworkUnavailableError(url, f"{error} ({waited})")
    sink = init({"mode": "offline", "settings": {**settings, "mode": "offline"}})
    run_dir = os.path.dirname(str(sink.info().get("dir") or "")) or "<the run's directory>"
    say(
        f"W&B at {url} did not answer ({error}; {waited}): the run {sink.run_id} is recorded "
        f"offline in {run_dir}, with every row; training goes on. Upload it later with:\n"
        f"    wandb sync {run_dir}"
    )
    return sink, error


def _init_online(
    init: Callable[[dict[str, Any]], Any],
    settings: dict[str, Any],
    deadline: float,
    closing: Callable[[], float | None],
) -> tuple[Any, str]:
    """``wandb.init`` online on a thread, bounded by ``deadline`` and, once the funnel is
    closing, by the time ``closing()`` gives: returns (the sink, "") or (None, why not). A
    call still running past them is abandoned (its thread is a daemon)."""
    done = threading.Event()
    result: list[Any] = [None, None]  # the sink, or the exception init raised

    def run() -> None:
        try:
            # wandb-core gives up by itself when the deadline comes (the user's own
            # init_timeout stands where it is shorter).
            left = max(1.0, deadline - time.monotonic())
            own = settings.get("init_timeout")
            if isinstance(own, (int, float)) and 0 < own < left:
                left = float(own)
            result[0] = init({"settings": {**settings, "init_timeout": left}})
        except Exception as exc:
            result[1] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="wandb-funnel-init-online", daemon=True).start()
    while not done.wait(0.05):
        close_by = closing()
        if close_by is not None and time.monotonic() >= close_by:
            return None, "the funnel closed while wandb.init was still waiting for W&B"
        if time.monotonic() >= deadline:
            return None, "wandb.init did not return within start_timeout"
    failed = result[1]
    if failed is None:
        return result[0], ""
    if not _is_network_error(failed):
        raise failed  # a bad argument, say: no offline run would fix it
    first_line = (str(failed).splitlines() or [""])[0]
    return None, f"wandb.init failed: {type(failed).__name__}: {first_line}"


def _is_network_error(exc: BaseException) -> bool:
    """wandb's own "could not talk to the server" (``CommError``, its timeouts), or the OS's."""
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    try:
        from wandb.errors import CommError
    except ImportError:
        return False
    return isinstance(exc, CommError)


def _own_service() -> None:
    """From now on this process's wandb uses a wandb-core of its own (started by the next
    ``wandb.init``, torn down at this process's exit): the shared one still holds the run's id
    from the online attempt. wandb's private singleton; a later wandb that renamed it keeps
    the shared core, and the offline init then says why it failed."""
    os.environ.pop("WANDB_SERVICE", None)
    try:
        from wandb.sdk import wandb_setup

        with wandb_setup._singleton_lock:
            wandb_setup._singleton = None
    except (ImportError, AttributeError):
        pass
