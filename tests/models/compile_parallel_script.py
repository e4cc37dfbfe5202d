"""model.compile=layers under tensor, sequence and context parallelism on CPU (gloo), run by
tests/models/test_compile.py under torchrun on 2 ranks: first as TP = 2, then as CP = 2.

The layers' collectives (megatron's all-reduce, all-gather and reduce-scatter of TP and
SP; the key and value all-gather of CP) are traced into the compiled graphs
(orchestrator/models/compile.py: `traceable_linear`). For each case: the model compiled
with fullgraph=True by a counting dynamo backend (a graph break would raise), with the
reference attention forward and backward and with flex (the GPU kernel: a forward without
gradients, torch has no flex backward on CPU) against the same model eager; then, with
the reference attention, the model compiled by inductor (what a GPU run uses) against
the same model eager: per-token losses and every gradient. Full fine-tuning (the default
recipe: every linear's weight trains) and LoRA (gemma2_whisper_tp1: frozen linears).

Prints one `RESULT {json}` line per case from rank 0. With `traced`, only the cases whose
gradients come from the traced graphs run through AOT autograd, without inductor (the
rehearsal's, on the GPU machines' torch: tests/rehearsal/lent_machine.py).
"""

import json
import sys

import torch

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown
from tests.models.compile_script import SHRINK, build, inputs_of

LAYOUTS = {  # the 2 ranks' layout, as its overrides
    "tp": ["parallel.tp=2", "parallel.cp=1"],
    "cp": ["parallel.tp=1", "parallel.cp=2"],
}
NO_DRAWS = ["model.spec_augment.enabled=false", "model.adapter.dropout=0"]  # no random draw differs
FULL, LORA = "tiny_cpu", "gemma2_whisper_tp1"  # every weight trains; LoRA on frozen linears
# (recipe, parallel.sp, attention, backend) per layout: the graphs counted (reference, flex)
# and inductor against eager, with SP on; without SP inductor for full fine-tuning (its
# linears' own all-reduce) and flex's mask for LoRA's.
CASES = {
    "tp": [(recipe, "true", attention, backend) for recipe in (FULL, LORA)
           for attention, backend in (("reference", "counting"), ("flex", "counting"), ("reference", "inductor"))]
          + [(FULL, "false", "reference", "inductor"), (LORA, "false", "flex", "counting")],
    "cp": [(FULL, "false", "reference", "counting"), (FULL, "false", "reference", "inductor"),
           (LORA, "false", "flex", "counting"), (LORA, "false", "reference", "inductor")],
}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def case(recipe: str, layout: list, attention: str, backend) -> dict:
    """The recipe's model compiled with `backend` against the same weights eager."""
    from torch._dynamo.backends.debugging import aot_eager

    from orchestrator.models.compile import compile_layers

    torch._dynamo.reset()
    overrides = [f"+recipe={recipe}", "model.allow_frozen_random=true", *SHRINK, *layout, *NO_DRAWS]
    cfg, eager = build(overrides, attention)
    _, compiled = build(overrides, attention)
    compiled.load_state_dict(eager.state_dict())
    captured = []

    def counting(gm, example_inputs):
        # dynamo's graph counted, then run as AOT autograd traces it for inductor (forward
        # and backward graphs, not compiled): dynamo's graph run as it is, torch 2.11 gave
        # zero gradients for functional collectives in an autograd Function's backward
        captured.append(sum(node.op == "call_function" for node in gm.graph.nodes))
        return aot_eager(gm, example_inputs)

    layers = compile_layers(compiled, "layers", backend=counting if backend == "counting" else backend)
    inputs = inputs_of(cfg)
    losses, grads = {}, {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        if attention == "flex":  # forward only: torch has no flex backward on a CPU
            with torch.no_grad():
                losses[name] = model(**inputs)
            continue
        loss = model(**inputs)
        loss.sum().backward()
        losses[name] = loss.detach()
        grads[name] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    grad_rel = {n: rel(grads["compiled"][n], g) for n, g in grads.get("eager", {}).items()}
    return {"layers": layers, "graphs": len(captured), "ops": captured, "loss_rel": rel(losses["compiled"], losses["eager"]),
            "grad_rel": grad_rel, "grads": len(grad_rel), "sp": cfg.parallel.sp,
            "layer_input": list(inputs["input_ids"].shape)}


def main():
    from megatron.core import parallel_state

    for layout in LAYOUTS:  # one launch: the process group kept, megatron's groups made anew per layout
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        init_distributed(ParallelDims(tp=2) if layout == "tp" else ParallelDims(cp=2), seed=0)
        for recipe, sp, attention, backend in CASES[layout]:
            if "traced" in sys.argv[1:] and (attention, backend) != ("reference", "counting"):
                continue  # the rehearsal's cases: the traced graphs' gradients, without inductor's compile
            result = case(recipe, [*LAYOUTS[layout], f"parallel.sp={sp}"], attention, backend)
            if torch.distributed.get_rank() == 0:
                name = f"{layout}/{recipe}/sp={sp}/{attention}/{backend}"
                print("RESULT " + json.dumps({"case": name, **result}), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
