"""Audio decoding, resampling and Whisper log-mel features against HF's extractor."""

import io

import numpy as np
import pytest
import soundfile as sf
import torch
from transformers import WhisperFeatureExtractor

from orchestrator.data import mel
from orchestrator.data.audio import AudioError, decode_bytes, load_audio, resample

from .conftest import tone


def _speechlike(n, seed):
    rng = np.random.default_rng(seed)
    envelope = np.abs(np.sin(np.arange(n) / 900.0))
    return (0.2 * rng.standard_normal(n) * envelope).astype(np.float32)


@pytest.mark.parametrize("bins,seconds", [(80, 5), (128, 30)])
def test_log_mel_matches_hf_whisper_feature_extractor(bins, seconds):
    clips = [_speechlike(n, i) for i, n in enumerate((3000, 16000, 47123, seconds * 16000, seconds * 16000 + 999))]
    hf = WhisperFeatureExtractor(feature_size=bins, chunk_length=seconds)
    ref = hf(clips, sampling_rate=16000, return_tensors="np", return_attention_mask=True)
    ours, lengths = mel.features(clips, bins, window_frames=seconds * 100)
    assert ours.shape == ref["input_features"].shape == (len(clips), bins, seconds * 100)
    assert np.abs(ours.numpy() - ref["input_features"]).max() < 1e-3
    # Valid frames = HF's attention mask (the longest clip is cut to the window).
    assert lengths.tolist() == ref["attention_mask"].sum(-1).tolist()


def test_mel_filters_match_hf():
    for bins in (80, 128):
        hf = WhisperFeatureExtractor(feature_size=bins)
        assert np.abs(mel.mel_filters(bins).numpy() - hf.mel_filters.T).max() < 1e-6


def test_padding_is_zeros_at_the_end_and_long_clips_are_cut():
    clip = tone(1.0)
    batch = mel.pad_or_trim([clip, tone(6.0)], window_frames=500)
    assert batch.shape == (2, 80000)
    assert torch.equal(batch[0, :16000], torch.from_numpy(clip)) and batch[0, 16000:].abs().sum() == 0
    assert batch[1].abs().sum() > 0


def test_decode_wav_flac_mp3_and_raw_arrays():
    clip = tone(0.5)
    for fmt, tol in (("WAV", 1e-4), ("FLAC", 1e-4), ("MP3", None)):
        buf = io.BytesIO()
        sf.write(buf, clip, 16000, format=fmt)
        out, rate = decode_bytes(buf.getvalue())
        assert rate == 16000
        if tol is not None:
            assert out.shape == clip.shape and np.abs(out - clip).max() < tol
        else:  # mp3 is lossy and delays the signal; it must still be the same tone
            assert abs(out.shape[0] - clip.shape[0]) < 2000 and np.abs(out).max() > 0.2
    pcm = (clip * 32767).astype(np.int16)
    assert np.abs(load_audio(pcm, 16000, 16000) - clip).max() < 1e-3
    stereo = np.stack([clip, clip], axis=1)
    assert np.abs(load_audio(stereo, 16000, 16000) - clip).max() < 1e-6


def test_resample_keeps_a_tone_and_removes_what_is_above_the_new_nyquist():
    x = tone(1.0, rate=22050, freq=440.0)
    y = resample(x, 22050, 16000)
    assert y.shape[0] == 16000
    ref = tone(1.0, rate=16000, freq=440.0)
    t = np.arange(16000) / 16000
    clean = 0.3 * np.sin(2 * np.pi * 440 * t)
    assert np.abs(y - clean)[100:-100].std() < 0.02  # only the small noise differs
    high = (0.5 * np.sin(2 * np.pi * 10000 * np.arange(22050) / 22050)).astype(np.float32)
    assert np.abs(resample(high, 22050, 16000))[200:-200].max() < 0.01
    assert ref.shape == y.shape


def test_wrong_sample_rate_resampled_or_refused():
    x = tone(1.0, rate=8000)
    assert load_audio(x, 8000, 16000, "resample").shape[0] == 16000
    with pytest.raises(AudioError, match="8000 Hz.*16000 Hz.*wrong_sample_rate=refuse"):
        load_audio(x, 8000, 16000, "refuse")


def test_undecodable_bytes_are_a_clear_error():
    with pytest.raises(AudioError, match="cannot decode 12 audio bytes"):
        decode_bytes(b"not audio!!!")
