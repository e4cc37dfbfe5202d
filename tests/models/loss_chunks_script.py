"""DecoderModel.softcapped_loss in sequence chunks (as at full vocabulary size) equals the
whole-sequence loss, and so do its gradients: run by tests/models/test_loss_chunks.py on
one process (megatron's parallel state needs a process group)."""

import torch

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown


def main():
    init_distributed(ParallelDims(), seed=0)
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.models.decoder_model import DecoderModel
    from tests.models.tiny_models import decoder_config, hf_gemma2, hf_llama

    dec = decoder_config(hf_gemma2(seed=0).config)
    model = DecoderModel(decoder_transformer_config(dec), dec.vocab_size, dec.max_position_embeddings,
                        rope_theta=dec.rope_theta)
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(1, dec.vocab_size, (2, 64), generator=gen)
    positions = torch.arange(64)[None].expand(2, -1)
    labels = torch.roll(tokens, -1, dims=1)
    vocab = model.vocab_size  # padded

    def run(chunk_tokens):
        model.zero_grad(set_to_none=True)
        model.loss_chunk_elements = chunk_tokens * 2 * vocab
        loss = model(tokens, positions, None, labels=labels)
        loss.sum().backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    whole, whole_grads = run(64)
    for chunk_tokens in (5, 16):
        chunked, grads = run(chunk_tokens)
        assert torch.equal(chunked, whole), (chunk_tokens, (chunked - whole).abs().max())
        worst = max((grads[n] - g).abs().max().item() for n, g in whole_grads.items())
        print(f"RESULT chunk {chunk_tokens}: loss equal, max grad diff {worst:.3e}")
        assert worst == 0.0
    print(f"RESULT loss mean {whole.mean():.4f}")

    # The gradient the output layer's backward receives is one [s*b, v] matrix (the
    # layout torch's matmul multiplies by the weight in one product), at micro-batch
    # sizes 1 and 2, chunked or not; as megatron hands it on (a transposed view) torch
    # 2.11 runs a batched matmul over s broadcast copies of the [v, h] weight.
    layouts = []

    def watch(module, args, out):  # before the model's own hook: on the linear's own output
        out[0].register_hook(lambda g: layouts.append((tuple(g.shape), g.stride())))

    model.output_layer.register_forward_hook(watch, prepend=True)
    for rows in (1, 2):
        for chunk_tokens in (5, 64):
            model.loss_chunk_elements = chunk_tokens * rows * vocab
            model(tokens[:rows], positions[:rows], None, labels=labels[:rows]).sum().backward()
    for (s, b, v), stride in layouts:
        assert stride[0] == stride[1] * b and stride[2] == 1, ((s, b, v), stride)
    print(f"RESULT output layer gradient one matrix in {len(layouts)} of 4 backwards: {layouts}")

    # A decoder without a softcap, its vocabulary a multiple of 128 (nothing padded), at
    # micro-batch size 1: the logits megatron's cross entropy changes in place are a tensor of
    # their own, chunked or not (at full vocabulary size a Llama, Qwen or Voxtral run is
    # chunked; autograd refused the view the loss was handed).
    dec = decoder_config(hf_llama(seed=0, vocab_size=256).config)
    model = DecoderModel(decoder_transformer_config(dec), dec.vocab_size, dec.max_position_embeddings,
                        rope_theta=dec.rope_theta, tie_embeddings=dec.tie_embeddings)
    assert model.vocab_size == model.real_vocab_size == 256
    for chunk_tokens in (64, 5):
        model.zero_grad(set_to_none=True)
        model.loss_chunk_elements = chunk_tokens * model.vocab_size
        loss = model(tokens[:1] % 256, positions[:1], None, labels=labels[:1] % 256)
        loss.sum().backward()
        if chunk_tokens == 64:
            whole, whole_grads = loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    worst = max((p.grad - whole_grads[n]).abs().max().item() for n, p in model.named_parameters())
    assert torch.equal(loss.detach(), whole) and worst == 0.0, worst
    print("RESULT no softcap, micro-batch 1: chunked loss and gradients equal the whole")
    shutdown()


if __name__ == "__main__":
    main()
