"""Tokenizer, placeholder count, loss masks, packing and the context-parallel split."""

import math

import numpy as np
import pytest
import torch

from orchestrator.data.context_parallel import frame_index_within, split_batch
from orchestrator.data.packing import Example, Packer, collate, packed_seq_params
from orchestrator.data.prompts import PromptBuilder, Tokenized, audio_placeholder_count
from orchestrator.data.tokenizer_build import AUDIO_TOKEN, SPECIAL_TOKENS
from orchestrator.plan.schema.data import DataConfig

TEMPLATE = DataConfig().prompt_template


def test_tokenizer_directory_loads_with_auto_tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert len(tok) <= 512
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == ("<pad>", "<eos>", "<bos>")
    text = "<start_of_turn>user\nthree one four<end_of_turn>\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<start_of_turn>")
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"


def _conv_out(length):
    # The Whisper encoder's front end: conv(k3, s1, p1) then conv(k3, s2, p1).
    x = torch.zeros(1, 1, length)
    x = torch.nn.functional.conv1d(x, torch.zeros(1, 1, 3), padding=1)
    return torch.nn.functional.conv1d(x, torch.zeros(1, 1, 3), stride=2, padding=1).shape[-1]


@pytest.mark.parametrize("samples", [1, 159, 160, 161, 16000, 47123, 79999, 80000, 95000])
def test_placeholder_count_follows_the_encoder_convolutions(samples):
    mel_frames = min(math.ceil(samples / 160), 500)
    expected = _conv_out(mel_frames) // 5
    assert audio_placeholder_count(samples, max_source_positions=250, frames_per_token=5) == expected
    # Window mode: every clip counts the full window: 500 frames -> 250 -> 50 tokens.
    assert audio_placeholder_count(samples, 250, 5, mode="window") == 50
    assert audio_placeholder_count(480000, 1500, 5, mode="window") == 300  # whisper-large-v3: 300 per 30 s


def test_prompt_expands_speech_marker_and_masks_the_response_only(tokenizer):
    builder = PromptBuilder(tokenizer, TEMPLATE)
    out = builder.build("three one four", [7, 3])
    ids = np.concatenate([out.tokens, out.labels[-1:]])
    audio_id = tokenizer.convert_tokens_to_ids(AUDIO_TOKEN)
    assert (ids == audio_id).sum() == 10
    run = np.flatnonzero(ids == audio_id)
    assert (np.diff(run) == 1).all()  # one contiguous run
    assert np.array_equal(out.labels[:-1], out.tokens[1:])
    trained = out.labels[out.loss_mask == 1]
    assert tokenizer.decode(trained) == "three one four<end_of_turn><eos>"
    assert ids[0] == tokenizer.bos_token_id
    text = tokenizer.decode(ids[run[-1] + 1:])
    assert text == "<end_of_turn>\n<start_of_turn>model\nthree one four<end_of_turn><eos>"
    everything = PromptBuilder(tokenizer, TEMPLATE, loss_on_prompt=True).build("three", [4])
    assert everything.loss_mask[everything.labels == audio_id].sum() == 0
    assert everything.loss_mask.sum() == len(everything) - 4
    with pytest.raises(ValueError, match="empty answer"):
        builder.build("  ", [3])
    with pytest.raises(ValueError, match="exactly once"):
        PromptBuilder(tokenizer, "no marker")


def _example(pos, length, dataset_id=0):
    toks = np.arange(1, length + 1, dtype=np.int64) + 100 * pos
    return Example(pos, dataset_id, Tokenized(toks, toks + 1, np.ones(length, np.float32), []), [])


def test_packing_fills_rows_and_restarts_positions():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 60, size=400)
    packer = Packer(seq_length=128, rows=4, buffer_size=64)
    stream = iter(_example(i, int(n), i % 3) for i, n in enumerate(lengths))
    seen, used, slots = [], 0, 0
    exhausted = False
    while True:
        while not packer.full() and not exhausted:
            try:
                packer.add(next(stream))
            except StopIteration:
                exhausted = True
        rows = packer.pop_rows()
        if not rows:
            break
        batch = collate(rows, 128, pad_id=0, dataset_names=["a", "b", "c"], audio_token_id=6,
                        num_rows=4)
        cu = batch["cu_seqlens"].tolist()
        assert cu[0] == 0 and cu[-1] == 4 * 128
        # Every row boundary is a sequence boundary; positions restart at every boundary.
        assert set(range(0, 4 * 128 + 1, 128)) <= set(cu)
        flat_pos = batch["position_ids"].reshape(-1)
        for start, end in zip(cu[:-1], cu[1:]):
            assert torch.equal(flat_pos[start:end], torch.arange(end - start))
        for row in rows:
            for ex in row:
                seen.append(ex.position)
        if not exhausted:
            used += batch["num_tokens"]
            slots += batch["tokens"].numel()
    assert sorted(seen) == list(range(400))  # every sample exactly once
    assert used / slots >= 0.95
    unpacked = lengths.sum() / (len(lengths) * 128)
    assert unpacked < 0.35


def test_unpacked_rows_hold_one_sample_each():
    packer = Packer(seq_length=64, rows=2, buffer_size=2, packing=False)
    for i in range(3):
        packer.add(_example(i, 10 + i))
    rows = packer.pop_rows()
    assert [[ex.position for ex in r] for r in rows] == [[0], [1]]
    batch = collate(rows, 64, 0, ["a"], 6, num_rows=2, packed=False)
    assert batch["cu_seqlens"].tolist() == [0, 10, 64, 75, 128]
    assert batch["loss_mask"].sum() == 21
    with pytest.raises(ValueError, match="does not fit data.seq_length"):
        packer.add(_example(9, 65))
    params = packed_seq_params(batch)
    assert params.qkv_format == "thd" and params.max_seqlen_q == 54


def test_context_parallel_split_exact_example():
    """The worked example [10, A1, A2, A3, A4, 20, 30, 40] at CP=2. Contiguous halves would
    put A1-A3 on rank 0 and A4 on rank 1; megatron's load-balanced layout cuts 4 chunks of
    2 and gives rank 0 chunks 0 and 3 ([10, A1] + [30, 40]), rank 1 chunks 1 and 2
    ([A2, A3] + [A4, 20]): A1 goes to rank 0, A2-A4 to rank 1."""
    tokens = torch.tensor([[10, 99, 99, 99, 99, 20, 30, 40]])
    batch = {"tokens": tokens, "labels": tokens + 1, "loss_mask": torch.ones(1, 8),
             "position_ids": torch.arange(8).unsqueeze(0), "audio_token_id": 99,
             "audio_num_tokens": torch.tensor([4]), "packed": False}
    r0, r1 = split_batch(batch, 2, 0), split_batch(batch, 2, 1)
    assert r0["tokens"].tolist() == [[10, 99, 30, 40]]
    assert r1["tokens"].tolist() == [[99, 99, 99, 20]]
    assert r0["position_ids"].tolist() == [[0, 1, 6, 7]] and r1["position_ids"].tolist() == [[2, 3, 4, 5]]
    assert r0["cp_slots"].tolist() == [0, 1, 6, 7]
    assert r0["audio_frames"].tolist() == [0]  # A1
    assert r1["audio_frames"].tolist() == [1, 2, 3]  # A2, A3, A4
    assert r0["audio_clips"].tolist() == r1["audio_clips"].tolist() == [0]  # both encode the clip
    assert r1["labels"].tolist() == [[100, 100, 100, 21]]
    with pytest.raises(ValueError, match="2 x context_parallel_size"):
        split_batch(batch, 3, 0)  # 8 tokens do not make 6 equal chunks


def test_context_parallel_split_of_packed_rows(tokenizer):
    """Packed rows are split as whole rows (documents are a mask over global slots): the
    ranks' tokens are the row's, each once, and each audio frame goes to the rank holding
    its placeholder; `frame_index_within` finds a rank's frames in the output of the clips
    it encodes."""
    builder = PromptBuilder(tokenizer, TEMPLATE)
    examples = [Example(i, 0, builder.build(t, [n]), [np.zeros(160 * n * 10, np.float32)])
                for i, (t, n) in enumerate([("one two", 3), ("three", 5), ("four five six", 2)])]
    cp = 2
    packer = Packer(seq_length=128, rows=1, buffer_size=3)
    for ex in examples:
        packer.add(ex)
    batch = collate(packer.pop_rows(), 128, 0, ["a"], builder.audio_token_id, num_rows=1)
    assert batch["audio_clip_keys"].tolist() == [[0, 0], [1, 0], [2, 0]]  # (sample position, clip in sample)
    parts = [split_batch(batch, cp, r) for r in range(cp)]
    slots = torch.cat([p["cp_slots"] for p in parts])
    assert sorted(slots.tolist()) == list(range(128))
    assert torch.equal(torch.cat([p["tokens"] for p in parts], dim=1)[0], batch["tokens"][0, slots])
    frames = torch.cat([p["audio_frames"] for p in parts])
    assert sorted(frames.tolist()) == list(range(10))
    for p in parts:
        assert int((p["tokens"] == builder.audio_token_id).sum()) == p["audio_frames"].numel()
        rows = frame_index_within(p["audio_clips"], p["audio_frames"], batch["audio_num_tokens"])
        encoded = torch.cat([torch.arange(int(batch["audio_num_tokens"][:c].sum()),
                                          int(batch["audio_num_tokens"][:c + 1].sum())) for c in p["audio_clips"]])
        assert torch.equal(encoded[rows], p["audio_frames"])
