"""A fine-tune of a released speech LLM as users run it, against a plain HF + torch loop on
the released class: torchrun --nproc_per_node=2 tests/models/released_curve_script.py KIND HF_DIR RUN_DIR

HF_DIR: a tiny random VoxtralForConditionalGeneration or Qwen2AudioForConditionalGeneration
(tests/models/tiny_models.py); RUN_DIR: a run directory whose plan.json (composed and
resolved as `audiollm train` does) starts from its conversion (model.init_checkpoint), with
LoRA on the decoder (lora=decoder_r16: its rank, alpha and lr groups, the projector at half
the rate), the encoder frozen, at TP 2 with sequence parallelism, one unpacked micro-batch a
step, train.iters steps.

The project's side is the job's own Trainer (orchestrator/train/entry.make_trainer: the
plan's data loader, the init checkpoint, LoRA, freezes, lr groups, megatron's DDP, optimizer
and schedule) stepped train.iters times; each micro-batch its loader yields is kept. The HF
side, on rank 0: the released class loaded from HF_DIR, the same LoRA written out on its
modules (one A shared by q, k and v, and by gate and up, as the project's fused linears
have it; the B of each part its rows of the fused B; A drawn as the project draws it, B
zero), the same parameters trained at the same rates (torch.optim.AdamW, the recipe's
schedule written out, no weight decay on biases and 1-D weights, the gradient norm clipped)
on the kept micro-batches: their ids, their clips' log-mel features padded to the encoder's
window (Qwen2-Audio: with its mask of each clip's frames), the mean loss over the trained
tokens. Prints `CURVE {json}` from rank 0."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from tests.models.training_curve_script import lr_at


class KeptBatches:
    """The train source as the Trainer reads it, each micro-batch kept (on every rank)."""

    def __init__(self, source):
        self.source, self.kept = source, []

    def next_microbatch(self) -> dict:
        batch = self.source.next_microbatch()
        self.kept.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()})
        return batch

    def __getattr__(self, name):
        return getattr(self.source, name)


def project_curve(run_dir: str) -> tuple:
    from orchestrator.train.audiollm_provider import build_audiollm_components
    from orchestrator.train.entry import make_trainer

    kept = []

    def components(plan, dp_rank, dp_size):
        built = build_audiollm_components(plan, dp_rank, dp_size)
        built.train_source = KeptBatches(built.train_source)
        kept.append(built.train_source)
        return built

    trainer = make_trainer(run_dir, components)
    losses = [trainer.train_step()["loss"] for _ in range(trainer.train_iters)]
    return losses, kept[0].kept, trainer.plan


class SharedLora:
    """The project's LoRA on the HF decoder's linears: y += (alpha / rank) B_part (A x), one A
    per megatron linear (linear_qkv: q, k, v; linear_fc1: gate, up; linear_proj: o;
    linear_fc2: down), one B per HF linear."""

    PARTS = {"linear_qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")),
             "linear_proj": ("self_attn", ("o_proj",)),
             "linear_fc1": ("mlp", ("gate_proj", "up_proj")),
             "linear_fc2": ("mlp", ("down_proj",))}
    MEGATRON = {"linear_qkv": "self_attention", "linear_proj": "self_attention", "linear_fc1": "mlp",
                "linear_fc2": "mlp"}

    def __init__(self, decoder_layers, lora: dict, seed: int):
        import math

        from orchestrator.train.lora import _seeded_full

        rank, self.scale = int(lora["rank"]), float(lora["alpha"]) / int(lora["rank"])
        self.params = []
        for i, layer in enumerate(decoder_layers):
            for linear in lora["targets"]:
                block, parts = self.PARTS[linear]
                modules = [getattr(getattr(layer, block), part) for part in parts]
                name = f"language_model.decoder.layers.{i}.{self.MEGATRON[linear]}.{linear}"
                a = torch.nn.Parameter(_seeded_full((rank, modules[0].in_features), seed, name + ".lora_a",
                                                    1.0 / math.sqrt(modules[0].in_features)))
                self.params.append(a)
                for module in modules:
                    b = torch.nn.Parameter(torch.zeros(module.out_features, rank))
                    self.params.append(b)
                    module.weight.requires_grad_(False)
                    if module.bias is not None:
                        module.bias.requires_grad_(False)
                    module.register_forward_hook(self._hook(a, b))

    def _hook(self, a, b):
        def add(module, args, output):
            return output + self.scale * torch.nn.functional.linear(torch.nn.functional.linear(args[0], a), b)
        return add


def hf_inputs(kind: str, batch: dict, window: int) -> dict:
    """The released class's inputs of one of the project's micro-batches (unpacked rows)."""
    features = batch["audio_features"]
    padded = torch.nn.functional.pad(features, (0, window - features.shape[-1]))
    inputs = dict(input_ids=batch["tokens"], input_features=padded)
    if kind == "qwen2_audio":  # its processor's mask of each clip's own frames
        inputs["feature_attention_mask"] = (torch.arange(window)[None] < batch["audio_lengths"][:, None]).long()
    return inputs


def hf_curve(kind: str, hf, batches: list, plan) -> list:
    optim, lora_cfg = plan.section("optim"), plan.section("lora")
    scales = {g["name"]: float(g["lr_scale"]) for g in lora_cfg["lr_groups"]}
    for p in hf.parameters():
        p.requires_grad_(False)
    lora = SharedLora(hf.language_model.model.layers, lora_cfg, plan.seed)
    projector = list(hf.multi_modal_projector.named_parameters())
    for _, p in projector:
        p.requires_grad_(True)
    groups = []
    for params, scale in ((lora.params, scales["lora"]), ([p for _, p in projector], scales["adapter"])):
        decayed = [p for p in params if p.dim() > 1]
        plain = [p for p in params if p.dim() <= 1]
        groups += [{"params": decayed, "weight_decay": float(optim["weight_decay"]), "scale": scale},
                   {"params": plain, "weight_decay": 0.0, "scale": scale}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=float(optim["lr"]),
                            betas=(float(optim["adam_beta1"]), float(optim["adam_beta2"])), eps=float(optim["adam_eps"]))
    trained = [p for g in groups for p in g["params"]]
    window = 2 * int(plan.section("model")["encoder"]["max_source_positions"])
    hf.train()
    losses = []
    for step, batch in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, optim, len(batches), group["scale"])
        logits = hf(**hf_inputs(kind, batch, window)).logits
        token_loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(),
                                                       reduction="none")
        mask = batch["loss_mask"].flatten().float()
        loss = (token_loss * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, float(optim["clip_grad"]))
        opt.step()
        losses.append(loss.item())
    return losses


def main(kind: str, hf_dir: str, run_dir: str) -> None:
    import transformers

    from orchestrator.plan.released_models import RELEASED
    from orchestrator.runtime.distributed import shutdown

    losses, batches, plan = project_curve(run_dir)
    if dist.get_rank() == 0:
        hf = getattr(transformers, RELEASED[kind].hf_class).from_pretrained(hf_dir, torch_dtype=torch.float32,
                                                                           attn_implementation="eager")
        reference = hf_curve(kind, hf, batches, plan)
        print("CURVE " + json.dumps({"case": kind, "project": losses, "hf": reference,
                                     "packed": [bool(b["packed"]) for b in batches]}), flush=True)
    shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
