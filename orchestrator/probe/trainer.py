"""The job's Trainer, stepped on fake tensors: everything the job builds (chunks, LoRA,
freezes, lr groups, DDP, megatron's optimizer) and megatron's pipeline schedule, minus
what reads tensor values, which fake tensors do not have (the NaN check of the loss,
the step's metrics)."""

from __future__ import annotations

import contextlib
import functools

from orchestrator.plan.model_params import model_name
from orchestrator.train.loop import Trainer


@contextlib.contextmanager
def _no_gloo_optimizer():
    """megatron's optimizer asks for the gloo copies of the data-parallel groups by
    default; a fake world has none (fake_world)."""
    import megatron.core.optimizer as optimizer

    original = optimizer.get_megatron_optimizer
    optimizer.get_megatron_optimizer = functools.partial(original, use_gloo_process_groups=False)
    try:
        yield
    finally:
        optimizer.get_megatron_optimizer = original


def component_of(name: str) -> str:
    """The plan's component of a parameter name (orchestrator.plan.model_params.ParamSpec)."""
    if name.startswith("encoder."):
        return "encoder"
    if name.startswith("adapter."):
        return "adapter"
    if name.startswith(("language_model.embedding.", "language_model.output_layer.")):
        return "embedding"
    return "decoder"


class ProbeTrainer(Trainer):
    def __init__(self, *args, **kwargs):
        with _no_gloo_optimizer():
            super().__init__(*args, **kwargs)
        for chunk in self.chunks:  # the gradients' NaN check reads their values
            chunk.ddp_config.check_for_nan_in_grad = False
        self.memory = None
        self.compiled_graphs = 0  # graphs dynamo captured: one per layer variant, not per layer

    def _compile_backend(self):
        from orchestrator.probe.compiled import counting_backend

        backend = counting_backend(lambda: self.memory)  # set by probe_step; None until then

        def compile_graph(graph, example_inputs):  # dynamo calls it once per graph it captures
            self.compiled_graphs += 1
            return backend(graph, example_inputs)

        return compile_graph

    def _resumable_checkpoint(self):
        return None  # the probe measures a fresh step: it never reads the run's checkpoints

    def weights(self) -> list:
        return [p for chunk in self.chunks for p in chunk.parameters()]

    def grad_buffers(self) -> list:
        return [buffer.grad_data for chunk in self.chunks
                for buffer in list(chunk.buffers) + list(chunk.expert_parallel_buffers)]

    def parameter_counts(self) -> dict:
        by_component: dict[str, int] = {}
        total = trainable = 0
        for chunk in self.unwrapped:
            for name, param in chunk.named_parameters():
                name = model_name(name)
                total += param.numel()
                trainable += param.numel() if param.requires_grad else 0
                component = component_of(name)
                by_component[component] = by_component.get(component, 0) + param.numel()
        return {"total": total, "trainable": trainable, "by_component": by_component}

    def track_modules(self, memory, depth: int = 3) -> None:
        """Tells `memory` which module's forward runs: the first `depth` parts of its name
        (language_model.decoder.layers, encoder.layers, adapter, ...). Not inside a compiled
        region: dynamo would trace the hooks into each layer's graph and guard on the module
        (its id) and on `memory.where`, compiling every layer anew (the job compiles one graph
        per layer variant). The layers' own module calls stay eager around their graphs
        (orchestrator.models.compile), so a graph's tensors count under its layer."""
        import torch
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        names = {}
        for chunk in self.unwrapped:
            for name, module in chunk.named_modules():
                names[id(module)] = ".".join(name.split(".")[:depth]) or "(chunk)"
        stack = []

        def enter(module, args):
            if torch.compiler.is_compiling():
                return
            if id(module) in names:
                stack.append(memory.where)
                memory.where = names[id(module)]

        def leave(module, args, output):
            if torch.compiler.is_compiling():
                return
            if id(module) in names:
                memory.where = stack.pop()

        register_module_forward_pre_hook(enter)
        register_module_forward_hook(leave)

    def fake_forward(self, fake_mode) -> None:
        """The model chunks' forward runs under `fake_mode`; the provider's work around it
        (placeholder checks, context-parallel frame routing, CTC targets: host tensors made
        and read on the host) runs for real (_forward_step)."""
        for chunk in self.chunks:
            def forward(*args, _forward=chunk.forward, **kwargs):
                with fake_mode:
                    return _forward(*args, **kwargs)

            chunk.forward = forward

    def _forward_step(self, data_iterator, model):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        self.memory.phase, self.memory.where = "forward", "(data and inputs)"
        try:
            with unset_fake_temporarily():
                return super()._forward_step(data_iterator, model)
        finally:
            self.memory.phase, self.memory.where = "backward", ""

    def _finalize_with_loss_check(self, model, num_tokens=None, **kwargs):
        # The loss statistics and the token count hold values (megatron divides the gradients
        # by the count where it is positive, in place): neither changes what memory holds.
        self._local_stats = []
        return self._finalize(model, None, **kwargs)

    def probe_step(self, memory, forward_backward: bool = True) -> None:
        """train_step's work: zeroed gradient buffers, the schedule over the plan's
        micro-batches, the optimizer step. `forward_backward=False`: the optimizer's step
        alone, on the zeroed gradients: it makes the optimizer's state (Adam's moments,
        fp32 main copies) that every later step holds, without a forward/backward whose
        memory is all freed by the step's end (the measured step makes and frees the same)."""
        self.memory = memory
        self.stats_for_batch = self.stats
        from torch.utils._python_dispatch import _disable_current_modes

        microbatches = []
        if forward_backward:
            with _disable_current_modes():  # the data side works on the host, on real tensors
                microbatches = [self.components.train_source.next_microbatch()
                                for _ in range(self.plan.num_microbatches)]
        for chunk in self.chunks:
            chunk.train()
            chunk.zero_grad_buffer()
        for chunk in self.unwrapped:
            # HF's Whisper encoder draws its layerdrop in training mode (a value); the job's
            # has every dropout and the layerdrop at 0 (speech.whisper_encoder_config), so
            # in evaluation mode it computes and keeps the same.
            if getattr(chunk, "encoder", None) is not None:
                chunk.encoder.eval()
        self.optimizer.zero_grad()
        if forward_backward:
            self._run_schedule(microbatches, forward_only=False)
        memory.phase = "optimizer"
        self.optimizer.step()
        memory.phase = "idle"
