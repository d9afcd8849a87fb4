"""The public surface is exactly what __all__ says, and importing it stays cheap."""

from __future__ import annotations

import json
import subprocess
import sys

import wandb_funnel


def test_all_names_exist() -> None:
    for name in wandb_funnel.__all__:
        assert hasattr(wandb_funnel, name), name


def test_public_names_are_all_exported() -> None:
    public = {n for n in dir(wandb_funnel) if not n.startswith("_")}
    # Submodules show up as attributes once imported; they are not API.
    modules = {"errors", "sinks", "soak", "cli", "integrations", "testing"}
    assert public - modules - {"annotations"} == set(wandb_funnel.__all__) - {"__version__"}


def test_worker_import_does_not_import_wandb_or_torch() -> None:
    """A worker that imports wandb_funnel pays for zmq and msgpack, not wandb or torch."""
    code = "import sys, wandb_funnel; print('wandb' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_worker_import_skips_the_owner_and_logger_modules() -> None:
    """What made a worker's import cost 14.6 MB (8.5 MB without them): dataclasses pulls in
    inspect, secrets pulls in hashlib and OpenSSL; the logger's modules are not a worker's."""
    heavy = ["dataclasses", "secrets", "hashlib", "argparse", "tempfile", "wandb_funnel._logger"]
    code = f"import sys, wandb_funnel; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _loaded_by(bootstrap: str, role: str, module: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules (named with ``prefixes``) a process started by ``bootstrap`` has loaded
    once it imported ``module`` instead of ``role``'s __main__ (which would run it); the
    role's own and the protocol's left out."""
    main = f"import wandb_funnel.{role}.__main__\n"
    assert main in bootstrap
    code = bootstrap.replace(main, "") + (
        f"import wandb_funnel.{module}\n"
        "import json\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({prefixes!r})"
        f" and not m.startswith(('wandb_funnel.{role}', 'wandb_funnel._protocol')))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def test_the_logger_process_loads_no_worker_or_owner_module() -> None:
    """The logger starts from LOGGER_BOOTSTRAP (the package registered, its __init__ not
    run): none of the worker stack (exit and fork hooks, signal watching) nor the API is
    loaded in it (issue 24: ``-m wandb_funnel._logger`` ran the package's __init__)."""
    from wandb_funnel._owner.logger_process import LOGGER_BOOTSTRAP

    loaded = _loaded_by(LOGGER_BOOTSTRAP, "_logger", "_logger.main", ("wandb_funnel.",))
    assert set(loaded) <= {
        "wandb_funnel._attempts",  # the run as an attempt of a restarted job
        "wandb_funnel._constants",
        "wandb_funnel._deadline",  # the close's budget
        "wandb_funnel._options",
        "wandb_funnel._outcomes",  # how a logger ends, typed
        "wandb_funnel._private_dir",  # the private directory's files
        "wandb_funnel._pid",
        "wandb_funnel.errors",
        "wandb_funnel.sinks",  # the Sink protocol and open_sink: where the rows go
        "wandb_funnel.sinks.refs",  # media refs made into what the sink writes
    }, loaded


def test_the_node_logger_process_loads_the_protocol_only() -> None:
    """A node logger (issue 38) starts from NODE_BOOTSTRAP: the protocol and the bottom
    modules, never the worker stack, the logger's modules, wandb or torch."""
    from wandb_funnel._node.starter import NODE_BOOTSTRAP

    loaded = _loaded_by(NODE_BOOTSTRAP, "_node", "_node.relay", ("wandb_funnel", "wandb", "torch"))
    assert set(loaded) <= {
        "wandb_funnel",  # the package, registered unexecuted
        "wandb_funnel._constants",
        "wandb_funnel._options",  # (imported by the protocol's messages)
        "wandb_funnel._private_dir",
        "wandb_funnel._pid",
    }, loaded
