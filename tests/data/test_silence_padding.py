"""data.silence_padding: the share of training clips padded with silence up to the encoder's
window (orchestrator/data/loader.SampleProcessor). A padded clip is the clip with zeros
before and after it, at most the window long; its placeholders are counted on it as padded;
the draw is the same for the same place in the order (a resumed run pads as before), other
places draw other paddings; validation clips are never padded."""

from __future__ import annotations

import numpy as np

from orchestrator.data.loader import SampleProcessor
from orchestrator.data.prompts import audio_placeholder_count
from orchestrator.data.sources import ResolvedDataset
from orchestrator.plan.schema.data import DatasetEntry
from tests.data.conftest import data_config, tone_samples

ASR = DatasetEntry(name="asr", path="")
WINDOW = 5 * 16000  # the tests' encoder window (tests/data/conftest.py encoder_cfg)


def processor(tokenizer, encoder_cfg, adapter_cfg, split: str, share: float) -> SampleProcessor:
    cfg = data_config([ASR], [ASR], silence_padding=share)
    entries = cfg.train if split == "train" else cfg.validation
    return SampleProcessor(cfg, encoder_cfg, adapter_cfg, tokenizer, [ResolvedDataset("asr", "", 1.0, None, entries[0])],
                           split)


def test_a_share_of_training_clips_is_padded_with_silence_up_to_the_window(tokenizer, encoder_cfg, adapter_cfg):
    from orchestrator.data.audio import load_audio

    raw = tone_samples(1, seed=4)[0]
    clip = load_audio(raw["audio"], None, 16000)
    always = processor(tokenizer, encoder_cfg, adapter_cfg, "train", 1.0)
    padded = [always(raw, position, 0) for position in range(40)]
    for example in padded:
        (audio,) = example.clips
        assert len(clip) <= len(audio) <= WINDOW
        start = int(np.flatnonzero(audio)[0])  # the clip whole, zeros around it
        assert np.array_equal(audio[start:start + len(clip)], clip) and not audio[:start].any()
        assert not audio[start + len(clip):].any()
        assert example.tokenized.audio_tokens == [audio_placeholder_count(len(audio), 250, 5, "clip")]
    lengths = {len(e.clips[0]) for e in padded}
    assert len(lengths) > 30 and max(lengths) > 0.8 * WINDOW  # lengths spread over the window
    assert [len(e.clips[0]) for e in padded] == [len(always(raw, position, 0).clips[0]) for position in range(40)]
    half = processor(tokenizer, encoder_cfg, adapter_cfg, "train", 0.5)
    changed = sum(len(half(raw, position, 0).clips[0]) > len(clip) for position in range(200))
    assert 70 <= changed <= 130, changed  # about half (binomial: 100 +- 3 sigma)
    never = [processor(tokenizer, encoder_cfg, adapter_cfg, "validation", 1.0)(raw, p, 0) for p in range(5)]
    assert all(len(e.clips[0]) == len(clip) for e in never)
