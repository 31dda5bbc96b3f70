"""The beam search of a commit against the working tree's, on the same model, in one process.

    python benchmarks/search_ab.py --base c5a4970 [--data-dir ../shared/data/multi30k] [--marian-model DIR]
        [--sentences 256] [--rounds 7] [--processor NAME=VALUE ...]

For deciding whether a change to the search pays, where separate runs of `decoding.py` differ by more than
the change: the base commit's ``generation_vanilla_transformer.py`` is read with ``git show`` and loaded beside
the working tree's, and rounds alternate between the two `BeamSearch` classes (AB, BA, AB, ...), each round
decoding the same batches of 32 test sentences at beam 4 with the same model (`decoding.load_models`), one
thread, timed in CPU time. Printed: each search's median seconds, the base / working tree ratio of every round
with its median (above 1: the working tree is faster), and whether both gave the same hypotheses. The base
module is loaded as a module of the package, so its relative imports (``from .private_api import require``)
are the working tree's, and it must fit the model's current interface: meant for nearby commits.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import vanilla_transformer.generation_vanilla_transformer as generation
from common import REPO, add_data_dir, argument_parser, multi30k_folder, read_split
from decoding import load_models, make_batches, processor_setting, transformers_decoder

MODULE = "vanilla_transformer/generation_vanilla_transformer.py"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--base", required=True, help="the commit whose search is compared (e.g. HEAD~1)")
    add_data_dir(parser)
    parser.add_argument("--marian-model", help="a trained MarianMTModel folder with its tokenizer (default: random)")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7, help="timed passes per search")
    parser.add_argument(
        "--processor",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a generate() setting that adds a logits processor (repeatable), as in decoding.py",
    )
    args = parser.parse_args(argv)
    args.processors = dict(processor_setting(text, parser) for text in args.processor)
    return args


def search_of(commit: str):
    """The `BeamSearch` class of ``commit``'s generation module."""
    try:
        source = subprocess.run(
            ["git", "show", f"{commit}:{MODULE}"], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout
    except subprocess.CalledProcessError as error:
        raise SystemExit(f"--base {commit}: git cannot show {MODULE} there ({error.stderr.strip()})") from None
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "generation_base.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("vanilla_transformer.generation_base", path)  # `from .x` works
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.BeamSearch


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    data_dir = multi30k_folder(args.data_dir, "nothing to compare")
    if data_dir is None:
        return None
    torch.set_num_threads(1)
    searches = {"base": search_of(args.base), "working tree": generation.BeamSearch}
    marian, ours, tokenizer, trained = load_models(args, data_dir)
    pairs = read_split(data_dir, "test_2016_flickr", limit=args.sentences)
    decode = transformers_decoder(ours, tokenizer, make_batches(tokenizer, pairs, 32, trained), 4, args.processors)
    seconds, hypotheses = {name: [] for name in searches}, {}
    try:
        for round_ in range(args.rounds):
            for name in list(searches)[:: 1 if round_ % 2 == 0 else -1]:
                generation.BeamSearch = searches[name]  # what generate()'s beam search runs
                start = time.process_time()
                hypotheses[name] = decode()
                seconds[name].append(time.process_time() - start)
    finally:
        generation.BeamSearch = searches["working tree"]
    ratios = [base / new for base, new in zip(seconds["base"], seconds["working tree"])]
    result = {
        "medians": {name: statistics.median(times) for name, times in seconds.items()},
        "ratios": ratios,
        "median_ratio": statistics.median(ratios),
        "identical": hypotheses["base"] == hypotheses["working tree"],
    }
    print(f"median seconds: base {result['medians']['base']:.3f}, working tree {result['medians']['working tree']:.3f}")
    print(
        f"base / working tree per round: {', '.join(f'{r:.3f}' for r in ratios)}; median "
        f"{result['median_ratio']:.3f} ({min(ratios):.2f}-{max(ratios):.2f}); identical hypotheses: "
        f"{result['identical']}"
    )
    return result


if __name__ == "__main__":
    main()
