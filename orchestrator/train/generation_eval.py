"""Generation metrics during training and in `audiollm eval`: the loop's
`generation_eval` hook (orchestrator.train.loop.Components).

Each model replica greedy-decodes its own share of every validation dataset (the
validation loaders shard by data-parallel rank) at the training layout, with the KV
cache (orchestrator.models.generate: tensor-parallel ranks hold their heads, pipeline
stages pass each step's hidden states on), and scores it by the dataset's metric
(orchestrator.scoring.metrics: wer, exact, bleu). Context-parallel ranks hold the whole
weights of their stage, so each decodes whole samples: rank r of CP size c answers
samples r, r + c, ... of every batch. The metrics' statistics are summed over the data-
and context-parallel ranks, so every rank returns the same figures. Keys:
`<metric>/<dataset>`, and for each metric in use `<metric>/all` (pooled over its
datasets) and `<metric>/utterances` (utterances it scored).

`audiollm eval` asks for more (the attributes below, off during training, whose
evaluations they would slow): `timing`, the decoding speed as RTFx (audio seconds over
decode seconds, after a warm-up batch: orchestrator.scoring.asr), keys `rtfx/<dataset>`
and `rtfx/all` (with `rtfx_batch/<dataset>`, the most samples decoded together), the audio summed over the ranks and the decode time their slowest's
(they decode at the same time); `keep_hypotheses`, every (reference, hypothesis) pair
with both normalised, gathered from the data- and context-parallel ranks (rank order);
`last_scoring`, each dataset's metric, normaliser and scorer.

With data.replica_reader only the replica's reader has loaders: it reads each batch and
sends it to its peers (orchestrator.train.replica_reader), who decode with it. Virtual
pipeline chunks (parallel.vpp) are not decoded: the hook returns nothing and says so.
"""

from __future__ import annotations

import logging
from typing import Dict

import torch
import torch.distributed as dist

from orchestrator.scoring import metrics

log = logging.getLogger(__name__)

# Second halves of the hook's keys that are not datasets.
RESERVED = ("all", "utterances")


class GenerationEvaluation:
    def __init__(self, loaders: dict, tokenizer_path: str, train_cfg, replica=None):
        """`loaders`: this DP rank's validation sets by name (the same ones the validation
        loss reads), each scored by its `metric` attribute ("wer" without one); empty on a
        replica's peers when `replica` (group, reader's global rank, whether this rank
        reads: orchestrator.train.replica_reader.replica_group) is given. Collective in
        the replica then: the reader tells its peers the datasets and metrics."""
        from orchestrator.data.tokenizer_build import load_tokenizer

        clash = sorted(set(loaders) & set(RESERVED))
        if clash:
            raise ValueError(f"validation datasets named {clash}: these names are taken by pooled metrics")
        self.metric = {name: metrics.check_metric(getattr(loader, "metric", "wer")) for name, loader in loaders.items()}
        self.normaliser = {name: getattr(loader, "normaliser", None) for name, loader in loaders.items()}
        self.loaders = loaders
        if replica is not None:
            box = [(self.metric, self.normaliser)]
            dist.broadcast_object_list(box, src=replica[1], group=replica[0])
            self.metric, self.normaliser = box[0]
            self.loaders = {name: _SharedBatches(loaders.get(name), self.metric[name], replica, self.normaliser[name])
                            for name in self.metric}
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.max_batches = int(train_cfg.eval_generation_batches) or None
        self.max_new_tokens = int(train_cfg.eval_generation_max_new_tokens)
        self.ctc_weight = float(train_cfg.eval_generation_ctc_weight)
        # `audiollm eval --examples N`: keep this rank's first N (reference, answer) pairs
        # of each dataset from the last call, in `last_examples`.
        self.examples = 0
        self.last_examples: Dict[str, list] = {}
        self.timing = False
        self.keep_hypotheses = False
        self.last_hypotheses: Dict[str, list] = {}
        self.last_scoring: Dict[str, dict] = {}
        self._warned = False

    def __call__(self, trainer, step: int) -> Dict[str, float]:
        from megatron.core import parallel_state as ps

        from orchestrator.scoring.asr import evaluate_generation

        if len(trainer.unwrapped) != 1:
            if not self._warned and trainer.rank == 0:
                log.warning("train.eval_generation: no generation metrics with virtual pipeline chunks "
                            "(parallel.vpp); run `audiollm eval %s`", trainer.plan.run_dir)
            self._warned = True
            return {}
        model = trainer.unwrapped[0]
        # Joint CTC/attention decoding needs the CTC head (validation warns where the model
        # has none) and runs at pipeline size 1 (`audiollm eval --pp` refuses it).
        adapter = getattr(model, "adapter", None)
        ctc_weight = self.ctc_weight if getattr(adapter, "ctc_head", None) is not None else 0.0
        was_training = model.training
        model.eval()
        try:
            report = evaluate_generation(model, self.loaders, self.tokenizer, max_new_tokens=self.max_new_tokens,
                                         max_batches=self.max_batches, ctc_weight=ctc_weight, examples=self.examples,
                                         share=(ps.get_context_parallel_rank(), ps.get_context_parallel_world_size()),
                                         hypotheses=self.keep_hypotheses, timing=self.timing)
        finally:
            model.train(was_training)
        self.last_examples = {n: report[n]["examples"] for n in self.loaders if "examples" in report[n]}
        group = ps.get_data_parallel_group(with_context_parallel=True)
        self.last_scoring = {n: {k: report[n][k] for k in ("metric", "normaliser", "normaliser_from", "scorer")} for n in self.loaders}
        if self.keep_hypotheses:
            gathered = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, {n: report[n]["hypotheses"] for n in self.loaders}, group=group)
            self.last_hypotheses = {n: [pair for part in gathered for pair in part[n]] for n in self.loaders}
        # One flat vector of every dataset's statistics in its metric's order: the same
        # layout on every rank (same datasets, same metrics).
        layout = [(n, k) for n in self.loaders for k in metrics.statistic_names(self.metric[n])]
        flat = torch.tensor([float(report[n][k]) for n, k in layout], dtype=torch.float64, device=trainer.device)
        dist.all_reduce(flat, group=group)
        summed: Dict[str, Dict[str, float]] = {n: {} for n in self.loaders}
        for (n, k), value in zip(layout, flat.tolist()):
            summed[n][k] = value
        out = metric_values(summed, self.metric)
        if self.timing:
            out.update(self._rtfx(report, trainer.device, group))
        return out

    def _rtfx(self, report: dict, device, group) -> Dict[str, float]:
        """`rtfx/<dataset>` and `rtfx/all`, and each dataset's timing in last_scoring."""
        names = list(self.loaders)
        audio = torch.tensor([float(report[n]["audio_seconds"]) for n in names], dtype=torch.float64, device=device)
        decode = torch.tensor([float(report[n]["decode_seconds"]) for n in names] +
                              [sum(float(report[n]["decode_seconds"]) for n in names)], dtype=torch.float64,
                              device=device)
        widest = torch.tensor([int(report[n]["batch_samples"]) for n in names], dtype=torch.int64, device=device)
        dist.all_reduce(audio, group=group)
        dist.all_reduce(decode, op=dist.ReduceOp.MAX, group=group)
        dist.all_reduce(widest, op=dist.ReduceOp.MAX, group=group)
        from orchestrator.runtime.machine import device_name

        out = {}
        where = device_name(device)
        for k, n in enumerate(names):
            rtfx = float(audio[k]) / max(float(decode[k]), 1e-9)
            out[f"rtfx/{n}"] = rtfx
            out[f"rtfx_batch/{n}"] = int(widest[k])  # beside it in the table and W&B: what the speed was at
            self.last_scoring[n].update(rtfx=rtfx, audio_seconds=float(audio[k]), decode_seconds=float(decode[k]),
                                        batch_samples=int(widest[k]), device=where)
        out["rtfx/all"] = float(audio.sum()) / max(float(decode[-1]), 1e-9)
        return out


class _SharedBatches:
    """One validation dataset's batches as every rank of a replica iterates them: the
    reader's, sent to its peers one by one (None ends them). Every rank of the replica
    must iterate as far as the others."""

    def __init__(self, loader, metric: str, replica, normaliser=None):
        self.loader, self.metric, self.replica, self.normaliser = loader, metric, replica, normaliser

    def __iter__(self):
        group, reader, reads = self.replica
        batches = iter(self.loader) if reads else None
        while True:
            box = [next(batches, None) if reads else None]
            dist.broadcast_object_list(box, src=reader, group=group)
            if box[0] is None:
                return
            yield box[0]


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
