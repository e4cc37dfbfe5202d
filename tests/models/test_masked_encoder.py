"""The encoder's masked mode (model.encoder.mask_padding=true): a clip's encoding does
not depend on the other clips of its batch nor on the window, and with nothing to mask
it is HF WhisperEncoder's own forward."""

import torch

from orchestrator.plan.model_params import encoder_frame_count
from orchestrator.models.speech import build_whisper_encoder, run_encoder
from tests.models.tiny_models import encoder_config, randomize, whisper_config
from tests.tolerances import reorder_tolerance

WINDOW = 2 * 40  # mel frames of max_source_positions=40
MEL = 16  # tiny_models.WHISPER num_mel_bins
# A clip that attends to padding or to another clip moves its states by more than this
# (0.39 in the control below); the reordering bounds stay well under it.
MASKING_EFFECT = 1e-2


def _encoder():
    cfg = whisper_config(max_source_positions=WINDOW // 2)
    return randomize(build_whisper_encoder(encoder_config(cfg)), seed=3).eval()


def _clips(lengths, seed=0, pad_value=-0.7):
    """Features padded the way the data side pads them: the clip's own floor value."""
    gen = torch.Generator().manual_seed(seed)
    feats = torch.full((len(lengths), MEL, WINDOW), pad_value)
    for i, n in enumerate(lengths):
        feats[i, :, :n] = torch.randn(MEL, n, generator=gen)
    return feats


def test_masked_encoding_of_a_clip_is_the_same_in_any_batch():
    """Alone and in a batch the clip runs matrix products of other shapes, so fp32 sums
    run in another order: the bound is the reordering bound for the encoder's longest
    reduction (its FFN) over its chained products (conv1, conv2 and per layer q/k/v,
    scores, values, out, fc1, fc2), at the scale of the states; a clip that sees another
    clip's frames (the bug this catches) moves them by far more (the control test)."""
    encoder = _encoder()
    cfg = encoder.config
    lengths = [23, 61, 40]
    batch = run_encoder(encoder, _clips(lengths), mel_lengths=lengths)
    assert batch[0].shape[1] < WINDOW // 2  # ran on the longest clip, not the window
    reduction = max(cfg.encoder_ffn_dim, cfg.d_model, 3 * cfg.num_mel_bins, WINDOW // 2)
    depth = 2 + 7 * cfg.encoder_layers
    for i, n in enumerate(lengths):
        alone = run_encoder(encoder, _clips(lengths)[i:i + 1], mel_lengths=[n])
        frames = encoder_frame_count(n)
        for state_batch, state_alone in zip(batch, alone):
            atol = reorder_tolerance(state_alone.abs().max(), reduction, depth)
            assert atol < MASKING_EFFECT
            torch.testing.assert_close(state_batch[i, :frames], state_alone[0, :frames], atol=atol, rtol=0)


def test_masked_mode_without_padding_is_hf_whisper():
    encoder = _encoder()
    feats = _clips([WINDOW, WINDOW])
    ours = run_encoder(encoder, feats, mel_lengths=[WINDOW, WINDOW])
    hf = encoder(feats, output_hidden_states=True, return_dict=True).hidden_states[1:]
    assert len(ours) == len(hf) == encoder.config.encoder_layers
    for a, b in zip(ours, hf):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_unmasked_mode_attends_to_padding_so_the_batch_matters():
    """The control: Whisper's own forward lets a clip see the padding, so a clip padded
    to the window differs from the same clip run in the masked mode."""
    encoder = _encoder()
    n = 23
    frames = encoder_frame_count(n)
    full = run_encoder(encoder, _clips([n]))
    masked = run_encoder(encoder, _clips([n]), mel_lengths=[n])
    assert (full[-1][0, :frames] - masked[-1][0, :frames]).abs().max() > MASKING_EFFECT


def test_a_bf16_encoder_with_sdpa_stays_close_to_fp32_and_feeds_the_fp32_adapter():
    """model.encoder.precision=bf16 (what auto picks for a frozen encoder on GPUs), run on
    the CPU: the same weights rounded to bf16, PyTorch's SDPA instead of HF's eager
    attention, in both encoder modes. Each bf16 rounding is off by up to 2^-9 relative;
    the tiny encoder chains 2 + 7 x layers rounded ops, independent errors add in
    quadrature: sqrt(2 + 7 x layers) x 2^-9 x 3 (three sigma) bounds the relative norm
    error of every layer's states. The adapter mixes the bf16 states in fp32."""
    from orchestrator.models.adapters import AudioAdapter

    reference = _encoder()
    cfg = reference.config
    fast = build_whisper_encoder(encoder_config(cfg), "bf16").eval()
    fast.load_state_dict({k: v.to(torch.bfloat16) for k, v in reference.state_dict().items()})
    assert fast.config._attn_implementation == "sdpa" and fast.conv1.weight.dtype == torch.bfloat16
    bound = (2 + 7 * cfg.encoder_layers) ** 0.5 * 2**-9 * 3
    lengths = [23, 61]
    for mel_lengths in (None, lengths):
        with torch.no_grad():
            want = run_encoder(reference, _clips(lengths), mel_lengths=mel_lengths)
            got = run_encoder(fast, _clips(lengths), mel_lengths=mel_lengths)
        for w, g in zip(want, got):
            assert g.dtype == torch.bfloat16
            rel = float((g.float() - w).norm() / w.norm())
            assert rel <= bound, (mel_lengths, rel, bound)
    adapter = AudioAdapter(cfg.encoder_layers, cfg.d_model, 24, frame_stack=2).float()
    tokens = adapter(got, lengths)
    assert tokens.dtype == torch.float32 and torch.isfinite(tokens).all()
