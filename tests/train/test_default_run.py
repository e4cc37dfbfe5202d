"""README's first command, `audiollm train` with no arguments, on a small corpus: it
writes the espeak-ng demo corpus (none exists yet), trains the tiny AudioLLM with the
real trainer through the local launcher, and prints the validation WER at the end."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.distributed_run import REPO

ITERS = 6

VALIDATION_SETS = ("digits_heldout_accent", "sentences_heldout_accent", "digits_heldout_variant",
                   "sentences_heldout_variant")
NUMERALS_SETS = ("numerals_heldout_accent", "numerals_heldout_variant")  # the second task: exact match


@pytest.mark.multiprocess
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the demo corpus is spoken by espeak-ng (apt-get install -y espeak-ng)")
def test_default_command_makes_the_demo_corpus_trains_and_prints_wer(tmp_path):
    corpus = tmp_path / "demo_data"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "AUDIOLLM_DEMO_DATA": str(corpus),
           "OMP_NUM_THREADS": "1"}
    # The default recipe, made small: 64 training utterances, a few steps, one batch per
    # validation set for the loss and for the WER.
    overrides = ["data.demo_corpus_samples=64", f"train.iters={ITERS}", "optim.lr_warmup_iters=2", "train.eval_interval=3",
                 "train.eval_iters=1", "train.eval_generation_batches=1", "train.log_interval=1"]
    proc = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "train", *overrides],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "holds no corpus yet: synthesizing 64 training utterances" in out
    # A quiet console: the corpus as one line per dataset, one line on the CPU path, then
    # progress; libraries' notices (missing TransformerEngine/Apex, deprecations, the
    # rerun state machine, submitit's own) are kept in the rank log, not printed.
    assert "train/digits_us" in out and '"samples"' not in out
    assert out.count("CPU path:") == 1, out[-4000:]
    noise = [line for line in out.splitlines() if "Warning" in line or "WARNING" in line
             or line.startswith(("submitit INFO", "  warnings.warn"))]
    assert noise == [], noise
    manifest = json.loads((corpus / "manifest.json").read_text())
    assert manifest["num_samples"] == 64
    # The end of the run: the last step's evaluation line, with the WER of every
    # validation set (voices never heard in training).
    last_eval = [line for line in out.splitlines() if line.startswith(f"eval at step {ITERS}:")]
    assert last_eval, out[-4000:]
    for name in VALIDATION_SETS + NUMERALS_SETS:
        assert name in last_eval[0]
    assert " | exact " in last_eval[0]
    (run_dir,) = (tmp_path / "outputs" / "tiny_cpu").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, ITERS + 1))
    # The time each step waited for its micro-batches is logged, and is part of the step.
    assert all(0 < r["data_wait_s"] < r["step_time_s"] for r in rows)
    assert all(" | data wait " in line for line in out.splitlines() if line.startswith("[#") or line.startswith("[."))
    evaluated = [r for r in rows if "wer/all" in r]
    assert [r["step"] for r in evaluated] == [3, ITERS]
    # A WER per validation set, on the utterances decoded (a few steps do not transcribe
    # yet: the WER bound of a working model is in tests/models/test_generate.py)
    assert all(r["wer/utterances"] > 0 and all(f"wer/{name}" in r for name in VALIDATION_SETS) for r in evaluated)
    assert all(r["exact/utterances"] > 0 and all(f"exact/{name}" in r for name in NUMERALS_SETS)
               and not any(f"wer/{name}" in r for name in NUMERALS_SETS) for r in evaluated)
    # Both tasks train: a loss per training dataset, the numerals twins included.
    for name in ("digits_us", "numerals_us", "numerals_gb"):
        assert any(f"loss/{name}" in r for r in rows), (name, sorted(rows[-1]))
    assert (run_dir / "loss_curve.png").stat().st_size > 0
    rank_log = (run_dir / "logs" / "rank0.log").read_text()
    assert "rerun_state_machine WARNING" in rank_log  # kept, not lost (this test ignores Python warnings)
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{ITERS:06d}"
    # The console ends with the run's summary: where it is, each metric final and best,
    # the plot, the wall time, what to run next.
    summary = proc.stdout[proc.stdout.index("run finished: "):].strip().splitlines()  # the end of stdout
    assert re.fullmatch(rf"run finished: {ITERS} steps in \dm\d\ds since it was submitted", summary[0]), summary
    assert summary[1] == f"  run directory  {run_dir}"
    for label, key, scale in (("val_loss", "val_loss", 1), ("WER", "wer/all", 100), ("exact", "exact/all", 100)):
        line = next(line for line in summary if line.startswith(f"  {label} "))
        final = [r[key] for r in rows if key in r][-1]
        assert f"final {scale * final:.{4 if label == 'val_loss' else 1}f}" in line and "best " in line, line
    assert f"  loss curve     {run_dir / 'loss_curve.png'}" in summary
    assert f"  next           audiollm eval {run_dir}" in summary
    assert any("audiollm convert megatron-to-hf" in line for line in summary)
    assert "Fine-tuning demo" in summary[-1]
    # The GPU acceptance reads the same run's metrics so (benchmarks/gpu_acceptance.py
    # default_run_row: README's first command on a GPU against this CPU's figures).
    from benchmarks.gpu_acceptance import CPU_DEFAULT_RUN, DEFAULT_RUN_WER_FACTOR, default_run_row

    figure, result = default_run_row(rows, ITERS)
    last = evaluated[-1]
    assert figure.startswith(f"held-out WER {last['wer/all']:.1%}, numerals exact {last['exact/all']:.1%} "
                             f"at step {ITERS}"), figure
    assert result == ("PASS" if last["wer/all"] <= DEFAULT_RUN_WER_FACTOR * CPU_DEFAULT_RUN["wer/all"] else "FAIL")
    assert default_run_row(rows[:-1], ITERS)[1] == "FAIL"  # a run that stopped short of its last evaluation
