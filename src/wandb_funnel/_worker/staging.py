"""Staging a record's media, the worker's half of their transport (``media.py`` says how it
goes): each media value becomes a descriptor (``Encoding``), its file put where the logger
takes it by name (``Stager``: the funnel's staging directory, or bytes sent ahead of the
record from a rank on another node), within the bounds; and ``log()``'s packer, which stages
a record's media in the one pass that encodes it (``RecordPacker``).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack

from wandb_funnel import _private_dir
from wandb_funnel._constants import MEDIA_INFLIGHT_BYTES, REMOTE_MEDIA_BYTES
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import MEDIA_EXT
from wandb_funnel.sinks.wandb.objects import describe, wandb_class

_INFLIGHT_EXPIRY = 600.0  # seconds after which a staged file no longer counts in flight
_EXT = re.compile(r"(?:\.[\w-]{1,32}){0,3}")  # a staged file's extension, as the logger takes it


class LightMedia:
    """Base of the light types (``media.py``): each knows its descriptor."""

    def _descriptor(self, stager: Stager, enc: Encoding) -> dict[str, Any]:
        raise NotImplementedError


def is_media(value: Any) -> bool:
    return isinstance(value, LightMedia) or wandb_class(value) is not None


def too_big(what: str, size: int, limit: int) -> ValueError:
    return ValueError(
        f"wandb_funnel: {what} is {size} bytes, over max_media_bytes={limit}; log a smaller "
        f"one, or raise max_media_bytes"
    )


def table_descriptor(
    columns: list[Any], data: list[Any], mixed: bool, log_mode: str | None
) -> dict[str, Any]:
    return {
        "k": "table",
        "columns": list(columns),
        "data": [list(r) for r in data],
        "mixed": mixed,
        "log_mode": log_mode,
    }


class Encoding:
    """One ``log()``'s staging: the files it staged (removed if the record is then refused),
    the bytes it has for the logger (a rank on another node: sent once the record is good),
    and the descriptors it made, so that a re-pack stages nothing twice."""

    def __init__(self, stager: Stager) -> None:
        self.stager = stager
        self.staged: list[str] = []
        self.blobs: list[tuple[str, bytes]] = []
        self._made: dict[int, tuple[Any, Any]] = {}  # id(value) -> (value, ExtType)

    def default(self, value: Any) -> Any:
        """msgpack's ``default`` for a record holding media (numpy scalars too)."""
        known = self._made.get(id(value))
        if known is not None:
            return known[1]
        stager = self.stager
        if isinstance(value, LightMedia):
            desc = stager.guarded(lambda: value._descriptor(stager, self), value)
        else:
            name = wandb_class(value)
            if name is None:
                return codec.scalar_item(value)
            desc = stager.guarded(
                lambda: describe(
                    value,
                    name,
                    lambda path, ext, link: stager.stage_file(path, ext, self, link=link),
                    table_descriptor,
                ),
                value,
            )
        ext = msgpack.ExtType(
            MEDIA_EXT, msgpack.packb(desc, default=self.default, use_bin_type=True)
        )
        self._made[id(value)] = (value, ext)  # the value kept alive: its id stays its own
        return ext

    def rollback(self) -> None:
        """Remove the files staged for a ``log()`` that was then refused."""
        for path in self.staged:
            try:
                os.unlink(path)
            except OSError:
                pass
        self.staged, self.blobs = [], []


class RecordPacker:
    """One thread's packer of one Run's records: a record is encoded in one pass, its media
    included. The packer's default (``hook``) makes numpy scalars and 0-d tensors numbers, and
    from a record's first media value on stages each one and packs its descriptor (an
    ``Encoding``, left in ``pending`` for the caller: its blobs to send, or its files to roll
    back). A record without media pays nothing for it."""

    __slots__ = ("_spare", "_stager", "hook", "packer", "pending")

    def __init__(self, stager: Callable[[], Stager]) -> None:
        self._stager = stager
        self.hook = self.default  # bound once: log() passes it on every call
        self.packer = msgpack.Packer(default=self.hook, use_bin_type=True)
        self._spare: msgpack.Packer | None = None
        self.pending: Encoding | None = None  # the staging of the record being packed

    def default(self, value: Any) -> Any:
        """msgpack's ``default`` for a record (the same bytes as ``Encoding.default``)."""
        try:
            return codec.scalar_item(value)
        except TypeError:
            if not is_media(value):
                raise  # not a number either: the caller names the key
        enc = self.pending
        if enc is None:
            enc = self.pending = self._stager().encoding()
        # Staging runs Python code, where a signal handler may run and log: that record gets a
        # packer and an encoding of its own, never this record's half-packed buffer.
        packer, spare = self.packer, self._spare
        if spare is None:
            spare = msgpack.Packer(default=self.hook, use_bin_type=True)
        self.packer, self._spare, self.pending = spare, None, None
        try:
            return enc.default(value)
        finally:
            self.packer, self._spare, self.pending = packer, spare, enc

    def take(self) -> Encoding | None:
        """The staging of the record just packed (None: it held no media), handed over."""
        enc, self.pending = self.pending, None
        return enc

    def rollback(self) -> None:
        """The record was refused: remove what was staged for it."""
        enc = self.take()
        if enc is not None:
            enc.rollback()


class RecordPackers(threading.local):
    """A Run's ``RecordPacker`` for each thread that logs (``here``: this thread's)."""

    def __init__(self, stager: Callable[[], Stager]) -> None:
        self.here = RecordPacker(stager)


class Stager:
    """Puts this process's media files where the logger takes them, by name: into the
    funnel's staging directory, or (a rank on another node) as bytes sent ahead of the
    record. One per (process, funnel); thread-safe.
    """

    def __init__(
        self,
        directory: str | None,
        max_bytes: int,
        why_not: str = "",
        remote: bool = False,
    ) -> None:
        self.pid = os.getpid()
        # None: no shared disk with the logger (another node): with ``remote`` the bytes go
        # over the connection (Encoding.blobs), else the media are dropped for ``why_not``.
        self.directory = directory
        self.remote = remote
        self.why_not = why_not
        self.max_bytes = max_bytes
        self._inflight: dict[str, tuple[int, float]] = {}  # path -> (size, when staged)
        self._inflight_bytes = 0
        self._swept = 0.0
        self._lock = threading.Lock()
        self._seq = 0
        self.dropped = 0

    def encoding(self) -> Encoding:
        return Encoding(self)

    def _room(self, size: int) -> bool:
        """True when ``size`` more bytes fit the in-flight bound (caller holds the lock).
        Over it, forget what the logger has taken (wandb moved it away), and what has waited
        past ``_INFLIGHT_EXPIRY`` (a record lost on the way: its file goes at close)."""
        if self._inflight_bytes + size <= MEDIA_INFLIGHT_BYTES:
            return True
        now = time.monotonic()
        if now < self._swept + 1.0:
            return False  # swept within the last second: a stat per file is not free
        self._swept = now
        for path, (length, when) in list(self._inflight.items()):
            if now - when > _INFLIGHT_EXPIRY or not os.path.exists(path):
                del self._inflight[path]
                self._inflight_bytes -= length
        return self._inflight_bytes + size <= MEDIA_INFLIGHT_BYTES

    def _new_name(self, ext: str) -> str:
        """``{pid}-{seq}-{8 hex}{ext}``: the form the logger accepts (``_logger/media.py``)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        return f"{os.getpid()}-{seq}-{os.urandom(4).hex()}{ext if _EXT.fullmatch(ext) else ''}"

    def _reserve(self, path: str | None, size: int) -> None:
        """Check one item against the bounds and count it in flight, or raise."""
        if size > self.max_bytes:
            raise too_big("media item", size, self.max_bytes)
        if self.directory is None:
            if not self.remote:
                raise _DroppedError(self.why_not)
            if size > REMOTE_MEDIA_BYTES:
                raise _DroppedError(
                    f"a media item of {size} bytes is over the {REMOTE_MEDIA_BYTES} a rank on "
                    f"another node sends"
                )
            return  # then bounded by the connection's queue
        assert path is not None
        with self._lock:
            if not self._room(size):
                raise _DroppedError(
                    f"{self._inflight_bytes} bytes of media are waiting for the logger "
                    f"(limit {MEDIA_INFLIGHT_BYTES})"
                )
            self._inflight[path] = (size, time.monotonic())
            self._inflight_bytes += size

    def stage_bytes(self, data: bytes, ext: str, enc: Encoding) -> str:
        name = self._new_name(ext)
        if self.directory is None:
            self._reserve(None, len(data))
            enc.blobs.append((name, data))
            return name
        path = os.path.join(self.directory, name)
        self._reserve(path, len(data))
        enc.staged.append(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return name

    def stage_file(
        self, source: str, ext: str, enc: Encoding, checked: bool = True, link: bool = False
    ) -> str:
        """``source`` staged: copied (a snapshot of the user's file, as wandb takes one at
        log time), or hard-linked when ``link`` (wandb's own temporary files, never written
        again). ``checked=False`` for the user's artifacts and saved files: no size cap and
        no in-flight bound."""
        if self.directory is None:
            if checked:
                self._reserve(None, os.path.getsize(source))  # before reading it
            with open(source, "rb") as f:
                return self.stage_bytes(f.read(), ext, enc)
        name = self._new_name(ext)
        path = os.path.join(self.directory, name)
        if checked:
            self._reserve(path, os.path.getsize(source))
        enc.staged.append(path)
        if link:
            try:
                os.link(source, path)
                return name
            except OSError:
                pass  # another filesystem: copied
        import shutil

        shutil.copyfile(source, path)
        os.chmod(path, 0o600)
        return name

    def guarded(self, make: Callable[[], dict[str, Any]], value: Any) -> dict[str, Any]:
        """``make()``, or a counted drop: the bound, no way to the logger, or a staging
        directory gone (the funnel closed)."""
        try:
            return make()
        except (_DroppedError, OSError) as drop:
            with self._lock:
                self.dropped += 1
            return {"k": "dropped", "what": type(value).__name__, "why": str(drop)}


class _DroppedError(Exception):
    """A media value that cannot be staged now: it travels as a counted drop."""


def staging_dir_for(address: str) -> str | None:
    """The staging directory of the funnel at ``address``: beside its IPC socket on the
    logger's host; None over TCP (another node: no shared disk)."""
    directory = _private_dir.of_address(address)
    return None if directory is None else _private_dir.path(directory, _private_dir.MEDIA)
