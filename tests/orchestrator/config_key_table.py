"""What a plausible wrong value of every config key gets: one entry per key of the schema
(tests/orchestrator/test_config_key_table.py fails when a key joins the schema without
one), tried on the tiny recipe with the tests' corpus and tokenizer on this machine.
docs/config-keys.md is generated from it (`python -m tests.orchestrator.config_key_table`).

An entry's `works` is empty where plan refuses the value, its message naming the key
and the value; otherwise it says why the value is fine, or where else it is refused
(before submission, on the cluster) and why plan cannot tell."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    value: str  # the value tried, as an override writes it
    works: str = ""  # "": refused by plan; else why the value is fine, or where it is refused instead
    needs: tuple = ()  # other overrides the try needs (a setting that makes the key matter)


LORA_ON = ("lora.rank=4", "lora.targets=[linear_qkv]")
SLURM = ("launcher.kind=slurm",)

TABLE: dict[str, Entry] = {
    "recipe": Entry("nonsense", "a record of the recipe's name; `+recipe=NAME` of a recipe that does not exist fails "
                                "to compose, naming the recipes there are"),
    "model.name": Entry("nonsense", "a label (logs, W&B, the plan's report): any name"),
    "model.backend": Entry("nonsense"),
    "model.attention": Entry("nonsense"),
    "model.compile": Entry("nonsense"),
    "model.fp8": Entry("nonsense"),
    "model.decoder.family": Entry("nonsense"),
    "model.decoder.hidden_size": Entry("-1"),
    "model.decoder.num_layers": Entry("0"),
    "model.decoder.num_attention_heads": Entry("-1"),
    "model.decoder.num_query_groups": Entry("3"),
    "model.decoder.kv_channels": Entry("0"),
    "model.decoder.ffn_hidden_size": Entry("-1"),
    "model.decoder.vocab_size": Entry("100"),  # smaller than the tokenizer's
    "model.decoder.max_position_embeddings": Entry("64"),  # shorter than data.seq_length
    "model.decoder.rope_theta": Entry("-1.0"),
    "model.decoder.norm_eps": Entry("0.0"),
    "model.decoder.sliding_window": Entry("-1"),
    "model.decoder.query_pre_attn_scalar": Entry("null"),
    "model.decoder.attn_logit_softcap": Entry("-1.0"),
    "model.decoder.final_logit_softcap": Entry("-1.0"),
    "model.decoder.rope_scaling_factor": Entry("8.0"),  # a Llama trait on the Gemma2 decoder
    "model.decoder.rope_local_theta": Entry("10000.0"),  # a Gemma 3 trait on the Gemma2 decoder
    "model.decoder.tie_embeddings": Entry("maybe"),
    "model.decoder.freeze": Entry("true", needs=("model.init_checkpoint=null",)),  # frozen at random weights
    "model.decoder.init_method_std": Entry("-0.02"),
    "model.encoder.d_model": Entry("130"),  # not divisible by the heads
    "model.encoder.num_layers": Entry("0"),
    "model.encoder.num_heads": Entry("3"),
    "model.encoder.ffn_dim": Entry("-1"),
    "model.encoder.num_mel_bins": Entry("64"),
    "model.encoder.max_source_positions": Entry("249"),  # not divisible by the frame stack
    "model.encoder.mask_padding": Entry("maybe"),
    "model.encoder.init_std": Entry("0.0"),
    "model.encoder.freeze": Entry("true"),  # frozen at random weights
    "model.encoder.precision": Entry("bf16"),  # on a CPU
    "model.adapter.kind": Entry("perceiver"),
    "model.adapter.frame_stack": Entry("3"),
    "model.adapter.dropout": Entry("1.5"),
    "model.adapter.freeze": Entry("maybe"),
    "model.adapter.ctc_weight": Entry("-0.3"),
    "model.spec_augment.enabled": Entry("maybe"),
    "model.spec_augment.freq_masks": Entry("-1"),
    "model.spec_augment.freq_width": Entry("0"),
    "model.spec_augment.time_masks": Entry("-1"),
    "model.spec_augment.time_width": Entry("0"),
    "model.spec_augment.time_ratio": Entry("1.5"),
    "model.init_checkpoint": Entry("/nonexistent/checkpoint"),
    "model.allow_frozen_random": Entry("maybe"),
    "parallel.tp": Entry("3"),
    "parallel.pp": Entry("3"),
    "parallel.cp": Entry("0"),
    "parallel.vpp": Entry("2"),  # needs pp > 1
    "parallel.sp": Entry("true"),  # at TP 1
    "parallel.distributed_optimizer": Entry("maybe"),
    "parallel.recompute.granularity": Entry("partial"),
    "parallel.recompute.method": Entry("uniform"),  # without a granularity
    "parallel.recompute.num_layers": Entry("-1", needs=("parallel.recompute.granularity=full",
                                                        "parallel.recompute.method=uniform")),
    "parallel.rank_order": Entry("dp-tp-pp"),
    "data.seq_length": Entry("0"),
    "data.train": Entry("[]", "plan warns (a layout is planned without data); `audiollm train` refuses it before "
                              "it submits anything"),
    "data.train[].name": Entry("a"),  # the name of the list's other dataset
    "data.train[].path": Entry("/nonexistent/dataset"),
    "data.train[].weight": Entry("-1"),
    "data.train[].task": Entry("translation"),
    "data.train[].prompt_template": Entry("'no marker'"),
    "data.train[].instruction_field": Entry("question"),  # a transcription dataset reads no instruction
    "data.train[].audio_field": Entry("speech"),  # no such column
    "data.train[].text_field": Entry("transcript"),  # no such column
    "data.train[].turns_field": Entry("turns"),  # a transcription dataset reads no turns
    "data.train[].metric": Entry("wer"),  # a metric of a training dataset
    "data.train[].normaliser": Entry("whisper_english"),  # a normaliser of a training dataset
    "data.train[].ctc": Entry("maybe"),
    "data.validation": Entry("[{name:x,path:'/nonexistent/dataset'}]"),
    "data.tokenizer": Entry("/nonexistent/tokenizer"),
    "data.audio_token": Entry("'<no_such_token>'"),
    "data.prompt_template": Entry("'Transcribe:'"),  # no <SpeechHere>
    "data.response_suffix": Entry("'<eos>'", "any text: the tokenizer turns it into the tokens that end an answer "
                                             "(the family's own end of turn is the recipe's value)"),
    "data.add_bos": Entry("maybe"),
    "data.add_eos": Entry("maybe"),
    "data.loss_on_prompt": Entry("maybe"),
    "data.long_conversation": Entry("drop"),
    "data.max_audio_seconds": Entry("60.0"),  # longer than the encoder window
    "data.long_audio": Entry("split"),
    "data.audio_tokens": Entry("frames"),
    "data.sample_rate": Entry("8000"),
    "data.wrong_sample_rate": Entry("ignore"),
    "data.audio_field": Entry("speech"),  # no such column in the datasets
    "data.sample_rate_field": Entry("rate", "read only where a dataset's audio column holds raw arrays (encoded "
                                            "audio carries its rate); such a dataset without the column is refused "
                                            "when the job reads its first sample, naming dataset, file and sample"),
    "data.text_field": Entry("transcript"),  # no such column in the datasets
    "data.packing": Entry("maybe"),
    "data.packing_buffer": Entry("0"),
    "data.silence_padding": Entry("1.5"),
    "data.shuffle": Entry("maybe"),
    "data.on_bad_sample": Entry("ignore"),
    "data.max_bad_fraction": Entry("1.5"),
    "data.cache_dir": Entry("relative/cache", "a directory the job creates where it runs (remote datasets' local "
                                              "copies); where it cannot, the first read says so, naming it"),
    "data.cache_limit": Entry("lots"),
    "data.download_retry": Entry("-1"),
    "data.feature_cache_mb": Entry("-64"),
    "data.validation_max_samples": Entry("0"),
    "data.demo_corpus": Entry("/nonexistent/demo", "the directory `audiollm train` writes the demo corpus into "
                                                   "before it submits (espeak-ng), unless it holds one already"),
    "data.demo_corpus_samples": Entry("0", needs=("data.demo_corpus=/nonexistent/demo",)),
    "data.demo_corpus_accent": Entry("xx-nowhere", "an espeak-ng voice: writing the corpus, before submission, "
                                                   "fails naming espeak-ng's own error for a voice it lacks",
                                     needs=("data.demo_corpus=/nonexistent/demo",)),
    "data.num_workers": Entry("-1"),
    "data.features_on": Entry("gpu"),
    "data.replica_reader": Entry("maybe"),
    "data.seed": Entry("-1"),
    "data.canonical_nodes": Entry("0"),
    "lora.rank": Entry("-1"),
    "lora.alpha": Entry("-16.0", needs=LORA_ON),
    "lora.dropout": Entry("1.0", needs=LORA_ON),
    "lora.targets": Entry("[q_proj]", needs=("lora.rank=4",)),  # a HF name, not megatron's
    "lora.encoder": Entry("maybe"),
    "lora.adapter": Entry("maybe"),
    "lora.lr_groups": Entry("[]"),
    "lora.lr_groups[].name": Entry("a"),  # the name of the list's other group
    "lora.lr_groups[].patterns": Entry("['decoder.nonexistent.*']"),
    "lora.lr_groups[].lr_scale": Entry("-1.0"),
    "optim.optimizer": Entry("lamb"),
    "optim.lr": Entry("0.0"),
    "optim.min_lr": Entry("1.0"),  # above optim.lr
    "optim.weight_decay": Entry("-0.1"),
    "optim.adam_beta1": Entry("1.0"),
    "optim.adam_beta2": Entry("-0.5"),
    "optim.adam_eps": Entry("0.0"),
    "optim.clip_grad": Entry("-1.0"),
    "optim.lr_warmup_iters": Entry("100000"),  # beyond train.iters
    "optim.lr_decay_style": Entry("exponential"),
    "optim.global_batch_size": Entry("7"),
    "optim.micro_batch_size": Entry("0"),
    "launcher.kind": Entry("kubernetes"),
    "launcher.nodes": Entry("2"),  # launcher=local on one machine
    "launcher.gpus_per_node": Entry("0"),
    "launcher.accelerator": Entry("tpu"),
    "launcher.gpu_type": Entry("v100"),
    "launcher.intra_node_gb_s": Entry("0.0"),
    "launcher.inter_node_gb_s": Entry("-25.0"),
    "launcher.cpus_per_task": Entry("0"),
    "launcher.mem_gb": Entry("-1"),
    "launcher.timeout_min": Entry("0"),
    "launcher.partition": Entry("nonexistent", "checked against the cluster's partitions where SLURM answers "
                                               "(launchers/slurm_fit.py: refused before submission, naming the "
                                               "ones there are); plan without a cluster says it could not check",
                                needs=SLURM),
    "launcher.account": Entry("nonexistent", "checked against the cluster where SLURM answers (slurm_fit: the "
                                             "partition's allowed accounts); else sbatch refuses it at submission",
                              needs=SLURM),
    "launcher.qos": Entry("nonexistent", "checked against the cluster where SLURM answers (slurm_fit: the "
                                         "partition's allowed QOS); else sbatch refuses it at submission",
                          needs=SLURM),
    "launcher.constraint": Entry("nonexistent", "checked against the nodes' features where SLURM answers "
                                                "(slurm_fit); else sbatch refuses it at submission", needs=SLURM),
    "launcher.exclusive": Entry("maybe"),
    "launcher.additional_sbatch": Entry("{--mail-type: END}"),
    "launcher.setup": Entry("['module load nothing']", "shell lines run before the job: what they do is the "
                                                       "user's; a failing line fails the job's start, in its log",
                            needs=SLURM),
    "launcher.srun_args": Entry("['--nonsense']", "passed to srun as they are: srun refuses an option it lacks when "
                                                  "the job starts, in the job's log", needs=SLURM),
    "launcher.max_requeues": Entry("-1"),
    "launcher.dry_run": Entry("maybe"),
    "launcher.allow_unfit_memory": Entry("maybe"),
    "launcher.entry": Entry("nodots"),
    "launcher.signal_delay_s": Entry("0"),
    "launcher.array_parallelism": Entry("0"),
    "launcher.wait": Entry("maybe"),
    "logger.backend": Entry("tensorboard"),
    "logger.mode": Entry("sometimes"),
    "logger.project": Entry("'my project'", "a W&B project name: W&B creates it (online) or keeps it (offline)"),
    "logger.entity": Entry("nobody", "a W&B team or user: online, W&B refuses one the key cannot write to when the "
                                     "run starts; offline, a label"),
    "logger.tags": Entry("['a b']", "W&B tags: any strings"),
    "train.iters": Entry("0"),
    "train.log_interval": Entry("0"),
    "train.eval_interval": Entry("-1"),
    "train.eval_iters": Entry("-1"),
    "train.eval_at_start": Entry("maybe"),
    "train.eval_generation": Entry("maybe"),
    "train.eval_generation_batches": Entry("-1"),
    "train.eval_generation_max_new_tokens": Entry("0", needs=("train.eval_generation=true",)),
    "train.eval_generation_ctc_weight": Entry("1.5"),
    "train.save_interval": Entry("-1"),
    "train.save_interval_minutes": Entry("-1.0"),
    "train.keep_last": Entry("0"),
    "train.keep_every": Entry("-1"),
    "train.async_save": Entry("maybe"),
    "train.save_frozen_weights": Entry("maybe"),
    "train.hang_timeout": Entry("-1.0"),
    "train.straggler_threshold": Entry("-0.2"),
    "train.profile_steps": Entry("[5]"),
    "train.profile_ranks": Entry("[9]", needs=("train.profile_steps=[2,3]",)),
    "train.seed": Entry("-1"),
    "run.experiment": Entry("a/b"),
    "run.name": Entry("/elsewhere"),
    "run.output_root": Entry("/nonexistent/outputs", "created when the run is submitted; one that cannot be "
                                                     "written is refused then, before anything runs, naming it"),
    "run.resume": Entry("always"),
}
# Each validation dataset entry gets what a training one gets.
for _key in [k for k in TABLE if k.startswith("data.train[].")]:
    TABLE[_key.replace("data.train[]", "data.validation[]")] = TABLE[_key]
TABLE["data.validation[].metric"] = Entry("rouge")
TABLE["data.validation[].normaliser"] = Entry("whisper")  # not one of audiollm, whisper_english, whisper_basic
TABLE["data.validation[].weight"] = Entry("-1", "each validation dataset is scored on its own: plan warns that "
                                                "its weight has no effect")


def markdown(defaults: dict) -> str:
    """docs/config-keys.md: every key, its default, the wrong value tried and what it gets."""
    lines = ["# Every config key and what a wrong value gets", "",
             "Generated from the schema and tests/orchestrator/config_key_table.py (`python -m",
             "tests.orchestrator.config_key_table`); tests/orchestrator/test_config_key_table.py tries every row",
             "on the tiny recipe with a corpus and tokenizer on the machine, and fails when a schema key has no",
             "row. *refused*: `audiollm plan` (and `train`, before anything is submitted) exits 2 with a message",
             "naming the key and the value. The other rows say why the value is fine, or where it is refused",
             "instead. A key of list entries (`data.train[]`) is tried in the list's second entry.", "",
             "| key | default | tried | gets |", "|---|---|---|---|"]
    for key, entry in TABLE.items():
        tried = entry.value + (f" (with {', '.join(entry.needs)})" if entry.needs else "")
        lines.append(f"| `{key}` | `{defaults.get(key, '')}` | `{tried}` | {entry.works or '*refused*'} |")
    return "\n".join(lines) + "\n"


def schema_defaults() -> dict:
    """Each key's default as the schema declares it (a list entry's in its dataclass)."""
    import dataclasses
    import typing

    from orchestrator.plan.schema import AudioLLMConfig

    out = {}

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint, path = hints[f.name], prefix + f.name
            inner = next((a for a in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(a)), None)
            if inner is not None and typing.get_origin(hint) is None:
                walk(inner, path + ".")
                continue
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "???")
            out[path] = "null" if default is None else str(default).lower() if isinstance(default, bool) else \
                repr(default).replace("\n", "\\n") if isinstance(default, str) else default
            if inner is not None:  # entries of a list: data.train[].path
                walk(inner, path + "[].")

    walk(AudioLLMConfig, "")
    return out


if __name__ == "__main__":
    from pathlib import Path

    out = Path(__file__).resolve().parents[2] / "docs" / "config-keys.md"
    out.write_text(markdown(schema_defaults()))
    print(f"wrote {out}")
