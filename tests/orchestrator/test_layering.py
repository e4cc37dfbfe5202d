"""The planning side (compose, validate, resolve, the estimates: orchestrator's top-level
modules and its schema) imports nothing from the job side (orchestrator/train, models,
data, eval, runtime, convert, probe): FLOP arithmetic and task presets are planning knowledge
that the job imports, not the other way round. Every import counts, those inside
functions too. orchestrator/cli.py is the command router: it starts job-side commands
(eval, convert, data) and is left out."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOB_SIDE = ("train", "models", "data", "eval", "runtime", "convert", "probe")
ROUTERS = {"cli.py"}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_the_planning_side_imports_nothing_from_the_job_side():
    root = REPO / "orchestrator"
    planning = [p for p in root.glob("*.py") if p.name not in ROUTERS] + sorted((root / "schema").glob("*.py"))
    assert {"validate.py", "estimate.py", "resolve.py", "step_flops.py", "tasks.py"} <= {p.name for p in planning}
    backwards = [f"{p.relative_to(REPO)} imports {name}" for p in planning for name in _imports(p)
                 if name.split(".")[:2] in [["orchestrator", side] for side in JOB_SIDE]]
    assert backwards == []
