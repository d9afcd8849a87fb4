"""The soak harness: a program run over and over with injected faults, every exit checked.

``wandb-funnel soak -- COMMAND`` points it at a user's own program; ``wandb-funnel soak
--matrix FILE`` runs a fault matrix (this project's is ``soak/scenarios.py`` in its
repository, with its programs; ``tests/soak/`` runs it briefly in CI). Its command line is
``wandb_funnel._soak_command``.
- ``scenarios``: what a scenario is (``Scenario``, ``Fault``), matrix files
  (``load_matrix``), and the faults a user's command gets (``USER_FAULTS``, ``user_matrix``);
- ``probe`` is how a program may tell the harness what it sent and when things happened;
- ``session`` runs a soak: iterations round-robin on ``--jobs`` threads, Ctrl-C, the table;
- ``harness`` runs one iteration in a private directory and checks it, with ``job`` (the
  job's processes by role, signalled, killed), ``faults`` (the fault injected), ``checks``
  (the verdict once the job has ended) and ``iteration`` (``Iteration``, what it found);
- ``jobenv`` builds a job's clean offline environment and finds its processes by a marker
  (the tests and the benchmarks use it too);
- ``runfile`` reads back the ``.wandb`` file wandb wrote;
- ``report`` turns iterations into the table (text, JSON, Markdown).
"""
