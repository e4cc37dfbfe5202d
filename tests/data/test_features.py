"""Audio decoding, resampling and Whisper log-mel features against HF's extractor."""

import io

import numpy as np
import pytest
import soundfile as sf
import torch
from transformers import WhisperFeatureExtractor

from orchestrator.data import mel
from orchestrator.data.audio import AudioError, _decode_flac16, decode_bytes, encode_flac, load_audio, resample

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
    # fp32 FFT against HF's: ~1e-7 relative in a bin's power, ~1e-7 after log10 / 4 for the
    # bins within the 8 decades kept; 1e-5 is the bound the features are held to.
    assert np.abs(ours.numpy() - ref["input_features"]).max() < 1e-5
    # Valid frames = HF's attention mask (the longest clip is cut to the window).
    assert lengths.tolist() == ref["attention_mask"].sum(-1).tolist()


@pytest.mark.parametrize("bins,seconds", [(80, 5), (128, 30)])
def test_short_clips_computed_over_their_own_length_match_hf(bins, seconds):
    # Blocks of short clips take the path that runs the STFT only over the clips.
    clips = [_speechlike(n, i) for i, n in enumerate((1, 159, 160, 3000, 16000, 16201, 47123))]
    clips.append(np.zeros(8000, np.float32))  # silence: every frame at the floor
    hf = WhisperFeatureExtractor(feature_size=bins, chunk_length=seconds)
    ref = hf(clips, sampling_rate=16000, return_tensors="np")["input_features"]
    for block in (1, 3, 4):
        ours, _ = mel.features(clips, bins, window_frames=seconds * 100, block=block)
        assert np.abs(ours.numpy() - ref).max() < 1e-5


@pytest.mark.parametrize("bins,seconds", [(80, 5), (128, 30)])
def test_features_made_from_the_waveforms_on_the_device_match_hf_and_the_host_ones(bins, seconds):
    """data.features_on=device: a micro-batch carries the clips' waveforms, zero-padded to
    the longest, and the step computes the log-mel where the encoder is (here the CPU):
    the same features as the loader's own, for all clips or a subset (a CP rank's)."""
    clips = [_speechlike(n, i) for i, n in enumerate((3000, 16000, 47123, seconds * 16000, seconds * 16000 + 999))]
    window = seconds * 100
    host, lengths = mel.features(clips, bins, window)
    batch = {"audio_waveforms": mel.waveforms(clips, window), "audio_mel_bins": bins, "audio_window_frames": window}
    assert batch["audio_waveforms"].shape == (len(clips), seconds * 16000)  # the longest, cut to the window
    assert torch.equal(mel.frame_counts(clips, window), lengths)
    made = mel.batch_features(batch, "cpu")
    ref = WhisperFeatureExtractor(feature_size=bins, chunk_length=seconds)(
        clips, sampling_rate=16000, return_tensors="np")["input_features"]
    assert made.shape == host.shape and np.abs(made.numpy() - ref).max() < 1e-5
    # Per column the same arithmetic as the host's: equal up to the order of a few fp32 sums.
    assert (made - host).abs().max() <= 1e-6
    short = {**batch, "audio_waveforms": mel.waveforms(clips[:2], window)}  # only short clips: STFT over them
    assert (mel.batch_features(short, "cpu") - host[:2]).abs().max() <= 1e-6
    subset = torch.tensor([2, 0])
    assert (mel.batch_features(batch, "cpu", subset) - host[subset]).abs().max() <= 1e-6
    # A loader batch with features is moved as it is.
    assert torch.equal(mel.batch_features({"audio_features": host}, "cpu", subset), host[subset])


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


def test_16_bit_flac_is_decoded_by_dr_flac_to_libsndfile_s_samples():
    """16-bit FLAC goes through dr_flac (faster); its samples equal libsndfile's float32
    read bit for bit, mono and stereo. Other depths go through libsndfile."""
    rng = np.random.default_rng(3)
    for channels in (1, 2):
        clip = rng.uniform(-0.9, 0.9, (24000, channels)).astype(np.float32)
        buf = io.BytesIO()
        sf.write(buf, clip, 16000, format="FLAC", subtype="PCM_16")
        data = buf.getvalue()
        direct = _decode_flac16(data)
        assert direct is not None
        reference, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        expected = reference[:, 0] if channels == 1 else reference.mean(axis=1)
        out, got_rate = decode_bytes(data)
        assert got_rate == rate == 16000 and out.dtype == np.float32
        assert np.array_equal(out, expected) and np.array_equal(direct[0], expected)
    buf = io.BytesIO()
    sf.write(buf, clip, 16000, format="FLAC", subtype="PCM_24")
    assert _decode_flac16(buf.getvalue()) is None
    assert np.abs(decode_bytes(buf.getvalue())[0] - clip.mean(axis=1)).max() < 1e-6


def test_damaged_flac_is_a_clear_error_not_a_shorter_clip():
    """dr_flac alone decodes a cut-off or corrupted stream as far as it can; the header's
    sample count catches it and libsndfile names the fault."""
    data = encode_flac(np.random.default_rng(4).uniform(-0.5, 0.5, 48000).astype(np.float32), 16000)
    assert decode_bytes(data)[0].shape == (48000,)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    for damaged in (data[:len(data) // 2], bytes(flipped)):
        with pytest.raises(AudioError, match=f"cannot decode {len(damaged)} audio bytes"):
            decode_bytes(damaged)
