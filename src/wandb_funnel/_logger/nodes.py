"""The nodes of a job in the node tier (issue 38), as the root logger knows them: its own, and
each node logger's, from the NodeHello it says when it connects and every second after.

Which ranks a node has is read, when asked, from where each stream's frames come from: the
socket notes the node logger each forwarded stream came through (``LoggerSocket.routes``), so
a rank that reconnects through a restarted node logger moves with it. Pure bookkeeping: the
receiver's thread writes, ``snapshot`` is read from the main thread (a copy of plain data).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wandb_funnel._constants import REMOTE_SILENCE
from wandb_funnel._protocol.messages import NodeHello, NodePlan

if TYPE_CHECKING:
    from wandb_funnel._logger.streams import Streams


@dataclass(slots=True)
class _Node:
    node: int
    host: str
    pid: int
    last_seen: float
    state: str = "live"
    restarts: int = 0  # node loggers of this node that came after the first
    counts: tuple[int, int, int, int] = (0, 0, 0, 0)  # its logger's counts, named in COUNTS
    period: float = 0.0  # the fold period it was told (NodePlan)


COUNTS = ("forwarded", "stale", "junk", "folded")  # a node logger's counts, as status names them


def fold_period(nodes: int) -> float:
    """Seconds between a node logger's Folded frames: 0.2 up to 256 nodes, then longer with
    the nodes, to 1 s from 1,280 on (the root's cost is per frame and per stream it names:
    about 2,000 frames a second at most; a row waits a period more)."""
    return round(min(1.0, max(0.2, nodes / 1280)), 2)


class Nodes:
    """The root's view of the node tier; ``own`` is the root's node (None: flat, no nodes)."""

    def __init__(
        self, own: int | None, streams: Streams, routes: Mapping[bytes, bytes], plan: NodePlan
    ) -> None:
        self.own = own
        self._plan = plan
        self._streams = streams
        self._routes = routes  # stream identity -> the node logger it came through
        self._by_route: dict[bytes, _Node] = {}  # a node logger's socket identity -> its node
        self._by_node: dict[int, _Node] = {}

    @property
    def tiered(self) -> bool:
        return self.own is not None

    def new(self, route: bytes) -> bool:
        """Whether this node logger has not said its word yet."""
        return route not in self._by_route

    def seen(self, route: bytes, hello: NodeHello, token: str) -> bool:
        """A node logger said which node it serves; False: not with the job's token."""
        if hello.token != token:
            return False
        now = time.monotonic()
        node = self._by_route.get(route)
        if node is None:
            earlier = self._by_node.get(hello.node)
            node = _Node(hello.node, hello.host, hello.pid, now)
            if earlier is not None and earlier.pid != hello.pid:
                node.restarts = earlier.restarts + 1
            self._by_route[route] = self._by_node[hello.node] = node
        node.last_seen = now
        node.state = hello.state
        node.counts = (hello.forwarded, hello.stale, hello.junk, hello.folded)
        return True

    def plan(self, route: bytes, new: bool, hello: NodeHello) -> NodePlan | None:
        """The plan to tell a node logger that said ``hello``, or None: told when it is
        ``new``, again while it has folded nothing (the word may be lost), and when the job
        has grown enough nodes that it should fold less often."""
        node = self._by_route.get(route)
        if node is None:
            return None
        period = fold_period(len(self._by_node))
        if new or not hello.folded or period > node.period * 1.5:
            node.period = period
            return self._plan._replace(period=period)
        return None

    def count(self) -> int:
        """Nodes of the job seen so far, the root's own included."""
        return len(self._by_node.keys() | ({self.own} if self.own is not None else set()))

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """``wandb-funnel status``'s ``nodes``: each node, its host, its logger's pid, its
        ranks and its state (``live``, ``ended``, or ``gone``: silent past
        ``REMOTE_SILENCE``), and what its node logger has forwarded, sent back as stale and
        dropped as malformed, as of its last word (the root's own node forwards nothing).
        Safe from another thread: it reads copies."""
        ranks: dict[int | None, set[int]] = {}
        by_route = dict(self._by_route)
        routes = dict(self._routes)
        for identity, peer in self._streams.items():
            rank = peer.rank
            route = routes.get(identity)
            node = by_route.get(route) if route is not None else None
            ranks.setdefault(node.node if node is not None else self.own, set()).add(rank)
        out = []
        if self.own is not None:
            out.append(
                {
                    "node": self.own,
                    "host": socket.gethostname(),
                    "logger_pid": os.getpid(),
                    "ranks": sorted(ranks.get(self.own, ())),
                    "state": "live",
                    "restarts": 0,
                    **dict.fromkeys(COUNTS, 0),
                }
            )
        for node in sorted(dict(self._by_node).values(), key=lambda n: n.node):
            if node.node == self.own:
                continue
            state = node.state
            if state == "live" and now - node.last_seen > REMOTE_SILENCE:
                state = "gone"
            out.append(
                {
                    "node": node.node,
                    "host": node.host,
                    "logger_pid": node.pid,
                    "ranks": sorted(ranks.get(node.node, ())),
                    "state": state,
                    "restarts": node.restarts,
                    **dict(zip(COUNTS, node.counts, strict=True)),
                }
            )
        return out
