"""Tiny random HF models (Gemma2, Llama, Qwen2, Qwen3, Gemma 3, Whisper) and the matching project config sections.

Weights are redrawn with larger spreads than HF's init (and non-zero norm weights), so
that every Gemma2 detail (norm offset, softcaps, window, activation) moves the logits
far beyond the parity tolerance."""

from __future__ import annotations

import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                          LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          WhisperConfig)

from orchestrator.convert.decoder_mapping import decoder_config_from_hf
from orchestrator.plan.schema.model import AdapterConfig, DecoderConfig, EncoderConfig, ModelConfig

GEMMA2 = dict(vocab_size=250, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
              sliding_window=8, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
              max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0)


def hf_gemma2_config(**overrides) -> Gemma2Config:
    return Gemma2Config(**{**GEMMA2, **overrides}, attn_implementation="eager")


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            std = 0.5 if "norm" in name else 0.15
            param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model


def hf_gemma2(seed: int = 0, **overrides) -> Gemma2ForCausalLM:
    return randomize(Gemma2ForCausalLM(hf_gemma2_config(**overrides)), seed).eval()


# Llama 3's shape in small: grouped-query attention, untied output layer (as the 8B), RoPE
# base 500000 with its frequency scaling (factor 8, as 3.1). The scaling moves frequencies
# whose wavelength passes 8192 / 4 tokens: at head_dim 16 and base 500000, 6 of the 8.
LLAMA = dict(vocab_size=250, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=16384, rms_norm_eps=1e-5, rope_theta=500000.0,
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192},
             tie_word_embeddings=False, hidden_act="silu", attention_bias=False, mlp_bias=False)


def hf_llama_config(**overrides) -> LlamaConfig:
    return LlamaConfig(**{**LLAMA, **overrides}, attn_implementation="eager")


def hf_llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    return _with_plain_norms(LlamaForCausalLM(hf_llama_config(**overrides)), seed)


def _with_plain_norms(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """`model` randomized, its norm weights drawn around one (the x*w norm of Llama and Qwen)."""
    model = randomize(model, seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(1.0)
    return model.eval()


# Qwen2.5's shape in small: the q/k/v biases, RoPE base 1e6 without scaling, tied embeddings
# (as 0.5b to 3b; 7b unties them). Its head_dim is hidden / heads (Qwen2Config has no key).
QWEN2 = dict(vocab_size=250, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
             tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False)


def hf_qwen2(seed: int = 0, **overrides) -> Qwen2ForCausalLM:
    return _with_plain_norms(Qwen2ForCausalLM(Qwen2Config(**{**QWEN2, **overrides}, attn_implementation="eager")),
                             seed)


# Qwen3's shape in small: QK-norm, head_dim wider than hidden / heads (as 0.6b: 128 against
# 1024 / 16), untied output layer (as 8b), no biases.
QWEN3 = dict(vocab_size=250, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-6,
             rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
             use_sliding_window=False)


def hf_qwen3(seed: int = 0, **overrides) -> Qwen3ForCausalLM:
    return _with_plain_norms(Qwen3ForCausalLM(Qwen3Config(**{**QWEN3, **overrides}, attn_implementation="eager")),
                             seed)


# Gemma 3's text model in small: six layers, so that layer 5 is the one global layer among
# five sliding ones (window 8); RoPE base 1e6 with linear scaling 8 on it (as 4b and
# larger), 1e4 unscaled on the others; zero-centred QK-norm; no softcaps; tied.
GEMMA3 = dict(vocab_size=250, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
              max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
              rope_scaling={"rope_type": "linear", "factor": 8.0}, tie_word_embeddings=True,
              hidden_activation="gelu_pytorch_tanh")


def hf_gemma3(seed: int = 0, **overrides) -> Gemma3ForCausalLM:
    config = Gemma3TextConfig(**{**GEMMA3, **overrides}, attn_implementation="eager")
    return randomize(Gemma3ForCausalLM(config), seed).eval()


HF_DECODERS = {"llama": hf_llama, "qwen2": hf_qwen2, "qwen3": hf_qwen3, "gemma3": hf_gemma3}


def decoder_config(hf_cfg) -> DecoderConfig:
    return decoder_config_from_hf(hf_cfg)


WHISPER = dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
               num_mel_bins=16, max_source_positions=50,
               # decoder sizes only matter for the full WhisperModel saved in conversion tests
               decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64, vocab_size=100, pad_token_id=99,
               bos_token_id=98, eos_token_id=99, decoder_start_token_id=98,
               max_target_positions=32)


def whisper_config(**overrides) -> WhisperConfig:
    return WhisperConfig(**{**WHISPER, **overrides}, attn_implementation="eager")


def encoder_config(cfg: WhisperConfig, freeze: bool = False) -> EncoderConfig:
    return EncoderConfig(d_model=cfg.d_model, num_layers=cfg.encoder_layers, num_heads=cfg.encoder_attention_heads,
                         ffn_dim=cfg.encoder_ffn_dim, num_mel_bins=cfg.num_mel_bins,
                         max_source_positions=cfg.max_source_positions, freeze=freeze)


def random_adapter_weights(wcfg: WhisperConfig, hidden_size: int, gen: torch.Generator) -> dict:
    """The adapter's weights (`adapter.*`, frame stack 5) drawn from `gen`, spread like the
    other tiny weights: a layer mix, a LayerNorm off its identity, two linears."""
    kd = 5 * wcfg.d_model
    return {
        "adapter.layer_weights": torch.randn(wcfg.encoder_layers, generator=gen),
        "adapter.norm.weight": 1 + 0.3 * torch.randn(wcfg.d_model, generator=gen),
        "adapter.norm.bias": 0.3 * torch.randn(wcfg.d_model, generator=gen),
        "adapter.linear_1.weight": 0.1 * torch.randn(kd, kd, generator=gen),
        "adapter.linear_1.bias": 0.1 * torch.randn(kd, generator=gen),
        "adapter.linear_2.weight": 0.1 * torch.randn(hidden_size, kd, generator=gen),
        "adapter.linear_2.bias": 0.1 * torch.randn(hidden_size, generator=gen),
    }


def tiny_model_config(hf_cfg: Gemma2Config, wcfg: WhisperConfig) -> ModelConfig:
    return ModelConfig(name="tiny_test", decoder=decoder_config(hf_cfg), encoder=encoder_config(wcfg),
                       adapter=AdapterConfig(frame_stack=5, dropout=0.0))


# The released speech LLMs in small: a Whisper-shaped encoder of 2 layers (Voxtral's config
# names it in its own words), the projector of each, and the decoder family each uses
# (Voxtral a Llama, Qwen2-Audio a Qwen2), every weight random and the norms around one.
RELEASED_AUDIO = dict(num_mel_bins=80, max_source_positions=60)


def hf_voxtral(seed: int = 0, vocab_size: int = 250, audio_token_id: int = 249, **audio_overrides):
    from transformers import VoxtralConfig, VoxtralForConditionalGeneration

    audio = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 **{**RELEASED_AUDIO, **audio_overrides})
    config = VoxtralConfig(audio_config=audio, text_config={**LLAMA, "model_type": "llama", "vocab_size": vocab_size},
                           audio_token_id=audio_token_id)
    return _with_plain_norms(VoxtralForConditionalGeneration(config), seed)


def hf_qwen2_audio(seed: int = 0, vocab_size: int = 250, audio_token_id: int = 249, **audio_overrides):
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    audio = dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                 **{**RELEASED_AUDIO, **audio_overrides})
    config = Qwen2AudioConfig(audio_config=audio, text_config={**QWEN2, "model_type": "qwen2", "vocab_size": vocab_size},
                              audio_token_index=audio_token_id)
    return _with_plain_norms(Qwen2AudioForConditionalGeneration(config), seed)
