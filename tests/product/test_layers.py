"""The package's layering (``.importlinter``, drawn in docs/explanation/design.md): checked by
import-linter on the real package, shown to catch an import that climbs a layer, and no import
circle anywhere in the package."""

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root):
    """Run import-linter with the repository's contract on the package under ``root``."""
    return subprocess.run([str(LINT_IMPORTS), "--config", str(REPO / ".importlinter"),
                           "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120)


def test_the_package_keeps_its_layers():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_an_import_that_climbs_a_layer_breaks_the_contract(tmp_path):
    shutil.copytree(REPO / "ratelimit_app", tmp_path / "ratelimit_app",
                    ignore=shutil.ignore_patterns("__pycache__"))
    engine = tmp_path / "ratelimit_app" / "decision" / "engine.py"
    # the pure decision steps reaching up for the process's Limiter
    engine.write_text(engine.read_text() + "\n\ndef _climb():\n"
                      "    from ..runtime.limiter import default_limiter\n\n"
                      "    return default_limiter\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout
    assert "ratelimit_app.decision.engine -> ratelimit_app.runtime.limiter" in result.stdout


def test_a_module_outside_every_layer_breaks_the_contract(tmp_path):
    shutil.copytree(REPO / "ratelimit_app", tmp_path / "ratelimit_app",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "ratelimit_app" / "helpers.py").write_text('"""Where does this belong?"""\n')
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout
    assert "ratelimit_app.helpers" in result.stdout


def import_circles(graph, modules):
    """Return the sets of modules that import each other in a circle (Tarjan's components)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module) & modules:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            circle = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                circle.add(member)
                if member == module:
                    break
            if len(circle) > 1:
                circles.append(circle)

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return circles


def test_no_module_imports_itself_through_others(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    graph = grimp.build_graph("ratelimit_app", cache_dir=None)
    assert import_circles(graph, set(graph.modules)) == []


def test_the_circle_finder_finds_a_circle(monkeypatch, tmp_path):
    package = tmp_path / "circular_example"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def late():\n    from . import c\n")
    (package / "c.py").write_text("from .a import *\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circular_example", cache_dir=None)
    assert import_circles(graph, set(graph.modules)) == [
        {"circular_example.a", "circular_example.b", "circular_example.c"}]
