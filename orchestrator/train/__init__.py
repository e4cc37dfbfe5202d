"""Job side: the training runtime that runs on every rank.

entry.main(run_dir)      the job (launchers call it on every rank); entry.build_components is
                         the default components factory, the trainer's plug-in point
evaluate.main(run_dir)   validation of a run's checkpoint (`audiollm eval RUN_DIR`)
megatron_config          TransformerConfig / OptimizerConfig / DDP config / LR schedule from the Plan
                         (orchestrator/plan/resolved.py, read with Plan.load)
components               the ModelProvider and BatchSource interfaces the loop uses
audiollm_provider        the AudioLLM + MDS train/validation loaders implementing them (the default)
lora                     LoRA on megatron tensor-parallel linears (and plain linears), merge for export
lr_groups                lora.lr_groups -> megatron optimizer param groups
loop                     the Trainer: model transforms, DDP, optimizer, steps, eval, checkpoints
checkpoint               dist_checkpointing save/load, atomic publication, keep-last-K
metrics                  loss statistics, throughput/MFU (peak from the device name), W&B, console, loss curve
"""

from orchestrator.runtime.megatron_import import import_megatron

import_megatron()  # first, before any module here imports megatron (see there why)

