"""A rehearsal of the lent GPU machine, on CPU: the first GPU contact must not fail on
what a CPU can already show.

Run:  .venv/bin/python -m tests.rehearsal.lent_machine [--keep DIR] [--machine DIR]
(tests/rehearsal/test_lent_machine.py runs it in the test suite.)

The lent machine (docs/gpu-machines.md) has its own Python 3.12 whose `python3` is
itself a virtual environment, torch 2.11 (a CUDA 13 build), transformers 5.17 and
numpy 2.5 (constraints-gpu-machine.txt), no TransformerEngine, no megatron-core and no
internet. This script:

1. makes a machine like it: a virtual environment of Python 3.12 (this machine's
   `python3.12`; the running Python where there is none, and the report says so) with
   constraints-gpu-machine.txt's torch, transformers and numpy from the package index. torch 2.11
   for Linux x86-64 on the index is the CUDA build (its CUDA libraries install with it,
   about 2.6 GB, unused on a CPU); `torch.cuda.is_available()` is False here. The machine
   is kept between rehearsals on the same machine (`machine_dir`: one folder per Python
   and package set, under $AUDIOLLM_CACHE or ~/.cache/audiollm); it is reused only once
   its installation finished (a marker written last), so an interrupted one is made
   again, and one rehearsal at a time makes it (a lock);
2. writes the device kit on this (connected) machine, `audiollm wheels --kit --with-peft`
   (peft for the acceptance's HF + PEFT rows, which then run on transformers 5 here);
3. installs it there exactly as on the lent machine: `PYTHON=<its python3> bash setup.sh
   --from-wheels KIT SITE` (pip --no-index --no-deps --target), then everything below
   runs with PYTHONPATH=SITE from a folder outside the repository, so that the kit's
   copy of the project is what runs;
4. the acceptance's dry run there, as a lent machine's session runs it
   (`benchmarks/gpu_session.py PART --dry-run` for each part), with a demo corpus as
   the lent machine gets one: the job rows train the tiny model on the CPU through the
   same path (the 9B row's two launches, background save, resume and profiled step; the
   default recipe's job rows);
5. the job's start-up decisions on GPU machines for every GPU recipe (and the default
   recipe run on a GPU), and its model and first batch built with them
   (tests/rehearsal/gpu_decisions_script.py): what a CPU run cannot decide for itself
   (gradient-accumulation fusion, the flex attention kernel, bf16) decided for a GPU
   with TransformerEngine and without, the model built on the CPU with those decisions,
   every trained parameter in bf16 (megatron's bf16 optimizer checkpoints no other),
   and its first batch's forward;
6. one training step of every GPU recipe through `audiollm train`, shrunk to the tiny
   model but keeping its own flags: its parallel layout (TP 4 -> 2: the tiny decoder
   has 2 KV heads), sequence parallel, distributed optimizer, recompute, LoRA, packing
   and CP; the backend is local (no TransformerEngine there) and the attention is what
   the job picks on a CPU (reference); the LoRA step, started from the TP2 x PP2 step's
   checkpoint, holds it there (its checkpoints read their frozen weights from it);
7. `audiollm convert` both ways on transformers 5: the TP2 x PP2 step's checkpoint out to
   one HF model directory and back, verified against its decoder's logits.
8. `audiollm plan --probe` of the tiny model planned for a GPU with its layers compiled:
   the probe compiles them on torch 2.11 as the job would (orchestrator/probe/compiled.py
   needs torch's `ignore_compile_internals`), the GPU machine's torch, where the 9B row's
   probe runs.
9. the layers compiled at TP 2 with sequence parallelism and at CP 2 (2 ranks, gloo),
   their gradients through the traced collectives against eager
   (tests/models/compile_parallel_script.py `traced`): torch 2.11 traced megatron's own
   gathers to zero gradients (orchestrator/models/compile.py).

Prints one line per step and exits non-zero at the first failure, with its output.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu_session import PARTS
from tests.venvs import cached_venv, made_at, venv_dir

REPO = Path(__file__).resolve().parents[2]
# The lent machine's own stack, as the project states it (constraints-gpu-machine.txt).
MACHINE_PACKAGES = tuple(line.strip() for line in (REPO / "constraints-gpu-machine.txt").read_text().splitlines()
                         if line.strip() and not line.lstrip().startswith("#"))
MACHINE_PYTHON = "3.12"
# The GPU recipes, each shrunk to the tiny model on CPU processes: parallel sizes that the
# tiny decoder (2 KV heads) and a 2-core machine take, everything else the recipe's own.
SHRINK = ["model=tiny_audiollm", "model.backend=local", "launcher=local",
          "launcher.accelerator=cpu", "launcher.nodes=1", "launcher.cpus_per_task=1", "data=demo",
          "data.audio_token='<audio>'", "model.adapter.ctc_weight=0"]  # the recipes' models have no CTC head
# After the corpus's overrides: one step, no warm-up.
ONE_STEP = ["optim.micro_batch_size=1", "optim.lr_warmup_iters=0", "train.iters=1", "train.eval_generation=false",
            "train.eval_interval=0", "train.save_interval=0"]
RECIPE_LAYOUT = {  # recipe -> (overrides for the tiny model, processes), in the order they run
    "gemma2_whisper_tp4pp2": (["parallel.tp=2", "model.init_checkpoint=null"], 4),  # TP2 x PP2, SP, dist. optimizer, recompute
    "gemma2_whisper_8k_cp2": (["parallel.tp=2", "model.init_checkpoint=null"], 4),  # TP2 x CP2, SP, dist. optimizer, recompute
    # DP2, LoRA on a frozen decoder, distributed optimizer, recompute: LoRA needs pretrained
    # weights, so it starts from the TP2 x PP2 run's checkpoint (loaded at another layout).
    "gemma2_whisper_tp1": (["model.init_checkpoint={gemma2_whisper_tp4pp2}"], 2),
}


class StepFailed(RuntimeError):
    pass


def _run(label: str, argv: list, *, env: dict | None = None, cwd: Path | None = None, timeout: int = 900) -> str:
    started = time.perf_counter()
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    out = proc.stdout + proc.stderr
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise StepFailed(f"{label}: exit {proc.returncode} after {took:.0f} s\n{out[-8000:]}")
    print(f"[rehearsal] {label}: ok in {took:.0f} s", flush=True)
    return out


def machine_python() -> tuple[str, str]:
    """(interpreter that makes the machine's virtual environment, its X.Y)."""
    for candidate in (shutil.which(f"python{MACHINE_PYTHON}"),
                      str(Path.home() / f".pyenv/versions/{MACHINE_PYTHON}.1/bin/python")):
        if candidate and Path(candidate).exists():
            probe = subprocess.run([candidate, "-c", "import sys, venv; print(sys.version_info[:2])"],
                                   capture_output=True, text=True)
            if probe.returncode == 0:
                return candidate, MACHINE_PYTHON
    base = getattr(sys, "_base_executable", sys.executable)
    return base, f"{sys.version_info[0]}.{sys.version_info[1]}"


def machine_dir(version: str) -> Path:
    """Where the machine of this Python version and MACHINE_PACKAGES is kept between
    rehearsals: another package set or Python gets a folder of its own."""
    return venv_dir("lent-machine", version, MACHINE_PACKAGES)


def make_machine(venv: Path | None = None) -> tuple[Path, str]:
    """A virtual environment shaped like the lent machine's python3 (made once, then
    reused: tests/venvs.py); returns its python3 and Python version. The lent machine
    comes with these packages: how they get there is not rehearsed."""
    interpreter, version = machine_python()
    if version != MACHINE_PYTHON:
        print(f"[rehearsal] no python{MACHINE_PYTHON} here: the machine uses Python {version}", flush=True)
    started = time.perf_counter()
    python3 = cached_venv("lent-machine", interpreter, version, MACHINE_PACKAGES, folder=venv)
    print(f"[rehearsal] machine: {python3.parent.parent} (made {made_at(python3)}; ready in "
          f"{time.perf_counter() - started:.0f} s)", flush=True)
    return python3, version


def machine_env(site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(site), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


def corpus(root: Path) -> list:
    """A tiny MDS corpus (tone clips with digit-word transcripts) written here; the
    overrides that train on it."""
    from tests.train.audiollm_runs import make_corpus, train_overrides

    return train_overrides(make_corpus(root / "corpus"), wandb=True)  # the job says W&B is off without wandb


def rehearse(root: Path, machine: Path | None = None) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    report = {}
    python3, version = make_machine(machine)
    versions = _run("machine: versions", [python3, "-c", "import sys, torch, transformers, numpy; print(sys.prefix "
                                          "!= sys.base_prefix, torch.__version__, torch.cuda.is_available(), "
                                          "transformers.__version__, numpy.__version__)"])
    report["machine"] = versions.strip().splitlines()[-1]
    kit = root / "kit"
    for old in (kit, root / "site", root / "work", root / "outputs", root / "corpus", root / "demo"):
        shutil.rmtree(old, ignore_errors=True)
    torch_version = next(p.split("==")[1] for p in MACHINE_PACKAGES if p.startswith("torch=="))
    out = _run("kit: audiollm wheels --kit --with-peft",
               [sys.executable, "-m", "orchestrator.cli", "wheels", kit, "--kit", "--with-peft", "--python", version,
                "--machine-torch", torch_version], cwd=REPO)
    report["kit"] = out.strip().splitlines()[0]
    site = root / "site"
    _run("machine: bash setup.sh --from-wheels", ["bash", REPO / "setup.sh", "--from-wheels", kit, site],
         env={**os.environ, "PYTHON": str(python3)}, cwd=REPO)
    env = machine_env(site)
    work = root / "work"
    work.mkdir()
    # The kit's project, not the repository's, must be the one imported from here on.
    where = _run("machine: the kit's project is imported", [python3, "-c", "import orchestrator; print(orchestrator.__file__)"],
                 env=env, cwd=work)
    if not where.strip().startswith(str(site)):
        raise StepFailed(f"orchestrator imported from {where.strip()}, not from the kit in {site}")
    # The acceptance as a lent machine's session runs it, part by part (no group skipped:
    # the dry run's time is not the GPU's).
    # The job rows train on the demo corpus a lent machine gets (docs/gpu-machines.md), here
    # with the tiny model on the CPU through the same path: the 9B's launches, its save,
    # resume and profiled step; the default recipe's job rows.
    demo = root / "demo"
    _run("the job rows' demo corpus", [sys.executable, "-m", "orchestrator.cli", "data", "demo", demo,
                                       "--num-samples", "96", "--num-val-samples", "8"], cwd=REPO)
    report["acceptance"], report["session_groups"], report["session_files"] = [], [], {}
    for part in sorted(PARTS):
        out = root / f"session_{part}"
        _run(f"benchmarks/gpu_session.py {part} --dry-run",
             [python3, REPO / "benchmarks" / "gpu_session.py", part, "--dry-run", "--seconds", "1800",
              "--demo-corpus", demo], env={**env, "OUT": str(out)}, cwd=work)
        session = json.loads((out / "session.json").read_text())
        report["session_groups"] += [(part, g["group"], g.get("exit", g.get("skipped"))) for g in session["groups"]]
        report["acceptance"] += [row for group in session["groups"] for row in group.get("rows", [])]
        report["session_files"][part] = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    data = corpus(root)
    decisions = _run("GPU decisions: every GPU recipe's model and first batch",
                     [python3, REPO / "tests" / "rehearsal" / "gpu_decisions_script.py", json.dumps(data)],
                     env=env, cwd=work)
    report["gpu_decisions"] = [line for line in decisions.splitlines() if line.startswith("recipe ")]
    report["steps"] = {}
    output_root = root / "outputs"
    run_dirs = {}
    for recipe, (layout, processes) in RECIPE_LAYOUT.items():
        layout = [o.format(**run_dirs) for o in layout]
        _run(f"one training step: {recipe}",
             [python3, "-m", "orchestrator.cli", "train", f"+recipe={recipe}", *SHRINK, *layout,
              f"launcher.gpus_per_node={processes}", *data, *ONE_STEP, f"optim.global_batch_size={processes}",
              f"run.name={recipe}", f"run.output_root={output_root}"], env=env, cwd=work)
        (metrics,) = output_root.rglob(f"{recipe}/metrics.jsonl")
        run_dirs[recipe] = metrics.parent
        rows_ = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        report["steps"][recipe] = rows_[-1]
        if [r["step"] for r in rows_] != [1] or not 0 < rows_[-1]["loss"] < 100:
            raise StepFailed(f"{recipe}: metrics {rows_}")
        # The job's first lines: its decisions, the Adam step it runs, and that W&B is off
        # without wandb (the recipes log to W&B; the kit has neither wandb nor matplotlib,
        # whose absence costs the run its loss_curve.png alone).
        rank0 = (metrics.parent / "logs" / "rank0.log").read_text()
        for said in ("decided on this machine:", "gradient-accumulation fusion: off (CPU)",
                     "optimizer: torch.optim.adamw.AdamW (per-tensor loop)",
                     "W&B logging is off: wandb is not installed here",
                     "no loss_curve.png: matplotlib is not installed here"):
            if said not in rank0:
                raise StepFailed(f"{recipe}: the job did not say {said!r} (logs/rank0.log)")
    # The LoRA step leaves its frozen base out of its checkpoints and reads it from the TP2 x
    # PP2 run's checkpoint, which that run's retention must now keep: the job holds it there.
    from orchestrator.plan.checkpoint_dirs import HOLDS

    holds = list((run_dirs["gemma2_whisper_tp4pp2"] / "checkpoints" / HOLDS).glob("step_*/*.json"))
    if len(holds) != 1:
        raise StepFailed(f"gemma2_whisper_tp1 did not hold the checkpoint it started from: {holds}")
    # transformers 5 on both conversion paths: the TP2 x PP2 run out to HF (one AudioLLM
    # model directory, its remote code run by transformers 5) and back, with the logits of
    # its decoder compared.
    hf_dir, back = root / "hf_export", root / "hf_import"
    _run("convert megatron-to-hf", [python3, "-m", "orchestrator.cli", "convert", "megatron-to-hf", "--megatron",
                                    run_dirs["gemma2_whisper_tp4pp2"], "--out", hf_dir], env=env, cwd=work)
    verified = _run("convert hf-to-megatron --verify", [python3, "-m", "orchestrator.cli", "convert", "hf-to-megatron",
                                                        "--hf", hf_dir, "--out", back, "--verify"], env=env, cwd=work)
    checked = [line for line in verified.splitlines() if line.startswith("{") and '"ok": true' in line]
    if not checked:
        raise StepFailed(f"hf-to-megatron --verify printed no passing comparison:\n{verified[-3000:]}")
    report["convert_verify"] = json.loads(checked[-1])
    probe = _run("audiollm plan --probe, compiled layers",
                 [python3, "-m", "orchestrator.cli", "plan", "+recipe=tiny_cpu", "launcher.accelerator=gpu",
                  "model.backend=local", "model.compile=layers", "--probe"], env=env, cwd=work)
    said = [line.strip() for line in probe.splitlines() if line.strip().startswith("the probe ")]
    if said != ["the probe compiles the layers as the job does (inductor's partitioner on fake tensors: "
                "orchestrator/probe/compiled.py)"]:
        raise StepFailed(f"the probe did not compile the layers: {said}\n{probe[-3000:]}")
    report["probe_compiled"] = said[0]
    # The layers' collectives traced into their graphs on torch 2.11: megatron's own
    # gathers, traced as they are, gave zero gradients there (orchestrator/models/compile.py).
    traced = _run("compiled layers at TP 2 with SP and at CP 2, gradients against eager",
                  [python3, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                   REPO / "tests" / "models" / "compile_parallel_script.py", "traced"],
                  env={**env, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}, cwd=work)
    report["compiled_parallel"] = [json.loads(m) for m in
                                   (line[len("RESULT "):] for line in traced.splitlines() if line.startswith("RESULT "))]
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument("--machine", type=Path, help="the machine's virtual environment (default: machine_dir, kept "
                                                     "between rehearsals)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lent_machine_") as tmp:
        try:
            report = rehearse(args.keep or Path(tmp), args.machine)
        except StepFailed as failure:
            print(f"[rehearsal] FAILED: {failure}", flush=True)
            return 1
    print(json.dumps(report, indent=1))
    print(f"[rehearsal] the lent machine's rehearsal passed in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
