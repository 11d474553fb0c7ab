"""The shape of the code: one-way layers, no import cycle, pack and adapter-kind facts in their own
folders, checkpoint names in one module (docs/ARCHITECTURE.md, "Layout").

Every import is read from the source with `ast`: lazy ones (inside functions) and those under
`if TYPE_CHECKING:` included, since a type-only import is still a dependency the next change turns
into a real one. The registries' discovery (the kinds found in their folder, the packs found by entry
point) counts as imports of what they find. The layer order is the one docs/ARCHITECTURE.md states.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("trainer_core", "ui")



def _documented_layers() -> tuple[str, ...]:
    """The one layer order, bottom up, as docs/ARCHITECTURE.md writes it ("Layers, bottom up: a, b, …")."""
    found = re.search(r"^Layers, bottom up: (.+)$", (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8"),
                      re.MULTILINE)
    assert found, "docs/ARCHITECTURE.md states no layer order"
    return tuple(name.strip(" .`") for name in found.group(1).split(","))


# bottom up; a module may import its own layer and the layers below, never one above
LAYERS = _documented_layers()


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "ui":
        return "ui"
    if module == "trainer_core" or parts[1] == "base":
        return "base"
    if parts[1] == "contract":
        return "contract"
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


def _imported(module: str, path: Path) -> set[str]:
    """The names this module imports at run time (modules of ours, or the top package of others)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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


def _discovered() -> dict[str, set[str]]:
    """What the registries import without naming it: every kind module of contract/kinds/ (and of the
    entry points), every pack's module (folder or entry point)."""
    from trainer_core.contract.kinds import registered
    from trainer_core.packs import PACKS
    kinds = {type(k).__module__ for k in registered().values()}
    packs = {type(p).__module__ for p in PACKS.values()} | {_pack_module(p) for p in PACKS.values()}
    return {"trainer_core.contract.kinds": {m for m in kinds if m in MODULES},
            "trainer_core.packs": {m for m in packs if m in MODULES}}


def _pack_module(pack) -> str:
    import sys
    return next((name for name, module in list(sys.modules.items())
                 if getattr(module, "PACK", None) is pack and name in MODULES), type(pack).__module__)


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        targets = {_ours(n) for n in _imported(module, path)}
        graph[module] = {t for t in targets if t and t != module}
    for registry, found in _discovered().items():
        graph[registry] |= found - {registry}
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


def test_the_checker_sees_a_cycle_lazy_and_type_checking_imports(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # a lazy import inside a function counts, and so does one under TYPE_CHECKING
    module = tmp_path / "m.py"
    module.write_text("if TYPE_CHECKING:\n    import x\ndef f():\n    import y\n")
    assert _imported("m", module) == {"x", "y"}


def test_the_registries_count_as_importing_what_they_discover():
    assert {"trainer_core.contract.kinds.resampler", "trainer_core.contract.kinds.qwen35_bridge"} <= \
        GRAPH["trainer_core.contract.kinds"]
    assert "trainer_core.packs.llada_image" in GRAPH["trainer_core.packs"]


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


def _owns_kind_or_pack_facts(module: str) -> bool:
    return module.startswith(("trainer_core.packs", "trainer_core.contract.kinds"))


def test_no_pack_id_or_adapter_kind_outside_their_folders():
    """No exemption: a kind named like the pack that introduced it is still a leak outside both."""
    from trainer_core.contract.kinds import kind_names
    from trainer_core.packs import PACKS
    names = set(PACKS) | set(kind_names()) | {"token_aligned", "layerwise"}
    found = [f"{m}:{node.lineno} {node.value!r}" for m, path in MODULES.items() if not _owns_kind_or_pack_facts(m)
             for node in _string_constants(path) if node.value in names]
    assert found == []


def test_no_pack_folder_imports_another_pack_folder():
    """What two packs share lives in packs/common/: a pack folder imports packs/base, its helpers, packs/common and
    the layers below, never a sibling pack (the lazy imports too)."""
    packs_dir = ROOT / "trainer_core" / "packs"
    folders = {p.name for p in packs_dir.iterdir() if p.is_dir() and (p / "__init__.py").exists()} - {"common"}
    found = []
    for folder in sorted(folders):
        for path in (packs_dir / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                for name in names:
                    parts = name.split(".")
                    if parts[:2] == ["trainer_core", "packs"] and len(parts) > 2 and parts[2] in folders - {folder}:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert folders and found == []


@pytest.mark.parametrize("name", ["best.pt", "last.pt", "last.json", "best.json", "history"])
def test_checkpoint_file_names_only_in_the_checkpoints_module(name):
    found = [f"{m}:{node.lineno}" for m, path in MODULES.items() if m != "trainer_core.contract.checkpoints"
             for node in _string_constants(path) if name in node.value.split("/")]
    assert found == []


def test_modules_stay_readable():
    long = {m: n for m, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}
