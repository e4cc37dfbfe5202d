"""Datasets of several tasks in one mixture (orchestrator/plan/tasks.py, prompts.py,
loader.py): transcription behind data.prompt_template, a dataset with its own template,
answer column and per-sample instructions, and two-clip conversations rendered by the
tokenizer's chat template with the loss on the assistant turns."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from orchestrator.plan import tasks
from orchestrator.data.loader import BadSampleError, SampleProcessor, build_train_loader, build_validation_loaders
from orchestrator.data.prompts import encode_text
from orchestrator.data.sources import ResolvedDataset
from orchestrator.plan.schema.data import DatasetEntry
from tests.data.conftest import (CONVERSATION_COLUMNS, FIRST_QUESTION, INSTRUCTED_COLUMNS, INSTRUCTED_TEMPLATE,
                                 conversation_samples, data_config, instructed_samples, tone_samples, write_mds)

ASR = DatasetEntry(name="asr", path="")
OWN = DatasetEntry(name="own", path="", prompt_template=INSTRUCTED_TEMPLATE, instruction_field="instruction",
                   text_field="answer")
CONV = DatasetEntry(name="conv", path="", turns_field="turns")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    write_mds(root / "asr", tone_samples(12, seed=1))
    write_mds(root / "own", instructed_samples(12, seed=2), INSTRUCTED_COLUMNS)
    write_mds(root / "conv", conversation_samples(12, seed=3), CONVERSATION_COLUMNS)
    return root


def entries(corpus, *chosen, **changes):
    return [DatasetEntry(**{**OmegaConf.to_container(OmegaConf.structured(e)), "path": str(corpus / e.name),
                            **changes.get(e.name, {})}) for e in chosen]


def processor(tokenizer, encoder_cfg, adapter_cfg, entry, **overrides):
    cfg = data_config([entry], **overrides)
    dataset = ResolvedDataset(entry.name, entry.path, 1.0, None, cfg.train[0])
    return SampleProcessor(cfg, encoder_cfg, adapter_cfg, tokenizer, [dataset], "train")


def test_conversation_loss_mask_covers_exactly_the_assistant_turns(tokenizer, encoder_cfg, adapter_cfg):
    """Token by token against the Gemma chat format written out by hand: the user turns,
    the placeholders of each clip where its turn puts it, and the trained tokens = each
    answer with its end of turn, then eos; nothing else."""
    raw = conversation_samples(1, seed=5)[0]
    example = processor(tokenizer, encoder_cfg, adapter_cfg, CONV)(raw, 0, 0)
    t = example.tokenized
    first, second = raw["turns"][1]["text"], raw["turns"][3]["text"]
    n_a, n_b = t.audio_tokens
    audio = tokenizer.convert_tokens_to_ids("<audio>")

    def text(s, trained=False):
        return [(i, trained) for i in encode_text(tokenizer, s)]

    expected = ([(tokenizer.bos_token_id, False)] + text("<start_of_turn>user\n") + [(audio, False)] * n_a
                + text(f"{FIRST_QUESTION}<end_of_turn>\n<start_of_turn>model\n") + text(first, True)
                + text("<end_of_turn>", True) + text("\n<start_of_turn>user\nAnd ") + [(audio, False)] * n_b
                + text(" in reverse?<end_of_turn>\n<start_of_turn>model\n") + text(second, True)
                + text("<end_of_turn>", True) + text("\n") + [(tokenizer.eos_token_id, True)])
    ids = [int(i) for i in t.tokens] + [int(t.labels[-1])]
    trained = [False] + [bool(m) for m in t.loss_mask]
    assert list(zip(ids, trained)) == expected
    assert len(example.clips) == 2 and t.ctc is False
    # Generation is scored on the last answer, prompted with everything before it.
    assert t.reference == second
    assert tokenizer.decode(ids[t.answer_start:]).startswith(second)


def test_a_turn_marked_untrained_stays_in_context_only(tokenizer, encoder_cfg, adapter_cfg):
    raw = conversation_samples(1, seed=5)[0]
    raw["turns"][1]["train"] = False
    t = processor(tokenizer, encoder_cfg, adapter_cfg, CONV)(raw, 0, 0).tokenized
    trained_text = tokenizer.decode([int(i) for i, m in zip(t.labels, t.loss_mask) if m])
    assert trained_text == raw["turns"][3]["text"] + "<end_of_turn><eos>"


def test_own_template_takes_each_samples_instruction_and_answer_column(tokenizer, encoder_cfg, adapter_cfg):
    raw = instructed_samples(3, seed=2)[2]
    t = processor(tokenizer, encoder_cfg, adapter_cfg, OWN)(raw, 0, 0).tokenized
    prompt = tokenizer.decode([int(i) for i in t.tokens[:t.answer_start]])
    assert "<start_of_turn>user\nSay word 2: <audio>" in prompt and prompt.endswith("<start_of_turn>model\n")
    assert tokenizer.decode([int(i) for i, m in zip(t.labels, t.loss_mask) if m]) == \
        raw["answer"] + "<end_of_turn><eos>"
    assert t.ctc is False  # not a transcript: no joint CTC target


def test_task_preset_renders_its_instruction_with_the_chat_template(tokenizer, encoder_cfg, adapter_cfg):
    """The transcribe preset through the chat template gives the default template's tokens."""
    raw = tone_samples(1, seed=4)[0]
    preset = processor(tokenizer, encoder_cfg, adapter_cfg, DatasetEntry(name="p", path="", task="transcribe"))
    default = processor(tokenizer, encoder_cfg, adapter_cfg, ASR)
    a, b = preset(raw, 0, 0).tokenized, default(raw, 0, 0).tokenized
    assert a.tokens.tolist() == b.tokens.tolist() and a.loss_mask.tolist() == b.loss_mask.tolist()
    assert a.ctc and b.ctc
    answer = processor(tokenizer, encoder_cfg, adapter_cfg, DatasetEntry(name="q", path="", task="answer"))
    prompt = tokenizer.decode([int(i) for i in answer(raw, 0, 0).tokenized.tokens])
    assert "<audio>\nAnswer the question.<end_of_turn>" in prompt


def test_mixture_of_three_formats_packs_and_resumes_exactly(tokenizer_dir, corpus, tokenizer, encoder_cfg, adapter_cfg):
    cfg = data_config(entries(corpus, ASR, OWN, CONV), seq_length=256, packing_buffer=8)
    loader = build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0, tokenizer_path=str(tokenizer_dir))
    seen = set()
    for _ in range(4):
        batch = next(loader)
        seen.update(batch["sample_datasets"])
        # CTC targets only for the transcription dataset's clips.
        rows = batch["audio_clip_rows"].tolist()
        assert len(rows) == len(batch["audio_clip_ctc"]) == len(batch["audio_num_tokens"])
        assert sum(batch["audio_clip_ctc"].tolist()) == batch["sample_datasets"].count("asr")
    assert seen == {"asr", "own", "conv"}
    state = loader.state_dict()
    expected = [next(loader) for _ in range(3)]
    loader.close()
    resumed = build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0, tokenizer_path=str(tokenizer_dir))
    resumed.load_state_dict(state)
    for want in expected:
        got = next(resumed)
        for key in ("tokens", "labels", "loss_mask", "audio_num_tokens", "audio_clip_ctc", "audio_features"):
            assert got[key].equal(want[key]), key
        assert got["answer_starts"] == want["answer_starts"]
    resumed.close()


def test_long_conversation_is_refused_or_cut_at_a_turn_boundary_and_counted(tokenizer_dir, corpus, tokenizer, encoder_cfg,
                                                                             adapter_cfg):
    raw = conversation_samples(1, seed=5)[0]
    full = processor(tokenizer, encoder_cfg, adapter_cfg, CONV)(raw, 0, 0).tokenized
    first_turn = len(full) - 25  # too short for both exchanges, long enough for the first
    cut = processor(tokenizer, encoder_cfg, adapter_cfg, CONV, seq_length=first_turn,
                    long_conversation="truncate")(raw, 0, 0)
    assert cut.truncated and len(cut.clips) == 1 and len(cut.tokenized.audio_tokens) == 1
    assert cut.tokenized.reference == raw["turns"][1]["text"]
    trained = tokenizer.decode([int(i) for i, m in zip(cut.tokenized.labels, cut.tokenized.loss_mask) if m])
    assert trained == raw["turns"][1]["text"] + "<end_of_turn><eos>"
    with pytest.raises(Exception, match=r"does not fit data.seq_length .*data.long_conversation=truncate"):
        processor(tokenizer, encoder_cfg, adapter_cfg, CONV, seq_length=first_turn)(raw, 0, 0)
    # In the loader: counted per dataset, and kept across a resume.
    cfg = data_config(entries(corpus, CONV), seq_length=first_turn, long_conversation="truncate", packing=False)
    loader = build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0, tokenizer_path=str(tokenizer_dir))
    next(loader)
    counts = loader.sample_counts()
    assert counts.get("truncated_samples/conv", 0) >= 1, counts
    assert loader.state_dict()["truncated_samples"] == {"conv": counts["truncated_samples/conv"]}
    loader.close()


def test_bad_conversation_names_dataset_sample_turn_and_segment(tokenizer_dir, corpus, tmp_path, tokenizer, encoder_cfg,
                                                                adapter_cfg):
    samples = conversation_samples(4, seed=6)
    samples[2]["turns"][2]["audio"] = ["clip_c"]  # a column the sample does not have
    write_mds(tmp_path / "conv", samples, CONVERSATION_COLUMNS)
    cfg = data_config(entries(tmp_path, CONV), shuffle=False, packing=False, seq_length=256)
    loader = build_train_loader(cfg, encoder_cfg, adapter_cfg, 4, seed=0, tokenizer_path=str(tokenizer_dir))
    with pytest.raises(BadSampleError, match=r"dataset conv: shard \S+, sample 2: conversation in column 'turns': "
                                             r"turn 2: audio segment column 'clip_c' is not in the sample"):
        next(loader)
    loader.close()


def test_missing_column_is_refused_before_reading_naming_dataset_column_and_setting(tokenizer_dir, corpus, tokenizer, encoder_cfg,
                                                                                    adapter_cfg):
    cfg = data_config(entries(corpus, ASR, OWN, CONV),
                      validation=entries(corpus, OWN))
    cfg.train[0].text_field = "number"
    with pytest.raises(ValueError, match=r"dataset asr \(\S+asr\) has no column 'number' "
                                         r"\(data\[asr\]\.text_field\); its columns: \['audio', 'text'\]"):
        build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0, tokenizer_path=str(tokenizer_dir))
    cfg.validation[0].instruction_field = "prompt"
    sets = build_validation_loaders(cfg, encoder_cfg, adapter_cfg, 2, tokenizer_path=str(tokenizer_dir))
    with pytest.raises(ValueError, match=r"dataset own .* has no column 'prompt' \(data\[own\]\.instruction_field\)"):
        next(iter(sets["own"]))


def test_validation_sets_carry_their_metric_reference_and_answer_start(tokenizer_dir, corpus, tokenizer, encoder_cfg, adapter_cfg):
    cfg = data_config(validation=entries(corpus, ASR, OWN, CONV, **{"conv": {"metric": "bleu"}}), seq_length=256,
                      packing=False)  # one sample per row, in order
    sets = build_validation_loaders(cfg, encoder_cfg, adapter_cfg, 4, tokenizer_path=str(tokenizer_dir))
    assert {name: s.metric for name, s in sets.items()} == {"asr": "wer", "own": "wer", "conv": "bleu"}
    raws = conversation_samples(12, seed=3)
    batch = next(iter(sets["conv"]))
    assert batch["transcripts"] == [r["turns"][3]["text"] for r in raws[:batch["num_samples"]]]
    tokens, owner = batch["tokens"].reshape(-1), batch["dataset_index"].reshape(-1)
    starts = [s for s in batch["cu_seqlens"].tolist()[:-1] if owner[s] >= 0]  # samples, not row padding
    for k, answer_start in enumerate(batch["answer_starts"]):
        prompt = tokenizer.decode(tokens[starts[k]:starts[k] + answer_start].tolist())
        assert prompt.endswith("in reverse?<end_of_turn>\n<start_of_turn>model\n")
        assert raws[k]["turns"][1]["text"] in prompt  # the earlier answer is context


@pytest.mark.parametrize("change, message", [
    ({"prompt_template": "no marker"}, r"data.train\[x\].prompt_template must contain <SpeechHere> exactly once"),
    ({"task": "dance"}, r"data.train\[x\].task='dance' is not a task preset"),
    ({"instruction_field": "q"}, r"data.train\[x\].instruction_field='q' but data.prompt_template .* has no "
                                 r"\{instruction\}"),
    ({"prompt_template": "{instruction} <SpeechHere>"}, r"data.train\[x\].prompt_template has \{instruction\} but "
                                                        r"data.train\[x\].instruction_field is not set"),
    ({"turns_field": "turns", "text_field": "a"}, r"data.train\[x\]: text_field and turns_field together"),
    ({"turns_field": "turns", "ctc": True}, r"data.train\[x\].ctc=true on a conversation dataset"),
    ({"metric": "exact"}, r"data.train\[x\].metric='exact': a metric scores validation datasets only"),
])
def test_entry_problems_name_the_dataset(change, message):
    cfg = data_config()
    problems = tasks.entry_problems(OmegaConf.structured(DatasetEntry(name="x", path="p", **change)), cfg, "train")
    assert any(__import__("re").search(message, p) for p in problems), problems
    assert tasks.entry_problems(OmegaConf.structured(DatasetEntry(name="x", path="p")), cfg, "train") == []
