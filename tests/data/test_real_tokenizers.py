"""A tokenizer with Gemma2's special-token layout (bos, eos, pad, <start_of_turn>,
<end_of_turn>, <unusedN>; the real one cannot be fetched here): the audio placeholder
is an existing token chosen by data.audio_token, and plan refuses a placeholder the
tokenizer does not know or a tokenizer larger than the model's vocabulary."""

import pytest

from orchestrator.plan.compose import compose
from orchestrator.data.tokenizer_build import build_tokenizer, load_tokenizer
from orchestrator.plan.resolve import to_object
from orchestrator.plan.rules.findings import ERROR
from orchestrator.plan.validate import validate
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


# --- the other families' layouts: plan says where a prompt, placeholder or BOS does not fit


@pytest.fixture(scope="module")
def family_tokenizers(tmp_path_factory):
    from tests.data.family_tokenizers import build_family_tokenizer

    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5 + ["user assistant Transcribe:"] * 5
    return {family: build_family_tokenizer(family, texts, tmp_path_factory.mktemp(family) / "tokenizer")
            for family in ("llama", "qwen2")}


# The demo corpus's datasets carry Gemma2's prompt: left out here.
FAMILY_DECODER = {"llama": ["data.train=[]", "data.validation=[]", "model.decoder.family=llama", "model.decoder.sliding_window=null",
                            "model.decoder.query_pre_attn_scalar=null", "model.decoder.attn_logit_softcap=null",
                            "model.decoder.final_logit_softcap=null"]}
FAMILY_DECODER["qwen2"] = [*FAMILY_DECODER["llama"][:2], *FAMILY_DECODER["llama"][3:], "model.decoder.family=qwen2"]


def _family_prompt(family):
    from orchestrator.plan.decoder_families import prompt_overrides

    return prompt_overrides(family)


TOKENIZER_RULES = {"tokenizer", "audio_token", "tokenizer_vocab", "tokenizer_specials", "prompt_tokens"}


def _tokenizer_errors(overrides):
    return {rule: message for rule, message in _errors(overrides).items() if rule in TOKENIZER_RULES}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_familys_own_prompt_and_placeholder_fit_its_tokenizer(family_tokenizers, family):
    assert _tokenizer_errors([*FAMILY_DECODER[family], f"data.tokenizer={family_tokenizers[family]}",
                    *_family_prompt(family)]) == {}


def test_gemma2s_prompt_on_a_qwen_tokenizer_is_refused_naming_the_markers_and_the_qwen_prompt(family_tokenizers):
    tokenizer = family_tokenizers["qwen2"]
    errors = _tokenizer_errors([*FAMILY_DECODER["qwen2"], f"data.tokenizer={tokenizer}"])
    assert sorted(errors) == ["audio_token", "prompt_tokens", "tokenizer_specials"]
    # the default (Gemma2's) prompt would be trained as the pieces of '<start_of_turn>'
    assert "data.prompt_template holds <end_of_turn>, <start_of_turn>; data.response_suffix holds <end_of_turn>" \
        in errors["prompt_tokens"]
    assert "data.prompt_template='<|im_start|>user\\nTranscribe: <SpeechHere><|im_end|>" in errors["prompt_tokens"]
    assert f"data.add_bos=true but data.tokenizer={tokenizer} has no bos token" in errors["tokenizer_specials"]
    assert "data.add_bos=false" in errors["tokenizer_specials"]
    assert "for qwen2 '<|vision_pad|>'" in errors["audio_token"]


def test_a_qwen_sample_has_no_bos_and_one_placeholder_per_audio_token(tmp_path, family_tokenizers):
    from orchestrator.data.loader import build_train_loader
    from orchestrator.data.tokenizer_build import load_tokenizer
    from orchestrator.plan.schema.data import DatasetEntry

    tokenizer = family_tokenizers["qwen2"]
    write_mds(tmp_path / "ds", tone_samples(4, seed=3))
    cfg = to_object(compose([*FAMILY_DECODER["qwen2"], f"data.tokenizer={tokenizer}", *_family_prompt("qwen2"),
                             "data.demo_corpus=null", "data.packing=false", "data.seq_length=128"]))
    cfg.data.train = [DatasetEntry(name="tones", path=str(tmp_path / "ds"))]
    batch = next(build_train_loader(cfg.data, cfg.model.encoder, cfg.model.adapter, 2, 0, 1, 0))
    tok = load_tokenizer(tokenizer)
    placeholder, im_start = tok.convert_tokens_to_ids("<|vision_pad|>"), tok.convert_tokens_to_ids("<|im_start|>")
    assert int(batch["audio_token_id"]) == placeholder
    assert int((batch["tokens"] == placeholder).sum()) == int(batch["audio_num_tokens"].sum()) > 0
    assert batch["tokens"][:, 0].tolist() == [im_start, im_start]  # the turn first: no BOS
