"""The shape of the code: one-way layers, no import cycle, pack facts in packs/, checkpoint
names in one module (docs/ARCHITECTURE.md, "Layers").

Every import is read from the source with `ast`, lazy ones (inside functions) included; only
imports under `if TYPE_CHECKING:` are left out, as they never run.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("trainer_core", "ui")

# bottom up; a module may import its own layer and the layers below, never one above
LAYERS = ("base", "contract", "fixtures", "packs", "project", "stages", "services", "ui")


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "ui":
        return "ui"
    if module == "trainer_core" or parts[1] == "base":
        return "base"
    if parts[1] == "contract":
        return "contract"
    if module in ("trainer_core.demo", "trainer_core.demo.fixtures"):
        return "fixtures"
    if parts[1] == "packs":
        return "packs"
    if module == "trainer_core.project":
        return "project"
    if parts[1] == "stages":
        return "stages"
    return "services"


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not _is_type_checking(child):
                stack.append(child)


def _imported(module: str, path: Path) -> set[str]:
    """The names this module imports at run time (modules of ours, or the top package of others)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{a.name}" for a in node.names)
    return names


def _ours(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        targets = {_ours(n) for n in _imported(module, path)}
        graph[module] = {t for t in targets if t and t != module}
    return graph


GRAPH = _graph()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
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
                    out.append(sorted(component))
    return out


def test_the_checker_sees_a_cycle_and_lazy_imports():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # a lazy import inside a function counts; one under TYPE_CHECKING does not
    tree = ast.parse("if TYPE_CHECKING:\n    import x\ndef f():\n    import y\n")
    found = {a.name for n in _runtime_nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    assert found == {"y"}


def test_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_imports_point_down_the_layers():
    upward = [f"{m} ({layer_of(m)}) imports {t} ({layer_of(t)})"
              for m, targets in GRAPH.items() for t in targets
              if LAYERS.index(layer_of(t)) > LAYERS.index(layer_of(m))]
    assert upward == []


def test_the_core_never_imports_the_ui_or_gradio():
    offenders = [m for m, path in MODULES.items() if m.startswith("trainer_core")
                 for n in _imported(m, path) if n.split(".")[0] in ("ui", "gradio", "gradio_client")]
    assert offenders == []


def _string_constants(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def test_no_pack_id_outside_packs():
    from trainer_core.contract.adapter import KINDS
    from trainer_core.packs import PACKS
    allowed = {"trainer_core.base.config"}   # the reference project.json's default pack
    # an adapter kind may share its name with the pack that introduced it (the engine's "qwen35_bridge")
    found = [f"{m}:{node.lineno} {node.value!r}" for m, path in MODULES.items()
             if not m.startswith("trainer_core.packs") and m not in allowed
             for node in _string_constants(path) if node.value in PACKS and node.value not in KINDS]
    assert found == []


@pytest.mark.parametrize("name", ["best.pt", "last.pt", "last.json", "best.json", "history"])
def test_checkpoint_file_names_only_in_the_checkpoints_module(name):
    found = [f"{m}:{node.lineno}" for m, path in MODULES.items() if m != "trainer_core.contract.checkpoints"
             for node in _string_constants(path) if name in node.value.split("/")]
    assert found == []


def test_modules_stay_readable():
    long = {m: n for m, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}
