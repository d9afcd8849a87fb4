"""Opening an online run when W&B may not answer (``sinks/wandb/network.py``): the probe
against real local HTTP servers (answering, failing, refusing, silent), and the decision
(online, offline under the same id, or raise) with a stand-in for ``wandb.init``."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from wandb_funnel.sinks.wandb import network

pytestmark = pytest.mark.timeout(60)


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"data": {}}'
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(status: int) -> Iterator[str]:
    handler = type("Handler", (_Answer,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def answering() -> Iterator[str]:
    yield from _serve(200)


@pytest.fixture
def failing() -> Iterator[str]:
    yield from _serve(503)


@pytest.fixture
def refusing() -> str:
    """A port nothing listens on (bound, then closed: refused, at least for a while)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def silent() -> Iterator[str]:
    """Accepts connections (the kernel's backlog) and never answers: a black hole."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_the_probe_tells_an_answer_from_every_kind_of_silence(
    answering: str, failing: str, refusing: str, silent: str
) -> None:
    assert network.probe(answering, 5.0) is None
    assert network.probe(failing, 5.0) == "HTTP 503 Service Unavailable"
    assert network.probe(refusing, 5.0) == "connection refused"
    t0 = time.monotonic()
    assert network.probe(silent, 0.5) == "no answer (timed out)"
    assert time.monotonic() - t0 < 3.0


def test_online_is_decided_as_wandb_decides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert not network.is_online({})  # the funnel's default is offline
    assert network.is_online({"mode": "online"})
    assert network.is_online({"settings": {"mode": "online"}})
    assert not network.is_online({"mode": "offline", "settings": {"mode": "online"}})
    monkeypatch.setenv("WANDB_MODE", "online")
    assert network.is_online({}) and not network.is_online({"mode": "disabled"})
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:1/")
    assert network.base_url({}) == "http://127.0.0.1:1"
    assert network.base_url({"settings": {"base_url": "http://127.0.0.1:2"}}) == (
        "http://127.0.0.1:2"
    )


class _Sink:
    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs
        self.run_id = kwargs.get("id", "abc")

    def info(self) -> dict[str, Any]:
        mode = self.kwargs.get("mode")
        return {"dir": f"/runs/{mode}-run-{self.run_id}/files", "offline": mode == "offline"}


def _opener(fail_online: bool = False) -> tuple[Any, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []

    def init(overrides: dict[str, Any]) -> _Sink:
        calls.append(overrides)
        if fail_online and overrides.get("mode") != "offline":
            raise ConnectionError("CommError: run ID in use")
        return _Sink({"id": "abc", "mode": "online", **overrides})

    return init, calls


def _open(
    url: str, init: Any, on_error: str = "offline", wait: float = 2.0, closing: Any = None
) -> tuple[tuple[Any, str | None], list[str]]:
    said: list[str] = []
    kwargs = {"id": "abc", "mode": "online", "settings": {"base_url": url, "console": "off"}}
    out = network.open_online(
        init, kwargs, time.monotonic() + wait, on_error, closing or (lambda: None), said.append
    )
    return out, said


def test_a_server_that_answers_gets_the_run_online_within_the_start_timeout(
    answering: str,
) -> None:
    init, calls = _opener()
    (sink, error), said = _open(answering, init, wait=30.0)
    assert error is None and said == [] and sink.kwargs["mode"] == "online"
    # wandb-core's own retries end by the funnel's deadline; the user's settings are kept
    (overrides,) = calls
    assert overrides["settings"]["console"] == "off"
    assert 25.0 < overrides["settings"]["init_timeout"] <= 30.0


def test_a_server_that_refuses_gets_the_run_offline_under_its_id_and_says_how_to_upload(
    refusing: str,
) -> None:
    init, calls = _opener()
    t0 = time.monotonic()
    (_sink, error), said = _open(refusing, init, wait=1.5)
    assert 1.4 < time.monotonic() - t0 < 6.0  # it kept asking until start_timeout
    assert error == "connection refused"
    settings = {"base_url": refusing, "console": "off", "mode": "offline"}
    assert calls == [{"mode": "offline", "settings": settings}]
    (message,) = said
    assert refusing in message and "connection refused" in message and "abc" in message
    assert message.endswith("wandb sync /runs/offline-run-abc")


def test_raise_is_plain_wandbs_behaviour_and_names_the_url_and_error(refusing: str) -> None:
    init, calls = _opener()
    with pytest.raises(network.NetworkUnavailableError, match="connection refused") as caught:
        _open(refusing, init, on_error="raise", wait=0.5)
    assert caught.value.url == refusing and calls == []
    assert isinstance(caught.value, ConnectionError)


def test_a_close_waits_for_a_silent_server_only_within_its_budget(silent: str) -> None:
    """A close (its budget: 2 s) ends the wait for a server that never answers long before
    start_timeout (60 s); the run is kept offline."""
    init, _calls = _opener()
    asked = threading.Event()
    threading.Timer(0.3, asked.set).start()
    t0 = time.monotonic()
    (sink, error), said = _open(silent, init, wait=60.0, closing=_closing_by(asked, 2.0))
    assert 2.0 < time.monotonic() - t0 < 10.0  # the close's budget, not start_timeout
    assert sink.kwargs["mode"] == "offline" and "closed before it answered" in (error or "")
    assert len(said) == 1


def _closing_by(asked: threading.Event, budget: float) -> Any:
    """A close asked when ``asked`` is set: the run must be open ``budget`` s later."""
    at: list[float] = []

    def closing() -> float | None:
        if not asked.is_set():
            return None
        if not at:
            at.append(time.monotonic() + budget)
        return at[0]

    return closing


def test_a_server_back_while_the_job_closes_still_gets_the_run_online() -> None:
    """The server is down when the close comes and back 1 s later, within the close's
    budget: the run opens online."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = type("Handler", (_Answer,), {"status": 200})
    servers: list[http.server.ThreadingHTTPServer] = []

    def come_back() -> None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        servers.append(server)
        server.serve_forever()

    back = threading.Timer(1.0, come_back)
    back.daemon = True
    back.start()
    asked = threading.Event()
    asked.set()  # closing from the start
    init, _calls = _opener()
    try:
        (sink, error), said = _open(
            f"http://127.0.0.1:{port}", init, wait=60.0, closing=_closing_by(asked, 10.0)
        )
    finally:
        back.cancel()
        for server in servers:
            server.shutdown()
            server.server_close()
        back.join(5)
    assert error is None and said == [] and sink.kwargs["mode"] == "online"


def test_a_close_waits_for_an_init_already_talking_to_a_server_that_answered(
    answering: str,
) -> None:
    """A short job closes while wandb.init is still opening the run online (a healthy server,
    a second or two): the run stays online, within the close's budget."""
    asked = threading.Event()

    def slow_init(overrides: dict[str, Any]) -> _Sink:
        asked.set()  # the close comes now, while init runs
        time.sleep(1.0)
        return _Sink({"id": "abc", "mode": "online", **overrides})

    (sink, error), said = _open(answering, slow_init, wait=30.0, closing=_closing_by(asked, 10))
    assert error is None and said == [] and sink.kwargs["mode"] == "online"


def test_an_init_that_outlasts_the_close_budget_is_left_for_an_offline_run(
    answering: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(network, "_own_service", lambda: None)
    asked = threading.Event()
    release = threading.Event()
    calls: list[dict[str, Any]] = []

    def stuck_init(overrides: dict[str, Any]) -> _Sink:
        calls.append(overrides)
        if overrides.get("mode") == "offline":
            return _Sink({"id": "abc", **overrides})
        asked.set()
        release.wait(30)  # a server that answered the probe, then stalled
        return _Sink({"id": "abc", "mode": "online", **overrides})

    t0 = time.monotonic()
    try:
        (sink, error), said = _open(answering, stuck_init, wait=60, closing=_closing_by(asked, 1))
    finally:
        release.set()
    assert time.monotonic() - t0 < 10.0
    assert sink.kwargs["mode"] == "offline" and "closed while wandb.init" in (error or "")
    assert len(said) == 1


def test_an_init_that_fails_after_the_server_answered_falls_back_offline(
    answering: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server answered the probe, then wandb.init failed: the shared wandb-core may hold
    the id, so the offline run goes to a core of the logger's own (WANDB_SERVICE dropped)."""
    own_service: list[int] = []
    monkeypatch.setattr(network, "_own_service", lambda: own_service.append(1))
    init, calls = _opener(fail_online=True)
    (sink, error), said = _open(answering, init, wait=30.0)
    assert [c.get("mode") for c in calls] == [None, "offline"]
    assert own_service == [1]  # before the offline init, not after
    assert sink.kwargs["mode"] == "offline" and "run ID in use" in (error or "")
    assert len(said) == 1 and "wandb sync" in said[0]


def test_an_init_that_fails_for_another_reason_than_the_network_raises_it(
    answering: str,
) -> None:
    """A bad argument is not a network error: no offline run would fix it, so it raises, as
    plain wandb.init would, whatever on_network_error says."""

    def refusing_init(overrides: dict[str, Any]) -> _Sink:
        raise ValueError("wandb.init: bad argument")

    with pytest.raises(ValueError, match="bad argument"):
        _open(answering, refusing_init, wait=30.0)
