"""The training job under test, on every rank (torchrun). Modes:
  train RUN_DIR                         train to the end (entry.main's path)
  kill RUN_DIR STEP                     train, then exit the process hard after STEP's checkpoint
  stop RUN_DIR STEP                     rank 0 gets SIGTERM's stop request at STEP (as from the launcher)
  poison RUN_DIR SAMPLE                 synthetic sample SAMPLE has a NaN loss mask
  slow RUN_DIR RANK                     RANK's forward takes 0.15 s longer per micro-batch
  eval RUN_DIR CKPT_RUN_DIR             load CKPT_RUN_DIR's latest model weights into this
                                        (maybe differently parallel) plan; print val loss
Prints `RESULT <json>` on rank 0."""

import hashlib
import json
import os
import sys

import torch.distributed as dist


def main() -> int:
    mode, run_dir = sys.argv[1], sys.argv[2]
    from orchestrator.runtime.distributed import shutdown
    from orchestrator.train import entry
    from orchestrator.train.loop import TrainingDiverged
    from orchestrator.plan.resolved import Plan

    entry.setup_logging(int(os.environ["RANK"]))
    from tests.train import stand_in

    plan = Plan.load(run_dir)
    factory = None  # from the plan's model: the AudioLLM's (entry's default) or the stand-in's
    if plan.section("model").get("name") == stand_in.MODEL_NAME:
        factory = stand_in.build_components
    if mode == "poison":
        sample = int(sys.argv[3])
        factory = lambda plan, r, n: stand_in.build_components(plan, r, n, poison_sample=sample)  # noqa: E731
    trainer = entry.make_trainer(run_dir, factory, plan=plan)
    result = {}
    if mode == "kill":
        kill_step = int(sys.argv[3])

        def kill(trainer, step):
            if step == kill_step:
                dist.barrier()
                os._exit(17)  # a real crash: no clean-up, no atexit

        trainer.callbacks.append(kill)
    if mode == "slow":  # rank SLOW_RANK spends 0.15 s more in every micro-batch's forward
        import time

        slow_rank = int(sys.argv[3])
        forward = trainer._forward_step

        def slow_forward(*args, **kwargs):
            if dist.get_rank() == slow_rank:
                time.sleep(0.15)
            return forward(*args, **kwargs)

        trainer._forward_step = slow_forward
        mode = "train"
    if mode == "stop":
        stop_step = int(sys.argv[3])

        def stop(trainer, step):
            if step == stop_step and dist.get_rank() == 0:
                import signal

                from orchestrator.runtime import job_control

                job_control.request_stop(signal.SIGTERM)

        trainer.callbacks.append(stop)
    if mode == "eval":
        from orchestrator.train import checkpoint as ckpt

        ckpt.load_model_weights(ckpt.latest_checkpoint(sys.argv[3]), trainer.chunks)
        result["eval"] = trainer.evaluate()
    else:
        frozen_before = {n: p.detach().clone() for c in trainer.unwrapped for n, p in c.named_parameters()
                         if not p.requires_grad}
        trainable_before = {n: p.detach().clone() for c in trainer.unwrapped for n, p in c.named_parameters()
                            if p.requires_grad}
        try:
            history = trainer.run()
        except TrainingDiverged as exc:
            print(f"DIVERGED {exc}", flush=True)
            shutdown()
            return 3
        result["losses"] = [h["loss"] for h in history]
        result["history"] = history
        params = {n: p for c in trainer.unwrapped for n, p in c.named_parameters()}
        changes = {n: (params[n].detach() - before).abs().max().item()
                   for n, before in {**frozen_before, **trainable_before}.items()}
        # The final weights themselves, as a digest of their bytes: ranks that hold
        # replicas of a tensor must hold the same bits.
        digests = {n: hashlib.sha1(p.detach().float().contiguous().numpy().tobytes()).hexdigest()
                   for n, p in params.items()}
        everyone = [None] * dist.get_world_size()
        # Every module that holds a megatron config holds the job's one (the loop's, DDP's).
        from megatron.core.transformer import TransformerConfig

        configs = {id(m.config) for c in trainer.chunks for m in c.modules()
                   if isinstance(getattr(m, "config", None), TransformerConfig)}
        dist.all_gather_object(everyone, {"members": trainer.group_members, "changes": changes,
                                          "digests": digests, "frozen": sorted(frozen_before),
                                          "one_config": configs == {id(trainer.config)}})
        result["ranks"] = everyone
        result["eval"] = trainer.evaluate()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
