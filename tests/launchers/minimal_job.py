"""The launchers' tests' job: a small MLP that starts in a second, a real training job
without the AudioLLM trainer (the default entry, orchestrator.train.entry.main).

    launcher.entry=tests.launchers.minimal_job.main

Run on every rank by launchers/job.py with the torch.distributed environment set.
It trains a small MLP on deterministic synthetic regression data, data parallel
over gloo (cpu) or nccl (gpu): every rank draws its own shard of each step's batch
from a generator seeded by (seed, step, rank) and gradients are averaged with one
all-reduce. Because the data depend only on the step, a run resumed from a
checkpoint reproduces an uninterrupted run's loss at every step exactly.

Reads <run_dir>/config.yaml (train.iters, train.seed, train.save_interval,
train.keep_last, train.log_interval, optim.lr, launcher.accelerator) and
<run_dir>/plan.json (world_size, checked against the environment). Writes
checkpoints/step_<N>/state.pt + checkpoints/latest and metrics.jsonl (one line per
step, rank 0). At every step boundary it asks orchestrator.runtime.job_control.should_stop()
and, when told to, checkpoints and returns.

It reports its progress to the launcher's watchdog after every step and at its end
(job_control.progress), as the trainer does.

AUDIOLLM_MINIMAL_STEP_DELAY_S (seconds, default 0) slows each step down, so that a
demo or a test can interrupt a run mid-way. AUDIOLLM_MINIMAL_FAIL=RANK:STEP makes that
rank raise a ValueError at that step (a failure inside the job); with
AUDIOLLM_MINIMAL_PEERS_WAIT=1 the other ranks then wait at that step without an error,
as NCCL's ranks wait in a collective for a peer that is gone (gloo's fail at once on the
closed connection), which only a GPU job would show. AUDIOLLM_MINIMAL_STOP_END_DELAY_S
(seconds) keeps rank 0 that long past its last collective when the job stops early, as a
logger's end can, while its peers have exited for the requeue.

Its periodic saves are every rank's, as a distributed checkpoint's are: each reports the
save phase, rank 0 writes, and all meet in a barrier before the next step.
AUDIOLLM_MINIMAL_SAVE_DELAY_S (seconds) makes rank 0's writing take that long, and
AUDIOLLM_MINIMAL_FREEZE_IN_SAVE=RANK:STEP makes that rank stop itself (SIGSTOP, as a
process stuck in a file system does) inside the save of that step.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from orchestrator.runtime import job_control

IN_DIM, HIDDEN, BATCH_PER_RANK = 16, 64, 32


def _config(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN_DIM, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, 1),
    )


def _batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(BATCH_PER_RANK, IN_DIM, generator=gen)
    target_w = torch.linspace(-1.0, 1.0, IN_DIM)
    y = torch.sin(x @ target_w).unsqueeze(1) + 0.05 * torch.randn(BATCH_PER_RANK, 1, generator=gen)
    return x, y


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if (path / "state.pt").exists() else None


def _periodic_save(run_dir: Path, step: int, model, optim, keep_last: int, rank: int) -> None:
    """Every rank's part of a save, reported as the trainer reports it (job_control.progress)."""
    job_control.progress(step, "save")
    freeze_rank, _, freeze_step = os.environ.get("AUDIOLLM_MINIMAL_FREEZE_IN_SAVE", "").partition(":")
    if freeze_rank and rank == int(freeze_rank) and step == int(freeze_step):
        os.kill(os.getpid(), signal.SIGSTOP)
    if rank == 0:
        time.sleep(float(os.environ.get("AUDIOLLM_MINIMAL_SAVE_DELAY_S", "0")))
        _save(run_dir, step, model, optim, keep_last)
    dist.barrier()
    job_control.progress(step)


def _save(run_dir: Path, step: int, model, optim, keep_last: int) -> None:
    """Rank 0 writes (the replicas are identical); `latest` moves only once the file is complete."""
    ckpt_root = run_dir / "checkpoints"
    target = ckpt_root / f"step_{step}"
    target.mkdir(parents=True, exist_ok=True)
    torch.save({"step": step, "model": model.state_dict(), "optim": optim.state_dict()}, target / "state.pt.tmp")
    os.replace(target / "state.pt.tmp", target / "state.pt")
    tmp = ckpt_root / "latest.tmp"
    tmp.write_text(target.name + "\n")
    os.replace(tmp, ckpt_root / "latest")
    steps = sorted(int(p.name.split("_")[1]) for p in ckpt_root.glob("step_*") if (p / "state.pt").exists())
    for old in steps[: max(0, len(steps) - max(1, keep_last))]:
        shutil.rmtree(ckpt_root / f"step_{old}", ignore_errors=True)


def _trim_metrics(path: Path, last_step: int) -> None:
    """Drop lines of steps after the checkpoint (written before an unclean stop)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


def main(run_dir: str) -> dict:
    run_path = Path(run_dir)
    cfg = _config(run_path)
    plan = json.loads((run_path / "plan.json").read_text())
    train, optim_cfg = cfg["train"], cfg["optim"]
    gpu = cfg["launcher"]["accelerator"] == "gpu" and torch.cuda.is_available()
    torch.set_num_threads(1)  # deterministic and polite on a shared machine

    started = time.time()
    dist.init_process_group(backend="nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"[minimal_job] process group of {world} ranks ready in {time.time() - started:.1f} s", flush=True)
    if plan.get("world_size") not in (None, world):
        raise RuntimeError(f"plan.json world_size {plan['world_size']} != WORLD_SIZE {world} of this job")
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")

    seed, iters = int(train["seed"]), int(train["iters"])
    model = _model(seed).to(device)
    optim = torch.optim.AdamW(model.parameters(), lr=float(optim_cfg["lr"]), weight_decay=0.0)
    start = 0
    ckpt = latest_checkpoint(run_path)
    if ckpt is not None and cfg["run"].get("resume", "auto") == "auto":
        state = torch.load(ckpt / "state.pt", map_location=device)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = int(state["step"])
        if rank == 0:
            _trim_metrics(run_path / "metrics.jsonl", start)
            print(f"[minimal_job] resumed from {ckpt.name} (step {start})", flush=True)
    dist.barrier()

    delay = float(os.environ.get("AUDIOLLM_MINIMAL_STEP_DELAY_S", "0"))
    fail_rank, _, fail_step = os.environ.get("AUDIOLLM_MINIMAL_FAIL", "").partition(":")
    save_interval, keep_last = int(train.get("save_interval") or 0), int(train.get("keep_last") or 2)
    log_interval = max(1, int(train.get("log_interval") or 1))
    metrics = open(run_path / "metrics.jsonl", "a") if rank == 0 else None
    loss_value = float("nan")
    step = start
    while step < iters:
        if job_control.should_stop():  # step boundary: every rank gets the same answer
            if rank == 0:
                _save(run_path, step, model, optim, keep_last)
                print(f"[minimal_job] stop requested: checkpoint at step {step}", flush=True)
            dist.barrier()
            job_control.progress(step, job_control.END_PHASE)
            if rank == 0:
                time.sleep(float(os.environ.get("AUDIOLLM_MINIMAL_STOP_END_DELAY_S", "0")))
            return {"stopped_at": step}
        step_start = time.time()
        if fail_rank and step + 1 == int(fail_step):
            if rank == int(fail_rank):
                raise ValueError(f"batch of step {step + 1} has 3 columns, the model takes {IN_DIM} "
                                 "(AUDIOLLM_MINIMAL_FAIL)")
            if os.environ.get("AUDIOLLM_MINIMAL_PEERS_WAIT") == "1":
                time.sleep(3600)  # until the launcher ends the job
        x, y = _batch(seed, step, rank)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        optim.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        loss_value = mean_loss.item() / world
        step += 1
        job_control.progress(step)
        if delay:
            time.sleep(delay)
        if rank == 0:
            metrics.write(json.dumps({"step": step, "loss": loss_value, "time": time.time(),
                                      "step_s": time.time() - step_start}) + "\n")
            metrics.flush()
            if step % log_interval == 0 or step == iters:
                print(f"[minimal_job] step {step}/{iters} loss {loss_value:.6f}", flush=True)
        if save_interval and step % save_interval == 0 and step < iters:
            _periodic_save(run_path, step, model, optim, keep_last, rank)
    if rank == 0:
        if step > start or ckpt is None:
            _save(run_path, step, model, optim, keep_last)
        print(f"[minimal_job] done: step {step}" + (f" loss {loss_value:.6f}" if step > start else " (nothing left to train)"), flush=True)
    dist.barrier()
    job_control.progress(step, job_control.END_PHASE)
    return {"step": step, "loss": loss_value}
