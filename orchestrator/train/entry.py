"""Job entry point, called on every rank: `orchestrator.train.entry.main(run_dir)`.

The launcher sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; the run
directory holds plan.json (the resolved Plan) and config.yaml (`audiollm prepare` writes
one without submitting). A prepared run is started by hand through launchers/by_hand.py
(`srun ... python -m launchers.by_hand RUN_DIR`, or torchrun's `-m launchers.by_hand
RUN_DIR`), which gives the ranks stop signals, failure records and hang detection around
this entry; `python -m orchestrator.train.entry RUN_DIR` runs the entry alone.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Callable, Optional

log = logging.getLogger("orchestrator.train")

def build_components(plan, dp_rank: int, dp_size: int):
    """The default components factory: the AudioLLM (model section) on the MDS loader
    (data section), see orchestrator.train.audiollm_provider. Another factory
    (plan, dp_rank, dp_size) -> Components plugs another model and data source into the
    same trainer (make_trainer, main)."""
    from orchestrator.train.audiollm_provider import build_audiollm_components

    return build_audiollm_components(plan, dp_rank, dp_size)


_OWN_LOGGERS = ("orchestrator", "launchers", "__main__")


def _for_the_console(record: logging.LogRecord) -> bool:
    """The project's own messages, and errors from anyone."""
    return record.levelno >= logging.ERROR or record.name.split(".")[0] in _OWN_LOGGERS


def setup_logging(rank: int) -> None:
    """Log records of this rank. Under the launcher, whose stderr also writes the rank log
    (`sys.stderr.log`, launchers/job.py), libraries' notices below ERROR (megatron's rerun
    state machine, torch's missing CUDA runtime, ...) go to the rank log only; the console
    keeps the project's messages and every error. Elsewhere everything goes to stderr.
    Handlers that others installed (a host application's) are kept; ours are replaced."""
    formatter = logging.Formatter(f"[rank{rank}] %(asctime)s %(name)s %(levelname)s: %(message)s")
    console = logging.StreamHandler(sys.stderr)
    handlers = [console]
    rank_log = getattr(sys.stderr, "log", None)
    if rank_log is not None:
        console.addFilter(_for_the_console)
        details = logging.StreamHandler(rank_log)
        details.addFilter(lambda record: not _for_the_console(record))
        handlers.append(details)
    for handler in handlers:
        handler.setFormatter(formatter)
        handler._audiollm = True  # ours: replaced by the next call, the host application's kept
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if not getattr(h, "_audiollm", False)] + handlers
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    # torch's logger does not propagate to the root, and its own handler would print torch's
    # notices to the console unfiltered: ours replace it.
    logging.getLogger("torch").handlers = handlers
    # megatron-core logs every parameter and config at INFO; streaming logs its defaults
    # each time a dataset is opened.
    for noisy in ("megatron", "streaming"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def make_trainer(run_dir, components_factory=None, plan=None, training: bool = True):
    """Distributed init + Trainer for the run directory's plan (all ranks)."""
    from megatron.core import parallel_state as ps

    from orchestrator.plan.resolved import Plan
    from orchestrator.runtime.distributed import init_distributed
    from orchestrator.train.loop import Trainer

    plan = plan or Plan.load(run_dir)
    device = init_distributed(plan.dims, plan.seed)
    import torch.distributed as dist

    plan.check_world(dist.get_world_size())
    dp_rank, dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    components = (components_factory or build_components)(plan, dp_rank, dp_size)
    return Trainer(plan, components, device, training=training)


def main(run_dir: str | Path, components_factory: Optional[Callable] = None) -> int:
    """Train the run in `run_dir` on this rank (with `components_factory`'s model and
    data, the AudioLLM's by default). Returns 0; a diverged run (NaN/Inf loss) is
    logged with its diagnostic and re-raised, so the launcher records the run as failed
    with that message."""
    from orchestrator.runtime.distributed import shutdown
    from orchestrator.runtime.slurm_env import export_from_slurm
    from orchestrator.train.loop import TrainingDiverged

    export_from_slurm()  # started by srun inside an allocation: RANK and the rest from SLURM's variables
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(rank)
    try:
        trainer = make_trainer(run_dir, components_factory)
        if rank == 0 and not str(trainer.device).startswith("cuda"):
            print("CPU path: fp32, gloo, megatron-core's local layers (TransformerEngine, Apex and fused kernels "
                  "are for GPUs); library notices go to logs/rank0.log", flush=True)
        trainer.run()
    except TrainingDiverged as exc:
        log.error("%s", exc)
        raise
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m orchestrator.train.entry RUN_DIR")
    sys.exit(main(sys.argv[1]))
