"""`launcher` group: where the job runs and how its processes start."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class LauncherConfig:
    kind: str = "local"  # local | slurm
    nodes: int = 1
    # Ranks per node: one per GPU; with accelerator=cpu, one process each.
    gpus_per_node: int = 1
    accelerator: str = "gpu"  # gpu | cpu
    gpu_type: str = "h100"  # for memory and throughput estimates (see estimate.py DEVICES)
    cpus_per_task: int = 8
    mem_gb: Optional[int] = None
    timeout_min: int = 240
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    exclusive: bool = False
    additional_sbatch: Dict[str, str] = field(default_factory=dict)
    setup: List[str] = field(default_factory=list)  # shell lines run before the job (module load, env)
    srun_args: List[str] = field(default_factory=list)
    max_requeues: int = 3  # preemptions/time-outs resumed before the run gives up
    dry_run: bool = False  # print sbatch script and argv, submit nothing
