"""Batches by token count (§5.1), the way fairseq's ``--max-tokens`` makes them.

"Each training batch contained a set of sentence pairs containing approximately 25000 source tokens
and 25000 target tokens." The Trainer only knows a fixed number of sentences per batch, which with
sentences of 3 to 200 tokens wastes most of a batch on padding or runs out of memory on the longest
one. `TokenBatchSampler` sorts the examples by length and packs them greedily, so that a batch's
*padded* size (sentences x longest side, what memory depends on) stays within ``max_tokens``; the
batches are shuffled each epoch.

Lengths come in as one array (e.g. the ``source_length``/``target_length`` columns of an Arrow
dataset) and the batches are kept as two integer arrays, not as Python lists: a sampler over the
4.5M pairs of WMT14 en-de costs tens of megabytes, not gigabytes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

logger = logging.getLogger(__name__)


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def length_pairs(lengths) -> np.ndarray:
    """``(N, 2)`` int64 array of (source, target) lengths from ints (both sides) or pairs, checked >= 1."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.numpy()
    if isinstance(lengths, np.ndarray) and lengths.dtype.kind in "iu" and lengths.ndim in (1, 2):
        array = lengths.astype(np.int64)
    else:
        array = np.array([_one_length(item, index) for index, item in enumerate(lengths)], dtype=np.int64)
    if array.ndim == 1:
        array = np.stack([array, array], axis=1)
    if array.ndim != 2 or array.shape[1] != 2:
        raise ValueError(f"lengths must be one int or a (source, target) pair per example, got shape {array.shape}.")
    if len(array) and (bad := np.flatnonzero(array.min(axis=1) < 1)).size:
        raise ValueError(
            f"Length of example {bad[0]} must be a positive int or a (source, target) pair of positive ints, got "
            f"{tuple(array[bad[0]])}; drop empty examples first (the data module's length filter does)."
        )
    return array


def _one_length(item, index: int) -> tuple[int, int]:
    """(source, target) of one example; ints, numpy and torch integers count, bools and strings do not."""
    try:
        if isinstance(item, (bool, str)):
            raise TypeError
        if isinstance(item, (int, np.integer)) or (isinstance(item, torch.Tensor) and item.ndim == 0):
            return int(item), int(item)
        source, target = item
        if any(isinstance(side, (bool, str, float)) for side in (source, target)):
            raise TypeError
        return int(source), int(target)
    except (TypeError, ValueError):
        raise ValueError(
            f"Length of example {index} must be a positive int or a (source, target) pair of positive ints, "
            f"got {item!r}."
        ) from None


def pack(lengths: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Sort by (source, target) length and cut greedily into batches of at most ``max_tokens`` padded tokens.

    Returns ``(order, starts)``: batch ``b`` is ``order[starts[b]:starts[b + 1]]`` (with
    ``starts[-1] == len(order)``).
    """
    order = np.lexsort((lengths[:, 1], lengths[:, 0]))  # stable: ties keep dataset order
    longest = lengths.max(axis=1)[order]
    if (too_long := np.flatnonzero(longest > max_tokens)).size:
        index = order[too_long[0]]
        raise ValueError(
            f"Example {index} has {longest[too_long[0]]} tokens (source {lengths[index, 0]}, target "
            f"{lengths[index, 1]}), more than max_tokens={max_tokens}, so it fits in no batch; drop long "
            "examples with the length filter (max_source_length/max_target_length) or raise max_tokens."
        )
    starts, size, batch_longest = [0], 0, 0
    for position, length in enumerate(longest.tolist()):
        # Padded size if this example joins: every row is padded to the batch's longest side.
        if size and (size + 1) * max(batch_longest, length) > max_tokens:
            starts.append(position)
            size, batch_longest = 0, 0
        size += 1
        batch_longest = max(batch_longest, length)
    starts.append(len(order))
    return order, np.asarray(starts, dtype=np.int64)


class TokenBatchSampler(Sampler[list[int]]):
    """Batch sampler that fills batches up to a number of padded tokens, like fairseq's --max-tokens.

    Examples are sorted by (source, target) length and packed greedily, so each batch holds
    sentences of similar length and ``len(batch) * longest side in the batch <= max_tokens``.
    The batches are fixed at construction; each epoch only their order changes, shuffled with
    ``seed + epoch`` (call `set_epoch` every epoch, as with ``DistributedSampler``; the Trainer and
    accelerate do). Every example is in exactly one batch.

    Data parallel: every rank builds the same batches and the same shuffled order; rank ``r`` takes
    batches ``r, r + num_replicas, ...``. So that all ranks take the same number of steps, the list
    is padded by repeating batches from its start when its length is not a multiple of
    ``num_replicas`` (as ``DistributedSampler`` does; those few examples are seen twice that epoch),
    or, with ``drop_last=True``, the last ``len % num_replicas`` batches of the shuffled list are
    left out that epoch (different ones each epoch when shuffling).

    Do not shard twice: ``accelerate.prepare`` (used by the Trainer) already splits a batch sampler
    across processes the same way, so there keep ``num_replicas=1``.

    Args:
        lengths: per example, ``(source_length, target_length)`` or one int for both, in tokens: a
            sequence, or an ``(N,)`` / ``(N, 2)`` integer array or tensor.
        max_tokens: the most padded tokens per batch, per side (the paper: about 25000).
        shuffle: shuffle the order of the batches each epoch; otherwise shortest first.
        seed: base of the shuffling seed; must be the same on every rank.
        num_replicas, rank: number of data-parallel processes and this one's index.
        drop_last: drop batches that do not divide evenly among ranks instead of repeating some.
    """

    def __init__(
        self,
        lengths: Sequence[int] | Sequence[tuple[int, int]] | np.ndarray | torch.Tensor,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ):
        _positive_int("max_tokens", max_tokens)
        _positive_int("num_replicas", num_replicas)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be an int in [0, {num_replicas}), got {rank!r}.")
        if len(lengths) == 0:
            raise ValueError("lengths is empty: there is nothing to batch.")
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.num_replicas, self.rank, self.drop_last = num_replicas, rank, drop_last
        self.epoch = 0
        self.order, self.starts = pack(length_pairs(lengths), max_tokens)
        if drop_last and self.num_batches < num_replicas:
            logger.warning(
                f"Only {self.num_batches} batches for {num_replicas} replicas with drop_last=True: "
                "every rank gets no batch at all; lower max_tokens or set drop_last=False."
            )

    @property
    def num_batches(self) -> int:
        """The number of batches over all ranks, before any padding or dropping."""
        return len(self.starts) - 1

    def batch(self, index: int) -> list[int]:
        """The example indices of batch ``index`` (in length-sorted batch order)."""
        return self.order[self.starts[index]:self.starts[index + 1]].tolist()

    @property
    def batches(self) -> list[list[int]]:
        """Every batch in length-sorted order (for inspection; iterating does not build this list)."""
        return [self.batch(index) for index in range(self.num_batches)]

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which (with the seed) decides the order of the batches."""
        self.epoch = epoch

    @property
    def sampler(self) -> "TokenBatchSampler":
        """Itself, so that accelerate reaches `set_epoch` after wrapping this sampler for data parallelism.

        ``DataLoaderShard.set_epoch`` looks for ``set_epoch`` on the batch sampler, then on
        ``.batch_sampler.sampler``; its ``BatchSamplerShard`` wrapper has none, so without this the
        batch order would be the same every epoch on every process.
        """
        return self

    def _epoch_order(self) -> np.ndarray:
        """Batch indices in this epoch's order, identical on every rank."""
        if not self.shuffle:
            return np.arange(self.num_batches)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_batches, generator=generator).numpy()

    def _rank_order(self) -> np.ndarray:
        order = self._epoch_order()
        if self.drop_last:
            order = order[: len(self) * self.num_replicas]
        else:
            padding = len(self) * self.num_replicas - len(order)
            order = np.concatenate([order, np.resize(order, padding)])  # repeats from the start, cycling
        return order[self.rank::self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        for batch_index in self._rank_order().tolist():
            yield self.batch(batch_index)

    def __len__(self) -> int:
        """The number of batches this rank yields per epoch."""
        if self.drop_last:
            return self.num_batches // self.num_replicas
        return math.ceil(self.num_batches / self.num_replicas)
