"""Small byte-level BPE tokenizers with the special-token layout of each decoder family
beside Gemma2 (the real ones cannot be fetched here): the family's special tokens after
the learned vocabulary, as in the released tokenizers (Llama 3 from id 128000, Qwen from
151643), its BOS and EOS (Qwen has no BOS: bos_token null) and its chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

LAYOUTS = {
    "llama": dict(
        specials=["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        bos="<|begin_of_text|>", eos="<|end_of_text|>", pad=None,
        chat_template=("{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
                       "<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}"
                       "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")),
    "qwen2": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"],
        bos=None, eos="<|endoftext|>", pad="<|endoftext|>",
        chat_template=("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                       "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")),
}
LAYOUTS["qwen3"] = LAYOUTS["qwen2"]
# Qwen2-Audio-Instruct's: Qwen's, its audio markers and placeholder after them (<|AUDIO|> at
# 151646 in the release), end of turn as EOS.
LAYOUTS["qwen2_audio"] = dict(LAYOUTS["qwen2"], specials=LAYOUTS["qwen2"]["specials"][:3] + [
    "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"], eos="<|im_end|>")


def build_family_tokenizer(family: str, texts: Iterable[str], out_dir: str | Path, vocab_size: int = 300) -> Path:
    """Byte-level BPE of `vocab_size` learned tokens on `texts`, then `family`'s special
    tokens; saved as a HF tokenizer directory."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    layout = LAYOUTS[family]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(texts), trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_special_tokens([AddedToken(t, special=True) for t in layout["specials"]])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=layout["bos"], eos_token=layout["eos"],
                                   pad_token=layout["pad"], chat_template=layout["chat_template"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


# Voxtral's Tekken tokenizer, made from the Tekken file mistral-common's wheel ships (the
# released 131072-token vocabulary, but of a version before audio): its version raised to v7,
# Voxtral's audio control tokens named at their ranks ([AUDIO] 24, [BEGIN_AUDIO] 25,
# [TRANSCRIBE] 34: the ids transformers' Voxtral processor and the release use; the first
# twenty are every Tekken file's), and the audio settings of Voxtral's processor (16 kHz,
# 12.5 audio tokens a second, 30-s chunks, 128 mel bins).
VOXTRAL_CONTROLS = {24: "[AUDIO]", 25: "[BEGIN_AUDIO]", 34: "[TRANSCRIBE]"}
_VOXTRAL: list = []


def voxtral_tokenizer_dir() -> Path:
    """A directory holding that tekken.json, written once per test process."""
    import atexit
    import json
    import shutil
    import tempfile

    import mistral_common
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    if not _VOXTRAL:
        data = json.loads((Path(mistral_common.__file__).parent / "data" / "tekken_240911.json").read_text())
        data.pop("image", None)
        data["config"]["version"] = "v7"
        first = [dict(t, token_str=str(t["token_str"].value if hasattr(t["token_str"], "value") else t["token_str"]))
                 for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
        data["special_tokens"] = first + [
            {"rank": rank, "token_str": VOXTRAL_CONTROLS.get(rank, f"<SPECIAL_{rank}>"), "is_control": True}
            for rank in range(len(first), data["config"]["default_num_special_tokens"])]
        data["audio"] = {"sampling_rate": 16000, "frame_rate": 12.5, "chunk_length_s": 30.0,
                         "audio_encoding_config": {"num_mel_bins": 128, "hop_length": 160, "window_size": 400}}
        root = Path(tempfile.mkdtemp(prefix="audiollm-tests-tekken-"))
        atexit.register(shutil.rmtree, root, True)
        (root / "tekken.json").write_text(json.dumps(data))
        _VOXTRAL.append(root)
    return _VOXTRAL[0]
