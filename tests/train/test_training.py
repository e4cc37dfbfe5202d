"""The training runtime end to end on CPU (gloo): real megatron-core models, real
processes, real checkpoints. The stand-in model is a tiny megatron GPTModel (local
spec) on deterministic synthetic rows; see tests/train/stand_in.py."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.distributed_run import REPO
from tests.train.jobs import launch, metrics, result
from tests.train.plans import write_run_dir

SENTINEL = "sentinel-wandb-key-0123456789abcdef0123456789abcdef"

LORA = {
    "rank": 4, "alpha": 8.0,
    "lr_groups": [
        {"name": "lora", "patterns": ["*.lora_a.*", "*.lora_b.*"], "lr_scale": 1.0},
        {"name": "final_norm", "patterns": ["*final_layernorm*"], "lr_scale": 0.0},
        {"name": "embedding", "patterns": ["*word_embeddings*"], "lr_scale": 0.5},
        {"name": "norms", "patterns": ["*layernorm*"], "lr_scale": 0.25},
        {"name": "decoder", "patterns": ["language_model.*"], "lr_scale": 0.0},
    ],
}


def _cosine_lr(step_index: int, lr: float, min_lr: float, iters: int) -> float:
    """megatron OptimizerParamScheduler, no warmup: lr after `step_index` steps."""
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * step_index / iters))


def _grep_tree(root, needle: str) -> list:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and needle.encode() in path.read_bytes():
            hits.append(str(path))
    return hits


@pytest.mark.multiprocess
def _megatron_lm_latest(checkpoints) -> int:
    """The latest checkpoint's iteration as Megatron-LM finds it: its tracker file, then
    `iter_{:07d}` under the same directory, a dist checkpoint whose common state holds the
    iteration (megatron-core's dist_checkpointing, which Megatron-LM's loader calls)."""
    from megatron.core import dist_checkpointing

    iteration = int((checkpoints / "latest_checkpointed_iteration.txt").read_text().strip())
    path = checkpoints / f"iter_{iteration:07d}"
    assert dist_checkpointing.check_is_distributed_checkpoint(str(path)), path
    common = dist_checkpointing.load_common_state_dict(str(path))
    assert common["iteration"] == iteration and common["checkpoint_version"] == 3.0
    return iteration


def test_tp2_lora_training_exact_resume_and_tp1_reshard(tmp_path):
    """TP=2 with LoRA and lr groups: falling loss; each group's lr is the configured
    scale of the schedule; lr_scale 0 freezes; 20 steps straight equal 10 steps + a
    hard process exit + 10 resumed steps at every step; the TP=2 checkpoint loads at
    TP=1 and gives the same validation loss; the W&B API key never reaches the run
    directory; the W&B run id survives the restart."""
    lr, min_lr, iters = 3e-3, 3e-4, 20
    common = dict(tp=2, iters=iters, lr=lr, min_lr=min_lr, warmup=0, lora=LORA, save_interval=10)
    # mode, project and entity unset: W&B's environment variables give them (the ecosystem's way)
    wandb_logger = {"backend": "wandb"}
    straight = write_run_dir(tmp_path / "straight", keep_last=1, **common)
    resumed = write_run_dir(tmp_path / "resumed", keep_last=3, logger=wandb_logger, **common)
    env = {"WANDB_API_KEY": SENTINEL, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_PROJECT": "audiollm-env-project", "WANDB_ENTITY": "audiollm-env-entity"}

    out_straight = launch("job_script.py", 2, "train", str(straight), log_dir=tmp_path, env=env)
    launch("job_script.py", 2, "kill", str(resumed), "10", log_dir=tmp_path, env=env, expect_rc=17)
    first_half = metrics(resumed)
    assert [m["step"] for m in first_half] == list(range(1, 11))
    assert (resumed / "checkpoints" / "latest").read_text().strip() == "step_000010"
    out_resumed = launch("job_script.py", 2, "train", str(resumed), log_dir=tmp_path, env=env)

    # falling loss
    full = result(out_straight)
    losses = full["losses"]
    print("straight losses:", losses)
    assert len(losses) == iters and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.05, losses

    # exact resume, every step
    again = [m["loss"] for m in metrics(resumed)]
    print("killed + resumed losses:", again)
    assert [m["step"] for m in metrics(resumed)] == list(range(1, 21))
    assert again == losses, [(i + 1, a, b) for i, (a, b) in enumerate(zip(losses, again)) if a != b]
    assert result(out_resumed)["losses"] == losses[10:]
    # every weight came from the checkpoint: the resumed job drew no random init
    skipped = "random initialisation skipped"
    assert skipped in out_resumed and skipped not in out_straight

    # lr per group: the schedule scaled by lr_scale, step 1 and step 2
    history = full["history"]
    for step_index, row in enumerate(history[:2]):
        for name, scale in (("lora", 1.0), ("embedding", 0.5), ("norms", 0.25)):
            expected = _cosine_lr(step_index, lr * scale, min_lr * scale, iters)
            assert row[f"lr/{name}"] == pytest.approx(expected, rel=1e-9), (name, step_index, row)
        assert "lr/decoder" not in row and "lr/final_norm" not in row  # lr_scale 0: never stepped
    for key in ("loss/synthetic_a", "loss/synthetic_b", "grad_norm", "tokens_per_s_per_gpu",
                "model_tflops_per_gpu", "hardware_tflops_per_gpu", "memory/rss_gib", "val_loss/synthetic_a"):
        assert key in history[-1], key

    # partition: every parameter in one group; lr_scale 0 froze the decoder base
    for rank_report in full["ranks"]:
        members = rank_report["members"]
        flat = [n for names in members.values() for n in names]
        assert len(flat) == len(set(flat))
        assert all(".lora_" in n for n in members["lora"]) and members["lora"]
        assert all("word_embeddings" in n for n in members["embedding"])
        assert all("layernorm" in n for n in members["norms"]) and members["norms"]
        # lr_scale 0 froze the final norm (first match wins over "norms"); LoRA had
        # already frozen the adapted linears' base weights and biases, so the catch-all
        # decoder group is left with nothing
        assert members["final_norm"] == ["language_model.decoder.final_layernorm.weight"]
        assert members["decoder"] == []
        frozen = set(rank_report["frozen"])
        assert "language_model.decoder.final_layernorm.weight" in frozen
        assert "language_model.decoder.layers.0.self_attention.linear_qkv.weight" in frozen
        for name in frozen:
            assert rank_report["changes"][name] == 0.0, name
        assert not any(".lora_" in n or "word_embeddings" in n for n in frozen)
        trained = [n for n in rank_report["changes"] if n not in rank_report["frozen"]]
        assert trained and all(rank_report["changes"][n] > 0 for n in trained), rank_report["changes"]

    # checkpoints: atomic publication and keep_last
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == [
        "iter_0000020", "latest", "latest_checkpointed_iteration.txt", "step_000020"]
    # Megatron-LM's way to the latest checkpoint (training/checkpointing.py): the tracker
    # file's iteration, the iter_NNNNNNN directory, its common state's iteration
    assert _megatron_lm_latest(straight / "checkpoints") == 20
    assert not list((resumed / "checkpoints").glob(".tmp-*"))
    assert (straight / "loss_curve.png").stat().st_size > 1000

    # W&B: offline run, same id after the restart, the key nowhere in the run dir or logs
    run_id = (resumed / "wandb_id").read_text().strip()
    runs = sorted(p.name for p in (resumed / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.endswith(run_id) for r in runs), (runs, run_id)
    # the run carries the environment's project and entity, and the job said where they came from
    records = (resumed / "wandb" / runs[-1] / f"run-{run_id}.wandb").read_bytes()
    assert b"audiollm-env-project" in records and b"audiollm-env-entity" in records
    assert "W&B project: audiollm-env-project ($WANDB_PROJECT; logger.project unset)" in out_resumed
    assert _grep_tree(resumed, SENTINEL) == [] and _grep_tree(tmp_path, SENTINEL) == []
    assert SENTINEL not in out_straight + out_resumed

    # reshard: the TP=2 checkpoint at TP=1 gives the same validation loss
    tp1 = write_run_dir(tmp_path / "tp1", tp=1, iters=iters, lr=lr, min_lr=min_lr, warmup=0, lora=LORA)
    evaluated = result(launch("job_script.py", 1, "eval", str(tp1), str(straight), log_dir=tmp_path))["eval"]
    final = metrics(straight)[-1]
    for key in ("val_loss", "val_loss/synthetic_a", "val_loss/synthetic_b"):
        assert evaluated[key] == pytest.approx(final[key], abs=1e-5), (key, evaluated, final)


@pytest.mark.multiprocess
def test_lora_tp2_forward_equals_tp1_and_merge_reproduces_it(tmp_path):
    lora = {"rank": 4, "alpha": 8.0, "lr_groups": [{"name": "all", "patterns": ["*"], "lr_scale": 1.0}]}
    for tp in (2, 1):
        run_dir = write_run_dir(tmp_path / f"tp{tp}", tp=tp, lora=lora)
        launch("lora_script.py", tp, str(run_dir), str(tmp_path), log_dir=tmp_path)
    tp1, tp2 = torch.load(tmp_path / "lora_tp1.pt"), torch.load(tmp_path / "lora_tp2.pt")
    adapted_names = {n.rsplit(".", 1)[-1] for n in tp1["names"]}
    assert adapted_names == {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}
    assert tp1["frozen_base"] and tp2["frozen_base"]
    assert "language_model.decoder.layers.0.mlp.linear_fc1.lora_a.weight" in tp1["lora_names"]
    assert "language_model.decoder.layers.0.mlp.linear_fc1.lora_b.weight" in tp1["lora_names"]
    # the adapters matter, and TP=2 computes what TP=1 computes
    assert (tp1["adapted"] - tp1["base"]).abs().max() > 1e-2
    assert torch.allclose(tp2["adapted"], tp1["adapted"], atol=1e-5)
    # the adapted model is W + (alpha/r) B A, computed in the test script from the plan
    for run in (tp1, tp2):
        assert torch.allclose(run["adapted"], run["reference"], atol=1e-5)
    # merged weights reproduce the adapted output; no adapter is left; names unchanged
    for run in (tp1, tp2):
        assert run["merged_count"] == 8 and run["leftover"] == []
        assert torch.allclose(run["merged"], run["adapted"], atol=1e-5)
        assert "language_model.decoder.layers.0.mlp.linear_fc1.weight" in run["param_names"]


@pytest.mark.multiprocess
def test_pp2_1f1b_with_full_recompute_trains(tmp_path):
    """PP=2, 1F1B, full activation recompute: falling loss, both stages train, and
    recomputation is counted as hardware FLOPs, not model FLOPs. Steps 3-4 run under the
    profiler on both stages (train.profile_steps): each writes its operator tables and
    trace, and those steps' metrics say `profiled`."""
    run_dir = write_run_dir(tmp_path / "pp", pp=2, num_layers=4, iters=12, num_microbatches=4,
                            lr=3e-3, warmup=0, recompute="full", profile_steps=(3, 4), profile_ranks=(0, 1))
    out = result(launch("job_script.py", 2, "train", str(run_dir), log_dir=tmp_path))
    losses = out["losses"]
    print("pp2 1f1b recompute losses:", losses)
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.05, losses
    for rank_report in out["ranks"]:
        assert rank_report["changes"] and all(v > 0 for v in rank_report["changes"].values())
    rows = metrics(run_dir)
    assert rows[-1]["hardware_tflops_per_gpu"] > rows[-1]["model_tflops_per_gpu"]
    assert [r["step"] for r in rows if r.get("profiled")] == [3, 4]
    for rank in (0, 1):
        profiled = run_dir / "profile" / "steps_3-4" / f"rank{rank}"
        ops = (profiled / "ops.txt").read_text()
        assert "== operators by self_cpu_time_total" in ops and "aten::mm" in ops, ops[:2000]
        with gzip.open(profiled / "trace.json.gz") as trace:
            events = json.load(trace)["traceEvents"]
        assert any(e.get("name") == "aten::mm" for e in events)
    said = "".join(log.read_text(errors="replace") for log in tmp_path.glob("*.log"))
    assert "rank 0: profile of steps 3-4 written to" in said and "top operators by own host time: " in said


@pytest.mark.multiprocess
def test_interleaved_pp2_vpp2_stop_request_and_exact_resume(tmp_path):
    """PP=2 with two virtual stages per rank (interleaved 1F1B). The launcher's stop
    request (SIGTERM on one rank) at step 4 checkpoints and stops every rank after
    step 4; the next attempt resumes and reproduces an uninterrupted run exactly (which
    saved after every step on the wall clock)."""
    common = dict(pp=2, vpp=2, num_layers=4, iters=8, num_microbatches=4, lr=3e-3, warmup=0)
    # The straight run also saves on a wall-clock interval short enough to be due after
    # every step (train.save_interval_minutes): the last two steps are kept.
    straight = write_run_dir(tmp_path / "straight", save_interval_minutes=1e-9, **common)
    stopped = write_run_dir(tmp_path / "stopped", **common)
    losses = result(launch("job_script.py", 2, "train", str(straight), log_dir=tmp_path))["losses"]
    print("pp2 vpp2 losses:", losses)
    assert sorted(p.name for p in (straight / "checkpoints").glob("step_*")) == ["step_000007", "step_000008"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.05, losses
    assert result(launch("job_script.py", 2, "stop", str(stopped), "4", log_dir=tmp_path))["losses"] == losses[:4]
    assert (stopped / "checkpoints" / "latest").read_text().strip() == "step_000004"
    assert result(launch("job_script.py", 2, "train", str(stopped), log_dir=tmp_path))["losses"] == losses[4:]
    assert [m["loss"] for m in metrics(stopped)] == losses


@pytest.mark.multiprocess
def test_nan_loss_stops_without_saving_then_resumes_with_distributed_optimizer(tmp_path):
    """DP=2 with the distributed optimizer, a checkpoint every step. Sample 20 (step
    3: 8 samples per step) has a NaN loss: the run stops at step 3 naming the step and
    the datasets, exits non-zero, and the newest checkpoint is step 2's. A clean
    restart resumes from it (distributed-optimizer state reloaded) and finishes."""
    run_dir = write_run_dir(tmp_path / "nan", dp=2, iters=5, save_interval=1, keep_last=10, eval_interval=1,
                            distributed_optimizer=True, warmup=0)
    out = launch("job_script.py", 2, "poison", str(run_dir), "20", log_dir=tmp_path, expect_rc=3)
    assert "DIVERGED loss is nan at step 3" in out, out[-3000:]
    assert "datasets in this step's batch: ['synthetic_a', 'synthetic_b']" in out
    assert "datasets with a non-finite loss: ['synthetic_a']" in out
    published = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert published == ["iter_0000001", "iter_0000002", "latest", "latest_checkpointed_iteration.txt",
                         "step_000001", "step_000002"], published
    assert _megatron_lm_latest(run_dir / "checkpoints") == 2
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert [m["step"] for m in metrics(run_dir)] == [1, 2]

    # the real job entry (as the launchers call it, with the stand-in's components
    # factory), then the evaluation entry
    launch("tests.train.stand_in", 2, str(run_dir), log_dir=tmp_path)
    rows = metrics(run_dir)
    assert [m["step"] for m in rows] == [1, 2, 3, 4, 5] and all(math.isfinite(m["loss"]) for m in rows)
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000005"
    launch("tests.train.stand_in", 2, "eval", str(run_dir), log_dir=tmp_path)
    evaluated = json.loads((run_dir / "eval" / "step_000005.json").read_text())
    assert evaluated["val_loss"] == pytest.approx(rows[-1]["val_loss"], abs=1e-6)
    # `audiollm eval RUN_DIR --checkpoint`'s path: one process, the DP=2 checkpoint at a one-rank layout
    proc = subprocess.run([sys.executable, "-m", "tests.train.stand_in", "eval", str(run_dir),
                           str(run_dir / "checkpoints" / "step_000004")],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    single = json.loads((run_dir / "eval" / "step_000004.json").read_text())
    assert single["val_loss"] == pytest.approx(rows[3]["val_loss"], abs=1e-5), (single, rows[3])
