"""Config -> Plan: a pure function from a validated config to what will run.

The Plan holds the Megatron argument set (Megatron-LM flag names), the model's
megatron-core fields (megatron_fields.py: the decoder's family translated once), what the
job implements or decides itself, the derived numbers (DP, micro-batches per
step, padded vocabulary, tokens per step), the rank layout and the estimates. The
launcher writes it to the run directory (plan.json) and the job builds its
megatron-core configs from it: what `audiollm plan` prints is what runs.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, replace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from orchestrator.plan.adapter_kinds import KIND_KEYS, setting
from orchestrator.plan import estimate as est
from orchestrator.plan.layout_estimate import estimate_layout
from orchestrator.plan.local_paths import absolute_data_paths
from orchestrator.plan.kernels import attention_kernel, encoder_precision, planned_compile
from orchestrator.plan.megatron_args import megatron_args, padded_vocab_size, plan_args, render_argv
from orchestrator.plan.megatron_fields import transformer_fields
from orchestrator.plan.schema import AudioLLMConfig
from orchestrator.plan.resolved import Plan
from orchestrator.plan.rules.findings import ERROR, ConfigInvalid, Finding
from orchestrator.plan.rules.topology import parallel_dims, world_size
from orchestrator.plan.validate import check, validate


def to_object(cfg: DictConfig | AudioLLMConfig) -> AudioLLMConfig:
    return OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg


ARGV_IMPLEMENTED_BY_AUDIOLLM = {
    "--apply-layernorm-1p": ("orchestrator/models/norms.py ZeroCenteredRMSNorm (local backend); "
                             "TransformerEngine's RMSNorm with zero_centered_gamma (te backend)"),
    "--window-size --window-attn-skip-freq": ("orchestrator/models/attention.py (windows by the family's layer "
                                              "pattern, softcap)"),
    "--cp-comm-type all_gather": ("orchestrator/models/attention.py (K/V gathered over the CP group, masks on "
                                  "global positions)"),
}


DECIDED_AT_START = {
    "gradient_accumulation_fusion": "on where apex's fused_weight_gradient_mlp_cuda imports, else off",
}


def encoder_precision_of(cfg: AudioLLMConfig) -> str:
    """model.encoder.precision on the planned accelerator (orchestrator/plan/kernels.py)."""
    return encoder_precision(cfg.model.encoder.precision, cfg.launcher.accelerator == "gpu")


def model_extensions(cfg: AudioLLMConfig, argv: list[str]) -> dict[str, Any]:
    """What the plan says of the model beside its megatron fields (Plan.transformer_fields):
    where the job implements flags of the argv itself, and what it decides or compiles."""
    on_gpu = cfg.launcher.accelerator == "gpu"
    return {
        # Flags of the argv that describe the model but that the job does not hand to
        # megatron-core: it switches them off there and implements them in its own
        # modules. Megatron-LM's own layer specs fed this argv build a different model.
        "implemented_by_audiollm": {flags: where for flags, where in ARGV_IMPLEMENTED_BY_AUDIOLLM.items()
                                    if flags.split()[0] in argv},
        # model.attention on the planned accelerator (orchestrator/plan/kernels.py); the memory
        # estimate counts this kernel's activations.
        "attention_kernel": attention_kernel(cfg.model.attention, on_gpu),
        "encoder_precision": encoder_precision_of(cfg),
        # model.compile on the planned accelerator: what the job compiles (it says so again at start).
        "compiled": planned_compile(cfg),
        # What the job decides on the machine it runs on (orchestrator/runtime/machine.py).
        "decided_at_start": dict(DECIDED_AT_START) if on_gpu else {},
        "encoder": asdict(cfg.model.encoder),
        # Its keys as the adapter's kind reads them: a null key its kind's default.
        "adapter": {**asdict(cfg.model.adapter), **{key: setting(cfg.model.adapter, key) for key in KIND_KEYS}},
    }


def unfit_memory_message(cfg: AudioLLMConfig, memory: est.MemoryEstimate) -> str:
    """Why a layout does not fit, naming every term of the estimate and what lowers it."""
    p, launcher, optim = cfg.parallel, cfg.launcher, cfg.optim
    terms = {"weights": memory.weights_gib, "grads": memory.grads_gib, "optimizer": memory.optimizer_gib,
             "activations": memory.activations_gib}
    largest = max(terms, key=terms.get)

    def value(v) -> str:  # as an override writes it
        return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

    return (f"the plan estimates {memory.total_gib:.1f} GiB per GPU on pipeline stage {memory.stage} (weights "
            f"{memory.weights_gib:.1f} + grads {memory.grads_gib:.1f} + optimizer {memory.optimizer_gib:.1f} + "
            f"activations {memory.activations_gib:.1f} + margin {memory.overhead_gib:.1f}; largest: {largest}) "
            f"against {memory.device_gib:.1f} GiB of launcher.gpu_type={launcher.gpu_type}: the job would run out of "
            f"memory. Lower it (optim.micro_batch_size={optim.micro_batch_size}, "
            f"parallel.recompute.granularity={value(p.recompute.granularity)}, parallel.tp={p.tp}, parallel.pp={p.pp}, "
            f"parallel.distributed_optimizer={value(p.distributed_optimizer)}; `audiollm plan -m` ranks the layouts "
            f"that fit), or set launcher.allow_unfit_memory=true to submit it anyway")


def resolve(cfg: DictConfig | AudioLLMConfig, purpose: str = "plan", keep_errors: bool = False) -> Plan:
    """Validate (raises validate.ConfigInvalid on any error) and resolve `cfg`. With
    keep_errors, the errors go into Plan.errors instead and as much is resolved as they
    allow (a missing init_checkpoint does not hide the topology, memory and argv); a
    setting that leaves nothing to compute still raises, from wherever it breaks."""
    obj = to_object(cfg)
    if keep_errors:
        everything = validate(obj, purpose)
        findings: list[Finding] = [f for f in everything if f.severity != ERROR]
        errors = [str(f) for f in everything if f.severity == ERROR]
    else:
        findings, errors = check(obj, purpose), []
    if obj.model.init_checkpoint:
        # The job loads exactly the checkpoint planned (a run directory's latest step now).
        from orchestrator.plan.checkpoint_dirs import resolve_model_checkpoint

        obj.model.init_checkpoint = resolve_model_checkpoint(obj.model.init_checkpoint)[0]
    absolute_data_paths(obj.data)
    p, launcher, optim = obj.parallel, obj.launcher, obj.optim
    dims = parallel_dims(p, launcher)
    if dims.dp is None:  # kept errors: the sizes do not tile the ranks; shown on as many as they fill
        dims = replace(dims, dp=world_size(launcher) // dims.model_parallel)
    dp = dims.dp
    gpu = launcher.accelerator == "gpu"
    fields = transformer_fields(obj.model, p, on_gpu=gpu)
    args = megatron_args(obj.model, p, obj.data, optim, obj.train, on_gpu=gpu, dp=dp, fields=fields)
    argv = render_argv(args)
    planned_args = plan_args(args)
    inventory = est.inventory_for(obj)
    stages = est.stage_params(inventory, obj.model, p, encoder_fp32=encoder_precision_of(obj) == "fp32")
    num_microbatches = optim.global_batch_size // (optim.micro_batch_size * dp)
    by_stage = est.memory_by_stage(obj, stages, dp, num_microbatches)
    memory = max(by_stage, key=lambda estimate: estimate.total_gib)
    if not memory.fits and not launcher.allow_unfit_memory:
        unfit = Finding(ERROR, "memory", unfit_memory_message(obj, memory))
        if not keep_errors:
            raise ConfigInvalid([*findings, unfit])
        errors.append(str(unfit))
    memory_at_cp1 = None
    if p.cp > 1:
        without_cp = copy.deepcopy(obj)
        without_cp.parallel.cp = 1
        at_cp1 = est.memory_per_gpu(without_cp, stages, dp * p.cp,
                                    max(1, optim.global_batch_size // (optim.micro_batch_size * dp * p.cp)))
        memory_at_cp1 = asdict(at_cp1) | {"fits": at_cp1.fits}
    flops = est.flops_per_step(obj, inventory)
    step_estimate = None
    if gpu:
        step_estimate = asdict(estimate_layout(obj, inventory, stages, dp, num_microbatches,
                                               overlap_grad_reduce=bool(planned_args.get("overlap_grad_reduce"))))
    return Plan(
        recipe=obj.recipe,
        dims=dims,
        num_microbatches=num_microbatches,
        padded_vocab_size=padded_vocab_size(obj.model.decoder.vocab_size, p.tp),
        tokens_per_step=optim.global_batch_size * obj.data.seq_length,
        megatron_args=planned_args,
        argv=argv,
        transformer_fields=fields,
        model_extensions=model_extensions(obj, argv),
        rank_layout=dims.mesh().as_dict(),
        parameters={
            "total": est.parameter_totals(inventory),
            "per_rank_by_stage": [asdict(s) | {"total": s.total} for s in stages],
        },
        memory=asdict(memory) | {"fits": memory.fits, "by_stage": [asdict(m) | {"fits": m.fits} for m in by_stage]},
        memory_at_cp1=memory_at_cp1,
        flops=asdict(flops),
        step_estimate=step_estimate,
        warnings=[str(f) for f in findings],
        config=asdict(obj),  # the typed config as plain values (as OmegaConf.to_container gives them, 100x faster)
        errors=errors,
    )
