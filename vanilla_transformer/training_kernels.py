"""The two training-time computations of §5.4 that the model file calls, written to be fast on the CPU:
dropout (`UniformMaskDropout`) and the label-smoothed cross-entropy (`label_smoothed_cross_entropy`).

Both give what torch's own functions give (the same distribution, the same loss and gradient); they differ in
how they compute it. The file loads as Hub remote code beside the model files (flat, torch only).
"""

from __future__ import annotations

import numbers

import torch
from torch import nn


class UniformMaskDropout(nn.Dropout):
    """``nn.Dropout`` whose mask, on CPU, is drawn with ``torch.rand`` instead of ``bernoulli_``.

    The same distribution: each unit kept with probability 1 - p (a uniform float is >= p with that
    probability, to float precision) and scaled by 1 / (1 - p). On CPU ``F.dropout`` draws with
    ``bernoulli_``, about three times slower than ``torch.rand``, and dropout was a tenth of a training
    step; here the uniform draws become the scaled mask in place (kept for the backward in the units' type,
    2 or 4 bytes a unit where ``F.dropout`` keeps 1). Other devices keep ``F.dropout``'s fused kernel.
    """

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:  # the identity, as F.dropout returns it, without the call
            return hidden_states
        if hidden_states.device.type != "cpu" or not 0 < self.p < 1:
            return super().forward(hidden_states)
        # 0 or 1 / (1 - p), drawn in float32 whatever the units' type: a bf16 uniform takes too few values
        mask = torch.rand(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
        mask = mask.ge_(self.p).mul_(1 / (1 - self.p))
        return hidden_states * mask.to(hidden_states.dtype)


def check_label_smoothing(label_smoothing) -> None:
    """A smoothing in [0, 1) (§5.4: 0.1); a tensor passes unread (no device read in a training step)."""
    if isinstance(label_smoothing, numbers.Real) and not 0 <= label_smoothing < 1:
        raise ValueError(f"label_smoothing must be in [0, 1) (the paper: 0.1), got {label_smoothing}.")


def label_smoothed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    always_scale: bool = False,
) -> torch.Tensor:
    """Per-token cross-entropy with label smoothing (§5.4), summed and divided by the number of tokens.

    ``(1 - eps) * -log p(y) + eps * mean over the vocabulary of -log p`` (Szegedy et al., 2016, and
    ``cross_entropy(label_smoothing=eps)``: eps spread over all V entries, the true one included; fairseq
    spreads it over the other V - 1, a difference of eps / V per entry); labels of -100 are ignored. The
    sum is divided by ``num_items_in_batch`` when given (the Trainer's count of target tokens in the
    whole accumulated batch, over all processes), else by this batch's tokens: every token weighs
    the same however the tokens fall into micro-batches. With ``label_smoothing=0`` it is the
    negative log-likelihood per token, whose exp is the perplexity. Computed by `ChunkedSmoothedCrossEntropy`
    (under ``torch.compile`` by ``cross_entropy``, which the compiler fuses itself). ``always_scale``: the
    backward multiplies the gradient by the incoming one even where that is 1 (``loss.backward()``), instead of
    reading it on the host to skip the multiply (the training lever ``--sync_free_step``).
    """
    check_label_smoothing(label_smoothing)
    labels = labels.to(logits.device)
    count = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum().clamp(min=1)
    count = count.to(logits.device) if torch.is_tensor(count) else count
    logits, labels = logits.flatten(0, -2), labels.flatten()
    if torch.compiler.is_compiling():
        total = nn.functional.cross_entropy(
            logits.float(), labels, ignore_index=-100, reduction="sum", label_smoothing=label_smoothing
        )
        return total / count
    return ChunkedSmoothedCrossEntropy.apply(logits, labels, label_smoothing, count, always_scale)


class ChunkedSmoothedCrossEntropy(torch.autograd.Function):
    """`label_smoothed_cross_entropy` over rows of logits (N, V), with its gradient computed in the same pass.

    Per row, with L = log sum_v exp(x_v): loss = L - (1 - eps) x_y - eps mean_v(x_v), and gradient
    softmax(x) - (1 - eps) onehot(y) - eps / V (zero for a label of -100), both divided by the token
    count. A chunk of rows at a time (`cache_sized_row_chunks`), in float32, while the chunk is in cache:
    no (N, V) log-probability tensor, no float copy of all the logits, and the backward only scales the
    gradient (when the loss was scaled after). ``cross_entropy`` with label smoothing builds several (N, V)
    temporaries; on CPU this takes half its time (benchmarks/profile_training_step.py).
    """

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, labels: torch.Tensor, smoothing: float, count, always_scale: bool = False
    ) -> torch.Tensor:
        ctx.always_scale, ctx.dtype = always_scale, logits.dtype
        ignored = labels == -100
        targets = labels.masked_fill(ignored, 0)
        row_weight = (~ignored).float() / count
        # float16's range ends near 6e-8, and an entry (softmax - eps / V) / count is ~1e-9 at WMT's vocabulary and
        # batch: kept in float32 until the backward has scaled it by the loss scale (GradScaler's), as autocast's
        # float32 cross_entropy does; bfloat16 has float32's range
        kept = torch.float32 if logits.dtype == torch.float16 else logits.dtype
        grad = torch.empty_like(logits, dtype=kept) if ctx.needs_input_grad[0] else None
        total = logits.new_zeros((), dtype=torch.float32)
        for rows in cache_sized_row_chunks(logits):
            x = logits[rows].float()
            maximum = x.amax(dim=-1, keepdim=True)
            in_place = grad[rows] if grad is not None and grad.dtype == torch.float32 else None
            exp = torch.sub(x, maximum, out=in_place).exp_()
            normalizer = exp.sum(dim=-1, keepdim=True)
            target = x.gather(1, targets[rows, None])
            loss = maximum + normalizer.log() - (1 - smoothing) * target - smoothing * x.mean(dim=-1, keepdim=True)
            weight = row_weight[rows, None]
            total += (loss * weight).sum()
            if grad is not None:  # (softmax - eps / V) * weight, then -(1 - eps) * weight at the label
                torch.addcmul(weight * (-smoothing / x.shape[-1]), exp, weight / normalizer, out=exp)
                exp.scatter_add_(1, targets[rows, None], weight * (smoothing - 1))
                if in_place is None:
                    grad[rows] = exp
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total: torch.Tensor):
        (grad,) = ctx.saved_tensors
        if not ctx.always_scale and bool(grad_total == 1):  # loss.backward() passes 1: a host read, no multiply
            return grad.to(ctx.dtype), None, None, None, None
        return (grad * grad_total).to(ctx.dtype), None, None, None, None


def cache_sized_row_chunks(logits: torch.Tensor) -> list[slice]:
    """Slices of rows of about 2^18 elements on CPU (a core's L2 cache; measured fastest), 2^28 elsewhere."""
    elements = 2**18 if logits.device.type == "cpu" else 2**28
    step = max(1, elements // logits.shape[-1])
    return [slice(start, start + step) for start in range(0, logits.shape[0], step)]


__all__ = [
    "ChunkedSmoothedCrossEntropy",
    "UniformMaskDropout",
    "cache_sized_row_chunks",
    "label_smoothed_cross_entropy",
]
