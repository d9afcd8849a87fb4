"""This process's stdout and stderr, copied to the run's Logs tab: print, logging, warnings,
tracebacks (a rank that crashes included), as plain wandb captures rank 0's.

``sys.stdout.write`` and ``sys.stderr.write`` are wrapped, as wandb's own ``wrap_raw`` capture
does (``wandb/sdk/lib/console_capture.py``): the text goes to the terminal first, unchanged,
then a copy joins this process's pending console text. The stream that carries it (the first
of this process) sends it to the logger on its flusher thread, and before its goodbye at exit
(so a crashing rank's traceback, printed before the exit hooks run, gets there). The logger
cuts it into lines and labels them with the rank (``_logger/console.py``).

Bounded, never blocking: a line is kept or dropped whole, when it starts, against a budget of
``CONSOLE_LINES_PER_S`` lines a second (``CONSOLE_BURST`` at once) and ``CONSOLE_PENDING_CHARS``
of text waiting; a dropped line is counted (``_funnel/dropped_console_lines``), as are lines
whose frame found the logger's queue full. The copy is all a write pays.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from wandb_funnel._constants import CONSOLE_BURST, CONSOLE_LINES_PER_S, CONSOLE_PENDING_CHARS
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import CONSOLE

_MARK = "__wandb_funnel_console__"
# Text per CONSOLE frame: far below the logger's frame limit even for a small
# max_record_bytes (it takes max_record_bytes + 260 KiB).
_FRAME_TEXT = 192 * 1024

# A signal handler that prints may interrupt a write on the same thread: re-entrant.
_lock = threading.RLock()
_pending: list[list[Any]] = []  # [fd, unix time, text]
_pending_chars = 0
_dropped = 0  # lines left out, not yet reported
_tokens = float(CONSOLE_BURST)
_refilled = time.monotonic()
_mode = {1: "start", 2: "start"}  # per fd: at a line's start, in a kept line, in a dropped one
_carrier: Any = None  # the Stream that sends this process's console


def start(stream: Any) -> None:
    """Capture this process's console from now on (idempotent), sent by ``stream`` unless an
    open stream of this process already carries it."""
    global _carrier
    _patch(sys.stdout, 1)
    _patch(sys.stderr, 2)
    with _lock:
        if _carrier is None or _carrier.closed or _carrier.pid != os.getpid():
            _carrier = stream


def forget(stream: Any) -> None:
    """``stream`` closed: if it carried the console, capture stops until a new one starts
    (text written meanwhile would otherwise reach a later run of this process)."""
    global _carrier, _pending, _pending_chars, _dropped
    with _lock:
        if _carrier is stream:
            _carrier = None
            _pending, _pending_chars, _dropped = [], 0, 0
            _mode[1] = _mode[2] = "start"


def _patch(target: Any, fd: int) -> None:
    if target is None:
        return
    write = getattr(target, "write", None)
    if write is None or getattr(write, _MARK, False):
        return  # already ours (this process, or inherited through fork)

    def tee(text: Any, /) -> Any:
        written = write(text)
        if _carrier is not None and not getattr(_here, "quiet", False):
            # (nothing to copy to before init, after finish, in a fork; nor wandb's own lines)
            try:
                _capture(fd, text)
            except Exception:  # the console copy must never be what breaks a print
                pass
        return written

    setattr(tee, _MARK, True)
    try:
        target.write = tee
    except (AttributeError, TypeError):
        pass  # a stream object that cannot take it: its output is not copied


_here = threading.local()


class uncaptured:  # noqa: N801  (used as a context manager, like contextlib's)
    """Lines written meanwhile on this thread reach the terminal only, not the run: wandb's
    own terminal lines, which its capture leaves out of the run's Logs as well."""

    def __enter__(self) -> None:
        _here.quiet = True

    def __exit__(self, *exc: object) -> None:
        _here.quiet = False


def _capture(fd: int, text: Any) -> None:
    """Keep or drop ``text``, a line at a time: a line is decided when it starts (a line and
    each ``\r`` redraw cost one of the budget's lines); a kept line that outgrows the budget
    is cut there (ended with a newline, the rest left out); a dropped line is counted at its
    end."""
    global _pending_chars, _dropped
    if not isinstance(text, str):
        if not isinstance(text, (bytes, bytearray)):
            return
        text = bytes(text).decode("utf-8", "replace")
    if not text:
        return
    now = time.time()
    with _lock:
        keep: list[str] = []
        mode = _mode[fd]
        if mode != "start":  # the rest of a line already decided on
            end = text.find("\n")
            head, text = (text, "") if end < 0 else (text[: end + 1], text[end + 1 :])
            if mode == "keep":
                if _afford(head.count("\r"), len(head)):
                    keep.append(head)
                else:
                    keep.append("\n")  # the kept part stands as a line of its own
                    mode = "cut"
            elif mode == "drop" and end >= 0:
                _dropped += 1
            _mode[fd] = mode if end < 0 else "start"
        if text:
            lines = text.count("\n")
            partial = not text.endswith("\n")
            if _afford(lines + partial + text.count("\r"), len(text)):
                keep.append(text)
                _mode[fd] = "keep" if partial else "start"
            else:
                _dropped += lines
                _mode[fd] = "drop" if partial else "start"
        if keep:
            joined = "".join(keep)
            _pending.append([fd, now, joined])
            _pending_chars += len(joined)


def note_traceback(exc: BaseException, process_name: str) -> None:
    """Add the traceback multiprocessing will print for ``exc`` to the console copy only (the
    terminal gets it from multiprocessing, after this process's stream has closed)."""
    if _carrier is None:
        return
    try:
        import traceback

        _capture(2, f"Process {process_name}:\n" + "".join(traceback.format_exception(exc)))
    except Exception:  # never what keeps the streams from closing
        pass


def _afford(lines: int, chars: int) -> bool:
    """Whether the budget takes ``lines`` more lines now (caller holds the lock)."""
    global _tokens, _refilled
    now = time.monotonic()
    _tokens = min(float(CONSOLE_BURST), _tokens + (now - _refilled) * CONSOLE_LINES_PER_S)
    _refilled = now
    if _tokens < lines or _pending_chars + chars > CONSOLE_PENDING_CHARS:
        return False
    _tokens -= lines
    return True


def _take() -> tuple[list[list[Any]], int]:
    global _pending, _pending_chars, _dropped
    with _lock:
        taken, dropped = _pending, _dropped
        _pending, _pending_chars, _dropped = [], 0, 0
    return taken, dropped


def pump(stream: Any, send: Callable[[bytes], bool]) -> None:
    """Send what this process wrote since the last pump through ``send``, if ``stream``
    carries the console; the caller holds the stream's lock, so a close cannot slip between
    taking the text and sending it. Frames stay far below any frame limit; one the queue
    does not take is counted as dropped lines."""
    global _dropped
    if stream is not _carrier:
        return
    lines, dropped = _take()
    if not lines and not dropped:
        return
    lost = 0
    for chunk in _chunks(lines):
        frame = codec.encode_update(CONSOLE, {"lines": chunk, "dropped": dropped}, 1 << 22)
        if send(frame):
            dropped = 0
        else:
            lost += sum(item[2].count("\n") for item in chunk)
    if lost or dropped:
        with _lock:
            _dropped += lost + dropped


def _chunks(lines: list[list[Any]]) -> list[list[list[Any]]]:
    """``lines`` in frames of at most ``_FRAME_TEXT`` characters (a long write split)."""
    out: list[list[list[Any]]] = [[]]
    size = 0
    for fd, when, text in lines:
        for start in range(0, len(text), _FRAME_TEXT):
            piece = text[start : start + _FRAME_TEXT]
            if size + len(piece) > _FRAME_TEXT and out[-1]:
                out.append([])
                size = 0
            out[-1].append([fd, when, piece])
            size += len(piece)
    return out


def carrier() -> Any:
    return _carrier


def _reset_in_child() -> None:
    # A forked child keeps the wrapped writes; its console goes with a stream of its own.
    global _lock, _pending, _pending_chars, _dropped, _carrier
    _lock = threading.RLock()
    _pending, _pending_chars, _dropped, _carrier = [], 0, 0, None
    _mode[1] = _mode[2] = "start"


os.register_at_fork(after_in_child=_reset_in_child)
