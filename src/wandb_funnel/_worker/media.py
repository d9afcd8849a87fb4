"""Media from any rank: the light types (``wf.Image``, ``wf.Histogram``, ``wf.Table``) and the
worker's half of the transport for them and for wandb's own media objects.

A media value crosses the wire as a small descriptor (``MEDIA_EXT``, see
``_protocol/messages.py``); its bytes never ride in the record batches. On the logger's host a
file is handed over by name: written, copied (a user's file) or hard-linked (wandb's own
temporary file) into the funnel's staging directory, a
``media`` folder inside its private 0700 socket directory, which the owner and the logger
remove on every exit path. The logger's wandb sink turns each descriptor back into the wandb
object (``sinks/wandb/media.py``; wandb's own objects are read by ``sinks/wandb/objects.py``,
without importing wandb) and logs that, so the run records media exactly as plain wandb
does; wandb then moves the staged file into the run's ``media/`` folder.

The encoding happens where the data is: a ``wf.Image`` is a PNG by the time it is logged, a
``wf.Histogram`` holds its bins. A process that only uses the light types never imports wandb.
wandb's own objects are carried by their state (their file, caption, size, hash, boxes,
masks), never re-encoded.

Bounds: an item over ``max_media_bytes`` is refused at the call (ValueError). Media a process
has staged that the logger has not taken yet are bounded (``MEDIA_INFLIGHT_BYTES``); past that,
and on a node without the logger's disk, a media value is dropped and counted (the logger
adds it to ``_funnel/dropped_media``), never waited for.
"""

from __future__ import annotations

import io
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgpack

from wandb_funnel._constants import (
    ENV_MAX_MEDIA_BYTES,
    MEDIA_DIR,
    MEDIA_INFLIGHT_BYTES,
    REMOTE_MEDIA_BYTES,
)
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import MEDIA_EXT
from wandb_funnel.sinks.wandb.objects import describe, wandb_class

_MAX_HISTOGRAM_BINS = 512  # wandb.Histogram's limit
_INFLIGHT_EXPIRY = 600.0  # seconds after which a staged file no longer counts in flight
_EXT = re.compile(r"(?:\.[\w-]{1,32}){0,3}")  # a staged file's extension, as the logger takes it
_TABLE_DEFAULT_COLUMNS = ["Input", "Output", "Expected"]  # wandb.Table's, when none are given


def is_media(value: Any) -> bool:
    return isinstance(value, _LightMedia) or wandb_class(value) is not None


def contains_media(data: Any, depth: int = 0) -> bool:
    """Whether a log dict holds a media value anywhere (only asked after a plain pack failed)."""
    if depth > codec.MAX_NESTING:
        return False
    if isinstance(data, dict):
        return any(contains_media(v, depth + 1) for v in data.values())
    if isinstance(data, (list, tuple)):
        return any(contains_media(v, depth + 1) for v in data)
    return is_media(data)


def max_media_bytes() -> int:
    """The per-item limit of the funnel this process logs to (the default without one)."""
    from wandb_funnel._constants import DEFAULT_MAX_MEDIA_BYTES

    raw = os.environ.get(ENV_MAX_MEDIA_BYTES, "")
    return int(raw) if raw.isdigit() else DEFAULT_MAX_MEDIA_BYTES


def _too_big(what: str, size: int, limit: int) -> ValueError:
    return ValueError(
        f"wandb_funnel: {what} is {size} bytes, over max_media_bytes={limit}; log a smaller "
        f"one, or raise max_media_bytes"
    )


# ---- the light types ---------------------------------------------------------------------------


class _LightMedia:
    """Base of the light types: each knows its descriptor."""

    def _descriptor(self, stager: Stager, enc: Encoding) -> dict[str, Any]:
        raise NotImplementedError


def _sha256(data: bytes) -> str:
    import hashlib  # here: a worker's import stays free of hashlib and OpenSSL

    return hashlib.sha256(data).hexdigest()


def _guess_mode(shape: Sequence[int], channels_first: bool, file_type: str | None) -> str:
    # wandb.Image.guess_mode, for the same result.
    channels = shape[0] if channels_first else shape[-1]
    if len(shape) == 2 or channels == 1:
        return "L"
    if channels == 3:
        return "RGB"
    if channels == 4:
        return "RGB" if file_type in ("jpg", "jpeg") else "RGBA"
    raise ValueError(f"wandb_funnel: an image needs 1, 3 or 4 channels, got shape {tuple(shape)}")


class Image(_LightMedia):
    """An image for the run, encoded here: ``wandb.Image``'s common arguments, without wandb.

    Args:
        data_or_path: a numpy array (height, width[, channels]), a torch tensor (channels,
            height, width), a PIL image, or the path of an image file. Array values are
            taken as 0-255, as wandb takes them.
        mode: the PIL mode (``"L"``, ``"RGB"``, ``"RGBA"``); guessed from the channels.
        caption: shown under the image.
        grouping: wandb's grouping number.
        file_type: ``"png"`` (default), ``"jpg"``, ``"jpeg"`` or ``"bmp"``.

    Boxes, masks and classes need ``wandb.Image`` (which the funnel carries too).

    Raises:
        TypeError: data of a kind an image cannot be made from, or boxes/masks/classes.
        ValueError: a bad shape or file type, or an image over ``max_media_bytes``.
        FileNotFoundError: a path that does not exist.
    """

    def __init__(
        self,
        data_or_path: Any,
        mode: str | None = None,
        caption: str | None = None,
        grouping: int | None = None,
        classes: Any = None,
        boxes: Any = None,
        masks: Any = None,
        file_type: str | None = None,
    ) -> None:
        if classes is not None or boxes is not None or masks is not None:
            raise TypeError(
                "wandb_funnel: wf.Image takes no classes, boxes or masks; use wandb.Image for "
                "those (the funnel carries it from any rank too)"
            )
        if caption is not None and not isinstance(caption, str):
            raise TypeError(f"wandb_funnel: caption must be a str, got {caption!r:.60}")
        self.caption = caption
        self.grouping = grouping
        limit = max_media_bytes()
        self._src_path: str | None = None
        if isinstance(data_or_path, (str, os.PathLike)):
            self._init_from_path(os.fspath(data_or_path), limit)
        else:
            self._init_from_data(data_or_path, mode, file_type, limit)

    def _init_from_path(self, path: str, limit: int) -> None:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"wandb_funnel: no image file at {path!r}")
        size = os.path.getsize(path)
        if size > limit:
            raise _too_big(f"image file {path!r}", size, limit)
        pil = _pil()
        with pil.open(path) as img:  # reads the header only: no decode
            self.width, self.height = img.size
        self.format = os.path.splitext(path)[1][1:]
        with open(path, "rb") as f:
            self._sha = _sha256(f.read())
        self._size = size
        self._src_path = path
        self._bytes: bytes | None = None

    def _init_from_data(
        self, data: Any, mode: str | None, file_type: str | None, limit: int
    ) -> None:
        fmt = file_type or "png"
        if fmt not in ("png", "jpg", "jpeg", "bmp"):
            raise ValueError(
                f"wandb_funnel: file_type must be one of png, jpg, jpeg, bmp, got {fmt!r}"
            )
        pil = _pil()
        nbytes = getattr(data, "nbytes", None)
        if isinstance(nbytes, int) and nbytes > limit:
            raise _too_big("image data", nbytes, limit)  # before encoding 10 GB
        if isinstance(data, pil.Image):
            image = data
        elif type(data).__module__.startswith("torch"):
            import numpy as np

            tensor = data.detach()
            if str(tensor.dtype) == "torch.uint8":
                tensor = tensor.to(float)
            mode = mode or _guess_mode(tuple(tensor.shape), True, file_type)
            array = tensor.permute(1, 2, 0).cpu().numpy().astype(np.uint8)
            if array.ndim > 2:
                array = array.squeeze()
            image = pil.fromarray(array).convert(mode)
        elif hasattr(data, "ndim") and hasattr(data, "astype"):
            import numpy as np

            array = data.squeeze() if data.ndim > 2 else data
            mode = mode or _guess_mode(array.shape, False, file_type)
            image = pil.fromarray(array.astype(np.uint8)).convert(mode)
        else:
            raise TypeError(
                f"wandb_funnel: wf.Image takes a numpy array, a torch tensor, a PIL image or a "
                f"path, got {type(data).__name__}"
            )
        out = io.BytesIO()
        image.save(out, format={"jpg": "JPEG"}.get(fmt, fmt.upper()), transparency=None)
        self._bytes = out.getvalue()
        if len(self._bytes) > limit:
            raise _too_big("encoded image", len(self._bytes), limit)
        self.width, self.height = image.size
        self.format = fmt
        self._sha = _sha256(self._bytes)
        self._size = len(self._bytes)

    def _descriptor(self, stager: Stager, enc: Encoding) -> dict[str, Any]:
        ext = "." + self.format
        if self._bytes is not None:
            name = stager.stage_bytes(self._bytes, ext, enc)
        else:
            assert self._src_path is not None
            name = stager.stage_file(self._src_path, ext, enc)
        # The state wandb.Image has after its own __init__, file aside.
        state = {
            "_caption": self.caption,
            "_grouping": self.grouping,
            "_width": self.width,
            "_height": self.height,
            "_classes": None,
            "_boxes": None,
            "_masks": None,
            "_file_type": None,
            "format": self.format,
            "_extension": None,
            "_sha256": self._sha,
            "_size": self._size,
        }
        return {"k": "file", "c": "Image", "f": name, "s": state}

    def __repr__(self) -> str:
        return f"<wf.Image {self.width}x{self.height} {self.format}>"


class Histogram(_LightMedia):
    """A histogram, binned here: ``wandb.Histogram``'s arguments, without wandb.

    Raises:
        ValueError: neither or both inputs, more than 512 bins, counts and edges that do not
            match.
    """

    def __init__(
        self,
        sequence: Sequence[Any] | None = None,
        np_histogram: tuple[Any, Any] | None = None,
        num_bins: int = 64,
    ) -> None:
        if np_histogram is not None:
            if len(np_histogram) != 2:
                raise ValueError(
                    "wandb_funnel: np_histogram must be (counts, bin_edges), as np.histogram "
                    "returns"
                )
            counts, edges = np_histogram
        elif sequence is not None:
            import numpy as np

            counts, edges = np.histogram(sequence, bins=num_bins)
        else:
            raise ValueError("wandb_funnel: Histogram needs a sequence or np_histogram")
        self.histogram = counts.tolist() if hasattr(counts, "tolist") else list(counts)
        self.bins = edges.tolist() if hasattr(edges, "tolist") else list(edges)
        if len(self.histogram) > _MAX_HISTOGRAM_BINS:
            raise ValueError("wandb_funnel: the maximum length of a histogram is 512")
        if len(self.histogram) + 1 != len(self.bins):
            raise ValueError(
                f"wandb_funnel: a histogram of {len(self.histogram)} counts needs "
                f"{len(self.histogram) + 1} bin edges, got {len(self.bins)}"
            )

    def _descriptor(self, stager: Stager, enc: Encoding) -> dict[str, Any]:
        return {"k": "histogram", "histogram": self.histogram, "bins": self.bins}


class Table(_LightMedia):
    """A table: ``wandb.Table``'s columns and rows, cells of numbers, strings and images.

    Raises:
        ValueError: a row whose length does not match the columns.
        TypeError: columns that are not a list of str.
    """

    def __init__(
        self,
        columns: Sequence[str] | None = None,
        data: Iterable[Sequence[Any]] | None = None,
        rows: Iterable[Sequence[Any]] | None = None,
        allow_mixed_types: bool = False,
        log_mode: str | None = "IMMUTABLE",
    ) -> None:
        if columns is None:
            columns = list(_TABLE_DEFAULT_COLUMNS)
        if isinstance(columns, str) or not all(isinstance(c, (str, int)) for c in columns):
            raise TypeError(f"wandb_funnel: Table columns must be a list of str, got {columns!r}")
        self.columns = list(columns)
        self.data: list[list[Any]] = []
        self.allow_mixed_types = allow_mixed_types
        self.log_mode = log_mode
        for row in data if data is not None else (rows or ()):
            self.add_data(*row)

    def add_data(self, *data: Any) -> None:
        """Add one row."""
        if len(data) != len(self.columns):
            raise ValueError(
                f"wandb_funnel: this table has {len(self.columns)} columns "
                f"({', '.join(map(str, self.columns))}), the row has {len(data)} values"
            )
        self.data.append(list(data))

    def _descriptor(self, stager: Stager, enc: Encoding) -> dict[str, Any]:
        return _table_descriptor(self.columns, self.data, self.allow_mixed_types, self.log_mode)


def _table_descriptor(
    columns: list[Any], data: list[Any], mixed: bool, log_mode: str | None
) -> dict[str, Any]:
    return {
        "k": "table",
        "columns": list(columns),
        "data": [list(r) for r in data],
        "mixed": mixed,
        "log_mode": log_mode,
    }


def _pil() -> Any:
    try:
        from PIL import Image as PILImage
    except ImportError:
        raise TypeError(
            'wandb_funnel: images need the PIL package. To get it, run "pip install pillow".'
        ) from None
    return PILImage


# ---- staging -----------------------------------------------------------------------------------


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
        if isinstance(value, _LightMedia):
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
                    _table_descriptor,
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
            raise _too_big("media item", size, self.max_bytes)
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
    if not address.startswith("ipc://"):
        return None
    return os.path.join(os.path.dirname(address[len("ipc://") :]), MEDIA_DIR)
