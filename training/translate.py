"""Translate a file (or stdin) with batched beam search; optionally score against references.

    python training/translate.py --model runs/en-de --input test.en [--output hyp.de] [--references test.de]
    echo "A dog runs." | python training/translate.py --model runs/en-de

Decoding uses the model's generation config unless told otherwise: the paper's 4 beams, length
penalty 0.6 and at most (source length + 50) output tokens (§6.1). Sentences are sorted by length
into batches (less padding, fewer wasted steps), and the hypotheses are written back in input order,
one per line. With ``--references`` it prints sacreBLEU and chrF with their signatures.
``--attention-png DIR`` also draws the attention maps of the first ``--attention-count`` inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import vanilla_transformer  # noqa: F401  (registers the classes with the Auto API)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import read_lines as read_text_lines  # noqa: E402


def translate(
    model, tokenizer, sentences: Sequence[str], batch_size: int = 64, **generate_kwargs
) -> list[str]:
    """Translate `sentences` in batches of similar length; returns hypotheses in input order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    lengths = [len(ids) for ids in tokenizer(list(sentences))["input_ids"]]
    order = sorted(range(len(sentences)), key=lambda i: lengths[i])
    hypotheses: list[str | None] = [None] * len(sentences)
    model.eval()
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        batch = tokenizer([sentences[i] for i in indices], return_tensors="pt", padding=True).to(model.device)
        with torch.inference_mode():
            generated = model.generate(**batch, **generate_kwargs)
        for index, text in zip(indices, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            hypotheses[index] = text
    return hypotheses


def score(hypotheses: Sequence[str], references: Sequence[str], tokenize: str | None = None) -> dict:
    """sacreBLEU and chrF of `hypotheses` against one reference each, with signatures."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references: the files must align.")
    bleu = sacrebleu.metrics.BLEU(tokenize=tokenize)
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": bleu_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf": chrf_score.score,
        "chrf_signature": str(chrf.get_signature()),
    }


def read_lines(path: str) -> list[str]:
    """Lines of a text file (plain or .gz) or of stdin ('-'), without line endings."""
    if path == "-":
        return [line.rstrip("\r\n") for line in sys.stdin]
    return read_text_lines(path)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model folder or Hub id (with its tokenizer)")
    parser.add_argument("--tokenizer", help="tokenizer, if not the model's")
    parser.add_argument("--input", default="-", help="source sentences, one a line (.gz ok); '-' = stdin")
    parser.add_argument("--output", default="-", help="where hypotheses go, one a line; '-' = stdout")
    parser.add_argument("--references", help="reference translations, aligned with --input: print BLEU and chrF")
    parser.add_argument("--metrics-json", help="also write the scores (and timing) to this JSON file")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument("--num-beams", type=int, help="default: the model's generation config (paper: 4)")
    parser.add_argument("--length-penalty", type=float, help="default: the model's generation config (paper: 0.6)")
    parser.add_argument("--max-new-tokens", type=int, help="default: source length + 50 (§6.1)")
    parser.add_argument("--sacrebleu-tokenize", help="sacreBLEU tokenizer (default 13a; 'zh', 'ja-mecab', ...)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--attention-png", metavar="DIR", help="write attention pictures of the first inputs here")
    parser.add_argument("--attention-count", type=int, default=3, help="how many inputs get pictures")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).to(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    sources = read_lines(args.input)
    references = read_lines(args.references) if args.references else None
    if references is not None and len(references) != len(sources):
        raise ValueError(f"--input has {len(sources)} lines but --references has {len(references)}; they must align.")
    generate_kwargs = {
        key: value
        for key, value in {
            "num_beams": args.num_beams, "length_penalty": args.length_penalty, "max_new_tokens": args.max_new_tokens
        }.items()
        if value is not None
    }
    started = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources, args.batch_size, **generate_kwargs)
    seconds = time.perf_counter() - started
    text = "".join(h + "\n" for h in hypotheses)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
    result = {"sentences": len(sources), "seconds": seconds, "sentences_per_second": len(sources) / max(seconds, 1e-9)}
    if references is not None:
        result.update(score(hypotheses, references, args.sacrebleu_tokenize))
        print(f"BLEU {result['bleu']:.2f}  ({result['bleu_signature']})", file=sys.stderr)
        print(f"chrF {result['chrf']:.2f}  ({result['chrf_signature']})", file=sys.stderr)
    if args.attention_png:
        pictures, skipped = write_pictures(model, tokenizer, sources, hypotheses, args)
        result["attention_pictures"] = [str(p) for p in pictures]
        result["attention_skipped"] = skipped
    if args.metrics_json:
        Path(args.metrics_json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def write_pictures(model, tokenizer, sources: Sequence[str], hypotheses: Sequence[str], args) -> tuple[list[Path], list[int]]:
    """Attention pictures (Figures 3-5 of the paper) of the first inputs with their translations, a folder each.

    An empty translation has no target side to draw: its input is skipped, said on stderr, and its
    index returned in the second list, so the translations themselves are never held back.
    """
    from vanilla_transformer.visualization import write_attention_pictures

    paths, skipped = [], []
    for index, (source, hypothesis) in enumerate(zip(sources[: args.attention_count], hypotheses)):
        if not hypothesis.strip():
            skipped.append(index)
            continue
        folder = Path(args.attention_png) / f"{index:04d}"
        paths += write_attention_pictures(model, tokenizer, source, folder, target=hypothesis)
    if skipped:
        print(f"No attention pictures for input(s) {', '.join(map(str, skipped))}: their translation is empty.",
              file=sys.stderr)
    return paths, skipped


if __name__ == "__main__":
    main()
