"""`audiollm eval ... launcher=...` before anything is submitted (launchers/eval_job.py):
where the job runs and how big it is, and what is refused. The job itself runs in
tests/slurm/test_slurm_jobs.py."""

import json

from launchers.eval_job import eval_launcher, eval_main
from orchestrator.eval.arguments import split_launcher_overrides
from orchestrator.plan import rundir as rd

TRAINED_ON = ["+recipe=tiny_cpu", "launcher=slurm", "launcher.gpus_per_node=8", "launcher.partition=gpu",
              "launcher.account=speech"]


def _run_dir(tmp_path, overrides=TRAINED_ON):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "plan.json").write_text("{}")
    rd.record_launch(run_dir, {"kind": "slurm", "job_ids": ["7"], "launch_index": 0, "overrides": overrides})
    return run_dir


def test_launcher_overrides_are_told_apart_from_the_evaluations_own_arguments():
    own, launcher = split_launcher_overrides(["RUN", "--all", "launcher=slurm", "--tp", "2", "launcher.qos=high",
                                              "++launcher.additional_sbatch.mail-type=END"])
    assert own == ["RUN", "--all", "--tp", "2"]
    assert launcher == ["launcher=slurm", "launcher.qos=high", "++launcher.additional_sbatch.mail-type=END"]


def test_the_job_runs_where_the_training_ran_sized_by_the_evaluation(tmp_path):
    run_dir = _run_dir(tmp_path)
    launcher, errors = eval_launcher(run_dir, ["launcher=slurm", "launcher.qos=high"], processes=4)
    assert errors == []
    assert (launcher["kind"], launcher["partition"], launcher["account"], launcher["qos"]) == \
        ("slurm", "gpu", "speech", "high")
    assert (launcher["nodes"], launcher["gpus_per_node"]) == (1, 4)
    launcher, _ = eval_launcher(run_dir, ["launcher=slurm"], processes=16)
    assert (launcher["nodes"], launcher["gpus_per_node"]) == (2, 8)
    launcher, errors = eval_launcher(run_dir, ["launcher=slurm"], processes=12)
    assert launcher is None and errors == [
        "12 evaluation processes do not fill whole nodes of launcher.gpus_per_node=8: pass --gpus as a multiple "
        "of 8, or at most 8"]
    launcher, _ = eval_launcher(run_dir, ["launcher=local"], processes=12)  # one machine runs them all
    assert (launcher["kind"], launcher["nodes"], launcher["gpus_per_node"]) == ("local", 1, 12)


def test_what_is_refused_before_submission(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    assert eval_main([str(run_dir), "--all", "launcher=slurm", "launcher.nodes=2"]) == 2
    err = capsys.readouterr().err
    assert "launcher.nodes=2: an evaluation job's size comes from --tp/--pp/--cp/--gpus (1 process(es) here)" in err
    assert eval_main([str(tmp_path), "--all", "launcher=slurm"]) == 2
    assert f"{tmp_path} is not a run directory (no plan.json)" in capsys.readouterr().err
    assert eval_main([str(run_dir), "--tp", "0", "launcher=slurm"]) == 2
    assert "--tp, --pp, --cp and --gpus must be >= 1 (got 0, None, None, None)" in capsys.readouterr().err
    assert eval_main([str(run_dir), "--all", "launcher=slurm", "launcher.bogus=1"]) == 2
    assert "launcher.bogus" in capsys.readouterr().err
    # a dry run says what would be submitted, and writes nothing
    assert eval_main([str(run_dir), "--all", "--tp", "2", "launcher=slurm", "launcher.dry_run=true"]) == 0
    assert "evaluation job of" in capsys.readouterr().out and not (run_dir / "eval").exists()
    assert json.loads((run_dir / "launch.json").read_text())["launches"][0]["job_ids"] == ["7"]
