"""The layout is the architecture: imports run one way, and docs/architecture.md describes the code as it is."""

import ast
import importlib
import re
from pathlib import Path

import pytest

from sleuth.core.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()

# What each part may import of sleuth (itself aside): the one flow, top to bottom.
ALLOWED = {
    "cli": None,
    "servers": {"training", "rewards", "agents", "envs", "tasks", "verifiers", "core"},
    "__init__": {"envs", "tasks", "verifiers"},
    "view": {"agents", "envs", "tasks", "verifiers", "core"},
    "training": {"rewards", "agents", "envs", "tasks", "verifiers", "core"},
    "rewards": {"agents", "envs", "tasks", "verifiers", "core"},
    "agents": {"envs", "tasks", "verifiers", "core"},
    "synth": {"tasks", "sandbox", "verifiers", "core"},
    "envs": {"tasks", "verifiers", "sandbox", "core"},
    "verifiers": {"sandbox", "core"},
    "tasks": {"core"},
    "sandbox": {"core"},
    "core": set(),
}
FOLDERS = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))


def _part(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    """The parts of sleuth a module imports, at the top or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "sleuth" else [node.module]
        else:
            continue
        out |= {n.split(".")[1] for n in names if n.startswith("sleuth.")}
    return out


def test_every_part_of_the_package_has_its_place_in_the_flow():
    modules = [p.stem for p in ROOT.glob("*.py") if p.name != "setup.py"]
    assert set(FOLDERS) | set(modules) <= set(ALLOWED), set(FOLDERS) | set(modules) - set(ALLOWED)


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_imports_run_one_way(part):
    files = sorted((ROOT / part).rglob("*.py")) if (ROOT / part).is_dir() else [ROOT / f"{part}.py"]
    if ALLOWED[part] is None:
        return
    bad = {f"{f.relative_to(ROOT)} imports sleuth.{dst}" for f in files for dst in _imports(f) - {part}
           if dst not in ALLOWED[part] and dst in ALLOWED}
    assert not bad, sorted(bad)


def test_the_architecture_page_names_every_folder_and_module():
    for folder in FOLDERS:
        assert f"`{folder}/`" in DOC, folder
    for module in ("core/net.py", "core/registry.py", "cli/main.py"):
        assert f"`{module}`" in DOC, module


def test_the_registries_the_page_names_are_registries_with_those_entry_point_groups():
    rows = re.findall(r"`(sleuth\.[\w.]+\.([A-Z_]+))`[^|]*\| `(sleuth\.\w+)`", DOC)
    assert len(rows) >= 4, rows
    for dotted, name, group in rows:
        registry = getattr(importlib.import_module(dotted.rsplit(".", 1)[0]), name)
        assert isinstance(registry, Registry), dotted
        assert registry.group in (group, None), (dotted, registry.group, group)
    from sleuth.envs.registry import ENV_GROUP

    assert "`sleuth.envs.registry.ENVS`" in DOC and f"`{ENV_GROUP}`" in DOC


def test_the_protocols_the_page_names_exist():
    for dotted in re.findall(r"`(sleuth\.[\w.]+)`", DOC):
        if dotted.count(".") < 1 or dotted in ("sleuth.estimators", "sleuth.envs", "sleuth.tasks",
                                               "sleuth.verifiers", "sleuth.extractors", "sleuth.parsers",
                                               "sleuth.env_families", "sleuth.policy_losses", "sleuth.servers"):
            continue  # entry-point groups, and packages that are checked as folders
        module, _, attr = dotted.rpartition(".")
        try:
            obj = importlib.import_module(dotted)
        except ImportError:
            obj = getattr(importlib.import_module(module), attr, None)
        assert obj is not None, dotted


def test_the_policy_protocol_imports_no_policy():
    """`agents/policies/base.py` holds the protocol and its data; the factory (`agents/policies/load.py`) imports the
    implementations, which import the protocol, so nothing imports back."""
    tree = ast.parse((ROOT / "agents" / "policies" / "base.py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in imported if m.startswith("sleuth.agents")}, imported


def _module_graph() -> dict[str, set[str]]:
    """sleuth's modules → the modules of sleuth each imports, at the top or inside functions."""
    mods = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if _part(path) in ALLOWED and "vllm_ext" not in rel.parts:
            mods[".".join(("sleuth", *rel.with_suffix("").parts)).removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        graph[name] = {m for m in found if m in mods and m != name}
    return graph


def test_no_module_imports_itself_back_through_others():
    """No import circle between modules (a factory beside its protocol, importing the implementations that
    import the protocol, is the usual one): every module can be read before the ones that import it."""
    graph, done, circles = _module_graph(), set(), []

    def visit(name: str, path: list[str]) -> None:
        for nxt in sorted(graph[name]):
            if nxt in path:
                circles.append(" → ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not circles, circles[:5]


def test_every_exception_sleuth_raises_on_purpose_has_the_one_root():
    """Each exception class of the package derives from `SleuthError` (through a branch that carries its exit
    code), so the CLI catches one root; a class that subclasses a builtin exception alone is refused. (The code
    sandbox's `_TestTimeout` is a `BaseException` on purpose: a test's own `except Exception` must not catch it.)"""
    builtin = {"Exception", "RuntimeError", "ValueError", "LookupError", "KeyError", "OSError", "TypeError",
               "ImportError", "TimeoutError", "ConnectionError"}
    roots = {"SleuthError", "BadInput", "InfraFailure", "TrainingError", "ConfigError"}
    loose = []
    for path in ROOT.rglob("*.py"):
        if _part(path) not in ALLOWED or "vllm_ext" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                         if isinstance(b, (ast.Name, ast.Attribute))}
                if bases & builtin and not bases & roots and node.name != "SleuthError":
                    loose.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert not loose, loose
