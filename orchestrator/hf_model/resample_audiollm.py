"""Band-limited resampling in numpy: the Kaiser-windowed sinc polyphase filter that
`orchestrator.data.audio.resample` runs as a torch conv1d, here as a matrix product.

Kept free of torch so that `audiollm data import` (whose worker processes decode,
resample and encode every clip of a corpus once) starts its workers in a fraction of a
second; the filter itself is designed once, here, for both (`polyphase_kernel`). Numpy
only, so an exported model directory carries it as remote code: its pipeline resamples
audio of another rate as `audiollm transcribe` does (pipeline_audiollm.py).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Tuple

import numpy as np

ZERO_CROSSINGS = 16
ROLLOFF = 0.96
# Output blocks computed per matrix product: bounds the windowed copy of the input to
# about BLOCK_ROWS x taps floats (8 kHz -> 16 kHz: 35 taps, ~1 MB) however long the file.
BLOCK_ROWS = 8192


@lru_cache(maxsize=16)
def polyphase_kernel(orig: int, new: int, zero_crossings: int = ZERO_CROSSINGS,
                     rolloff: float = ROLLOFF) -> Tuple[np.ndarray, int]:
    """Kernel [new, taps] (float64) of a Kaiser-windowed sinc low-pass, one row per output
    phase, and its half width in input samples (taps = 2 * half + orig).

    Output sample q*new + j sits at input position q*orig + j*orig/new; row j holds the
    filter evaluated at the input taps around that position.
    """
    cutoff = rolloff * min(1.0, new / orig)  # fraction of the input Nyquist kept
    half_width = math.ceil(zero_crossings / cutoff)  # taps on each side, in input samples
    taps = np.arange(-half_width, half_width + orig, dtype=np.float64)
    offsets = np.arange(new, dtype=np.float64)[:, None] * orig / new
    t = taps[None, :] - offsets  # distance from each tap to the output position
    beta = 14.769656459379492  # Kaiser beta for a ~ -100 dB stop band
    inside = np.abs(t) <= half_width
    ratio = np.clip(1.0 - (t / half_width) ** 2, 0.0, None)
    window = np.where(inside, np.i0(beta * np.sqrt(ratio)) / np.i0(beta), 0.0)
    kernel = cutoff * np.sinc(cutoff * t) * window
    kernel.setflags(write=False)  # cached and shared: nobody may change it
    return kernel, half_width


def resample(samples: np.ndarray, orig_rate: int, target_rate: int) -> np.ndarray:
    """Mono float signal at orig_rate -> float32 at target_rate; output length
    ceil(n * target / orig), as `audio.resample`."""
    if orig_rate <= 0 or target_rate <= 0:
        raise ValueError(f"sample rates must be positive (got {orig_rate} -> {target_rate})")
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    if orig_rate == target_rate:
        return samples
    g = math.gcd(orig_rate, target_rate)
    orig, new = orig_rate // g, target_rate // g
    kernel, half = polyphase_kernel(orig, new)
    kernel_t = np.ascontiguousarray(kernel.T, dtype=np.float32)  # [taps, new]
    n = samples.shape[0]
    out_len = math.ceil(n * new / orig)
    blocks = math.ceil(n / orig)
    padded = np.pad(samples, (half, half + orig + blocks * orig - n))
    taps = kernel.shape[1]
    # Row q of the windows is the input around output block q (stride orig): the same
    # product as conv1d(padded, kernel, stride=orig), block by block.
    windows = np.lib.stride_tricks.sliding_window_view(padded, taps)[::orig]
    out = np.empty((windows.shape[0], new), dtype=np.float32)
    for start in range(0, windows.shape[0], BLOCK_ROWS):
        stop = start + BLOCK_ROWS
        np.matmul(np.ascontiguousarray(windows[start:stop]), kernel_t, out=out[start:stop])
    return out.reshape(-1)[:out_len]
