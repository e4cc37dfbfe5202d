"""A released speech LLM's HF directory (Voxtral, Qwen2-Audio: orchestrator/plan/
released_models.py) read as the three parts a converted checkpoint holds: the language
model's tensors as its family's decoder names them (model.*, lm_head.weight), the audio
tower's as encoder.* (a Whisper encoder's names), the projector's as adapter.* (the
adapter kind's: linear_1/linear_2, or linear), with the configs that describe them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.convert.hf_io import JoinedTensors, SafetensorsDir, TensorsUnder, under_first
from orchestrator.plan.decoder_families import family_for_hf
from orchestrator.plan.released_models import (PART_PREFIXES, WHISPER_NAMES, ReleasedSpeechLLM, adapter_section,
                                               encoder_section)


# The language model's tensors as its family's HF decoder names them; the encoder's and the
# adapter's without a prefix (encoder.* and adapter.* in the checkpoint).
RENAMED = {"decoder": "model.", "lm_head": "lm_head."}


@dataclass
class ReleasedParts:
    model: ReleasedSpeechLLM
    text_config: dict  # the language model's HF config, architectures its family's causal-LM class
    decoder: JoinedTensors
    encoder: TensorsUnder
    adapter: TensorsUnder
    whisper_config: dict  # the encoder's config in Whisper's names (what whisper_config.json holds)
    adapter_config: dict  # model.adapter: its kind (and Voxtral's frame_stack)


def released_parts(hf_dir: Path, config_dict: dict, model: ReleasedSpeechLLM, files: SafetensorsDir) -> ReleasedParts:
    text_config = dict(config_dict["text_config"])
    text_config["architectures"] = [family_for_hf(str(text_config.get("model_type"))).hf_architecture]
    views = {part: under_first(files, prefixes, RENAMED.get(part, "")) for part, prefixes in PART_PREFIXES.items()}
    missing = [part for part in ("decoder", "encoder", "adapter") if views[part] is None]
    if missing:
        raise ValueError(f"{hf_dir} is a {model.name} checkpoint ({model.hf_class}) but holds no tensors of its "
                         f"{', '.join(missing)} (under {' or '.join(p for m in missing for p in PART_PREFIXES[m])})")
    decoder = JoinedTensors(*(v for v in (views["decoder"], views["lm_head"]) if v is not None))
    audio = config_dict["audio_config"]
    encoder = encoder_section(model, audio)
    whisper_config = {"model_type": "whisper", **{WHISPER_NAMES[key]: value for key, value in encoder.items()}}
    return ReleasedParts(model, text_config, decoder, views["encoder"], views["adapter"], whisper_config,
                         adapter_section(model, audio))
