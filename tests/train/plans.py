"""Run directories for the training tests: plan.json shaped like resolve's
Plan.to_dict(), for the stand-in model (a tiny megatron GPTModel on synthetic rows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from tests.train.stand_in import MODEL_NAME


def write_run_dir(run_dir: Path, *, tp: int = 1, pp: int = 1, dp: int = 1, vpp: Optional[int] = None,
                  iters: int = 20, lr: float = 3e-3, min_lr: float = 3e-4, warmup: int = 2,
                  decay_style: str = "cosine", num_layers: int = 2, hidden: int = 32, heads: int = 4,
                  seq_length: int = 16, micro_batch_size: int = 2, num_microbatches: int = 2,
                  distributed_optimizer: bool = False, lora: Optional[dict] = None,
                  save_interval: int = 0, keep_last: int = 2, eval_interval: int = 0, save_interval_minutes: float = 0,
                  async_save: bool = False, profile_steps: tuple = (), profile_ranks: tuple = (0,),
                  logger: Optional[dict] = None, recompute: Optional[str] = None,
                  overlap_grad_reduce: bool = False) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    world = tp * pp * dp
    gbs = micro_batch_size * num_microbatches * dp
    padded_vocab = 256  # a multiple of 128 x TP for TP <= 2, the same at every TP (reshard tests)
    megatron_args = dict(  # the sizes are in dims (below), as resolve writes them
        num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=4 * hidden, num_attention_heads=heads,
        num_query_groups=2, kv_channels=hidden // heads, seq_length=seq_length,
        micro_batch_size=micro_batch_size, global_batch_size=gbs, lr=lr, min_lr=min_lr,
        lr_warmup_iters=warmup, lr_decay_style=decay_style, train_iters=iters, weight_decay=0.01,
        clip_grad=1.0, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8,
        use_distributed_optimizer=distributed_optimizer, bf16=True,
        recompute_granularity=recompute, recompute_method="uniform" if recompute == "full" else None,
        recompute_num_layers=1 if recompute == "full" else None, overlap_grad_reduce=overlap_grad_reduce,
    )
    # The stand-in's megatron fields (what megatron_fields.transformer_fields writes for a
    # real model): Gemma-like, RMSNorm and a gated MLP with tanh-GELU (fc1 = [gate; up]);
    # plain causal attention and a plain RMSNorm (the local spec has no zero-centred one).
    transformer_fields = dict(
        num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=4 * hidden, num_attention_heads=heads,
        num_query_groups=2, kv_channels=hidden // heads, normalization="RMSNorm", gated_linear_unit=True,
        activation_func="gelu_tanh", bias_activation_fusion=False, layernorm_zero_centered_gamma=False,
        window_size=None, hidden_dropout=0.0, attention_dropout=0.0,
        recompute_granularity=megatron_args["recompute_granularity"],
        recompute_method=megatron_args["recompute_method"], recompute_num_layers=megatron_args["recompute_num_layers"],
    )
    lora = lora or {"rank": 0, "lr_groups": [{"name": "all", "patterns": ["*"], "lr_scale": 1.0}]}
    config = {
        "model": {"name": MODEL_NAME},
        "optim": {"lr": lr, "min_lr": min_lr, "global_batch_size": gbs, "micro_batch_size": micro_batch_size},
        "lora": lora,
        "data": {"seq_length": seq_length, "seed": 17},
        "train": {"iters": iters, "log_interval": 5, "save_interval": save_interval, "keep_last": keep_last,
                  "save_interval_minutes": save_interval_minutes, "async_save": async_save,
                  "eval_interval": eval_interval, "eval_iters": 1, "seed": 1234,
                  "profile_steps": list(profile_steps), "profile_ranks": list(profile_ranks)},
        "run": {"experiment": "tests", "name": run_dir.name, "resume": "auto"},
        "logger": logger or {"backend": "none"},
        "launcher": {"gpu_type": "h100"},
        "parallel": {"tp": tp, "pp": pp, "cp": 1, "vpp": vpp},
    }
    plan = dict(world_size=world, tp=tp, pp=pp, cp=1, dp=dp, vpp=vpp, sp=False,
                num_microbatches=num_microbatches, padded_vocab_size=padded_vocab,
                tokens_per_step=gbs * seq_length, argv=[], megatron_args=megatron_args,
                transformer_fields=transformer_fields, config=config)
    (run_dir / "plan.json").write_text(json.dumps(plan, indent=1))
    return run_dir
