"""Frame arithmetic from audio samples to decoder placeholder tokens (no torch: the
submit side may import it to check configs).

16-kHz audio -> mel frames (hop 160: 100 per second) -> encoder frames (Whisper's
conv front end: conv k3 s1 p1, then conv k3 s2 p1, so ceil(mel / 2)) -> adapter
tokens (`frame_stack` encoder frames concatenated per token; a partial stack is
dropped: // frame_stack).
"""

from __future__ import annotations

import math

SAMPLE_RATE = 16000
HOP_LENGTH = 160


def window_frames_for(max_source_positions: int) -> int:
    """Mel frames of the encoder window: the stride-2 conv halves them to the positions."""
    return 2 * max_source_positions


def valid_frames(num_samples: int) -> int:
    """Mel frames that carry a clip of `num_samples` (HF attention-mask length)."""
    return math.ceil(num_samples / HOP_LENGTH)


def encoder_frames(mel_frames: int) -> int:
    return math.ceil(mel_frames / 2)


def audio_placeholder_count(num_samples: int, max_source_positions: int, frame_stack: int,
                            mode: str = "clip") -> int:
    """Audio tokens the adapter makes for a clip of `num_samples` 16-kHz samples.

    mode "clip": the clip's own mel frames (capped at the window); mode "window": the
    whole window (2 * max_source_positions), as Whisper always encodes 30 s.
    """
    window = window_frames_for(max_source_positions)
    if mode == "window":
        mel = window
    elif mode == "clip":
        mel = min(valid_frames(num_samples), window)
    else:
        raise ValueError(f"data.audio_tokens={mode!r}; use 'clip' or 'window'")
    return encoder_frames(mel) // frame_stack
