"""One key's values at one step, as a state that merges: a node logger's pre-reduction of its
ranks' values (issue 38), which the root merges with the other nodes' and finishes into the
very value the flat funnel's ``_logger/reduce.py`` gives for every rank's values at once. Here,
not in ``_logger``, because the node logger builds them and the wire carries them.

Pure logic, no I/O. Exact, not approximately equal, for every numeric reducer (``mean``,
``sum``, ``min``, ``max``, ``first``, ``spread``) and for the flat funnel's rules:

- **Sums and means** keep the exact sum as non-overlapping float partials (Shewchuk's
  algorithm, as ``math.fsum`` does inside): ``fsum`` of the merged partials is the correctly
  rounded sum of every value, which is what ``fsum`` of the values gives. A sum of ints only
  is a Python int, exact. NaN and infinities are counted apart (``fsum`` gives NaN for a NaN
  or for both infinities, else the infinity).
- **min and max** follow Python's ``min(values)`` in rank order: a value replaces the one
  kept only when it is smaller (NaN never is, and never is replaced unless it came first);
  ties keep the lowest rank's value (``1`` before ``1.0``). So the state keeps the lowest
  rank and whether its value was NaN, and the extreme of the values that are not NaN.
- **Not numbers** (a string, a bool, a list): the lowest rank's value stands, as flat.

Outside these, not exact: finite values whose sum overflows a float (flat falls back to plain
addition in rank order, which a node cannot redo without every value).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from typing import Any

_NUMBERS = (int, float)
MERGEABLE = frozenset({"mean", "sum", "min", "max", "first"})  # the reducers a state gives


class ReducerNames:
    """The reducer the user's ``reduce`` option names for a key (exactly, or by a glob), or
    None; asked per key of every row, so each answer is kept."""

    def __init__(self, reduce: Mapping[str, str]) -> None:
        self._explicit = dict(reduce)
        self._globs = [(k, v) for k, v in self._explicit.items() if any(c in k for c in "*?[")]
        self._cache: dict[str, str | None] = {}

    def __call__(self, key: str) -> str | None:
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


def _add_partial(partials: list[float], x: float) -> None:
    """Add ``x`` to ``partials`` (non-overlapping, increasing magnitude), exactly."""
    i = 0
    for p in partials:
        y = p
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


class KeyState:
    """One key's values from some ranks at one step."""

    __slots__ = (
        "count",
        "first",
        "first_rank",
        "high",
        "high_rank",
        "int_sum",
        "ints",
        "low",
        "low_rank",
        "nan",
        "ninf",
        "numbers",
        "partials",
        "pinf",
    )

    def __init__(self, rank: int, value: Any) -> None:
        self.count = 0
        self.first: Any = value  # the lowest rank's value (the first in rank order)
        self.first_rank = rank
        self.numbers = True  # every value a plain int or float (bool is not)
        self.ints = True
        self.int_sum = 0
        self.partials: list[float] = []
        self.nan = self.pinf = self.ninf = 0
        # The extremes of the values that are not NaN, with their ranks (None: none yet).
        self.low: Any = None
        self.low_rank = -1
        self.high: Any = None
        self.high_rank = -1
        self.add(rank, value)

    def add(self, rank: int, value: Any) -> None:
        """One more rank's value (ranks in any order)."""
        self.count += 1
        if rank < self.first_rank:
            self.first, self.first_rank = value, rank
        if type(value) not in _NUMBERS:
            self.numbers = False
            return
        if type(value) is int:
            self.int_sum += value
        else:
            self.ints = False
        as_float = float(value)
        if math.isnan(as_float):
            self.nan += 1
            return
        if math.isinf(as_float):
            if as_float > 0:
                self.pinf += 1
            else:
                self.ninf += 1
        else:
            self._add_float(as_float)
        self._extremes(value, rank, value, rank)

    def _add_float(self, x: float) -> None:
        """``x`` into the exact sum; a sum past the largest float is kept as that infinity
        (as the flat funnel's plain addition gives it; not exact: see the module's docstring)."""
        partials = self.partials
        _add_partial(partials, x)
        if not math.isfinite(partials[-1]):  # the largest partial overflowed
            if partials[-1] > 0:
                self.pinf += 1
            else:
                self.ninf += 1
            partials.clear()

    def _extremes(self, low: Any, low_rank: int, high: Any, high_rank: int) -> None:
        if self.low is None or low < self.low or (low == self.low and low_rank < self.low_rank):
            self.low, self.low_rank = low, low_rank
        if (
            self.high is None
            or high > self.high
            or (high == self.high and high_rank < self.high_rank)
        ):
            self.high, self.high_rank = high, high_rank

    def merge(self, other: KeyState) -> None:
        """Take in another node's state for the same key and step (other ranks)."""
        self.count += other.count
        if other.first_rank < self.first_rank:
            self.first, self.first_rank = other.first, other.first_rank
        self.numbers = self.numbers and other.numbers
        self.ints = self.ints and other.ints
        self.int_sum += other.int_sum
        for p in other.partials:
            self._add_float(p)
        self.nan += other.nan
        self.pinf += other.pinf
        self.ninf += other.ninf
        if other.low is not None:
            self._extremes(other.low, other.low_rank, other.high, other.high_rank)

    # -- finished, as reduce.py gives it ------------------------------------------------------
    def _float_sum(self) -> float:
        if self.nan or (self.pinf and self.ninf):
            return math.nan
        if self.pinf:
            return math.inf
        if self.ninf:
            return -math.inf
        try:
            return math.fsum(self.partials)
        except OverflowError:  # (non-overlapping finite partials: not expected)
            return float(sum(self.partials))

    def _extreme(self, value: Any, rank: int) -> tuple[Any, int]:
        """Python's min/max in rank order: a NaN first stands; else the extreme found."""
        first_is_nan = type(self.first) is float and math.isnan(self.first)
        if first_is_nan or value is None:
            return self.first, self.first_rank
        return value, rank

    def value(self, reducer: str) -> Any:
        """The one value ``reducer`` (mean, sum, min, max, first) gives for every rank's."""
        if self.count == 1 or reducer == "first" or not self.numbers:
            return self.first
        if reducer == "mean":
            return self._float_sum() / self.count
        if reducer == "sum":
            return self.int_sum if self.ints else self._float_sum()
        if reducer == "min":
            return self._extreme(self.low, self.low_rank)[0]
        if reducer == "max":
            return self._extreme(self.high, self.high_rank)[0]
        raise ValueError(f"not a mergeable reducer: {reducer!r}")

    def spread(self, key: str) -> dict[str, Any]:
        """What the ``spread`` reducer gives: the mean, the min and max and their ranks."""
        if self.count == 1 or not self.numbers:
            return {key: self.first}
        low, low_rank = self._extreme(self.low, self.low_rank)
        high, high_rank = self._extreme(self.high, self.high_rank)
        return {
            key: self._float_sum() / self.count,
            f"{key}/min": low,
            f"{key}/max": high,
            f"{key}/min_rank": low_rank,
            f"{key}/max_rank": high_rank,
        }
