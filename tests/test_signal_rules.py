"""The signal rules of ``_lifecycle``, in this process (no funnel, no other process): held
signals are delivered once, to the handler installed by then; our hook chains a handler it
replaced, and only flushes when another handler calls it."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType

import pytest

from wandb_funnel._worker import lifecycle


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    previous, hook_pid = lifecycle._previous_sigterm, lifecycle._sigterm_hook_pid
    flushes = list(lifecycle._flush_callbacks)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    lifecycle._previous_sigterm, lifecycle._sigterm_hook_pid = previous, hook_pid
    lifecycle._flush_callbacks[:] = flushes


def _land(signum: int) -> None:
    """Send ``signum`` to this process and let the main thread run its Python handler."""
    os.kill(os.getpid(), signum)
    for _ in range(3):
        pass  # bytecode: CPython checks for pending signals here


@pytest.mark.usefixtures("restore_signals")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_held_signals_run_the_handler_once_after_the_block(signum: int) -> None:
    calls: list[int] = []
    signal.signal(signum, lambda s, f: calls.append(s))
    with lifecycle.signals_held():
        _land(signum)
        _land(signum)  # two while held: still one delivery (a signal is not a queue)
        assert calls == []
        assert signal.getsignal(signum) is not None
    assert calls == [signum]


@pytest.mark.usefixtures("restore_signals")
def test_systemexit_from_a_held_handler_propagates_from_the_block() -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        sys.exit(143)

    signal.signal(signal.SIGTERM, handler)
    with pytest.raises(SystemExit) as exc, lifecycle.signals_held():
        _land(signal.SIGTERM)
    assert exc.value.code == 143


@pytest.mark.usefixtures("restore_signals")
def test_default_int_handler_still_raises_keyboardinterrupt_after_the_hold() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with pytest.raises(KeyboardInterrupt), lifecycle.signals_held():
        _land(signal.SIGINT)


@pytest.mark.usefixtures("restore_signals")
def test_ignored_signals_are_left_alone() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with lifecycle.signals_held():
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        _land(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


@pytest.mark.usefixtures("restore_signals")
def test_hook_installs_once_and_never_over_a_later_handler() -> None:
    lifecycle._sigterm_hook_pid = -1
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lifecycle.install_sigterm_hook()
    assert signal.getsignal(signal.SIGTERM) is lifecycle._on_sigterm

    def mine(signum: int, frame: FrameType | None) -> None:
        pass

    signal.signal(signal.SIGTERM, mine)
    lifecycle.install_sigterm_hook()  # a second stream, a later init(): never again
    assert signal.getsignal(signal.SIGTERM) is mine


@pytest.mark.usefixtures("restore_signals")
def test_hook_chains_a_handler_it_replaced_after_flushing() -> None:
    order: list[str] = []
    lifecycle._sigterm_hook_pid = -1
    signal.signal(signal.SIGTERM, lambda s, f: order.append("user"))
    lifecycle._flush_callbacks[:] = [lambda: order.append("flush")]
    lifecycle.install_sigterm_hook()
    _land(signal.SIGTERM)
    assert order == ["flush", "user"]


@pytest.mark.usefixtures("restore_signals")
def test_hook_called_by_another_handler_only_flushes() -> None:
    """Lightning's connector calls the handlers it found; ours must not end the process
    (over SIG_DFL it would close everything and kill itself) under the caller."""
    order: list[str] = []
    lifecycle._sigterm_hook_pid = -1
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lifecycle._flush_callbacks[:] = [lambda: order.append("flush")]
    lifecycle.install_sigterm_hook()
    ours = signal.getsignal(signal.SIGTERM)
    assert callable(ours)

    def composed(signum: int, frame: FrameType | None) -> None:
        order.append("theirs")
        ours(signum, frame)
        order.append("after ours")

    signal.signal(signal.SIGTERM, composed)
    _land(signal.SIGTERM)  # still alive: ours did not re-raise SIGTERM with SIG_DFL
    assert order == ["theirs", "flush", "after ours"]


@pytest.mark.usefixtures("restore_signals")
def test_a_chain_through_our_hook_still_runs_the_handler_we_replaced() -> None:
    """A requeue handler installed before the funnel, then Lightning's connector calling the
    handler it found (ours): the requeue handler still runs, once, after the flush."""
    order: list[str] = []
    lifecycle._sigterm_hook_pid = -1
    signal.signal(signal.SIGTERM, lambda s, f: order.append("requeue"))
    lifecycle._flush_callbacks[:] = [lambda: order.append("flush")]
    lifecycle.install_sigterm_hook()
    ours = signal.getsignal(signal.SIGTERM)
    assert callable(ours)

    def composed(signum: int, frame: FrameType | None) -> None:
        order.append("lightning")
        ours(signum, frame)

    signal.signal(signal.SIGTERM, composed)
    _land(signal.SIGTERM)
    assert order == ["lightning", "flush", "requeue"]


def test_every_shutdown_step_runs_when_one_raises_systemexit() -> None:
    """A handler of a signal we do not hold (SIGUSR1) exiting inside a step: the later steps
    (the funnel's close) still run, then the exit goes on."""
    ran: list[str] = []

    def exits(code: int, reason: str) -> None:
        ran.append("streams")
        raise SystemExit(7)

    saved = list(lifecycle._callbacks)
    lifecycle._callbacks[:] = [(0, exits), (10, lambda c, r: ran.append("funnel"))]
    try:
        with pytest.raises(SystemExit) as exc:
            lifecycle.run_shutdown_callbacks(0, "test")
    finally:
        lifecycle._callbacks[:] = saved
    assert ran == ["streams", "funnel"] and exc.value.code == 7


@pytest.mark.usefixtures("restore_signals")
def test_both_held_signals_are_delivered_and_handlers_restored_when_one_raises() -> None:
    calls: list[int] = []

    def term(signum: int, frame: FrameType | None) -> None:
        calls.append(signum)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, term)
    # Two statements on purpose: both signals land inside the hold, and the KeyboardInterrupt
    # comes from the hold's exit.
    with pytest.raises(KeyboardInterrupt), lifecycle.signals_held():  # noqa: PT012
        _land(signal.SIGINT)
        _land(signal.SIGTERM)
    assert calls == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is term
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
