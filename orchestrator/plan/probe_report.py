"""`audiollm plan ... --probe`: the plan's memory and parameters beside a measurement.

Submit side: no torch here. Each rank role (pipeline stage, and context-parallel rank
where there are several) is probed in a process of its own
(`python -m orchestrator.probe.role`, orchestrator/probe/), at most as many at once as
this machine has cores; this module starts them, reads their JSON and sets it beside the
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
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.plan.estimate import FIXED_OVERHEAD_GIB, GIB, MEMORY_MARGIN

CATEGORIES = ("weights", "grads", "optimizer", "activations")


class ProbeFailed(RuntimeError):
    pass


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
    """Probe every role of `plan` (Plan.to_dict()), or those in `roles`, each in a process
    of its own, at most `workers` (this machine's cores) at once; their results in order."""
    roles = probe_roles(plan) if roles is None else list(roles)
    workers = max(1, min(len(roles), workers or os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix="audiollm-probe-") as tmp:
        plan_json = Path(tmp) / "plan.json"
        plan_json.write_text(json.dumps(plan))
        pending, running, results = list(roles), {}, {}
        try:
            while pending or running:
                while pending and len(running) < workers:
                    stage, cp_rank = role = pending.pop(0)
                    name = f"stage{stage}_cp{cp_rank}"
                    log = open(Path(tmp) / f"{name}.log", "w")
                    command = [sys.executable, "-m", "orchestrator.probe.role", str(plan_json), str(stage),
                               str(cp_rank), str(Path(tmp) / f"{name}.json")]
                    running[role] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log, name)
                for role, (process, log, name) in list(running.items()):
                    if process.poll() is None:
                        continue
                    log.close()
                    del running[role]
                    if process.returncode != 0:
                        raise ProbeFailed(f"the probe of pipeline stage {role[0]}, context-parallel rank {role[1]} "
                                          f"failed (exit {process.returncode}):\n  {_failure(Path(tmp) / f'{name}.log')}")
                    results[role] = json.loads((Path(tmp) / f"{name}.json").read_text())
                time.sleep(0.05)
        finally:
            for process, log, _ in running.values():
                process.kill()
                process.wait()
                log.close()
    return [results[role] for role in roles]


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
