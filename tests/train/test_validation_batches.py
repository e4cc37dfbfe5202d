"""The trainer's validation source: datasets read round-robin, so a few evaluation
batches cover all of them, and a restart reads the same batches again."""

import torch

from orchestrator.train.audiollm_provider import ValidationBatches


def _set(batches: int, tag: int):
    # A validation set yields batches whose dataset_index is 0 (its own list) or -1 (padding).
    return [{"dataset_index": torch.tensor([[0, 0, -1]]), "tag": (tag, b)} for b in range(batches)]


def test_round_robin_covers_every_dataset_and_restarts_identically():
    source = ValidationBatches({"a": _set(3, 0), "b": _set(1, 1), "c": _set(2, 2)})
    start = source.state_dict()
    drawn = [source.next_microbatch() for _ in range(7)]
    assert [b["tag"] for b in drawn] == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (0, 2), (0, 0)]
    # dataset_index now names the source's dataset (a=0, b=1, c=2); padding stays -1
    assert [b["dataset_index"].tolist() for b in drawn[:3]] == [[[0, 0, -1]], [[1, 1, -1]], [[2, 2, -1]]]
    source.load_state_dict(start)
    assert [source.next_microbatch()["tag"] for _ in range(3)] == [(0, 0), (1, 0), (2, 0)]
