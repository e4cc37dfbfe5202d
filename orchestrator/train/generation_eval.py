"""Generation metrics during training and in `audiollm eval`: the loop's
`generation_eval` hook (orchestrator.train.loop.Components).

Each data-parallel rank greedy-decodes its own share of every validation dataset
(the validation loaders shard by DP rank) with its unwrapped model chunk and scores it
by the dataset's metric (orchestrator.eval.metrics: wer, exact, bleu); the metrics'
statistics are summed over the data-parallel group, so every rank returns the same
figures. Keys: `<metric>/<dataset>`, and for each metric in use `<metric>/all` (pooled
over its datasets) and `<metric>/utterances` (utterances it scored). Greedy decoding
runs on one model-parallel rank (tp = pp = 1); in other layouts the hook returns
nothing and says so once.
"""

from __future__ import annotations

import logging
from typing import Dict

import torch
import torch.distributed as dist

from orchestrator.eval import metrics

log = logging.getLogger(__name__)

# Second halves of the hook's keys that are not datasets.
RESERVED = ("all", "utterances")


class GenerationEvaluation:
    def __init__(self, loaders: dict, tokenizer_path: str, train_cfg, parallel_cfg):
        """`loaders`: this DP rank's validation sets by name (the same ones the validation
        loss reads), each scored by its `metric` attribute ("wer" without one)."""
        from orchestrator.data.tokenizer_build import load_tokenizer

        clash = sorted(set(loaders) & set(RESERVED))
        if clash:
            raise ValueError(f"validation datasets named {clash}: these names are taken by pooled metrics")
        self.loaders = loaders
        self.metric = {name: metrics.check_metric(getattr(loader, "metric", "wer")) for name, loader in loaders.items()}
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.max_batches = int(train_cfg.eval_generation_batches) or None
        self.max_new_tokens = int(train_cfg.eval_generation_max_new_tokens)
        self.single_model_rank = parallel_cfg.tp * parallel_cfg.pp * parallel_cfg.cp == 1
        self._warned = False

    def __call__(self, trainer, step: int) -> Dict[str, float]:
        from megatron.core import parallel_state as ps

        from orchestrator.eval.asr import evaluate_generation

        if not self.single_model_rank or len(trainer.unwrapped) != 1:
            if not self._warned and trainer.rank == 0:
                log.warning("train.eval_generation: no generation metrics inside training with model parallelism; "
                            "run `audiollm eval %s`", trainer.plan.run_dir)
            self._warned = True
            return {}
        model = trainer.unwrapped[0]
        was_training = model.training
        model.eval()
        try:
            report = evaluate_generation(model, self.loaders, self.tokenizer, max_new_tokens=self.max_new_tokens,
                                         max_batches=self.max_batches)
        finally:
            model.train(was_training)
        # One flat vector of every dataset's statistics in its metric's order: the same
        # layout on every rank (same loaders, same metrics).
        layout = [(n, k) for n in self.loaders for k in metrics.statistic_names(self.metric[n])]
        flat = torch.tensor([float(report[n][k]) for n, k in layout], dtype=torch.float64, device=trainer.device)
        dist.all_reduce(flat, group=ps.get_data_parallel_group())
        summed: Dict[str, Dict[str, float]] = {n: {} for n in self.loaders}
        for (n, k), value in zip(layout, flat.tolist()):
            summed[n][k] = value
        return metric_values(summed, self.metric)


def metric_values(summed: Dict[str, Dict[str, float]], metric: Dict[str, str]) -> Dict[str, float]:
    """The hook's keys from each dataset's statistics summed over ranks (`summed`, by
    dataset name) and each dataset's metric name (`metric`)."""
    out = {f"{metric[n]}/{n}": metrics.score(metric[n], stats) for n, stats in summed.items()}
    for name in metrics.METRICS:
        used = [stats for n, stats in summed.items() if metric[n] == name]
        if used:
            total = metrics.add(name, used)
            out[f"{name}/all"] = metrics.score(name, total)
            out[f"{name}/utterances"] = total["utterances"]
    return out
