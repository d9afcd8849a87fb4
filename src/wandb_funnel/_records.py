"""The messages that cross the wire, as plain frozen dataclasses; no I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

PROTOCOL_VERSION: Final = 1

# Message kinds. Client -> logger first, then logger -> client.
HELLO: Final = 1
RECORDS: Final = 2
CONFIG: Final = 3
SUMMARY: Final = 4
GOODBYE: Final = 5
CLOSE: Final = 6
WELCOME: Final = 16
DONE: Final = 17
ACK: Final = 18


@dataclass(frozen=True, slots=True)
class Hello:
    """A new stream (one rank of one process) announces itself."""

    token: str
    pid: int
    host: str
    requested_rank: int | None
    pid_start: int | None = None  # process start time, to tell a reused pid from the original


# One ``log()`` call as the logger receives it: ``[step, committed, data]``, exactly as msgpack
# decoded it (validated, not copied into an object: the receive path handles every record, and
# building one object each cost more than the rest of the decode).
Record = list[Any]


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Records sent together; ``first_seq`` numbers them so the logger can see gaps."""

    first_seq: int
    records: list[Record] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ConfigUpdate:
    """``run.config.update(data)`` from some rank."""

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SummaryUpdate:
    """``run.summary[key] = value`` from some rank."""

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Goodbye:
    """A stream ends; ``produced`` counts every record it ever numbered, sent or dropped.

    ``exit_code`` is the rank's own: non-zero when it ended with an exception, which makes
    the run end non-zero too (a rank that raised failed the job).
    """

    produced: int
    reason: str
    exit_code: int = 0


@dataclass(frozen=True, slots=True)
class Close:
    """The owner asks the logger to finish the run within ``budget`` seconds."""

    token: str
    exit_code: int
    budget: float


@dataclass(frozen=True, slots=True)
class Welcome:
    """The logger's answer to a Hello: the rank this stream got."""

    rank: int


@dataclass(frozen=True, slots=True)
class Ack:
    """The logger's answer to a Goodbye: how many of the stream's records it received."""

    received: int


@dataclass(frozen=True, slots=True)
class Done:
    """The logger's answer to Close, sent once the run is finished."""

    stats: dict[str, Any]


Message = (
    Hello | RecordBatch | ConfigUpdate | SummaryUpdate | Goodbye | Close | Welcome | Done | Ack
)
