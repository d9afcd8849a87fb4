"""Every rank's console into the run's Logs tab: what ranks wrote, as wandb's own records.

A rank sends what it wrote to stdout and stderr as it wrote it, both streams in one sequence
(``_worker/console.py``). Here it becomes ``output_raw`` records, the records wandb's own
``wrap_raw`` capture writes (wandb-core emulates the terminal into ``output.log``), in the
order the process wrote it, across stdout and stderr.

- **One rank** (a one-process script, or a job where only rank 0 calls wandb): the text goes
  through as it was written, unlabelled, each write's ``\\r`` and half-lines included, as
  plain wandb records them; wandb-core draws progress bars as it does for plain wandb.
- **Several ranks**: from the moment a second rank attaches to the run (``label``), text is
  cut into lines per (rank, stream), each labelled ``[rank N] ``. A line is only written once
  it is whole (it ends with ``\\n``), with its ``\\r`` redraws collapsed to the last as a
  terminal shows them, so two ranks' half-lines or progress bars never run over each other;
  what a rank leaves unfinished goes out at close. Lines written before the second rank
  attached were the first rank's alone and stay as written (unlabelled); a line it had left
  unfinished then is ended there, so labelled lines start on lines of their own. Lines of
  different ranks interleave in the order they reach the logger (time order within the
  flush interval); each rank's stay in the order it wrote them.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

_STREAMS = {1: "stdout", 2: "stderr"}
_MAX_PARTIAL = 64 * 1024  # a "line" that never ends is written in pieces of this size


class ConsoleSink(Protocol):
    def output(self, stream: str, text: str, timestamp: float) -> None: ...


class ConsoleLines:
    """Passes through or assembles and labels console text; called from the logger's main
    thread only."""

    def __init__(self) -> None:
        self.labelled = False  # several ranks: whole lines, labelled
        self._partial: dict[tuple[int, int], tuple[str, float]] = {}  # (rank, fd) -> text
        self._open: dict[int, bool] = {}  # unlabelled: fd -> its last text ended mid-line
        self.lines = 0  # lines written into the run
        self.dropped = 0  # lines ranks left out (their bound), or that were not written

    def label(self, sink: ConsoleSink | None) -> None:
        """A second rank attached: lines are labelled from now on. A line left unfinished by
        the text written so far is ended, so the first labelled line starts a line."""
        if self.labelled:
            return
        self.labelled = True
        now = time.time()
        ends = [[fd, "\n", now] for fd, open_ in sorted(self._open.items()) if open_]
        self._open = {}
        self._emit(ends, sink)

    def take(
        self, rank: int, data: dict[str, Any], sink: ConsoleSink | None, late: bool = False
    ) -> None:
        """One frame of a rank's console. ``late`` (past the close's write deadline): its
        lines are counted, not written, so console text never costs the run its exit."""
        dropped = data.get("dropped")
        if type(dropped) is int and dropped > 0:
            self.dropped += dropped
        lines = data.get("lines")
        if type(lines) is not list:
            return
        out: list[list[Any]] = []  # [fd, text, when], in the order the rank wrote them
        for item in lines:
            if type(item) is not list or len(item) != 3:
                continue
            fd, when, text = item
            if fd not in _STREAMS or type(when) not in (int, float) or type(text) is not str:
                continue
            if late:
                self.dropped += text.count("\n")
            elif self.labelled:
                out.extend(
                    [fd, piece, since]
                    for piece, since in self._assemble(rank, fd, float(when), text)
                )
            elif text:
                out.append([fd, text, float(when)])
                self._open[fd] = not text.endswith("\n")
        self._emit(out, sink)

    def _assemble(self, rank: int, fd: int, when: float, text: str) -> list[tuple[str, float]]:
        """The whole lines ``text`` completes for (rank, fd), labelled; the rest is kept."""
        out: list[tuple[str, float]] = []
        before, since = self._partial.pop((rank, fd), ("", when))
        text = before + text
        cut = text.rfind("\n") + 1
        whole, rest = text[:cut], text[cut:]
        if whole:
            out.append((_labelled(rank, whole), since))
        rest = _collapse(rest)  # a progress bar's redraws: only the last one stands
        if len(rest) > _MAX_PARTIAL:  # a "line" that never ends is written in pieces
            out.append((_labelled(rank, rest + "\n"), when))
        elif rest:
            self._partial[(rank, fd)] = (rest, since if before else when)
        return out

    def _emit(self, out: list[list[Any]], sink: ConsoleSink | None) -> None:
        """Write ``out`` in order, one record per run of one stream's text."""
        runs: list[list[Any]] = []
        for fd, text, when in out:
            if runs and runs[-1][0] == fd:
                runs[-1][1] += text
            else:
                runs.append([fd, text, when])
        for fd, text, when in runs:
            self._write(fd, text, when, sink)

    def _write(self, fd: int, text: str, when: float, sink: ConsoleSink | None) -> None:
        count = text.count("\n")
        if sink is None:
            self.dropped += count
            return
        try:
            sink.output(_STREAMS[fd], text, when)
            self.lines += count
        except Exception:  # wandb gone: counted, never raised into the logger's loop
            self.dropped += count

    def flush(self, sink: ConsoleSink | None) -> None:
        """At close: write what ranks left unfinished (labelled), or count the line a single
        rank left unfinished, already written as it was (as plain wandb leaves it)."""
        self.lines += sum(1 for open_ in self._open.values() if open_)
        self._open = {}
        partial, self._partial = self._partial, {}
        self._emit(
            [
                [fd, _labelled(rank, text + "\n"), when]
                for (rank, fd), (text, when) in sorted(partial.items())
            ],
            sink,
        )


def _labelled(rank: int, text: str) -> str:
    """Whole lines (``text`` ends with a newline), each labelled, its ``\r`` redraws
    collapsed to the last as a terminal shows it: a redraw written raw would overwrite
    another rank's line in ``output.log``."""
    return "".join(f"[rank {rank}] {_collapse(line)}\n" for line in text.split("\n")[:-1])


def _collapse(line: str) -> str:
    """A line as a terminal leaves it after its ``\r`` redraws: the last one that wrote
    something (approximately: a shorter redraw would leave the longer one's tail)."""
    if "\r" not in line:
        return line
    parts = [part for part in line.split("\r") if part]
    return parts[-1] if parts else ""
