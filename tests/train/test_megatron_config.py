"""Every recipe's resolved Plan builds the job's megatron-core configs (in one process)."""

import pytest
import torch

from orchestrator import paths
from orchestrator.compose import compose
from orchestrator.resolve import resolve
from orchestrator.train import megatron_config as mcfg
from orchestrator.train.run_plan import RunPlan


@pytest.mark.parametrize("recipe", paths.recipe_names())
def test_recipe_plan_builds_transformer_and_optimizer_configs(recipe, tmp_path):
    plan = RunPlan(tmp_path, resolve(compose([f"+recipe={recipe}"])).to_dict())
    args = plan.megatron_args
    for on_gpu in (False, True):
        config = mcfg.transformer_config(plan, on_gpu=on_gpu)
        assert config.tensor_model_parallel_size == plan.tp
        assert config.pipeline_model_parallel_size == plan.pp
        assert config.virtual_pipeline_model_parallel_size == (plan.vpp if plan.pp > 1 else None)
        for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                     "kv_channels", "sequence_parallel", "recompute_granularity"):
            assert getattr(config, name) == args[name], name
        assert config.calculate_per_token_loss
        # bf16 only where the plan asks for it and a GPU runs it; fp32 on CPU
        assert config.params_dtype == (torch.bfloat16 if on_gpu and args.get("bf16") else torch.float32)
        optim = mcfg.optimizer_config(plan, on_gpu=on_gpu)
        assert optim.lr == args["lr"] and optim.min_lr == args["min_lr"] and optim.clip_grad == args["clip_grad"]
        assert optim.use_distributed_optimizer == args["use_distributed_optimizer"]
