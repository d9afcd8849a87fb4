"""The owner process of tests/test_fuzz_api.py: hypothesis drives the public API of a real
funnel (``wf.log``, ``Run.log``, ``Run.summary``, ``Run.config.update``).

    python fuzz_api.py --max-record-bytes 20000 --log-examples 700 --update-examples 150 \\
        --final-step 7

Any exception but TypeError or ValueError escapes a call, fails the search and the program.
REPORT: the calls accepted and refused, every step an accepted record went to, the odd cases'
outcomes, and the funnel's stats.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import decimal
import fractions
import operator
import types
from collections.abc import Callable
from typing import Any

import numpy as np
from _prelude import report
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import wandb_funnel as wf

MAX_STEP = 2**63 - 1


class Opaque:
    pass


class FloatSub(float):
    pass


class StrSub(str):  # noqa: SLOT000  (a plain subclass, as a user would write one)
    pass


# Values log() takes (numpy scalars and 0-d arrays and tensors become numbers; subclasses of
# the plain types pass) and values it must refuse (TypeError or ValueError).
GOOD_ODD: list[Any] = [
    FloatSub(2.5),
    StrSub("s"),
    collections.OrderedDict(a=1),
    np.float32(1.5),
    np.float16(-0.5),
    np.int8(-3),
    np.int64(2**62),
    np.uint64(2**64 - 1),
    np.bool_(True),
    np.str_("np"),
    np.array(2.0),
    np.array(7),
    np.float64("nan"),
]
BAD_ODD: list[Any] = [
    object(),
    Opaque(),
    {1, 2},
    frozenset([3]),
    complex(1, 2),
    decimal.Decimal("1.5"),
    fractions.Fraction(1, 3),
    datetime.datetime(2024, 1, 1),
    datetime.timedelta(1),
    range(3),
    Ellipsis,
    len,
    b"raw",
    bytearray(b"raw"),
    memoryview(b"raw"),
    types.MappingProxyType({"k": 1}),
    np.zeros(3),
    np.zeros((2, 2)),
    np.array([]),
    np.datetime64("2024-01-01"),
]
try:  # torch is optional for the package; the test extras pin the CPU build
    import torch
except ImportError:
    pass
else:
    GOOD_ODD += [torch.tensor(1.5), torch.tensor(3), torch.tensor(True), torch.zeros(())]
    BAD_ODD += [torch.zeros(2), torch.zeros((2, 2))]

# Any text at all: U+0085 and U+2028 once broke the run reader (it split lines with
# str.splitlines(), and JSON leaves them raw); keep them in the fuzz.
text = st.text(max_size=20)
keys = st.one_of(
    text.map(lambda s: s[:12]),
    st.sampled_from(
        ["", " ", "global_step", "_step", "_runtime", "a.b", "a/b", "é", "\x00", "k" * 300, "loss"]
    ),
)
bad_keys = st.one_of(
    st.integers(-3, 3),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.binary(max_size=3),
    st.tuples(st.integers(0, 2)),
    st.just(StrSub("sub")),
)
good_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),  # every int msgpack carries
    st.floats(),  # NaN and inf included
    text,
    st.integers(0, 12_000).map(lambda n: "x" * n),  # big, sometimes over max_record_bytes
    st.sampled_from(GOOD_ODD),
)
bad_scalars = st.one_of(
    st.integers(min_value=2**64, max_value=2**70),  # past 64 bits
    st.integers(min_value=-(2**70), max_value=-(2**63) - 1),
    st.sampled_from(["\ud800", "a\udfff"]),  # lone surrogates: not encodable
    st.binary(max_size=8),
    st.sampled_from(BAD_ODD),
)


def nested(scalar: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalar,
        lambda inner: st.one_of(
            st.lists(inner, max_size=5),
            st.lists(inner, max_size=5).map(tuple),
            st.dictionaries(keys, inner, max_size=5),
            st.integers(0, 3000).map(lambda n: list(range(n))),  # big lists
        ),
        max_leaves=6,
    )


good_values = nested(good_scalars)
any_values = nested(st.one_of(good_scalars, bad_scalars))
good_dicts = st.dictionaries(keys, good_values, max_size=6)
valid_datas = st.one_of(
    good_dicts,
    good_dicts.map(collections.OrderedDict),
    good_dicts.map(types.MappingProxyType),  # any Mapping is taken (as a dict)
)
any_datas = st.one_of(
    valid_datas,
    st.dictionaries(keys, any_values, max_size=6),
    st.dictionaries(st.one_of(keys, bad_keys), good_values, min_size=1, max_size=4),
    # not a dict at all
    st.lists(good_values, max_size=3),
    st.none(),
    st.text(max_size=5),
    st.integers(),
    st.sampled_from(BAD_ODD),
)
valid_steps = st.one_of(
    st.none(),
    st.integers(0, 60),  # small, often going backwards
    st.integers(0, 60).map(np.int64),  # index types are taken
    st.integers(0, 60).map(np.uint8),
    # Huge but valid. (Not up to 2**63-1: once a rank committed that step, every implicit
    # step is refused, which would starve the rest of the search; tested once at the end.)
    st.integers(2**40, 2**62),
)
any_steps = st.one_of(
    valid_steps,
    st.integers(-(2**64), -1),  # negative: ValueError
    st.integers(MAX_STEP + 1, 2**80),  # too big: ValueError
    st.sampled_from([2**63, 2**64 - 1, -(2**63)]),
    st.floats(),  # not an int: TypeError
    st.booleans(),
    st.text(max_size=3),
    st.sampled_from([np.float64(3.0), decimal.Decimal(4), 5.0, [1], "7"]),
)
valid_commits = st.one_of(st.none(), st.booleans())
any_commits = st.one_of(valid_commits, st.sampled_from([0, 1, "yes", np.bool_(True), 1.0]))

counts: collections.Counter[str] = collections.Counter()
STEP_KEY = "fuzz-step-key-longer-than-any-drawn"
ok_steps: set[int] = set()  # the step every accepted record went to: each must have a row


def call_log(run: wf.Run, via: str, data: Any, step: Any, commit: Any) -> None:
    before = run.step
    fn = wf.log if via == "wf.log" else run.log
    try:
        fn(data, step=step, commit=commit)
    except (TypeError, ValueError):
        counts["log_refused"] += 1
        return
    # Anything else escapes: hypothesis reports it and the scenario fails.
    counts["log_ok"] += 1
    counts["log_ok_implicit" if step is None else "log_ok_explicit"] += 1
    ok_steps.add(before if step is None else operator.index(step))


def call_update(run: wf.Run, how: str, data: Any, key: Any) -> None:
    try:
        if how == "summary[key]":
            run.summary[key] = data
        elif how == "summary.update":
            run.summary.update(data)
        else:
            run.config.update(data)
    except (TypeError, ValueError):
        counts["update_refused"] += 1
        return
    counts["update_ok"] += 1


def deep_dict(depth: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    cur = top
    for _ in range(depth):
        cur["d"] = {}
        cur = cur["d"]
    return top


def deep_list(depth: int) -> dict[str, Any]:
    top: list[Any] = []
    cur = top
    for _ in range(depth):
        cur.append([])
        cur = cur[0]
    return {"l": top}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-record-bytes", type=int, required=True)
    parser.add_argument("--log-examples", type=int, required=True)
    parser.add_argument("--update-examples", type=int, required=True)
    parser.add_argument("--final-step", type=int, required=True)
    args = parser.parse_args()
    log_examples: int = args.log_examples
    # The x-axis key is one no fuzzed key can be (longer than any text key drawn): a rank's
    # own step key is the user's and is kept (issue 23), so "global_step", which the fuzz
    # logs, would not name every row's step.
    with wf.Funnel(
        project="t", max_record_bytes=args.max_record_bytes, step_key=STEP_KEY
    ) as funnel:
        run = funnel.run

        # Two searches: one over input that is valid but for its size (most calls are
        # accepted: their records must all land), one over anything at all (most refused).
        @seed(20240601)
        @settings(
            max_examples=log_examples // 2,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.sampled_from(["wf.log", "Run.log"]), valid_datas, valid_steps, valid_commits)
        def fuzz_valid_log(via: str, data: Any, step: Any, commit: Any) -> None:
            call_log(run, via, data, step, commit)

        @seed(20240602)
        @settings(
            max_examples=log_examples // 2,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.sampled_from(["wf.log", "Run.log"]), any_datas, any_steps, any_commits)
        def fuzz_any_log(via: str, data: Any, step: Any, commit: Any) -> None:
            call_log(run, via, data, step, commit)

        @seed(20240603)
        @settings(
            max_examples=args.update_examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(
            st.sampled_from(["summary[key]", "summary.update", "config.update"]),
            st.one_of(any_datas, any_values),
            st.one_of(keys, bad_keys),
        )
        def fuzz_updates(how: str, data: Any, key: Any) -> None:
            call_update(run, how, data, key)

        fuzz_valid_log()
        fuzz_any_log()
        fuzz_updates()

        # Cases a random search is unlikely to build: containers that contain themselves,
        # nesting deeper than the interpreter's recursion limit, and the step space running
        # out (log(step=2**63-1, commit=True), then an implicit step would be 2**63).
        looped: dict[str, Any] = {}
        looped["me"] = looped
        loop_list: list[Any] = []
        loop_list.append(loop_list)

        odd = []
        # 980 levels: the interpreter can pack it, but the logger's decoder (deeper in its
        # own stack) could not, and the whole batch was lost; 5000: past the recursion limit.
        cases = (looped, {"l": loop_list}, deep_dict(980), deep_list(980), deep_dict(5000))
        takers: tuple[Callable[[Any], None], ...] = (wf.log, run.summary.update, run.config.update)
        for data in cases:
            for fn in takers:
                try:
                    fn(data)
                    odd.append("accepted")
                except (TypeError, ValueError) as exc:
                    odd.append(type(exc).__name__)
        call_log(run, "Run.log", {"edge": 1}, MAX_STEP, True)
        before = counts["log_refused"]
        call_log(run, "wf.log", {"past_the_end": 1}, None, None)
        odd.append("refused" if counts["log_refused"] == before + 1 else "accepted")

        # The funnel still works: a good log, a summary and a config value all land.
        wf.log({"final_ok": 1}, step=args.final_step)
        run.summary["final_summary"] = 2
        run.config.update({"final_config": 3})
        ok_steps.add(args.final_step)
        report(counts=dict(counts), ok_steps=sorted(ok_steps), odd=odd, step_key=STEP_KEY)
    report(stats=funnel.stats)


if __name__ == "__main__":
    main()
