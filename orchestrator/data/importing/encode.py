"""One record -> one sample: read the audio's part (offset, duration), average the
channels, resample to the target rate, encode as 16-bit FLAC (or WAV); or the reason
the record is bad. Runs in the import's worker processes: numpy and soundfile only.

The part of the file a record names is read at the file's own rate, then resampled:
a segment [a, b) s holds the file's samples round(a * rate) .. round(b * rate) - 1.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any, Dict, Tuple, Union

import numpy as np
import soundfile as sf

from orchestrator.data.importing.records import AudioRef, BadRecord, Record
from orchestrator.hf_model.resample_audiollm import resample

# Manifests round durations and segment times (NeMo's to 2-3 decimals): a clip that ends
# at most this far past the end of its file is read to the end; further is a bad record
# (the manifest describes other audio than the file holds).
END_TOLERANCE_S = 0.1
AUDIO_FORMATS = {"flac": ("FLAC", "PCM_16"), "wav": ("WAV", "PCM_16")}


@dataclass(frozen=True)
class EncodeOptions:
    sample_rate: int = 16000
    audio_format: str = "flac"
    probe: bool = False  # a dry run: read the audio's header only and return the clip's seconds


Result = Union[Dict[str, Any], float, BadRecord]


def process(task: Tuple[Record, EncodeOptions]) -> Result:
    """The sample of `record` (a dict of MDS columns); with opts.probe its seconds."""
    record, opts = task

    def bad(kind: str, reason: str) -> BadRecord:
        return BadRecord(record.index, record.where, record.key, kind, reason)

    ref = record.audio
    if ref.hf is not None:
        from orchestrator.data.importing import hf

        try:
            ref = hf.fetch(ref)
        except Exception as err:  # a damaged Arrow file raises whatever pyarrow raises
            return bad("unreadable_audio", f"cannot read {record.audio.describe()}: {type(err).__name__}: {err}")
    source, what = _source(ref)
    if isinstance(source, tuple):
        return bad(*source)
    try:
        with sf.SoundFile(source) as f:
            rate, frames = int(f.samplerate), int(f.frames)
            span = _span(ref, rate, frames)
            if isinstance(span, tuple) and isinstance(span[0], str):
                return bad(*span)
            start, stop = span
            if opts.probe:
                return (stop - start) / rate
            f.seek(start)
            samples = f.read(stop - start, dtype="float32", always_2d=True)
    except Exception as err:  # libsndfile and soundfile raise several types; all mean "not decodable"
        return bad("unreadable_audio", f"cannot decode {what}: {type(err).__name__}: {err}")
    got, wanted = samples.shape[0], stop - start
    if wanted - got > END_TOLERANCE_S * rate:
        return bad("unreadable_audio", f"{what} is cut short: its header announces {frames} samples, "
                                       f"and samples {start + got} to {stop} could not be read")
    if got == 0:
        return bad("empty_audio", f"{what} has no samples in [{start / rate:.3f}, {stop / rate:.3f}) s")
    mono = samples[:, 0] if samples.shape[1] == 1 else samples.mean(axis=1)
    if not np.isfinite(mono).all():
        return bad("empty_audio", f"{what} holds NaN or infinite samples")
    audio = resample(mono, rate, opts.sample_rate)
    return {"audio": encode(audio, opts.sample_rate, opts.audio_format), "text": record.text,
            "duration": audio.shape[0] / opts.sample_rate, "key": record.key, **record.fields}


def _source(ref: AudioRef):
    """(file path or file object for soundfile, description), or ((kind, reason), None)."""
    what = ref.describe()
    if ref.member is not None:
        offset, size = ref.member
        try:
            with open(ref.path, "rb") as f:
                f.seek(offset)
                data = f.read(size)
        except OSError as err:
            return ("missing_file", f"cannot read {what}: {err}"), None
        return io.BytesIO(data), what
    if ref.data is not None:
        if not ref.data:
            return ("unreadable_audio", "the audio is empty (0 bytes)"), None
        return io.BytesIO(ref.data), what
    if not os.path.exists(ref.path):
        return ("missing_file", f"audio file {ref.path} does not exist"), None
    return ref.path, what


def _span(ref: AudioRef, rate: int, frames: int):
    """(start, stop) samples of the clip, or (kind, reason) when it is outside the audio."""
    length = frames / rate
    start = round(ref.offset * rate)
    if frames <= 0:
        return "empty_audio", f"{ref.describe()} has no samples"
    if start >= frames:
        return "offset_beyond_file", (f"offset {ref.offset:.3f} s is at or past the end of {ref.describe()} "
                                      f"({length:.3f} s long)")
    if ref.duration is None:
        return start, frames
    stop = round((ref.offset + ref.duration) * rate)
    if stop - frames > END_TOLERANCE_S * rate:
        return "offset_beyond_file", (f"clip [{ref.offset:.3f}, {ref.offset + ref.duration:.3f}) s ends "
                                      f"{(stop - frames) / rate:.3f} s past the end of {ref.describe()} "
                                      f"({length:.3f} s long; at most {END_TOLERANCE_S} s is read as rounding)")
    return start, min(stop, frames)


def encode(samples: np.ndarray, rate: int, audio_format: str = "flac") -> bytes:
    """Mono float samples -> 16-bit FLAC or WAV bytes (what orchestrator.data.audio
    decodes; FLAC as the demo corpus stores it)."""
    container, subtype = AUDIO_FORMATS[audio_format]
    buf = io.BytesIO()
    sf.write(buf, np.clip(samples, -1.0, 1.0), rate, format=container, subtype=subtype)
    return buf.getvalue()
