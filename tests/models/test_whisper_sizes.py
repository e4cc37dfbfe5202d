"""Whisper encoders of every released size (conf/model/encoder/: tiny to large-v3, chosen
with model/encoder=NAME): each plans with a recipe of the full-size decoders, and the
plan's parameter inventory of the encoder is HF WhisperEncoder's of that shape, built on
the meta device (no weights drawn)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from orchestrator.plan.compose import compose
from orchestrator.plan.model_params import encoder_params
from orchestrator.plan.resolve import resolve, to_object

SIZES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "model" / "encoder").glob("*.yaml"))


def test_every_released_size_has_a_choice():
    assert SIZES == ["whisper_base", "whisper_large_v2", "whisper_large_v3", "whisper_medium", "whisper_small",
                     "whisper_tiny"]


@pytest.mark.parametrize("size", SIZES)
def test_a_released_whisper_encoder_plans_and_its_inventory_is_hfs(size):
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = to_object(compose(["+recipe=qwen2_5_whisper_tp1", f"model/encoder={size}"]))
    plan = resolve(cfg, purpose="plan")
    assert plan.config["model"]["encoder"]["d_model"] == cfg.model.encoder.d_model
    enc = cfg.model.encoder
    hf = WhisperConfig(d_model=enc.d_model, encoder_layers=enc.num_layers, encoder_attention_heads=enc.num_heads,
                       encoder_ffn_dim=enc.ffn_dim, num_mel_bins=enc.num_mel_bins,
                       max_source_positions=enc.max_source_positions)
    with torch.device("meta"):
        module = WhisperEncoder(hf)
    planned = {spec.name: tuple(spec.shape) for spec in encoder_params(cfg.model, cfg.lora)}
    assert planned == {f"encoder.{name}": tuple(p.shape) for name, p in module.named_parameters()}
