"""The wire codec: round trips, call-site validation, and junk that must never escape."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tiers import examples
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import (
    CONFIG,
    PROTOCOL_VERSION,
    RECORDS,
    SUMMARY,
    TENSORBOARD,
    Ack,
    Close,
    Done,
    Goodbye,
    Hello,
    RecordBatch,
    Update,
    UpdateKind,
    Welcome,
)

MAX = 1 << 26

V = PROTOCOL_VERSION  # the version the junk frames below are written in


def _batch(records: list[tuple[int, bool, dict[str, Any]]], first_seq: int = 0) -> RecordBatch:
    packed = [codec.encode_record(s, c, d, MAX) for s, c, d in records]
    message = codec.decode(codec.encode_batch(first_seq, packed), MAX)
    assert isinstance(message, RecordBatch)
    return message


def test_record_batch_round_trip() -> None:
    """A batch decodes to the same steps, commit flags and data, in order."""
    records: list[tuple[int, bool, dict[str, Any]]] = [
        (0, True, {"a": 1}),
        (5, False, {"b": {"c": [1.5, None, "x"]}}),
        (5, True, {}),
    ]
    batch = _batch(records, first_seq=7)
    assert batch.first_seq == 7
    assert [tuple(r) for r in batch.records] == records


def test_control_messages_round_trip() -> None:
    """Every control message decodes to what was encoded, as its own kind. (Messages are
    NamedTuples: Ack(2) == Welcome(2), so the type is compared too.)"""

    def same(decoded: object, expected: object) -> bool:
        return type(decoded) is type(expected) and decoded == expected

    hello = Hello("tok", 12, "host", 3, 999)
    assert same(codec.decode(codec.encode_hello(hello), MAX), hello)
    assert same(codec.decode(codec.encode_goodbye(Goodbye(4, "done")), MAX), Goodbye(4, "done"))
    close = Close("tok", 143, 2.5)
    assert same(codec.decode(codec.encode_close(close), MAX), close)
    assert same(codec.decode(codec.encode_welcome(Welcome(2)), MAX), Welcome(2))
    opened = Welcome(2, {"name": "run-x", "dir": "/d/files", "offline": False})
    assert same(codec.decode(codec.encode_welcome(opened), MAX), opened)
    assert same(codec.decode(codec.encode_ack(Ack(2)), MAX), Ack(2))
    assert same(codec.decode(codec.encode_done(Done({"x": 1})), MAX), Done({"x": 1}))
    update = codec.encode_update(CONFIG, {"lr": 0.1}, MAX)
    assert same(codec.decode(update, MAX), Update(UpdateKind.CONFIG, {"lr": 0.1}))
    summary = codec.encode_update(SUMMARY, {"best": 1}, MAX)
    assert same(codec.decode(summary, MAX), Update(UpdateKind.SUMMARY, {"best": 1}))
    tb = {"log_dir": "runs/a", "save": True, "root_dir": "", "cwd": "/w"}
    assert same(
        codec.decode(codec.encode_update(TENSORBOARD, tb, MAX), MAX),
        Update(UpdateKind.TENSORBOARD, tb),
    )
    # Every kind round-trips, and the decoded kind is the enum, not a bare int.
    for kind in UpdateKind:
        decoded = codec.decode(codec.encode_update(kind, {"k": 1}, MAX), MAX)
        assert decoded == Update(kind, {"k": 1}) and type(decoded.kind) is UpdateKind


def test_numpy_scalars_and_special_floats_pass() -> None:
    """numpy scalars and 0-d arrays become plain numbers; NaN and inf pass as in wandb."""
    batch = _batch(
        [
            (
                0,
                True,
                {
                    "f": np.float32(0.5),
                    "i": np.int64(3),
                    "z": np.array(2.0),
                    "nan": math.nan,
                    "inf": -math.inf,
                    "b": True,
                },
            )
        ]
    )
    data = batch.records[0][2]
    assert data["f"] == 0.5 and data["i"] == 3 and data["z"] == 2.0 and data["b"] is True
    assert math.isnan(data["nan"]) and data["inf"] == -math.inf


def test_torch_zero_d_tensor_passes() -> None:
    """A 0-d torch tensor is logged as its value (when torch is installed)."""
    torch = pytest.importorskip("torch")
    batch = _batch([(0, True, {"loss": torch.tensor(1.25)})])
    assert batch.records[0][2]["loss"] == 1.25


@pytest.mark.parametrize(
    ("data", "exc", "fragment"),
    [
        ({1: 2}, TypeError, "keys must be str"),
        ({"a": {2: 3}}, TypeError, "in 'a'"),
        ({"obj": object()}, TypeError, "'obj'"),
        ({"nested": {"deep": {1, 2}}}, TypeError, "'nested.deep'"),
        ({"arr": np.zeros(3)}, TypeError, "'arr'"),
        ({"big": 2**70}, ValueError, "'big'"),
    ],
)
def test_bad_values_name_the_key(data: dict[str, Any], exc: type, fragment: str) -> None:
    """Unencodable input raises TypeError/ValueError that names the key at fault."""
    with pytest.raises(exc, match=fragment):
        codec.encode_record(0, True, codec.check_data(data), MAX)


def test_oversized_record_is_rejected() -> None:
    """A record over max_record_bytes raises ValueError at the call site."""
    with pytest.raises(ValueError, match="max_record_bytes=100"):
        codec.encode_record(0, True, {"s": "x" * 200}, 100)


@pytest.mark.parametrize("step", [-1, 2**63, 1.5, "3", True, None])
def test_bad_steps(step: object) -> None:
    """Steps must be non-negative 63-bit ints."""
    with pytest.raises((TypeError, ValueError)):
        codec.check_step(step)


def test_non_dict_data() -> None:
    with pytest.raises(TypeError, match="must be a dict"):
        codec.check_data([1, 2])


def test_packer_recovers_after_a_failure() -> None:
    """A failed pack does not corrupt the next record (the per-thread packer is reset)."""
    with pytest.raises(TypeError):
        codec.encode_record(0, True, {"a": 1, "b": object()}, MAX)
    batch = _batch([(1, True, {"ok": 1})])
    assert batch.records[0][2] == {"ok": 1}


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",
        msgpack.packb([99, 2, 0, 0]),  # wrong protocol version
        msgpack.packb([V, 2, 0, 5]),  # declares 5 records, has none
        msgpack.packb([V, 2, 0, 2**40]),  # huge declared count
        msgpack.packb([V, 2, 0, 1]) + msgpack.packb(["x", True, {}]),  # wrong type of step
        msgpack.packb([V, 2, 0, 1]) + msgpack.packb([1, True, {1: 2}]),  # int key
        msgpack.packb([V, 1, "tok", "pid", "h", None, None, None]),  # wrong field type
        msgpack.packb([V, 1, "tok", 7, "h", None, None]),  # a hello of the old shape
        msgpack.packb([V, 77]),  # unknown kind
        msgpack.packb({"a": 1}),  # header not a list
        msgpack.packb([V, 5, 3, "x"]) + b"\x00",  # trailing bytes
        b"\xdb\xff\xff\xff\xff",  # str32 declaring 4 GiB
    ],
)
def test_junk_frames_raise_decode_error_only(frame: bytes) -> None:
    """Malformed frames raise DecodeError, never anything else."""
    with pytest.raises(codec.DecodeError):
        codec.decode(frame, MAX)


def test_every_message_kind_has_one_decoder_and_an_unknown_kind_is_named() -> None:
    """``decode`` is a table from message kind to decoder (a batch's records follow its
    header, so RECORDS is read apart): every kind of messages.py is in it once."""
    from wandb_funnel._protocol import messages

    names = [
        "HELLO",
        "RECORDS",
        "GOODBYE",
        "CLOSE",
        "BLOB",
        "WELCOME",
        "DONE",
        "ACK",
        "SAVED",
        "REHELLO",
        "NODE",
        "FOLDED",
        "NODE_PLAN",
        "NODE_SAVED",
    ]
    kinds = [getattr(messages, name) for name in names] + list(UpdateKind)
    assert len(set(kinds)) == len(kinds)  # no two kinds share a number
    assert {*codec._DECODERS, messages.RECORDS} == set(kinds)
    with pytest.raises(codec.DecodeError, match="unknown message kind 77"):
        codec.decode(msgpack.packb([messages.PROTOCOL_VERSION, 77]), MAX)


def test_frame_over_limit_is_junk() -> None:
    with pytest.raises(codec.DecodeError, match="over the"):
        codec.decode(b"x" * 100, 10)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_escape(frame: bytes) -> None:
    """Whatever arrives, decode returns a message or raises DecodeError."""
    try:
        codec.decode(frame, MAX)
    except codec.DecodeError:
        pass


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**63 - 1),
            st.booleans(),
            st.dictionaries(st.text(max_size=8), json_values, max_size=5),
        ),
        max_size=10,
    )
)
def test_any_valid_records_round_trip(records: list[tuple[int, bool, dict[str, Any]]]) -> None:
    """Every valid record decodes to equal data (NaN compared by repr)."""
    batch = _batch(records)
    assert repr([tuple(r) for r in batch.records]) == repr(records)


@pytest.mark.parametrize("value", [b"raw", bytearray(b"x"), [1, b"in-list"], {"deep": b"x"}])
def test_bytes_are_refused_at_the_call_site(value: object) -> None:
    """wandb cannot store raw bytes, so they are refused where they are logged."""
    with pytest.raises(TypeError, match=r"bytes|bytearray"):
        codec.check_data({"k": value})


def test_peek_batch_reads_a_batch_header_without_its_records() -> None:
    records = [codec.encode_record(s, True, {"x": s}, 1 << 16) for s in range(3)]
    frame = codec.encode_batch(7, records)
    assert codec.peek_batch(frame) == (7, 3)
    assert codec.peek_batch(frame[:-5]) == (7, 3)  # records are not looked at: decode says


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",
        msgpack.packb((PROTOCOL_VERSION, RECORDS, -1, 3)),
        msgpack.packb((PROTOCOL_VERSION, RECORDS, 0, codec.MAX_BATCH_RECORDS + 1)),
        msgpack.packb((PROTOCOL_VERSION + 1, RECORDS, 0, 3)),
        msgpack.packb((True, RECORDS, 0, 3)),
        msgpack.packb((PROTOCOL_VERSION, RECORDS, 0.0, 3)),
        msgpack.packb((PROTOCOL_VERSION, RECORDS, 0)),
        codec.encode_goodbye(Goodbye(3, "done", 0)),
    ],
)
def test_peek_batch_is_none_for_anything_but_a_batch_header(frame: bytes) -> None:
    assert codec.peek_batch(frame) is None
