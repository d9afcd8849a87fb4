"""wandb-core, the logger's own service (the funnel's only one): imported ahead of time by a
logger started early, torn down by the logger once its run is finished."""

from __future__ import annotations

import threading


def import_wandb() -> None:
    """Import wandb now (0.5 s), ahead of its first use."""
    import wandb  # noqa: F401


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
