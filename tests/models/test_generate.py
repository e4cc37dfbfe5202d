"""Greedy decoding reproduces answers a tiny AudioLLM has memorised (one process launch)."""

import json
import re
from pathlib import Path

import pytest

from tests.distributed_run import torchrun

SCRIPT = Path(__file__).with_name("generate_script.py")


@pytest.fixture(scope="module")
def result():
    out = torchrun(SCRIPT, 1, timeout=240)
    return json.loads(re.search(r"^RESULT (.*)$", out, re.M).group(1))


@pytest.mark.multiprocess
def test_memorised_answers_are_decoded_from_their_clips(result):
    assert result["loss"] < 0.02, f"the tiny model did not memorise its three answers: {result}"
    assert result["batched"] == result["answers"]  # stop token not included, per-row stop
    assert result["alone"] == result["answers"]  # right padding of shorter prompts does not leak
    # same prompt tokens, audio swapped: the answers follow the audio
    assert result["swapped"] == [result["answers"][1], result["answers"][0]]
    assert result["rows"] == result["answers"][1:]


@pytest.mark.multiprocess
def test_max_new_tokens_caps_and_mode_is_restored(result):
    assert result["capped"] == [a[:2] for a in result["answers"]]
    assert result["training_after"] is True


@pytest.mark.multiprocess
def test_spec_augment_hook_acts_in_training_mode_only(result):
    assert result["spec_augment_built"] and result["plain_has_none"]
    assert result["train_diff"] > 1e-3
    assert result["eval_diff"] == 0.0


@pytest.mark.multiprocess
def test_word_error_rate_of_a_model_that_transcribes_and_of_one_that_says_nothing(result):
    """The evaluation path (prompts from a validation batch, greedy decoding, the
    tokenizer's decode, WER) gives the model that knows its answers a WER a working
    model meets, and the same model cut off before its first token (empty
    transcripts) a WER of 1: the bound tells them apart."""
    assert result["wer_working"] <= 0.1 < result["wer_silent"], result
    assert result["wer_silent"] == 1.0, result  # every reference word deleted


@pytest.mark.multiprocess
def test_each_validation_dataset_is_scored_by_its_metric(result):
    """The same batch as three datasets: without a `metric` (WER), exact match, BLEU.
    The model that reproduces its answers scores full marks on both; the silent one none."""
    assert result["metrics"] == {"memorised": "wer", "memorised_exact": "exact", "memorised_bleu": "bleu"}
    assert result["batched"] == result["answers"], "greedy decoding is not exact: the scores below cannot be"
    assert result["exact_working"] == 1.0 and result["bleu_working"] == pytest.approx(100.0), result
    assert result["exact_silent"] == 0.0 and result["bleu_silent"] == 0.0, result
