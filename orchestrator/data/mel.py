"""Whisper log-mel features, batched with one torch STFT.

Same recipe as Whisper (and HF `WhisperFeatureExtractor`): 16 kHz audio padded with
zeros (or cut) to the encoder window, 400-point Hann STFT with hop 160 and reflect
padding, power spectrum without the last frame, Slaney-normalised mel filters
0-8000 Hz, log10 floored at 1e-10, then floored at (clip max - 8) and scaled
(x + 4) / 4. The max is taken per clip over the whole padded window, so the zero
padding is part of the feature, exactly as in Whisper.

Window: `window_frames` mel frames (100 per second). Whisper-large-v3 uses 3000
(30 s); a small encoder uses 2 * max_source_positions (500 frames = 5 s for the tiny
model). A clip shorter than the window is zero-padded at the end; its valid frame
count is ceil(samples / 160) (HF's attention mask); longer clips must be refused or
chunked before they get here (data.long_audio; loader.SampleProcessor.clips).

Under data.features_on=device the loader sends the clips' waveforms (`waveforms`) and
the training step computes these features on the encoder's device (`batch_features`).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from orchestrator.data.frames import HOP_LENGTH, valid_frames, window_frames_for  # noqa: F401
from orchestrator.plan.model_params import SAMPLE_RATE

N_FFT = 400


def _hz_to_slaney_mel(hz: np.ndarray) -> np.ndarray:
    # Slaney's scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above.
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz * 3.0 / 200.0
    log_step = math.log(6.4) / 27.0
    return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / log_step, linear)


def _slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    log_step = math.log(6.4) / 27.0
    return np.where(mel >= 15.0, 1000.0 * np.exp(log_step * (mel - 15.0)), mel * 200.0 / 3.0)


@lru_cache(maxsize=8)
def mel_filters(num_mel_bins: int, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT,
                f_max: float = 8000.0) -> torch.Tensor:
    """[num_mel_bins, n_fft//2 + 1] triangular filters, area-normalised (Slaney)."""
    fft_hz = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    edges_mel = np.linspace(_hz_to_slaney_mel(0.0), _hz_to_slaney_mel(f_max), num_mel_bins + 2)
    edges_hz = _slaney_mel_to_hz(edges_mel)
    lower, centre, upper = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (fft_hz[None, :] - lower) / (centre - lower)
    falling = (upper - fft_hz[None, :]) / (upper - centre)
    filters = np.maximum(0.0, np.minimum(rising, falling))
    filters *= (2.0 / (upper - lower))  # equal area per filter
    return torch.from_numpy(filters.astype(np.float32))


def pad_or_trim(clips: Sequence[np.ndarray], window_frames: int, samples: Optional[int] = None) -> torch.Tensor:
    """Clips -> [batch, window_frames * 160] float32 (or [batch, samples]), zero-padded at the end (or cut)."""
    n = window_frames * HOP_LENGTH if samples is None else samples
    out = torch.zeros(len(clips), n, dtype=torch.float32)
    for i, clip in enumerate(clips):
        clip = clip[:n]
        out[i, : clip.shape[0]] = torch.from_numpy(np.ascontiguousarray(clip, dtype=np.float32))
    return out


def mel_power(waveforms: torch.Tensor, num_mel_bins: int) -> torch.Tensor:
    """[batch, samples] -> mel power [batch, num_mel_bins, samples // 160] (last STFT frame dropped)."""
    window = torch.hann_window(N_FFT, dtype=waveforms.dtype, device=waveforms.device)
    with torch.no_grad():
        spec = torch.view_as_real(torch.stft(waveforms, N_FFT, HOP_LENGTH, window=window, center=True,
                                             pad_mode="reflect", return_complex=True))
        power = power_spectrum(spec)  # [B, freq, frames]
        filters = mel_filters(num_mel_bins).to(waveforms.device, waveforms.dtype)
        if waveforms.device.type != "cpu":
            # The job lets fp32 matmuls on GPUs run in TF32 (a 10-bit mantissa: ~1e-4 after
            # the log); float64 keeps this one exact to fp32, at no cost at its size.
            return torch.matmul(filters.double(), power.double()).to(waveforms.dtype)
        return torch.matmul(filters, power)


def power_spectrum(spec: torch.Tensor) -> torch.Tensor:
    """STFT [..., freq, frames + 1, 2] (the real view) -> power [..., freq, frames], the last
    frame dropped. re^2 + im^2 on the real view: ~2.5x faster than complex abs().square() on CPU."""
    return (spec[..., 0].square() + spec[..., 1].square())[..., :-1]


def log_scale(mel: torch.Tensor) -> torch.Tensor:
    """Whisper's scaling: log10 floored at 1e-10, then at (clip max - 8), then (x + 4) / 4."""
    logs = mel.clamp_min(1e-10).log10_()
    peak = logs.amax(dim=(1, 2), keepdim=True)
    logs = torch.maximum(logs, peak - 8.0)
    return logs.add_(4.0).div_(4.0)


def _window_features(waveforms: torch.Tensor, num_mel_bins: int, window_frames: int) -> torch.Tensor:
    """[B, n] clips zero-padded to the longest (n samples) -> log-mel over the full window,
    computing the STFT only where there is sound.

    A frame whose 400-sample span starts at or after the end of the longest clip sees only
    zero padding: its power is exactly 0. So the STFT runs over the clips plus 201 samples
    of zeros (rounded to a hop), which also makes the reflect padding at that edge zeros,
    and the remaining frames are set to 0 power before the log: identical output, and
    short clips in a long window (5 s in Whisper's 30 s) cost only their own length.
    """
    longest = min(waveforms.shape[1], window_frames * HOP_LENGTH)
    frames = min(-(-(longest + N_FFT // 2 + 1) // HOP_LENGTH), window_frames)
    fitted = torch.nn.functional.pad(waveforms[:, :frames * HOP_LENGTH], (0, max(0, frames * HOP_LENGTH - longest)))
    power = mel_power(fitted, num_mel_bins)
    if frames < window_frames:
        power = torch.nn.functional.pad(power, (0, window_frames - frames))
    return log_scale(power)


def features(clips: Sequence[np.ndarray], num_mel_bins: int, window_frames: int, block: int = 4) -> Tuple[torch.Tensor, torch.Tensor]:
    """16-kHz clips -> (features [B, num_mel_bins, window_frames], valid frames [B] int64)."""
    lengths = frame_counts(clips, window_frames)
    if not clips:
        return torch.zeros(0, num_mel_bins, window_frames), lengths
    # A few clips per STFT call: batching amortises the call overhead, while small
    # blocks keep the spectrogram in cache (16 x 30-s clips is ~100 MB of complex STFT).
    blocks = [_window_features(waveforms(clips[i:i + block], window_frames), num_mel_bins, window_frames)
              for i in range(0, len(clips), block)]
    return torch.cat(blocks) if len(blocks) > 1 else blocks[0], lengths


def frame_counts(clips: Sequence[np.ndarray], window_frames: int) -> torch.Tensor:
    """Valid mel frames of each clip, at most the window: [B] int64."""
    return torch.tensor([min(valid_frames(c.shape[0]), window_frames) for c in clips], dtype=torch.long)


def waveforms(clips: Sequence[np.ndarray], window_frames: int) -> torch.Tensor:
    """Clips -> [B, longest] float32, zero-padded at the end, each cut to the window."""
    longest = max((min(c.shape[0], window_frames * HOP_LENGTH) for c in clips), default=0)
    return pad_or_trim(clips, 0, longest)


def batch_features(batch, device, clips=None) -> torch.Tensor:
    """The log-mel features [clips, mels, frames] of a micro-batch's clips (all, or the
    index tensor `clips`) on `device`: moved there, or computed there from the waveforms
    a data.features_on=device loader sends (the same arithmetic, on the encoder's device)."""
    if "audio_features" in batch:
        feats = batch["audio_features"]
        return (feats if clips is None else feats[clips]).to(device)
    audio = batch["audio_waveforms"]
    audio = (audio if clips is None else audio[clips]).to(device, non_blocking=True)
    return _window_features(audio, int(batch["audio_mel_bins"]), int(batch["audio_window_frames"]))
