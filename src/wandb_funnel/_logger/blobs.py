"""Media files that arrive as bytes: chunks from ranks on other nodes, written into the
logger's staging directory by the receiver thread, ahead of the records that name them.

A file is written as ``name.part`` and renamed to ``name`` when its last chunk lands, so a
half-sent file is never taken for a whole one (a record naming it finds it missing: counted,
the row kept). What a rank never finished sending stays as ``.part`` until the staging folder
goes with the socket directory at close.

**Resent files.** A rank keeps a file's chunks with its unsaved records, and resends both to
a logger (or through a node logger) that restarted (``_worker/replay.py``). Names are unique
per item (pid, number, random), so a first chunk for a name already complete is that file
again: it and its later chunks are taken and skipped (``resent``), never written over; a
first chunk for a name left ``.part`` by a dead predecessor begins it again. Chunks are taken
only in order, each where the last one ended: a file with a hole is never completed.
"""

from __future__ import annotations

import os

from wandb_funnel._protocol.messages import Blob


class BlobWriter:
    """Writes chunks into ``directory``; called from the receiver thread only."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.bytes = 0  # accepted
        self.files = 0  # completed
        self.resent = 0  # chunks of files already complete, skipped
        self._skipping: set[str] = set()  # complete files whose resent chunks are arriving
        self._next: dict[str, int] = {}  # files begun here -> the offset of their next chunk

    def write(self, blob: Blob) -> bool:
        """Write one chunk; False for a chunk that cannot be taken (no staging directory, a
        name that is not a plain name, a later chunk for a file not begun here, or not where
        its last chunk ended)."""
        name = blob.name
        if (
            self.directory is None
            or not name
            or os.path.basename(name) != name
            or name[0] == "."
            or name.endswith(".part")
        ):
            return False
        part = os.path.join(self.directory, name + ".part")
        last = blob.offset + len(blob.data) == blob.total
        try:
            if blob.offset == 0:
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
                if os.path.exists(os.path.join(self.directory, name)):
                    return self._skip(name, last, begun=True)
                self._skipping.discard(name)
                fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            elif name in self._skipping:
                return self._skip(name, last, begun=False)
            elif self._next.get(name) != blob.offset:
                return False
            else:
                fd = os.open(part, os.O_WRONLY | os.O_NOFOLLOW)
            try:
                os.pwrite(fd, blob.data, blob.offset)
            finally:
                os.close(fd)
            if last:
                os.rename(part, os.path.join(self.directory, name))
                self._next.pop(name, None)
                self.files += 1
            else:
                self._next[name] = blob.offset + len(blob.data)
        except OSError:
            self._next.pop(name, None)
            return False
        self.bytes += len(blob.data)
        return True

    def _skip(self, name: str, last: bool, begun: bool) -> bool:
        """A chunk of a file already complete: taken, not written."""
        self.resent += 1
        if last:
            self._skipping.discard(name)
        elif begun:
            self._skipping.add(name)
        return True
