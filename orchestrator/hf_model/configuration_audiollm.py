"""AudioLLM configuration for transformers (remote code of an exported model directory).

A Whisper encoder, an adapter that mixes its layers and stacks `frame_stack` frames into
one decoder embedding, and a causal decoder (`text_config`: its own model type, built
with AutoModelForCausalLM). Self-contained: torch and transformers only."""

from transformers import AutoConfig, PretrainedConfig, WhisperConfig


class AudioLLMConfig(PretrainedConfig):
    model_type = "audiollm"

    def __init__(self, text_config=None, audio_config=None, audio_token_id=None, frame_stack=5,
                 ctc_vocab_size=0, encoder_mask_padding=False, **kwargs):
        """`audio_token_id`: the placeholder id in input_ids where the audio embeddings go,
        one per `frame_stack` encoder frames. `encoder_mask_padding`: the encoder runs on
        the batch's longest clip with attention kept inside each clip (as trained with
        model.encoder.mask_padding); otherwise on Whisper's whole window. `ctc_vocab_size`:
        the adapter's CTC head's vocabulary (0: no head)."""
        if isinstance(text_config, dict):
            text_config = dict(text_config)
            text_config = AutoConfig.for_model(text_config.pop("model_type", "gemma2"), **text_config)
        if isinstance(audio_config, dict):
            audio_config = WhisperConfig(**{k: v for k, v in audio_config.items() if k != "model_type"})
        self.text_config = text_config
        self.audio_config = audio_config
        self.audio_token_id = audio_token_id
        self.frame_stack = int(frame_stack)
        self.ctc_vocab_size = int(ctc_vocab_size)
        self.encoder_mask_padding = bool(encoder_mask_padding)
        super().__init__(**kwargs)

    def to_dict(self):
        out = super().to_dict()
        for key in ("text_config", "audio_config"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value.to_dict()
        return out
