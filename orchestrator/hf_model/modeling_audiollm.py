"""AudioLLM model for transformers (remote code of an exported model directory).

    model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
    processor = AutoProcessor.from_pretrained(DIR, trust_remote_code=True)
    inputs = processor(audio=[waveform_16k], return_tensors="pt")
    ids = model.generate(**inputs, max_new_tokens=64)
    text = processor.batch_decode(ids[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

The arithmetic is the project's (orchestrator/models/audiollm.py, speech.py), repeated
here so that the export needs only torch and transformers: the Whisper encoder's layer
outputs (HF's hidden_states[1:]) mixed by softmax weights in fp32, a LayerNorm, groups
of `frame_stack` frames stacked, Linear -> SiLU -> Linear to the decoder's width; the
result replaces the decoder's token embeddings at the audio placeholders, before the
decoder scales its input embeddings (Gemma2 multiplies every input embedding by
sqrt(hidden)). tests/convert/test_hf_model.py holds the tokens to the project's."""

import inspect
from typing import Optional, Sequence

import torch
import transformers
from torch import nn
from transformers import AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.models.whisper.modeling_whisper import WhisperEncoder, WhisperEncoderLayer

from .configuration_audiollm import AudioLLMConfig

# transformers 4.x's WhisperEncoderLayer takes a head mask; 5.x's has none.
_LAYER_KWARGS = {"layer_head_mask": None} if "layer_head_mask" in inspect.signature(
    WhisperEncoderLayer.forward).parameters else {}
# The decoder's output weight is its input embedding (Gemma's are tied): the export
# stores it once. transformers 5 names the tie as a mapping, 4.x as a list.
_TIED = "language_model.lm_head.weight"
_TIED_KEYS = ({_TIED: "language_model.model.embed_tokens.weight"}
              if int(transformers.__version__.split(".")[0]) >= 5 else [_TIED])

# Mel frames kept after the longest clip when the encoder masks padding: conv1 (kernel 3)
# and conv2 (kernel 3, stride 2) read up to 3 frames past a clip's last one.
EDGE_FRAMES = 4


def encoder_frame_count(mel_frames: int) -> int:
    """Encoder output frames of `mel_frames` mel frames (Whisper's conv2: stride 2, pad 1)."""
    return (mel_frames - 1) // 2 + 1 if mel_frames > 0 else 0


def audio_token_count(mel_frames: int, frame_stack: int) -> int:
    """Audio placeholders of a clip: whole groups of `frame_stack` encoder frames."""
    return encoder_frame_count(mel_frames) // frame_stack


class AudioLLMAdapter(nn.Module):
    """Softmax-weighted sum of the encoder's layer outputs -> LayerNorm -> `frame_stack`
    frames stacked -> Linear -> SiLU -> Linear (the project's AudioAdapter, in eval mode)."""

    def __init__(self, num_states: int, d_model: int, hidden_size: int, frame_stack: int, ctc_vocab_size: int = 0):
        super().__init__()
        self.frame_stack = frame_stack
        stacked = frame_stack * d_model
        self.layer_weights = nn.Parameter(torch.zeros(num_states))
        self.norm = nn.LayerNorm(d_model)
        self.linear_1 = nn.Linear(stacked, stacked)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(stacked, hidden_size)
        # The CTC head trained beside the decoder (the vocabulary plus a blank, last).
        self.ctc_head = nn.Linear(hidden_size, ctc_vocab_size + 1) if ctc_vocab_size else None

    def forward(self, states: Sequence[torch.Tensor], mel_lengths: Sequence[int]) -> torch.Tensor:
        weights = torch.softmax(self.layer_weights.float(), dim=0)
        mixed = torch.zeros(states[0].shape, dtype=torch.float32, device=states[0].device)
        for w, state in zip(weights, states):  # in fp32, in layer order, as in training
            mixed += w * state.float()
        mixed = self.norm(mixed.to(self.norm.weight.dtype))
        stacks = []
        for i, mel_len in enumerate(mel_lengths):
            tokens = audio_token_count(int(mel_len), self.frame_stack)
            stacks.append(mixed[i, :tokens * self.frame_stack].reshape(tokens, -1))
        return self.linear_2(self.act(self.linear_1(torch.cat(stacks, dim=0))))


class AudioLLMPreTrainedModel(PreTrainedModel):
    config_class = AudioLLMConfig
    base_model_prefix = "audiollm"
    supports_gradient_checkpointing = False
    _no_split_modules = ["WhisperEncoderLayer"]
    _supports_cache_class = True
    _supports_static_cache = False
    _tied_weights_keys = _TIED_KEYS


class AudioLLMForCausalLM(AudioLLMPreTrainedModel, GenerationMixin):
    """Audio in (log-mel features and their valid frame counts), text out."""

    def __init__(self, config: AudioLLMConfig):
        super().__init__(config)
        text_config = config.text_config
        if getattr(text_config, "_attn_implementation_internal", None) is None and text_config.model_type == "gemma2":
            # Gemma2's attention soft-caps its logits, which only the eager kernel does
            # (the project's decoder caps them too).
            text_config._attn_implementation = "eager"
        self.encoder = WhisperEncoder(config.audio_config)
        self.adapter = AudioLLMAdapter(config.audio_config.encoder_layers, config.audio_config.d_model,
                                       text_config.hidden_size, config.frame_stack, config.ctc_vocab_size)
        self.language_model = AutoModelForCausalLM.from_config(text_config)
        self.post_init()

    # What GenerationMixin and weight tying look up on the model: the decoder's.
    def get_input_embeddings(self):
        return self.language_model.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.language_model.set_input_embeddings(value)

    def get_output_embeddings(self):
        return self.language_model.get_output_embeddings()

    def set_output_embeddings(self, value):
        self.language_model.set_output_embeddings(value)

    def get_decoder(self):
        return self.language_model.get_decoder()

    def audio_embeddings(self, input_features: torch.Tensor, feature_lengths: Sequence[int]) -> torch.Tensor:
        """[clips, mel, frames] log-mel features and each clip's valid frames -> the audio
        embeddings of all clips, in order: [audio tokens, hidden]."""
        encoder = self.encoder
        window = 2 * encoder.config.max_source_positions
        lengths = [int(n) for n in feature_lengths]
        if input_features.shape[-1] > window:
            raise ValueError(f"audio features have {input_features.shape[-1]} mel frames, more than the encoder's "
                             f"window of {window}: cut the audio into windows first")
        if self.config.encoder_mask_padding:  # even, so conv2's stride-2 output covers every kept frame
            width = min(window, max(lengths) + EDGE_FRAMES)
            width += width % 2
        else:
            width = window
        features = input_features.to(encoder.conv1.weight.dtype)
        if features.shape[-1] < width:
            features = nn.functional.pad(features, (0, width - features.shape[-1]))
        features = features[..., :width]
        act = nn.functional.gelu
        hidden = act(encoder.conv2(act(encoder.conv1(features)))).permute(0, 2, 1)
        frames = hidden.shape[1]
        hidden = hidden + encoder.embed_positions.weight[:frames]
        mask = None
        if self.config.encoder_mask_padding:
            valid = torch.tensor([encoder_frame_count(n) for n in lengths], device=hidden.device)
            keys_out = torch.arange(frames, device=hidden.device)[None, :] >= valid[:, None]
            mask = torch.zeros(keys_out.shape, dtype=hidden.dtype, device=hidden.device)
            mask = mask.masked_fill(keys_out, torch.finfo(hidden.dtype).min)[:, None, None, :]
        states = []
        for layer in encoder.layers:
            out = layer(hidden, mask, **_LAYER_KWARGS)
            hidden = out[0] if isinstance(out, tuple) else out
            states.append(hidden)
        states[-1] = encoder.layer_norm(hidden)
        return self.adapter(states, lengths)

    def forward(self, input_ids: Optional[torch.LongTensor] = None, input_features: Optional[torch.Tensor] = None,
                feature_lengths: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.LongTensor] = None, past_key_values=None,
                inputs_embeds: Optional[torch.Tensor] = None, labels: Optional[torch.LongTensor] = None,
                use_cache: Optional[bool] = None, **kwargs):
        """`input_features` [clips, mel, frames] belong to the placeholders of `input_ids`
        in row-major order, `feature_lengths` [clips] their valid mel frames."""
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
            if input_features is not None:
                if feature_lengths is None:
                    raise ValueError("input_features need feature_lengths (each clip's valid mel frames)")
                audio = self.audio_embeddings(input_features, feature_lengths.tolist())
                placeholders = input_ids == self.config.audio_token_id
                if int(placeholders.sum()) != audio.shape[0]:
                    raise ValueError(f"input_ids hold {int(placeholders.sum())} audio placeholders (id "
                                     f"{self.config.audio_token_id}) but the audio makes {audio.shape[0]} audio "
                                     f"tokens: build the inputs with the processor")
                audio = audio.to(inputs_embeds.dtype)
                # Gemma's decoders scale every input embedding by sqrt(hidden): transformers
                # 4.x scales inputs_embeds inside the decoder (the audio with them), 5.x in the
                # embedding module, which the audio does not pass through: scaled here then.
                scale = getattr(self.get_input_embeddings(), "embed_scale", None)
                if scale is not None:
                    audio = audio * scale.to(audio.dtype)
                inputs_embeds = inputs_embeds.masked_scatter(placeholders[..., None], audio)
        # The KV cache goes on under the name this release gives it: past_key_values, or
        # (transformers 5.24 on) `cache`, which arrives in kwargs.
        if past_key_values is not None:
            kwargs["past_key_values"] = past_key_values
        return self.language_model(attention_mask=attention_mask, position_ids=position_ids,
                                   inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache, **kwargs)

    def prepare_inputs_for_generation(self, input_ids, *args, input_features=None, feature_lengths=None, **kwargs):
        inputs = super().prepare_inputs_for_generation(input_ids, *args, **kwargs)
        # The audio goes in with the prompt only: later steps feed the new token alone. The
        # KV cache is `past_key_values` before transformers 5.24 and `cache` from it on.
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is None or cache.get_seq_length() == 0:
            inputs["input_features"], inputs["feature_lengths"] = input_features, feature_lengths
        return inputs

