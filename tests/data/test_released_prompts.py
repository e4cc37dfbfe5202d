"""A released speech LLM's recipe prompts as its own processor does. The job's sample path
(orchestrator/data/loader.SampleProcessor) builds a training sample of a clip from the
recipe's data.prompt_template and data.audio_token and the audio tokens of each of the
clip's windows; the prompt part
of it must be the ids the release's processor gives for the same clip and request, or a
fine-tuned model is asked differently than it was trained:

- Voxtral (voxtral_mini_tp1, voxtral_small_tp4): its Tekken tokenizer (the Tekken file
  mistral-common ships, with Voxtral's audio tokens: tests/data/family_tokenizers.py) read
  through mistral-common (orchestrator/data/tekken.py), against transformers'
  VoxtralProcessor.apply_transcription_request, whose ids mistral-common's transcription
  request makes; clips shorter than a 30-s window and longer (two windows);
- Qwen2-Audio (qwen2_audio_tp1): a tokenizer of Qwen2-Audio-Instruct's layout against
  Qwen2AudioProcessor on its chat template's rendering of a user turn of one clip and the
  instruction; a short clip and a whole window.

The answer follows as the tokenizer encodes the transcript, then the end of the answer."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.data.tokenizer_build import load_tokenizer
from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import to_object
from tests.data.family_tokenizers import build_family_tokenizer, voxtral_tokenizer_dir

ANSWER = "Hello world, this is a test."


def _clip(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def _ours(recipe: str, tokenizer, seconds: float):
    """(prompt ids, answer ids) of one sample of the clip through the job's sample path
    (decoding, chunking, counting, tokenizing: orchestrator/data/loader.SampleProcessor) with
    the recipe's data and model sections."""
    import io

    import soundfile

    from orchestrator.data.loader import SampleProcessor
    from orchestrator.data.sources import ResolvedDataset

    cfg = to_object(compose([f"+recipe={recipe}", "data.train=[{name:clips,path:unused}]"]))
    wav = io.BytesIO()
    soundfile.write(wav, _clip(seconds), 16000, format="WAV")
    processor = SampleProcessor(cfg.data, cfg.model.encoder, cfg.model.adapter, tokenizer,
                                [ResolvedDataset("clips", "unused", 1.0, None, cfg.data.train[0])], "train")
    sample = processor({"audio": wav.getvalue(), "text": ANSWER}, 0, 0).tokenized
    ids = np.concatenate([sample.tokens, sample.labels[-1:]]).tolist()
    return ids[:sample.answer_start], ids[sample.answer_start:]


@pytest.mark.parametrize("recipe", ["voxtral_mini_tp1", "voxtral_small_tp4"])
@pytest.mark.parametrize("seconds", [2.5, 31.0])
def test_a_voxtral_recipes_prompt_is_its_processors_transcription_request(recipe, seconds):
    from transformers import MistralCommonTokenizer, VoxtralProcessor, WhisperFeatureExtractor

    directory = voxtral_tokenizer_dir()
    tokenizer = load_tokenizer(directory, "[AUDIO]")
    prompt, answer = _ours(recipe, tokenizer, seconds)
    processor = VoxtralProcessor(WhisperFeatureExtractor(feature_size=128), MistralCommonTokenizer.from_pretrained(
        str(directory)))
    theirs = processor.apply_transcription_request(language="en", audio=_clip(seconds), model_id="voxtral",
                                                   sampling_rate=16000, format=["wav"])
    assert prompt == theirs["input_ids"][0].tolist()
    assert prompt.count(24) == 375 * (1 if seconds < 30 else 2)  # [AUDIO]: 375 a 30-s window
    assert theirs["input_features"].shape[0] == (1 if seconds < 30 else 2)  # the windows the model reads
    assert answer == tokenizer.tekken.encode(ANSWER, bos=False, eos=False) + [tokenizer.eos_token_id]
    assert tokenizer.decode(answer, skip_special_tokens=True) == ANSWER


@pytest.mark.parametrize("seconds", [2.5, 30.0])
def test_the_qwen2_audio_recipes_prompt_is_its_processors_chat_turn(tmp_path, seconds):
    from transformers import AutoTokenizer, Qwen2AudioProcessor, WhisperFeatureExtractor

    from tests.data.conftest import WORDS

    texts = [" ".join(WORDS)] * 5 + ["system You are a helpful assistant. user Audio 1: Transcribe the speech."] * 5
    directory = build_family_tokenizer("qwen2_audio", texts + [ANSWER] * 5, tmp_path / "tokenizer")
    tokenizer = load_tokenizer(directory, "<|AUDIO|>")
    prompt, answer = _ours("qwen2_audio_tp1", tokenizer, seconds)
    processor = Qwen2AudioProcessor(WhisperFeatureExtractor(feature_size=128), AutoTokenizer.from_pretrained(directory))
    turn = [{"role": "user", "content": [{"type": "audio", "audio_url": "clip.wav"},
                                         {"type": "text", "text": "Transcribe the speech."}]}]
    text = processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    theirs = processor(text=text, audio=[_clip(seconds)], sampling_rate=16000, return_tensors="np")
    assert prompt == theirs["input_ids"][0].tolist()
    audio = tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    assert prompt.count(audio) == {2.5: 62, 30.0: 750}[seconds]  # one a 40 ms, as its encoder pools
    assert answer == tokenizer(ANSWER, add_special_tokens=False)["input_ids"] + tokenizer("<|im_end|>")["input_ids"]


def test_the_plan_reads_a_tekken_tokenizer_and_refuses_what_its_vocabulary_does_not_hold():
    """Submit side (no mistral-common, no transformers): tekken.json read as JSON gives the
    ids mistral-common gives, so a control token the file lacks (a misspelt [TRANSCRIBE])
    is refused naming Voxtral's own prompt, as is a decoder smaller than the vocabulary."""
    from orchestrator.plan.rules.data import check_tokenizer
    from orchestrator.plan.tokenizer_file import read_special_tokens, read_vocabulary

    directory = voxtral_tokenizer_dir()
    vocabulary, tokenizer = read_vocabulary(directory), load_tokenizer(directory)
    assert {t: vocabulary[t] for t in ("[AUDIO]", "[BEGIN_AUDIO]", "[TRANSCRIBE]", "<s>", "</s>", "lang")} == \
        {t: tokenizer.convert_tokens_to_ids(t) for t in ("[AUDIO]", "[BEGIN_AUDIO]", "[TRANSCRIBE]", "<s>", "</s>", "lang")}
    assert max(vocabulary.values()) + 1 == len(tokenizer) == 131072
    assert read_special_tokens(directory) == {"bos_token": "<s>", "eos_token": "</s>"}

    def said(*overrides):
        cfg = to_object(compose(["+recipe=voxtral_mini_tp1", f"data.tokenizer={directory}", *overrides]))
        return {f.rule: f.message for f in check_tokenizer(cfg.data, cfg.model)}

    assert said() == {}
    wrong = said('data.prompt_template="[INST][BEGIN_AUDIO]<SpeechHere>[/INST]lang:en[TRANSCRIPT]"')
    assert list(wrong) == ["prompt_tokens"], wrong
    assert "holds [TRANSCRIPT]" in wrong["prompt_tokens"] and "Voxtral's: data.prompt_template='[INST][BEGIN_AUDIO]" \
        "<SpeechHere>[/INST]lang:en[TRANSCRIBE]'" in wrong["prompt_tokens"], wrong
    small = said("model.decoder.vocab_size=32000")
    assert "has 131072 token ids but model.decoder.vocab_size=32000" in small["tokenizer_vocab"], small
