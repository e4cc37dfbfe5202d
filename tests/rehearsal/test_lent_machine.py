"""The lent GPU machine rehearsed on CPU (tests/rehearsal/lent_machine.py): a Python 3.12
virtual environment with torch 2.11, transformers 5.17 and numpy 2 as its python3, the
device kit installed into it as on that machine, the acceptance's dry run (every row
passes or is n/a, and its parity figures are within their fp32 bounds), every GPU
recipe's model (and the default recipe's, built for a GPU) and first batch with the
decisions its job makes on GPUs, every trained parameter in bf16, one training
step of every GPU recipe shrunk to the tiny model, `audiollm convert` both ways on
transformers 5, and the probe compiling a plan's layers on torch 2.11. The machine (torch
2.11 with its CUDA libraries, 5 GB) is made on the first rehearsal on a machine and kept
for the next ones (lent_machine.machine_dir): about 3.5 to 4.5 minutes with it made, about
a minute less with it kept."""

import json
import shutil
import subprocess
import sys

import pytest

from benchmarks.gpu_session import PARTS
from tests.rehearsal.gpu_decisions_script import RECIPES
from tests.rehearsal.lent_machine import RECIPE_LAYOUT, REPO
from tests.tolerances import FP32_REORDER

# benchmarks/gpu_acceptance.py's rows: each passes or is n/a in its dry run, where the lent
# machine's stack runs it through benchmarks/gpu_session.py (the rehearsal's step 4).
ACCEPTANCE_ROWS = {"parity_logits", "parity_loss", "parity_grads", "lora_trains", "lora_base_frozen", "recompiles",
                   "throughput_tokens", "throughput_mfu", "peak_memory", "hf_peft_tokens", "hf_peft_ratio",
                   "generation", "encoder_fp32", "encoder_bf16", "features_device", "fp8", "job_default",
                   "job_distributed_optimizer", "job_lora", "job_2b", "job_9b", "job_9b_mfu", "job_9b_memory",
                   "default_run"}


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
    groups = report["session_groups"]  # (part, group, exit): every group of every part ran and exited 0
    assert [(part, group) for part, group, _ in groups] == [(p, g.name) for p in sorted(PARTS) for g in PARTS[p]]
    assert all(code == 0 for _, _, code in groups), groups
    # What comes back from a lent machine: at most eight files a call; the 9B job's
    # profiled step among them (the 2b's dry run plans only).
    files = report["session_files"]
    assert all(len(names) <= 8 for names in files.values()), files
    assert {"profile_job9b/ops.txt", "profile_job9b/trace.json.gz"} <= set(files["1"]), files
    rows = report["acceptance"]
    assert ACCEPTANCE_ROWS <= {r["check"] for r in rows}, rows
    by_check = {r["check"]: r for r in rows}
    # job_2b plans its full size in a dry run and passes that (its training is job_9b's dry run)
    assert by_check["job_2b"]["result"] == "PASS (n/a: trains as job_9b's dry run)", by_check["job_2b"]
    others = [r for r in rows if r["check"] != "job_2b"]
    assert all(r["result"] == "PASS" or r["result"].startswith("n/a") for r in others), others
    assert by_check["recompiles"]["result"].startswith("n/a")
    # The job rows trained (the tiny model on the CPU, through the same path), not n/a.
    assert all(by_check[c]["result"] == "PASS" for c in ("job_default", "job_distributed_optimizer", "job_lora",
                                                          "job_9b")), [r for r in rows if r["check"].startswith("job")]
    # The parity figures themselves, against the fp32 bounds the script states.
    figure = lambda check: by_check[check]["figure"]  # noqa: E731
    assert float(figure("parity_logits").split()[-1]) <= 1e-4
    assert float(figure("parity_loss").split()[1]) <= 1e-5
    grads = dict(part.split() for part in figure("parity_grads").split(", "))
    assert set(grads) == {"embedding", "final_norm"} and all(float(v) <= 1e-4 for v in grads.values()), grads
    decided = report["gpu_decisions"]
    assert len(decided) == 2 * len(RECIPES) and all("(finite)" in line for line in decided), decided
    assert {line.split()[1] for line in decided} == set(RECIPES) >= set(RECIPE_LAYOUT)
    assert all("attention: flex" in line and "gradient-accumulation fusion: off" in line for line in decided)
    assert set(report["steps"]) == set(RECIPE_LAYOUT)
    assert report["convert_verify"]["ok"] and report["convert_verify"]["max_abs_logit_diff"] <= 1e-3
    assert report["probe_compiled"].startswith("the probe compiles the layers as the job does")
    traced = {r["case"]: r for r in report["compiled_parallel"]}
    assert set(traced) == {"tp/tiny_cpu/sp=true/reference/counting", "tp/gemma2_whisper_tp1/sp=true/reference/counting",
                           "cp/tiny_cpu/sp=false/reference/counting"}, traced
    for name, result in traced.items():
        worst = max(result["grad_rel"].items(), key=lambda item: item[1])
        assert result["grads"] > 70 and result["loss_rel"] <= FP32_REORDER and worst[1] <= FP32_REORDER, (name, worst)
