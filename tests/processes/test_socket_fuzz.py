"""Fuzzing the logger's socket: 100,000 random and mutated frames from peers that never said a
valid hello. The logger must survive them all, keep its memory bounded, count every one of
them (as junk, or as a refused hello or close), and keep serving real ranks meanwhile and after.

Every fuzz frame is classified in the scenario with the package's own decoder: a frame that
decodes as a Hello or a Close carries a made-up token (the real one is never used in a seed,
and a mutation cannot produce 32 secret hex digits), so the logger must count it in
``funnel/rejected_peers``; every other frame (undecodable, a multi-part message, or a valid
message from a peer the logger does not know) must be counted in ``funnel/junk_frames``.
Frames reach the logger in order per peer and ZeroMQ never drops them here (blocking sends, so
a full queue waits instead), so both counts are asserted exactly. For the frame classes that
cannot be valid whatever the decoder says (strict prefixes of a frame, a wrong protocol
version, lengths that claim more than the frame holds, multi-part messages), the scenario also
checks that the decoder refuses every one of them.

Two smaller scenarios follow: 20,000 fresh, mutated and malformed frames from a peer that did
say a valid hello (its handling modelled frame by frame, so again counted exactly), and raw
connections that speak no ZeroMQ at all.
"""

from __future__ import annotations

import pytest

from tests.conftest import PRELUDE, Scripts, reports
from tests.wandb_reader import only_run

pytestmark = pytest.mark.processes

FRAMES = 100_000
CHUNKS = 10  # one DEALER per chunk; the first chunk is the warm-up for the memory baseline
MAX_RECORD_BYTES = 4096  # keeps the logger's frame limit small, so oversize frames are cheap
RSS_LIMIT = 300 * 2**20
RSS_GROWTH_LIMIT = 100 * 2**20

# The frame makers, the seeds and the peers' helpers, shared by the scenarios below.
COMMON = (
    PRELUDE
    + f"""
import collections, random, socket
import msgpack, psutil, zmq
from wandb_funnel._protocol import codec
from wandb_funnel._constants import BATCH_BYTES, ENV_TOKEN
from wandb_funnel._protocol.messages import (CONFIG, SUMMARY, Ack, Close, Done, Goodbye, Hello,
                                   Welcome)

FRAMES, CHUNKS, MAXR = {FRAMES}, {CHUNKS}, {MAX_RECORD_BYTES}
MAX_FRAME = MAXR + BATCH_BYTES + 4096  # the logger's limit (_logger.main)
rng = random.Random(20240607)
FAKE = "".join(rng.choice("0123456789abcdef") for _ in range(32))
HOST = socket.gethostname()

def seeds():
    records = [
        codec.encode_record(0, True, {{"loss": 0.5}}, MAXR),
        codec.encode_record(3, False, {{"a": {{"b": [1, 2.5, None, "x"]}}, "t": True}}, MAXR),
        codec.encode_record(2**40, True, {{"s": "é" * 10, "n": -7}}, MAXR),
        codec.encode_record(7, True, {{}}, MAXR),
    ]
    return [
        codec.encode_batch(0, records[:1]),
        codec.encode_batch(5, records),
        codec.encode_batch(0, []),  # a heartbeat
        codec.encode_batch(2**31, records[1:3]),
        codec.encode_hello(Hello(FAKE, 1234, "elsewhere", None, None)),
        codec.encode_hello(Hello(FAKE, os.getpid(), HOST, 3, 12345)),
        codec.encode_goodbye(Goodbye(4, "finished", 0)),
        codec.encode_update(CONFIG, {{"lr": 0.1, "nested": {{"x": [1]}}}}, MAXR),
        codec.encode_update(SUMMARY, {{"best": 0.9}}, MAXR),
        codec.encode_close(Close(FAKE, 0, 10.0)),
        codec.encode_welcome(Welcome(2)),
        codec.encode_ack(Ack(5)),
        codec.encode_done(Done({{"x": 1}})),
    ]

SEEDS = seeds()
INTERESTING = [0x00, 0x01, 0x7f, 0x80, 0xc0, 0xc1, 0xc2, 0xc3, 0xc6, 0xc9, 0xcf, 0xd3, 0xd9,
               0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xff, 0x90, 0x9f, 0xa0, 0xbf]
WRONG = [None, "s", -1, 1.5, [], {{}}, b"x", True, 2**64 - 1, -(2**63), [1, 2], {{"a": 1}}, "é",
         float("nan"), 0, 1, 2]

def rand_bytes(n):
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""

def split_header(frame):
    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(frame)
    header = u.unpack()
    return header, frame[u.tell():]

# ---- the frame classes ---------------------------------------------------------------
def random_frame():
    n = rng.choice([0, 1, 2, 3, 5, 8, 16, 64, rng.randrange(256), rng.randrange(4096)])
    return rand_bytes(n)

def truncated():  # a strict prefix of a valid frame: never a whole message
    s = rng.choice(SEEDS)
    return s[: rng.randrange(len(s))]

def wrong_version():  # anything that is not == 1 (True and 1.0 are == 1 in Python)
    header, rest = split_header(rng.choice(SEEDS))
    header[0] = rng.choice([0, 2, 3, 255, -1, 2**40, "1", None, [1], {{"v": 1}}, b"\\x01", 1.5])
    return msgpack.packb(header) + rest

def wrong_types():  # valid msgpack, any kind, fields of the wrong types (may be valid: classified)
    kind = rng.choice([1, 2, 3, 4, 5, 6, 16, 17, 18, 0, 7, 99, -1, "x", None])
    body = [rng.choice(WRONG) for _ in range(rng.randrange(8))]
    if rng.random() < 0.1:
        return msgpack.packb(rng.choice([{{"v": 1}}, "hello", 1, None, [1], [], b"raw"]))
    frame = msgpack.packb([1, kind, *body])
    if kind == 2 and rng.random() < 0.5:
        frame += b"".join(msgpack.packb(rng.choice([
            [0, True, []], [-1, True, {{}}], [0, 1, {{}}], [0, True, {{1: 2}}], "x",
            [2**64 - 1, True, {{}}], [0, True], [0, True, {{}}, 4]])) for _ in range(3))
    return frame

HUGE = [b"\\xdd\\xff\\xff\\xff\\xff", b"\\xdf\\xff\\xff\\xff\\xff", b"\\xc6\\xff\\xff\\xff\\xff",
        b"\\xdb\\xff\\xff\\xff\\xff", b"\\xc9\\xff\\xff\\xff\\xff\\x01", b"\\xdc\\xff\\xff",
        b"\\xde\\xff\\xff", b"\\xc5\\xff\\xff", b"\\xda\\xff\\xff", b"\\xc7\\xff\\x01"]

def huge_length():  # lengths that claim far more than the frame holds
    pick = rng.randrange(6)
    if pick == 0:
        return rng.choice(HUGE) + rand_bytes(rng.randrange(16))
    if pick == 1:  # a records header claiming 2**32-1, 2**20+1, ... records
        count = rng.choice([2**32 - 1, 2**20 + 1, 2**64 - 1, 2**20, 10**6])
        return b"\\x94\\x01\\x02\\x00" + msgpack.packb(count) + rng.choice(SEEDS[:1])[6:]
    if pick == 2:  # a record whose data map claims 2**32-1 entries
        return b"\\x94\\x01\\x02\\x00\\x01\\x93\\x00\\xc3" + rng.choice(HUGE[:2]) + b"\\xa1k\\x01"
    if pick == 3:  # a hello whose token claims 4 GiB
        return b"\\x97\\x01\\x01" + rng.choice([HUGE[3], HUGE[2], HUGE[8]]) + b"abc"
    if pick == 4:  # nesting bombs: arrays or maps nested tens of thousands deep
        unit = rng.choice([b"\\x91", b"\\x81\\xa1a", b"\\x92\\xc0"])
        return unit * rng.randrange(1000, 60_000)
    return rng.choice(SEEDS)[:3] + rng.choice(HUGE) + rng.choice(SEEDS)[3:]

def mutate(frame):
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(8)
        b = bytearray(frame)
        if op == 0 and b:  # bit flips
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # interesting bytes
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.choice(INTERESTING)
        elif op == 2:  # insert
            i = rng.randrange(len(b) + 1)
            b[i:i] = rand_bytes(rng.randint(1, 16))
        elif op == 3 and b:  # delete a range
            i = rng.randrange(len(b))
            del b[i : i + rng.randint(1, 16)]
        elif op == 4 and b:  # duplicate a range
            i = rng.randrange(len(b))
            b[i:i] = b[i : i + rng.randint(1, 32)]
        elif op == 5:  # splice with another valid frame
            other = rng.choice(SEEDS)
            b = b[: rng.randrange(len(b) + 1)] + other[rng.randrange(len(other) + 1) :]
        elif op == 6:  # two frames back to back
            b = b + rng.choice(SEEDS)
        else:  # truncate (possibly to nothing, possibly not at all)
            b = b[: rng.randrange(len(b) + 1)]
        frame = bytes(b)
    return frame

def mutated():
    return mutate(rng.choice(SEEDS))

def valid_unknown():  # valid frames, from a peer that never said a valid hello
    return rng.choice(SEEDS)

def at_the_limit():  # the biggest frames the logger takes: exactly MAX_FRAME bytes
    size = MAX_FRAME - rng.randrange(2)
    if rng.random() < 0.5:
        return rand_bytes(size)
    # A batch claiming as many (tiny, valid) records as fit: decoded, then refused as junk.
    count = (size - 16) // 4
    head = b"\\x94\\x01\\x02\\x00" + msgpack.packb(count)
    return head + b"\\x93\\x00\\xc3\\x80" * count

def multipart():  # 2..4 parts: junk whatever the parts (even a hello with the real token)
    parts = []
    for _ in range(rng.randint(2, 4)):
        parts.append(rng.choice([rng.choice(SEEDS), random_frame(), b"", REAL_HELLO]))
    return parts

# (class, share of the frames, certainly junk whatever the decoder says)
CLASSES = [
    ("random", 15_000, False), ("truncated", 15_000, True), ("wrong_version", 5_000, True),
    ("wrong_types", 10_000, False), ("huge_length", 4_990, True), ("at_the_limit", 10, False),
    ("multipart", 5_000, True), ("mutated", 40_000, False), ("valid_unknown", 5_000, False),
]
MAKERS = {{"random": random_frame, "truncated": truncated, "wrong_version": wrong_version,
          "wrong_types": wrong_types, "huge_length": huge_length, "at_the_limit": at_the_limit,
          "multipart": multipart, "mutated": mutated, "valid_unknown": valid_unknown}}
assert sum(n for _, n, _ in CLASSES) == FRAMES

def expect(frame):
    "What the logger must do with this frame from a peer it does not know."
    if isinstance(frame, list):
        return "junk"
    try:
        message = codec.decode(frame, MAX_FRAME)
    except codec.DecodeError:
        return "junk"
    if isinstance(message, (Hello, Close)):
        assert message.token != REAL_TOKEN
        return "rejected"
    return "junk"

# ---- the peers ------------------------------------------------------------------------
def replies(sock, timeout=60.0):
    if not sock.poll(int(timeout * 1000), zmq.POLLIN):
        raise AssertionError("the logger did not answer within 60 s")
    return codec.decode(sock.recv(), 1 << 20)

def sync(sock):
    # A real hello on the same DEALER, after its junk: ZeroMQ delivers one peer's frames in
    # order, so the WELCOME means the logger has taken (and counted) every frame before it.
    hello = codec.encode_hello(Hello(REAL_TOKEN, os.getpid(), HOST, None, None))
    sock.send(hello)
    welcome = replies(sock)
    assert isinstance(welcome, Welcome), welcome
    sock.send(codec.encode_goodbye(Goodbye(0, "fuzz peer done", 0)))
    ack = replies(sock)
    assert isinstance(ack, Ack) and ack.received == 0, ack

def steady(stop, out):
    run = wf.init()
    i = 0
    while not stop.is_set():
        run.log({{"steady": i}}, step=i)
        i += 1
        time.sleep(0.005)
    run.finish()
    out.put(i)

def after(n):
    run = wf.init()
    for i in range(n):
        run.log({{"after": i}}, step=i)
    run.finish()
"""
)

UNKNOWN_PEERS = (
    COMMON
    + """
if __name__ == "__main__":
    with wf.Funnel(project="t", max_record_bytes=MAXR) as funnel:
        REAL_TOKEN = os.environ[ENV_TOKEN]
        REAL_HELLO = codec.encode_hello(Hello(REAL_TOKEN, os.getpid(), HOST, None, None))
        funnel.log({"before": 1}, step=0)
        logger = psutil.Process(funnel.logger_pid)
        ctx_mp = mp.get_context("spawn")
        stop, out = ctx_mp.Event(), ctx_mp.Queue()
        worker = ctx_mp.Process(target=steady, args=(stop, out))
        worker.start()

        plan = [name for name, n, _ in CLASSES for _ in range(n)]
        rng.shuffle(plan)
        certain = {name for name, _, sure in CLASSES if sure}
        expected = collections.Counter()
        not_junk_but_certain = collections.Counter()
        sent = collections.Counter()
        rss = []
        ctx = zmq.Context()
        per_chunk = FRAMES // CHUNKS
        for c in range(CHUNKS):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 1000)
            s.connect(funnel.address)
            for name in plan[c * per_chunk : (c + 1) * per_chunk]:
                frame = MAKERS[name]()
                verdict = expect(frame)
                expected[verdict] += 1
                if name in certain and verdict != "junk":
                    not_junk_but_certain[name] += 1
                if isinstance(frame, list):
                    s.send_multipart(frame)
                else:
                    s.send(frame)
                sent[name] += 1
            sync(s)
            s.close()
            rss.append(logger.memory_info().rss)

        # Oversize frames: ZeroMQ drops the connection before buffering them (MAXMSGSIZE);
        # they never reach the logger as frames, so they are in no count.
        oversize = 0
        for size in (MAX_FRAME + 1, MAX_FRAME + 4096, 2 * MAX_FRAME, 4 * 2**20):
            for _ in range(3):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 2000)
                s.connect(funnel.address)
                s.send(rand_bytes(size))
                s.close()
                oversize += 1
        ctx.term()  # linger: the oversize frames have left (or been refused) by now
        time.sleep(0.5)

        stop.set()
        steady_count = out.get(timeout=60)
        worker.join(60)
        p = ctx_mp.Process(target=after, args=(50,))
        p.start()
        p.join(60)
        rss.append(logger.memory_info().rss)
        alive = logger.is_running() and logger.status() != psutil.STATUS_ZOMBIE
        report(sent=dict(sent), expected=dict(expected), rss=rss, alive=alive,
               oversize=oversize, not_junk_but_certain=dict(not_junk_but_certain),
               steady=steady_count, codes=[worker.exitcode, p.exitcode])
    report(stats=funnel.stats)
"""
)


@pytest.mark.timeout(240)
def test_logger_survives_and_counts_100k_fuzzed_frames(scripts: Scripts) -> None:
    """100,000 random, malformed and mutated frames (and a dozen oversize ones) from peers that
    never said a valid hello, while a real worker logs: the logger stays alive, its RSS stays
    bounded and does not grow past warm-up, every frame is counted exactly (junk, or a refused
    hello/close), the worker's records all land, and a worker started afterwards lands too."""
    res = scripts.run(UNKNOWN_PEERS, timeout=220)
    assert res.returncode == 0, res.stderr[-6000:]
    assert res.leftovers == []
    info = reports(res.stdout)
    print(info)  # shown when the test fails: the counts, the RSS samples
    stats = info["stats"]
    assert sum(info["sent"].values()) == FRAMES
    expected = info["expected"]
    assert expected["junk"] + expected.get("rejected", 0) == FRAMES
    # Frames that cannot be valid were all refused by the decoder.
    assert info["not_junk_but_certain"] == {}
    # Mutation produces some valid hellos and closes (with a made-up token): refused, counted.
    assert expected.get("rejected", 0) > 0

    # The logger lived through it all and finished the run.
    assert info["alive"] is True
    assert info["codes"] == [0, 0]
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 0

    # Every fuzz frame is counted, exactly: nothing else on the socket was junk or refused
    # (the oversize frames never became frames).
    assert stats["funnel/junk_frames"] == expected["junk"]
    assert stats["funnel/rejected_peers"] == expected.get("rejected", 0)
    assert run.summary["funnel/junk_frames"] == expected["junk"]

    # Memory: bounded, and no growth after the warm-up chunk.
    rss = info["rss"]
    assert max(rss) < RSS_LIMIT, rss
    assert rss[-1] - rss[0] < RSS_GROWTH_LIMIT, rss

    # Real ranks were served throughout: the owner, a worker logging during the fuzz, a worker
    # started after it. Nothing any fuzz frame carried reached the run.
    steady = info["steady"]
    assert steady > 0
    assert run.column("before") == [(0, 1)]
    assert run.column("steady") == [(i, i) for i in range(steady)]
    assert run.column("after") == [(i, i) for i in range(50)]
    assert stats["funnel/records"] == 1 + steady + 50
    assert stats["funnel/dropped_records"] == 0
    keys = {k for row in run.history for k in row if not k.startswith("_")}
    assert keys == {"before", "steady", "after", "global_step"}
    assert "lr" not in run.config and "best" not in run.summary
    # Ranks: the owner, the two workers and one per fuzz peer (its closing hello).
    assert stats["funnel/ranks"] == 3 + CHUNKS


# A peer that did say a valid hello (it holds the job's token), then sends fresh valid batches,
# mutations of them, and mutated control messages. The logger's handling of such a peer is
# modelled frame by frame (what the protocol says: a batch numbered below what was received is
# a replay, junk; a batch numbered above it means records the peer dropped; a goodbye ends the
# rank, its exit code counts; welcome/ack/done from a client are junk), so the counts are
# asserted exactly, and every record the logger took in must be written or counted as dropped.
KNOWN_FRAMES = 20_000

KNOWN_PEER = (
    COMMON
    + f"""
KNOWN_FRAMES = {KNOWN_FRAMES}
KEYS = ["loss", "acc", "a.b", "x/y", "é", "", "global_step", "n"]

def random_value(depth=0):
    pick = rng.randrange(9 if depth < 2 else 6)
    if pick == 0:
        return rng.randint(-(2**63), 2**64 - 1)
    if pick == 1:
        return rng.choice([0.5, float("nan"), float("inf"), -0.0, 1e308])
    if pick == 2:
        return rng.choice(["x", "é" * 5, "", "\\x00"])
    if pick == 3:
        return rng.choice([None, True, False])
    if pick in (4, 5):
        return rng.randint(-5, 5)
    if pick == 6:
        return [random_value(depth + 1) for _ in range(rng.randrange(4))]
    return {{rng.choice(KEYS): random_value(depth + 1) for _ in range(rng.randrange(4))}}

class Model:
    "What the logger must do with each frame of a peer that said a valid hello."
    def __init__(self):
        self.next_seq = 0
        self.junk = self.rejected = self.records = self.gaps = self.updates = 0
        self.ended = False
        self.exit_code = 0

    def fresh_batch(self):
        gap = rng.choice([0, 0, 0, 0, 1, 5])
        records = [
            codec.encode_record(
                rng.choice([rng.randrange(100), rng.randrange(2**62)]), rng.random() < 0.7,
                {{rng.choice(KEYS): random_value() for _ in range(rng.randrange(5))}}, MAXR)
            for _ in range(rng.randrange(6))
        ]
        return codec.encode_batch(self.next_seq + gap, records)

    def take(self, frame):
        try:
            m = codec.decode(frame, MAX_FRAME)
        except codec.DecodeError:
            self.junk += 1
            return
        if isinstance(m, (Hello, Close)):
            assert m.token != REAL_TOKEN
            self.rejected += 1
        elif isinstance(m, RecordBatch):
            if m.first_seq < self.next_seq:
                self.junk += 1  # a replay
                return
            self.gaps += m.first_seq - self.next_seq
            self.next_seq = m.first_seq + len(m.records)
            self.records += len(m.records)
        elif isinstance(m, Goodbye):
            self.gaps += max(0, m.produced - self.next_seq)
            if not self.ended:
                self.ended, self.exit_code = True, m.exit_code
        elif isinstance(m, (ConfigUpdate, SummaryUpdate)):
            self.updates += 1
        else:  # Welcome, Ack, Done: the logger's own messages
            self.junk += 1

if __name__ == "__main__":
    from wandb_funnel._protocol.messages import ConfigUpdate, RecordBatch, SummaryUpdate
    with wf.Funnel(project="t", max_record_bytes=MAXR) as funnel:
        REAL_TOKEN = os.environ[ENV_TOKEN]
        REAL_HELLO = codec.encode_hello(Hello(REAL_TOKEN, os.getpid(), HOST, None, None))
        funnel.log({{"before": 1}}, step=0)
        logger = psutil.Process(funnel.logger_pid)
        model = Model()
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(funnel.address)
        s.send(REAL_HELLO)
        assert isinstance(replies(s), Welcome)
        kinds = collections.Counter()
        for _ in range(KNOWN_FRAMES):
            pick = rng.random()
            if pick < 0.4:
                frame, kind = model.fresh_batch(), "fresh"
            elif pick < 0.8:
                frame, kind = mutate(model.fresh_batch()), "mutated_fresh"
            elif pick < 0.9:
                frame, kind = mutated(), "mutated_seed"
            else:
                frame, kind = wrong_types(), "wrong_types"
            model.take(frame)
            kinds[kind] += 1
            s.send(frame)
        # Say hello again: the WELCOME means every frame before it was taken. Then a proper
        # goodbye (numbered as the model says: no gap), acknowledged.
        s.send(REAL_HELLO)
        while not isinstance(replies(s), Welcome):
            pass  # acks of mutated goodbyes
        s.send(codec.encode_goodbye(Goodbye(model.next_seq, "fuzz peer done", 0)))
        model.take(codec.encode_goodbye(Goodbye(model.next_seq, "fuzz peer done", 0)))
        while not isinstance(replies(s), Ack):
            pass
        s.close()
        ctx.term()
        p = mp.get_context("spawn").Process(target=after, args=(50,))
        p.start()
        p.join(60)
        alive = logger.is_running() and logger.status() != psutil.STATUS_ZOMBIE
        report(kinds=dict(kinds), model=vars(model), alive=alive, code=p.exitcode)
    report(stats=funnel.stats)
"""
)


@pytest.mark.timeout(180)
def test_logger_survives_fuzzed_frames_from_a_peer_that_said_hello(scripts: Scripts) -> None:
    """20,000 fresh, mutated and malformed frames from a peer holding the job's token: the
    logger stays alive; junk (including replays) and refused hellos/closes are counted exactly
    as the protocol says; every record it took in is written or counted as dropped (none
    vanishes, whatever the record carried); the run's exit code is the one the peer's first
    goodbye carried, as for a rank that raised; a worker started afterwards lands."""
    res = scripts.run(KNOWN_PEER, timeout=170)
    assert res.returncode == 0, res.stderr[-6000:]
    assert res.leftovers == []
    info = reports(res.stdout)
    print(info)  # shown when the test fails
    stats, model = info["stats"], info["model"]
    assert sum(info["kinds"].values()) == KNOWN_FRAMES
    assert info["alive"] is True and info["code"] == 0
    # The fuzz reached every path: junk, replays or malformed; refused hellos; records taken.
    assert model["junk"] > 1000 and model["rejected"] > 0 and model["records"] > 1000
    assert stats["funnel/junk_frames"] == model["junk"]
    assert stats["funnel/rejected_peers"] == model["rejected"]
    # Every record is accounted for: written, or dropped (never sent by the peer, as its
    # numbering says, or refused by wandb), none lost silently.
    own = 1 + 50  # the owner's and the later worker's
    taken = own + model["records"]
    assert stats["funnel/records"] + stats["funnel/dropped_records"] == taken + model["gaps"]
    run = only_run(scripts.wandb_dir)
    assert run.summary["funnel/records"] == stats["funnel/records"]
    assert run.column("before") == [(0, 1)]
    assert [v for _, v in run.column("after")] == list(range(50))
    # A peer's goodbye with a non-zero exit code fails the run, like a rank that raised.
    assert stats["funnel/failed_ranks"] == (1 if model["exit_code"] else 0)
    assert run.exit_code == model["exit_code"]
    assert stats["funnel/ranks"] == 3  # the owner, the fuzz peer, the later worker


# Below ZeroMQ's framing: raw connections to the IPC socket that speak no ZMTP, or a ZMTP
# greeting with a security mechanism the logger does not use. ZeroMQ refuses the handshake
# (counted in funnel/rejected_peers); random bytes may also parse as ZMTP 1.0 frames, which
# then reach the logger as junk. Either way nothing reaches the run.
RAW = (
    PRELUDE
    + """
import random, socket
def after(n):
    run = wf.init()
    for i in range(n):
        run.log({"after": i}, step=i)
    run.finish()

if __name__ == "__main__":
    rng = random.Random(7)
    with wf.Funnel(project="t") as funnel:
        funnel.log({"before": 1}, step=0)
        path = funnel.address[len("ipc://"):]
        hung_up = 0
        for i in range(200):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(path)
            try:
                if i % 2 == 0:  # a ZMTP 3.0 greeting asking for another mechanism
                    mech = rng.choice([b"CURVE", b"PLAIN", b"GSSAPI", b"EVIL", b""])
                    s.sendall(b"\\xff" + bytes(8) + b"\\x7f\\x03\\x00" + mech.ljust(20, b"\\x00")
                              + bytes(32))
                    while s.recv(4096):  # the logger hangs up
                        pass
                    hung_up += 1
                else:
                    s.sendall(rng.getrandbits(8 * 300).to_bytes(300, "little")[
                        : rng.randrange(1, 300)])
            except OSError:
                pass  # the logger hung up first
            s.close()
        time.sleep(1.0)  # the logger checks its handshake monitor every 0.25 s
        p = mp.get_context("spawn").Process(target=after, args=(20,))
        p.start()
        p.join(60)
        report(hung_up=hung_up, code=p.exitcode)
    report(stats=funnel.stats)
"""
)


@pytest.mark.timeout(120)
def test_raw_garbage_below_zeromq_is_refused_and_counted(scripts: Scripts) -> None:
    """200 raw connections to the IPC socket: 100 ZMTP greetings asking for another security
    mechanism (each refused by the handshake, the connection closed, and counted) and 100
    bursts of random bytes. The logger survives, nothing reaches the run, a worker lands."""
    res = scripts.run(RAW, timeout=110)
    assert res.returncode == 0, res.stderr[-6000:]
    assert res.leftovers == []
    info = reports(res.stdout)
    stats = info["stats"]
    assert info["hung_up"] == 100 and info["code"] == 0
    assert stats["funnel/rejected_peers"] >= 100
    assert stats["funnel/records"] == 1 + 20
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 0
    assert [v for _, v in run.column("after")] == list(range(20))
    keys = {k for row in run.history for k in row if not k.startswith("_")}
    assert keys == {"before", "after", "global_step"}
    assert stats["funnel/ranks"] == 2
