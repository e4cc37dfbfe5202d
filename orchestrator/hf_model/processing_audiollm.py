"""AudioLLM processor for transformers (remote code of an exported model directory):
16-kHz mono audio -> Whisper log-mel features over the encoder's window, and the prompt
with one audio placeholder per `frame_stack` encoder frames, as the project's data side
builds it (orchestrator/data/prompts.py PromptBuilder: bos, the template's text before
<SpeechHere> and after it, each tokenized alone, the placeholders between them).

    processor(audio=[waveform, ...], sampling_rate=16000, text=None | template | [templates])

`text`: prompt templates with <SpeechHere> once (default: the run's data.prompt_template);
prompts are padded on the left, for generation. Self-contained: torch, numpy and
transformers only."""

from typing import List, Optional, Sequence, Union

import numpy as np
import torch
import transformers
from transformers import BatchFeature, ProcessorMixin

SPEECH_MARKER = "<SpeechHere>"


def encoder_frame_count(mel_frames: int) -> int:
    return (mel_frames - 1) // 2 + 1 if mel_frames > 0 else 0


class AudioLLMProcessor(ProcessorMixin):
    attributes = ["feature_extractor", "tokenizer"]
    # transformers 5 reads the parts' classes from their saved configs (and warns at names
    # given here); 4.x needs them named.
    if int(transformers.__version__.split(".")[0]) < 5:
        feature_extractor_class = "WhisperFeatureExtractor"
        tokenizer_class = "AutoTokenizer"
    # The keywords processor_config.json gives __init__ (4.x warns at others).
    valid_kwargs = ["chat_template", "prompt_template", "audio_token", "frame_stack", "add_bos"]

    def __init__(self, feature_extractor=None, tokenizer=None, prompt_template: Optional[str] = None,
                 audio_token: str = "<audio>", frame_stack: int = 5, add_bos: bool = True, chat_template=None,
                 **kwargs):
        # Set before ProcessorMixin's init, which takes only its own keywords; saved with
        # the processor (processor_config.json) as attributes of it.
        self.prompt_template = prompt_template
        self.audio_token = audio_token
        self.frame_stack = int(frame_stack)
        self.add_bos = bool(add_bos)
        super().__init__(feature_extractor, tokenizer, chat_template=chat_template)

    @property
    def audio_token_id(self) -> int:
        return int(self.tokenizer.convert_tokens_to_ids(self.audio_token))

    @property
    def window_samples(self) -> int:
        return int(self.feature_extractor.n_samples)

    def prompt_ids(self, template: str, placeholders: int) -> List[int]:
        if template.count(SPEECH_MARKER) != 1:
            raise ValueError(f"a prompt must hold {SPEECH_MARKER} once, where the audio goes: {template!r}")
        before, after = template.split(SPEECH_MARKER)
        ids = [self.tokenizer.bos_token_id] if self.add_bos else []
        for piece, audio in ((before, placeholders), (after, 0)):
            if piece:
                ids += list(self.tokenizer(piece, add_special_tokens=False)["input_ids"])
            ids += [self.audio_token_id] * audio
        return ids

    def __call__(self, audio: Union[np.ndarray, Sequence[np.ndarray]] = None, text: Union[None, str, Sequence[str]] = None,
                 sampling_rate: int = 16000, return_tensors: str = "pt", **kwargs) -> BatchFeature:
        """`audio`: one clip or a list, mono float at `sampling_rate` (the feature
        extractor's, 16 kHz), each at most the encoder's window. Returns input_ids and
        attention_mask (left-padded), input_features [clips, mel, window] and
        feature_lengths (each clip's valid mel frames)."""
        if audio is None:
            raise ValueError("the AudioLLM processor needs audio (one clip per prompt)")
        clips = [audio] if isinstance(audio, np.ndarray) and audio.ndim == 1 else list(audio)
        clips = [np.asarray(c, dtype=np.float32) for c in clips]
        if sampling_rate != self.feature_extractor.sampling_rate:
            raise ValueError(f"audio at {sampling_rate} Hz; the model reads {self.feature_extractor.sampling_rate} Hz "
                             f"(resample it first)")
        for i, clip in enumerate(clips):
            if clip.ndim != 1 or clip.size == 0:
                raise ValueError(f"audio clip {i}: expected mono samples [time], got shape {clip.shape}")
            if clip.size > self.window_samples:
                raise ValueError(f"audio clip {i} lasts {clip.size / sampling_rate:.2f} s, longer than the encoder's "
                                 f"window of {self.window_samples / sampling_rate:.0f} s: cut it into windows first")
        templates = [text] * len(clips) if text is None or isinstance(text, str) else list(text)
        if len(templates) != len(clips):
            raise ValueError(f"{len(templates)} prompts for {len(clips)} audio clips")
        templates = [t if t is not None else self.prompt_template for t in templates]
        if any(t is None for t in templates):
            raise ValueError("no prompt: give text= with <SpeechHere>, or save the processor with a prompt_template")
        feats = self.feature_extractor(clips, sampling_rate=sampling_rate, return_tensors="pt", padding="max_length",
                                       return_attention_mask=True)
        lengths = feats["attention_mask"].sum(-1).long()
        prompts = [self.prompt_ids(t, encoder_frame_count(int(n)) // self.frame_stack)
                   for t, n in zip(templates, lengths)]
        longest = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        input_ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts], dtype=torch.long)
        attention = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        return BatchFeature({"input_ids": input_ids, "attention_mask": attention,
                             "input_features": feats["input_features"], "feature_lengths": lengths},
                            tensor_type=return_tensors)

    def batch_decode(self, *args, **kwargs):
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)

    @property
    def model_input_names(self):
        return ["input_ids", "attention_mask", "input_features", "feature_lengths"]
