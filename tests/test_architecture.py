"""The house's shape, checked by tools rather than by review (README, Layout).

- the import contracts in pyproject.toml (``lint-imports``): views over parts over resources over core, the
  server apart from the kernel's parts;
- no import circle anywhere in the package (import-linter's own graph, grimp);
- no part imports the package ``nbcoord`` (the public API) or the wiring: only the entry point does;
- no module over 500 lines (a longer one usually holds two concerns);
- no test module imports another (shared helpers live in support modules).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nbcoord"
MAX_MODULE_LINES = 500


def _import_graph() -> grimp.ImportGraph:
    return grimp.build_graph("nbcoord", include_external_packages=False, exclude_type_checking_imports=False)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint is not None, "import-linter is part of the test extra"
    done = subprocess.run([lint], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_no_import_circle_in_the_package() -> None:
    graph = _import_graph()
    edges = {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    # The check above must be able to fail.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_only_the_entry_point_imports_the_package_or_the_wiring() -> None:
    graph = _import_graph()
    importers = {
        module
        for target in ("nbcoord", "nbcoord._wiring")
        for module in graph.find_modules_that_directly_import(target)
    }
    assert importers <= {"nbcoord", "nbcoord._wiring"}, sorted(importers)


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these by concern: {long}"


def test_no_test_module_imports_another() -> None:
    tests = {path.stem for path in (ROOT / "tests").glob("test_*.py")}
    offenders: dict[str, list[str]] = {}
    for path in (ROOT / "tests").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            hits = [name for name in names if name.split(".")[0] in tests]
            if hits:
                offenders.setdefault(path.name, []).extend(hits)
    assert offenders == {}, offenders


def test_no_module_shadows_a_public_name() -> None:
    # Importing nbcoord.X binds the attribute nbcoord.X to the module: a subpackage named like a function of the
    # API (nbcoord.panel) would replace the function the first time anything imports it.
    import nbcoord

    modules = {path.stem for path in PACKAGE.glob("*.py")}
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert (modules | packages) & set(nbcoord.__all__) == set()
