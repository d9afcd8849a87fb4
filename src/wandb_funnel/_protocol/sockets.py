"""ZeroMQ sockets and endpoints; the only module that imports zmq.

Clients hold a DEALER socket per stream and the logger binds one ROUTER, so the logger sees
every stream's identity on each frame and can answer a HELLO with the rank it assigned. Every
socket has a bounded LINGER (pyzmq's default is forever, the classic hang at exit), bounded
high-water marks, and every receive here is either non-blocking or polled with a timeout.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Final

import zmq

from wandb_funnel import _private_dir

# A Unix socket path must fit in sockaddr_un.sun_path (108 bytes with the NUL).
_MAX_IPC_PATH: Final = 100

# Re-entrant: a SIGTERM handler runs on the main thread and may need it while that thread
# already holds it.
_lock = threading.RLock()
_context: zmq.Context[zmq.Socket[bytes]] | None = None
_context_pid: int = -1
# Contexts inherited through fork. They are kept referenced, never used and never closed: the
# child must not touch the parent's ZeroMQ state (its I/O threads did not survive the fork).
_orphans: list[object] = []


def _forget_inherited() -> None:
    global _context, _context_pid, _lock
    if _context is not None:
        _orphans.append(_context)
    _context, _context_pid = None, -1
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_forget_inherited)


def process_context() -> zmq.Context[zmq.Socket[bytes]]:
    """This process's own ZeroMQ context (never one inherited through fork)."""
    global _context, _context_pid
    with _lock:
        if _context is None or _context_pid != os.getpid():
            if _context is not None:
                _orphans.append(_context)
            _context = zmq.Context()
            _context_pid = os.getpid()
        return _context


def term_process_context(timeout: float) -> bool:
    """Terminate this process's context so queued frames leave before exit; bounded.

    Sockets must already be closed with a bounded linger, so term() returns once their last
    frames are sent or their linger ran out. The thread guards against anything unforeseen.
    """
    global _context, _context_pid
    with _lock:
        ctx, _context, _context_pid = _context, None, -1
    if ctx is None:
        return True
    done = threading.Event()

    def term() -> None:
        try:
            ctx.term()
        finally:
            done.set()

    threading.Thread(target=term, name="wandb-funnel-term", daemon=True).start()
    return done.wait(timeout)


def private_ipc_endpoint(name: str = _private_dir.SOCKET) -> tuple[str, str]:
    """A fresh ``ipc://`` endpoint inside a new 0700 directory; returns (endpoint, directory)."""
    import tempfile  # the owner's alone: a worker's import skips it

    base = tempfile.gettempdir()
    if len(base) > _MAX_IPC_PATH - 30:
        base = "/tmp"
    directory = tempfile.mkdtemp(prefix="wandb-funnel-", dir=base)  # mkdtemp makes it 0700
    os.chmod(directory, 0o700)
    return f"ipc://{os.path.join(directory, name)}", directory


# The owner removes the directory with its socket once the funnel has closed.
remove_ipc_dir = _private_dir.remove


def new_curve_keys() -> dict[str, str]:
    """A fresh CURVE key pair for the logger and one shared by the job's clients (Z85)."""
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    return {
        "server_public": server_public.decode(),
        "server_secret": server_secret.decode(),
        "client_public": client_public.decode(),
        "client_secret": client_secret.decode(),
    }


def client_curve(keys: dict[str, str]) -> dict[str, str]:
    """What a client needs (never the logger's secret)."""
    return {k: keys[k] for k in ("server_public", "client_public", "client_secret")}


# ROUTER identities that start with a zero byte are ZeroMQ's own (generated ones); ours start
# with a byte that says which kind of peer is talking, and never collide with those.
STREAM_PREFIX: Final = b"\x01"  # a stream: one rank of one process (HELLO, records, GOODBYE)
CLOSER_PREFIX: Final = b"\x02"  # the owner's CLOSE socket: never a rank
# A node logger (issue 38): it forwards its node's streams as [stream identity, frame], and
# says its own NodeHello as a single frame.
NODE_PREFIX: Final = b"\x03"


class ClientSocket:
    """One stream's DEALER socket. Not thread-safe: the caller serialises use."""

    def __init__(
        self, endpoint: str, identity: bytes, send_hwm: int, curve: dict[str, str] | None = None
    ) -> None:
        self._sock = process_context().socket(zmq.DEALER)
        if curve:
            # Encrypted, and only a client holding the job's key pair gets through.
            self._sock.curve_serverkey = curve["server_public"].encode()
            self._sock.curve_publickey = curve["client_public"].encode()
            self._sock.curve_secretkey = curve["client_secret"].encode()
        self._sock.setsockopt(zmq.LINGER, 0)  # set again, bounded, at close
        self._sock.setsockopt(zmq.SNDHWM, send_hwm)
        self._sock.setsockopt(zmq.RCVHWM, 100)
        self._sock.setsockopt(zmq.ROUTING_ID, identity)
        try:
            self._sock.connect(endpoint)
        except zmq.ZMQError as exc:
            self._sock.close(linger=0)
            # pyzmq's own error, kept (errno and all), with the address that failed.
            raise zmq.ZMQError(
                exc.errno, f"{exc.strerror} (wandb_funnel: connecting to {endpoint!r})"
            ) from exc
        self._closed = False
        self._busy = 0  # calls into pyzmq in progress on this (the caller's) thread
        self._close_linger: int | None = None  # a close that waits for them, in ms

    # A signal handler on this thread may close us (the user's finish()) while a call below
    # is inside pyzmq, which retries an interrupted system call on the same handle: the close
    # waits until the outermost call returns (``_busy``), and that call then reports closed.

    def try_send(self, frame: bytes) -> bool:
        """Queue ``frame`` without waiting; False when the queue is full (or we are closed)."""
        if self._closed:
            return False
        self._busy += 1
        try:
            self._sock.send(frame, zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False
        finally:
            self._unbusy()

    def send_within(self, frame: bytes, timeout: float) -> bool:
        """Queue ``frame``, waiting at most ``timeout`` seconds for room."""
        if self.try_send(frame):
            return True
        if self._closed or timeout <= 0 or not self._poll(timeout, zmq.POLLOUT):
            return False
        return self.try_send(frame)

    def wait_for_room(self, timeout: float) -> bool:
        """Whether the queue has room for a frame, waiting at most ``timeout`` seconds."""
        return not self._closed and self._poll(timeout, zmq.POLLOUT)

    def recv_within(self, timeout: float) -> bytes | None:
        """The next reply frame, waiting at most ``timeout`` seconds."""
        if self._closed:
            return None
        if timeout > 0 and not self._poll(timeout, zmq.POLLIN):
            return None
        if self._closed:
            return None
        self._busy += 1
        try:
            return self._sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None
        finally:
            self._unbusy()

    def _poll(self, timeout: float, events: int) -> bool:
        self._busy += 1
        try:
            return bool(self._sock.poll(int(timeout * 1000), events)) and not self._closed
        finally:
            self._unbusy()

    def _unbusy(self) -> None:
        self._busy -= 1
        if not self._busy and self._close_linger is not None:
            linger, self._close_linger = self._close_linger, None
            self._sock.close(linger=linger)

    def close(self, linger: float) -> None:
        if not self._closed:
            self._closed = True
            if self._busy:
                self._close_linger = max(0, int(linger * 1000))  # see _busy
            else:
                self._sock.close(linger=max(0, int(linger * 1000)))


class _OnlyOurClients:
    """ZAP credentials check: the job's client key gets in, nothing else."""

    def __init__(self, client_public: bytes) -> None:
        self._key = client_public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self._key


_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class LoggerSocket:
    """The logger's ROUTER: (identity, frame) in, replies out. Owned by one thread.

    Always bound to the private IPC endpoint; with ``tcp_host`` also to a random TCP port on
    that address (never all interfaces), and then with CURVE: encrypted, and only clients
    holding the job's key get past the handshake. Refused handshakes are counted.
    """

    def __init__(
        self,
        endpoint: str,
        recv_hwm: int,
        max_frame_bytes: int,
        tcp_host: str | None = None,
        curve: dict[str, str] | None = None,
        tcp_endpoint: str | None = None,
    ) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # A peer that sends a bigger frame is disconnected by ZeroMQ before it is buffered.
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        self._sock.setsockopt(zmq.RCVHWM, recv_hwm)
        self._sock.setsockopt(zmq.SNDHWM, 10_000)
        self._auth: Any = None
        self.tcp_endpoint: str | None = None
        if curve:
            from zmq.auth.thread import ThreadAuthenticator  # only a TCP (multi-node) logger

            self._auth = ThreadAuthenticator(self._ctx)
            self._auth.start()
            provider = _OnlyOurClients(curve["client_public"].encode())
            self._auth.configure_curve_callback(domain="*", credentials_provider=provider)
            self._sock.curve_server = True
            self._sock.curve_secretkey = curve["server_secret"].encode()
            self._sock.curve_publickey = curve["server_public"].encode()
        self._monitor = self._sock.get_monitor_socket(_HANDSHAKE_FAILED)
        try:
            # A restarted logger binds the dead one's endpoints: the ranks' sockets reconnect
            # by themselves (ZeroMQ replaces a Unix socket file left behind).
            self._sock.bind(endpoint)
            if tcp_endpoint is not None:
                self._sock.bind(tcp_endpoint)
                self.tcp_endpoint = tcp_endpoint
            elif tcp_host is not None:
                port = self._sock.bind_to_random_port(f"tcp://{tcp_host}")
                self.tcp_endpoint = f"tcp://{tcp_host}:{port}"
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(f"wandb_funnel: cannot bind the logger to {endpoint!r}: {exc}") from exc
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        # A stream forwarded by a node logger -> that node logger's identity: its replies go
        # back the same way (the latest route wins: a restarted node logger is a new peer).
        self.routes: dict[bytes, bytes] = {}

    def handshake_failures(self) -> int:
        """Peers refused by the handshake since the last call (no or wrong CURVE keys)."""
        count = 0
        while True:
            try:
                self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return count
            count += 1

    def wait(self, timeout: float) -> bool:
        """True when a frame is ready, within ``timeout`` seconds."""
        return bool(self._poller.poll(max(0, int(timeout * 1000))))

    def recv_nowait(self) -> tuple[bytes, list[bytes]] | None:
        """(identity, frames) of the next message, or None when nothing is queued. A
        stream's frame forwarded by a node logger comes out as the stream's own."""
        try:
            parts = self._sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None
        identity = parts[0]
        if identity[:1] == NODE_PREFIX and len(parts) == 3 and parts[1][:1] == STREAM_PREFIX:
            self.routes[parts[1]] = identity
            return parts[1], parts[2:]
        return identity, parts[1:]

    def reply(self, identity: bytes, frame: bytes) -> None:
        route = self.routes.get(identity)
        try:
            if route is None:
                self._sock.send_multipart([identity, frame], zmq.NOBLOCK)
            else:
                self._sock.send_multipart([route, identity, frame], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the peer is gone or slow: replies are advisory

    def close(self) -> None:
        # A short linger lets the final DONE reply reach the owner.
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
        self._sock.close(linger=500)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()


class NodeSockets:
    """A node logger's two sockets (issue 38): a ROUTER on the node's private IPC endpoint,
    where the node's ranks connect as they would to the logger, and one DEALER to the root
    logger over TCP with the job's CURVE keys. Frames cross as they are, never decoded here;
    each stream's frames keep their order. Owned by one thread."""

    def __init__(
        self, endpoint: str, upstream: str, curve: dict[str, str] | None, max_frame_bytes: int
    ) -> None:
        self._ctx = zmq.Context()
        self.local = self._ctx.socket(zmq.ROUTER)
        self.local.setsockopt(zmq.LINGER, 0)
        self.local.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        self.local.setsockopt(zmq.SNDHWM, 10_000)
        self.up = self._ctx.socket(zmq.DEALER)
        if curve:
            self.up.curve_serverkey = curve["server_public"].encode()
            self.up.curve_publickey = curve["client_public"].encode()
            self.up.curve_secretkey = curve["client_secret"].encode()
        self.up.setsockopt(zmq.LINGER, 0)
        # A fresh identity per node logger: a restarted one is a new peer to the root, and
        # the root's ROUTER never refuses it for an identity still in use.
        self.up.setsockopt(zmq.ROUTING_ID, NODE_PREFIX + os.urandom(11))
        self.up.setsockopt(zmq.SNDHWM, 10_000)
        try:
            self.local.bind(endpoint)
            self.up.connect(upstream)
        except zmq.ZMQError as exc:
            self.close(0)
            raise OSError(f"wandb_funnel: node logger cannot use {endpoint!r}: {exc}") from exc

    def poll(self, timeout: float, up_out: bool) -> tuple[bool, bool, bool]:
        """(a rank's frame waits, the root's reply waits, the root takes a frame) within
        ``timeout``; ranks are not read while the root cannot take (``up_out``)."""
        poller = zmq.Poller()
        poller.register(self.local, zmq.POLLIN if not up_out else 0)
        poller.register(self.up, zmq.POLLIN | (zmq.POLLOUT if up_out else 0))
        ready = dict(poller.poll(max(0, int(timeout * 1000))))
        local, up = ready.get(self.local, 0), ready.get(self.up, 0)
        return bool(local & zmq.POLLIN), bool(up & zmq.POLLIN), bool(up & zmq.POLLOUT)

    def recv_local(self) -> list[bytes] | None:
        try:
            return self.local.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None

    def recv_up(self) -> list[bytes] | None:
        try:
            return self.up.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None

    def send_up(self, parts: list[bytes]) -> bool:
        """Queue ``parts`` to the root; False when its queue is full (the caller keeps them)."""
        try:
            self.up.send_multipart(parts, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def send_local(self, identity: bytes, frame: bytes) -> None:
        try:
            self.local.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the rank is gone or slow: replies are advisory

    def close(self, linger: float) -> None:
        self.local.close(linger=0)
        self.up.close(linger=max(0, int(linger * 1000)))
        self._ctx.term()
