"""What the job decides from the machine it runs on, and says in its first lines.

The plan is made on the submit side, which cannot see the GPU machine's installed
packages; these decisions are made by every rank at start, from the plan's `model`
section and what this machine has:

- attention kernel: `model.attention` (orchestrator.plan.kernels; auto: flex_attention on
  CUDA, the plain-PyTorch reference on CPU);
- gradient-accumulation fusion (the weight gradient accumulated into the fp32 main_grad
  inside the GEMM): on a GPU only where apex's `fused_weight_gradient_mlp_cuda` imports.
  megatron-core builds the output layer from its own `ColumnParallelLinear` on both
  backends, and that layer refuses the fusion without apex's kernel (megatron-core
  0.16.1, tensor_parallel/layers.py); TransformerEngine's linears could fuse without it,
  but megatron reads one config field for all of them;
- `model.compile`: layers compiles every decoder and encoder layer and, at TP 1, the loss
  (orchestrator.models.compile); auto does so on a GPU where the layout allows it
  (plan/kernels.compile_kind); said here beside the attention kernel it compiles around;
- `model.backend=te` needs TransformerEngine to import: without it the job stops at
  start, naming the fix, rather than building another model than planned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from orchestrator.plan.kernels import attention_kernel, compile_kind, loss_compiles


@dataclass(frozen=True)
class Machine:
    cuda: bool
    transformer_engine: bool
    apex_gradient_fusion: bool  # apex's fused_weight_gradient_mlp_cuda imports

    @classmethod
    def probe(cls) -> "Machine":
        import torch

        return cls(cuda=torch.cuda.is_available(), transformer_engine=_imports("transformer_engine.pytorch"),
                   apex_gradient_fusion=_imports("fused_weight_gradient_mlp_cuda"))


def _imports(module: str) -> bool:
    import importlib

    try:
        importlib.import_module(module)
        return True
    except Exception:  # TransformerEngine raises more than ImportError without its CUDA libraries
        return False


class MachineCannotRunPlan(RuntimeError):
    pass


@dataclass(frozen=True)
class Decisions:
    cuda: bool  # the model is built for a GPU (bf16 where planned, the GPU's kernels and encoder precision)
    attention: str  # "reference" | "flex"
    gradient_accumulation_fusion: bool
    compile: str  # model.compile resolved: "none" | "layers"
    lines: tuple  # what was decided and why, one line each

    def describe(self) -> str:
        return "\n".join(self.lines)


def decide(model: dict, machine: Machine, dims, recompute_granularity: Optional[str] = None) -> Decisions:
    """The job's decisions on `machine` for the plan's `model` section, its sizes (`dims`:
    orchestrator.plan.parallel_dims.ParallelDims) and its recompute granularity."""
    backend, choice = model.get("backend", "local"), model.get("attention", "auto")
    if backend == "te" and not (machine.cuda and machine.transformer_engine):
        missing = "CUDA" if not machine.cuda else "TransformerEngine (transformer_engine.pytorch does not import)"
        raise MachineCannotRunPlan(
            f"model.backend=te needs {missing} on this machine; install the `gpu` extra (docs/gpu-machines.md) "
            f"or plan the run with model.backend=local (megatron's linears; attention stays model.attention={choice})")
    attention = attention_kernel(choice, machine.cuda)
    if attention == "flex" and not machine.cuda:
        raise MachineCannotRunPlan("model.attention=flex trains on CUDA only (torch's flex_attention has no backward "
                                   "on CPU); use model.attention=reference or auto")
    fusion = machine.cuda and machine.apex_gradient_fusion
    if not machine.cuda:
        fusion_why = "CPU"
    elif fusion:
        fusion_why = "apex's fused_weight_gradient_mlp_cuda is installed"
    else:
        fusion_why = ("apex's fused_weight_gradient_mlp_cuda is not installed, and megatron's output layer "
                      "refuses the fusion without it")
    compiled, compile_why = compile_kind(model.get("compile", "auto"), machine.cuda, backend, recompute_granularity)
    loss_compiled = loss_compiles(dims.tp)
    lines = (
        f"linears/norms: {backend} backend" + (" (TransformerEngine)" if backend == "te" else " (megatron-core's own)"),
        f"attention: {attention} (model.attention={choice}, {'CUDA' if machine.cuda else 'CPU'})",
        f"gradient-accumulation fusion: {'on' if fusion else 'off'} ({fusion_why})",
        "compile: " + (("each decoder and encoder layer" + (" and the loss" if loss_compiled else "")
                        + ", fullgraph" + ("" if loss_compiled else "; the vocab-parallel loss eager (TP > 1)"))
                       if compiled == "layers" else "none, eager") + f" ({compile_why})",
    )
    return Decisions(cuda=machine.cuda, attention=attention, gradient_accumulation_fusion=fusion, compile=compiled,
                     lines=lines)


def device_name(device) -> str:
    """The device the figures were measured on, as a reader compares them: the GPU's
    model, or the CPU's with the threads torch uses."""
    import platform

    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    model = platform.processor() or platform.machine()
    try:  # Linux names the model here; platform.processor() says only x86_64
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu: {model}, {torch.get_num_threads()} threads"

