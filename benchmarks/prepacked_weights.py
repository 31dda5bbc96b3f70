"""What the opt-in prepacked weights (`vanilla_transformer.cpu_decoding`) cost and save, by model size, batch
and output length.

    python benchmarks/prepacked_weights.py [--d-model 512 --ffn 2048 --layers 6 --heads 8 --vocab 58000]
        [--batches 1,8] [--new-tokens 3,8,20] [--processor] [--repeats 5] [--threads N]

On the CPU, `prepack_for_cpu_decoding(model)` makes the decoder FFN's and the output projection's layers
multiply by their weights reordered for oneDNN (once, at their first product, and again after a change). The
reorder and the copy grow with the weights, the saving with the number of decoding steps. This times
generate() on a model and on a copy of it with the switch on, alternating, with random weights (no data
needed; they almost never emit ``</s>``, so every call decodes its N steps): a source of 20 tokens, beam 4,
``max_new_tokens = N``: the paper's decoding, which `BeamSearch` runs through its lean step.
``--processor`` also sets ``min_new_tokens = N``, a logits processor, which takes the general step. The
first call of each pair reorders the weights. Medians over the repeats; the outputs must be identical. On
trained weights, `benchmarks/decoding.py --levers` times it (docs/benchmarks/speed.md).
The defaults are an opus-mt-sized model (Helsinki-NLP's MarianMT models: 512/2048, 6+6 layers, 58k).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import argument_parser
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.cpu_decoding import prepack_for_cpu_decoding, unprepack

SOURCE_TOKENS = 20


def integers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=58000)
    parser.add_argument("--batches", type=integers, default=[1, 8], help="sentences per call, comma-separated")
    parser.add_argument("--new-tokens", type=integers, default=[3, 8, 20], help="output lengths, comma-separated")
    parser.add_argument("--processor", action="store_true", help="also min_new_tokens = N (a logits processor)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.vocab <= 4 or args.repeats < 1 or not args.batches or not args.new_tokens:
        parser.error("--vocab must exceed the 4 special ids, --repeats be at least 1, and the lists non-empty")
    return args


def timed_generate(
    model, input_ids: torch.Tensor, new_tokens: int, prepacked: bool, processor: bool = False
) -> tuple[float, torch.Tensor]:
    """generate() on ``model`` with its FFN and output-projection weights prepacked (the switch on) or plain."""
    (prepack_for_cpu_decoding if prepacked else unprepack)(model)
    at_least = {"min_new_tokens": new_tokens} if processor else {}
    started = time.perf_counter()
    output = model.generate(
        input_ids=input_ids, num_beams=4, max_new_tokens=new_tokens, early_stopping=True, **at_least
    )
    return time.perf_counter() - started, output


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = VanillaTransformerConfig(
        vocab_size=args.vocab,
        d_model=args.d_model,
        encoder_ffn_dim=args.ffn,
        decoder_ffn_dim=args.ffn,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
    )
    model = VanillaTransformerForConditionalGeneration(config).eval()
    print(
        f"d_model {args.d_model}, FFN {args.ffn}, {args.layers}+{args.layers} layers, vocabulary {args.vocab}; "
        f"beam 4, source {SOURCE_TOKENS} tokens; {'with' if args.processor else 'no'} min_new_tokens processor; "
        f"{torch.get_num_threads()} threads, {args.repeats} repeats\n"
    )
    print(
        "| sentences per call | new tokens (decoded) | plain weights ms | prepacked ms | prepacked speed-up | outputs |"
    )
    print("|---|---|---|---|---|---|")
    rows = []
    try:
        for batch in args.batches:
            input_ids = torch.randint(
                4, args.vocab, (batch, SOURCE_TOKENS), generator=torch.Generator().manual_seed(batch)
            )
            for new_tokens in args.new_tokens:
                seconds = {True: [], False: []}
                outputs = {
                    flag: timed_generate(model, input_ids, new_tokens, flag, args.processor)[1]
                    for flag in (True, False)
                }
                for _ in range(args.repeats):
                    for flag in (True, False):
                        elapsed, outputs[flag] = timed_generate(model, input_ids, new_tokens, flag, args.processor)
                        seconds[flag].append(elapsed)
                plain, packed = statistics.median(seconds[False]), statistics.median(seconds[True])
                identical = torch.equal(outputs[True], outputs[False])
                decoded = outputs[True].shape[1] - 1  # after the start token
                rows.append(
                    {
                        "batch": batch,
                        "new_tokens": new_tokens,
                        "decoded": decoded,
                        "plain": plain,
                        "prepacked": packed,
                        "identical": identical,
                    }
                )
                print(
                    f"| {batch} | {new_tokens} ({decoded}) | {plain * 1e3:.0f} | {packed * 1e3:.0f} | {plain / packed:.2f}x | "
                    f"{'identical' if identical else 'DIFFERENT'} |",
                    flush=True,
                )
    finally:
        unprepack(model)
    return rows


if __name__ == "__main__":
    main()
