"""Planning and submitting import neither torch nor megatron (a laptop without CUDA
plans a 4-node run, and `audiollm plan` / `--help` stay fast)."""

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "megatron", "transformer_engine", "transformers", "streaming", "wandb")


def _submit_side_modules() -> list[str]:
    """The CLI, every module of orchestrator/plan/ and every module of launchers/."""
    names = ["orchestrator.cli"]
    names += [m.name for m in pkgutil.walk_packages([str(REPO / "orchestrator" / "plan")], prefix="orchestrator.plan.")]
    names += [f"launchers.{m.name}" for m in pkgutil.walk_packages([str(REPO / "launchers")])]
    return sorted(names)


def test_submit_side_modules_and_plan_import_no_heavy_package():
    modules = _submit_side_modules()
    assert {"orchestrator.cli", "orchestrator.plan.validate", "orchestrator.plan.schema.root", "launchers.train"} <= set(modules)
    script = f"""
import importlib, json, sys, io, contextlib
for name in {modules!r}:
    importlib.import_module(name)
from orchestrator.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["plan", "+recipe=gemma2_whisper_tp4pp2", "--json"]) == 0
    assert main(["plan", "+recipe=tiny_cpu"]) == 0
    assert main(["plan", "-m", "+recipe=gemma2_whisper_tp4pp2", "parallel.tp=2,4", "parallel.pp=1,2"]) == 0
heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))
print(json.dumps(heavy))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_help_lists_commands_without_heavy_imports():
    script = """
import contextlib, io, json, sys
from orchestrator.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["--help"])
print(json.dumps([out.getvalue(), sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'hydra'))]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    text, heavy = json.loads(proc.stdout)
    assert "plan" in text and "train" in text and "convert" in text
    assert heavy == []
