"""``_protocol/columns.py``: nodes' states by column, through the wire and merged at the root
(numpy, and plain Python), give the flat funnel's value for every numeric reducer: count,
first, min and max with their ranks exactly; sums and means the correctly rounded sum but
within one rounding where the exact sum lies within 2**-100 of a tie or the values cancel
to below 2**-100 of their size (the double-double on the wire), and exactly for everyday
values from 2,048 nodes."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wandb_funnel._logger.reduce import _reduce, spread
from wandb_funnel._protocol import columns
from wandb_funnel._protocol.mergeable import KeyState

REDUCERS = ("mean", "sum", "min", "max", "first")
LIMIT = columns.INT_LIMIT
numbers = st.one_of(
    st.integers(min_value=-LIMIT, max_value=LIMIT),
    st.floats(min_value=-1e300, max_value=1e300, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 1, 1.0, 0.1, 1e16, -1e16]),
)


@pytest.fixture(params=["numpy", "python"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    before = columns.use_numpy(request.param == "numpy")
    yield request.param
    columns.use_numpy(before)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is float and (math.isnan(a) or math.isnan(b)):
        return math.isnan(a) and math.isnan(b)
    return bool(a == b)


def _close(a: Any, b: Any, scale: float) -> bool:
    """Equal, or within one rounding and 2**-100 of the values' size (the double-double)."""
    if type(a) is not type(b):
        return False
    if type(a) is float and math.isfinite(a) and math.isfinite(b):
        # one rounding of the sum is up to 3 of a mean's (the sum's ulp over the count)
        return bool(abs(a - b) <= 3 * math.ulp(b) + scale * 2.0**-100)
    return bool(_same(a, b))


def _through_the_wire(nodes: list[dict[int, Any]], keys: tuple[str, ...]) -> dict[str, KeyState]:
    """Each node's states (one per key, every key the same values) packed and unpacked, then
    merged as a row at the root merges them."""
    blocks = []
    for node in nodes:
        ranks = sorted(node)
        state = KeyState(ranks[0], node[ranks[0]])
        for rank in ranks[1:]:
            state.add(rank, node[rank])
        packed = columns.pack([columns.state_row(state)] * len(keys))
        blocks += columns.unpack([keys], [0], packed)
    return columns.states(blocks)


@st.composite
def jobs(draw: st.DrawFn) -> list[dict[int, Any]]:
    ranks = draw(st.lists(st.integers(0, 4096), min_size=1, max_size=40, unique=True))
    split = draw(st.integers(1, len(ranks)))
    random.Random(draw(st.integers(0, 2**32))).shuffle(ranks)
    nodes: list[dict[int, Any]] = [{} for _ in range(split)]
    for i, rank in enumerate(ranks):
        nodes[i % split][rank] = draw(numbers)
    return nodes


# (the fixture only chooses the path: nothing in it to reset between inputs)
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(jobs())
def test_states_through_the_wire_give_the_flat_funnels_values(
    path: str, nodes: list[dict[int, Any]]
) -> None:
    by_rank = {rank: value for node in nodes for rank, value in node.items()}
    ranks = sorted(by_rank)
    flat = [by_rank[r] for r in ranks]
    scale = sum(abs(float(v)) for v in flat if math.isfinite(float(v)))
    merged = _through_the_wire(nodes, ("a", "b"))
    assert sorted(merged) == ["a", "b"]
    state = merged["a"]
    assert state.count == len(ranks)
    for name in REDUCERS:
        want = flat[0] if len(flat) == 1 else _reduce(name, flat, ranks)
        got = state.value(name)
        if name in ("mean", "sum"):
            assert _close(got, want, scale), (name, nodes, got, want)
        else:
            assert _same(got, want), (name, nodes, got, want)
    want_spread = {"a": flat[0]} if len(flat) == 1 else spread("a", flat, ranks)
    got_spread = state.spread("a")
    assert got_spread.keys() == want_spread.keys()
    for key, want_value in want_spread.items():
        if key == "a":
            assert _close(got_spread[key], want_value, scale), (key, nodes)
        else:
            assert _same(got_spread[key], want_value), (key, nodes)


def test_2048_nodes_of_everyday_values_sum_exactly_as_fsum_does(path: str) -> None:
    """Losses, accuracies, counts: 2,048 nodes of 8 ranks, the sum the correctly rounded
    one, as flat's ``fsum``."""
    rng = random.Random(38)
    nodes = [
        {
            n * 8 + r: rng.choice(
                [rng.gauss(2.0, 0.5), rng.random(), rng.randrange(1000), -rng.expovariate(1)]
            )
            for r in range(8)
        }
        for n in range(2048)
    ]
    merged = _through_the_wire(nodes, ("loss",))["loss"]
    values = [v for node in nodes for _, v in sorted(node.items())]
    assert merged.value("sum") == math.fsum(values)
    assert merged.value("mean") == math.fsum(values) / len(values)
    low = min(values)
    assert merged.value("min") == low and type(merged.value("min")) is type(low)


def test_a_sum_past_the_largest_float_across_nodes_is_that_infinity(path: str) -> None:
    nodes = [{r: 1e308} for r in range(4)]
    merged = _through_the_wire(nodes, ("x",))["x"]
    assert merged.value("sum") == _reduce("sum", [1e308] * 4, list(range(4))) == math.inf


def test_key_sets_that_differ_across_nodes_merge_by_key(path: str) -> None:
    one = KeyState(0, 1.0)
    two = KeyState(1, 3.0)
    blocks = columns.unpack([("a", "b")], [0], columns.pack([columns.state_row(one)] * 2))
    blocks += columns.unpack([("b",)], [0], columns.pack([columns.state_row(two)]))
    merged = columns.states(blocks)
    assert merged["a"].value("mean") == 1.0 and merged["b"].value("mean") == 2.0
    assert (merged["b"].value("max"), merged["b"].high_rank) == (3.0, 1)


def test_many_blocks_merged_in_rounds_equal_one_merge(path: str) -> None:
    """A row merges its blocks as they come (its memory bounded): merging merged blocks gives
    what one merge of them all gives."""
    rng = random.Random(7)
    keys = ("k",)
    blocks = []
    for node in range(300):
        state = KeyState(node * 2, rng.uniform(-1, 1))
        state.add(node * 2 + 1, rng.randrange(-50, 50))
        blocks += columns.unpack([keys], [0], columns.pack([columns.state_row(state)]))
    once = columns.states(blocks)["k"]
    rounds = blocks[:1]
    for block in blocks[1:]:
        rounds = columns.merge([*rounds, block]) if len(rounds) >= 63 else [*rounds, block]
    again = columns.states(rounds)["k"]
    for name in REDUCERS:
        assert _same(again.value(name), once.value(name)), name
    assert (again.low_rank, again.high_rank, again.count) == (once.low_rank, once.high_rank, 600)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        (columns.COUNT, 0, "counts or ranks"),
        (columns.FIRST_RANK, -1, "counts or ranks"),
        (columns.FLAGS, 64, "counts or ranks"),
        (columns.INT_SUM, LIMIT * 5, "sums"),
        (columns.INT_SUM, -(2**63), "sums"),  # (numpy's abs of it is negative)
        (columns.PINF, 2**62, "counts or ranks"),  # (thousands of nodes' sum would wrap)
        (columns.SUM_HI, math.inf, "sums"),
        (columns.LOW, math.nan, "min or max"),
        (columns.HIGH_RANK, -1, "min or max"),
    ],
)
def test_a_malformed_state_is_refused_with_what_is_wrong(
    path: str, field: int, value: Any, why: str
) -> None:
    state = KeyState(3, 2)
    state.add(4, 7)
    row = list(columns.state_row(state))
    row[field] = value
    packed = columns.pack([tuple(row)])
    with pytest.raises(ValueError, match=why):
        columns.unpack([("k",)], [0], packed)
    with pytest.raises(ValueError, match="not as long"):
        columns.unpack([("k", "j")], [0], packed)


def test_a_value_said_to_be_an_int_that_is_not_a_whole_number_stays_a_float(path: str) -> None:
    row = list(columns.state_row(KeyState(3, 2)))
    assert row[columns.FLAGS] & columns.FIRST_INT
    for value in (0.5, math.inf, math.nan):
        row[columns.FIRST] = value
        (block,) = columns.unpack([("k",)], [0], columns.pack([tuple(row)]))
        first = columns.states([block])["k"].first
        assert type(first) is float and _same(first, value)


def test_a_rows_node_blocks_are_merged_as_time_passes_and_let_go_of_their_frames(
    path: str,
) -> None:
    """A block unpacked from a frame is a view that keeps the whole frame (every step of it)
    in memory: the reorder buffer merges each row's blocks every ``_MERGE_EVERY`` seconds,
    into blocks of their own, and the row's states are what one merge of them all gives."""
    from wandb_funnel._logger import ordering

    keys = ("k",)
    order = ordering.Reorderer(window=2.0, max_pending_rows=100)
    frames, states = [], []
    for node in range(6):
        state = KeyState(node * 2, float(node) / 3)
        state.add(node * 2 + 1, node)
        states.append(state)
        frames.append(columns.unpack([keys], [0, 0], columns.pack([columns.state_row(state)] * 2)))
    times = [0.0, 0.05, 0.1, 0.15, 0.3, 0.35]  # merges at 0.0 (the first) and 0.3
    for (block, _), now in zip(frames, times, strict=True):
        order.add_states(7, True, 2, block, [], now)
    order.rank_floor(0, 8)
    (row,) = order.pop_ready(0.4)
    assert row.blocks is not None and len(row.blocks) == 2  # merged at 0.3, and one since
    if path == "numpy":
        assert row.blocks[0].rows.base is None  # its own: no frame kept
    merged = columns.states(row.blocks)["k"]
    whole = columns.states([block for block, _ in frames])["k"]
    assert merged.count == whole.count == 12
    for name in REDUCERS:
        assert _same(merged.value(name), whole.value(name)), name


def test_the_wire_leaves_out_fields_of_zeros_and_narrows_small_ints(path: str) -> None:
    """A frame's states take the bytes their values need: a field that is 0 for every key
    is left out, one of small ints takes 4 bytes a key; -0.0 is not left out (it is a value);
    an int past 32 bits takes 8. They read back as packed."""
    plain = KeyState(3, 0.25)
    plain.add(4, 0.5)
    big = KeyState(2**35, -0.0)
    rows = [columns.state_row(plain), columns.state_row(big)]
    packed = columns.pack(rows)
    widths = list(packed[: columns.FIELDS])
    assert widths[columns.NAN] == widths[columns.INT_SUM] == 0  # floats: no NaN, no int sum
    assert widths[columns.COUNT] == widths[columns.FLAGS] == 4
    assert widths[columns.FIRST_RANK] == 8  # rank 2**35
    assert widths[columns.FIRST] == 8  # 0.25 and -0.0
    assert len(packed) == columns.FIELDS + 2 * sum(widths) < 2 * 112 * 3 // 4
    (block,) = columns.unpack([("a", "b")], [0], packed)
    merged = columns.states([block])
    assert merged["a"].value("mean") == 0.375 and merged["a"].count == 2
    assert merged["b"].first_rank == 2**35 and math.copysign(1.0, merged["b"].first) < 0
    assert columns.unpack([], [], columns.pack([])) == []


@pytest.mark.parametrize(
    ("widths", "why"),
    [
        ([4] + [8] * 13, "widths"),  # a float field in 4 bytes
        ([8] * 5 + [2] + [8] * 8, "widths"),
        ([8] * 13, "widths"),  # one short
        ([0] * 14, "counts"),  # no counts: a tiny frame could say a billion keys
    ],
)
def test_a_frame_whose_widths_are_malformed_is_refused(
    path: str, widths: list[int], why: str
) -> None:
    packed = columns.pack([columns.state_row(KeyState(3, 2))])
    body = packed[columns.FIELDS :] if any(widths) else b""
    with pytest.raises(ValueError, match=why):
        columns.unpack([("k",)], [0], bytes(widths) + body if len(widths) == 14 else bytes(widths))
    if not any(widths):  # refused before a row is made, however many keys it names
        with pytest.raises(ValueError, match=why):
            columns.unpack([tuple(f"k{i}" for i in range(100_000))], [0] * 65_536, bytes(widths))
