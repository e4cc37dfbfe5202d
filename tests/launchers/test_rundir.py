"""Run identity, run-directory contents and resume rules (no processes started)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launchers.status import cancel, status
from launchers.train import train
from orchestrator.plan import rundir as rd
from orchestrator.plan.compose import compose


def _container(overrides):
    return OmegaConf.to_container(compose(overrides), resolve=True)


def test_same_command_same_run_directory_and_changes_make_new_runs(tmp_path):
    base = [f"run.output_root={tmp_path}"]
    first = rd.run_dir_for(_container(base))
    assert first == rd.run_dir_for(_container(base))
    # Keys that do not change what is trained keep the run.
    assert first == rd.run_dir_for(_container([*base, "run.resume=never", "launcher.dry_run=true"]))
    # Anything that does is another run.
    assert first != rd.run_dir_for(_container([*base, "optim.lr=0.5"]))
    assert first.parent == tmp_path / "tiny_cpu" and first.name.startswith("tiny_cpu-")
    assert rd.run_dir_for(_container([*base, "run.name=mine"])) == tmp_path / "tiny_cpu" / "mine"


def test_resume_rules(tmp_path):
    run_dir = tmp_path / "r"
    assert rd.check_resume(run_dir, "auto") is False
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("step_3\n")
    assert rd.check_resume(run_dir, "auto") is True
    with pytest.raises(rd.RunDirError, match=r"run.resume=auto.*run.name="):
        rd.check_resume(run_dir, "never")


def test_prepare_writes_config_plan_and_keeps_the_wandb_id(tmp_path):
    run_dir = tmp_path / "r"
    rd.prepare(run_dir, "a: 1\n", {"world_size": 2})
    wandb_id = (run_dir / "wandb_id").read_text()
    rd.prepare(run_dir, "a: 2\n", {"world_size": 2})
    assert (run_dir / "wandb_id").read_text() == wandb_id
    assert (run_dir / "config.yaml").read_text() == "a: 2\n" + rd.CONFIG_END
    assert rd.damage(run_dir / "config.yaml") is None and rd.damage(run_dir / "plan.json") is None
    assert json.loads((run_dir / "plan.json").read_text()) == {"world_size": 2}
    rd.record_launch(run_dir, {"kind": "local", "job_ids": ["7"]})
    rd.record_launch(run_dir, {"kind": "local", "job_ids": ["8"]})
    assert [launch["job_ids"] for launch in rd.read_json(run_dir / "launch.json")["launches"]] == [["7"], ["8"]]
    assert rd.last_launch(run_dir)["version"]
    (run_dir / "plan.json").write_text('{"world_si')
    assert rd.damage(run_dir / "plan.json") == "plan.json is damaged (10 bytes, not valid JSON at line 1)"


def test_dry_run_prints_everything_and_writes_nothing(tmp_path, capsys):
    code = train(["+recipe=gemma2_whisper_tp4pp2", "launcher.dry_run=true", f"run.output_root={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "#SBATCH --nodes=4" in out and "--tensor-model-parallel-size 4" in out and "parallel:" in out
    assert not any(tmp_path.iterdir())


def test_invalid_config_lists_every_error_and_writes_nothing(tmp_path, capsys):
    code = train(["launcher.nodes=2", "launcher.entry=nodots", f"run.output_root={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "launcher.nodes=2" in err and "launcher.entry='nodots'" in err
    assert not any(tmp_path.iterdir())


def test_status_and_cancel_reject_unknown_paths(tmp_path, capsys):
    assert status(tmp_path) == 2
    assert cancel(tmp_path) == 2
    assert "neither a run directory" in capsys.readouterr().err


def test_submit_side_does_not_import_torch():
    code = (
        "import sys, launchers.train, launchers.prepare, launchers.status, launchers.kinds.local, launchers.kinds.slurm, launchers.summary, "
        "launchers.sweep, launchers.job, launchers.slurm_fit, orchestrator.plan.rundir, orchestrator.runtime.job_control, "
        "orchestrator.runtime.slurm_env\n"
        "from launchers.runs import prepare\n"
        "prepare(['+recipe=gemma2_whisper_tp4pp2', 'launcher.dry_run=true'])\n"
        "bad = [m for m in ('torch', 'megatron') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
