"""Media from any rank: the light types (``wf.Image``, ``wf.Histogram``, ``wf.Table``) and the
worker's half of the transport for them and for wandb's own media objects.

A media value crosses the wire as a small descriptor (``MEDIA_EXT``, see
``_protocol/messages.py``); its bytes never ride in the record batches. On the logger's host a
file is handed over by name: written (or hard-linked) into the funnel's staging directory, a
``media`` folder inside its private 0700 socket directory, which the owner and the logger
remove on every exit path. The logger turns each descriptor back into the wandb object and
logs that, so the run records media exactly as plain wandb does; wandb then moves the staged
file into the run's ``media/`` folder.

The encoding happens where the data is: a ``wf.Image`` is a PNG by the time it is logged, a
``wf.Histogram`` holds its bins. A process that only uses the light types never imports wandb.
wandb's own objects are carried by their state (their file, caption, size, hash, boxes,
masks), never re-encoded.

Bounds: an item over ``max_media_bytes`` is refused at the call (ValueError). Media a process
has staged that the logger has not taken yet are bounded (``MEDIA_INFLIGHT_BYTES``); past that,
and on a node without the logger's disk, a media value is dropped and counted (the logger
adds it to ``funnel/dropped_media``), never waited for.
"""

from __future__ import annotations

import io
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgpack

from wandb_funnel._constants import ENV_MAX_MEDIA_BYTES, MEDIA_DIR, MEDIA_INFLIGHT_BYTES
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import MEDIA_EXT

# wandb's file-backed media, carried by their state. Their module must be wandb's own.
FILE_MEDIA = frozenset({
    "Image", "Html", "Video", "Audio", "Object3D", "Molecule",
    "ImageMask", "BoundingBoxes2D", "Classes",
})
# State that stays behind: the run or artifact it is bound to, a decoded PIL image, and the
# mask array (its PNG is the file that travels).
_LOCAL_STATE = frozenset({"_run", "_artifact_source", "_artifact_target", "_image", "_path"})
_MAX_HISTOGRAM_BINS = 512  # wandb.Histogram's limit
_EXT = re.compile(r"(?:\.[\w-]{1,32}){0,3}")  # a staged file's extension, as the logger takes it
_TABLE_DEFAULT_COLUMNS = ["Input", "Output", "Expected"]  # wandb.Table's, when none are given


def _wandb_class(value: Any) -> str | None:
    """The class name of one of wandb's media objects, else None (no wandb import)."""
    kind = type(value)
    if not kind.__module__.startswith("wandb."):
        return None
    name = kind.__name__
    if name in FILE_MEDIA or name in ("Histogram", "Table", "CustomChart"):
        return name
    return None


def is_media(value: Any) -> bool:
    return isinstance(value, _LightMedia) or _wandb_class(value) is not None


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

    def _descriptor(self, stager: Stager, staged: list[str]) -> dict[str, Any]:
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
    raise ValueError(
        f"wandb_funnel: an image needs 1, 3 or 4 channels, got shape {tuple(shape)}"
    )


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

    def _init_from_data(self, data: Any, mode: str | None, file_type: str | None,
                        limit: int) -> None:
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

    def _descriptor(self, stager: Stager, staged: list[str]) -> dict[str, Any]:
        ext = "." + self.format
        if self._bytes is not None:
            name = stager.stage_bytes(self._bytes, ext, staged)
        else:
            assert self._src_path is not None
            name = stager.stage_file(self._src_path, ext, staged)
        # The state wandb.Image has after its own __init__, file aside.
        state = {
            "_caption": self.caption, "_grouping": self.grouping, "_width": self.width,
            "_height": self.height, "_classes": None, "_boxes": None, "_masks": None,
            "_file_type": None, "format": self.format, "_extension": None,
            "_sha256": self._sha, "_size": self._size,
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

    def _descriptor(self, stager: Stager, staged: list[str]) -> dict[str, Any]:
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

    def _descriptor(self, stager: Stager, staged: list[str]) -> dict[str, Any]:
        return _table_descriptor(self.columns, self.data, self.allow_mixed_types, self.log_mode)


def _table_descriptor(
    columns: list[Any], data: list[Any], mixed: bool, log_mode: str | None
) -> dict[str, Any]:
    return {"k": "table", "columns": list(columns), "data": [list(r) for r in data],
            "mixed": mixed, "log_mode": log_mode}


def _pil() -> Any:
    try:
        from PIL import Image as PILImage
    except ImportError:
        raise TypeError(
            'wandb_funnel: images need the PIL package. To get it, run "pip install pillow".'
        ) from None
    return PILImage


# ---- wandb's own objects -----------------------------------------------------------------------


def _wandb_descriptor(
    value: Any, name: str, stager: Stager, staged: list[str]
) -> dict[str, Any]:
    if name == "Histogram":
        return {"k": "histogram", "histogram": list(value.histogram), "bins": list(value.bins)}
    if name == "Table":
        mixed = "Union" in type(getattr(value, "_column_types", None)).__name__
        return _table_descriptor(value.columns, value.data, mixed, getattr(value, "log_mode", None))
    if name == "CustomChart":
        table = value.table
        spec = value.spec
        return {
            "k": "chart",
            "table": _table_descriptor(table.columns, table.data, False, None),
            "spec": {
                "spec_name": spec.spec_name, "fields": dict(spec.fields),
                "string_fields": dict(spec.string_fields or {}), "key": spec.key,
                "panel_type": spec.panel_type, "split_table": spec.split_table,
            },
        }
    state: dict[str, Any] = {}
    for attr, item in vars(value).items():
        if attr in _LOCAL_STATE:
            continue
        if attr == "_val" and isinstance(item, dict) and "mask_data" in item:
            state[attr] = {k: v for k, v in item.items() if k != "mask_data"}
        else:
            state[attr] = item
    desc: dict[str, Any] = {"k": "file", "c": name, "s": state}
    path = getattr(value, "_path", None)
    if isinstance(path, str):
        if os.path.isfile(path):
            extension = getattr(value, "_extension", None) or os.path.splitext(path)[1]
            desc["f"] = stager.stage_file(path, extension, staged)
        elif "://" in path:
            desc["ref"] = path  # an image by reference (a URL): no file travels
        else:
            raise ValueError(f"wandb_funnel: the file of this {name} is gone: {path!r}")
    return desc


# ---- staging -----------------------------------------------------------------------------------


class Stager:
    """Puts this process's media files into the funnel's staging directory, by name.

    One per (process, funnel); thread-safe. ``stage_*`` return the name the descriptor
    carries and add the path to the caller's ``staged`` list, so that the files of a ``log()``
    that is then refused can be removed (``rollback``).
    """

    def __init__(
        self,
        directory: str | None,
        max_bytes: int,
        why_not: str = "",
        send_blob: Callable[[str, bytes], bool] | None = None,
    ) -> None:
        self.pid = os.getpid()
        # None: no shared disk with the logger (another node): files are sent as bytes
        # through ``send_blob`` (the stream's), or, without one, dropped for ``why_not``.
        self.directory = directory
        self._send_blob = send_blob
        self.why_not = why_not
        self.max_bytes = max_bytes
        self._inflight: deque[tuple[str, int]] = deque()  # (path, size), oldest first
        self._inflight_bytes = 0
        self._lock = threading.Lock()
        self._seq = 0
        self.dropped = 0
        if directory is not None:
            os.makedirs(directory, mode=0o700, exist_ok=True)

    def _room(self, size: int) -> bool:
        """Forget what the logger has taken (wandb moved it away); True when ``size`` fits."""
        while self._inflight and not os.path.exists(self._inflight[0][0]):
            self._inflight_bytes -= self._inflight.popleft()[1]
        return self._inflight_bytes + size <= MEDIA_INFLIGHT_BYTES

    def _new_name(self, ext: str) -> str:
        """``{pid}-{seq}-{8 hex}{ext}``: the form the logger accepts (``_logger/media.py``)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        return f"{os.getpid()}-{seq}-{os.urandom(4).hex()}{ext if _EXT.fullmatch(ext) else ''}"

    def _new_path(self, ext: str) -> tuple[str, str]:
        assert self.directory is not None
        name = self._new_name(ext)
        return name, os.path.join(self.directory, name)

    def _check(self, size: int) -> None:
        if size > self.max_bytes:
            raise _too_big("media item", size, self.max_bytes)
        if self.directory is None:
            if self._send_blob is None:
                raise _DroppedError(self.why_not)
            return  # bounded by the connection's queue: see _sent
        if not self._room(size):
            raise _DroppedError(
                f"{self._inflight_bytes} bytes of media are waiting for the logger "
                f"(limit {MEDIA_INFLIGHT_BYTES})"
            )

    def _staged(self, path: str, size: int, staged: list[str]) -> None:
        with self._lock:
            self._inflight.append((path, size))
            self._inflight_bytes += size
        staged.append(path)

    def _sent(self, data: bytes, ext: str) -> str:
        """``data`` sent to the logger as a file of its own staging directory."""
        assert self._send_blob is not None
        name = self._new_name(ext)
        if not self._send_blob(name, data):
            raise _DroppedError("the connection to the logger is full (or closed)")
        return name

    def stage_bytes(self, data: bytes, ext: str, staged: list[str]) -> str:
        self._check(len(data))
        if self.directory is None:
            return self._sent(data, ext)
        name, path = self._new_path(ext)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        self._staged(path, len(data), staged)
        return name

    def stage_file(self, source: str, ext: str, staged: list[str], checked: bool = True) -> str:
        """``source`` staged (hard-linked, or copied across filesystems); ``checked=False``
        for the user's own files (artifacts, save): no size cap, no in-flight bound."""
        size = os.path.getsize(source)
        if checked:
            self._check(size)
        if self.directory is None:
            with open(source, "rb") as f:
                return self._sent(f.read(), ext)
        name, path = self._new_path(ext)
        try:
            os.link(source, path)  # same filesystem: no copy
        except OSError:
            import shutil

            shutil.copyfile(source, path)
            os.chmod(path, 0o600)
        self._staged(path, size, staged)
        return name

    @staticmethod
    def rollback(staged: list[str]) -> None:
        """Remove the files staged for a ``log()`` that was then refused."""
        for path in staged:
            try:
                os.unlink(path)
            except OSError:
                pass

    def packer_default(self, staged: list[str]) -> Any:
        """msgpack's ``default`` for a record holding media (numpy scalars too); the paths it
        stages are appended to ``staged``."""

        def default(value: Any) -> Any:
            if isinstance(value, _LightMedia):
                desc = self._guarded(lambda: value._descriptor(self, staged), value)
            else:
                name = _wandb_class(value)
                if name is None:
                    return codec.scalar_item(value)
                desc = self._guarded(lambda: _wandb_descriptor(value, name, self, staged), value)
            packed = msgpack.packb(desc, default=default, use_bin_type=True)
            return msgpack.ExtType(MEDIA_EXT, packed)

        return default

    def _guarded(self, make: Callable[[], dict[str, Any]], value: Any) -> dict[str, Any]:
        try:
            return make()
        except _DroppedError as drop:
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
    return os.path.join(os.path.dirname(address[len("ipc://"):]), MEDIA_DIR)
