"""The messages that cross the wire, as NamedTuples; no I/O here.

NamedTuples, not dataclasses: every worker imports this module, and ``dataclasses`` (with the
``inspect`` it pulls in) cost a worker 30 ms and 2.8 MB at import.
"""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Any, Final, NamedTuple

from wandb_funnel._options import FunnelOptions, Topology

PROTOCOL_VERSION: Final = 4  # 2: the node tier's folded batches (issue 38); 3: by column; 4: packed

# Message kinds. Client -> logger first, then logger -> client.
HELLO: Final = 1
RECORDS: Final = 2
GOODBYE: Final = 5
CLOSE: Final = 6
BLOB: Final = 9  # a chunk of a media file, from a rank on another node (no shared disk)
WELCOME: Final = 16
DONE: Final = 17
ACK: Final = 18
SAVED: Final = 19  # the logger's: a stream's records below a sequence number are safe in the run
REHELLO: Final = 20  # the logger's: "say hello again" (it restarted and does not know you)
NODE: Final = 21  # a node logger's, to the root: the node it serves, now and then (issue 38)
FOLDED: Final = 22  # a node logger's, to the root: its ranks' batches, pre-reduced per step
NODE_PLAN: Final = 23  # the root's, to a node logger: whether and how to pre-reduce
NODE_SAVED: Final = 24  # the root's, to a node logger: its ranks' saved points, in one frame


# msgpack extension type of a media value inside a record (``wandb.Image``, ``wf.Table``, ...):
# its payload is a msgpack map, the media's descriptor (``_worker/media.py`` writes it; the
# sink makes it what it writes: ``sinks/wandb/media.py``, wandb's object again). Bytes never
# ride here: a file a descriptor names lies in the funnel's staging directory, by name.
MEDIA_EXT: Final = 1


class MediaRef:
    """A media value as the logger receives it: its descriptor, ``{"k": kind, ...}``."""

    __slots__ = ("desc",)

    def __init__(self, desc: dict[str, Any]) -> None:
        self.desc = desc

    def files(self) -> list[str]:
        """The staged file names this value (and any value inside it) holds."""
        out: list[str] = []
        _collect_files(self.desc, out)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MediaRef) and other.desc == self.desc

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MediaRef({self.desc.get('k')!r})"


def _collect_files(value: Any, out: list[str]) -> None:
    if type(value) is MediaRef:
        value = value.desc
    if type(value) is dict:
        name = value.get("f")
        if type(name) is str:
            out.append(name)
        for item in value.values():
            if type(item) in (dict, list, MediaRef):
                _collect_files(item, out)
    elif type(value) is list:
        for item in value:
            if type(item) in (dict, list, MediaRef):
                _collect_files(item, out)


class Hello(NamedTuple):
    """A new stream (one rank of one process) announces itself."""

    token: str
    pid: int
    host: str
    requested_rank: int | None
    pid_start: int | None = None  # process start time, to tell a reused pid from the original
    # A stream saying hello again to a restarted logger: ``(first, until)``, the sequence
    # numbers it resends next (its replay buffer; ``first`` is the oldest it still holds),
    # None at a stream's first hello.
    resume: tuple[int, int] | None = None


# One ``log()`` call as the logger receives it: ``[step, committed, data]``, exactly as msgpack
# decoded it (validated, not copied into an object: the receive path handles every record, and
# building one object each cost more than the rest of the decode).
Record = list[Any]


class RecordBatch(NamedTuple):
    """Records sent together; ``first_seq`` numbers them so the logger can see gaps."""

    first_seq: int
    records: list[Record]


class UpdateKind(IntEnum):
    """What a rank's update asks of the run: one vocabulary for the wire (the value is the
    message kind), the decoder and the logger's writer (``label`` names it in messages)."""

    CONFIG = 3  # run.config.update(data)
    SUMMARY = 4  # run.summary[key] = value
    METRIC = 7  # run.define_metric(**data): name, step_metric, ...
    # run.log_artifact / run.save: {"op": "artifact" | "save", ...} naming staged files
    FILES = 8
    # stdout and stderr as written: {"lines": [[fd, unix time, text], ...], "dropped": n}
    CONSOLE = 10
    STATS = 11  # system metrics: {"host": "node1", "stats": {key: number}}
    # a tensorboard log directory (sync_tensorboard): {"log_dir", "save", "root_dir", "cwd"},
    # as wandb's Run._tensorboard_callback gets them, plus the rank's working directory
    TENSORBOARD = 12
    # the run's own settable attributes (run.name = ..., run.notes, run.tags), the ones set:
    # {"name": str | None, "notes": str | None, "tags": [str, ...]}
    RUN = 13

    @property
    def label(self) -> str:
        return "define_metric" if self is UpdateKind.METRIC else self.name.lower()


# The update kinds by their wire names (the worker's modules send them by these).
CONFIG: Final = UpdateKind.CONFIG
SUMMARY: Final = UpdateKind.SUMMARY
METRIC: Final = UpdateKind.METRIC
FILES: Final = UpdateKind.FILES  # see _worker/files.py
CONSOLE: Final = UpdateKind.CONSOLE  # see _worker/console.py
STATS: Final = UpdateKind.STATS  # see _worker/system.py
TENSORBOARD: Final = UpdateKind.TENSORBOARD  # see Run._tensorboard_callback
RUN: Final = UpdateKind.RUN  # see Run's name, notes and tags setters


class Update(NamedTuple):
    """A rank's update of the run: ``kind`` says what, ``data`` is always a str-keyed map."""

    kind: UpdateKind
    data: dict[str, Any]


class Blob(NamedTuple):
    """Bytes ``[offset, offset + len(data))`` of the staged file ``name`` (``total`` bytes in
    all), sent ahead of the record that names it by a rank that cannot write to the logger's
    disk. The logger writes ``name`` once its last chunk has arrived."""

    name: str
    offset: int
    total: int
    data: bytes


class Goodbye(NamedTuple):
    """A stream ends; ``produced`` counts every record it ever numbered, sent or dropped.

    ``exit_code`` is the rank's own: non-zero when it ended with an exception, which makes
    the run end non-zero too (a rank that raised failed the job).
    """

    produced: int
    reason: str
    exit_code: int = 0


class Close(NamedTuple):
    """The owner asks the logger to finish the run within ``budget`` seconds."""

    token: str
    exit_code: int
    budget: float
    # wandb's end-of-run footer ("Run history:", "Run summary:"): plain wandb prints it for a
    # finish() the program called, not for the finish its exit hook makes.
    footer: bool = True


class Welcome(NamedTuple):
    """The logger's answer to a Hello: the rank this stream got, and what the open run says
    about itself (name, project, dir, url, ...): None while it is still opening (an online run
    opens in the background). A stream may say Hello again to ask for it."""

    rank: int
    run: dict[str, Any] | None = None
    logger_pid: int | None = None  # the logger process answering (a new one after a restart)


class Ack(NamedTuple):
    """The logger's answer to a Goodbye: how many of the stream's records it received."""

    received: int


class Saved(NamedTuple):
    """The logger's word that every record of the stream numbered below ``seq`` is in the
    run's transaction log (or was counted as dropped): the stream may forget them."""

    seq: int


class Rehello(NamedTuple):
    """The logger's answer to a stream it does not know (it was restarted): say hello again
    and resend what was not saved."""


class NodeHello(NamedTuple):
    """A node logger's word to the root logger, when it connects and every second after:
    which node it serves, from which host and process; ``state`` is ``"live"``, or
    ``"ended"`` when it leaves (its ranks have finished). Its counts so far: frames it
    ``forwarded``, frames of a predecessor's streams it sent back for a hello (``stale``),
    and malformed frames it dropped (``junk``)."""

    token: str
    node: int
    host: str
    pid: int
    state: str = "live"
    forwarded: int = 0
    stale: int = 0
    junk: int = 0
    folded: int = 0  # rank batches it sent pre-reduced (``Folded``)


class Folded(NamedTuple):
    """A node logger's pre-reduction of whole record batches of some of its ranks (issue 38,
    ``_node/fold.py``). ``streams``: ``[identity, first_seq, end_seq, top step, floor]`` for
    each stream whose batches ``[first_seq, end_seq)`` it holds, no more, no fewer; ``steps``:
    ``[step, committed, records, keyset, [[rank, {key: value}], ...]]``, ``keyset`` the index
    in ``keysets`` of the keys whose states it has (-1: none), each part what of a rank's step
    no state reduces; ``nonfinite``: NaN and infinite values among them, the first of each
    (rank, key) in ``said`` as ``[rank, step, key, value as text]``; ``states``: every
    step's states, key after key, a row each (``columns.py``). The root takes it whole or
    not at all."""

    streams: list[list[Any]]
    steps: list[list[Any]]
    nonfinite: int
    said: list[list[Any]]
    keysets: list[list[str]]
    states: bytes


class NodePlan(NamedTuple):
    """The root's answer to a node logger's first word: ``fold`` (pre-reduce: a run shared by
    every rank, not ``run_mode="shared"`` or ``"new"``), with the job's ``reduce`` option, and
    how often (``period``: the root's cost is per frame, so the more nodes, the longer)."""

    fold: bool
    reduce: dict[str, str]
    period: float = 0.2  # seconds between its Folded frames (longer, the more nodes)


class NodeSaved(NamedTuple):
    """The root's ``Saved`` for a node logger's ranks, in one frame instead of one each (at
    16,384 ranks they cost the root a tenth of a core): ``points``, ``[identity, seq]`` per
    stream; the node logger tells each its ``Saved(seq)``."""

    points: list[list[Any]]


class Done(NamedTuple):
    """The logger's answer to Close, sent once the run is finished."""

    stats: dict[str, Any]


Message = (
    Hello
    | RecordBatch
    | Update
    | Blob
    | Goodbye
    | Close
    | Welcome
    | Done
    | Ack
    | Saved
    | Rehello
    | NodeHello
    | Folded
    | NodePlan
    | NodeSaved
)


class LoggerStart(NamedTuple):
    """What the owner tells the logger process it starts, as JSON on the logger's stdin (a
    pipe between two processes of one user; never on the socket). ``init_kwargs`` are
    ``wandb.init``'s arguments, already plain data. The logger validates it all again."""

    address: str
    ipc_dir: str | None
    token: str
    owner_pid: int
    ready_fd: int
    options: FunnelOptions
    topology: Topology
    init_kwargs: dict[str, Any]
    curve: dict[str, str] | None = None  # the server's CURVE keys, when listening on TCP
    # The owner's program and arguments: the run records the user's script, not the logger.
    program: dict[str, Any] | None = None
    # How many loggers this funnel started before this one: 0 at the start, then one more at
    # each restart (``_owner/supervisor.py``); a restarted logger continues the same run.
    generation: int = 0
    # The TCP endpoint the first logger bound (a restarted one binds the same: ranks on
    # other nodes reconnect to it).
    tcp_endpoint: str | None = None
    # For a logger started ahead of time (``_owner/prewarm.py``): the owner's environment and
    # working directory now, which the logger takes before it opens the run (a started
    # logger inherited them when they may have been different).
    env: dict[str, str] | None = None
    cwd: str | None = None
    # This run as an attempt of a job (``_attempts.Attempt``'s wire form): the logger
    # continues the earlier attempts' run, and records what this one did.
    attempt: dict[str, Any] | None = None

    @property
    def run_id(self) -> str:
        return str(self.init_kwargs["id"])

    def to_json(self) -> bytes:
        data = self._asdict()
        data["options"] = self.options.to_wire()
        data["topology"] = self.topology.to_wire()
        return json.dumps(data).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> LoggerStart:
        try:
            data = json.loads(raw)
            start = cls(
                address=str(data["address"]),
                ipc_dir=data["ipc_dir"],
                token=str(data["token"]),
                owner_pid=int(data["owner_pid"]),
                ready_fd=int(data["ready_fd"]),
                options=FunnelOptions.from_wire(data["options"]),
                topology=Topology.from_wire(data["topology"]),
                init_kwargs=dict(data["init_kwargs"]),
                curve=data["curve"],
                program=data.get("program"),
                generation=int(data.get("generation", 0)),
                tcp_endpoint=data.get("tcp_endpoint"),
                env=_str_dict(data.get("env")),
                cwd=str(data["cwd"]) if data.get("cwd") is not None else None,
                attempt=dict(data["attempt"]) if data.get("attempt") is not None else None,
            )
            _ = start.run_id
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"wandb_funnel: malformed logger start message: {exc}") from exc
        return start


class NodeStart(NamedTuple):
    """What a rank tells the node logger it starts (issue 38), as one JSON line on its stdin:
    where the node's ranks connect (``endpoint`` in the private ``ipc_dir``), where the root
    logger listens (``upstream``, with the job's client CURVE keys), and which node this is.
    ``generation``: how many node loggers this node had before this one."""

    endpoint: str
    ipc_dir: str
    upstream: str
    curve: dict[str, str] | None
    token: str
    node: int
    parent_pid: int
    max_frame: int
    generation: int = 0

    def to_json(self) -> bytes:
        return json.dumps(self._asdict()).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> NodeStart:
        try:
            data = json.loads(raw)
            curve = data["curve"]
            return cls(
                endpoint=str(data["endpoint"]),
                ipc_dir=str(data["ipc_dir"]),
                upstream=str(data["upstream"]),
                curve=None if curve is None else {str(k): str(v) for k, v in curve.items()},
                token=str(data["token"]),
                node=int(data["node"]),
                parent_pid=int(data["parent_pid"]),
                max_frame=int(data["max_frame"]),
                generation=int(data.get("generation", 0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"wandb_funnel: malformed node logger start message: {exc}") from exc


def _str_dict(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"env must be a dict, got {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}
