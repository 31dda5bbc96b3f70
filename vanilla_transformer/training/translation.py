"""Translate many sentences with batched beam search, and the ``translate.py`` command line.

`translate` sorts the sentences by length into batches (less padding, fewer wasted decoding steps)
and returns the hypotheses in input order. Decoding follows the model's generation config unless
told otherwise: the paper's 4 beams, length penalty 0.6 and at most (source length + 50) tokens
(§6.1). Empty and whitespace-only inputs give empty outputs without being decoded. Inputs longer
than the model accepts are found before anything is decoded: an error naming the lines, or, on
request, skipped (empty output) or truncated. The command line checks the model folder (complete
weights, a tokenizer), the output paths and the input files before loading anything.

    python training/translate.py --model runs/en-de --input test.en [--output hyp.de] [--references test.de]
    echo "A dog runs." | python training/translate.py --model runs/en-de
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from ..checkpoint_files import (
    check_has_tokenizer,
    check_model_folder,
    from_pretrained_named,
    warn_if_an_average_is_beside,
)
from ..command_line import CommandParser
from ..generation_vanilla_transformer import LENGTH_PENALTY_FORMULAS
from ..pipeline_vanilla_transformer import check_tokenizer_matches_model
from .batching import allow_recompiles
from .data import decoded_lines, read_lines
from .metrics import check_sacrebleu_tokenize

logger = logging.getLogger(__name__)

LONG_INPUT_POLICIES = ("error", "skip", "truncate")
# --static-cache: a batch's sources padded to a multiple of this many tokens, so that the graphs generate()
# compiles for a static cache (one per batch shape) are few: the longest source over 16, plus the last batch
STATIC_CACHE_MULTIPLE = 16
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def source_limit(model, tokenizer) -> int:
    """The most source tokens the model accepts (its positions, or a smaller tokenizer limit)."""
    return min(model.config.max_position_embeddings, tokenizer.model_max_length)


def as_lines(hypotheses: Sequence[str], written_to: str) -> str:
    """The hypotheses one a line, for a file aligned line by line with its source. A byte-level vocabulary
    can produce a line break; each one inside a hypothesis becomes a space, and the lines are named in a
    warning, so that line N stays sentence N."""
    broken = [i for i, hypothesis in enumerate(hypotheses) if "\n" in hypothesis or "\r" in hypothesis]
    if broken:
        logger.warning(
            f"{written_to}: {len(broken)} hypotheses held a line break, written as a space so that each line "
            f"is its sentence's (line {', '.join(str(i + 1) for i in broken[:10])}{' ...' if len(broken) > 10 else ''})"
        )
    return "".join(re.sub(r"\r\n|\r|\n", " ", hypothesis) + "\n" for hypothesis in hypotheses)


def inputs_too_long(model, tokenizer, sentences: Sequence[str], todo: list[int] | None = None):
    """The model's source limit (`source_limit`), the token count of each sentence (those of ``todo``, by
    default all) and the positions of those longer than the limit."""
    todo = range(len(sentences)) if todo is None else todo
    limit = source_limit(model, tokenizer)
    if not todo:  # only blank lines: nothing to tokenize (a fast tokenizer fails on an empty batch)
        return limit, {}, []
    lengths = {i: len(ids) for i, ids in zip(todo, tokenizer([sentences[i] for i in todo])["input_ids"])}
    return limit, lengths, [i for i in todo if lengths[i] > limit]


def where_too_long(too_long: list[int], lengths: dict, lines_of: str | None, line_numbers=None) -> str:
    """Where the first ten too-long inputs are: "FILE, line 3 (70 tokens), ...", or "number 3 ..." without a file.
    ``line_numbers[i]``: input i's line in the file, where that is not i + 1 (a .jsonl file with blank lines)."""
    return (
        (f"{lines_of}, line" if lines_of else "number")
        + " "
        + ", ".join(f"{line_numbers[i] if line_numbers else i + 1} ({lengths[i]} tokens)" for i in too_long[:10])
        + (" ..." if len(too_long) > 10 else "")
    )


def translate(
    model,
    tokenizer,
    sentences: Sequence[str],
    batch_size: int = 64,
    long_inputs: str = "error",
    progress: bool = False,
    lines_of: str | None = None,
    pad_to_multiple_of: int | None = None,
    flags: Mapping[str, str] | None = None,
    counts: dict | None = None,
    **generate_kwargs,
) -> list[str]:
    """Translate ``sentences`` in batches of similar length; returns hypotheses in input order.

    Args:
        long_inputs: what to do with an input longer than the model accepts: ``"error"`` (before
            decoding anything, naming the 1-based input numbers), ``"skip"`` (empty hypothesis,
            logged) or ``"truncate"`` (cut to the limit, ``</s>`` kept; logged).
        progress: show a progress bar (tqdm) with sentences per second.
        lines_of: the file the sentences are the lines of (e.g. ``"--input test.en"``), for messages
            that name lines rather than input numbers.
        pad_to_multiple_of: pad each batch's sources to a multiple of this many tokens (at most the model's
            limit), so that batches come in few shapes: with ``cache_implementation="static"``, generate()
            compiles one graph per shape on CUDA. The hypotheses are those of the unpadded batch (§6.1's length
            limit is each sentence's own).
        flags: the command line's flags for ``long_inputs`` and ``max_new_tokens``, for the messages that say how
            to change them (``{"max_new_tokens": "--max-new-tokens"}``); without, they name these arguments.
        counts: a dict to fill in with what happened: ``decoded`` (the inputs decoded: not blank, not skipped),
            ``unfinished`` (those of them cut off by the length limit, without ``</s>``), ``skipped`` and
            ``truncated`` (inputs longer than the model accepts).
        generate_kwargs: passed to ``model.generate`` (e.g. ``num_beams=1``).
    """
    flags = {"long_inputs": 'long_inputs="skip" or "truncate"', "max_new_tokens": "max_new_tokens", **(flags or {})}
    if isinstance(sentences, str):
        raise TypeError(
            "translate takes a list of sentences and got one string, which it would translate character by "
            "character: give [sentence]."
        )
    sentences = list(sentences)  # a generator or other iterator: read once, here
    if wrong := next(((i, s) for i, s in enumerate(sentences) if not isinstance(s, str)), None):
        raise TypeError(f"sentence {wrong[0] + 1} (1-based) is a {type(wrong[1]).__name__}, not a string.")
    check_tokenizer_matches_model(tokenizer, model.config, warn=False)  # else an IndexError deep in the model
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    if long_inputs not in LONG_INPUT_POLICIES:
        raise ValueError(f"long_inputs must be one of {LONG_INPUT_POLICIES}, got {long_inputs!r}.")
    returned = generate_kwargs.get("num_return_sequences") or model.generation_config.num_return_sequences or 1
    if returned != 1:  # one hypothesis a sentence, in the sentences' order
        raise ValueError(
            f"translate gives one translation a sentence; num_return_sequences={returned} (from the call or the "
            "model's generation_config.json) asks for several: set it to 1, or call model.generate() for n-best lists."
        )
    hypotheses = ["" for _ in sentences]
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]  # blank lines stay blank
    limit, lengths, too_long = inputs_too_long(model, tokenizer, sentences, todo)
    if too_long:
        where = where_too_long(too_long, lengths, lines_of)
        if long_inputs == "error":
            raise ValueError(
                f"{len(too_long)} input(s) are longer than the {limit} tokens the model accepts: {where}. Shorten "
                f"them, or choose to skip or truncate them ({flags['long_inputs']})."
            )
        logger.warning(
            f"{'skipping' if long_inputs == 'skip' else 'truncating'} {len(too_long)} input(s) longer "
            f"than {limit} tokens: {where}"
        )
        if long_inputs == "skip":
            todo = [i for i in todo if lengths[i] <= limit]
    order = sorted(todo, key=lambda i: lengths[i])
    static = (generate_kwargs.get("cache_implementation") or model.generation_config.cache_implementation) == "static"
    if static and pad_to_multiple_of:  # torch.compile keeps 8 graphs by default, then decodes the rest uncompiled
        batches = (order[start : start + batch_size] for start in range(0, len(order), batch_size))
        allow_recompiles(
            len({(len(b), padded_width(min(lengths[b[-1]], limit), pad_to_multiple_of, limit)) for b in batches})
        )
    model.eval()
    bar = _progress_bar(len(order), progress)
    unfinished = []
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        batch = tokenizer(
            [sentences[i] for i in indices], return_tensors="pt", padding=True, truncation=True, max_length=limit
        )
        if pad_to_multiple_of:
            batch = padded_to_multiple(batch, pad_to_multiple_of, limit, tokenizer.pad_token_id)
        batch = batch.to(model.device)
        with torch.inference_mode():
            generated = model.generate(**batch, **generate_kwargs)
        for index, text in zip(indices, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            hypotheses[index] = text
        unfinished += [index for index, ended in zip(indices, _ended(generated, model, generate_kwargs)) if not ended]
        bar.update(len(indices))
    bar.close()
    if unfinished:
        _warn_unfinished(sorted(unfinished), len(order), lines_of, flags["max_new_tokens"])
    if counts is not None:
        counts.update(
            decoded=len(order),
            unfinished=len(unfinished),
            skipped=len(too_long) if long_inputs == "skip" else 0,
            truncated=len(too_long) if long_inputs == "truncate" else 0,
        )
    return hypotheses


def padded_width(width: int, multiple: int, limit: int) -> int:
    """``width`` rounded up to a multiple of ``multiple``, or ``limit`` where the multiple would pass it (the model
    has no positions beyond)."""
    return min(-(-width // multiple) * multiple, max(limit, width))


def padded_to_multiple(batch, multiple: int, limit: int, pad_token_id: int):
    """``batch`` (input_ids, attention_mask; padded on the right) widened with padding to `padded_width`."""
    width = batch["input_ids"].shape[1]
    extra = padded_width(width, multiple, limit) - width
    if extra:
        batch["input_ids"] = torch.nn.functional.pad(batch["input_ids"], (0, extra), value=pad_token_id)
        batch["attention_mask"] = torch.nn.functional.pad(batch["attention_mask"], (0, extra), value=0)
    return batch


def _ended(generated: torch.Tensor, model, generate_kwargs: dict) -> list[bool]:
    """Whether each generated row (decoder start token first) contains ``</s>``."""
    eos = generate_kwargs.get("eos_token_id", model.generation_config.eos_token_id)
    if eos is None:
        return [True] * len(generated)
    eos = torch.tensor(eos if isinstance(eos, list) else [eos], device=generated.device)
    return torch.isin(generated[:, 1:], eos).any(dim=1).tolist()


def _warn_unfinished(unfinished: list[int], total: int, lines_of: str | None, length_flag: str) -> None:
    """Say which translations the length limit cut off: an undertrained model loops instead of ending."""
    where = (
        (f"{lines_of}, line" if lines_of else "number")
        + " "
        + ", ".join(str(i + 1) for i in unfinished[:10])
        + (" ..." if len(unfinished) > 10 else "")
    )
    logger.warning(
        f"{len(unfinished)} of {total} translation(s) reached the length limit without </s> and are cut off: "
        f"{where}. Long inputs may need a longer limit ({length_flag}); a model that repeats "
        "itself instead of ending is undertrained: train it longer, or decode with no_repeat_ngram_size=3 (not in "
        "the paper)."
    )


def _progress_bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="sentence", desc="translating", disable=not enabled, file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def build_parser(prog: str = "vanilla-transformer translate") -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        epilog="Every flag is also accepted with underscores (--num_beams).",
    )
    parser.add_argument("--model", required=True, help="model folder or Hub id (with its tokenizer)")
    parser.add_argument("--tokenizer", help="tokenizer, if not the model's")
    parser.add_argument("--input", default="-", help="source sentences, one a line (.gz ok); '-' = stdin")
    parser.add_argument("--output", default="-", help="where hypotheses go, one a line (.gz: compressed); '-' = stdout")
    parser.add_argument("--references", help="reference translations, aligned with --input: print BLEU and chrF")
    parser.add_argument(
        "--metrics-json", help="also write the scores (and timing) to this JSON file; '-' = stdout, with --output FILE"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument("--num-beams", type=int, help="default: the model's generation config (paper: 4)")
    parser.add_argument("--length-penalty", type=float, help="default: the model's generation config (paper: 0.6)")
    parser.add_argument(
        "--length-penalty-formula",
        choices=LENGTH_PENALTY_FORMULAS,
        help="gnmt: ((5 + |Y|) / 6)^alpha (the paper's), length: |Y|^alpha (transformers'); "
        "default: the model's generation config",
    )
    parser.add_argument("--max-new-tokens", type=int, help="default: source length + 50 (§6.1)")
    parser.add_argument(
        "--static-cache",
        action="store_true",
        help="beam search with a static cache, which generate() compiles on CUDA (CUDA graphs: a graph per batch "
        f"shape, sources padded to a multiple of {STATIC_CACHE_MULTIPLE} tokens); the same translations (not "
        "measured)",
    )
    long = parser.add_mutually_exclusive_group()
    long.add_argument("--skip-long", action="store_true", help="inputs longer than the model accepts: empty output")
    long.add_argument("--truncate", action="store_true", help="inputs longer than the model accepts: cut them")
    parser.add_argument("--sacrebleu-tokenize", help="sacreBLEU tokenizer (default 13a; 'zh', 'ja-mecab', ...)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda where available, else cpu)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights and activations")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--attention-png", metavar="DIR", help="write attention pictures of the first inputs here")
    parser.add_argument("--attention-count", type=int, default=3, help="how many inputs get pictures")
    return parser


def parse_args(argv=None, prog: str = "vanilla-transformer translate") -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for name in ("batch_size", "num_beams", "max_new_tokens", "attention_count"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "attention_count" else 1):
            parser.error(
                f"--{name.replace('_', '-')} must be {'>= 0' if name == 'attention_count' else 'positive'}, got {value}"
            )
    if args.length_penalty is not None and not math.isfinite(args.length_penalty):
        parser.error(f"--length-penalty must be a finite number (the paper: 0.6), got {args.length_penalty}")
    return args


def read_input(path: str, what: str) -> list[str]:
    """Lines of a text file (plain or .gz) or of stdin ('-'), without line endings, by the same rules
    (UTF-8 with the line named when invalid, a byte-order mark dropped)."""
    if path == "-":
        return [text for _, text in decoded_lines(sys.stdin.buffer, f"{what} (standard input)")]
    return read_lines(path, what)


def check_paths(args: argparse.Namespace) -> None:
    """What can be wrong with the paths and names before the model is loaded and anything decoded:
    the model folder and its tokenizer, and every file the results go to."""
    if args.input == "-" and args.references == "-":
        raise ValueError("--input - and --references - would both read standard input: give one of them a file.")
    check_model_folder(args.model, f"--model {args.model}")
    if args.tokenizer:
        check_has_tokenizer(
            args.tokenizer, f"--tokenizer {args.tokenizer}", "Give the folder saved with the tokenizer."
        )
    else:
        check_has_tokenizer(
            args.model, f"--model {args.model}", "Give the tokenizer the model was trained with: --tokenizer FOLDER."
        )
    inputs = {Path(path).resolve() for path in (args.input, args.references) if path and path != "-"}
    outputs = {
        flag: path
        for flag, path in (("--output", args.output), ("--metrics-json", args.metrics_json))
        if path not in {None, "-"}
    }
    for flag, path in outputs.items():
        _check_writable(flag, Path(path), inputs)
    if len({Path(path).resolve() for path in outputs.values()}) < len(outputs):
        raise ValueError(f"--output and --metrics-json are both {args.output}: one would overwrite the other.")
    if args.attention_png and Path(args.attention_png).exists() and not Path(args.attention_png).is_dir():
        raise NotADirectoryError(f"--attention-png {args.attention_png} is a file; give a folder.")
    if args.sacrebleu_tokenize is not None:
        check_sacrebleu_tokenize(args.sacrebleu_tokenize, "--sacrebleu-tokenize")
    if args.metrics_json == "-" and args.output == "-":
        raise ValueError("--metrics-json - and --output - would both write to stdout: give --output a file.")
    try:
        torch.device(args.device)
    except RuntimeError:
        raise ValueError(f"--device {args.device}: not a device; give cpu, cuda, cuda:1, mps, ...") from None
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: no CUDA device is available here; use --device cpu.")
    try:  # mps or xpu where torch has none, cuda:3 of two GPUs: before the model is loaded
        torch.empty(0, device=args.device)
    except (RuntimeError, AssertionError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"--device {args.device}: not available here ({reason}); use --device cpu.") from None


def _check_writable(flag: str, path: Path, inputs: set[Path]) -> None:
    if path.is_dir():
        raise IsADirectoryError(f"{flag} {path} is a folder; give a file name.")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{flag} {path}: the folder {path.parent} does not exist; create it first.")
    if not os.access(path if path.exists() else path.parent, os.W_OK):  # an existing file: its own permission
        raise PermissionError(f"{flag} {path} cannot be written; choose a writable place.")
    if path.resolve() in inputs:
        raise ValueError(f"{flag} {path} is also an input file, which writing would destroy; choose another name.")


def main(argv=None, prog: str = "vanilla-transformer translate") -> dict:
    """``vanilla-transformer translate``: the hypotheses on --output, scores on stderr; the results as a dict."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from .metrics import score

    args = parse_args(argv, prog)
    check_paths(args)
    sources = read_input(args.input, "--input")
    if not sources:
        raise ValueError(f"--input {args.input} has no lines: nothing to translate.")
    references = read_input(args.references, "--references") if args.references else None
    if references is not None and len(references) != len(sources):
        raise ValueError(
            f"--input {args.input} has {len(sources)} lines but --references has {len(references)} ({args.references}); "
            "line i of the references must translate line i of the input, so they need the same number of lines."
        )
    with progress_bars(not args.no_progress):  # transformers' own: "Loading weights", downloads
        model = from_pretrained_named(
            AutoModelForSeq2SeqLM.from_pretrained, args.model, f"--model {args.model}", dtype=DTYPES[args.dtype]
        ).to(args.device)
        flag = f"--tokenizer {args.tokenizer}" if args.tokenizer else f"--model {args.model}"
        tokenizer = from_pretrained_named(AutoTokenizer.from_pretrained, args.tokenizer or args.model, flag)
        warn_if_an_average_is_beside(args.model, "--model")
    if args.tokenizer:
        fix = f"Leave --tokenizer out to use the one saved with --model {args.model}, or give the tokenizer it was "
        fix += "trained with."
    else:
        fix = f"--model {args.model} holds another tokenizer: give the one it was trained with, --tokenizer FOLDER."
    check_tokenizer_matches_model(tokenizer, model.config, fix=fix)
    generate_kwargs = {
        key: value
        for key, value in {
            "num_beams": args.num_beams,
            "length_penalty": args.length_penalty,
            "max_new_tokens": args.max_new_tokens,
            "length_penalty_formula": args.length_penalty_formula,
        }.items()
        if value is not None
    }
    if args.static_cache:
        generate_kwargs["cache_implementation"] = "static"
    long_inputs = "skip" if args.skip_long else "truncate" if args.truncate else "error"
    started = time.perf_counter()
    counts = {}
    hypotheses = translate(
        model,
        tokenizer,
        sources,
        args.batch_size,
        long_inputs=long_inputs,
        progress=not args.no_progress,
        lines_of=f"--input {args.input}",
        pad_to_multiple_of=STATIC_CACHE_MULTIPLE if args.static_cache else None,
        flags={"long_inputs": "--skip-long or --truncate", "max_new_tokens": "--max-new-tokens"},
        counts=counts,
        **generate_kwargs,
    )
    seconds = time.perf_counter() - started
    text = as_lines(hypotheses, f"--output {args.output}")
    if args.output == "-":
        sys.stdout.write(text)
    elif args.output.endswith(".gz"):  # read back by every reader here, as --input is
        with gzip.open(args.output, "wt", encoding="utf-8", newline="") as file:
            file.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
    result = {"sentences": len(sources), "seconds": seconds, "sentences_per_second": len(sources) / max(seconds, 1e-9)}
    if counts:  # as translate() filled it in
        # of the lines decoded (not blank, not skipped), the share cut off by the length limit: 0 for a trained model
        result["unfinished_percent"] = 100 * counts["unfinished"] / max(counts["decoded"], 1)
        result["skipped_long"], result["truncated_long"] = counts["skipped"], counts["truncated"]
    if references is not None:  # the lines as written (a line break inside a hypothesis is a space there)
        result.update(score(text.split("\n")[:-1], references, tokenize=args.sacrebleu_tokenize))
        print(f"BLEU {result['bleu']:.2f}  ({result['bleu_signature']})", file=sys.stderr)
        print(f"chrF {result['chrf']:.2f}  ({result['chrf_signature']})", file=sys.stderr)
    if args.attention_png:
        pictures, skipped = write_pictures(model, tokenizer, sources, hypotheses, args)
        result["attention_pictures"] = [str(p) for p in pictures]
        result["attention_skipped"] = skipped
    if args.metrics_json == "-":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    elif args.metrics_json:
        Path(args.metrics_json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


@contextlib.contextmanager
def progress_bars(shown: bool):
    """transformers' progress bars on or off for the block, as they were afterwards."""
    from transformers.utils import logging as transformers_logging

    were_shown = transformers_logging.is_progress_bar_enabled()
    if not shown:
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if were_shown:
            transformers_logging.enable_progress_bar()


def write_pictures(
    model, tokenizer, sources: Sequence[str], hypotheses: Sequence[str], args
) -> tuple[list[Path], list[int]]:
    """Attention pictures (Figures 3-5 of the paper) of the first inputs with their translations, a folder each.

    An empty translation has no target side to draw, and an input longer than the model accepts (skipped or
    truncated by --skip-long / --truncate) cannot be read whole: such inputs are skipped, said on stderr, and
    their indices returned in the second list, so the translations themselves are never held back.
    """
    from ..visualization import write_attention_pictures

    first = list(zip(sources[: args.attention_count], hypotheses))
    limit, _, too_long = inputs_too_long(model, tokenizer, sources, [i for i, (s, _) in enumerate(first) if s.strip()])
    empty = [index for index, (_, hypothesis) in enumerate(first) if not hypothesis.strip() and index not in too_long]
    paths = []
    for index, (source, hypothesis) in enumerate(first):
        if index not in empty and index not in too_long:
            folder = Path(args.attention_png) / f"{index:04d}"
            paths += write_attention_pictures(model, tokenizer, source, folder, target=hypothesis)
    for indices, reason in ((empty, "their translation is empty"), (too_long, f"longer than the {limit} tokens")):
        if indices:
            lines = ", ".join(str(index + 1) for index in indices)  # folders count from 0000, lines from 1
            print(f"No attention pictures for line(s) {lines} of the input: {reason}.", file=sys.stderr)
    return paths, sorted(empty + too_long)


if __name__ == "__main__":
    from vanilla_transformer.cli import run_command

    run_command("translate", sys.argv[1:])
