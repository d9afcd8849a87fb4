"""Every rank's console into the run's Logs tab: what ranks wrote, as wandb's own records.

A rank sends what it wrote to stdout and stderr as it wrote it (``_worker/console.py``). Here
the text is cut into lines per (rank, stream), each line labelled ``[rank N] `` and handed to
wandb as an ``output_raw`` record, the record wandb's own console capture writes (wandb-core
writes them into ``output.log``). A line is only written once it is whole (it ends with
``\\n``), with its ``\\r`` redraws collapsed to the last as a terminal shows them, so two
ranks' half-lines or progress bars never run over each other; what a rank leaves unfinished
goes out at close.
Lines of different ranks are interleaved in the order they reach the logger, which is time
order within the flush interval.
"""

from __future__ import annotations

from typing import Any, Protocol

_STREAMS = {1: "stdout", 2: "stderr"}
_MAX_PARTIAL = 64 * 1024  # a "line" that never ends is written in pieces of this size


class ConsoleSink(Protocol):
    def output(self, stream: str, text: str, timestamp: float) -> None: ...


class ConsoleLines:
    """Assembles and labels console text; called from the logger's main thread only."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, int], tuple[str, float]] = {}  # (rank, fd) -> text
        self.lines = 0  # lines written into the run
        self.dropped = 0  # lines ranks left out (their bound), or that were not written

    def take(self, rank: int, data: dict[str, Any], sink: ConsoleSink | None,
             late: bool = False) -> None:
        """One frame of a rank's console. ``late`` (past the close's write deadline): its
        lines are counted, not written, so console text never costs the run its exit."""
        dropped = data.get("dropped")
        if type(dropped) is int and dropped > 0:
            self.dropped += dropped
        lines = data.get("lines")
        if type(lines) is not list:
            return
        merged: dict[int, tuple[str, float]] = {}  # one write per stream per frame
        for item in lines:
            if type(item) is not list or len(item) != 3:
                continue
            fd, when, text = item
            if fd not in _STREAMS or type(when) not in (int, float) or type(text) is not str:
                continue
            before, first = merged.get(fd, ("", float(when)))
            merged[fd] = (before + text, first)
        for fd, (text, when) in merged.items():
            if late:
                self.dropped += text.count("\n")
            else:
                self._add(rank, fd, when, text, sink)

    def _add(self, rank: int, fd: int, when: float, text: str, sink: ConsoleSink | None) -> None:
        before, since = self._partial.pop((rank, fd), ("", when))
        text = before + text
        cut = text.rfind("\n") + 1
        whole, rest = text[:cut], text[cut:]
        if whole:
            self._write(rank, fd, whole, since, sink)
        rest = _collapse(rest)  # a progress bar's redraws: only the last one stands
        if len(rest) > _MAX_PARTIAL:  # a "line" that never ends is written in pieces
            self._write(rank, fd, rest + "\n", when, sink)
        elif rest:
            self._partial[(rank, fd)] = (rest, since if before else when)

    def _write(self, rank: int, fd: int, text: str, when: float, sink: ConsoleSink | None) -> None:
        """Whole lines (``text`` ends with a newline), each labelled. A line's ``\r``
        redraws are collapsed to the last, as a terminal shows it: a redraw written raw would
        overwrite another rank's line in ``output.log``."""
        lines = text.split("\n")[:-1]
        labelled = "".join(f"[rank {rank}] {_collapse(line)}\n" for line in lines)
        if sink is None:
            self.dropped += len(lines)
            return
        try:
            sink.output(_STREAMS[fd], labelled, when)
            self.lines += len(lines)
        except Exception:  # wandb gone: counted, never raised into the logger's loop
            self.dropped += len(lines)

    def flush(self, sink: ConsoleSink | None) -> None:
        """Write what ranks left unfinished (at close)."""
        partial, self._partial = self._partial, {}
        for (rank, fd), (text, when) in sorted(partial.items()):
            self._write(rank, fd, text + "\n", when, sink)


def _collapse(line: str) -> str:
    """A line as a terminal leaves it after its ``\r`` redraws: the last one that wrote
    something (approximately: a shorter redraw would leave the longer one's tail)."""
    if "\r" not in line:
        return line
    parts = [part for part in line.split("\r") if part]
    return parts[-1] if parts else ""
