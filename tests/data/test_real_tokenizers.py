"""A tokenizer with Gemma2's special-token layout (bos, eos, pad, <start_of_turn>,
<end_of_turn>, <unusedN>; the real one cannot be fetched here): the audio placeholder
is an existing token chosen by data.audio_token, and plan refuses a placeholder the
tokenizer does not know or a tokenizer larger than the model's vocabulary."""

import pytest

from orchestrator.plan.compose import compose
from orchestrator.data.tokenizer_build import build_tokenizer, load_tokenizer
from orchestrator.plan.resolve import to_object
from orchestrator.plan.validate import ERROR, validate
from tests.data.conftest import WORDS, tone_samples, write_mds

GEMMA2_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]",
                   *[f"<unused{i}>" for i in range(8)], "<start_of_turn>", "<end_of_turn>"]


@pytest.fixture(scope="module")
def gemma_layout_tokenizer(tmp_path_factory):
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5 + ["user model Transcribe:"] * 5
    return build_tokenizer(texts, tmp_path_factory.mktemp("gemma_tok") / "tokenizer", vocab_size=320,
                           special_tokens=GEMMA2_SPECIALS)


def _errors(overrides):
    return {f.rule: f.message for f in validate(to_object(compose(overrides)), "plan") if f.severity == ERROR}


def test_the_layout_is_gemma2s(gemma_layout_tokenizer):
    tok = load_tokenizer(gemma_layout_tokenizer, audio_token="<unused0>")
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.convert_tokens_to_ids("<unused0>") == 6
    assert tok.tokenize("<start_of_turn>user") [0] == "<start_of_turn>"


def test_an_existing_token_is_accepted_as_the_audio_placeholder(gemma_layout_tokenizer):
    assert _errors([f"data.tokenizer={gemma_layout_tokenizer}", "data.audio_token='<unused0>'"]) == {}


def test_a_placeholder_the_tokenizer_lacks_is_refused_naming_both(gemma_layout_tokenizer):
    message = _errors([f"data.tokenizer={gemma_layout_tokenizer}", "data.audio_token='<audio>'"])["audio_token"]
    assert "data.audio_token='<audio>'" in message and str(gemma_layout_tokenizer) in message
    assert "<unused0>" in message  # the hint


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused_naming_both(gemma_layout_tokenizer):
    errors = _errors([f"data.tokenizer={gemma_layout_tokenizer}", "data.audio_token='<unused0>'",
                      "model.decoder.vocab_size=200"])
    assert "model.decoder.vocab_size=200" in errors["tokenizer_vocab"]
    assert f"data.tokenizer={gemma_layout_tokenizer} has 3" in errors["tokenizer_vocab"]  # 3xx token ids


def test_samples_carry_the_chosen_placeholder_once_per_audio_token(tmp_path, gemma_layout_tokenizer):
    from orchestrator.data.loader import build_train_loader
    from orchestrator.plan.schema.data import DatasetEntry

    write_mds(tmp_path / "ds", tone_samples(4, seed=3))
    cfg = to_object(compose([f"data.tokenizer={gemma_layout_tokenizer}", "data.audio_token='<unused0>'",
                             "data.demo_corpus=null", "data.packing=false", "data.seq_length=128"]))
    cfg.data.train = [DatasetEntry(name="tones", path=str(tmp_path / "ds"))]
    batch = next(build_train_loader(cfg.data, cfg.model.encoder, cfg.model.adapter, 2, 0, 1, 0))
    assert int(batch["audio_token_id"]) == 6
    assert int((batch["tokens"] == 6).sum()) == int(batch["audio_num_tokens"].sum()) > 0
