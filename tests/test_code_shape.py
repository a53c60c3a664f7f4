"""The package's functions fit on a screen: none is longer than ``MAX_FUNCTION_LINES`` lines
(its decorators aside, its docstring included)."""

from __future__ import annotations

import ast
from pathlib import Path

import saguaro

ROOT = Path(saguaro.__file__).parent
MAX_FUNCTION_LINES = 50


def long_functions(root: Path, limit: int) -> list[str]:
    """``path:line name (n lines)`` of every function under ``root`` longer than ``limit``
    lines, nested ones and methods included."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_is_longer_than_a_screen():
    assert long_functions(ROOT, MAX_FUNCTION_LINES) == []


def test_the_checker_sees_a_long_method(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(3))
    (pkg / "m.py").write_text(
        f"class C:\n    def f(self):\n{body}\n    def g(self):\n        pass\n"
    )
    assert long_functions(pkg, 3) == ["pkg/m.py:2 f (4 lines)"]
