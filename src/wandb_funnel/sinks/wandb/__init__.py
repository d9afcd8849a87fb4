"""The wandb sink: everything that knows wandb's internals (with ``_wandb_module``, the only
code that imports wandb, and only inside functions or modules a worker never loads).

- ``run``: ``WandbSink``, the logger's one wandb run (rows, config, summary, metrics,
  console and system metrics records, tensorboard, files, finish);
- ``media``: descriptors back into wandb's media objects, files into the run;
- ``objects``: the worker's reading of wandb's media objects into descriptors (no import);
- ``settings``: ``wandb.Settings`` and the user's program as plain data (no import);
- ``service``: wandb-core, set up and torn down by the owner.
"""
