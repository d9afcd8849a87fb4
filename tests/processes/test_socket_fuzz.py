"""Fuzzing the logger's socket: 100,000 random and mutated frames from peers that never said a
valid hello. The logger must survive them all, keep its memory bounded, count every one of
them (as junk, or as a refused hello or close), and keep serving real ranks meanwhile and after.

Every fuzz frame is classified in the scenario with the package's own decoder: a frame that
decodes as a Hello or a Close carries a made-up token (the real one is never used in a seed,
and a mutation cannot produce 32 secret hex digits), so the logger must count it in
``_funnel/rejected_peers``; every other frame (undecodable, a multi-part message, or a valid
message from a peer the logger does not know) must be counted in ``_funnel/junk_frames``.
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

from tests.conftest import Scripts, program, reports
from tests.wandb_reader import only_run

pytestmark = [pytest.mark.processes, pytest.mark.sink("record")]  # the funnel's semantics

FRAMES = 100_000
CHUNKS = 10  # one DEALER per chunk; the first chunk is the warm-up for the memory baseline
MAX_RECORD_BYTES = 4096  # keeps the logger's frame limit small, so oversize frames are cheap
RSS_LIMIT = 300 * 2**20
RSS_GROWTH_LIMIT = 100 * 2**20

SOCKET_FUZZ = program("socket_fuzz")  # the owner process of each scenario below


@pytest.mark.timeout(240)
def test_logger_survives_and_counts_100k_fuzzed_frames(scripts: Scripts) -> None:
    """100,000 random, malformed and mutated frames (and a dozen oversize ones) from peers that
    never said a valid hello, while a real worker logs: the logger stays alive, its RSS stays
    bounded and does not grow past warm-up, every frame is counted exactly (junk, or a refused
    hello/close), the worker's records all land, and a worker started afterwards lands too."""
    res = scripts.run_file(
        SOCKET_FUZZ,
        [
            "unknown-peers",
            "--frames",
            str(FRAMES),
            "--chunks",
            str(CHUNKS),
            "--max-record-bytes",
            str(MAX_RECORD_BYTES),
        ],
        timeout=220,
    )
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
    assert stats["_funnel/junk_frames"] == expected["junk"]
    assert stats["_funnel/rejected_peers"] == expected.get("rejected", 0)
    assert run.summary["_funnel/junk_frames"] == expected["junk"]

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
    assert stats["_funnel/records"] == 1 + steady + 50
    assert stats["_funnel/dropped_records"] == 0
    keys = {k for row in run.history for k in row if not k.startswith("_")}
    assert keys == {"before", "steady", "after"}
    assert "lr" not in run.config and "best" not in run.summary
    # Ranks: the owner, the two workers and one per fuzz peer (its closing hello).
    assert stats["_funnel/ranks"] == 3 + CHUNKS


# A peer that did say a valid hello (it holds the job's token), then sends fresh valid batches,
# mutations of them, and mutated control messages. The logger's handling of such a peer is
# modelled frame by frame (what the protocol says: a batch numbered below what was received is
# a replay, junk; a batch numbered above it means records the peer dropped; a goodbye ends the
# rank, its exit code counts; welcome/ack/done from a client are junk), so the counts are
# asserted exactly, and every record the logger took in must be written or counted as dropped.
KNOWN_FRAMES = 20_000


@pytest.mark.timeout(180)
@pytest.mark.sink("wandb")  # records that reach the run: wandb must take or refuse them
def test_logger_survives_fuzzed_frames_from_a_peer_that_said_hello(scripts: Scripts) -> None:
    """20,000 fresh, mutated and malformed frames from a peer holding the job's token: the
    logger stays alive; junk (including replays) and refused hellos/closes are counted exactly
    as the protocol says; every record it took in is written or counted as dropped (none
    vanishes, whatever the record carried); the run's exit code is the one the peer's first
    goodbye carried, as for a rank that raised; a worker started afterwards lands."""
    res = scripts.run_file(
        SOCKET_FUZZ,
        ["known-peer", "--frames", str(KNOWN_FRAMES), "--max-record-bytes", str(MAX_RECORD_BYTES)],
        timeout=170,
    )
    assert res.returncode == 0, res.stderr[-6000:]
    assert res.leftovers == []
    info = reports(res.stdout)
    print(info)  # shown when the test fails
    stats, model = info["stats"], info["model"]
    assert sum(info["kinds"].values()) == KNOWN_FRAMES
    assert info["alive"] is True and info["code"] == 0
    # The fuzz reached every path: junk, replays or malformed; refused hellos; records taken.
    assert model["junk"] > 1000 and model["rejected"] > 0 and model["records"] > 1000
    assert stats["_funnel/junk_frames"] == model["junk"]
    assert stats["_funnel/rejected_peers"] == model["rejected"]
    # Every record is accounted for: written, or dropped (never sent by the peer, as its
    # numbering says, or refused by wandb), none lost silently.
    own = 1 + 50  # the owner's and the later worker's
    taken = own + model["records"]
    assert stats["_funnel/records"] + stats["_funnel/dropped_records"] == taken + model["gaps"]
    run = only_run(scripts.wandb_dir)
    assert run.summary["_funnel/records"] == stats["_funnel/records"]
    assert run.column("before") == [(0, 1)]
    assert [v for _, v in run.column("after")] == list(range(50))
    # A peer's goodbye with a non-zero exit code fails the run, like a rank that raised.
    assert stats["_funnel/failed_ranks"] == (1 if model["exit_code"] else 0)
    assert run.exit_code == model["exit_code"]
    assert stats["_funnel/ranks"] == 3  # the owner, the fuzz peer, the later worker


# Below ZeroMQ's framing: raw connections to the IPC socket that speak no ZMTP, or a ZMTP
# greeting with a security mechanism the logger does not use. ZeroMQ refuses the handshake
# (counted in _funnel/rejected_peers); random bytes may also parse as ZMTP 1.0 frames, which
# then reach the logger as junk. Either way nothing reaches the run.
@pytest.mark.timeout(120)
def test_raw_garbage_below_zeromq_is_refused_and_counted(scripts: Scripts) -> None:
    """200 raw connections to the IPC socket: 100 ZMTP greetings asking for another security
    mechanism (each refused by the handshake, the connection closed, and counted) and 100
    bursts of random bytes. The logger survives, nothing reaches the run, a worker lands."""
    res = scripts.run_file(SOCKET_FUZZ, ["raw"], timeout=110)
    assert res.returncode == 0, res.stderr[-6000:]
    assert res.leftovers == []
    info = reports(res.stdout)
    stats = info["stats"]
    assert info["hung_up"] == 100 and info["code"] == 0
    assert stats["_funnel/rejected_peers"] >= 100
    assert stats["_funnel/records"] == 1 + 20
    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 0
    assert [v for _, v in run.column("after")] == list(range(20))
    keys = {k for row in run.history for k in row if not k.startswith("_")}
    assert keys == {"before", "after"}
    assert stats["_funnel/ranks"] == 2
