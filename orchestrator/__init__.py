"""audiollm orchestrator: from a YAML config to a trained AudioLLM.

The tree follows the flow of one run, and imports point one way:

    cli.py      the `audiollm` command line (routes each command to its module)
    plan/       config -> Plan: schema, compose, validate, resolve, estimate, reports;
                never imports torch or megatron (tests/test_submit_side_light.py)
    (launchers/, beside this package: local and SLURM submission, the rank's job wrapper)
    train/ models/ data/ eval/ convert/ runtime/ probe/
                the job side: what runs on every rank, and the tools that load its
                checkpoints; it reads the Plan and never imports cli or launchers

tests/orchestrator/test_layering.py states the directions.
"""

__version__ = "0.1.0"
