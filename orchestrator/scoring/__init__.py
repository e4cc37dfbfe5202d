"""Scoring: answer validation sets with greedy decoding, score each dataset by its metric
(word error rate, exact match, BLEU). Below both the training loop (its generation
evaluation, orchestrator/train/generation_eval.py) and `audiollm eval` / `transcribe` /
`convert` (orchestrator/eval, orchestrator/convert), which all import it.

    from orchestrator.scoring.asr import evaluate_generation
    report = evaluate_generation(model, build_validation_loaders(...), tokenizer, max_new_tokens=48)
    report["digits_heldout_accent"]["wer"]          # per validation dataset, by its loader's `metric`
    report["numerals_heldout_accent"]["exact"]
    report["all"]["wer"]                            # pooled over the WER datasets
    report["all/exact"]["exact"], report["all/bleu"]["bleu"]

Data parallel: give each rank its own share of the validation sets
(build_validation_loaders(..., dp_rank, dp_size)); the statistics of a report's entry
(metrics.statistic_names(entry["metric"]): errors and words, correct and utterances,
BLEU's n-gram counts and lengths) add up across ranks, so all-reduce them (sum) and
score the sums (metrics.score) for the run's figures. Decoding needs the whole model
on one process (tp = pp = 1); call it on the unwrapped model (DDP's `.module`), which
greedy_generate puts in eval mode (SpecAugment and dropout off) and restores afterwards.

Modules: text (the project's transcript normalisation, documented there), normalisers
(the normaliser a dataset names: the project's, or Whisper's English or basic one from
transformers; the scorer's name each figure carries), wer (jiwer word error rate over
normalised text), metrics (wer, exact, bleu as summable statistics and their
scores), asr (prompts out of a validation batch, greedy answers, the per-dataset
report). Importing this package is light; `asr` imports torch, the BLEU metric imports
sacrebleu when it runs.
"""
