"""megatron-core imported without its import-time compilation on a machine without CUDA.

`megatron.core.jit` sets `jit_fuser = torch.compile` when imported, and megatron's fused
element-wise functions (fused_bias_geglu and its siblings) are decorated with it as
megatron.core's package import reaches them: the first decoration imports torch._dynamo
and inductor, about 2 s of every process's start on a 2-core machine (3 s while another
process competes for the cores), paid by every rank of every CPU run and test. On a
machine without CUDA none of those functions runs: the job turns megatron's fusions off
there (orchestrator/train/megatron_config.py `_CPU_FIELDS`). megatron's own
`disable_jit_fuser()` comes too late, since importing megatron.core.jit runs the package
import first. So there, the first import of megatron.core runs with torch.compile
standing for the identity decorator, the value `disable_jit_fuser()` would set, and
torch.compile is restored right after (a later `torch.compile` call of the project's
own, `model.compile`, is the real one). Likewise wandb (0.7 s): megatron imports it, if
present, for its inference engine's and its timers' W&B writers, which the job never uses
(its own logger imports wandb when a run logs there); during that first import `import
wandb` fails as if wandb were absent, which megatron handles. With CUDA, megatron is
imported as it is.

The job-side packages that use megatron (models, train, convert, probe) call this from
their `__init__`, before any of their modules imports megatron.
"""

from __future__ import annotations

import sys


def import_megatron() -> None:
    if "megatron.core" in sys.modules:
        return
    import torch

    if torch.cuda.is_available():
        return
    real = torch.compile

    def identity(model=None, **kwargs):
        return model if model is not None else (lambda fn: fn)

    torch.compile = identity
    wandb_loaded = "wandb" in sys.modules
    if not wandb_loaded:
        sys.modules["wandb"] = None  # `import wandb` raises ImportError
    try:
        import megatron.core.jit  # noqa: F401  (megatron.core and its fusions with it)
        import megatron.core.timers  # noqa: F401
    finally:
        torch.compile = real
        if not wandb_loaded:
            del sys.modules["wandb"]
