"""`audiollm train` on a mixture of three formats through the real CLI: transcription
behind data.prompt_template (with the joint CTC loss), a dataset with its own template,
answer column and per-sample instructions, and two-clip conversations; each validation
dataset scored by its own metric (WER, exact match, BLEU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.data.conftest import (CONVERSATION_COLUMNS, INSTRUCTED_COLUMNS, INSTRUCTED_TEMPLATE, conversation_samples,
                                 instructed_samples, write_mds)
from tests.distributed_run import REPO
from tests.train.audiollm_runs import VAL_SET, make_corpus, train_overrides

ITERS = 3


def _cli(cwd, *argv):
    return subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", *argv], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore",
                                        "OMP_NUM_THREADS": "1"})


@pytest.mark.multiprocess
def test_mixture_of_asr_own_template_and_conversations_trains_and_scores_each_task(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    write_mds(corpus / "train" / "own", instructed_samples(16, seed=4), INSTRUCTED_COLUMNS)
    write_mds(corpus / "train" / "conv", conversation_samples(16, seed=5), CONVERSATION_COLUMNS)
    write_mds(corpus / "val" / "own_val", instructed_samples(4, seed=6), INSTRUCTED_COLUMNS)
    write_mds(corpus / "val" / "conv_val", conversation_samples(4, seed=7), CONVERSATION_COLUMNS)
    template = INSTRUCTED_TEMPLATE.replace("\n", "\\n")
    own = f"prompt_template:'{template}',instruction_field:instruction,text_field:answer"
    train = (f"[{{name:tones_a,path:'{corpus / 'train' / 'tones_a'}'}},"
             f"{{name:own,path:'{corpus / 'train' / 'own'}',{own}}},"
             f"{{name:conv,path:'{corpus / 'train' / 'conv'}',turns_field:turns}}]")
    validation = (f"[{{name:{VAL_SET},path:'{corpus / 'val' / VAL_SET}'}},"
                  f"{{name:own_val,path:'{corpus / 'val' / 'own_val'}',{own},metric:exact,normaliser:whisper_english}},"
                  f"{{name:conv_val,path:'{corpus / 'val' / 'conv_val'}',turns_field:turns,metric:bleu}}]")
    overrides = [o for o in train_overrides(corpus) if not o.startswith(("data.train=", "data.validation="))]
    overrides += [f"data.train={train}", f"data.validation={validation}", f"train.iters={ITERS}",
                  f"train.eval_interval={ITERS}", f"train.save_interval={ITERS}", "train.eval_generation=true",
                  # A validation-loss batch of each dataset (they take turns).
                  "train.eval_iters=3", "data.seq_length=160",
                  "run.name=multitask", f"run.output_root={tmp_path / 'outputs'}"]
    proc = _cli(tmp_path, "train", *overrides)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    (run_dir,) = [m.parent for m in (tmp_path / "outputs").rglob("metrics.jsonl")]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, ITERS + 1))
    for name in ("tones_a", "own", "conv"):  # every format trained (a finite loss of its own)
        losses = [r[f"loss/{name}"] for r in rows if f"loss/{name}" in r]
        assert losses and all(0 < x < 100 for x in losses), (name, losses)
    final = rows[-1]
    assert {f"val_loss/{n}" for n in (VAL_SET, "own_val", "conv_val")} <= set(final), sorted(final)
    # Each validation dataset by its metric, generation prompted with its own format.
    assert f"wer/{VAL_SET}" in final and "exact/own_val" in final and "bleu/conv_val" in final, sorted(final)
    assert "wer/own_val" not in final and "wer/conv_val" not in final
    assert final["exact/utterances"] == 4 and final["bleu/utterances"] == 4
    last_eval = [line for line in out.splitlines() if line.startswith(f"eval at step {ITERS}:")]
    assert last_eval and "exact" in last_eval[0] and "BLEU" in last_eval[0], out[-3000:]
    # `audiollm eval RUN_DIR` prompts each validation dataset with its own format and
    # scores it by its own metric, from the saved checkpoint.
    proc = _cli(tmp_path, "eval", str(run_dir))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    evaluated = json.loads((run_dir / "eval" / f"step_{ITERS:06d}.json").read_text())
    assert {f"wer/{VAL_SET}", "exact/own_val", "bleu/conv_val", "wer/all", "exact/all", "bleu/all"} <= set(evaluated)
    assert "wer/own_val" not in evaluated and "wer/conv_val" not in evaluated
    assert evaluated["exact/utterances"] == 4 and evaluated["bleu/utterances"] == 4
    # Each figure names its normaliser and scorer; the decoding speed beside them.
    from orchestrator.scoring.normalisers import normaliser, scorer

    scoring = evaluated["scoring"]
    assert {n: (s["metric"], s["normaliser"], s["scorer"]) for n, s in scoring.items()} == {
        VAL_SET: ("wer", "audiollm", scorer("wer")), "own_val": ("exact", "whisper_english", scorer("exact")),
        "conv_val": ("bleu", None, scorer("bleu"))}
    for name in (VAL_SET, "own_val", "conv_val"):
        assert scoring[name]["rtfx"] == evaluated[f"rtfx/{name}"] > 0 and scoring[name]["audio_seconds"] > 0
        assert scoring[name]["device"].startswith("cpu: ") and scoring[name]["batch_samples"] >= 1
        assert evaluated[f"rtfx_batch/{name}"] == scoring[name]["batch_samples"]
    assert evaluated["rtfx/all"] > 0
    assert "RTFx after a warm-up batch on cpu: " in proc.stdout and "own_val exact under whisper_english" in proc.stdout
    # Every answer kept, raw and normalised beside the reference: rescoring them gives the figures.
    kept = [json.loads(line) for line in
            (run_dir / "eval" / "hypotheses" / f"step_{ITERS:06d}.jsonl").read_text().splitlines()]
    by_set = {n: [k for k in kept if k["dataset"] == n] for n in (VAL_SET, "own_val", "conv_val")}
    assert [len(by_set[n]) for n in by_set] == [evaluated["wer/utterances"], 4, 4]
    english = normaliser("whisper_english")
    assert all(k["normaliser"] == "whisper_english" and k["hypothesis_normalised"] == english(k["hypothesis"])
               and k["reference_normalised"] == english(k["reference"]) for k in by_set["own_val"])
    assert evaluated["exact/own_val"] == sum(k["reference_normalised"] == k["hypothesis_normalised"]
                                             for k in by_set["own_val"]) / 4
    assert all(k["hypothesis_normalised"] is None for k in by_set["conv_val"])  # BLEU scores the raw strings
    from orchestrator.scoring import metrics

    rescored = metrics.statistics("wer", [k["reference"] for k in by_set[VAL_SET]],
                                  [k["hypothesis"] for k in by_set[VAL_SET]])
    assert metrics.score("wer", rescored) == evaluated[f"wer/{VAL_SET}"]
