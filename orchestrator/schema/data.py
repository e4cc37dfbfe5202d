"""`data` group: MDS datasets, audio features, prompts, packing."""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class DatasetEntry:
    name: str = "default"  # shown in per-dataset metrics; a glob path suffixes it per match
    path: str = "???"  # local directory or remote URI of an MDS dataset; may be a glob
    weight: float = 1.0  # sampling proportion in the training mixture


@dataclass
class DataConfig:
    seq_length: int = 2048  # tokens per packed row (decoder sequence length)
    train: List[DatasetEntry] = field(default_factory=list)
    validation: List[DatasetEntry] = field(default_factory=list)
    tokenizer: Optional[str] = None  # local HF tokenizer directory
    prompt_template: str = "<start_of_turn>user\nTranscribe: <SpeechHere><end_of_turn>\n<start_of_turn>model\n"
    max_audio_seconds: float = 30.0
    long_audio: str = "refuse"  # refuse | chunk: clips longer than max_audio_seconds
    packing: bool = True
    on_bad_sample: str = "error"  # error | skip (skipped samples are counted in the metrics)
    num_workers: int = 0
    seed: int = 17
