"""Rules of the data section: dataset entries and their columns, the tokenizer against the
model's vocabulary and chat format, the inputs this machine can see, packing."""

from __future__ import annotations

import importlib.util
import re
from typing import Iterator

from orchestrator.plan.adapter_kinds import ADAPTER_KINDS, frames_per_token
from orchestrator.plan.decoder_families import PROMPTS, data_overrides, prompt_settings
from orchestrator.plan.released_models import released_class, released_of_kind
from orchestrator.plan.tokenizer_file import TEKKEN_INSTALL, is_tekken
from orchestrator.plan.schema import (
    DataConfig,
    LauncherConfig,
    ModelConfig,
    OptimConfig,
)
from orchestrator.plan.launcher_kinds import KINDS
from orchestrator.plan.local_paths import index_columns, inside, local_dataset_dirs, missing_inputs
from orchestrator.plan.model_params import AUDIO_TOKEN_MODES, SAMPLE_RATE, audio_tokens_per_clip
from orchestrator.plan import tasks
from orchestrator.plan.rules.findings import Finding, error, one_of, warning


# mosaic's size format (streaming.base.util.bytes_to_int), checked here without importing it.
_CACHE_LIMIT = re.compile(r"^\s*\d+(\.\d+)?\s*(b|kb|mb|gb|tb|pb)?\s*$", re.IGNORECASE)


def check_data(data: DataConfig, model: ModelConfig, purpose: str) -> Iterator[Finding]:
    yield from one_of("data", "data.on_bad_sample", data.on_bad_sample, ("error", "skip"))
    yield from one_of("data", "data.long_audio", data.long_audio, ("refuse", "chunk"))
    yield from one_of("data", "data.audio_tokens", data.audio_tokens, AUDIO_TOKEN_MODES)
    yield from one_of("data", "data.wrong_sample_rate", data.wrong_sample_rate, ("resample", "refuse"))
    yield from one_of("data", "data.features_on", data.features_on, ("cpu", "device"))
    if not 0.0 <= data.max_bad_fraction <= 1.0:
        yield error("data", f"data.max_bad_fraction={data.max_bad_fraction} must be between 0 and 1 (a share of "
                            f"a dataset's samples; 0.01 stops the run when over 1% of one dataset is bad)")
    if data.num_workers < 0:
        yield error("data_workers", f"data.num_workers={data.num_workers} must be >= 0 "
                                    f"(0 decodes in the training process)")
    if data.sample_rate != SAMPLE_RATE:
        yield error("data", f"data.sample_rate={data.sample_rate}: the Whisper encoder's log-mel features are "
                            f"computed at {SAMPLE_RATE} Hz (audio at another rate is resampled to it: "
                            f"data.wrong_sample_rate); set data.sample_rate={SAMPLE_RATE}")
    for key, least in (("packing_buffer", 1), ("seed", 0)):
        if getattr(data, key) < least:
            yield error("data", f"data.{key}={getattr(data, key)} must be >= {least}")
    if data.validation_max_samples is not None and data.validation_max_samples < 1:
        yield error("data", f"data.validation_max_samples={data.validation_max_samples} must be at least 1, or null "
                            f"for every sample of each validation dataset")
    if data.cache_limit is not None and not _CACHE_LIMIT.match(str(data.cache_limit)):
        yield error("data", f"data.cache_limit={data.cache_limit!r} is not a size: use bytes or a number with "
                            f"kb, mb, gb or tb (e.g. 200gb), or null for no limit")
    if data.download_retry < 0:
        yield error("data", f"data.download_retry={data.download_retry} must be >= 0")
    if data.demo_corpus and data.demo_corpus_samples < 1:
        yield error("data", f"data.demo_corpus_samples={data.demo_corpus_samples} must be >= 1 "
                            f"(training utterances written into data.demo_corpus={data.demo_corpus})")
    if data.feature_cache_mb < 0:
        yield error("data", f"data.feature_cache_mb={data.feature_cache_mb} must be >= 0 (0 disables the cache)")
    if not 0.0 <= data.silence_padding <= 1.0:
        yield error("silence_padding", f"data.silence_padding={data.silence_padding} is the share of training clips "
                                       f"padded with silence: between 0 (none) and 1 (every one)")
    if data.max_audio_seconds <= 0:
        yield error("data", f"data.max_audio_seconds={data.max_audio_seconds} must be positive")
        return
    window_seconds = model.encoder.max_source_positions * 2 / 100
    if data.max_audio_seconds > window_seconds:
        yield error(
            "audio_window",
            f"data.max_audio_seconds ({data.max_audio_seconds}) exceeds the encoder window of {window_seconds:g} s "
            f"(model.encoder.max_source_positions {model.encoder.max_source_positions} x 2 / 100 frames per s); "
            f"lower data.max_audio_seconds or use data.long_audio=chunk with max_audio_seconds <= {window_seconds:g}",
        )
    if data.audio_tokens not in AUDIO_TOKEN_MODES:
        return  # said above; nothing can be counted
    kind = ADAPTER_KINDS.get(model.adapter.kind)
    if kind is not None and kind.audio_tokens and data.audio_tokens != kind.audio_tokens:
        yield error("audio_tokens", f"model.adapter.kind={model.adapter.kind} counts "
                                    f"{'every clip as whole encoder windows' if kind.audio_tokens == 'window' else 'a clip by its own frames'} "
                                    f"(as {released_class(model.adapter.kind)}'s processor does), but data.audio_tokens="
                                    f"{data.audio_tokens}: set data.audio_tokens={kind.audio_tokens}")
    if kind is not None and frames_per_token(model.adapter) >= 1:
        # "window" counts every clip as a full encoder window, whatever its length.
        seconds = window_seconds if data.audio_tokens == "window" else min(data.max_audio_seconds, window_seconds)
        audio_tokens = audio_tokens_per_clip(seconds, model, data.audio_tokens)
        if audio_tokens >= data.seq_length:
            yield error(
                "audio_tokens",
                f"a {seconds:g}-s clip (data.audio_tokens={data.audio_tokens}) becomes {audio_tokens} audio tokens, not fewer than "
                f"data.seq_length ({data.seq_length}): no room for the prompt and the response",
            )
    if "<SpeechHere>" not in data.prompt_template:
        yield error("prompt", "data.prompt_template has no <SpeechHere> marker for the audio")
    yield from one_of("data", "data.long_conversation", data.long_conversation, ("refuse", "truncate"))
    for split in ("train", "validation"):
        for entry in getattr(data, split):
            for problem in tasks.entry_problems(entry, data, split):
                yield error("dataset_format", problem)
    if not data.train:
        finding = error if purpose == "train" else warning
        yield finding("no_train_data", "data.train lists no datasets; add at least one {name, path, weight}")
    names = [d.name for d in list(data.train) + list(data.validation)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        yield error("dataset_names", f"dataset names must be unique; repeated: {', '.join(duplicates)}")
    for entry in data.train:
        if entry.weight <= 0:
            yield error("dataset_weight", f"data.train[{entry.name}].weight={entry.weight} must be positive")
    for entry in data.validation:
        if entry.weight != 1.0:
            yield warning("dataset_weight", f"data.validation[{entry.name}].weight={entry.weight} has no effect: each "
                                            f"validation dataset is scored on its own (weights mix training datasets)")


# What a chat format's turn markers look like: <start_of_turn>, <|im_start|>, </s>; and a
# Tekken tokenizer's control tokens: [INST], [/INST], [BEGIN_AUDIO].
_TURN_MARKER = re.compile(r"</?\|?[A-Za-z_][A-Za-z0-9_]*\|?>")
_CONTROL_MARKER = re.compile(r"\[/?[A-Z][A-Z_]*\]")


def check_tokenizer(data: DataConfig, model: ModelConfig, purpose: str = "plan") -> Iterator[Finding]:
    """There is a tokenizer (every job tokenizes its text: without one it would stop at
    start, on the cluster); a local HF tokenizer (its tokenizer.json, read as JSON: no
    transformers here) knows data.audio_token as one token and fits the model's
    vocabulary. A tokenizer not written yet (the demo corpus is made by `audiollm train`)
    is checked by the job."""
    from orchestrator.plan.tokenizer_file import TokenizerFileError, read_special_tokens, read_vocabulary

    if not data.tokenizer:
        finding = error if purpose == "train" else warning
        release = released_of_kind(model.adapter.kind)
        whose = (f"the released {release.hf_class} directory, or the released_processor/ directory of its conversion "
                 f"(model.init_checkpoint)" if release else
                 "its HF decoder's directory, the one `audiollm convert hf-to-megatron --hf` read, or the directory "
                 "`audiollm convert megatron-to-hf` wrote")
        yield finding("tokenizer", f"data.tokenizer is unset, and every job tokenizes its prompts and answers with "
                                   f"it: set data.tokenizer to the model's own tokenizer, a local HF directory with "
                                   f"tokenizer.json or a Tekken tokenizer's tekken.json (for model {model.name}: "
                                   f"{whose})")
        return
    try:
        vocab = read_vocabulary(data.tokenizer)
        specials = read_special_tokens(data.tokenizer)
    except FileNotFoundError:
        yield from _prompt_of_another_family(data, model)
        return
    except TokenizerFileError as exc:
        yield error("tokenizer", f"data.tokenizer={data.tokenizer}: {exc}")
        return
    family = model.decoder.family if model.decoder.family in PROMPTS else "gemma2"
    release = released_of_kind(model.adapter.kind)  # a released model's prompt is its processor's
    whose, own = (release.name, release.prompt) if release else (family, PROMPTS[family])
    if data.audio_token not in vocab:
        yield error("audio_token", f"data.audio_token={data.audio_token!r} is not one token of data.tokenizer="
                                   f"{data.tokenizer}; choose a token the tokenizer already has (for {whose} "
                                   f"{own['audio_token']!r}): a new token would need an embedding row the "
                                   f"checkpoint lacks")
    for key, setting in (("bos_token", "add_bos"), ("eos_token", "add_eos")):
        if getattr(data, setting) and key in specials and specials[key] is None:
            yield error("tokenizer_specials", f"data.{setting}=true but data.tokenizer={data.tokenizer} has no "
                                              f"{key[:3]} token ({key} is null in its tokenizer_config.json, as "
                                              f"in Qwen's): set data.{setting}=false")
    # A turn marker of another family's chat format is no token of this tokenizer: it would
    # be trained as the text pieces it splits into, a prompt the model never saw.
    templates = [("data.prompt_template", data.prompt_template), ("data.response_suffix", data.response_suffix)]
    templates += [(f"data.{split}[{entry.name}].prompt_template", entry.prompt_template)
                  for split in ("train", "validation") for entry in getattr(data, split) if entry.prompt_template]
    tekken = is_tekken(data.tokenizer)
    if tekken and importlib.util.find_spec("mistral_common") is None:
        yield error("tokenizer_package", f"data.tokenizer={data.tokenizer} is a Tekken tokenizer (tekken.json), which "
                                         f"the job reads with the mistral-common package, not installed here: "
                                         f"{TEKKEN_INSTALL}")
    # Tekken's control tokens are written [INST], [AUDIO]: one not in its vocabulary would be plain text.
    markers = [_TURN_MARKER, _CONTROL_MARKER] if tekken else [_TURN_MARKER]
    strangers = [f"{where} holds {', '.join(found)}" for where, text in templates
                 if (found := sorted({m for marker in markers for m in marker.findall(text)
                                      if m != "<SpeechHere>" and m not in vocab}))]
    if strangers:
        yield error("prompt_tokens", f"{'; '.join(strangers)}: markers data.tokenizer={data.tokenizer} does not "
                                     f"have as one token, so the prompt is another chat format's. "
                                     f"{release.name if release else f'The {family} decoder'}'s: "
                                     f"{' '.join(data_overrides(own))}")
    size = max(vocab.values()) + 1
    if size > model.decoder.vocab_size:
        yield error("tokenizer_vocab", f"data.tokenizer={data.tokenizer} has {size} token ids but "
                                       f"model.decoder.vocab_size={model.decoder.vocab_size}: ids past the "
                                       f"embedding would fail; use the model's tokenizer or a larger vocab_size")


def _prompt_of_another_family(data: DataConfig, model: ModelConfig) -> Iterator[Finding]:
    """Where the tokenizer cannot be read here (a path only the cluster sees; a tokenizer the
    demo corpus writes later is the job's to check): a chat format and audio placeholder
    that are another family's and not this decoder's are refused all the same, since the
    job would refuse them at start (a recipe composed with another family's model)."""
    own = model.decoder.family
    if own not in PROMPTS or inside(data.tokenizer, data.demo_corpus):
        return
    settings = {"prompt_template": data.prompt_template, "audio_token": data.audio_token}

    def belongs(family: str) -> bool:
        return any(settings[key] == PROMPTS[family][key] for key in settings)

    others = [f for f in PROMPTS if f != own and PROMPTS[f] != PROMPTS[own] and belongs(f)]
    if others and not belongs(own):
        yield error("prompt_family", f"data.prompt_template={data.prompt_template!r} and data.audio_token="
                                     f"{data.audio_token!r} are the {others[0]} family's chat format, but "
                                     f"model.decoder.family={own}: its tokenizer (data.tokenizer={data.tokenizer}, "
                                     f"not on this machine: checked no further here) has another, and the job would "
                                     f"refuse them at start. The {own} decoder's: {prompt_settings(own)}")
    if data.add_bos and not PROMPTS[own]["add_bos"]:
        yield error("prompt_family", f"data.add_bos=true but the {own} family's tokenizers have no BOS token (the "
                                     f"job would refuse it at start; data.tokenizer={data.tokenizer} is not on this "
                                     f"machine): set data.add_bos=false")


def check_local_inputs(data: DataConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    """The tokenizer and the local datasets exist where the job reads them
    (orchestrator/plan/local_paths.py): refused for a job on this machine, said for a job
    on a cluster (SLURM), whose nodes may see what this machine does not."""
    datasets = [(f"data.{split}[{entry.name}].path", str(entry.path))
                for split in ("train", "validation") for entry in (getattr(data, split) or [])]
    for _, problem in missing_inputs(data.tokenizer, datasets, data.demo_corpus):
        kind = KINDS.get(launcher.kind)
        if kind is not None and kind.one_machine:
            yield error("local_paths", f"{problem}; launcher={launcher.kind} runs the job on this machine, where it "
                                       f"would stop at start: point it at what exists here (or write it first)")
        else:
            yield warning("cluster_paths", f"{problem} (seen from this machine): the job reads it on the compute "
                                           f"nodes at start, which must see it (launcher={launcher.kind})")


def check_dataset_columns(data: DataConfig) -> Iterator[Finding]:
    """Each local dataset this machine can read has the columns its entry reads (the
    job's loader refuses it at start otherwise), from its index.json."""
    for split in ("train", "validation"):
        for entry in getattr(data, split) or []:
            if tasks.entry_problems(entry, data, split):
                continue  # said by check_data
            needed = tasks.dataset_format(entry, data).required_columns()
            for path in local_dataset_dirs(str(entry.path), data.demo_corpus):
                have = index_columns(path)
                missing = [f"{column!r} ({key})" for column, key in needed if have is not None and column not in have]
                if missing:
                    yield error("dataset_columns", f"data.{split}[{entry.name}] ({path}) has no column "
                                                   f"{', '.join(missing)}; its columns: {have}. Name its columns in "
                                                   f"the entry (audio_field, text_field, instruction_field, "
                                                   f"turns_field), or data.audio_field / data.text_field for all")


def check_packing(data: DataConfig, optim: OptimConfig) -> Iterator[Finding]:
    if data.packing and data.packing_buffer < optim.micro_batch_size:
        yield error(
            "packing_buffer",
            f"data.packing_buffer ({data.packing_buffer}) is smaller than optim.micro_batch_size "
            f"({optim.micro_batch_size}): the packer needs at least one sample per row to fill a micro-batch",
        )
