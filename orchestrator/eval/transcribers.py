"""The two models `audiollm transcribe` answers with, behind one interface:

    transcriber.window_samples           16-kHz samples of the encoder's window
    transcriber.min_samples              the shortest audio that gives one audio token
    transcriber.answer(clips, template)  greedy answers, one per clip (<= the window)
    transcriber.close()

- RunTranscriber: a run's checkpoint, in this process at TP = PP = 1 (as `audiollm eval`
  loads it: dist_checkpointing reshards any layout), decoded by the project's own
  greedy_generate with the run's joint CTC/attention weight (the one eval uses);
- ExportTranscriber: an exported model directory (orchestrator/convert/audiollm_dir.py)
  through transformers' AutoModelForCausalLM / AutoProcessor and `generate`, greedy;
- ReleasedTranscriber: a released Voxtral or Qwen2-Audio directory (the release, or a
  fine-tune given back as its class) through its own class and processor, greedy.

The first two build the prompt as the data side does (PromptBuilder: bos, the template's
text around <SpeechHere>, one placeholder per audio token); the released models' processors
make the prompts the project's recipes train on (tests/data/test_released_prompts.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from orchestrator.plan.tasks import SPEECH_MARKER


def prompt_template(tokenizer, prompt: Optional[str], default: str) -> str:
    """`--prompt` as a template: with <SpeechHere>, the whole template (as
    data.prompt_template); without, the user's instruction with the audio after it,
    rendered as a user turn by the tokenizer's chat template; none: `default`."""
    if prompt is None:
        return default
    if SPEECH_MARKER in prompt:
        return prompt
    from orchestrator.data.prompts import chat_user_template

    return chat_user_template(tokenizer, f"{prompt.rstrip()} {SPEECH_MARKER}")


def released_model_type(path: Path) -> Optional[str]:
    """The model_type of a released speech LLM's directory (Voxtral, Qwen2-Audio: what
    `convert megatron-to-hf --layout released` writes, or the release itself); None otherwise."""
    from orchestrator.plan.released_models import released

    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    model_type = json.loads(config.read_text()).get("model_type")
    return model_type if released(model_type) else None


def is_exported_model(path: Path) -> bool:
    from orchestrator.convert.audiollm_dir import MODEL_TYPE

    config = Path(path) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("model_type") == MODEL_TYPE


class _NoData:
    """The model built as evaluation builds it, with no data to read."""

    dataset_names: List[str] = []


class RunTranscriber:
    def __init__(self, run_dir: Path, checkpoint: Path, ctc_weight: Optional[float] = None,
                 max_new_tokens: Optional[int] = None, prompt: Optional[str] = None):
        from orchestrator.data.prompts import PromptBuilder
        from orchestrator.data.tokenizer_build import load_tokenizer
        from orchestrator.scoring.asr import default_stop_ids
        from orchestrator.plan.adapter_kinds import frames_per_token
        from orchestrator.plan.model_params import audio_token_count
        from orchestrator.train import checkpoint as ckpt
        from orchestrator.train.audiollm_provider import AudioLLMProvider, audiollm_config
        from orchestrator.train.entry import make_trainer, setup_logging
        from orchestrator.eval.evaluate import check_frozen_source, evaluation_plan, single_process_env, \
            single_rank_plan
        from orchestrator.train.loop import Components

        plan = evaluation_plan(Path(run_dir), ctc_weight)  # refuses a weight the model has no head for
        head = float(plan.section("model").get("adapter", {}).get("ctc_weight", 0.0)) > 0
        self.ctc_weight = float(plan.section("train").get("eval_generation_ctc_weight", 0.0)) if head else 0.0
        check_frozen_source(Path(checkpoint))
        single_process_env()
        setup_logging(0)
        logging.getLogger().setLevel(logging.WARNING)  # the answers on stdout, problems on stderr: no notices
        plan = single_rank_plan(plan)
        cfg = audiollm_config(plan)
        self.trainer = make_trainer(run_dir, lambda p, rank, size: Components(
            provider=AudioLLMProvider.from_plan(p), train_source=_NoData()), plan=plan,
            training=False)
        ckpt.load_model_weights(Path(checkpoint), self.trainer.chunks)
        self.model = self.trainer.unwrapped[0].eval()
        self.device = next(self.model.parameters()).device
        self.tokenizer = load_tokenizer(cfg.data.tokenizer, cfg.data.audio_token)
        self.stop_ids = default_stop_ids(self.tokenizer, cfg.data.response_suffix)
        self.max_new_tokens = int(max_new_tokens or cfg.train.eval_generation_max_new_tokens)
        self.mel_bins = int(cfg.model.encoder.num_mel_bins)
        self.window_frames = 2 * int(cfg.model.encoder.max_source_positions)
        per_token = frames_per_token(cfg.model.adapter)
        self.audio_tokens = str(cfg.data.audio_tokens)
        self.window_samples = self.window_frames * 160
        self.min_samples = 160 * (2 * per_token - 2) + 1  # the mel frames of one audio token
        self._tokens = lambda frames: audio_token_count(int(frames), per_token)
        template = prompt_template(self.tokenizer, prompt, cfg.data.prompt_template)
        self.builder = PromptBuilder(self.tokenizer, template, cfg.data.response_suffix, cfg.data.add_bos,
                                     audio_token=cfg.data.audio_token)

    def answer(self, clips: Sequence[np.ndarray]) -> List[str]:
        from orchestrator.data import mel
        from orchestrator.data.frames import read_frames
        from orchestrator.models.generate import greedy_generate

        features, valid = mel.features(list(clips), self.mel_bins, self.window_frames)
        lengths = [read_frames(int(n), self.window_frames, self.audio_tokens) for n in valid.tolist()]
        prompts = []
        for n in lengths:
            sample = self.builder.build("-", [self._tokens(n)])
            prompts.append(sample.tokens.tolist()[:sample.answer_start])
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        ids = greedy_generate(self.model, prompts, features.to(self.device), lengths, self.stop_ids,
                              max_new_tokens=self.max_new_tokens, pad_id=pad, ctc_weight=self.ctc_weight,
                              ctc_rows=[True] * len(prompts))  # (greedy_generate runs without autograd)
        return [self.tokenizer.decode(x, skip_special_tokens=True) for x in ids]

    def close(self) -> None:
        from orchestrator.runtime.distributed import shutdown

        shutdown()


class ExportTranscriber:
    def __init__(self, export_dir: Path, device: str, max_new_tokens: Optional[int] = None,
                 prompt: Optional[str] = None):
        from transformers import AutoModelForCausalLM, AutoProcessor

        self.model = AutoModelForCausalLM.from_pretrained(str(export_dir), trust_remote_code=True).to(device).eval()
        self.processor = AutoProcessor.from_pretrained(str(export_dir), trust_remote_code=True)
        self.device = device
        self.ctc_weight = 0.0
        self.max_new_tokens = max_new_tokens
        self.window_samples = self.processor.window_samples
        self.min_samples = 160 * (2 * self.processor.frame_stack - 2) + 1
        self.template = prompt_template(self.processor.tokenizer, prompt, self.processor.prompt_template)

    def answer(self, clips: Sequence[np.ndarray]) -> List[str]:
        import torch

        inputs = self.processor(audio=list(clips), text=self.template).to(self.device)
        extra = {"max_new_tokens": self.max_new_tokens} if self.max_new_tokens else {}
        with torch.no_grad():
            ids = self.model.generate(**inputs, do_sample=False, **extra)
        return self.processor.batch_decode(ids[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

    def close(self) -> None:
        pass


class ReleasedTranscriber:
    """A released speech LLM's directory through its own class, processor and `generate`,
    greedy, asked as the project's recipes train it (orchestrator/plan/released_models.py):
    Voxtral with its transcription request in English (a clip of up to 30 s is one window),
    Qwen2-Audio-Instruct with its chat template's user turn of the clip and the instruction
    (--prompt: another instruction)."""

    def __init__(self, model_dir: Path, device: str, max_new_tokens: Optional[int] = None,
                 prompt: Optional[str] = None):
        import transformers
        from transformers import AutoProcessor

        from orchestrator.plan.released_models import released

        self.kind = released_model_type(model_dir)
        if self.kind == "voxtral" and prompt is not None:
            raise ValueError(f"--prompt: {model_dir} is a Voxtral model, asked with its transcription request "
                             f"(no instruction); leave --prompt out")
        self.model_dir, self.device, self.ctc_weight = str(model_dir), device, 0.0
        cls = getattr(transformers, released(self.kind).hf_class)
        self.model = cls.from_pretrained(self.model_dir).to(device).eval()
        self.processor = AutoProcessor.from_pretrained(self.model_dir)
        self.max_new_tokens = max_new_tokens or 128
        features = self.processor.feature_extractor
        self.window_samples = int(features.n_samples)  # the encoder's window (30 s in the releases)
        self.min_samples = 160 * 2 + 1
        self.instruction = prompt or "Transcribe the speech."
        if self.kind == "qwen2_audio":
            self.processor.tokenizer.padding_side = "left"  # a batch of prompts generates on from their ends

    def _inputs(self, clips: Sequence[np.ndarray]):
        if self.kind == "voxtral":
            return self.processor.apply_transcription_request(language="en", audio=list(clips), model_id=self.model_dir,
                                                              sampling_rate=16000, format=["wav"] * len(clips))
        turn = [{"role": "user", "content": [{"type": "audio", "audio_url": "clip"},
                                             {"type": "text", "text": self.instruction}]}]
        text = self.processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
        inputs = self.processor(text=[text] * len(clips), audio=list(clips), sampling_rate=16000, padding=True,
                                return_tensors="pt")
        inputs.pop("token_type_ids", None)
        return inputs

    def answer(self, clips: Sequence[np.ndarray]) -> List[str]:
        import torch

        inputs = self._inputs(clips).to(self.device)
        with torch.no_grad():
            ids = self.model.generate(**inputs, do_sample=False, max_new_tokens=self.max_new_tokens)
        return self.processor.batch_decode(ids[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

    def close(self) -> None:
        pass
