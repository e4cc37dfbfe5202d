"""The run's sizes as one object (orchestrator/plan/parallel_dims.py) and the Plan that
carries them from planning to every rank (orchestrator/plan/resolved.py)."""

import json

import pytest
from omegaconf import OmegaConf

from orchestrator.plan.compose import compose
from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.plan.resolve import resolve, to_object
from orchestrator.plan.resolved import Plan, PlanError
from orchestrator.plan.topology import rank_layout


def test_sizes_on_a_world_name_every_factor_where_they_do_not_tile_it():
    dims = ParallelDims(tp=2, pp=2, cp=2).at_world(16)
    assert (dims.dp, dims.world_size, dims.model_parallel) == (2, 16, 8)
    with pytest.raises(ValueError) as bad:
        ParallelDims(tp=4, pp=2).at_world(12, "launcher.nodes 3 x launcher.gpus_per_node 4")
    said = str(bad.value)
    for part in ("tensor_model_parallel_size (4)", "pipeline_model_parallel_size (2)", "context_parallel_size (1)",
                 "= 8 does not divide world size 12", "launcher.nodes 3 x launcher.gpus_per_node 4"):
        assert part in said, said
    with pytest.raises(ValueError, match="tp 2 x pp 1 x cp 1 x dp 2 = 4 ranks planned, but world size is 8"):
        ParallelDims(tp=2, dp=2).at_world(8)
    with pytest.raises(ValueError, match="use ParallelDims.at_world"):
        ParallelDims(tp=2).world_size


def test_micro_batches_and_the_batch_that_is_not_whole_steps():
    dims = ParallelDims(tp=2, dp=4)
    assert dims.microbatches(32, 2) == 4
    with pytest.raises(ValueError, match=r"global_batch_size \(30\) is not divisible by .*micro_batch_size \(2\) x "
                                         r"data-parallel size \(4\) = 8"):
        dims.microbatches(30, 2)


def test_no_interleaving_has_one_spelling_and_the_mesh_is_megatrons():
    assert ParallelDims(pp=1, vpp=2).vpp is None and ParallelDims(pp=2, vpp=1).vpp is None
    assert ParallelDims(pp=2, vpp=2).vpp == 2
    dims = ParallelDims(tp=2, pp=2, dp=2, order="tp-cp-ep-pp-dp")
    assert dims.mesh() == rank_layout(2, 1, 2, 2, "tp-cp-ep-pp-dp")
    assert ParallelDims.from_dict(dims.as_dict()) == dims


def test_the_plan_round_trips_through_its_run_directory(tmp_path):
    planned = resolve(compose(["+recipe=gemma2_whisper_tp4pp2"]))
    written = json.dumps(planned.to_dict())
    (tmp_path / "plan.json").write_text(written)
    loaded = Plan.load(tmp_path)
    assert loaded.dims == planned.dims and loaded.dims.world_size == 32
    assert loaded.to_dict() == json.loads(written)  # every field back as written (tuples as JSON lists)
    # the config it carries is the composed one, as OmegaConf writes it out
    typed = to_object(compose(["+recipe=gemma2_whisper_tp4pp2"]))
    assert planned.config == OmegaConf.to_container(OmegaConf.structured(typed), resolve=True)
    assert loaded.run_dir == tmp_path and loaded.seed == planned.config["train"]["seed"]
    loaded.check_world(32)
    with pytest.raises(PlanError, match="world size is 8 \\(WORLD_SIZE of the job\\)"):
        loaded.check_world(8)


def test_a_plan_file_that_disagrees_with_itself_is_refused(tmp_path):
    data = resolve(compose([])).to_dict()
    (tmp_path / "plan.json").write_text(json.dumps({**data, "world_size": 3}))
    with pytest.raises(PlanError, match="inconsistent: tp 1 x pp 1 x cp 1 x dp 1 != world_size 3"):
        Plan.load(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps({k: v for k, v in data.items() if k != "megatron_args"}))
    with pytest.raises(PlanError, match=r"lacks keys \['megatron_args'\]"):
        Plan.load(tmp_path)
    with pytest.raises(PlanError, match="does not exist"):
        Plan.load(tmp_path / "nowhere")
