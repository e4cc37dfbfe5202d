"""FlexSoftcapAttention (the GPU core attention) on CPU: bucketed widths give the same
outputs as the plain-PyTorch reference, the kernel sees only the bucket widths, block
masks are built once per micro-batch and window variant, and compiling the kernel
(dynamo, static shapes) compiles once per bucket and variant with no fallback.

On CPU torch runs flex_attention's forward eagerly (the module compiles it on CUDA
only); the compile test compiles it here with a counting dynamo backend."""

import gc
import math
import types

import pytest
import torch

from orchestrator.models import attention as attention_module
from orchestrator.models.attention import (
    FLEX_MIN_BUCKET, FLEX_RECOMPILE_LIMIT, FlexSoftcapAttention, SoftcapDotProductAttention, flex_bucket_width,
)

HEADS, GROUPS, HEAD_DIM, WINDOW = 4, 2, 8, 16  # GQA: two query heads per key/value group
SOFTCAP = 1.5  # small, so that the softcap changes the scores of N(0, 1)-sized logits


def _config(heads=HEADS, groups=GROUPS, head_dim=HEAD_DIM):
    return types.SimpleNamespace(
        context_parallel_size=1, num_attention_heads=heads, num_query_groups=groups, kv_channels=head_dim,
        attn_logit_softcapping=SOFTCAP, sliding_window=WINDOW, attention_dropout=0.0,
    )


def _tp1():
    """A process-group collection with TP size 1 (no torch.distributed needed)."""
    return types.SimpleNamespace(tp=types.SimpleNamespace(size=lambda: 1))


def _attention(cls, layer_number, **shape):
    """Core attention of layer `layer_number` (1-based): odd numbers are windowed."""
    from megatron.core.transformer.enums import AttnMaskType

    return cls(_config(**shape), layer_number=layer_number, attn_mask_type=AttnMaskType.causal,
               attention_type="self", pg_collection=_tp1())


def _qkv(s, b, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(s, b, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(s, b, GROUPS, HEAD_DIM, generator=gen)
    v = torch.randn(s, b, GROUPS, HEAD_DIM, generator=gen)
    return q, k, v


def _packed(lengths):
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                           max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))


def _document_mask(s, b, seed):
    """[b, 1, s, s] megatron mask (True = masked out) of rows packed with random documents."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.rand(b, s, generator=gen) < 0.05
    starts[:, 0] = True
    documents = torch.cumsum(starts, dim=1)
    return (documents[:, :, None] != documents[:, None, :])[:, None]


def _tolerance(s):
    # fp32: each output is a softmax-weighted sum over up to s keys; blocked/pairwise sums
    # carry about log2(s) rounding steps, each of one ulp (eps) relative to the largest
    # term; the scores' dot product over HEAD_DIM, tanh and exp add a few ulp more. So a
    # few ulp x log2 of the reduction length, relative to the values' scale (|v| <= ~4).
    return 8 * torch.finfo(torch.float32).eps * (math.log2(flex_bucket_width(s)) + math.log2(HEAD_DIM))


def _assert_matches_reference(layer_number, q, k, v, mask=None, packed=None):
    flex = _attention(FlexSoftcapAttention, layer_number)
    ref = _attention(SoftcapDotProductAttention, layer_number)
    with torch.no_grad():
        out = flex(q, k, v, mask, packed_seq_params=packed)
        expected = ref(q, k, v, mask, packed_seq_params=packed)
    assert out.shape == expected.shape
    tol = _tolerance(q.shape[0])
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol * v.abs().max().item())


def test_bucket_width_is_the_next_power_of_two_of_at_least_128():
    assert [flex_bucket_width(w) for w in (1, 127, 128, 129, 256, 257, 4096, 4097)] == [
        128, 128, 128, 256, 256, 512, 4096, 8192]
    with pytest.raises(ValueError, match="width must be >= 1"):
        flex_bucket_width(0)


@pytest.mark.parametrize("layer_number", [1, 2], ids=["window", "global"])
@pytest.mark.parametrize("s", [1, 5, 100, 129, 300])
def test_bucketed_flex_equals_reference(layer_number, s):
    _assert_matches_reference(layer_number, *_qkv(s, 2))


@pytest.mark.parametrize("layer_number", [1, 2], ids=["window", "global"])
@pytest.mark.parametrize("lengths", [(3,), (40, 1, 60), (7, 150, 30)])
def test_bucketed_flex_equals_reference_with_packed_documents(layer_number, lengths):
    q, k, v = (t[:, 0] for t in _qkv(sum(lengths), 1))  # thd: [tokens, heads, dim]
    _assert_matches_reference(layer_number, q, k, v, packed=_packed(lengths))


@pytest.mark.parametrize("layer_number", [1, 2], ids=["window", "global"])
@pytest.mark.parametrize("s,b", [(77, 2), (200, 3), (150, 1)])
def test_bucketed_flex_equals_reference_with_explicit_mask(layer_number, s, b):
    _assert_matches_reference(layer_number, *_qkv(s, b), mask=_document_mask(s, b, seed=s))


def test_bucketed_flex_equals_reference_with_documents_and_a_mask(monkeypatch):
    lengths = (40, 100)
    q, k, v = (t[:, 0] for t in _qkv(sum(lengths), 1))
    packed, mask = _packed(lengths), _document_mask(sum(lengths), 1, seed=5)
    _assert_matches_reference(1, q, k, v, mask=mask, packed=packed)
    calls = _count_block_mask_builds(monkeypatch, _attention(FlexSoftcapAttention, 1))
    with torch.no_grad():
        for n in (3, 5):  # the windowed variant was built above, for this micro-batch
            _attention(FlexSoftcapAttention, n)(q, k, v, mask, packed_seq_params=packed)
        _attention(FlexSoftcapAttention, 1)(q, k, v, mask, packed_seq_params=_packed((70, 70)))
    assert len(calls) == 1, "other documents with the same mask: a new build"


def test_bucketed_flex_equals_reference_with_a_padding_mask_broadcast_over_rows():
    # [1, 1, 1, s]: keys 10..19 masked for every query (no query loses all its keys: a fully
    # masked row is zero in flex_attention and uniform in the reference, both meaningless)
    pad = torch.zeros(1, 1, 1, 90, dtype=torch.bool)
    pad[..., 10:20] = True
    _assert_matches_reference(2, *_qkv(90, 2), mask=pad)


def test_kernel_sees_only_the_bucket_widths(monkeypatch):
    """Widths over 1..600 (every bucket edge and a stride between; every width would take
    ~40 s of eager flex_attention here): the kernel is called at 128, 256, 512 and 1024
    only (real calls, through a wrapper on what _attention_kernel returns)."""
    attn = _attention(FlexSoftcapAttention, 2, heads=1, groups=1, head_dim=1)  # tiny: cheap eager calls
    attn._score_mod = None  # the shapes do not depend on it; the eager score_mod costs time here
    seen = []
    kernel = attn._attention_kernel

    def spying_kernel(device):
        real = kernel(device)

        def call(q, k, v, **kwargs):
            seen.append((tuple(q.shape), tuple(k.shape), tuple(v.shape), kwargs["block_mask"].shape))
            return real(q, k, v, **kwargs)

        return call

    monkeypatch.setattr(attn, "_attention_kernel", spying_kernel)
    widths = sorted(set(range(1, 601, 23)) | {127, 128, 129, 255, 256, 257, 511, 512, 513, 600})
    with torch.no_grad():
        for s in widths:
            q, k, v = (t[:, :, :1, :1].contiguous() for t in _qkv(s, 1, seed=s))
            assert attn(q, k, v, None).shape == (s, 1, 1)
    assert len(seen) == len(widths)
    assert {shapes[0][2] for shapes in seen} == {128, 256, 512, 1024}
    assert {shapes for shapes in seen} == {((1, 1, w, 1),) * 3 + ((1, 1, w, w),) for w in (128, 256, 512, 1024)}


def _count_block_mask_builds(monkeypatch, layer):
    """Wraps torch's create_block_mask as the module reaches it (its `_flex` reference);
    returns the list that gets one entry per call."""
    calls = []
    build = layer._flex.create_block_mask

    def counting(*args, **kwargs):
        calls.append(kwargs["Q_LEN"])
        return build(*args, **kwargs)

    monkeypatch.setattr(layer._flex, "create_block_mask", counting)
    return calls


def test_block_masks_are_built_once_per_micro_batch_and_window_variant(monkeypatch):
    """Six layers (windows on layers 1, 3, 5), two micro-batches with documents: two builds
    each (windowed, global), whatever the number of layers; running the same micro-batch
    again (activation recomputation) builds nothing."""
    layers = [_attention(FlexSoftcapAttention, n) for n in range(1, 7)]
    assert all(layer._flex is layers[0]._flex for layer in layers)
    gc.collect()
    live_before = len(attention_module._MICRO_BATCH_BLOCK_MASKS)
    calls = _count_block_mask_builds(monkeypatch, layers[0])

    def micro_batch(lengths):
        packed = _packed(lengths)
        q, k, v = (t[:, 0] for t in _qkv(sum(lengths), 1))
        with torch.no_grad():
            for layer in layers:
                layer(q, k, v, None, packed_seq_params=packed)
        return packed

    first = micro_batch((30, 70))
    assert len(calls) == 2
    second = micro_batch((50, 20, 30))  # same width, other documents
    assert len(calls) == 4
    q, k, v = (t[:, 0] for t in _qkv(100, 1))
    with torch.no_grad():
        for layer in layers:  # the first micro-batch again
            layer(q, k, v, None, packed_seq_params=first)
    assert len(calls) == 4, "a live micro-batch's block masks are reused"
    assert first.cu_seqlens_q.untyped_storage() in attention_module._MICRO_BATCH_BLOCK_MASKS
    del first, second
    gc.collect()
    assert len(attention_module._MICRO_BATCH_BLOCK_MASKS) == live_before, "block masks go away with their micro-batch"


def test_explicit_mask_block_masks_survive_the_detached_copy_of_recomputation(monkeypatch):
    """megatron's activation checkpointing recomputes the core attention with a detached
    copy of attention_mask (a new tensor on the same storage): no new build then."""
    layers = [_attention(FlexSoftcapAttention, n) for n in range(1, 5)]
    calls = _count_block_mask_builds(monkeypatch, layers[0])
    q, k, v = _qkv(60, 2)
    mask = _document_mask(60, 2, seed=3)
    with torch.no_grad():
        for layer in layers:
            layer(q, k, v, mask)
        assert len(calls) == 2
        for layer in layers:
            layer(q, k, v, mask.detach())
        assert len(calls) == 2
        other = mask.clone()  # another micro-batch's mask, equal contents: new builds
        for layer in layers:
            layer(q, k, v, other)
        assert len(calls) == 4


def test_compiled_kernel_compiles_once_per_bucket_and_variant_without_fallback(monkeypatch):
    """Dynamo compiles flex_attention (static shapes) once per bucket x window x mask
    source, whatever the real widths: 2 buckets x 2 window variants x (causal only,
    documents) = 8 compilations, with dynamo's process-wide recompile limit set to 4 here —
    so this also checks that the module's own limit is what applies. A counting backend
    (the recompile decisions are dynamo's, not the backend's; inductor would take ~30 s
    per compilation on this CPU) keeps this fast; fail_on_recompile_limit_hit turns a
    fallback to eager into an error."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    torch._dynamo.reset()
    attention_module.compiled_flex_attention.cache_clear()
    try:
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=4), torch.no_grad():
            kernel = attention_module.compiled_flex_attention(backend=counter)
            layers = [_attention(FlexSoftcapAttention, n) for n in (1, 2)]
            for layer in layers:
                monkeypatch.setattr(layer, "_attention_kernel", lambda device: kernel)
            for s in (60, 128, 129, 200):  # buckets 128, 256
                q, k, v = _qkv(s, 1, seed=s)
                packed = _packed((s // 3, s - s // 3))
                for layer in layers:
                    layer(q, k, v, None)
                    layer(q[:, 0], k[:, 0], v[:, 0], None, packed_seq_params=packed)
        assert counter.frame_count == 2 * 2 * 2
    finally:
        torch._dynamo.reset()
        attention_module.compiled_flex_attention.cache_clear()


def test_recompile_limit_covers_the_known_set_and_keeps_a_larger_user_value(monkeypatch):
    import torch._dynamo

    seen = {}

    def recording_compile(fn, *, dynamic=None, backend="inductor", recompile_limit=None):
        seen.update(dynamic=dynamic, recompile_limit=recompile_limit)
        return fn

    def older_compile(fn, *, dynamic=None, backend="inductor"):  # a torch.compile without recompile_limit
        return fn

    monkeypatch.setattr(torch, "compile", recording_compile)
    attention_module.compiled_flex_attention.cache_clear()
    try:
        buckets = (attention_module.FLEX_MAX_BUCKET // FLEX_MIN_BUCKET).bit_length()
        assert FLEX_RECOMPILE_LIMIT == buckets * 2 * 3 * 2 <= torch._dynamo.config.accumulated_recompile_limit
        attention_module.compiled_flex_attention()
        assert seen["recompile_limit"] == FLEX_RECOMPILE_LIMIT and seen["dynamic"] is False
        attention_module.compiled_flex_attention.cache_clear()
        with torch._dynamo.config.patch(recompile_limit=1000):
            attention_module.compiled_flex_attention()
        assert seen["recompile_limit"] == 1000
        attention_module.compiled_flex_attention.cache_clear()
        monkeypatch.setattr(torch, "compile", older_compile)
        with torch._dynamo.config.patch(recompile_limit=8):  # restores the process-wide value after
            attention_module.compiled_flex_attention()
            assert torch._dynamo.config.recompile_limit == FLEX_RECOMPILE_LIMIT
    finally:
        attention_module.compiled_flex_attention.cache_clear()
