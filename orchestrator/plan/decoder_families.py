"""Decoder families: what each one's layer computes, in one table the plan side (parameter
inventory, Megatron argv, validation) and the model (orchestrator/models) both read.
Torch-free: the submit side imports it.

    gemma2  sandwich norms (post-attention and post-MLP RMSNorms beside the pre-norms),
            zero-centred RMSNorm x*(1 + w), GeGLU with tanh GELU, embeddings times
            sqrt(hidden), sliding windows on even layers, attention and final softcaps,
            queries scaled by query_pre_attn_scalar**-0.5
    llama   pre-norms only, RMSNorm x*w (HF Llama's order: normalised in fp32, cast,
            then times w), SwiGLU, unscaled embeddings, full attention, queries scaled by
            head_dim**-0.5, RoPE with Llama 3's frequency scaling (rope_scaling_factor)
    qwen2   Llama's layer with biases on the query, key and value projections (Qwen2, 2.5)
    qwen3   Llama's layer with QK-norm: an RMSNorm x*w over each head's head_dim on the
            queries and keys, before RoPE (Qwen3 dense)
    gemma3  Gemma2's layer (sandwich and zero-centred norms, GeGLU, scaled embeddings,
            query_pre_attn_scalar) with zero-centred QK-norm, no softcaps, five sliding-window
            layers to one global layer, RoPE base rope_local_theta on the sliding layers and
            rope_theta (with linear scaling rope_scaling_factor) on the global ones

`model.decoder.family` selects one; the default is gemma2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class DecoderFamily:
    name: str
    hf_model_type: str  # config.json's model_type of the family's HF model
    sandwich_norms: bool  # post_attention_layernorm and post_mlp_layernorm after each block
    zero_centered_norm: bool  # RMSNorm scales by (1 + w) (weights stored as offsets from one)
    activation: str  # of the gated MLP: fc1 = [gate; up], act(gate) * up
    scaled_embeddings: bool  # embeddings times sqrt(hidden) (after audio fusion)
    sliding_window: bool  # windows on all layers but every window_pattern-th (model.decoder.sliding_window)
    softcaps: bool  # attention and final logit softcaps may be set
    query_pre_attn_scalar: bool  # queries scaled by query_pre_attn_scalar**-0.5, not head_dim**-0.5
    # RoPE scaling model.decoder.rope_scaling_factor may set: "llama3" (Llama 3's frequency
    # scaling), "linear" (positions divided by the factor: Gemma 3), or None
    rope_scaling: Optional[str]
    hf_architecture: str  # config.json's architectures[0]: the family's HF causal LM class
    qkv_bias: bool = False  # the query, key and value projections have biases
    qk_norm: bool = False  # RMSNorms over head_dim on queries and keys before RoPE
    # Every window_pattern-th layer (1-based) attends globally, the others in the window:
    # HF layer_types "sliding_attention" where (i + 1) % pattern != 0 (Gemma2 2, Gemma 3 6)
    window_pattern: int = 2
    local_rope: bool = False  # sliding layers rotate with model.decoder.rope_local_theta, unscaled


FAMILIES = {
    "gemma2": DecoderFamily("gemma2", "gemma2", sandwich_norms=True, zero_centered_norm=True,
                            activation="gelu_tanh", scaled_embeddings=True, sliding_window=True, softcaps=True,
                            query_pre_attn_scalar=True, rope_scaling=None, hf_architecture="Gemma2ForCausalLM"),
    "llama": DecoderFamily("llama", "llama", sandwich_norms=False, zero_centered_norm=False, activation="silu",
                           scaled_embeddings=False, sliding_window=False, softcaps=False,
                           query_pre_attn_scalar=False, rope_scaling="llama3", hf_architecture="LlamaForCausalLM"),
    "qwen2": DecoderFamily("qwen2", "qwen2", sandwich_norms=False, zero_centered_norm=False, activation="silu",
                           scaled_embeddings=False, sliding_window=False, softcaps=False,
                           query_pre_attn_scalar=False, rope_scaling=None, hf_architecture="Qwen2ForCausalLM",
                           qkv_bias=True),
    "qwen3": DecoderFamily("qwen3", "qwen3", sandwich_norms=False, zero_centered_norm=False, activation="silu",
                           scaled_embeddings=False, sliding_window=False, softcaps=False,
                           query_pre_attn_scalar=False, rope_scaling=None, hf_architecture="Qwen3ForCausalLM",
                           qk_norm=True),
    "gemma3": DecoderFamily("gemma3", "gemma3_text", sandwich_norms=True, zero_centered_norm=True,
                            activation="gelu_tanh", scaled_embeddings=True, sliding_window=True, softcaps=False,
                            query_pre_attn_scalar=True, rope_scaling="linear", hf_architecture="Gemma3ForCausalLM",
                            qk_norm=True, window_pattern=6, local_rope=True),
}


def family_of(decoder) -> DecoderFamily:
    """The family of a decoder section (`model.decoder`: a DecoderConfig or a dict)."""
    name = decoder.get("family", "gemma2") if isinstance(decoder, dict) else getattr(decoder, "family", "gemma2")
    if name not in FAMILIES:
        raise ValueError(f"model.decoder.family={name!r} is not one of {sorted(FAMILIES)}")
    return FAMILIES[name]


def family_for_hf(model_type: str) -> DecoderFamily:
    """The family whose HF model has config.json's `model_type`."""
    for family in FAMILIES.values():
        if family.hf_model_type == model_type:
            return family
    raise ValueError(f"a HF decoder of model_type {model_type!r} is not supported: the decoder families are "
                     f"{', '.join(f.hf_model_type for f in FAMILIES.values())}")


# Each family's own chat format as the data.* prompt keys (the ASR prompt of its instruct
# models' chat template) and the audio placeholder: a token its tokenizer has and never
# produces in text. Validation names them where a prompt or placeholder does not fit the
# tokenizer; the family's recipes set them.
PROMPTS = {
    "gemma2": dict(prompt_template="<start_of_turn>user\nTranscribe: <SpeechHere><end_of_turn>\n<start_of_turn>model\n",
                   response_suffix="<end_of_turn>", audio_token="<unused0>", add_bos=True),
    "llama": dict(prompt_template="<|start_header_id|>user<|end_header_id|>\n\nTranscribe: <SpeechHere><|eot_id|>"
                                  "<|start_header_id|>assistant<|end_header_id|>\n\n",
                  response_suffix="<|eot_id|>", audio_token="<|reserved_special_token_0|>", add_bos=True),
    # Qwen's tokenizers have no BOS token; <|vision_pad|> is a placeholder of the
    # vision models, never written in text.
    "qwen2": dict(prompt_template="<|im_start|>user\nTranscribe: <SpeechHere><|im_end|>\n<|im_start|>assistant\n",
                  response_suffix="<|im_end|>", audio_token="<|vision_pad|>", add_bos=False),
}
PROMPTS["qwen3"] = PROMPTS["qwen2"]
PROMPTS["gemma3"] = PROMPTS["gemma2"]


def data_overrides(settings: dict) -> list[str]:
    """data keys as command-line overrides (data.KEY=VALUE)."""
    return [f"data.{key}={str(value).lower() if isinstance(value, bool) else repr(value)}"
            for key, value in settings.items()]


def prompt_overrides(family: str) -> list[str]:
    """The family's prompt keys as command-line overrides (data.KEY=VALUE)."""
    return data_overrides(PROMPTS[family])


def prompt_settings(family: str) -> str:
    """The family's prompt keys as overrides, for messages."""
    return " ".join(prompt_overrides(family))

