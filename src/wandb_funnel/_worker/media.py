"""Media from any rank: the light types (``wf.Image``, ``wf.Histogram``, ``wf.Table``) and the
worker's half of the transport for them and for wandb's own media objects (the staging itself
is ``staging.py``'s, its names importable here).

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
from collections.abc import Iterable, Sequence
from typing import Any

from wandb_funnel._constants import ENV_MAX_MEDIA_BYTES
from wandb_funnel._protocol import codec

# Staging is staging.py's; its names stay importable here, where callers find them.
from wandb_funnel._worker.staging import Encoding as Encoding
from wandb_funnel._worker.staging import LightMedia, table_descriptor, too_big
from wandb_funnel._worker.staging import RecordPacker as RecordPacker
from wandb_funnel._worker.staging import RecordPackers as RecordPackers
from wandb_funnel._worker.staging import Stager as Stager
from wandb_funnel._worker.staging import is_media as is_media
from wandb_funnel._worker.staging import staging_dir_for as staging_dir_for

_MAX_HISTOGRAM_BINS = 512  # wandb.Histogram's limit
_TABLE_DEFAULT_COLUMNS = ["Input", "Output", "Expected"]  # wandb.Table's, when none are given


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


# ---- the light types ---------------------------------------------------------------------------


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


class Image(LightMedia):
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
            raise too_big(f"image file {path!r}", size, limit)
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
            raise too_big("image data", nbytes, limit)  # before encoding 10 GB
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
            raise too_big("encoded image", len(self._bytes), limit)
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


class Histogram(LightMedia):
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


class Table(LightMedia):
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
        return table_descriptor(self.columns, self.data, self.allow_mixed_types, self.log_mode)


def _pil() -> Any:
    try:
        from PIL import Image as PILImage
    except ImportError:
        raise TypeError(
            'wandb_funnel: images need the PIL package. To get it, run "pip install pillow".'
        ) from None
    return PILImage
