"""The AudioLLM's transformers pipeline (remote code of an exported model directory):

    from transformers import pipeline
    asr = pipeline(model=DIR, trust_remote_code=True)      # task automatic-speech-recognition
    asr("speech.wav")                          # {"text": "..."}
    asr({"raw": samples, "sampling_rate": 16000}, prompt="What number was said? <SpeechHere>")

Task "automatic-speech-recognition": what the model is trained for first, and the name
under which users call ASR models; config.json's `custom_pipelines` names this class for
it, so with trust_remote_code=True it takes the place of transformers' own ASR pipeline
(which runs CTC and encoder-decoder models, not a decoder fed by an adapter) for this
model only, and is the one `pipeline(model=DIR)` infers. Output as that pipeline's:
{"text": answer}. Inputs: a file path or its bytes (read with soundfile where installed,
else ffmpeg), a 16-kHz mono array, or {"raw" | "array": samples, "sampling_rate": rate}
(other rates resampled with the band-limited resampler `audiollm transcribe` uses,
resample_audiollm.py). A recording longer than the encoder's window is answered as
`audiollm transcribe` answers it: its windows, cut where it is quietest and overlapping, in
one batch, the answers joined with the words the overlaps repeat said once
(longform_audiollm.py). Self-contained: torch, numpy and transformers only."""

import numpy as np
from transformers import AutoProcessor, Pipeline

from .longform_audiollm import merge, windows
from .resample_audiollm import resample

RATE = 16000


def _read(data: bytes) -> np.ndarray:
    try:
        import io

        import soundfile

        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
        return _at_rate(samples.mean(axis=1), rate)
    except ImportError:
        from transformers.pipelines.audio_utils import ffmpeg_read

        return ffmpeg_read(data, RATE)


def _at_rate(samples: np.ndarray, rate: int) -> np.ndarray:
    """At 16 kHz, through the band-limited resampler `audiollm transcribe` uses."""
    return resample(np.asarray(samples, dtype=np.float32), rate, RATE)


class AudioLLMPipeline(Pipeline):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.audio_processor = AutoProcessor.from_pretrained(self.model.name_or_path, trust_remote_code=True)

    def _sanitize_parameters(self, prompt=None, max_new_tokens=None, **kwargs):
        return ({"prompt": prompt} if prompt else {}), ({"max_new_tokens": max_new_tokens} if max_new_tokens else {}), {}

    def preprocess(self, inputs, prompt=None):
        if isinstance(inputs, str):
            with open(inputs, "rb") as handle:
                inputs = handle.read()
        if isinstance(inputs, (bytes, bytearray)):
            samples = _read(bytes(inputs))
        elif isinstance(inputs, dict):
            samples = inputs.get("raw", inputs.get("array"))
            samples = _at_rate(np.asarray(samples, dtype=np.float32), int(inputs.get("sampling_rate", RATE)))
        else:
            samples = np.asarray(inputs, dtype=np.float32)
        if samples.ndim == 2:  # [time, channels]
            samples = samples.mean(axis=1)
        # A recording longer than the encoder's window: its windows, answered together (one row each).
        clips = [samples[start:end] for start, end in windows(samples, self.audio_processor.window_samples)]
        return self.audio_processor(audio=clips, text=prompt)

    def _forward(self, model_inputs, max_new_tokens=None):
        extra = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
        ids = self.model.generate(**model_inputs, do_sample=False, **extra)
        return {"ids": ids[:, model_inputs["input_ids"].shape[1]:]}

    def postprocess(self, model_outputs):
        answers = self.audio_processor.batch_decode(model_outputs["ids"], skip_special_tokens=True)
        return {"text": merge([a.strip() for a in answers if a.strip()])}
