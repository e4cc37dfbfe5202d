"""Lets megatron-core 0.16 run on a machine without CUDA (gloo, CPU tensors).

megatron-core assumes CUDA in a few places that matter for training on CPU:
- the model-parallel RNG tracker stores CUDA generator states
  (`model_parallel_cuda_manual_seed`, `tracker.fork()` around TP-region init/dropout);
- `torch.cuda.current_device()` for scratch buffers (GlobalMemoryBuffer, TP
  all-gather and pipeline p2p buffers) and `torch.cuda.synchronize()`;
- tensors created with `device="cuda"` literals (pipeline schedules, optimizer
  found-inf/scale tensors, grad clipping), `Tensor.cuda()`, and asserts that
  parameters are `torch.cuda.FloatTensor` (optimizer, grad clipping).

This module is the ONLY place that adapts to that, and it is active only when CUDA
is absent: `activate()` is a no-op on a CUDA machine. It patches torch.cuda's
device helpers and megatron's RNG-state helpers, and enters a TorchFunctionMode
that maps CUDA device requests to the CPU. Because these are patches, the job
calls `require_active()` after `activate()` on CPU: it refuses to start unless the
patches are in place (a megatron upgrade that renamed a patched function would
otherwise fail later and less clearly).
"""

from __future__ import annotations

import logging

import torch
from torch.overrides import TorchFunctionMode

_mode: "_CudaRequestsToCpu | None" = None


def _is_cuda(device) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


class _CudaRequestsToCpu(TorchFunctionMode):
    """Maps `device="cuda"` (and `.cuda()`, `.to("cuda")`) to the CPU, and reports CPU
    float tensors as `torch.cuda.*Tensor` to `Tensor.type()` for megatron's asserts."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            if name.startswith("torch.") and not name.startswith("torch.cuda."):
                return "torch.cuda." + name[len("torch."):]
            return name
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu") + tuple(args[2:])
        return func(*args, **kwargs)


def _patch_rng_tracker() -> None:
    """Megatron's tracker keeps per-name CUDA generator states; on CPU keep CPU ones."""
    import megatron.core.tensor_parallel.random as mp_random

    def get_state(device=-1, clone=False, graph_safe=False):
        return torch.get_rng_state()

    def set_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    def add(self, name, seed):
        self._is_initialized = True
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"rng state {name} already exists")
        self.seeds_.add(seed)
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    mp_random._get_cuda_rng_state = get_state
    mp_random._set_cuda_rng_state = set_state
    mp_random.CudaRNGStatesTracker.add = add
    mp_random.CudaRNGStatesTracker._audiollm_cpu = True
    # On CPU the forked generator IS the CPU generator, so megatron warns on every
    # fork that the CPU state changed inside the GPU context; that is expected here.
    logging.getLogger(mp_random.__name__).setLevel(logging.ERROR)


def _patch_cuda_device() -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.manual_seed = lambda seed: None
    torch.cuda.manual_seed_all = lambda seed: None


def activate() -> bool:
    """Enable the CPU layer when CUDA is absent. Returns whether it is active."""
    global _mode
    if torch.cuda.is_available():
        return False
    if _mode is None:
        _patch_rng_tracker()
        _patch_cuda_device()
        _mode = _CudaRequestsToCpu()
        _mode.__enter__()
    return True


def is_active() -> bool:
    if _mode is None:
        return False
    import megatron.core.tensor_parallel.random as mp_random

    return getattr(mp_random.CudaRNGStatesTracker, "_audiollm_cpu", False) and torch.cuda.current_device() == "cpu"


def require_active() -> None:
    """Refuse to run megatron on a CUDA-less machine without the compatibility layer."""
    if not torch.cuda.is_available() and not is_active():
        raise RuntimeError(
            "CUDA is not available and the CPU compatibility layer is not active: call "
            "orchestrator.runtime.cpu_compat.activate() before building megatron models"
        )
