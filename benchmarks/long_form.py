"""Long recordings against their clips: the word error rate of a run's model on recordings
made by joining 4 to 12 held-out clips with short pauses (20 to 60 s: several windows of the
tiny model's 5 s), answered three ways:

  clip by clip     each clip alone (the reference figure: what the model does at its best);
                   and each clip padded with silence to the whole window (split at random
                   before and after it)
  long-form        each recording as `audiollm transcribe` answers it: windows cut where it
                   is quietest, overlapping, the answers joined with the overlap's words said
                   once (orchestrator/hf_model/longform_audiollm.py)
  back-to-back     each recording cut into consecutive whole windows, the answers joined by a
                   space (what `transcribe` did before)

The clips are the run's held-out transcription sets (its validation datasets scored by WER);
each way answers with `audiollm transcribe`'s own transcriber of the run's latest checkpoint,
decoded as `audiollm eval` decodes (the run's joint CTC/attention weight), in batches of 8.
WER under the project's normaliser, pooled over the recordings.

Run: .venv/bin/python benchmarks/long_form.py RUN_DIR [--recordings 30] [--seed 0]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RATE = 16000
BATCH = 8


def held_out_clips(run_dir: Path) -> list:
    """[(16-kHz samples, reference)] of the run's held-out WER datasets."""
    from streaming import LocalDataset

    from orchestrator.data.audio import load_audio
    from orchestrator.plan.tasks import dataset_format

    config = json.loads((run_dir / "plan.json").read_text())["config"]
    data = config["data"]
    clips = []
    for entry in data["validation"]:
        fmt = dataset_format(entry, _Data(data), entry["name"])
        if fmt.metric != "wer":
            continue
        held_out = LocalDataset(local=str(entry["path"]))
        clips += [(load_audio(held_out[i][fmt.audio_field], None, RATE), held_out[i][fmt.text_field])
                  for i in range(len(held_out))]
    return clips


class _Data:
    """The plan's data section with attribute access (what dataset_format reads)."""

    def __init__(self, section: dict):
        self.__dict__.update(section)


def recordings(clips: list, count: int, seed: int) -> list:
    """[(samples, reference, [clip indices])]: 4 to 12 distinct clips a recording, 0.2 to
    0.6 s of silence between them, 20 to 60 s long."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        chosen = rng.choice(len(clips), size=int(rng.integers(4, 13)), replace=False).tolist()
        parts = []
        for i in chosen:
            parts += [clips[i][0], np.zeros(int(rng.uniform(0.2, 0.6) * RATE), np.float32)]
        samples = np.concatenate(parts[:-1])
        if 20 * RATE <= len(samples) <= 60 * RATE:
            out.append((samples, " ".join(clips[i][1] for i in chosen), chosen))
    return out


def answer_all(transcriber, pieces: list) -> list:
    answers = []
    for start in range(0, len(pieces), BATCH):
        answers += transcriber.answer(pieces[start:start + BATCH])
    return answers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--recordings", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from orchestrator.eval.transcribers import RunTranscriber
    from orchestrator.hf_model.longform_audiollm import merge, windows
    from orchestrator.scoring import metrics
    from orchestrator.train.checkpoint import latest_checkpoint

    clips = held_out_clips(args.run_dir)
    made = recordings(clips, args.recordings, args.seed)
    transcriber = RunTranscriber(args.run_dir, latest_checkpoint(args.run_dir))
    window = transcriber.window_samples
    references = [reference for _, reference, _ in made]
    ways = {}
    # clip by clip: every clip a recording holds, alone
    used = sorted({i for _, _, chosen in made for i in chosen})
    began = time.perf_counter()
    said = dict(zip(used, answer_all(transcriber, [clips[i][0] for i in used])))
    ways["clip by clip"] = ([" ".join(said[i].strip() for i in chosen) for _, _, chosen in made],
                            time.perf_counter() - began)
    # each of those clips padded with silence to the whole window (the silence split at random)
    rng = np.random.default_rng(args.seed)
    padded = []
    for i in used:
        before = int(rng.integers(0, window - len(clips[i][0]) + 1)) if len(clips[i][0]) < window else 0
        padded.append(np.pad(clips[i][0], (before, max(0, window - len(clips[i][0]) - before))))
    began = time.perf_counter()
    said_padded = dict(zip(used, answer_all(transcriber, padded)))
    ways["clip by clip, padded with silence to the window"] = (
        [" ".join(said_padded[i].strip() for i in chosen) for _, _, chosen in made], time.perf_counter() - began)
    cuts = {
        "long-form (quietest point, overlap, merged)": lambda s: [s[a:b] for a, b in windows(s, window)],
        # (a last piece too short for one audio token left out, as transcribe did)
        "back-to-back windows": lambda s: [s[i:i + window] for i in range(0, len(s), window)
                                           if len(s[i:i + window]) >= transcriber.min_samples],
    }
    for name, cut in cuts.items():
        began = time.perf_counter()
        pieces = [cut(samples) for samples, _, _ in made]
        flat = answer_all(transcriber, [p for ps in pieces for p in ps])
        texts, at = [], 0
        for ps in pieces:
            answers = [a.strip() for a in flat[at:at + len(ps)] if a.strip()]
            texts.append(merge(answers) if name.startswith("long") else " ".join(answers))
            at += len(ps)
        ways[name] = (texts, time.perf_counter() - began)
    transcriber.close()
    seconds = [len(samples) / RATE for samples, _, _ in made]
    print(f"{len(made)} recordings of {min(len(c) for _, _, c in made)}-{max(len(c) for _, _, c in made)} held-out "
          f"clips, {min(seconds):.1f}-{max(seconds):.1f} s ({sum(seconds) / 60:.1f} min), window "
          f"{window / RATE:.2f} s; {args.run_dir}")
    print("| answered | WER | decode time |\n|---|---:|---:|")
    for name, (texts, spent) in ways.items():
        wer = metrics.score("wer", metrics.statistics("wer", references, texts))
        print(f"| {name} | {100 * wer:.2f} % | {spent:.0f} s |")


if __name__ == "__main__":
    main()
