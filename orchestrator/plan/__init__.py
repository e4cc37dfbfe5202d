"""The planning side: a composed config becomes a Plan before anything runs.

compose (Hydra + schema/) -> validate (every rule, all errors at once) -> resolve (the
Plan of resolved.py: Megatron argv, the sizes of parallel_dims.py, derived numbers, the
estimates of estimate.py, step_flops.py and model_params.py) -> report / probe_report
(what `audiollm plan` prints). Beside them: the shared knowledge the job reads with the
Plan (resolved.Plan.load, tasks, kernels, topology, megatron_args), the run directory's
files (rundir) and checkpoint directories (checkpoint_dirs). Nothing here imports
megatron, the job side or launchers; nothing imports torch when planning (the one torch
import, in step_flops.StepFlops.batch_items, runs on the job's batches only). The job
side imports none of compose, validate and resolve (tests/orchestrator/test_layering.py).
"""
