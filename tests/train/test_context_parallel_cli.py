"""Context parallelism through the real CLI: `audiollm train +recipe=tiny_cpu parallel.cp=2
launcher.gpus_per_node=2` on a mixture of transcription and two-clip conversations, then
`audiollm eval` of the CP run in one process; and the 8k-context CP recipe
(gemma2_whisper_8k_cp2) with its parallel settings kept and its model shrunk to the tiny
AudioLLM on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.data.conftest import CONVERSATION_COLUMNS, conversation_samples, write_mds
from tests.distributed_run import REPO
from tests.train.audiollm_runs import VAL_SAMPLES, VAL_SET, make_corpus, train_overrides

ITERS = 4


def _cli(cwd, *argv):
    proc = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", *argv], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore",
                                        "OMP_NUM_THREADS": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def _rows(run_dir) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    corpus = make_corpus(tmp_path_factory.mktemp("cp_cli_corpus"))
    write_mds(corpus / "train" / "conv", conversation_samples(16, seed=5), CONVERSATION_COLUMNS)
    return corpus


@pytest.mark.multiprocess
def test_tiny_cpu_at_cp2_trains_through_the_cli_and_decodes_as_one_process_does(corpus, tmp_path):
    train = (f"[{{name:tones_a,path:'{corpus / 'train' / 'tones_a'}'}},"
             f"{{name:conv,path:'{corpus / 'train' / 'conv'}',turns_field:turns}}]")
    overrides = [o for o in train_overrides(corpus) if not o.startswith("data.train=")]
    _cli(tmp_path, "train", "+recipe=tiny_cpu", "parallel.cp=2", "launcher.gpus_per_node=2", *overrides,
         f"data.train={train}", "data.seq_length=160", f"train.iters={ITERS}", f"train.eval_interval={ITERS}",
         "train.eval_generation=true", "run.name=cp2", f"run.output_root={tmp_path / 'outputs'}")
    (run_dir,) = [m.parent for m in (tmp_path / "outputs").rglob("metrics.jsonl")]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["world_size"], plan["cp"], plan["dp"]) == (2, 2, 1)
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, ITERS + 1))
    for name in ("tones_a", "conv"):  # both formats trained under CP, each a finite loss of its own
        losses = [r[f"loss/{name}"] for r in rows if f"loss/{name}" in r]
        assert losses and all(0 < x < 100 for x in losses), (name, losses)
    val_loss = rows[-1]["val_loss"]

    _cli(tmp_path, "eval", str(run_dir))
    evaluated = json.loads((run_dir / "eval" / f"step_{ITERS:06d}.json").read_text())
    assert evaluated["val_loss"] == pytest.approx(val_loss, abs=1e-5)  # the CP checkpoint at one process
    assert evaluated["wer/utterances"] == VAL_SAMPLES and evaluated[f"wer/{VAL_SET}"] == evaluated["wer/all"]
    # greedy decoding inside training at CP=2 (each CP rank answers half the samples) scores as one process does
    assert (rows[-1]["wer/utterances"], rows[-1]["wer/all"]) == (VAL_SAMPLES, evaluated["wer/all"]), rows[-1]


@pytest.mark.multiprocess
def test_the_8k_context_parallel_recipe_shrunk_to_the_tiny_model_trains(corpus, tmp_path):
    """gemma2_whisper_8k_cp2's parallel section as it is (CP=2, sequence parallel,
    distributed optimizer, full recompute; TP 4 -> 2: the tiny decoder has 2 KV heads) on
    4 CPU processes; the model, data and sizes shrunk to the tiny AudioLLM's."""
    shrink = ["model=tiny_audiollm", "model.backend=local", "model.init_checkpoint=null", "launcher=local",
              "launcher.accelerator=cpu", "launcher.gpus_per_node=4", "launcher.cpus_per_task=1", "parallel.tp=2",
              "data=demo", "data.audio_token='<audio>'"]
    _cli(tmp_path, "train", "+recipe=gemma2_whisper_8k_cp2", *shrink, *train_overrides(corpus),
         "optim.global_batch_size=2", "optim.micro_batch_size=1", f"train.iters={ITERS}", "train.eval_generation=false",
         "run.name=cp2_8k", f"run.output_root={tmp_path / 'outputs'}")
    (run_dir,) = [m.parent for m in (tmp_path / "outputs").rglob("metrics.jsonl")]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["tp"], plan["cp"], plan["dp"], plan["sp"]) == (2, 2, 1, True)
    assert plan["megatron_args"]["use_distributed_optimizer"] and plan["megatron_args"]["recompute_granularity"] == "full"
    assert " ".join(plan["argv"]).count("--cp-comm-type all_gather") == 1 and plan["cp"] == 2
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, ITERS + 1)) and all(0 < r["loss"] < 100 for r in rows)
