"""CTC targets for the auxiliary loss (model.adapter.ctc_weight) from loader batches:
each clip gets its own sample's transcript, packed or not, and the CTC loss spread
over the sample's trained tokens adds exactly weight x CTC to the loss sum."""

from __future__ import annotations

import pytest
import torch

from orchestrator.data.loader import build_train_loader
from orchestrator.schema.data import DatasetEntry
from orchestrator.train.audiollm_provider import ctc_per_token, ctc_samples
from tests.data.conftest import data_config, tone_samples, write_mds


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    samples = tone_samples(6, seed=5)
    return write_mds(tmp_path_factory.mktemp("ctc") / "tones", samples), [s["text"] for s in samples]


@pytest.mark.parametrize("packing", [False, True])
def test_each_clip_gets_its_own_transcript(dataset, tokenizer_dir, tokenizer, encoder_cfg, adapter_cfg, packing):
    path, texts = dataset
    cfg = data_config(train=[DatasetEntry(name="tones", path=str(path))], shuffle=False, packing=packing,
                      tokenizer=str(tokenizer_dir), packing_buffer=6)
    batch = next(build_train_loader(cfg, encoder_cfg, adapter_cfg, 2 if packing else 6))
    assert batch["num_samples"] == 6
    if packing:
        assert batch["tokens"].shape[0] == 2  # several samples share a row
    samples = ctc_samples(batch, set(tokenizer.all_special_ids))
    assert sorted(tokenizer.decode(t).strip() for _, _, t in samples) == sorted(texts)
    # Each clip's trained positions lie in its own row and are disjoint from the others'.
    taken = torch.zeros_like(batch["loss_mask"], dtype=torch.bool)
    for row, positions, _ in samples:
        assert not (taken[row] & positions).any()
        taken[row] |= positions
    assert torch.equal(taken, batch["loss_mask"] > 0)

    ctc = torch.arange(1.0, 7.0)
    extra = ctc_per_token(ctc, samples, tuple(batch["tokens"].shape), weight=0.3)
    assert float((extra * batch["loss_mask"]).sum()) == pytest.approx(0.3 * float(ctc.sum()))
    assert float(extra[batch["loss_mask"] == 0].abs().sum()) == 0.0
