"""A launcher kind added by the tests alone: its module (tests/launchers/toy_launcher.py)
and its entry in orchestrator/plan/launcher_kinds.py, nothing else (docs/project.md, "How
to add a launcher"). Validation, the dry run, the cluster check, submission, status and a
sweep all reach it through the interface of launchers/kinds/__init__.py; and no module
outside the kinds tells the kinds apart by name."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from launchers.runs import prepare
from launchers.status import status
from launchers.summary import run_state
from launchers.train import train
from orchestrator.plan.launcher_kinds import KINDS, LauncherKind
from tests.launchers.helpers import tiny_overrides, wait_until
from tests.launchers.toy_launcher import TIME_LIMIT_MIN

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.multiprocess


@pytest.fixture
def toy_kind(monkeypatch):
    """The registration: one entry, as a new kind's commit adds it."""
    monkeypatch.setitem(KINDS, "toy", LauncherKind("tests.launchers.toy_launcher", one_machine=False))


def test_validation_knows_a_registered_kind_and_its_trait(toy_kind, monkeypatch, tmp_path):
    run, errors = prepare(tiny_overrides(tmp_path, "launcher.kind=toy", "launcher.nodes=2", "launcher.gpus_per_node=1"))
    assert errors == [] and run is not None
    monkeypatch.setitem(KINDS, "toy_here", LauncherKind("tests.launchers.toy_launcher", one_machine=True))
    _, errors = prepare(tiny_overrides(tmp_path, "launcher.kind=toy_here", "launcher.nodes=2",
                                       "launcher.gpus_per_node=1"))
    assert any("launcher.kind=toy_here runs on this machine only, but launcher.nodes=2; use launcher=slurm or "
               "launcher=toy for several nodes" in e for e in errors), errors
    _, errors = prepare(tiny_overrides(tmp_path, "launcher.kind=elsewhere"))
    assert any("launcher.kind" in e and "'elsewhere'" in e and "toy" in e for e in errors), errors


def test_a_toy_kind_is_dry_run_checked_submitted_and_followed(toy_kind, tmp_path, capsys):
    assert train(tiny_overrides(tmp_path, "launcher.kind=toy", "launcher.dry_run=true")) == 0
    assert re.search(r"^# toy: 2 processes queued as \S+$", capsys.readouterr().out, re.M)

    assert train(tiny_overrides(tmp_path, "launcher.kind=toy", f"launcher.timeout_min={TIME_LIMIT_MIN + 1}")) == 2
    assert f"exceeds the toy cluster's time limit of {TIME_LIMIT_MIN} minutes" in capsys.readouterr().err

    assert train(tiny_overrides(tmp_path, "launcher.kind=toy", f"launcher.timeout_min={TIME_LIMIT_MIN}")) == 0
    out = capsys.readouterr().out
    run_dir = Path(re.search(r"^starting run (\S+)$", out, re.M).group(1))
    job_id = re.search(r"^queued toy job (\d+)$", out, re.M).group(1)  # returned at once: the kind queues
    assert "audiollm status" in out  # where to follow it, as for any queued job
    assert json.loads((run_dir / "launch.json").read_text())["launches"][-1]["kind"] == "toy"
    # COMPLETED from the job's own record, ENDED from the toy's scheduler_view (its controller gone).
    info = wait_until(lambda: (lambda i: i if (i["state"], i["scheduler"]) == ("COMPLETED", "ENDED") else None)(
        run_state(run_dir)), 120, "the toy job to complete", [run_dir])
    assert info["kind"] == "toy" and info["job_id"] == job_id
    assert status(run_dir) == 0
    assert "COMPLETED" in capsys.readouterr().out


def test_a_sweep_through_a_queueing_toy_kind_is_one_array(toy_kind, tmp_path, capsys):
    overrides = tiny_overrides(tmp_path, "launcher.kind=toy", "train.seed=1,2", f"launcher.timeout_min={TIME_LIMIT_MIN}")
    assert train([*overrides, "launcher.dry_run=true"], multirun=True) == 0
    assert re.search(r"^# toy: 2 processes queued as \S+, an array of 2$", capsys.readouterr().out, re.M)
    assert train(overrides, multirun=True) == 0
    out = capsys.readouterr().out
    assert re.search(r"^submitted job\(s\) \d+(, \d+)?$", out, re.M), out
    sweep_dir = Path(re.search(r"^sweep (\S+): 2 points$", out, re.M).group(1))
    points = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name != "submitit")
    assert [p.name for p in points] == ["000", "001"]
    for point in points:
        wait_until(lambda: run_state(point)["state"] == "COMPLETED", 120, "a sweep point to complete", [point])


def _kind_names_compared(path: Path) -> list[str]:
    """`x == "slurm"`-like comparisons of something named *kind* with a kind's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = [s.value for s in sides if isinstance(s, ast.Constant) and s.value in KINDS]
            if names and "kind" in ast.unparse(node).replace(repr(names[0]), ""):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_kinds_tells_them_apart_by_name():
    files = [p for p in sorted((REPO / "launchers").rglob("*.py")) + sorted((REPO / "orchestrator").rglob("*.py"))
             if "kinds" not in p.relative_to(REPO).parts]
    assert [hit for path in files for hit in _kind_names_compared(path)] == []
