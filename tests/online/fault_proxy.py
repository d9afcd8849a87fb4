"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1, in front of a W&B server (stdlib only).

wandb-core talks to the server with HTTP/1.1 keep-alive: GraphQL ``POST /graphql``, the
filestream ``POST /files/<entity>/<project>/<run>/file_stream``, uploads ``PUT /files/...``
(OpenWandb's upload URLs are built from the ``Host`` header, which the proxy passes on as it
came, so uploads come back through the proxy too). Point ``WANDB_BASE_URL`` at ``proxy.url``.

    proxy = FaultProxy(upstream_port=server.port).start()
    proxy.delay(2.0, only="filestream")         # each matching request waits 2 s, then goes on
    proxy.black_hole(only="filestream")          # read, never answered, never forwarded
    proxy.reset()                                # read, then the connection is reset (RST)
    proxy.status(429, rate_limit_headers(retry_after=1))   # answered here, not forwarded
    proxy.status(500, only="filestream", times=3)          # the next 3 matching requests
    proxy.healthy()                              # every fault off
    proxy.requests("filestream"), proxy.bytes_up(), proxy.bytes_down(), proxy.stats()
    proxy.exit_codes()                           # run id -> exitcode the server was sent
    proxy.stop()

A fault applies to the requests that finish arriving while it is set; ``only`` limits it to
one kind (``graphql``, ``filestream``, ``upload``, ``other``): one fault per kind, plus one
for every kind, the kind's own winning. A black-holed request is held, unanswered, until its
fault is lifted (``healthy()`` or another fault for that scope) or the proxy stops; then its
connection is closed without an answer, as a peer that went away.

Each request goes to the server on a connection of its own (the server's idle keep-alive
timeout cannot then break a request the client sent on a connection it kept). A server that
refuses the connection or does not answer within ``upstream_timeout`` gets the client's
connection reset, as if the client had met it directly.

From a script: ``python -m tests.online.fault_proxy --upstream PORT [--port P]`` prints
``LISTENING <port>``, serves until SIGTERM or SIGINT, then prints the counters as JSON. It is
steered by the proxy's own endpoints (never forwarded, never counted): ``GET
/__fault_proxy__/stats`` and ``POST /__fault_proxy__/fault`` with a JSON body such as
``{"fault": "delay", "seconds": 2, "only": "filestream"}`` or ``{"fault": "healthy"}``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http
import http.client
import io
import json
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal

Kind = Literal["graphql", "filestream", "upload", "other"]
KINDS: tuple[Kind, ...] = ("graphql", "filestream", "upload", "other")
Action = Literal["delay", "black_hole", "reset", "status"]
CONTROL = "/__fault_proxy__/"
FILESTREAM = re.compile(r"/files/([^/]+)/([^/]+)/([^/]+)/file_stream")
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",  # set again from the body as forwarded
    }
)
MAX_LINE = 65536


def kind_of(method: str, path: str) -> Kind:
    """Which kind of wandb traffic a request is."""
    bare = path.split("?", 1)[0]
    if bare.rstrip("/") == "/graphql":
        return "graphql"
    if FILESTREAM.fullmatch(bare):
        return "filestream"
    if method == "PUT" and bare.startswith(("/files/", "/artifacts/")):
        return "upload"
    return "other"


def rate_limit_headers(
    retry_after: float | None = None,
    remaining: float | None = None,
    reset: float | None = None,
) -> dict[str, str]:
    """The rate-limit headers wandb-core 0.31 reads (its Go source, ``core/internal``):

    - ``Retry-After`` (seconds, or an HTTP date): on a response it retries (429, 5xx), the
      wait before the retry, in place of its exponential backoff (``clients/backoff.go``);
    - ``RateLimit-Remaining`` with ``RateLimit-Reset`` (seconds; IETF draft-polli-ratelimit-
      headers), or the legacy ``X-RateLimit-Remaining`` alone: on any response, they steer
      the rate of its requests to the backend (``api/ratelimitheaders.go``,
      ``api/ratelimittracker.go``).
    """
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["Retry-After"] = f"{retry_after:g}"
    if remaining is not None:
        headers["RateLimit-Remaining"] = f"{remaining:g}"
    if reset is not None:
        headers["RateLimit-Reset"] = f"{reset:g}"
    return headers


@dataclass
class Fault:
    action: Action
    only: Kind | None = None
    seconds: float = 0.0  # delay
    code: int = 0  # status
    headers: dict[str, str] = field(default_factory=dict)  # status
    body: bytes = b""  # status
    times: int | None = None  # how many more requests it applies to (None: until lifted)
    lifted: threading.Event = field(default_factory=threading.Event, repr=False)

    def describe(self) -> str:
        return {
            "delay": f"delay {self.seconds:g}s",
            "black_hole": "black hole",
            "reset": "reset",
            "status": f"status {self.code}",
        }[self.action]


@dataclass(frozen=True)
class RequestRecord:
    """One request as the proxy saw it."""

    started: float  # time.monotonic() when it had fully arrived
    ended: float  # when it was answered (or dropped)
    method: str
    path: str
    kind: Kind
    status: int | None  # what the client got; None: no answer (black hole, reset, no server)
    fault: str | None  # the fault it met, if any
    bytes_up: int  # client -> proxy: request line, headers, body as sent
    bytes_down: int  # proxy -> client


class _ClosedError(Exception):
    """The client closed its connection (between requests, or mid-request)."""


class FaultProxy:
    """The proxy; a context manager (``with FaultProxy(port) as proxy``) or start()/stop()."""

    def __init__(
        self,
        upstream_port: int,
        *,
        upstream_host: str = "127.0.0.1",
        port: int = 0,
        upstream_timeout: float = 300.0,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.upstream_timeout = upstream_timeout
        self._want_port = port
        self.port = 0
        self._lock = threading.Lock()
        self._faults: dict[Kind | None, Fault] = {}
        self._spent: list[Fault] = []  # faults whose `times` ran out (black holes still hold)
        self._records: list[RequestRecord] = []
        self._exit_codes: dict[str, int] = {}
        self._complete: set[str] = set()
        self._history_lines: dict[str, int] = {}
        self._held = 0
        self._connections = 0
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self.started_at = time.monotonic()

    # ---- lifecycle ----
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self._want_port))
        listener.listen(1024)
        listener.settimeout(0.2)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self.started_at = time.monotonic()
        self._spawn(self._accept_loop, "fault-proxy-accept")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection; black-holed requests are let go."""
        self._stopping.set()
        with self._lock:
            for fault in [*self._faults.values(), *self._spent]:
                fault.lifted.set()
            sockets = list(self._sockets)
        if self._listener is not None:
            self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)

    # ---- faults ----
    def _set(self, fault: Fault) -> None:
        with self._lock:
            old = self._faults.get(fault.only)
            self._faults[fault.only] = fault
        if old is not None:
            old.lifted.set()

    def healthy(self, only: Kind | None = None) -> None:
        """Lift every fault (``only``: the one for that kind alone)."""
        with self._lock:
            if only is None:
                lifted = [*self._faults.values(), *self._spent]
                self._faults.clear()
                self._spent.clear()
            else:
                one = self._faults.pop(only, None)
                lifted = [] if one is None else [one]
                lifted += [f for f in self._spent if f.only == only]
                self._spent = [f for f in self._spent if f.only != only]
        for fault in lifted:
            fault.lifted.set()

    def delay(self, seconds: float, only: Kind | None = None, times: int | None = None) -> None:
        """Hold each matching request ``seconds`` before forwarding it."""
        self._set(Fault("delay", only, seconds=seconds, times=times))

    def black_hole(self, only: Kind | None = None, times: int | None = None) -> None:
        """Read each matching request, never forward or answer it (until lifted)."""
        self._set(Fault("black_hole", only, times=times))

    def reset(self, only: Kind | None = None, times: int | None = None) -> None:
        """Read each matching request, then reset the connection (RST: SO_LINGER 0)."""
        self._set(Fault("reset", only, times=times))

    def status(
        self,
        code: int,
        headers: Mapping[str, str] | None = None,
        only: Kind | None = None,
        times: int | None = None,
        body: bytes | None = None,
    ) -> None:
        """Answer each matching request with ``code`` and ``headers`` (see
        ``rate_limit_headers``), without forwarding it; the connection stays open."""
        payload = body if body is not None else json.dumps({"error": f"fault proxy: {code}"})
        self._set(
            Fault(
                "status",
                only,
                code=code,
                headers=dict(headers or {}),
                body=payload.encode() if isinstance(payload, str) else payload,
                times=times,
            )
        )

    def _fault_for(self, kind: Kind) -> Fault | None:
        with self._lock:
            for scope in (kind, None):
                fault = self._faults.get(scope)
                if fault is None:
                    continue
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:  # its last request; healthy() still lifts it
                        del self._faults[scope]
                        self._spent.append(fault)
                return fault
        return None

    # ---- counters ----
    def records(self, kind: Kind | None = None) -> list[RequestRecord]:
        with self._lock:
            return [r for r in self._records if kind is None or r.kind == kind]

    def requests(self, kind: Kind | None = None, *, faulted: bool | None = None) -> int:
        """Requests that fully arrived (``faulted``: only those that met a fault, or none)."""
        return sum(
            1 for r in self.records(kind) if faulted is None or (r.fault is not None) == faulted
        )

    def bytes_up(self, kind: Kind | None = None) -> int:
        return sum(r.bytes_up for r in self.records(kind))

    def bytes_down(self, kind: Kind | None = None) -> int:
        return sum(r.bytes_down for r in self.records(kind))

    def held(self) -> int:
        """Black-holed requests being held right now."""
        with self._lock:
            return self._held

    def exit_codes(self) -> dict[str, int]:
        """Run id -> the ``exitcode`` of a ``complete`` filestream request the server
        accepted (2xx): what the server was told, which OpenWandb does not store."""
        with self._lock:
            return dict(self._exit_codes)

    def completed_runs(self) -> set[str]:
        with self._lock:
            return set(self._complete)

    def history_lines(self) -> dict[str, int]:
        """Run id -> history lines in the filestream requests the server accepted (a line
        sent again after a lost answer counts again)."""
        with self._lock:
            return dict(self._history_lines)

    def stats(self) -> dict[str, Any]:
        """Every counter, as plain data (for a benchmark's JSON)."""
        records = self.records()
        with self._lock:
            connections, held = self._connections, self._held
        per_kind: dict[str, dict[str, int]] = {}
        for kind in KINDS:
            mine = [r for r in records if r.kind == kind]
            statuses: dict[str, int] = {}
            for r in mine:
                key = "none" if r.status is None else str(r.status)
                statuses[key] = statuses.get(key, 0) + 1
            per_kind[kind] = {
                "requests": len(mine),
                "faulted": sum(1 for r in mine if r.fault is not None),
                "bytes_up": sum(r.bytes_up for r in mine),
                "bytes_down": sum(r.bytes_down for r in mine),
                **{f"status_{k}": v for k, v in sorted(statuses.items())},
            }
        return {
            "seconds": time.monotonic() - self.started_at,
            "connections": connections,
            "held": held,
            "requests": len(records),
            "bytes_up": sum(r.bytes_up for r in records),
            "bytes_down": sum(r.bytes_down for r in records),
            "kinds": per_kind,
            "exit_codes": self.exit_codes(),
            "history_lines": self.history_lines(),
        }

    def reset_counters(self) -> None:
        with self._lock:
            self._records.clear()
            self._connections = 0
        self.started_at = time.monotonic()

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Poll ``predicate`` every 50 ms for at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    # ---- serving ----
    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._track(client)
            with self._lock:
                self._connections += 1
            self._spawn(self._serve_connection, "fault-proxy-conn", client)

    def _serve_connection(self, client: socket.socket) -> None:
        rfile = client.makefile("rb")
        try:
            while not self._stopping.is_set():
                try:
                    if not self._one_request(client, rfile):
                        break
                except (_ClosedError, OSError, ValueError):
                    break
        finally:
            self._untrack(client)
            with contextlib.suppress(OSError):
                rfile.close()
            with contextlib.suppress(OSError):
                client.close()

    def _one_request(self, client: socket.socket, rfile: BinaryIO) -> bool:
        """Serve one request; False when the connection is done."""
        line = rfile.readline(MAX_LINE)
        while line in (b"\r\n", b"\n"):  # tolerated empty lines between requests
            line = rfile.readline(MAX_LINE)
        if not line:
            raise _ClosedError
        up = len(line)
        method, path, version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        raw_headers = b""
        while True:
            h = rfile.readline(MAX_LINE)
            if not h:
                raise _ClosedError
            up += len(h)
            if h in (b"\r\n", b"\n"):
                break
            raw_headers += h
        headers = http.client.parse_headers(io.BytesIO(raw_headers + b"\r\n"))
        if headers.get("Expect", "").lower() == "100-continue":
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body, body_bytes = _read_body(rfile, headers)
        up += body_bytes
        keep_alive = _keeps_alive(version, headers)
        started = time.monotonic()

        if path.startswith(CONTROL):
            return self._control(client, method, path, body) and keep_alive

        kind = kind_of(method, path)
        fault = self._fault_for(kind)

        # Each outcome is recorded before the client can see it: a client that has its
        # answer (or its reset) finds the request already counted.
        def record(status: int | None, down: int) -> None:
            done = RequestRecord(
                started=started,
                ended=time.monotonic(),
                method=method,
                path=path,
                kind=kind,
                status=status,
                fault=None if fault is None else fault.describe(),
                bytes_up=up,
                bytes_down=down,
            )
            with self._lock:
                self._records.append(done)

        if fault is not None and fault.action == "black_hole":
            with self._lock:
                self._held += 1
            try:
                while not fault.lifted.wait(0.2) and not self._stopping.is_set():
                    pass
            finally:
                record(None, 0)
                with self._lock:
                    self._held -= 1
            return False  # closed, never answered
        if fault is not None and fault.action == "reset":
            record(None, 0)
            _reset(client)
            return False
        if fault is not None and fault.action == "status":
            data = (
                _response_head(fault.code, None, fault.headers, len(fault.body), keep_alive)
                + fault.body
            )
            record(fault.code, len(data))
            client.sendall(data)
            return keep_alive
        if fault is not None and fault.action == "delay" and self._stopping.wait(fault.seconds):
            record(None, 0)
            return False  # stopped meanwhile
        answer = self._forward(method, path, headers, body)
        if answer is None:  # no server, or no answer from it in time
            record(None, 0)
            _reset(client)
            return False
        code, reason, resp_headers, resp_body = answer
        if kind == "filestream" and 200 <= code < 300:
            self._note_filestream(path, headers, body)
        length_header = None
        if method == "HEAD":
            length_header = next(
                (v for k, v in resp_headers if k.lower() == "content-length"), None
            )
        data = (
            _response_head(code, reason, resp_headers, len(resp_body), keep_alive, length_header)
            + resp_body
        )
        record(code, len(data))
        client.sendall(data)
        return keep_alive

    def _forward(
        self, method: str, path: str, headers: http.client.HTTPMessage, body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes] | None:
        conn = http.client.HTTPConnection(*self.upstream, timeout=self.upstream_timeout)
        try:
            conn.connect()
            assert conn.sock is not None
            upstream_sock: socket.socket = conn.sock
            self._track(upstream_sock)
            try:
                conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers.items():
                    if name.lower() not in HOP_BY_HOP:
                        conn.putheader(name, value)  # Host as the client sent it
                conn.putheader("Content-Length", str(len(body)))
                conn.putheader("Connection", "close")
                conn.endheaders(body)
                resp = conn.getresponse()
                resp_body = resp.read()
                return resp.status, resp.reason, resp.getheaders(), resp_body
            finally:
                self._untrack(upstream_sock)
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def _note_filestream(self, path: str, headers: http.client.HTTPMessage, body: bytes) -> None:
        match = FILESTREAM.fullmatch(path.split("?", 1)[0])
        if match is None:
            return
        run_id = match.group(3)
        try:
            raw = gzip.decompress(body) if headers.get("Content-Encoding") == "gzip" else body
            payload = json.loads(raw)
        except (ValueError, OSError):
            return
        if not isinstance(payload, dict):
            return
        files = payload.get("files") or {}
        history = files.get("wandb-history.jsonl") if isinstance(files, dict) else None
        lines = len(history.get("content") or []) if isinstance(history, dict) else 0
        with self._lock:
            self._history_lines[run_id] = self._history_lines.get(run_id, 0) + lines
            if payload.get("complete"):
                self._complete.add(run_id)
                code = payload.get("exitcode")
                if isinstance(code, int):
                    self._exit_codes[run_id] = code

    def _control(self, client: socket.socket, method: str, path: str, body: bytes) -> bool:
        """The proxy's own endpoints (see the module's docstring)."""
        code, answer = 200, b""
        try:
            if method == "GET" and path == CONTROL + "stats":
                answer = json.dumps(self.stats()).encode()
            elif method == "POST" and path == CONTROL + "fault":
                self.apply(json.loads(body or b"{}"))
                answer = b'{"ok": true}'
            else:
                code, answer = 404, b'{"error": "unknown control path"}'
        except (ValueError, TypeError, KeyError) as exc:
            code, answer = 400, json.dumps({"error": str(exc)}).encode()
        client.sendall(_response_head(code, None, [], len(answer), True) + answer)
        return True

    def apply(self, spec: Mapping[str, Any]) -> None:
        """Set a fault from plain data: ``{"fault": "delay"|"black_hole"|"reset"|"status"|
        "healthy", "only": kind, "times": n, "seconds": s, "code": c, "headers": {...}}``."""
        name = spec["fault"]
        only = spec.get("only")
        if only is not None and only not in KINDS:
            raise ValueError(f"only: one of {KINDS}, not {only!r}")
        times = spec.get("times")
        if name == "healthy":
            self.healthy(only)
        elif name == "delay":
            self.delay(float(spec["seconds"]), only, times)
        elif name == "black_hole":
            self.black_hole(only, times)
        elif name == "reset":
            self.reset(only, times)
        elif name == "status":
            self.status(int(spec["code"]), spec.get("headers") or {}, only, times)
        else:
            raise ValueError(f"unknown fault {name!r}")


def _read_body(rfile: BinaryIO, headers: http.client.HTTPMessage) -> tuple[bytes, int]:
    """The body (de-chunked) and how many bytes it took on the wire."""
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        body, wire = b"", 0
        while True:
            size_line = rfile.readline(MAX_LINE)
            if not size_line:
                raise _ClosedError
            wire += len(size_line)
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = rfile.readline(MAX_LINE)
                    if not trailer:
                        raise _ClosedError
                    wire += len(trailer)
                    if trailer in (b"\r\n", b"\n"):
                        return body, wire
            chunk = rfile.read(size + 2)
            if len(chunk) < size + 2:
                raise _ClosedError
            wire += len(chunk)
            body += chunk[:size]
    length = int(headers.get("Content-Length", "0") or 0)
    body = rfile.read(length) if length else b""
    if len(body) < length:
        raise _ClosedError
    return body, length


def _keeps_alive(version: str, headers: http.client.HTTPMessage) -> bool:
    connection = headers.get("Connection", "").lower()
    if version == "HTTP/1.0":
        return "keep-alive" in connection
    return "close" not in connection


def _response_head(
    code: int,
    reason: str | None,
    headers: Mapping[str, str] | list[tuple[str, str]],
    length: int,
    keep_alive: bool,
    length_header: str | None = None,
) -> bytes:
    if reason is None:
        try:
            reason = http.HTTPStatus(code).phrase
        except ValueError:
            reason = ""
    items = headers.items() if isinstance(headers, Mapping) else headers
    lines = [f"HTTP/1.1 {code} {reason}"]
    lines += [f"{k}: {v}" for k, v in items if k.lower() not in HOP_BY_HOP]
    lines.append(f"Content-Length: {length_header if length_header is not None else length}")
    lines.append("Connection: " + ("keep-alive" if keep_alive else "close"))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN: SO_LINGER on, with a zero timeout."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--upstream", type=int, required=True, help="the server's port")
    parser.add_argument("--upstream-host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="this proxy's port (0: any free)")
    args = parser.parse_args(argv)
    proxy = FaultProxy(args.upstream, upstream_host=args.upstream_host, port=args.port)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    proxy.start()
    print(f"LISTENING {proxy.port}", flush=True)
    while not done.wait(0.5):
        pass
    proxy.stop()
    print(json.dumps(proxy.stats()), flush=True)
    return 0


__all__ = [
    "KINDS",
    "Fault",
    "FaultProxy",
    "Kind",
    "RequestRecord",
    "kind_of",
    "rate_limit_headers",
]

if __name__ == "__main__":
    sys.exit(main())
