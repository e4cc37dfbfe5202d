"""The released speech LLMs audiollm starts from (and gives back): their HF model_type,
class, adapter kind (orchestrator/plan/adapter_kinds.py), where their parts' tensors sit,
and how their encoder's config names our model.encoder keys; and the speech LLMs it
cannot take, by model_type, to name them in a refusal. No torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ReleasedSpeechLLM:
    name: str  # as people say it
    hf_class: str
    adapter_kind: str
    # model.encoder key -> its key in the model's audio_config (Whisper's own names, or
    # Voxtral's: hidden_size, num_hidden_layers, ...)
    encoder_keys: dict
    audio_token_key: str  # where config.json keeps the audio placeholder's id
    # The data keys of its prompt as its processor makes it (the recipes' and the rules' own;
    # tests/data/test_released_prompts.py holds them to the processor)
    prompt: dict


WHISPER_NAMES = {"d_model": "d_model", "num_layers": "encoder_layers", "num_heads": "encoder_attention_heads",
                 "ffn_dim": "encoder_ffn_dim", "num_mel_bins": "num_mel_bins",
                 "max_source_positions": "max_source_positions"}
VOXTRAL_ENCODER_NAMES = {"d_model": "hidden_size", "num_layers": "num_hidden_layers",
                         "num_heads": "num_attention_heads", "ffn_dim": "intermediate_size",
                         "num_mel_bins": "num_mel_bins", "max_source_positions": "max_source_positions"}

# Voxtral's transcription request (mistral-common's, which its processor's
# apply_transcription_request encodes): BOS, [INST][BEGIN_AUDIO], the clip's [AUDIO] tokens,
# [/INST], the language, [TRANSCRIBE]; the transcript, then EOS.
VOXTRAL_PROMPT = dict(prompt_template="[INST][BEGIN_AUDIO]<SpeechHere>[/INST]lang:en[TRANSCRIBE]",
                      response_suffix="", audio_token="[AUDIO]", add_bos=True)
# Qwen2-Audio-Instruct's chat format as its processor's chat template renders a user turn of
# one clip and an instruction (with its default system turn); no BOS; EOS is the end of turn.
QWEN2_AUDIO_PROMPT = dict(prompt_template="<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                                          "<|im_start|>user\nAudio 1: <|audio_bos|><SpeechHere><|audio_eos|>\n"
                                          "Transcribe the speech.<|im_end|>\n<|im_start|>assistant\n",
                          response_suffix="<|im_end|>", audio_token="<|AUDIO|>", add_bos=False, add_eos=False)

RELEASED: dict[str, ReleasedSpeechLLM] = {
    "voxtral": ReleasedSpeechLLM("Voxtral", "VoxtralForConditionalGeneration", "voxtral", VOXTRAL_ENCODER_NAMES,
                                 "audio_token_id", VOXTRAL_PROMPT),
    "qwen2_audio": ReleasedSpeechLLM("Qwen2-Audio", "Qwen2AudioForConditionalGeneration", "qwen2_audio",
                                     WHISPER_NAMES, "audio_token_index", QWEN2_AUDIO_PROMPT),
}

# A converted checkpoint of a released model keeps its config.json under this name.
RELEASED_CONFIG = "released_config.json"

# Where each part's tensors sit in a released checkpoint: the names the hub's files carry
# (transformers 4), then those transformers 5 writes.
PART_PREFIXES = {
    "decoder": ("language_model.model.", "model.language_model."),
    "lm_head": ("language_model.lm_head.", "lm_head."),
    "encoder": ("audio_tower.", "model.audio_tower."),
    "adapter": ("multi_modal_projector.", "model.multi_modal_projector."),
}

# Speech LLMs in transformers (or on the hub) that audiollm does not take, by model_type.
NOT_SUPPORTED = {
    "granite_speech": "Granite Speech (a Conformer encoder and a Q-Former projector)",
    "qwen2_5_omni": "Qwen2.5-Omni (a thinker-talker model with vision and speech output)",
    "qwen2_5_omni_thinker": "Qwen2.5-Omni's thinker",
    "phi4_multimodal": "Phi-4-multimodal (a Conformer audio encoder with LoRA experts)",
    "phi4mm": "Phi-4-multimodal (remote code)",
    "kimi_audio": "Kimi-Audio (remote code: a Whisper encoder with discrete audio tokens)",
    "ultravox": "Ultravox (remote code)",
    "gemma3n": "Gemma 3n (a USM audio encoder)",
    "kyutai_speech_to_text": "Kyutai speech-to-text (audio codec tokens)",
}


def released(model_type: Optional[str]) -> Optional[ReleasedSpeechLLM]:
    return RELEASED.get(str(model_type))


def not_supported_message(model_type: str, where: str) -> Optional[str]:
    """Why a checkpoint of `model_type` (at `where`) cannot start a run here, naming what
    can; None for a model type this says nothing of."""
    what = NOT_SUPPORTED.get(str(model_type))
    if what is None:
        return None
    supported = ", ".join(f"{m.name} ({m.hf_class})" for m in RELEASED.values())
    return (f"{where} is a {what} checkpoint (model_type {model_type}), which audiollm does not convert; the "
            f"released speech LLMs it starts from: {supported}; or a decoder of a family with a Whisper encoder "
            f"(--hf DECODER --whisper WHISPER)")


def encoder_section(model: ReleasedSpeechLLM, audio_config: dict) -> dict:
    """model.encoder values of a released model's audio_config."""
    return {ours: audio_config.get(theirs) for ours, theirs in model.encoder_keys.items()}


def adapter_section(model: ReleasedSpeechLLM, audio_config: dict) -> dict:
    """model.adapter values of a released model: its kind, and Voxtral's frames per token
    (it reshapes the encoder's output to its intermediate_size: intermediate_size / d)."""
    if model.adapter_kind == "voxtral":
        encoder = encoder_section(model, audio_config)
        return {"kind": "voxtral", "frame_stack": int(encoder["ffn_dim"]) // int(encoder["d_model"])}
    return {"kind": model.adapter_kind}


def released_of_kind(adapter_kind: Optional[str]) -> Optional[ReleasedSpeechLLM]:
    """The released model whose adapter `adapter_kind` is; None for the project's own kind."""
    return next((m for m in RELEASED.values() if m.adapter_kind == adapter_kind), None)


def released_class(adapter_kind: str) -> str:
    """The transformers class whose adapter `adapter_kind` is (orchestrator/plan/adapter_kinds.py)."""
    return released_of_kind(adapter_kind).hf_class
