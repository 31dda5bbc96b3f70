"""benchmarks/multi30k.py: skips cleanly without the data, configures the tuned MarianMT as its docstring
describes it, computes medians and differences right, and runs end to end on a tiny stand-in corpus."""

from __future__ import annotations

import gzip
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

import common
import multi30k_systems as systems
from helpers import REPO, load_script

multi30k = load_script("benchmarks/multi30k.py")
multi30k_report = load_script("benchmarks/multi30k_report.py")


def test_missing_data_folder_is_reported_not_an_error(tmp_path, capsys):
    assert multi30k.main(["--data-dir", str(tmp_path / "absent"), "--output-dir", str(tmp_path / "out")]) is None
    assert "Multi30k not found" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def result(test_bleu: float, val_bleu: float, steps: int) -> dict:
    return {
        "test": {"bleu": test_bleu, "chrf": test_bleu + 20},
        "val": {"bleu": val_bleu, "chrf": val_bleu + 20},
        "steps": steps,
        "target_tokens_per_second": 10.0 * steps,
    }


def test_medians_over_runs_and_the_difference_of_the_medians():
    runs = {
        "ours": [result(37.0, 38.0, 5), result(35.0, 36.5, 7), result(36.0, 36.0, 6)],
        "marian": [result(33.0, 34.0, 3), result(32.0, 33.0, 4), result(34.5, 35.0, 2)],
    }
    medians = multi30k.summary(runs)
    assert medians["ours"]["test BLEU"] == 36.0 and medians["marian"]["test BLEU"] == 33.0
    assert medians["ours"]["updates"] == 6 and medians["marian"]["val BLEU"] == 34.0
    assert medians["difference"] == pytest.approx({"test BLEU": 3.0, "test chrF": 3.0, "val BLEU": 2.5})
    table = multi30k.markdown(
        {
            "runs": runs,
            "medians": medians,
            "pair": "en-de",
            "budget_minutes": 25,
            "test_sentences": 1000,
            "marian_setup": "tuned",
            "machine": "m",
            "date": "d",
        }
        | {"runs": {k: [dict(r, val=dict(r["val"], bleu_signature="sig")) for r in v] for k, v in runs.items()}}
    )
    assert "| test BLEU | 37.00 | 35.00 | 36.00 | 33.00 | 32.00 | 34.50 | 36.00 | 33.00 |" in table
    assert "test BLEU +3.00" in table


def run_with_load(bleu, gflops=None, others=0.0, name="run", after=None, steal=0.0):
    load = (
        {}
        if gflops is None
        else {
            "machine_load": {
                "matmul_gflops_before": gflops,
                "matmul_gflops_after": after or gflops,
                "others_cpu_share": others,
                "steal_share": steal,
            }
        }
    )
    return {**result(bleu, bleu, 100), "model_dir": name, **load}


def comparison_table(ours, marian, reused=True):
    runs = {"ours": ours, "marian": [dict(r, **({"from": "old/results.json"} if reused else {})) for r in marian]}
    runs = {k: [dict(r, val=dict(r["val"], bleu_signature="sig")) for r in v] for k, v in runs.items()}
    return multi30k.markdown(
        {
            "runs": runs,
            "medians": multi30k.summary(runs),
            "pair": "en-de",
            "budget_minutes": 25,
            "test_sentences": 1000,
            "marian_setup": "tuned",
            "machine": "m",
            "date": "d",
        }
    )


def notes(table: str) -> list[str]:
    """The lines of a table's notes: after the table, before the MarianMT set-up's description."""
    return [
        line
        for line in table.split("\n\n")
        if not line.startswith("|") and ("GFLOP/s" in line or "CPUs" in line or "probe" in line)
    ]


def test_the_machine_probe_says_which_side_a_slower_machine_favours():
    """fp32 matmul GFLOP/s before training, medians: within 5% the same machine; beyond, the side it was
    faster for is favoured (a time budget buys as many updates as the machine gives)."""
    speeds = multi30k_report.machine_speeds
    slower = speeds(
        [run_with_load(37, 90.0), run_with_load(38, 91.0), run_with_load(37.5, 89.0)], [run_with_load(34, 100.0)]
    )
    assert slower.pop("recorded") == {"runs": (3, 3), "others": (1, 1)}
    assert slower == pytest.approx({"median": 90.0, "others_median": 100.0, "ratio": 0.9, "favours": "others"})
    assert speeds([run_with_load(37, 111.0)], [run_with_load(34, 100.0)])["favours"] == "runs"
    assert speeds([run_with_load(37, 97.0)], [run_with_load(34, 100.0)])["favours"] is None
    unrecorded = speeds([run_with_load(37, 97.0), run_with_load(36)], [run_with_load(34)])
    assert unrecorded == {"recorded": {"runs": (1, 2), "others": (0, 1)}}  # nothing to compare with


def test_a_run_that_shared_its_cpus_or_saw_the_machine_change_speed_is_named_with_its_figures():
    """Other processes and guests over 5% of the CPUs' time, or a probe after training more than 10% off the
    one before: named, with the share and the drift."""
    runs = {
        "ours-1": run_with_load(37, 100.0, others=0.2),
        "ours-2": run_with_load(37, 100.0, others=0.04),
        "ours-3": run_with_load(37, 100.0, steal=0.06),
        "ours-4": run_with_load(37, 100.0, after=80.0),
        "ours-5": run_with_load(37, 100.0, after=105.0),
        "ours-6": run_with_load(37),
    }
    found = multi30k_report.disturbed_runs(runs)
    assert set(found) == {"ours-1", "ours-3", "ours-4"}
    assert found["ours-1"] == pytest.approx({"shared": 0.2}) and found["ours-3"] == pytest.approx({"shared": 0.06})
    assert found["ours-4"] == pytest.approx({"drift": -0.2, "before": 100.0, "after": 80.0})


def test_a_comparison_table_prints_each_runs_probe_and_load_and_a_note_for_each_finding():
    slower = comparison_table(
        [run_with_load(37, 90.0), run_with_load(38, 91.0, 0.2), run_with_load(37.5, 89.0, 0.04)],
        [run_with_load(34, 100.0, 0.3)] * 3,
    )
    assert "| fp32 matmul GFLOP/s before training | 90 | 91 | 89 | 100 | 100 | 100 | 90 | 100 |" in slower
    assert "| CPU share of other processes while training | 0.0% | 20.0% | 4.0% | 30.0% |" in slower
    found = notes(slower)[
        0
    ].splitlines()  # the slower machine for ours; ours-2 shared its CPUs (reused runs: not ours to redo)
    assert len(found) == 2 and "90 vs 100 GFLOP/s" in found[0] and "favours MarianMT" in found[0]
    assert found[1].startswith("ours-2") and "20.0%" in found[1] and "--resume --redo ours-2" in found[1]
    quiet = comparison_table([run_with_load(37, 97.0)], [run_with_load(34, 100.0)], reused=False)
    assert "favours" not in quiet and len(notes(quiet)[0].splitlines()) == 1  # the same machine, said once
    alone = multi30k.markdown(
        {
            "runs": {"ours": [dict(run_with_load(37, 97.0), val={"bleu": 37, "chrf": 57, "bleu_signature": "sig"})]},
            "medians": {"ours": {}},
            "pair": "en-de",
            "budget_minutes": 25,
            "test_sentences": 1000,
            "marian_setup": "tuned",
            "machine": "m",
            "date": "d",
        }
    )
    assert notes(alone) == []  # --systems ours: nothing to compare with


def test_a_levers_table_compares_the_machine_with_the_recipes_row_and_names_disturbed_levers():
    recipe = {**run_with_load(36, 100.0), "val with length penalty": {"bleu": 35.5, "chrf": 59.8}}
    levers = multi30k.levers_markdown(
        {
            "pair": "en-de",
            "budget_minutes": 25,
            "levers": {
                "recipe": {**recipe, "from": "old/results.json (ours-1)"},
                "dropout 0.3": run_with_load(36.4, 120.0, 0.1),
            },
        }
    )
    assert "| dropout 0.3 | 36.40 | 56.40 | 100 | +0.40 |" in levers
    found = notes(levers)[0].splitlines()
    assert len(found) == 2 and "120 vs 100 GFLOP/s" in found[0] and "favours the levers" in found[0]
    assert found[1].startswith("dropout 0.3") and '--levers --lever "dropout 0.3"' in found[1]
    without_recipe = multi30k.levers_markdown(
        {"pair": "en-de", "budget_minutes": 25, "levers": {"dropout 0.3": run_with_load(36.4, 120.0)}}
    )
    assert notes(without_recipe) == []


def test_the_tuned_marian_is_configured_as_the_docstring_describes(tmp_path, monkeypatch):
    """ReLU, scaled tied embeddings, dropout 0.1 (attention/activation 0), its own 8k Metaspace BPE,
    64-sentence batches grouped by length, Adam (0.9, 0.98, 1e-9), 1e-3 after 800 warm-up steps, LS 0.1."""
    import transformers

    seen = {}

    class Stop(Exception):
        pass

    def capture(self, *args, **kwargs):
        seen.update(config=kwargs["model"].config, args=kwargs["args"], tokenizer=kwargs["processing_class"])
        raise Stop

    monkeypatch.setattr(transformers.Seq2SeqTrainer, "__init__", capture)
    write_corpus(tmp_path, {"train": 300})
    args = multi30k.parse_args(["--marian-vocab-size", "300", "--data-dir", str(tmp_path)])
    with pytest.raises(Stop):
        systems.train_marian(args, tmp_path, tmp_path / "run")
    config, training_args, tokenizer = seen["config"], seen["args"], seen["tokenizer"]
    assert (config.activation_function, config.scale_embedding, config.tie_word_embeddings) == ("relu", True, True)
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.1, 0.0, 0.0)
    assert (config.d_model, config.encoder_layers, config.encoder_attention_heads, config.encoder_ffn_dim) == (
        256,
        3,
        4,
        1024,
    )
    assert config.decoder_start_token_id == tokenizer.pad_token_id
    assert (training_args.per_device_train_batch_size, training_args.train_sampling_strategy) == (64, "group_by_length")
    assert (training_args.learning_rate, training_args.warmup_steps, training_args.lr_scheduler_type) == (
        1e-3,
        800,
        "inverse_sqrt",
    )
    assert (training_args.adam_beta1, training_args.adam_beta2, training_args.adam_epsilon) == (0.9, 0.98, 1e-9)
    assert training_args.label_smoothing_factor == 0.1
    assert not training_args.bf16


def test_bf16_trains_both_systems_under_bfloat16_autocast_and_only_joins_bf16_runs(tmp_path, monkeypatch):
    """--bf16 reaches MarianMT's Seq2SeqTrainingArguments and ours' train.py (whose own parsing then holds it),
    and is part of the settings: a comparison in float32 is not resumed or reused under it, nor the reverse."""
    import transformers

    from vanilla_transformer.training.run import parse_arguments

    class Stop(Exception):
        pass

    seen = {}

    def capture(self, *args, **kwargs):
        seen.update(args=kwargs["args"])
        raise Stop

    monkeypatch.setattr(transformers.Seq2SeqTrainer, "__init__", capture)
    write_corpus(tmp_path / "data", {"train": 300, "val": 3, "test_2016_flickr": 3})
    base = ["--marian-vocab-size", "300", "--data-dir", str(tmp_path / "data")]
    with pytest.raises(Stop):
        systems.train_marian(multi30k.parse_args([*base, "--bf16"]), tmp_path / "data", tmp_path / "run")
    assert seen["args"].bf16 and seen["args"].use_cpu
    for flags, expected in (([], False), (["--bf16"], True)):
        argv = systems.ours_arguments(
            multi30k.parse_args([*base, *flags]), tmp_path / "data", tmp_path / "ours", multi30k.LEVERS["recipe"]
        )
        assert parse_arguments(argv)[2].bf16 is expected

    def fake_run(function, name, args, data_dir, run_dir, lever):
        return dict(
            result(36.0, 35.0, 10), val={"bleu": 35.0, "chrf": 55.0, "bleu_signature": "sig"}, model_dir=run_dir.name
        )

    monkeypatch.setattr(multi30k, "run_in_child", fake_run)
    for first, then in (([], ["--bf16"]), (["--bf16"], [])):
        output = ["--output-dir", str(tmp_path / f"out{len(first)}")]
        multi30k.main([*base, *output, *first])
        with pytest.raises(SystemExit, match="--resume .*other settings.*bf16"):
            multi30k.main([*base, *output, *then, "--runs", "2", "--resume"])
        with pytest.raises(SystemExit, match="--marian-from .*bf16"):
            multi30k.main(
                [
                    *base,
                    *then,
                    "--output-dir",
                    str(tmp_path / "new"),
                    "--marian-from",
                    str(tmp_path / f"out{len(first)}" / "results.json"),
                ]
            )
    bf16_levers = multi30k.parse_args([*base, "--bf16"])
    with pytest.raises(SystemExit, match="--recipe-from .*other settings \\(bf16:"):  # bf16 levers, a float32 row
        multi30k.recipe_from(str(tmp_path / "out0" / "results.json"), bf16_levers)
    assert multi30k.recipe_from(str(tmp_path / "out1" / "results.json"), bf16_levers)["steps"] == 10
    recorded = [json.loads((tmp_path / f"out{n}" / "results.json").read_text())["settings"] for n in (0, 1)]
    assert "bf16" not in recorded[0] and recorded[1]["bf16"] is True  # float32 results files stay as they were


def test_the_metaspace_tokenizer_round_trips_and_ends_sequences():
    words = "a dog runs man woman sits on the bench two children play in park".split()
    tokenizer = systems.metaspace_tokenizer(iter(words * 10), vocab_size=120)
    ids = tokenizer("a dog runs in the park")["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id and len(tokenizer) <= 120
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a dog runs in the park"
    labels = tokenizer(text_target=["two children"])["input_ids"][0]
    assert labels[-1] == tokenizer.eos_token_id


def test_the_levers_table_adds_the_other_length_penalty_of_the_same_model():
    results = {
        "pair": "en-de",
        "budget_minutes": 25,
        "levers": {
            "recipe": {
                "val": {"bleu": 36.0, "chrf": 60.0},
                "val with length penalty": {"bleu": 35.5, "chrf": 59.8},
                "steps": 3000,
            },
            "dropout 0.3": {"val": {"bleu": 36.4, "chrf": 60.1}, "steps": 2990},
        },
    }
    table = multi30k.levers_markdown(results)
    assert "| decoded with length penalty (same model) | 35.50 | 59.80 | 3000 | -0.50 |" in table
    assert "| dropout 0.3 | 36.40 | 60.10 | 2990 | +0.40 |" in table


def test_the_recipe_row_can_come_from_a_comparison_run_and_must_measure_the_same_thing(tmp_path):
    """The run of the levers' seed, else the median one, from a comparison whose runs of ours were trained as
    the levers will be: same machine, pair, budget, shape, precision, recipe file and flags."""
    runs = [
        {
            "val": {"bleu": bleu, "chrf": 60.0},
            "val with length penalty": {"bleu": bleu, "chrf": 60.0},
            "steps": 100,
            "model_dir": f"ours-{index}",
        }
        for index, bleu in enumerate((38.0, 36.0, 37.0), 1)
    ]
    path = tmp_path / "results.json"
    here, levers = multi30k.machine(), multi30k.parse_args(["--seed", "1"])

    def comparison(runs, **changed) -> dict:  # results.json of a comparison run with `levers`' settings
        return {"settings": multi30k.settings(levers), "runs": {"ours": runs}, "machine": here, **changed}

    path.write_text(json.dumps(comparison(runs)))
    chosen = multi30k.recipe_from(str(path), levers)
    assert chosen["val"]["bleu"] == 37.0 and chosen["model_dir"] == "ours-3"  # unseeded runs: the median of 36, 37, 38
    table = multi30k.levers_markdown({"pair": "en-de", "budget_minutes": 25, "levers": {"recipe": chosen}})
    assert f"| recipe (from {path} (ours-3)) | 37.00 |" in table
    for flags, setting in (
        (["--pair", "de-en"], "pair"),
        (["--budget-minutes", "10"], "budget_minutes"),
        (["--bf16"], "bf16"),
        (["--recipe-flag=--max_tokens", "--recipe-flag=512"], "recipe_flag"),
        (["--dimensions", "32,1,2,64"], "dims"),
    ):
        with pytest.raises(SystemExit, match=f"--recipe-from {path}: it was run with other settings \\({setting}:"):
            multi30k.recipe_from(str(path), multi30k.parse_args(flags))
    path.write_text(json.dumps(comparison(runs, settings={**multi30k.settings(levers), "recipe_sha256": "0" * 64})))
    with pytest.raises(SystemExit, match="other settings \\(recipe_sha256:"):  # the recipe file has changed since
        multi30k.recipe_from(str(path), levers)
    seeded = [{**run, "seed": index} for index, run in enumerate(runs, 1)]
    path.write_text(json.dumps(comparison(seeded)))
    assert multi30k.recipe_from(str(path), levers)["model_dir"] == "ours-1"  # the levers' seed
    assert multi30k.recipe_from(str(path), multi30k.parse_args(["--seed", "7"]))["model_dir"] == "ours-3"  # the median
    for elsewhere in ({"machine": "Intel Xeon, 2 cores, torch 2.13.0+cpu"}, {"machine": None}):  # another, unknown
        path.write_text(json.dumps(comparison(seeded, **elsewhere)))
        with pytest.raises(
            SystemExit, match=f"--recipe-from {path}: its runs were trained on .*; this is {re.escape(here)}"
        ):
            multi30k.recipe_from(str(path), levers)
    path.write_text(json.dumps(comparison([])))
    with pytest.raises(SystemExit, match="no finished run of ours"):
        multi30k.recipe_from(str(path), levers)
    with pytest.raises(SystemExit):  # without --levers, or naming no file: refused before any training
        multi30k.parse_args(["--recipe-from", str(path)])
    with pytest.raises(SystemExit):
        multi30k.parse_args(["--levers", "--recipe-from", str(tmp_path / "absent.json")])


def write_corpus(folder: Path, sizes: dict[str, int]) -> None:
    rng = random.Random(0)
    words = "a dog runs man woman sits on the bench two children play in park".split()
    folder.mkdir(parents=True, exist_ok=True)
    for split, size in sizes.items():
        sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))) for _ in range(size)]
        for lang, transform in (("en", str), ("de", str.upper)):
            with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as file:
                file.write("".join(transform(s) + "\n" for s in sentences))


@pytest.mark.slow  # 28 s: the benchmark end to end (make test-slow)
def test_benchmark_runs_both_systems_and_writes_the_table(tmp_path):
    data = tmp_path / "multi30k"
    write_corpus(data, {"train": 300, "val": 12, "test_2016_flickr": 12})
    output = tmp_path / "out"
    completed = subprocess.run(
        [  # as a user runs it: the systems train in child processes of the script
            sys.executable,
            str(REPO / "benchmarks/multi30k.py"),
            "--data-dir",
            str(data),
            "--output-dir",
            str(output),
            "--budget-minutes",
            "0.1",
            "--dimensions",
            "32,1,2,64",
            "--marian-vocab-size",
            "200",
            "--recipe-flag=--tokenizer_vocab_size",
            "--recipe-flag=300",
            "--recipe-flag=--save_minutes",
            "--recipe-flag=0.02",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = json.loads((output / "results.json").read_text())
    for name, [run] in results["runs"].items():
        assert run["steps"] > 0 and run["target_tokens_per_second"] > 0, name
        assert 0 <= run["test"]["bleu"] <= 100 and run["test"]["bleu_signature"].startswith("nrefs:1")
    ours = results["runs"]["ours"][0]
    assert ours["final_weights"] == "moving average of every update, decay 0.998" and "test with length penalty" in ours
    assert (output / "ours-1" / "model.safetensors").is_file() and (output / "marian-1" / "config.json").is_file()
    table = (output / "results.md").read_text()
    assert "| test BLEU |" in table and "careful user" in table


def test_resume_keeps_finished_runs_trains_the_missing_ones_with_their_own_seeds(tmp_path, monkeypatch):
    """A 3-run comparison is hours of CPU: --resume continues it, a second invocation without it is
    refused instead of overwriting, and a resume with other settings is refused before any training."""
    data = tmp_path / "multi30k"
    write_corpus(data, {"train": 5, "val": 3, "test_2016_flickr": 3})
    trained = []

    def fake_run(function, name, args, data_dir, run_dir, lever):
        assert function is systems.run_system
        trained.append((name, run_dir.name, args.seed))
        return dict(
            result(36.0 if name == "ours" else 33.0, 35.0, 10),
            val={"bleu": 35.0, "chrf": 55.0, "bleu_signature": "sig"},
        )

    monkeypatch.setattr(multi30k, "run_in_child", fake_run)
    base = ["--data-dir", str(data), "--output-dir", str(tmp_path / "out"), "--seed", "7"]
    multi30k.main(base + ["--runs", "1"])
    assert trained == [("ours", "ours-1", 7), ("marian", "marian-1", 7)]
    with pytest.raises(SystemExit, match="give --resume"):
        multi30k.main(base + ["--runs", "2"])
    with pytest.raises(SystemExit, match="budget_minutes"):
        multi30k.main(base + ["--runs", "2", "--resume", "--budget-minutes", "10"])
    assert len(trained) == 2
    path = tmp_path / "out" / "results.json"
    finished = path.read_text()
    path.write_text(json.dumps({**json.loads(finished), "machine": "Intel Xeon, 2 cores, torch 2.13.0+cpu"}))
    with pytest.raises(SystemExit, match="--resume .*trained on Intel Xeon, 2 cores, torch 2.13.0\\+cpu; this is"):
        multi30k.main(base + ["--runs", "2", "--resume"])  # run 1 was trained on another machine
    path.write_text(finished)
    assert len(trained) == 2
    (tmp_path / "out" / "ours-2").mkdir()  # left by a run that was stopped: set aside, never trained into
    results = multi30k.main(base + ["--runs", "3", "--resume"])
    assert trained[2:] == [
        ("marian", "marian-2", 8),
        ("ours", "ours-2", 8),
        ("ours", "ours-3", 9),
        ("marian", "marian-3", 9),
    ]  # run 2 alternates the order; each run its own seed
    assert [run["seed"] for run in results["runs"]["ours"]] == [7, 8, 9]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["medians"]["difference"]["test BLEU"] == 3.0
    assert (tmp_path / "out" / "ours-2.incomplete-1").is_dir()


def test_redo_trains_a_finished_run_again_and_keeps_the_old_result_and_folder(tmp_path, monkeypatch):
    data = tmp_path / "multi30k"
    write_corpus(data, {"train": 5, "val": 3, "test_2016_flickr": 3})
    trained, scores = [], iter([36.0, 33.0, 30.0])

    def fake_run(function, name, args, data_dir, run_dir, lever):
        assert function is systems.run_system
        trained.append((name, run_dir.name, args.seed))
        return dict(result(next(scores), 35.0, 10), val={"bleu": 35.0, "chrf": 55.0, "bleu_signature": "sig"})

    monkeypatch.setattr(multi30k, "run_in_child", fake_run)
    base = ["--data-dir", str(data), "--output-dir", str(tmp_path / "out"), "--runs", "1"]
    multi30k.main(base)
    (tmp_path / "out" / "ours-1").mkdir()
    for wrong in (["--redo", "ours-1"], ["--resume", "--redo", "ours-2"], ["--resume", "--redo", "other-1"]):
        with pytest.raises(SystemExit):  # without --resume, beyond --runs, or no such system: refused up front
            multi30k.main(base + wrong)
    results = multi30k.main(base + ["--resume", "--redo", "ours-1"])
    assert trained[2:] == [("ours", "ours-1", 1)]  # the same slot and seed, and nothing else
    assert results["runs"]["ours"][0]["test"]["bleu"] == 30.0 and len(results["runs"]["ours"]) == 1
    [old] = results["replaced"]
    assert old["run"] == "ours-1" and old["test"]["bleu"] == 36.0
    assert (tmp_path / "out" / "ours-1.replaced-1").is_dir()
    assert json.loads((tmp_path / "out" / "results.json").read_text())["replaced"][0]["test"]["bleu"] == 36.0


@pytest.mark.slow  # 13 s: one lever of the benchmark (make test-slow)
def test_the_metaspace_lever_trains_ours_with_the_baselines_tokenizer(tmp_path):
    """The tokenizer lever gives our model MarianMT's Metaspace BPE, trained on the same pairs with the
    same size, and our train.py takes it like any tokenizer folder: the saved model tokenizes as
    the baseline's tokenizer does, and decodes the validation set."""
    data = tmp_path / "multi30k"
    write_corpus(data, {"train": 300, "val": 12, "test_2016_flickr": 12})
    output = tmp_path / "out"
    name = "Metaspace BPE 8k, MarianMT's tokenizer"
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/multi30k.py"),
            "--data-dir",
            str(data),
            "--output-dir",
            str(output),
            "--budget-minutes",
            "0.05",
            "--dimensions",
            "32,1,2,64",
            "--marian-vocab-size",
            "200",
            "--levers",
            "--lever",
            name,
            "--recipe-flag=--save_minutes",
            "--recipe-flag=0.02",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads((output / "levers.json").read_text())["levers"][name]
    assert result["steps"] > 0 and 0 <= result["val"]["bleu"] <= 100
    load = result["machine_load"]  # the machine probe around training
    assert load["matmul_gflops_before"] > 0 and load["matmul_gflops_after"] > 0
    assert all(0 <= load[key] <= 1 for key in ("others_cpu_share", "steal_share") if key in load)
    pairs = common.read_split(data, "train", "en-de")
    baseline = systems.metaspace_tokenizer((text for pair in pairs for text in pair), 200)
    saved = AutoTokenizer.from_pretrained(output / "lever-0")
    assert result["vocabulary"] == len(saved) == len(baseline)
    assert json.loads((output / "lever-0" / "tokenizer.json").read_text())["pre_tokenizer"]["type"] == "Metaspace"
    sentence = "A dog runs in the park."
    assert saved(sentence)["input_ids"] == baseline(sentence)["input_ids"]


@pytest.mark.parametrize("name", sorted(multi30k.LEVERS))
def test_every_lever_is_a_valid_change_of_the_recipe(name):
    """Each lever's flags pass train.py's own parsing and checks on top of the recipe file, before any
    27-minute run is spent on it (a lever that averages more checkpoints than it keeps is refused there)."""
    from vanilla_transformer.training.run import check_training_arguments, parse_arguments

    flags, config = multi30k.LEVERS[name]
    # the baseline's tokenizer is trained into the run folder first (test above); here, any folder name
    flags = ["some/folder" if flag == systems.MARIAN_TOKENIZER else flag for flag in flags]
    parsed = parse_arguments([str(systems.RECIPE), *flags, "--output_dir", "unused"])
    check_training_arguments(parsed[2])
    for flag, value in zip(flags[::2], flags[1::2]):  # each flag reaches the arguments unchanged
        holder = next(args for args in parsed if hasattr(args, flag[2:]))
        given = str(getattr(holder, flag[2:]))
        assert given == value or given.lower() == value.lower() in ("true", "false") or given == str(float(value)), flag
    from vanilla_transformer import VanillaTransformerConfig
    from vanilla_transformer.training.run import parse_overrides

    for key in parse_overrides(config):  # config changes name fields the model's config has
        assert hasattr(VanillaTransformerConfig(), key), key


def test_marian_runs_are_reused_only_from_a_comparison_with_the_same_marian_settings(tmp_path, monkeypatch):
    """--marian-from fills MarianMT's runs from an earlier comparison whose MarianMT settings and seeds are
    this one's; our recipe may differ (the baseline does not read it), anything else is refused."""
    data = tmp_path / "multi30k"
    write_corpus(data, {"train": 10, "val": 3, "test_2016_flickr": 3})
    arguments = ["--data-dir", str(data), "--runs", "2", "--recipe-flag=--max_tokens", "--recipe-flag=512"]
    earlier = tmp_path / "earlier.json"
    marian = [
        {
            "val": {"bleu": 30.0 + i, "chrf": 50.0, "bleu_signature": "sig"},
            "test": {"bleu": 31.0 + i, "chrf": 51.0},
            "steps": 10,
            "target_tokens_per_second": 1.0,
            "seed": i + 1,
        }
        for i in range(2)
    ]
    settings = multi30k.settings(multi30k.parse_args(["--data-dir", str(data)]))  # no recipe flag: ours differs
    earlier.write_text(json.dumps({"settings": settings, "runs": {"marian": marian}, "machine": multi30k.machine()}))
    trained = []

    def fake_run(function, name, args, data_dir, run_dir, lever):
        assert function is systems.run_system
        trained.append((name, args.seed))
        return {
            "val": {"bleu": 40.0, "chrf": 60.0, "bleu_signature": "sig"},
            "test": {"bleu": 41.0, "chrf": 61.0},
            "steps": 20,
            "target_tokens_per_second": 2.0,
        }

    monkeypatch.setattr(multi30k, "run_in_child", fake_run)
    output = tmp_path / "out"
    results = multi30k.main([*arguments, "--output-dir", str(output), "--marian-from", str(earlier)])
    assert trained == [("ours", 1), ("ours", 2)]  # MarianMT is not trained again
    assert [run["test"]["bleu"] for run in results["runs"]["marian"]] == [31.0, 32.0]
    assert results["medians"]["difference"]["test BLEU"] == pytest.approx(41.0 - 31.5)
    assert [run["from"] for run in results["runs"]["marian"]] == [str(earlier)] * 2
    assert str(earlier) in (output / "results.md").read_text()  # the table names where MarianMT's runs came from
    for changed in (["--seed", "2"], ["--pair", "de-en"], ["--marian-vocab-size", "4000"], ["--runs", "3"]):
        with pytest.raises(SystemExit, match="--marian-from"):
            multi30k.main([*arguments, *changed, "--output-dir", str(tmp_path / "x"), "--marian-from", str(earlier)])
    elsewhere = tmp_path / "elsewhere.json"  # the same MarianMT runs, trained on another CPU: refused
    elsewhere.write_text(json.dumps({"settings": settings, "runs": {"marian": marian}, "machine": "AMD EPYC, 2 cores"}))
    with pytest.raises(SystemExit, match="--marian-from .*trained on AMD EPYC, 2 cores; this is"):
        multi30k.main([*arguments, "--output-dir", str(tmp_path / "y"), "--marian-from", str(elsewhere)])
    assert trained == [("ours", 1), ("ours", 2)]
    for extra in (
        ["--levers", "--marian-from", str(earlier)],
        ["--systems", "ours", "--marian-from", str(earlier)],
        ["--marian-from", str(tmp_path / "absent.json")],
    ):  # refused before any training
        with pytest.raises(SystemExit):
            multi30k.parse_args(["--data-dir", str(data), *extra])


def test_the_averaging_sweep_scores_the_mean_of_each_last_k_checkpoints(tmp_path, monkeypatch):
    """--averaging decodes, for k = 1 .. all, the mean of the k newest checkpoints (by step, not by name),
    and from k = 2 on also their linearly weighted mean (the newest weighs k, the oldest 1)."""
    import torch

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    data = tmp_path / "multi30k"
    write_corpus(data, {"train": 4, "val": 3, "test_2016_flickr": 3})
    run = tmp_path / "levers" / "lever-1"
    biases = {}
    for seed, step in enumerate((90, 100, 1000)):  # 90 < 100 < 1000 by number, not by name
        torch.manual_seed(seed)
        model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny"))
        model.save_pretrained(run / f"checkpoint-{step}")
        biases[step] = model.model.encoder.layers[0].feed_forward.fc1.weight[0].detach().double()
    seen = []

    def fake_decode(name, model_dir, pairs, batch_size, **settings):
        loaded = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir)
        seen.append(loaded.model.encoder.layers[0].feed_forward.fc1.weight[0].detach().double())
        return {"bleu": float(len(pairs)), "chrf": 1.0, "examples": []}

    monkeypatch.setattr(systems, "decode_and_score", fake_decode)
    sweep = multi30k.main(["--data-dir", str(data), "--averaging", str(run), "--output-dir", str(tmp_path / "out")])
    a, b, c = biases[90], biases[100], biases[1000]
    expected = [c, (b + c) / 2, (b + 2 * c) / 3, (a + b + c) / 3, (a + 2 * b + 3 * c) / 6]
    assert len(seen) == len(expected)  # k = 1 once; k = 2, 3 uniform then linear
    for index, (bias, reference) in enumerate(zip(seen, expected)):
        assert torch.allclose(bias, reference, atol=1e-6), index
    assert [row["first_step"] for row in sweep["rows"].values()] == [1000, 100, 90]
    assert sweep["rows"][1]["val"]["bleu"] == 3.0  # val only: its 3 sentences
    assert "val, linear weights" in sweep["rows"][3] and "val, linear weights" not in sweep["rows"][1]
    assert "| 2 | 100 |" in (tmp_path / "out" / "averaging-levers-lever-1.md").read_text()
    assert not any("val, moving average" in row for row in sweep["rows"].values())  # trained without --ema_decay

    # A checkpoint that holds a moving average (--ema_decay): also the average itself, at that checkpoint's update.
    from vanilla_transformer.training import ExponentialMovingAverage

    torch.manual_seed(7)
    averaged = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny"))
    average = ExponentialMovingAverage(0.99)
    average.update(averaged)  # the first update's average is these weights
    average.save(run / "checkpoint-100")
    seen.clear()
    sweep = multi30k.main(["--data-dir", str(data), "--averaging", str(run), "--output-dir", str(tmp_path / "out")])
    assert "val, moving average" in sweep["rows"][2] and "val, moving average" not in sweep["rows"][1]
    assert len(seen) == len(expected) + 1
    assert torch.allclose(seen[3], averaged.model.encoder.layers[0].feed_forward.fc1.weight[0].detach().double())
    table = (tmp_path / "out" / "averaging-levers-lever-1.md").read_text()
    assert (
        "moving average |" in table and "| 1 | 1000 |" in table and table.count("– | –") == 2
    )  # k = 1 and 3 have none
    with pytest.raises(SystemExit):  # a folder without checkpoints is refused before any work
        multi30k.parse_args(["--averaging", str(tmp_path / "out")])
    for other in (["--levers"], ["--resume"]):  # it trains nothing: flags it would ignore are refused
        with pytest.raises(SystemExit):
            multi30k.parse_args(["--averaging", str(run), *other])
    (run / "checkpoint-1000" / "model.safetensors").unlink()
    (run / "checkpoint-100" / "model.safetensors").unlink()
    (run / "checkpoint-90" / "model.safetensors").unlink()
    with pytest.raises(SystemExit, match="complete model"):  # no complete checkpoint: a clear error, not an IndexError
        multi30k.main(["--data-dir", str(data), "--averaging", str(run), "--output-dir", str(tmp_path / "out")])


def test_the_length_penalty_sweep_decodes_one_model_at_every_alpha_under_both_formulas(tmp_path, monkeypatch):
    """--length-penalties decodes val with the one model at each alpha, under GNMT's and transformers'
    formula (the settings reach decode_and_score, which passes them to generate()), and trains nothing."""
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    data = tmp_path / "multi30k"
    write_corpus(data, {"train": 4, "val": 3, "test_2016_flickr": 3})
    model_dir = tmp_path / "runs" / "ours-1"
    VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny")).save_pretrained(model_dir)
    seen = []

    def fake_decode(name, folder, pairs, batch_size, **settings):
        seen.append((name, folder, len(pairs), settings["length_penalty_formula"], settings["length_penalty"]))
        return {"bleu": 10 * settings["length_penalty"], "chrf": 1.0, "length_ratio": 0.9, "examples": []}

    monkeypatch.setattr(systems, "decode_and_score", fake_decode)
    sweep = multi30k.main(
        ["--data-dir", str(data), "--length-penalties", str(model_dir), "--output-dir", str(tmp_path / "out")]
    )
    expected = [
        ("ours", str(model_dir), 3, formula, alpha)
        for formula in ("gnmt", "length")
        for alpha in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0)
    ]
    assert seen == expected  # val only (3 sentences), every alpha, both formulas
    assert sweep["rows"]["gnmt 0.6"]["val"]["bleu"] == 6.0
    assert (
        "| 0.6 | 6.00 | 1.00 | 0.900 | 6.00 | 1.00 | 0.900 |"
        in (tmp_path / "out" / "length-penalties-runs-ours-1.md").read_text()
    )
    with pytest.raises(SystemExit):  # a folder without a model is refused before any work
        multi30k.parse_args(["--length-penalties", str(tmp_path / "out")])
    for other in (["--levers"], ["--resume"], ["--averaging", str(model_dir)]):  # flags it would ignore
        with pytest.raises(SystemExit):
            multi30k.parse_args(["--length-penalties", str(model_dir), *other])


def test_the_length_penalty_sweep_of_a_marian_model_decodes_it_as_marian_with_its_one_formula(tmp_path, monkeypatch):
    """MarianMT has transformers' |Y|^alpha only: its folder is decoded as MarianMT (decode_and_score's
    settings for it), at every alpha, without a formula setting it would not understand."""
    from transformers import MarianConfig, MarianMTModel

    data = tmp_path / "multi30k"
    write_corpus(data, {"train": 4, "val": 3, "test_2016_flickr": 3})
    model_dir = tmp_path / "runs" / "marian-1"
    MarianMTModel(
        MarianConfig(
            vocab_size=50,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            pad_token_id=1,
            decoder_start_token_id=1,
        )
    ).save_pretrained(model_dir)
    seen = []

    def fake_decode(name, folder, pairs, batch_size, **settings):
        seen.append((name, settings))
        return {"bleu": settings["length_penalty"], "chrf": 1.0, "length_ratio": 1.0, "examples": []}

    monkeypatch.setattr(systems, "decode_and_score", fake_decode)
    sweep = multi30k.main(
        ["--data-dir", str(data), "--length-penalties", str(model_dir), "--output-dir", str(tmp_path / "out")]
    )
    assert [name for name, _ in seen] == ["marian"] * 16 and all(set(s) == {"length_penalty"} for _, s in seen)
    assert sweep["system"] == "marian" and set(sweep["rows"]) == {
        f"length {alpha}" for alpha in multi30k.LENGTH_PENALTIES
    }
    assert (
        "| 3.0 | – | – | – | 3.00 | 1.00 | 1.000 |"
        in (tmp_path / "out" / "length-penalties-runs-marian-1.md").read_text()
    )


def test_redecode_decodes_a_comparisons_models_of_ours_with_the_recipes_decoding_and_keeps_the_rest(
    tmp_path, monkeypatch, capsys
):
    """--redecode: each run of ours decoded again (val and test, and the other formula) with the decoding the
    recipe and --recipe-flag set; the medians against MarianMT's runs as they were; what training measured
    kept; redecoded.json and .md written into the comparison's folder. Refused with flags that train."""
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    data = tmp_path / "multi30k"
    write_corpus(data, {"train": 5, "val": 3, "test_2016_flickr": 4})
    out = tmp_path / "out"

    def fake_run(function, name, args, data_dir, run_dir, lever):
        VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny")).save_pretrained(
            run_dir
        )
        return dict(
            result(30.0 + args.seed if name == "ours" else 33.0, 35.0, 100 + args.seed),
            model_dir=str(run_dir),
            val={"bleu": 35.0, "chrf": 55.0, "bleu_signature": "sig"},
        )

    monkeypatch.setattr(multi30k, "run_in_child", fake_run)
    multi30k.main(["--data-dir", str(data), "--output-dir", str(out), "--runs", "3"])
    decoded = []

    def fake_decode(name, folder, pairs, batch_size, **settings):
        decoded.append((name, Path(folder).name, len(pairs), settings))
        bonus = {"length": 5.0, "gnmt": 1.0}[settings.get("length_penalty_formula", "gnmt")]
        return {
            "bleu": 30.0 + int(Path(folder).name[-1]) + bonus,
            "chrf": 60.0,
            "bleu_signature": "sig",
            "examples": [],
        }

    monkeypatch.setattr(systems, "decode_and_score", fake_decode)
    flags = [
        "--recipe-flag=--length_penalty",
        "--recipe-flag=2.5",
        "--recipe-flag=--length_penalty_formula",
        "--recipe-flag=length",
    ]
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where the default --output-dir, runs/multi30k, would be made
    results = multi30k.main(["--data-dir", str(data), "--redecode", str(out), *flags])
    asked = {"length_penalty": 2.5, "length_penalty_formula": "length"}
    assert decoded == [
        ("ours", f"ours-{i}", size, settings)
        for i in (1, 2, 3)
        for size in (3, 4)
        for settings in (asked, {**asked, "length_penalty_formula": "gnmt"})
    ]
    ours, marian = results["runs"]["ours"], results["runs"]["marian"]
    assert [run["test"]["bleu"] for run in ours] == [36.0, 37.0, 38.0]  # formula "length": +5
    assert [run["test with gnmt penalty"]["bleu"] for run in ours] == [32.0, 33.0, 34.0]
    assert [run["decoded_before"]["test"]["bleu"] for run in ours] == [31.0, 32.0, 33.0]
    assert [run["steps"] for run in ours] == [101, 102, 103] and [run["test"]["bleu"] for run in marian] == [33.0] * 3
    assert results["medians"]["difference"]["test BLEU"] == 37.0 - 33.0
    saved = json.loads((out / "redecoded-2.5-length.json").read_text())  # named by the settings
    assert saved["redecoded"]["decoding"] == asked and saved["medians"] == results["medians"]
    assert "test median was 32.00" in (out / "redecoded-2.5-length.md").read_text()
    decoded.clear()  # without decoding flags: the recipe's own, §6.1's
    multi30k.main(["--data-dir", str(data), "--redecode", str(out)])
    assert not list((tmp_path / "cwd").iterdir())  # written into the comparison's folder only
    paper = {"length_penalty": 0.6, "length_penalty_formula": "gnmt"}
    assert [settings for *_, settings in decoded[:2]] == [paper, {**paper, "length_penalty_formula": "length"}]
    assert (out / "redecoded-0.6-gnmt.json").is_file()
    for other in (["--levers"], ["--resume"], ["--length-penalties", str(out / "ours-1")]):
        with pytest.raises(SystemExit):
            multi30k.parse_args(["--redecode", str(out), *other])
    with pytest.raises(SystemExit):  # a folder without results.json
        multi30k.parse_args(["--redecode", str(data)])
    (out / "ours-2" / "config.json").unlink()  # a model gone (or the command run from another folder)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        multi30k.parse_args(["--redecode", str(out)])
    assert re.search("no model in .*ours-2; run from the folder", capsys.readouterr().err)
