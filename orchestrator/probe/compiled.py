"""The layers the job compiles (model.compile=layers), compiled in the probe too.

What a compiled layer keeps for its backward is the compiler's choice: its partitioner
(AOTAutograd's min-cut, the one inductor uses) recomputes cheap element-wise work in the
backward rather than keep its results, so a compiled layer keeps about a third less than
the eager one (docs/memory.md). The probe runs that same partitioner, with inductor's
decompositions, on the layers' graphs traced from fake tensors, and runs the partitioned
graphs as they are (inductor's kernels cannot run on fake tensors): each graph's outputs,
which for the forward are the layer's output and what it keeps for the backward, are
counted where the graph runs. What a graph makes and frees inside itself is not counted:
inductor fuses most of it away (a layer's transient buffers, a few hundred MiB at 9B
size, are what the count misses); run as traced, unfused, the softcapped loss's backward
alone would hold a dozen fp32 copies of the logits.

The probe's dispatch modes (live_memory, host_tensors) declare that compiled regions may
ignore them (`ignore_compile_internals`); where torch has no such declaration, dynamo
refuses to compile under them, and the probe steps eager layers (`supported`) and says so.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch


def supported() -> bool:
    """Whether this torch lets a compiled region run under the probe's dispatch modes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return hasattr(TorchDispatchMode, "ignore_compile_internals")


def counting_backend(memory_of: Callable):
    """A torch.compile backend: inductor's decompositions and partitioner, the partitioned
    graphs run as traced, their outputs counted by `memory_of()` (a LiveMemory, or None
    where nothing is measured yet)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.compile_fx import select_decomp_table

    def counted(graph: torch.fx.GraphModule, example_inputs):
        def run(args):
            memory = memory_of()
            if memory is None:
                return graph(*args)
            with memory.paused():  # the backward graph runs under the probe's modes; the forward does not
                out = graph(*args)
            return memory.count(out)

        run._boxed_call = True  # AOTAutograd's calling convention: the arguments as one list
        return run

    return aot_autograd(fw_compiler=counted, bw_compiler=counted, decompositions=select_decomp_table(),
                        partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"))
