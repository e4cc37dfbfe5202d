"""`audiollm wheels`: which packages a GPU machine without internet is given."""

import importlib.metadata
import subprocess
import sys

import pytest

from launchers.offline_wheels import job_side_closure, target_environment


def test_the_job_side_closure_has_the_jobs_packages_at_the_installed_versions_and_not_the_machines_torch():
    closure = job_side_closure("3.12")
    for needed in ("megatron-core", "hydra-core", "antlr4-python3-runtime", "omegaconf", "submitit", "transformers",
                   "mosaicml-streaming", "safetensors", "wandb", "jiwer", "soundfile", "miniaudio", "numpy"):
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


def test_the_kit_leaves_out_what_a_gpu_image_brings_and_wandb_and_matplotlib():
    """--kit: torch, transformers, numpy and everything they require (by the installed
    metadata) stay with the machine; wandb and matplotlib and what only they need are left
    out; the job side's own packages are all there."""
    from launchers.offline_wheels import kit_closure, machine_brings

    brought = machine_brings(python="3.12")
    assert {"torch", "transformers", "numpy", "tokenizers", "safetensors", "huggingface-hub"} <= brought
    kit = kit_closure("3.12")
    for needed in ("megatron-core", "hydra-core", "omegaconf", "antlr4-python3-runtime", "mosaicml-streaming",
                   "submitit", "soundfile", "miniaudio", "jiwer", "xxhash", "zstd", "psutil"):
        assert kit.get(needed) == importlib.metadata.version(needed), needed
    assert not brought & set(kit), brought & set(kit)
    assert "wandb" not in kit and "protobuf" not in kit  # protobuf: wandb's alone here
    assert "wandb" in kit_closure("3.12", with_wandb=True)
    # matplotlib (loss_curve.png) with its fonts and images; pillow came only with it
    assert not {"matplotlib", "fonttools", "kiwisolver", "pillow"} & set(kit)
    assert {"matplotlib", "fonttools", "kiwisolver", "pillow"} <= set(kit_closure("3.12", with_matplotlib=True))
    with_peft = kit_closure("3.12", with_peft=True)  # the acceptance's HF + PEFT rows
    assert {"peft", "accelerate"} <= set(with_peft) and not brought & set(with_peft)


def test_a_kit_root_not_installed_here_is_named_in_one_line():
    """`--with-peft` where peft is missing (setup.sh without --test) stops with what to run,
    not importlib's traceback."""
    from launchers.offline_wheels import _closure

    with pytest.raises(SystemExit, match=r"no-such-package-here is not installed here.*setup.sh --test"):
        _closure(["no-such-package-here"], "3.12", lambda name: False, include_roots=True)


def test_torchvision_is_paired_with_the_machines_torch():
    from launchers.offline_wheels import torchvision_for

    assert torchvision_for("2.11.0") == "0.26.0"
    assert torchvision_for("2.14.1+cu130") == "0.29.1"


def test_the_machines_torchvision_comes_with_what_it_imports_and_not_the_machines_torch():
    """--machine-torch: torchvision imports pillow at import (mosaicml-streaming imports
    torchvision), and a kit without matplotlib has no other way to bring it."""
    from launchers.offline_wheels import kit_closure, with_machine_torchvision

    kit = kit_closure("3.12")
    with_vision = with_machine_torchvision(kit, "2.11.0")
    assert with_vision["torchvision"] == "0.26.0"
    assert set(with_vision) - set(kit) == {"torchvision", "pillow"}
    assert with_vision["pillow"] == importlib.metadata.version("pillow")
