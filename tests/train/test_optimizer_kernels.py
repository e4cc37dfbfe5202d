"""The foreach gradient norm and scaling in megatron's optimizer
(orchestrator/train/optimizer_kernels.py) compute what megatron's per-tensor fallbacks
compute, and never read a device value back to the host."""

import torch
from torch.overrides import TorchFunctionMode

from orchestrator.train.optimizer_kernels import foreach_l2_norm, foreach_scale

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__"}


class CountReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.reads += getattr(func, "__name__", "") in READS
        return func(*args, **(kwargs or {}))


def _grads(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for shape in [(7, 3), (128,), (4, 5, 6), (1,), (300, 2)]]


def test_the_norm_is_megatrons_and_stays_on_the_device():
    """megatron's fallback: the norm of the per-tensor norms (built on the host)."""
    grads = _grads()
    counter = CountReads()
    with counter:
        ours, _ = foreach_l2_norm(2048 * 32, None, [grads], False)
    assert counter.reads == 0
    assert ours.shape == (1,) and ours.dtype == torch.float32
    reference = torch.norm(torch.tensor([float(torch.norm(g)) for g in grads]))
    # fp32 sums of squares of ~1,000 values in another order: within a few ulps of the norm
    assert abs(float(ours[0]) - float(reference)) <= 8 * torch.finfo(torch.float32).eps * float(reference)


def test_scaling_in_place_and_copying_into_another_dtype():
    from megatron.core.utils import local_multi_tensor_scale

    grads, expected = _grads(), _grads()
    foreach_scale(0, None, [grads, grads], 0.25)
    local_multi_tensor_scale(0, None, [expected, expected], 0.25)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected))
    main = _grads(1)
    model = [torch.empty_like(t, dtype=torch.bfloat16) for t in main]
    reference = [torch.empty_like(t, dtype=torch.bfloat16) for t in main]
    foreach_scale(0, None, [main, model], 1.0)
    local_multi_tensor_scale(0, None, [main, reference], 1.0)
    assert all(torch.equal(a, b) for a, b in zip(model, reference))


def test_installed_where_megatron_fell_back_to_its_loops(monkeypatch):
    """Here (no TransformerEngine, no apex) megatron's optimizer takes them; the training
    tests run every step's clipping and weight copies through them."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    from orchestrator.train import optimizer_kernels

    for module, name in ((clip_grads, "l2_norm_impl"), (clip_grads, "multi_tensor_scale_impl"),
                         (optimizer, "multi_tensor_scale_impl")):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    assert clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm
    assert optimizer_kernels.install()
    assert clip_grads.l2_norm_impl is foreach_l2_norm and clip_grads.multi_tensor_scale_impl is foreach_scale
    assert optimizer.multi_tensor_scale_impl is foreach_scale
    assert not optimizer_kernels.install()  # once


def test_the_job_says_which_adam_step_runs(monkeypatch):
    """torch's AdamW picks its implementation at each step from the parameters: the
    per-tensor loop for CPU tensors (foreach for CUDA ones), unless the optimizer was built
    with one; megatron's wrappers (and its chains of them) hold it as `.optimizer`. The
    norm's kernels are named as megatron holds them (installed or not)."""
    from types import SimpleNamespace

    from megatron.core import utils
    from megatron.core.optimizer import clip_grads

    from orchestrator.train.optimizer_kernels import describe, foreach_l2_norm

    def megatrons(**kwargs):
        return SimpleNamespace(optimizer=torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], **kwargs))

    monkeypatch.setattr(clip_grads, "l2_norm_impl", foreach_l2_norm)
    assert describe(megatrons()) == ("optimizer: torch.optim.adamw.AdamW (per-tensor loop); gradient norm, clipping, "
                                     "weight copies: torch's foreach kernels (no TransformerEngine or apex)")
    assert "AdamW (foreach)" in describe(megatrons(foreach=True))
    assert "AdamW (fused)" in describe(megatrons(fused=True))
    chain = SimpleNamespace(chained_optimizers=[megatrons(), megatrons(), SimpleNamespace(optimizer=None)])
    monkeypatch.setattr(clip_grads, "l2_norm_impl", utils.local_multi_tensor_l2_norm)
    assert describe(chain) == ("optimizer: torch.optim.adamw.AdamW (per-tensor loop); gradient norm, clipping, "
                               "weight copies: megatron's per-tensor loops")
