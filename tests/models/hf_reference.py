"""The HF side of a decoder parity case (tests/models/parity_script.py for Gemma2,
family_parity_script.py for every family): the HF model's weights in megatron's names,
random token rows and packed documents, and HF's logits and loss on both."""

import torch

from orchestrator.convert.decoder_mapping import DecoderShape
from tests.models.sharding import hf_to_megatron_full
from tests.models.tiny_models import decoder_config


def hf_reference(hf, batch: int, seq: int, docs: tuple, seed: int = 1) -> dict:
    """{hf, shape, dec (the model.decoder section), full (megatron weights, unsharded),
    tokens [batch, seq], packed_tokens [1, sum(docs)], docs (its documents), ref and
    packed_ref ((logits, loss) of HF: the packed loss per token over both documents, each
    predicting its length - 1 tokens)}."""
    shape = DecoderShape.from_hf_config(hf.config)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape.vocab_size, (batch, seq), generator=gen)
    packed_tokens = torch.randint(0, shape.vocab_size, (1, sum(docs)), generator=gen)
    with torch.no_grad():
        ref = hf(tokens, labels=tokens)
        split = torch.split(packed_tokens, list(docs), dim=1)
        doc_out = [hf(d, labels=d) for d in split]
        packed_ref = (torch.cat([o.logits for o in doc_out], dim=1),
                      sum(o.loss * (d.shape[1] - 1) for o, d in zip(doc_out, split)) / (sum(docs) - len(docs)))
    return dict(hf=hf, shape=shape, dec=decoder_config(hf.config), full=hf_to_megatron_full(hf.state_dict(), shape),
                tokens=tokens, packed_tokens=packed_tokens, docs=split, ref=(ref.logits, ref.loss),
                packed_ref=packed_ref)
