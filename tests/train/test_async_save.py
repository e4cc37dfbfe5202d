"""Checkpoints written in the background (train.async_save, orchestrator/train/checkpoint.py
BackgroundSaves): published only once every rank's files are written, with a manifest
that verifies, so a rank killed hard between a save and its publication leaves `latest`
naming the previous, complete checkpoint, from which the run resumes to the losses of a
run that saved synchronously."""

from __future__ import annotations

import pytest

from orchestrator.plan.checkpoint_dirs import checkpoint_files, manifest_problem, read_manifest
from tests.train.jobs import launch, metrics, result
from tests.train.plans import write_run_dir


@pytest.mark.multiprocess
def test_a_kill_before_a_background_save_is_published_resumes_from_the_one_before_exactly(tmp_path):
    # DP=2 with the distributed optimizer: each rank writes its own shard of the state.
    common = dict(dp=2, iters=8, save_interval=2, keep_last=10, distributed_optimizer=True, warmup=0)
    synchronous = write_run_dir(tmp_path / "sync", **common)
    background = write_run_dir(tmp_path / "background", async_save=True, **common)
    losses = result(launch("job_script.py", 2, "train", str(synchronous), log_dir=tmp_path))["losses"]
    # Killed (os._exit, as SIGKILL: nothing runs after it) right after step 4's save was
    # handed to the background writers, before any later step could publish it.
    launch("job_script.py", 2, "kill", str(background), "4", log_dir=tmp_path, expect_rc=17)
    assert (background / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert not (background / "checkpoints" / "step_000004").exists()
    resumed_output = launch("job_script.py", 2, "train", str(background), log_dir=tmp_path)
    resumed = result(resumed_output)
    assert resumed["losses"] == losses[2:], (resumed["losses"], losses)

    # Every save of the background run was published, its manifest complete and right
    # (the tensor files checksummed by the writers, the rest at publication). (Files are
    # not compared with the synchronous run's byte for byte: megatron pickles some
    # uninitialised padding into them.)
    steps = ["step_000002", "step_000004", "step_000006", "step_000008"]
    for run in (synchronous, background):
        assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == steps
        assert not list((run / "checkpoints").glob(".tmp-*"))
    assert (background / "checkpoints" / "latest").read_text().strip() == "step_000008"
    for step in steps:
        checkpoint = background / "checkpoints" / step
        files, _ = read_manifest(checkpoint)
        assert sorted(files) == checkpoint_files(checkpoint) and any(n.endswith(".distcp") for n in files)
        assert manifest_problem(checkpoint, files, sorted(files)) is None, step

    # Each save's stall is in the next step's row; its publication is logged with the
    # time since the save, and is in the row of the step that published it.
    rows = {m["step"]: m for m in metrics(background)}
    assert all(rows[s + 1]["checkpoint/stall_s"] > 0 for s in (4, 6)), rows
    assert all("checkpoint/stall_s" not in rows[s] for s in (4, 6, 8)), rows
    written = [rows[s]["checkpoint/background_write_s"] for s in rows if "checkpoint/background_write_s" in rows[s]]
    assert written and all(w > 0 for w in written), rows
    for step in (4, 6, 8):
        assert f"checkpoint step_00000{step} published, " in resumed_output, resumed_output[-3000:]
