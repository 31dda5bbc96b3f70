"""Batches by token count (§5.1), the way fairseq's ``--max-tokens`` makes them, in a few shapes.

"Each training batch contained a set of sentence pairs containing approximately 25000 source tokens
and 25000 target tokens." The Trainer only knows a fixed number of sentences per batch, which with
sentences of 3 to 200 tokens wastes most of a batch on padding or runs out of memory on the longest
one. `TokenBatchSampler` groups the examples by length so that a batch's *padded* size (sentences x
longest side, what memory depends on) stays within ``max_tokens``; the batches are shuffled each epoch.

By default a batch is cut greedily from the pairs sorted by length, as fairseq does: its rows are padded
to its own longest source and target only, so short sentences (Multi30k's ~13 tokens) waste little of it.
``pad_to_buckets=True`` bounds the shapes instead: each side is padded to a bucket length (multiples of 8,
about 10% apart above 80 tokens) and the batches of one (source bucket, target bucket) cell have one number
of rows, so an epoch of WMT14 has a few dozen distinct (rows, source length, target length) shapes instead
of one per batch. That is what a compiled graph per shape (``torch.compile`` with static shapes) needs; the
price is the padding to the bucket: about 11% of the tokens on WMT-like lengths (``python
benchmarks/gpu.py --shapes-only``) and 15% of the sentences of a Multi30k batch. `PadToBucket` pads a
collated batch to its shape.

Lengths come in as one array (e.g. the ``source_length``/``target_length`` columns of an Arrow
dataset) and the batches are kept as integer arrays, not as Python lists: a sampler over the
4.5M pairs of WMT14 en-de costs tens of megabytes, not gigabytes.
"""

from __future__ import annotations

import hashlib
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


BUCKET_WIDTH = 8  # lengths are padded to multiples of 8 at least: tensor cores take dimensions in eights
BUCKET_GROWTH = 1.1  # above 80 tokens the buckets widen with the length, 10% each (padding about 5% there)


def bucket_lengths(longest: int, width: int = BUCKET_WIDTH, growth: float = BUCKET_GROWTH) -> np.ndarray:
    """The padded lengths: 8, 16, ..., 80, then about 10% apart in multiples of 8 (88, 104, 120, ...), up to
    ``longest``. Every batch side is padded to one of them, so a corpus gives a few dozen shapes."""
    grid = [width]
    while grid[-1] < longest:
        grid.append(max(grid[-1] + width, -(-int(grid[-1] * growth) // width) * width))
    return np.asarray(grid, dtype=np.int64)


def bucket_length(length: int, max_tokens: int, width: int = BUCKET_WIDTH, growth: float = BUCKET_GROWTH) -> int:
    """The length a batch side whose longest sentence has ``length`` tokens is padded to, at most ``max_tokens``
    (a `TokenBatchSampler`'s `longest`)."""
    return min(int(bucket_lengths(length, width, growth)[-1]), max_tokens)


def pack(
    lengths: np.ndarray,
    max_tokens: int,
    width: int = BUCKET_WIDTH,
    growth: float = BUCKET_GROWTH,
    max_length: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token batches whose shapes come from a small set: ``(order, starts, shapes)``.

    Each side of an example is padded to its bucket (`bucket_lengths`, at most ``max_tokens`` and
    ``max_length``, the positions the model has: a bucket past them would not fit it); the
    pairs of one (source bucket, target bucket) cell go into batches of exactly
    ``max_tokens // max(source bucket, target bucket)`` rows, so that every batch of a cell has the
    same shape. A cell's remainder (fewer examples than a batch) waits for the next cell that is at
    least as long on both sides and fills its batches first; what no cell takes at the end is packed
    greedily. Each batch holds one example of its own cell, so its shape is the bucket of its longest
    source and its longest target (what `PadToBucket` pads to).

    Batch ``b`` is ``order[starts[b]:starts[b + 1]]`` (``starts[-1] == len(order)``), padded to
    ``shapes[b] = (rows, source length, target length)``; batches are sorted by shape, shortest first.
    """
    _refuse_too_long(lengths, max_tokens)
    longest = max_tokens if max_length is None else min(max_tokens, max_length)
    if (beyond := np.flatnonzero(lengths.max(axis=1) > longest)).size:  # a side longer than the positions
        raise ValueError(
            f"Example {beyond[0]} has {lengths[beyond[0]].max()} tokens, more than max_length={max_length} (the "
            "model's positions); drop long examples with the length filter (max_source_length/max_target_length)."
        )
    grid = bucket_lengths(int(lengths.max()), width, growth)
    padded = np.minimum(grid[np.searchsorted(grid, lengths)], longest)  # (N, 2) each side's bucket
    code = padded[:, 0] * (max_tokens + 1) + padded[:, 1]  # one int per (source bucket, target bucket) cell
    by_cell = np.argsort(code, kind="stable")  # stable: within a cell, dataset order
    codes, cell_begins, counts = np.unique(code[by_cell], return_index=True, return_counts=True)
    cells = np.stack([codes // (max_tokens + 1), codes % (max_tokens + 1)], axis=1)
    cell_starts = np.append(cell_begins, len(code))
    batches, shapes, waiting = [], [], []  # waiting: [(source bucket, target bucket, indices)]
    for (source, target), begin, end in zip(cells.tolist(), cell_starts[:-1], cell_starts[1:]):
        rows = max_tokens // max(source, target)
        own = by_cell[begin:end]
        fits = [group for group in waiting if group[0] <= source and group[1] <= target]
        waiting = [group for group in waiting if not (group[0] <= source and group[1] <= target)]
        carried = np.concatenate([group[2] for group in fits]) if fits else own[:0]
        count = min((len(carried) + len(own)) // rows, len(own))  # full batches, one own example in each
        taken = min(len(carried), count * (rows - 1))
        rest = count * (rows - 1) - taken
        others = np.concatenate([carried[:taken], own[count : count + rest]]).reshape(count, rows - 1)
        batches += [np.concatenate([own[i : i + 1], others[i]]) for i in range(count)]
        shapes += [(rows, source, target)] * count
        waiting += _left_over(fits, taken)
        if count + rest < len(own):
            waiting.append((source, target, own[count + rest :]))
    left_batches, left_shapes = _pack_greedily(waiting, max_tokens)
    batches, shapes = batches + left_batches, np.asarray(shapes + left_shapes, dtype=np.int64).reshape(-1, 3)
    ranked = np.lexsort((shapes[:, 0], shapes[:, 2], shapes[:, 1]))  # shortest first
    order = np.concatenate([batches[b] for b in ranked]) if batches else np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum([len(batches[b]) for b in ranked])]).astype(np.int64)
    return order.astype(np.int64), starts, shapes[ranked]


def _left_over(groups: list, taken: int) -> list:
    """The waiting groups less their first ``taken`` examples (taken in order), each keeping its cell."""
    left = []
    for source, target, indices in groups:
        used = min(taken, len(indices))
        taken -= used
        if used < len(indices):
            left.append((source, target, indices[used:]))
    return left


def _pack_greedily(groups: list, max_tokens: int) -> tuple[list, list]:
    """The examples no cell took, in cell order, cut into batches of at most ``max_tokens`` padded tokens."""
    batches, shapes, current, source, target = [], [], [], 0, 0
    for group_source, group_target, indices in sorted(groups, key=lambda group: group[:2]):
        for index in indices.tolist():
            grown_source, grown_target = max(source, group_source), max(target, group_target)
            if current and (len(current) + 1) * max(grown_source, grown_target) > max_tokens:
                batches.append(np.asarray(current, dtype=np.int64))
                shapes.append((len(current), source, target))
                current, grown_source, grown_target = [], group_source, group_target
            current.append(index)
            source, target = grown_source, grown_target
    if current:
        batches.append(np.asarray(current, dtype=np.int64))
        shapes.append((len(current), source, target))
    return batches, shapes


def pack_sorted(lengths: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fairseq's ``--max-tokens`` batches: ``(order, starts, shapes)`` as `pack` returns them, without buckets.

    The pairs, sorted by (source, target) length, are cut greedily: a batch takes the next pair while
    its rows, each padded to the batch's longest side, stay within ``max_tokens``. ``shapes[b]`` is
    (rows, longest source, longest target): what the collator pads batch ``b`` to on its own.
    """
    _refuse_too_long(lengths, max_tokens)
    # by (source, target): one int each (both at most max_tokens), sorted stably (ties keep dataset order)
    order = np.argsort(lengths[:, 0] * (max_tokens + 1) + lengths[:, 1], kind="stable")
    longest = np.maximum(lengths[:, 0], lengths[:, 1])[order]
    starts = [0]
    while starts[-1] < len(order):  # one batch a step, in numpy: 36M pairs in about a second, not a Python loop
        start = starts[-1]
        # a batch starting here has at most max_tokens // longest[start] rows: only those can join it
        window = longest[start : start + max_tokens // int(longest[start]) + 1]
        fits = np.arange(1, len(window) + 1) * np.maximum.accumulate(window) <= max_tokens  # rows padded alike
        starts.append(start + (int(np.argmin(fits)) if not fits.all() else len(window)))
    starts = np.asarray(starts, dtype=np.int64)
    sorted_lengths = lengths[order]
    shapes = (
        np.stack(
            [np.diff(starts), *(np.maximum.reduceat(sorted_lengths[:, side], starts[:-1]) for side in (0, 1))], axis=1
        )
        if len(order)
        else np.zeros((0, 3), np.int64)
    )
    return order.astype(np.int64), starts, shapes.astype(np.int64)


def _refuse_too_long(lengths: np.ndarray, max_tokens: int) -> None:
    longest = lengths.max(axis=1)
    if (too_long := np.flatnonzero(longest > max_tokens)).size:
        index = too_long[0]
        raise ValueError(
            f"Example {index} has {longest[index]} tokens (source {lengths[index, 0]}, target "
            f"{lengths[index, 1]}), more than max_tokens={max_tokens}, so it fits in no batch; drop long "
            "examples with the length filter (max_source_length/max_target_length) or raise max_tokens."
        )


class TokenBatchSampler(Sampler[list[int]]):
    """Batch sampler that fills batches up to a number of padded tokens, like fairseq's --max-tokens.

    Examples are sorted by length and cut greedily (`pack_sorted`), or with ``pad_to_buckets`` grouped by
    the buckets of their (source, target) lengths (`pack`), so each batch holds sentences of similar
    length; ``shapes[b] = (rows, source length, target length)`` is what batch ``b`` is padded to, with
    ``rows * max(source length, target length) <= max_tokens``.
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
        pad_to_buckets: pad each batch to one of a few bucket shapes (for a compiled graph per shape);
            otherwise each batch is padded to its own longest sentences, and carries the most of them.
        bucket_width: with ``pad_to_buckets``, the padded lengths are multiples of this (8: what tensor
            cores want).
        max_length: with ``pad_to_buckets``, the longest a side is padded to: the model's positions
            (``max_position_embeddings``), where a bucket would pass them; default ``max_tokens`` (`longest`).
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
        pad_to_buckets: bool = False,
        bucket_width: int = BUCKET_WIDTH,
        max_length: int | None = None,
    ):
        _positive_int("max_tokens", max_tokens)
        if max_length is not None:
            _positive_int("max_length", max_length)
        _positive_int("num_replicas", num_replicas)
        _positive_int("bucket_width", bucket_width)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be an int in [0, {num_replicas}), got {rank!r}.")
        if len(lengths) == 0:
            raise ValueError("lengths is empty: there is nothing to batch.")
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.num_replicas, self.rank, self.drop_last = num_replicas, rank, drop_last
        self.epoch = 0
        self.pad_to_buckets, self.bucket_width = pad_to_buckets, bucket_width
        self.longest = max_tokens if max_length is None else min(max_tokens, max_length)  # what a side pads to
        pairs = length_pairs(lengths)
        packed = (
            pack(pairs, max_tokens, bucket_width, max_length=max_length)
            if pad_to_buckets
            else pack_sorted(pairs, max_tokens)
        )
        self.order, self.starts, self.shapes = packed
        self._digest = None
        if drop_last and self.num_batches < num_replicas:
            logger.warning(
                f"Only {self.num_batches} batches for {num_replicas} replicas with drop_last=True: "
                "every rank gets no batch at all; lower max_tokens or set drop_last=False."
            )

    @property
    def num_batches(self) -> int:
        """The number of batches over all ranks, before any padding or dropping."""
        return len(self.starts) - 1

    @property
    def digest(self) -> str:
        """The batches' identity (which examples each holds), the same on every process: a checkpoint keeps it,
        so that a run resumed in the middle of an epoch knows whether it skips the batches that were trained."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.order.tobytes() + self.starts.tobytes()).hexdigest()[:16]
        return self._digest

    def batch(self, index: int) -> list[int]:
        """The example indices of batch ``index`` (in length-sorted batch order)."""
        return self.order[self.starts[index] : self.starts[index + 1]].tolist()

    @property
    def batches(self) -> list[list[int]]:
        """Every batch in length-sorted order (for inspection; iterating does not build this list)."""
        return [self.batch(index) for index in range(self.num_batches)]

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which (with the seed) decides the order of the batches."""
        self.epoch = epoch

    @property
    def sampler(self) -> TokenBatchSampler:
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
        # (seed, epoch) together: seed + epoch would give seed s at epoch e the order of seed s + 1 at epoch e - 1
        generator = torch.Generator().manual_seed(
            int(np.random.SeedSequence([self.seed, self.epoch]).generate_state(1)[0])
        )
        return torch.randperm(self.num_batches, generator=generator).numpy()

    def _rank_order(self) -> np.ndarray:
        order = self._epoch_order()
        if self.drop_last:
            order = order[: len(self) * self.num_replicas]
        else:
            padding = len(self) * self.num_replicas - len(order)
            order = np.concatenate([order, np.resize(order, padding)])  # repeats from the start, cycling
        return order[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        for batch_index in self._rank_order().tolist():
            yield self.batch(batch_index)

    def __len__(self) -> int:
        """The number of batches this rank yields per epoch."""
        if self.drop_last:
            return self.num_batches // self.num_replicas
        return math.ceil(self.num_batches / self.num_replicas)


class PadToBucket:
    """A collator that pads what ``collator`` returns to the batch's bucket shape (see `pack`).

    ``collator`` (e.g. ``DataCollatorForSeq2Seq``) pads each side to its longest sentence; this pads
    on to that length's bucket: ``input_ids``/``decoder_input_ids`` with ``pad_token_id``, the
    attention masks with 0, ``labels`` with -100 (ignored by the loss). Give it the sampler's
    ``longest`` (as ``max_tokens``: the longest a side is padded to) and ``bucket_width``.
    """

    def __init__(self, collator, pad_token_id: int, max_tokens: int, bucket_width: int = BUCKET_WIDTH):
        self.collator, self.max_tokens, self.bucket_width = collator, max_tokens, bucket_width
        self.fill = {
            "input_ids": pad_token_id,
            "attention_mask": 0,
            "labels": -100,
            "decoder_input_ids": pad_token_id,
            "decoder_attention_mask": 0,
        }

    def __call__(self, features):
        batch = self.collator(features)
        for key, value in list(batch.items()):
            if not isinstance(value, torch.Tensor) or value.ndim < 2:
                continue
            if key not in self.fill:
                raise ValueError(
                    f"PadToBucket does not know how to pad the collated {key!r} (shape "
                    f"{tuple(value.shape)}); it pads {', '.join(self.fill)}: drop {key!r} from the dataset."
                )
            length = bucket_length(value.shape[1], self.max_tokens, self.bucket_width)
            if length > value.shape[1]:
                batch[key] = torch.nn.functional.pad(value, (0, length - value.shape[1]), value=self.fill[key])
        return batch


class LengthSortedSampler(Sampler[int]):
    """The order in which evaluation decodes: shortest source first (then shortest target), as `translate`
    decodes, so that a batch of generate() pads its sentences to similar lengths. Shortest first, because
    accelerate completes the last batch of several processes with the first examples: short ones leave its
    padded length as it was. ``order[i]`` is the dataset row decoded i-th; `restore_order` puts what was
    computed in this order (predictions, labels) back into the dataset's order.

    ``lengths``: one int (the source) or a (source, target) pair per example."""

    def __init__(self, lengths):
        pairs = length_pairs(lengths)
        self.order = np.lexsort((pairs[:, 1], pairs[:, 0]))  # stable: equal lengths keep the input order

    def __iter__(self) -> Iterator[int]:
        return iter(self.order.tolist())

    def __len__(self) -> int:
        return len(self.order)

    def restore_order(self, rows):
        """``rows`` (an array with a row per example in this sampler's order, or k consecutive rows per example
        as ``num_return_sequences=k`` gives; a tuple or list of such arrays; or None) in the dataset's order."""
        if rows is None:
            return None
        if isinstance(rows, (tuple, list)):
            return type(rows)(self.restore_order(part) for part in rows)
        count = len(self.order)
        if count == 0 or len(rows) % count:
            raise ValueError(
                f"Expected a row (or k rows) for each of the {count} examples, got {len(rows)} rows; evaluate "
                "with --eval_order input (eval_order='input') to keep the dataset's order."
            )
        grouped = rows.reshape(count, len(rows) // count, *rows.shape[1:])  # k rows an example
        restored = np.empty_like(grouped)
        restored[self.order] = grouped
        return restored.reshape(rows.shape)


def allow_recompiles(shapes: int) -> None:
    """Let torch.compile keep a graph for each of ``shapes`` batch shapes (and a few more, e.g. for the
    last batches), where its limit would fall back to running uncompiled."""
    import torch._dynamo.config as dynamo

    name = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"  # torch < 2.7
    setattr(dynamo, name, max(getattr(dynamo, name), shapes + 8))
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), 4 * (shapes + 8)))
