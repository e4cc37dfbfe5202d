"""Job-side evaluation: transcribe validation sets with greedy decoding, word error rates.

    from orchestrator.eval.asr import evaluate_wer
    report = evaluate_wer(model, build_validation_loaders(...), tokenizer, max_new_tokens=48)
    report["digits_heldout_accent"]["wer"]          # per validation dataset
    report["all"]["wer"]                            # pooled over every dataset

Modules: text (transcript normalisation, documented there), wer (jiwer word error
rate over normalised text), asr (prompts out of a validation batch, greedy
transcription, the per-dataset report). Importing this package is light; `asr`
imports torch.
"""
