"""torch.distributed's environment from SLURM's, for a job started outside submitit.

A user who already holds an allocation starts the job with `srun python -m
launchers.by_hand RUN_DIR`: SLURM then sets SLURM_PROCID / SLURM_NTASKS /
SLURM_LOCALID / SLURM_JOB_NODELIST, not the RANK / WORLD_SIZE / MASTER_ADDR that
torch.distributed reads. Under torchrun or the project's launcher RANK is set already
and nothing here applies. No torch import.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import List, MutableMapping, Optional

from orchestrator.runtime.ports import port_for_job


def expand_nodelist(nodelist: str) -> List[str]:
    """SLURM's compressed host list ("aunode[1-2,4],gpu07") -> host names, in order.
    `scontrol show hostnames` where it exists; otherwise the common forms by hand."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                 timeout=30)
            if out.returncode == 0 and out.stdout.split():
                return out.stdout.split()
        except (OSError, subprocess.SubprocessError):
            pass
    hosts: List[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{n:0{width}d}")
    return hosts


def _first_count(value: Optional[str]) -> Optional[int]:
    """SLURM_TASKS_PER_NODE "2(x3),1" -> 2 (tasks on the first node)."""
    match = re.match(r"(\d+)", value or "")
    return int(match.group(1)) if match else None


def export_from_slurm(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from
    a SLURM task's environment when RANK is absent. Returns whether it did. The master is
    the first node of the job; the port is MASTER_PORT if set, else one derived from the
    job id, so every task of the step picks the same without talking to the others."""
    if "RANK" in environ or "SLURM_PROCID" not in environ:
        return False
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise RuntimeError("SLURM_PROCID is set but no SLURM_JOB_NODELIST: start the job with srun inside the "
                           "allocation, or set RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT yourself")
    tasks_per_node = (_first_count(environ.get("SLURM_STEP_TASKS_PER_NODE"))
                      or _first_count(environ.get("SLURM_NTASKS_PER_NODE"))
                      or _first_count(environ.get("SLURM_TASKS_PER_NODE")) or 1)
    environ["RANK"] = environ["SLURM_PROCID"]
    environ["WORLD_SIZE"] = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS", "1")
    environ["LOCAL_RANK"] = environ.get("SLURM_LOCALID", "0")
    environ["LOCAL_WORLD_SIZE"] = str(tasks_per_node)
    environ.setdefault("MASTER_ADDR", expand_nodelist(nodelist)[0])
    environ.setdefault("MASTER_PORT", str(port_for_job(environ.get("SLURM_JOB_ID", "0"))))
    return True
