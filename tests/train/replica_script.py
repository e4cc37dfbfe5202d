"""Every rank (torchrun): the AudioLLM components of RUN_DIR's plan built twice, with
data.replica_reader on and off; from each, MICROBATCHES training micro-batches and two
validation ones as this rank's forward receives them (after its CP split). Prints
`RESULT <json>` on rank 0: per rank and mode, a digest of each micro-batch, the samples
this process read (SampleReader calls: data.num_workers=0) and the data state.

    replica_script.py RUN_DIR MICROBATCHES"""

import hashlib
import json
import sys

import torch
import torch.distributed as dist


def digest(value, h=None):
    h = h or hashlib.sha1()
    if isinstance(value, torch.Tensor):
        h.update(f"{value.dtype}{tuple(value.shape)}".encode())
        h.update(value.detach().contiguous().view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            h.update(str(key).encode())
            digest(value[key], h)
    elif isinstance(value, (list, tuple)):
        for item in value:
            digest(item, h)
    else:
        h.update(repr(value).encode())
    return h.hexdigest()


def main() -> int:
    run_dir, count = sys.argv[1], int(sys.argv[2])
    from megatron.core import parallel_state as ps

    from orchestrator.data import loader
    from orchestrator.runtime.distributed import init_distributed, shutdown
    from orchestrator.train.audiollm_provider import build_audiollm_components
    from orchestrator.plan.resolved import Plan

    reads = {"n": 0}
    read = loader.SampleReader.__getitem__

    def counted(self, task):
        reads["n"] += 1
        return read(self, task)

    loader.SampleReader.__getitem__ = counted
    plan = Plan.load(run_dir)
    init_distributed(plan.dims, seed=plan.seed)
    mine = {}
    for on in (True, False):
        plan.config["data"]["replica_reader"] = on
        reads["n"] = 0
        components = build_audiollm_components(plan, ps.get_data_parallel_rank(), ps.get_data_parallel_world_size())
        train = [digest(components.train_source.next_microbatch()) for _ in range(count)]
        val = [digest(components.val_source.next_microbatch()) for _ in range(2)]
        mine["on" if on else "off"] = {"train": train, "val": val, "reads": reads["n"],
                                       "state": digest(components.train_source.state_dict()),
                                       "names": components.train_source.dataset_names}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"ranks": everyone}), flush=True)
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
