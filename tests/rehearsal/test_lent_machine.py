"""The lent GPU machine rehearsed on CPU (tests/rehearsal/lent_machine.py): a Python 3.12
virtual environment with torch 2.11, transformers 5.17 and numpy 2 as its python3, the
device kit installed into it as on that machine, the acceptance's dry run, every GPU
recipe's model (and the default recipe's, built for a GPU) and first batch with the
decisions its job makes on GPUs, every trained parameter in bf16, one training
step of every GPU recipe shrunk to the tiny model, and `audiollm convert` both ways on
transformers 5. The machine (torch 2.11 with its CUDA libraries, 5 GB) is made on the first
rehearsal on a machine and kept for the next ones (lent_machine.machine_dir): about 3.5 to 4.5
minutes with it made, about a minute less with it kept."""

import json
import shutil
import subprocess
import sys

import pytest

from tests.rehearsal.gpu_decisions_script import RECIPES
from tests.rehearsal.lent_machine import RECIPE_LAYOUT, REPO


@pytest.mark.rehearsal
@pytest.mark.timeout(2400)
def test_the_lent_machine_rehearsal_passes(tmp_path):
    root = tmp_path / "rehearsal"
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.rehearsal.lent_machine", "--keep", str(root)],
                              capture_output=True, text=True, cwd=REPO, timeout=2300)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the work folder; the machine itself is kept (machine_dir)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-10000:]
    report = json.loads(out[out.index("\n{") + 1: out.rindex("\n}") + 2])
    in_venv, torch_version, cuda, transformers_version, numpy_version = report["machine"].split()
    assert in_venv == "True" and torch_version.startswith("2.11.") and cuda == "False"
    assert transformers_version.startswith("5.") and numpy_version.startswith("2.")
    assert all(r["result"] == "PASS" or r["result"].startswith("n/a") for r in report["acceptance"])
    decided = report["gpu_decisions"]
    assert len(decided) == 2 * len(RECIPES) and all("(finite)" in line for line in decided), decided
    assert {line.split()[1] for line in decided} == set(RECIPES) >= set(RECIPE_LAYOUT)
    assert all("attention: flex" in line and "gradient-accumulation fusion: off" in line for line in decided)
    assert set(report["steps"]) == set(RECIPE_LAYOUT)
    assert report["convert_verify"]["ok"] and report["convert_verify"]["max_abs_logit_diff"] <= 1e-3
