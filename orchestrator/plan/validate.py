"""Every rule a run must satisfy, checked before anything is queued.

Megatron-LM checks most of these in `validate_args` on every rank after the job
has started; here they run on the submit side, all at once, and each message names
every value involved and how to fix it. `validate(cfg)` returns all findings;
`check(cfg)` raises ConfigInvalid when any is an error.

Each rule is a small function of the config sections it needs, yielding Findings; they
live in orchestrator/plan/rules/ by group (topology, model, data, run, lora), and this
module runs them all in one order.
"""

from __future__ import annotations

from typing import Callable, Iterable

from orchestrator.plan.rules.data import (check_data, check_dataset_columns, check_local_inputs, check_packing,
                                          check_tokenizer)
from orchestrator.plan.rules.findings import ERROR, ConfigInvalid, Finding
from orchestrator.plan.rules.lora import check_lora, check_lr_group_fields, check_lr_groups_against_params, named_params
from orchestrator.plan.rules.model import (check_adapter, check_backend, check_compile, check_decoder, check_encoder,
                                           check_init_checkpoint, check_spec_augment,
                                           check_trained_encoder_precision)
from orchestrator.plan.rules.run import (check_ctc, check_eval_generation, check_launcher, check_logger, check_optim,
                                         check_own_experiment, check_profile, check_train)
from orchestrator.plan.rules.topology import (check_batch, check_canonical_nodes, check_context_parallel,
                                              check_distributed_optimizer, check_heads, check_layers,
                                              check_rank_order, check_recompute, check_sequence,
                                              check_sequence_parallel, check_sizes, check_world_size)
from orchestrator.plan.schema import AudioLLMConfig


def validate(cfg: AudioLLMConfig, purpose: str = "plan") -> list[Finding]:
    """All findings for `cfg` (errors and warnings). purpose: plan | train."""
    p, m, l = cfg.parallel, cfg.model, cfg.launcher
    rules: list[Callable[[], Iterable[Finding]]] = [
        lambda: check_sizes(p, l),
        lambda: check_world_size(p, l),
        lambda: check_rank_order(p),
        lambda: check_heads(p, m),
        lambda: check_layers(p, m),
        lambda: check_sequence(p, cfg.data, m),
        lambda: check_sequence_parallel(p),
        lambda: check_context_parallel(p, cfg.data),
        lambda: check_batch(p, l, cfg.optim),
        lambda: check_canonical_nodes(p, l, cfg.data, cfg.optim),
        lambda: check_recompute(p, m),
        lambda: check_distributed_optimizer(p, l),
        lambda: check_decoder(m),
        lambda: check_encoder(m),
        lambda: check_adapter(m),
        lambda: check_spec_augment(m),
        lambda: check_backend(m, l),
        lambda: check_compile(m, p),
        lambda: check_trained_encoder_precision(m, cfg.lora, l),
        lambda: check_init_checkpoint(m, cfg.lora),
        lambda: check_data(cfg.data, m, purpose),
        lambda: check_packing(cfg.data, cfg.optim),
        lambda: check_tokenizer(cfg.data, m, purpose),
        lambda: check_local_inputs(cfg.data, l),
        lambda: check_dataset_columns(cfg.data),
        lambda: check_own_experiment(cfg.recipe, cfg.run),
        lambda: check_optim(cfg.optim, cfg.train),
        lambda: check_train(cfg.train, cfg.run),
        lambda: check_profile(cfg.train, l),
        lambda: check_eval_generation(cfg.train, cfg.data, p),
        lambda: check_ctc(m, p, cfg.train),
        lambda: check_launcher(l),
        lambda: check_logger(cfg.logger),
        lambda: check_lora(cfg.lora, m),
        lambda: check_lr_group_fields(cfg.lora),
    ]
    findings = [f for rule in rules for f in rule()]
    # Parameter names are only meaningful once the model's own fields are valid.
    if not any(f.severity == ERROR and f.rule in ("decoder", "encoder", "adapter", "lora", "lora_targets", "lora_rank")
               for f in findings):
        findings += list(check_lr_groups_against_params(cfg.lora, named_params(m, cfg.lora, p.tp), m.name))
    return findings


def check(cfg: AudioLLMConfig, purpose: str = "plan") -> list[Finding]:
    """Raise ConfigInvalid if any finding is an error; return the warnings otherwise."""
    findings = validate(cfg, purpose)
    if any(f.severity == ERROR for f in findings):
        raise ConfigInvalid(findings)
    return findings
