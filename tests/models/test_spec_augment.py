"""SpecAugment masks: where they fall, what they hold, and that eval mode is untouched."""

import pytest
import torch

from orchestrator.models.spec_augment import SpecAugment, build_spec_augment
from orchestrator.plan.schema.model import SpecAugmentConfig


def _features(clips=4, bins=20, frames=60, seed=0):
    return torch.randn(clips, bins, frames, generator=torch.Generator().manual_seed(seed))


def test_eval_mode_and_zero_masks_are_identity():
    x = _features()
    aug = SpecAugment().eval()
    assert torch.equal(aug(x, [60] * 4), x)
    none = SpecAugment(freq_masks=0, time_masks=0).train()
    assert torch.equal(none(x, [60] * 4), x)


def test_masks_stay_inside_valid_frames_and_hold_the_clip_mean():
    x = _features()
    lengths = [60, 40, 25, 10]
    aug = SpecAugment(freq_masks=2, freq_width=5, time_masks=2, time_width=30, time_ratio=0.5).train()
    changed_any = False
    for seed in range(20):
        y = aug(x, lengths, generator=torch.Generator().manual_seed(seed))
        assert y.shape == x.shape
        for i, n in enumerate(lengths):
            assert torch.equal(y[i, :, n:], x[i, :, n:]), "padding after the clip was masked"
            changed = y[i, :, :n] != x[i, :, :n]
            if changed.any():
                changed_any = True
                fill = x[i, :, :n].mean()
                assert torch.allclose(y[i, :, :n][changed], fill.expand(int(changed.sum())))
            # two time masks of at most time_ratio * n frames each (freq bands never fill a column: 2 x 5 < 20 bins)
            full_cols = (y[i, :, :n] != x[i, :, :n]).all(dim=0).sum()
            assert int(full_cols) <= 2 * int(0.5 * n)
    assert changed_any
    assert torch.equal(x, _features())  # the input is not modified in place


def test_masked_bands_are_whole_rows_within_width():
    x = _features(clips=1, bins=30, frames=50)
    aug = SpecAugment(freq_masks=1, freq_width=6, time_masks=0).train()
    drawn = 0
    for seed in range(20):
        y = aug(x, [50], generator=torch.Generator().manual_seed(seed))
        rows = (y[0] != x[0]).any(dim=1)
        if rows.any():
            drawn += 1
            idx = torch.nonzero(rows).flatten()
            assert int(idx[-1] - idx[0] + 1) == int(rows.sum()) <= 6  # one contiguous band
            assert bool((y[0, rows] != x[0, rows]).all())  # across every frame
    # A band of width 0 may be drawn, but most seeds must mask something, or nothing was checked.
    assert drawn >= 10, drawn


def test_config_builds_or_disables_and_rejects_negative_values():
    assert build_spec_augment(SpecAugmentConfig()) is None
    assert isinstance(build_spec_augment(SpecAugmentConfig(enabled=True)), SpecAugment)
    with pytest.raises(ValueError, match=r"freq_width \(-1\).*time_ratio \(-0.5\)"):
        SpecAugment(freq_width=-1, time_ratio=-0.5)
