"""`audiollm data ...` commands. `main(argv)` receives the arguments after `data`.

    audiollm data demo OUT_DIR [--num-samples 3000] [--num-val-samples 100] [--seed 0] [--workers 2] [--accent VOICE]
    audiollm data import {nemo,hf,kaldi,wds} SRC OUT [--text-field F] [--keep-field F ...] [--workers N] [--dry-run] ...
    audiollm data show DIR [--samples 3]
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="audiollm data", description="Data tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="synthesize the espeak-ng demo corpus as MDS datasets + a tokenizer",
                          description="Synthesize spoken digit strings and short sentences with espeak-ng "
                                      "(48 training voices; validation on held-out accents and variants), "
                                      "written as several MDS datasets with a small HF tokenizer.")
    demo.add_argument("out_dir", help="new (or empty) directory to write; the demo data config reads "
                                      "$AUDIOLLM_DEMO_DATA, default outputs/demo_data")
    demo.add_argument("--num-samples", type=int, default=3000, help="training utterances (default 3000)")
    demo.add_argument("--num-val-samples", type=int, default=100,
                      help="utterances per validation dataset (4 datasets, and the 2 digits sets' numerals twins; default 100)")
    demo.add_argument("--seed", type=int, default=0, help="the corpus is a pure function of the seed")
    demo.add_argument("--workers", type=int, default=None, help="synthesis processes (default: min(2, cores))")
    demo.add_argument("--accent", default=None,
                      help="one espeak-ng voice's accent only (e.g. nl: Dutch-accented English), for fine-tuning")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    _import_parser(sub)
    show = sub.add_parser("show", help="samples, counts and hours of audio of MDS datasets",
                          description="Print each MDS dataset's sample count, shards, columns, hours of audio and "
                                      "its first samples. DIR: a dataset (with index.json) or a directory of them.")
    show.add_argument("dir", help="an MDS dataset directory, or a directory with datasets below it")
    show.add_argument("--samples", type=int, default=3, help="samples shown per dataset (default 3)")
    show.add_argument("--audio-field", default="audio", help="the audio column (default audio)")
    show.add_argument("--text-field", default="text", help="the transcript column (default text)")
    return parser


def _import_parser(sub) -> None:
    from orchestrator.data.importing import FORMATS

    imp = sub.add_parser(
        "import", help="a NeMo manifest, HF dataset, Kaldi data dir or WebDataset shards -> one MDS dataset",
        description="Import a corpus into one MDS dataset in this project's sample schema (audio: 16-kHz mono "
                    "16-bit FLAC; text; duration; key; kept fields), which a data config lists as is. Parallel "
                    "over --workers; running the same command again continues an interrupted import, with the "
                    "same bytes as an uninterrupted one. Every bad record is counted and named in "
                    "OUT/bad_records.jsonl; more than --max-bad-fraction of them fails the import.",
        epilog="Formats. nemo: JSONL manifest (audio_filepath, duration, text, optional offset; relative paths "
               "from the manifest's directory). hf: a Dataset/DatasetDict.save_to_disk directory with an Audio "
               "column (--split for a DatasetDict). kaldi: a data directory (wav.scp, text, optional segments, "
               "utt2spk). wds: WebDataset tar shards (a file, a directory or a glob), an audio member and a "
               ".txt or .json transcript per key. See docs/data.md, \"Your own data\".")
    imp.add_argument("format", choices=FORMATS, help="the source's layout")
    imp.add_argument("src", help="manifest file (nemo), dataset directory (hf), data directory (kaldi), "
                                 "tar file, directory or glob (wds)")
    imp.add_argument("out", help="the MDS dataset to write: a new or empty directory, or an unfinished import "
                                 "of the same command to continue")
    imp.add_argument("--text-field", default=None,
                     help="the transcript's field: nemo key (default text), hf column (default text), wds member "
                          "extension or .json key (default: the .txt member, else the .json's text); not kaldi")
    imp.add_argument("--audio-field", default=None,
                     help="the audio's field: nemo key (default audio_filepath), hf column (default audio), wds "
                          "member extension (default: the sample's one audio member); not kaldi")
    imp.add_argument("--keep-field", action="append", default=[], metavar="FIELD",
                     help="also write this source field as a str column (repeatable), e.g. a speaker, a language "
                          "or an instruction for data.train[].instruction_field; kaldi has speaker (utt2spk)")
    imp.add_argument("--split", default=None, help="hf: the DatasetDict's split (needed when it has several)")
    imp.add_argument("--audio-root", default=None,
                     help="base of relative audio paths (default: nemo the manifest's directory, kaldi the "
                          "current directory)")
    imp.add_argument("--sample-rate", type=int, default=16000,
                     help="rate of the written audio (default 16000, data.sample_rate)")
    imp.add_argument("--audio-format", choices=("flac", "wav"), default="flac",
                     help="16-bit FLAC (default) or 16-bit WAV (about twice the bytes)")
    imp.add_argument("--chunk-size", type=int, default=1000,
                     help="records per part (default 1000): the unit of resuming; shards never span two parts")
    imp.add_argument("--shard-size", default="64mb", help="most bytes per MDS shard (default 64mb)")
    imp.add_argument("--workers", type=int, default=None, help="encoding processes (default: the CPU count)")
    imp.add_argument("--max-bad-fraction", type=float, default=0.01,
                     help="fail the import when more than this share of records is bad (default 0.01)")
    imp.add_argument("--name", default="NAME", help="the dataset name in the printed data config entry")
    imp.add_argument("--dry-run", action="store_true",
                     help="read the source and every audio header; report counts, hours and bad records; "
                          "write nothing")
    imp.add_argument("--no-progress", action="store_true", help="no progress bar")


def _run_import(args) -> int:
    from orchestrator.data.importing.records import ReaderOptions, SourceError
    from orchestrator.data.importing.writer import ImportFailed, describe, make_params, run_import

    if args.workers is not None and args.workers < 1:
        print(f"--workers ({args.workers}) must be >= 1", file=sys.stderr)
        return 2
    if not 0 <= args.max_bad_fraction <= 1:
        print(f"--max-bad-fraction ({args.max_bad_fraction}) must be within [0, 1]", file=sys.stderr)
        return 2
    opts = ReaderOptions(text_field=args.text_field, audio_field=args.audio_field,
                         keep_fields=tuple(args.keep_field), split=args.split, audio_root=args.audio_root)
    try:
        params = make_params(args.format, args.src, opts, sample_rate=args.sample_rate,
                             audio_format=args.audio_format, chunk_size=args.chunk_size, shard_size=args.shard_size)
        report = run_import(params, args.out, workers=args.workers, max_bad_fraction=args.max_bad_fraction,
                            dry_run=args.dry_run, progress=not args.no_progress)
    except (SourceError, ImportFailed) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(describe(report, args.name))
    return 1 if report.dry_run and report.summary.get("would_fail") else 0


def _run_show(args) -> int:
    from orchestrator.data.importing.show import show

    try:
        print(show(args.dir, samples=args.samples, audio_field=args.audio_field, text_field=args.text_field))
    except (FileNotFoundError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "demo":
        from orchestrator.data.demo import write_corpus

        if args.num_samples < 1 or args.num_val_samples < 0:
            print(f"--num-samples ({args.num_samples}) must be >= 1 and --num-val-samples "
                  f"({args.num_val_samples}) >= 0", file=sys.stderr)
            return 2
        try:
            manifest = write_corpus(args.out_dir, num_samples=args.num_samples,
                                    num_val_samples=args.num_val_samples, seed=args.seed,
                                    workers=args.workers, progress=not args.no_progress, accent=args.accent)
        except (FileExistsError, RuntimeError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        total = sum(d["samples"] for d in manifest["datasets"].values())
        for name, entry in manifest["datasets"].items():
            print(f"  {name:<32} {entry['samples']:>5} utterances, {entry['audio_seconds']:>7.1f} s of audio")
        print(f"wrote {total} utterances to {args.out_dir} in {manifest['synthesis_seconds']} s "
              f"({manifest['workers']} workers); tokenizer at {args.out_dir}/tokenizer")
        return 0
    if args.command == "import":
        return _run_import(args)
    if args.command == "show":
        return _run_show(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
