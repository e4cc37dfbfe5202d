"""The adapter's layer mix (orchestrator/models/adapters.py _LayerMix) computes what the plain
sum computes, in the same order: the same bits forward and backward, for fp32 and bf16
encoder states, frozen or trained; it keeps the states themselves, not fp32 copies."""

import pytest
import torch

from orchestrator.models.adapters import _LayerMix


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("states_train", [False, True])
def test_the_layer_mix_equals_the_plain_sum_bit_for_bit(dtype, states_train):
    generator = torch.Generator().manual_seed(0)
    states = [torch.randn(3, 50, 16, generator=generator).to(dtype).requires_grad_(states_train) for _ in range(5)]
    logits = torch.randn(5, generator=generator, requires_grad=True)
    grad = torch.randn(3, 50, 16, generator=generator)
    inputs = [logits] + (states if states_train else [])

    plain = sum(w * s.float() for w, s in zip(torch.softmax(logits, 0), states))
    mixed = _LayerMix.apply(torch.softmax(logits, 0), *states)
    assert mixed.dtype == torch.float32 and torch.equal(mixed, plain)
    for ours, reference in zip(torch.autograd.grad(mixed, inputs, grad), torch.autograd.grad(plain, inputs, grad)):
        assert ours.dtype == reference.dtype and torch.equal(ours, reference)


def test_the_layer_mix_keeps_the_bf16_states_not_fp32_copies():
    states = [torch.randn(2, 8, 4).to(torch.bfloat16) for _ in range(3)]
    weights = torch.softmax(torch.zeros(3, requires_grad=True), 0)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        _LayerMix.apply(weights, *states)
    kept = [t for t in saved if t.dim() == 3]
    assert len(kept) == 3 and all(t.dtype == torch.bfloat16 for t in kept)
    assert {t.data_ptr() for t in kept} == {s.data_ptr() for s in states}
