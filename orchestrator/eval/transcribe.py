"""`audiollm transcribe SOURCE AUDIO... [--step N|best] [--prompt P] [--batch N] [--format text|jsonl]`

Answers recordings with a trained AudioLLM. SOURCE is a run directory (its latest
checkpoint, `--step N` or `--step best`), a training checkpoint (RUN/checkpoints/step_N)
or a model directory `audiollm convert megatron-to-hf` wrote
(orchestrator/eval/transcribers.py says how each is run).

Audio: wav, flac, ogg and mp3 (what the installed libsndfile decodes; 16-bit FLAC through
dr_flac), any sample rate and channel count, made 16-kHz mono (channels averaged, the
project's band-limited resampler). A recording longer than the encoder's window (30 s for
Whisper, 5 s for the tiny model) is cut into windows, each answered alone: each ends where
the audio is quietest in its last fifth, the next starts a tenth of a window before that
cut, and the words the overlap repeats are said once when the answers are joined
(orchestrator/hf_model/longform_audiollm.py, which an exported model's pipeline shares; its
limits are written there). A recording too short for one audio token is skipped. An
unreadable file is named on stderr and skipped; the others are answered,
and the exit status is then 1.

Output (stdout): `--format text`, the answer alone for one file, `FILE<TAB>ANSWER` per
line for several; `--format jsonl`, one {"file", "text", "seconds"} per line, then one
line of the decoding speed (below). A progress bar over the files goes to stderr when it
is a terminal.

Speed: RTFx, the audio seconds answered over the seconds spent answering them, timed
after a warm-up (the first batch is answered once more before it is timed, and that
answer thrown away: the first call pays for allocations and kernel choices), with the
batch size and the device: jsonl's last line {"rtfx", "audio_seconds", "decode_seconds",
"batch", "device", "warmup": true} (it has no "file"); on stderr with --format text."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from orchestrator.hf_model.longform_audiollm import merge, windows

FORMATS = ("text", "jsonl")
# libsndfile names the in-memory file it was given: nothing a user can act on.
_BUFFER = re.compile(r"Error opening <_io\.BytesIO object at 0x[0-9a-f]+>: ")


class _File:
    def __init__(self, name: str, seconds: float, pieces: int):
        self.name, self.seconds = name, seconds
        self.answers: List[Optional[str]] = [None] * pieces

    @property
    def done(self) -> bool:
        return all(a is not None for a in self.answers)

    @property
    def text(self) -> str:
        return merge([a.strip() for a in self.answers if a and a.strip()])


def read_recording(path: str):
    """16-kHz mono float32 samples of an audio file; AudioError/OSError when unreadable."""
    from orchestrator.data.audio import load_audio

    return load_audio(Path(path).read_bytes(), None, 16000)


def pieces(samples, window: int, shortest: int) -> list:
    """The recording's windows of at most `window` samples, cut where it is quietest and
    overlapping (orchestrator/hf_model/longform_audiollm.py); none for a recording shorter
    than `shortest`."""
    if len(samples) < shortest:
        return []
    return [samples[start:end] for start, end in windows(samples, window)]


class Speed:
    """Audio seconds answered (the recordings', counted once however their windows
    overlap) and the seconds answering them took, after a warm-up."""

    def __init__(self):
        self.audio_seconds = self.decode_seconds = 0.0
        self.warm = False

    def answer(self, transcriber, clips: list) -> List[str]:
        if not self.warm:  # the warm-up: the first batch once, untimed and thrown away
            transcriber.answer(clips)
            self.warm = True
        began = time.perf_counter()
        answers = transcriber.answer(clips)
        self.decode_seconds += time.perf_counter() - began
        return answers

    @property
    def rtfx(self) -> float:
        return self.audio_seconds / self.decode_seconds if self.decode_seconds else 0.0


def transcribe_files(transcriber, files: Sequence[str], batch: int, emit, warn, progress: bool = False,
                     speed: Optional[Speed] = None) -> int:
    """Answer each file (in order: `emit(_File)` as soon as it and those before it are
    done); `warn(message)` for each unreadable one; the decoding speed into `speed`.
    Returns how many were skipped."""
    from tqdm import tqdm

    from orchestrator.data.audio import AudioError

    queue, pending, skipped = [], [], 0
    speed = speed or Speed()

    def run(count: int) -> None:
        work, queue[:] = queue[:count], queue[count:]
        for (entry, index, _), answer in zip(work, speed.answer(transcriber, [clip for _, _, clip in work])):
            entry.answers[index] = answer
        while pending and pending[0].done:
            emit(pending.pop(0))

    for path in tqdm(files, unit="file", disable=not progress, file=sys.stderr):
        try:
            samples = read_recording(path)
        except (AudioError, OSError) as exc:
            warn(f"{path}: skipped: {_BUFFER.sub('', str(exc))}")
            skipped += 1
            continue
        cut = pieces(samples, transcriber.window_samples, transcriber.min_samples)
        if not cut:
            warn(f"{path}: skipped: {len(samples) / 16000:.3f} s of audio is too short for one audio token "
                 f"({transcriber.min_samples} samples at 16 kHz)")
            skipped += 1
            continue
        entry = _File(path, len(samples) / 16000, len(cut))
        speed.audio_seconds += entry.seconds
        pending.append(entry)
        queue += [(entry, i, piece) for i, piece in enumerate(cut)]
        while len(queue) >= batch:
            run(batch)
    while queue:
        run(batch)
    return skipped


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="audiollm transcribe", description=__doc__.split("\n\n")[1])
    parser.add_argument("source", type=Path, help="a run directory, a training checkpoint, an exported model "
                        "directory, or a Voxtral or Qwen2-Audio directory (a release, or a fine-tune given back as "
                        "its class)")
    parser.add_argument("audio", nargs="+", help="audio files (wav, flac, ogg, mp3)")
    parser.add_argument("--step", default=None, help="with a run directory: the checkpoint at this step, or `best` "
                        "(RUN/eval/best.json); default: the latest")
    parser.add_argument("--prompt", default=None, help="the prompt: a template with <SpeechHere> where the audio "
                        "goes, or an instruction the audio follows (rendered as a user turn by the tokenizer's chat "
                        "template); default: the run's data.prompt_template (a Qwen2-Audio directory: the "
                        "instruction of its chat turn, default 'Transcribe the speech.'; Voxtral takes none)")
    parser.add_argument("--batch", type=int, default=8, help="audio windows answered together (default 8)")
    parser.add_argument("--format", choices=FORMATS, default="text", help="text (default) or jsonl: one "
                        '{"file", "text", "seconds"} per line, then {"rtfx", "audio_seconds", "decode_seconds", '
                        '"batch", "device", "warmup"}')
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="answer length bound (default: the run's train.eval_generation_max_new_tokens)")
    parser.add_argument("--ctc-weight", type=float, default=None,
                        help="a run's checkpoint: joint CTC/attention decoding at this weight (default: the run's "
                             "train.eval_generation_ctc_weight, as `audiollm eval`; 0: the decoder alone)")
    parser.add_argument("--device", default=None, help="an exported model: cpu or cuda (default: cuda when there "
                        "is one); a run's checkpoint runs where its job would (a GPU when there is one)")
    return parser


def open_transcriber(args):
    """The transcriber SOURCE asks for; ValueError / FileNotFoundError naming what is wrong."""
    from orchestrator.eval.transcribers import (ExportTranscriber, ReleasedTranscriber, RunTranscriber,
                                                is_exported_model, released_model_type)
    from orchestrator.plan.checkpoint_dirs import checkpoint_at_step, resolve_model_checkpoint

    source = args.source
    if is_exported_model(source) or released_model_type(source):
        if args.step is not None:
            raise ValueError(f"--step {args.step}: {source} is an exported model (one set of weights), not a run")
        if args.ctc_weight:
            raise ValueError(f"--ctc-weight {args.ctc_weight}: an exported model decodes with its decoder alone; "
                             f"transcribe with the run's checkpoint for joint CTC/attention decoding")
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if released_model_type(source):
            return ReleasedTranscriber(source, device, args.max_new_tokens, args.prompt)
        return ExportTranscriber(source, device, args.max_new_tokens, args.prompt)
    checkpoint = checkpoint_at_step(source, args.step) if args.step is not None else None
    if checkpoint is None:
        resolved, problem = resolve_model_checkpoint(str(source))
        if problem:
            raise FileNotFoundError(problem)
        checkpoint = Path(resolved)
    run_dir = checkpoint.parent.parent
    if not (run_dir / "plan.json").is_file():
        raise ValueError(f"{source} is neither a run (no {run_dir / 'plan.json'}) nor an exported model directory "
                         f"(config.json of model_type audiollm); a converted checkpoint holds no tokenizer or "
                         f"prompt: train from it, or transcribe with the run")
    return RunTranscriber(run_dir, checkpoint, args.ctc_weight, args.max_new_tokens, args.prompt)


def _quiet() -> None:
    """stdout holds the answers and stderr the files skipped: the libraries' notices
    (megatron's missing TransformerEngine and Apex, torch's missing CUDA runtime,
    dist_checkpointing's deprecations) are left out."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    _quiet()
    if args.batch < 1:
        print(f"--batch {args.batch}: answer at least 1 window at a time", file=sys.stderr)
        return 2
    from orchestrator.plan.resolved import PlanError

    try:
        transcriber = open_transcriber(args)
    except (ValueError, FileNotFoundError, PlanError) as exc:  # what to fix, named: no traceback
        print(str(exc), file=sys.stderr)
        return 2
    several = len(args.audio) > 1

    def emit(entry: _File) -> None:
        if args.format == "jsonl":
            line = json.dumps({"file": entry.name, "text": entry.text, "seconds": round(entry.seconds, 3)})
        else:
            line = f"{entry.name}\t{entry.text}" if several else entry.text
        print(line, flush=True)

    speed = Speed()
    try:
        skipped = transcribe_files(transcriber, args.audio, args.batch, emit,
                                   lambda message: print(message, file=sys.stderr, flush=True),
                                   progress=several and sys.stderr.isatty(), speed=speed)
    finally:
        transcriber.close()
    if speed.warm:
        from orchestrator.runtime.machine import device_name

        said = {"rtfx": round(speed.rtfx, 3), "audio_seconds": round(speed.audio_seconds, 3),
                "decode_seconds": round(speed.decode_seconds, 4), "batch": args.batch,
                "device": device_name(transcriber.device), "warmup": True}
        if args.format == "jsonl":
            print(json.dumps(said), flush=True)
        else:
            print(f"RTFx {said['rtfx']:.1f} ({said['audio_seconds']:.1f} s of audio in {said['decode_seconds']:.2f} s, "
                  f"batch {args.batch}, {said['device']}, after a warm-up batch)", file=sys.stderr, flush=True)
    if skipped:
        print(f"{skipped} of {len(args.audio)} files skipped (named above)", file=sys.stderr)
    return 1 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
