"""Job-side evaluation: transcribe validation sets with greedy decoding, word error rates.

    from orchestrator.eval.asr import evaluate_wer
    report = evaluate_wer(model, build_validation_loaders(...), tokenizer, max_new_tokens=48)
    report["digits_heldout_accent"]["wer"]          # per validation dataset
    report["all"]["wer"]                            # pooled over every dataset

Data parallel: give each rank its own share of the validation sets
(build_validation_loaders(..., dp_rank, dp_size)); the counts of a report (errors,
words, substitutions, deletions, insertions, utterances) add up across ranks, so
all-reduce them (sum) and divide errors by words for the run's WER. Decoding needs
the whole model on one process (tp = pp = 1); call it on the unwrapped model
(DDP's `.module`), which greedy_generate puts in eval mode (SpecAugment and dropout
off) and restores afterwards.

Modules: text (transcript normalisation, documented there), wer (jiwer word error
rate over normalised text), asr (prompts out of a validation batch, greedy
transcription, the per-dataset report). Importing this package is light; `asr`
imports torch.
"""
