"""Word error rate during training and in `audiollm eval`: the loop's `generation_eval`
hook (orchestrator.train.loop.Components).

Each data-parallel rank greedy-decodes its own share of every validation dataset
(the validation loaders shard by DP rank) with its unwrapped model chunk; error and
word counts are summed over the data-parallel group, so every rank returns the same
figures. Greedy decoding runs on one model-parallel rank (tp = pp = 1); in other
layouts the hook returns nothing and says so once.
"""

from __future__ import annotations

import logging
from typing import Dict

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

_COUNTS = ("errors", "words", "utterances")


class WerEvaluation:
    def __init__(self, loaders: dict, tokenizer_path: str, train_cfg, parallel_cfg):
        """`loaders`: this DP rank's validation sets by name (the same ones the validation
        loss reads)."""
        from orchestrator.data.tokenizer_build import load_tokenizer

        self.loaders = loaders
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.max_batches = int(train_cfg.eval_wer_batches) or None
        self.max_new_tokens = int(train_cfg.eval_wer_max_new_tokens)
        self.single_model_rank = parallel_cfg.tp * parallel_cfg.pp * parallel_cfg.cp == 1
        self._warned = False

    def __call__(self, trainer, step: int) -> Dict[str, float]:
        from megatron.core import parallel_state as ps

        from orchestrator.eval.asr import evaluate_wer

        if not self.single_model_rank or len(trainer.unwrapped) != 1:
            if not self._warned and trainer.rank == 0:
                log.warning("train.eval_wer: no WER inside training with model parallelism; "
                            "run `audiollm eval %s`", trainer.plan.run_dir)
            self._warned = True
            return {}
        model = trainer.unwrapped[0]
        was_training = model.training
        model.eval()
        try:
            report = evaluate_wer(model, self.loaders, self.tokenizer, max_new_tokens=self.max_new_tokens,
                                  max_batches=self.max_batches)
        finally:
            model.train(was_training)
        names = [n for n in report if n != "all"]
        counts = torch.tensor([[report[n][k] for k in _COUNTS] for n in names], dtype=torch.float64,
                              device=trainer.device)
        dist.all_reduce(counts, group=ps.get_data_parallel_group())
        out = {f"wer/{n}": float(c[0] / c[1].clamp_min(1)) for n, c in zip(names, counts)}
        total = counts.sum(dim=0)
        out["wer/all"] = float(total[0] / total[1].clamp_min(1))
        out["wer/utterances"] = float(total[2])
        return out
