"""Audio decoding and resampling to the feature sample rate.

Encoded bytes (wav, flac, ogg, mp3: whatever the bundled libsndfile reads) or raw
arrays (float in [-1, 1] or integer PCM) become mono float32 at `target_rate`.
16-bit FLAC, what speech corpora mostly store, is decoded by dr_flac (the `miniaudio`
package) to int16: 1.6-1.8x libsndfile's speed, and the same samples
(benchmarks/data_pipeline.py); every other format goes through libsndfile.
Resampling is a band-limited (Kaiser-windowed sinc) polyphase filter run as one
strided conv1d, so it needs neither torchaudio nor scipy.
"""

from __future__ import annotations

import io
import math
from functools import lru_cache
from typing import Optional, Tuple

import miniaudio
import numpy as np
import soundfile as sf
import torch

from orchestrator.hf_model.resample_audiollm import polyphase_kernel


class AudioError(ValueError):
    """Audio that cannot be decoded or is not acceptable under the data config."""


def decode_bytes(data: bytes) -> Tuple[np.ndarray, int]:
    """Encoded audio bytes -> (mono float32 samples, sample rate)."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) == 0:
        raise AudioError(f"audio bytes are empty or not bytes (got {type(data).__name__} of length "
                         f"{len(data) if hasattr(data, '__len__') else '?'})")
    data = bytes(data)
    if data[:4] == b"fLaC":
        decoded = _decode_flac16(data)
        if decoded is not None:
            return decoded
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as err:  # libsndfile raises several types; all mean "not decodable"
        raise AudioError(f"cannot decode {len(data)} audio bytes (wav/flac/ogg/mp3 expected): {err}") from err
    return to_mono(samples), int(rate)


def _decode_flac16(data: bytes) -> Optional[Tuple[np.ndarray, int]]:
    """16-bit FLAC -> (mono float32, rate) through dr_flac; None for other bit depths or
    a stream dr_flac refuses (libsndfile then decodes it, or names the fault). The int16
    samples scaled by 1/32768 are bit for bit what libsndfile's float32 read returns.
    dr_flac decodes a cut-off stream as far as it goes without a word: fewer samples than
    the header announces go to libsndfile too, which names the damage."""
    try:
        info = miniaudio.flac_get_info(data)
        if info.sample_format != miniaudio.SampleFormat.SIGNED16:
            return None
        decoded = miniaudio.flac_read_s16(data)
    except miniaudio.MiniaudioError:
        return None
    if info.num_frames > 0 and decoded.num_frames != info.num_frames:
        return None
    pcm = np.frombuffer(decoded.samples, dtype=np.int16)
    samples = np.multiply(pcm, np.float32(1.0 / 32768.0), dtype=np.float32)  # one pass, exact (a power of 2)
    if decoded.nchannels > 1:
        samples = to_mono(samples.reshape(-1, decoded.nchannels))
    return samples, int(decoded.sample_rate)


def to_mono(samples: np.ndarray) -> np.ndarray:
    """[time] or [time, channels] -> [time] float32 (channels averaged)."""
    samples = np.asarray(samples)
    if samples.dtype.kind in "iu":
        # Integer PCM: scale to [-1, 1) by the dtype's range.
        info = np.iinfo(samples.dtype)
        samples = (samples.astype(np.float32) - (info.min + info.max + 1) / 2) / ((info.max - info.min + 1) / 2)
    samples = samples.astype(np.float32, copy=False)
    if samples.ndim == 2:
        samples = samples[:, 0] if samples.shape[1] == 1 else samples.mean(axis=1)
    if samples.ndim != 1:
        raise AudioError(f"audio array must be [time] or [time, channels], got shape {samples.shape}")
    return samples


def load_audio(value, sample_rate: Optional[int], target_rate: int, wrong_rate: str = "resample") -> np.ndarray:
    """A sample's audio column -> mono float32 at `target_rate`.

    value: encoded bytes, or a raw array whose rate is `sample_rate` (required then).
    wrong_rate: "resample" converts other rates; "refuse" raises AudioError for them.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        samples, rate = decode_bytes(value)
    else:
        if sample_rate is None:
            raise AudioError("a raw audio array needs its sample rate (the data config's sample_rate_field column)")
        samples, rate = to_mono(value), int(sample_rate)
    if rate != target_rate:
        if wrong_rate == "refuse":
            raise AudioError(
                f"audio is at {rate} Hz but data.sample_rate is {target_rate} Hz and data.wrong_sample_rate=refuse; "
                f"set data.wrong_sample_rate=resample or convert the dataset")
        samples = resample(samples, rate, target_rate)
    if samples.size == 0:
        raise AudioError("audio has no samples")
    if not np.isfinite(samples).all():
        raise AudioError("audio contains NaN or infinite samples")
    return samples


@lru_cache(maxsize=16)
def _polyphase_kernel(orig: int, new: int, zero_crossings: int, rolloff: float) -> Tuple[torch.Tensor, int]:
    """Kernel [new, 1, taps] of the filter designed in orchestrator.hf_model.resample_audiollm (one
    design for this conv1d and for the numpy resampler of `audiollm data import`)."""
    kernel, half_width = polyphase_kernel(orig, new, zero_crossings, rolloff)
    return torch.from_numpy(kernel.astype(np.float32)).unsqueeze(1), half_width


def resample(samples: np.ndarray, orig_rate: int, target_rate: int,
             zero_crossings: int = 16, rolloff: float = 0.96) -> np.ndarray:
    """Band-limited resampling of a mono float signal; output length ceil(n * target / orig)."""
    if orig_rate <= 0 or target_rate <= 0:
        raise AudioError(f"sample rates must be positive (got {orig_rate} -> {target_rate})")
    if orig_rate == target_rate:
        return samples
    g = math.gcd(orig_rate, target_rate)
    orig, new = orig_rate // g, target_rate // g
    kernel, half = _polyphase_kernel(orig, new, zero_crossings, rolloff)
    n = samples.shape[-1]
    out_len = math.ceil(n * new / orig)
    x = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)).view(1, 1, -1)
    blocks = math.ceil(n / orig)
    x = torch.nn.functional.pad(x, (half, half + orig + blocks * orig - n))
    with torch.no_grad():
        y = torch.nn.functional.conv1d(x, kernel, stride=orig)  # [1, new, blocks+1]
    y = y[0].transpose(0, 1).reshape(-1)[:out_len]
    return y.numpy().astype(np.float32, copy=False)


def encode_flac(samples: np.ndarray, rate: int) -> bytes:
    """Mono float samples -> 16-bit FLAC bytes (how the demo corpus stores audio)."""
    buf = io.BytesIO()
    sf.write(buf, np.clip(samples, -1.0, 1.0), rate, format="FLAC", subtype="PCM_16")
    return buf.getvalue()
