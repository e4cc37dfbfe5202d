"""`audiollm plan -m`: every point of a sweep planned as `audiollm plan` plans it, one row
each, ranked by the step-time estimate, the points that cannot run last."""

import json

import pytest
from omegaconf import OmegaConf

from orchestrator.cli import main
from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import resolve
from orchestrator.plan.step_time import estimate
from orchestrator.plan.communication import Traffic
from orchestrator.plan.sweep import compose_points, expand

SWEEP = ["+recipe=gemma2_whisper_tp4pp2", "parallel.tp=1,2,4,8", "parallel.pp=1,2,4", "optim.micro_batch_size=1,2",
         "parallel.recompute=none,selective,full"]


def test_points_composed_once_per_group_choice_equal_a_full_compose_of_each():
    overrides = ["+recipe=tiny_cpu", "lora=none,decoder_r16", "parallel.tp=1,2", "optim.lr=1e-3,2e-4",
                 "parallel.recompute=full,none", "data.seq_length=256"]
    points = expand(overrides)
    assert len(points) == 16
    for point, (cfg, problem) in zip(points, compose_points(points)):
        assert problem is None
        assert OmegaConf.to_container(cfg, resolve=True) == OmegaConf.to_container(compose(point), resolve=True), point


def test_a_point_with_an_unknown_key_or_a_wrong_type_is_its_own_error():
    points = [["+recipe=tiny_cpu", "parallel.tpp=2"], ["+recipe=tiny_cpu", "parallel.tp=two"],
              ["+recipe=tiny_cpu", "parallel.tp=2"]]
    (bad_key, why_key), (bad_type, why_type), (good, none) = compose_points(points)
    assert bad_key is None and "parallel.tpp" in why_key
    assert bad_type is None and "parallel.tp" in why_type and "two" in why_type
    assert good is not None and none is None


def test_table_ranks_runnable_points_first_and_names_broken_rules(capsys):
    rc = main(["plan", "-m", *SWEEP, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["shared_errors"] == []
    points = report["points"]
    assert len(points) == 72
    runnable = [p for p in points if p["runs"]]
    assert runnable and points[:len(runnable)] == runnable  # runnable first
    rates = [p["tokens_per_s_per_gpu"] for p in runnable]
    assert rates == sorted(rates, reverse=True)
    by_point = {(p["point"]["parallel.tp"], p["point"]["parallel.pp"]): p for p in points}
    assert any("[sp_needs_tp]" in e for e in by_point[("1", "1")]["errors"])  # the recipe's sp=true
    assert any("[layers_pp]" in e for e in by_point[("2", "4")]["errors"])  # 42 layers over 4 stages
    # the memory column is `audiollm plan`'s of the same point, the TFLOP column its busiest GPU's
    for p in points[::9]:
        if p["memory_gib"] is not None:
            plan = resolve(compose(p["overrides"]), purpose="plan", keep_errors=True).to_dict()
            assert p["memory_gib"] == pytest.approx(plan["memory"]["total_gib"], rel=1e-12)
            assert p["fits"] == plan["memory"]["fits"]
            assert p["tflop_per_gpu"] == pytest.approx(plan["step_estimate"]["busiest_gpu_tflop"], rel=1e-12)
    # recomputing and a pipeline's uneven stages change what the busiest GPU computes
    assert len({round(p["tflop_per_gpu"]) for p in runnable}) > 3, [p["tflop_per_gpu"] for p in runnable]
    assert all(p["valid"] == p["runs"] for p in points)  # nothing shared: valid is runnable


def test_table_says_what_the_estimate_rests_on_and_errors_every_point_shares_once(capsys, tmp_path):
    rc = main(["plan", "-m", "+recipe=gemma2_whisper_tp4pp2", "parallel.tp=2,4", "launcher.inter_node_gb_s=25",
               f"model.init_checkpoint={tmp_path / 'absent'}"])
    text = capsys.readouterr().out
    assert rc == 2  # no point can run until the shared error is fixed
    assert "2 points" in text and "network 25 GB/s per GPU (set)" in text
    assert "NVLink 450 GB/s per GPU (assumed" in text and "MFU 23.5%" in text
    assert "every point has 1 error(s)" in text and "[init_checkpoint]" in text
    table = text.split("best estimate first:")[1].split("GB: what one GPU")[0]
    assert "init_checkpoint" not in table and table.count(" ok ") == 2
    main(["plan", "-m", "+recipe=gemma2_whisper_tp4pp2", "parallel.tp=2,4", f"model.init_checkpoint={tmp_path / 'absent'}",
          "--json"])
    points = json.loads(capsys.readouterr().out)["points"]
    # as the table: each point is valid, and none runs until the shared error is fixed
    assert [(p["valid"], p["runs"]) for p in points] == [(True, False)] * 2


def test_the_tied_embeddings_all_reduce_runs_among_the_first_and_last_stage_only():
    """megatron's embedding group holds 2 ranks whatever the pipeline's depth: its ring
    sends the payload once (2 x 1/2), not 2 x (pp-1)/pp times."""
    last = Traffic(stage=2)
    last.add("pp", "send", 3e9)
    last.add("pp", "all_reduce", 2e9)
    sizes = dict(tp=1, cp=1, pp=3, dp=1)
    assert last.wire_bytes("pp", sizes) == pytest.approx(3e9 + 2e9)
    assert last.wire_bytes("pp", sizes, ("all_reduce",)) == pytest.approx(2e9)


def _uniform(p, m, v):
    """p equal stages of v chunks, a micro-batch's forward 1 s and backward 2 s a stage."""
    chunks = v or 1
    return estimate([[1e12 / chunks] * chunks] * p, [[2e12 / chunks] * chunks] * p, [Traffic(stage=s) for s in range(p)],
                    num_microbatches=m, vpp=v, group_sizes=dict(tp=1, cp=1, pp=p, dp=1),
                    bandwidths=dict(tp=1, cp=1, pp=1, dp=1), peak_flops=1e12, mfu=1.0, world=p, tokens=1,
                    overlap_grad_reduce=False)


@pytest.mark.parametrize("p,m,v", [(1, 4, None), (2, 4, None), (4, 8, None), (4, 8, 2), (2, 16, 3), (4, 4, 4)])
def test_bubble_of_equal_stages_is_the_schedules(p, m, v):
    """megatron's order played with equal stages: 1F1B idles (p-1)/(m+p-1) of the step,
    interleaved over v chunks (p-1)/(v*m+p-1) (Narayanan et al. 2021, section 2.2)."""
    chunks = v or 1
    step = _uniform(p, m, v)
    assert step.bubble == pytest.approx((p - 1) / (chunks * m + p - 1))
    assert step.step_s == pytest.approx(3 * (m + (p - 1) / chunks))


def test_a_heavier_first_stage_sets_the_pace():
    """Stage 0 also runs the encoder: 1F1B's steady state goes at its pace, and the others wait."""
    slow = estimate([[2e12], [1e12]], [[4e12], [2e12]], [Traffic(stage=0), Traffic(stage=1)], num_microbatches=8,
                    vpp=None, group_sizes=dict(tp=1, cp=1, pp=2, dp=1), bandwidths=dict(tp=1, cp=1, pp=1, dp=1),
                    peak_flops=1e12, mfu=1.0, world=2, tokens=1, overlap_grad_reduce=False)
    # stage 0 runs its 8 micro-batches (6 s each) back to back but for one wait: its first
    # backward needs micro-batch 0's gradient, back from stage 1 at 5 s, while its second
    # forward ends at 4 s
    assert slow.step_s == pytest.approx(8 * 6 + 1)
    assert slow.bubble == pytest.approx((49 - (48 + 24) / 2) / 49)


def test_probe_best_probes_the_first_valid_points_or_says_there_is_none(capsys, tmp_path):
    """`--probe-best 1` probes the best valid point (here the tiny recipe on a CPU: no step
    estimate, so the valid points keep their sweep order), also where an error every point
    shares (weights not converted yet) keeps them from running: the probe's weights are fake."""
    absent = f"model.init_checkpoint={tmp_path / 'absent'}"
    rc = main(["plan", "-m", "+recipe=tiny_cpu", "parallel.tp=3,1", absent, "--probe-best", "1"])
    captured = capsys.readouterr()
    assert rc == 2, captured.err  # the shared error still stops a run
    assert "probing the 1 best valid point(s) despite the error(s) every point shares" in captured.out
    assert f"probe of +recipe=tiny_cpu parallel.tp=1 {absent}:" in captured.out  # tp=3 breaks a rule
    assert "parallel.tp=3 " + absent + ":" not in captured.out
    assert main(["plan", "-m", "+recipe=tiny_cpu", "parallel.tp=3,5", "--probe-best", "1"]) == 2
    assert "--probe-best 1: nothing to probe, no point is valid" in capsys.readouterr().err
