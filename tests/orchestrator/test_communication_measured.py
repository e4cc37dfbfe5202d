"""The plan's communication bytes per kind, and the pipeline schedule its step time
plays, against a real multi-process training step whose torch.distributed calls are
wrapped and summed and whose forwards and backwards are recorded (comm_count_script.py): the tiny
AudioLLM on the tone corpus, gloo on CPU, one step.

Three layouts of four ranks cover every kind and switch: TP=2 x PP=2 interleaved
(vpp 2, four micro-batches) with sequence parallel; CP=2 x DP=2 with the distributed optimizer; TP=2 x DP=2
without sequence parallel, with LoRA and full recompute and the plain all-reduce of
gradients. Expected and measured agree exactly but for megatron's padding of the
distributed optimizer's gradient buffer (each parameter starts at a multiple of 64
values, each bucket ends at a multiple of lcm(DP x CP, 128)) and a few scalars (the
loss, token counts, the gradient norm). The other layouts run two micro-batches."""

import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from orchestrator.plan.schedule import order
from tests.train.audiollm_runs import make_corpus, write_audiollm_run_dir
from tests.train.jobs import launch

pytestmark = pytest.mark.multiprocess
SCALARS_BYTES = 256  # a kind's scalar collectives in one step (loss sums, norms, flags)

LAYOUTS = {
    "tp2_pp2_vpp2_sp": dict(tp=2, pp=2, kinds={"tp", "pp"}, global_batch_size=8, extra=["parallel.sp=true", "parallel.vpp=2", "model.adapter.ctc_weight=0"]),
    "cp2_dp2_distopt": dict(cp=2, kinds={"cp", "dp"}, extra=["launcher.gpus_per_node=4", "parallel.distributed_optimizer=true"]),
    "tp2_dp2_lora_full_recompute": dict(tp=2, kinds={"tp", "dp"}, extra=[
        "launcher.gpus_per_node=4", "parallel.sp=false", "lora.rank=4", "model.allow_frozen_random=true",
        "parallel.recompute.granularity=full", "parallel.recompute.method=uniform", "parallel.recompute.num_layers=1"]),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("tones"))


def expected_traffic(run_dir: Path, widths: list[int]):
    """The planner's count for the run directory's own plan and the micro-batch widths the step ran."""
    from orchestrator.plan import communication as comm, estimate as est
    from orchestrator.plan.resolve import to_object
    from orchestrator.plan.schema import AudioLLMConfig
    from orchestrator.plan.step_flops import recomputed_layers

    plan = json.loads((run_dir / "plan.json").read_text())
    cfg = to_object(OmegaConf.merge(OmegaConf.structured(AudioLLMConfig), OmegaConf.create(plan["config"])))
    inventory = est.inventory_for(cfg)
    stages = est.stage_params(inventory, cfg.model, cfg.parallel)
    rc = cfg.parallel.recompute
    full = recomputed_layers(cfg.model.decoder.num_layers, rc.granularity, rc.method, rc.num_layers,
                             cfg.parallel.pp, cfg.parallel.vpp)
    shape = comm.shape_of(cfg, plan["dp"], plan["num_microbatches"], inventory, full)
    return plan, comm.stage_traffic(shape, [s.trainable for s in stages], widths)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_bytes_per_kind_match_a_measured_step(layout, corpus, tmp_path):
    spec = LAYOUTS[layout]
    tp, pp, cp = spec.get("tp", 1), spec.get("pp", 1), spec.get("cp", 1)
    run_dir = write_audiollm_run_dir(tmp_path / layout, corpus, tp=tp, pp=pp, cp=cp, iters=1,
                                     global_batch_size=spec.get("global_batch_size", 4),
                                     extra=["optim.lr_warmup_iters=0", *spec["extra"]])
    launch(str(Path(__file__).with_name("comm_count_script.py")), 4, str(run_dir), log_dir=tmp_path)
    ranks = [json.loads(p.read_text()) for p in sorted(run_dir.glob("comm-rank*.json"))]
    assert len(ranks) == 4
    checked = set()
    for rank, measured in enumerate(ranks):
        plan, traffic = expected_traffic(run_dir, measured["widths"])
        expected = traffic[measured["stage"]].by_kind
        dp_cp = plan["dp"] * plan["cp"]
        element_bytes = {"reduce_scatter": 4, "all_gather": 4}  # fp32 gradients; fp32 parameters on CPU
        padding = 64 * measured["trainable_tensors"] + math.lcm(dp_cp, 128) * 2 * measured["model_chunks"]
        for kind in ("tp", "cp", "pp", "dp"):
            got, want = measured["bytes"].get(kind, {}), expected.get(kind, {})
            for collective in sorted(set(got) | set(want)):
                g, w = got.get(collective, 0), want.get(collective, 0)
                allowed = SCALARS_BYTES
                if kind == "dp" and plan["megatron_args"]["use_distributed_optimizer"] and collective in element_bytes:
                    allowed += padding * element_bytes[collective]
                assert 0 <= g - w <= allowed, (
                    f"rank {rank} (stage {measured['stage']}) {kind} {collective}: measured {g} bytes, "
                    f"planned {w:.0f} (allowed excess {allowed})")
                if w:
                    checked.add((kind, collective))
    # the order of forwards and backwards the step-time estimate plays is the one megatron ran
    for measured in ranks:
        assert [tuple(e) for e in measured["schedule"]] == order(plan["pp"], plan["vpp"], plan["num_microbatches"],
                                                                 measured["stage"])
    # the layout exercises the kinds it is meant to
    assert {kind for kind, _ in checked} == spec["kinds"], checked
