"""Every scored checkpoint of a run in one table, a plot of the metrics over steps, and
the best checkpoint by a chosen metric (`audiollm eval RUN --all`).

Reads RUN/eval/step_N.json (one per checkpoint `audiollm eval` scored) and writes
  RUN/eval/steps.tsv        one row per step: validation loss, each generation metric and
                            the decoding speed (rtfx/<dataset>, beside rtfx_batch/<dataset>)
  RUN/eval_curve.png        the same over steps, beside loss_curve.png (with matplotlib)
  RUN/eval/best.json        {"by", "step", "checkpoint", "value", "lower_is_better"}
`audiollm convert megatron-to-hf --megatron RUN --step best` exports the best one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from orchestrator.plan.checkpoint_dirs import STEP_DIR
from orchestrator.plan.rundir import write_text_atomic

# Which key names the best checkpoint when none is asked for: the pooled generation
# metric the run measures (WER first), else the validation loss.
DEFAULT_BEST_BY = ("wer/all", "exact/all", "bleu/all", "val_loss")
HIGHER_IS_BETTER = ("exact", "bleu", "rtfx")  # rtfx: audio seconds decoded per second


def scored(run_dir: Path) -> list[dict]:
    """{"step", "checkpoint", **results} of each scored checkpoint, oldest first."""
    rows = []
    for path in Path(run_dir, "eval").glob("step_*.json"):
        match = STEP_DIR.match(path.stem)
        if not match:
            continue
        results = json.loads(path.read_text())
        rows.append({"step": int(match.group(1)), "checkpoint": path.stem,
                     **{k: v for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}})
    return sorted(rows, key=lambda r: r["step"])


def lower_is_better(key: str) -> bool:
    return key.split("/", 1)[0] not in HIGHER_IS_BETTER


def best(rows: list[dict], by: Optional[str] = None) -> Optional[dict]:
    """The best row by `by` (default: DEFAULT_BEST_BY's first key the rows have); None
    without rows. An unknown `by` is a ValueError naming the keys there are."""
    if not rows:
        return None
    keys = sorted({k for r in rows for k in r} - {"step", "checkpoint", "eval_generation_ctc_weight"})
    if by is None:
        by = next((k for k in DEFAULT_BEST_BY if k in keys), None)
    if by not in keys:
        raise ValueError(f"--best-by {by}: the scored checkpoints have no such figure; they have: {', '.join(keys)}")
    candidates = [r for r in rows if by in r and math.isfinite(r[by])]
    if not candidates:
        return None
    sign = 1 if lower_is_better(by) else -1
    # ties go to the earlier step: the same score with less training
    row = min(candidates, key=lambda r: (sign * r[by], r["step"]))
    return {"by": by, "step": row["step"], "checkpoint": row["checkpoint"], "value": row[by],
            "lower_is_better": lower_is_better(by)}


def table_text(rows: list[dict]) -> str:
    keys = [k for k in ("val_loss",) if any(k in r for r in rows)]
    keys += sorted({k for r in rows for k in r if "/" in k and not k.endswith("/utterances")})
    lines = ["\t".join(["step", "checkpoint", *keys])]
    for r in rows:
        lines.append("\t".join([str(r["step"]), r["checkpoint"], *(f"{r[k]:.6g}" if k in r else "" for k in keys)]))
    return "\n".join(lines) + "\n"


def write_summary(run_dir: Path, by: Optional[str] = None) -> tuple[list[dict], Optional[dict]]:
    """steps.tsv, best.json and eval_curve.png from the scored checkpoints."""
    run_dir = Path(run_dir)
    rows = scored(run_dir)
    chosen = best(rows, by)
    if rows:
        write_text_atomic(run_dir / "eval" / "steps.tsv", table_text(rows))
        plot(run_dir, rows, chosen)
    if chosen:
        write_text_atomic(run_dir / "eval" / "best.json", json.dumps(chosen, indent=1) + "\n")
    return rows, chosen


def plot(run_dir: Path, rows: list[dict], chosen: Optional[dict]) -> Optional[Path]:
    """eval_curve.png: validation loss and each pooled generation metric over steps, the
    best checkpoint marked; None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in ("val_loss", "wer/all", "exact/all", "bleu/all") if any(k in r for r in rows)]
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.5), squeeze=False)
    for ax, key in zip(axes[0], keys):
        points = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot(*zip(*points), "-o")
        if chosen and chosen["by"] == key:
            ax.plot([chosen["step"]], [chosen["value"]], "*", markersize=16, label=f"best: {chosen['checkpoint']}")
            ax.legend(fontsize=8)
        ax.set_xlabel("step")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{run_dir.name}: every scored checkpoint")
    fig.tight_layout()
    out = run_dir / "eval_curve.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
