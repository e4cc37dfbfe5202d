"""`audiollm eval` and `audiollm transcribe`: a run's checkpoints scored on its validation
sets (evaluate: the job entry, one process or torchrun; checkpoint_table: the table and the
best checkpoint; arguments), and recordings answered by a run or an exported model
directory (transcribe, transcribers). They load what training wrote through the trainer
(orchestrator/train) and score with orchestrator/scoring.
"""
