"""model.compile=layers on CPU, run by tests/models/test_compile.py under torchrun.

First, every recipe's decoder and encoder layers (each recipe shrunk to the tiny model, its LoRA
and freezes kept, at TP = CP = 1: tests/models/compile_parallel_script.py compiles the
parallel layouts) compiled whole with fullgraph=True by a counting dynamo backend, on a packed micro-batch
of the recipe's own making: with the reference attention a forward and backward, with
flex (the GPU kernel; torch has no flex backward on CPU) a forward without gradients.
fullgraph makes any graph break an error; the backend counts the graphs captured.

Then the default recipe's model, compiled by inductor (what a GPU run uses) against
the same model eager: per-token losses and every gradient; the compiled softcapped loss
alone in bf16 (what it keeps for the backward). Last, the host cost of a
micro-batch, eager and compiled (benchmarks/host_cost.py's own measurement, at the same
shapes, so that the compiled graphs of the parity case serve it).

Prints one `RESULT {json}` line per case.
"""

import contextlib
import json

import torch
from omegaconf import OmegaConf

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown

RECIPES = ("gemma2_whisper_tp4pp2", "gemma2_whisper_tp1", "gemma2_whisper_8k_cp2", "tiny_cpu")
# The recipes shrunk as the rehearsal shrinks them (the tiny model, local backend, CPU),
# with pretrained weights left out (random ones serve) and a short packed row.
SHRINK = ["model=tiny_audiollm", "model.backend=local", "launcher=local", "launcher.accelerator=cpu",
          "launcher.nodes=1", "data=demo", "data.audio_token='<audio>'", "model.adapter.ctc_weight=0",
          "model.init_checkpoint=null", "data.seq_length=128", "optim.micro_batch_size=2",
          "parallel.pp=1", "parallel.vpp=null", "parallel.cp=1", "model.compile=layers"]


def build(overrides, attention):
    """The recipe's model as the job transforms it: built, LoRA applied, parts frozen,
    layers compiled (orchestrator.train.loop.Trainer's order)."""
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import to_object
    from orchestrator.probe.role import AUDIO_TOKEN_ID
    from orchestrator.train.loop import freeze_model_parts
    from orchestrator.train.lora import apply_lora

    composed = compose(overrides)
    cfg = to_object(composed)
    model = build_audiollm(cfg.model, decoder_transformer_config(cfg.model.decoder, ParallelDims.of(cfg.parallel)),
                           audio_token_id=AUDIO_TOKEN_ID, attention=attention,
                           on_gpu=False).train()
    apply_lora(model, OmegaConf.to_container(composed.lora, resolve=True), seed=1234)
    freeze_model_parts([model], OmegaConf.to_container(composed.model, resolve=True))
    return cfg, model


def inputs_of(cfg):
    from orchestrator.probe.role import synthetic_microbatch
    from orchestrator.train.audiollm_provider import model_inputs, trimmed_width

    batch = synthetic_microbatch(cfg)
    return model_inputs(batch, trimmed_width(batch, cfg.parallel), "cpu")


def graphs() -> None:
    from orchestrator.models.compile import compile_layers

    layout = ["parallel.tp=1", "parallel.sp=false"]
    # every recipe with either attention, and the default recipe at micro-batch 1 (its
    # decoder input's batch dimension has size one)
    cases = [(recipe, attention, []) for recipe in RECIPES for attention in ("reference", "flex")]
    for recipe, attention, extra in cases + [("tiny_cpu", "reference", ["optim.micro_batch_size=1"])]:
        torch._dynamo.reset()
        cfg, model = build([f"+recipe={recipe}", *SHRINK, *layout, *extra], attention)
        captured = []

        def counting(gm, example_inputs):
            captured.append(sum(node.op == "call_function" for node in gm.graph.nodes))
            return gm.forward

        layers = compile_layers(model, cfg.model.compile, backend=counting)
        inputs = inputs_of(cfg)
        if attention == "reference":
            model(**inputs).sum().backward()
            trained = [p for p in model.parameters() if p.requires_grad]
            grads = sum(p.grad is not None for p in trained)
        else:
            with torch.no_grad():
                model(**inputs)
            trained, grads = [], 0
        print("RESULT " + json.dumps({
            "case": f"{recipe}/{attention}" + ("/mbs1" if extra else ""), "layers": layers, "graphs": len(captured),
            "ops": captured, "trained": len(trained), "grads": grads,
            "lora": bool(cfg.lora.rank)}), flush=True)


def parity() -> None:
    from orchestrator.models.compile import compile_layers

    overrides = ["+recipe=tiny_cpu", *SHRINK, "parallel.tp=1", "parallel.sp=false",
                 "model.spec_augment.enabled=false", "model.adapter.dropout=0"]  # no random draw differs
    cfg, eager = build(overrides, "reference")
    _, compiled = build(overrides, "reference")
    compiled.load_state_dict(eager.state_dict())
    layers = compile_layers(compiled, "layers")
    inputs = inputs_of(cfg)
    losses, kept = {}, {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        with saved_by_one_layer(model) as kept[name]:
            loss = model(**inputs)
        loss.sum().backward()
        losses[name] = loss.detach()
    grads = {name: (p.grad, dict(compiled.named_parameters())[name].grad)
             for name, p in eager.named_parameters() if p.grad is not None}
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))  # noqa: E731
    print("RESULT " + json.dumps({
        "case": "parity", "layers": layers, "loss": float(losses["eager"].sum()),
        "loss_rel": rel(losses["compiled"], losses["eager"]),
        "grad_rel": {name: rel(b, a) for name, (a, b) in grads.items()},
        "grads": len(grads), "layer_input": kept["compiled"]["input"],
        "layer_saved_bytes": {name: k["bytes"] for name, k in kept.items()}}), flush=True)


@contextlib.contextmanager
def saved_by_one_layer(model):
    """What the second decoder layer keeps for the backward during the forward inside:
    {"bytes": its saved tensors' storages (parameters excluded, each storage once),
    "input": the layer input's shape [s, b, h]}."""
    from orchestrator.models.compile import decoder_layers

    layer = decoder_layers(model)[1]
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages, found, inside = {}, {}, []

    def pack(tensor):
        storage = tensor.untyped_storage()
        if inside and storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def enter(module, args, kwargs):
        inside.append(True)
        found["input"] = list((args[0] if args else kwargs["hidden_states"]).shape)

    hooks = [layer.register_forward_pre_hook(enter, with_kwargs=True),
             layer.register_forward_hook(lambda module, args, output: inside.clear())]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield found
    finally:
        for hook in hooks:
            hook.remove()
    found["bytes"] = sum(storages.values())


def fused_loss() -> None:
    """The compiled softcapped loss in bf16, as a GPU runs it: what its forward keeps for
    the backward (eagerly: fp32 copies of the logits, recomputed per chunk), and its
    values and gradient against the same function eager."""
    from orchestrator.models.decoder_model import softcapped_cross_entropy

    b, s, v, real = 2, 48, 320, 300  # padding rows 300..319; labels outside [0, v) too
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(b, s, v, generator=gen) * 20).to(torch.bfloat16)
    labels = torch.randint(-1, real, (b, s), generator=gen)
    compiled = torch.compile(softcapped_cross_entropy, fullgraph=True, dynamic=False)
    results = {}
    for name, fn in (("eager", softcapped_cross_entropy), ("compiled", compiled)):
        x = logits.clone().requires_grad_()
        saved = []

        def pack(t):
            saved.append({"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")})
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = fn(x, labels, 30.0, real)
        loss.sum().backward()
        results[name] = (loss.detach(), x.grad.float(), saved)
    (loss_e, grad_e, saved_e), (loss_c, grad_c, saved_c) = results["eager"], results["compiled"]
    full = [b, s, v]
    print("RESULT " + json.dumps({
        "case": "fused_loss", "shape": full,
        "saved_eager": saved_e, "saved_compiled": saved_c,
        "loss_rel": float((loss_c - loss_e).abs().max() / loss_e.abs().max()),
        "grad_rel": float((grad_c - grad_e).abs().max() / grad_e.abs().max()),
        "padding_grad": float(grad_c[..., real:].abs().max())}), flush=True)


def main():
    init_distributed(ParallelDims(), seed=0)
    graphs()
    torch._dynamo.reset()
    parity()
    torch._dynamo.reset()
    fused_loss()
    from benchmarks.host_cost import measure

    for choice in ("none", "layers"):
        print("RESULT " + json.dumps({"case": f"host_cost/{choice}", **measure(choice)}), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
