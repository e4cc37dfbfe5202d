"""The root config: every group plus the run and training-loop sections."""

from dataclasses import dataclass, field
from typing import Optional

from orchestrator.plan.schema.data import DataConfig
from orchestrator.plan.schema.launcher import LauncherConfig
from orchestrator.plan.schema.logger import LoggerConfig
from orchestrator.plan.schema.lora import LoraConfig
from orchestrator.plan.schema.model import ModelConfig
from orchestrator.plan.schema.optim import OptimConfig
from orchestrator.plan.schema.parallel import ParallelConfig


@dataclass
class TrainConfig:
    iters: int = 1000  # optimizer steps
    log_interval: int = 10
    eval_interval: int = 0  # 0: evaluate only at the end
    eval_iters: int = 10
    # Also evaluate before the first step (step 0): the starting point of a fine-tune,
    # e.g. the pretrained model's WER on the new data. Fresh runs only, not on resume.
    eval_at_start: bool = False
    # Also greedy-decode the validation datasets at every evaluation and score each by its
    # metric (WER, exact match or BLEU: orchestrator/train/generation_eval.py). Runs inside
    # training at the run's own layout (TP, PP, CP, DP), except with virtual pipeline
    # chunks (parallel.vpp > 1: validation warns); `audiollm eval RUN_DIR` scores any
    # checkpoint at the layout you choose.
    # (Named eval_wer, eval_wer_batches, eval_wer_max_new_tokens before; orchestrator/plan/compose.py
    # refuses the old names with the new ones.)
    eval_generation: bool = False
    eval_generation_batches: int = 0  # batches of optim.micro_batch_size per validation dataset; 0: all
    eval_generation_max_new_tokens: int = 48
    # Joint CTC/attention decoding of the datasets whose answer is the clip's transcript
    # (a dataset's `ctc`): each token is chosen among the decoder's most likely by
    # (1 - w) * its log-probability + w * the adapter's CTC prefix score
    # (orchestrator/models/ctc_prefix.py). Needs the CTC head (model.adapter.ctc_weight > 0).
    # 0: the decoder alone.
    eval_generation_ctc_weight: float = 0.0
    save_interval: int = 0  # 0: save only at the end and on preemption
    # Also save once this many minutes of wall-clock time have passed since the last save
    # (rank 0's clock; the SLURM recipes set 30): what a lost node costs. 0: off.
    save_interval_minutes: float = 0
    keep_last: int = 2  # checkpoints kept
    # Also keep every checkpoint whose step is a multiple of this (0: none), e.g. for
    # `audiollm eval RUN --all` to score the whole run: save_interval 500, keep_every 2000.
    keep_every: int = 0
    # Write checkpoints in the background: a save stalls the step only for the save plan
    # and the copy of the tensors to host; a forked process writes the files and the
    # checkpoint is published (`latest`) once every rank's are written. Off by default (a
    # small run's saves take a moment; the fork costs host memory up to the rank's
    # shard of weights and optimizer state); the SLURM recipes turn it on.
    async_save: bool = False
    # false: frozen weights read from model.init_checkpoint (a LoRA run's base model, a
    # frozen encoder) are left out of checkpoints, which record where they are and read
    # them back from there at a resume, an evaluation and an export (a 9B LoRA checkpoint:
    # its adapter and optimizer, not 18 GB of base weights each), so that checkpoint must
    # stay where it is, unchanged; a checkpoint whose source is gone or changed is refused,
    # naming it. true: every checkpoint holds every weight (one to hand on by itself, or
    # to load with Megatron-LM's own tools).
    save_frozen_weights: bool = False
    # Seconds a rank may go without progress before the job is declared hung, its stacks
    # logged, the stopped rank named and the job requeued on SLURM (launchers/watchdog.py).
    # 0: max(120 s, 5 x the slowest step seen); while saving or evaluating, max(this
    # value or 120 s, 10 x the slowest save or evaluation seen); 30 minutes (or this
    # value, if longer) before the first steps, saves or evaluations are timed.
    hang_timeout: float = 0
    # Every log interval a rank whose own time per step (data wait, forward/backward,
    # optimizer: not its waits for others) is this fraction above the median of all ranks
    # is named on the console and in metrics.jsonl (`stragglers`).
    straggler_threshold: float = 0.2
    # Profile steps of the run with torch.profiler, to see what bounds a step (the GPU's
    # kernels, or the host issuing them): [first, last] optimizer steps, inclusive, e.g.
    # [10, 10]; empty: off. Each rank of profile_ranks writes
    # RUN/profile/steps_<first>-<last>/rank<N>/ops.txt (operators by their own device
    # time, host time and input shape) and trace.json.gz (Perfetto, chrome://tracing);
    # metrics.jsonl marks those steps `profiled`: the profiler slows them
    # (orchestrator/train/profiling.py).
    profile_steps: list[int] = field(default_factory=list)
    profile_ranks: list[int] = field(default_factory=lambda: [0])
    seed: int = 1234


@dataclass
class RunConfig:
    experiment: str = "default"
    name: Optional[str] = None  # default: <recipe>-<config hash>, see orchestrator/plan/rundir.py
    output_root: str = "outputs"  # run directory: <output_root>/<experiment>/<name>/
    resume: str = "auto"  # auto: continue the run directory's latest checkpoint | never


@dataclass
class AudioLLMConfig:
    recipe: Optional[str] = None  # name of the recipe this config came from
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
