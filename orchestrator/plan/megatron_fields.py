"""The one translation of a run's model into megatron-core: its TransformerConfig fields.

`transformer_fields(model, parallel, on_gpu)` is what resolve.py writes into plan.json
(`Plan.transformer_fields`) and what the job's one TransformerConfig is built from, as is
(orchestrator/models/decoder_config.py adds the sizes of `Plan.dims` and what the job
decides on its machine). The Megatron-LM argv that `audiollm plan` prints
(megatron_args.decoder_args) is written from the same fields, so a decoder family's traits
(orchestrator/plan/decoder_families.py) become megatron's fields here and nowhere else.

Field names are megatron-core's TransformerConfig fields, plus those of the project's
subclass (orchestrator/models/decoder_config.DecoderTransformerConfig) for what megatron
has no field for: softcaps, the window, the family, RoPE scaling and Gemma 3's local RoPE.
Values are plain JSON; the one exception is `activation_func`, held by its name (a key of
orchestrator/models/decoder_config.ACTIVATIONS). Torch-free: the submit side imports it.
"""

from __future__ import annotations

from typing import Any

from orchestrator.plan.decoder_families import family_of


def decoder_fields(decoder) -> dict[str, Any]:
    """The decoder section's shape and its family's traits as TransformerConfig fields
    (`decoder`: an orchestrator.plan.schema.model.DecoderConfig)."""
    family = family_of(decoder)
    scalar = decoder.query_pre_attn_scalar if family.query_pre_attn_scalar else None
    windowed = family.sliding_window and bool(decoder.sliding_window)
    return dict(
        num_layers=decoder.num_layers,
        hidden_size=decoder.hidden_size,
        num_attention_heads=decoder.num_attention_heads,
        num_query_groups=decoder.num_query_groups,
        kv_channels=decoder.kv_channels,
        ffn_hidden_size=decoder.ffn_hidden_size,
        gated_linear_unit=True,  # fc1 = [gate; up], the activation on the gate half
        activation_func=family.activation,
        add_bias_linear=False,
        add_qkv_bias=family.qkv_bias,  # Qwen2's q, k, v biases
        qk_layernorm=family.qk_norm,  # Qwen3's and Gemma 3's RMSNorm of each head's q and k
        layernorm_epsilon=decoder.norm_eps,
        # The family's norm, as megatron names it (TENorm builds it from these on the te
        # backend; the local backend's norms are those norms by construction: decoder_spec).
        normalization="RMSNorm",
        layernorm_zero_centered_gamma=family.zero_centered_norm,  # RMSNorm scales by (1 + w)
        softmax_scale=float(scalar) ** -0.5 if scalar else None,  # None: head_dim**-0.5
        attn_logit_softcapping=decoder.attn_logit_softcap if family.softcaps else None,
        final_logit_softcapping=decoder.final_logit_softcap if family.softcaps else None,
        # The window (tokens, the current one included) on all layers but every
        # window_pattern-th: the project's attention applies it (orchestrator/models/
        # attention.py), so megatron's own windows (window_size) stay off.
        sliding_window=decoder.sliding_window if windowed else None,
        window_pattern=family.window_pattern,
        window_size=None,
        window_attn_skip_freq=None,
        decoder_family=family.name,
        rope_scaling_factor=decoder.rope_scaling_factor if family.rope_scaling else None,
        rope_local_theta=decoder.rope_local_theta if family.local_rope else None,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=float(decoder.init_method_std),
        # Fusions the project's layers do not take (the local spec's GLU needs
        # bias_activation_fusion off; the others are CUDA/apex kernels that the compiled
        # layers replace).
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
    )


def transformer_fields(model, parallel, on_gpu: bool) -> dict[str, Any]:
    """Every TransformerConfig field the plan decides (`model`, `parallel`: the config's
    sections; `on_gpu`: launcher.accelerator is gpu): the decoder's, the backend, FP8,
    recompute and the softmax's precision. The sizes are `Plan.dims`' (not repeated here)."""
    rc = parallel.recompute
    return dict(
        decoder_fields(model.decoder),
        transformer_impl="transformer_engine" if model.backend == "te" else "local",
        fp8=model.fp8,
        recompute_granularity=rc.granularity,
        recompute_method=rc.method,
        recompute_num_layers=rc.num_layers,
        # GPU runs train in bf16 (megatron_args.training_args), its softmax in fp32.
        attention_softmax_in_fp32=on_gpu,
    )
