"""The soak harness: real user-style programs run over a fault matrix, every exit checked.

``wandb-funnel soak`` (see ``cli.py``) and the ``soak`` pytest marker both drive it:
- ``programs/`` holds the programs, each a script a user could have written;
- ``probe`` is how a program tells the harness what it sent and when things happened;
- ``scenarios`` is the matrix: a program, a fault to inject, and what must hold afterwards;
- ``harness`` runs one iteration in a private directory and checks it;
- ``runfile`` reads back the ``.wandb`` file wandb wrote;
- ``report`` turns iterations into the table (text, JSON, Markdown).
"""
