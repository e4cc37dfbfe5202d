"""`data` group: MDS datasets, audio features, prompts, packing."""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class DatasetEntry:
    name: str = "default"  # shown in per-dataset metrics; a glob path suffixes it per match
    path: str = "???"  # local directory or remote URI of an MDS dataset; may be a glob
    weight: float = 1.0  # sampling proportion in the training mixture
    # What the dataset's samples ask of the model (orchestrator/plan/tasks.py). Every
    # field left unset takes the `data` group's default, so a plain {name, path, weight}
    # entry is transcription with data.prompt_template, as before.
    # A named task preset (transcribe, translate, answer, caption, instruct): its
    # instruction is rendered as a user turn by the tokenizer's chat template, and it
    # brings its validation metric.
    task: Optional[str] = None
    # This dataset's template, as data.prompt_template: <SpeechHere> exactly once, and
    # {instruction} where instruction_field's text goes. Overrides `task`'s instruction.
    prompt_template: Optional[str] = None
    instruction_field: Optional[str] = None  # MDS column with each sample's own instruction text
    audio_field: Optional[str] = None  # default data.audio_field
    text_field: Optional[str] = None  # the answer column; default data.text_field
    # A conversation dataset: the MDS column with the turns (a JSON list of {role, text,
    # audio: [indices into the sample's audio column]}); see docs/data.md, "Tasks and conversations".
    turns_field: Optional[str] = None
    metric: Optional[str] = None  # validation only: wer | exact | bleu; default: the task's, else wer
    # Validation only, wer and exact: how both sides are normalised before scoring:
    # audiollm (the default: the project's own, orchestrator/scoring/text.py; numbers stay
    # as written) | whisper_english (Whisper's English normaliser, as the Open ASR
    # Leaderboard scores: numbers to digits, British to American spelling, contractions
    # expanded) | whisper_basic (Whisper's basic one: case and punctuation only).
    normaliser: Optional[str] = None
    # Joint CTC on this dataset's clips (model.adapter.ctc_weight > 0): the answer must be
    # the transcript of the one clip. Default: true for transcription, false otherwise.
    ctc: Optional[bool] = None


@dataclass
class DataConfig:
    seq_length: int = 2048  # tokens per packed row (decoder sequence length)
    train: List[DatasetEntry] = field(default_factory=list)
    validation: List[DatasetEntry] = field(default_factory=list)
    tokenizer: Optional[str] = None  # local HF tokenizer directory
    # The audio placeholder, repeated once per adapter output frame: one token the
    # tokenizer already has (Gemma2: one of its <unusedN> tokens). A new token would need
    # an embedding row that pretrained weights lack. The demo tokenizers have <audio>.
    audio_token: str = "<audio>"
    # The user turn; <SpeechHere> becomes as many audio placeholder tokens as the
    # adapter makes for the clip. The response is the transcript + response_suffix.
    prompt_template: str = "<start_of_turn>user\nTranscribe: <SpeechHere><end_of_turn>\n<start_of_turn>model\n"
    response_suffix: str = "<end_of_turn>"
    add_bos: bool = True  # prepend the tokenizer's bos token to every sample
    add_eos: bool = True  # append the tokenizer's eos token after the response
    loss_on_prompt: bool = False  # false: the loss covers the response tokens only
    # Conversations longer than seq_length: "refuse" (a bad sample, see on_bad_sample)
    # or "truncate" at the last assistant turn that fits (counted per dataset in the
    # metrics as truncated_samples).
    long_conversation: str = "refuse"
    max_audio_seconds: float = 30.0
    # Share of training clips (single-clip samples) padded with silence to a random length
    # up to the encoder's window (and data.max_audio_seconds), the silence split at random
    # before and after the speech: a model trained on short clips alone answers a whole
    # window, or a clip with a pause in front, badly. Drawn per sample from (data.seed, its
    # place in the order): a resumed run pads as the first attempt did. 0: none.
    silence_padding: float = 0.0
    # refuse | chunk: clips longer than max_audio_seconds. chunk cuts one into windows of
    # max_audio_seconds, each encoded on its own; their audio tokens follow one another in
    # the prompt, and the auxiliary CTC loss aligns the transcript over all of them.
    long_audio: str = "refuse"
    # Audio tokens per clip: "clip" counts the clip's own mel frames (short clips make
    # fewer tokens; the adapter output is cut to that count), "window" always counts
    # the whole encoder window (Whisper style: 300 tokens per clip at 30 s).
    audio_tokens: str = "clip"
    sample_rate: int = 16000  # features are computed at this rate
    wrong_sample_rate: str = "resample"  # resample | refuse: audio stored at another rate
    audio_field: str = "audio"  # MDS column with encoded audio bytes (wav/flac/mp3) or a raw array
    sample_rate_field: str = "sample_rate"  # MDS column with the rate of a raw-array audio column
    text_field: str = "text"  # MDS column with the transcript
    packing: bool = True
    # Samples looked ahead to fill packed rows; also the most samples the data workers
    # prepare ahead of the packer (memory: about twice this many samples' features).
    packing_buffer: int = 256
    shuffle: bool = True  # shuffle the training mixture (validation is never shuffled)
    on_bad_sample: str = "error"  # error | skip (counted per dataset in the step metrics as bad_samples/<name>)
    # With on_bad_sample=skip: the run stops when one dataset's bad samples pass this share
    # of the samples read from it (judged from its 10th bad sample on, over every data-parallel
    # rank's reads together): a few bad samples are skipped, a broken dataset is not trained without.
    max_bad_fraction: float = 0.01
    # Local cache of remote (s3://, gs://, ...) datasets; local datasets are read in place.
    # None: a directory under the system temp dir. Each process caches in its own
    # subdirectory, fetching a shard when one of its samples is first read.
    cache_dir: Optional[str] = None
    # Most bytes of remote shards each process keeps in its cache (mosaic's cache_limit:
    # bytes, or a number with kb/mb/gb/tb, e.g. "200gb"); the least recently used shard
    # is evicted beyond it. Mosaic needs at least 4x the largest shard. None: no limit.
    cache_limit: Optional[str] = None
    # Re-attempts of a failed shard download before the run stops with an error naming
    # the dataset and shard (credentials come from the environment, e.g. AWS_* and
    # S3_ENDPOINT_URL, and are never written to the run directory).
    download_retry: int = 2
    # Keep tokenized samples and their log-mel features in memory up to this many MiB,
    # so later epochs of a small corpus skip decoding and the STFT. 0: off.
    feature_cache_mb: int = 0
    validation_max_samples: Optional[int] = None  # per validation dataset; None: all of it
    # The espeak-ng demo corpus (conf/data/demo.yaml points every path into it): when
    # set, `audiollm train` first writes the corpus into this directory unless it
    # already holds one (its manifest.json), with this many training utterances.
    demo_corpus: Optional[str] = None
    demo_corpus_samples: int = 3000
    # The demo corpus of one espeak-ng voice's accent only (the fine-tuning demo,
    # recipe tiny_cpu_finetune); None: the default 48-voice corpus.
    demo_corpus_accent: Optional[str] = None
    # Worker processes per training process that read, decode, resample, compute log-mel
    # and tokenize ahead of the step; 0: all of it in the training process, between steps.
    # Validation gets as many more, started at the first evaluation and kept for the run.
    num_workers: int = 0
    # Where the log-mel is computed. cpu: by the data workers (or the training process),
    # and the micro-batch carries the features. device: the micro-batch carries the clips'
    # waveforms and the training step computes the log-mel on the encoder's device (a GPU
    # does it in well under a millisecond), leaving the host to decode and tokenize only:
    # about 3x fewer CPU cores per GPU for 30-s clips (benchmarks/data_pipeline.py).
    features_on: str = "cpu"
    # One process of each model replica (the ranks that share a data-parallel rank: its
    # tensor-, pipeline- and context-parallel peers) reads, decodes and computes features,
    # and sends each micro-batch to the others. false: every rank reads its replica's
    # micro-batches itself (the same batches, TP x PP x CP times the host's data work).
    replica_reader: bool = True
    seed: int = 17
    # Mosaic canonical nodes of the training order: the run can continue at any
    # data-parallel size that divides this number, reading on from every node's own
    # position. Fixed at the run's first start and kept in its checkpoints. None: the
    # data-parallel size at the first start (e.g. 12 continues at 1, 2, 3, 4, 6 and 12).
    canonical_nodes: Optional[int] = None
