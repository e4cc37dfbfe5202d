"""Every recipe's resolved Plan builds the job's megatron-core configs (in one process)."""

import pytest
import torch

from orchestrator.plan import paths
from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import resolve
from orchestrator.train import megatron_config as mcfg


@pytest.mark.parametrize("recipe", paths.recipe_names())
def test_recipe_plan_builds_transformer_and_optimizer_configs(recipe):
    plan = resolve(compose([f"+recipe={recipe}"]))
    args = plan.megatron_args
    for on_gpu in (False, True):
        config = mcfg.transformer_config(plan, on_gpu=on_gpu)
        assert config.tensor_model_parallel_size == plan.dims.tp
        assert config.pipeline_model_parallel_size == plan.dims.pp
        assert config.virtual_pipeline_model_parallel_size == plan.dims.vpp
        assert config.sequence_parallel == plan.dims.sp
        for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                     "kv_channels", "recompute_granularity"):
            assert getattr(config, name) == args[name], name
        assert config.calculate_per_token_loss
        # bf16 only where the plan asks for it and a GPU runs it; fp32 on CPU
        assert config.params_dtype == (torch.bfloat16 if on_gpu and args.get("bf16") else torch.float32)
        optim = mcfg.optimizer_config(plan, on_gpu=on_gpu)
        assert optim.lr == args["lr"] and optim.min_lr == args["min_lr"] and optim.clip_grad == args["clip_grad"]
        assert optim.use_distributed_optimizer == args["use_distributed_optimizer"]


def test_flags_the_job_implements_itself_are_said_so_and_off_in_megatron():
    """--apply-layernorm-1p and --window-size describe the model in the printed argv; the
    job's one megatron config keeps the zero-centred norm (the project's norms read it) and
    has megatron's windows off (the project's attention windows the even layers), and the
    Plan and `audiollm plan` say so."""
    from orchestrator.plan.report import render
    from orchestrator.plan.resolve import ARGV_IMPLEMENTED_BY_AUDIOLLM

    resolved = resolve(compose(["+recipe=gemma2_whisper_8k_cp2"]))  # context parallel: --cp-comm-type too
    for flags in ARGV_IMPLEMENTED_BY_AUDIOLLM:
        assert all(flag in resolved.argv for flag in flags.split()), flags
    assert resolved.model_extensions["implemented_by_audiollm"] == ARGV_IMPLEMENTED_BY_AUDIOLLM
    assert "--apply-layernorm-1p (orchestrator/models/norms.py" in render(resolved)
    without_cp = resolve(compose(["+recipe=gemma2_whisper_tp4pp2"])).model_extensions["implemented_by_audiollm"]
    assert "--cp-comm-type all_gather" not in without_cp and "--apply-layernorm-1p" in without_cp
    plan = resolved
    config = mcfg.transformer_config(plan, False)
    assert plan.megatron_args["layernorm_zero_centered_gamma"] and plan.megatron_args["window_size"]
    assert config.layernorm_zero_centered_gamma and config.window_size is None and config.window_attn_skip_freq is None
    assert config.sliding_window == plan.config["model"]["decoder"]["sliding_window"]
    # The sizes are the Plan's, as megatron's parallel state has them.
    assert (config.tensor_model_parallel_size, config.context_parallel_size, config.sequence_parallel,
            config.cp_comm_type) == (plan.dims.tp, plan.dims.cp, plan.dims.sp, "all_gather")

