"""An evaluation at another layout makes a new Plan (orchestrator/plan/resolved.Plan.at_layout):
every value that follows from the sizes is made anew, none is left from the training layout."""

from orchestrator.plan.compose import compose
from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.plan.resolve import resolve


def test_a_plan_at_another_layout_derives_its_sizes_anew():
    # A vocabulary that megatron pads differently at TP 2 (multiples of 256) and TP 1 (128).
    plan = resolve(compose(["+recipe=llama3_whisper_tp2", "model.decoder.vocab_size=32001"]), keep_errors=True)
    assert (plan.dims.tp, plan.padded_vocab_size) == (2, 32256)
    dims = ParallelDims(tp=1, pp=1, cp=1, order=plan.dims.order).at_world(1, "the test")
    one = plan.at_layout(dims, num_microbatches=plan.global_batch_size // plan.micro_batch_size)
    assert one.dims == dims and one.padded_vocab_size == 32128
    assert one.rank_layout == dims.mesh().as_dict() != plan.rank_layout
    assert one.megatron_args["use_distributed_optimizer"] is False
    # plan.json holds the sizes once, in dims
    assert not {"tensor_model_parallel_size", "sequence_parallel"} & (set(one.megatron_args) | set(plan.megatron_args))
    assert (one.config["parallel"]["tp"], one.config["parallel"]["sp"]) == (1, False)
    # What described the training layout is not kept as if it described this one.
    assert one.argv == [] and one.memory == {} and one.step_estimate is None
    # The model is the run's: its megatron fields and every other argument unchanged; the
    # run's own plan untouched.
    assert one.transformer_fields == plan.transformer_fields
    assert one.megatron_args["lr"] == plan.megatron_args["lr"] and plan.dims.tp == 2
    assert plan.config["parallel"]["tp"] == 2 and plan.padded_vocab_size == 32256


def test_a_layout_no_training_run_could_have_is_refused_by_the_plans_rules():
    """`audiollm eval --tp/--pp` meets the rules a training run at that layout meets
    (orchestrator/plan/rules/topology.py), naming every value."""
    import pytest

    from orchestrator.eval.evaluate import PlanError, plan_at_layout

    plan = resolve(compose(["+recipe=llama3_whisper_tp2"]), keep_errors=True)  # 32 heads, 8 KV groups, 32 layers
    with pytest.raises(PlanError) as refused:
        plan_at_layout(plan, tp=3, pp=5, cp=1, world_size=15)
    said = str(refused.value)
    assert said.startswith("cannot evaluate at this layout: ")
    assert "model.decoder.num_attention_heads (32) is not divisible by parallel.tp (3)" in said
    assert "model.decoder.num_query_groups (8 KV heads) is not divisible by parallel.tp (3)" in said
    assert "model.decoder.num_layers (32) is not divisible by parallel.pp (5)" in said
    assert plan_at_layout(plan, tp=4, pp=2, cp=1, world_size=8).dims.tp == 4
