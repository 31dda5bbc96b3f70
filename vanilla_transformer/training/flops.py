"""How much arithmetic a training step is: the model FLOPs behind MFU and the cost estimates.

`forward_flops` counts the floating-point operations of the matrix multiplications of one forward
pass over a batch of sentence pairs (2 per multiply-add; padding excluded), layer by layer as the
model computes them (§3): per layer the query/key/value/output projections, the attention scores
Q K^T and their weighted sum with V over the whole (unmasked-by-skipping) length, the two FFN
matrices; the decoder's cross-attention projects the source once per layer; and the pre-softmax
projection over the target vocabulary. Element-wise work (softmax, LayerNorm, dropout, the loss) is
left out, as usual for MFU (Chowdhery et al., 2022, appendix B). A training step is three forward
passes' worth (the backward pass costs two).
"""

from __future__ import annotations

from collections.abc import Sequence


def forward_flops(config, source_lengths: Sequence[float], target_lengths: Sequence[float]) -> float:
    """Matrix-multiply FLOPs of one forward pass over pairs with these lengths (tokens, ``</s>`` included)."""
    d = config.d_model
    source, target = sum(source_lengths), sum(target_lengths)
    source_square = sum(s * s for s in source_lengths)
    target_square = sum(t * t for t in target_lengths)
    cross = sum(s * t for s, t in zip(source_lengths, target_lengths, strict=True))

    def inner(heads: int) -> int:  # width of the concatenated heads, h * d_k
        return heads * (config.head_dim or d // heads)

    encoder_inner, decoder_inner = inner(config.encoder_attention_heads), inner(config.decoder_attention_heads)
    encoder_layer = (
        2 * source * d * encoder_inner * 4  # q, k, v, out projections
        + 2 * 2 * encoder_inner * source_square  # Q K^T and weights x V
        + 2 * 2 * source * d * config.encoder_ffn_dim  # FFN: d -> d_ff -> d
    )
    decoder_layer = (
        2 * target * d * decoder_inner * 4
        + 2 * 2 * decoder_inner * target_square  # masked self-attention
        + 2 * target * d * decoder_inner * 2
        + 2 * source * d * decoder_inner * 2  # cross: q, out | k, v
        + 2 * 2 * decoder_inner * cross  # cross-attention scores and weighted sum
        + 2 * 2 * target * d * config.decoder_ffn_dim
    )
    output_projection = 2 * target * d * config.decoder_vocab_size
    return config.encoder_layers * encoder_layer + config.decoder_layers * decoder_layer + output_projection


def training_flops(config, source_lengths: Sequence[int], target_lengths: Sequence[int]) -> int:
    """FLOPs of one training step (forward + backward, the backward costing twice the forward)."""
    return 3 * forward_flops(config, source_lengths, target_lengths)


def training_flops_per_target_token(config, source_length: float, target_length: float) -> float:
    """Training FLOPs per target token for pairs of these (mean) lengths, e.g. WMT14's."""
    return training_flops(config, [source_length], [target_length]) / target_length


def matmul_flops_per_second(
    size: int = 1024, repeats: int = 15, clock=None, warmup_seconds: float = 0.5
) -> list[float]:
    """This machine's float32 matrix-multiply throughput now: FLOP/s of ``repeats`` square products of
    ``size``, each timed by ``clock`` (``time.perf_counter`` by default), after untimed products for
    ``warmup_seconds`` (at least one: a fresh process's first products run slower). Their best is the
    peak behind MFU; their median, taken before and after a timed run, says whether the machine was as
    fast as in another run (consecutive medians differ by up to about 5% on a 2-core cloud machine)."""
    import time

    import torch

    clock = clock or time.perf_counter
    a, b = torch.randn(size, size), torch.randn(size, size)
    started = clock()
    a @ b
    while clock() - started < warmup_seconds:
        a @ b
    seconds = []
    for _ in range(repeats):
        started = clock()
        a @ b
        seconds.append(clock() - started)
    return [2 * size**3 / s for s in seconds]
