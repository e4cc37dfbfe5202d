"""Data-parallel gradient reduction overlapped with the backward (GPU runs with DP > 1
plan it: orchestrator/plan/megatron_args.py) trains exactly as the reduction after the
backward does: the plan's flag reaches megatron's DDP, which then starts the reduction
from backward hooks once the step's last micro-batch has produced every gradient.
Run here over gloo."""

import pytest

from tests.train.jobs import launch, metrics, result
from tests.train.plans import write_run_dir


@pytest.mark.multiprocess
def test_overlapped_gradient_reduction_trains_like_the_reduction_after_backward(tmp_path):
    losses = {}
    for overlap in (False, True):
        run_dir = write_run_dir(tmp_path / f"overlap_{overlap}", dp=2, iters=4, num_microbatches=3, warmup=0,
                                overlap_grad_reduce=overlap)
        result(launch("job_script.py", 2, "train", str(run_dir), log_dir=tmp_path))
        losses[overlap] = [row["loss"] for row in metrics(run_dir)]
    assert len(losses[True]) == 4 and losses[True][-1] < losses[True][0], losses
    # The same fp32 sums in the same bucket order: only the time of the all-reduce moves.
    assert losses[True] == losses[False], losses
