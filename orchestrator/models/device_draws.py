"""The decoder's random initialisation drawn on the GPU, the same weights at any TP size.

megatron with `use_cpu_initialization` (decoder_config.build_transformer_config sets it) draws each
full master weight in fp32 on the host, then keeps this rank's tensor-parallel split: TP=1
and TP=2 start from the same weights. torch draws normals on the host in one thread, about
180 M values/s whatever the cores: some 50 s for a 9B decoder, at every launch that draws
(the first of a run) on every rank. `draw_on_device` keeps megatron's path and its split
but draws each full master weight on the GPU, from one generator seeded alike on every
rank (its seed drawn from the host generator every rank seeded with train.seed, so each
model chunk built gets its own), then copies it to the host tensor megatron splits: the
same weights at every TP size, in seconds. The draws differ from a CPU run's of the same
seed (another generator); nothing compares those: CPU and GPU runs already differ in dtype
and kernels. The staging blocks (the largest a full fp32 embedding, 3.7 GB for Gemma2's
vocabulary) go back to the driver after the build (build_audiollm).
"""

from __future__ import annotations

import torch

# The init methods megatron's layers draw their weights with (TransformerConfig fields).
INIT_METHODS = ("init_method", "output_layer_init_method", "embedding_init_method")


def draw_on_device(config, device: torch.device) -> None:
    """Make `config`'s init methods draw on `device`, writing into the host tensor megatron
    hands them; their generator's seed is the next draw of the host's (seeded alike on
    every rank), as the host draws would have continued from it."""
    seed = int(torch.randint(2**62, (1,)).item())
    generator = torch.Generator(device=device).manual_seed(seed)
    for name in INIT_METHODS:
        init = getattr(config, name, None)
        if init is not None:
            setattr(config, name, _staged(init, device, generator))


def _staged(init, device: torch.device, generator: torch.Generator):
    """`init` (one of torch.nn.init's functions, as megatron's init_method_normal makes it)
    applied to a device copy of the host tensor, with `generator`; the result copied back."""

    def draw(weight: torch.Tensor) -> torch.Tensor:
        staged = torch.empty(weight.shape, dtype=weight.dtype, device=device)
        init(staged, generator=generator)
        with torch.no_grad():
            weight.copy_(staged)
        return weight

    return draw
