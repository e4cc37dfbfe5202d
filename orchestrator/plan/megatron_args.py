"""The Megatron argument set of a run, in Megatron-LM's own flag names.

`megatron_args(...)` turns a composed config into an ordered list of MegatronArg
(argparse dest name, command-line flag, value). The job builds its OptimizerConfig, DDP
config and schedule from the same dest names, so what is printed by `audiollm plan` is
what runs. It builds its TransformerConfig from the Plan's `transformer_fields`
(megatron_fields.py), from which `decoder_args` writes the model's flags.
What Megatron-LM has no flag for (logit softcaps, sandwich norms, GeGLU with tanh GELU,
embedding scaling, query_pre_attn_scalar when it differs from kv_channels) is not invented
as a flag here: it is in those fields and in the family (decoder_families.py). Two flags
that Megatron-LM has, --apply-layernorm-1p and --window-size, are printed to describe the
model, but the job implements them in its own modules (model_extensions
["implemented_by_audiollm"] says where).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.plan.decoder_families import family_of
from orchestrator.plan.schema import DataConfig, ModelConfig, OptimConfig, ParallelConfig, TrainConfig

# megatron's padding of the vocabulary: a multiple of this times TP.
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128


@dataclass(frozen=True)
class MegatronArg:
    dest: str  # Megatron-LM argparse dest (= megatron-core config field where one exists)
    flag: str  # command-line flag
    value: Any
    # For store_false flags such as --disable-bias-linear: the flag is present when value is False.
    negated: bool = False

    def render(self) -> list[str]:
        if isinstance(self.value, bool):
            present = (not self.value) if self.negated else self.value
            return [self.flag] if present else []
        if self.value is None:
            return []
        return [self.flag, _format(self.value)]


def _format(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ",".join(str(v) for v in value) + ")"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _arg(dest: str, value: Any, flag: str | None = None, negated: bool = False) -> MegatronArg:
    return MegatronArg(dest=dest, flag=flag or "--" + dest.replace("_", "-"), value=value, negated=negated)


def parallel_args(parallel: ParallelConfig) -> list[MegatronArg]:
    rc = parallel.recompute
    return [
        _arg("tensor_model_parallel_size", parallel.tp),
        _arg("pipeline_model_parallel_size", parallel.pp),
        _arg("context_parallel_size", parallel.cp),
        # The Gemma2 attention gathers K/V over the CP group (orchestrator.models.attention).
        _arg("cp_comm_type", "all_gather" if parallel.cp > 1 else None),
        _arg("num_virtual_stages_per_pipeline_rank", parallel.vpp),
        _arg("use_distributed_optimizer", parallel.distributed_optimizer),
        _arg("sequence_parallel", parallel.sp),
        _arg("use_tp_pp_dp_mapping", parallel.rank_order == "tp-cp-ep-pp-dp"),
        _arg("recompute_granularity", rc.granularity),
        _arg("recompute_method", rc.method),
        _arg("recompute_num_layers", rc.num_layers),
    ]


def decoder_args(model: ModelConfig, seq_length: int, fields: dict[str, Any]) -> list[MegatronArg]:
    """Megatron-LM's flags for the model, written from its megatron `fields`
    (megatron_fields.transformer_fields: the one translation of the family's traits)."""
    dec, f = model.decoder, fields
    scaling = family_of(dec).rope_scaling if f["rope_scaling_factor"] is not None else None
    return [
        _arg("num_layers", f["num_layers"]),
        _arg("hidden_size", f["hidden_size"]),
        _arg("ffn_hidden_size", f["ffn_hidden_size"]),
        _arg("num_attention_heads", f["num_attention_heads"]),
        _arg("group_query_attention", f["num_query_groups"] != f["num_attention_heads"]),
        _arg("num_query_groups", f["num_query_groups"]),
        _arg("kv_channels", f["kv_channels"]),
        _arg("seq_length", seq_length),
        _arg("max_position_embeddings", dec.max_position_embeddings),
        _arg("position_embedding_type", "rope"),
        _arg("rotary_base", int(dec.rope_theta)),
        *([_arg("use_rope_scaling", True), _arg("rope_scaling_factor", float(f["rope_scaling_factor"]))]
          if scaling == "llama3" else []),
        # Gemma 3's linear scaling (Megatron-LM takes an integer factor; Gemma 3's is 8)
        *([_arg("rotary_seq_len_interpolation_factor", int(f["rope_scaling_factor"]))]
          if scaling == "linear" else []),
        _arg("normalization", f["normalization"]),
        _arg("norm_epsilon", f["layernorm_epsilon"]),
        # RMSNorm weight w is applied as (1 + w): Gemma's zero-centred gamma.
        *([_arg("layernorm_zero_centered_gamma", True, flag="--apply-layernorm-1p")]
          if f["layernorm_zero_centered_gamma"] else []),
        _arg("add_bias_linear", f["add_bias_linear"], flag="--disable-bias-linear", negated=True),
        *([_arg("swiglu", True)] if f["activation_func"] == "silu" else []),  # fc1 = [gate; up], silu on the gate
        *([_arg("add_qkv_bias", True)] if f["add_qkv_bias"] else []),  # Qwen2's q, k, v biases
        *([_arg("qk_layernorm", True)] if f["qk_layernorm"] else []),  # Qwen3's RMSNorm of each head's q and k
        # Sliding window of W tokens including the current one = (W-1, 0) in Megatron; skip
        # frequency 2 puts windows on layers 0, 2, 4, ... (HF layer_types), 6 on all but 5, 11, ...
        # (the project's attention applies them: megatron's own stay off in the fields)
        *([_arg("window_size", (f["sliding_window"] - 1, 0)), _arg("window_attn_skip_freq", f["window_pattern"])]
          if f["sliding_window"] else []),
        _arg("hidden_dropout", f["hidden_dropout"]),
        _arg("attention_dropout", f["attention_dropout"]),
        _arg("vocab_size", dec.vocab_size),
        _arg("make_vocab_size_divisible_by", MAKE_VOCAB_SIZE_DIVISIBLE_BY),
        _arg("untie_embeddings_and_output_weights", not dec.tie_embeddings),
        _arg("transformer_impl", f["transformer_impl"]),
        _arg("fp8", f["fp8"], flag="--fp8-format"),
    ]


def training_args(optim: OptimConfig, train: TrainConfig, bf16: bool, fields: dict[str, Any]) -> list[MegatronArg]:
    return [
        _arg("micro_batch_size", optim.micro_batch_size),
        _arg("global_batch_size", optim.global_batch_size),
        _arg("train_iters", train.iters),
        _arg("seed", train.seed),
        _arg("optimizer", optim.optimizer),
        _arg("lr", optim.lr),
        _arg("min_lr", optim.min_lr),
        _arg("lr_decay_style", optim.lr_decay_style),
        _arg("lr_warmup_iters", optim.lr_warmup_iters),
        _arg("lr_decay_iters", train.iters),
        _arg("weight_decay", optim.weight_decay),
        _arg("adam_beta1", optim.adam_beta1),
        _arg("adam_beta2", optim.adam_beta2),
        _arg("adam_eps", optim.adam_eps),
        _arg("clip_grad", optim.clip_grad),
        _arg("bf16", bf16),
        _arg("attention_softmax_in_fp32", fields["attention_softmax_in_fp32"]),
    ]


def gpu_performance_args(model: ModelConfig, on_gpu: bool, dp: int) -> list[MegatronArg]:
    """Fusions and overlaps that only a GPU run has (Megatron-LM's defaults where it has
    them), decided here so that the plan shows what the job does."""
    return [
        # The weight gradient accumulated straight into the fp32 main_grad buffer inside the
        # GEMM: off on CPU; on GPUs the job decides at start from what is installed (apex's
        # fused_weight_gradient_mlp_cuda, orchestrator/runtime/machine.py), so the plan
        # leaves it open (None: no flag printed) and says so (model_extensions).
        _arg("gradient_accumulation_fusion", None if on_gpu else False,
             flag="--no-gradient-accumulation-fusion", negated=True),
        # Data-parallel gradient all-reduce (or reduce-scatter) bucket by bucket while the
        # backward still runs, instead of after it.
        _arg("overlap_grad_reduce", on_gpu and dp > 1),
    ]


def megatron_args(
    model: ModelConfig, parallel: ParallelConfig, data: DataConfig, optim: OptimConfig, train: TrainConfig,
    on_gpu: bool, dp: int, fields: dict[str, Any],
) -> list[MegatronArg]:
    """GPU runs train in bf16 (with fp32 master weights); CPU runs in fp32. `fields`: the
    plan's megatron_fields.transformer_fields, which the model's flags describe."""
    return (parallel_args(parallel) + decoder_args(model, data.seq_length, fields)
            + training_args(optim, train, bf16=on_gpu, fields=fields) + gpu_performance_args(model, on_gpu, dp))


# The sizes: the argv shows them, plan.json holds them once, in its dims
# (orchestrator/plan/parallel_dims.py), which is what the job reads.
SIZE_DESTS = frozenset({"tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                        "cp_comm_type", "num_virtual_stages_per_pipeline_rank", "sequence_parallel"})


def plan_args(args: list[MegatronArg]) -> dict[str, Any]:
    """The Plan's megatron_args: dest -> value of every argument but the sizes."""
    return {a.dest: a.value for a in args if a.dest not in SIZE_DESTS}


def render_argv(args: list[MegatronArg]) -> list[str]:
    argv: list[str] = []
    for arg in args:
        argv.extend(arg.render())
    return argv


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * TP."""
    multiple = MAKE_VOCAB_SIZE_DIVISIBLE_BY * tp
    return -(-vocab_size // multiple) * multiple
