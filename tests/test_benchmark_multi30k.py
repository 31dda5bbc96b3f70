"""benchmarks/multi30k.py: skips cleanly without the data; end to end on a tiny stand-in corpus (slow)."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, load_script

multi30k = load_script("benchmarks/multi30k.py")


def test_missing_data_folder_is_reported_not_an_error(tmp_path, capsys):
    assert multi30k.main(["--data-dir", str(tmp_path / "absent"), "--output-dir", str(tmp_path / "out")]) is None
    assert "Multi30k not found" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_ratios_compare_ours_with_marian():
    systems = {
        "ours": {"decode": {"bleu": 30.0, "sentences_per_second": 20.0}, "target_tokens_per_second": 1300.0},
        "marian": {"decode": {"bleu": 27.5, "sentences_per_second": 8.0}, "target_tokens_per_second": 1000.0},
    }
    assert multi30k.ratios(systems) == pytest.approx(
        {"BLEU difference": 2.5, "training tokens/s": 1.3, "decoding sentences/s": 2.5}
    )


def write_corpus(folder: Path, sizes: dict[str, int]) -> None:
    rng = random.Random(0)
    words = "a dog runs man woman sits on the bench two children play in park".split()
    for split, size in sizes.items():
        sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))) for _ in range(size)]
        for lang, transform in (("en", str), ("de", str.upper)):
            with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as file:
                file.write("".join(transform(s) + "\n" for s in sentences))


def test_benchmark_runs_both_systems_and_writes_the_table(tmp_path):
    data = tmp_path / "multi30k"
    data.mkdir()
    write_corpus(data, {"train": 300, "val": 20, "test_2016_flickr": 12})
    output = tmp_path / "out"
    completed = subprocess.run([  # as a user runs it: the systems train in child processes of the script
        sys.executable, str(REPO / "benchmarks/multi30k.py"),
        "--data-dir", str(data), "--output-dir", str(output), "--budget-minutes", "0.1",
        "--checkpoint-minutes", "0.02", "--average", "2", "--vocab-size", "300", "--d-model", "32", "--ffn", "64",
        "--layers", "1", "--heads", "2", "--max-tokens", "256", "--warmup-steps", "5",
    ], capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = json.loads((output / "results.json").read_text())
    assert set(results["systems"]) == {"ours", "marian"}
    for name, system in results["systems"].items():
        assert system["steps"] > 0 and system["target_tokens_per_second"] > 0, name
        assert 0 <= system["decode"]["bleu"] <= 100 and system["decode"]["bleu_signature"].startswith("nrefs:1")
    assert "ctranslate2_int8" in results["systems"]["ours"] and "decode_sorted" in results["systems"]["marian"]
    assert results["systems"]["marian"]["same_weights"]["identical_output"]  # imported weights decode alike
    # same dimensions and tokenizer: the parameter counts differ only by Marian's two sinusoidal tables
    # (frozen parameters of 1024 positions x d_model in each stack; a non-persistent buffer in ours)
    ours, marian = (results["systems"][name]["parameters"] for name in ("ours", "marian"))
    assert marian - ours == 2 * 1024 * 32
    assert results["systems"]["ours"]["final_weights"]["kind"] in {"last", "mean of last 2 checkpoints"}
    card = (output / "ours" / "README.md").read_text()
    assert "model-index" in card and "test_2016_flickr" in card
    table = (output / "results.md").read_text()
    assert "| sacreBLEU (test_2016_flickr) |" in table and "ours" in table and "marian" in table
    assert "as a transformers user gets it" in table


def test_paper_setup_gives_marian_the_papers_model_and_optimizer(tmp_path, monkeypatch):
    """--marian-setup paper: ReLU, scaled embeddings and Adam (0.9, 0.98, 1e-9) reach MarianMT and its Trainer."""
    import transformers

    seen = {}

    class Stop(Exception):
        pass

    def capture(self, *args, **kwargs):
        seen["config"], seen["args"] = kwargs["model"].config, kwargs["args"]
        raise Stop

    monkeypatch.setattr(transformers.Seq2SeqTrainer, "__init__", capture)
    import vanilla_transformer

    tokenizer = vanilla_transformer.train_tokenizer(iter(["a b c", "d e f"] * 5), vocab_size=260)
    tokenizer.save_pretrained(tmp_path / "tok")
    args = multi30k.parse_args(["--marian-setup", "paper", "--d-model", "32", "--ffn", "64", "--layers", "1"])
    write_corpus(tmp_path, {"train": 4})
    with pytest.raises(Stop):
        multi30k.train_marian(args, tmp_path / "tok", tmp_path, tmp_path / "run")
    config, training_args = seen["config"], seen["args"]
    assert config.activation_function == "relu" and config.scale_embedding is True
    assert (training_args.adam_beta1, training_args.adam_beta2, training_args.adam_epsilon) == (0.9, 0.98, 1e-9)


def test_step_profiler_skips_without_data(tmp_path, capsys):
    profile_training_step = load_script("benchmarks/profile_training_step.py")
    assert profile_training_step.main(["--system", "ours", "--tokenizer", str(tmp_path),
                                       "--data-dir", str(tmp_path / "absent")]) is None
    assert "Multi30k not found" in capsys.readouterr().out
