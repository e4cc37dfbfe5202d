"""The tree's layers, in one line: imports point down the list cli.py -> launchers/ ->
the job side (orchestrator/eval, convert, probe, train, scoring, models, data, runtime, hf_model) ->
orchestrator/plan/, and no two modules import each other, however indirectly.

So the planning side (compose, validate, resolve, the estimates) imports nothing from
the job side, launchers or the CLI; the job side reads the Plan but never imports
launchers or the CLI (launchers/job.py starts the job's entry by its module name).
Every import counts, those inside functions too."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOB_SIDE = ("train", "models", "data", "eval", "convert", "hf_model", "runtime", "probe", "scoring")

# Inside the job side, each package imports only those of a higher number: the tools that
# load training's checkpoints (eval, convert) and the probe over the trainer, the trainer
# over what it shares with them (scoring), the model, the data and the process set-up.
JOB_SIDE_ORDER = {"eval": 0, "convert": 1, "probe": 1, "train": 2, "scoring": 3, "models": 4, "data": 5,
                  "runtime": 6, "hf_model": 6}


def _layer(module: str) -> int:
    """0: the CLI, 1: launchers, 2: the job side, 3: the plan."""
    parts = module.split(".")
    if parts[0] == "launchers":
        return 1
    if parts[:2] == ["orchestrator", "plan"]:
        return 3
    if len(parts) > 1 and parts[1] in JOB_SIDE:
        return 2
    return 0


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_modules() -> dict:
    files = sorted((REPO / "orchestrator").rglob("*.py")) + sorted((REPO / "launchers").rglob("*.py"))
    return {_module_of(p): p for p in files}


def _imports(path: Path, modules: dict) -> set:
    """The project modules `path` imports (a `from package import name` of a submodule
    counts as that submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
                break
    return found


def _graph(modules: dict) -> dict:
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_imports_point_down_the_layers():
    graph = _graph(_project_modules())
    assert {"orchestrator.plan.validate", "orchestrator.plan.resolve", "launchers.train",
            "orchestrator.train.loop", "orchestrator.cli"} <= set(graph)
    upward = [f"{src} imports {dst}" for src, dsts in graph.items() for dst in sorted(dsts)
              if _layer(dst) < _layer(src)]
    assert upward == []


def test_job_side_packages_import_down_their_order():
    """What eval and train share lives below both (orchestrator/scoring): no arrow goes
    back up from the trainer to the tools that load its checkpoints, nor between those."""
    assert set(JOB_SIDE_ORDER) == set(JOB_SIDE)
    graph = _graph(_project_modules())

    def package(module):
        parts = module.split(".")
        return parts[1] if parts[0] == "orchestrator" and len(parts) > 2 and parts[1] in JOB_SIDE else None

    upward = [f"{src} imports {dst}" for src, dsts in graph.items() for dst in sorted(dsts)
              if package(src) and package(dst) and package(src) != package(dst)
              and JOB_SIDE_ORDER[package(dst)] <= JOB_SIDE_ORDER[package(src)]]
    assert upward == []


def test_no_import_cycle_between_modules():
    modules = _project_modules()
    # Package __init__ modules are left out: importing a.b runs a/__init__.py, which is
    # an order of loading, not a dependency of a.b on its siblings.
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    graph = {m: deps - packages for m, deps in _graph(modules).items() if m not in packages}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_job_side_imports_no_validation():
    """The job reads the resolved Plan (orchestrator/plan/resolved.py); it never validates,
    composes or resolves a config again, however indirectly: what was planned runs."""
    modules = _project_modules()
    graph = _graph(modules)
    planning_only = {"orchestrator.plan.validate", "orchestrator.plan.resolve", "orchestrator.plan.compose"}
    reached = []
    for start in sorted(m for m in graph if _layer(m) == 2):
        seen, todo = set(), [start]
        while todo:
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        reached += [f"{start} reaches {m}" for m in sorted(seen & planning_only)]
    assert reached == []
    assert "orchestrator.plan.resolved" in graph["orchestrator.train.entry"] | graph["orchestrator.train.loop"]
