"""The logger's one close path: every cause asks, the first asked wins."""

from __future__ import annotations

import os
import signal
import threading

from wandb_funnel._logger.close_request import CloseRequests


def test_nothing_asked_is_no_close() -> None:
    assert CloseRequests().first() is None


def test_the_first_request_wins_and_stays() -> None:
    close = CloseRequests()
    close.ask(0, 5.0, "closed by the owner", at=10.0)
    close.ask(143, 2.0, "signalled")
    first = close.first()
    assert first is not None and (first.exit_code, first.budget, first.why, first.at) == (
        0,
        5.0,
        "closed by the owner",
        10.0,
    )
    close.ask(1, None, "owner lost")
    assert close.first() is first


def test_a_request_from_another_thread() -> None:
    close = CloseRequests()
    t = threading.Thread(target=close.ask, args=(2, None, "receiver failed: boom"))
    t.start()
    t.join()
    first = close.first()
    assert first is not None and first.why == "receiver failed: boom" and first.budget is None


def test_a_request_from_a_signal_handler() -> None:
    close = CloseRequests()
    old = signal.signal(signal.SIGUSR1, lambda *_: close.ask(143, 2.0, "signalled"))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # its handler runs before kill() returns here
    finally:
        signal.signal(signal.SIGUSR1, old)
    first = close.first()
    assert first is not None and (first.exit_code, first.why) == (143, "signalled")


def test_the_receivers_death_asks_for_the_close() -> None:
    """The receiver's thread dies (here its socket raises): the run closes through the one
    path, with the funnel's close_timeout (budget None) and the cause named."""
    from typing import Any, ClassVar, cast

    from wandb_funnel._logger.receiver import Receiver

    class BrokenSocket:
        routes: ClassVar[dict[bytes, bytes]] = {}

        def wait(self, timeout: float) -> bool:
            raise OSError("the socket broke")

    receiver = Receiver(cast(Any, BrokenSocket()), "token", 1 << 20, 1000)
    receiver.start()
    receiver.join(10)
    first = receiver.close_requests.first()
    assert not receiver.is_alive() and isinstance(receiver.failure, OSError)
    assert first is not None and first.budget is None and first.why == "receiver failed: OSError"
