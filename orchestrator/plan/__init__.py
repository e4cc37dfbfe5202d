"""The planning side: a composed config becomes a Plan before anything runs.

compose (Hydra + schema/) -> validate (every rule, all errors at once) -> resolve (the
Plan: Megatron argv, derived numbers, the estimates of estimate.py, step_flops.py and
model_params.py) -> report / probe_report (what `audiollm plan` prints). Beside them:
the shared knowledge the job reads from the Plan (tasks, kernels, topology,
megatron_args), the run directory's files (rundir) and checkpoint directories
(checkpoint_dirs). Nothing here imports torch, megatron, the job side or launchers.
"""
