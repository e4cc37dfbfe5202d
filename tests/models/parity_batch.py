"""The batch both decoder parity scripts (parity_script.py, family_parity_script.py) feed
their sharded model: whole sequences, or documents packed into one row (THD), each with
its next-token labels and a loss mask that leaves out every document's last position."""

from __future__ import annotations

import torch


def parity_batch(tokens, packed_tokens, docs, doc_lengths, packed: bool):
    """(tokens, packed_seq_params or None, positions, labels, loss_mask)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    if packed:
        cu = torch.tensor([0, doc_lengths[0], sum(doc_lengths)], dtype=torch.int32)
        psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                              max_seqlen_q=max(doc_lengths), max_seqlen_kv=max(doc_lengths))
        positions = torch.cat([torch.arange(n) for n in doc_lengths])[None]
        labels = torch.cat([torch.cat([d[:, 1:], d[:, :1]], dim=1) for d in docs], dim=1)
        loss_mask = torch.ones_like(labels, dtype=torch.float)
        loss_mask[0, doc_lengths[0] - 1] = 0.0
        loss_mask[0, -1] = 0.0
        return packed_tokens, psp, positions, labels, loss_mask
    batch, seq = tokens.shape
    positions = torch.arange(seq)[None].expand(batch, -1)
    labels = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
    loss_mask = torch.ones_like(labels, dtype=torch.float)
    loss_mask[:, -1] = 0.0
    return tokens, None, positions, labels, loss_mask
