"""The rules of orchestrator/plan/validate.py, one module per group (findings, topology,
model, data, run, lora). Torch-free; the job side may import them (the entry points in
validate.py, with compose and resolve, it does not)."""
