"""AudioLLM configuration for transformers (remote code of an exported model directory).

A Whisper encoder, an adapter that mixes its layers and stacks `frame_stack` frames into
one decoder embedding, and a causal decoder (`text_config`: its own model type, built
with AutoModelForCausalLM). Self-contained: torch and transformers only."""

import transformers
from transformers import AutoConfig, PretrainedConfig, WhisperConfig

# The first transformers release with each decoder family's model (text_config's
# model_type): an older one cannot build the decoder, and says so in these terms.
DECODER_SINCE = {"gemma2": "4.42", "llama": "4.43", "qwen2": "4.37", "qwen3": "4.51", "gemma3_text": "4.50"}


def text_config_for(model_type: str, values: dict):
    """The decoder's config of `model_type`, or an error naming the release it needs."""
    try:
        return AutoConfig.for_model(model_type, **values)
    except (KeyError, ValueError) as err:
        since = DECODER_SINCE.get(model_type)
        raise ValueError(
            f"this AudioLLM's decoder is a {model_type!r} model, which transformers {transformers.__version__} "
            f"does not have: " + (f"install transformers>={since}" if since else "install a transformers release "
                                  "that has it") + f" ({err})") from err


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
            text_config = text_config_for(text_config.pop("model_type", "gemma2"), text_config)
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
