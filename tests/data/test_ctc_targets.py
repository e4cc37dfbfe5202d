"""CTC targets for the auxiliary loss (model.adapter.ctc_weight) from loader batches:
each clip gets its own sample's transcript, packed or not, and the CTC loss spread
over the sample's trained tokens adds exactly weight x CTC to the loss sum.

The pairing is checked clip by clip: which sample a clip came from is read off its
audio (each sample is a tone of its own length and pitch, matched against that
sample's own log-mel features), and the clip's CTC targets must be that sample's
transcript tokens, in order; so must the tokens its CTC loss is spread over."""

from __future__ import annotations

import pytest
import torch

from orchestrator.data import mel
from orchestrator.data.audio import encode_flac, load_audio
from orchestrator.data.loader import build_train_loader
from orchestrator.plan.schema.data import DatasetEntry
from orchestrator.train.audiollm_provider import ctc_per_token, ctc_samples
from tests.data.conftest import WORDS, data_config, tone, write_mds

# Distinct transcripts of different lengths: a swap changes the token lists.
TEXTS = ["one", "two three", "four five six", "seven eight nine zero", "the cat sees", "dog sees the cat one"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    assert all(w in WORDS for t in TEXTS for w in t.split())
    samples = [{"audio": encode_flac(tone(0.4 + 0.15 * i, freq=250 + 90 * i, seed=i), 16000), "text": text}
               for i, text in enumerate(TEXTS)]
    return write_mds(tmp_path_factory.mktemp("ctc") / "tones", samples), samples


def _clip_samples(batch, samples, encoder_cfg):
    """The dataset index of the sample each clip of the batch came from, by its audio."""
    audio = [load_audio(s["audio"], None, 16000) for s in samples]
    reference, _ = mel.features(audio, int(encoder_cfg.num_mel_bins),
                                mel.window_frames_for(int(encoder_cfg.max_source_positions)))
    distance = (batch["audio_features"][:, None] - reference[None]).abs().flatten(2).amax(-1)  # [clips, samples]
    which = distance.argmin(dim=1)
    assert (distance.gather(1, which[:, None]) < 1e-4).all(), distance
    assert sorted(which.tolist()) == list(range(len(samples)))  # each sample's clip once
    return which.tolist()


@pytest.mark.parametrize("packing", [False, True])
def test_each_clip_gets_its_own_transcript(dataset, tokenizer_dir, tokenizer, encoder_cfg, adapter_cfg, packing):
    path, samples = dataset
    cfg = data_config(train=[DatasetEntry(name="tones", path=str(path))], shuffle=False, packing=packing,
                      tokenizer=str(tokenizer_dir), packing_buffer=6)
    batch = next(build_train_loader(cfg, encoder_cfg, adapter_cfg, 2 if packing else 6))
    assert batch["num_samples"] == 6
    if packing:
        assert batch["tokens"].shape[0] == 2  # several samples share a row
    special = set(tokenizer.all_special_ids)
    clips = ctc_samples(batch, special)
    assert len(clips) == batch["audio_features"].shape[0] == 6
    origin = _clip_samples(batch, samples, encoder_cfg)
    # The transcript's tokens as the prompt builder encodes them (no chat markers, no eos).
    expected = [list(tokenizer(s["text"], add_special_tokens=False)["input_ids"]) for s in samples]
    assert len({tuple(e) for e in expected}) == len(expected)

    taken = torch.zeros_like(batch["loss_mask"], dtype=torch.bool)
    for k, (row, positions, targets) in enumerate(clips):
        i = origin[k]
        # Clip k's CTC targets are its own sample's transcript, token for token, in order.
        assert targets == expected[i], (f"clip {k} (audio of sample {i}, {samples[i]['text']!r}) got CTC targets "
                                        f"{tokenizer.decode(targets)!r}")
        # ... and its trained positions are in the row that holds its audio placeholders.
        assert row == int(batch["audio_clip_rows"][k])
        # Each clip's trained positions lie in its own row and are disjoint from the others'.
        assert not (taken[row] & positions).any()
        taken[row] |= positions
    assert torch.equal(taken, batch["loss_mask"] > 0)

    # Clip k's CTC loss is spread over clip k's own sample's tokens: with losses 10^k, the
    # tokens that carry weight x 10^k / (their count) are exactly that sample's answer.
    weight = 0.3
    ctc = torch.tensor([10.0 ** k for k in range(6)])
    shares = [(row, positions, int(positions.sum())) for row, positions, _ in clips]
    extra = ctc_per_token(ctc, shares, tuple(batch["tokens"].shape), weight=weight)
    for k, (row, positions, _) in enumerate(clips):
        share = weight * float(ctc[k]) / int(positions.sum())
        carried = torch.isclose(extra[row], torch.tensor(share), rtol=1e-5, atol=0.0)
        labels = [int(t) for t in batch["labels"][row][carried].tolist() if int(t) not in special]
        assert labels == expected[origin[k]], f"clip {k}: its CTC loss lands on {tokenizer.decode(labels)!r}"
    assert float((extra * batch["loss_mask"]).sum()) == pytest.approx(weight * float(ctc.sum()), rel=1e-6)
    assert float(extra[batch["loss_mask"] == 0].abs().sum()) == 0.0
