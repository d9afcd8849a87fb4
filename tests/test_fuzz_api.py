"""Fuzzing the public API with hypothesis, against a real funnel (real logger, real wandb
offline, real ZeroMQ): whatever is passed to ``wf.log`` / ``Run.log`` / ``Run.summary`` /
``Run.config.update``, the call either succeeds or raises TypeError or ValueError at the call
site; nothing else escapes, nothing a call accepted is lost or refused later, and the funnel
keeps working.

Hypothesis runs inside a scenario script (the ``scripts`` fixture): the funnel is a real owner
process with its logger and wandb-core, and the fixture checks that none of them survive.
"""

from __future__ import annotations

import pytest

from tests.conftest import PRELUDE, Scripts, reports
from tests.wandb_reader import only_run

pytestmark = pytest.mark.processes

MAX_RECORD_BYTES = 20_000
LOG_EXAMPLES = 700
UPDATE_EXAMPLES = 150
FINAL_STEP = 7

FUZZ = (
    PRELUDE
    + f"""
import collections, datetime, decimal, fractions, operator, types
import numpy as np
from hypothesis import HealthCheck, given, seed, settings, strategies as st

MAX_STEP = 2**63 - 1
MAX_RECORD_BYTES = {MAX_RECORD_BYTES}

class Opaque:
    pass

class FloatSub(float):
    pass

class StrSub(str):
    pass

# Values log() takes (numpy scalars and 0-d arrays and tensors become numbers; subclasses of
# the plain types pass) and values it must refuse (TypeError or ValueError).
GOOD_ODD = [
    FloatSub(2.5), StrSub("s"), collections.OrderedDict(a=1), np.float32(1.5),
    np.float16(-0.5), np.int8(-3), np.int64(2**62), np.uint64(2**64 - 1), np.bool_(True),
    np.str_("np"), np.array(2.0), np.array(7), np.float64("nan"),
]
BAD_ODD = [
    object(), Opaque(), {{1, 2}}, frozenset([3]), complex(1, 2), decimal.Decimal("1.5"),
    fractions.Fraction(1, 3), datetime.datetime(2024, 1, 1), datetime.timedelta(1), range(3),
    Ellipsis, len, b"raw", bytearray(b"raw"), memoryview(b"raw"),
    types.MappingProxyType({{"k": 1}}), np.zeros(3), np.zeros((2, 2)), np.array([]),
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
    st.sampled_from(["", " ", "global_step", "_step", "_runtime", "a.b", "a/b", "é", "\\x00",
                     "k" * 300, "loss"]),
)
bad_keys = st.one_of(
    st.integers(-3, 3), st.none(), st.booleans(), st.floats(allow_nan=False),
    st.binary(max_size=3), st.tuples(st.integers(0, 2)), st.just(StrSub("sub")),
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
    st.sampled_from(["\\ud800", "a\\udfff"]),  # lone surrogates: not encodable
    st.binary(max_size=8),
    st.sampled_from(BAD_ODD),
)


def nested(scalar):
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
    st.lists(good_values, max_size=3), st.none(), st.text(max_size=5), st.integers(),
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

counts = collections.Counter()
ok_steps = set()  # the step every accepted record went to: each must have a row


def call_log(run, via, data, step, commit):
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


def call_update(run, how, data, key):
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


if __name__ == "__main__":
    with wf.Funnel(project="t", max_record_bytes=MAX_RECORD_BYTES) as funnel:
        run = funnel.run

        # Two searches: one over input that is valid but for its size (most calls are
        # accepted: their records must all land), one over anything at all (most refused).
        @seed(20240601)
        @settings(max_examples={LOG_EXAMPLES // 2}, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.sampled_from(["wf.log", "Run.log"]), valid_datas, valid_steps, valid_commits)
        def fuzz_valid_log(via, data, step, commit):
            call_log(run, via, data, step, commit)

        @seed(20240602)
        @settings(max_examples={LOG_EXAMPLES // 2}, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.sampled_from(["wf.log", "Run.log"]), any_datas, any_steps, any_commits)
        def fuzz_any_log(via, data, step, commit):
            call_log(run, via, data, step, commit)

        @seed(20240603)
        @settings(max_examples={UPDATE_EXAMPLES}, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.sampled_from(["summary[key]", "summary.update", "config.update"]),
               st.one_of(any_datas, any_values), st.one_of(keys, bad_keys))
        def fuzz_updates(how, data, key):
            call_update(run, how, data, key)

        fuzz_valid_log()
        fuzz_any_log()
        fuzz_updates()

        # Cases a random search is unlikely to build: containers that contain themselves,
        # nesting deeper than the interpreter's recursion limit, and the step space running
        # out (log(step=2**63-1, commit=True), then an implicit step would be 2**63).
        looped = {{}}
        looped["me"] = looped
        loop_list = []
        loop_list.append(loop_list)
        def deep_dict(depth):
            top = cur = {{}}
            for _ in range(depth):
                cur["d"] = {{}}
                cur = cur["d"]
            return top

        def deep_list(depth):
            top = cur = []
            for _ in range(depth):
                cur.append([])
                cur = cur[0]
            return {{"l": top}}

        odd = []
        # 980 levels: the interpreter can pack it, but the logger's decoder (deeper in its
        # own stack) could not, and the whole batch was lost; 5000: past the recursion limit.
        cases = (looped, {{"l": loop_list}}, deep_dict(980), deep_list(980), deep_dict(5000))
        for data in cases:
            for fn in (wf.log, run.summary.update, run.config.update):
                try:
                    fn(data)
                    odd.append("accepted")
                except (TypeError, ValueError) as exc:
                    odd.append(type(exc).__name__)
        call_log(run, "Run.log", {{"edge": 1}}, MAX_STEP, True)
        before = counts["log_refused"]
        call_log(run, "wf.log", {{"past_the_end": 1}}, None, None)
        odd.append("refused" if counts["log_refused"] == before + 1 else "accepted")

        # The funnel still works: a good log, a summary and a config value all land.
        wf.log({{"final_ok": 1}}, step={FINAL_STEP})
        run.summary["final_summary"] = 2
        run.config.update({{"final_config": 3}})
        ok_steps.add({FINAL_STEP})
        report(counts=dict(counts), ok_steps=sorted(ok_steps), odd=odd)
    report(stats=funnel.stats)
"""
)


@pytest.mark.timeout(150)
def test_public_api_raises_only_type_or_value_errors_and_keeps_working(
    scripts: Scripts,
) -> None:
    """Random keys, values, nesting, sizes, steps (negative, huge, backwards, not ints) and
    commit flags through ``wf.log`` and ``Run.log``, and random summary and config updates:
    every call succeeds or raises TypeError/ValueError (anything else fails the scenario);
    every record a call accepted reaches the run (``funnel/records`` is exactly the accepted
    calls plus the final good log, none dropped, one history row per accepted step); the
    final log, summary and config value land; no junk on the socket."""
    res = scripts.run(FUZZ, timeout=140)
    assert res.returncode == 0, res.stderr[-6000:]
    assert res.leftovers == []
    info = reports(res.stdout)
    counts, stats = info["counts"], info["stats"]
    print(counts)
    # The fuzz really exercised both outcomes, and both step kinds.
    assert counts["log_ok"] + counts["log_refused"] >= 0.9 * LOG_EXAMPLES
    assert counts["log_ok_implicit"] >= 20 and counts["log_ok_explicit"] >= 20
    assert counts["log_refused"] >= 100
    assert counts["update_ok"] >= 10 and counts["update_refused"] >= 10
    # Self-containing or too deep data is refused with ValueError (log, summary, config),
    # and an implicit step past 2**63-1 is refused at the call site.
    assert info["odd"] == ["ValueError"] * 15 + ["refused"]

    run = only_run(scripts.wandb_dir)
    assert run.exit_code == 0
    assert stats["funnel/records"] == counts["log_ok"] + 1  # + the final good log
    assert run.summary["funnel/records"] == counts["log_ok"] + 1
    assert run.summary["funnel/dropped_records"] == 0
    assert run.summary["funnel/junk_frames"] == 0
    assert run.summary["funnel/rejected_peers"] == 0
    # Every accepted record's step has a row (late records get rows of their own).
    assert {row["global_step"] for row in run.history} == set(info["ok_steps"])
    assert run.column("final_ok") == [(FINAL_STEP, 1)]
    assert run.summary["final_summary"] == 2
    assert run.config["final_config"] == 3
