"""Installs wandb-funnel into every Python process started from an installed one.

``wandb_funnel.install()`` and ``wandb-funnel run`` put this directory first on
``PYTHONPATH`` and export ``WANDB_FUNNEL_INSTALL``; Python imports ``sitecustomize`` at
startup. Nothing is imported here until the process imports ``wandb`` itself: a process that
never logs (torchrun's agent, a DataLoader worker, a compiler) pays one environment lookup.
Then the funnel is installed into the freshly loaded module, before anyone can call it.

A ``sitecustomize`` that this one shadows (a distribution's, a virtualenv's) still runs.
"""

import os
import sys


def _install_on_import() -> None:
    import importlib.abc
    import importlib.machinery

    class _WandbLoaded(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
            if fullname != "wandb":
                return None
            # Asked directly of the path finder, not through sys.meta_path (no recursion).
            # This finder stays until wandb is loaded: libraries ask for the spec first
            # (``importlib.util.find_spec("wandb")``, HF and accelerate do) and import later.
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            load = spec.loader.exec_module

            def exec_module(module):  # type: ignore[no-untyped-def]
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                load(module)
                try:
                    from wandb_funnel._installed.install import install_into

                    install_into(module)
                except Exception as exc:  # never break the user's `import wandb`
                    sys.stderr.write(f"wandb-funnel: could not install into wandb: {exc!r}\n")

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    if "wandb" in sys.modules:  # imported already (by another startup hook)
        from wandb_funnel._installed.install import install_into

        install_into(sys.modules["wandb"])
    else:
        sys.meta_path.insert(0, _WandbLoaded())


def _chain() -> None:
    """Run the ``sitecustomize`` that this one shadows, if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if os.environ.get("WANDB_FUNNEL_INSTALL"):
    try:
        _install_on_import()
    except Exception as exc:  # a startup hook must never stop Python from starting
        sys.stderr.write(f"wandb-funnel: install hook failed: {exc!r}\n")
_chain()
