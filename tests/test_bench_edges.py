"""The edges of bench/: the tests import nothing from it (they run its scripts as commands at most), its engine
harness (bench/engine/) imports one way with no cycle, and no bench module names a pack by its id (what differs
between packs is read from their declarations, so a new pack is measured without editing bench/)."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO
from trainer_core.contract.kinds import kind_names
from trainer_core.packs import PACKS

BENCH = REPO / "bench"
TESTS = REPO / "tests"


def _modules(folder: Path, prefix: str = "") -> dict[str, Path]:
    """Every module under `folder`, by the name it is imported as when `folder` is on sys.path."""
    out = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        out[prefix + ".".join(parts)] = path
    return out


BENCH_MODULES = _modules(BENCH)


def _imports(path: Path, name: str) -> set[str]:
    """The modules `path` (imported as `name`) imports, relative imports resolved; lazy ones included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def _reaches_bench(node: ast.AST, text: str) -> bool:
    """sys.path.insert / append of a path naming bench, or a module loaded from its file (spec_from_file_location)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    on_sys_path = node.func.attr in ("insert", "append") and ast.unparse(node.func.value) == "sys.path"
    return (on_sys_path or node.func.attr == "spec_from_file_location") and "bench" in ast.get_source_segment(text, node).lower()


def test_no_test_module_imports_from_bench():
    tests = _modules(TESTS)
    own = {name.split(".")[0] for name in tests}              # tests/gui, tests/stages shadow bench/gui.py, stages.py
    bench_names = ({name.split(".")[0] for name in BENCH_MODULES} | {"bench"}) - own
    wrong = []
    for name, path in tests.items():
        text = path.read_text(encoding="utf-8")
        wrong += [f"{path.relative_to(REPO)} imports {m}" for m in _imports(path, name) if m.split(".")[0] in bench_names]
        wrong += [f"{path.relative_to(REPO)}:{node.lineno} reaches into bench/" for node in ast.walk(ast.parse(text))
                  if _reaches_bench(node, text)]
    assert wrong == [], "tests import nothing from bench/ (move shared helpers under tests/, which bench may import)"


def test_the_engine_harness_imports_one_way():
    graph = {name: {m for m in _imports(path, name) if m in BENCH_MODULES and m != name}
             for name, path in BENCH_MODULES.items()}
    assert not any(m.startswith("engine_") for name in graph if name.startswith("engine.") for m in graph[name]), \
        "the package never imports its command lines"
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise AssertionError("an import cycle in bench/: " + " -> ".join((*path[path.index(name):], name)))
        if name in done:
            return
        for child in sorted(graph[name]):
            visit(child, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())


def test_no_bench_module_names_a_pack():
    """A pack-id string anywhere in bench/*.py (an adapter kind's name given as `kind=`, which the bridge and Ming
    share with their packs, is a kind, not a pack)."""
    ids, kinds = set(PACKS), set(kind_names())
    wrong = []
    for path in BENCH_MODULES.values():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        as_kind = {id(k.value) for node in ast.walk(tree) if isinstance(node, ast.Call) for k in node.keywords
                   if k.arg == "kind" and isinstance(k.value, ast.Constant) and k.value.value in kinds}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in ids and id(node) not in as_kind:
                wrong.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    assert wrong == [], "read the pack's declarations (TrainerPack.engine, …) instead of naming it"
