"""Two data-parallel ranks (gloo): the training loop's generation hook
(orchestrator.train.generation_eval.GenerationEvaluation) sums each dataset's statistics over the
ranks, and its figures are those of the whole datasets. Decoding is left out: each
rank's report is scored (real metrics) on its share of fixed answers, as the validation
loaders shard samples r, r + dp, ... Prints `RESULT <json>` on rank 0.
Run: torchrun --nproc_per_node=2 tests/eval/dp_sum_script.py"""

import json
import tempfile
from types import SimpleNamespace

import torch

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown

ANSWERS = {  # dataset: (metric, references, hypotheses)
    "speech": ("wer", ["one two three", "four five", "six seven eight nine", "ten"],
               ["one two three", "four", "six seven eight nine ten", "ten"]),
    "numbers": ("exact", ["314", "42", "7", "1000"], ["314", "forty two", "7.", "100"]),
    "captions": ("bleu", ["a dog runs across the green field", "the children are playing in the park",
                          "a man is cooking dinner in the kitchen"],
                 ["a dog runs across the field", "children are playing in a park",
                  "a man is cooking dinner in the kitchen"]),
}


class Share:
    """This rank's share of one dataset's answers, with the dataset's metric."""

    def __init__(self, metric, refs, hyps, rank, size):
        self.metric, self.refs, self.hyps = metric, refs[rank::size], hyps[rank::size]


def _tokenizer_dir() -> str:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    out = tempfile.mkdtemp()
    backend = Tokenizer(WordLevel({"<pad>": 0, "<eos>": 1}, unk_token="<pad>"))
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>").save_pretrained(out)
    return out


def main() -> None:
    init_distributed(ParallelDims(tp=1), seed=0)
    import torch.distributed as dist

    from orchestrator.scoring import asr, metrics
    from orchestrator.train.generation_eval import GenerationEvaluation, metric_values

    rank, size = dist.get_rank(), dist.get_world_size()

    def answered(model, validation, tokenizer, **kw):  # stands in for greedy decoding
        # (what evaluate_generation reports with timing and hypotheses: rank r took r + 1
        # seconds to decode 10 seconds of audio of each dataset)
        return {name: {"metric": share.metric, **metrics.statistics(share.metric, share.refs, share.hyps),
                       "normaliser": None, "normaliser_from": None, "scorer": "s", "audio_seconds": 10.0,
                       "decode_seconds": rank + 1.0, "batch_samples": len(share.refs),
                       "hypotheses": [{"reference": r, "hypothesis": h} for r, h in zip(share.refs, share.hyps)]}
                for name, share in validation.items()}

    asr.evaluate_generation = answered
    loaders = {name: Share(m, refs, hyps, rank, size) for name, (m, refs, hyps) in ANSWERS.items()}
    hook = GenerationEvaluation(loaders, _tokenizer_dir(),
                                SimpleNamespace(eval_generation_batches=0, eval_generation_max_new_tokens=8,
                                                eval_generation_ctc_weight=0.0))
    trainer = SimpleNamespace(unwrapped=[torch.nn.Linear(1, 1)], rank=rank, device=torch.device("cpu"))
    reduced = hook(trainer, step=1)
    hook.timing = hook.keep_hypotheses = True  # as `audiollm eval` asks
    timed = hook(trainer, step=1)
    whole = metric_values({name: metrics.statistics(m, refs, hyps) for name, (m, refs, hyps) in ANSWERS.items()},
                          {name: m for name, (m, _, _) in ANSWERS.items()})
    if rank == 0:
        import sacrebleu

        _, refs, hyps = ANSWERS["captions"]
        print("RESULT " + json.dumps({"reduced": reduced, "whole": whole, "timed": timed,
                                      "scoring": hook.last_scoring, "hypotheses": hook.last_hypotheses,
                                      "sacrebleu": sacrebleu.corpus_bleu(hyps, [refs]).score}), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
