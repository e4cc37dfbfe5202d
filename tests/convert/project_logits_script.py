"""Each clip's prompt through a run's own model (its latest checkpoint, one process at
TP = PP = 1, built as `audiollm transcribe` and `audiollm eval` build it): the logits of
the token after the prompt, one clip at a time, as numpy [clips, vocab] in OUT.npy.

    python tests/convert/project_logits_script.py RUN_DIR CLIPS.npz OUT.npy"""

import sys
from pathlib import Path

import numpy as np
import torch

from orchestrator.data import mel
from orchestrator.eval.transcribers import RunTranscriber
from orchestrator.train.checkpoint import latest_checkpoint


def main(run_dir: str, clips_path: str, out_path: str) -> None:
    model = RunTranscriber(Path(run_dir), latest_checkpoint(Path(run_dir)), ctc_weight=0.0)
    stored = np.load(clips_path)
    count = len([k for k in stored.files if k.startswith("clip_")])
    rows = []
    with torch.no_grad():
        for i in range(count):
            features, lengths = mel.features([stored[f"clip_{i}"]], model.mel_bins, model.window_frames)
            sample = model.builder.build("-", [model._tokens(int(lengths[0]))])
            ids = torch.tensor([sample.tokens.tolist()[:sample.answer_start]])
            positions = torch.arange(ids.shape[1])[None]
            logits = model.model(ids, positions, None, audio_features=features, audio_lengths=lengths.tolist())
            rows.append(logits[0, -1].float().numpy())
    model.close()
    np.save(out_path, np.stack(rows))


if __name__ == "__main__":
    main(*sys.argv[1:4])
