"""A node's ``KeyState``s by column (issue 38): how a ``Folded`` frame carries them, and how
the root merges thousands of nodes' states of one step at once.

One key's state is a row of 5 floats and 9 ints (``Row``). A frame carries all its steps'
states field by field (``pack``: a field's values for every key of every step, little-endian,
in as few bytes as they need, a field of zeros left out), and the key names once per
distinct key set (``keysets``). So the root decodes a frame's states in a call per field,
checks them in a handful of vector operations, and merges a step's states from every node by
column, not key by key and node by node: numpy where it is installed (it is wherever torch
is), plain Python otherwise (slower).

What changes from a ``KeyState``: its exact sum (partials) travels as a double-double
``hi + lo`` (``hi`` the rounded sum, ``lo`` what rounding left, 106 bits), and the root adds
those with error-free transformations (TwoSum), so a sum's width stays two floats however
many nodes merge. The row's sum is then the flat funnel's ``fsum`` but where the exact sum
lies within about 2**-100 of a rounding tie, or the values cancel to below 2**-100 of their
size: there it may differ by one rounding (keeping every node's partials exact cost the
root 5 times the CPU at 2,048 nodes; docs/reports/benchmarks.md). Ints are folded within
``INT_LIMIT``, so that a sum of a million ranks' fits the wire's 64 bits.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from wandb_funnel._protocol.mergeable import KeyState

INT_LIMIT = 1 << 40  # ints folded are within this (a node's and the root's sums fit 64 bits)
# A row's fields: floats, then ints (the root views one int64 array as float64 for the first)
FIRST, LOW, HIGH, SUM_HI, SUM_LO = range(5)
COUNT, FIRST_RANK, LOW_RANK, HIGH_RANK, NAN, PINF, NINF, INT_SUM, FLAGS = range(5, 14)
FIELDS = 14
# FLAGS bits
ALL_INTS, FIRST_INT, LOW_INT, HIGH_INT, HAS_EXTREMES = 1, 2, 4, 8, 16
_ALL_FLAGS = 31
# values a state may hold, and NaNs and infinities among them (so that count * INT_LIMIT, and
# the counts of thousands of nodes summed, fit 64 bits)
_MAX_COUNT = 1 << 22

_np: Any = None  # numpy, once a frame's states are first unpacked (None: plain Python)
_use_numpy: bool | None = None  # None: with numpy if it imports


def _numpy() -> bool:
    """Whether to merge with numpy; imported on first use (a node logger, which only packs,
    and every other process never pay for it)."""
    global _np, _use_numpy
    if _use_numpy is None:
        try:
            import numpy
        except ImportError:  # pragma: no cover - numpy is in the test environment
            _use_numpy = False
        else:
            _np, _use_numpy = numpy, True
    return _use_numpy


def use_numpy(on: bool) -> bool:
    """Merge with numpy (when installed) or in plain Python; returns the previous choice
    (tests run both)."""
    global _use_numpy
    before = _numpy()
    _use_numpy = None
    _use_numpy = on and _numpy()
    return before


# -- a node's side: KeyStates to rows --------------------------------------------------------
Row = tuple[Any, ...]  # FIELDS values: 5 floats, 9 ints


def state_row(state: KeyState) -> Row:
    """One key's state as a row (a node folds plain ints and floats only)."""
    pinf, ninf = state.pinf, state.ninf
    try:
        hi = math.fsum(state.partials)
        lo = math.fsum([*state.partials, -hi]) if state.partials else 0.0
    except OverflowError:  # partials whose sum rounds past the largest float: that infinity
        hi = lo = 0.0
        if state.partials[-1] > 0:
            pinf += 1
        else:
            ninf += 1
    flags = ALL_INTS if state.ints else 0
    if type(state.first) is int:
        flags |= FIRST_INT
    low = high = 0.0
    if state.low is not None:
        flags |= HAS_EXTREMES
        low, high = float(state.low), float(state.high)
        flags |= (LOW_INT if type(state.low) is int else 0) | (
            HIGH_INT if type(state.high) is int else 0
        )
    return (
        float(state.first),
        low,
        high,
        hi,
        lo,
        state.count,
        state.first_rank,
        state.low_rank,
        state.high_rank,
        state.nan,
        pinf,
        ninf,
        state.int_sum,
        flags,
    )


def pack(rows: Sequence[Row]) -> bytes:
    """Rows of ``state_row`` as the wire's columns: a byte per field, its width (0: every
    value is 0, left out; 4: each fits an int32; else 8), then each field's values that are
    not left out, little-endian, field after field. Most of a row is small ints and zeros
    (a float key's non-finite counts, its int sum): 50 to 60 bytes a key, not 112, and the
    root checks each field as one contiguous array."""
    widths = bytearray()
    parts = []
    n = len(rows)
    for field, values in enumerate(zip(*rows, strict=True) if rows else [()] * FIELDS):
        if field < COUNT:
            width = 8 if any(values) or any(math.copysign(1.0, v) < 0 for v in values) else 0
            code = "d"
        else:
            low, high = (min(values), max(values)) if values else (0, 0)
            width = 0 if low == high == 0 else 4 if low >= -(2**31) and high < 2**31 else 8
            code = "i" if width == 4 else "q"
        widths.append(width)
        if width:
            parts.append(struct.pack(f"<{n}{code}", *values))
    return bytes(widths) + b"".join(parts)


# -- the root's side ---------------------------------------------------------------------------
class Block(NamedTuple):
    """One step's states from one node (or merged from several): ``keys``, and a row per key
    (a numpy int64 array, its first 5 columns float64 bits; or tuples in plain Python)."""

    keys: tuple[str, ...]
    rows: Any


def unpack(keysets: Sequence[tuple[str, ...]], which: Sequence[int], states: bytes) -> list[Block]:
    """A frame's states (``pack``): a block per step (``which``: each step's index into
    ``keysets``), in order; ValueError names what is malformed (a frame off the network)."""
    count = sum(len(keysets[k]) for k in which)
    widths = states[:FIELDS]
    if len(widths) != FIELDS or any(
        w not in ((0, 8) if f < COUNT else (0, 4, 8)) for f, w in enumerate(widths)
    ):
        raise ValueError("a folded frame's states are malformed: their widths")
    if len(states) != FIELDS + count * sum(widths):
        raise ValueError("a folded frame's states are not as long as its keys")
    # Every count is at least 1, so a frame with keys has its counts: then its length said
    # how many keys it holds, before anything is made for them (14 bytes could say billions).
    if count and not widths[COUNT]:
        raise ValueError(_BAD + ": counts or ranks")
    rows: Any
    if _numpy():
        fields = _np.zeros((FIELDS, count), "<i8")
        at = FIELDS
        for field, width in enumerate(widths):
            if width:
                fields[field] = _np.frombuffer(states, "<i4" if width == 4 else "<i8", count, at)
                at += count * width
        _check_numpy(fields)
        rows = _np.ascontiguousarray(fields.T)  # a row per key, as merge takes them
    else:
        columns: list[Sequence[Any]] = []
        at = FIELDS
        for field, width in enumerate(widths):
            code = "d" if field < COUNT else "i" if width == 4 else "q"
            columns.append(
                struct.unpack_from(f"<{count}{code}", states, at)
                if width
                else [0.0 if field < COUNT else 0] * count
            )
            at += count * width
        rows = list(zip(*columns, strict=True))
        for row in rows:
            _check_row(row)
    blocks = []
    at = 0
    for k in which:
        keys = keysets[k]
        end = at + len(keys)
        blocks.append(Block(keys, rows[at:end]))
        at = end
    return blocks


_BAD = "a folded key's state is malformed"


def _check_row(row: Row) -> None:
    count, first_rank, low_rank, high_rank, nan, pinf, ninf, int_sum, flags = row[COUNT:]
    if (
        not 1 <= count <= _MAX_COUNT
        or first_rank < 0
        or not 0 <= min(nan, pinf, ninf) <= max(nan, pinf, ninf) <= _MAX_COUNT
        or not 0 <= flags <= _ALL_FLAGS
    ):
        raise ValueError(_BAD + ": counts or ranks")
    if abs(int_sum) > count * INT_LIMIT or not (
        math.isfinite(row[SUM_HI]) and math.isfinite(row[SUM_LO])
    ):
        raise ValueError(_BAD + ": its sums")
    if flags & HAS_EXTREMES and (
        min(low_rank, high_rank) < 0 or math.isnan(row[LOW]) or math.isnan(row[HIGH])
    ):
        raise ValueError(_BAD + ": its min or max")


def _check_numpy(fields: Any) -> None:
    """``_check_row`` for every row at once, given field by field (``FIELDS`` contiguous
    arrays: 3 times faster than a least per column of rows; the root checks some 2,000
    frames a second at 16,384 ranks): each field's least and greatest value, ints and floats,
    then the rows one by one only where those do not settle it. (A float field's least or
    greatest is NaN if any value is: NaN propagates.) A value said to be an int that is not
    a whole number is not checked here: it stays a float (``_state``)."""
    np = _np
    if not fields.shape[1]:
        return
    low, high = fields.min(1).tolist(), fields.max(1).tolist()
    floats = fields[:COUNT].view("<f8")
    f_low, f_high = floats.min(1).tolist(), floats.max(1).tolist()
    if (
        low[COUNT] < 1
        or high[COUNT] > _MAX_COUNT
        or low[FIRST_RANK] < 0
        or min(low[NAN], low[PINF], low[NINF]) < 0
        or max(high[NAN], high[PINF], high[NINF]) > _MAX_COUNT
        or low[FLAGS] < 0
        or high[FLAGS] > _ALL_FLAGS
    ):
        raise ValueError(_BAD + ": counts or ranks")
    if (low[INT_SUM] < -INT_LIMIT or high[INT_SUM] > INT_LIMIT) and (
        (fields[INT_SUM] < -fields[COUNT] * INT_LIMIT)  # (not abs: -2**63 stays negative)
        | (fields[INT_SUM] > fields[COUNT] * INT_LIMIT)
    ).any():
        raise ValueError(_BAD + ": its sums")
    sums = (f_low[SUM_HI], f_low[SUM_LO], f_high[SUM_HI], f_high[SUM_LO])
    if not all(map(math.isfinite, sums)):
        raise ValueError(_BAD + ": its sums")
    extremes = (f_low[LOW], f_low[HIGH])
    if min(low[LOW_RANK], low[HIGH_RANK]) < 0 or any(map(math.isnan, extremes)):
        f = fields.view("<f8")
        has = (fields[FLAGS] & HAS_EXTREMES) != 0  # (a key of NaNs only has none)
        bad = (
            (fields[LOW_RANK] < 0) | (fields[HIGH_RANK] < 0) | np.isnan(f[LOW]) | np.isnan(f[HIGH])
        )
        if (has & bad).any():
            raise ValueError(_BAD + ": its min or max")


def merge(blocks: list[Block]) -> list[Block]:
    """``blocks`` of one step merged into one block per distinct key set."""
    groups: dict[int, list[Block]] = {}
    for block in blocks:
        groups.setdefault(id(block.keys), []).append(block)
    merged = []
    for group in groups.values():
        if len(group) == 1:
            merged.append(group[0])
        elif _numpy():
            merged.append(_merge_numpy(group))
        else:
            merged.append(_merge_python(group))
    return merged


def compact(blocks: list[Block]) -> list[Block]:
    """``merge(blocks)``, each block owning its rows: one unpacked from a frame is a view
    that keeps the whole frame in memory."""
    return [
        Block(b.keys, b.rows.copy())
        if not isinstance(b.rows, list) and b.rows.base is not None
        else b
        for b in merge(blocks)
    ]


def states(blocks: list[Block]) -> dict[str, KeyState]:
    """The merged state of every key of ``blocks`` (one step)."""
    out: dict[str, KeyState] = {}
    for block in merge(blocks):
        rows = block.rows
        if not isinstance(rows, list):
            floats = rows[:, :COUNT].view("<f8").tolist()
            rows = [f + i for f, i in zip(floats, rows[:, COUNT:].tolist(), strict=True)]
        for key, row in zip(block.keys, rows, strict=True):
            state = _state(row)
            held = out.get(key)
            if held is None:
                out[key] = state
            else:
                held.merge(state)
    return out


def _whole(value: float, flagged: int) -> Any:
    """An int the node had (flagged), back as one; a float stays one (a value flagged that
    is not a whole number too: it is not refused, it just stays what it is)."""
    return int(value) if flagged and value.is_integer() else value


def _state(row: Sequence[Any]) -> KeyState:
    flags = row[FLAGS]
    state = KeyState.__new__(KeyState)
    state.count = row[COUNT]
    state.first = _whole(row[FIRST], flags & FIRST_INT)
    state.first_rank = row[FIRST_RANK]
    state.numbers = True
    state.ints = bool(flags & ALL_INTS)
    state.int_sum = row[INT_SUM]
    state.partials = [p for p in (row[SUM_LO], row[SUM_HI]) if p]
    state.nan, state.pinf, state.ninf = row[NAN], row[PINF], row[NINF]
    if flags & HAS_EXTREMES:
        state.low = _whole(row[LOW], flags & LOW_INT)
        state.high = _whole(row[HIGH], flags & HIGH_INT)
        state.low_rank, state.high_rank = row[LOW_RANK], row[HIGH_RANK]
    else:
        state.low = state.high = None
        state.low_rank = state.high_rank = -1
    return state


def _merge_python(group: list[Block]) -> Block:
    keys = group[0].keys
    rows = []
    for at in range(len(keys)):
        state = _state(group[0].rows[at])
        for block in group[1:]:
            state.merge(_state(block.rows[at]))
        rows.append(state_row(state))
    return Block(keys, rows)


def _merge_numpy(group: list[Block]) -> Block:
    """The states of one key set from many nodes, by column: what ``KeyState.merge`` gives,
    the sum as a double-double."""
    np = _np
    keys = len(group[0].keys)
    # (nodes, keys, fields); concatenate, not stack: a third of its time for 2,048 blocks
    i = np.concatenate([b.rows for b in group]).reshape(len(group), keys, FIELDS)
    f = i.view("<f8")
    cols = np.arange(keys)
    flags = i[:, :, FLAGS]
    out_i = np.zeros((keys, FIELDS), dtype="<i8")
    out_f = out_i.view("<f8")
    for field in (COUNT, NAN, PINF, NINF, INT_SUM):
        out_i[:, field] = i[:, :, field].sum(0)
    # first: the lowest rank's (ranks are distinct across nodes)
    at = i[:, :, FIRST_RANK].argmin(0)
    out_f[:, FIRST] = f[at, cols, FIRST]
    out_i[:, FIRST_RANK] = i[at, cols, FIRST_RANK]
    out_flags = np.where(((flags & ALL_INTS) != 0).all(0), ALL_INTS, 0)
    out_flags |= flags[at, cols] & FIRST_INT
    # min and max of the values that are not NaN; ties go to the lowest rank
    has = (flags & HAS_EXTREMES) != 0
    any_has = has.any(0)
    out_flags |= np.where(any_has, HAS_EXTREMES, 0)
    big = np.iinfo(np.int64).max
    for field, rank, bit, pad in (
        (LOW, LOW_RANK, LOW_INT, np.inf),
        (HIGH, HIGH_RANK, HIGH_INT, -np.inf),
    ):
        v = np.where(has, f[:, :, field], pad)
        best = v.min(0) if field == LOW else v.max(0)
        tied = has & (v == best)
        at = np.where(tied, i[:, :, rank], big).argmin(0)
        out_f[:, field] = np.where(any_has, f[at, cols, field], 0.0)
        out_i[:, rank] = np.where(any_has, i[at, cols, rank], -1)
        out_flags |= np.where(any_has, flags[at, cols] & bit, 0)
    _sum(f[:, :, SUM_HI], f[:, :, SUM_LO], out_f, out_i)
    out_i[:, FLAGS] = out_flags
    return Block(group[0].keys, out_i)


def _sum(hi: Any, lo: Any, out_f: Any, out_i: Any) -> None:
    """Double-doubles summed down the nodes: each addition of ``hi``s keeps its rounding
    error (TwoSum), added to the ``lo``s; a sum past the largest float is kept as that
    infinity, as ``KeyState`` keeps it."""
    np = _np
    err = lo.sum(0)
    with np.errstate(invalid="ignore", over="ignore"):
        while hi.shape[0] > 1:
            if hi.shape[0] % 2:
                hi = np.concatenate([hi, np.zeros((1, hi.shape[1]))])
            a, b = hi[0::2], hi[1::2]
            s = a + b
            bb = s - a
            err = err + ((a - (s - bb)) + (b - bb)).sum(0)
            hi = s
        top = hi[0]
        s = top + err
        bb = s - top
        rest = (top - (s - bb)) + (err - bb)
    finite = np.isfinite(s) & np.isfinite(rest)
    out_f[:, SUM_HI] = np.where(finite, s, 0.0)
    out_f[:, SUM_LO] = np.where(finite, rest, 0.0)
    past = np.where(np.isnan(s), top, s)  # (an overflow makes the errors NaN, not the sum)
    out_i[:, PINF] += ~finite & (past > 0)
    out_i[:, NINF] += ~finite & (past < 0)
    out_i[:, NAN] += ~finite & np.isnan(past)
