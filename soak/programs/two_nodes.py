"""Two torchrun agents on this machine stand in for two nodes (issue 38): ``ddp.py`` under
``torchrun --nnodes 2 --node-rank 0|1 --master-addr 127.0.0.1``, N ranks each, so node 1's
ranks reach the funnel through node 1's node logger.

    python two_nodes.py N [ddp.py's arguments]

Exits with the first non-zero exit code of the two agents (0 when both end well); a SIGTERM
or SIGINT to this process is passed on to both.
"""

from __future__ import annotations

import pathlib
import signal
import socket
import subprocess
import sys
from types import FrameType

DDP = pathlib.Path(__file__).resolve().with_name("ddp.py")


def main() -> int:
    nproc, rest = sys.argv[1], sys.argv[2:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    agents = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", nproc),
                *("--nnodes", "2", "--node-rank", str(node)),
                *("--master-addr", "127.0.0.1", "--master-port", port),
                str(DDP),
                *rest,
            ]
        )
        for node in (0, 1)
    ]

    def forward(signum: int, frame: FrameType | None) -> None:
        for agent in agents:
            if agent.poll() is None:
                agent.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [agent.wait() for agent in agents]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())
