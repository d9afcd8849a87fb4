"""_worker.lifecycle's exit codes and shutdown callbacks (the in-process rules; signals are in
test_signal_rules.py, and real exits in tests/processes)."""

from __future__ import annotations

import pytest

from wandb_funnel._worker import lifecycle


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (None, 0),
        (KeyboardInterrupt(), 130),
        (SystemExit(), 0),
        (SystemExit(None), 0),
        (SystemExit(143), 143),
        (SystemExit("a message"), 1),  # sys.exit("msg") prints it and exits 1
        (ValueError("x"), 1),
    ],
)
def test_exit_code_from_exception(exc: BaseException | None, code: int) -> None:
    assert lifecycle.exit_code_from_exception(exc) == code


def test_shutdown_callbacks_run_by_priority_once_and_can_be_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lifecycle, "_callbacks", [])  # this process's own stay untouched
    calls: list[tuple[str, int, str]] = []

    def low(code: int, reason: str) -> None:
        calls.append(("low", code, reason))

    def high(code: int, reason: str) -> None:
        calls.append(("high", code, reason))

    def removed(code: int, reason: str) -> None:
        calls.append(("removed", code, reason))

    lifecycle.add_shutdown_callback(high, priority=50)
    lifecycle.add_shutdown_callback(low, priority=1)
    lifecycle.add_shutdown_callback(low, priority=1)  # twice: still once
    lifecycle.add_shutdown_callback(removed, priority=20)
    lifecycle.remove_shutdown_callback(removed)
    try:
        lifecycle.run_shutdown_callbacks(3, "test")
        lifecycle.run_shutdown_callbacks(4, "again")
    finally:
        lifecycle.remove_shutdown_callback(low)
        lifecycle.remove_shutdown_callback(high)
    # Lowest priority first (a rank's streams before the funnel that waits for them); each
    # runs once, so the second shutdown finds nothing left to run.
    assert calls == [("low", 3, "test"), ("high", 3, "test")]
