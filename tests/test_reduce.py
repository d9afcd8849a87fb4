"""Row building: auto-mode reduction, shared-mode per-rank keys, flattening, validation."""

from __future__ import annotations

import math
from typing import Any

import pytest

from wandb_funnel._logger.ordering import Row
from wandb_funnel._logger.reduce import RowBuilder
from wandb_funnel._options import FunnelOptions
from wandb_funnel._protocol.mergeable import flatten


def _row(step: int, parts: dict[int, dict[str, Any]]) -> Row:
    return Row(step, parts={r: dict(d) for r, d in parts.items()})


def test_auto_single_rank_key_is_untouched() -> None:
    """Rank-0-only code behaves as before: one rank's keys pass through as they are."""
    out = RowBuilder("auto", {}, "global_step").build(_row(3, {0: {"acc": 0.5, "tag": "x"}}))
    assert out == {"acc": 0.5, "tag": "x"}


def test_auto_reduces_across_ranks_with_mean_by_default() -> None:
    b = RowBuilder("auto", _reducers({"tput": "sum", "m*": "max"}), "global_step")
    out = b.build(
        _row(
            0,
            {
                0: {"loss": 1.0, "tput": 10, "mx": 1},
                1: {"loss": 3.0, "tput": 5, "mx": 7},
                2: {"loss": 2.0},
            },
        )
    )
    assert out["loss"] == pytest.approx(2.0)
    assert out["tput"] == 15 and type(out["tput"]) is int
    assert out["mx"] == 7


def test_non_numbers_take_the_lowest_rank() -> None:
    out = RowBuilder("auto", {}, "s").build(_row(0, {2: {"name": "b"}, 1: {"name": "a"}}))
    assert out["name"] == "a"


def test_nan_propagates_like_all_gather() -> None:
    out = RowBuilder("auto", {}, "s").build(_row(0, {0: {"l": math.nan}, 1: {"l": 1.0}}))
    assert math.isnan(out["l"])


def test_shared_mode_keys_per_rank_plus_asked_reductions() -> None:
    b = RowBuilder("shared", _reducers({"loss": "mean"}), "global_step")
    out = b.build(_row(1, {0: {"loss": 1.0, "acc": 0.1}, 1: {"loss": 3.0}}))
    assert out == {
        "loss/rank0": 1.0,
        "acc/rank0": 0.1,
        "loss/rank1": 3.0,
        "loss": 2.0,
    }


def test_nested_dicts_flatten_and_reduce() -> None:
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": {}}) == {"a.b": 1, "a.c.d": 2, "e": {}}
    out = RowBuilder("auto", {}, "s").build(
        _row(0, {0: {"eval": {"acc": 1.0}}, 1: {"eval": {"acc": 3.0}}})
    )
    assert out["eval.acc"] == 2.0


def test_rows_hold_the_ranks_keys_only() -> None:
    """The row's step is where the writer places it (``_step``), not a key of the row:
    plain wandb's rows carry no ``global_step`` (issue 34)."""
    b = RowBuilder("auto", {}, "global_step")
    assert b.build(_row(9, {0: {"x": 1}})) == {"x": 1}
    assert not b.user_step_key


@pytest.mark.parametrize("mode", ["auto", "shared"])
def test_a_users_own_step_key_is_kept_as_logged(mode: str) -> None:
    """A rank that logs ``global_step`` itself owns the key: its values are written, and
    rows without it stay without it (issue 34: 6 rows carried it against plain's 3)."""
    said: list[str] = []
    b = RowBuilder(mode, {}, "global_step", said.append)
    assert "global_step" not in b.build(_row(0, {0: {"x": 1}}))
    first = b.build(_row(1, {0: {"global_step": 2000, "x": 2}, 1: {"global_step": 2000}}))
    assert first["global_step"] == 2000
    assert "global_step/rank0" not in first  # one x-axis key, also in shared mode
    assert "global_step" not in b.build(_row(2, {0: {"x": 3}}))
    assert b.build(_row(3, {1: {"global_step": 4000}}))["global_step"] == 4000
    assert b.user_step_key
    assert said == []  # nothing to say: the funnel writes nothing under that key


def test_infinities_and_overflow_reduce_like_plain_arithmetic() -> None:
    """inf + -inf gives nan and huge values give inf (fsum would raise and sink the row)."""
    b = RowBuilder("auto", _reducers({"s": "sum"}), "g")
    parts = {0: {"m": math.inf, "s": 1e308, "o": 1}, 1: {"m": -math.inf, "s": 1e308}}
    out = b.build(_row(0, parts))
    assert math.isnan(out["m"]) and out["s"] == math.inf and out["o"] == 1


def test_unorderable_values_fall_back_to_first() -> None:
    """min over values that cannot be compared keeps the lowest rank's, not an exception."""
    b = RowBuilder("auto", _reducers({"k": "min"}), "g")
    out = b.build(_row(0, {0: {"k": [1]}, 1: {"k": 2.0}}))
    assert out["k"] == [1]


def _reducers(reduce: object) -> dict[str, str]:
    return FunnelOptions(reduce=reduce).reduce
