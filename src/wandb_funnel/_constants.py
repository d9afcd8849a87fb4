"""The one place for defaults, limits and the WANDB_FUNNEL_* environment variables."""

from __future__ import annotations

from typing import Final

# --- environment variables a Funnel exports to the processes started after it --------------
# Its state, prefixed _WANDB_FUNNEL_: a child never mistakes it for one of the options that
# WANDB_FUNNEL_<OPTION> sets (_options.resolve).
ENV_ADDRESS: Final = "_WANDB_FUNNEL_ADDRESS"  # the ZeroMQ endpoint clients connect to
ENV_TOKEN: Final = "_WANDB_FUNNEL_TOKEN"  # per-funnel secret every HELLO must carry
ENV_RUN_ID: Final = "_WANDB_FUNNEL_RUN_ID"  # the wandb run id, known before the logger starts
ENV_LOGGER_PID: Final = "_WANDB_FUNNEL_LOGGER_PID"  # lets a client skip lingering on a dead logger
ENV_HOST: Final = "_WANDB_FUNNEL_HOST"  # hostname of the logger (pids are only meaningful there)
ENV_MAX_RECORD_BYTES: Final = "_WANDB_FUNNEL_MAX_RECORD_BYTES"
ENV_MAX_MEDIA_BYTES: Final = "_WANDB_FUNNEL_MAX_MEDIA_BYTES"
ENV_CONSOLE: Final = "_WANDB_FUNNEL_CONSOLE"  # "0": the owner's settings say console="off"
# Seconds between a process's system metrics samples (wandb's x_stats_sampling_interval);
# "0": the owner's settings say x_disable_stats.
ENV_STATS_INTERVAL: Final = "_WANDB_FUNNEL_STATS_INTERVAL"
ENV_BIND_ADDR: Final = "WANDB_FUNNEL_BIND_ADDR"  # the address a multi-node logger listens on
ENV_CURVE: Final = "_WANDB_FUNNEL_CURVE"  # JSON: the client's CURVE keys, when the funnel uses TCP
# Set by a process that took its rank from RANK; a child that inherits RANK but has another
# pid (a DataLoader worker, a Pool) then gets a fresh rank instead of colliding with its parent.
ENV_RANK_PID: Final = "_WANDB_FUNNEL_RANK_PID"
ENV_SINK: Final = "WANDB_FUNNEL_SINK"  # "null": the logger writes nothing (benchmarks)
SINK_RECORD_PREFIX: Final = "record:"  # WANDB_FUNNEL_SINK=record:DIR: testing.capture_run()
# The attribute that holds the real function behind one that install() put on the wandb module.
ORIGINAL_ATTRIBUTE: Final = "__wandb_funnel_original__"
# JSON: the open run's name, project, entity, dir, url, ... (what ``wandb.run.name`` answers).
ENV_RUN_INFO: Final = "_WANDB_FUNNEL_RUN_INFO"
# Set (to JSON funnel options) by ``install()`` and ``wandb-funnel run``: every Python process
# started with it installs the funnel into ``wandb`` at startup (``_bootstrap/sitecustomize``).
ENV_INSTALL: Final = "_WANDB_FUNNEL_INSTALL"
# A history row not at its own step (a late row: _logger/steps.py) carries that step here too
# (a key wandb's UI hides): what a restarted logger reads as the row's step, whatever the
# user's own rows hold under step_key.
TRUE_STEP_KEY: Final = "_funnel/step"
# In a logger started ahead of time (``_owner/prewarm.py``): import wandb before the start
# message comes.
ENV_WARM: Final = "_WANDB_FUNNEL_WARM"
# "0": no logger is started ahead of time (on by default where it can pay: prewarm.py).
ENV_PREWARM: Final = "WANDB_FUNNEL_PREWARM"

ENV_REPLAY: Final = "_WANDB_FUNNEL_REPLAY"  # "records,bytes": a rank's replay buffer bound
EXPORTED_ENV: Final = (
    ENV_ADDRESS,
    ENV_TOKEN,
    ENV_RUN_ID,
    ENV_LOGGER_PID,
    ENV_HOST,
    ENV_MAX_RECORD_BYTES,
    ENV_MAX_MEDIA_BYTES,
    ENV_CONSOLE,
    ENV_STATS_INTERVAL,
    ENV_CURVE,
    ENV_RUN_INFO,
    ENV_REPLAY,
)

# --- defaults -------------------------------------------------------------------------------
DEFAULT_STEP_KEY: Final = "global_step"
DEFAULT_CLOSE_TIMEOUT: Final = 30.0  # seconds for close(): stragglers + drain + wandb finish
DEFAULT_START_TIMEOUT: Final = 90.0  # seconds for the logger to open its run (wandb's init_timeout)
# The most a rank waits for the open run's name, dir or url (an online run opens in the
# background): past start_timeout's default, by when the run is open online or offline.
RUN_INFO_TIMEOUT: Final = DEFAULT_START_TIMEOUT + 30.0
DEFAULT_MAX_RECORD_BYTES: Final = 64 * 1024 * 1024
# One media item (an image's file, a video, ...): a bigger one is refused at the call.
DEFAULT_MAX_MEDIA_BYTES: Final = 256 * 1024 * 1024
# Media a process has staged that the logger has not taken yet: past this, a media value is
# dropped and counted (_funnel/dropped_media) rather than fill the disk or wait on the logger.
MEDIA_INFLIGHT_BYTES: Final = 1024 * 1024 * 1024
# The largest media item a rank on another node sends as bytes: its chunks share that rank's
# connection queue with its records.
REMOTE_MEDIA_BYTES: Final = 16 * 1024 * 1024
# Console capture (every rank's stdout and stderr into the Logs tab): per process, lines a
# second and at once, and text waiting to be sent; past them a line is dropped and counted.
CONSOLE_LINES_PER_S: Final = 1_000
CONSOLE_BURST: Final = 10_000
CONSOLE_PENDING_CHARS: Final = 4 * 1024 * 1024
DEFAULT_STATS_INTERVAL: Final = 15.0  # wandb's own default
DEFAULT_REORDER_WINDOW: Final = 2.0  # seconds a row may wait for a straggling rank
DEFAULT_STALL_TIMEOUT: Final = 300.0  # seconds without progress before a stall is reported
DEFAULT_MAX_PENDING_ROWS: Final = 10_000  # rows held for reordering before the oldest is forced

# Client batching: a batch is sent when it holds BATCH_RECORDS records, or BATCH_BYTES bytes,
# or FLUSH_INTERVAL seconds after its first record (by the per-process flusher thread).
# Large batches make few sends (each costs log() CPU); a rank logging under
# BATCH_RECORDS / FLUSH_INTERVAL records/s still sends by time, so a SIGKILL loses at most
# FLUSH_INTERVAL seconds of its records.
BATCH_RECORDS: Final = 256
BATCH_BYTES: Final = 256 * 1024
FLUSH_INTERVAL: Final = 0.1
# A rank that sent nothing for this long sends an empty batch (a heartbeat).
HEARTBEAT_INTERVAL: Final = 1.0
# A rank on another host that sent nothing (not even a heartbeat) for this long is gone.
REMOTE_SILENCE: Final = 5.0
# Batches queued in ZeroMQ per stream before log() starts dropping (and counting) records:
# up to SEND_HWM * BATCH_RECORDS = 128,000 records.
SEND_HWM: Final = 500
# How long a finishing client waits for its last batches to leave the process.
FINAL_FLUSH_TIMEOUT: Final = 5.0
# A rank's replay buffer (records sent but not yet saved in the run's transaction log): the
# defaults of the options replay_max_records and replay_max_bytes. 65,536 records is 256
# batches, which fit in ZeroMQ's queue (SEND_HWM) when they are resent.
DEFAULT_REPLAY_MAX_RECORDS: Final = 65_536
DEFAULT_REPLAY_MAX_BYTES: Final = 64 * 1024 * 1024
# The owner starts a new logger at most this many times in LOGGER_RESTART_WINDOW seconds.
DEFAULT_MAX_LOGGER_RESTARTS: Final = 3
LOGGER_RESTART_WINDOW: Final = 600.0
# A closing rank whose goodbye the logger received waits up to this long for word that its
# last records are on disk (they are lost if the logger dies before, with the rank gone).
SAVED_WAIT: Final = 1.0
# A closing rank whose logger died waits this long for its successor (the owner restarts it),
# past its own exit timeout: a restart takes seconds, more on a loaded machine.
RESTART_WAIT: Final = 30.0
# How long Run.rank waits for the logger's WELCOME.
WELCOME_TIMEOUT: Final = 10.0

# The logger: poll period (also how fast it notices a dead owner or rank).
LOGGER_TICK: Final = 0.05
# wandb's transaction log flushes every 15 s by default; a crash then loses up to 15 s. The
# logger tells a rank its records are saved only once they are flushed (``_logger/saving``):
# a short interval keeps the ranks' replay buffers small and their exits quick.
TRANSACTION_LOG_FLUSH_INTERVAL: Final = 0.2

# Exit codes recorded in the run for each way a job can end.
EXIT_OK: Final = 0
EXIT_EXCEPTION: Final = 1
EXIT_OWNER_LOST: Final = 1  # the owner vanished without closing (killed, or os._exit)
EXIT_RANK_DIED: Final = 1  # run_mode="new": the run of a rank that died without finishing
# The logger's own exit when wandb-core died under it: the owner starts a new logger (any
# exit but after a CLOSE is restarted; this one says why in the logger's exit status).
EXIT_LOGGER_RESTART: Final = 75  # EX_TEMPFAIL
EXIT_SIGINT: Final = 130  # 128 + SIGINT, the shell's convention
EXIT_SIGTERM: Final = 143  # 128 + SIGTERM

REDUCERS: Final = ("mean", "sum", "min", "max", "first", "concat", "merge", "spread")
RUN_MODES: Final = ("auto", "shared", "new")
RANK_SCOPES: Final = ("global", "worker")
# What an online run does when W&B does not answer at start: record offline under the same
# id (training goes on; `wandb sync` uploads it later), or raise as plain wandb.init does.
ON_NETWORK_ERROR: Final = ("offline", "raise")
# A job restarted by torchrun or requeued by SLURM: one run across its attempts, or a run per
# attempt as plain wandb (_attempts.py).
RESTARTS: Final = ("continue", "new")
# A job on several nodes: a node logger per node between the node's ranks and the root logger
# ("node"), every rank straight to the root ("flat"), or the node tier when there is more
# than one node ("auto"). Issue 38.
TIERS: Final = ("auto", "node", "flat")
