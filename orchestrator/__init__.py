"""audiollm orchestrator.

Submit side (this package's top-level modules: cli, compose, schema, validate,
resolve, estimate, megatron_args, topology) never imports torch or megatron;
tests/test_submit_side_light.py enforces it. Job-side code lives in subpackages
(models/, data/, train/) and is imported only inside the training job.
"""

__version__ = "0.1.0"
