"""How full a token batch is: sentences and real tokens per batch of a corpus, with and without bucket shapes.

    python benchmarks/batch_fill.py --data-dir ../shared/data/multi30k            # the Multi30k recipe's batches
    python benchmarks/batch_fill.py --data-dir DIR --source en --target fr --max-tokens 1024 --vocab-size 8000

Tokenises ``train.{source,target}.gz`` of ``--data-dir`` with a joint BPE of ``--vocab-size`` trained on
them (what the Multi30k recipe trains), packs one epoch with `TokenBatchSampler` as the trainer does
(``--pad_to_buckets never``, the default without ``--torch_compile``) and padded to bucket shapes
(``always``), and prints one JSON line per packing: batches, sentences per batch, and the share of each
batch's ``max_tokens`` padded tokens a side that are real tokens. Nothing is timed: the numbers depend on
the data and the packing only, not on the machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vanilla_transformer import train_tokenizer
from vanilla_transformer.training import TokenBatchSampler, read_parallel


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="holds train.SOURCE.gz and train.TARGET.gz")
    parser.add_argument("--source", default="en")
    parser.add_argument("--target", default="de")
    parser.add_argument("--max-tokens", type=int, default=1024, help="padded tokens per batch and side")
    parser.add_argument("--vocab-size", type=int, default=8000, help="the joint BPE's vocabulary")
    return parser.parse_args(argv)


def corpus_lengths(args) -> np.ndarray:
    """(source, target) token counts of the training pairs, end-of-sentence included."""
    pairs = read_parallel(args.data_dir / f"train.{args.source}.gz", args.data_dir / f"train.{args.target}.gz")
    sources, targets = [source for source, _ in pairs], [target for _, target in pairs]  # aligned, or refused
    tokenizer = train_tokenizer(iter(sources + targets), vocab_size=args.vocab_size)
    encoded = tokenizer(sources, text_target=targets)
    return np.array(
        [(len(s), len(t)) for s, t in zip(encoded["input_ids"], encoded["labels"], strict=True)], dtype=np.int64
    )


def fill(lengths: np.ndarray, max_tokens: int, pad_to_buckets: bool) -> dict:
    sampler = TokenBatchSampler(lengths, max_tokens, pad_to_buckets=pad_to_buckets)
    return {
        "pad_to_buckets": pad_to_buckets,
        "max_tokens": max_tokens,
        "pairs": len(lengths),
        "batches": sampler.num_batches,
        "sentences_per_batch": round(len(lengths) / sampler.num_batches, 1),
        "real_share_of_padded_tokens": round(float(lengths.sum()) / (2 * max_tokens * sampler.num_batches), 4),
    }


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    lengths = corpus_lengths(args)
    results = [fill(lengths, args.max_tokens, buckets) for buckets in (False, True)]
    for result in results:
        print(json.dumps(result), flush=True)
    return results


if __name__ == "__main__":
    main()
