"""Turns a released Row (every rank's data at one step) into the one dict wandb logs.

``auto``: a key logged by one rank appears as it is; a key logged by several ranks is reduced
(``mean`` for numbers by default, ``first`` otherwise, or whatever ``reduce`` says for the key).
``shared``: every rank's value appears as ``{key}/rank{rank}``, plus the reductions that
``reduce`` names explicitly. Nested dicts are flattened to ``a.b`` keys first, as wandb itself
does in history, so that nested keys reduce too. Media values (``MediaRef``) are not numbers:
the lowest rank's stands by default; ``concat`` makes one table of every rank's, ``merge`` one
histogram. Pure functions; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from wandb_funnel._protocol import columns
from wandb_funnel._protocol.mergeable import MERGEABLE, ReducerNames, flatten
from wandb_funnel._protocol.messages import MediaRef

if TYPE_CHECKING:  # the logger's modules: a worker that imports this never loads them
    from wandb_funnel._logger.ordering import Row
    from wandb_funnel._protocol.mergeable import KeyState

Reducer = Callable[[list[Any]], Any]


_NUMBER_TYPES = frozenset({int, float})


def _numbers(values: list[Any]) -> bool:
    """All plain ints and floats (bool is not a number here); checked without a Python call
    per value, since every reduced key of every row comes through here."""
    return _NUMBER_TYPES.issuperset(map(type, values))


def _float_sum(values: list[Any]) -> float:
    # fsum is exact, but raises on inf + -inf and on overflow where plain addition gives
    # nan or inf, which is what an all_gather-and-sum would have produced.
    try:
        return math.fsum(values)
    except (OverflowError, ValueError):
        return float(sum(float(v) for v in values))


def _mean(values: list[Any]) -> Any:
    return _float_sum(values) / len(values) if _numbers(values) else values[0]


def _sum(values: list[Any]) -> Any:
    if not _numbers(values):
        return values[0]
    if all(type(v) is int for v in values):
        return sum(values)
    return _float_sum(values)


def _min(values: list[Any]) -> Any:
    return min(values) if _numbers(values) else values[0]


def _max(values: list[Any]) -> Any:
    return max(values) if _numbers(values) else values[0]


def _first(values: list[Any]) -> Any:
    return values[0]


def _descs(values: list[Any], kind: str, reducer: str) -> list[dict[str, Any]]:
    descs = [v.desc for v in values if type(v) is MediaRef and v.desc.get("k") == kind]
    if len(descs) != len(values):
        raise TypeError(f"{reducer} takes {kind}s only")
    return descs


def concat_tables(values: list[Any], ranks: list[int]) -> MediaRef:
    """Tables logged by several ranks at one step as one table, rows in rank order, with a
    ``rank`` column unless the tables have one."""
    tables = _descs(values, "table", "concat")
    columns = tables[0]["columns"]
    for rank, table in zip(ranks, tables, strict=True):
        if table["columns"] != columns:
            raise ValueError(
                f"rank {rank}'s table has columns {table['columns']!r}, rank {ranks[0]}'s "
                f"{columns!r}: tables concatenate only with the same columns"
            )
    add_rank = "rank" not in columns
    data: list[Any] = []
    for rank, table in zip(ranks, tables, strict=True):
        data.extend([*row, rank] if add_rank else row for row in table["data"])
    return MediaRef(
        {**tables[0], "columns": [*columns, "rank"] if add_rank else columns, "data": data}
    )


def merge_histograms(values: list[Any], ranks: list[int]) -> MediaRef:
    """Histograms with the same bin edges as one, their counts added."""
    hists = _descs(values, "histogram", "merge")
    bins = hists[0]["bins"]
    for rank, hist in zip(ranks, hists, strict=True):
        if hist["bins"] != bins:
            raise ValueError(
                f"rank {rank}'s histogram has other bin edges than rank {ranks[0]}'s: histograms "
                f"merge only with the same edges (np_histogram with edges fixed for every rank)"
            )
    counts = [sum(c) for c in zip(*(h["histogram"] for h in hists), strict=True)]
    return MediaRef({"k": "histogram", "histogram": counts, "bins": bins})


_RANKED_FUNCS = {"concat": concat_tables, "merge": merge_histograms}
SPREAD = "spread"  # mean, min, max and which rank had each: not one value, several keys


def spread(key: str, values: list[Any], ranks: list[int]) -> dict[str, Any]:
    """``key`` (the mean), ``key/min``, ``key/max``, ``key/min_rank``, ``key/max_rank``: the
    collective-free way to time ranks (the lowest rank wins a tie). Not numbers: the lowest
    rank's value, as ``first``."""
    if not _numbers(values):
        return {key: values[0]}
    low = min(range(len(values)), key=values.__getitem__)
    high = max(range(len(values)), key=values.__getitem__)
    return {
        key: _float_sum(values) / len(values),
        f"{key}/min": values[low],
        f"{key}/max": values[high],
        f"{key}/min_rank": ranks[low],
        f"{key}/max_rank": ranks[high],
    }


_REDUCER_FUNCS: dict[str, Reducer] = {
    "mean": _mean,
    "sum": _sum,
    "min": _min,
    "max": _max,
    "first": _first,
}


def _reduce(
    name: str,
    values: list[Any],
    ranks: list[int],
    key: str = "",
    warn: Callable[[str], None] | None = None,
) -> Any:
    # One odd key (mixed types min/max cannot order) must not sink the whole row: the lowest
    # rank's value stands, and a reducer asked for by name says why it could not apply.
    try:
        ranked = _RANKED_FUNCS.get(name)
        if ranked is not None:
            return ranked(values, ranks)
        return _REDUCER_FUNCS[name](values)
    except (TypeError, ValueError, OverflowError) as exc:
        if warn is not None and ranks:
            warn(f"reduce {key!r} with {name!r}: {exc}; kept rank {ranks[0]}'s value")
        return values[0]


def _flat(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` itself when nothing in it is nested (the common case), else ``flatten(data)``."""
    for value in data.values():
        if type(value) is dict:
            return flatten(data)
    return data


class RowBuilder:
    """Builds wandb rows for one run from released Rows."""

    def __init__(
        self,
        run_mode: str,
        reduce: Mapping[str, str],
        step_key: str,
        warn: Callable[[str], None] | None = None,
        on_spread: Callable[[str, list[int], list[Any], int], None] | None = None,
    ) -> None:
        self._mode = run_mode
        self._warn = warn
        self._on_spread = on_spread  # each step of a spread key (the logger's straggler watch)
        self._reducer_for = ReducerNames(reduce)
        self._step_key = step_key
        # Set once a rank logs ``step_key`` itself: the key is the user's then.
        self.user_step_key = False

    def _note_step_key(self, out: dict[str, Any]) -> None:
        """A rank logs ``step_key`` itself: the key is the user's (wandb's end-of-run footer
        shows it, and a late row keeps the user's value there)."""
        if not self.user_step_key and self._step_key in out:
            self.user_step_key = True

    def build(self, row: Row) -> dict[str, Any]:
        """The dict to log for ``row``: the ranks' keys only (the row's step is where the
        writer places it, ``_logger/steps.py``)."""
        if self._mode == "shared":
            return self._build_shared(row)
        if row.blocks is None:
            out = self._reduce_parts(row.parts, row.step)
        else:
            states = columns.states(row.blocks)
            out = self._reduce_parts(self._into_states(row.parts, states), row.step)
            out.update(self._folded(states))
        self._note_step_key(out)
        return out

    def _reduce_parts(self, parts: dict[int, dict[str, Any]], step: int) -> dict[str, Any]:
        """Every rank's values of each key, reduced: the flat funnel's way."""
        if len(parts) == 1:  # one rank at this step: nothing to reduce
            (part,) = parts.values()
            return dict(_flat(part))
        by_key: dict[str, list[Any]] = {}
        for rank in sorted(parts):
            for key, value in _flat(parts[rank]).items():
                values = by_key.get(key)
                if values is None:
                    by_key[key] = [value]
                else:
                    values.append(value)
        out: dict[str, Any] = {}
        for key, values in by_key.items():
            if len(values) == 1:
                out[key] = values[0]
                continue
            name = self._reducer_for(key) or "mean"
            # Which ranks gave the values: asked for only by concat, merge and spread, off
            # the hot path.
            ranks = (
                [r for r in sorted(parts) if key in _flat(parts[r])]
                if name in _RANKED_FUNCS or name == SPREAD
                else []
            )
            if name == SPREAD:
                self._spread(out, key, values, ranks, step)
                continue
            out[key] = _reduce(name, values, ranks, key, self._warn)
        return out

    @staticmethod
    def _into_states(
        parts: dict[int, dict[str, Any]], states: dict[str, KeyState]
    ) -> dict[int, dict[str, Any]]:
        """A rank's own value of a key that nodes pre-reduced goes into that key's state (a
        node sends some ranks' steps as they are); the rest of each part is returned."""
        rest: dict[int, dict[str, Any]] = {}
        for rank in sorted(parts):
            mine = rest[rank] = {}
            for key, value in _flat(parts[rank]).items():
                state = states.get(key)
                if state is None:
                    mine[key] = value
                else:
                    state.add(rank, value)
        return {rank: part for rank, part in rest.items() if part}

    def _folded(self, states: dict[str, KeyState]) -> dict[str, Any]:
        """The node tier's pre-reduced keys (issue 38): what ``_reduce_parts`` gives for
        every rank's values (``mergeable.py``)."""
        out: dict[str, Any] = {}
        for key, state in states.items():
            name = self._reducer_for(key) or "mean"
            if state.count == 1:
                out[key] = state.first
            elif name == SPREAD:
                out.update(state.spread(key))
            elif name in MERGEABLE:
                out[key] = state.value(name)
            else:  # a node folds no key of concat or merge: the lowest rank's value
                out[key] = state.first
        return out

    def _spread(
        self, out: dict[str, Any], key: str, values: list[Any], ranks: list[int], step: int
    ) -> None:
        out.update(spread(key, values, ranks))
        if self._on_spread is not None and len(values) > 1 and _numbers(values):
            self._on_spread(key, ranks, values, step)

    def _build_shared(self, row: Row) -> dict[str, Any]:
        by_key: dict[str, list[Any]] = {}
        ranks_by_key: dict[str, list[int]] = {}
        for rank in sorted(row.parts):
            for key, value in flatten(row.parts[rank]).items():
                by_key.setdefault(key, []).append(value)
                ranks_by_key.setdefault(key, []).append(rank)
        out: dict[str, Any] = {}
        for key, values in by_key.items():
            asked = self._reducer_for(key)
            if key == self._step_key:  # a user's own x-axis stays one key, not one per rank
                out[key] = _reduce(asked or "first", values, ranks_by_key[key], key, self._warn)
                continue
            for rank, value in zip(ranks_by_key[key], values, strict=True):
                out[f"{key}/rank{rank}"] = value
            if asked == SPREAD:
                self._spread(out, key, values, ranks_by_key[key], row.step)
            elif asked is not None:
                out[key] = _reduce(asked, values, ranks_by_key[key], key, self._warn)
        self._note_step_key(out)
        return out
