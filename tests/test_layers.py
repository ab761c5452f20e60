"""The package's layering (ARCHITECTURE.md): which layer may import which,
which room of the runtime may import which, no import circles, and layers
below the runtime that work without Ray or torch."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

import ray_stagetree

# Layers from the bottom up; a module may import its own layer and those listed before it.
LAYERS = [
    "sequences",
    "planning",
    "execution",
    "searchers",
    "trial_schedulers",
    "simulation",
    "testing",
    "trainables",
    "monitor",
    "runtime",
    "jobs",
]
PURE_LAYERS = ("sequences", "planning", "execution")
# The runtime's rooms from the bottom up, under the same rule.
ROOMS = ["workers", "control", "service", "driver"]
# What the driver may import of the controller side: the actor, its settings
# (StudySpec, WorkerSpec, which starts the workers), and the snapshot files
# Tuner.restore reads. Everything else of the controller's is behind its actor.
CONTROL_API = {
    "ray_stagetree.runtime.control.controller",
    "ray_stagetree.runtime.control.spec",
    "ray_stagetree.runtime.control.experiment_state",
    "ray_stagetree.runtime.control.messages",
}


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name, each layer
    walked from where its package is found (setup.cfg maps searchers/ and
    trainables/ into the package from the top of the repository)."""
    found = {"ray_stagetree": Path(ray_stagetree.__file__)}
    for layer in LAYERS:
        spec = importlib.util.find_spec(f"ray_stagetree.{layer}")
        found[spec.name] = Path(spec.origin)
        for info in pkgutil.walk_packages(spec.submodule_search_locations, f"{spec.name}."):
            found[info.name] = Path(info.module_finder.find_spec(info.name).origin)
    for info in pkgutil.iter_modules(ray_stagetree.__path__, "ray_stagetree."):
        if not info.ispkg:
            found[info.name] = Path(info.module_finder.find_spec(info.name).origin)
        elif info.name not in found:  # a package beside the layers (the cli)
            spec = importlib.util.find_spec(info.name)
            found[spec.name] = Path(spec.origin)
            for inner in pkgutil.walk_packages(spec.submodule_search_locations, f"{spec.name}."):
                found[inner.name] = Path(inner.module_finder.find_spec(inner.name).origin)
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source
    (top level, inside functions, under TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    return {target for target in targets if target in modules and target != name}


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _room(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "runtime" and parts[2] in ROOMS else None


@pytest.fixture(scope="module")
def import_graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        graph.add_edges_from((name, target) for target in _imports(name, path, modules))
    return graph


def test_the_layers_are_all_there(import_graph):
    assert {_layer(name) for name in import_graph} - {None} == set(LAYERS)


def test_no_import_circles(import_graph):
    # The top-level package re-exports the public API from every layer; modules
    # never import it, so leaving it out hides no circle.
    inner = import_graph.subgraph(name for name in import_graph if name != "ray_stagetree")
    assert [name for name in import_graph.predecessors("ray_stagetree")] == []
    assert list(nx.simple_cycles(inner)) == []


def test_each_layer_imports_only_the_layers_below_it(import_graph):
    violations = []
    for source, target in import_graph.edges:
        source_layer, target_layer = _layer(source), _layer(target)
        if source_layer and target_layer and LAYERS.index(target_layer) > LAYERS.index(source_layer):
            violations.append(f"{source} ({source_layer}) imports {target} ({target_layer})")
    assert violations == []


def test_the_runtime_is_all_in_rooms(import_graph):
    loose = [name for name in import_graph if _layer(name) == "runtime" and name != "ray_stagetree.runtime"]
    assert [name for name in loose if _room(name) is None] == []
    assert {_room(name) for name in loose} == set(ROOMS)


def test_each_room_imports_only_the_rooms_below_it(import_graph):
    violations = []
    for source, target in import_graph.edges:
        source_room, target_room = _room(source), _room(target)
        if source_room and target_room and ROOMS.index(target_room) > ROOMS.index(source_room):
            violations.append(f"{source} ({source_room}) imports {target} ({target_room})")
    assert violations == []


def test_the_driver_reaches_the_controller_only_through_its_actor_api(import_graph):
    reached = {
        target
        for source, target in import_graph.edges
        if _room(source) == "driver" and _room(target) == "control" and target != "ray_stagetree.runtime.control"
    }
    assert reached <= CONTROL_API


def test_the_layers_below_the_runtime_import_without_ray_or_torch():
    pure = sorted(name for name in _modules() if _layer(name) in PURE_LAYERS)
    code = (
        "import sys\n"
        "sys.modules['ray'] = None  # any 'import ray' now raises ImportError\n"
        "sys.modules['torch'] = None\n"
        "import importlib\n"
        f"for name in {pure!r}:\n"
        "    importlib.import_module(name)\n"
        "import ray_stagetree\n"
        "from ray_stagetree import CriticalPathPolicy, MultiStep, merge_rate\n"
        "from ray_stagetree.planning import SearchPlan, build_stage_tree\n"
        "plan = SearchPlan()\n"
        "plan.add_trials([('a', {'lr': MultiStep(0.1, [5], 0.1)}, 10), ('b', {'lr': MultiStep(0.1, [7], 0.1)}, 10)])\n"
        "print(len(build_stage_tree(plan).stages), len(CriticalPathPolicy().select(plan, 2)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(pure) > 10
    stages, batches = map(int, result.stdout.split())
    assert stages == 3 and batches >= 1


def _ray_private_imports(path: Path) -> list[str]:
    """The private Ray modules (``ray._private``, ``ray.train._internal``, ...)
    and private Ray names ``path`` imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [
            f"line {node.lineno}: {name}"
            for name in names
            if name.split(".")[0] == "ray" and any(part.startswith("_") for part in name.split(".")[1:])
        ]
    return sorted(set(found))


def test_only_ray_fields_imports_what_ray_keeps_private():
    """Ray's private modules and names are read in trial_schedulers/ray_fields.py,
    each through a function tested on the installed Ray (ARCHITECTURE.md's rule):
    a Ray upgrade that moves one fails there, by name."""
    allowed = "ray_stagetree.trial_schedulers.ray_fields"
    offenders = {
        name: found for name, path in _modules().items() if name != allowed and (found := _ray_private_imports(path))
    }
    assert offenders == {}


def test_every_package_is_in_the_distribution():
    """setup.cfg lists the packages a wheel holds: a package left out imports
    in this editable checkout and is missing from `pip install .`."""
    import configparser

    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    listed = set(setup["options"]["packages"].split())
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert packages - listed == set()


def _foreign_private_reads(path: Path) -> list[str]:
    """Where ``path`` reads another object's ``_``-name: ``other._name``,
    except on ``self``, ``cls``, ``super()``, an imported module
    (``sys._getframe``), or another instance of the class that defines
    ``_name`` (Python's convention: a class's privates are its own)."""
    tree = ast.parse(path.read_text())
    modules = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    found = []

    def visit(node: ast.AST, own: set[str]) -> None:
        if isinstance(node, ast.ClassDef):
            own = own | {
                child.attr
                for child in ast.walk(node)
                if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name) and child.value.id == "self"
            }
            own |= {child.name for child in node.body if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)}
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
            value = node.value
            exempt = (
                (isinstance(value, ast.Name) and value.id in {"self", "cls", *modules})
                or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super")
                or node.attr in own
            )
            if not exempt:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, own)

    visit(tree, set())
    return found


def test_no_runtime_module_reads_another_objects_private_names():
    """The runtime's objects talk through their public methods (the loop and
    its studies through `LoopPort`, the driver and the Tuner through
    `runtime.driver.run`): a private name read from outside is a seam that
    a refactoring breaks silently."""
    offenders = {
        name: found
        for name, path in _modules().items()
        if name.startswith("ray_stagetree.runtime.") and (found := _foreign_private_reads(path))
    }
    assert offenders == {}


#: The most lines a module, and a class, of the package may have: past them
#: a file stops being readable in one sitting (a reason at its top does not
#: change that; split it along the seam it has).
MODULE_LINES, CLASS_LINES = 700, 600


def test_no_module_or_class_outgrows_one_reading():
    too_long = []
    for name, path in _modules().items():
        text = path.read_text()
        if text.count("\n") > MODULE_LINES:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_LINES:
                too_long.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []


def test_architecture_names_every_module():
    """ARCHITECTURE.md's map of the package names every module, so that a
    new engineer finds where each thing lives (and a new module is placed)."""
    architecture = (Path(__file__).resolve().parents[1] / "ARCHITECTURE.md").read_text()
    unnamed = [
        name
        for name, path in _modules().items()
        if path.name != "__init__.py" and path.name != "__main__.py" and path.name not in architecture
    ]
    assert unnamed == []
