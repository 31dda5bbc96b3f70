"""What the paper's runs cost: hours and GPU-hours of each recipe on 1 and 8 GPUs, beside the paper's own.

    python benchmarks/cost.py --gpu-json gpu.json                 # throughput measured by benchmarks/gpu.py
    python benchmarks/cost.py --tokens-per-second big=150000      # target tokens/s of one GPU, given
    python benchmarks/cost.py --model-tflops 300                  # or a sustained model TFLOP/s of one GPU

A recipe's work is its updates x the target tokens of an update (the paper's ~25,000, §5.1) x the
training FLOPs per target token of its model at WMT14's mean lengths (`training_flops_per_target_token`:
the matrix multiplies, backward twice the forward). Its time on G GPUs is that work at G times one GPU's
throughput (perfect scaling; --scaling for less). A throughput measured for one model gives the other
model's at the same model FLOP/s (marked "derived"). Decoding (evaluation, the test set) is not counted.

Beside each, the paper's own (§5.2): 12 hours (base) and 3.5 days (big) on 8 P100s, and what its step
times imply: 25,000 target tokens per 0.4 s (base) or 1.0 s (big) x the FLOPs per token = the model
FLOP/s that the 8 P100s sustained, and its share of their peak (9.5 TFLOP/s each in float32, the value
the paper's Table 2 assumes).

WMT14 mean lengths, </s> included: 29.5 English and 30.6 German tokens a pair, from fairseq-preprocess's
counts of the paper's training data with a 32k joint BPE (Google's wmt16_en_de_bpe32k: 4,500,966 pairs,
132,886,171 English and 137,628,246 German tokens; logged in github.com/dertilo/machine-translation,
nmt_fairseq.md). Cited, not measured here; the recipes' 37k vocabulary cuts a little finer. For en-fr no
such count was found: en-de's lengths stand in (the FLOPs per token hardly depend on them: attention
is a few percent of the work).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NamedTuple

import yaml

from common import REPO, argument_parser
from vanilla_transformer import PRESETS, VanillaTransformerConfig
from vanilla_transformer.training.flops import training_flops_per_target_token

RECIPES = REPO / "training" / "recipes"
WMT14_MEAN_LENGTHS = (132_886_171 / 4_500_966, 137_628_246 / 4_500_966)  # (source, target) tokens a pair
PAPER_TOKENS_PER_UPDATE = 25_000  # target tokens (§5.1)
PAPER_GPUS = 8
P100_PEAK_TFLOPS = 9.5  # float32; the paper's Table 2 footnote
# §5.2: seconds per update and hours of training on 8 P100s, by model size (both language pairs).
PAPER = {"base": {"seconds_per_update": 0.4, "hours": 12.0}, "big": {"seconds_per_update": 1.0, "hours": 84.0}}


class Recipe(NamedTuple):
    name: str
    preset: str
    updates: int
    vocab_size: int

    @property
    def flops_per_token(self) -> float:
        config = VanillaTransformerConfig.from_preset(self.preset, vocab_size=self.vocab_size)
        return training_flops_per_target_token(config, *WMT14_MEAN_LENGTHS)


def read_recipes(folder: Path = RECIPES) -> list[Recipe]:
    """Each of the paper's runs (training/recipes/wmt14-*.yaml): its model, number of updates and vocabulary."""
    recipes = []
    for path in sorted(Path(folder).glob("wmt14-*.yaml")):
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
        recipes.append(
            Recipe(
                path.stem,
                values.get("preset", "base"),
                int(values["max_steps"]),
                int(values.get("tokenizer_vocab_size", 37000)),
            )
        )
    if not recipes:
        raise ValueError(f"No wmt14-*.yaml recipes in {folder}.")
    return recipes


# ---------------------------------------------------------------------------------------------
# Throughput: measured, given, or derived
# ---------------------------------------------------------------------------------------------


def parse_tokens_per_second(text: str | None) -> dict[str, float]:
    """``"base=120000,big=60000"`` -> {preset: target tokens/s of one GPU}."""
    rates = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        preset, _, value = (part.strip() for part in item.partition("="))
        try:
            rates[preset] = float(value)
        except ValueError:
            rates[preset] = -1.0
        if preset not in PRESETS or rates[preset] <= 0:
            raise ValueError(
                f"--tokens-per-second item {item!r}: write PRESET=TOKENS with a positive number, e.g. "
                f"big=150000 (presets: {', '.join(PRESETS)})."
            )
    return rates


def throughputs_from_gpu_json(path: str | Path) -> tuple[dict[str, float], str]:
    """{preset: the fastest mode's training target tokens/s} from a benchmarks/gpu.py --output file, and
    which run it was (GPU, dtype, modes)."""
    results = json.loads(Path(path).read_text(encoding="utf-8"))
    machine = next((r for r in results if r.get("what") == "machine"), {})
    best: dict[str, dict] = {}
    for result in results:
        if result.get("what") == "training" and "error" not in result:
            if result["target_tokens_per_second"] > best.get(result["preset"], {}).get("target_tokens_per_second", 0):
                best[result["preset"]] = result
    if not best:
        raise ValueError(f"{path}: no training measurement without an error; run benchmarks/gpu.py again.")
    where = machine.get("gpu") or machine.get("device", "unknown device")
    modes = ", ".join(f"{p}: {r['mode']} {r['dtype']}" for p, r in sorted(best.items()))
    return {preset: r["target_tokens_per_second"] for preset, r in best.items()}, f"measured on {where} ({modes})"


def tokens_per_second(
    recipe: Recipe, measured: dict[str, float], source: str, model_tflops: float | None, recipes: list[Recipe]
) -> tuple[float | None, str]:
    """One GPU's target tokens/s for the recipe's model, and where the number comes from."""
    if recipe.preset in measured:
        return measured[recipe.preset], source
    for other in recipes:  # the same model FLOP/s with another model's measured throughput
        if other.preset in measured:
            rate = measured[other.preset] * other.flops_per_token / recipe.flops_per_token
            return rate, f"derived from {other.preset} at equal model FLOP/s"
    if model_tflops:
        return model_tflops * 1e12 / recipe.flops_per_token, f"from --model-tflops {model_tflops:g}"
    return None, "no throughput given"


# ---------------------------------------------------------------------------------------------
# Cost
# ---------------------------------------------------------------------------------------------


def training_hours(
    updates: int, tokens_per_update: float, tokens_per_second: float, gpus: int, scaling: float = 1.0
) -> float:
    """Wall-clock hours of ``updates`` updates on ``gpus`` GPUs of ``tokens_per_second`` each."""
    return updates * tokens_per_update / (tokens_per_second * gpus * scaling) / 3600


def paper_throughput(recipe: Recipe) -> dict:
    """What the paper's step time implies: target tokens/s of its 8 P100s, model TFLOP/s per GPU, share of peak."""
    tokens = PAPER_TOKENS_PER_UPDATE / PAPER[recipe.preset]["seconds_per_update"]
    per_gpu_tflops = tokens * recipe.flops_per_token / PAPER_GPUS / 1e12
    return {
        "tokens_per_second_8_gpus": tokens,
        "model_tflops_per_gpu": per_gpu_tflops,
        "share_of_p100_peak": per_gpu_tflops / P100_PEAK_TFLOPS,
    }


def cost_table(
    recipes: list[Recipe],
    measured: dict[str, float],
    source: str,
    model_tflops: float | None,
    gpus: tuple[int, ...],
    tokens_per_update: float,
    scaling: float,
) -> list[dict]:
    rows = []
    for recipe in recipes:
        rate, where = tokens_per_second(recipe, measured, source, model_tflops, recipes)
        row = {
            **recipe._asdict(),
            "flops_per_target_token": recipe.flops_per_token,
            "training_flops": recipe.updates * tokens_per_update * recipe.flops_per_token,
            "tokens_per_second_per_gpu": rate,
            "throughput_from": where,
            "paper_hours_8_p100": PAPER[recipe.preset]["hours"],
            "paper_gpu_hours": PAPER[recipe.preset]["hours"] * PAPER_GPUS,
            "paper": paper_throughput(recipe),
        }
        for count in gpus:
            hours = training_hours(recipe.updates, tokens_per_update, rate, count, scaling) if rate else None
            row[f"hours_{count}_gpus"] = hours
            row[f"gpu_hours_{count}_gpus"] = hours * count if hours is not None else None
        rows.append(row)
    return rows


def markdown(rows: list[dict], gpus: tuple[int, ...]) -> str:
    def number(value, digits=1):
        return "n/a" if value is None else f"{value:,.{digits}f}"

    head = ["recipe", "updates", "GFLOP / target token", "training EFLOP", "tokens/s/GPU"]
    head += [f"hours on {g} GPU{'s' * (g > 1)}" for g in gpus] + [
        "GPU-hours",
        "paper: hours on 8 P100",
        "paper: GPU-hours",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [
            row["name"],
            f"{row['updates']:,}",
            number(row["flops_per_target_token"] / 1e9, 2),
            number(row["training_flops"] / 1e18, 2),
            number(row["tokens_per_second_per_gpu"], 0),
        ]
        cells += [number(row[f"hours_{g}_gpus"]) for g in gpus] + [number(row[f"gpu_hours_{gpus[-1]}_gpus"])]
        cells += [number(row["paper_hours_8_p100"], 0), number(row["paper_gpu_hours"], 0)]
        lines.append("| " + " | ".join(cells) + " |")
    sources = sorted({f"{row['name']}: {row['throughput_from']}" for row in rows})
    paper = [
        f"{row['name']}: {row['paper']['tokens_per_second_8_gpus']:,.0f} target tokens/s on 8 P100 = "
        f"{row['paper']['model_tflops_per_gpu']:.2f} model TFLOP/s per GPU "
        f"({row['paper']['share_of_p100_peak']:.0%} of 9.5); Table 2's training cost, hours x 8 x 9.5 TFLOP/s, "
        f"is {row['paper_hours_8_p100'] * 3600 * PAPER_GPUS * P100_PEAK_TFLOPS * 1e12:.1e} FLOPs"
        for row in rows
    ]
    return "\n".join(lines + ["", "Throughput: " + "; ".join(sources), "", "The paper's step times imply:", *paper])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--gpu-json", help="a benchmarks/gpu.py --output file: training tokens/s per model")
    parser.add_argument("--tokens-per-second", help="target tokens/s of one GPU per model, e.g. base=120000,big=60000")
    parser.add_argument("--model-tflops", type=float, help="sustained model TFLOP/s of one GPU, for unmeasured models")
    parser.add_argument("--gpus", default="1,8", help="comma-separated GPU counts")
    parser.add_argument("--scaling", type=float, default=1.0, help="multi-GPU efficiency (1: perfect)")
    parser.add_argument("--tokens-per-update", type=float, default=PAPER_TOKENS_PER_UPDATE)
    parser.add_argument("--recipes", default=str(RECIPES), help="folder of recipe YAML files")
    parser.add_argument("--output", help="write the rows as JSON here")
    return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.gpu_json and args.tokens_per_second:
        raise ValueError("Give --gpu-json or --tokens-per-second, not both.")
    if not 0 < args.scaling <= 1:
        raise ValueError(f"--scaling is an efficiency in (0, 1], got {args.scaling}.")
    measured, source = parse_tokens_per_second(args.tokens_per_second), "given (--tokens-per-second)"
    if args.gpu_json:
        measured, source = throughputs_from_gpu_json(args.gpu_json)
    gpus = tuple(int(g) for g in args.gpus.split(","))
    rows = cost_table(
        read_recipes(Path(args.recipes)),
        measured,
        source,
        args.model_tflops,
        gpus,
        args.tokens_per_update,
        args.scaling,
    )
    print(markdown(rows, gpus))
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return rows


if __name__ == "__main__":
    main()
