"""`audiollm data import FORMAT SRC OUT`: a corpus in another tool's layout -> one MDS
dataset in this project's sample schema, which the training data config lists as is.

    nemo   a NeMo JSONL manifest (audio_filepath, duration, text, optional offset)
    hf     a HF `datasets` directory (Dataset/DatasetDict.save_to_disk) with an audio column
    kaldi  a Kaldi data directory (wav.scp, text, optional segments and utt2spk)
    wds    WebDataset tar shards (per key: an audio member and a .txt or .json transcript)

Modules, one job each:
    records   what a reader yields: a Record (key, audio reference, text, fields) or a
              BadRecord (where, kind, reason); the checks shared by every format
    nemo, hf, kaldi, wds   one reader per format: SRC -> records in source order
    encode    one record -> decoded, cut (offset/duration, segments), mono, resampled,
              encoded sample; or the reason it is bad (runs in the worker processes)
    writer    records -> fixed chunks -> MDS part directories (parallel, resumable) ->
              the final dataset, its bad-record report and summary
    show      `audiollm data show DIR`: samples, counts and hours of MDS datasets

Each sample: audio (16-kHz mono 16-bit FLAC bytes, or WAV with --audio-format wav),
text, duration (s, float32), key (where it came from in the source), and each
--keep-field column (str). Importing this package is light: numpy and soundfile in the
workers; mosaic streaming (and with it torch) only where the shards are written or read.
"""

FORMATS = ("nemo", "hf", "kaldi", "wds")
