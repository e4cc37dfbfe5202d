"""Every GPU recipe's model and first batch with the decisions its job makes on a GPU
machine, built on this CPU (run by tests/rehearsal/lent_machine.py inside the machine it
makes; argv[1]: the JSON list of data overrides of its tiny corpus).

For each GPU recipe, planned as a GPU run (bf16, the plan's GPU flags) with its model
shrunk to the tiny AudioLLM at TP = PP = CP = 1, and for two GPU machines — with
TransformerEngine but without apex (a common cluster image), and without either (the
lent machine) — the job's own start-up decisions (orchestrator/runtime/machine.decide:
gradient-accumulation fusion, attention kernel, compiled layers) go through the job's own code:
megatron_config.transformer_config -> AudioLLMProvider.build -> the loader's first
micro-batch (LoRA and the freezes applied as the trainer does) -> AudioLLMProvider.forward (no backward: torch has none for flex_attention
on a CPU). TransformerEngine's linears cannot be built here: the TE machine's model uses
megatron's, with the TE machine's decisions; the output layer, which refused the
fusion without apex (the first GPU run's crash), is megatron's on both.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from orchestrator.runtime.ports import free_port

# The default recipe too, as a one-GPU box runs it (launcher.accelerator=gpu): its encoder
# trains, and its adapter has the CTC head.
RECIPES = ("gemma2_whisper_tp4pp2", "gemma2_whisper_tp1", "gemma2_whisper_8k_cp2", "tiny_cpu")


def main(data_overrides: list) -> int:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    import torch

    from orchestrator.models.compile import compile_layers
    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import resolve
    from orchestrator.plan.parallel_dims import ParallelDims
    from orchestrator.runtime.distributed import init_distributed
    from orchestrator.runtime.machine import Machine, decide
    from orchestrator.train import megatron_config as mcfg
    from orchestrator.train.audiollm_provider import build_audiollm_components
    from orchestrator.train.lora import apply_lora
    from orchestrator.train.loop import freeze_model_parts

    init_distributed(ParallelDims(), seed=0)
    machines = {"GPU with TransformerEngine, no apex": Machine(cuda=True, transformer_engine=True,
                                                                 apex_gradient_fusion=False),
                "GPU without TransformerEngine": Machine(cuda=True, transformer_engine=False,
                                                         apex_gradient_fusion=False)}
    # LoRA freezes the decoder, which validation refuses at random weights: a placeholder
    # init_checkpoint (an empty dist-checkpoint directory) satisfies it; nothing is loaded
    # from it here (the job would load it at start; the training steps load a real one).
    placeholder = Path(tempfile.mkdtemp(prefix="placeholder_ckpt_"))
    (placeholder / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                            "common_backend": "torch", "common_backend_version": 1}))
    for recipe in RECIPES:
        overrides = [f"+recipe={recipe}", "model=tiny_audiollm", f"model.init_checkpoint={placeholder}", "launcher=local",
                     "launcher.accelerator=gpu", "launcher.nodes=1", "launcher.gpus_per_node=1", "parallel.tp=1",
                     "parallel.pp=1", "parallel.cp=1", "parallel.sp=false", "parallel.vpp=null", "data=demo",
                     "data.audio_token='<audio>'", *([] if recipe == "tiny_cpu" else ["model.adapter.ctc_weight=0"]),
                     *data_overrides, "optim.micro_batch_size=1", "optim.global_batch_size=1"]
        for label, machine in machines.items():
            backend = "te" if machine.transformer_engine else "local"
            with tempfile.TemporaryDirectory() as run_dir:
                resolved = resolve(compose([*overrides, f"model.backend={backend}"]))
                assert resolved.config["launcher"]["accelerator"] == "gpu" and resolved.megatron_args["bf16"]
                plan = resolved
                plan.run_dir = Path(run_dir)
                decisions = decide(plan.section("model"), machine, plan.dims,
                                   plan.transformer_fields.get("recompute_granularity"))
                # Built here with megatron's linears (no TransformerEngine on this CPU) and the
                # kernel the GPU job picks.
                plan.config["model"].update(backend="local", attention=decisions.attention)
                components = build_audiollm_components(plan, 0, 1)
                provider = components.provider
                config = mcfg.transformer_config(plan, True, decisions.gradient_accumulation_fusion)
                model = provider.build(config, True, True, None, decisions)
                # The trainer's order: build -> LoRA -> the model's freezes.
                adapted = apply_lora(model, plan.section("lora"), 0)
                freeze_model_parts([model], plan.section("model"))
                # The layers compiled as the job compiles them (model.compile=auto: on the
                # machine without TE), traced by dynamo alone (fullgraph: a break raises)
                # with this machine's transformers: transformers 5's output-capture hooks
                # broke the first GPU run's compiled encoder layers.
                compile_layers(model, decisions.compile, backend="eager")
                # megatron's bf16 optimizer keeps fp32 master weights of bf16 parameters and
                # its checkpoints hold no other: a trained fp32 adapter beside the bf16
                # decoder failed the first GPU run's first save (KeyError in
                # Float16OptimizerWithFloat16Params.sharded_state_dict; an assertion in the
                # distributed optimizer's).
                other = sorted({f"{name} {p.dtype}" for name, p in model.named_parameters()
                                if p.requires_grad and p.dtype != config.params_dtype})
                if other:
                    print(f"recipe {recipe} on a {label}: trained parameters not in {config.params_dtype}: "
                          f"{', '.join(other[:6])}{' ...' if len(other) > 6 else ''}", flush=True)
                    return 1
                attention = type(model.language_model.decoder.layers[0].self_attention.core_attention).__name__
                batch = components.train_source.next_microbatch()
                with torch.no_grad():
                    loss = provider.forward(model.eval(), batch)
                components.train_source.loader.close()
                finite = bool(torch.isfinite(loss.float()).all())
                print(f"recipe {recipe} on a {label}: {'; '.join(decisions.lines)}; built {attention} in "
                      f"{config.params_dtype}, {len(adapted)} LoRA linears; first batch {tuple(batch['tokens'].shape)} -> loss sum "
                      f"{float(loss.float().sum()):.3f} ({'finite' if finite else 'NOT FINITE'})", flush=True)
                if not finite:
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
