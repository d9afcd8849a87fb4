"""The node logger's loop (issue 38): the node's streams in, one connection to the root out.

Every rank of the node connects here over the node's private IPC endpoint, exactly as it
would to the logger; each of its frames goes to the root as ``[stream identity, frame]`` over
one TCP connection (CURVE), undecoded, in order, and each reply of the root goes back to the
stream it names. The root sees every rank as its own stream, so every rule the wire keeps
between a rank and the logger (numbering, saved points, exactly once across the root's
death, health by global rank) holds through this hop unchanged.

**This process's death loses nothing.** What it held in its queues is in its ranks' replay
buffers (the root has not said it is saved). Its successor binds the same endpoint, and asks
every stream its predecessor knew (``node-streams.json`` in the node's private directory) to
say hello again: each resends from its oldest unsaved batch, and the root, which never
stopped, takes only the numbers it had not taken (``_logger/streams.py``). A frame from a
stream the successor does not know is answered the same way, and not forwarded.

**It leaves when its node is done**: once the rank that started it is gone (or it is asked
to stop), and every process it served has exited (a stream waits for its saved points a
moment after its receipt: the node logger carries them); bounded by ``EXIT_LINGER``
seconds.
"""

from __future__ import annotations

import json
import os
import socket
import time

from wandb_funnel import _pid
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import HELLO, Hello, NodeHello
from wandb_funnel._protocol.sockets import NodeSockets

STREAMS_FILE = "node-streams.json"  # the streams this node's loggers have served
_BEAT = 1.0  # seconds between NodeHellos (the root's liveness of this node)
_REHELLO_EVERY = 0.5  # a successor asks its predecessor's streams this often ...
_REHELLO_FOR = 30.0  # ... for at most this long (a stream that never answers has died)
_CHECK_EVERY = 0.25  # seconds between looks at the starter's and the streams' pids
EXIT_LINGER = 30.0  # seconds a node logger waits for its streams once its starter is gone
_DRAIN = 500  # frames taken from one side before looking at the other


class NodeRelay:
    """One node logger's state; ``serve()`` runs until the node is done."""

    def __init__(
        self,
        sockets: NodeSockets,
        *,
        token: str,
        node: int,
        parent_pid: int,
        state_dir: str,
        generation: int = 0,
    ) -> None:
        self._socks = sockets
        self._token = token
        self._node = node
        self._parent = parent_pid
        self._file = os.path.join(state_dir, STREAMS_FILE)
        self._generation = generation
        self._host = socket.gethostname()
        self._pending: list[bytes] | None = None  # a frame the root's queue had no room for
        self.streams: dict[bytes, int] = {}  # identity -> pid, of every stream said hello
        # A successor: its predecessor's streams, asked to say hello again until they do.
        self._ask: dict[bytes, int] = self._read_streams() if generation else {}
        self._asked_at = 0.0
        self._started = time.monotonic()
        self.stop_asked = False
        self._leaving_since: float | None = None
        self.forwarded = 0
        self.stale = 0  # frames of streams a predecessor served, before their hello again
        self.junk = 0

    def _read_streams(self) -> dict[bytes, int]:
        try:
            with open(self._file, encoding="utf-8") as fh:
                data = json.load(fh)
            return {bytes.fromhex(k): int(v) for k, v in data.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}

    def _write_streams(self) -> None:
        known = {**{k.hex(): v for k, v in self._read_streams().items()}}
        known.update({k.hex(): v for k, v in self.streams.items()})
        tmp = f"{self._file}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(known, fh)
        os.replace(tmp, self._file)

    # -- the loop ------------------------------------------------------------------------------
    def serve(self) -> None:
        next_beat = next_check = 0.0
        while True:
            local_in, up_in, up_out = self._socks.poll(0.05, self._pending is not None)
            if self._pending is not None and up_out and self._socks.send_up(self._pending):
                self._pending = None
            if up_in:
                self._from_root()
            if local_in and self._pending is None:
                self._from_ranks()
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + _BEAT
                self._beat("live")
            if self._ask and now - self._asked_at >= _REHELLO_EVERY:
                self._asked_at = now
                self._ask_again(now)
            if now >= next_check:
                next_check = now + _CHECK_EVERY
                if self._node_done(now):
                    self._beat("ended")
                    return

    def _beat(self, state: str) -> None:
        hello = NodeHello(
            self._token,
            self._node,
            self._host,
            os.getpid(),
            state,
            self.forwarded,
            self.stale,
            self.junk,
        )
        self._socks.send_up([codec.encode_node_hello(hello)])  # a full queue skips one beat

    def _from_root(self) -> None:
        for _ in range(_DRAIN):
            parts = self._socks.recv_up()
            if parts is None:
                return
            if len(parts) != 2:
                self.junk += 1
                continue
            self._socks.send_local(parts[0], parts[1])

    def _from_ranks(self) -> None:
        for _ in range(_DRAIN):
            parts = self._socks.recv_local()
            if parts is None:
                return
            if len(parts) != 2:
                self.junk += 1
                continue
            identity, frame = parts
            if identity not in self.streams and not self._first_frame(identity, frame):
                continue
            if not self._socks.send_up(parts):
                self._pending = parts  # the root is behind: the ranks wait, nothing is lost
                return
            self.forwarded += 1

    def _first_frame(self, identity: bytes, frame: bytes) -> bool:
        """A stream's first frame here: its hello is forwarded (and the stream noted, for a
        successor); anything else, from a stream a predecessor served, is answered with
        REHELLO and not forwarded (the stream resends it)."""
        if codec.peek_kind(frame) == HELLO:
            try:
                hello = codec.decode(frame, 1 << 16)
            except codec.DecodeError:
                hello = None
            if isinstance(hello, Hello):
                self.streams[identity] = hello.pid
                self._ask.pop(identity, None)
                self._write_streams()
            return True
        if self._generation:
            self.stale += 1
            self._socks.send_local(identity, codec.REHELLO_FRAME)
            return False
        return True  # the root counts a stranger's frame as junk, as it would from a rank

    def _ask_again(self, now: float) -> None:
        if now - self._started >= _REHELLO_FOR:
            self._ask.clear()
            return
        for identity, pid in list(self._ask.items()):
            if not _pid.pid_alive(pid):
                del self._ask[identity]
            else:
                self._socks.send_local(identity, codec.REHELLO_FRAME)

    def _node_done(self, now: float) -> bool:
        """Whether to leave: the starter gone (or a stop asked), and every process served
        has exited, or ``EXIT_LINGER`` has passed since."""
        if not self.stop_asked and _pid.pid_alive(self._parent):
            return False
        if self._leaving_since is None:
            self._leaving_since = now
        if any(_pid.pid_alive(pid) for pid in set(self.streams.values())):
            return now - self._leaving_since >= EXIT_LINGER
        return self._pending is None
