"""Stragglers named (orchestrator/train/stragglers.py): the rule on step parts, and a
2-rank data-parallel run whose rank 1 is slowed on purpose (0.15 s more in every
micro-batch's forward), named every log interval on the console and in metrics.jsonl."""

import pytest

from orchestrator.train.stragglers import StepTimer, stragglers
from tests.train.jobs import launch, metrics
from tests.train.plans import write_run_dir


def _parts(data_wait, compute, optimizer, sync):
    return {"data_wait": data_wait, "compute": compute, "optimizer": optimizer, "sync": sync}


def test_a_rank_whose_own_time_is_over_the_median_by_the_threshold_is_named():
    # Equal step times (a synchronous step): the slow rank's own time, its peers' waiting.
    even = [_parts(0.01, 0.50, 0.05, 0.10), _parts(0.01, 0.50, 0.05, 0.10), _parts(0.01, 0.52, 0.05, 0.08)]
    assert stragglers(even, 0.2) == []
    slow = [_parts(0.01, 0.50, 0.05, 0.40), _parts(0.01, 0.90, 0.05, 0.00), _parts(0.01, 0.50, 0.05, 0.40)]
    (named,) = stragglers(slow, 0.2)
    assert named["rank"] == 1 and named["median_s"] == pytest.approx(0.56) and named["over"] == pytest.approx(
        0.96 / 0.56 - 1)
    assert stragglers([_parts(0.5, 0.5, 0.1, 0.0), _parts(0.01, 0.5, 0.1, 0.5)], 0.2)[0]["rank"] == 0  # data wait


def test_the_first_step_of_a_process_is_not_timed():
    timer = StepTimer()
    for _ in range(3):
        timer.start()
        timer.lap("compute")
        timer.step_done()
    assert timer.steps == 2


@pytest.mark.multiprocess
def test_a_slowed_rank_is_named_every_log_interval(tmp_path):
    run_dir = write_run_dir(tmp_path / "slow", dp=2, iters=10, num_microbatches=2)
    output = launch("job_script.py", 2, "slow", str(run_dir), "1", log_dir=tmp_path)
    rows = {m["step"]: m for m in metrics(run_dir)}
    assert rows[5]["stragglers"] == [1] and rows[10]["stragglers"] == [1], rows
    assert not any("stragglers" in rows[s] for s in rows if s % 5), rows  # reported at log steps only
    # (the process's first step, with its one-time costs, is left out)
    assert "stragglers over steps 2-5: rank 1 " in output and "stragglers over steps 6-10: rank 1 " in output
    assert "rank 0 " not in output.partition("stragglers over steps 2-5:")[2].splitlines()[0]
