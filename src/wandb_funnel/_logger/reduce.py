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

import fnmatch
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from wandb_funnel._protocol.messages import MediaRef

if TYPE_CHECKING:  # the logger's module: a worker that imports this never loads it
    from wandb_funnel._logger.ordering import Row

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


def flatten(
    data: Mapping[str, Any], prefix: str = "", out: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``, the way wandb names nested history keys."""
    if out is None:
        out = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if type(value) is dict and value:
            flatten(value, f"{full}.", out)
        else:
            out[full] = value
    return out


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
        self._explicit = dict(reduce)
        self._globs = [(k, v) for k, v in self._explicit.items() if any(c in k for c in "*?[")]
        self._step_key = step_key
        # Set once a rank logs ``step_key`` itself: the key is the user's then.
        self.user_step_key = False
        self._cache: dict[str, str | None] = {}

    def _reducer_for(self, key: str) -> str | None:
        """The reducer the user asked for ``key``, or None."""
        try:
            return self._cache[key]
        except KeyError:
            pass
        name = self._explicit.get(key)
        if name is None:
            for pattern, pattern_name in self._globs:
                if fnmatch.fnmatchcase(key, pattern):
                    name = pattern_name
                    break
        self._cache[key] = name
        return name

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
        parts = row.parts
        if len(parts) == 1:  # one rank at this step: nothing to reduce
            (part,) = parts.values()
            out = dict(_flat(part))
        else:
            by_key: dict[str, list[Any]] = {}
            for rank in sorted(parts):
                for key, value in _flat(parts[rank]).items():
                    values = by_key.get(key)
                    if values is None:
                        by_key[key] = [value]
                    else:
                        values.append(value)
            out = {}
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
                    self._spread(out, key, values, ranks, row.step)
                    continue
                out[key] = _reduce(name, values, ranks, key, self._warn)
        self._note_step_key(out)
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
