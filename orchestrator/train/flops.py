"""FLOPs of a decoder-only transformer step, counted from the TransformerConfig.

Model FLOPs (for MFU) count what the model needs: forward + backward = 3 x forward.
Hardware FLOPs add what activation recomputation re-runs: a second forward of every
recomputed layer (full) or of the core attention (selective). Matmuls only; a
multiply-add is 2 FLOPs; attention scores count the full s x s square (as Megatron-LM).
"""

from __future__ import annotations


def _layer_forward_flops(config, seq_length: int) -> tuple[float, float]:
    """(linear FLOPs, core-attention FLOPs) of one layer's forward, per token."""
    h = config.hidden_size
    kv = config.kv_channels or h // config.num_attention_heads
    q_width = config.num_attention_heads * kv
    kv_width = (config.num_query_groups or config.num_attention_heads) * kv
    ffn = config.ffn_hidden_size
    fc1_out = 2 * ffn if config.gated_linear_unit else ffn
    linear = 2 * (h * (q_width + 2 * kv_width) + q_width * h + h * fc1_out + ffn * h)
    attention = 2 * 2 * seq_length * q_width  # QK^T and attention x V
    return float(linear), float(attention)


def decoder_flops_per_sample(config, seq_length: int, vocab_size: int) -> dict:
    linear, attention = _layer_forward_flops(config, seq_length)
    layers = config.num_layers
    logits = 2.0 * config.hidden_size * vocab_size
    forward = seq_length * (layers * (linear + attention) + logits)
    model = 3.0 * forward
    granularity = getattr(config, "recompute_granularity", None)
    if granularity == "full":
        recomputed_layers = layers if config.recompute_num_layers is None else min(layers, _full_recompute_layers(config))
        extra = seq_length * recomputed_layers * (linear + attention)
    elif granularity == "selective":
        extra = seq_length * layers * attention
    else:
        extra = 0.0
    return {"model": model, "hardware": model + extra}


def _full_recompute_layers(config) -> int:
    # uniform: every layer is recomputed (in chunks of recompute_num_layers);
    # block: the first recompute_num_layers layers of each pipeline stage.
    if config.recompute_method == "block":
        return config.recompute_num_layers * (config.pipeline_model_parallel_size or 1)
    return config.num_layers
