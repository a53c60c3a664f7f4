"""The package's import rules: layers import downward only, and no two packages import each other
(directly or through others). Lazy imports inside functions count too: they are still a
dependency, only a deferred one."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import saguaro

ROOT = Path(saguaro.__file__).parent

# (importer, imported): packages that must never depend on each other this way.
FORBIDDEN = [
    *(("models", p) for p in ("engine", "speculation", "server", "bench", "cli", "api")),
    *(("sampling", p) for p in ("engine", "models", "speculation", "core", "config")),
    *(("core", p) for p in ("engine", "speculation", "models", "server", "bench")),
    *(
        (low, high)
        for low in ("engine", "speculation", "distributed", "core", "models", "sampling")
        for high in ("server", "cli", "bench", "launch", "train", "api")
    ),
    ("engine", "speculation"),  # the engine is handed a proposer factory
    # the kernels are the bottom layer: tensors in, tensors out
    *(
        ("kernels", p)
        for p in ("models", "engine", "speculation", "sampling", "core", "config", "distributed")
    ),
]


def _unit(module: str) -> str:
    """The package (or top-level module) a dotted module name belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "saguaro"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "saguaro":  # `from saguaro import bundled` names a submodule
                for alias in node.names:
                    sub = ROOT / alias.name
                    out.add(
                        alias.name
                        if sub.is_dir() or sub.with_suffix(".py").is_file()
                        else "saguaro"
                    )
            elif node.module.startswith("saguaro."):
                out.add(_unit(node.module))
        elif isinstance(node, ast.Import):
            out |= {_unit(a.name) for a in node.names if a.name.startswith("saguaro.")}
    return out


def graph() -> dict[str, set[str]]:
    deps: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        unit = rel.parts[0] if len(rel.parts) > 1 else rel.parts[0].replace("__init__", "saguaro")
        deps[unit] |= _imports(path) - {unit}
    return deps


def _cycles(deps: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(deps.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(deps):
        if v not in index:
            visit(v)
    return out


def test_no_package_cycles():
    assert _cycles(graph()) == []


def test_layers_import_downward_only():
    deps = graph()
    broken = [(a, b) for a, b in FORBIDDEN if b in deps.get(a, ())]
    assert broken == []


def test_the_checker_sees_a_cycle_and_a_lazy_import(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    lazy = tmp_path / "m.py"
    lazy.write_text("def f():\n    from saguaro.server.routes import build_app\n")
    assert _imports(lazy) == {"server"}


def test_importing_the_package_leaves_torch_unloaded_until_a_model_is_wanted():
    """``import saguaro`` is fast (no PyTorch, about 2 s of a start); the API loads on use."""
    code = (
        "import sys, saguaro; assert 'torch' not in sys.modules, 'torch loaded'; "
        "from saguaro import LLM, SamplingParams; assert 'torch' in sys.modules; "
        "print(LLM.__module__, SamplingParams.__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["saguaro.api", "SamplingParams"]


def test_the_commands_list_loads_no_torch():
    """``saguaro --help`` answers at once: each command's module loads when that command runs."""
    listed = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "saguaro", "--help"],
        capture_output=True,
        text=True,
    )
    assert listed.returncode == 0 and "generate" in listed.stdout, listed.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in listed.stderr.splitlines()}
    assert "saguaro.cli" in loaded and "torch" not in loaded
