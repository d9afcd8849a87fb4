"""Installs wandb-funnel into every Python process started from an installed one.

``wandb_funnel.install()`` and ``wandb-funnel run`` put this directory first on
``PYTHONPATH`` and export ``_WANDB_FUNNEL_INSTALL``; Python imports ``sitecustomize`` at
startup. Nothing of wandb_funnel is imported here until the process imports ``wandb``
itself: a process that never logs (torchrun's agent, a DataLoader worker, a compiler) pays
an environment lookup and a finder on ``sys.meta_path`` (``importlib.machinery`` is loaded
at startup anyway; ``importlib.abc`` would cost ~15 ms, so the finder is a plain class).
Then the funnel is installed into the freshly loaded module, before anyone can call it.

A ``sitecustomize`` that this one shadows (a distribution's, a virtualenv's) still runs.
"""

import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))


class _InstallWhenWandbLoads:
    """A meta-path finder that answers for ``wandb`` only: it finds the real module with the
    path finder and wraps its loader, so that the module is installed into once it has run.

    It stays on ``sys.meta_path`` until wandb is loaded: libraries ask for the spec first
    (``importlib.util.find_spec("wandb")``: HF and accelerate) and import it later."""

    done = False

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != "wandb" or self.done:
            return None
        import importlib.machinery

        # Asked of the path finder directly, not through sys.meta_path: no recursion.
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module
        finder = self

        def exec_module(module):  # type: ignore[no-untyped-def]
            finder.done = True  # inert from now on (removing it races other importers)
            try:  # the logger imports wandb beside this import (_owner/prewarm.py)
                # The light module (28 ms), not install's (106 ms): the logger starts sooner.
                from wandb_funnel._wandb_module.hooks import prewarm_logger

                prewarm_logger()
            except Exception:  # never break the user's `import wandb`
                pass
            load(module)
            try:
                from wandb_funnel._wandb_module.install import install_into

                install_into(module)
            except Exception as exc:  # never break the user's `import wandb`
                sys.stderr.write(f"wandb-funnel: could not install into wandb: {exc!r}\n")

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install_on_import() -> None:
    if "wandb" in sys.modules:  # imported already (by another startup hook)
        from wandb_funnel._wandb_module.install import install_into

        install_into(sys.modules["wandb"])
    elif not any(isinstance(f, _InstallWhenWandbLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _InstallWhenWandbLoads())


def _chain() -> None:
    """Run the ``sitecustomize`` that this one shadows, if there is one (never this one
    again, however its directory is spelled on ``sys.path``). Checked with ``os.path`` first:
    importing ``importlib.util`` costs ~12 ms, which only a process that has one pays."""
    for entry in sys.path:
        base = entry or os.curdir
        for name in ("sitecustomize.py", "sitecustomize"):  # a module, or a package
            candidate = os.path.join(base, name)
            if not os.path.exists(candidate):
                continue
            try:
                if os.path.dirname(os.path.realpath(candidate)) == _HERE:
                    break  # this file, by another spelling: look further
            except OSError:
                break
            _run_other(base)
            return


def _run_other(directory: str) -> None:
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [directory])
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if os.environ.get("_WANDB_FUNNEL_INSTALL"):
    try:
        _install_on_import()
    except Exception as exc:  # a startup hook must never stop Python from starting
        sys.stderr.write(f"wandb-funnel: install hook failed: {exc!r}\n")
_chain()
