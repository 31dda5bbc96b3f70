"""Training data on `datasets`: text files or a Hub dataset -> Arrow -> token ids -> length filter.

The corpus never lives in Python objects. Each reader streams its file into an Arrow table with two
string columns, ``source`` and ``target`` (`parallel_text_dataset`, `tsv_dataset`,
`jsonl_dataset`, `hub_dataset`); `tokenize_dataset` turns it into ``input_ids``/``labels`` with
``Dataset.map(batched=True, num_proc=...)``; `drop_unusable` removes empty and too-long pairs and
says how many. Every step is cached on disk under a fingerprint of its inputs (file path, size,
modification and status change times; the tokenizer's JSON; the limits), so a second run, and the other processes
of a data-parallel run, memory-map the result instead of computing it again (a damaged cache entry is
rebuilt, with a warning naming it: `caches`). The sampler gets the lengths as one array
(`example_lengths`). Disk: the text once (as Arrow) plus the token ids (4 bytes a token), e.g. about
1.3 GB + 1.1 GB for WMT14 en-de (4.5M pairs).

A run's flags (`options.DataArguments`) name the files or Hub splits of each role (train, validation,
test): `load_text_datasets` reads them all, checking each file's first record for its columns or
keys before reading it whole, and `tokenize_pairs` tokenises one role for a model and filters it.

Reading rules, the same for every text format: UTF-8 (a byte-order mark at the start is dropped;
invalid bytes are an error naming the line); lines end at "\\n" only ("\\r\\n" loses its "\\r"; a
lone "\\r" stays inside the sentence, as in the data); gzip is recognised by its first bytes, not
its suffix; other compressions, directories, empty files and misaligned files are errors that name
the file (and the flag it came from) and say what to do.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import math
import os
import signal
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..tokenization_vanilla_transformer import decoded_lines, open_text_bytes  # one reader's rules, the tokenizer's too
from .caches import dataset_cache_folder, generator_cache_folder, rebuilt_if_damaged
from .metrics import check_sacrebleu_tokenize

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
# Bump when what the readers, tokenize_dataset or drop_unusable write changes, so that old caches are not reused.
CACHE_VERSION = "1"
PAIR_COLUMNS = ("source", "target")
TOKENIZED_COLUMNS = ("input_ids", "labels", "source_length", "target_length", "empty")
# --validation_size's draw: the same held-out pairs whatever --seed (a resumed run, Table 3's seeds, an evaluation
# later), the default --seed's as before
HELD_OUT_SEED = 42
ROWS_PER_WORKER = 50_000  # fewer rows than this per process: not worth starting one


# ---------------------------------------------------------------------------------------------
# Opening a file: the one place that decides how text is read
# ---------------------------------------------------------------------------------------------


def _named(path: Path, what: str | None) -> str:
    return f"{what} {str(path)!r}" if what else repr(str(path))


def check_file(path: PathLike, what: str | None = None) -> Path:
    """``path`` as a regular, readable, non-empty file; otherwise an error that says what to give."""
    path = Path(path)
    name = _named(path, what)
    if not path.exists():
        raise FileNotFoundError(f"{name} does not exist; check the path.")
    if path.is_dir():
        raise IsADirectoryError(f"{name} is a directory; give a text file (one sentence a line, plain or .gz).")
    if not stat.S_ISREG(path.stat().st_mode):
        raise ValueError(f"{name} is not a regular file (a pipe or a device?); write the data to a file first.")
    if not os.access(path, os.R_OK):
        raise PermissionError(f"{name} is not readable; give the current user read permission.")
    if path.stat().st_size == 0:
        raise ValueError(f"{name} is empty; give a file with at least one sentence.")
    return path


def numbered_lines(path: PathLike, what: str | None = None) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for every line of a UTF-8 text file (plain or gzip), read lazily.

    The text is the line without its "\\n" or "\\r\\n"; a byte-order mark at the start of the file is
    dropped. Invalid UTF-8 and a compressed file that ends early are errors naming file and line.
    """
    path = check_file(path, what)
    name = _named(path, what)
    number = 0
    with open_text_bytes(path, name) as lines:
        try:
            for number, text in decoded_lines(lines, name):
                yield number, text
        except (EOFError, zlib.error, gzip.BadGzipFile) as error:
            raise ValueError(
                f"{name} is a damaged or truncated gzip file (it breaks off after line {number}: {error}); "
                "download or compress it again."
            ) from None
    if number == 0:  # a compressed file of nothing (a plain one is refused as empty by check_file)
        raise ValueError(f"{name} is empty once decompressed; give a file with at least one sentence.")


def read_lines(path: PathLike, what: str | None = None) -> list[str]:
    """All lines of a (small) text file, by the rules of `numbered_lines`: test sets, references."""
    return [text for _, text in numbered_lines(path, what)]


def read_parallel(
    source_path: PathLike, target_path: PathLike, what: tuple[str, str] | None = None
) -> list[tuple[str, str]]:
    """The pairs of two small aligned files (test sets), in memory; corpora go through `parallel_text_dataset`."""
    rows = _parallel_rows(str(source_path), str(target_path), what or (None, None))
    return [(row["source"], row["target"]) for row in rows]


# ---------------------------------------------------------------------------------------------
# Readers: each streams one format into an Arrow dataset with columns source, target
# ---------------------------------------------------------------------------------------------


def _parallel_rows(source_path: str, target_path: str, what: tuple[str | None, str | None], **_) -> Iterator[dict]:
    sources, targets = numbered_lines(source_path, what[0]), numbered_lines(target_path, what[1])
    paired = 0
    for source, target in itertools.zip_longest(sources, targets):
        if source is None or target is None:  # one file ended before the other: count the rest of both
            lines = [
                paired + (line is not None) + sum(1 for _ in rest)
                for line, rest in ((source, sources), (target, targets))
            ]
            raise ValueError(
                f"Parallel files are not aligned: {_named(Path(source_path), what[0])} has {lines[0]} lines but "
                f"{_named(Path(target_path), what[1])} has {lines[1]}; line i of one must translate line i of the "
                "other, so they need the same number of lines."
            )
        paired += 1
        yield {"source": source[1], "target": target[1]}


def _tsv_rows(path: str, source_column: int, target_column: int, what: str | None, **_) -> Iterator[dict]:
    """Fields are split on tabs with no quoting rules (the csv module would eat quotes that belong to
    the sentences). Every line must have as many fields as the first: one more means a tab inside a
    sentence, which would shift the columns silently."""
    name = _named(Path(path), what)
    needed = max(source_column, target_column) + 1
    expected = None
    for number, line in numbered_lines(path, what):
        fields = line.split("\t")
        if expected is None:
            expected = len(fields)
        if len(fields) < needed or len(fields) != expected:
            why = (
                f"need at least {needed} (source column {source_column}, target column {target_column})"
                if len(fields) < needed
                else f"line 1 has {expected}: is there a tab inside a sentence, on this line or on line 1?"
            )
            raise ValueError(
                f"{name}, line {number}: {len(fields)} tab-separated field(s), {why}. Every line holds the same "
                "fields; a sentence cannot contain a tab (use .jsonl for such text)."
            )
        yield {"source": fields[source_column], "target": fields[target_column]}


def json_field(record: dict, key: str, where: str) -> str:
    """``record[key]``; a dotted key such as ``"translation.en"`` reaches into nested objects."""
    value, reached = record, []
    for part in [key] if key in record else key.split("."):
        if reached and not isinstance(value, dict):  # {"translation": null}: present, but no object to look in
            kind = "null" if value is None else f"a {type(value).__name__}"
            raise ValueError(f"{where}: {'.'.join(reached)!r} is {kind}, not an object holding {part!r}.")
        if not isinstance(value, dict) or part not in value:
            available = sorted(record) if isinstance(record, dict) else []
            raise ValueError(f"{where}: missing key {key!r} (keys present: {available}).")
        value = value[part]
        reached.append(part)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key!r} must be a string, got {type(value).__name__}.")
    try:  # JSON's "\ud83d" alone: half a character, which no UTF-8 file (nor Arrow) can hold
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{where}: {key!r} holds a lone surrogate ({error.object[error.start]!r} at character {error.start}), "
            "half of a character; fix or remove the line."
        ) from None
    return value


def _jsonl_rows(path: str, source_key: str, target_key: str, what: str | None, **_) -> Iterator[dict]:
    """One JSON object a line; blank lines are skipped (and counted in the log)."""
    name, blank = _named(Path(path), what), 0
    for number, line in numbered_lines(path, what):
        if not line.strip():
            blank += 1
            continue
        where = f"{name}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: invalid JSON ({error}).") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}.")
        yield {"source": json_field(record, source_key, where), "target": json_field(record, target_key, where)}
    if blank:
        logger.info(f"{name}: skipped {blank} blank line(s)")


def first_json_record(path: PathLike, what: str | None = None) -> dict:
    """The first non-blank line of a JSONL file as an object: to choose and check the keys before reading it all."""
    name = _named(Path(path), what)
    for number, line in numbered_lines(path, what):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{name}, line {number}: invalid JSON ({error}); one JSON object a line.") from None
            if not isinstance(record, dict):
                raise ValueError(f"{name}, line {number}: expected a JSON object, got {type(record).__name__}.")
            return record
    raise ValueError(f"{name} has only blank lines; give one JSON object a line.")


def file_identity(path) -> tuple:
    """What a cache of ``path``'s content is keyed on: the resolved path, the size, the modification time, and the
    status change time (ctime), which every write sets and no tool can set back: a file rewritten with its old size
    and modification time restored (``cp -p``, ``rsync -a``, ``tar x``) is read again. A file only touched or
    renamed is read again too."""
    status = os.stat(path)
    return str(Path(path).resolve()), status.st_size, status.st_mtime_ns, status.st_ctime_ns


def _arrow_from(rows, cache_dir: str | None, **gen_kwargs):
    """Stream ``rows(**gen_kwargs)`` into a cached Arrow dataset, keyed on the files' `file_identity`, so that an
    edited file is read again."""
    from datasets import Dataset, Features, Value
    from datasets.exceptions import DatasetGenerationError
    from datasets.fingerprint import Hasher

    files = [value for key, value in gen_kwargs.items() if key.endswith("path")]
    for index, path in enumerate(files):
        what = gen_kwargs["what"][index] if isinstance(gen_kwargs["what"], tuple) else gen_kwargs["what"]
        check_file(path, what)
    # A tuple, not a list: datasets would read a list in gen_kwargs as shards, one generator call each.
    identity = tuple(file_identity(path) for path in files)
    fingerprint = Hasher.hash([CACHE_VERSION, rows.__name__, identity, sorted(gen_kwargs.items())])
    try:
        return rebuilt_if_damaged(
            lambda: Dataset.from_generator(
                rows,
                features=Features({name: Value("string") for name in PAIR_COLUMNS}),
                cache_dir=cache_dir,
                gen_kwargs={**gen_kwargs, "identity": identity},
                fingerprint=fingerprint,
            ),
            generator_cache_folder(cache_dir, fingerprint),
        )
    except DatasetGenerationError as error:  # our own message, not datasets' generic one
        raise (error.__cause__ or error) from None


def parallel_text_dataset(
    source_path: PathLike, target_path: PathLike, what: tuple[str, str] | None = None, cache_dir: str | None = None
):
    """Two aligned files (line i of one translates line i of the other) as an Arrow dataset.

    Files with different numbers of lines are an error, never truncated: one missing line shifts every
    later pair onto the wrong translation.
    """
    return _arrow_from(
        _parallel_rows, cache_dir, source_path=str(source_path), target_path=str(target_path), what=what or (None, None)
    )


def tsv_dataset(
    path: PathLike,
    source_column: int = 0,
    target_column: int = 1,
    what: str | None = None,
    cache_dir: str | None = None,
):
    """Tab-separated pairs (0-based columns) as an Arrow dataset."""
    for name, column in (("source_column", source_column), ("target_column", target_column)):
        if isinstance(column, bool) or not isinstance(column, int) or column < 0:
            raise ValueError(f"TSV columns are 0-based non-negative integers; {name} is {column!r}.")
    return _arrow_from(
        _tsv_rows, cache_dir, path=str(path), source_column=source_column, target_column=target_column, what=what
    )


def jsonl_dataset(
    path: PathLike, source_key: str, target_key: str, what: str | None = None, cache_dir: str | None = None
):
    """JSON Lines pairs as an Arrow dataset; a dotted key reaches into nested objects, e.g.
    ``translation.en`` for the layout of the WMT datasets on the Hub."""
    return _arrow_from(_jsonl_rows, cache_dir, path=str(path), source_key=source_key, target_key=target_key, what=what)


def default_key(language: str, keys) -> str:
    """The key of a language in a record: ``translation.<lang>`` for Hub-style records, else ``<lang>``."""
    return f"translation.{language}" if "translation" in keys else language


def leave_ctrl_c_to_the_main_process() -> None:
    """Called by each function `Dataset.map` runs: in a worker process (num_proc), Ctrl-C is ignored from then on.
    A terminal's Ctrl-C reaches every process of the job; the main process stops the run and with it the pool
    (`checkpointing.ctrl_c_stops_the_run`), and each worker printed a KeyboardInterrupt traceback. Forked workers
    inherit that function's handler; those a forkserver starts (Python 3.14's default on Linux) or spawn (macOS's)
    do not. datasets' workers are `multiprocess`'s."""
    import multiprocess

    if multiprocess.parent_process() is not None and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class _SelectPair:
    """Batched map: a Hub dataset's record -> (source, target) strings, by key (dotted for nesting)."""

    def __init__(self, source_key: str, target_key: str, where: str):
        self.source_key, self.target_key, self.where = source_key, target_key, where

    def __call__(self, batch: dict, indices: list[int]) -> dict:
        leave_ctrl_c_to_the_main_process()
        rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
        return {
            "source": [json_field(r, self.source_key, f"{self.where}, row {i}") for r, i in zip(rows, indices)],
            "target": [json_field(r, self.target_key, f"{self.where}, row {i}") for r, i in zip(rows, indices)],
        }


def hub_dataset(
    name: str,
    config: str | None,
    split: str,
    source_key: str | None,
    target_key: str | None,
    languages: tuple[str, str],
    num_proc: int | None = None,
    cache_dir: str | None = None,
):
    """A Hub dataset split with columns source, target (downloaded by `datasets`, only when asked for)."""
    from datasets import load_dataset

    try:
        dataset = load_dataset(name, config, split=split, cache_dir=cache_dir)
    except ConnectionError as error:  # offline (HF_HUB_OFFLINE=1) or the Hub unreachable, and not in the cache
        raise ConnectionError(
            f"--dataset_name {name}: {error}. Connect to the Hub (with HF_HUB_OFFLINE unset), or train on local "
            "files: --dataset_name none with --train_source_file/--train_target_file (or --train_file), and "
            "likewise --validation_* and --test_*."
        ) from error
    source_key = source_key or default_key(languages[0], dataset.column_names)
    target_key = target_key or default_key(languages[1], dataset.column_names)
    where = f"dataset {name!r} split {split!r}"
    hint = "give --source_column/--target_column, or check --source_lang/--target_lang"
    for key in (source_key, target_key):
        if key.split(".")[0] not in dataset.column_names:
            raise ValueError(
                f"Dataset {name!r} split {split!r} has no column {key.split('.')[0]!r} (columns: "
                f"{dataset.column_names}); {hint}."
            )
        if len(dataset):  # nested keys: checked on the first row now, not in every row of a long map
            try:
                json_field(dataset[0], key, f"{where}, row 0")
            except ValueError as error:
                raise ValueError(f"{error} Keys come from the language codes unless given: {hint}.") from None
    if source_key == target_key:
        raise ValueError(f"Source and target would both be read from {source_key!r} ({where}): {hint}.")
    return rebuilt_if_damaged(
        lambda: dataset.map(
            _SelectPair(source_key, target_key, where),
            batched=True,
            with_indices=True,
            remove_columns=dataset.column_names,
            num_proc=workers_for(len(dataset), num_proc),
            desc="selecting pairs",
        ),
        dataset_cache_folder(dataset),
    )


# ---------------------------------------------------------------------------------------------
# Tokenising and the length filter
# ---------------------------------------------------------------------------------------------


def workers_for(rows: int, num_proc: int | None) -> int | None:
    """Processes for a map over ``rows`` rows: at most ``num_proc`` (default: the CPUs this process may
    use), and none beyond the first for small datasets, where starting processes costs more than it saves."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    wanted = min(num_proc or available, max(1, math.ceil(rows / ROWS_PER_WORKER)))
    return wanted if wanted > 1 else None


class _TokenizePairs:
    """Batched map: (source, target) strings -> token ids (no truncation) and their lengths."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, batch: dict) -> dict:
        leave_ctrl_c_to_the_main_process()
        encoded = self.tokenizer(batch["source"], text_target=batch["target"], truncation=False)
        sources, targets = encoded["input_ids"], encoded["labels"]
        return {
            "input_ids": sources,
            "labels": targets,
            "source_length": [len(ids) for ids in sources],
            "target_length": [len(ids) for ids in targets],
            # Empty: nothing but whitespace on a side (the tokenizer would still give it </s>).
            "empty": [not s.strip() or not t.strip() for s, t in zip(batch["source"], batch["target"])],
        }


def tokenizer_fingerprint(tokenizer) -> str:
    """What decides the token ids: the tokenizer's full definition and the settings its call uses."""
    from datasets.fingerprint import Hasher

    if getattr(tokenizer, "is_fast", False):
        # the definition without the truncation and padding a last call left set: the calls here set their own
        backend = json.loads(tokenizer.backend_tokenizer.to_str())
        backend.pop("truncation", None), backend.pop("padding", None)
    else:
        backend = _slow_definition(tokenizer)
    return Hasher.hash(
        [type(tokenizer).__name__, backend, tokenizer.all_special_ids, getattr(tokenizer, "split_special_tokens", None)]
    )


def _slow_definition(tokenizer) -> list:
    """A Python tokenizer's (MarianTokenizer's sentencepiece models, a BPE's vocabulary and merges) ids live in
    its vocabulary files, which its repr does not show: the files as it saves them, byte for byte."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        names = set(getattr(tokenizer, "vocab_files_names", {}).values())
        files = [(path.name, path.read_bytes()) for path in sorted(Path(folder).iterdir()) if path.name in names]
    return [repr(tokenizer), files]


def tokenize_dataset(dataset, tokenizer, num_proc: int | None = None, desc: str = "tokenizing"):
    """Token ids of every pair, as columns ``input_ids``, ``labels`` (int32), their lengths and ``empty``.

    Nothing is truncated: a too-long pair is dropped and counted by `drop_unusable`, not cut into a
    source that no longer matches its target.
    """
    from datasets import Features, Sequence, Value
    from datasets.fingerprint import Hasher

    features = Features(
        {
            "input_ids": Sequence(Value("int32")),
            "labels": Sequence(Value("int32")),
            "source_length": Value("int32"),
            "target_length": Value("int32"),
            "empty": Value("bool"),
        }
    )
    return rebuilt_if_damaged(
        lambda: dataset.map(
            _TokenizePairs(tokenizer),
            batched=True,
            remove_columns=list(PAIR_COLUMNS),
            features=features,
            num_proc=workers_for(len(dataset), num_proc),
            desc=desc,
            new_fingerprint=Hasher.hash([CACHE_VERSION, dataset._fingerprint, tokenizer_fingerprint(tokenizer)]),
        ),
        dataset_cache_folder(dataset),
    )


def column(dataset, name: str) -> np.ndarray:
    """One scalar column of an Arrow dataset as a numpy array (reads only that column)."""
    return dataset.select_columns([name]).with_format("numpy")[:][name]


def drop_unusable(
    dataset, max_source_tokens: int, max_target_tokens: int, role: str = "train", limits_from: str | None = None
):
    """Drop pairs that are empty on a side or longer than the limits (in tokens, ``</s>`` included).

    Returns ``(dataset, counts)``; the counts (kept, empty, too long) are logged, as a warning when
    anything was dropped, with ``limits_from`` (the flags or the model's positions that set the limits).
    Nothing is dropped silently.
    """
    for name, value in (("max_source_tokens", max_source_tokens), ("max_target_tokens", max_target_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    limits = {"max_source_tokens": max_source_tokens, "max_target_tokens": max_target_tokens}
    empty = column(dataset, "empty")
    keep = _usable(empty, column(dataset, "source_length"), column(dataset, "target_length"), **limits)
    counts = {"kept": int(keep.sum()), "empty": int(empty.sum()), "too_long": int((~keep & ~empty).sum())}
    dropped = len(keep) - counts["kept"]
    why = (
        f"{counts['empty']} empty, {counts['too_long']} longer than {max_source_tokens} source / "
        f"{max_target_tokens} target tokens{f' ({limits_from})' if limits_from else ''}"
    )
    logger.log(
        logging.WARNING if dropped else logging.INFO,
        f"{role}: kept {counts['kept']} of {len(keep)} pairs; dropped {dropped} ({why})",
    )
    if not counts["kept"]:
        raise ValueError(
            f"No {role} pairs left: all {dropped} dropped ({why}). Check the {role} data, or raise the limit."
        )
    if not dropped:
        return dataset, counts
    # filter, not select(indices): its indices are written beside the data (memory-mapped, cached for the other
    # processes and the next run), where select would hold a Python list of them, one per pair, in each process
    from datasets.fingerprint import Hasher

    form = dataset.format
    kept = rebuilt_if_damaged(
        lambda: dataset.with_format("numpy").filter(
            _usable,
            batched=True,
            batch_size=100_000,
            input_columns=["empty", "source_length", "target_length"],
            fn_kwargs=limits,
            desc=f"dropping unusable {role} pairs",
            # datasets hashes a module's function by its name, not its code: CACHE_VERSION says when that changed
            new_fingerprint=Hasher.hash([CACHE_VERSION, dataset._fingerprint, "drop_unusable", limits]),
        ),
        dataset_cache_folder(dataset),
    )
    kept = kept.with_format(form["type"], form["columns"], form["output_all_columns"], **form["format_kwargs"])
    return kept, counts


def _usable(empty, source_length, target_length, *, max_source_tokens: int, max_target_tokens: int) -> np.ndarray:
    """`drop_unusable`'s test of a batch of pairs (numpy columns)."""
    return ~empty & (source_length <= max_source_tokens) & (target_length <= max_target_tokens)


def example_lengths(dataset) -> np.ndarray:
    """``(N, 2)`` source and target lengths in tokens: from the length columns of `tokenize_dataset`'s
    output, from ``input_ids``/``labels`` of any other Arrow dataset, or from a list of examples."""
    from datasets import Dataset

    if isinstance(dataset, Dataset) and {"source_length", "target_length"} <= set(dataset.column_names):
        return np.stack([column(dataset, "source_length"), column(dataset, "target_length")], axis=1)
    return list_lengths(dataset, ("input_ids", "labels"))


def list_lengths(dataset, names) -> np.ndarray:
    """``(N, len(names))`` lengths of the list fields ``names`` (``input_ids``, ``labels``) of an Arrow dataset
    (read as Arrow, without the lists; a null counts 0) or of a list of examples."""
    from datasets import Dataset

    if isinstance(dataset, Dataset):
        import pyarrow.compute as pc

        table = dataset.select_columns(list(names)).with_format("arrow")[:]
        return np.stack([pc.fill_null(pc.list_value_length(table[name]), 0).to_numpy() for name in names], axis=1)
    rows = [[len(example[name]) for name in names] for example in dataset]
    return np.array(rows, dtype=np.int64).reshape(len(rows), len(names))


# How `tokenizer_training_texts` samples, part of a trained tokenizer's cache key: 2 makes up a short last block
TOKENIZER_SAMPLE_VERSION = 2


def tokenizer_training_texts(dataset, max_pairs: int | None, seed: int = 0, block: int = 1000) -> Iterator[str]:
    """Source and target sentences of up to ``max_pairs`` pairs for training the tokenizer.

    A large corpus is sampled in random contiguous blocks of ``block`` pairs (like sentencepiece's
    ``input_sentence_size``): tokenizer training then costs the same for 4.5M pairs as for 1M, and
    reads only the sampled part of the memory-mapped file.
    """
    rows = len(dataset)
    if max_pairs is None or max_pairs >= rows:
        starts, left = range(0, rows, block), rows
    else:
        blocks, rng = math.ceil(rows / block), np.random.default_rng(seed)
        chosen = {int(b) for b in rng.choice(blocks, size=math.ceil(max_pairs / block), replace=False)}
        if sum(min(block, rows - b * block) for b in chosen) < max_pairs:  # the short last block is among them
            chosen.add(int(rng.choice(sorted(set(range(blocks)) - chosen))))  # one more, a full one
        starts, left = sorted(b * block for b in chosen), max_pairs
    for start in starts:  # exactly the pairs asked for: the last block sampled is cut to them
        batch = dataset[start : min(start + block, rows, start + left)]
        left -= len(batch["source"])
        yield from batch["source"]
        yield from batch["target"]
        if left <= 0:
            return


def tokenizer_cache_dir(text, settings: dict, cache_dir: str | None = None) -> Path:
    """Where a tokenizer trained on ``text`` with ``settings`` is kept for the next run: next to the
    Arrow caches, under a fingerprint of the data and the settings."""
    from datasets import config
    from datasets.fingerprint import Hasher

    root = Path(cache_dir) if cache_dir else Path(config.HF_DATASETS_CACHE)
    return (
        root
        / "vanilla_transformer_tokenizers"
        / Hasher.hash([CACHE_VERSION, text._fingerprint, sorted(settings.items())])
    )


# ---------------------------------------------------------------------------------------------
# The data of a run, from its flags (`options.DataArguments`): each role's text as Arrow, then token ids
# ---------------------------------------------------------------------------------------------

ROLES = ("train", "validation", "test")


def pairs_format(path: str) -> str | None:
    """ ".tsv" or ".jsonl" (".json" counts as JSON Lines) by suffix, ".gz" aside; None for anything else."""
    suffixes = [suffix for suffix in Path(path).suffixes if suffix != ".gz"]
    suffix = suffixes[-1] if suffixes else None
    return ".jsonl" if suffix == ".json" else suffix if suffix in {".tsv", ".jsonl"} else None


def tsv_column(value: str | None, flag: str, default: int) -> int:
    """The 0-based TSV column ``value`` of ``flag`` (``default`` when not given)."""
    if value is None:
        return default
    if not value.isdigit():
        raise ValueError(f"{flag} {value!r}: a TSV column is a 0-based number (e.g. 0 or 1).")
    return int(value)


def check_data_arguments(args) -> None:
    """Counts, lengths and names of the data flags (``args``: `options.DataArguments`), refused before any
    file is read."""
    for name in (
        "max_source_length",
        "max_target_length",
        "max_train_samples",
        "max_eval_samples",
        "max_predict_samples",
        "preprocessing_num_workers",
    ):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be a positive number, got {value}; leave it out for the default.")
    if args.validation_size < 0:
        raise ValueError(f"--validation_size must be 0 or a positive number of pairs, got {args.validation_size}.")
    if args.validation_size and (args.validation_source_file or args.validation_file or args.validation_split):
        raise ValueError("Give validation data or --validation_size (held out from training), not both.")
    for name in ("source_lang", "target_lang"):
        if not getattr(args, name).strip():
            raise ValueError(f"--{name} is empty; give a language code such as en or de.")
    if any(pairs_format(path) == ".tsv" for path in (args.train_file, args.validation_file, args.test_file) if path):
        source = tsv_column(args.source_column, "--source_column", 0)
        if source == tsv_column(args.target_column, "--target_column", 1):  # defaults filled in, numbers compared
            raise ValueError(
                f"--source_column and --target_column both read TSV column {source} (the target's default is 1, "
                "the source's 0): the model would learn to copy. Give the other side's column."
            )
    if args.source_column is not None and args.source_column == args.target_column:
        raise ValueError(
            f"--source_column and --target_column are both {args.source_column!r}: the model would "
            "learn to copy. Give the target's column."
        )
    if args.sacrebleu_tokenize is not None:
        check_sacrebleu_tokenize(args.sacrebleu_tokenize, "--sacrebleu_tokenize")


def role_files(args, role: str) -> dict[str, str]:
    """The role's local files by flag (``--train_source_file``, ...), after checking the flags go together."""
    source_file, target_file = getattr(args, f"{role}_source_file"), getattr(args, f"{role}_target_file")
    pairs_file = getattr(args, f"{role}_file")
    if (source_file is None) != (target_file is None):
        raise ValueError(f"Give both --{role}_source_file and --{role}_target_file, or neither.")
    if source_file and pairs_file:
        raise ValueError(f"Give --{role}_source_file/--{role}_target_file or --{role}_file, not both.")
    if pairs_file and pairs_format(pairs_file) is None:
        raise ValueError(f"--{role}_file {pairs_file!r}: use a .tsv or .jsonl file (optionally .gz).")
    named = {f"--{role}_source_file": source_file, f"--{role}_target_file": target_file, f"--{role}_file": pairs_file}
    return {flag: path for flag, path in named.items() if path}


def refuse_one_file_for_both_sides(args, role: str) -> None:
    """--{role}_source_file and --{role}_target_file name one file (a typo, a link): the model would learn to copy."""
    source, target = getattr(args, f"{role}_source_file"), getattr(args, f"{role}_target_file")
    if source and target and os.path.samefile(source, target):
        same = "are the same file" if Path(source).resolve() == Path(target).resolve() else "are one file (a link)"
        raise ValueError(
            f"--{role}_source_file {source!r} and --{role}_target_file {target!r} {same}: the model would learn to "
            f"copy. Give the {args.target_lang} side's file as --{role}_target_file."
        )


def check_data_files(args) -> None:
    """Every local data file of the flags (``args``: `options.DataArguments`) exists, is a readable non-empty file
    and is not the other side's too; checked before any is read, so that a mistyped test path fails before the
    training corpus is read (and a command that wraps training, before it replaces anything)."""
    for role in ROLES:
        for flag, path in role_files(args, role).items():
            check_file(path, flag)
        refuse_one_file_for_both_sides(args, role)
    if role_files(args, "train") and args.dataset_name:
        raise ValueError("Give training data as files or as --dataset_name, not both.")
    trained = {Path(path).resolve(): flag for flag, path in role_files(args, "train").items()}
    for role in ("validation", "test"):  # allowed (a check that a model fits its data), never unsaid
        for flag, path in role_files(args, role).items():
            if Path(path).resolve() in trained:
                logger.warning(
                    f"{flag} {path} is also {trained[Path(path).resolve()]}: the {role} scores are of pairs the "
                    "model trains on, not of held-out ones."
                )


def local_dataset(args, role: str):
    """The role's local files as an Arrow dataset of (source, target), or None when none are given."""
    role_files(args, role)
    source_file, target_file = getattr(args, f"{role}_source_file"), getattr(args, f"{role}_target_file")
    pairs_file = getattr(args, f"{role}_file")
    if source_file:
        return parallel_text_dataset(
            source_file, target_file, (f"--{role}_source_file", f"--{role}_target_file"), cache_dir=args.cache_dir
        )
    if not pairs_file:
        return None
    what = f"--{role}_file"
    if pairs_format(pairs_file) == ".tsv":
        columns = [
            tsv_column(args.source_column, "--source_column", 0),
            tsv_column(args.target_column, "--target_column", 1),
        ]
        _check_tsv_columns(pairs_file, what, columns)
        return tsv_dataset(pairs_file, *columns, what=what, cache_dir=args.cache_dir)
    if pairs_format(pairs_file) == ".jsonl":
        keys = _json_keys(args, first_json_record(pairs_file, what), f"{what} {pairs_file!r}, first record")
        return jsonl_dataset(pairs_file, *keys, what=what, cache_dir=args.cache_dir)
    raise ValueError(f"{what} {pairs_file!r}: use a .tsv or .jsonl file (optionally .gz).")


def _check_tsv_columns(path: str, what: str, columns: list[int]) -> None:
    """The columns exist on the first line (the reader then holds every line to the same fields)."""
    _, first = next(numbered_lines(path, what))
    fields = len(first.split("\t"))
    for flag, column in zip(("--source_column", "--target_column"), columns):
        if column >= fields:
            raise ValueError(
                f"{flag} {column}: {what} {path!r} has {fields} tab-separated field(s) on line 1, "
                f"columns 0 to {fields - 1}; give the 0-based column of each side."
            )


def _json_keys(args, record: dict, where: str) -> tuple[str, str]:
    """The source and target keys for JSON records (given, or from the language codes), checked on one record."""
    keys = []
    for side in ("source", "target"):
        given, language = getattr(args, f"{side}_column"), getattr(args, f"{side}_lang")
        key = given or default_key(language, record)
        try:
            json_field(record, key, where)
        except ValueError as error:
            origin = f"--{side}_column {given}" if given else f"--{side}_lang {language}"
            raise ValueError(
                f"{error} The key {key!r} comes from {origin}: give --{side}_column with the key "
                f"(dotted for nesting, e.g. translation.{language}), or check --{side}_lang."
            ) from None
        keys.append(key)
    if keys[0] == keys[1]:
        raise ValueError(
            f"Source and target would both be read from {keys[0]!r} ({where}): give different "
            "--source_lang/--target_lang or --source_column/--target_column."
        )
    return keys[0], keys[1]


def check_has_text(dataset, where: str) -> None:
    """A set with at least one pair that has text on both sides, read until the first one: a set of only blank
    pairs would otherwise be found empty after the tokenizer is trained and the training corpus tokenised."""
    batches = dataset.iter(batch_size=1000)
    if not any(s.strip() and t.strip() for batch in batches for s, t in zip(batch["source"], batch["target"])):
        raise ValueError(
            f"{where}: none of its {len(dataset)} pairs has text on both sides (each is empty or blank on one "
            "side or both); give pairs of sentences."
        )


def _hub_split(args, split: str):
    return hub_dataset(
        args.dataset_name,
        args.dataset_config_name,
        split,
        args.source_column,
        args.target_column,
        (args.source_lang, args.target_lang),
        args.preprocessing_num_workers,
        args.cache_dir,
    )


def _first(dataset, count: int | None, flag: str):
    if count is None:
        return dataset
    if count > len(dataset):
        logger.info(f"{flag} {count}: there are only {len(dataset)} pairs; using them all")
    return dataset.select(range(min(count, len(dataset))))


def load_text_datasets(args, seed: int | None = None, train: bool = True) -> dict:
    """``{"train": ..., "validation": ..., "test": ...}`` Arrow datasets of (source, target); None where absent.

    ``args`` is `options.DataArguments`: local files for each role, or a Hub dataset's splits; a validation
    set held out of the training pairs (``validation_size``, drawn with ``seed``, by default `HELD_OUT_SEED`
    whatever the run's --seed); the first N of each.
    ``train=False``: the training pairs are not read (a run that only evaluates or translates, with a tokenizer
    to load), unless ``validation_size`` holds pairs out of them.
    """
    check_data_arguments(args)
    check_data_files(args)
    train = train or bool(args.validation_size)
    # the small sets first: a problem inside a validation or test file shows before the training corpus is read
    local = {
        role: local_dataset(args, role) if train or role != "train" else None
        for role in ("validation", "test", "train")
    }
    for role in ROLES:
        if local[role] is not None:
            check_has_text(local[role], " and ".join(role_files(args, role)))
    datasets = dict(local)
    if args.dataset_name:
        if train:
            # the first N only, unless the split is sliced already (cut after reading) or --validation_size holds
            # pairs out of the whole split first, as it does out of local files
            sliced = args.max_train_samples and "[" not in args.train_split and not args.validation_size
            train_split = (  # each part of a sum of splits (train+test): the first N come from the first parts
                "+".join(f"{part}[:{args.max_train_samples}]" for part in args.train_split.split("+"))
                if sliced
                else args.train_split
            )
            datasets["train"] = _hub_split(args, train_split)  # read only what is asked for
            check_has_text(datasets["train"], f"--dataset_name {args.dataset_name}, split {train_split!r}")
        for role, split in (("validation", args.validation_split), ("test", args.test_split)):
            if datasets[role] is None and split:
                datasets[role] = _hub_split(args, split)
                check_has_text(datasets[role], f"--dataset_name {args.dataset_name}, split {split!r}")
    if args.validation_size:
        if datasets["train"] is None:
            raise ValueError("--validation_size holds out training pairs, but no training data is given.")
        if args.validation_size >= len(datasets["train"]):
            raise ValueError(
                f"--validation_size {args.validation_size} leaves no training data ({len(datasets['train'])} pairs)."
            )
        split = rebuilt_if_damaged(
            lambda: datasets["train"].train_test_split(  # a damaged cached split: rebuilt
                test_size=args.validation_size, shuffle=True, seed=HELD_OUT_SEED if seed is None else seed
            ),
            dataset_cache_folder(datasets["train"]),
        )
        datasets["train"], datasets["validation"] = split["train"], split["test"]
    for role, count in (
        ("train", args.max_train_samples),
        ("validation", args.max_eval_samples),
        ("test", args.max_predict_samples),
    ):
        if datasets[role] is not None:
            datasets[role] = _first(
                datasets[role],
                count,
                {"train": "--max_train_samples", "validation": "--max_eval_samples", "test": "--max_predict_samples"}[
                    role
                ],
            )
    return datasets


def tokenize_pairs(
    dataset,
    tokenizer,
    config,
    role: str = "train",
    *,
    max_source_length: int | None = None,
    max_target_length: int | None = None,
    max_tokens: int | None = None,
    num_proc: int | None = None,
):
    """Token ids of one role's (source, target) pairs, without the empty and too-long ones (counted in the log).

    Too long: beyond ``max_source_length``/``max_target_length``, by default the model's positions, or
    ``max_tokens`` (the batch size) when that is smaller, since such a pair fits in no batch.
    """
    limits, sources = [], []
    positions = config.max_position_embeddings
    for name, given in (("max_source_length", max_source_length), ("max_target_length", max_target_length)):
        if given is not None and given > positions:
            raise ValueError(
                f"--{name} {given} is more than the model's {positions} positions "
                f"(max_position_embeddings); give at most {positions}."
            )
        limits.append(given or min(positions, max_tokens or positions))
        sources.append(
            f"--{name} {given}"
            if given
            else f"--max_tokens {max_tokens}, a batch's tokens"
            if max_tokens and max_tokens < positions
            else f"the model's {positions} positions"
        )
    limits_from = sources[0] if sources[0] == sources[1] else " / ".join(sources)
    ids = tokenize_dataset(dataset, tokenizer, num_proc, desc=f"tokenizing {role}")
    kept, _ = drop_unusable(ids, *limits, role, limits_from=limits_from)
    return kept
