"""`audiollm data ...` commands. `main(argv)` receives the arguments after `data`.

    audiollm data demo OUT_DIR [--num-samples 3000] [--num-val-samples 100] [--seed 0] [--workers 2] [--accent VOICE]
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
                      help="utterances per validation dataset (4 datasets; default 100)")
    demo.add_argument("--seed", type=int, default=0, help="the corpus is a pure function of the seed")
    demo.add_argument("--workers", type=int, default=None, help="synthesis processes (default: min(2, cores))")
    demo.add_argument("--accent", default=None,
                      help="one espeak-ng voice's accent only (e.g. nl: Dutch-accented English), for fine-tuning")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


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
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
