"""wandb-core, the service every process of a job attaches to: started by the owner before
any process that logs, torn down by the owner when it exits (``sinks.Backend``)."""

from __future__ import annotations

import os
import threading


def setup_service() -> bool:
    """Start (or join) wandb-core in this process, so that every process started after us,
    the logger included, attaches to one service through ``WANDB_SERVICE``. True when this
    call started it (no service was inherited)."""
    import wandb

    started = "WANDB_SERVICE" not in os.environ
    wandb.setup()
    return started


def teardown_service(timeout: float, exit_code: int | None = None) -> bool:
    """Shut down the wandb-core this process started, waiting at most ``timeout`` seconds;
    runs of the user's own still open on it are finished with ``exit_code``, as wandb's own
    exit hook would finish them with the process's code.

    wandb tears its service down in an atexit hook, which processes that leave through
    ``os._exit`` (multiprocessing children) never run: wandb-core then lingers until it
    notices its parent is gone, seconds later. On a thread, because a stalled wandb-core
    must not hold the exit.
    """
    import wandb

    done = threading.Event()

    def teardown() -> None:
        try:
            wandb.teardown(exit_code)
        except BaseException:  # SystemExit included: wandb exits with core's code
            pass
        finally:
            done.set()

    threading.Thread(target=teardown, name="wandb-funnel-teardown", daemon=True).start()
    return done.wait(timeout)
