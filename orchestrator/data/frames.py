"""Frame arithmetic from audio samples to decoder placeholder tokens (no torch: the
submit side may import it to check configs).

16-kHz audio -> mel frames (hop 160: 100 per second) -> encoder frames (Whisper's
conv front end: conv k3 s1 p1, then conv k3 s2 p1, so ceil(mel / 2)) -> adapter
tokens (`frames_per_token` encoder frames stacked or pooled into one, as the adapter's
kind does: orchestrator/plan/adapter_kinds.py; a partial group is dropped).
"""

from __future__ import annotations

import math

from orchestrator.plan.model_params import read_frames

HOP_LENGTH = 160


def window_frames_for(max_source_positions: int) -> int:
    """Mel frames of the encoder window: the stride-2 conv halves them to the positions."""
    return 2 * max_source_positions


def valid_frames(num_samples: int) -> int:
    """Mel frames that carry a clip of `num_samples` (HF attention-mask length)."""
    return math.ceil(num_samples / HOP_LENGTH)


def encoder_frames(mel_frames: int) -> int:
    return math.ceil(mel_frames / 2)


def audio_placeholder_count(num_samples: int, max_source_positions: int, frames_per_token: int,
                            mode: str = "clip") -> int:
    """Audio tokens the adapter makes for a clip of `num_samples` 16-kHz samples (`mode`:
    data.audio_tokens, read_frames)."""
    mel = read_frames(valid_frames(num_samples), window_frames_for(max_source_positions), mode)
    return encoder_frames(mel) // frames_per_token
