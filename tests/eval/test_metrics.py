"""Validation metrics as summable statistics (real jiwer and sacrebleu): the score of
statistics summed over parts (data-parallel ranks, datasets) is the score of the whole,
which is what the training loop's all-reduce relies on."""

import json
import re
from pathlib import Path

import pytest
import sacrebleu

from orchestrator.scoring import metrics
from orchestrator.scoring.wer import wer, word_errors
from orchestrator.train.generation_eval import metric_values
from tests.distributed_run import torchrun
from tests.eval.dp_sum_script import ANSWERS

REFS = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog", "hello there",
        "It rained all day in Paris.", "we will meet at noon tomorrow", "one two three four five"]
HYPS = ["the cat sat on a mat", "the quick brown fox jumped over a lazy dog", "hello",
        "it rained all day in paris .", "", "one two three four five"]


def test_exact_match_counts_after_normalisation():
    refs = ["314", "Three one four", "42", "3.14", "Don't stop"]
    hyps = [" 314.", "three-one FOUR", "24", "314", "dont stop!"]
    stats = metrics.statistics("exact", refs, hyps)
    # "3.14" normalises to "3 14": a different answer from "314".
    assert stats == {"correct": 3, "utterances": 5}
    assert metrics.score("exact", stats) == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match="empty after normalisation"):
        metrics.statistics("exact", ["..."], ["x"])


def test_wer_statistics_are_the_word_error_counts():
    stats = metrics.statistics("wer", REFS[:3], HYPS[:3])
    assert stats == {k: word_errors(REFS[:3], HYPS[:3])[k] for k in metrics.statistic_names("wer")}
    assert metrics.score("wer", stats) == wer(REFS[:3], HYPS[:3])


@pytest.mark.parametrize("refs,hyps", [
    (REFS, HYPS),
    # 4-grams in the hypotheses but none matching: sacrebleu's exp smoothing acts.
    (["a b c d e", "f g", "h i j", "k"], ["a b c x e", "f g", "h y j", "k"]),
])
def test_bleu_of_summed_halves_is_sacrebleus_corpus_bleu(refs, hyps):
    whole = sacrebleu.corpus_bleu(hyps, [refs])
    half = len(refs) // 2
    parts = [metrics.statistics("bleu", refs[:half], hyps[:half]), metrics.statistics("bleu", refs[half:], hyps[half:])]
    summed = metrics.add("bleu", parts)
    assert summed == metrics.statistics("bleu", refs, hyps)
    assert summed["utterances"] == len(refs)
    assert metrics.score("bleu", summed) == pytest.approx(whole.score, abs=1e-9)
    # As the all-reduce hands them back: float64 sums.
    assert metrics.score("bleu", {k: float(v) for k, v in summed.items()}) == pytest.approx(whole.score, abs=1e-9)
    assert 0 < whole.score < 100


def test_bleu_is_on_raw_strings_and_on_sacrebleus_scale():
    def bleu(refs, hyps):
        return metrics.score("bleu", metrics.statistics("bleu", refs, hyps))

    assert bleu(["The cat sat down."], ["The cat sat down."]) == pytest.approx(100.0)
    # Case and punctuation count (no normalisation), unlike WER and exact match.
    assert bleu(["The cat sat down."], ["the cat sat down"]) < 100.0
    # Corpus BLEU, no effective order: answers with no 4-gram at all score 0 (as sacrebleu's).
    assert bleu(["a b c", "d e"], ["a b c", "d e"]) == 0.0
    with pytest.raises(ValueError, match="empty; a BLEU needs reference text"):
        metrics.statistics("bleu", ["  "], ["x"])


@pytest.mark.parametrize("metric", metrics.METRICS)
def test_no_utterances_score_zero(metric):
    stats = metrics.statistics(metric, [], [])
    assert set(stats) == set(metrics.statistic_names(metric)) and not any(stats.values())
    assert metrics.score(metric, stats) == 0.0


def test_unknown_metric_names_the_allowed_ones():
    for call in (lambda: metrics.statistics("rouge", ["a"], ["a"]), lambda: metrics.score("rouge", {}),
                 lambda: metrics.statistic_names("rouge")):
        with pytest.raises(ValueError, match="'rouge'; use one of wer, exact, bleu"):
            call()
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        metrics.statistics("exact", ["a", "b"], ["a"])


def test_training_keys_from_rank_sums():
    """Two "ranks" each score their half of three datasets; the sums give the figures of
    the whole datasets, per dataset and pooled per metric (orchestrator/train/generation_eval.py)."""
    data = {"speech": ("wer", REFS[:4], HYPS[:4]), "numbers": ("exact", ["314", "42"], ["314", "forty two"]),
            "captions": ("bleu", REFS, HYPS)}
    metric = {name: m for name, (m, _, _) in data.items()}
    summed = {name: metrics.add(m, [metrics.statistics(m, refs[::2], hyps[::2]),
                                    metrics.statistics(m, refs[1::2], hyps[1::2])])
              for name, (m, refs, hyps) in data.items()}
    out = metric_values(summed, metric)
    assert set(out) == {"wer/speech", "wer/all", "wer/utterances", "exact/numbers", "exact/all", "exact/utterances",
                        "bleu/captions", "bleu/all", "bleu/utterances"}
    assert out["wer/speech"] == out["wer/all"] == pytest.approx(wer(REFS[:4], HYPS[:4]))
    assert out["exact/numbers"] == out["exact/all"] == 0.5
    assert out["bleu/captions"] == out["bleu/all"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert (out["wer/utterances"], out["exact/utterances"], out["bleu/utterances"]) == (4, 2, 6)
    # A WER-only run has the keys it always had.
    only_wer = metric_values({"speech": summed["speech"]}, {"speech": "wer"})
    assert set(only_wer) == {"wer/speech", "wer/all", "wer/utterances"}


@pytest.mark.multiprocess
def test_the_training_hook_sums_statistics_over_data_parallel_ranks():
    """Two ranks, each with half of every dataset: the hook's all-reduced figures are
    those of the whole datasets (BLEU: sacrebleu's corpus BLEU over all answers)."""
    out = json.loads(re.search(r"^RESULT (.*)$", torchrun(Path(__file__).with_name("dp_sum_script.py"), 2), re.M)[1])
    assert out["reduced"] == pytest.approx(out["whole"])
    assert out["reduced"]["bleu/captions"] == pytest.approx(out["sacrebleu"])
    assert (out["reduced"]["wer/utterances"], out["reduced"]["exact/utterances"]) == (4, 4)
    assert 0 < out["reduced"]["exact/numbers"] < 1 and 0 < out["reduced"]["wer/speech"] < 1
    assert not any(k.startswith("rtfx") for k in out["reduced"])  # training's evaluations are not timed
    # `audiollm eval`'s: the audio of both ranks over the slower one's decoding (they decode
    # at the same time), and every rank's answers gathered
    timed = out["timed"]
    assert {k: v for k, v in timed.items() if not k.startswith("rtfx")} == out["reduced"]
    assert timed["rtfx/speech"] == timed["rtfx/all"] == 20.0 / 2.0
    assert (timed["rtfx_batch/speech"], timed["rtfx_batch/captions"]) == (2, 2)
    assert out["scoring"]["speech"]["device"].startswith("cpu: ") and out["scoring"]["numbers"]["rtfx"] == 10.0
    for name, (_, refs, hyps) in ANSWERS.items():
        assert sorted((k["reference"], k["hypothesis"]) for k in out["hypotheses"][name]) == sorted(zip(refs, hyps))
