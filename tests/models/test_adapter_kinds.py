"""The adapter kinds (orchestrator/plan/adapter_kinds.py) against the released classes they
come from: a clip's audio token count is what each HF model makes of it, and the
encoder's last states through our adapter of that kind are HF's audio features (fp32,
a tiny random model of the released class, its weights copied); the plan's parameter
inventory is what the built adapter holds, for every kind."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from orchestrator.data.frames import read_frames
from orchestrator.models.adapters import build_adapter
from orchestrator.models.speech import build_whisper_encoder, run_encoder
from orchestrator.plan.adapter_kinds import ADAPTER_KINDS, frames_per_token
from orchestrator.plan.model_params import adapter_params, audio_token_count
from orchestrator.plan.schema import AdapterConfig, EncoderConfig, LoraConfig

D_MODEL, HEADS, LAYERS, MEL_BINS, WINDOW_POSITIONS, HIDDEN = 32, 4, 2, 80, 60, 48
# fp32 sums of a few dozen products in another order: a few ulps of values of order 1.
ATOL = 1e-5


def _encoder_section(ffn_dim: int) -> EncoderConfig:
    return EncoderConfig(d_model=D_MODEL, num_layers=LAYERS, num_heads=HEADS, ffn_dim=ffn_dim, num_mel_bins=MEL_BINS,
                         max_source_positions=WINDOW_POSITIONS, freeze=True)


def _audio_config(ffn_dim: int) -> dict:
    return dict(d_model=D_MODEL, encoder_layers=LAYERS, encoder_attention_heads=HEADS, encoder_ffn_dim=ffn_dim,
                num_mel_bins=MEL_BINS, max_source_positions=WINDOW_POSITIONS)


def _text_config(model_type: str) -> dict:
    return dict(model_type=model_type, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=64, vocab_size=128)


def _qwen2_audio():
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    torch.manual_seed(0)
    config = Qwen2AudioConfig(audio_config=_audio_config(64), text_config=_text_config("qwen2"))
    return Qwen2AudioForConditionalGeneration(config).eval()


def _voxtral():
    from transformers import VoxtralConfig, VoxtralForConditionalGeneration

    torch.manual_seed(0)
    audio = dict(hidden_size=D_MODEL, num_hidden_layers=LAYERS, num_attention_heads=HEADS,  # Voxtral's own names
                 intermediate_size=4 * D_MODEL, num_mel_bins=MEL_BINS, max_source_positions=WINDOW_POSITIONS)
    config = VoxtralConfig(audio_config=audio, text_config=_text_config("llama"))
    return VoxtralForConditionalGeneration(config).eval()


def _ours(hf, kind: str, ffn_dim: int):
    """Our encoder and adapter of `kind` holding the HF model's audio tower and projector."""
    section = OmegaConf.structured({"encoder": _encoder_section(ffn_dim), "adapter": AdapterConfig(kind=kind)})
    encoder = build_whisper_encoder(section.encoder)
    encoder.load_state_dict(hf.audio_tower.state_dict())  # strict: the same names and shapes
    adapter = build_adapter(section, HIDDEN).eval()
    adapter.load_state_dict(hf.multi_modal_projector.state_dict())
    return encoder, adapter


def _randomized_norms(hf) -> None:
    """Norm weights and biases away from HF's 1 and 0, so that a norm applied twice, or
    skipped, shows."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in hf.audio_tower.named_parameters():
            if "layer_norm" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3 + (1.0 if name.endswith("weight") else 0))


def test_qwen2_audio_counts_a_clips_tokens_as_its_encoder_does():
    hf = _qwen2_audio()
    adapter = AdapterConfig(kind="qwen2_audio")
    window = 2 * WINDOW_POSITIONS
    for mel in range(1, window + 1):
        _, theirs = hf.audio_tower._get_feat_extract_output_lengths(torch.tensor(mel))
        assert audio_token_count(read_frames(mel, window, "clip"), frames_per_token(adapter)) == int(theirs), mel


def test_qwen2_audio_features_equal_hfs():
    """Pool of 2 -> the encoder's final LayerNorm -> Linear with bias, as HF's audio tower
    and projector compute them; each clip keeps its own count of tokens."""
    hf = _qwen2_audio()
    _randomized_norms(hf)
    encoder, adapter = _ours(hf, "qwen2_audio", 64)
    features = torch.randn(3, MEL_BINS, 2 * WINDOW_POSITIONS, generator=torch.Generator().manual_seed(2))
    lengths = [2 * WINDOW_POSITIONS, 77, 118]
    with torch.no_grad():
        theirs = hf.multi_modal_projector(hf.audio_tower(features).last_hidden_state)
        ours = adapter(run_encoder(encoder, features, every_layer=False, pool=adapter.pool), lengths)
    counts = [int(hf.audio_tower._get_feat_extract_output_lengths(torch.tensor(n))[1]) for n in lengths]
    expected = torch.cat([theirs[i, :n] for i, n in enumerate(counts)])
    assert ours.shape == expected.shape
    torch.testing.assert_close(ours, expected, rtol=0, atol=ATOL)


def test_voxtral_features_equal_hfs_for_whole_windows():
    """Voxtral's processor pads every clip to whole windows: `frame_stack` frames of the
    encoder's normed output per token -> Linear -> GELU -> Linear, no biases."""
    hf = _voxtral()
    _randomized_norms(hf)
    encoder, adapter = _ours(hf, "voxtral", 4 * D_MODEL)
    features = torch.randn(2, MEL_BINS, 2 * WINDOW_POSITIONS, generator=torch.Generator().manual_seed(3))
    window = 2 * WINDOW_POSITIONS
    lengths = [read_frames(n, window, "window") for n in (window, 31)]  # a short clip reads the whole window too
    with torch.no_grad():
        theirs = hf.get_audio_features(features)
        ours = adapter(run_encoder(encoder, features, every_layer=False), lengths)
    assert ours.shape == theirs.shape == (2 * WINDOW_POSITIONS // 4, HIDDEN)
    assert sum(audio_token_count(n, frames_per_token(AdapterConfig(kind="voxtral"))) for n in lengths) == len(theirs)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)


@pytest.mark.parametrize("kind", sorted(ADAPTER_KINDS))
@pytest.mark.parametrize("ctc, lora", [(False, False), (True, False), (False, True)])
def test_the_plans_inventory_is_the_built_adapter(kind, ctc, lora):
    """Names and shapes, with the CTC head, and with LoRA on the adapter's linears (lora.adapter)."""
    from orchestrator.train.lora import apply_lora

    model = OmegaConf.structured({"encoder": _encoder_section(4 * D_MODEL),
                                  "adapter": AdapterConfig(kind=kind, ctc_weight=0.3 if ctc else 0.0),
                                  "decoder": {"hidden_size": HIDDEN, "vocab_size": 100}})
    lora_cfg = LoraConfig(rank=4 if lora else 0, adapter=lora, targets=[])
    built = torch.nn.ModuleDict({"adapter": build_adapter(model, HIDDEN, ctc_vocab_size=100 if ctc else 0)})
    adapted = apply_lora(built, {"rank": lora_cfg.rank, "alpha": 8, "adapter": lora, "targets": []}, seed=0)
    assert bool(adapted) == lora
    planned = {spec.name: tuple(spec.shape) for spec in adapter_params(model, lora_cfg)}
    assert planned == {name: tuple(p.shape) for name, p in built.named_parameters()}


KIND_OVERRIDES = {"layer_mix": [], "qwen2_audio": ["model.adapter.frame_stack=null", "model.adapter.dropout=null"],
                  "voxtral": ["model.adapter.frame_stack=null", "model.adapter.dropout=null",
                              "model.encoder.max_source_positions=252", "data.audio_tokens=window"]}


@pytest.mark.parametrize("kind", sorted(ADAPTER_KINDS))
def test_the_plan_counts_a_clips_tokens_as_the_data_path_does(kind):
    """A planned step's audio tokens (sequence room, FLOPs, memory, the probe's batch) are
    the data path's placeholders for a clip of data.max_audio_seconds."""
    from orchestrator.data.frames import audio_placeholder_count
    from orchestrator.plan.compose import compose
    from orchestrator.plan.estimate import clips_in_a_row, planned_step_items
    from orchestrator.plan.resolve import resolve, to_object

    cfg = to_object(compose(["+recipe=tiny_cpu", f"model.adapter.kind={kind}", *KIND_OVERRIDES[kind],
                             "data.max_audio_seconds=2"]))
    resolve(cfg, purpose="plan")  # plans without an error
    per_clip = audio_placeholder_count(2 * 16000, cfg.model.encoder.max_source_positions,
                                       frames_per_token(cfg.model.adapter), cfg.data.audio_tokens)
    expected = {"layer_mix": 200 // 2 // 5, "qwen2_audio": 200 // 2 // 2, "voxtral": 252 // 4}[kind]
    assert per_clip == expected
    clips = clips_in_a_row(cfg) * cfg.optim.global_batch_size
    assert planned_step_items(cfg)["audio_token"] == clips * per_clip
