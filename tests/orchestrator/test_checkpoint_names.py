"""Checkpoint names stay in order past 999,999 steps: step_N is six digits or more, and
every listing sorts by the step, not by the name (as text, step_1000000 sorts before
step_999999)."""

from orchestrator.plan.checkpoint_dirs import STEP_DIR, resolve_model_checkpoint, set_aside_dirs, step_dirs

STEPS = (10, 999_999, 1_000_000, 12_345_678)


def _name(step: int) -> str:  # orchestrator/train/checkpoint.py's naming, without torch
    return f"step_{step:06d}"


def test_steps_past_999999_are_listed_newest_first(tmp_path):
    root = tmp_path / "checkpoints"
    for step in STEPS:
        (root / _name(step)).mkdir(parents=True)
        (root / f"{_name(step)}.damaged").mkdir()
    assert [p.name for p in step_dirs(tmp_path)] == [_name(s) for s in sorted(STEPS, reverse=True)]
    assert [p.name for p in set_aside_dirs(tmp_path)] == [f"{_name(s)}.damaged" for s in sorted(STEPS)]
    assert all(STEP_DIR.match(_name(s)) for s in STEPS)


def test_the_job_names_its_checkpoints_as_the_listings_read_them():
    from orchestrator.train.checkpoint import _megatron_name, _step_name

    assert [_step_name(s) for s in STEPS] == [_name(s) for s in STEPS]
    assert _megatron_name(_step_name(1_000_000)) == "iter_1000000"  # Megatron-LM's iter_{:07d}
    assert _megatron_name(_step_name(12_345_678)) == "iter_12345678"


def test_a_run_directory_past_999999_steps_resolves_to_its_latest(tmp_path):
    root = tmp_path / "checkpoints"
    latest = root / _name(1_000_000)
    latest.mkdir(parents=True)
    (latest / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (root / "latest").write_text(latest.name + "\n")
    path, problem = resolve_model_checkpoint(str(tmp_path))
    assert problem is None and path.endswith("step_1000000"), (path, problem)


def test_a_checkpoint_chosen_by_step_or_best_names_what_the_run_keeps(tmp_path):
    import json

    import pytest

    from orchestrator.plan.checkpoint_dirs import checkpoint_at_step

    for step in (6, 12):
        (tmp_path / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
    assert checkpoint_at_step(tmp_path, "12") == tmp_path / "checkpoints" / "step_000012"
    with pytest.raises(ValueError, match="keeps checkpoints at steps 6, 12"):
        checkpoint_at_step(tmp_path, "7")
    with pytest.raises(ValueError, match=f"audiollm eval {tmp_path} --all"):
        checkpoint_at_step(tmp_path, "best")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "best.json").write_text(json.dumps({"checkpoint": "step_000006"}))
    assert checkpoint_at_step(tmp_path, "best") == tmp_path / "checkpoints" / "step_000006"


def test_the_newest_checkpoints_and_every_keep_every_th_are_kept():
    from orchestrator.train.checkpoint import Retention

    newest_first = [1200, 1000, 800, 600, 400, 200]
    assert Retention(2).pruned(newest_first) == [800, 600, 400, 200]
    assert Retention(2, every=400).pruned(newest_first) == [600, 200]  # 800 and 400 stay for eval --all
    assert Retention(0).pruned(newest_first) == [1000, 800, 600, 400, 200]  # the one just saved stays


def test_a_checkpoint_another_runs_checkpoints_read_frozen_weights_from_outlives_the_retention(tmp_path):
    """A LoRA run started from step 4 of a pretraining run leaves the frozen base out of its
    own checkpoints and reads it there (train.save_frozen_weights=false): the job holds step
    4, `audiollm status` of the pretraining run says so, and its keep_last no longer deletes
    it; once the hold is deleted, or the LoRA run's directory, it does."""
    from launchers.summary import format_run, run_state
    from orchestrator.plan.checkpoint_dirs import HOLDS, held_by, hold_checkpoint
    from orchestrator.train.checkpoint import Retention, _prune

    root = tmp_path / "pretrain" / "checkpoints"

    def checkpoints(*steps):
        for step in steps:
            (root / f"step_{step:06d}").mkdir(parents=True, exist_ok=True)
        (root / "iter_0000004").unlink(missing_ok=True)
        (root / "iter_0000004").symlink_to("step_000004")  # Megatron-LM's name for it

    checkpoints(2, 4, 6, 8)
    holder = tmp_path / "lora_run"
    holder.mkdir()
    hold = hold_checkpoint(root / "iter_0000004", holder)
    assert hold_checkpoint(root / "step_000004", holder) == hold  # one hold a run, however named
    assert held_by(root, "step_000004") == [str(holder.resolve())] and held_by(root, "step_000006") == []
    assert hold_checkpoint(tmp_path / "converted", holder) is None  # no run's checkpoint: nothing prunes it
    said = format_run(root.parent, run_state(root.parent, query_scheduler=False))
    assert f"held      step_000004 by {holder.resolve()}" in said, said
    _prune(root, Retention(1))
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000004", "step_000008"]
    assert (root / "iter_0000004").is_symlink()
    hold.unlink()  # the LoRA run no longer needs it
    _prune(root, Retention(1))
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000008"]
    assert not (root / "iter_0000004").exists()

    checkpoints(4, 10)
    hold_checkpoint(root / "step_000004", holder)
    elsewhere = hold_checkpoint(root / "step_000004", tmp_path / "unmounted" / "run")  # its file system not here
    _prune(root, Retention(1))
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000004", "step_000010"]
    elsewhere.unlink()
    holder.rmdir()  # the LoRA run deleted: its checkpoints need nothing
    assert held_by(root, "step_000004") == []
    assert "held" not in format_run(root.parent, run_state(root.parent, query_scheduler=False))
    _prune(root, Retention(1))
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000010"]
    assert not (root / HOLDS / "step_000004").exists()

def test_status_says_where_a_lora_runs_checkpoint_reads_its_frozen_weights_and_when_they_are_gone(tmp_path):
    """`audiollm status` of a run whose latest checkpoint leaves its frozen base in
    model.init_checkpoint (train.save_frozen_weights=false) names that place; once it is
    gone, the damage line says what resume, evaluation and export will refuse."""
    import json

    from launchers.summary import format_run, run_state
    from orchestrator.plan.checkpoint_dirs import FROZEN_SOURCE

    base = tmp_path / "pretrained"
    base.mkdir()
    (base / "weights.bin").write_bytes(b"x" * 10)
    run = tmp_path / "lora_run"
    step = run / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step_000002\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "loss": 1.0}) + "\n" for k in (1, 2)))
    (step / FROZEN_SOURCE).write_text(json.dumps({"source": str(base), "files": {"weights.bin": {"size": 10}},
                                                  "tensors": ["decoder.layers.0.mlp.linear_fc1.weight"]}))
    said = format_run(run, run_state(run, query_scheduler=False))
    assert f"frozen    weights read from {base} (train.save_frozen_weights=false: it must stay in place)" in said
    assert "damaged" not in said, said
    (base / "weights.bin").unlink()
    (base / "weights.bin").write_bytes(b"x" * 3)  # another file written there since
    said = format_run(run, run_state(run, query_scheduler=False))
    assert "damaged" in said and "whose files changed since" in said, said
    (step / FROZEN_SOURCE).write_text("{")
    said = format_run(run, run_state(run, query_scheduler=False))
    assert f"step_000002/{FROZEN_SOURCE} cannot be read" in said, said
