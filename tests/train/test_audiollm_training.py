"""The real AudioLLM trained by the job entry's components (orchestrator.train.entry
.build_components -> AudioLLMProvider + the MDS loader) on a tiny tone corpus made
here, at TP=2 and at PP=2 over gloo, from plans made by the real planner."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.distributed_run import REPO
from tests.train.audiollm_runs import VAL_SAMPLES, make_corpus, write_audiollm_run_dir
from tests.train.jobs import launch, metrics, result

ITERS = 12


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("audiollm_corpus"))


def _falls(losses: list) -> bool:
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    return last < 0.8 * first


def _check_run(out: dict, run_dir, world: int) -> None:
    losses = out["losses"]
    assert len(losses) == ITERS and all(loss == loss for loss in losses), losses
    assert _falls(losses), f"loss did not fall: {losses}"
    assert [m["loss"] for m in metrics(run_dir)] == losses
    ranks = out["ranks"]
    assert len(ranks) == world
    for rank, info in enumerate(ranks):
        frozen = set(info["frozen"])
        unchanged = [n for n, c in info["changes"].items() if n not in frozen and c == 0.0]
        assert not unchanged, f"rank {rank}: trainable parameters that did not change: {unchanged}"
        assert all(c == 0.0 for n, c in info["changes"].items() if n in frozen), f"rank {rank} moved frozen weights"
    # One validation dataset: its loss is the overall validation loss (both are means
    # over target tokens).
    assert out["eval"]["val_loss"] == pytest.approx(out["eval"]["val_loss/tones_val"], rel=1e-9), out["eval"]


SAVE_AT = 6  # checkpoints at steps 6 and 12 (the resume test kills the job after step 6)


@pytest.fixture(scope="module")
def tp2_straight(corpus, tmp_path_factory):
    """One straight TP=2 run, shared by the training and the resume test."""
    root = tmp_path_factory.mktemp("tp2_straight")
    run_dir = write_audiollm_run_dir(root / "tp2", corpus, tp=2, iters=ITERS, save_interval=SAVE_AT)
    return run_dir, result(launch("job_script.py", 2, "train", str(run_dir), log_dir=root))


@pytest.mark.multiprocess
def test_audiollm_trains_at_tp2_and_pp2(corpus, tp2_straight, tmp_path):
    """TP=2 (one sample per row) and PP=2 (packed rows), 2 processes each: the loss falls
    over 12 steps; every trainable parameter moves on every rank; TP ranks agree on every
    replicated weight (encoder, adapter, norms), and the PP stages agree on the tied
    embedding / output weight."""
    tp_dir, tp_out = tp2_straight
    _check_run(tp_out, tp_dir, 2)
    rank0, rank1 = (r["digests"] for r in tp_out["ranks"])
    assert sorted(rank0) == sorted(rank1)
    replicated = [n for n in rank0 if n.startswith(("encoder.", "adapter.")) or "layernorm" in n]
    trained = [n for n in replicated if tp_out["ranks"][0]["changes"].get(n, 0) > 0]
    assert len(replicated) > 10 and len(trained) > 10, sorted(rank0)
    assert [n for n in replicated if rank0[n] != rank1[n]] == []  # the same bits on both TP ranks
    sharded = [n for n in rank0 if "linear_fc1" in n or "linear_qkv" in n]
    assert sharded and all(rank0[n] != rank1[n] for n in sharded)  # (the digests tell different shards apart)
    # DDP, the schedule and every layer read one TransformerConfig, the Plan's (its TP size included)
    assert all(r["one_config"] for r in tp_out["ranks"])

    # The auxiliary CTC loss needs pp=1 (orchestrator/plan/rules/run.check_ctc); the TP=2 run trains with it.
    pp_dir = write_audiollm_run_dir(tmp_path / "pp2", corpus, pp=2, iters=ITERS,
                                    extra=["data.packing=true", "model.adapter.ctc_weight=0"])
    pp_out = result(launch("job_script.py", 2, "train", str(pp_dir), log_dir=tmp_path))
    _check_run(pp_out, pp_dir, 2)
    first, last = (r["changes"] for r in pp_out["ranks"])
    assert any(n.startswith("encoder.") for n in first) and not any(n.startswith("encoder.") for n in last)
    assert first["language_model.embedding.word_embeddings.weight"] > 0
    assert all(r["one_config"] for r in pp_out["ranks"])
    first, last = (r["digests"] for r in pp_out["ranks"])  # the tied weight: the same bits on both stages
    assert first["language_model.embedding.word_embeddings.weight"] == last["language_model.output_layer.weight"]
    print("TP2 losses", tp_out["losses"])
    print("PP2 losses", pp_out["losses"])


@pytest.mark.multiprocess
def test_audiollm_exact_resume_with_the_real_loader(corpus, tp2_straight, tmp_path):
    """TP=2: 6 steps, a hard process exit after step 6's checkpoint, 6 resumed steps
    give the straight run's loss at every step (model, optimizer, RNG and the MDS
    loader's position and packer buffer all restored), with no random init drawn for
    the weights the checkpoint overwrites. This run reads in a data worker
    (data.num_workers=1), the straight one in the training process; in both one rank
    reads and sends its TP peer the micro-batches (data.replica_reader)."""
    _, straight = tp2_straight
    run_dir = write_audiollm_run_dir(tmp_path / "tp2_resumed", corpus, tp=2, iters=ITERS, save_interval=SAVE_AT,
                                     extra=["data.num_workers=1"])
    launch("job_script.py", 2, "kill", str(run_dir), str(SAVE_AT), log_dir=tmp_path, expect_rc=17)
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, SAVE_AT + 1))
    resumed_out = launch("job_script.py", 2, "train", str(run_dir), log_dir=tmp_path)
    resumed = result(resumed_out)
    # the checkpoint overwrites every weight: the resumed job skipped megatron's random init
    assert "random initialisation skipped" in resumed_out
    again = [m["loss"] for m in metrics(run_dir)]
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, ITERS + 1))
    assert again == straight["losses"], [(i + 1, a, b) for i, (a, b) in enumerate(zip(straight["losses"], again))
                                         if a != b]
    assert resumed["losses"] == straight["losses"][SAVE_AT:]
    print("step, straight loss, killed-and-resumed loss:",
          [(i + 1, a, b) for i, (a, b) in enumerate(zip(straight["losses"], again))])
    assert resumed["eval"] == straight["eval"]


@pytest.mark.multiprocess
def test_audiollm_eval_reshards_tp2_to_one_process_and_scores_wer(tp2_straight):
    """`audiollm eval RUN_DIR --ctc-weight 0.5 --examples 3` on the TP=2 run (trained with
    the CTC loss, so its adapter has the head): one process loads the last checkpoint at
    TP=1, reproduces the training's final validation loss, decodes every validation
    utterance with joint CTC/attention scores for a word error rate and writes the first
    three (reference, answer) pairs."""
    run_dir, straight = tp2_straight
    proc = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; "
                           f"sys.exit(main(['eval', {str(run_dir)!r}, '--ctc-weight', '0.5', '--examples', '3']))"],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "random initialisation skipped" in proc.stderr  # the checkpoint overwrites it
    evaluated = json.loads((run_dir / "eval" / f"step_{ITERS:06d}.json").read_text())
    assert evaluated["val_loss"] == pytest.approx(straight["eval"]["val_loss"], abs=1e-5)
    assert evaluated["wer/utterances"] == VAL_SAMPLES
    assert evaluated["eval_generation_ctc_weight"] == 0.5  # the command's, not the recipe's 0.3
    (name, pairs), = evaluated["examples"].items()  # --examples 3: the first 3 (reference, answer) pairs
    assert name == "tones_val" and len(pairs) == 3 and all(isinstance(ref, str) and ref for ref, _ in pairs), pairs
    # One validation set: the pooled WER is that set's. (12 steps on transcripts that do
    # not follow the audio cannot transcribe: the WER of a model that does, and of one
    # that outputs nothing, is checked in tests/models/test_generate.py.)
    assert evaluated["wer/tones_val"] == evaluated["wer/all"]


def test_audiollm_eval_refuses_joint_ctc_decoding_of_a_model_without_the_head(corpus, tmp_path, capsys):
    """Before anything is loaded, naming both weights."""
    from orchestrator.eval.evaluate import main

    no_head = write_audiollm_run_dir(tmp_path / "no_head", corpus,
                                     extra=["model.adapter.ctc_weight=0", "train.eval_generation_ctc_weight=0"])
    assert main([str(no_head), "--ctc-weight", "0.3"]) == 2
    err = capsys.readouterr().err
    assert "--ctc-weight 0.3" in err and "model.adapter.ctc_weight > 0 (its is 0.0)" in err, err


def scores_only(report: dict) -> dict:
    """An eval JSON without what depends on the machine's speed (RTFx and the timings)."""
    return {k: v for k, v in report.items() if k not in ("checkpoint", "scoring") and not k.startswith("rtfx")}


@pytest.mark.multiprocess
def test_eval_all_scores_each_kept_checkpoint_once_names_the_best_and_exports_it(tp2_straight, tmp_path):
    """`audiollm eval RUN --all` on the TP=2 run (checkpoints at steps 6 and 12), in one
    process: each checkpoint scored as `audiollm eval --checkpoint` scores it alone, the
    table over steps, its plot and the best checkpoint written; run again, it scores
    nothing; `convert megatron-to-hf --step best` exports the one it chose."""
    import shutil

    source, straight = tp2_straight
    run_dir = tmp_path / source.name
    shutil.copytree(source, run_dir, symlinks=True, ignore=shutil.ignore_patterns("eval"))

    def cli(*argv):
        proc = subprocess.run([sys.executable, "-c", f"import sys; from orchestrator.cli import main; "
                               f"sys.exit(main({list(argv)!r}))"], capture_output=True, text=True, timeout=300,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    out = cli("eval", str(run_dir), "--all", "--ctc-weight", "0")
    scores = {s: json.loads((run_dir / "eval" / f"step_{s:06d}.json").read_text()) for s in (SAVE_AT, ITERS)}
    assert scores[ITERS]["val_loss"] == pytest.approx(straight["eval"]["val_loss"], abs=1e-5)
    table = (run_dir / "eval" / "steps.tsv").read_text().splitlines()
    assert table[0].split("\t")[:3] == ["step", "checkpoint", "val_loss"] and len(table) == 3
    assert "rtfx/tones_val" in table[0].split("\t") and "rtfx_batch/tones_val" in table[0].split("\t")
    assert "RTFx after a warm-up batch on cpu: " in out
    assert [row.split("\t")[0] for row in table[1:]] == [str(SAVE_AT), str(ITERS)]
    best = json.loads((run_dir / "eval" / "best.json").read_text())
    assert best["by"] == "wer/all" and best["lower_is_better"]
    assert best["value"] == min(scores[s]["wer/all"] for s in scores)
    assert f"best by wer/all (lower is better): {best['checkpoint']}" in out
    assert (run_dir / "eval_curve.png").stat().st_size > 0
    # the same as scoring one checkpoint on its own
    alone = tmp_path / "alone"
    shutil.copytree(run_dir, alone, symlinks=True, ignore=shutil.ignore_patterns("eval"))
    cli("eval", str(alone), "--checkpoint", str(alone / "checkpoints" / f"step_{SAVE_AT:06d}"), "--ctc-weight", "0")
    single = json.loads((alone / "eval" / f"step_{SAVE_AT:06d}.json").read_text())
    assert scores_only(single) == scores_only(scores[SAVE_AT])
    # again: every kept checkpoint is scored already
    before = {p.name: p.stat().st_mtime_ns for p in (run_dir / "eval").glob("step_*.json")}
    again = cli("eval", str(run_dir), "--all")
    assert "step_000006:" not in again and "step_000012:" not in again
    assert before == {p.name: p.stat().st_mtime_ns for p in (run_dir / "eval").glob("step_*.json")}
    # export the chosen one
    out = cli("convert", "megatron-to-hf", "--megatron", str(run_dir), "--step", "best", "--out", str(tmp_path / "hf"))
    assert best["checkpoint"] in out and (tmp_path / "hf" / "config.json").is_file()
