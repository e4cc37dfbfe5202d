"""AudioLLM (Whisper encoder -> adapter -> fusion -> Gemma2) against a reference built
from HF modules; the fusion's error messages; the analytic parameter inventory."""

import pytest
import torch

from orchestrator.plan.model_params import audio_token_count, encoder_frame_count
from orchestrator.models.fusion import check_audio_placeholders, fuse_audio

AUDIO_CASES = ["audiollm_tp1", "audiollm_tp2_sp", "audiollm_pp2", "audiollm_packed_tp2"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", AUDIO_CASES)
def test_audiollm_matches_hf_reference(parity_results, case):
    r = parity_results[case]
    assert r["max_abs_logit_diff"] <= 1e-4, r
    assert r["loss_diff"] <= 1e-5, r


@pytest.mark.multiprocess
def test_scaling_embeddings_before_fusion_breaks_parity(parity_results):
    assert parity_results["bad_audiollm_scale_before_fusion"]["max_abs_logit_diff"] > 1e-2


@pytest.mark.multiprocess
@pytest.mark.parametrize("label", ["trainable_encoder", "frozen_encoder", "untied_output", "tiny_cpu_recipe"])
def test_parameter_inventory_equals_real_model(parity_results, label):
    inv = parity_results["inventory"][label]
    real, analytic = inv["real"], inv["analytic"]
    assert len(real) > 50
    assert [r for r in real if r not in analytic] == [] and [a for a in analytic if a not in real] == []


@pytest.mark.multiprocess
@pytest.mark.parametrize("label", ["trainable_encoder", "frozen_encoder", "untied_output", "tiny_cpu_recipe"])
def test_built_for_a_gpu_every_trained_parameter_is_bf16(parity_results, label):
    """An fp32 adapter beside the bf16 decoder trained on the first GPU run and failed its
    first checkpoint: megatron's bf16 optimizer checkpoints only bf16 parameters."""
    assert parity_results["inventory"][label]["gpu_trained_dtypes"] == ["torch.bfloat16"]


@pytest.mark.multiprocess
def test_a_trained_fp32_encoder_beside_a_bf16_decoder_is_refused(parity_results):
    message = parity_results["inventory"]["trained_fp32_encoder_on_gpu"]
    assert "model.encoder.precision=auto" in message and "torch.bfloat16" in message, message


def test_audio_token_count_follows_the_encoder_stride_and_frame_stack():
    assert encoder_frame_count(3000) == 1500 and audio_token_count(3000, 5) == 300
    assert encoder_frame_count(67) == 34 and audio_token_count(67, 5) == 6
    assert audio_token_count(0, 5) == 0


def test_fusion_places_audio_in_order_and_keeps_dtype():
    emb = torch.zeros(2, 6, 3, dtype=torch.bfloat16)
    ids = torch.tensor([[1, 9, 9, 2, 3, 4], [9, 5, 6, 7, 8, 1]])
    audio = torch.arange(9, dtype=torch.float32).reshape(3, 3)
    check_audio_placeholders(ids, 9, tokens_per_clip=[2, 1])
    out = fuse_audio(emb, ids, audio, 9)
    assert out.dtype == torch.bfloat16
    assert out[0, 1].tolist() == [0, 1, 2] and out[0, 2].tolist() == [3, 4, 5] and out[1, 0].tolist() == [6, 7, 8]
    assert out[0, 0].abs().sum() == 0


def test_fusion_of_several_clips_in_one_packed_row():
    ids = torch.tensor([[9, 1, 9, 9, 2]])
    check_audio_placeholders(ids, 9, [1, 2], clip_rows=[0, 0])
    out = fuse_audio(torch.zeros(1, 5, 1), ids, torch.tensor([[1.0], [2.0], [3.0]]), 9)
    assert out[0, :, 0].tolist() == [1.0, 0.0, 2.0, 3.0, 0.0]


def test_fusion_count_mismatch_names_the_sample():
    ids = torch.tensor([[9, 9, 1], [9, 2, 3]])
    with pytest.raises(ValueError, match=r"sample 1: 1 placeholder tokens \(id 9\) but its audio \(clip 1: 2\) gives 2"):
        check_audio_placeholders(ids, 9, tokens_per_clip=[2, 2])


@pytest.mark.multiprocess
def test_converted_checkpoint_loads_into_the_audiollm(parity_results):
    r = parity_results["load_converted_audiollm_tp2"]
    assert r["fresh"] == {"adapter": 7}, r  # layer_weights, norm (2), linear_1 (2), linear_2 (2)
    for rank in r["ranks"]:
        assert rank["compared"] > 20 and rank["decoder"] == [] and rank["encoder"] == [], r
        assert rank["qkv_rows"] == (4 + 2 * 2) * 16 // 2  # this rank's KV groups, not the full tensor
