"""The node tier's own frames (issue 38): a node logger's word about itself (``NodeHello``),
its pre-reduced batches (``Folded``), and the root's word on whether to pre-reduce
(``NodePlan``). ``codec.decode`` takes them as any other kind (its ``_DECODERS``); a
malformed one raises ValueError, which it reports as a DecodeError. The states' own columns
are checked where they are used (``columns.unpack``): this module knows their shape, not
their meaning.
"""

from __future__ import annotations

from typing import Any, Final

import msgpack

from wandb_funnel._protocol.checks import MAX_STEP
from wandb_funnel._protocol.messages import (
    FOLDED,
    MEDIA_EXT,
    NODE,
    NODE_PLAN,
    NODE_SAVED,
    PROTOCOL_VERSION,
    Folded,
    MediaRef,
    NodeHello,
    NodePlan,
    NodeSaved,
)

MAX_FOLDED_STREAMS: Final = 1 << 16  # streams (and steps) one Folded may name


def encode_node_hello(hello: NodeHello) -> bytes:
    return msgpack.packb((PROTOCOL_VERSION, NODE, *hello))  # type: ignore[no-any-return]


def _media(obj: Any) -> msgpack.ExtType:
    """A media value a rank logged, in its parts: as the rank packed it (``MEDIA_EXT``)."""
    if isinstance(obj, MediaRef):
        return msgpack.ExtType(MEDIA_EXT, msgpack.packb(obj.desc, default=_media))
    raise TypeError(f"cannot encode {type(obj).__qualname__}")


def encode_folded(folded: Folded) -> bytes:
    return msgpack.packb(  # type: ignore[no-any-return]
        (PROTOCOL_VERSION, FOLDED, *folded), use_bin_type=True, default=_media
    )


def encode_node_plan(plan: NodePlan) -> bytes:
    return msgpack.packb((PROTOCOL_VERSION, NODE_PLAN, *plan))  # type: ignore[no-any-return]


def encode_node_saved(saved: NodeSaved) -> bytes:
    return msgpack.packb((PROTOCOL_VERSION, NODE_SAVED, *saved))  # type: ignore[no-any-return]


def _want(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def decode_folded(body: list[Any]) -> Folded:
    _want(len(body) == 6, "folded needs 6 fields")
    streams, steps, nonfinite, said, keysets, states = body
    _want(type(streams) is list and 0 < len(streams) <= MAX_FOLDED_STREAMS, "bad folded streams")
    for entry in streams:
        _want(type(entry) is list and len(entry) == 5, "a folded stream is not 5 fields")
        _want(type(entry[0]) is bytes and all(map(_count, entry[1:])), "bad folded stream")
        _want(entry[1] <= entry[2], "a folded stream's numbers run backwards")
    _want(type(keysets) is list and len(keysets) <= MAX_FOLDED_STREAMS, "bad folded key sets")
    for keys in keysets:
        _want(type(keys) is list and all(type(k) is str for k in keys), "bad folded keys")
        _want(len(set(keys)) == len(keys), "a folded key set names a key twice")
    _want(type(states) is bytes, "bad folded states")
    _want(type(steps) is list and len(steps) <= MAX_FOLDED_STREAMS, "bad folded steps")
    for step in steps:
        _want(type(step) is list and len(step) == 5, "a folded step is not 5 fields")
        _want(_count(step[0]) and type(step[1]) is bool and _count(step[2]), "bad folded step")
        _want(type(step[3]) is int and -1 <= step[3] < len(keysets), "bad folded key set")
        _want(type(step[4]) is list, "a folded step's parts are not a list")
        for part in step[4]:
            _want(type(part) is list and len(part) == 2 and _count(part[0]), "bad folded part")
            _want(type(part[1]) is dict and all(type(k) is str for k in part[1]), "bad part")
    _want(_count(nonfinite) and type(said) is list, "bad folded non-finite count")
    for fact in said:
        _want(type(fact) is list and len(fact) == 4, "a folded non-finite fact is not 4 fields")
        rank, step, key, text = fact
        _want(_count(rank) and _count(step), "bad folded non-finite fact")
        _want(type(key) is str and type(text) is str, "bad folded non-finite fact")
    return Folded(streams, steps, nonfinite, said, keysets, states)


def decode_node_plan(body: list[Any]) -> NodePlan:
    _want(len(body) == 3 and type(body[0]) is bool and type(body[1]) is dict, "bad node plan")
    _want(all(type(k) is str and type(v) is str for k, v in body[1].items()), "bad node plan")
    _want(type(body[2]) is float and 0.01 <= body[2] <= 10.0, "bad node plan period")
    return NodePlan(body[0], body[1], body[2])


def decode_node_saved(body: list[Any]) -> NodeSaved:
    _want(len(body) == 1 and type(body[0]) is list, "bad node saved")
    _want(len(body[0]) <= MAX_FOLDED_STREAMS, "bad node saved")
    for point in body[0]:
        _want(type(point) is list and len(point) == 2, "a node saved point is not 2 fields")
        _want(type(point[0]) is bytes and _count(point[1]), "bad node saved point")
    return NodeSaved(body[0])


def decode_node_hello(body: list[Any]) -> NodeHello:
    _want(len(body) == 9, "node hello needs 9 fields")
    token, node, host, pid, state, *counts = body
    _want(type(token) is str and type(host) is str and state in ("live", "ended"), "bad node")
    _want(type(node) is int and 0 <= node <= MAX_STEP and _count(pid), "bad node")
    _want(all(map(_count, counts)), "bad node counts")
    return NodeHello(token, node, host, pid, state, *counts)
