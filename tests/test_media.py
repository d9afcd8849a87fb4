"""Media, the pure parts: the light types' checks, staging and its bounds, the wire form, the
logger's checks on a descriptor, and the table and histogram reducers. End to end (real
processes, the run read back, compared with plain wandb): tests/processes/test_media.py."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np
import pytest

import wandb_funnel as wf
from wandb_funnel._logger.media import MediaFiles, count_media, has_media
from wandb_funnel._logger.ordering import Row
from wandb_funnel._logger.reduce import RowBuilder
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import MediaRef, RecordBatch
from wandb_funnel._worker import media
from wandb_funnel.sinks.refs import BadMediaError, materialize
from wandb_funnel.sinks.wandb.media import Maker


def _stager(tmp_path: pathlib.Path, max_bytes: int = 1 << 20) -> media.Stager:
    (tmp_path / "media").mkdir(mode=0o700, exist_ok=True)  # the owner makes it, at start
    return media.Stager(str(tmp_path / "media"), max_bytes)


def _encode(
    stager: media.Stager, data: dict[str, Any], max_record: int = 1 << 20
) -> tuple[bytes, list[str]]:
    return _encoding(stager, data, max_record)[:2]


def _encoding(
    stager: media.Stager, data: dict[str, Any], max_record: int = 1 << 20
) -> tuple[bytes, list[str], list[tuple[str, bytes]]]:
    enc = stager.encoding()
    try:
        packed = codec.encode_record(0, True, data, max_record, enc.default)
    except BaseException:
        enc.rollback()
        raise
    return packed, enc.staged, enc.blobs


def _decode(packed: bytes) -> dict[str, Any]:
    batch = codec.decode(codec.encode_batch(0, [packed]), 1 << 22)
    assert isinstance(batch, RecordBatch)
    data: dict[str, Any] = batch.records[0][2]
    return data


# ---- the light types: bad input is refused where it is made ------------------------------


def test_an_image_over_max_media_bytes_is_refused_before_it_is_encoded() -> None:
    huge = np.broadcast_to(np.uint8(0), (100_000, 100_000, 1))  # 10 GB, no memory behind it
    with pytest.raises(ValueError, match=r"10000000000 bytes, over max_media_bytes"):
        wf.Image(huge)


def test_image_inputs_are_checked_with_their_names(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match="no image file at"):
        wf.Image(str(tmp_path / "missing.png"))
    with pytest.raises(ValueError, match="1, 3 or 4 channels"):
        wf.Image(np.zeros((4, 4, 2), dtype=np.uint8))
    with pytest.raises(ValueError, match="file_type must be one of"):
        wf.Image(np.zeros((4, 4, 3), dtype=np.uint8), file_type="tiff")
    with pytest.raises(TypeError, match=r"use wandb\.Image for those"):
        wf.Image(np.zeros((4, 4, 3), dtype=np.uint8), boxes={})
    with pytest.raises(TypeError, match="takes a numpy array"):
        wf.Image([[1, 2], [3, 4]])


def test_table_rows_must_match_the_columns() -> None:
    table = wf.Table(columns=["a", "b"])
    with pytest.raises(ValueError, match=r"2 columns \(a, b\), the row has 3 values"):
        table.add_data(1, 2, 3)
    with pytest.raises(ValueError, match="the row has 1 values"):
        wf.Table(columns=["a", "b"], data=[[1]])
    with pytest.raises(TypeError, match="columns must be a list of str"):
        wf.Table(columns="ab")


def test_histograms_follow_wandb_rules() -> None:
    with pytest.raises(ValueError, match="maximum length of a histogram is 512"):
        wf.Histogram(list(range(1000)), num_bins=600)
    with pytest.raises(ValueError, match="needs 3 bin edges, got 2"):
        wf.Histogram(np_histogram=([1, 2], [0.0, 1.0]))
    with pytest.raises(ValueError, match="needs a sequence or np_histogram"):
        wf.Histogram()
    hist = wf.Histogram([0.0, 0.5, 1.0], num_bins=2)
    assert hist.histogram == [1, 2] and hist.bins == [0.0, 0.5, 1.0]


# ---- staging and the wire ----------------------------------------------------------------


def test_a_media_record_carries_descriptors_and_the_files_lie_staged(
    tmp_path: pathlib.Path,
) -> None:
    stager = _stager(tmp_path)
    table = wf.Table(columns=["i", "img"], data=[[1, wf.Image(np.zeros((4, 4, 3), np.uint8))]])
    packed, staged = _encode(
        stager, {"t": table, "img": wf.Image(np.ones((2, 2)) * 9), "loss": np.float32(0.5)}
    )
    assert len(staged) == 2 and all(os.path.isfile(p) for p in staged)
    assert oct(os.stat(staged[0]).st_mode & 0o777) == "0o600"
    data = _decode(packed)
    assert data["loss"] == 0.5 and has_media(data)
    img = data["img"]
    assert isinstance(img, MediaRef) and img.desc["k"] == "file" and img.desc["c"] == "Image"
    assert img.desc["s"]["_width"] == 2 and img.desc["f"] == os.path.basename(staged[1])
    cell = data["t"].desc["data"][0][1]
    assert isinstance(cell, MediaRef) and cell.files() == [os.path.basename(staged[0])]
    assert sorted(data["t"].files() + img.files()) == sorted(map(os.path.basename, staged))
    # as a sink counts them (the table, its image cell, the image); a rank's drop is not one
    assert count_media(data) == 3
    assert count_media({"x": [MediaRef({"k": "dropped", "what": "Image"}), 1.0]}) == 0


def test_a_rank_on_another_node_drops_files_but_keeps_histograms_and_tables() -> None:
    assert media.staging_dir_for("tcp://10.0.0.1:5555") is None
    stager = media.Stager(None, 1 << 20, "another node")
    packed, _ = _encode(
        stager,
        {"img": wf.Image(np.zeros((2, 2))), "h": wf.Histogram(np_histogram=([1], [0.0, 1.0]))},
    )
    data = _decode(packed)
    assert data["img"].desc == {"k": "dropped", "what": "Image", "why": "another node"}
    assert data["h"].desc["k"] == "histogram"


# ---- the logger's side -------------------------------------------------------------------


def test_the_logger_takes_only_plain_names_in_its_staging_directory(
    tmp_path: pathlib.Path,
) -> None:
    files = MediaFiles(str(tmp_path))
    (tmp_path.parent / "secret").write_text("x")
    for name in ("../secret", "/etc/passwd", ".hidden", "", 7):
        with pytest.raises(BadMediaError, match="plain name"):
            files.path_of(name)
    with pytest.raises(BadMediaError, match="missing"):
        files.path_of("1-1-0123abcd.png")


def test_a_bad_descriptor_costs_its_key_only_counted(tmp_path: pathlib.Path) -> None:
    import wandb

    warned: list[str] = []
    files = MediaFiles(str(tmp_path), warned.append)
    row = {
        "ok": 1,
        "evil": MediaRef({"k": "file", "c": "Artifact", "s": {}}),
        "traversal": MediaRef({"k": "file", "c": "Image", "s": {}, "f": "../x.png"}),
        "local_ref": MediaRef({"k": "file", "c": "Image", "s": {}, "ref": "file:///etc/passwd"}),
        "dropped": MediaRef({"k": "dropped", "what": "Image", "why": "queue full"}),
        "hist": MediaRef({"k": "histogram", "histogram": [1, 2], "bins": [0, 1, 2]}),
    }
    out, keys = materialize(row, files, Maker(wandb))
    assert keys == set(row) - {"ok"}
    assert set(out) == {"ok", "hist"} and isinstance(out["hist"], wandb.Histogram)
    assert files.dropped == 4 and files.logged == 1
    assert any("not a wandb media class" in w for w in warned)
    assert any("queue full" in w for w in warned)


def test_a_staged_image_becomes_wandbs_own_moved_into_the_run(tmp_path: pathlib.Path) -> None:
    import wandb

    stager = media.Stager(str(tmp_path), 1 << 20)
    packed, staged = _encode(stager, {"img": wf.Image(np.zeros((3, 5, 3), np.uint8), caption="c")})
    out, _ = materialize(_decode(packed), MediaFiles(str(tmp_path)), Maker(wandb))
    image = out["img"]
    assert type(image) is wandb.Image and image._caption == "c"
    assert (image._width, image._height, image.format) == (5, 3, "png")
    assert image._path == staged[0] and image._is_tmp is True  # wandb moves it, no copy


def _row(parts: dict[int, dict[str, Any]]) -> Row:
    return Row(0, parts)


def _table(columns: list[str], rows: list[list[Any]]) -> MediaRef:
    return MediaRef(
        {"k": "table", "columns": columns, "data": rows, "mixed": False, "log_mode": "IMMUTABLE"}
    )


def test_concat_makes_one_table_in_rank_order_with_a_rank_column() -> None:
    builder = RowBuilder("auto", {"t": "concat"}, "global_step")
    out = builder.build(
        _row({2: {"t": _table(["a"], [[20]])}, 0: {"t": _table(["a"], [[0], [1]])}})
    )
    assert out["t"].desc["columns"] == ["a", "rank"]
    assert out["t"].desc["data"] == [[0, 0], [1, 0], [20, 2]]
    has_rank = builder.build(
        _row({0: {"t": _table(["rank"], [[0]])}, 1: {"t": _table(["rank"], [[1]])}})
    )
    assert has_rank["t"].desc["columns"] == ["rank"] and has_rank["t"].desc["data"] == [[0], [1]]


def test_reducers_that_cannot_apply_keep_the_lowest_rank_and_say_why() -> None:
    warned: list[str] = []
    builder = RowBuilder("auto", {"t": "concat", "h": "merge"}, "global_step", warned.append)
    out = builder.build(
        _row(
            {
                0: {
                    "t": _table(["a"], [[0]]),
                    "h": MediaRef({"k": "histogram", "histogram": [1], "bins": [0, 1]}),
                },
                1: {
                    "t": _table(["b"], [[1]]),
                    "h": MediaRef({"k": "histogram", "histogram": [1], "bins": [0, 2]}),
                },
            }
        )
    )
    assert out["t"].desc["columns"] == ["a"] and out["h"].desc["bins"] == [0, 1]
    assert any("rank 1's table has columns ['b']" in w for w in warned)
    assert any("other bin edges" in w for w in warned)
    merged = builder.build(
        _row(
            {
                0: {"h": MediaRef({"k": "histogram", "histogram": [1, 2], "bins": [0, 1, 2]})},
                1: {"h": MediaRef({"k": "histogram", "histogram": [3, 4], "bins": [0, 1, 2]})},
            }
        )
    )
    assert merged["h"].desc["histogram"] == [4, 6]


def test_media_default_to_the_lowest_rank_in_auto_and_per_rank_in_shared() -> None:
    image = {r: MediaRef({"k": "file", "c": "Image", "s": {}, "f": f"{r}.png"}) for r in (0, 1)}
    auto = RowBuilder("auto", {}, "global_step").build(
        _row({1: {"img": image[1]}, 0: {"img": image[0]}})
    )
    assert auto["img"] is image[0]
    shared = RowBuilder("shared", {}, "global_step").build(
        _row({1: {"img": image[1]}, 0: {"img": image[0]}})
    )
    assert shared["img/rank0"] is image[0] and shared["img/rank1"] is image[1]
    assert "img" not in shared


# ---- across nodes: bytes in chunks ------------------------------------------------------------


def test_a_rank_on_another_node_sends_its_files_as_chunks(tmp_path: pathlib.Path) -> None:
    """The remote stager sends the file's bytes (chunks, through the stream), names them in
    the descriptor; the logger's BlobWriter writes ``.part`` and renames on the last chunk."""
    from wandb_funnel._constants import BATCH_BYTES
    from wandb_funnel._logger.blobs import BlobWriter
    from wandb_funnel._protocol.messages import Blob

    writer = BlobWriter(str(tmp_path))

    def send(name: str, data: bytes) -> None:  # what Stream.send_blob puts on the wire
        for offset in range(0, max(len(data), 1), BATCH_BYTES):
            chunk = data[offset : offset + BATCH_BYTES]
            frame = codec.encode_blob(Blob(name, offset, len(data), chunk))
            blob = codec.decode(frame, 1 << 20)
            assert isinstance(blob, Blob)
            if offset + BATCH_BYTES < len(data):
                assert not (tmp_path / name).exists()  # not whole yet
            assert writer.write(blob)

    stager = media.Stager(None, 1 << 24, remote=True)
    big = np.random.default_rng(1).integers(0, 255, (400, 400, 3))  # a PNG over one chunk
    packed, staged, blobs = _encoding(
        stager, {"img": wf.Image(big), "again": []}, max_record=1 << 20
    )
    assert staged == []  # nothing of this process's on the logger's disk to take back
    ((name, data),) = blobs  # sent by the Run once the record is good, ahead of it
    assert _decode(packed)["img"].desc["f"] == name
    send(name, data)
    assert (tmp_path / name).stat().st_size > BATCH_BYTES and writer.files == 1
    assert not list(tmp_path.glob("*.part"))
    # Over what a rank on another node sends: a counted drop, and the record still goes.
    small = media.Stager(None, 1 << 26, remote=True)
    from wandb_funnel._constants import REMOTE_MEDIA_BYTES

    huge = np.random.default_rng(2).integers(0, 255, (3000, 3000, 3), dtype=np.uint8)
    assert huge.nbytes > REMOTE_MEDIA_BYTES
    packed, _, blobs = _encoding(
        small, {"img": wf.Image(huge, file_type="bmp"), "loss": 1}, max_record=1 << 20
    )
    data_ = _decode(packed)
    assert data_["img"].desc["k"] == "dropped" and data_["loss"] == 1 and small.dropped == 1
    assert blobs == []


def test_the_logger_takes_chunks_only_for_plain_new_names(tmp_path: pathlib.Path) -> None:
    from wandb_funnel._logger.blobs import BlobWriter
    from wandb_funnel._protocol.messages import Blob

    writer = BlobWriter(str(tmp_path))
    for name in ("../x", ".hidden", "x.part", ""):
        assert not writer.write(Blob(name, 0, 1, b"x"))
    assert not writer.write(Blob("late.png", 5, 10, b"12345"))  # never begun
    assert writer.write(Blob("a.png", 0, 2, b"ab"))
    assert writer.write(Blob("a.png", 0, 2, b"cd"))  # a resend: taken, never written over
    assert (tmp_path / "a.png").read_bytes() == b"ab"
    assert writer.resent == 1 and writer.files == 1


def test_a_file_resent_after_a_restart_is_taken_once(tmp_path: pathlib.Path) -> None:
    """A rank resends a file with its unsaved records to a logger (or node logger) that
    restarted (issue 38): a complete file's chunks are all taken and skipped, never written
    over; a ``.part`` a dead predecessor left is begun again and completed."""
    from wandb_funnel._logger.blobs import BlobWriter
    from wandb_funnel._protocol.messages import Blob

    writer = BlobWriter(str(tmp_path))
    chunks = [Blob("a.png", 0, 6, b"ab"), Blob("a.png", 2, 6, b"cd"), Blob("a.png", 4, 6, b"ef")]
    assert all(writer.write(c) for c in chunks)
    again = [c._replace(data=c.data.upper()) for c in chunks]  # (different bytes: to tell)
    assert all(BlobWriter(str(tmp_path)).write(c) for c in again[:1])
    assert all(writer.write(c) for c in again)
    assert (tmp_path / "a.png").read_bytes() == b"abcdef" and writer.resent == 3
    assert not writer.write(Blob("x.png", 2, 4, b"zz"))  # a later chunk, never begun
    assert writer.write(Blob("h.png", 0, 6, b"ab"))
    assert not writer.write(Blob("h.png", 4, 6, b"ef"))  # not where the last one ended
    assert not (tmp_path / "h.png").exists()
    (tmp_path / "b.png.part").write_bytes(b"half of it")  # a dead logger's, half written
    assert writer.write(Blob("b.png", 0, 2, b"ok"))
    assert (tmp_path / "b.png").read_bytes() == b"ok" and writer.files == 2

    assert BlobWriter(None).write(Blob("b.png", 0, 1, b"b")) is False


@pytest.mark.parametrize(
    "make",
    [
        lambda rng: rng.integers(0, 256, (6, 5), dtype=np.uint8),  # 2-D: grayscale
        lambda rng: rng.integers(0, 256, (6, 5, 1), dtype=np.uint8),  # one channel
        lambda rng: rng.integers(0, 256, (6, 5, 3), dtype=np.uint8),  # RGB
        lambda rng: rng.integers(0, 256, (6, 5, 4), dtype=np.uint8),  # RGBA
        lambda rng: rng.random((6, 5, 3)) * 255,  # floats, taken as 0-255 as wandb takes them
        lambda rng: __import__("torch").from_numpy(rng.random((3, 6, 5)) * 255),  # CHW tensor
        lambda rng: __import__("torch").from_numpy(rng.integers(0, 256, (3, 6, 5), dtype=np.uint8)),
    ],
    ids=["2d", "1ch", "rgb", "rgba", "float", "tensor", "tensor-uint8"],
)
def test_a_light_image_is_the_very_png_wandb_image_makes(make: Any) -> None:
    """Same bytes (so the same hash, and the same file name in the run) as wandb.Image."""
    import wandb

    data = make(np.random.default_rng(3))
    light, theirs = wf.Image(data), wandb.Image(data)
    assert (light.width, light.height, light.format) == (
        theirs._width,
        theirs._height,
        theirs.format,
    )
    assert light._sha == theirs._sha256 and light._size == theirs._size


def test_media_nested_past_any_real_depth_is_junk_not_a_crash() -> None:
    """200 nested media values once crashed the decoding process (a C unpacker per level)."""
    import msgpack

    from wandb_funnel._protocol.messages import MEDIA_EXT

    inner: Any = msgpack.packb({"k": "histogram", "histogram": [1], "bins": [0, 1]})
    for _ in range(200):
        inner = msgpack.packb(
            {"k": "table", "columns": ["a"], "data": [[msgpack.ExtType(MEDIA_EXT, inner)]]}
        )
    record = msgpack.packb((0, True, {"t": msgpack.ExtType(MEDIA_EXT, inner)}))
    with pytest.raises(codec.DecodeError, match="nested too deeply"):
        codec.decode(codec.encode_batch(0, [record]), 1 << 22)


def test_a_descriptor_cannot_steer_where_wandb_writes(tmp_path: pathlib.Path) -> None:
    """State the logger sets itself (``_extension``, ``_path``, ``_is_tmp``) is ignored;
    hashes, formats and mask keys that go into file names are checked."""
    import wandb

    name = "1-1-0123abcd.png"
    (tmp_path / name).write_bytes(b"png")
    good = {"_sha256": "a" * 64, "_size": 3, "format": "png", "_width": 1, "_height": 1}
    files = MediaFiles(str(tmp_path), lambda message: None)

    def make(state: dict[str, Any]) -> dict[str, Any]:
        ref = MediaRef({"k": "file", "c": "Image", "s": state, "f": name})
        out, _ = materialize({"img": ref}, files, Maker(wandb))
        return out

    image = make(
        {**good, "_extension": "/../../../evil.sh", "_path": "/etc/passwd", "_is_tmp": False}
    )["img"]
    assert image._extension == ".png" and image._path == str(tmp_path / name)
    assert image._is_tmp is True
    for bad in (
        {"_sha256": "../../x" + "a" * 57},
        {"format": "png/../../x"},
        {"_masks": {"../m": None}},
        {"_size": -1},
    ):
        assert make({**good, **bad}) == {}
    assert files.dropped == 4


def test_one_ref_logged_twice_is_one_wandb_object_and_a_dropped_list_item_is_just_that(
    tmp_path: pathlib.Path,
) -> None:
    """Shared mode logs a rank's image as {key}/rank{r} and, with a reducer, as {key}: one
    object, so wandb moves its file once. A rank's dropped image in a list costs only itself."""
    import wandb

    name = "1-1-0123abcd.png"
    (tmp_path / name).write_bytes(b"png")
    ref = MediaRef(
        {
            "k": "file",
            "c": "Image",
            "f": name,
            "s": {"_sha256": "b" * 64, "_size": 3, "format": "png"},
        }
    )
    hist = MediaRef({"k": "histogram", "histogram": [1], "bins": [0, 1]})
    dropped = MediaRef({"k": "dropped", "what": "Image", "why": "full"})
    files = MediaFiles(str(tmp_path), lambda message: None)
    other = MediaRef({"k": "histogram", "histogram": [2], "bins": [0, 1]})
    out, _ = materialize(
        {"img": ref, "img/rank0": ref, "list": [hist, dropped, other]}, files, Maker(wandb)
    )
    assert out["img"] is out["img/rank0"]
    assert len(out["list"]) == 2 and files.logged == 3 and files.dropped == 1


def test_one_value_logged_under_two_keys_is_staged_once_and_logged_once(
    tmp_path: pathlib.Path,
) -> None:
    """The rank stages it once (both keys name one file): the logger makes one wandb object
    for both, so wandb moves the file once and the row is not lost."""
    import wandb

    stager = _stager(tmp_path)
    image = wf.Image(np.zeros((4, 4, 3), np.uint8))
    packed, staged = _encode(stager, {"a": image, "b": [image, image]})
    assert len(staged) == 1
    data = _decode(packed)
    assert data["a"] is not data["b"][0] and data["a"].desc["f"] == data["b"][0].desc["f"]
    out, _ = materialize(data, MediaFiles(str(tmp_path / "media")), Maker(wandb))
    assert out["a"] is out["b"][0] is out["b"][1]
