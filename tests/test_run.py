"""``Run`` without a logger: what ``log`` refuses, it refuses before connecting; ``run.name``,
``notes`` and ``tags`` set as wandb sets them."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from wandb_funnel import _pid
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import Update, UpdateKind
from wandb_funnel._worker.run import AttachInfo, Run
from wandb_funnel.errors import ClientClosedError, FunnelWarning


def test_bad_data_on_first_use_raises_before_the_rank_connects() -> None:
    # Nothing listens here: a stream made anyway would be a rank holding rows back for good.
    info = AttachInfo("ipc:///nonexistent/wandb-funnel.sock", "token", "run", 1 << 20)
    run = Run(info, requested_rank=None)
    with pytest.raises(TypeError, match="keys must be str"):
        run.log({1: 2.0})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="must be a dict"):
        run.log([("loss", 1.0)])  # type: ignore[arg-type]
    assert run._stream is None


class _Updates:
    """A stream that keeps the updates a Run sends, decoded (no socket)."""

    def __init__(self) -> None:
        self.pid = _pid.current
        self.updates: list[Update] = []

    def send_control(self, frame: bytes) -> bool:
        message = codec.decode(frame, 1 << 24)
        assert isinstance(message, Update)
        self.updates.append(message)
        return True

    def close(self, reason: str, timeout: float, exit_code: int) -> None:
        pass


def _run_with_updates(run_info: dict[str, Any] | None = None) -> tuple[Run, _Updates]:
    info = AttachInfo("ipc:///nonexistent/x.sock", "token", "run", 1 << 20, run_info=run_info)
    run = Run(info, requested_rank=None)
    stream = _Updates()
    run._stream = stream  # type: ignore[assignment]
    return run, stream


def test_name_notes_and_tags_are_set_here_and_sent_to_the_run() -> None:
    run, stream = _run_with_updates({"name": "first", "notes": None, "tags": ["t0"]})
    assert (run.name, run.notes, run.tags) == ("first", None, ("t0",))
    run.name = "renamed"
    run.notes = "some notes"
    run.tags = ["a", "b"]
    assert (run.name, run.notes, run.tags) == ("renamed", "some notes", ("a", "b"))
    assert stream.updates == [
        Update(UpdateKind.RUN, {"name": "renamed"}),
        Update(UpdateKind.RUN, {"notes": "some notes"}),
        Update(UpdateKind.RUN, {"tags": ["a", "b"]}),
    ]
    run.name = None  # wandb takes None too
    assert run.name is None and stream.updates[-1].data == {"name": None}
    # A process this Run is pickled into starts from what this one set.
    child = pickle.loads(pickle.dumps(run))
    assert (child.name, child.notes, child.tags) == (None, "some notes", ("a", "b"))


def test_bad_values_raise_or_warn_where_wandb_does_and_send_nothing() -> None:
    run, stream = _run_with_updates({"tags": ["t0"]})
    with pytest.raises(ValueError, match=r"run.name must be a str or None, got int 5"):
        run.name = 5  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"run.notes must be a str"):
        run.notes = ["n"]  # type: ignore[assignment]
    with pytest.raises(TypeError, match="not iterable"):
        run.tags = 5  # type: ignore[assignment]
    with pytest.warns(FunnelWarning, match="Invalid tag detected: .* is 65 characters") as w:
        run.tags = ["x" * 65]
    assert w[0].filename == __file__  # said at the user's line
    assert run.tags == ("t0",) and stream.updates == []  # the tags the run had


def test_a_finished_run_refuses_the_setters_first() -> None:
    run, stream = _run_with_updates()
    run._finished = True
    with pytest.raises(ClientClosedError, match=r"run.name = on a finished run"):
        run.name = "late"
    with pytest.raises(ClientClosedError, match=r"run.tags = on a finished run"):
        run.tags = 5  # type: ignore[assignment]  # finished before the value is looked at
    assert stream.updates == []
