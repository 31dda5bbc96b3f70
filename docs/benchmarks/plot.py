"""Draw the pictures of docs/benchmarks from the numbers recorded in measurements.json beside this file.

    python docs/benchmarks/plot.py                      # rewrites the PNGs next to this file
    python docs/benchmarks/plot.py --output-dir /tmp/x  # somewhere else

Every number comes from measurements.json, which holds only numbers the Markdown files here report, each with
the date, machine, commit and command that produced it. Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

HERE = Path(__file__).resolve().parent
OURS, MARIAN = "tab:blue", "tab:orange"
COLOURS = {"ours": OURS, "MarianMT": MARIAN, "CTranslate2 float32": "tab:green", "CTranslate2 int8": "tab:red"}


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=90, metadata={"Software": None})  # no version stamp: the same numbers, the same file
    plt.close(figure)
    return path


def multi30k_bleu(data: dict, path: Path) -> Path:
    """Test BLEU of every en-de run, ours and MarianMT, one column per comparison, medians as bars."""
    comparisons = data["comparisons"]
    figure, axes = plt.subplots(figsize=(8, 3.6))
    for x, comparison in enumerate(comparisons):
        for system, colour, shift in (("ours", OURS, -0.12), ("marian", MARIAN, 0.12)):
            runs = comparison[system]
            hollow = system == "marian" and comparison["marian_reused"]
            axes.scatter(
                [x + shift] * len(runs),
                runs,
                s=18,
                edgecolors=colour,
                facecolors="none" if hollow else colour,
                zorder=3,
            )
            axes.hlines(statistics.median(runs), x + shift - 0.1, x + shift + 0.1, colors=colour, linewidth=2)
    axes.set_xticks(range(len(comparisons)))
    axes.set_xticklabels([f"{c['label']}\n{c['machine'].split()[0]}\n{c['date'][5:]}" for c in comparisons], fontsize=7)
    axes.set_ylabel("test BLEU (test_2016_flickr)")
    axes.set_title("Multi30k en-de, 25 CPU minutes each: every run (dots), medians (bars)", fontsize=9)
    axes.scatter([], [], color=OURS, s=18, label="ours (the recipe of the day)")
    axes.scatter([], [], color=MARIAN, s=18, label="MarianMT, tuned")
    axes.scatter([], [], facecolors="none", edgecolors=MARIAN, s=18, label="MarianMT, runs reused")
    axes.set_ylim(32.8, 40.4)
    axes.legend(fontsize=7, loc="upper center", ncol=3)
    axes.grid(axis="y", alpha=0.3)
    return _save(figure, path)


def decoding_speed(data: dict, path: Path) -> Path:
    """Sentences/s of each system at each beam x batch configuration, on the same weights."""
    configurations, systems = data["configurations"], data["systems"]
    width = 0.8 / len(systems)
    figure, axes = plt.subplots(figsize=(7, 3.4))
    for i, (name, rates) in enumerate(systems.items()):
        axes.bar(
            [x + (i - (len(systems) - 1) / 2) * width for x in range(len(configurations))],
            rates,
            width,
            label=name,
            color=COLOURS.get(name),
        )
    axes.set_xticks(range(len(configurations)))
    axes.set_xticklabels([f"beam x batch\n{c}" for c in configurations], fontsize=8)
    axes.set_ylabel("sentences/s")
    threads = data.get("threads")  # as measured: one thread, or the machine's 2 cores
    where = f"{threads} thread" + ("s" if threads != 1 else "") if threads else "2 cores"
    axes.set_title(
        f"Decoding Multi30k test sentences, same weights ({data['machine']}, {where}, {data['date']})", fontsize=9
    )
    axes.legend(fontsize=7)
    axes.grid(axis="y", alpha=0.3)
    return _save(figure, path)


def length_penalty(data: dict, path: Path) -> Path:
    """Val BLEU against alpha under GNMT's penalty (the paper's) and transformers' |Y|^alpha."""
    figure, axes = plt.subplots(figsize=(6, 3.2))
    axes.plot(data["alpha"], data["gnmt"], marker="o", label="GNMT ((5 + |Y|) / 6)^alpha, the paper's")
    axes.plot(data["alpha"], data["length"], marker="s", label="|Y|^alpha, transformers'")
    axes.axvline(0.6, color="grey", linestyle=":", linewidth=1)
    axes.set_xlabel("alpha")
    axes.set_ylabel("val BLEU (mean of 3 models)")
    axes.set_title(f"Multi30k en-de, length penalty ({data['machine']}, {data['date']})", fontsize=9)
    axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    return _save(figure, path)


def averaging_window(data: dict, path: Path) -> Path:
    """Val BLEU of the mean of the last k checkpoints, uniform against linear weights."""
    figure, axes = plt.subplots(figsize=(6, 3.2))
    axes.plot(data["checkpoints"], data["uniform"], marker="o", label="uniform mean (the paper's)")
    axes.plot(data["checkpoints"], data["linear"], marker="s", label="linear weights (k-th oldest weighs k)")
    axes.set_xlabel("one-minute checkpoints averaged")
    axes.set_ylabel("val BLEU (mean of 3 runs)")
    axes.set_title(f"Multi30k en-de, checkpoint averaging ({data['machine']}, {data['date']})", fontsize=9)
    axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    return _save(figure, path)


def table3(data: dict, path: Path) -> Path:
    """Table 3's rows: each one's change in dev BLEU from the base model, ours beside the paper's (the picture
    `vanilla-transformer table3` draws, from the recorded rows)."""
    from vanilla_transformer.training.table3 import plot

    return plot(data["rows"], path)


PICTURES = {
    "multi30k-bleu.png": (multi30k_bleu, "multi30k_en_de_test_bleu"),
    "decoding-speed.png": (decoding_speed, "decoding_sentences_per_second"),
    "length-penalty.png": (length_penalty, "length_penalty_val_bleu"),
    "averaging-window.png": (averaging_window, "averaging_window_val_bleu"),
    "table3.png": (table3, "table3_multi30k_en_de"),
}


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measurements", type=Path, default=HERE / "measurements.json")
    parser.add_argument("--output-dir", type=Path, default=HERE)
    args = parser.parse_args(argv)
    measurements = json.loads(args.measurements.read_text(encoding="utf-8"))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    written = [draw(measurements[key], args.output_dir / name) for name, (draw, key) in PICTURES.items()]
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
