"""The node tier (issue 38): one node logger per node of a multi-node job, between the
node's ranks and the root logger.

- ``relay.py``: the node logger's loop (the node's streams in, one TCP connection out; its
  death survived).
- ``__main__.py``: its process (started by ``NODE_BOOTSTRAP``, which does not run the
  package's ``__init__``).
- ``starter.py``: the rank side: the node's first rank starts it and restarts it when it dies.
"""
