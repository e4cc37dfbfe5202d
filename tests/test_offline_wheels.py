"""`audiollm wheels`: which packages a GPU machine without internet is given."""

import importlib.metadata
import subprocess
import sys

from orchestrator.offline_wheels import job_side_closure, target_environment


def test_the_job_side_closure_has_the_jobs_packages_at_the_installed_versions_and_not_the_machines_torch():
    closure = job_side_closure("3.12")
    for needed in ("megatron-core", "hydra-core", "antlr4-python3-runtime", "omegaconf", "submitit", "transformers",
                   "mosaicml-streaming", "safetensors", "wandb", "jiwer", "soundfile", "numpy"):
        assert closure.get(needed) == importlib.metadata.version(needed), needed
    # transitive requirements are followed (hydra-core -> antlr4 above; streaming -> xxhash, zstd)
    assert {"xxhash", "zstd"} <= set(closure)
    left_out = [n for n in closure if n.startswith(("torch", "nvidia-", "cuda-")) or n in ("triton", "boto3", "oci")]
    assert left_out == [], left_out


def test_requirements_are_evaluated_for_the_target_python_not_this_one():
    assert target_environment("3.12")["python_version"] == "3.12"
    from packaging.markers import Marker

    only_old = Marker('python_version < "3.12"')
    assert only_old.evaluate({**target_environment("3.11"), "extra": ""})
    assert not only_old.evaluate({**target_environment("3.12"), "extra": ""})


def test_the_command_lists_without_downloading():
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "wheels", "unused", "--list"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "megatron-core==0.16.1" in proc.stdout.splitlines()
