"""Sweep expansion (Hydra BasicSweeper semantics) and all-or-nothing validation."""

from __future__ import annotations

from launchers.sweep import prepare_sweep
from launchers.train import train
from orchestrator.plan.sweep import expand, swept_keys


def test_cartesian_product_in_hydra_order():
    points = expand(["optim.lr=1e-3,3e-4", "train.seed=1", "train.iters=range(2,4)"])
    assert points == [
        ["optim.lr=0.001", "train.seed=1", "train.iters=2"],
        ["optim.lr=0.001", "train.seed=1", "train.iters=3"],
        ["optim.lr=0.0003", "train.seed=1", "train.iters=2"],
        ["optim.lr=0.0003", "train.seed=1", "train.iters=3"],
    ]
    assert swept_keys(["optim.lr=1e-3,3e-4", "train.seed=1", "a=choice(x,y)"]) == ["optim.lr", "a"]


def test_sweep_points_and_dry_run(tmp_path, capsys, tiny):
    overrides = tiny(tmp_path, "launcher=slurm", "launcher.dry_run=true", "optim.lr=1e-3,3e-4", "train.seed=1,2")
    sweep_dir, points, errors = prepare_sweep(overrides)
    assert errors == [] and len(points) == 4
    assert [p[0] for p in points][1] == ["optim.lr=0.001", "train.seed=2"]
    assert [run.run_dir for _, run in points] == [sweep_dir / f"{i:03d}" for i in range(4)]
    assert train(overrides, multirun=True) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --array=0-3%4" in out and "sweep of 4 points" in out
    assert not any(tmp_path.iterdir())


def test_every_invalid_point_is_reported_before_anything_is_submitted(tmp_path, capsys, tiny):
    # Two of the three points are invalid (warmup must be shorter than iters); nothing may start.
    code = train(tiny(tmp_path, "optim.lr_warmup_iters=0,4,5", iters=4), multirun=True)
    err = capsys.readouterr().err
    assert code == 2
    assert "nothing was submitted" in err
    assert "point 1 (optim.lr_warmup_iters=4)" in err and "point 2 (optim.lr_warmup_iters=5)" in err
    assert "point 0" not in err
    assert not any(tmp_path.iterdir())
