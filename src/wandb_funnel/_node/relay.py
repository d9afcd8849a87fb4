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
from collections import deque

from wandb_funnel import _pid
from wandb_funnel._node.fold import Folder, Out
from wandb_funnel._protocol import codec, node_wire
from wandb_funnel._protocol.messages import (
    GOODBYE,
    HELLO,
    RECORDS,
    WELCOME,
    Hello,
    NodeHello,
    NodePlan,
    NodeSaved,
    Saved,
    Welcome,
)
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
        max_frame: int = 1 << 20,
    ) -> None:
        self._socks = sockets
        self._token = token
        self._node = node
        self._parent = parent_pid
        self._file = os.path.join(state_dir, STREAMS_FILE)
        self._generation = generation
        self._host = socket.gethostname()
        # What goes to the root, in order; while the root's queue has no room, ranks wait.
        self._out: deque[list[bytes]] = deque()
        self.folder = Folder(max_frame)  # pre-reduction, once the root says to
        self._max_frame = max_frame
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
            local_in, up_in, up_out = self._socks.poll(0.05, bool(self._out))
            if up_out:
                self._send()
            if up_in:
                self._from_root()
            if local_in and not self._out:
                self._from_ranks()
            now = time.monotonic()
            self._send(self.folder.tick(now))
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
            self.folder.folded,
        )
        self._socks.send_up([node_wire.encode_node_hello(hello)])  # a full queue skips one beat

    def _send(self, messages: Out | None = None) -> None:
        """Queue ``messages`` behind what waits, and send what the root's queue takes."""
        if messages:
            self._out.extend(messages)
        while self._out and self._socks.send_up(self._out[0]):
            self._out.popleft()

    def _from_root(self) -> None:
        for _ in range(_DRAIN):
            parts = self._socks.recv_up()
            if parts is None:
                return
            if len(parts) == 1:  # the root's word to this node logger
                self._word(parts[0])
            elif len(parts) != 2:
                self.junk += 1
            else:
                if codec.peek_kind(parts[1]) == WELCOME:
                    self._welcome(parts[0], parts[1])
                self._socks.send_local(parts[0], parts[1])

    def _word(self, frame: bytes) -> None:
        """The root's plan, or its ranks' saved points (each told its own)."""
        try:
            word = codec.decode(frame, self._max_frame)
        except codec.DecodeError:
            word = None
        if isinstance(word, NodePlan):
            self.folder.plan(word)
        elif isinstance(word, NodeSaved):
            for identity, seq in word.points:
                self._socks.send_local(identity, codec.encode_saved(Saved(seq)))
        else:
            self.junk += 1

    def _welcome(self, identity: bytes, frame: bytes) -> None:
        try:
            welcome = codec.decode(frame, self._max_frame)
        except codec.DecodeError:
            return
        if isinstance(welcome, Welcome):
            self.folder.welcome(identity, welcome.rank)

    def _from_ranks(self) -> None:
        for _ in range(_DRAIN):
            parts = self._socks.recv_local()
            if parts is None:
                return
            if len(parts) != 2:
                self.junk += 1
                continue
            identity, frame = parts
            kind = codec.peek_kind(frame)
            if kind == HELLO:
                if not self._hello(identity, frame):
                    continue
            elif identity not in self.streams and not self._stranger(identity):
                continue
            if kind == RECORDS:
                self._send(self.folder.records(identity, frame, time.monotonic()))
            else:
                if kind == GOODBYE:
                    self._send(self.folder.goodbye(identity))
                self._send([parts])
            self.forwarded += 1
            if self._out:
                return  # the root is behind: the ranks wait, nothing is lost

    def _hello(self, identity: bytes, frame: bytes) -> bool:
        """A stream's hello is forwarded (and the stream noted, for a successor), after what
        it must follow; a hello that does not decode is forwarded for the root to count."""
        try:
            hello = codec.decode(frame, 1 << 16)
        except codec.DecodeError:
            return True
        if isinstance(hello, Hello):
            if identity not in self.streams:
                self.streams[identity] = hello.pid
                self._ask.pop(identity, None)
                self._write_streams()
            self._send(self.folder.hello(identity, hello.resume))
        return True

    def _stranger(self, identity: bytes) -> bool:
        """A frame of a stream that has not said hello here: from a stream a predecessor
        served, it is answered with REHELLO and not forwarded (the stream resends it)."""
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
        # Nothing is held back from here on (a rank killed outright says no goodbye).
        self._send(self.folder.leaving())
        if any(_pid.pid_alive(pid) for pid in set(self.streams.values())):
            return now - self._leaving_since >= EXIT_LINGER
        # (bounded: a root that takes nothing more must not keep this process for ever)
        return not self._out or now - self._leaving_since >= EXIT_LINGER
