"""`audiollm plan ... --probe`: the plan's memory and parameters beside a measurement.

Submit side: no torch here. Each rank role (pipeline stage, and context-parallel rank
where there are several) is probed in a process of its own, forked from one that imports
the job once (orchestrator/probe/forks.py, role.py), at most as many at once as this
machine has cores; this module starts them, reads their JSON and sets it beside the
plan's estimate (orchestrator/plan/estimate.py), category by category.

The comparison: weights, grads and optimizer state as such; the plan's activations
(everything a step keeps for the backward, its recompute, logits and loss) against the
probe's activations plus temporaries at its peak. Neither side counts the plan's margin
(MEMORY_MARGIN, FIXED_OVERHEAD_GIB: allocator and CUDA context); "fits" adds it to the
probe's peak as the plan adds it to its estimate.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.plan.estimate import FIXED_OVERHEAD_GIB, GIB, MEMORY_MARGIN

CATEGORIES = ("weights", "grads", "optimizer", "activations")


class ProbeFailed(RuntimeError):
    def __init__(self, message: str, probe: int | None = None):
        super().__init__(message)
        self.probe = probe  # the index in run_probes' `probes` of the plan whose role failed


def probe_roles(plan: dict) -> list[tuple[int, int]]:
    """(pipeline stage, context-parallel rank) of every role (orchestrator/probe/fake_world.py
    says which ranks stand for which)."""
    return [(stage, cp_rank) for stage in range(int(plan["pp"])) for cp_rank in range(int(plan["cp"]))]


def _failure(log: Path) -> str:
    """A failed role's log, shortened to the project's own frames and the error."""
    lines = log.read_text().strip().splitlines()
    ours = [line for line in lines if "/orchestrator/" in line and "File " in line][-6:]
    return "\n  ".join(ours + lines[-1:])


def run_probe(plan: dict, roles=None, workers: int | None = None) -> list[dict]:
    """Probe every role of `plan` (Plan.to_dict()), or those in `roles`, at most `workers`
    (this machine's cores) at once; their results in order."""
    (results,) = run_probes([(plan, roles)], workers)
    return results


def run_probes(probes: list, workers: int | None = None) -> list[list[dict]]:
    """run_probe of each (plan, roles or None) in `probes`, their roles forked from one
    process that imports the job once (orchestrator/probe/forks.py), at most `workers`
    (this machine's cores) at once; each plan's results in order. Raises ProbeFailed at
    the first role that fails, naming it, with the project's frames and the error."""
    with tempfile.TemporaryDirectory(prefix="audiollm-probe-") as tmp:
        jobs, owners = [], []
        for k, (plan, roles) in enumerate(probes):
            plan_dir = Path(tmp) / f"plan{k}"  # the probe's run directory (role.py)
            plan_dir.mkdir()
            (plan_dir / "plan.json").write_text(json.dumps(plan))
            for stage, cp_rank in (probe_roles(plan) if roles is None else roles):
                name = plan_dir / f"stage{stage}_cp{cp_rank}"
                jobs.append({"plan": str(plan_dir / "plan.json"), "stage": stage, "cp_rank": cp_rank,
                             "out": f"{name}.json", "log": f"{name}.log"})
                owners.append(k)
        workers = max(1, min(len(jobs), workers or os.cpu_count() or 1))
        (Path(tmp) / "roles.json").write_text(json.dumps(jobs))
        with open(Path(tmp) / "forks.log", "w") as log:
            # A session of its own: a failure stops the forks and every role they started at once.
            process = subprocess.Popen([sys.executable, "-m", "orchestrator.probe.forks", str(Path(tmp) / "roles.json"),
                                        str(workers)], stdout=subprocess.PIPE, stderr=log, text=True,
                                       start_new_session=True)
        try:
            ended = set()
            for line in process.stdout:
                index, code = (int(x) for x in line.split())
                if code != 0:
                    job = jobs[index]
                    raise ProbeFailed(f"the probe of pipeline stage {job['stage']}, context-parallel rank "
                                      f"{job['cp_rank']} failed (exit {code}):\n  {_failure(Path(job['log']))}",
                                      owners[index])
                ended.add(index)
            if process.wait() != 0 or len(ended) < len(jobs):
                raise ProbeFailed(f"the probe's process failed (exit {process.returncode}):\n  "
                                  f"{_failure(Path(tmp) / 'forks.log')}")
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            process.stdout.close()
        results = [json.loads(Path(job["out"]).read_text()) for job in jobs]
    return [[r for r, owner in zip(results, owners) if owner == k] for k in range(len(probes))]


@dataclass
class StageComparison:
    stage: int
    planned: dict  # category -> GiB, and "total"
    probed: dict
    params_planned: dict  # total, trainable
    params_probed: dict
    fits: bool  # the probe's peak with the plan's margin on the plan's device
    total_with_margin_gib: float
    device_gib: float

    def difference(self, category: str) -> float:
        """(plan - probe) / probe."""
        probed = self.probed[category]
        return (self.planned[category] - probed) / probed if probed else float("inf") if self.planned[category] else 0.0

    @property
    def largest(self) -> str:
        return max(CATEGORIES, key=lambda c: self.probed[c])


def stage_results(results: list[dict]) -> list[dict]:
    """Per pipeline stage, the probed role with the highest peak (the plan estimates the
    stage's most loaded rank), in stage order."""
    worst: dict[int, dict] = {}
    for result in results:
        stage = result["stage"]
        if stage not in worst or result["memory"]["peak"] > worst[stage]["memory"]["peak"]:
            worst[stage] = result
    return [worst[stage] for stage in sorted(worst)]


def compare(plan: dict, results: list[dict]) -> list[StageComparison]:
    """Each probed stage (its most loaded role) beside the plan's estimate of it."""
    low_precision = plan["config"]["launcher"]["accelerator"] == "gpu"
    out = []
    for result in stage_results(results):
        stage = result["stage"]
        estimate = plan["memory"]["by_stage"][stage]
        params = plan["parameters"]["per_rank_by_stage"][stage]
        planned = {c: estimate[f"{c}_gib"] for c in CATEGORIES}
        peak = result["memory"]["peak_by_category"]
        probed = {"weights": peak["weights"], "grads": peak["grads"], "optimizer": peak["optimizer"],
                  "activations": peak["activations"] + peak["temporaries"]}
        probed = {c: v / GIB for c, v in probed.items()}
        planned["total"], probed["total"] = sum(planned.values()), sum(probed.values())
        with_margin = probed["total"] * (1 + MEMORY_MARGIN) + (FIXED_OVERHEAD_GIB if low_precision else 0.0)
        device = estimate["device_gib"] if estimate["device_gib"] is not None else float("inf")
        out.append(StageComparison(
            stage=stage, planned=planned, probed=probed,
            params_planned={"total": params["total"], "trainable": params["trainable"]},
            params_probed={"total": result["parameters"]["total"], "trainable": result["parameters"]["trainable"]},
            fits=with_margin <= device, total_with_margin_gib=with_margin, device_gib=device))
    return out


def probe_stepped_eager(plan: dict, results: list[dict]) -> bool:
    """Whether the job compiles its layers and the probe stepped them eagerly (a torch that
    cannot compile under the probe's dispatch modes: orchestrator/probe/compiled.py)."""
    return plan["model_extensions"]["compiled"] == "layers" and any(r["compiled"] != "layers" for r in results)


def compile_note(plan: dict, results: list[dict]) -> list[str]:
    """The report's line where the job compiles its layers: whether the probe did too."""
    if plan["model_extensions"]["compiled"] != "layers" or not results:
        return []
    if not probe_stepped_eager(plan, results):
        return ["  the probe compiles the layers as the job does (inductor's partitioner on fake tensors: "
                "orchestrator/probe/compiled.py)"]
    return ["  the probe steps the layers eagerly (this torch cannot compile under its dispatch modes: "
            "orchestrator/probe/compiled.py): the plan counts what compiled layers keep, which is less "
            "(the compiler recomputes their cheap element-wise work in the backward; docs/memory.md)"]


def render(plan: dict, results: list[dict]) -> str:
    lines = ["probe         one training step per pipeline stage (and context-parallel rank) at full size on fake "
             "tensors, in one CPU process each (orchestrator/probe/)"]
    for comparison, result in zip(compare(plan, results), stage_results(results)):
        pp, pr = comparison.params_planned, comparison.params_probed
        same = "equal" if pp == pr else "DIFFER"
        timings = result["timings"]
        lines += [
            f"  stage {comparison.stage} (rank {result['rank']} of {result['world_size']}"
            f"{', the most loaded of ' + str(plan['cp']) + ' CP ranks' if int(plan['cp']) > 1 else ''}, "
            f"{result['microbatches_per_step']} micro-batches a step): {timings['total_s']:.1f} s, "
            f"peak RSS {result['peak_rss_mib']:.0f} MiB",
            f"    parameters   plan {pp['total']:,} ({pp['trainable']:,} trainable), probe {pr['total']:,} "
            f"({pr['trainable']:,} trainable): {same}",
            f"    memory GiB   {'plan':>8} {'probe':>8} {'plan-probe':>11}",
        ]
        for category in CATEGORIES + ("total",):
            diff = comparison.difference(category)
            lines.append(f"    {category:<12} {comparison.planned[category]:8.2f} {comparison.probed[category]:8.2f} "
                         f"{diff:+10.1%}")
        verdict = "fits" if comparison.fits else \
            f"DOES NOT FIT (largest: {comparison.largest} {comparison.probed[comparison.largest]:.1f} GiB)"
        lines.append(f"    probe + margin {comparison.total_with_margin_gib:.1f} GiB of "
                     f"{comparison.device_gib:.1f} GiB: {verdict}")
    lines += compile_note(plan, results)
    stand_ins = results[0]["stand_ins"] if results else []
    if stand_ins:
        lines.append("  stand-ins (what cannot run on fake tensors on a CPU):")
        lines += [f"    - {line}" for line in stand_ins]
    return "\n".join(lines)
