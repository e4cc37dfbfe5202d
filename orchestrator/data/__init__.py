"""Job-side data path: MDS datasets -> decoded 16-kHz audio -> Whisper log-mel ->
prompt tokens with audio placeholders -> packed micro-batches.

Importing this package is light; the modules below import torch where they need it.

Entry points for the training job (each takes its own config sections):

    from orchestrator.data.loader import build_train_loader, build_validation_loaders
    loader = build_train_loader(cfg.data, cfg.model.encoder, cfg.model.adapter, micro_batch_size,
                                dp_rank, dp_size, seed)
    batch = next(loader)          # format: orchestrator.data.packing (module docstring)
    loader.state_dict() / loader.load_state_dict(state) / loader.sample_counts()
    vals = build_validation_loaders(cfg.data, cfg.model.encoder, cfg.model.adapter, micro_batch_size,
                                    dp_rank, dp_size)   # {name: iterable of batches}

    from orchestrator.data.context_parallel import split_batch    # this CP rank's share
    from orchestrator.data.packing import packed_seq_params       # megatron PackedSeqParams (THD)
    from orchestrator.data.frames import audio_placeholder_count  # samples -> audio tokens (no torch)

Modules: frames (frame arithmetic), audio (decode, resample), mel (log-mel),
tokenizer_build (HF tokenizer with chat and audio tokens), prompts
(templates and conversations -> tokens and loss mask), packing (packer, batch format), sources (MDS mixture via mosaic streaming),
loader (train/validation loaders, bad samples), context_parallel (CP split),
demo (espeak-ng corpus), resample (the resampling filter, torch-free), importing
(`audiollm data import` of NeMo / HF / Kaldi / WebDataset corpora, `audiollm data show`),
cli (`audiollm data ...`). Each dataset's format (task
presets, own templates, conversations, metric) is planning knowledge: orchestrator/plan/tasks.py.
"""
