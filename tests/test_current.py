"""_current: this process's current Run, shared by the module API and the owner's Funnel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from wandb_funnel import _current


class FakeRun:
    def __init__(self) -> None:
        self.finished = False


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    before = _current.get()
    yield
    _current.forget(_current.get())
    if before is not None:
        _current.use(before)


def _run() -> Any:
    return cast(Any, FakeRun())


def test_set_get_and_a_finished_run_is_no_longer_current() -> None:
    run = _run()
    _current.use(run)
    assert _current.get() is run
    cast(Any, run).finished = True  # (the `is` above narrowed it to a Run, read-only there)
    assert _current.get() is None


def test_adopt_never_replaces_a_current_run() -> None:
    first, second = _run(), _run()
    _current.adopt(first)
    _current.adopt(second)  # a Funnel started while this process has a run: not current
    assert _current.get() is first


def test_forget_only_forgets_that_run() -> None:
    first, other = _run(), _run()
    _current.use(first)
    _current.forget(other)
    assert _current.get() is first
    _current.forget(None)
    assert _current.get() is first
    _current.forget(first)
    assert _current.get() is None


def test_a_run_made_current_by_another_pid_is_not_current(monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run()
    _current.use(run)
    from wandb_funnel import _pid

    monkeypatch.setattr(_pid, "current", _pid.current + 1)  # as if after fork, hooks aside
    assert _current.get() is None
