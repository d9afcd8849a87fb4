"""The fault proxy against a stdlib HTTP/1.1 upstream (no wandb, no OpenWandb): each fault does
what it says, only where it is scoped, and every request and byte is counted."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.online.fault_proxy import FaultProxy, Kind, kind_of, rate_limit_headers
from tests.online.openwandb import REPO, free_port

pytestmark = pytest.mark.timeout(60)

FILESTREAM = "/files/default/proj/run1/file_stream"


class Upstream(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[tuple[str, str, bytes, str]] = []  # method, path, body, Host

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as wandb-core's server
    server: Upstream

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.seen.append((self.command, self.path, body, self.headers.get("Host", "")))
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"hello ", b"chunked ", b"world"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        answer = json.dumps({"method": self.command, "path": self.path, "len": len(body)})
        data = answer.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _answer  # noqa: N815 - http.server's names

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - its signature
        pass


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[FaultProxy]:
    with FaultProxy(upstream.port) as p:
        yield p


def request(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    conn.request(method, path, body=body)
    resp = conn.getresponse()
    return resp.status, dict(resp.getheaders()), resp.read()


def raw(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the proxy closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_request_kinds() -> None:
    assert kind_of("POST", "/graphql") == "graphql"
    assert kind_of("POST", "/files/e/p/r/file_stream") == "filestream"
    assert kind_of("PUT", "/files/e/p/r/media/images/a.png") == "upload"
    assert kind_of("GET", "/files/e/p/r/output.log") == "other"
    assert kind_of("POST", "/sdk/otel/v1/metrics") == "other"


def test_healthy_keeps_alive_forwards_every_kind_and_counts_each(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    calls: list[tuple[str, str, bytes, Kind]] = [
        ("POST", "/graphql", b'{"query": "q"}', "graphql"),
        ("POST", FILESTREAM, b'{"files": {}}', "filestream"),
        ("PUT", "/files/default/proj/run1/output.log", b"x" * 1000, "upload"),
        ("GET", "/", b"", "other"),
    ]
    for method, path, body, _ in calls:
        status, _, answer = request(conn, method, path, body)
        assert status == 200
        assert json.loads(answer) == {"method": method, "path": path, "len": len(body)}
    conn.close()
    assert proxy.stats()["connections"] == 1  # one keep-alive connection carried all four
    assert [(m, p, b) for m, p, b, _ in upstream.seen] == [(m, p, b) for m, p, b, _ in calls]
    assert {host for *_, host in upstream.seen} == {f"127.0.0.1:{proxy.port}"}  # Host kept
    for *_, body, kind in calls:
        assert proxy.requests(kind) == 1
        assert proxy.bytes_up(kind) > len(body)
        assert proxy.bytes_down(kind) > 0
    assert proxy.requests() == 4 and proxy.requests(faulted=True) == 0


def test_bytes_are_counted_exactly_both_ways(proxy: FaultProxy) -> None:
    body = b'{"files": {"wandb-history.jsonl": {"offset": 0, "content": ["{}"]}}}'
    sent = (
        f"POST {FILESTREAM} HTTP/1.1\r\nHost: h\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    got = raw(proxy.port, sent)
    assert got.startswith(b"HTTP/1.1 200 OK\r\n")
    assert proxy.bytes_up("filestream") == len(sent)
    assert proxy.bytes_down("filestream") == len(got)
    assert proxy.history_lines() == {"run1": 1}


def test_a_chunked_request_and_a_chunked_answer_are_passed_on(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    sent = (
        b"POST /graphql HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    got = raw(proxy.port, sent)
    assert upstream.seen[0][:3] == ("POST", "/graphql", b"hello world")
    assert got.endswith(b'"len": 11}')
    assert proxy.bytes_up() == len(sent)

    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    assert request(conn, "GET", "/chunked")[2] == b"hello chunked world"
    conn.close()


def test_delay_holds_only_the_kind_it_is_scoped_to(proxy: FaultProxy) -> None:
    proxy.delay(1.0, only="filestream")
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    t0 = time.monotonic()
    assert request(conn, "POST", FILESTREAM, b"{}")[0] == 200
    assert time.monotonic() - t0 >= 1.0
    assert request(conn, "POST", "/graphql", b"{}")[0] == 200
    conn.close()
    faults = {r.kind: r.fault for r in proxy.records()}
    assert faults == {"filestream": "delay 1s", "graphql": None}


def test_a_black_hole_reads_never_answers_and_closes_when_lifted(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    proxy.black_hole(only="filestream")
    hole = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    hole.sendall(f"POST {FILESTREAM} HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{{}}".encode())
    assert proxy.wait_until(lambda: proxy.held() == 1, timeout=10)

    # Meanwhile another kind goes through, and the held request never reached the server.
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    assert request(conn, "POST", "/graphql", b"{}")[0] == 200
    conn.close()
    assert [p for _, p, _, _ in upstream.seen] == ["/graphql"]
    hole.settimeout(0.5)
    with pytest.raises(TimeoutError):
        hole.recv(1)  # no answer

    proxy.healthy()
    hole.settimeout(10)
    assert hole.recv(1) == b""  # closed, never answered
    hole.close()
    assert proxy.held() == 0
    [record] = proxy.records("filestream")
    assert (record.status, record.fault, record.bytes_down) == (None, "black hole", 0)


def test_stop_lets_go_of_black_holed_requests(proxy: FaultProxy) -> None:
    proxy.black_hole(times=1)  # a spent fault still holds its request until lifted
    hole = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    hole.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert proxy.wait_until(lambda: proxy.held() == 1, timeout=10)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    assert request(conn, "GET", "/")[0] == 200  # the second request: the fault was spent
    conn.close()
    proxy.stop()
    assert hole.recv(1) == b""
    hole.close()
    assert proxy.held() == 0


def test_reset_closes_the_connection_with_an_rst(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.reset(only="graphql")
    with pytest.raises(ConnectionResetError):
        raw(proxy.port, b"POST /graphql HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}")
    assert upstream.seen == []
    assert proxy.records()[0].fault == "reset"


def test_status_429_carries_wandbs_rate_limit_headers_and_keeps_the_connection(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    headers = rate_limit_headers(retry_after=2, remaining=0, reset=5)
    assert headers == {"Retry-After": "2", "RateLimit-Remaining": "0", "RateLimit-Reset": "5"}
    proxy.status(429, headers, only="filestream")
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    status, got, _ = request(conn, "POST", FILESTREAM, b"{}")
    assert status == 429
    assert {k: got[k] for k in headers} == headers
    assert upstream.seen == []
    proxy.healthy()
    assert request(conn, "POST", FILESTREAM, b"{}")[0] == 200  # the same connection
    conn.close()
    assert proxy.stats()["connections"] == 1
    assert proxy.stats()["kinds"]["filestream"]["status_429"] == 1


def test_status_500_for_a_number_of_requests_then_healthy(proxy: FaultProxy) -> None:
    proxy.status(500, times=2)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    assert [request(conn, "GET", "/")[0] for _ in range(3)] == [500, 500, 200]
    conn.close()
    assert proxy.requests(faulted=True) == 2


def test_a_kinds_own_fault_wins_and_is_lifted_alone(proxy: FaultProxy) -> None:
    proxy.status(503)
    proxy.status(429, only="filestream")
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    assert request(conn, "POST", FILESTREAM, b"{}")[0] == 429
    assert request(conn, "POST", "/graphql", b"{}")[0] == 503
    proxy.healthy(only="filestream")
    assert request(conn, "POST", FILESTREAM, b"{}")[0] == 503
    proxy.healthy()
    assert request(conn, "POST", FILESTREAM, b"{}")[0] == 200
    conn.close()


def test_no_server_behind_resets_the_client() -> None:
    with FaultProxy(free_port()) as proxy:
        with pytest.raises(ConnectionResetError):
            raw(proxy.port, b"POST /graphql HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n")
        [record] = proxy.records()
        assert (record.status, record.fault) == (None, None)


def test_the_exit_code_the_server_accepted_is_recorded(proxy: FaultProxy) -> None:
    final = json.dumps(
        {
            "files": {"wandb-history.jsonl": {"offset": 0, "content": ["{}", "{}"]}},
            "complete": True,
            "exitcode": 3,
        }
    ).encode()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    proxy.status(500, only="filestream", times=1)
    assert request(conn, "POST", FILESTREAM, final)[0] == 500
    assert proxy.exit_codes() == {} and proxy.history_lines() == {}  # refused: not counted
    assert request(conn, "POST", FILESTREAM, final)[0] == 200
    conn.close()
    assert proxy.exit_codes() == {"run1": 3}
    assert proxy.completed_runs() == {"run1"}
    assert proxy.history_lines() == {"run1": 2}


def test_the_command_line_proxy_is_steered_through_its_control_endpoints(
    upstream: Upstream,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.online.fault_proxy", "--upstream", str(upstream.port)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("LISTENING "), (line, proc.stderr.read() if proc.stderr else "")
        port = int(line.split()[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        spec = json.dumps({"fault": "status", "code": 503, "only": "graphql"}).encode()
        assert request(conn, "POST", "/__fault_proxy__/fault", spec)[0] == 200
        assert request(conn, "POST", "/graphql", b"{}")[0] == 503
        assert request(conn, "GET", "/")[0] == 200
        bad = json.dumps({"fault": "nonsense"}).encode()
        assert request(conn, "POST", "/__fault_proxy__/fault", bad)[0] == 400
        stats = json.loads(request(conn, "GET", "/__fault_proxy__/stats")[2])
        assert stats["requests"] == 2  # the control requests are not counted
        conn.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0
        final = json.loads(out.strip().splitlines()[-1])
        assert final["kinds"]["graphql"]["status_503"] == 1
        assert final["kinds"]["other"]["status_200"] == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
