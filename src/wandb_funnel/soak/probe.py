"""What a soak program uses to tell the harness what it did; no-ops outside the harness.

- ``count(slot)`` after each ``log()`` that returned: a per-slot counter in a shared,
  file-backed mmap. It survives SIGKILL of the process that wrote it, so the harness knows
  exactly how many records every worker handed to the funnel, whoever died.
- ``event(name, **fields)`` appends one JSON line (``t`` is wall-clock time): ``ready``
  (the harness may now inject its fault), ``train_end`` (training code is over; exit time
  is counted from here), ``program_end`` (the program's last line ran: a fault that lands
  later meets the interpreter's own exit, and counts as missed), ``worker`` (a pid the
  harness may kill), and so on.
- ``rng()`` is seeded by the harness, so an iteration's randomized timings can be replayed.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import struct
import time
from typing import Any

SENT_ENV = "WANDB_FUNNEL_SOAK_SENT"
EVENTS_ENV = "WANDB_FUNNEL_SOAK_EVENTS"
SEED_ENV = "WANDB_FUNNEL_SOAK_SEED"
SLOTS = 256
_SLOT = struct.Struct("<q")

_map: mmap.mmap | None = None
_map_pid = -1


def create_sent_file(path: str) -> None:
    with open(path, "wb") as f:
        f.write(b"\0" * _SLOT.size * SLOTS * 2)  # returned counts, then attempted counts


def read_sent_file(path: str) -> tuple[list[int], list[int]]:
    """(returned, attempted) per slot; a slot that never called attempt() counts returned."""
    with open(path, "rb") as f:
        data = f.read()
    values = [_SLOT.unpack_from(data, i * _SLOT.size)[0] for i in range(2 * SLOTS)]
    returned = values[:SLOTS]
    return returned, [max(r, a) for r, a in zip(returned, values[SLOTS:], strict=True)]


def _sent_map() -> mmap.mmap | None:
    global _map, _map_pid
    if _map_pid != os.getpid():  # a forked child maps the file again; cheap and explicit
        path = os.environ.get(SENT_ENV)
        _map, _map_pid = None, os.getpid()
        if path:
            with open(path, "r+b") as f:
                _map = mmap.mmap(f.fileno(), _SLOT.size * SLOTS * 2)
    return _map


def _add(offset: int, n: int) -> None:
    m = _sent_map()
    if m is not None:
        _SLOT.pack_into(m, offset, _SLOT.unpack_from(m, offset)[0] + n)


def count(slot: int, n: int = 1) -> None:
    """Record that ``n`` more log() calls of ``slot`` returned (one writer per slot)."""
    _add(slot * _SLOT.size, n)


def attempt(slot: int, n: int = 1) -> None:
    """Record that ``n`` log() calls of ``slot`` are about to be made. A process signalled
    between a log() and its count() has one record more in the run than it counted; with
    this, the harness knows that record was in flight rather than invented."""
    _add((SLOTS + slot) * _SLOT.size, n)


def event(name: str, **fields: Any) -> None:
    path = os.environ.get(EVENTS_ENV)
    if not path:
        return
    line = json.dumps({"event": name, "t": time.time(), "pid": os.getpid(), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())  # one write with O_APPEND: lines never interleave
    finally:
        os.close(fd)


def read_events(path: str, final: bool = False) -> list[dict[str, Any]]:
    """The events written so far. A last line without its newline is being written now (one
    ``write`` is not atomic against a reader): it is left for the next read. With ``final``
    (the job has ended) it is taken if it parses, and otherwise was cut short by a kill. A
    complete line that is not JSON raises ValueError: something not an event was written."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    *lines, tail = data.split(b"\n")
    events = [json.loads(line) for line in lines if line.strip()]
    if final and tail.strip():
        try:
            events.append(json.loads(tail))
        except ValueError:
            pass  # its writer was killed mid-line: it never was an event
    return events


def rng() -> random.Random:
    return random.Random(os.environ.get(SEED_ENV, "0"))
