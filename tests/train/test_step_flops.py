"""Throughput accounting: a step's FLOPs and tokens counted from its micro-batches
(orchestrator.plan.step_flops), the peak read from the device name, and the rates
(orchestrator.train.metrics). Expected numbers are written out from the formulas
here, not taken from the code under test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.data.packing import Example, collate
from orchestrator.data.prompts import Tokenized
from orchestrator.plan.model_params import parameter_inventory
from orchestrator.plan.schema import AdapterConfig, DecoderConfig, EncoderConfig, LoraConfig, ModelConfig
from orchestrator.plan.schema.parallel import RecomputeConfig
from orchestrator.train.metrics import device_peak_flops, peak_flops, throughput
from orchestrator.plan.step_flops import StepFlops, causal_pairs, parameter_pattern, recomputed_layers

AUDIO_ID = 7
VOCAB = 16  # decoder vocabulary; the output layer is PADDED wide
PADDED = 128


def _model(mask_padding=True, ctc_weight=0.0, window=4, encoder_freeze=True, adapter_freeze=False,
           decoder_freeze=False) -> ModelConfig:
    return ModelConfig(
        name="tiny",
        decoder=DecoderConfig(hidden_size=8, num_layers=2, num_attention_heads=2, num_query_groups=1, kv_channels=4,
                              ffn_hidden_size=12, vocab_size=VOCAB, sliding_window=window, freeze=decoder_freeze),
        encoder=EncoderConfig(d_model=8, num_layers=2, num_heads=2, ffn_dim=16, num_mel_bins=4,
                              max_source_positions=60, mask_padding=mask_padding, freeze=encoder_freeze),
        adapter=AdapterConfig(frame_stack=2, ctc_weight=ctc_weight, freeze=adapter_freeze),
    )


def _trained(model: ModelConfig, lora: LoraConfig = LoraConfig()) -> list:
    """Names of the parameters that train under the model and LoRA config (what the job
    reads off requires_grad)."""
    return [p.name for p in parameter_inventory(model, lora) if p.trainable]


def _counter(model, lora=LoraConfig(), recompute=None, pp=1, vpp=None, trained=None) -> StepFlops:
    return StepFlops(model, lora.rank, recompute or RecomputeConfig(), PADDED,
                     _trained(model, lora) if trained is None else trained, pp=pp, vpp=vpp)


def _example(pos: int, length: int, clips=()) -> Example:
    tokens = np.arange(1, length + 1, dtype=np.int64) % VOCAB
    return Example(pos, 0, Tokenized(tokens, tokens, np.ones(length, np.float32), list(clips)), [])


def _batch(rows, seq=32, clip_frames=(), packed=True):
    """A micro-batch from the real collate; clip_frames: mel frames of each clip, in order."""
    frames = list(clip_frames)

    def features(examples):
        return {"audio_features": torch.zeros(len(frames), 4, 120), "audio_lengths": torch.tensor(frames, dtype=torch.long)}

    return collate(rows, seq, pad_id=0, dataset_names=["a"], audio_token_id=AUDIO_ID,
                   num_rows=2, features_fn=features, packed=packed)


# ---- tokens: real ones, not padding slots ----------------------------------------------

def test_packed_batch_counts_real_tokens_and_each_documents_causal_pairs():
    batch = _batch([[_example(0, 10), _example(1, 6)], [_example(2, 7)]])
    counter = _counter(_model())
    counted = counter.count(batch)
    assert counted["tokens"] == 10 + 6 + 7 == batch["num_tokens"]
    assert counted["slots"] == 2 * 32
    items = counter.batch_items(batch)
    # documents 10, 6, 7 each causal on their own: n(n+1)/2 pairs; window 4: 10 + 4 per token past the 4th
    assert items["pair_full"] == 55 + 21 + 28
    assert items["pair_window"] == (10 + 6 * 4) + (10 + 2 * 4) + (10 + 3 * 4)


def test_unpacked_batch_counts_one_document_per_row():
    batch = _batch([[_example(0, 10)], [_example(1, 7)]], packed=False)
    counter = _counter(_model())
    counted = counter.count(batch)
    assert (counted["tokens"], counted["slots"]) == (17, 64)
    assert counter.batch_items(batch)["pair_full"] == 55 + 28


# ---- decoder: the closed form of a small case ------------------------------------------

# Tiny decoder: h=8, 2 heads x 4 = 8 query width, 1 group x 4 = 4 kv width, ffn 12, 2 layers.
QKV, PROJ, FC1, FC2 = 2 * 8 * (8 + 2 * 4), 2 * 8 * 8, 2 * 8 * (2 * 12), 2 * 12 * 8  # per token
LAYER = QKV + PROJ + FC1 + FC2  # 960
LOGITS = 2 * 8 * PADDED
PAIR = 2 * 8 + 2 * 8  # QK^T and attention x V per (query, key) pair, 8 = heads x head_dim
# the batch of the packed test: documents 10, 6 | 7; layer 0 windowed (W=4), layer 1 full
TOKENS, PAIRS_FULL, PAIRS_WINDOW = 23, 104, 34 + 18 + 22
FORWARD = TOKENS * (2 * LAYER + LOGITS) + PAIR * (PAIRS_WINDOW + PAIRS_FULL)


def test_decoder_flops_of_a_batch_equal_the_closed_form():
    assert (LAYER, FORWARD) == (960, 23 * 3968 + 32 * 178)
    batch = _batch([[_example(0, 10), _example(1, 6)], [_example(2, 7)]])
    # Only the decoder and its embeddings train (the adapter is frozen too): forward +
    # weight gradients + input gradients = 3 x forward (the 6N rule).
    model = _model(adapter_freeze=True)
    assert _counter(model).count(batch)["model"] == pytest.approx(3 * FORWARD, rel=1e-12)
    # Nothing trains: the forward only.
    frozen = _counter(model, trained=[]).count(batch)
    assert frozen["model"] == frozen["hardware"] == pytest.approx(FORWARD, rel=1e-12)


def test_lora_decoder_skips_the_frozen_weights_gradients():
    """LoRA (rank 2) on the four linears, base and embeddings frozen, audio side frozen:
    gradients flow through everything after the first adapted linear, but no frozen
    weight's gradient is computed, so the decoder costs ~2x forward plus the adapters."""
    r = 2
    model = _model(adapter_freeze=True, decoder_freeze=True)
    lora = LoraConfig(rank=r)
    batch = _batch([[_example(0, 10), _example(1, 6)], [_example(2, 7)]])
    base_backward = TOKENS * (2 * LAYER - QKV + LOGITS) + 2 * PAIR * (PAIRS_WINDOW + PAIRS_FULL)

    def adapter(n_in, n_out, flows=True):  # forward + backward of one LoRA pair per token
        forward = 2 * r * (n_in + n_out)
        backward = 2 * r * n_out * 2 + 2 * r * n_in * (2 if flows else 1)
        return forward + backward

    per_token = (adapter(8, 16, flows=False) + adapter(8, 8) + adapter(8, 24) + adapter(12, 8)
                 + adapter(8, 16) + adapter(8, 8) + adapter(8, 24) + adapter(12, 8))
    expected = FORWARD + base_backward + TOKENS * per_token
    assert _counter(model, lora).count(batch)["model"] == pytest.approx(expected, rel=1e-12)
    assert (FORWARD + base_backward) / FORWARD == pytest.approx(2.0, abs=0.01)  # base weights: 2x, not 3x


# ---- recompute: hardware FLOPs -----------------------------------------------------------

def test_recompute_adds_the_recomputed_forward_to_hardware_flops_only():
    batch = _batch([[_example(0, 10), _example(1, 6)], [_example(2, 7)]])
    model = _model(adapter_freeze=True)
    layers_forward = TOKENS * 2 * LAYER + PAIR * (PAIRS_WINDOW + PAIRS_FULL)  # no logits
    full = _counter(model, recompute=RecomputeConfig("full", "uniform", 1)).count(batch)
    assert full["model"] == pytest.approx(3 * FORWARD, rel=1e-12)
    assert full["hardware"] - full["model"] == pytest.approx(layers_forward, rel=1e-12)
    selective = _counter(model, recompute=RecomputeConfig("selective")).count(batch)
    assert selective["hardware"] - selective["model"] == pytest.approx(PAIR * (PAIRS_WINDOW + PAIRS_FULL), rel=1e-12)
    # block, 1 layer: the first layer of the stage (layer 0, windowed) only; with pp=2 the first of each
    block = _counter(model, recompute=RecomputeConfig("full", "block", 1)).count(batch)
    assert block["hardware"] - block["model"] == pytest.approx(TOKENS * LAYER + PAIR * PAIRS_WINDOW, rel=1e-12)
    block = _counter(model, recompute=RecomputeConfig("full", "block", 1), pp=2).count(batch)
    assert block["hardware"] - block["model"] == pytest.approx(layers_forward, rel=1e-12)
    # nothing trains: no backward, nothing recomputed
    idle = _counter(model, recompute=RecomputeConfig("full", "uniform", 1), trained=[]).count(batch)
    assert idle["hardware"] == idle["model"]


def test_block_recompute_takes_the_first_layers_of_every_pipeline_chunk():
    assert recomputed_layers(8, "full", "block", 1, pp=2) == {0, 4}
    assert recomputed_layers(8, "full", "block", 1, pp=2, vpp=2) == {0, 2, 4, 6}
    assert recomputed_layers(8, "full", "block", 3, pp=4) == set(range(8))
    assert recomputed_layers(8, "full", "uniform", 2, pp=2) == set(range(8))
    assert recomputed_layers(8, "selective", None, None) == set()


# ---- encoder: real frames or the whole window, clips present -------------------------------

D, F, MELS, ENC_LAYERS = 8, 16, 4, 2


def _encoder_forward(mel: int, positions: int) -> float:
    conv1 = 2 * 3 * MELS * D * mel
    conv2 = 2 * 3 * D * D * positions
    layer = (4 * 2 * D * D + 2 * 2 * D * F) * positions + 4 * D * positions**2  # q k v out, fc1 fc2, attention
    return conv1 + conv2 + ENC_LAYERS * layer


def test_encoder_counts_each_clips_own_frames_when_masked_and_the_window_otherwise():
    rows = [[_example(0, 12, clips=[3]), _example(1, 6)], [_example(2, 9, clips=[2])]]
    masked, windowed = _counter(_model(mask_padding=True)), _counter(_model(mask_padding=False))
    batch = _batch(rows, clip_frames=[100, 37])  # mel frames -> 50 and 19 encoder positions
    items = masked.batch_items(batch)
    assert (items["mel_frame"], items["enc_position"], items["enc_pair"]) == (137, 69, 50**2 + 19**2)
    assert items["audio_token"] == 5
    items = windowed.batch_items(batch)  # 2 clips x the 30-s-style window of 60 positions (120 mel frames)
    assert (items["mel_frame"], items["enc_position"], items["enc_pair"]) == (240, 120, 2 * 60**2)
    # no clip in the batch: no encoder work, whatever the mode
    text_only = _batch([[_example(0, 12)], [_example(1, 9)]])
    for counter in (masked, windowed):
        assert counter.batch_items(text_only)["enc_position"] == 0
    # frozen encoder: its forward only (the adapter, trained, needs no gradient from it)
    encoder_items = {"mel_frame": 137, "enc_position": 69, "enc_pair": 50**2 + 19**2}
    expected = _encoder_forward(100, 50) + _encoder_forward(37, 19)
    assert masked.flops(encoder_items)["model"] == pytest.approx(expected, rel=1e-12)
    # trained encoder: 3x forward, less conv1's input gradient (nothing before it)
    trained = _counter(_model(mask_padding=True, encoder_freeze=False))
    conv1 = 2 * 3 * MELS * D * 137
    assert trained.flops(encoder_items)["model"] == pytest.approx(3 * expected - conv1, rel=1e-12)


# ---- adapter and CTC head -----------------------------------------------------------------

def test_adapter_and_ctc_head_count_per_audio_token():
    k, d, h = 2, D, 8
    adapter_forward = 2 * (k * d) * (k * d) + 2 * (k * d) * h
    ctc_forward = 2 * h * (VOCAB + 1)
    audio = {"audio_token": 5}
    # adapter trains, encoder frozen: 3x forward (the layer-mix and norm weights before
    # linear_1 train too, so its input gradient is needed)
    plain = _counter(_model(ctc_weight=0.0)).flops(audio)["model"]
    assert plain == pytest.approx(5 * 3 * adapter_forward, rel=1e-12)
    # only linear_2 trains (lr_scale 0 on the rest): linear_1 forward, linear_2 forward + weight gradient
    only_2 = _counter(_model(), trained=["adapter.linear_2.weight"]).flops(audio)["model"]
    assert only_2 == pytest.approx(5 * (2 * (k * d) * (k * d) + 2 * 2 * (k * d) * h), rel=1e-12)
    # CTC head (trains with the adapter): forward, weight gradient, input gradient into the adapter
    with_ctc = _counter(_model(ctc_weight=0.3)).flops(audio)["model"]
    assert with_ctc - plain == pytest.approx(5 * 3 * ctc_forward, rel=1e-12)
    # a batch's audio tokens are the adapter tokens of its clips
    batch = _batch([[_example(0, 12, clips=[3])], [_example(1, 9, clips=[2])]], clip_frames=[30, 20])
    assert _counter(_model(ctc_weight=0.3)).batch_items(batch)["audio_token"] == 5


def test_plan_estimate_includes_the_adapter_and_ctc_head():
    from orchestrator.plan.compose import compose
    from orchestrator.plan.estimate import flops_per_step, inventory_for, planned_step_items
    from orchestrator.plan.resolve import to_object

    with_ctc = to_object(compose(["+recipe=tiny_cpu"]))
    without = to_object(compose(["+recipe=tiny_cpu", "model.adapter.ctc_weight=0"]))
    assert with_ctc.model.adapter.ctc_weight > 0 and not with_ctc.model.adapter.freeze
    audio_tokens = planned_step_items(with_ctc)["audio_token"]
    h, vocab = with_ctc.model.decoder.hidden_size, with_ctc.model.decoder.vocab_size
    difference = (flops_per_step(with_ctc, inventory_for(with_ctc)).model_flops_per_step
                  - flops_per_step(without, inventory_for(without)).model_flops_per_step)
    assert audio_tokens > 0
    assert difference == pytest.approx(audio_tokens * 3 * 2 * h * (vocab + 1), rel=1e-9)


# ---- helpers ----------------------------------------------------------------------------------

def test_causal_pairs_and_parameter_patterns():
    assert causal_pairs(5) == 15 and causal_pairs(5, window=2) == 1 + 2 * 4 and causal_pairs(3, window=8) == 6
    assert parameter_pattern("module.language_model.decoder.layers.12.mlp.linear_fc1.lora_a.weight") == \
        "language_model.decoder.layers.*.mlp.linear_fc1.lora_a.weight"
    assert parameter_pattern("adapter.linear_1.weight") == "adapter.linear_1.weight"


# ---- the peak, from the device name --------------------------------------------------------

@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.4e12),  # SXM
    ("NVIDIA H100 PCIe", 756.5e12),
    ("NVIDIA H100 NVL", 835.5e12),
    ("NVIDIA H200", 989.4e12),
    ("NVIDIA GH200 480GB", 989.4e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100-SXM4-40GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA B200", 2250e12),
    ("NVIDIA L40S", 362e12),
    ("NVIDIA L40", 181e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA A10G", 125e12),
    ("NVIDIA GeForce RTX 4090", None),
    ("Tesla T4", None),
])
def test_device_name_to_peak(name, peak):
    assert device_peak_flops(name) == peak


def test_peak_prefers_the_device_then_the_plans_gpu_type_and_none_on_cpu():
    assert peak_flops("NVIDIA H100 PCIe", "h100")[0] == 756.5e12  # the device wins over the plan
    assert peak_flops("Tesla T4", "a100")[0] == 312e12  # unknown name: the plan's gpu_type
    assert peak_flops("Tesla T4", None)[0] is None
    assert peak_flops(None, "h100")[0] is None  # CPU: no MFU


def test_throughput_rates_per_gpu():
    step = {"tokens": 1000.0, "slots": 1600.0, "model": 4e15, "hardware": 5e15}
    out = throughput(2.0, step, world_size=4, peak=1e15)
    assert out["tokens_per_s_per_gpu"] == pytest.approx(125.0)
    assert out["tokens/utilization"] == pytest.approx(0.625)
    assert out["model_tflops_per_gpu"] == pytest.approx(500.0)
    assert out["hardware_tflops_per_gpu"] == pytest.approx(625.0)
    assert (out["mfu"], out["hfu"]) == (pytest.approx(0.5), pytest.approx(0.625))
    assert "mfu" not in throughput(2.0, step, world_size=4, peak=None)
