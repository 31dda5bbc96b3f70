"""train's evaluation in the input order against sorted by length (``--eval_order``), on the same model and sentences.

    python benchmarks/evaluation_order.py --model runs/multi30k-eab1ee5/ours-1 \
        [--data-dir ../shared/data/multi30k] [--split val] [--repeats 3] [--batch-size 64] [--device cpu]

`TransformerTrainer.evaluate()` as ``train`` runs it (``predict_with_generate``, the model's generation config:
beam 4 and the paper's length limit, `TranslationMetrics`), once with ``--eval_order input`` and once with
``--eval_order length``, alternating (``--repeats`` timed passes each after one untimed pass): the median
sentences per second of each, their ratio, and each order's BLEU, chrF, ``gen_len`` and validation loss: equal
where every hypothesis ends with ``</s>`` (the batches differ, so the last digits of the loss may); a hypothesis
cut by the length limit (the batch's longest source + 50) may be shorter in a sorted batch. ``--model``: a trained model
folder (a ``train`` output, e.g. a Multi30k run of benchmarks/multi30k.py); the sentences are a Multi30k split
of ``--pair``. `benchmarks/gpu.py` runs `evaluation_speed` on a GPU with a random model (its "evaluation" row).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

import torch

from common import add_data_dir, alternate, argument_parser, machine, multi30k_folder, read_split, speed_ratio

ORDERS = ("input", "length")
LARGER = "length, larger batch"
STATIC = "length, static cache"  # --static_cache_decoding: compiled by generate() on CUDA, a graph per shape


def parse_args(argv=None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--model", required=True, help="a trained model folder with its tokenizer")
    add_data_dir(parser)
    parser.add_argument("--pair", default="en-de")
    parser.add_argument("--split", default="val", help="val, test_2016_flickr or train")
    parser.add_argument("--limit", type=int, help="the first N sentences of the split (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes of each order")
    parser.add_argument("--batch-size", type=int, default=64, help="--per_device_eval_batch_size (the recipes' 64)")
    parser.add_argument(
        "--larger-batch", type=int, help="also sorted by length in batches of this many sentences (e.g. 256)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.batch_size < 1 or (args.larger_batch is not None and args.larger_batch < 1):
        parser.error("--repeats, --batch-size and --larger-batch must be at least 1")
    return args


def evaluation_speed(
    model,
    tokenizer,
    pairs: list[tuple[str, str]],
    *,
    batch_size: int,
    device: str,
    repeats: int,
    bf16: bool = False,
    larger_batch: int | None = None,
    static_cache: bool = False,
) -> dict:
    """`TransformerTrainer.evaluate()` of ``model`` on ``pairs`` in each order of `ORDERS`, alternating: per
    order the seconds of each timed pass, the sentences per second of the median pass and the last pass's
    metrics; and how many times faster sorting by length evaluated (median ratio and the range of the passes).
    With ``larger_batch``, also sorted by length in batches of that many sentences ("length, larger batch", in the
    same alternation) and how many times faster than sorted in ``batch_size`` (on a GPU, where a beam step of
    a few sentences waits on kernel launches). With ``static_cache``, also sorted with ``--static_cache_decoding``
    ("length, static cache": its graphs compiled in the untimed first pass) and how many times faster than sorted."""
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq

    from vanilla_transformer.training import TransformerTrainer, TransformerTrainingArguments, TranslationMetrics

    sources, targets = [source for source, _ in pairs], [target for _, target in pairs]
    dataset = Dataset.from_dict(dict(tokenizer(sources, text_target=targets)))
    model = model.to(device).eval()
    variants = {order: (order, batch_size, False) for order in ORDERS}
    if larger_batch:
        variants[LARGER] = ("length", larger_batch, False)
    if static_cache:
        variants[STATIC] = ("length", batch_size, True)
    with tempfile.TemporaryDirectory() as folder:
        trainers = {
            name: TransformerTrainer(
                model=model,
                args=TransformerTrainingArguments(
                    output_dir=folder,
                    predict_with_generate=True,
                    per_device_eval_batch_size=size,
                    eval_order=order,
                    static_cache_decoding=static,
                    use_cpu=device == "cpu",
                    bf16=bf16,
                    bf16_full_eval=bf16,
                    report_to="none",
                    disable_tqdm=True,
                ),
                eval_dataset=dataset,
                processing_class=tokenizer,
                data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
                compute_metrics=TranslationMetrics(tokenizer),
            )
            for name, (order, size, static) in variants.items()
        }

        def evaluate(name: str):
            metrics = trainers[name].evaluate()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            return metrics

        seconds, metrics = alternate({name: (lambda name=name: evaluate(name)) for name in variants}, repeats)
    faster, lowest, highest = speed_ratio(seconds["input"], seconds["length"])
    result = {
        "sentences": len(pairs),
        "batch_size": batch_size,
        "num_beams": model.generation_config.num_beams,
        **{
            name: {
                "seconds": seconds[name],
                "sentences_per_second": len(pairs) / statistics.median(seconds[name]),
                **{key: metrics[name][f"eval_{key}"] for key in ("bleu", "chrf", "loss", "gen_len")},
            }
            for name in variants
        },
        "length_over_input": faster,
        "length_over_input_range": [lowest, highest],
    }
    if larger_batch:
        faster, lowest, highest = speed_ratio(seconds["length"], seconds[LARGER])
        result[LARGER]["batch_size"] = larger_batch
        result["larger_over_length"], result["larger_over_length_range"] = faster, [lowest, highest]
    if static_cache:
        faster, lowest, highest = speed_ratio(seconds["length"], seconds[STATIC])
        result["static_over_length"], result["static_over_length_range"] = faster, [lowest, highest]
    return result


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    folder = multi30k_folder(args.data_dir)
    if folder is None:
        return None
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import vanilla_transformer  # noqa: F401 (the Auto classes)

    torch.manual_seed(0)
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(args.model), AutoTokenizer.from_pretrained(args.model)
    pairs = read_split(folder, args.split, args.pair, args.limit)
    result = {
        "model": args.model,
        "split": args.split,
        "pair": args.pair,
        "machine": machine(),
        **evaluation_speed(
            model,
            tokenizer,
            pairs,
            batch_size=args.batch_size,
            device=args.device,
            repeats=args.repeats,
            larger_batch=args.larger_batch,
        ),
    }
    for name in (*ORDERS, LARGER) if args.larger_batch else ORDERS:
        row = result[name]
        print(
            f"--eval_order {name}: {row['sentences_per_second']:.1f} sentences/s (median of "
            f"{args.repeats}), BLEU {row['bleu']:.2f}, chrF {row['chrf']:.2f}, loss {row['loss']:.4f}"
        )
    low, high = result["length_over_input_range"]
    print(f"length / input: {result['length_over_input']:.2f}x [{low:.2f}, {high:.2f}] ({result['machine']})")
    if args.larger_batch:
        low, high = result["larger_over_length_range"]
        print(
            f"batch {args.larger_batch} / {args.batch_size}, sorted: {result['larger_over_length']:.2f}x [{low:.2f}, {high:.2f}]"
        )
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2)
    return result


if __name__ == "__main__":
    main()
