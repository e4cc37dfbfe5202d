"""Unit checks of the Gemma2 building blocks that need no process group."""

import types

import pytest
import torch

from orchestrator.models.attention import allowed_attention, document_ids, is_sliding_window_layer
from orchestrator.models.norms import ZeroCenteredRMSNorm


def _cfg(sp=False):
    return types.SimpleNamespace(params_dtype=torch.float32, sequence_parallel=sp, use_cpu_initialization=True)


def test_norm_is_zero_centred_fp32_and_tagged_for_sequence_parallel():
    norm = ZeroCenteredRMSNorm(_cfg(sp=True), 8, eps=1e-6)
    assert norm.weight.sequence_parallel is True
    assert ZeroCenteredRMSNorm(_cfg(), 8).weight.sequence_parallel is False
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(-1, 1, 8))
    x32 = x.float()
    expected = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm.weight)).to(torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)


def test_window_layers_are_the_even_zero_based_ones():
    assert [is_sliding_window_layer(n) for n in range(1, 7)] == [True, False, True, False, True, False]


def test_window_counts_the_current_token():
    allowed = allowed_attention(6, 6, "cpu", window=3)[0, 0]
    assert allowed[5].tolist() == [False, False, False, True, True, True]
    assert allowed[1].tolist() == [True, True, False, False, False, False]


def test_document_mask_from_cu_seqlens_and_padding_mask():
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    assert document_ids(cu, 5).tolist() == [0, 0, 1, 1, 1]
    allowed = allowed_attention(5, 5, "cpu", window=None, cu_seqlens=cu)[0, 0]
    assert allowed[2].tolist() == [False, False, True, False, False]
    assert allowed[4].tolist() == [False, False, True, True, True]
    pad = torch.zeros(1, 1, 5, 5, dtype=torch.bool)
    pad[..., 0] = True
    assert not allowed_attention(5, 5, "cpu", None, attention_mask=pad)[0, 0, :, 0].any()


def test_unequal_query_and_key_lengths_are_refused():
    with pytest.raises(ValueError, match=r"query \(3\) and key \(4\)"):
        allowed_attention(3, 4, "cpu", None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_te_backend_without_transformer_engine_says_what_to_do():
    from orchestrator.models.decoder_spec import decoder_layer_spec

    with pytest.raises((ImportError, ValueError), match="model.backend='local' on CPU"):
        decoder_layer_spec("te")
    with pytest.raises(ValueError, match=r"model.backend='cuda' is not one of \('local', 'te'\)"):
        decoder_layer_spec("cuda")
