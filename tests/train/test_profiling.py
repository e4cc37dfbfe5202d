"""train.profile_steps' window (orchestrator/train/profiling.py) over a loop of small
matrix products on the CPU; the job's own profiled steps: tests/train/test_training.py
(the pipeline-parallel run)."""

import torch

from orchestrator.train.profiling import StepProfiler, profile_dir


def _run(profiler: StepProfiler, steps) -> list:
    """The loop's calls around each step; which steps the profiler recorded."""
    x = torch.randn(64, 64)
    recorded = []
    for step in steps:
        profiler.before_step(step)
        (x @ x).sum()
        if profiler.after_step(step):
            recorded.append(step)
    return recorded


def test_the_window_is_profiled_and_written_once(tmp_path):
    assert _run(StepProfiler([2, 3], [0], 0, tmp_path, "cpu"), range(1, 6)) == [2, 3]
    written = profile_dir(tmp_path, 2, 3, 0)
    assert sorted(p.name for p in written.iterdir()) == ["ops.txt", "trace.json.gz"]
    assert "aten::mm" in (written / "ops.txt").read_text()
    assert [p.name for p in (tmp_path / "profile").iterdir()] == ["steps_2-3"]


def test_a_run_resumed_inside_the_window_profiles_its_rest(tmp_path):
    assert _run(StepProfiler([2, 4], [0, 1], 1, tmp_path, "cpu"), range(4, 7)) == [4]
    assert (profile_dir(tmp_path, 4, 4, 1) / "ops.txt").is_file()


def test_other_ranks_and_runs_without_a_window_profile_nothing(tmp_path):
    assert _run(StepProfiler([1, 2], [0], 1, tmp_path, "cpu"), range(1, 4)) == []
    assert _run(StepProfiler([], [0], 0, tmp_path, "cpu"), range(1, 4)) == []
    assert not (tmp_path / "profile").exists()


def test_a_run_that_ends_inside_the_window_stops_the_profiler_and_writes_nothing(tmp_path):
    profiler = StepProfiler([2, 5], [0], 0, tmp_path, "cpu")
    assert _run(profiler, range(1, 4)) == [2, 3]
    profiler.close()
    assert not (tmp_path / "profile").exists()
    assert _run(StepProfiler([1, 1], [0], 0, tmp_path, "cpu"), [1]) == [1]  # a new session starts cleanly
