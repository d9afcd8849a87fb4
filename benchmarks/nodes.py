"""The root logger under many ranks (issue 38): N simulated ranks over M nodes into one root
(null sink), through the node tier and flat, side by side at the same load.

    python benchmarks/nodes.py --nodes 2048 --ranks-per-node 8 --keys 50 --rate 10 \\
        --seconds 20 [--tier all|folded,node,flat] [--producers 4]

The ranks are simulated by ``--producers`` processes, each holding its share of the nodes:

- **flat**: one DEALER per rank to the root's TCP endpoint with the job's CURVE keys, as a
  rank on another node has;
- **node**: one DEALER per node, with the node logger's identity, sending each of its ranks'
  frames as ``[rank identity, frame]`` and a NodeHello a second: what a node logger forwards
  when it does not pre-reduce (``_node/relay.py``), without 2,048 processes on one box;
- **folded**: the same DEALERs, sending what a node logger that pre-reduces sends
  (``_node/fold.py``): one ``Folded`` frame per node every period the root tells a job of
  that many nodes (``_logger/nodes.fold_period``), its ranks' steps of that
  time folded into one state per key (built with the real ``KeyState``s, once per node: the
  ranks log the same values every step, so only the frame is packed each time). Each node
  folds on its own clock, as a node logger does (its period runs from when it started: a
  random phase here); ``--aligned`` sends every node's frame at once instead, a burst at the
  root each period (the worst case).

Every rank says hello, then every ``1/rate`` seconds sends a batch of one record of
``--keys`` float keys at the next step (one packed record per step, shared by the ranks, so
that the producers keep the pace), then goodbye, and waits for the root's receipt of it, as
a rank does at its close. The root is a real logger process with the
null sink (``WANDB_FUNNEL_SINK=null``): these are the funnel's figures, not wandb's.

Reports, per tier: the root logger's CPU as a fraction of one core over the paced window,
its peak RSS (and its RSS once every rank attached, before the first record), the TCP
connections at the root, the p99 lag from a step's schedule to its row (every row's wall
time, from the null sink: ``WANDB_FUNNEL_NULL_ROWS``),
records taken, dropped and late (in rows of their own), the goodbyes the root never
answered, and the pace the producers kept. 0 collectives: no
``torch.distributed`` call is made.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import socket
import tempfile
import time
from typing import Any

from _common import percentile, report, rss_mb


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _connections(port: int) -> int:
    """Established TCP connections to ``port`` on this host (the root's side of each)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    cols = line.split()
                    if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "01":
                        count += 1
        except OSError:
            continue
    return count


def _producer(
    tier: str,
    nodes: list[int],
    per_node: int,
    keys: int,
    rate: float,
    steps: int,
    attach: dict[str, Any],
    start: Any,
    ready: Any,
    total_nodes: int,
    aligned: bool,
) -> None:
    import zmq

    from wandb_funnel._logger.nodes import fold_period
    from wandb_funnel._protocol import codec, columns, node_wire
    from wandb_funnel._protocol.mergeable import KeyState
    from wandb_funnel._protocol.messages import Ack, Folded, Goodbye, Hello, NodeHello
    from wandb_funnel._protocol.sockets import NODE_PREFIX, STREAM_PREFIX

    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, len(nodes) * (per_node + 1) + 64)  # 1,023 by default
    curve = attach["curve"]

    def dealer(identity: bytes) -> Any:
        s = ctx.socket(zmq.DEALER)
        s.curve_serverkey = curve["server_public"].encode()
        s.curve_publickey = curve["client_public"].encode()
        s.curve_secretkey = curve["client_secret"].encode()
        s.setsockopt(zmq.LINGER, 2000)
        s.setsockopt(zmq.SNDHWM, 100_000)
        s.setsockopt(zmq.ROUTING_ID, identity)
        s.connect(attach["tcp"])
        return s

    token, pid = attach["token"], os.getpid()
    # (socket, prefix frames, requested rank) per simulated rank
    ranks: list[tuple[Any, list[bytes], int]] = []
    node_socks: list[tuple[Any, int]] = []
    for node in nodes:
        up = dealer(NODE_PREFIX + os.urandom(11)) if tier != "flat" else None
        if up is not None:
            node_socks.append((up, node))
        for local in range(per_node):
            rank = 1 + node * per_node + local
            identity = STREAM_PREFIX + os.urandom(11)
            if up is None:
                ranks.append((dealer(identity), [], rank))
            else:
                ranks.append((up, [identity], rank))
    socks = [up for up, _ in node_socks] or [s for s, _, _ in ranks]

    def beat() -> None:
        for up, node in node_socks:
            up.send(node_wire.encode_node_hello(NodeHello(token, node, f"sim-{node}", pid)))

    def drain() -> None:
        for s in socks:
            while s.poll(0):
                s.recv_multipart()

    beat()
    for s, prefix, rank in ranks:
        hello = Hello(token, pid, f"sim-{rank // per_node}", rank, None)
        s.send_multipart([*prefix, codec.encode_hello(hello)])
    ready.put(len(ranks))
    t0 = start.get()
    data = {f"k{i:02d}": float(i) for i in range(keys)}
    # folded: each node's ranks' states of one step (the same at every step), and its streams,
    # every period the root tells a job of this many nodes
    fold_every = max(1, round(rate * fold_period(total_nodes)))
    folds = []
    for up, _ in node_socks if tier == "folded" else []:
        mine = [(prefix[0], rank) for s, prefix, rank in ranks if s is up]
        states: dict[str, KeyState] = {}
        for key, value in data.items():
            for _, rank in mine:  # each rank its own value: sums that round, as a loss's do
                mine_value = value + rank / 7919
                if key in states:
                    states[key].add(rank, mine_value)
                else:
                    states[key] = KeyState(rank, mine_value)
        folds.append((up, mine, [columns.state_row(v) for v in states.values()]))

    def send_folded(
        up: Any, mine: list[tuple[bytes, int]], rows: list[Any], first: int, end: int
    ) -> None:
        streams = [[identity, first, end, end - 1, end] for identity, _ in mine]
        steps_ = [[s, True, len(mine), 0, []] for s in range(first, end)]
        folded = Folded(streams, steps_, 0, [], [list(data)], columns.pack(rows * (end - first)))
        up.send(node_wire.encode_folded(folded))

    # Each node folds on its own clock, as a node logger does (its period runs from when it
    # started): a node's phase, in steps; --aligned: every node at once (a burst at the root).
    phases = [0 if aligned else random.randrange(fold_every) for _ in folds]
    sent = [0] * len(folds)
    behind = 0.0
    next_beat = time.monotonic() + 1.0
    for step in range(steps):
        due = t0 + step / rate
        now = time.time()
        if now < due:
            time.sleep(due - now)
        else:
            behind = max(behind, now - due)
        if folds:
            for at, (up, mine, rows) in enumerate(folds):
                if (step + 1 - phases[at]) % fold_every == 0 or step + 1 == steps:
                    send_folded(up, mine, rows, sent[at], step + 1)
                    sent[at] = step + 1
        else:
            frame = codec.encode_batch(step, [codec.encode_record(step, True, data, 1 << 20)])
            for s, prefix, _ in ranks:
                s.send_multipart([*prefix, frame])
        drain()
        if node_socks and time.monotonic() >= next_beat:
            next_beat = time.monotonic() + 1.0
            beat()
    for s, prefix, _ in ranks:
        s.send_multipart([*prefix, codec.encode_goodbye(Goodbye(steps, "done", 0))])
    ready.put(("behind", behind))
    # As a rank does at its close: wait for the root's receipt of each goodbye (a socket
    # closed before its frames left would lose them, and the benchmark would count them).
    acked, deadline = 0, time.monotonic() + 120.0
    while acked < len(ranks) and time.monotonic() < deadline:
        for s in socks:
            while s.poll(0):
                frame = s.recv_multipart()[-1]
                try:
                    acked += isinstance(codec.decode(frame, 1 << 24), Ack)
                except codec.DecodeError:
                    pass
        time.sleep(0.05)
    ready.put(("unanswered", len(ranks) - acked))
    for s in socks:
        s.close()
    ctx.term()


def _row_lags(path: str, t0: float, rate: float) -> list[float]:
    """Seconds from each step's schedule to its row (the null sink's row times)."""
    lags = []
    with open(path) as fh:
        for line in fh:
            at, step = line.split()
            if step != "None":
                lags.append(max(0.0, float(at) - (t0 + int(step) / rate)))
    return lags


def _get(ready: Any, procs: list[Any]) -> Any:
    """The next producer's message; a producer that died ends the benchmark, said."""
    while ready.empty():
        dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        if dead:
            for p in procs:
                p.kill()
            raise SystemExit(f"a producer died (exit codes {dead}): see its traceback above")
        time.sleep(0.1)
    return ready.get()


def one(tier: str, args: argparse.Namespace) -> dict[str, Any]:
    import wandb_funnel as wf
    from wandb_funnel._options import FunnelOptions, Topology

    n = args.nodes * args.ranks_per_node
    steps = int(args.seconds * args.rate)
    topology = Topology(
        first_auto_rank=n + 1, tcp_host="127.0.0.1", node=None if tier == "flat" else 0
    )
    options = FunnelOptions(close_timeout=120, max_pending_rows=100_000)
    fd, row_times = tempfile.mkstemp(prefix="nodes-rows-", suffix=".txt")
    os.close(fd)
    os.environ["WANDB_FUNNEL_NULL_ROWS"] = row_times  # the logger's null sink appends there
    f = wf.Funnel(options, topology=topology, project="bench-nodes").start()
    assert f.logger_pid is not None and f.tcp_address is not None
    info = f.attach_info()
    attach = {"tcp": f.tcp_address, "token": info.token, "curve": info.curve}
    ctx = mp.get_context("spawn")
    start, ready = ctx.SimpleQueue(), ctx.SimpleQueue()
    share = [list(range(p, args.nodes, args.producers)) for p in range(args.producers)]
    procs = [
        ctx.Process(
            target=_producer,
            args=(tier, nodes, args.ranks_per_node, args.keys, args.rate, steps, attach),
            kwargs={
                "start": start,
                "ready": ready,
                "total_nodes": args.nodes,
                "aligned": args.aligned,
            },
        )
        for nodes in share
    ]
    for proc in procs:
        proc.start()
    attached = sum(_get(ready, procs) for _ in procs)
    time.sleep(2.0)  # the handshakes and hellos settle before the paced window
    settled = rss_mb(f.logger_pid)  # every rank attached, nothing logged yet
    port = int(f.tcp_address.rsplit(":", 1)[1])
    connections = _connections(port)
    t0 = time.time() + 0.5
    for _ in procs:
        start.put(t0)
    cpu0, w0, peak = _cpu_seconds(f.logger_pid), time.time(), 0.0
    said: dict[str, list[float]] = {"behind": [], "unanswered": []}
    while len(said["behind"]) < len(procs):  # every producer has sent its last step
        while ready.empty():
            peak = max(peak, rss_mb(f.logger_pid))
            time.sleep(0.25)
        what, value = _get(ready, procs)
        said[what].append(value)
    cpu1, w1 = _cpu_seconds(f.logger_pid), time.time()
    while len(said["unanswered"]) < len(procs):  # goodbyes the root never answered
        what, value = _get(ready, procs)
        said[what].append(value)
    behind, unacked = max(said["behind"]), int(sum(said["unanswered"]))
    for proc in procs:
        proc.join()
    f.close()
    lags = _row_lags(row_times, t0, args.rate)
    os.remove(row_times)
    stats = f.stats or {}
    return {
        "tier": tier,
        **({"aligned": args.aligned} if tier == "folded" else {}),
        "ranks": n,
        "nodes": args.nodes,
        "attached": attached,
        "root_cpu_core": round((cpu1 - cpu0) / (w1 - w0), 3),
        "root_peak_rss_mb": round(peak, 1),
        "root_rss_attached_mb": round(settled, 1),
        "connections_at_root": connections,
        "p99_step_to_row_s": round(percentile(lags, 99), 2) if lags else None,
        "rows_timed": len(lags),
        "records": stats.get("_funnel/records"),
        "sent": n * steps,
        "dropped": stats.get("_funnel/dropped_records"),
        "rows": stats.get("_funnel/rows"),
        "late_records": stats.get("_funnel/late_records"),  # in rows of their own
        "producers_behind_s": round(behind, 2),
        "goodbyes_unanswered": unacked,
        "host": socket.gethostname(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--tier", default="all", help="all, or a comma-separated list of folded, node, flat"
    )
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--rate", type=float, default=10.0, help="steps per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument(
        "--aligned",
        action="store_true",
        help="folded: every node sends at once (a burst at the root each period), not each "
        "on its own clock",
    )
    args = parser.parse_args()
    os.environ["WANDB_FUNNEL_SINK"] = "null"
    os.environ.setdefault("WANDB_MODE", "offline")
    tiers = ("folded", "node", "flat") if args.tier == "all" else args.tier.split(",")
    if not set(tiers) <= {"folded", "node", "flat"}:
        parser.error(f"--tier: {args.tier!r} is not all, or a list of folded, node, flat")
    for tier in tiers:
        report(**one(tier, args))


if __name__ == "__main__":
    main()
