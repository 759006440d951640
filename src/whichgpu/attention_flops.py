"""FLOPs of scaled dot-product attention from its shapes, grouped-query attention included.

torch's own formulas (``torch.utils.flop_counter.sdpa_flop_count``) assert before torch 2.13
when key and value have fewer heads than the query, as in every Llama 3, Qwen or Mistral
model, which calls ``scaled_dot_product_attention`` with ``enable_gqa=True``. These formulas
count that work as attention with the query's head count (each key/value head serves
``h_q / h_kv`` query heads) and otherwise agree with torch's. The tracer counts its CPU fused
attention with them and the bench its fused kernels, so both count the same FLOPs on every
supported torch. No torch is imported here.
"""

from __future__ import annotations

from collections.abc import Sequence

Shape = Sequence[int]
"""A tensor's shape, ``(batch, heads, sequence, head_dim)`` for attention."""


def attention_flops(query: Shape, key: Shape, value: Shape) -> int:
    """FLOPs of scaled dot-product attention's forward pass: the scores ``Q K^T`` and the
    output ``P V``, ``2 x b x h_q x s_q x s_k x (d_qk + d_v)`` (``4 b h s_q s_k d`` when the
    head dims agree). Key and value may have fewer heads than the query (grouped-query
    attention): each key/value head serves ``h_q / h_kv`` query heads, so the work is that of
    attention with ``h_q`` heads. The causal mask is not subtracted (torch's convention)."""
    b, h_q, s_q, d_qk, s_k, d_v = _attention_sizes(query, key, value)
    return 2 * b * h_q * s_q * s_k * (d_qk + d_v)


def attention_backward_flops(grad_out: Shape, query: Shape, key: Shape, value: Shape) -> int:
    """FLOPs of scaled dot-product attention's backward pass, as torch counts them: the
    scores recomputed (``Q K^T``), the gradients of the probabilities and of V (two GEMMs over
    ``d_v``) and those of Q and K (two over ``d_qk``): ``2 b h_q s_q s_k (3 d_qk + 2 d_v)``,
    grouped-query attention at the query's head count (see ``attention_flops``)."""
    b, h_q, s_q, d_qk, s_k, d_v = _attention_sizes(query, key, value)
    if tuple(grad_out) != (b, h_q, s_q, d_v):
        raise ValueError(
            f"attention backward: the output gradient's shape {tuple(grad_out)} is not the "
            f"output's ({b}, {h_q}, {s_q}, {d_v})"
        )
    return 2 * b * h_q * s_q * s_k * (3 * d_qk + 2 * d_v)


def _attention_sizes(query: Shape, key: Shape, value: Shape) -> tuple[int, int, int, int, int, int]:
    """``b, h_q, s_q, d_qk, s_k, d_v`` of an attention call, its shapes checked."""
    if not len(query) == len(key) == len(value) == 4:
        raise ValueError(
            "attention: query, key and value must be (batch, heads, sequence, head_dim), got "
            f"{tuple(query)}, {tuple(key)}, {tuple(value)}"
        )
    b, h_q, s_q, d_qk = (int(n) for n in query)
    b_k, h_kv, s_k, d_k = (int(n) for n in key)
    b_v, h_v, s_v, d_v = (int(n) for n in value)
    if not (b == b_k == b_v and h_kv == h_v and s_k == s_v and d_qk == d_k):
        raise ValueError(
            "attention: query, key and value shapes do not go together: "
            f"{tuple(query)}, {tuple(key)}, {tuple(value)}"
        )
    if h_kv < 1 or h_q % h_kv:
        raise ValueError(
            f"attention: the query's {h_q} heads are not a multiple of the key/value's {h_kv}"
        )
    return b, h_q, s_q, d_qk, s_k, d_v
