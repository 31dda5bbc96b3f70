"""Training data: read parallel text, tokenise it, drop unusable examples, batch by token count.

The paper batches by tokens, not sentences (§5.1): "Each training batch contained a set of sentence
pairs containing approximately 25000 source tokens and 25000 target tokens." fairseq does this with
``--max-tokens``; the Hugging Face Trainer only knows a fixed number of sentences per batch, which
with sentences of 3 to 200 tokens wastes most of a batch on padding or runs out of memory on the
longest one. `TokenBatchSampler` fills that gap, with fairseq's semantics: examples sorted by
length, packed greedily so that a batch's *padded* size (sentences x longest sentence, what memory
depends on) stays within ``max_tokens``, and the batches shuffled each epoch.

Data flows one way: `read_parallel` / `read_tsv` / `read_jsonl` give ``(source, target)`` string
pairs, `tokenize_pairs` turns them into ``{"input_ids", "labels"}`` examples, `filter_by_length`
drops those that are empty or too long (and says how many), and `TokenBatchSampler` batches the
rest for ``DataLoader(examples, batch_sampler=sampler, collate_fn=DataCollatorForSeq2Seq(tok))``.

Nothing here drops or truncates data without saying so: misaligned files and malformed lines are
errors, filtered examples are counted and logged, and an example too long for any batch is an error.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import operator
import os
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import torch
from torch.utils.data import Sampler

logger = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"
PathLike = str | os.PathLike


# ---------------------------------------------------------------------------------------------
# Reading text
# ---------------------------------------------------------------------------------------------


def open_text(path: PathLike):
    """Open a plain or gzip UTF-8 file, told apart by its first bytes (a suffix can lie)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No such file: {str(path)!r}")
    with open(path, "rb") as file:
        is_gzip = file.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    # newline="\n": split on "\n" only; universal newlines would also split on a lone "\r" inside a
    # sentence and shift every following line. "utf-8-sig" drops a byte-order mark if there is one.
    opener = gzip.open if is_gzip else open
    return opener(path, "rt", encoding="utf-8-sig", newline="\n")


def read_lines(path: PathLike) -> list[str]:
    """All lines of a text file without their line ending ("\\n" or "\\r\\n"); nothing else stripped."""
    try:
        with open_text(path) as file:
            return [line.removesuffix("\n").removesuffix("\r") for line in file]
    except UnicodeDecodeError as error:
        raise ValueError(f"{str(path)!r} is not valid UTF-8: {error}") from error


def read_parallel(source_path: PathLike, target_path: PathLike) -> list[tuple[str, str]]:
    """Read two aligned files (line i of one translates line i of the other) into pairs.

    Either file may be plain or gzip-compressed. Files with different numbers of lines are an error,
    never truncated: one missing line shifts every later pair onto the wrong translation.
    """
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise ValueError(
            f"Parallel files are not aligned: {str(source_path)!r} has {len(sources)} lines but "
            f"{str(target_path)!r} has {len(targets)}; they need one sentence per line, the same "
            "number of lines."
        )
    return list(zip(sources, targets))


def read_tsv(path: PathLike, source_column: int = 0, target_column: int = 1) -> list[tuple[str, str]]:
    """Read pairs from tab-separated lines (plain or gzip); columns are 0-based.

    Fields are split on tabs with no quoting rules (the ``csv`` module would eat quote characters
    that belong to the sentences), so a field cannot contain a tab.
    """
    if min(source_column, target_column) < 0:
        raise ValueError(f"Columns are 0-based and non-negative, got {source_column} and {target_column}.")
    needed = max(source_column, target_column) + 1
    pairs = []
    for number, line in enumerate(read_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) < needed:
            raise ValueError(
                f"{str(path)!r}, line {number}: too few columns, found {len(fields)} tab-separated "
                f"field(s), need at least {needed} (source_column={source_column}, "
                f"target_column={target_column})."
            )
        pairs.append((fields[source_column], fields[target_column]))
    return pairs


def json_field(record: dict, key: str, where: str) -> str:
    """``record[key]``; a dotted key such as ``"translation.en"`` reaches into nested objects."""
    value = record
    for part in ([key] if key in record else key.split(".")):
        if not isinstance(value, dict) or part not in value:
            available = sorted(record) if isinstance(record, dict) else []
            raise ValueError(f"{where}: missing key {key!r} (keys present: {available}).")
        value = value[part]
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key!r} must be a string, got {type(value).__name__}.")
    return value


def read_jsonl(path: PathLike, source_key: str, target_key: str) -> list[tuple[str, str]]:
    """Read pairs from JSON Lines (one object per line, plain or gzip); blank lines are skipped.

    A dotted key reaches into nested objects, e.g. ``source_key="translation.en"`` for the layout
    of the WMT datasets on the Hub (``{"translation": {"de": ..., "en": ...}}``).
    """
    pairs = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{str(path)!r}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: invalid JSON ({error}).") from error
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}.")
        pairs.append((json_field(record, source_key, where), json_field(record, target_key, where)))
    return pairs


# ---------------------------------------------------------------------------------------------
# Tokenising and filtering
# ---------------------------------------------------------------------------------------------


def tokenize_pairs(pairs: Sequence[tuple[str, str]], tokenizer, chunk_size: int = 10_000) -> list[dict]:
    """Tokenise ``(source, target)`` pairs into ``{"input_ids": [...], "labels": [...]}`` examples.

    No truncation: a too-long example should be dropped and counted (`filter_by_length`), not cut
    into a source that no longer matches its target. Chunks keep memory flat on large corpora.
    """
    examples = []
    for start in range(0, len(pairs), chunk_size):
        chunk = pairs[start:start + chunk_size]
        encoded = tokenizer([s for s, _ in chunk], text_target=[t for _, t in chunk], truncation=False)
        examples += [{"input_ids": i, "labels": l} for i, l in zip(encoded["input_ids"], encoded["labels"])]
    return examples


def _is_empty(ids: Sequence[int], special_token_ids: Collection[int]) -> bool:
    return all(token in special_token_ids for token in ids)


def filter_by_length(
    examples: Sequence[dict],
    max_source_tokens: int,
    max_target_tokens: int,
    special_token_ids: Collection[int] = (),
) -> tuple[list[dict], int]:
    """Drop examples whose source or target is empty or longer than the limit, in tokens.

    Args:
        examples: tokenised examples, dicts with ``input_ids`` and ``labels`` lists (lengths are
            counted as the model sees them, ``</s>`` included).
        max_source_tokens, max_target_tokens: the longest ``input_ids`` / ``labels`` kept, e.g. the
            model's ``max_position_embeddings``.
        special_token_ids: tokens that do not count as content. The tokenizer appends ``</s>`` to
            every sentence, so an empty sentence is ``[</s>]``, not ``[]``: pass
            ``tokenizer.all_special_ids`` to drop it.

    Returns:
        ``(kept, number_dropped)``; the count, and why, is also logged (a warning if non-zero).
    """
    _check_positive(max_source_tokens=max_source_tokens, max_target_tokens=max_target_tokens)
    special = frozenset(special_token_ids)
    kept, too_long, empty = [], 0, 0
    for index, example in enumerate(examples):
        source, target = _example_ids(example, index)
        if _is_empty(source, special) or _is_empty(target, special):
            empty += 1
        elif len(source) > max_source_tokens or len(target) > max_target_tokens:
            too_long += 1
        else:
            kept.append(example)
    dropped = too_long + empty
    level = logging.WARNING if dropped else logging.INFO
    logger.log(
        level,
        f"filter_by_length dropped {dropped} of {len(examples)} examples ({empty} empty, {too_long} "
        f"longer than {max_source_tokens} source / {max_target_tokens} target tokens).",
    )
    return kept, dropped


def _example_ids(example, index: int) -> tuple[Sequence[int], Sequence[int]]:
    if not isinstance(example, dict) or "input_ids" not in example or "labels" not in example:
        raise TypeError(
            f"Example {index} is not a tokenised example (a dict with 'input_ids' and 'labels'), got "
            f"{type(example).__name__}; lengths are counted in tokens, so tokenise first (tokenize_pairs)."
        )
    return example["input_ids"], example["labels"]


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


# ---------------------------------------------------------------------------------------------
# Batching by token count
# ---------------------------------------------------------------------------------------------


def _length_pair(item) -> tuple[int, int]:
    """(source, target) from an int (both sides) or a pair; numpy and torch integers work too."""
    if isinstance(item, bool):
        raise TypeError
    try:
        return (operator.index(item),) * 2
    except TypeError:
        source, target = item  # TypeError / ValueError if not a pair
        if isinstance(source, bool) or isinstance(target, bool):
            raise TypeError from None
        return operator.index(source), operator.index(target)


def _as_pairs(lengths: Sequence[int] | Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Validated (source, target) lengths, each at least 1 token."""
    pairs = []
    for index, item in enumerate(lengths):
        try:
            pair = _length_pair(item)
        except (TypeError, ValueError):
            pair = (0, 0)
        if min(pair) < 1:
            raise ValueError(
                f"Length of example {index} must be a positive int or a (source, target) pair of "
                f"positive ints, got {item!r}; drop empty examples with filter_by_length."
            )
        pairs.append(pair)
    return pairs


def _pack(pairs: list[tuple[int, int]], max_tokens: int) -> list[list[int]]:
    """Sort by (source, target) length and greedily cut into batches of at most max_tokens padded tokens."""
    order = sorted(range(len(pairs)), key=lambda i: pairs[i])  # stable: ties keep dataset order
    batches, batch, longest = [], [], 0
    for index in order:
        length = max(pairs[index])
        if length > max_tokens:
            raise ValueError(
                f"Example {index} has {length} tokens (source {pairs[index][0]}, target "
                f"{pairs[index][1]}), more than max_tokens={max_tokens}, so it fits in no batch; "
                "drop long examples with filter_by_length or raise max_tokens."
            )
        # Padded size if this example joins: every row is padded to the batch's longest side.
        if batch and (len(batch) + 1) * max(longest, length) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(index)
        longest = max(longest, length)
    batches.append(batch)
    return batches


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
        lengths: per example, ``(source_length, target_length)`` or one int for both, in tokens.
        max_tokens: the most padded tokens per batch, per side (the paper: about 25000).
        shuffle: shuffle the order of the batches each epoch; otherwise shortest first.
        seed: base of the shuffling seed; must be the same on every rank.
        num_replicas, rank: number of data-parallel processes and this one's index.
        drop_last: drop batches that do not divide evenly among ranks instead of repeating some.
    """

    def __init__(
        self,
        lengths: Sequence[int] | Sequence[tuple[int, int]],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ):
        _check_positive(max_tokens=max_tokens, num_replicas=num_replicas)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be an int in [0, {num_replicas}), got {rank!r}.")
        if len(lengths) == 0:
            raise ValueError("lengths is empty: there is nothing to batch.")
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.num_replicas, self.rank, self.drop_last = num_replicas, rank, drop_last
        self.epoch = 0
        self.batches = _pack(_as_pairs(lengths), max_tokens)
        if drop_last and len(self.batches) < num_replicas:
            logger.warning(
                f"Only {len(self.batches)} batches for {num_replicas} replicas with drop_last=True: "
                "every rank gets no batch at all; lower max_tokens or set drop_last=False."
            )

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

    def _epoch_order(self) -> list[int]:
        """Batch indices in this epoch's order, identical on every rank."""
        if not self.shuffle:
            return list(range(len(self.batches)))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.batches), generator=generator).tolist()

    def _rank_order(self) -> list[int]:
        order = self._epoch_order()
        if self.drop_last:
            order = order[: len(self) * self.num_replicas]
        else:
            padding = len(self) * self.num_replicas - len(order)
            order += (order * math.ceil(padding / len(order)))[:padding]  # cycles if fewer than ranks
        return order[self.rank::self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        for batch_index in self._rank_order():
            yield list(self.batches[batch_index])  # a copy: callers may mutate what they get

    def __len__(self) -> int:
        """The number of batches this rank yields per epoch."""
        if self.drop_last:
            return len(self.batches) // self.num_replicas
        return math.ceil(len(self.batches) / self.num_replicas)
