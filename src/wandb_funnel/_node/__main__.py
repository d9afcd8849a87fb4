"""A node logger's process (imported by ``_node.starter.NODE_BOOTSTRAP`` without the
package's ``__init__``, and run at import): its start message (one JSON line on stdin), its
sockets, a ready line on stdout, the loop, and nothing left behind (its private directory
goes with the last node logger of the node, once it leaves for good)."""

from __future__ import annotations

import json
import os
import signal
import sys
from types import FrameType

from wandb_funnel import _private_dir
from wandb_funnel._node.relay import NodeRelay
from wandb_funnel._protocol.messages import NodeStart
from wandb_funnel._protocol.sockets import NodeSockets


def _line(payload: dict[str, object]) -> None:
    try:
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def main() -> int:
    try:
        start = NodeStart.from_json(sys.stdin.buffer.readline())
    except ValueError as exc:
        _line({"error": str(exc)})
        return 2
    try:
        sockets = NodeSockets(start.endpoint, start.upstream, start.curve, start.max_frame)
    except OSError as exc:
        _line({"error": str(exc)})
        return 1
    relay = NodeRelay(
        sockets,
        token=start.token,
        node=start.node,
        parent_pid=start.parent_pid,
        state_dir=start.ipc_dir,
        generation=start.generation,
        max_frame=start.max_frame,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        relay.stop_asked = True  # leave once the node's processes are done (bounded)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _line({"ready": os.getpid()})
    try:
        relay.serve()
    finally:
        sockets.close(1.0)
    _private_dir.remove(start.ipc_dir)
    if relay.junk:  # never silently: a frame that was not [identity, frame] was dropped
        print(
            f"wandb-funnel node logger (node {start.node}): {relay.junk} malformed frames "
            f"dropped ({relay.forwarded} forwarded)",
            file=sys.stderr,
            flush=True,
        )
    return 0


code = main()
sys.stdout.flush()
os._exit(code)  # nothing of the package's exit hooks runs here, and nothing is waited for
