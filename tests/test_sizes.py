"""The package's sizes (issue 35): no class over 300 lines, no function over 80, no module over
500 in ``src/wandb_funnel``. Past one of them a part has more than one job: split it where a
part has a job of its own (docs/DESIGN.md lists the parts), not where the number falls."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "wandb_funnel"
LIMITS = {"module": 500, "class": 300, "function": 80}


def _sizes() -> list[tuple[str, int, str]]:
    found: list[tuple[str, int, str]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        found.append(("module", len(text.splitlines()), rel))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((kind, size, f"{rel}:{node.lineno} {node.name}"))
    return found


def test_no_part_of_the_package_is_past_its_size() -> None:
    sizes = _sizes()
    assert any(kind == "class" for kind, _, _ in sizes)  # the walk found the package
    over = [f"{kind} {where}: {size} lines" for kind, size, where in sizes if size > LIMITS[kind]]
    assert not over, "past the limits (split by job):\n" + "\n".join(over)
