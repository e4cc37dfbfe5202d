"""The project's AudioLLM of a released speech LLM's kind against the released class:
torchrun --nproc_per_node=2 tests/models/released_parity_script.py KIND HF_DIR CKPT_DIR

HF_DIR: a tiny random VoxtralForConditionalGeneration or Qwen2AudioForConditionalGeneration
(tests/models/tiny_models.py); CKPT_DIR: its conversion (`convert hf-to-megatron`). The
model is built by the job's builder from the model section the released config describes
and loads the converted checkpoint as a run's model.init_checkpoint does, at TP 1 (data
parallel 2), TP 2 with sequence parallelism and PP 2. On a batch of two clips of
different lengths, padded to the encoder window, each in a row of text with its
placeholders, its logits and loss are compared with the released class's forward on the
same ids, features (and Qwen2-Audio's feature mask); and at TP 1 and TP 2 the greedy
answers to the rows' prompts equal the released class's `generate`, with the KV cache and
(TP 1) without. Prints `RESULT {json}` per case."""

from __future__ import annotations

import json
import sys

import torch

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown

AUDIO_TOKEN = 249  # the tiny models' audio placeholder id (their vocabulary is 250)
SEQ = 48
MEL_LENGTHS = (120, 77)  # the first clip fills the window (2 x 60 positions), the second is padded
CASES = [("tp1", 1, 1, False), ("tp2_sp", 2, 1, True), ("pp2", 1, 2, False)]
PROMPT, NEW_TOKENS = 40, 8  # each prompt holds its clip's placeholders (at most 2 + 30)


def model_section(hf_config: dict, kind: str):
    """The `model` section a run of this released model plans with (its decoder family's
    decoder, its encoder, its adapter kind)."""
    from omegaconf import OmegaConf

    from orchestrator.convert.decoder_mapping import decoder_config_from_hf, hf_decoder_config
    from orchestrator.plan.released_models import RELEASED, adapter_section, encoder_section
    from orchestrator.plan.schema import AdapterConfig, EncoderConfig, ModelConfig

    released = RELEASED[kind]
    encoder = EncoderConfig(**encoder_section(released, hf_config["audio_config"]), freeze=True,
                            mask_padding=kind == "qwen2_audio")
    section = ModelConfig(name=kind, decoder=decoder_config_from_hf(hf_decoder_config(hf_config["text_config"])),
                          encoder=encoder, adapter=AdapterConfig(**adapter_section(released, hf_config["audio_config"])))
    return OmegaConf.structured(section)


def model_overrides(hf_config: dict, kind: str) -> list:
    """model_section as `model.*` command-line overrides (a run of the released model)."""
    from omegaconf import OmegaConf

    section = OmegaConf.to_container(model_section(hf_config, kind))
    return [f"model.{part}.{key}={'null' if value is None else json.dumps(value)}"
            for part in ("decoder", "encoder", "adapter") for key, value in section[part].items()]


def main(kind: str, hf_dir: str, ckpt: str) -> None:
    import transformers
    from megatron.core import parallel_state as ps

    from orchestrator.convert.megatron_forward import pipeline_forward
    from orchestrator.models.generate import greedy_generate
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.plan.adapter_kinds import frames_per_token
    from orchestrator.plan.model_params import audio_token_count, read_frames
    from orchestrator.plan.released_models import RELEASED
    from orchestrator.train.init_weights import load_init_checkpoint

    hf_config = json.loads(open(f"{hf_dir}/config.json").read())
    cfg = model_section(hf_config, kind)
    window = 2 * cfg.encoder.max_source_positions
    mode = "window" if kind == "voxtral" else "clip"  # as each one's processor counts a clip
    read = [read_frames(n, window, mode) for n in MEL_LENGTHS]
    counts = [audio_token_count(n, frames_per_token(cfg.adapter)) for n in read]
    gen = torch.Generator().manual_seed(7)
    features = torch.randn(2, cfg.encoder.num_mel_bins, window, generator=gen)
    tokens = torch.randint(0, AUDIO_TOKEN, (2, SEQ), generator=gen)
    tokens[0, 2: 2 + counts[0]] = AUDIO_TOKEN
    tokens[1, 5: 5 + counts[1]] = AUDIO_TOKEN
    labels = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)

    hf = getattr(transformers, RELEASED[kind].hf_class).from_pretrained(hf_dir, torch_dtype=torch.float32,
                                                                       attn_implementation="eager").eval()
    extra = {}
    if kind == "qwen2_audio":  # its processor's mask of each clip's own frames
        extra["feature_attention_mask"] = (torch.arange(window)[None] < torch.tensor(MEL_LENGTHS)[:, None]).long()
    with torch.no_grad():
        ref = hf(input_ids=tokens, input_features=features, labels=tokens, **extra)

    for name, tp, pp, sp in CASES:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        dims = ParallelDims(tp=tp, pp=pp, sp=sp)
        init_distributed(dims, seed=0, allow_tf32=False)
        model = build_audiollm(cfg, decoder_transformer_config(cfg.decoder, dims), pre_process=ps.is_pipeline_first_stage(),
                               post_process=ps.is_pipeline_last_stage(), audio_token_id=AUDIO_TOKEN,
                               attention="reference").eval()
        loaded = load_init_checkpoint(ckpt, [model])
        positions = torch.arange(SEQ)[None].expand(2, -1)
        audio = dict(audio_features=features, audio_lengths=read)
        logits = pipeline_forward(model, lambda m: m(tokens, positions, None, **audio), SEQ, 2)
        token_loss = pipeline_forward(model, lambda m: m(tokens, positions, None, labels=labels, **audio), SEQ, 2,
                                      gather_vocab=False)
        if logits is not None and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
            vocab = hf_config["text_config"]["vocab_size"]
            loss = token_loss[:, :-1].mean()
            print("RESULT " + json.dumps({
                "case": name, "fresh": loaded["fresh"], "audio_tokens": counts,
                "max_abs_logit_diff": (logits[..., :vocab] - ref.logits).abs().max().item(),
                "logit_scale": ref.logits.abs().max().item(), "loss_diff": abs(loss.item() - ref.loss.item()),
            }), flush=True)
        if pp == 1:  # greedy decoding of the prompts (their audio and text), with and without the KV cache
            prompts = tokens[:, :PROMPT].tolist()
            for use_cache in ((True, False) if tp == 1 else (True,)):
                ours = greedy_generate(model, prompts, features, read, stop_ids=[-5], max_new_tokens=NEW_TOKENS,
                                       use_cache=use_cache)
                with torch.no_grad():
                    theirs = hf.generate(input_ids=tokens[:, :PROMPT], input_features=features, do_sample=False,
                                         max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, use_cache=use_cache,
                                         pad_token_id=0, **extra)[:, PROMPT:].tolist()
                if ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
                    print("RESULT " + json.dumps({"case": f"{name}_generate{'' if use_cache else '_no_cache'}",
                                                  "ours": ours, "theirs": theirs}), flush=True)
    shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
