"""Training metrics: the step's reduced loss statistics, throughput and FLOP rates,
memory, a console progress line, metrics.jsonl and W&B (rank 0), and the loss-curve
PNG at the end.

The W&B API key is never written anywhere by this module: it is read by wandb from
the environment (or ~/.netrc) and only its presence decides online vs offline.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Optional

import torch

from orchestrator.plan.rundir import write_text_atomic
from orchestrator.plan.wandb_settings import WandbSettings, wandb_settings

log = logging.getLogger(__name__)

# Dense bf16 tensor-core peak per GPU (FLOP/s), for MFU, by device name as
# torch.cuda.get_device_name() gives it. NVIDIA's datasheets state the bf16 peak "with
# sparsity"; dense is half of it: H100 SXM 1,979 -> 989.4 (same die in H200 SXM, GH200,
# H800 SXM), H100 PCIe 1,513 -> 756.5, H100/H200 NVL 1,671 -> 835.5, A100 (SXM and
# PCIe) 624 -> 312, B200 4.5 P -> 2,250 (HGX B200), GB200 5 P -> 2,500 (NVL72: 360 P
# over 72 GPUs), L40S 733 -> 362, L40 362 -> 181, L4 242 -> 121, A10 250 -> 125 (A10G:
# AWS publishes none; taken as A10's). First match wins: the more specific names come
# first (`H100 PCIe` before `H100`, `GB200` before `B200`, `L40S` before `L40`).
DEVICE_PEAK_FLOPS = (
    (r"\bGH200\b", 989.4e12),
    (r"\bGB200\b", 2500e12),
    (r"\bB200\b", 2250e12),
    (r"\bH(100|200)\b.*\bNVL\b", 835.5e12),
    (r"\bH(100|800)\b.*\bPCIE\b", 756.5e12),
    (r"\bH(100|200|800)\b", 989.4e12),
    (r"\bA100\b", 312e12),
    (r"\bL40S\b", 362e12),
    (r"\bL40\b", 181e12),
    (r"\bL4\b", 121e12),
    (r"\bA10G?\b", 125e12),
)


def device_peak_flops(device_name: Optional[str]) -> Optional[float]:
    """Dense bf16 peak (FLOP/s) of a GPU from its name ("NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-80GB", ...); None for a name the table does not know."""
    name = (device_name or "").upper()
    for pattern, peak in DEVICE_PEAK_FLOPS:
        if re.search(pattern, name):
            return peak
    return None


def peak_flops(device_name: Optional[str], gpu_type: Optional[str]) -> tuple:
    """(peak FLOP/s or None, where it came from) for MFU. The device's own name first;
    the plan's launcher.gpu_type only when the name is unknown; no device name (CPU):
    no peak, no MFU."""
    if not device_name:
        return None, "no GPU"
    peak = device_peak_flops(device_name)
    if peak is not None:
        return peak, device_name
    # The plan's launcher.gpu_type (its device table, orchestrator/plan/estimate.py) only when
    # the device name matches nothing above.
    from orchestrator.plan.estimate import DEVICES

    device = DEVICES.get((gpu_type or "").lower())
    peak = device.peak_tflops * 1e12 if device is not None and device.peak_tflops > 0 else None
    if peak is not None:
        return peak, f"launcher.gpu_type={gpu_type} (device name {device_name!r} not in the table)"
    return None, f"device name {device_name!r} and launcher.gpu_type={gpu_type} not in the table"


class LossStats:
    """Sum of per-token losses and target-token counts, overall and per dataset.
    Layout of the flat tensor: [loss_sum, tokens, ds_loss_sum x D, ds_tokens x D]."""

    def __init__(self, dataset_names):
        self.names = list(dataset_names)

    def size(self) -> int:
        return 2 + 2 * len(self.names)

    def zeros(self, device="cpu") -> torch.Tensor:
        return torch.zeros(self.size(), dtype=torch.float64, device=device)

    def of_microbatch(self, per_token_loss: torch.Tensor, loss_mask: torch.Tensor, dataset_index: torch.Tensor) -> torch.Tensor:
        d = len(self.names)
        loss = (per_token_loss.detach().double() * loss_mask.double()).reshape(-1)
        weight = loss_mask.double().reshape(-1)
        index = dataset_index.to(loss.device).reshape(-1)
        valid = index >= 0
        index = index.clamp(min=0)
        out = self.zeros(loss.device)
        out[0], out[1] = loss.sum(), weight.sum()
        out[2:2 + d].scatter_add_(0, index, torch.where(valid, loss, torch.zeros_like(loss)))
        # Per-dataset target-token counts (the denominator of each dataset's loss); a NaN
        # loss mask counts as 1, so it still shows which datasets were in the batch.
        out[2 + d:].scatter_add_(0, index, torch.where(valid, weight.nan_to_num(nan=1.0), torch.zeros_like(weight)))
        return out

    def summary(self, stats: torch.Tensor, prefix: str = "loss") -> dict:
        d = len(self.names)
        stats = stats.double().cpu()
        out = {prefix: (stats[0] / stats[1]).item() if stats[1] > 0 else float("nan")}
        for i, name in enumerate(self.names):
            sums, count = stats[2 + i], stats[2 + d + i]
            if count > 0:
                out[f"{prefix}/{name}"] = (sums / count).item()
        return out

    def datasets_present(self, stats: torch.Tensor) -> list:
        d = len(self.names)
        return [name for i, name in enumerate(self.names) if stats[2 + d + i] > 0]

    def datasets_not_finite(self, stats: torch.Tensor) -> list:
        d = len(self.names)
        return [name for i, name in enumerate(self.names)
                if stats[2 + d + i] > 0 and not math.isfinite(float(stats[2 + i]))]


def memory_gib() -> dict:
    if torch.cuda.is_available():
        return {"memory/max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                "memory/reserved_gib": torch.cuda.memory_reserved() / 2**30}
    import psutil

    return {"memory/rss_gib": psutil.Process().memory_info().rss / 2**30}


def throughput(step_time_s: float, step: dict, world_size: int, peak: Optional[float]) -> dict:
    """Rates of one step from its totals over all ranks, `step` = {'tokens': real tokens,
    'slots': token slots (padding included), 'model'/'hardware': FLOPs}: real tokens
    per second per GPU, the share of slots holding real tokens, model/hardware TFLOP/s
    per GPU and, with a peak (FLOP/s per GPU), MFU and HFU."""
    per_gpu = max(world_size, 1) * step_time_s
    model, hardware = step["model"] / per_gpu, step["hardware"] / per_gpu
    out = {"tokens_per_s_per_gpu": step["tokens"] / per_gpu,
           "tokens/utilization": step["tokens"] / step["slots"] if step["slots"] else float("nan"),
           "model_tflops_per_gpu": model / 1e12, "hardware_tflops_per_gpu": hardware / 1e12}
    if peak:
        out["mfu"] = model / peak
        out["hfu"] = hardware / peak
    return out


def progress_line(step: int, total: int, m: dict, width: int = 20) -> str:
    """One console line per logged step: a progress bar, then the step's figures. Lines,
    not a redrawn bar, so that log files and `tail -f` read the same as the console."""
    done = width * step // max(total, 1)
    parts = [f"[{'#' * done}{'.' * (width - done)}] step {step}/{total}", f"loss {m['loss']:.4f}"]
    if "grad_norm" in m:
        parts.append(f"grad {m['grad_norm']:.3f}")
    lrs = [f"{k[3:]}={v:.2e}" for k, v in m.items() if k.startswith("lr/")]
    if lrs:
        parts.append("lr " + ",".join(lrs))
    parts.append(f"{m['tokens_per_s_per_gpu']:.0f} tok/s/gpu")
    if "tokens/utilization" in m:
        parts.append(f"{100 * m['tokens/utilization']:.0f}% slots real")
    parts.append(f"{m['model_tflops_per_gpu']:.3g} TFLOP/s/gpu")
    if "mfu" in m:
        parts.append(f"mfu {100 * m['mfu']:.1f}%")
    mem = m.get("memory/max_allocated_gib", m.get("memory/rss_gib"))
    if mem is not None:
        parts.append(f"mem {mem:.2f} GiB")
    parts.append(f"{1000 * m['step_time_s']:.0f} ms")
    if "data_wait_s" in m:
        parts.append(f"data wait {1000 * m['data_wait_s']:.0f} ms")
    if m.get("profiled"):
        parts.append("profiled")
    return " | ".join(parts)


# How the generation metrics (orchestrator/train/generation_eval.py keys `<metric>/<dataset>`,
# `<metric>/all`, `<metric>/utterances`) are shown: console label, scale, unit, plot
# name. WER and exact match are fractions shown in percent; BLEU is 0..100 already.
GENERATION_METRICS = {
    "wer": ("WER", 100.0, "%", "word error rate"),
    "exact": ("exact", 100.0, "%", "exact match"),
    "bleu": ("BLEU", 1.0, "", "BLEU"),
}


def _per_dataset(metric: str, m: dict) -> dict:
    return {k[len(metric) + 1:]: v for k, v in m.items()
            if k.startswith(f"{metric}/") and k != f"{metric}/utterances"}


def eval_line(step: int, m: dict) -> Optional[str]:
    """The evaluation results among a step's metrics as one line (None without any):
    validation loss, then each generation metric overall and per validation dataset."""
    parts = []
    if "val_loss" in m:
        parts.append(f"val_loss {m['val_loss']:.4f}")
    for metric, (label, scale, unit, _) in GENERATION_METRICS.items():
        if f"{metric}/all" in m:
            per_set = ", ".join(f"{name} {scale * v:.1f}{unit}" for name, v in _per_dataset(metric, m).items()
                                if name != "all")
            parts.append(f"{label} {scale * m[f'{metric}/all']:.1f}{unit} over "
                         f"{m.get(f'{metric}/utterances', 0):.0f} utterances ({per_set})")
    return f"eval at step {step}: " + " | ".join(parts) if parts else None


# (metric, label, scale, unit, lower is better) of the end-of-run summary, in its order.
_SUMMARY_METRICS = [("val_loss", "val_loss", 1.0, "", True)] + [
    (f"{metric}/all", label, scale, unit, metric == "wer") for metric, (label, scale, unit, _) in GENERATION_METRICS.items()]


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def run_summary(run_dir: Path, recipe: Optional[str]) -> str:
    """The console's last lines after a finished run: where it is, the final and best
    evaluation of each metric the run measured (the whole run, restarts included), the
    loss curve, the wall time since the run was submitted (a resumed run: since its last
    submission), and what to run next."""
    from orchestrator.plan.rundir import last_launch, read_metrics

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    last_step = rows[-1]["step"] if rows else 0
    launch = last_launch(run_dir) or {}
    since = launch.get("submitted_at")
    took = f" in {_duration(time.time() - since)} since it was submitted" if since else ""
    lines = [f"run finished: {last_step} steps{took}", f"  run directory  {run_dir}"]
    for key, label, scale, unit, lower in _SUMMARY_METRICS:
        evaluated = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if not evaluated:
            continue
        final_step, final = evaluated[-1]
        best_step, best = (min if lower else max)(evaluated, key=lambda sv: sv[1])
        digits = 4 if key == "val_loss" else 1
        lines.append(f"  {label:<14} final {scale * final:.{digits}f}{unit} (step {final_step}), "
                     f"best {scale * best:.{digits}f}{unit} (step {best_step})")
    curve = run_dir / "loss_curve.png"
    if curve.is_file():
        lines.append(f"  loss curve     {curve}")
    lines += [f"  next           audiollm eval {run_dir}",
              f"                 audiollm transcribe {run_dir} RECORDING.wav ...",
              f"                 audiollm convert megatron-to-hf --megatron {run_dir} --out {run_dir}_hf"]
    if recipe == "tiny_cpu":
        lines.append("                 then fine-tune it on an unheard accent: docs/fine-tuning.md, \"Fine-tuning demo (CPU)\"")
    return "\n".join(lines)


class MetricsWriter:
    """Rank 0 only: metrics.jsonl in the run directory, W&B, console."""

    def __init__(self, run_dir: Path, logger_cfg: dict, run_cfg: dict, run_id: str, resumed_step: int,
                 config_for_wandb: Optional[dict] = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self._truncate_after(resumed_step)
        self.wandb = None
        backend = (logger_cfg.get("backend") or "none").lower()
        settings = wandb_settings(logger_cfg, os.environ, str(self.run_dir)) if backend == "wandb" else None
        if settings is not None:
            log.info("%s", "; ".join(settings.lines))
        if settings is not None and settings.mode != "disabled":
            if _installed("wandb"):
                self._to_wandb(lambda: setattr(self, "wandb", _init_wandb(
                    self.run_dir, settings, logger_cfg, run_cfg, run_id, config_for_wandb)), "the run's start")
            else:  # GPU images installed from `audiollm wheels --kit` have no wandb
                log.warning("W&B logging is off: wandb is not installed here (pip install wandb, or "
                            "logger=none); metrics go to %s only", self.path)

    def _truncate_after(self, step: int) -> None:
        """A resumed run repeats the steps after its checkpoint: drop their old lines."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if (_step_of(line) or step + 1) <= step]
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict) -> None:
        with self.path.open("a") as f:
            # Wall-clock time of the row, for timings across restarts (submit -> first step, ...).
            f.write(json.dumps({"step": step, "time": round(time.time(), 3), **metrics}) + "\n")
        if self.wandb is not None:
            self._to_wandb(lambda: self.wandb.log(metrics, step=step), f"step {step}")

    def finish(self, exit_code: int = 0) -> None:
        if self.wandb is not None:
            self._to_wandb(lambda: self.wandb.finish(exit_code=exit_code), "the run's end")
            self.wandb = None

    def _to_wandb(self, call, what: str) -> None:
        """W&B is a copy of metrics.jsonl: where its service is gone (a job's processes all
        get SLURM's SIGTERM on `scancel`, wandb's service too), the run goes on to its
        checkpoint without it."""
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - any failure of the side channel
            log.warning("W&B stopped at %s (%s: %s); metrics.jsonl has every row, and the next attempt logs to the "
                        "same W&B run", what, type(exc).__name__, exc)
            self.wandb = None


def log_evaluations_to_wandb(run_dir: Path, logger_cfg: dict, run_cfg: dict, rows: list,
                             summary: Optional[dict] = None) -> Optional[str]:
    """Every scored checkpoint (orchestrator/eval/checkpoint_table.py rows) into the
    training run's own W&B run, resumed by its id, as `eval/...` series on their own step
    axis `eval/step` (W&B drops rows logged at a step below the run's last): the dashboard
    shows the training loss and the checkpoints' scores over the same steps. Rows logged
    by an earlier `--all` are logged again and coincide. `summary`: text figures for the
    run's summary (the device the RTFx columns were measured on). Returns what happened, or None
    when the run does not log to W&B."""
    backend = (logger_cfg.get("backend") or "none").lower()
    if backend != "wandb" or not rows:
        return None
    settings = wandb_settings(logger_cfg, os.environ, str(run_dir))
    if settings.mode == "disabled" or not _installed("wandb"):
        return "W&B: not logged (mode disabled, or wandb not installed here)"
    from orchestrator.runtime.job_control import wandb_run_id

    run = _init_wandb(Path(run_dir), settings, logger_cfg, run_cfg, wandb_run_id(run_dir), None)
    run.define_metric("eval/step")
    run.define_metric("eval/*", step_metric="eval/step")
    for row in rows:
        run.log({"eval/step": row["step"], **{f"eval/{k}": v for k, v in row.items() if k not in ("step", "checkpoint")}})
    for key, value in (summary or {}).items():
        run.summary[key] = value
    run.finish()
    return f"W&B: {len(rows)} checkpoints' scores logged to run {run.id} ({settings.mode})"


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _api_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def _init_wandb(run_dir: Path, settings: WandbSettings, logger_cfg: dict, run_cfg: dict, run_id: str,
                config: Optional[dict]):
    import wandb

    mode = settings.mode
    if mode == "online" and not _api_key_configured():
        log.warning("W&B mode is online but no W&B API key is configured: logging offline "
                    "(sync later with `wandb sync %s/wandb`)", settings.dir)
        mode = "offline"
    # $WANDB_SERVICE, inherited from whatever started this process (a notebook, a test
    # runner, a script that logged to W&B itself), would make this run a stream of that
    # process's W&B service: the service outlives a rank killed hard, and the restart is
    # told the run's id "is in use" there. This process starts a service of its own (one
    # that ends with it, so a restart never finds the id held).
    os.environ.pop("WANDB_SERVICE", None)
    Path(settings.dir).mkdir(parents=True, exist_ok=True)  # (W&B falls back to a temporary folder otherwise)
    # System metrics (GPU utilisation and memory charts) online only: offline they would
    # fill the run directory for a sync that may never come.
    return wandb.init(
        project=settings.project, entity=settings.entity,
        group=run_cfg.get("experiment"), name=run_cfg.get("name") or run_dir.name,
        tags=list(logger_cfg.get("tags") or []), id=run_id, resume="allow", mode=mode, dir=settings.dir,
        config=config, settings=wandb.Settings(console="off", x_disable_stats=mode != "online", silent=True),
    )


def read_metrics(run_dir: Path) -> list:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def _step_of(line: str) -> Optional[int]:
    """The step of one metrics.jsonl line; None for a line cut short by a crash."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _smoothed(values, span: int) -> list:
    """Exponential moving average over about `span` points (pandas' ewm(span=...))."""
    alpha, out, level = 2.0 / (span + 1), [], None
    for value in values:
        level = value if level is None else alpha * value + (1 - alpha) * level
        out.append(level)
    return out


def plot_loss_curve(run_dir: Path) -> Optional[Path]:
    """loss_curve.png: training loss (overall and per dataset) and validation loss; next
    to it one panel per generation metric the run measured (WER, exact match, BLEU),
    per validation dataset and pooled. None without matplotlib (said once)."""
    if not _installed("matplotlib"):
        log.warning("no loss_curve.png: matplotlib is not installed here (metrics.jsonl has the curves)")
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if not rows:
        return None
    loss_series = {}
    metric_series = {metric: {} for metric in GENERATION_METRICS}
    for row in rows:
        for key, value in row.items():
            if key == "loss" or key.startswith("loss/") or key.startswith("val_loss"):
                loss_series.setdefault(key, []).append((row["step"], value))
        for metric, (_, scale, _, _) in GENERATION_METRICS.items():
            for name, value in _per_dataset(metric, row).items():
                metric_series[metric].setdefault(f"{metric}/{name}", []).append((row["step"], scale * value))
    panels = [metric for metric, series in metric_series.items() if series]
    fig, axes = plt.subplots(1, 1 + len(panels), figsize=(7 * (1 + len(panels)) if panels else 8, 5), squeeze=False)
    ax = axes[0][0]
    # Read at a glance: the raw total faint behind its smoothed curve, each training
    # dataset smoothed, validation as measured; a log axis (losses fall by orders of magnitude).
    span = max(1, len(rows) // 40)  # smoothing over ~1/40 of the run
    for key, points in sorted(loss_series.items(), key=lambda kv: (kv[0] != "loss", kv[0])):
        xs, ys = zip(*points)
        if key.startswith("val"):
            ax.plot(xs, ys, "--", marker="o", label=key, linewidth=1.2)
            continue
        if key == "loss":
            raw = ax.plot(xs, ys, "-", linewidth=0.8, alpha=0.25)[0]
            ax.plot(xs, _smoothed(ys, span), "-", color=raw.get_color(), linewidth=2.2,
                    label=f"loss (smoothed over {span} steps)" if span > 1 else "loss")
        else:
            ax.plot(xs, _smoothed(ys, span), "-", linewidth=1.0, alpha=0.8, label=key)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (log scale)")
    ax.set_title(Path(run_dir).name)
    ax.legend(fontsize=7, ncol=2, loc="lower left")  # below the falling curves
    ax.grid(alpha=0.3)
    for ax, metric in zip(axes[0][1:], panels):
        _, _, unit, name = GENERATION_METRICS[metric]
        pooled = f"{metric}/all"
        for key, points in sorted(metric_series[metric].items()):
            xs, ys = zip(*points)
            ax.plot(xs, ys, "-" if key == pooled else ":", marker="o", label=key, linewidth=2 if key == pooled else 1)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{name} ({unit})" if unit else name)
        ax.set_title(f"validation {name} (greedy decoding)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    out = Path(run_dir) / "loss_curve.png"
    tmp = out.with_name(f".loss_curve.{os.getpid()}.png")
    try:
        fig.savefig(tmp, dpi=100, bbox_inches="tight")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
        plt.close(fig)
    return out
