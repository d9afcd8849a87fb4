"""The import direction of docs/DESIGN.md's map, held by a test: a module of one process role
never imports another role's modules, and nothing below the API imports the API."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "wandb_funnel"

# role (a module or subpackage of wandb_funnel) -> the roles it must never import
FORBIDDEN: dict[str, set[str]] = {
    "_protocol": {"_worker", "_owner", "_logger", "_api", "sinks", "_current", "_wandb_module"},
    "_worker": {"_owner", "_logger", "_api", "_launched_init", "_wandb_module"},
    "_owner": {"_logger", "_api", "_launched_init", "_wandb_module"},
    "_logger": {"_worker", "_owner", "_api", "_current", "_launched_init", "_wandb_module"},
    "_options": {"_protocol", "_worker", "_owner", "_logger", "_api", "sinks", "_wandb_module"},
    "_constants": {
        "_protocol",
        "_worker",
        "_owner",
        "_logger",
        "_api",
        "_options",
        "sinks",
        "_wandb_module",
    },
    "_current": {"_protocol", "_owner", "_logger", "_api", "sinks", "_wandb_module"},
    "_pid": {"_protocol", "_worker", "_owner", "_logger", "_api", "sinks", "_wandb_module"},
    # Where rows go: below the processes that use it (the logger opens a sink, the owner asks
    # its backend, a worker reads wandb's media objects through sinks.wandb.objects).
    "sinks": {
        "_worker",
        "_owner",
        "_logger",
        "_api",
        "_current",
        "_launched_init",
        "_wandb_module",
        "_bootstrap",
        "integrations",
        "testing",
        "cli",
    },
    # The node tier (issue 38): a process of its own between ranks and the root logger; the
    # rank that starts it imports only its starter.
    "_node": {"_worker", "_owner", "_logger", "_api", "_current", "sinks", "_wandb_module"},
    "_launched_init": {"_logger", "_api", "_wandb_module"},
    "_api": {"_wandb_module"},
    # The layer that mirrors wandb's module API sits on top: it uses the API, never the
    # logger's insides.
    "_wandb_module": {"_logger"},
    "integrations": {"_logger", "_owner", "_protocol"},
    # The startup hook imports only the installer, and only once wandb is imported.
    "_bootstrap": {"_api", "_worker", "_owner", "_logger", "_protocol", "sinks"},
}
# The only places that may import wandb (an allow-list: a new module anywhere else that
# imports it fails test_only_the_wandb_packages_import_wandb).
WANDB_IMPORTERS = ("sinks/wandb/", "_wandb_module/")


def _ours(path: pathlib.Path) -> set[str]:
    """The wandb_funnel roles ``path`` imports (top level and inside functions alike)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "wandb_funnel" and len(parts) > 1:
                found.add(parts[1])
    return found


def _role(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    return rel[0].removesuffix(".py")


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_imports_follow_the_map(path: pathlib.Path) -> None:
    role = _role(path)
    wrong = _ours(path) & FORBIDDEN.get(role, set())
    assert not wrong, f"{path.relative_to(PACKAGE)} ({role}) imports {sorted(wrong)}"


def test_every_role_in_the_map_exists() -> None:
    roles = {_role(p) for p in PACKAGE.rglob("*.py")}
    assert set(FORBIDDEN) <= roles


def wandb_imports(source: str) -> list[str]:
    """How ``source`` imports wandb, one entry a way (empty: it does not): ``import wandb``,
    ``from wandb... import``, ``importlib.import_module("wandb...")``, ``__import__("wandb...")``
    (anywhere: top level, functions, ``TYPE_CHECKING`` blocks), and a dynamic import whose
    name is not a literal (it could be wandb: not allowed outside the wandb packages either)."""
    found: list[str] = []

    def is_wandb(name: str) -> bool:
        return name == "wandb" or name.startswith("wandb.")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if is_wandb(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and is_wandb(node.module):
                found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else None
            )
            if name not in ("import_module", "__import__"):
                continue
            first = node.args[0] if node.args else None
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                found.append(f"{name}(<not a literal name>)")
            elif is_wandb(first.value):
                found.append(f"{name}({first.value!r})")
    return found


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_only_the_wandb_packages_import_wandb(path: pathlib.Path) -> None:
    rel = path.relative_to(PACKAGE).as_posix()
    if rel.startswith(WANDB_IMPORTERS):
        return
    found = wandb_imports(path.read_text())
    assert not found, f"{rel} imports wandb ({found}): only {WANDB_IMPORTERS} may"


@pytest.mark.parametrize(
    "source",
    [
        "import wandb\n",
        "import wandb.sdk.lib as lib\n",
        "import os, wandb\n",
        "def f():\n    from wandb.sdk import wandb_init\n",
        "from wandb import Settings\n",
        "import importlib\nimportlib.import_module('wandb.plot')\n",
        "from importlib import import_module\nimport_module('wandb')\n",
        "w = __import__('wandb')\n",
        "name = 'wan' + 'db'\n__import__(name)\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import wandb\n",
    ],
)
def test_the_checker_finds_every_way_to_import_wandb(source: str) -> None:
    assert wandb_imports(source), source


@pytest.mark.parametrize(
    "source",
    [
        "import wandb_funnel\n",
        "from wandb_funnel.sinks import wandb\n",
        "from . import wandb\n",  # a relative import: wandb_funnel's own module
        "from .wandb import run\n",
        "import wandbx\n",
        "x = 'import wandb'\n",
        "importlib.import_module('wandb_funnel._logger')\n",
    ],
)
def test_the_checker_leaves_other_imports_alone(source: str) -> None:
    assert wandb_imports(source) == [], source


def test_a_module_planted_outside_the_wandb_packages_fails(tmp_path: pathlib.Path) -> None:
    """The allow-list test run on a copy of the package with one bad module added: it fails
    for that module alone, and a module under sinks/wandb/ may import wandb."""
    import shutil

    copy = tmp_path / "wandb_funnel"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "_logger" / "planted.py").write_text("def f():\n    import wandb.sdk\n")
    (copy / "sinks" / "wandb" / "planted_ok.py").write_text("import wandb\n")
    failed = []
    for path in sorted(copy.rglob("*.py")):
        rel = path.relative_to(copy).as_posix()
        if not rel.startswith(WANDB_IMPORTERS) and wandb_imports(path.read_text()):
            failed.append(rel)
    assert failed == ["_logger/planted.py"]
