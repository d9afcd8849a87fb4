"""A node logger's pre-reduction (issue 38): its ranks' record batches folded, per step, into
``KeyState``s, and sent to the root by column (``columns.py``) as one ``Folded`` frame a
period (the root's ``NodePlan``): the root then merges a state per node and key, not a value
per rank and key.

What keeps the rows exact, and every record taken exactly once (docs/DESIGN.md, "The node
tier"):

- **Whole batches, one way.** A rank's batch is either folded whole or forwarded as it came.
  A ``Folded`` names, for each stream, the numbers ``[first, end)`` it holds; the root takes
  it whole or not at all (it then asks those streams to resend, and resent batches go as they
  came). So the root numbers every stream as it would without a node tier, and a node
  logger's death loses nothing: what the root has not said is saved, the ranks still hold.
- **A rank's step is folded whole, once.** A rank's records at one step merge first (later
  keys win, as in wandb), and only once it has left that step: a batch is held until its
  last step is closed and the next batch starts at a later step. A batch held past
  ``HOLD_FOR`` goes as it came, and so does every later record of the rank at or below its
  steps: a rank's step reaches the root folded or as it came, not both.
- **Only what a state reduces exactly**: plain ints (within ``columns.INT_LIMIT``, so that
  sums fit the wire) and floats, of keys whose reducer is mean, sum, min, max or first (or
  none), in a run every rank shares (``NodePlan``). The rest of a rank's step (media,
  strings, bools, ``spread``, ``concat`` and ``merge`` keys) rides in the same ``Folded`` as
  it came, as that rank's part: the root merges a key's states and parts as the flat funnel
  merges values.
  ``run_mode="shared"`` or ``"new"``: nothing is folded.
- **Nothing the run may have already**: a stream's resend after a restart (numbers below its
  hello's ``resume`` end), its batches before the root's Welcome named its rank, a batch
  after a gap, all go as they came.
- **Order.** A stream's frame that goes as it came follows the ``Folded`` that holds that
  stream's earlier batches; its goodbye follows everything it accounts for.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from wandb_funnel._protocol import codec, columns, node_wire
from wandb_funnel._protocol.mergeable import MERGEABLE, KeyState, ReducerNames, flatten
from wandb_funnel._protocol.messages import Folded, NodePlan, RecordBatch

HOLD_FOR = 1.0  # a batch whose step stays open this long goes to the root as it came
_SAID_MAX = 1_000  # (rank, key) pairs whose first non-finite value is said
_STATE_BYTES = 120  # a key's state on the wire, at most (112 bytes, its name once a frame)
_MAX_STEPS = node_wire.MAX_FOLDED_STREAMS // 2  # steps in one Folded (the root takes 65,536)

Out = list[list[bytes]]  # messages to the root, in order: [identity, frame] or [frame]


class _Batch(NamedTuple):
    first: int
    end: int
    records: list[list[Any]]  # [step, committed, data], as decoded
    frame: bytes  # as it came, should it go so after all
    low: int
    high: int
    at: float
    size: int  # its bytes in a Folded, over-estimated (its frame, and a state per value)


class _Stream:
    __slots__ = ("floor", "folded_through", "held", "next_seq", "rank", "raw_through", "until")

    def __init__(self) -> None:
        self.rank: int | None = None  # from the root's Welcome
        self.next_seq: int | None = None  # the root's next number, once it has what went
        self.until = 0  # numbers below this are resent after a restart
        self.floor = -1  # the rank logs nothing below this step from now on
        self.raw_through = -1  # steps at or below this go as they came
        self.folded_through = -1
        self.held: list[_Batch] = []


class _Step:
    __slots__ = ("committed", "parts", "records", "states")

    def __init__(self) -> None:
        self.committed = False
        self.records = 0
        self.states: dict[str, KeyState] = {}
        self.parts: list[list[Any]] = []  # [rank, {key: value}]: what no state reduces


class Folder:
    """The node's folding state; its caller sends what each method returns, in order."""

    def __init__(self, max_frame: int) -> None:
        self._max_frame = max_frame
        self._names: ReducerNames | None = None  # None: the root has not said to fold
        self._streams: dict[bytes, _Stream] = {}
        self._steps: dict[int, _Step] = {}  # the next Folded: by step ...
        self._entries: dict[bytes, list[Any]] = {}  # ... and what it holds of each stream
        self._nonfinite = 0
        self._said: list[list[Any]] = []
        self._seen: set[tuple[int, str]] = set()
        self._due = 0.0
        self._period = 0.2  # seconds between Folded frames: the root's word (NodePlan)
        self._size = 0  # the next Folded's bytes, over-estimated
        self._budget = max_frame // 4
        self.folded = 0  # batches sent folded

    def plan(self, plan: NodePlan) -> None:
        """The root's word: fold, with the job's ``reduce`` option, or not."""
        self._names = ReducerNames(plan.reduce) if plan.fold else None
        self._period = plan.period

    def welcome(self, identity: bytes, rank: int) -> None:
        self._stream(identity).rank = rank

    def hello(self, identity: bytes, resume: tuple[int, int] | None) -> Out:
        """A stream says hello again; with ``resume`` (a logger restarted) it resends what is
        unsaved, its held batches among them: they are forgotten here."""
        if resume is None:
            return []
        stream = self._stream(identity)  # (a successor knows no stream yet)
        out = self._flush_for(identity)
        stream.held.clear()
        stream.until = max(stream.until, resume[1])
        stream.next_seq = None
        return out

    def records(self, identity: bytes, frame: bytes, now: float) -> Out:
        """A stream's record batch: held to be folded, or what must go now."""
        stream = self._stream(identity)
        try:
            batch = codec.decode(frame, self._max_frame)
        except codec.DecodeError:
            return [[identity, frame]]  # the root counts it
        if not isinstance(batch, RecordBatch):
            return [[identity, frame]]
        end = batch.first_seq + len(batch.records)
        if not batch.records:  # a heartbeat numbers nothing: behind held batches it would
            if stream.held or identity in self._entries:  # say they were skipped
                return []
            return [[identity, frame]]
        for step, committed, _ in batch.records:
            floor = step + 1 if committed else step
            if floor > stream.floor:
                stream.floor = floor
        held = self._foldable(stream, batch, frame, now)
        if held is None:  # what it closed folds first: what it did not goes as it came too
            low = min(r[0] for r in batch.records)
            out = self._fold(identity, stream, self._cuts(stream, low), low)
            out += self._flush_for(identity) + self._release(identity, stream)
            out.append([identity, frame])
            stream.raw_through = max(stream.raw_through, *(r[0] for r in batch.records))
        else:
            stream.held.append(held)
            out = []
        stream.next_seq = end
        return out

    def goodbye(self, identity: bytes) -> Out:
        """Before a stream's goodbye: all it holds (it logs no more: every step is closed)."""
        stream = self._streams.pop(identity, None)
        if stream is None:
            return []
        out = self._fold(identity, stream, self._cuts(stream, final=True))
        return out + self._flush_for(identity) + self._release(identity, stream)

    def leaving(self) -> Out:
        """This node logger leaves: what it holds goes now, as it came (a rank killed
        outright says no goodbye; its held batches must not die here)."""
        out: Out = []
        for identity, stream in self._streams.items():
            if stream.held:
                out += self._flush_for(identity) + self._release(identity, stream)
        if self._entries:
            out.append(self._take())
        return out

    def tick(self, now: float) -> Out:
        """Every period (``NodePlan``): what can be folded is, and sent; what waited too long
        goes as it came."""
        if now < self._due:
            return []
        self._due = now + self._period
        out: Out = []
        for identity, stream in self._streams.items():
            if stream.held:
                out += self._fold(identity, stream, self._cuts(stream))
                if stream.held and now - stream.held[0].at >= HOLD_FOR:
                    out += self._flush_for(identity) + self._release(identity, stream)
        if self._entries:
            out.append(self._take())
        return out

    # -- inside --------------------------------------------------------------------------------
    def _stream(self, identity: bytes) -> _Stream:
        stream = self._streams.get(identity)
        if stream is None:
            stream = self._streams[identity] = _Stream()
        return stream

    def _foldable(
        self, stream: _Stream, batch: RecordBatch, frame: bytes, now: float
    ) -> _Batch | None:
        names = self._names
        if names is None or stream.rank is None or stream.next_seq != batch.first_seq:
            return None
        if batch.first_seq < stream.until:
            return None
        below = max(stream.raw_through, stream.folded_through)
        records = batch.records
        if any(record[0] <= below for record in records):
            return None
        steps = [r[0] for r in records]
        values = sum(len(flatten(r[2])) for r in records)
        size = len(frame) + _STATE_BYTES * values
        end = batch.first_seq + len(records)
        return _Batch(batch.first_seq, end, records, frame, min(steps), max(steps), now, size)

    def _fold(
        self, identity: bytes, stream: _Stream, cuts: list[int], next_low: int | None = None
    ) -> Out:
        """Fold the held batches up to the last of ``cuts`` (counts from the first, each
        closing a step), keeping each Folded within a quarter of the largest frame (the root
        disconnects a peer past it): a full one goes, and the next is begun; what does not
        fit even an empty one goes as it came, with what follows it. ``next_low``: the lowest
        step of a batch about to go as it came (the floor sent stays below it). Returns what
        must go now."""
        out: Out = []
        while cuts:
            room = self._budget - self._size
            steps_room = _MAX_STEPS - len(self._steps)
            count = size = steps = 0
            for cut in cuts:
                more = stream.held[count:cut]
                more_size = size + sum(b.size for b in more)
                more_steps = steps + sum(len(b.records) for b in more)
                if more_size > room or more_steps > steps_room:
                    break
                count, size, steps = cut, more_size, more_steps
            if count:
                self._size += size
                self._cut(identity, stream, count, next_low)
                cuts = [cut - count for cut in cuts if cut > count]
            elif self._entries:
                out.append(self._take())  # full: the next cut begins a new one
            else:
                return out + self._release(identity, stream)
        return out

    @staticmethod
    def _cuts(stream: _Stream, next_low: int | None = None, final: bool = False) -> list[int]:
        """Where the held batches may be cut: after a batch whose steps the rank has left
        (every one, ``final``: it ended), and after which no record comes at one of those
        steps (held, or the batch that came next, from ``next_low`` on)."""
        held = stream.held
        lows = [batch.low for batch in held]
        if next_low is not None:
            lows.append(next_low)
        for i in range(len(lows) - 2, -1, -1):  # the lowest step from each batch on
            lows[i] = min(lows[i], lows[i + 1])
        cuts = []
        top = 0
        for i, batch in enumerate(held):
            top = max(top, batch.high)
            if top >= stream.floor and not final:
                break
            if i + 1 == len(lows) or lows[i + 1] > top:
                cuts.append(i + 1)
        return cuts

    def _cut(
        self, identity: bytes, stream: _Stream, count: int, next_low: int | None = None
    ) -> None:
        """Fold the first ``count`` held batches of ``stream`` into the next Folded."""
        if not count:
            return
        batches, stream.held = stream.held[:count], stream.held[count:]
        parts: dict[int, dict[str, Any]] = {}
        steps = self._steps
        for batch in batches:
            for step, committed, data in batch.records:
                part = parts.get(step)
                if part is None:
                    parts[step] = data
                else:
                    part.update(data)  # the same rank at the same step: later keys win (as
                    # ordering.Row does: nested dicts are replaced whole, then flattened)
                fold = steps.get(step)
                if fold is None:
                    fold = steps[step] = _Step()
                fold.records += 1
                fold.committed = fold.committed or committed
        rank = stream.rank
        assert rank is not None  # (held only once the Welcome named it)
        for step, part in parts.items():
            self._fold_part(steps[step], rank, step, flatten(part))
        top = max(batch.high for batch in batches)
        stream.folded_through = max(stream.folded_through, top)
        # The rank logs nothing below its floor from now on, but records still held here, or
        # about to go as they came, may be below it: the root must not pass them.
        lows = [batch.low for batch in stream.held]
        floor = min([stream.floor, *lows, *([] if next_low is None else [next_low])])
        entry = self._entries.get(identity)
        if entry is None:
            self._entries[identity] = [identity, batches[0].first, batches[-1].end, top, floor]
        else:
            entry[2], entry[3], entry[4] = batches[-1].end, max(entry[3], top), max(entry[4], floor)
        self.folded += count

    def _fold_part(self, fold: _Step, rank: int, step: int, part: dict[str, Any]) -> None:
        """One rank's whole step: what a state reduces exactly into the states, the rest
        as it came (media, strings, spread keys, ...)."""
        states = fold.states
        names = self._names
        rest: dict[str, Any] = {}
        for key, value in part.items():
            kind = type(value)
            name = names(key) if names is not None else "?"
            if (name is not None and name not in MERGEABLE) or not (
                kind is float or (kind is int and -columns.INT_LIMIT <= value <= columns.INT_LIMIT)
            ):
                rest[key] = value
                continue
            state = states.get(key)
            if state is None:
                states[key] = KeyState(rank, value)
            else:
                state.add(rank, value)
            if kind is float and value - value != 0.0:
                self._nonfinite_at(rank, step, key, value)
        if rest:
            fold.parts.append([rank, rest])

    def _nonfinite_at(self, rank: int, step: int, key: str, value: float) -> None:
        self._nonfinite += 1
        if (rank, key) not in self._seen and len(self._seen) < _SAID_MAX:
            self._seen.add((rank, key))
            self._said.append([rank, step, key, repr(value)])

    def _release(self, identity: bytes, stream: _Stream) -> Out:
        """Every held batch of ``stream``, as it came (its steps go so from now on)."""
        out = [[identity, batch.frame] for batch in stream.held]
        for batch in stream.held:
            stream.raw_through = max(stream.raw_through, batch.high)
        stream.held = []
        return out

    def _flush_for(self, identity: bytes) -> Out:
        """The next Folded now, if it holds batches of this stream (they go first)."""
        return [self._take()] if identity in self._entries else []

    def _take(self) -> list[bytes]:
        keysets: dict[tuple[str, ...], int] = {}
        steps = []
        rows: list[columns.Row] = []
        for step, fold in sorted(self._steps.items()):
            which = -1
            if fold.states:
                keys = tuple(fold.states)
                which = keysets.setdefault(keys, len(keysets))
                rows += map(columns.state_row, fold.states.values())
            steps.append([step, fold.committed, fold.records, which, fold.parts])
        folded = Folded(
            list(self._entries.values()),
            steps,
            self._nonfinite,
            self._said,
            [list(keys) for keys in keysets],
            columns.pack(rows),
        )
        self._steps, self._entries, self._nonfinite, self._said = {}, {}, 0, []
        self._size = 0
        return [node_wire.encode_folded(folded)]
