"""SpecAugment (Park et al., 2019) on Whisper log-mel features: time and frequency masks.

Applied by the AudioLLM to the encoder's input in training mode only (evaluation and
decoding see clean features). Per clip, independently:
  - `freq_masks` bands of f ~ U[0, freq_width] consecutive mel bins;
  - `time_masks` spans of t ~ U[0, min(time_width, time_ratio * valid frames)] frames,
    placed inside the clip's valid frames (the padding after a clip stays as it is).
Masked cells get the clip's mean over its valid frames, so a mask does not look like
silence or a loud band. No time warping.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch


class SpecAugment(torch.nn.Module):
    def __init__(self, freq_masks: int = 2, freq_width: int = 15, time_masks: int = 2, time_width: int = 40,
                 time_ratio: float = 0.1):
        super().__init__()
        bad = [f"{k} ({v}) must be >= 0" for k, v in (("freq_masks", freq_masks), ("freq_width", freq_width),
                                                      ("time_masks", time_masks), ("time_width", time_width),
                                                      ("time_ratio", time_ratio)) if v < 0]
        if bad:
            raise ValueError("model.spec_augment: " + "; ".join(bad))
        self.freq_masks, self.freq_width = int(freq_masks), int(freq_width)
        self.time_masks, self.time_width, self.time_ratio = int(time_masks), int(time_width), float(time_ratio)

    def forward(self, features: torch.Tensor, lengths: Sequence[int],
                generator: Optional[torch.Generator] = None,
                generators: Optional[Sequence[torch.Generator]] = None) -> torch.Tensor:
        """features [clips, mel, frames], lengths: valid frames per clip -> masked copy.
        Draws from `generators[i]` for clip i when given (training: each clip's own, so a
        clip is masked the same whichever rank encodes it and with whichever other clips),
        else from `generator` (default: torch's)."""
        if not self.training:
            return features
        clips, bins, frames = features.shape
        out = features.clone()
        dev = features.device

        def draw(high: int) -> int:  # integer in [0, high]
            return int(torch.randint(0, high + 1, (1,), generator=generator)) if high > 0 else 0

        for i in range(clips):
            if generators is not None:
                generator = generators[i]
            valid = max(1, min(int(lengths[i]), frames))
            fill = features[i, :, :valid].mean()
            keep = torch.ones(bins, frames, dtype=torch.bool, device=dev)
            for _ in range(self.freq_masks):
                width = draw(min(self.freq_width, bins))
                start = draw(bins - width)
                keep[start:start + width, :] = False
            span = min(self.time_width, int(self.time_ratio * valid))
            for _ in range(self.time_masks):
                width = draw(span)
                start = draw(valid - width)
                keep[:, start:start + width] = False
            keep[:, valid:] = True  # padding is never masked
            out[i] = torch.where(keep, features[i], fill)
        return out


def build_spec_augment(cfg) -> Optional[SpecAugment]:
    """The `model.spec_augment` section -> the module, or None when disabled."""
    if cfg is None or not cfg.enabled:
        return None
    return SpecAugment(cfg.freq_masks, cfg.freq_width, cfg.time_masks, cfg.time_width, cfg.time_ratio)
