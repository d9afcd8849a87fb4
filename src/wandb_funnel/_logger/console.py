"""Every rank's console into the run's Logs tab: what ranks wrote, as wandb's own records.

A rank sends what it wrote to stdout and stderr as it wrote it (``_worker/console.py``). Here
the text is cut into lines per (rank, stream), each line labelled ``[rank N] `` and handed to
wandb as an ``output_raw`` record, the record wandb's own console capture writes (wandb-core
then does the terminal emulation into ``output.log``, so ``\\r`` progress bars behave as they
do in plain wandb). A line is only written once it is whole (it ends with ``\\n`` or ``\\r``),
so two ranks' half-lines never run together; what a rank leaves unfinished goes out at close.
Lines of different ranks are interleaved in the order they reach the logger, which is time
order within the flush interval.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

_STREAMS = {1: "stdout", 2: "stderr"}
_MAX_PARTIAL = 64 * 1024  # a "line" that never ends is written in pieces of this size
# One line with its end (\r\n, \n, or a bare \r: a progress bar's redraw), or a last piece.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\n|\r)|[^\r\n]+")


class ConsoleSink(Protocol):
    def output(self, stream: str, text: str, timestamp: float) -> None: ...


class ConsoleLines:
    """Assembles and labels console text; called from the logger's main thread only."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, int], tuple[str, float]] = {}  # (rank, fd) -> text
        self.lines = 0  # lines written into the run
        self.dropped = 0  # lines ranks left out (their bound), or that wandb refused

    def take(self, rank: int, data: dict[str, Any], sink: ConsoleSink | None) -> None:
        dropped = data.get("dropped")
        if type(dropped) is int and dropped > 0:
            self.dropped += dropped
        lines = data.get("lines")
        if type(lines) is not list:
            return
        for item in lines:
            if type(item) is not list or len(item) != 3:
                continue
            fd, when, text = item
            if fd not in _STREAMS or type(when) not in (int, float) or type(text) is not str:
                continue
            self._add(rank, fd, float(when), text, sink)

    def _add(self, rank: int, fd: int, when: float, text: str, sink: ConsoleSink | None) -> None:
        before, since = self._partial.pop((rank, fd), ("", when))
        text = before + text
        cut = max(text.rfind("\n"), text.rfind("\r")) + 1
        whole, rest = text[:cut], text[cut:]
        if len(rest) > _MAX_PARTIAL:
            whole, rest = text, ""
        if whole:
            self._write(rank, fd, whole, since, sink)
        if rest:
            self._partial[(rank, fd)] = (rest, since if before else when)

    def _write(self, rank: int, fd: int, text: str, when: float, sink: ConsoleSink | None) -> None:
        pieces = _LINE.findall(text)
        labelled = "".join(f"[rank {rank}] {piece}" for piece in pieces)
        if sink is None:
            self.dropped += len(pieces)
            return
        try:
            sink.output(_STREAMS[fd], labelled, when)
            self.lines += len(pieces)
        except Exception:  # wandb gone: counted, never raised into the logger's loop
            self.dropped += len(pieces)

    def flush(self, sink: ConsoleSink | None) -> None:
        """Write what ranks left unfinished (at close)."""
        partial, self._partial = self._partial, {}
        for (rank, fd), (text, when) in sorted(partial.items()):
            self._write(rank, fd, text + "\n", when, sink)
