"""The owner processes of tests/processes/test_socket_fuzz.py: fuzz frames at the logger.

    python socket_fuzz.py unknown-peers --frames 100000 --chunks 10 --max-record-bytes 4096
    python socket_fuzz.py known-peer --frames 20000 --max-record-bytes 4096
    python socket_fuzz.py raw

The test file's docstring says what is sent and why each count can be asserted exactly; each
scenario prints its counts, its memory samples and the funnel's stats as REPORT lines.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import os
import random
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import msgpack
import psutil
import zmq
from _prelude import Scenarios, option, report

import wandb_funnel as wf
from wandb_funnel._constants import BATCH_BYTES, ENV_TOKEN
from wandb_funnel._logger.blobs import BlobWriter
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import (
    CONFIG,
    FILES,
    MEDIA_EXT,
    METRIC,
    PROTOCOL_VERSION,
    SUMMARY,
    Ack,
    Blob,
    Close,
    Done,
    Goodbye,
    Hello,
    Message,
    RecordBatch,
    Update,
    Welcome,
)

scenario = Scenarios(__doc__)

HOST = socket.gethostname()
Frame = bytes | list[bytes]  # one frame, or the parts of a multi-part message

INTERESTING = [
    0x00,
    0x01,
    0x7F,
    0x80,
    0xC0,
    0xC1,
    0xC2,
    0xC3,
    0xC6,
    0xC9,
    0xCF,
    0xD3,
    0xD9,
    0xDB,
    0xDC,
    0xDD,
    0xDE,
    0xDF,
    0xFF,
    0x90,
    0x9F,
    0xA0,
    0xBF,
]
WRONG: list[Any] = [
    None,
    "s",
    -1,
    1.5,
    [],
    {},
    b"x",
    True,
    2**64 - 1,
    -(2**63),
    [1, 2],
    {"a": 1},
    "é",
    float("nan"),
    0,
    1,
    2,
]
HUGE = [
    b"\xdd\xff\xff\xff\xff",
    b"\xdf\xff\xff\xff\xff",
    b"\xc6\xff\xff\xff\xff",
    b"\xdb\xff\xff\xff\xff",
    b"\xc9\xff\xff\xff\xff\x01",
    b"\xdc\xff\xff",
    b"\xde\xff\xff",
    b"\xc5\xff\xff",
    b"\xda\xff\xff",
    b"\xc7\xff\x01",
]

# (class, share of the frames, certainly junk whatever the decoder says)
CLASSES = [
    ("random", 15_000, False),
    ("truncated", 15_000, True),
    ("wrong_version", 5_000, True),
    ("wrong_types", 10_000, False),
    ("huge_length", 4_990, True),
    ("at_the_limit", 10, False),
    ("multipart", 5_000, True),
    ("mutated", 40_000, False),
    ("valid_unknown", 5_000, False),
]


def packb(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj)  # (msgpack has no type hints)
    return packed


def split_header(frame: bytes) -> tuple[Any, bytes]:
    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(frame)
    header = u.unpack()
    return header, frame[u.tell() :]


class Fuzz:
    """The frame makers and the seeds, drawing from one seeded generator.

    Made inside the funnel, which exports the job's token: a frame that decodes as a Hello
    or a Close carries a made-up token (never the real one) unless built from
    ``real_hello`` on purpose.
    """

    def __init__(self, max_record_bytes: int) -> None:
        self.maxr = max_record_bytes
        self.max_frame = max_record_bytes + BATCH_BYTES + 4096  # the logger's limit (_logger.main)
        self.rng = random.Random(20240607)
        self.fake = "".join(self.rng.choice("0123456789abcdef") for _ in range(32))
        self.seeds = self._seeds()
        self.real_token = os.environ[ENV_TOKEN]
        self.real_hello = codec.encode_hello(Hello(self.real_token, os.getpid(), HOST, None, None))
        self.makers: dict[str, Callable[[], Frame]] = {
            "random": self.random_frame,
            "truncated": self.truncated,
            "wrong_version": self.wrong_version,
            "wrong_types": self.wrong_types,
            "huge_length": self.huge_length,
            "at_the_limit": self.at_the_limit,
            "multipart": self.multipart,
            "mutated": self.mutated,
            "valid_unknown": self.valid_unknown,
        }

    def _seeds(self) -> list[bytes]:
        maxr, fake = self.maxr, self.fake
        records = [
            codec.encode_record(0, True, {"loss": 0.5}, maxr),
            codec.encode_record(3, False, {"a": {"b": [1, 2.5, None, "x"]}, "t": True}, maxr),
            codec.encode_record(2**40, True, {"s": "é" * 10, "n": -7}, maxr),
            codec.encode_record(7, True, {}, maxr),
        ]
        return [
            codec.encode_batch(0, records[:1]),
            codec.encode_batch(5, records),
            codec.encode_batch(0, []),  # a heartbeat
            codec.encode_batch(2**31, records[1:3]),
            codec.encode_hello(Hello(fake, 1234, "elsewhere", None, None)),
            codec.encode_hello(Hello(fake, os.getpid(), HOST, 3, 12345)),
            codec.encode_goodbye(Goodbye(4, "finished", 0)),
            codec.encode_update(CONFIG, {"lr": 0.1, "nested": {"x": [1]}}, maxr),
            codec.encode_update(SUMMARY, {"best": 0.9}, maxr),
            codec.encode_update(METRIC, {"name": "loss", "step_metric": "epoch"}, maxr),
            codec.encode_update(
                FILES, {"op": "save", "entries": [["a.txt", "1-1-00.txt"]], "policy": "now"}, maxr
            ),
            codec.encode_blob(Blob("1-2-00.png", 0, 6, b"abc")),
            codec.encode_blob(Blob("1-2-00.png", 3, 6, b"def")),
            codec.encode_batch(
                0,
                [
                    msgpack.packb(
                        (
                            1,
                            True,
                            {
                                "img": msgpack.ExtType(
                                    MEDIA_EXT,
                                    msgpack.packb(
                                        {"k": "file", "c": "Image", "s": {}, "f": "x.png"}
                                    ),
                                )
                            },
                        )
                    )
                ],
            ),
            codec.encode_close(Close(fake, 0, 10.0)),
            codec.encode_welcome(Welcome(2)),
            codec.encode_ack(Ack(5)),
            codec.encode_done(Done({"x": 1})),
        ]

    def rand_bytes(self, n: int) -> bytes:
        return self.rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""

    # ---- the frame classes -------------------------------------------------------------
    def random_frame(self) -> bytes:
        rng = self.rng
        n = rng.choice([0, 1, 2, 3, 5, 8, 16, 64, rng.randrange(256), rng.randrange(4096)])
        return self.rand_bytes(n)

    def truncated(self) -> bytes:  # a strict prefix of a valid frame: never a whole message
        s = self.rng.choice(self.seeds)
        return s[: self.rng.randrange(len(s))]

    def wrong_version(self) -> bytes:
        """Anything that is not == PROTOCOL_VERSION (a float or bool equal to it would be)."""
        header, rest = split_header(self.rng.choice(self.seeds))
        v = PROTOCOL_VERSION
        header[0] = self.rng.choice(
            [0, v - 1, v + 1, 255, -1, 2**40, str(v), None, [v], {"v": v}, bytes([v]), v + 0.5]
        )
        return packb(header) + rest

    def wrong_types(self) -> bytes:
        """Valid msgpack, any kind, fields of the wrong types (may be valid: classified)."""
        rng = self.rng
        kind = rng.choice([1, 2, 3, 4, 5, 6, 16, 17, 18, 21, 22, 23, 24, 0, 7, 99, -1, "x", None])
        body = [rng.choice(WRONG) for _ in range(rng.randrange(8))]
        if rng.random() < 0.1:
            return packb(rng.choice([{"v": 1}, "hello", 1, None, [1], [], b"raw"]))
        frame = packb([PROTOCOL_VERSION, kind, *body])
        if kind == 2 and rng.random() < 0.5:
            frame += b"".join(
                packb(
                    rng.choice(
                        [
                            [0, True, []],
                            [-1, True, {}],
                            [0, 1, {}],
                            [0, True, {1: 2}],
                            "x",
                            [2**64 - 1, True, {}],
                            [0, True],
                            [0, True, {}, 4],
                        ]
                    )
                )
                for _ in range(3)
            )
        return frame

    def huge_length(self) -> bytes:  # lengths that claim far more than the frame holds
        rng, seeds = self.rng, self.seeds
        pick = rng.randrange(6)
        if pick == 0:
            return rng.choice(HUGE) + self.rand_bytes(rng.randrange(16))
        if pick == 1:  # a records header claiming 2**32-1, 2**20+1, ... records
            count = rng.choice([2**32 - 1, 2**20 + 1, 2**64 - 1, 2**20, 10**6])
            return b"\x94\x01\x02\x00" + packb(count) + rng.choice(seeds[:1])[6:]
        if pick == 2:  # a record whose data map claims 2**32-1 entries
            return b"\x94\x01\x02\x00\x01\x93\x00\xc3" + rng.choice(HUGE[:2]) + b"\xa1k\x01"
        if pick == 3:  # a hello whose token claims 4 GiB
            return b"\x97\x01\x01" + rng.choice([HUGE[3], HUGE[2], HUGE[8]]) + b"abc"
        if pick == 4:  # nesting bombs: arrays or maps nested tens of thousands deep
            unit = rng.choice([b"\x91", b"\x81\xa1a", b"\x92\xc0"])
            return unit * rng.randrange(1000, 60_000)
        return rng.choice(seeds)[:3] + rng.choice(HUGE) + rng.choice(seeds)[3:]

    def mutate(self, frame: bytes) -> bytes:
        rng = self.rng
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
                b[i:i] = self.rand_bytes(rng.randint(1, 16))
            elif op == 3 and b:  # delete a range
                i = rng.randrange(len(b))
                del b[i : i + rng.randint(1, 16)]
            elif op == 4 and b:  # duplicate a range
                i = rng.randrange(len(b))
                b[i:i] = b[i : i + rng.randint(1, 32)]
            elif op == 5:  # splice with another valid frame
                other = rng.choice(self.seeds)
                b = b[: rng.randrange(len(b) + 1)] + other[rng.randrange(len(other) + 1) :]
            elif op == 6:  # two frames back to back
                b = b + rng.choice(self.seeds)
            else:  # truncate (possibly to nothing, possibly not at all)
                b = b[: rng.randrange(len(b) + 1)]
            frame = bytes(b)
        return frame

    def mutated(self) -> bytes:
        return self.mutate(self.rng.choice(self.seeds))

    def valid_unknown(self) -> bytes:  # valid frames, from a peer that never said a valid hello
        return self.rng.choice(self.seeds)

    def at_the_limit(self) -> bytes:  # the biggest frames the logger takes: exactly MAX_FRAME
        size = self.max_frame - self.rng.randrange(2)
        if self.rng.random() < 0.5:
            return self.rand_bytes(size)
        # A batch claiming as many (tiny, valid) records as fit: decoded, then refused as junk.
        count = (size - 16) // 4
        head = b"\x94\x01\x02\x00" + packb(count)
        return head + b"\x93\x00\xc3\x80" * count

    def multipart(self) -> list[bytes]:
        """2..4 parts: junk whatever the parts (even a hello with the real token)."""
        rng = self.rng
        return [
            rng.choice([rng.choice(self.seeds), self.random_frame(), b"", self.real_hello])
            for _ in range(rng.randint(2, 4))
        ]

    def decode(self, frame: bytes) -> Message:
        return codec.decode(frame, self.max_frame)

    def expect(self, frame: Frame) -> str:
        "What the logger must do with this frame from a peer it does not know."
        if isinstance(frame, list):
            return "junk"
        try:
            message = self.decode(frame)
        except codec.DecodeError:
            return "junk"
        if isinstance(message, (Hello, Close)):
            assert message.token != self.real_token
            return "rejected"
        return "junk"


# ---- the peers ----------------------------------------------------------------------------
def replies(sock: zmq.Socket[bytes], timeout: float = 60.0) -> Message:
    if not sock.poll(int(timeout * 1000), zmq.POLLIN):
        raise AssertionError("the logger did not answer within 60 s")
    return codec.decode(sock.recv(), 1 << 20)


def sync(sock: zmq.Socket[bytes], fuzz: Fuzz) -> None:
    # A real hello on the same DEALER, after its junk: ZeroMQ delivers one peer's frames in
    # order, so the WELCOME means the logger has taken (and counted) every frame before it.
    sock.send(fuzz.real_hello)
    welcome = replies(sock)
    assert isinstance(welcome, Welcome), welcome
    sock.send(codec.encode_goodbye(Goodbye(0, "fuzz peer done", 0)))
    ack = replies(sock)
    assert isinstance(ack, Ack) and ack.received == 0, ack


def steady(stop: Event, out: Queue[int]) -> None:
    run = wf.init()
    i = 0
    while not stop.is_set():
        run.log({"steady": i}, step=i)
        i += 1
        time.sleep(0.005)
    run.finish()
    out.put(i)


def after(n: int) -> None:
    run = wf.init()
    for i in range(n):
        run.log({"after": i}, step=i)
    run.finish()


def alive(logger: psutil.Process) -> bool:
    return bool(logger.is_running() and logger.status() != psutil.STATUS_ZOMBIE)


@scenario(
    option("--frames", type=int, required=True),
    option("--chunks", type=int, required=True),  # one DEALER each; the first is the warm-up
    option("--max-record-bytes", type=int, required=True),
)
def unknown_peers(args: argparse.Namespace) -> None:
    """--frames fuzz frames from peers that never said a valid hello, while a worker logs."""
    frames, chunks = args.frames, args.chunks
    assert sum(n for _, n, _ in CLASSES) == frames
    with wf.Funnel(project="t", max_record_bytes=args.max_record_bytes) as funnel:
        fuzz = Fuzz(args.max_record_bytes)
        rng = fuzz.rng
        funnel.log({"before": 1}, step=0)
        logger = psutil.Process(funnel.logger_pid)
        ctx_mp = mp.get_context("spawn")
        stop, out = ctx_mp.Event(), ctx_mp.Queue()
        worker = ctx_mp.Process(target=steady, args=(stop, out))
        worker.start()

        plan = [name for name, n, _ in CLASSES for _ in range(n)]
        rng.shuffle(plan)
        certain = {name for name, _, sure in CLASSES if sure}
        expected: collections.Counter[str] = collections.Counter()
        not_junk_but_certain: collections.Counter[str] = collections.Counter()
        sent: collections.Counter[str] = collections.Counter()
        rss = []
        ctx = zmq.Context()
        per_chunk = frames // chunks
        for c in range(chunks):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 1000)
            s.connect(funnel.address)
            for name in plan[c * per_chunk : (c + 1) * per_chunk]:
                frame = fuzz.makers[name]()
                verdict = fuzz.expect(frame)
                expected[verdict] += 1
                if name in certain and verdict != "junk":
                    not_junk_but_certain[name] += 1
                if isinstance(frame, list):
                    s.send_multipart(frame)
                else:
                    s.send(frame)
                sent[name] += 1
            sync(s, fuzz)
            s.close()
            rss.append(logger.memory_info().rss)

        # Oversize frames: ZeroMQ drops the connection before buffering them (MAXMSGSIZE);
        # they never reach the logger as frames, so they are in no count.
        oversize = 0
        max_frame = fuzz.max_frame
        for size in (max_frame + 1, max_frame + 4096, 2 * max_frame, 4 * 2**20):
            for _ in range(3):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 2000)
                s.connect(funnel.address)
                s.send(fuzz.rand_bytes(size))
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
        report(
            sent=dict(sent),
            expected=dict(expected),
            rss=rss,
            alive=alive(logger),
            oversize=oversize,
            not_junk_but_certain=dict(not_junk_but_certain),
            steady=steady_count,
            codes=[worker.exitcode, p.exitcode],
        )
    report(stats=funnel.stats)


# ---- a peer that did say a valid hello ----------------------------------------------------
KEYS = ["loss", "acc", "a.b", "x/y", "é", "", "global_step", "n"]
KNOWN_PEER_STEP_KEY = "known-peer-step"  # not in KEYS


def random_value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(9 if depth < 2 else 6)
    if pick == 0:
        return rng.randint(-(2**63), 2**64 - 1)
    if pick == 1:
        return rng.choice([0.5, float("nan"), float("inf"), -0.0, 1e308])
    if pick == 2:
        return rng.choice(["x", "é" * 5, "", "\x00"])
    if pick == 3:
        return rng.choice([None, True, False])
    if pick in (4, 5):
        return rng.randint(-5, 5)
    if pick == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


class Model:
    "What the logger must do with each frame of a peer that said a valid hello."

    def __init__(self, fuzz: Fuzz, shadow_dir: str) -> None:
        self.fuzz = fuzz
        self.next_seq = 0
        self.junk = self.rejected = self.records = self.gaps = self.updates = 0
        self.ended = False
        self.exit_code = 0
        # Media chunks: the logger's writer, replayed on a staging directory of our own (this
        # peer is the only one sending chunks, so the same frames meet the same files).
        self.blobs = BlobWriter(shadow_dir)

    def counts(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k not in ("fuzz", "blobs")}

    def fresh_batch(self) -> bytes:
        rng, maxr = self.fuzz.rng, self.fuzz.maxr
        gap = rng.choice([0, 0, 0, 0, 1, 5])
        records = [
            codec.encode_record(
                rng.choice([rng.randrange(100), rng.randrange(2**62)]),
                rng.random() < 0.7,
                {rng.choice(KEYS): random_value(rng) for _ in range(rng.randrange(5))},
                maxr,
            )
            for _ in range(rng.randrange(6))
        ]
        return codec.encode_batch(self.next_seq + gap, records)

    def take(self, frame: bytes) -> None:
        try:
            m = self.fuzz.decode(frame)
        except codec.DecodeError:
            self.junk += 1
            return
        if isinstance(m, (Hello, Close)):
            assert m.token != self.fuzz.real_token
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
        elif isinstance(m, Update):  # every kind: the receiver hands each to the writer
            self.updates += 1
        elif isinstance(m, Blob):
            if not self.blobs.write(m):
                self.junk += 1
        else:  # Welcome, Ack, Done: the logger's own messages
            self.junk += 1


@scenario(
    option("--frames", type=int, required=True),
    option("--max-record-bytes", type=int, required=True),
)
def known_peer(args: argparse.Namespace) -> None:
    """--frames fresh, mutated and malformed frames from a peer holding the job's token."""
    # The fuzzed records may log "global_step" (KEYS), which then is theirs (issue 23): the
    # funnel's x-axis is a key no fuzzed record can have, so that it names every row's step.
    with wf.Funnel(
        project="t", max_record_bytes=args.max_record_bytes, step_key=KNOWN_PEER_STEP_KEY
    ) as funnel:
        fuzz = Fuzz(args.max_record_bytes)
        rng = fuzz.rng
        funnel.log({"before": 1}, step=0)
        logger = psutil.Process(funnel.logger_pid)
        shadow = tempfile.TemporaryDirectory(prefix="fuzz-shadow-")  # removed at exit too
        model = Model(fuzz, shadow.name)
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(funnel.address)
        s.send(fuzz.real_hello)
        assert isinstance(replies(s), Welcome)
        kinds: collections.Counter[str] = collections.Counter()
        for _ in range(args.frames):
            pick = rng.random()
            if pick < 0.4:
                frame, kind = model.fresh_batch(), "fresh"
            elif pick < 0.8:
                frame, kind = fuzz.mutate(model.fresh_batch()), "mutated_fresh"
            elif pick < 0.9:
                frame, kind = fuzz.mutated(), "mutated_seed"
            else:
                frame, kind = fuzz.wrong_types(), "wrong_types"
            model.take(frame)
            kinds[kind] += 1
            s.send(frame)
        # Say hello again: the WELCOME means every frame before it was taken. Then a proper
        # goodbye (numbered as the model says: no gap), acknowledged.
        s.send(fuzz.real_hello)
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
        report(kinds=dict(kinds), model=model.counts(), alive=alive(logger), code=p.exitcode)
        shadow.cleanup()
    report(stats=funnel.stats)


# ---- below ZeroMQ's framing ---------------------------------------------------------------
@scenario()
def raw(args: argparse.Namespace) -> None:
    """200 raw connections to the IPC socket: ZMTP greetings for other mechanisms, garbage."""
    rng = random.Random(7)
    with wf.Funnel(project="t") as funnel:
        funnel.log({"before": 1}, step=0)
        path = funnel.address[len("ipc://") :]
        hung_up = 0
        for i in range(200):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(path)
            try:
                if i % 2 == 0:  # a ZMTP 3.0 greeting asking for another mechanism
                    mech = rng.choice([b"CURVE", b"PLAIN", b"GSSAPI", b"EVIL", b""])
                    s.sendall(
                        b"\xff" + bytes(8) + b"\x7f\x03\x00" + mech.ljust(20, b"\x00") + bytes(32)
                    )
                    while s.recv(4096):  # the logger hangs up
                        pass
                    hung_up += 1
                else:
                    s.sendall(
                        rng.getrandbits(8 * 300).to_bytes(300, "little")[: rng.randrange(1, 300)]
                    )
            except OSError:
                pass  # the logger hung up first
            s.close()
        time.sleep(1.0)  # the logger checks its handshake monitor every 0.25 s
        p = mp.get_context("spawn").Process(target=after, args=(20,))
        p.start()
        p.join(60)
        report(hung_up=hung_up, code=p.exitcode)
    report(stats=funnel.stats)


if __name__ == "__main__":
    scenario.main()
