"""The import direction of docs/DESIGN.md's map, held by a test: a module of one process role
never imports another role's modules, and nothing below the API imports the API."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "wandb_funnel"

# role (a module or subpackage of wandb_funnel) -> the roles it must never import
FORBIDDEN: dict[str, set[str]] = {
    "_protocol": {"_worker", "_owner", "_logger", "_api", "_wandb", "_current", "_installed"},
    "_worker": {"_owner", "_logger", "_api", "_wandb", "_launched_init", "_installed"},
    "_owner": {"_logger", "_api", "_launched_init", "_installed"},
    "_logger": {"_worker", "_owner", "_api", "_current", "_launched_init", "_installed"},
    "_options": {"_protocol", "_worker", "_owner", "_logger", "_api", "_installed"},
    "_constants": {"_protocol", "_worker", "_owner", "_logger", "_api", "_options", "_installed"},
    "_current": {"_protocol", "_owner", "_logger", "_api", "_installed"},
    "_pid": {"_protocol", "_worker", "_owner", "_logger", "_api", "_installed"},
    "_wandb": {"_worker", "_owner", "_logger", "_api", "_installed"},
    "_launched_init": {"_logger", "_api", "_installed"},
    "_api": {"_installed"},
    # The wandb-facing layer sits on top: it uses the API, never the logger's insides.
    "_installed": {"_logger"},
    "integrations": {"_logger", "_owner", "_protocol"},
    # The startup hook imports only the installer, and only once wandb is imported.
    "_bootstrap": {"_api", "_worker", "_owner", "_logger", "_protocol"},
}


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
