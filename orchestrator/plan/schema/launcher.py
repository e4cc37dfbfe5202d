"""`launcher` group: where the job runs and how its processes start.

Names of the SLURM fields follow submitit's SlurmExecutor parameters (which follow
sbatch): `cpus_per_task`, `mem_gb`, `timeout_min`, `partition`, `account`, `qos`,
`constraint`, `exclusive`, `additional_sbatch` (submitit's `additional_parameters`),
`setup`, `srun_args`.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class LauncherConfig:
    kind: str = "local"  # local | slurm
    nodes: int = 1
    # Ranks per node: one per GPU; with accelerator=cpu, one process each.
    gpus_per_node: int = 1
    accelerator: str = "gpu"  # gpu (nccl) | cpu (gloo)
    gpu_type: str = "h100"  # for memory and throughput estimates (see estimate.py DEVICES)
    # Link speeds per GPU and direction, GB/s, for the step-time estimate of `audiollm plan`
    # (orchestrator/plan/step_time.py): NVLink inside a node, the network between nodes.
    # None: the GPU type's nominal figures (step_time.LINKS).
    intra_node_gb_s: Optional[float] = None
    inter_node_gb_s: Optional[float] = None
    cpus_per_task: int = 8
    mem_gb: Optional[int] = None  # memory per node; None: the cluster's default
    timeout_min: int = 240  # wall-time limit of one attempt (sbatch --time)
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    exclusive: bool = False
    # Extra `#SBATCH --key=value` lines, e.g. {mail-type: END}; they override the fields above.
    additional_sbatch: Dict[str, str] = field(default_factory=dict)
    setup: List[str] = field(default_factory=list)  # shell lines run before the job (module load, env)
    srun_args: List[str] = field(default_factory=list)
    max_requeues: int = 3  # preemptions/time-outs resumed before the run gives up
    dry_run: bool = False  # print sbatch script and argv, submit nothing
    # true: plan and submit a GPU run whose estimated memory on its most loaded stage exceeds
    # the GPU's (launcher.gpu_type), which `audiollm plan` and `train` otherwise refuse
    # (docs/memory.md: the estimate and the probe agree within a few percent).
    allow_unfit_memory: bool = False
    # The job: a callable `f(run_dir: str)` run on every rank with the torch.distributed
    # environment set ("package.module.function" or "package.module:function").
    entry: str = "orchestrator.train.entry.main"
    # Seconds between SLURM's warning signal (USR2) and the end of the time limit:
    # room to finish a step and write a checkpoint.
    signal_delay_s: int = 120
    # Most job-array elements running at once in a sweep (sbatch --array=...%N).
    array_parallelism: int = 64
    # local: True blocks and streams rank 0's output until the job ends.
    # slurm: True waits for the job to end; False (default) returns once it is queued.
    wait: Optional[bool] = None
