"""The job's start-up decisions (orchestrator/runtime/machine.py) for the machines users
have: a CPU, a GPU with TransformerEngine, a GPU without it (the lent machine: no TE,
no apex), and the plan's record that the GPU decision is the job's."""

import pytest

from orchestrator.plan.compose import compose
from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.plan.resolve import resolve
from orchestrator.runtime import machine as machine_module
from orchestrator.runtime.machine import Machine, MachineCannotRunPlan

CPU = Machine(cuda=False, transformer_engine=False, apex_gradient_fusion=False)
GPU_BARE = Machine(cuda=True, transformer_engine=False, apex_gradient_fusion=False)
GPU_TE = Machine(cuda=True, transformer_engine=True, apex_gradient_fusion=False)
GPU_TE_APEX = Machine(cuda=True, transformer_engine=True, apex_gradient_fusion=True)
ONE = {"tp": 1, "cp": 1, "recompute": {"granularity": None}}  # the parallel section of a one-GPU layout


def decide(model: dict, machine: Machine, parallel: dict):
    """The job's decisions for a parallel section: its sizes and recompute, as the job
    passes them from the Plan."""
    dims = ParallelDims(tp=parallel.get("tp", 1), cp=parallel.get("cp", 1), sp=parallel.get("sp", False))
    return machine_module.decide(model, machine, dims, parallel["recompute"]["granularity"])


def test_gradient_accumulation_fusion_needs_apex_on_either_backend():
    """megatron's output layer is its own ColumnParallelLinear on both backends and refuses
    the fusion without apex's kernel: TE alone does not turn it on."""
    assert not decide({"backend": "local"}, CPU, ONE).gradient_accumulation_fusion
    assert not decide({"backend": "local"}, GPU_BARE, ONE).gradient_accumulation_fusion
    assert not decide({"backend": "te"}, GPU_TE, ONE).gradient_accumulation_fusion
    assert decide({"backend": "te"}, GPU_TE_APEX, ONE).gradient_accumulation_fusion
    lines = decide({"backend": "te"}, GPU_TE, ONE).describe()
    assert "gradient-accumulation fusion: off" in lines and "fused_weight_gradient_mlp_cuda is not installed" in lines


@pytest.mark.parametrize("machine, choice, kernel", [
    (CPU, "auto", "reference"), (GPU_BARE, "auto", "flex"), (GPU_BARE, "reference", "reference"),
    (GPU_TE, "flex", "flex"),
])
def test_attention_kernel_follows_the_choice_and_the_device(machine, choice, kernel):
    decisions = decide({"backend": "local", "attention": choice}, machine, ONE)
    assert decisions.attention == kernel
    assert f"attention: {kernel} (model.attention={choice}" in decisions.describe()


@pytest.mark.parametrize("machine, model, parallel, compiled, why", [
    (GPU_BARE, {"backend": "local"}, ONE, "layers", "model.compile=auto, CUDA"),
    (CPU, {"backend": "local"}, ONE, "none", "model.compile=auto, CPU"),
    (GPU_TE, {"backend": "te"}, ONE, "none", "not with model.backend=te"),
    (GPU_BARE, {"backend": "local"}, {**ONE, "tp": 4}, "layers", "model.compile=auto, CUDA"),
    (GPU_BARE, {"backend": "local"}, {**ONE, "tp": 4, "sp": True}, "layers", "model.compile=auto, CUDA"),
    (GPU_BARE, {"backend": "local"}, {**ONE, "cp": 2}, "layers", "model.compile=auto, CUDA"),
    (GPU_BARE, {"backend": "local"}, {**ONE, "recompute": {"granularity": "selective"}}, "none",
     "not with parallel.recompute.granularity=selective"),
    (GPU_BARE, {"backend": "local", "compile": "none"}, ONE, "none", "model.compile=none"),
    (CPU, {"backend": "local", "compile": "layers"}, ONE, "layers", "model.compile=layers"),
])
def test_compile_auto_compiles_the_layers_on_gpus_where_the_layout_allows(machine, model, parallel, compiled, why):
    decisions = decide(model, machine, parallel)
    assert decisions.compile == compiled
    said = decisions.describe().splitlines()[-1]
    assert why in said
    # under TP the vocabulary is split over the ranks and megatron's vocab-parallel loss stays eager
    assert ("and the loss" in said) == (compiled == "layers" and parallel.get("tp", 1) == 1), said


def test_what_this_machine_cannot_run_stops_the_job_naming_the_fix():
    with pytest.raises(MachineCannotRunPlan, match="TransformerEngine.*model.backend=local"):
        decide({"backend": "te"}, GPU_BARE, ONE)
    with pytest.raises(MachineCannotRunPlan, match="needs CUDA"):
        decide({"backend": "te"}, CPU, ONE)
    with pytest.raises(MachineCannotRunPlan, match="no backward on CPU"):
        decide({"backend": "local", "attention": "flex"}, CPU, ONE)


def test_the_plan_leaves_the_fusion_to_the_job_on_gpus_and_turns_it_off_on_cpus():
    gpu = resolve(compose(["+recipe=gemma2_whisper_8k_cp2", "model.init_checkpoint=null", "model.encoder.freeze=false"]))
    assert gpu.megatron_args["gradient_accumulation_fusion"] is None
    assert "--no-gradient-accumulation-fusion" not in gpu.argv
    assert "gradient_accumulation_fusion" in gpu.model_extensions["decided_at_start"]
    assert gpu.model_extensions["attention_kernel"] == "flex"
    cpu = resolve(compose(["+recipe=tiny_cpu"]))
    assert cpu.megatron_args["gradient_accumulation_fusion"] is False and "--no-gradient-accumulation-fusion" in cpu.argv
    assert cpu.model_extensions["decided_at_start"] == {} and cpu.model_extensions["attention_kernel"] == "reference"
