"""Continuing a run at another parallel layout: what the planning side says and refuses
before submission, and what the job refuses. The run itself (DP 2 on two SLURM nodes, TP 2
on one, DP 2 again, against a straight run) is
tests/slurm/test_multinode.py::test_a_two_node_run_continues_on_one_node_and_back_reading_every_sample_once;
the loader's order across sizes is tests/data/test_loader.py's."""

from __future__ import annotations


def test_a_distributed_optimizer_checkpoint_continues_at_another_data_parallel_size_only():
    from orchestrator.plan.rules.topology import layout_change
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
    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import to_object
    from orchestrator.plan.validate import validate

    def findings(*overrides):
        return [str(f) for f in validate(to_object(compose(["launcher.gpus_per_node=4", *overrides])))
                if f.rule == "canonical_nodes"]

    assert findings() == [] and findings("data.canonical_nodes=12", "optim.micro_batch_size=1", "optim.global_batch_size=48") == []
    (error,) = findings("data.canonical_nodes=6", "optim.micro_batch_size=1", "optim.global_batch_size=48")
    assert "data.canonical_nodes (6) is not a multiple of the data-parallel size (4)" in error
    assert "a data-parallel size among [1, 2, 3, 6]" in error
    (warning,) = findings("data.canonical_nodes=8", "optim.micro_batch_size=1", "optim.global_batch_size=12")
    assert "not a multiple of optim.micro_batch_size" in warning


def test_audiollm_plan_shows_the_change_of_size_of_the_run_it_would_resume_or_refuses_it(tmp_path, capsys):
    """`audiollm plan` with the overrides of an existing run (its run.name) says how the
    plan continues the run's latest checkpoint, as `audiollm train` does before it
    submits, and lists a change that cannot load as an error (exit 2)."""
    import json

    from orchestrator.cli import plan_main

    checkpoint = tmp_path / "tiny_cpu" / "elastic" / "checkpoints" / "step_000040"
    checkpoint.mkdir(parents=True)
    (checkpoint.parent / "latest").write_text("step_000040\n")

    def saved(**layout):
        (checkpoint / "layout.json").write_text(json.dumps({"tp": 1, "pp": 1, "cp": 1, "dp": 2, "world_size": 2,
                                                             "canonical_nodes": 2, "optimizer": None, **layout}))

    run = ["run.experiment=tiny_cpu", "run.name=elastic", f"run.output_root={tmp_path}", "optim.micro_batch_size=8"]
    saved()
    assert plan_main([*run, "launcher.gpus_per_node=1"]) == 0
    out = capsys.readouterr().out
    assert "resumes its run directory: step_000040 continues at another size: TP 1 PP 1 CP 1 DP 2 -> TP 1 PP 1 CP 1 " \
           "DP 1" in out, out
    assert plan_main([*run, "launcher.gpus_per_node=2"]) == 0  # the same layout: nothing to say
    assert "resumes its run directory" not in capsys.readouterr().out
    saved(optimizer="dp_reshardable")
    assert plan_main([*run, "launcher.gpus_per_node=2", "parallel.tp=2"]) == 2
    said = capsys.readouterr()
    assert "TP 1 PP 1 CP 1 DP 2 -> TP 2 PP 1 CP 1 DP 1" in said.out
    assert "step_000040: the checkpoint's distributed-optimizer state (megatron's dp_reshardable layout) loads at " \
           "another data-parallel size only" in said.err, said.err
    assert plan_main([*run, "launcher.gpus_per_node=3", "optim.global_batch_size=48"]) == 2
    assert "data-parallel sizes that continue it: 1, 2" in capsys.readouterr().err
