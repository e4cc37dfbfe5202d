"""model.compile=layers under tensor parallelism on CPU (gloo), run by
tests/models/test_compile.py under torchrun on 2 ranks (TP = 2, no sequence parallelism:
validation refuses compiled layers with SP or CP, whose gathers' traced backward gave
wrong gradients under torch 2.11).

megatron's TP all-reduces are traced into the compiled graphs (orchestrator/models/
compile.py: `traceable_linear`). For each case: the model compiled with fullgraph=True by
a counting dynamo backend (a graph break would raise), with the reference attention
forward and backward and with flex (the GPU kernel: a forward without gradients, torch
has no flex backward on CPU) against the same model eager; then, with the reference
attention, the model compiled by inductor (what a GPU run uses) against the same model
eager: per-token losses and every gradient. Full fine-tuning (the default recipe: every
linear's weight trains) and LoRA (gemma2_whisper_tp1: frozen linears).

Prints one `RESULT {json}` line per case from rank 0.
"""

import json

import torch

from orchestrator.runtime.distributed import ParallelSizes, init_distributed, shutdown
from tests.models.compile_script import SHRINK, build, inputs_of

LAYOUT = ["parallel.tp=2", "parallel.sp=false", "parallel.cp=1"]
NO_DRAWS = ["model.spec_augment.enabled=false", "model.adapter.dropout=0"]  # no random draw differs
# (recipe, attention, backend): every weight trains (tiny_cpu) or LoRA on frozen linears
CASES = [(recipe, attention, backend) for recipe in ("tiny_cpu", "gemma2_whisper_tp1")
         for attention, backend in (("reference", "counting"), ("flex", "counting"), ("reference", "inductor"))]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def case(recipe: str, layout: list, attention: str, backend) -> dict:
    """The recipe's model compiled with `backend` against the same weights eager."""
    from orchestrator.models.compile import compile_layers

    torch._dynamo.reset()
    overrides = [f"+recipe={recipe}", "model.allow_frozen_random=true", *SHRINK, *layout, *NO_DRAWS]
    cfg, eager = build(overrides, attention)
    _, compiled = build(overrides, attention)
    compiled.load_state_dict(eager.state_dict())
    captured = []

    def counting(gm, example_inputs):
        captured.append(sum(node.op == "call_function" for node in gm.graph.nodes))
        return gm.forward

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
    init_distributed(ParallelSizes(tp=2), seed=0)
    for recipe, attention, backend in CASES:
        result = case(recipe, LAYOUT, attention, backend)
        if torch.distributed.get_rank() == 0:
            print("RESULT " + json.dumps({"case": f"{recipe}/{attention}/{backend}", **result}), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
