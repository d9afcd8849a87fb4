"""The root's side of a node logger's pre-reduction (issue 38, ``_node/fold.py``): a
``Folded`` frame checked against each stream's numbering and taken whole or not at all (the
writer's side is ``intake.py``).

Whole or nothing, because a folded state cannot be taken in part: a frame that names a stream
this logger does not know (it restarted, and the node logger's frame was already on its way),
or numbers other than the stream's next ones, is refused, and every stream it names is asked
to say hello again: each resends what is not saved, as it came (a node never folds a resend),
and the root takes the numbers it has not taken. So exactly once holds through both hops.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from wandb_funnel._logger.events import EventQueue, FoldedRecords, Records
from wandb_funnel._logger.say import Drops
from wandb_funnel._protocol import columns
from wandb_funnel._protocol.messages import Folded

if TYPE_CHECKING:
    from wandb_funnel._logger.streams import Peer, Streams

# Each distinct key set once, so that the nodes' blocks of a step group by identity
# (``columns.merge``); forgotten past a bound in keys (a job whose key sets keep changing:
# blocks of equal key sets kept apart then still merge, by key, in ``columns.states``).
_KEYSETS: dict[tuple[str, ...], tuple[str, ...]] = {}
_keysets_keys = 0  # keys in all of them
_KEYSETS_MAX_KEYS = 100_000


def _interned(keysets: list[list[str]]) -> list[tuple[str, ...]]:
    global _keysets_keys
    out = []
    for keys in map(tuple, keysets):
        kept = _KEYSETS.get(keys)
        if kept is None:
            if _keysets_keys + len(keys) > _KEYSETS_MAX_KEYS:
                _KEYSETS.clear()
                _keysets_keys = 0
            kept = _KEYSETS[keys] = keys
            _keysets_keys += len(keys)
        out.append(kept)
    return out


def admit(streams: Streams, folded: Folded) -> tuple[list[Peer], FoldedRecords] | str:
    """The peers a ``Folded`` holds batches of, and what it hands the writer; or why it is
    refused. Nothing is changed here: the caller numbers the peers once it takes it."""
    peers: list[Peer] = []
    entries = []
    seen: set[bytes] = set()
    for identity, first, end, top, floor in folded.streams:
        peer = streams.peers.get(identity)
        if peer is None:
            return "a stream this logger does not know (yet)"
        if identity in seen or peer.ended:
            return "a stream named twice, or one that has ended"
        if first != peer.next_seq or first < peer.replay_until or first < peer.skip_below:
            return f"numbers {first}..{end} of rank {peer.rank}, not its next ({peer.next_seq})"
        seen.add(identity)
        peers.append(peer)
        entries.append((peer.rank, end, top, floor, end - first))
    keysets = _interned(folded.keysets)
    which = [step[3] for step in folded.steps if step[3] >= 0]
    try:
        blocks = iter(columns.unpack(keysets, which, folded.states))
    except ValueError as exc:
        return str(exc)
    steps: list[tuple[int, bool, int, columns.Block | None, list[list[Any]]]] = [
        (step, committed, records, next(blocks) if keyset >= 0 else None, parts)
        for step, committed, records, keyset, parts in folded.steps
    ]
    records = sum(entry[4] for entry in entries)
    if records != sum(step[2] for step in steps):
        return "its steps hold other records than its streams' numbers say"
    return peers, FoldedRecords(entries, steps, folded.nonfinite, folded.said, records)


def take(streams: Streams, events: EventQueue, drops: Drops, folded: Folded) -> str | None:
    """Take ``folded`` (its streams numbered, its records handed to the writer, or counted
    as dropped when the writer is that far behind); or why it is refused."""
    taken = admit(streams, folded)
    if isinstance(taken, str):
        return taken
    peers, event = taken
    now = time.monotonic()
    room = events.reserve(event.records)
    for peer, (_, end, _, _, count) in zip(peers, event.streams, strict=True):
        peer.next_seq, peer.last_seen = end, now
        if room:
            peer.received += count
        else:
            peer.dropped += count
            drops.count(count, "the logger's queue is full: wandb is slower than the workers", None)
            events.post(Records(peer.rank, [], end))  # its numbers are done with
    if room:
        events.post(event)
    return None
