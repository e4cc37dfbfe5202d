"""The normalisers WER and exact match are scored under (orchestrator/scoring/normalisers.py):
Whisper's, taken from transformers, give the figures jiwer gives under them, pair for pair
and pooled; the project's own stays the default."""

import hashlib
import json
from importlib import metadata

import jiwer
import pytest
from transformers.models.whisper.english_normalizer import BasicTextNormalizer, EnglishTextNormalizer

from orchestrator.plan.tasks import DEFAULT_NORMALISER, NORMALISERS
from orchestrator.scoring import metrics
from orchestrator.scoring.normalisers import SPELLING_TABLE, describe, normaliser, scorer
from orchestrator.scoring.text import normalize_transcript
from orchestrator.train.generation_eval import metric_values

# Numbers (spelled and written, currency, percent, ordinals), contractions, British
# spellings, punctuation and case, fillers, one hypothesis that is left empty.
PAIRS = [
    ("I don't know, Mr. Smith; it's twenty-five pounds!", "i do not know mister smith its £25"),
    ("The colour of the centre was 25 percent.", "the color of the center was twenty five per cent"),
    ("He's gonna pay three dollars fifty.", "he is going to pay $3.50"),
    ("HELLO, World... one hundred and two", "hello word 102"),
    ("We'll organise the 1st meeting at 10:30 on the 3rd of May.", "we will organize the first meeting at 1030 on "
                                                                     "the third of may"),
    ("Uh, the theatre's programme isn't finalised, um, yet.", "the theater program is not finalized yet"),
    ("They've travelled 2,500 kilometres (about 1,553 miles)!", "they have traveled two thousand five hundred "
                                                                 "kilometers"),
    ("You can't catch the 7:45 train.", "uh"),
    ("Doctor Jones said it's O.K.", "dr jones said it is ok"),
]
REFS = [r for r, _ in PAIRS]
HYPS = [h for _, h in PAIRS]


def _whisper_english():
    return EnglishTextNormalizer(json.loads(SPELLING_TABLE.read_text(encoding="utf-8")))


@pytest.mark.parametrize("name, library", [("whisper_english", _whisper_english), ("whisper_basic", BasicTextNormalizer)])
def test_wer_under_whispers_normalisers_is_jiwers_to_the_last_digit(name, library):
    norm = library()
    expected = jiwer.wer([norm(r) for r in REFS], [norm(h) for h in HYPS])
    # The eval's own path: summable statistics per share (two data-parallel ranks' halves),
    # summed, then scored (orchestrator/train/generation_eval.py metric_values).
    halves = [metrics.statistics("wer", REFS[:4], HYPS[:4], name), metrics.statistics("wer", REFS[4:], HYPS[4:], name)]
    pooled = metric_values({"set": metrics.add("wer", halves)}, {"set": "wer"})
    assert pooled["wer/set"] == expected  # exactly, not approximately
    assert metrics.score("wer", metrics.statistics("wer", REFS, HYPS, name)) == expected
    for ref, hyp in PAIRS:  # and pair by pair (the empty hypothesis: all deletions, as jiwer counts it)
        assert metrics.score("wer", metrics.statistics("wer", [ref], [hyp], name)) == jiwer.wer(norm(ref), norm(hyp))


def test_whispers_english_normaliser_does_what_the_leaderboard_counts_on():
    english = normaliser("whisper_english")
    assert english("The colour of the centre was twenty five percent.") == "the color of the center was 25%"
    assert english("I don't know, Mr. Smith") == "i do not know mister smith"
    assert english("Uh, um, hmm.") == ""
    assert normaliser("whisper_basic")("Hello,  World! ") == "hello world"  # whitespace collapsed
    # so the figures differ: Whisper's convention forgives what the project's counts
    assert metrics.score("wer", metrics.statistics("wer", REFS, HYPS, "whisper_english")) < 0.3
    assert metrics.score("wer", metrics.statistics("wer", REFS, HYPS)) > 0.7
    assert metrics.statistics("exact", ["Twenty-five percent."], ["25%"], "whisper_english")["correct"] == 1
    assert metrics.statistics("exact", ["Twenty-five percent."], ["25%"])["correct"] == 0


def test_the_default_is_the_projects_own_and_its_figures_do_not_move():
    assert DEFAULT_NORMALISER == "audiollm" and normaliser() is normalize_transcript
    refs, hyps = ["Three, ONE.", "one two three four"], ["three one", "one too three"]
    assert metrics.statistics("wer", refs, hyps) == metrics.statistics("wer", refs, hyps, "audiollm")
    assert metrics.statistics("wer", refs, hyps)["errors"] == 2
    normalise = normaliser("audiollm")
    assert jiwer.wer([normalise(r) for r in refs], [normalise(h) for h in hyps]) == \
        metrics.score("wer", metrics.statistics("wer", refs, hyps))


def test_the_spelling_table_is_whispers_file_unchanged_with_its_licence():
    licence = SPELLING_TABLE.with_name("whisper_english.LICENSE").read_text()
    assert hashlib.sha256(SPELLING_TABLE.read_bytes()).hexdigest() in licence
    assert "MIT License" in licence and "Copyright (c) 2022 OpenAI" in licence
    table = json.loads(SPELLING_TABLE.read_text())
    assert len(table) > 1500 and table["colour"] == "color"


def test_each_figure_names_its_normaliser_and_scorer():
    assert set(NORMALISERS) == {"audiollm", "whisper_english", "whisper_basic"}
    assert "transformers" in describe("whisper_english") and "english.json" in describe("whisper_english")
    assert scorer("wer").startswith(f"jiwer {metadata.version('jiwer')} ")
    with pytest.raises(ValueError, match="unknown normaliser 'whisper'; use one of audiollm, whisper_english"):
        normaliser("whisper")


def test_a_dataset_names_its_normaliser_and_a_wrong_one_is_refused_naming_it():
    from types import SimpleNamespace

    from orchestrator.plan.tasks import dataset_format, entry_problems

    data = SimpleNamespace(prompt_template="Transcribe: <SpeechHere>", audio_field="audio", text_field="text")
    assert dataset_format({"name": "a"}, data).normaliser == "audiollm"  # unset: the project's own
    assert dataset_format({"name": "a", "normaliser": "whisper_english"}, data).normaliser == "whisper_english"
    assert dataset_format({"name": "c", "task": "caption"}, data).normaliser is None  # BLEU: raw strings
    assert entry_problems({"name": "a", "normaliser": "whisper_basic", "metric": "exact"}, data, "validation") == []
    assert entry_problems({"name": "a", "normaliser": "whisper"}, data, "validation") == [
        "data.validation[a].normaliser='whisper'; use one of audiollm, whisper_english, whisper_basic"]
    (bleu,) = entry_problems({"name": "c", "task": "caption", "normaliser": "whisper_basic"}, data, "validation")
    assert "with metric 'bleu': bleu scores the raw strings" in bleu and "remove it" in bleu
    (train,) = entry_problems({"name": "t", "normaliser": "whisper_basic"}, data, "train")
    assert "scores validation datasets only" in train


def test_eval_normaliser_flag_sets_every_scored_dataset_or_one_and_refuses_what_it_cannot():
    from orchestrator.eval.arguments import eval_parser, normaliser_choice
    from orchestrator.eval.evaluate import set_normalisers
    from orchestrator.plan.resolved import PlanError

    args = eval_parser().parse_args(["RUN", "--normaliser", "whisper_english", "--normaliser", "own=whisper_basic"])
    chosen, wrong = normaliser_choice(args.normaliser)
    assert wrong is None and chosen == {None: "whisper_english", "own": "whisper_basic"}
    entries = [{"name": "speech"}, {"name": "own", "metric": "exact"}, {"name": "caps", "task": "caption"}]
    set_normalisers(entries, chosen)
    assert [e.get("normaliser") for e in entries] == ["whisper_english", "whisper_basic", None]
    assert "unknown normaliser 'whisper'" in normaliser_choice(["speech=whisper"])[1]
    with pytest.raises(PlanError, match="--normaliser nope=whisper_basic: the run has no validation dataset 'nope'; "
                                        "it has: speech, own, caps"):
        set_normalisers(entries, {"nope": "whisper_basic"})
    with pytest.raises(PlanError, match="--normaliser caps=whisper_basic: caps is scored by bleu, which reads the raw strings"):
        set_normalisers(entries, {"caps": "whisper_basic"})
