"""``_protocol/mergeable.py``: a key's values pre-reduced per node and merged at the root give
the very value the flat funnel's ``reduce.py`` gives for all of them at once (issue 38,
item 2), for every numeric reducer, whatever the split of ranks into nodes (interleaved
too), the order the nodes merge in, and the values (NaN, infinities, -0.0, ints and floats
mixed, ties, values that are not numbers)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from wandb_funnel._logger.reduce import _reduce, spread
from wandb_funnel._protocol import columns
from wandb_funnel._protocol.mergeable import KeyState

REDUCERS = ("mean", "sum", "min", "max", "first")

# What ranks log: mostly numbers of every kind; sometimes what is not one.
numbers = st.one_of(
    st.integers(min_value=-(2**62), max_value=2**62),
    st.floats(min_value=-1e300, max_value=1e300, allow_nan=False),  # no overflow of the sum
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 1, 1.0, 0.1, 1e16, -1e16]),
)
values = st.one_of(numbers, st.sampled_from(["a", True, None, [1]]))


def _same(a: Any, b: Any) -> bool:
    """Equal in value and type, NaN equal to NaN, -0.0 told from 0.0."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


def _merged(by_rank: dict[int, Any], nodes: list[list[int]], order: list[int]) -> KeyState:
    states = []
    for node in nodes:
        state = KeyState(node[0], by_rank[node[0]])
        for rank in node[1:]:
            state.add(rank, by_rank[rank])
        states.append(state)
    root = states[order[0]]
    for i in order[1:]:
        root.merge(states[i])
    return root


@st.composite
def jobs(draw: st.DrawFn) -> tuple[dict[int, Any], list[list[int]], list[int]]:
    """Values by rank (a sparse set of ranks), split into nodes any way, merged any order."""
    ranks = draw(st.lists(st.integers(0, 63), min_size=1, max_size=12, unique=True))
    pure = draw(st.booleans())
    by_rank = {r: draw(numbers if pure else values) for r in ranks}
    shuffled = draw(st.permutations(ranks))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(ranks) - 1)), max_size=len(ranks))))
    nodes = [list(shuffled[a:b]) for a, b in zip([0, *cuts], [*cuts, len(ranks)], strict=True)]
    nodes = [n for n in nodes if n]
    order = draw(st.permutations(range(len(nodes))))
    return by_rank, nodes, list(order)


@settings(max_examples=600, deadline=None)
@given(jobs())
def test_merged_states_give_the_flat_funnels_value_for_every_reducer(
    job: tuple[dict[int, Any], list[list[int]], list[int]],
) -> None:
    by_rank, nodes, order = job
    ranks = sorted(by_rank)
    flat = [by_rank[r] for r in ranks]
    merged = _merged(by_rank, nodes, order)
    assert merged.count == len(ranks)
    for name in REDUCERS:
        want = flat[0] if len(flat) == 1 else _reduce(name, flat, ranks)
        got = merged.value(name)
        assert _same(got, want), (name, flat, nodes, got, want)
    want_spread = {"k": flat[0]} if len(flat) == 1 else spread("k", flat, ranks)
    got_spread = merged.spread("k")
    assert got_spread.keys() == want_spread.keys()
    for key, want_value in want_spread.items():
        assert _same(got_spread[key], want_value), (key, flat, nodes)


def test_a_mean_over_nodes_is_the_exact_sum_not_a_sum_of_rounded_sums() -> None:
    """Summing each node's rounded sum would give 0.0 here; the exact sum is 1.0."""
    by_rank = {0: 1e16, 1: 1.0, 2: -1e16, 3: 1.0}
    merged = _merged(by_rank, [[0, 1], [2, 3]], [0, 1])
    assert merged.value("sum") == math.fsum(by_rank.values()) == 2.0
    naive = (1e16 + 1.0) + (-1e16 + 1.0)
    assert naive != 2.0  # what pre-rounded node sums would have given


def test_the_sum_is_rounded_once_from_the_exact_partials() -> None:
    """Plain addition of the exact partials (-1e-16, -1.0, -1e16) rounds twice: -1e16; the
    correctly rounded sum, as fsum of the values gives it, is -1.0000000000000002e16."""
    by_rank = {0: 2**53, 1: -1e-16, 2: -1e16, 3: -1.0, 4: -(2**53)}
    merged = _merged(by_rank, [[4, 1], [0, 3], [2]], [2, 0, 1])
    want = math.fsum(by_rank[r] for r in sorted(by_rank))
    assert want == -1.0000000000000002e16
    assert merged.value("sum") == want
    assert merged.value("mean") == want / 5


def test_a_sum_past_the_largest_float_is_that_infinity_and_still_crosses_the_wire() -> None:
    """Flat: ``fsum`` overflows and plain addition gives inf. A state gives inf too, and a
    node's state that overflowed is still one the root takes (not refused as malformed)."""
    state = KeyState(0, 1e308)
    state.add(1, 1e308)
    packed = columns.pack([columns.state_row(state)])
    (again,) = columns.states(columns.unpack([("k",)], [0], packed)).values()
    for name in ("mean", "sum"):
        assert again.value(name) == _reduce(name, [1e308, 1e308], [0, 1]) == math.inf
