"""Telling ranks their records are on disk (``Saved``): the writer posts the points that
moved, the receiver's thread (the socket is its own) sends them.

At most ``RATE`` ranks a second: each is a message through the socket, and at 16,384 ranks
telling every rank at every flush cost the root about a tenth of a core (issue 38). The
ranks behind a node logger are told in one ``NodeSaved`` frame to it. A rank needs its
point only to trim its replay buffer, which holds a few seconds of batches easily, and at
its close, when it waits for it (``SAVED_WAIT``): a rank that said goodbye is told at once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from wandb_funnel._protocol import codec, node_wire
from wandb_funnel._protocol.messages import NodeSaved, Saved

if TYPE_CHECKING:
    from wandb_funnel._logger.streams import Peer
    from wandb_funnel._protocol.sockets import LoggerSocket

RATE = 4_000  # ranks told a second, about (a small job's ranks are told at every flush)


class SavedReplies:
    def __init__(self, sock: LoggerSocket, peers: Mapping[bytes, Peer]) -> None:
        self._sock = sock
        self._peers = peers
        self._lock = threading.Lock()
        self._moved: dict[int, int] = {}  # rank -> saved point not yet told
        self._ending: dict[int, bytes] = {}  # ranks that said goodbye -> their identity
        self._urgent: dict[int, int] = {}  # their points not yet told
        self._next = 0.0

    def post(self, moved: dict[int, int]) -> None:
        """The writer's news: these ranks' records below these points are on disk."""
        with self._lock:
            self._moved.update(moved)
            if self._ending:
                for rank, seq in moved.items():
                    if rank in self._ending:
                        self._urgent[rank] = seq

    def ending(self, rank: int, identity: bytes) -> None:
        """``rank`` said goodbye: it waits for its point, which goes at once from now on."""
        with self._lock:
            self._ending[rank] = identity
            if rank in self._moved:  # posted before it said goodbye, and held by the rate
                self._urgent[rank] = self._moved[rank]

    def send(self, now: float) -> None:
        """What is due: every point not yet told when the rate allows, else the ending
        ranks'. On the receiver's thread."""
        with self._lock:
            urgent, self._urgent = self._urgent, {}
            if self._moved and now >= self._next:
                moved, self._moved = self._moved, {}
            else:
                moved = {}
                for rank in urgent:
                    self._moved.pop(rank, None)
            ending = self._ending
        if moved:
            by_node: dict[bytes, list[list[Any]]] = {}
            routes = self._sock.routes
            for identity, peer in list(self._peers.items()):
                seq = moved.get(peer.rank)
                if seq is None:
                    continue
                route = routes.get(identity)  # an ended rank too: it waits for this at exit
                if route is None:
                    self._sock.reply(identity, codec.encode_saved(Saved(seq)))
                else:
                    by_node.setdefault(route, []).append([identity, seq])
            for route, points in by_node.items():  # one frame a node logger
                self._sock.reply(route, node_wire.encode_node_saved(NodeSaved(points)))
            # paced by ranks, not messages: a pass over every stream is the cost that grows
            self._next = now + len(moved) / RATE
        else:
            for rank, seq in urgent.items():
                self._sock.reply(ending[rank], codec.encode_saved(Saved(seq)))
