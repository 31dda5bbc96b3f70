"""The tables and notes of `multi30k.py`'s results: medians over runs, the comparison and levers tables, the
sweeps' tables, and when the machine's speed or load makes two runs compare badly (`machine_speeds`,
`disturbed_runs`), first as numbers and then in words."""

from __future__ import annotations

import statistics

# What each MarianMT set-up is, in the words its table ends with.
MARIAN_SETUPS = {
    "tuned": "MarianMT as a careful user configures it: ReLU, scaled and tied embeddings, dropout 0.1 (attention and "
    "activation 0), a joint 8k Metaspace BPE, 64-sentence batches grouped by length, Adam (0.9, 0.98, 1e-9), "
    "peak 1e-3 after 800 warm-up steps then inverse square root, label smoothing 0.1.",
    "paper": "MarianMT with the paper's model and optimizer (ReLU, scaled embeddings, Adam 0.9/0.98/1e-9), "
    "64-sentence batches, peak 1e-3 after 800 warm-up steps, label smoothing 0.1, dropout 0.3.",
    "user": "MarianMT with MarianConfig's and the Trainer's defaults (GELU, unscaled embeddings, Adam 0.9/0.999/1e-8) "
    "apart from the dimensions, 64-sentence batches, peak 1e-3 after 800 warm-up steps, label smoothing 0.1.",
}


def median(values) -> float:
    return statistics.median(values)


def finished(runs: dict[str, list[dict | None]]) -> dict[str, list[dict]]:
    """The runs without the slots that --redo emptied and has not trained again yet."""
    return {name: [run for run in results if run is not None] for name, results in runs.items()}


# What the comparison table shows of each run and takes the median of: label, path in a run's result, format.
NUMBERS = [
    ("test BLEU", ("test", "bleu"), "{:.2f}"),
    ("test chrF", ("test", "chrf"), "{:.2f}"),
    ("val BLEU", ("val", "bleu"), "{:.2f}"),
    ("val chrF", ("val", "chrf"), "{:.2f}"),
    ("updates", ("steps",), "{:.0f}"),
    ("target tokens/s", ("target_tokens_per_second",), "{:.0f}"),
    ("fp32 matmul GFLOP/s before training", ("machine_load", "matmul_gflops_before"), "{:.0f}"),
    ("CPU share of other processes while training", ("machine_load", "others_cpu_share"), "{:.1%}"),
]


def lookup(result: dict, path: tuple[str, ...]) -> float | None:
    """The number at ``path`` in a run's result, or None where that run did not record it."""
    for key in path:
        result = result.get(key) if isinstance(result, dict) else None
    return result if isinstance(result, (int, float)) else None


def summary(runs: dict[str, list[dict]]) -> dict:
    """Per system: the median of each number over the runs (those all its runs recorded); and ours minus
    MarianMT's medians."""
    runs = finished(runs)
    medians = {
        name: {
            label: median([lookup(r, path) for r in results])
            for label, path, _ in NUMBERS
            if all(lookup(r, path) is not None for r in results)
        }
        for name, results in runs.items()
        if results
    }
    if {"ours", "marian"} <= set(medians):
        medians["difference"] = {
            label: medians["ours"][label] - medians["marian"][label]
            for label in ("test BLEU", "test chrF", "val BLEU")
            if label in medians["marian"]
        }
    return medians


def markdown(results: dict) -> str:
    runs, medians = finished(results["runs"]), results["medians"]
    lines = [
        f"Multi30k {results['pair']}, {results['budget_minutes']:g} min of training per run, "
        f"{len(next(iter(runs.values())))} run(s) per system; sacreBLEU on test_2016_flickr ({results['test_sentences']} "
        "sentences).",
        "",
        "| | "
        + " | ".join(f"{name} run {i + 1}" for name in runs for i in range(len(runs[name])))
        + " | "
        + " | ".join(f"{name} median" for name in runs)
        + " |",
        "|---|" + "---|" * (sum(len(r) for r in runs.values()) + len(runs)),
    ]
    for label, path, fmt in NUMBERS:
        cells = [lookup(result, path) for results_ in runs.values() for result in results_]
        cells += [medians[name].get(label) for name in runs]
        lines.append(f"| {label} | " + " | ".join("–" if cell is None else fmt.format(cell) for cell in cells) + " |")
    if "difference" in medians:
        lines += [
            "",
            "Ours minus MarianMT (medians): "
            + ", ".join(f"{k} {v:+.2f}" for k, v in medians["difference"].items())
            + ".",
        ]
    sources = sorted({run["from"] for run in runs.get("marian", []) if "from" in run})
    if sources:
        lines += [
            "",
            f"MarianMT's runs are those of {', '.join(sources)} (--marian-from): the same settings and seeds.",
        ]
    settle = (
        "train both systems in one session (without --marian-from) to settle it"
        if sources
        else "the machine's speed changed between the systems' runs"
    )
    notes = speed_notes("ours", runs.get("ours", []), "MarianMT", runs.get("marian", []), settle)
    notes += run_notes(
        {f"{name}-{i + 1}": run for name in runs for i, run in enumerate(runs[name]) if "from" not in run},
        lambda name: f"--resume --redo {name}",
    )
    if notes:
        lines += [""] + notes
    if results.get("settings", {}).get("bf16"):
        lines += ["", "Both systems trained under bfloat16 autocast (--bf16); weights and decoding in float32."]
    lines += [
        "",
        f"{MARIAN_SETUPS[results['marian_setup']]}",
        f"Machine: {results['machine']}. Date: {results['date']}.",
        f"sacreBLEU signature: `{next(iter(runs.values()))[0]['val']['bleu_signature']}`.",
    ]
    return "\n".join(lines) + "\n"


# Consecutive probes differ by up to ~5% on a 2-core cloud machine: medians over runs within 5% count as the same
# machine (beyond it, a note says which side it favours); one run's probes before and after training, within 10%.
SPEED_TOLERANCE = 0.05
DRIFT_TOLERANCE = 0.10
BUSY_TOLERANCE = 0.05  # other processes and guests taking more than 5% of the CPUs while a run trained: a note


def machine_speeds(runs: list[dict], others: list[dict]) -> dict:
    """Whether ``runs`` had the machine that ``others`` had: how many of each recorded the machine probe (fp32
    matmul GFLOP/s before training), the medians of those that did, their ratio, and which group a difference
    beyond `SPEED_TOLERANCE` favours ("runs" or "others", None within it): a time budget buys as many updates
    as the machine gives."""

    def speeds(group):
        return [v for v in (lookup(run, ("machine_load", "matmul_gflops_before")) for run in group) if v is not None]

    mine, theirs = speeds(runs), speeds(others)
    found = {"recorded": {"runs": (len(mine), len(runs)), "others": (len(theirs), len(others))}}
    if mine and theirs:
        ratio = median(mine) / median(theirs)
        found.update(
            median=median(mine),
            others_median=median(theirs),
            ratio=ratio,
            favours=None if abs(ratio - 1) <= SPEED_TOLERANCE else "others" if ratio < 1 else "runs",
        )
    return found


def disturbed_runs(runs: dict[str, dict]) -> dict[str, dict]:
    """The runs that shared their CPUs ("shared": the share of the CPUs' time that other processes and the
    hypervisor's other guests took, beyond `BUSY_TOLERANCE`) or whose machine slowed down or sped up while
    they trained ("drift": matmul GFLOP/s after over before, minus 1, beyond `DRIFT_TOLERANCE`)."""
    found = {}
    for name, run in runs.items():
        load = run.get("machine_load", {})
        shared = load.get("others_cpu_share", 0.0) + load.get("steal_share", 0.0)
        before, after = load.get("matmul_gflops_before"), load.get("matmul_gflops_after")
        drift = after / before - 1 if before and after else 0.0
        disturbance = {
            **({"shared": shared} if shared > BUSY_TOLERANCE else {}),
            **({"drift": drift, "before": before, "after": after} if abs(drift) > DRIFT_TOLERANCE else {}),
        }
        if disturbance:
            found[name] = disturbance
    return found


def speed_notes(label: str, runs: list[dict], other_label: str, others: list[dict], settle: str) -> list[str]:
    """`machine_speeds` in words; ``settle`` says what would settle a difference."""
    speeds = machine_speeds(runs, others)
    lines = []
    for name, (measured, count) in zip((label, other_label), speeds["recorded"].values()):
        if 0 < measured < count:
            lines.append(f"{measured} of {count} runs of {name} recorded the machine probe (the others predate it).")
        elif count and not measured and any(seen for seen, _ in speeds["recorded"].values()):
            lines.append(
                f"{name}'s runs predate the machine probe: whether the machine was as fast for them is not recorded."
            )
    if "ratio" not in speeds:
        return lines
    figures = f"({speeds['median']:.0f} vs {speeds['others_median']:.0f} GFLOP/s, medians before training)"
    if speeds["favours"] is None:
        return lines + [f"For {label} the machine multiplied float32 matrices as fast as for {other_label} {figures}."]
    slower = speeds["favours"] == "others"
    return lines + [
        f"For {label} the machine multiplied float32 matrices {abs(speeds['ratio'] - 1):.0%} "
        f"{'slower' if slower else 'faster'} than for {other_label} {figures}: under the same time "
        f"budget that {'cost' if slower else 'gave'} {label} {'' if slower else 'more '}updates, so the "
        f"difference favours {other_label if slower else label}; {settle}."
    ]


def run_notes(runs: dict[str, dict], remedy) -> list[str]:
    """`disturbed_runs` in words, a line for each disturbance; ``remedy(name)`` says how to train it again."""
    lines = []
    for name, found in disturbed_runs(runs).items():
        if "shared" in found:
            lines.append(
                f"{name} shared its CPUs: other processes and guests took {found['shared']:.1%} of the CPUs' "
                f"time while it trained; train it again on a quiet machine ({remedy(name)})."
            )
        if "drift" in found:
            lines.append(
                f"{name}: the machine multiplied float32 matrices {abs(found['drift']):.0%} "
                f"{'slower' if found['drift'] < 0 else 'faster'} after training than before "
                f"({found['after']:.0f} vs {found['before']:.0f} GFLOP/s); its speed changed during the run "
                f"({remedy(name)} to train it again)."
            )
    return lines


def levers_markdown(results: dict) -> str:
    lines = [
        f"Multi30k {results['pair']}, ours, {results['budget_minutes']:g} min each, scored on val "
        "(never on the test set).",
        "",
        "| change to the recipe | val BLEU | val chrF | updates | vs recipe |",
        "|---|---|---|---|---|",
    ]
    recipe = results["levers"].get("recipe")
    base = recipe["val"]["bleu"] if recipe else None
    rows = list(results["levers"].items())
    if recipe:  # the other length penalty: the recipe's model decoded again, no training
        other = next(key for key in recipe if key.startswith("val with "))
        rows.insert(1, (f"decoded {other[4:]} (same model)", {**recipe, "val": recipe[other]}))
    for name, result in rows:
        delta = "" if base is None or name == "recipe" else f"{result['val']['bleu'] - base:+.2f}"
        label = f"{name} (from {result['from']})" if "from" in result and name == "recipe" else name
        lines.append(
            f"| {label} | {result['val']['bleu']:.2f} | {result['val']['chrf']:.2f} | {result['steps']} | {delta} |"
        )
    levers = {name: result for name, result in results["levers"].items() if name != "recipe"}
    notes = speed_notes(
        "the levers",
        list(levers.values()),
        "the recipe's row",
        [recipe] if recipe else [],
        "train the recipe's row in the same session (--lever recipe) to settle it",
    )
    notes += run_notes(
        levers if recipe is None or "from" in recipe else {"recipe": recipe, **levers},
        lambda name: f'--levers --lever "{name}" in a new --output-dir',
    )
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def averaging_markdown(sweep: dict) -> str:
    moving = any("val, moving average" in row for row in sweep["rows"].values())
    lines = [
        f"{sweep['run']} ({sweep['pair']}), its last k checkpoints averaged, scored on val; the last "
        f"checkpoint is step {sweep['last_step']}. Uniform: the mean (§6.1); linear: the k-th oldest weighs k."
        + (
            " Moving average: the run's own (--ema_decay) at the update of the k-th newest checkpoint ('from "
            "step'), the final model had the run stopped there."
            if moving
            else ""
        ),
        "",
        "| checkpoints averaged | from step | val BLEU, uniform | chrF, uniform | val BLEU, linear | chrF, linear |"
        + (" val BLEU, moving average | chrF, moving average |" if moving else ""),
        "|---|---|---|---|---|---|" + ("---|---|" if moving else ""),
    ]
    for last, row in sweep["rows"].items():
        linear = row.get("val, linear weights", row["val"])  # one checkpoint: the same model
        cells = [row["val"], linear] + ([row.get("val, moving average")] if moving else [])
        lines.append(
            f"| {last} | {row['first_step']} | "
            + " | ".join("– | –" if cell is None else f"{cell['bleu']:.2f} | {cell['chrf']:.2f}" for cell in cells)
            + " |"
        )
    return "\n".join(lines) + "\n"


def length_penalty_markdown(sweep: dict) -> str:
    lines = [
        f"{sweep['model']} ({sweep['pair']}), decoded with beam 4 at each length penalty alpha, scored on val.",
        "Length: the hypotheses' words over the references' words.",
        "",
        "| alpha | GNMT ((5 + \\|Y\\|) / 6)^alpha: val BLEU | chrF | length | \\|Y\\|^alpha: val BLEU | chrF | length |",
        "|---|---|---|---|---|---|---|",
    ]
    for alpha in sorted({row["alpha"] for row in sweep["rows"].values()}):
        cells = []
        for formula in ("gnmt", "length"):
            row = sweep["rows"].get(f"{formula} {alpha}")  # MarianMT has the one formula
            val = row["val"] if row else {}
            cells.append(
                " | ".join(
                    f"{val[key]:.{digits}f}" if key in val else "–"
                    for key, digits in (("bleu", 2), ("chrf", 2), ("length_ratio", 3))
                )
            )
        lines.append(f"| {alpha} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
