"""Wire encoding: records and control messages to msgpack frames and back; the only msgpack user.

A frame is one ZeroMQ message body: a msgpack header array ``[version, kind, ...]``, followed,
for a record batch, by the records themselves packed back to back. Records are packed once, at
the ``log()`` call, so that bad input fails at the call site and a batch is a cheap byte join.
Nothing here does I/O, and nothing here ever unpickles. What ``log()`` accepts is checked by
``checks.py`` (its names importable here); ``decode`` reads a frame's header, then hands its
fields to the decoder of its kind (``_DECODERS``).
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgpack

# What log() accepts is checks.py's; its names stay importable here, where callers find them.
from wandb_funnel._protocol.checks import FLAT
from wandb_funnel._protocol.checks import MAX_NESTING as MAX_NESTING
from wandb_funnel._protocol.checks import MAX_STEP as MAX_STEP
from wandb_funnel._protocol.checks import check_data as check_data
from wandb_funnel._protocol.checks import check_step as check_step
from wandb_funnel._protocol.messages import (
    ACK,
    BLOB,
    CLOSE,
    DONE,
    FOLDED,
    GOODBYE,
    HELLO,
    MEDIA_EXT,
    NODE,
    NODE_PLAN,
    NODE_SAVED,
    PROTOCOL_VERSION,
    RECORDS,
    REHELLO,
    SAVED,
    WELCOME,
    Ack,
    Blob,
    Close,
    Done,
    Goodbye,
    Hello,
    MediaRef,
    Message,
    RecordBatch,
    Rehello,
    Saved,
    Update,
    UpdateKind,
    Welcome,
)
from wandb_funnel._protocol.node_wire import (
    decode_folded,
    decode_node_hello,
    decode_node_plan,
    decode_node_saved,
)

# The most records one batch frame may declare; a frame claiming more is junk.
MAX_BATCH_RECORDS: Final = 1 << 20


class DecodeError(ValueError):
    """A frame that is not a valid message of this protocol version."""


# ---- encoding (client side) ----------------------------------------------------------------

_local = threading.local()


def _scalar_item(obj: Any) -> Any:
    """msgpack ``default`` hook: numpy scalars, 0-d arrays and 0-d tensors become Python numbers.

    ``.item()`` on a CUDA tensor copies it to the host and waits for the GPU: that sync is the
    price of logging a CUDA value, paid where the value is logged.
    """
    if getattr(obj, "ndim", None) == 0 and hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__module__}.{type(obj).__qualname__}")


scalar_item = _scalar_item  # for a media packer's default (``_worker/media.py``)


def _packer() -> msgpack.Packer:
    # One packer per thread: a Packer keeps an internal buffer and is not thread-safe.
    packer: msgpack.Packer | None = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(default=_scalar_item, use_bin_type=True)
    return packer


def _find_unencodable(
    data: Mapping[str, Any], default: Callable[[Any], Any] | None = None, path: str = ""
) -> tuple[str, Any] | None:
    """Slow path after a failed pack: name the key whose value could not be encoded."""
    packer = msgpack.Packer(default=default or _scalar_item, use_bin_type=True)
    for key, value in data.items():
        full = f"{path}.{key}" if path else key
        try:
            packer.pack(value)
        except Exception:
            if isinstance(value, Mapping):
                inner = _find_unencodable(value, default, full)
                if inner is not None:
                    return inner
            return full, value
    return None


def _pack_checked(
    obj: Any, data: Mapping[str, Any], what: str, default: Callable[[Any], Any] | None = None
) -> bytes:
    try:
        if default is not None:
            return msgpack.packb(obj, default=default, use_bin_type=True)  # type: ignore[no-any-return]
        return _packer().pack(obj)  # type: ignore[no-any-return]
    except Exception as exc:
        # A failed pack can leave the packer's buffer dirty: drop it.
        _local.packer = None
        bad = _find_unencodable(data, default)
        if bad is None:
            raise TypeError(f"wandb_funnel: cannot encode {what}: {exc}") from exc
        key, value = bad
        kind = type(value)
        if isinstance(exc, OverflowError) or type(value) is int:
            raise ValueError(
                f"wandb_funnel: value for key {key!r} is out of range for a 64-bit integer: "
                f"{value!r}"
            ) from exc
        raise TypeError(
            f"wandb_funnel: cannot encode value for key {key!r}: "
            f"{kind.__module__}.{kind.__qualname__} is not a number, bool, str, None, "
            f"dict, list, numpy scalar or 0-d tensor"
        ) from exc


def encode_record(
    step: int,
    committed: bool,
    data: Any,
    max_record_bytes: int,
    default: Callable[[Any], Any] | None = None,
    packer: msgpack.Packer | None = None,
) -> bytes:
    """Validate and pack one ``log()`` record, in one pass; raises TypeError/ValueError naming
    the key at fault. ``default`` packs what msgpack cannot (media values, as ``MEDIA_EXT``);
    ``packer``, a ``msgpack.Packer(default=default, use_bin_type=True)`` the caller keeps per
    thread (without it, one is made for the call)."""
    # Checked here too, not only in check_step: an implicit step can reach 2**63 (after
    # log(step=2**63-1, commit=True)), which msgpack packs but the decoder refuses.
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"wandb_funnel: step must be between 0 and 2**63-1, got {step!r}")
    if type(data) is dict:  # check_data's fast path, inline: a function call costs 0.1 us
        for key, value in data.items():
            if type(key) is not str or type(value) not in FLAT:
                data = check_data(data)
                break
    else:
        data = check_data(data)
    if packer is None:
        packer = getattr(_local, "packer", None)
        if default is not None:
            packer = msgpack.Packer(default=default, use_bin_type=True)
    try:
        packed: bytes = packer.pack((step, committed, data))  # type: ignore[union-attr]
    except Exception as exc:  # no packer yet on this thread (AttributeError), or data it refuses
        if default is not None:
            if isinstance(exc, (TypeError, ValueError)) and str(exc).startswith("wandb_funnel:"):
                raise  # a media value refused, by the media hook: its own message says why
            packed = _pack_checked((step, committed, data), data, "log data", default)
        else:
            packed = _pack_checked((step, committed, data), data, "log data")
    if len(packed) > max_record_bytes:
        raise ValueError(
            f"wandb_funnel: record at step {step} is {len(packed)} bytes encoded, over "
            f"max_record_bytes={max_record_bytes}"
        )
    return packed


def encode_batch(first_seq: int, packed_records: list[bytes]) -> bytes:
    header = msgpack.packb((PROTOCOL_VERSION, RECORDS, first_seq, len(packed_records)))
    return header + b"".join(packed_records)  # type: ignore[no-any-return]


def encode_hello(hello: Hello) -> bytes:
    return msgpack.packb(  # type: ignore[no-any-return]
        (
            PROTOCOL_VERSION,
            HELLO,
            hello.token,
            hello.pid,
            hello.host,
            hello.requested_rank,
            hello.pid_start,
            None if hello.resume is None else list(hello.resume),
        )
    )


def encode_update(kind: UpdateKind, data: dict[str, Any], max_record_bytes: int) -> bytes:
    """Pack a rank's update of the run (``UpdateKind``: config, summary, define_metric, ...)."""
    what = UpdateKind(kind).label
    packed = _pack_checked((PROTOCOL_VERSION, kind, data), data, what)
    if len(packed) > max_record_bytes:
        raise ValueError(
            f"wandb_funnel: {what} update is {len(packed)} bytes, over "
            f"max_record_bytes={max_record_bytes}"
        )
    return packed


def encode_blob(blob: Blob) -> bytes:
    return msgpack.packb(  # type: ignore[no-any-return]
        (PROTOCOL_VERSION, BLOB, blob.name, blob.offset, blob.total, blob.data),
        use_bin_type=True,
    )


def encode_goodbye(goodbye: Goodbye) -> bytes:
    return msgpack.packb(  # type: ignore[no-any-return]
        (PROTOCOL_VERSION, GOODBYE, goodbye.produced, goodbye.reason, goodbye.exit_code)
    )


def encode_close(close: Close) -> bytes:
    return msgpack.packb(  # type: ignore[no-any-return]
        (PROTOCOL_VERSION, CLOSE, close.token, close.exit_code, close.budget, close.footer)
    )


def encode_welcome(welcome: Welcome) -> bytes:
    return msgpack.packb(  # type: ignore[no-any-return]
        (PROTOCOL_VERSION, WELCOME, welcome.rank, welcome.run, welcome.logger_pid)
    )


def encode_ack(ack: Ack) -> bytes:
    return msgpack.packb((PROTOCOL_VERSION, ACK, ack.received))  # type: ignore[no-any-return]


def encode_saved(saved: Saved) -> bytes:
    return msgpack.packb((PROTOCOL_VERSION, SAVED, saved.seq))  # type: ignore[no-any-return]


REHELLO_FRAME: Final[bytes] = msgpack.packb((PROTOCOL_VERSION, REHELLO))


def encode_done(done: Done) -> bytes:
    return msgpack.packb((PROTOCOL_VERSION, DONE, done.stats))  # type: ignore[no-any-return]


# ---- decoding (logger side, and the client's replies) --------------------------------------


def _is_int(value: Any) -> bool:
    return type(value) is int


def _want(cond: bool, msg: str) -> None:
    if not cond:
        raise DecodeError(msg)


def _check_records(records: list[Any]) -> None:
    """Every record is ``[step, committed, data]`` with str keys. On the receive path for every
    record: plain ifs in one loop, and error messages built only when a check fails."""
    for rec in records:
        if type(rec) is not list or len(rec) != 3:
            raise DecodeError(f"record is not [step, committed, data]: {rec!r:.80}")
        step, committed, data = rec
        if type(step) is not int or not 0 <= step <= MAX_STEP:
            raise DecodeError(f"record step is not a valid step: {step!r:.40}")
        if type(committed) is not bool:
            raise DecodeError("record commit flag is not a bool")
        if type(data) is not dict:
            raise DecodeError("record data is not a map")
        for key in data:
            if type(key) is not str:
                raise DecodeError("record data has a non-str key")


def peek_batch(frame: bytes) -> tuple[int, int] | None:
    """``(first_seq, count)`` from a record batch's header, without decoding its records; None
    for any other frame, or one whose header is malformed (``decode`` then says why).

    For a receiver with no room for the records: it still learns which numbers were skipped,
    so the drop is counted exactly, at the cost of unpacking four small ints.
    """
    try:
        unpacker = msgpack.Unpacker(max_buffer_size=max(len(frame), 1))
        unpacker.feed(frame)
        header = unpacker.unpack()
    except Exception:
        return None
    if type(header) is not list or len(header) != 4 or not all(map(_is_int, header)):
        return None
    version, kind, first_seq, count = header
    if version != PROTOCOL_VERSION or kind != RECORDS:
        return None
    if first_seq < 0 or not 0 <= count <= MAX_BATCH_RECORDS:
        return None
    return first_seq, count


# Media inside media (a table's image, its masks, their classes) nests 4 deep at most. Each
# level is a C unpacker of its own on the stack: 200 levels crashed the process outright.
_MAX_EXT_DEPTH: Final = 6


def _decode_ext(code: int, payload: bytes) -> MediaRef:
    """A media value's descriptor; the logger checks its fields when it uses them."""
    if code != MEDIA_EXT:
        raise DecodeError(f"unknown extension type {code}")
    depth = getattr(_local, "ext_depth", 0)
    if depth >= _MAX_EXT_DEPTH:
        raise DecodeError("media values nested too deeply")
    _local.ext_depth = depth + 1
    try:
        desc = msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=_decode_ext)
    finally:
        _local.ext_depth = depth
    if type(desc) is not dict or type(desc.get("k")) is not str:
        raise DecodeError("a media value is not a descriptor map")
    return MediaRef(desc)


def _records(body: list[Any], unpacker: msgpack.Unpacker, frame: bytes) -> RecordBatch:
    _want(len(body) == 2, "records header needs first_seq and count")
    first_seq, count = body
    _want(_is_int(first_seq) and first_seq >= 0, "first_seq is not a count")
    _want(_is_int(count) and 0 <= count <= MAX_BATCH_RECORDS, "bad record count")
    # Unpacked by the C iterator; a count larger than the frame holds just stops early.
    records = list(itertools.islice(unpacker, count))
    _want(len(records) == count, "fewer records than the header declares")
    _check_records(records)
    _want(unpacker.tell() == len(frame), "trailing bytes after the records")
    return RecordBatch(first_seq, records)


def _hello(body: list[Any]) -> Hello:
    _want(len(body) == 6, "hello needs 6 fields")
    token, pid, host, rank, pid_start, resume = body
    _want(type(token) is str and _is_int(pid) and type(host) is str, "bad hello fields")
    _want(rank is None or (_is_int(rank) and 0 <= rank <= MAX_STEP), "bad hello rank")
    _want(pid_start is None or _is_int(pid_start), "bad hello start time")
    _want(
        resume is None
        or (
            type(resume) is list
            and len(resume) == 2
            and all(_is_int(n) and 0 <= n <= MAX_STEP for n in resume)
            and resume[0] <= resume[1]
        ),
        "bad hello resume range",
    )
    return Hello(token, pid, host, rank, pid_start, None if resume is None else tuple(resume))


def _update(kind: UpdateKind, body: list[Any]) -> Update:
    _want(len(body) == 1 and type(body[0]) is dict, "update is not a map")
    _want(all(type(k) is str for k in body[0]), "update has a non-str key")
    return Update(kind, body[0])


def _blob(body: list[Any]) -> Blob:
    _want(len(body) == 4, "blob needs 4 fields")
    name, offset, total, data = body
    _want(type(name) is str and type(data) is bytes, "bad blob fields")
    _want(_is_int(offset) and _is_int(total) and offset >= 0, "bad blob offset")
    _want(offset + len(data) <= total <= MAX_STEP, "blob chunk past its total")
    return Blob(name, offset, total, data)


def _goodbye(body: list[Any]) -> Goodbye:
    _want(len(body) == 3 and _is_int(body[0]) and type(body[1]) is str, "bad goodbye")
    _want(body[0] >= 0 and _is_int(body[2]), "bad goodbye count or exit code")
    return Goodbye(body[0], body[1], body[2])


def _close(body: list[Any]) -> Close:
    _want(len(body) in (3, 4), "close needs 3 or 4 fields")
    token, code, budget, *more = body
    _want(type(token) is str and _is_int(code), "bad close fields")
    _want(type(budget) in (int, float) and math.isfinite(budget), "bad close budget")
    footer = more[0] if more else True
    _want(type(footer) is bool, "bad close footer")
    return Close(token, code, float(budget), footer)


def _welcome(body: list[Any]) -> Welcome:
    _want(len(body) == 3 and _is_int(body[0]), "bad welcome")
    _want(body[1] is None or type(body[1]) is dict, "bad welcome run info")
    _want(body[2] is None or _is_int(body[2]), "bad welcome logger pid")
    return Welcome(body[0], body[1], body[2])


def _ack(body: list[Any]) -> Ack:
    _want(len(body) == 1 and _is_int(body[0]) and body[0] >= 0, "bad ack")
    return Ack(body[0])


def _saved(body: list[Any]) -> Saved:
    _want(len(body) == 1 and _is_int(body[0]) and body[0] >= 0, "bad saved")
    return Saved(body[0])


def _rehello(body: list[Any]) -> Rehello:
    _want(not body, "bad rehello")
    return Rehello()


def peek_kind(frame: bytes) -> int | None:
    """A frame's message kind from its header alone (a node logger's forwarding: records
    pass through undecoded); None when the header is malformed."""
    try:
        unpacker = msgpack.Unpacker(max_buffer_size=max(len(frame), 1))
        unpacker.feed(frame)
        size = unpacker.read_array_header()
        if size < 2:
            return None
        unpacker.skip()  # the version: decode() checks it where the frame is taken
        kind = unpacker.unpack()
    except Exception:
        return None
    return kind if _is_int(kind) else None


def _done(body: list[Any]) -> Done:
    _want(len(body) == 1 and type(body[0]) is dict, "bad done")
    return Done(body[0])


# Every message kind but RECORDS (whose records follow the header), to its decoder: the
# header's fields after [version, kind] in, the message out, or DecodeError saying why.
_DECODERS: Final[dict[int, Callable[[list[Any]], Message]]] = {
    HELLO: _hello,
    BLOB: _blob,
    GOODBYE: _goodbye,
    CLOSE: _close,
    WELCOME: _welcome,
    ACK: _ack,
    SAVED: _saved,
    REHELLO: _rehello,
    NODE: decode_node_hello,
    FOLDED: decode_folded,
    NODE_PLAN: decode_node_plan,
    NODE_SAVED: decode_node_saved,
    DONE: _done,
    **{kind: functools.partial(_update, kind) for kind in UpdateKind},
}


def decode(frame: bytes, max_frame_bytes: int) -> Message:
    """Decode one frame; anything malformed raises DecodeError, never anything else."""
    if len(frame) > max_frame_bytes:
        raise DecodeError(f"frame of {len(frame)} bytes is over the {max_frame_bytes}-byte limit")
    try:
        unpacker = msgpack.Unpacker(
            raw=False,
            strict_map_key=False,
            max_buffer_size=max(len(frame), 1),
            ext_hook=_decode_ext,
        )
        unpacker.feed(frame)
        header = unpacker.unpack()
        _want(type(header) is list and len(header) >= 2, "header is not [version, kind, ...]")
        version, kind = header[0], header[1]
        _want(
            _is_int(version) and version == PROTOCOL_VERSION,  # not True, not 1.0
            f"protocol version {version!r:.20} is not supported",
        )
        if kind == RECORDS:
            return _records(header[2:], unpacker, frame)
        _want(unpacker.tell() == len(frame), "trailing bytes after the message")
        decoder = _DECODERS.get(kind)
        if decoder is None:
            raise DecodeError(f"unknown message kind {kind!r:.20}")
        return decoder(header[2:])
    except DecodeError:
        raise
    except Exception as exc:  # truncated data, bad utf-8, depth bombs, anything msgpack raises
        raise DecodeError(f"{type(exc).__name__}: {exc}") from exc
