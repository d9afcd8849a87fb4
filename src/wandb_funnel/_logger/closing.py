"""The logger's close: one budget, and a watchdog that ends the process when wandb outlasts it.

Every cause of a close asks through one place (``close_request.py``: the owner's CLOSE, a
signal, the owner lost, the receiver's death); the first asked is the close, with its
budget (a ``Deadline``). Half of it waits for ranks still sending (stragglers); rows are
written until ``_FINISH_RESERVE`` seconds are left; the rest is the summary and wandb's
finish. If wandb does not return by the end of the budget (a server that does not answer
holds its finish: plain wandb's would wait for ever), the watchdog says truthfully what is
safe on disk and what is not, leaves the accounting for the owner and exits the process.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wandb_funnel import _private_dir
from wandb_funnel._constants import (
    EXIT_OWNER_LOST,
    EXIT_RANK_DIED,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    LOGGER_TICK,
)
from wandb_funnel._deadline import Deadline
from wandb_funnel._logger.leave import leave
from wandb_funnel._logger.say import log_to_stderr
from wandb_funnel._outcomes import LoggerExit

if TYPE_CHECKING:
    from wandb_funnel._logger.close_request import CloseRequests
    from wandb_funnel._logger.ledger import Ledger
    from wandb_funnel._logger.receiver import Receiver
    from wandb_funnel._logger.run_writer import RunWriter
    from wandb_funnel._logger.runs import Runs

SIGNAL_BUDGET = 5.0  # seconds to finish when the logger itself is signalled
# Of the close budget, this much is kept for the summary and wandb's finish: rows that do not
# fit before it are counted as dropped, so the run always gets its accounting and exit code.
_FINISH_RESERVE = 2.0
# Once closing, the logger exits by itself this long after its budget, whatever wandb does:
# nobody else may be left to kill it (the owner may be dead).
_WATCHDOG_GRACE = 1.0


class Close:
    """The close asked first, its budget and deadlines, and the watchdog."""

    def __init__(self, requests: CloseRequests, close_timeout: float) -> None:
        self.requests = requests  # every cause of a close asks here
        self._close_timeout = close_timeout
        self.budget: Deadline | None = None  # once begun
        self.exit_code = 0
        self.why = ""
        self.straggler_deadline = 0.0  # stop waiting for ranks still sending
        self.write_deadline: float | None = None  # rows stop; the summary and finish go on
        self._watchdog_lock = threading.Lock()
        self._watchdog_armed = False
        self.watching = False  # signals taken, the owner watched
        self.supervised = True  # the owner is alive: it restarts a logger that exits
        self.orphaned = False  # the owner is gone: serve the ranks until they all end

    def watch(self, owner_pid: int) -> None:
        """Take SIGTERM and SIGINT as closes, and watch the owner on a thread of its own
        (the main thread may be stuck inside wandb when the owner dies, and then nobody else
        would ever end this process). Once."""
        if self.watching:
            return
        self.watching = True
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        threading.Thread(
            target=self._watch_owner, args=(owner_pid,), name="wandb-funnel-owner", daemon=True
        ).start()

    def _watch_owner(self, owner_pid: int) -> None:
        while os.getppid() == owner_pid:
            time.sleep(LOGGER_TICK)
        self.supervised = False
        if self.requests.first() is not None:
            return  # closing already: the close has its watchdog
        # The ranks may live on (spawned workers run after their parent's SIGKILL; torchrun
        # stops the others on its own): their records are still written, until every rank
        # has finished or is gone. Then the run ends, with the owner's failure as its code.
        log_to_stderr(
            f"the owner (pid {owner_pid}) is gone without closing; the run goes on until "
            f"every rank has finished or died, then ends as failed (exit code {EXIT_OWNER_LOST})"
        )
        self.orphaned = True

    @property
    def begun(self) -> bool:
        return self.budget is not None

    def on_signal(self, signum: int, frame: Any) -> None:
        code = EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM
        self.requests.ask(code, SIGNAL_BUDGET, "signalled")

    def open_by(self) -> float | None:
        """None until anything asks the funnel to close; then the time by which a run still
        opening must be open: the half of the close's budget that waits for stragglers."""
        asked = self.requests.first()
        if asked is None:
            return None
        budget = self._close_timeout if asked.budget is None else asked.budget
        return asked.at + max(0.0, budget) / 2

    def begin_if_asked(self, give_up: Callable[[float], None]) -> bool:
        """Begin the close asked first, if one is and it has not begun; True once begun.
        ``give_up(budget)`` runs on the watchdog's thread if the close outlasts it."""
        if self.budget is None and (asked := self.requests.first()) is not None:
            budget = self._close_timeout if asked.budget is None else asked.budget
            self.begin(asked.exit_code, budget, asked.why, asked.at, give_up)
        return self.budget is not None

    def begin(
        self,
        exit_code: int,
        budget: float,
        why: str,
        since: float | None,
        give_up: Callable[[float], None],
    ) -> None:
        # Half the budget for stragglers, the rest to write rows and finish wandb.
        self.budget = close = Deadline(budget, since)
        self.exit_code, self.why = exit_code, why
        self.straggler_deadline = close.part(0.5)
        self.write_deadline = close.keeping(_FINISH_RESERVE, at_least=0.5)
        with self._watchdog_lock:
            if self._watchdog_armed:
                return
            self._watchdog_armed = True
        left = close.remaining()
        watchdog = threading.Timer(left + _WATCHDOG_GRACE, give_up, args=(close.budget,))
        watchdog.daemon = True
        watchdog.start()

    def past_write_deadline(self) -> bool:
        return self.write_deadline is not None and time.monotonic() >= self.write_deadline

    def teardown_budget(self) -> float:
        """Seconds left for shutting wandb-core down once the run is finished: what is left
        of the close's budget (its watchdog ends the process 1 s after it anyway)."""
        if self.budget is None:
            return SIGNAL_BUDGET
        return max(0.5, self.budget.remaining())

    def step(self, step: str) -> None:
        """Say how far a close has got once rows ran out of time: if the owner then has to
        kill the logger, its stderr shows where the time went."""
        close = self.budget
        if close is None or not self.past_write_deadline():
            return
        log_to_stderr(f"closing: {step} at {close.elapsed():.2f}s of a {close.budget:.1f}s budget")


def finish_runs(
    runs: Runs,
    ledger: Ledger,
    close: Close,
    exit_code: int,
    active: set[int],
    receiver: Receiver,
    progress: Callable[[int], None],
) -> None:
    """Finish every run: its buffered rows (until the write deadline), its accounting (the
    ledger's), its exit code. In run_mode="new", a rank still unfinished at close did not
    finish in time: its run ends failed."""
    # Records the receiver dropped belong to the one run, unless there is a run per rank.
    elsewhere = receiver.dropped if runs.per_rank is None else 0
    for key, writer in list(runs.writers.items()):
        if not receiver.footer and writer.sink is not None:
            writer.sink.without_footer()  # the program never called finish(): none
        unfinished = key is not None and key in active
        code = close.exit_code or EXIT_RANK_DIED if unfinished else exit_code
        writer.finish(
            code,
            functools.partial(_accounting, ledger, runs, close.why, elsewhere, key is None),
            close.write_deadline,
            close.step,
            progress,
        )
    if runs.journal.attempt is not None:
        runs.journal.attempt.finished(exit_code)  # this attempt is done: recorded


def _accounting(
    ledger: Ledger, runs: Runs, why: str, elsewhere: int, main: bool, writer: RunWriter
) -> dict[str, Any]:
    # Taken once the run's rows are written: media and files its last rows brought are in
    # it, as in the owner's DONE (computed after every run finished).
    return ledger.for_run(writer, ledger.shared(runs, why), elsewhere, main)


def give_up(
    directory: str | None,
    owner_pid: int,
    stats: dict[str, Any],
    said: list[str],
) -> None:
    """The close ran out of time inside wandb: say what is safe (``said``, one line per
    run), leave the accounting for the owner (it gets no DONE), and exit the process."""
    for line in said:
        log_to_stderr(line)
    try:
        _private_dir.write_json(directory, _private_dir.FINAL_STATS, stats)
    finally:
        # The owner reads the accounting from the directory and removes it; with the owner
        # gone, nobody else will.
        if os.getppid() != owner_pid:
            _private_dir.remove(directory)
        leave(LoggerExit.GAVE_UP)


def what_is_safe(
    writer: RunWriter, budget: float, stats: dict[str, Any], info: dict[str, Any]
) -> str:
    """What a close cut short inside wandb leaves on disk for ``writer``'s run, in words."""
    run_dir = os.path.dirname(str(info.get("dir") or "")) or "the run's directory"
    log = f"{run_dir}/run-{writer.name}.wandb"
    offline = bool(info.get("offline", True))
    head = f"could not finish the run within its {budget:.1f}s close budget"
    dropped = stats["_funnel/dropped_records"]
    lost = f"{dropped} records, counted" if dropped else "nothing"
    if writer.finish_called:
        where = "" if offline else ", and the upload to W&B did not finish in time"
        sync = f"wandb sync {run_dir}" if offline else f"wandb sync --include-online {run_dir}"
        return (
            f"{head} (wandb's finish did not return{where}). Safe on this disk, in the "
            f"run's transaction log {log}: its {writer.rows} rows ({writer.records} records), "
            f"its accounting and its exit record; lost: {lost}. Upload what W&B is "
            f"missing with:\n    {sync}"
        )
    return (
        f"{head} (wandb stalled before the run's exit record). Safe on this disk, in "
        f"{log}: {writer.rows} rows ({writer.records} records)"
        f"{' and the accounting' if writer.summary_sent else ''}; lost: the exit record "
        f"and {dropped} records not yet written (counted)."
    )
