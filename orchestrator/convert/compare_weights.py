"""`audiollm compare-weights A B [--rtol R] [--atol T]`

Compares two checkpoints parameter by parameter (HF Gemma2 directories, converted or
training checkpoints, in any mix; megatron ones are read at TP=1 with LoRA merged and
renamed to HF names first, as `megatron-to-hf` exports them). Lists every parameter whose statistics (mean, std,
min, max, L2 norm) or shape differ beyond atol + rtol*|value|, and every parameter
present on one side only. Exit status 1 when anything is listed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch

STATS = ("mean", "std", "min", "max", "norm")


def load_any(path: Path) -> Dict[str, torch.Tensor]:
    path = Path(path)
    if not (path / "config.json").is_file():
        from orchestrator.convert.megatron_to_hf import DECODER, Export

        return {name[len(DECODER):] if name.startswith(DECODER) else name: tensor
                for name, tensor in Export(path).tensors() if not name.startswith("adapter.")}
    from orchestrator.convert.hf_io import read_hf_state_dict

    state = read_hf_state_dict(path)
    state.pop("lm_head.weight", None)  # tied copy of the embedding
    return state


def statistics(t: torch.Tensor) -> Dict[str, float]:
    x = t.detach().double()
    return {"mean": x.mean().item(), "std": x.std().item() if x.numel() > 1 else 0.0,
            "min": x.min().item(), "max": x.max().item(), "norm": x.norm().item()}


def compare(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], rtol: float = 1e-3, atol: float = 1e-6) -> List[str]:
    lines = [f"{n}: only in A" for n in sorted(set(a) - set(b))]
    lines += [f"{n}: only in B" for n in sorted(set(b) - set(a))]
    for name in sorted(set(a) & set(b)):
        ta, tb = a[name], b[name]
        if ta.shape != tb.shape:
            lines.append(f"{name}: shape {tuple(ta.shape)} vs {tuple(tb.shape)}")
            continue
        sa, sb = statistics(ta), statistics(tb)
        bad = [f"{k} {sa[k]:.6g} vs {sb[k]:.6g}" for k in STATS
               if abs(sa[k] - sb[k]) > atol + rtol * max(abs(sa[k]), abs(sb[k]))]
        if bad:
            lines.append(f"{name}: " + ", ".join(bad))
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="audiollm compare-weights", description=__doc__.split("\n\n")[1])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--rtol", type=float, default=1e-3)
    parser.add_argument("--atol", type=float, default=1e-6)
    args = parser.parse_args(argv)
    a, b = load_any(args.a), load_any(args.b)
    lines = compare(a, b, args.rtol, args.atol)
    for line in lines:
        print(line)
    print(f"{len(lines)} of {len(set(a) | set(b))} parameters differ" if lines
          else f"all {len(a)} parameters agree (rtol {args.rtol}, atol {args.atol})")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
