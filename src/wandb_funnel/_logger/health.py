"""Rank health, as the logger sees it with no collective (issue 27): which rank is stuck,
slow or broken, from the records every rank already sends.

- **Stalls.** No rank delivered a new step for ``stall_timeout`` seconds, or one rank went
  silent while the others advance: said once (every rank's last step and how long ago, and
  by name the ranks behind), and once more when progress resumes. A DDP job wedged in a
  collective shows exactly this: the ranks that reached the collective wait for the one that
  did not, and only the logger sees all of them.
- **Non-finite values.** The first NaN or ±Inf of each (rank, key) is said, naming rank, key
  and step; every one is counted. The row is written as it is.
- **Stragglers** (the ``spread`` reducer): a rank that is the slowest of a key for
  ``STRAGGLER_STEPS`` steps in a row, at ``STRAGGLER_RATIO`` times the median or more.

Pure logic with the clock passed in (``tests/test_health.py``); the logger says what it
returns. Nothing here ever waits, signals or kills.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

STRAGGLER_STEPS = 10
STRAGGLER_RATIO = 1.2
_NOTHING: list[str] = []  # never appended to: values() returns it when nothing is wrong
_RATE_WINDOW = 30.0  # seconds of (time, step) kept per rank for its steps per second


@dataclass(slots=True)
class RankProgress:
    """One rank's progress: its last step, when it last sent a record, and when it last
    delivered a new step."""

    last_step: int = -1
    last_record: float | None = None
    last_new_step: float | None = None
    records: int = 0
    new_steps: int = 0  # how many times it moved to a higher step
    recent: deque[tuple[float, int]] = field(default_factory=deque)

    def steps_per_s(self, now: float) -> float:
        recent = self.recent
        while recent and now - recent[0][0] > _RATE_WINDOW:
            recent.popleft()
        if len(recent) < 2:
            return 0.0
        (t0, s0), (_, s1) = recent[0], recent[-1]
        # over the window up to now: a rank that stopped slows down to 0, as it should
        return (s1 - s0) / (now - t0) if now > t0 else 0.0


def ranks_text(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: list[str] = []
    run: list[int] = []
    for rank in sorted(ranks):
        if run and rank == run[-1] + 1:
            run.append(rank)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
        run = [rank]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
    return ", ".join(out)


class Health:
    """Per-rank progress and the reports of stalls, non-finite values and stragglers."""

    def __init__(self, stall_timeout: float) -> None:
        self.stall_timeout = stall_timeout
        self.ranks: dict[int, RankProgress] = {}
        self._progress_at: float | None = None  # when any rank last delivered a new step
        self._stalled_since: float | None = None
        self.stalls = 0
        self.last_stall = ""
        self.behind: list[int] = []  # the ranks named in the stall being reported
        self.nonfinite = 0
        self._nonfinite_seen: set[tuple[int, str]] = set()
        self._streaks: dict[str, tuple[int, int]] = {}  # key -> (rank, steps in a row)
        self.stragglers: dict[int, tuple[str, float]] = {}  # rank -> (key, ratio to median)

    # -- progress ------------------------------------------------------------------------------
    def attached(self, rank: int, now: float) -> None:
        progress = self.ranks.setdefault(rank, RankProgress())
        if progress.last_new_step is None:
            progress.last_new_step = now  # silence is counted from the attach
        if self._progress_at is None:
            self._progress_at = now

    def batch(self, rank: int, top_step: int | None, count: int, now: float) -> None:
        """``count`` records of ``rank`` arrived; the highest step among them (None: none)."""
        progress = self.ranks.get(rank)
        if progress is None:
            progress = self.ranks[rank] = RankProgress()
        progress.records += count
        progress.last_record = now
        if top_step is not None and top_step > progress.last_step:
            progress.last_step = top_step
            progress.last_new_step = now
            progress.new_steps += 1
            progress.recent.append((now, top_step))
            self._progress_at = now

    def check(self, now: float, live: Iterable[int]) -> tuple[str, str] | None:
        """Every second or so: ("stall", report) once when a stall begins, ("resumed",
        line) once when it ends, else None. ``live``: ranks attached, not finished, not
        dead (a dead rank is reported as dead, not as a stall)."""
        if self.stall_timeout <= 0:
            return None
        live_ranks = {r: self.ranks[r] for r in live if r in self.ranks}
        if not live_ranks or self._progress_at is None:
            return None
        quiet = now - self._progress_at
        # Silent: a rank that was advancing, is behind the others, and has not moved for the
        # timeout (a rank that logs once, like an owner that logs its config and leaves the
        # steps to its workers, is never "silent"; nor are ranks waiting at the front).
        top = max(p.last_step for p in live_ranks.values())
        silent = [
            r
            for r, p in live_ranks.items()
            if p.new_steps >= 2
            and p.last_step < top
            and p.last_new_step is not None
            and now - p.last_new_step >= self.stall_timeout
        ]
        stalled = quiet >= self.stall_timeout or bool(silent)
        if self._stalled_since is not None:
            if stalled and not (quiet < self.stall_timeout and set(silent) - set(self.behind)):
                return None  # still the same stall: said once
            if stalled:  # another rank went silent: a new stall
                self._stalled_since = None
            else:
                since = self._stalled_since
                self._stalled_since, self.behind = None, []
                return ("resumed", f"progress resumed after {now - since:.0f} s of stall")
        if not stalled:
            return None
        self._stalled_since = now
        self.stalls += 1
        report = self._report(now, live_ranks, quiet, silent)
        self.last_stall = report
        return ("stall", report)

    def _report(
        self, now: float, live: dict[int, RankProgress], quiet: float, silent: list[int]
    ) -> str:
        top = max(p.last_step for p in live.values())
        if quiet >= self.stall_timeout:
            behind = sorted(r for r, p in live.items() if p.last_step < top)
            head = f"no rank has logged a new step for {quiet:.0f} s"
        else:
            behind = sorted(silent)
            head = f"{'rank' if len(behind) == 1 else 'ranks'} {ranks_text(behind)} silent"
            head += " while the others advance"
        self.behind = behind
        ahead = sorted(set(live) - set(behind))
        if behind:
            steps = ", ".join(str(live[r].last_step) for r in behind)
            who = (
                f"rank {behind[0]} is behind: last step {steps}"
                if len(behind) == 1
                else f"ranks {ranks_text(behind)} are behind: last steps {steps}"
            )
            lead = {live[r].last_step for r in ahead}
            at = f"step {top}" if len(lead) == 1 else f"steps up to {top}"
            names = "rank" if len(ahead) == 1 else "ranks"
            who += f"; {names} {ranks_text(ahead)} at {at}" if ahead else ""
        else:
            who = f"no rank is behind: every rank at step {top}"
        every = "; ".join(
            f"rank {r}: step {p.last_step}, last record {_ago(now, p.last_record)}"
            for r, p in sorted(live.items())
        )
        return f"stall: {head}. {who}, no progress for {quiet:.0f} s. {every}"

    # -- values ----------------------------------------------------------------------------------
    def values(self, rank: int, step: int, data: dict[str, Any]) -> list[str]:
        """Non-finite values in one rank's data at ``step``: counted; the first of each
        (rank, key) comes back as a line to say."""
        try:  # the common case, in C: every value a finite number
            if math.isfinite(math.fsum(data.values())):
                return _NOTHING
        except (TypeError, ValueError, OverflowError):
            pass  # not all numbers (or inf + -inf): look at each
        said: list[str] = []
        for key, value in data.items():
            kind = type(value)
            if kind is float:
                if value - value == 0.0:
                    continue  # finite (inf - inf and nan - nan are nan)
                self.nonfinite += 1
                if (rank, key) not in self._nonfinite_seen and len(self._nonfinite_seen) < 10_000:
                    self._nonfinite_seen.add((rank, key))
                    said.append(f"rank {rank} logged {value} for {key!r} at step {step}")
            elif kind is dict:
                nested = {f"{key}.{k}": v for k, v in value.items() if type(k) is str}
                said.extend(self.values(rank, step, nested))
        return said

    def folded_values(self, count: int, said: list[list[Any]]) -> list[str]:
        """A node logger's count of non-finite values it pre-reduced, with the first of some
        (rank, key) pairs (``[rank, step, key, value]``): as ``values`` would have said them."""
        self.nonfinite += count
        lines = []
        for rank, step, key, text in said:
            if (rank, key) not in self._nonfinite_seen and len(self._nonfinite_seen) < 10_000:
                self._nonfinite_seen.add((rank, key))
                lines.append(f"rank {rank} logged {text} for {key!r} at step {step}")
        return lines

    def spread(self, key: str, ranks: list[int], values: list[float], step: int) -> str | None:
        """One step of a ``spread`` key: a rank that is the max for ``STRAGGLER_STEPS`` steps
        in a row at ``STRAGGLER_RATIO`` x the median or more is a straggler, said once."""
        top = max(range(len(values)), key=values.__getitem__)
        median = statistics.median(values)
        rank, value = ranks[top], values[top]
        if not (median > 0 and value >= STRAGGLER_RATIO * median):
            self._streaks.pop(key, None)
            return None
        held, count = self._streaks.get(key, (rank, 0))
        count = count + 1 if held == rank else 1
        self._streaks[key] = (rank, count)
        if count < STRAGGLER_STEPS or rank in self.stragglers:
            return None
        ratio = value / median
        self.stragglers[rank] = (key, ratio)
        return (
            f"rank {rank} is a straggler: its {key!r} is the largest of every rank for "
            f"{count} steps in a row, {ratio:.2f}x the median (step {step})"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "_funnel/stalls": self.stalls,
            "_funnel/last_stall": self.last_stall,
            "_funnel/nonfinite": self.nonfinite,
            "_funnel/stragglers": sorted(self.stragglers),
        }


def _ago(now: float, then: float | None) -> str:
    return "never" if then is None else f"{now - then:.0f} s ago"
