"""The logger process: the one process that owns the funnel's wandb run.

Two threads: the receiver owns the socket and turns frames into events; the main thread runs
the loop, which may be slowed down by wandb. Each part owns its state:

- ``main``: the entry point: the start message, the socket, the run, ready, DONE.
- ``loop``: takes events, dispatches them by type, writes released rows, holds one close.
- ``receiver``: the socket's thread: decodes frames, receipts streams, queues events.
- ``streams``: the streams the logger knows: their ranks and their records' numbering.
- ``events``: what the receiver hands the loop (attached, records, update, ended).
- ``runs``: the run or runs written (one, or one per rank), each a ``RunWriter``.
- ``run_writer``: rows to the sink, nothing else (and a run's finish, given its accounting).
- ``ordering``, ``steps``, ``reduce``: rows in (step, rank) order, at wandb's steps, reduced.
- ``journal``: every record exactly once across a logger's death (with ``continuity``,
  what a dead logger leaves, and ``saving``, what is on disk).
- ``ledger``: every ``_funnel/*`` figure of a run, earlier segments included.
- ``monitor``: rank health (``health``), ``status.json``, stacks, a close's progress.
- ``closing`` and ``close_request``: the close's causes, budget and watchdog.
- ``media``, ``blobs``, ``console``: staged files, media bytes from other nodes, console lines.
- ``say``: the logger's one voice on the terminal, and its drop reports.
- ``leave``: the process's exit, its temporary directories removed first.
"""
