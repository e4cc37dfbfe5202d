"""Job-side model code (imports torch and megatron-core).

Build on every rank after `orchestrator.runtime.distributed.init_distributed`:

    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.train.megatron_config import transformer_config
    config = transformer_config(plan, on_gpu=True)   # the Plan's transformer_fields at plan.dims
    model = build_audiollm(model_cfg, config, pre_process=first_stage, post_process=last_stage,
                           audio_token_id=tokenizer_audio_id)
    config.finalize_model_grads_func = finalize_model_grads   # required with sequence parallel

A job builds that config once from its Plan and the same object serves DDP, the pipeline
schedule and every layer. Where no run planned the model (`convert --verify`, the tests'
reference models), `decoder_config.decoder_transformer_config(decoder, dims, dtype)` builds
it through the same translation (orchestrator/plan/megatron_fields.py) and builder.

Forward (one micro-batch; the first stage fuses audio, later stages take the
pipeline's input tensor):

    model(input_ids, position_ids, attention_mask=None, labels=None,
          audio_features=[clips, mel, frames], audio_lengths=[true mel frames per clip],
          audio_clip_rows=None | [batch row of each clip], packed_seq_params=None)
    -> per-token loss [b, s] with labels, else logits [b, s, padded vocab / tp]

Packed rows: tokens [1, T] with `PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu,
cu_seqlens_kv=cu, max_seqlen_q=m, max_seqlen_kv=m)` (int32 cu_seqlens); RoPE positions
restart at every document and attention stays inside documents. Each clip needs
`orchestrator.plan.model_params.audio_token_count(mel_frames, frame_stack)` placeholders.

Modules: decoder_config (the decoder's TransformerConfig, built one way), norms
(zero-centred RMSNorm), attention (Gemma2 core attention, local and flex), decoder_layer /
decoder_spec / decoder_model (the decoder), speech (Whisper encoder, adapter), fusion,
audiollm.
"""

from orchestrator.runtime.megatron_import import import_megatron

import_megatron()  # first, before any module here imports megatron (see there why)

