"""Invalid configurations are refused before submission, each with a message that
names the offending values; valid ones pass."""

import subprocess
import sys

import pytest

from orchestrator.plan import paths
from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import resolve, to_object
from orchestrator.plan.rules.findings import ERROR, ConfigInvalid
from orchestrator.plan.validate import validate

TP4PP2 = "+recipe=gemma2_whisper_tp4pp2"
TINY2 = ["launcher.gpus_per_node=2"]  # tiny model on 2 CPU processes

# (overrides, rule, substrings the message must contain)
INVALID = [
    pytest.param([TP4PP2, "launcher.nodes=3", "launcher.gpus_per_node=4"], "world_size",
                 ["tensor_model_parallel_size (4)", "pipeline_model_parallel_size (2)", "= 8", "world size 12",
                  "nodes 3", "gpus_per_node 4"], id="tp_pp_not_dividing_world"),
    pytest.param(["parallel.tp=4", "launcher.gpus_per_node=2"], "world_size", ["(4)", "world size 2"], id="tp_above_world"),
    pytest.param([TP4PP2, "parallel.cp=3", "model.backend=te"], "world_size", ["context_parallel_size (3)", "= 24"], id="cp_not_dividing"),
    pytest.param([*TINY2, "parallel.tp=0"], "sizes", ["parallel.tp=0"], id="tp_zero"),
    pytest.param([*TINY2, "parallel.pp=-1"], "sizes", ["parallel.pp=-1"], id="pp_negative"),
    pytest.param(["launcher.nodes=0"], "sizes", ["launcher.nodes=0"], id="no_nodes"),
    pytest.param([TP4PP2, "parallel.vpp=0"], "sizes", ["parallel.vpp=0"], id="vpp_zero"),
    pytest.param([TP4PP2, "parallel.tp=32", "parallel.pp=1"], "heads_tp",
                 ["num_attention_heads (16)", "parallel.tp (32)"], id="heads_not_divisible_by_tp"),
    pytest.param(["parallel.tp=2", *TINY2, "model.decoder.num_query_groups=1"], "kv_heads_tp",
                 ["num_query_groups (1 KV heads)", "parallel.tp (2)"], id="kv_heads_not_divisible_by_tp"),
    pytest.param(["model.decoder.num_query_groups=3"], "gqa", ["num_attention_heads (4)", "num_query_groups (3)"], id="gqa_mismatch"),
    pytest.param([TP4PP2, "parallel.pp=4", "parallel.tp=2"], "layers_pp", ["num_layers (42)", "parallel.pp (4)"], id="layers_not_divisible_by_pp"),
    pytest.param([TP4PP2, "parallel.vpp=2"], "layers_vpp", ["num_layers (42)", "parallel.pp (2)", "parallel.vpp (2)", "= 4"], id="layers_not_divisible_by_vpp"),
    pytest.param(["parallel.vpp=2"], "vpp_needs_pp", ["parallel.vpp (2)", "pp is 1"], id="vpp_without_pp"),
    pytest.param([TP4PP2, "parallel.cp=2", "parallel.tp=2", "data.seq_length=2050"], "seq_cp",
                 ["data.seq_length (2050)", "parallel.cp (2)", "= 4"], id="seq_not_divisible_by_2cp"),
    pytest.param([TP4PP2, "data.seq_length=2050"], "seq_sp", ["data.seq_length (2050)", "parallel.tp (4)"], id="seq_not_divisible_by_tp_with_sp"),
    pytest.param(["parallel.sp=true"], "sp_needs_tp", ["parallel.sp=true", "tp is 1"], id="sp_without_tp"),
    pytest.param(["data.seq_length=2048"], "seq_positions", ["data.seq_length (2048)", "max_position_embeddings (1024)"], id="seq_beyond_positions"),
    pytest.param(["data.seq_length=0"], "seq_length", ["data.seq_length=0"], id="seq_zero"),
    pytest.param([TP4PP2, "parallel.cp=2", "parallel.tp=2", "data.seq_length=2052"], "seq_cp_sp",
                 ["data.seq_length (2052)", "parallel.cp (2)", "parallel.tp (2)", "= 8", "parallel.sp=true"],
                 id="seq_not_divisible_by_2cp_tp_with_sp"),
    pytest.param([TP4PP2, "optim.global_batch_size=30"], "global_batch",
                 ["global_batch_size (30)", "micro_batch_size (1)", "data-parallel size (4)", "= 4"], id="gbs_not_divisible"),
    pytest.param([TP4PP2, "optim.micro_batch_size=3"], "global_batch", ["micro_batch_size (3)", "= 12"], id="mbs_times_dp_not_dividing"),
    pytest.param(["optim.micro_batch_size=0"], "batch", ["optim.micro_batch_size=0"], id="mbs_zero"),
    pytest.param([TP4PP2, "parallel.vpp=3", "optim.global_batch_size=12"], "vpp_microbatches",
                 ["parallel.vpp=3", "micro-batches (3)", "parallel.pp (2)"], id="vpp_microbatches_not_multiple_of_pp"),
    pytest.param([TP4PP2, "parallel.recompute.method=sideways"], "recompute", ["parallel.recompute.method='sideways'"], id="recompute_bad_method"),
    pytest.param([TP4PP2, "parallel.recompute.granularity=partial"], "recompute", ["granularity='partial'"], id="recompute_bad_granularity"),
    pytest.param([TP4PP2, "parallel.recompute.num_layers=null"], "recompute", ["num_layers >= 1"], id="recompute_full_without_layers"),
    pytest.param([TP4PP2, "parallel.recompute.num_layers=22"], "recompute", ["num_layers (22)", "21 decoder layers per"], id="recompute_more_layers_than_stage"),
    pytest.param([TP4PP2, "parallel.recompute.granularity=selective"], "recompute", ["selective takes no method"], id="selective_with_method"),
    pytest.param(["parallel.recompute.method=uniform"], "recompute", ["granularity is null"], id="method_without_granularity"),
    pytest.param(["parallel.rank_order=dp-tp-pp"], "rank_order", ["parallel.rank_order='dp-tp-pp'"], id="bad_rank_order"),
    pytest.param(["model.decoder.kv_channels=0"], "decoder", ["model.decoder.kv_channels=0"], id="kv_channels_zero"),
    pytest.param(["model.decoder.attn_logit_softcap=-50"], "decoder", ["attn_logit_softcap=-50"], id="negative_softcap"),
    pytest.param(["model.encoder.num_heads=3"], "encoder", ["d_model (128)", "num_heads (3)"], id="encoder_heads"),
    pytest.param(["model.encoder.num_mel_bins=64"], "encoder", ["num_mel_bins=64"], id="mel_bins"),
    pytest.param(["model.adapter.frame_stack=3"], "adapter", ["max_source_positions (250)", "frame_stack (3)"], id="frame_stack_not_dividing_window"),
    pytest.param(["model.adapter.dropout=1.5"], "adapter", ["dropout=1.5"], id="adapter_dropout"),
    pytest.param(["model.adapter.kind=perceiver"], "adapter", ["model.adapter.kind='perceiver'", "layer_mix", "voxtral",
                                                                "qwen2_audio"], id="unknown_adapter_kind"),
    pytest.param(["model.adapter.kind=qwen2_audio", "model.adapter.dropout=null"], "adapter",
                 ["model.adapter.frame_stack=5", "not read by model.adapter.kind=qwen2_audio", "layer_mix, voxtral",
                  "model.adapter.frame_stack=null"], id="a_key_of_another_adapter_kind"),
    pytest.param(["model.adapter.kind=voxtral", "model.adapter.frame_stack=2", "model.adapter.dropout=null",
                  "data.audio_tokens=window"], "adapter",
                 ["frame_stack (2)", "model.encoder.d_model (128)", "= 256", "model.encoder.ffn_dim=512"],
                 id="voxtral_stack_is_not_its_intermediate_size"),
    pytest.param(["model.adapter.kind=voxtral", "model.adapter.frame_stack=null", "model.adapter.dropout=null",
                  "model.encoder.max_source_positions=248"], "audio_tokens",
                 ["model.adapter.kind=voxtral", "whole encoder windows", "VoxtralForConditionalGeneration",
                  "data.audio_tokens=clip", "set data.audio_tokens=window"], id="voxtral_counts_whole_windows"),
    pytest.param(["model.adapter.kind=qwen2_audio", "model.adapter.frame_stack=null", "model.adapter.dropout=null",
                  "model.encoder.mask_padding=false"], "adapter",
                 ["model.adapter.kind=qwen2_audio", "Qwen2AudioForConditionalGeneration", "masks a clip's padded frames",
                  "model.encoder.mask_padding=false", "set model.encoder.mask_padding=true"],
                 id="qwen2_audio_masks_padding"),
    pytest.param(["model.backend=te"], "backend", ["model.backend=te", "launcher.accelerator=cpu"], id="te_on_cpu"),
    pytest.param(["model.backend=flash"], "backend", ["model.backend='flash'"], id="unknown_backend"),
    pytest.param(["model.attention=flex"], "attention", ["model.attention=flex", "launcher.accelerator=cpu",
                                                         "model.attention=reference"], id="flex_on_cpu"),
    pytest.param(["model.attention=sdpa"], "attention", ["model.attention='sdpa'"], id="unknown_attention"),
    pytest.param(["model.fp8=hybrid"], "fp8", ["model.fp8=hybrid", "model.backend=local", "launcher.accelerator=cpu"],
                 id="fp8_on_local_cpu"),
    pytest.param(["model.fp8=e5m2"], "fp8", ["model.fp8='e5m2'"], id="unknown_fp8"),
    pytest.param(["model.encoder.precision=bf16"], "encoder_precision",
                 ["model.encoder.precision=bf16", "launcher.accelerator=cpu"], id="bf16_encoder_on_cpu"),
    pytest.param(["model.encoder.precision=fp32", "launcher.accelerator=gpu"], "encoder_precision",
                 ["model.encoder.precision=fp32", "model.encoder.freeze=false", "launcher.accelerator=gpu",
                  "model.encoder.precision=auto"], id="trained_fp32_encoder_on_gpu"),
    pytest.param(["data.max_audio_seconds=30"], "audio_window", ["max_audio_seconds (30.0)", "encoder window of 5 s", "max_source_positions 250"], id="clip_longer_than_encoder_window"),
    pytest.param(["data.seq_length=40"], "audio_tokens", ["50 audio tokens", "data.seq_length (40)"], id="audio_tokens_fill_sequence"),
    pytest.param(["data.prompt_template=Transcribe"], "prompt", ["<SpeechHere>"], id="prompt_without_audio_marker"),
    pytest.param(["data.on_bad_sample=ignore"], "data", ["data.on_bad_sample='ignore'"], id="bad_sample_policy"),
    pytest.param(["data.long_audio=truncate"], "data", ["data.long_audio='truncate'"], id="long_audio_policy"),
    pytest.param(["data.audio_tokens=fixed"], "data", ["data.audio_tokens='fixed'"], id="audio_token_mode"),
    pytest.param(["data.wrong_sample_rate=ignore"], "data", ["data.wrong_sample_rate='ignore'"], id="wrong_rate_policy"),
    pytest.param(["data.num_workers=-1"], "data_workers", ["data.num_workers=-1"], id="data_workers"),
    pytest.param(["data.cache_limit=lots"], "data", ["data.cache_limit='lots'", "200gb"], id="cache_limit"),
    pytest.param(["data.download_retry=-1"], "data", ["data.download_retry=-1"], id="download_retry"),
    pytest.param(["data.feature_cache_mb=-1"], "data", ["feature_cache_mb=-1"], id="negative_feature_cache"),
    pytest.param(["data.packing=true", "data.packing_buffer=8"], "packing_buffer", ["data.packing_buffer (8)", "optim.micro_batch_size (16)"], id="packing_buffer_below_micro_batch"),
    pytest.param(["data.audio_tokens=window", "data.seq_length=50"], "audio_tokens", ["5-s clip", "50 audio tokens", "data.seq_length (50)"], id="window_tokens_fill_sequence"),
    pytest.param(["data.train=[{name: a, path: x, weight: 1}, {name: a, path: y, weight: 1}]"], "dataset_names", ["repeated: a"], id="duplicate_dataset_names"),
    pytest.param(["data.train=[{name: a, path: x, weight: 0}]"], "dataset_weight", ["data.train[a].weight=0"], id="zero_weight"),
    pytest.param(["optim.lr=0"], "lr", ["optim.lr=0"], id="lr_zero"),
    pytest.param(["optim.lr=1e-3", "optim.min_lr=0.5"], "min_lr", ["optim.min_lr (0.5)", "optim.lr (0.001)"], id="min_lr_above_lr"),
    pytest.param(["train.iters=600", "optim.lr_warmup_iters=600"], "warmup", ["lr_warmup_iters (600)", "train.iters (600)"], id="warmup_too_long"),
    pytest.param(["optim.optimizer=lion"], "optim", ["optim.optimizer='lion'"], id="unknown_optimizer"),
    pytest.param(["optim.lr_decay_style=exp"], "optim", ["optim.lr_decay_style='exp'"], id="unknown_decay"),
    pytest.param(["train.iters=0"], "train", ["train.iters=0"], id="no_iters"),
    pytest.param(["run.resume=maybe"], "run", ["run.resume='maybe'"], id="bad_resume"),
    pytest.param(["train.eval_generation=true", "data.validation=[]"], "eval_generation", ["train.eval_generation=true", "data.validation"],
                 id="wer_without_validation_data"),
    pytest.param(["train.eval_generation=true", "train.eval_generation_max_new_tokens=0"], "train",
                 ["train.eval_generation_max_new_tokens=0"], id="wer_with_no_tokens_to_decode"),
    pytest.param(["train.iters=20", "train.profile_steps=[5,30]"], "profile",
                 ["train.profile_steps=[5, 30]", "train.iters (20)", "[10, 10]"], id="profile_past_the_run"),
    pytest.param(["train.profile_steps=[5]"], "profile", ["train.profile_steps=[5]", "[first, last]"],
                 id="profile_one_number"),
    pytest.param(["train.profile_steps=[5,5]", "train.profile_ranks=[0,1]"], "profile",
                 ["train.profile_ranks=[0, 1]", "0 to 0", "launcher.gpus_per_node 1"], id="profile_rank_the_job_lacks"),
    pytest.param(["model.decoder.family=qwen9"], "decoder", ["model.decoder.family='qwen9'", "'gemma2', 'gemma3', 'llama', 'qwen2', 'qwen3'"],
                 id="unknown_decoder_family"),
    pytest.param(["model.decoder.family=llama", "model.decoder.query_pre_attn_scalar=null",
                  "model.decoder.attn_logit_softcap=null", "model.decoder.final_logit_softcap=null"], "decoder",
                 ["model.decoder.sliding_window=", "does not apply to the llama decoder family",
                  "model.decoder.sliding_window=null"], id="gemma2_window_on_a_llama"),
    pytest.param(["model.decoder.rope_scaling_factor=8"], "decoder",
                 ["model.decoder.rope_scaling_factor=8.0", "gemma2"], id="llama_rope_scaling_on_a_gemma2"),
    pytest.param(["model.decoder.family=gemma3", "model.decoder.attn_logit_softcap=null",
                  "model.decoder.final_logit_softcap=null"], "decoder",
                 ["model.decoder.rope_local_theta is null", "gemma3", "10000"], id="gemma3_without_its_local_rope_base"),
    pytest.param(["model.decoder.family=gemma3", "model.decoder.rope_local_theta=10000"], "decoder",
                 ["model.decoder.attn_logit_softcap=50.0 does not apply to the gemma3 decoder family"],
                 id="gemma2_softcap_on_a_gemma3"),
    pytest.param(["+recipe=tiny_cpu_gemma3", "model.decoder.sliding_window=null"], "decoder",
                 ["model.decoder.sliding_window is null", "gemma3", "every 6th layer", "another model"],
                 id="gemma3_without_its_windows"),
    pytest.param(["+recipe=tiny_cpu_gemma3", "model.decoder.num_layers=4"], "decoder",
                 ["model.decoder.num_layers=4", "every 6th", "none attends globally", "at least 6 layers"],
                 id="gemma3_without_a_global_layer"),
    pytest.param(["model.decoder.sliding_window=null"], "decoder",
                 ["model.decoder.sliding_window is null", "gemma2", "every 2nd layer"], id="gemma2_without_its_windows"),
    pytest.param(["model.adapter.ctc_weight=-1"], "adapter", ["model.adapter.ctc_weight=-1"], id="negative_ctc_weight"),
    pytest.param(["model.adapter.ctc_weight=0.3", "parallel.pp=2", "launcher.gpus_per_node=2"], "ctc",
                 ["model.adapter.ctc_weight=0.3", "parallel.pp=1 (got 2)"], id="ctc_with_pipeline_parallel"),
    pytest.param(["train.eval_generation_ctc_weight=1.5"], "ctc", ["train.eval_generation_ctc_weight=1.5", "[0, 1]"],
                 id="joint_ctc_weight_above_one"),
    pytest.param(["data.demo_corpus_samples=0"], "data", ["data.demo_corpus_samples=0", "data.demo_corpus="],
                 id="empty_demo_corpus"),
    pytest.param(["launcher.kind=k8s"], "launcher", ["launcher.kind='k8s'"], id="unknown_launcher"),
    pytest.param(["launcher.nodes=2"], "launcher", ["launcher.kind=local", "launcher.nodes=2"], id="local_with_two_nodes"),
    pytest.param(["launcher.entry=main"], "launcher", ["launcher.entry='main'", "dotted path"], id="job_entry_not_dotted"),
    pytest.param(["launcher.cpus_per_task=0"], "launcher", ["launcher.cpus_per_task=0"], id="no_cpus_per_task"),
    pytest.param(["logger.backend=tensorboard"], "logger", ["logger.backend='tensorboard'"], id="unknown_logger"),
    pytest.param(["lora.rank=8", "lora.targets=[linear_q]"], "lora_targets", ["['linear_q']", "tiny_audiollm"], id="lora_target_missing"),
    pytest.param(["lora.rank=512"], "lora_rank", ["lora.rank (512)", "(64)"], id="lora_rank_too_big"),
    pytest.param(["lora.rank=-1"], "lora", ["lora.rank=-1"], id="lora_rank_negative"),
    pytest.param(["lora.lr_groups=[{name: enc, patterns: ['vision_tower.*'], lr_scale: 1.0}, {name: rest, patterns: ['*'], lr_scale: 1.0}]"],
                 "lr_group_pattern", ["lr_groups[enc]", "'vision_tower.*'", "tiny_audiollm"], id="lr_pattern_matches_nothing"),
    pytest.param(["lora.lr_groups=[{name: dec, patterns: ['language_model.*'], lr_scale: 1.0}]"],
                 "lr_group_unmatched", ["encoder.conv1.weight", "no default rate"], id="trainable_params_without_group"),
    pytest.param(["lora.lr_groups=[{name: a, patterns: ['*'], lr_scale: 1.0}, {name: a, patterns: ['*'], lr_scale: 1.0}]"],
                 "lr_groups", ["two groups named 'a'"], id="duplicate_lr_group"),
    pytest.param(["lora.lr_groups=[{name: a, patterns: ['*'], lr_scale: -1.0}]"], "lr_groups", ["lr_scale=-1.0"], id="negative_lr_scale"),
    pytest.param(["model.encoder.freeze=true",
                  "lora.lr_groups=[{name: enc, patterns: ['encoder.*'], lr_scale: 0.1}, {name: rest, patterns: ['*'], lr_scale: 1.0}]"],
                 "lr_frozen", ["lr_groups[enc]", "lr_scale 0.1", "frozen", "model.encoder.freeze"], id="frozen_encoder_with_lr"),
    pytest.param(["model.init_checkpoint=/nonexistent/gemma2_megatron"], "init_checkpoint",
                 ["model.init_checkpoint=/nonexistent/gemma2_megatron", "does not exist"], id="init_checkpoint_missing"),
    pytest.param([f"model.init_checkpoint={paths.conf_dir()}"], "init_checkpoint",
                 [str(paths.conf_dir()), "is not a checkpoint", "audiollm convert hf-to-megatron"],
                 id="init_checkpoint_not_a_checkpoint"),
    pytest.param(["model.encoder.freeze=true"], "frozen_random",
                 ["model.encoder.freeze=true", "model.init_checkpoint is null", "random"], id="frozen_random_encoder"),
    pytest.param(["lora=decoder_r16", "model.encoder.freeze=false", "lora.lr_groups=[{name: all, patterns: ['*'], lr_scale: 1.0}]"],
                 "frozen_random", ["lora.rank=16", "model.init_checkpoint is null", "model.allow_frozen_random=true"],
                 id="lora_on_random_decoder"),
    # LoRA freezes the weights of the linears it adapts, nothing else of the decoder: a rate
    # for those weights alone trains nothing
    pytest.param([TP4PP2, "lora=decoder_r16", "lora.lr_groups=[{name: lora, patterns: ['*lora_*'], lr_scale: 1.0}, {name: dec, patterns: ['language_model.*.linear_*.weight'], lr_scale: 1.0}, {name: rest, patterns: ['*'], lr_scale: 1.0}]"],
                 "lr_frozen", ["lr_groups[dec]", "language_model."], id="lora_base_weights_with_lr"),
]


def _errors(overrides, cfg=None):
    cfg = compose(overrides) if cfg is None else cfg
    return [f for f in validate(to_object(cfg), purpose="train") if f.severity == ERROR]


@pytest.mark.parametrize("overrides, rule, substrings", INVALID)
def test_invalid_config_is_refused_naming_its_values(overrides, rule, substrings):
    cfg = compose(overrides)
    errors = _errors(overrides, cfg)
    matching = [e for e in errors if e.rule == rule]
    assert matching, f"expected a [{rule}] error, got {[str(e) for e in errors]}"
    message = " | ".join(e.message for e in matching)
    for text in substrings:
        assert text in message, f"{text!r} not in {message!r}"
    with pytest.raises(ConfigInvalid):
        resolve(cfg, purpose="train")


def test_a_hf_directory_as_init_checkpoint_is_refused_with_the_conversion_command(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gemma2"}')
    errors = _errors([f"model.init_checkpoint={tmp_path}"])
    (message,) = [e.message for e in errors if e.rule == "init_checkpoint"]
    assert "is a HF checkpoint (model_type 'gemma2')" in message
    assert f"audiollm convert hf-to-megatron --hf {tmp_path} --out {tmp_path}_megatron" in message


def test_a_run_directory_as_init_checkpoint_plans_its_latest_step(tmp_path, pretrained_checkpoint_location):
    import shutil

    step = tmp_path / "checkpoints" / "step_000042"
    shutil.copytree(pretrained_checkpoint_location, step)
    (tmp_path / "checkpoints" / "latest").write_text("step_000042\n")
    plan = resolve(compose([f"model.init_checkpoint={tmp_path}"]))
    assert plan.config["model"]["init_checkpoint"] == str(step.resolve())


def test_all_errors_are_reported_together():
    errors = _errors(["parallel.tp=3", "parallel.sp=true", "optim.lr=0", "launcher.kind=k8s"])
    assert {"world_size", "heads_tp", "lr", "launcher"} <= {e.rule for e in errors}


@pytest.mark.parametrize("recipe", paths.recipe_names())
def test_every_recipe_is_valid(recipe):
    errors = [f for f in validate(to_object(compose([f"+recipe={recipe}"])), purpose="plan") if f.severity == ERROR]
    assert errors == []


def test_missing_training_data_is_a_warning_for_plan_and_an_error_for_train():
    cfg = to_object(compose([TP4PP2]))
    assert [f.severity for f in validate(cfg, "plan") if f.rule == "no_train_data"] == ["warning"]
    assert [f.severity for f in validate(cfg, "train") if f.rule == "no_train_data"] == ["error"]


def test_a_run_without_a_tokenizer_is_refused_before_submission():
    """The 9B recipes read the user's MDS datasets and name no tokenizer: a launch without
    one would stop at start on the cluster; `audiollm plan` only warns."""
    data = "data.train=[{name: asr, path: /data/asr_mds}]"
    cfg = to_object(compose([TP4PP2, data]))
    (error,) = [f for f in validate(cfg, "train") if f.rule == "tokenizer"]
    assert error.severity == "error" and "data.tokenizer is unset" in error.message \
        and "its HF decoder's directory, the one `audiollm convert hf-to-megatron --hf` read" in error.message
    assert [f.severity for f in validate(cfg, "plan") if f.rule == "tokenizer"] == ["warning"]
    assert [f for f in validate(to_object(compose(["+recipe=tiny_cpu"])), "train") if f.rule == "tokenizer"] == []


def test_frozen_random_weights_are_a_warning_when_allowed_for_measuring():
    overrides = ["lora=decoder_r16", "model.encoder.freeze=false",
                 "lora.lr_groups=[{name: all, patterns: ['*'], lr_scale: 1.0}]", "model.allow_frozen_random=true"]
    findings = [f for f in validate(to_object(compose(overrides)), "train") if f.rule == "frozen_random"]
    assert [f.severity for f in findings] == ["warning"], findings
    assert "lora.rank=16" in str(findings[0]) and "speed and memory only" in str(findings[0])


def test_too_few_microbatches_for_the_pipeline_is_a_warning():
    cfg = to_object(compose([TP4PP2, "optim.global_batch_size=4"]))
    findings = [f for f in validate(cfg) if f.rule == "pipeline_bubble"]
    assert [f.severity for f in findings] == ["warning"]
    assert "1 micro-batches" in findings[0].message and "parallel.pp (2)" in findings[0].message


def test_joint_ctc_decoding_of_a_model_without_the_ctc_head_is_a_warning():
    cfg = to_object(compose(["+recipe=tiny_cpu", "model.adapter.ctc_weight=0"]))
    assert cfg.train.eval_generation_ctc_weight > 0  # the recipe's
    findings = [f for f in validate(cfg, "train") if f.rule == "ctc"]
    assert [f.severity for f in findings] == ["warning"]
    assert "has no effect" in findings[0].message and "model.adapter.ctc_weight=0.0" in findings[0].message


def test_generation_inside_training_runs_at_tp_pp_cp_and_warns_only_with_virtual_pipeline_chunks():
    for layout in (["parallel.tp=2", "launcher.gpus_per_node=2"], ["parallel.pp=2", "launcher.gpus_per_node=2"],
                   ["parallel.cp=2", "launcher.gpus_per_node=2"]):
        cfg = to_object(compose(["train.eval_generation=true", *layout]))
        assert [f for f in validate(cfg, "train") if f.rule == "eval_generation"] == [], layout
    cfg = to_object(compose(["train.eval_generation=true", "parallel.pp=2", "parallel.vpp=2", "model.decoder.num_layers=4",
                             "launcher.gpus_per_node=2"]))
    findings = [f for f in validate(cfg, "train") if f.rule == "eval_generation"]
    assert [f.severity for f in findings] == ["warning"]
    assert "parallel.vpp=2" in findings[0].message and "audiollm eval RUN_DIR" in findings[0].message


def test_plan_command_exits_nonzero_with_every_error_on_stderr():
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "plan", "parallel.tp=3", "launcher.gpus_per_node=2", "optim.lr=0"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "[world_size]" in proc.stderr and "[heads_tp]" in proc.stderr and "[lr]" in proc.stderr


def test_context_parallel_counts_as_sharding():
    """The distributed optimizer shards over data x context parallel ranks (no warning at
    DP=1, CP=2)."""
    cfg = to_object(compose(["parallel.cp=2", "launcher.gpus_per_node=2", "parallel.distributed_optimizer=true"]))
    findings = validate(cfg, "train")
    assert not [f for f in findings if f.rule == "distributed_optimizer"]
    alone = validate(to_object(compose(["parallel.distributed_optimizer=true"])), "plan")
    assert [f.rule for f in alone if f.rule == "distributed_optimizer"] == ["distributed_optimizer"]


def test_inputs_this_machine_cannot_see_are_refused_for_it_and_said_for_a_cluster(tmp_path, monkeypatch, capsys):
    """A tokenizer directory or a dataset that does not exist here fails a local job at its
    start: `plan` and a dry run refuse it, naming the key, the path and the directory a
    relative path is read from; a SLURM job's nodes may see it, so there it is a warning."""
    from launchers.train import train

    monkeypatch.chdir(tmp_path)
    (tmp_path / "seen").mkdir()
    (tmp_path / "seen" / "index.json").write_text("{}")
    inputs = ["data.demo_corpus=null", "data.tokenizer=/nonexistent/tokenizer", "data.validation=[]",
              "data.train=[{name: here, path: seen}, {name: gone, path: /nonexistent/asr_mds}, "
              "{name: many, path: 'shards/*'}]"]
    local = [str(f) for f in validate(to_object(compose(["launcher=local", *inputs])), "plan")
             if f.rule == "local_paths"]
    assert [f.split(":")[0] for f in local] == ["error"] * 3, local
    assert "data.tokenizer=/nonexistent/tokenizer: no such directory" in local[0]
    assert "data.train[gone].path: /nonexistent/asr_mds does not exist" in local[1]
    assert f"matches shards/* (relative to {tmp_path})" in local[2] and "launcher=local runs the job" in local[2]
    cluster = [f for f in validate(to_object(compose(["launcher=slurm", *inputs])), "train")
               if f.rule in ("local_paths", "cluster_paths")]
    assert {(f.severity, f.rule) for f in cluster} == {("warning", "cluster_paths")} and len(cluster) == 3, cluster
    assert all("seen from this machine" in f.message and "compute nodes" in f.message for f in cluster)
    # A dry run of that local job submits nothing and says why.
    assert train([*inputs, "launcher=local", "launcher.dry_run=true", f"run.output_root={tmp_path / 'out'}"]) != 0
    assert "data.tokenizer=/nonexistent/tokenizer: no such directory" in capsys.readouterr().err
    # The demo corpus's own paths are written by `audiollm train` before it submits.
    assert [f for f in validate(to_object(compose(["+recipe=tiny_cpu"])), "train") if f.rule == "local_paths"] == []


LLAMA = ["model.decoder.family=llama", "model.decoder.sliding_window=null", "model.decoder.query_pre_attn_scalar=null",
         "model.decoder.attn_logit_softcap=null", "model.decoder.final_logit_softcap=null",
         "model.decoder.rope_scaling_factor=8", "model.decoder.tie_embeddings=false"]


def test_a_llama_decoder_plans_megatron_llama_flags_and_its_parameters():
    """The argv says what a Llama is to Megatron-LM (SwiGLU, Llama 3's RoPE scaling, plain
    RMSNorm, no windows, its own output layer); the inventory has no post-norms."""
    plan = resolve(compose(LLAMA), purpose="plan")
    argv = " ".join(plan.argv)
    for flag in ("--swiglu", "--use-rope-scaling", "--rope-scaling-factor 8.0", "--untie-embeddings-and-output-weights"):
        assert flag in argv, flag
    for flag in ("--apply-layernorm-1p", "--window-size", "--window-attn-skip-freq"):
        assert flag not in argv, flag
    fields = plan.transformer_fields  # what the job's megatron config is built from
    assert (fields["decoder_family"], fields["activation_func"], fields["layernorm_zero_centered_gamma"]) == \
        ("llama", "silu", False)
    assert fields["softmax_scale"] is None  # megatron's head_dim**-0.5
    assert fields["sliding_window"] is None and fields["attn_logit_softcapping"] is None
    assert not any(k.startswith(("--apply", "--window")) for k in plan.model_extensions["implemented_by_audiollm"])
    gemma2 = resolve(compose([]), purpose="plan")
    layers = plan.config["model"]["decoder"]["num_layers"]
    # Two norms of a layer fewer; the output layer's vocabulary x hidden more.
    hidden = plan.config["model"]["decoder"]["hidden_size"]
    llama, base = plan.parameters["total"], gemma2.parameters["total"]
    assert llama["decoder"]["trainable"] == base["decoder"]["trainable"] - 2 * layers * hidden
    assert llama["embedding"]["trainable"] == base["embedding"]["trainable"] + plan.padded_vocab_size * hidden


@pytest.mark.parametrize("model,flag", [("qwen2_5_7b_whisper_large_v3", "--add-qkv-bias"),
                                        ("qwen3_8b_whisper_large_v3", "--qk-layernorm")])
def test_a_qwen_decoder_plans_its_megatron_flag(model, flag):
    """Qwen2's q/k/v biases and Qwen3's QK-norm are what Megatron-LM's argv says; neither
    is Llama 3's RoPE scaling nor Gemma's norm."""
    plan = resolve(compose(["+recipe=gemma2_whisper_tp1", f"model={model}", "data.add_bos=false"]), purpose="plan")
    argv = " ".join(plan.argv)
    for present in (flag, "--swiglu", "--untie-embeddings-and-output-weights"):
        assert present in argv, present
    for absent in ({"--add-qkv-bias", "--qk-layernorm"} - {flag}) | {"--use-rope-scaling", "--apply-layernorm-1p"}:
        assert absent not in argv, absent
    assert plan.transformer_fields["add_qkv_bias"] == (flag == "--add-qkv-bias")
    assert plan.transformer_fields["qk_layernorm"] == (flag == "--qk-layernorm")


def test_a_gemma3_decoder_plans_its_megatron_flags_and_its_local_rope_base():
    """Gemma 3 to Megatron-LM: Gemma's norm and window flags, QK-norm, one global layer in
    six, linear RoPE scaling; its sliding layers' RoPE base has no flag, and the plan says
    the project's model applies it."""
    plan = resolve(compose(["+recipe=gemma2_whisper_tp1", "model=gemma3_4b_whisper_large_v3"]), purpose="plan")
    argv = " ".join(plan.argv)
    for flag in ("--apply-layernorm-1p", "--qk-layernorm", "--window-size (1023,0)", "--window-attn-skip-freq 6",
                 "--rotary-seq-len-interpolation-factor 8", "--rotary-base 1000000"):
        assert flag in argv, flag
    for flag in ("--use-rope-scaling", "--swiglu", "--untie-embeddings-and-output-weights"):
        assert flag not in argv, flag
    fields = plan.transformer_fields
    assert (fields["rope_local_theta"], fields["rope_scaling_factor"]) == (10000.0, 8.0)
    assert (fields["sliding_window"], fields["window_pattern"], fields["qk_layernorm"]) == (1024, 6, True)
    assert fields["attn_logit_softcapping"] is None and fields["final_logit_softcapping"] is None


def test_an_untied_output_layer_adds_its_weights_to_the_plan_but_not_its_logits_twice():
    """The loss's logits are the output layer's rows on a rank, whether or not the layer is
    the embedding; with its own output layer a PP 1 stage holds twice the vocabulary's
    parameters, which once counted the logits twice (the full-size probe showed it)."""
    untied = resolve(compose(LLAMA), purpose="plan").memory
    tied = resolve(compose([*LLAMA[:-1], "model.decoder.tie_embeddings=true"]), purpose="plan").memory
    assert untied["activations_gib"] == tied["activations_gib"]
    assert untied["weights_gib"] > tied["weights_gib"]


def test_another_familys_prompt_is_refused_where_the_tokenizer_is_only_on_the_cluster():
    """A recipe composed with another family's model, its tokenizer a path this machine
    does not see: the chat format and placeholder are the recipe's family's, which the job
    would refuse at start; said at plan time, with the model family's own settings."""
    from orchestrator.plan.decoder_families import prompt_overrides

    llama = ["+recipe=gemma2_whisper_tp1", "model=llama3_1_8b_whisper_large_v3", "data.tokenizer=/cluster/llama3"]
    (error,) = [f.message for f in validate(to_object(compose(llama)), "plan") if f.rule == "prompt_family"]
    assert "'<unused0>' are the gemma2 family's chat format, but model.decoder.family=llama" in error
    assert "data.tokenizer=/cluster/llama3, not on this machine" in error and "<|start_header_id|>" in error
    assert [f for f in validate(to_object(compose([*llama, *prompt_overrides("llama")])), "plan")
            if f.rule == "prompt_family"] == []
    qwen = ["+recipe=gemma2_whisper_tp1", "model=qwen2_5_7b_whisper_large_v3", "data.tokenizer=/cluster/qwen",
            *prompt_overrides("qwen2"), "data.add_bos=true"]
    (error,) = [f.message for f in validate(to_object(compose(qwen)), "plan") if f.rule == "prompt_family"]
    assert "data.add_bos=true but the qwen2 family's tokenizers have no BOS token" in error
