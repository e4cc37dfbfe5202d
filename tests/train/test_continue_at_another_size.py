"""A run continued at another parallel layout (the real AudioLLM, the real MDS loader,
checkpoints through dist_checkpointing), against a straight run at DP 2 (2 processes):
steps 1-4 at DP 2, steps 5-8 at TP 2 (DP 1: one data-parallel rank reads both canonical
nodes), steps 9-12 at DP 2 again, each phase resumed from the last checkpoint of the one
before. Every step trains on the same samples as the straight run, so across the change no sample
is lost or read twice, and the losses agree to fp32 reduction order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launchers.commands import continuation_of
from tests.train.audiollm_runs import make_corpus, write_audiollm_run_dir
from tests.train.consumed import consumed
from tests.train.jobs import launch, metrics, result

ITERS, PHASE = 12, 4


def _plan(run_dir: Path, corpus: Path, tp: int, dp: int) -> None:
    write_audiollm_run_dir(run_dir, corpus, tp=tp, iters=ITERS, save_interval=PHASE,
                           extra=[f"launcher.gpus_per_node={tp * dp}", "model.adapter.ctc_weight=0"])


@pytest.mark.multiprocess
def test_a_run_continues_at_another_data_parallel_and_tensor_parallel_size(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    straight_dir, continued_dir = tmp_path / "straight", tmp_path / "continued"
    _plan(straight_dir, corpus, tp=1, dp=2)
    (tmp_path / "reads_straight").mkdir()
    straight = result(launch("job_script.py", 2, "train", str(straight_dir), log_dir=tmp_path,
                             env={"TEST_CONSUMED_DIR": str(tmp_path / "reads_straight")}))["losses"]

    (tmp_path / "reads_continued").mkdir()
    env = {"TEST_CONSUMED_DIR": str(tmp_path / "reads_continued")}
    outputs, told = [], []
    for end, tp, dp in ((PHASE, 1, 2), (2 * PHASE, 2, 1), (ITERS, 1, 2)):
        _plan(continued_dir, corpus, tp=tp, dp=dp)
        # What `audiollm train` prints before it submits (the checkpoint's layout.json).
        told.append(continuation_of(continued_dir, json.loads((continued_dir / "plan.json").read_text())))
        args = ("kill", str(continued_dir), str(end)) if end < ITERS else ("train", str(continued_dir))
        outputs.append(launch("job_script.py", tp * dp, *args, log_dir=tmp_path, env=env,
                              expect_rc=17 if end < ITERS else 0))
    assert "continuing at another size" in outputs[1] and "continuing at another size" in outputs[2]
    assert told == [(None, []),
                    ("step_000004 continues at another size: TP 1 PP 1 CP 1 DP 2 -> TP 2 PP 1 CP 1 DP 1; each "
                     "data-parallel rank reads 2 of its 2 canonical nodes", []),
                    ("step_000008 continues at another size: TP 2 PP 1 CP 1 DP 1 -> TP 1 PP 1 CP 1 DP 2; each "
                     "data-parallel rank reads 1 of its 2 canonical nodes", [])]
    rows = metrics(continued_dir)
    assert [m["step"] for m in rows] == list(range(1, ITERS + 1))
    continued = [m["loss"] for m in rows]
    # The same samples, step for step (the kills came after a checkpoint, so nothing is
    # consumed twice by a replayed step): the multiset of the whole run is the straight one's.
    assert consumed(tmp_path / "reads_continued") == consumed(tmp_path / "reads_straight")
    assert continued[:PHASE] == straight[:PHASE]  # the same layout: bit for bit
    print("step, straight, continued:", list(zip(range(1, ITERS + 1), straight, continued)))
    # After the change only the order of fp32 sums differs (TP splits the matmuls, DP 1
    # accumulates both micro-batches where DP 2 all-reduces them): about 1e-5 relative in
    # the first step's loss, grown by Adam (whose step does not shrink with the gradient's
    # size) to about 1e-4 over the eight steps after it. A lost or repeated sample changes
    # a step's batch (the loss by about 1e-1 here), and Adam state lost in the reshard
    # restarts its moments (about 1e-2): 1e-3 tells both from reduction order.
    assert continued == pytest.approx(straight, rel=1e-3)


def test_a_distributed_optimizer_checkpoint_continues_at_another_data_parallel_size_only():
    from orchestrator.checkpoint_dirs import layout_change
    from orchestrator.train.checkpoint import optimizer_reshard_problem

    saved = {"tp": 1, "pp": 2, "cp": 1, "dp": 4}
    assert optimizer_reshard_problem("dp_reshardable", saved, {**saved, "dp": 2}) is None
    assert optimizer_reshard_problem(None, saved, {**saved, "tp": 2}) is None  # no distributed optimizer
    problem = optimizer_reshard_problem("dp_reshardable", saved, {**saved, "tp": 2, "dp": 2})
    assert "saved at TP 1 PP 2 CP 1 DP 4" in problem and "this job is TP 2 PP 2 CP 1 DP 2" in problem
    assert "Continue it at TP 1 PP 2 CP 1 with any data-parallel size" in problem

    # Refused before submission (the planning side reads the checkpoint's layout.json).
    def plan(nodes=None, **sizes):
        return {**saved, **sizes, "config": {"data": {"canonical_nodes": nodes}}}

    written = {**saved, "canonical_nodes": 4, "optimizer": "dp_reshardable"}
    assert layout_change(written, plan()) == (None, [])
    line, problems = layout_change(written, plan(tp=2, dp=2))
    assert line == "continues at another size: TP 1 PP 2 CP 1 DP 4 -> TP 2 PP 2 CP 1 DP 2"
    assert problems == ["the checkpoint's distributed-optimizer state (megatron's dp_reshardable layout) loads at "
                        "another data-parallel size only: keep TP 1 PP 2 CP 1 (runs without "
                        "parallel.distributed_optimizer also change TP, PP and CP)"]
    _, problems = layout_change({**written, "optimizer": None}, plan(dp=3))
    assert problems == ["data-parallel size 3 does not divide the run's 4 canonical nodes (its sample order was "
                        "fixed at its first start); data-parallel sizes that continue it: 1, 2, 4"]
    _, problems = layout_change(written, plan(nodes=8, dp=2))
    assert problems and "data.canonical_nodes=8, but this run's sample order was fixed at 4" in problems[0]


def test_canonical_nodes_must_be_a_multiple_of_the_data_parallel_size():
    from orchestrator.compose import compose
    from orchestrator.resolve import to_object
    from orchestrator.validate import validate

    def findings(*overrides):
        return [str(f) for f in validate(to_object(compose(["launcher.gpus_per_node=4", *overrides])))
                if f.rule == "canonical_nodes"]

    assert findings() == [] and findings("data.canonical_nodes=12", "optim.micro_batch_size=1", "optim.global_batch_size=48") == []
    (error,) = findings("data.canonical_nodes=6", "optim.micro_batch_size=1", "optim.global_batch_size=48")
    assert "data.canonical_nodes (6) is not a multiple of the data-parallel size (4)" in error
    assert "a data-parallel size among [1, 2, 3, 6]" in error
    (warning,) = findings("data.canonical_nodes=8", "optim.micro_batch_size=1", "optim.global_batch_size=12")
    assert "not a multiple of optim.micro_batch_size" in warning
