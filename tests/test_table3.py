"""`vanilla-transformer table3`: the paper's Table 3 rows applied to a recipe's base model, checked against the
paper's printed table; end to end on tiny data, the table checked against what each run folder saved."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from helpers import REPO
from test_train import local_file_flags, reverse_pairs, write_pairs
from vanilla_transformer import VanillaTransformerConfig, cli
from vanilla_transformer.command_line import install_command
from vanilla_transformer.training import checkpointing, run, table3
from vanilla_transformer.training.checkpointing import checkpoint_folders
from vanilla_transformer.training.options import model_config

# Table 3 of the paper written out in full, every unlisted value filled in from the base row:
# row -> (N, d_model, d_ff, h, d_k, P_drop, eps_ls, positions, train steps).
PAPER_TABLE = {
    "base": (6, 512, 2048, 8, 64, 0.1, 0.1, "sinusoidal", 100_000),
    "A1": (6, 512, 2048, 1, 512, 0.1, 0.1, "sinusoidal", 100_000),
    "A2": (6, 512, 2048, 4, 128, 0.1, 0.1, "sinusoidal", 100_000),
    "A3": (6, 512, 2048, 16, 32, 0.1, 0.1, "sinusoidal", 100_000),
    "A4": (6, 512, 2048, 32, 16, 0.1, 0.1, "sinusoidal", 100_000),
    "B1": (6, 512, 2048, 8, 16, 0.1, 0.1, "sinusoidal", 100_000),
    "B2": (6, 512, 2048, 8, 32, 0.1, 0.1, "sinusoidal", 100_000),
    "C1": (2, 512, 2048, 8, 64, 0.1, 0.1, "sinusoidal", 100_000),
    "C2": (4, 512, 2048, 8, 64, 0.1, 0.1, "sinusoidal", 100_000),
    "C3": (8, 512, 2048, 8, 64, 0.1, 0.1, "sinusoidal", 100_000),
    "C4": (6, 256, 2048, 8, 32, 0.1, 0.1, "sinusoidal", 100_000),
    "C5": (6, 1024, 2048, 8, 128, 0.1, 0.1, "sinusoidal", 100_000),
    "C6": (6, 512, 1024, 8, 64, 0.1, 0.1, "sinusoidal", 100_000),
    "C7": (6, 512, 4096, 8, 64, 0.1, 0.1, "sinusoidal", 100_000),
    "D1": (6, 512, 2048, 8, 64, 0.0, 0.1, "sinusoidal", 100_000),
    "D2": (6, 512, 2048, 8, 64, 0.2, 0.1, "sinusoidal", 100_000),
    "D3": (6, 512, 2048, 8, 64, 0.1, 0.0, "sinusoidal", 100_000),
    "D4": (6, 512, 2048, 8, 64, 0.1, 0.2, "sinusoidal", 100_000),
    "E": (6, 512, 2048, 8, 64, 0.1, 0.1, "learned", 100_000),
    "big": (6, 1024, 4096, 16, 64, 0.3, 0.1, "sinusoidal", 300_000),
}
# The paper's results: row -> (PPL dev, BLEU dev, params x10^6 or None where the paper leaves it blank).
PAPER_RESULTS = {
    "base": (4.92, 25.8, 65),
    "A1": (5.29, 24.9, None),
    "A2": (5.00, 25.5, None),
    "A3": (4.91, 25.8, None),
    "A4": (5.01, 25.4, None),
    "B1": (5.16, 25.1, 58),
    "B2": (5.01, 25.4, 60),
    "C1": (6.11, 23.7, 36),
    "C2": (5.19, 25.3, 50),
    "C3": (4.88, 25.5, 80),
    "C4": (5.75, 24.5, 28),
    "C5": (4.66, 26.0, 168),
    "C6": (5.12, 25.4, 53),
    "C7": (4.75, 26.2, 90),
    "D1": (5.77, 24.6, None),
    "D2": (4.95, 25.5, None),
    "D3": (4.67, 25.3, None),
    "D4": (5.47, 25.7, None),
    "E": (4.92, 25.7, None),
    "big": (4.33, 26.4, 213),
}
# The Multi30k recipe's base (3+3 layers, d_model 256, 4 heads, d_ff 1024, dropout 0.1, label smoothing 0.2)
# with each row at the paper's ratio, worked out by hand (h 1/8 of 4 rounds up to 1).
MULTI30K_TABLE = {
    "base": (3, 256, 1024, 4, 64, 0.1, 0.2, "sinusoidal", 1000),
    "A1": (3, 256, 1024, 1, 256, 0.1, 0.2, "sinusoidal", 1000),
    "A2": (3, 256, 1024, 2, 128, 0.1, 0.2, "sinusoidal", 1000),
    "A3": (3, 256, 1024, 8, 32, 0.1, 0.2, "sinusoidal", 1000),
    "A4": (3, 256, 1024, 16, 16, 0.1, 0.2, "sinusoidal", 1000),
    "B1": (3, 256, 1024, 4, 16, 0.1, 0.2, "sinusoidal", 1000),
    "B2": (3, 256, 1024, 4, 32, 0.1, 0.2, "sinusoidal", 1000),
    "C1": (1, 256, 1024, 4, 64, 0.1, 0.2, "sinusoidal", 1000),
    "C2": (2, 256, 1024, 4, 64, 0.1, 0.2, "sinusoidal", 1000),
    "C3": (4, 256, 1024, 4, 64, 0.1, 0.2, "sinusoidal", 1000),
    "C4": (3, 128, 1024, 4, 32, 0.1, 0.2, "sinusoidal", 1000),
    "C5": (3, 512, 1024, 4, 128, 0.1, 0.2, "sinusoidal", 1000),
    "C6": (3, 256, 512, 4, 64, 0.1, 0.2, "sinusoidal", 1000),
    "C7": (3, 256, 2048, 4, 64, 0.1, 0.2, "sinusoidal", 1000),
    "D1": (3, 256, 1024, 4, 64, 0.0, 0.2, "sinusoidal", 1000),
    "D2": (3, 256, 1024, 4, 64, 0.2, 0.2, "sinusoidal", 1000),
    "D3": (3, 256, 1024, 4, 64, 0.1, 0.0, "sinusoidal", 1000),
    "D4": (3, 256, 1024, 4, 64, 0.1, 0.4, "sinusoidal", 1000),
    "E": (3, 256, 1024, 4, 64, 0.1, 0.2, "learned", 1000),
    "big": (3, 512, 2048, 8, 64, 0.3, 0.2, "sinusoidal", 3000),
}
MULTI30K_BASE = (
    "d_model=256,encoder_layers=3,decoder_layers=3,encoder_attention_heads=4,decoder_attention_heads=4,"
    "encoder_ffn_dim=1024,decoder_ffn_dim=1024,dropout=0.1"
)


def setting(config: VanillaTransformerConfig, label_smoothing: float, steps: int) -> tuple:
    """(N, d_model, d_ff, h, d_k, P_drop, eps_ls, positions, steps) of a built config, both stacks alike."""
    assert config.encoder_layers == config.decoder_layers and config.encoder_ffn_dim == config.decoder_ffn_dim
    assert config.encoder_attention_heads == config.decoder_attention_heads
    d_k = config.head_dim or config.d_model // config.encoder_attention_heads
    return (
        config.encoder_layers,
        config.d_model,
        config.encoder_ffn_dim,
        config.encoder_attention_heads,
        d_k,
        config.dropout,
        label_smoothing,
        config.position_embedding_type,
        steps,
    )


@pytest.mark.parametrize("row", list(PAPER_TABLE))
def test_each_row_applied_to_the_papers_base_is_the_papers_row(row):
    base = VanillaTransformerConfig.from_preset("base")
    change = table3.variation(table3.PAPER_ROWS[row], base, 0.1, 100_000)
    config = model_config("base", change.config)
    assert setting(config, change.label_smoothing, change.max_steps) == PAPER_TABLE[row]
    paper = table3.PAPER_ROWS[row]
    assert (paper.ppl, paper.bleu, paper.params) == PAPER_RESULTS[row]


@pytest.mark.parametrize("row", list(MULTI30K_TABLE))
def test_each_row_applied_to_the_multi30k_base_keeps_the_papers_ratios(row):
    base = model_config("base", MULTI30K_BASE)
    change = table3.variation(table3.PAPER_ROWS[row], base, 0.2, 1000)
    config = model_config("base", {**table3_overrides(MULTI30K_BASE), **change.config})
    assert setting(config, change.label_smoothing, change.max_steps) == MULTI30K_TABLE[row]


def test_a_base_with_learned_positions_keeps_them_in_every_row():
    """Positions are the base's in every row; only (E) names them, and on a learned base it changes nothing."""
    base = model_config("base", {**table3_overrides(MULTI30K_BASE), "position_embedding_type": "learned"})
    for row in PAPER_TABLE:
        change = table3.variation(table3.PAPER_ROWS[row], base, 0.2, 1000)
        assert change.config.get("position_embedding_type", "learned") == "learned", row


def test_the_multi30k_base_above_is_the_packaged_recipes():
    recipe = yaml.safe_load(cli.recipe_path("multi30k").read_text(encoding="utf-8"))
    assert (recipe["preset"], recipe["config_overrides"], recipe["label_smoothing_factor"]) == (
        "base",
        MULTI30K_BASE,
        0.2,
    )


def table3_overrides(text: str) -> dict:
    return {key: json.loads(value) for key, value in (item.split("=") for item in text.split(","))}


def test_rows_and_groups_select_in_the_papers_order_with_the_base_first():
    assert table3.select_rows("E,A2,B") == ["base", "A2", "B1", "B2", "E"]
    assert table3.select_rows(None) == [row for row in PAPER_TABLE if row != "big"]
    assert table3.select_rows("big") == ["base", "big"]


def test_a_bad_row_name_exits_2_naming_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["table3", "--max-steps", "2", "--rows", "A1,A9"])
    assert exit.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "'A9'" in error
    assert all(name in error for name in PAPER_TABLE) and "groups A, B, C, D, E" in error


@pytest.mark.parametrize(
    "flag",
    [
        "--max_train_minutes",
        "--do_predict",
        "--ema_decay",
        "--test_source_file",
        "--load_best_model_at_end",  # a checkpoint chosen on the set that scores it
        "--max_eval_samples",
        "--tokenizer_only",
    ],
)
def test_flags_that_would_change_what_table3_compares_are_refused(flag, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["table3", "--max-steps", "2", flag, "1"])
    assert exit.value.code == 2 and f"{flag} is set by table3 for every row" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-steps", "0"], "--max-steps and --seeds must be positive"),
        (["--max-steps", "2", "--seeds", "0"], "--max-steps and --seeds must be positive"),
        (["--max-steps", "2", "--devices", "0,,1"], "--devices '0,,1': give GPU numbers"),
        # 36 wide with 4 heads is a valid base; row A3's 8 heads do not divide it
        (
            ["--max-steps", "2", "--rows", "A3", "--preset", "tiny", "--config_overrides", "d_model=36"],
            "row A3 at this recipe's scale (encoder_attention_heads=8, decoder_attention_heads=8",
        ),
    ],
)
def test_bad_numbers_and_rows_the_base_cannot_take_exit_2_before_any_data_is_read(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["table3", *flags, "--output-dir", str(tmp_path)])
    error = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and len(error.splitlines()) == 1 and message in error, error
    assert not (tmp_path / "tokenizer").exists()


# ---------------------------------------------------------------------------------------------
# End to end: base and two rows on tiny data, then again (finished rows are not trained again)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reverse")
    write_pairs(folder, "train", reverse_pairs(120, seed=1))
    write_pairs(folder, "valid", reverse_pairs(4, seed=2))
    return folder


def table3_command(data_dir: Path, output_dir: Path) -> list[str]:
    return [
        "table3",
        "multi30k",
        "--max-steps",
        "2",
        "--rows",
        "B1,D4",
        "--output-dir",
        str(output_dir),
        *local_file_flags(data_dir),
        "--preset",
        "tiny",
        "--config_overrides",
        "d_model=32,encoder_ffn_dim=64,decoder_ffn_dim=64",
        "--tokenizer_vocab_size",
        "280",
        "--generation_max_length",
        "8",
        "--report_to",
        "none",
        "--use_cpu",
        "--disable_tqdm",
        "true",
    ]


def test_the_tokenizer_flags_that_trained_the_shared_tokenizer_are_not_called_ignored(data_dir, tmp_path, caplog):
    """Each row loads the tokenizer table3 trained once with --tokenizer_vocab_size; train called that flag ignored
    (the row loads a tokenizer), once per row and again when the rows were checked."""
    command = table3_command(data_dir, tmp_path / "table")
    command[command.index("--rows") + 1] = "base"
    with caplog.at_level(logging.WARNING):
        cli.main(command)
    assert "ignored" not in caplog.text and (tmp_path / "table" / "tokenizer" / "tokenizer.json").is_file()
    assert not logging.getLogger("vanilla_transformer.train").filters  # taken off after the table


@pytest.fixture(scope="module")
def table(data_dir, tmp_path_factory) -> Path:
    output_dir = tmp_path_factory.mktemp("table3")
    cli.main(table3_command(data_dir, output_dir))
    return output_dir


def saved_setting(folder: Path) -> dict:
    """A run's setting as its folder saved it: config.json, and training_args.bin for label smoothing."""
    config = json.loads((folder / "config.json").read_text())
    arguments = torch.load(folder / "training_args.bin", weights_only=False)
    head_dim = config["head_dim"] or config["d_model"] // config["encoder_attention_heads"]
    return {
        "N": config["encoder_layers"],
        "d_model": config["d_model"],
        "d_ff": config["encoder_ffn_dim"],
        "h": config["encoder_attention_heads"],
        "d_k": head_dim,
        "d_v": head_dim,
        "dropout": config["dropout"],
        "label_smoothing": arguments.label_smoothing_factor,
        "positions": config["position_embedding_type"],
    }


def validation_perplexity(folder: Path, data_dir: Path) -> float:
    """exp of the saved model's plain negative log-likelihood per target token (</s> included) on the
    validation pairs, one sentence at a time: the perplexity, with no label smoothing in it."""
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sources = (data_dir / "valid.src").read_text().splitlines()
    targets = (data_dir / "valid.tgt").read_text().splitlines()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for source, target in zip(sources, targets):
            batch = tokenizer(source, text_target=target, return_tensors="pt")
            decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
            logits = model(input_ids=batch["input_ids"], decoder_input_ids=decoder_input_ids).logits
            total += torch.nn.functional.cross_entropy(logits[0], batch["labels"][0], reduction="sum").item()
            tokens += batch["labels"].numel()
    return math.exp(total / tokens)


def test_the_table_lists_what_each_run_folder_trained(table, data_dir):
    rows = json.loads((table / "table3.json").read_text())["rows"]
    assert list(rows) == ["base", "B1", "D4"]
    saved = {row: saved_setting(table / row / "seed-42") for row in rows}
    for row, entry in rows.items():
        assert {key: entry["setting"][key] for key in saved[row]} == saved[row], row
        assert entry["setting"]["train_steps"] == 2
    # the rows' changes, at the tiny base's scale: d_k 8 -> 2 (a quarter), label smoothing 0.2 -> 0.4 (twice)
    assert (saved["base"]["d_k"], saved["B1"]["d_k"]) == (8, 2)
    assert (saved["base"]["label_smoothing"], saved["D4"]["label_smoothing"]) == (0.2, 0.4)
    # the markdown table: the base row in full, the other rows only where they differ from it
    lines = [line for line in (table / "table3.md").read_text().splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    split = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]
    cells = {row_cells[0]: row_cells for row_cells in split}
    columns = {
        "N": "N",
        "d_model": "d_model",
        "d_ff": "d_ff",
        "h": "h",
        "d_k": "d_k",
        "d_v": "d_v",
        "P_drop": "dropout",
        "ε_ls": "label_smoothing",
        "positions": "positions",
    }
    for row in rows:
        for column, key in columns.items():
            shown = cells[row][header.index(column)]
            value = saved[row][key]
            differs = row == "base" or value != saved["base"][key]
            written = f"{value:g}" if isinstance(value, float) else str(value)
            assert shown == (written if differs else ""), (row, column)
    assert cells["B1"][header.index("paper BLEU")] == "25.1" and cells["B1"][header.index("paper ΔBLEU")] == "-0.7"
    # scores as the run evaluated them, and the row's change from base
    results = {row: json.loads((table / row / "seed-42" / "all_results.json").read_text()) for row in rows}
    assert rows["B1"]["bleu"]["mean"] == results["B1"]["eval_bleu"]
    assert rows["B1"]["delta_bleu"]["mean"] == pytest.approx(results["B1"]["eval_bleu"] - results["base"]["eval_bleu"])
    assert rows["D4"]["perplexity"]["mean"] == pytest.approx(validation_perplexity(table / "D4" / "seed-42", data_dir))
    assert (table / "table3.png").is_file()


def test_finished_rows_are_skipped_an_unfinished_one_resumes_and_a_failed_one_is_reported(
    table, data_dir, monkeypatch, capsys
):
    (table / "D4" / "seed-42" / table3.RESULT_FILE).unlink()  # D4 is not finished: it runs again, and fails

    assert checkpoint_folders(table / "D4" / "seed-42")  # the Trainer saved the last update

    def failing_run(flags):
        assert f"{table / 'D4' / 'seed-42'}" in flags, "a finished row was trained again"
        assert flags[-2:] == ["--resume_from_checkpoint", "last"]  # an unfinished row resumes
        raise RuntimeError("out of memory")

    monkeypatch.setattr(run, "main", failing_run)
    with pytest.raises(SystemExit) as exit:
        cli.main(table3_command(data_dir, table))
    assert exit.value.code == 1
    out = capsys.readouterr()
    assert "base seed 42: finished before" in out.out and "B1 seed 42: finished before" in out.out
    assert "D4 seed 42: FAILED: out of memory" in out.out
    rows = json.loads((table / "table3.json").read_text())["rows"]
    assert rows["B1"]["bleu"]["n"] == 1 and "setting" not in rows["D4"]
    assert "- D4 seed 42: RuntimeError: out of memory" in (table / "table3.md").read_text()


@pytest.mark.slow
def test_rows_on_several_devices_run_as_processes_of_their_own(data_dir, tmp_path):
    """--devices: one `vanilla-transformer train` process a row, two at once (here on the CPU: the processes
    only see CUDA_VISIBLE_DEVICES); each writes its log and the same table as one process would."""
    cli.main([*table3_command(data_dir, tmp_path), "--devices", "0,1"])
    rows = json.loads((tmp_path / "table3.json").read_text())["rows"]
    for row in ("base", "B1", "D4"):
        folder = tmp_path / row / "seed-42"
        assert (folder / table3.LOG_FILE).is_file() and (folder / table3.RESULT_FILE).is_file()
        setting = saved_setting(folder)
        assert {key: rows[row]["setting"][key] for key in setting} == setting


def test_a_folder_trained_with_other_flags_is_refused_before_anything_runs(table, data_dir, monkeypatch, capsys):
    monkeypatch.setattr(run, "main", lambda flags: pytest.fail("a row was trained"))
    command = table3_command(data_dir, table)
    command[command.index("--max-steps") + 1] = "3"
    with pytest.raises(SystemExit) as exit:
        cli.main(command)
    error = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and len(error.splitlines()) == 1
    assert f"{table / 'base' / 'seed-42'} holds row base (seed 42) trained with other flags" in error
    assert "--max_steps 2, now 3" in error  # what changed, not the whole list of flags


def test_the_same_output_dir_spelled_relative_finds_its_finished_rows(table, monkeypatch):
    """The saved flags hold paths as given: the same folder named relative to the working directory was once
    refused as "trained with other flags". The reference: the base row's own saved flags, with every path
    under the table's folder spelled relative to its parent."""
    folder = table / "base" / "seed-42"
    saved = json.loads((folder / table3.FLAGS_FILE).read_text())["flags"]
    relative = [flag.replace(f"{table}", table.name) for flag in saved]
    assert relative != saved
    monkeypatch.chdir(table.parent)
    job = table3.Job("base", 42, Path(table.name) / "base" / "seed-42", relative, None)
    assert table3.finished(job) == json.loads((folder / table3.RESULT_FILE).read_text())
    other = table3.Job("base", 42, job.folder, [*relative[:-1], "elsewhere"], None)
    with pytest.raises(ValueError, match="trained with other flags"):
        table3.finished(other)


def scored_run(bleu: float = 20.0) -> dict:
    """What `run_job` records of one trained and scored row (a tiny setting)."""
    return {
        "wall_seconds": 60.0,
        "parameters": 1e6,
        "perplexity": 5.0,
        "bleu": bleu,
        "chrf": 40.0,
        **dict(zip(table3.SETTING, (2, 64, 128, 4, 16, 16, 0.1, 0.1, "sinusoidal", 10))),
    }


def test_without_matplotlib_the_table_is_written_and_the_picture_skipped_with_a_message(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    result = scored_run()
    summary = table3.summarize(["base", "A1"], {("base", 42): result, ("A1", 42): {**result, "bleu": 19.0}}, {})
    said = []
    table3.write_outputs(tmp_path, summary, ["notes"], report=said.append)
    assert (tmp_path / "table3.md").is_file() and (tmp_path / "table3.json").is_file()
    assert not (tmp_path / "table3.png").exists()
    assert said[-1] == f"no picture: matplotlib is not installed ({install_command('plot')})"
    assert summary["A1"]["delta_bleu"]["mean"] == -1.0 and summary["A1"]["runs"][42]["bleu"] == 19.0


@pytest.mark.parametrize("name", [table3.FLAGS_FILE, table3.RESULT_FILE])
def test_a_record_cut_short_is_named_with_what_to_do_and_records_are_written_whole(name, tmp_path, monkeypatch):
    job = table3.Job("base", 42, tmp_path, ["--seed", "42"], None)
    (tmp_path / name).write_text('{"row": "base", "flags": ', encoding="utf-8")  # a write stopped half-way
    with pytest.raises(ValueError, match=f"{tmp_path / name} is not valid JSON .*delete it"):
        table3.finished(job)

    def stopped(self, target):
        raise KeyboardInterrupt  # stopped between writing and renaming

    (tmp_path / name).unlink()
    monkeypatch.setattr(Path, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        table3.write_record(tmp_path / name, {"flags": job.flags})
    assert table3.finished(job) is None  # no record rather than half of one


def test_a_change_paired_over_fewer_seeds_than_the_row_says_how_many():
    """A1 seeds 1 and 2 (BLEU 19, 18); base finished seed 2 only (20): A1's mean is 18.5, its change -2.00 is
    seed 2's alone, which the table must say, or a reader computes 18.5 - 20."""
    result = scored_run()
    results = {("base", 2): result, ("A1", 1): {**result, "bleu": 19.0}, ("A1", 2): {**result, "bleu": 18.0}}
    summary = table3.summarize(["base", "A1"], results, {("base", 1): "RuntimeError: out of memory"})
    row = next(line for line in table3.markdown(summary, []).splitlines() if line.startswith("| A1 "))
    assert "| 18.50 ± 0.71 |" in row and "| -2.00 (n=1) |" in row
    assert "paired over the K seeds whose base run finished" in table3.markdown(summary, [])


def test_rows_that_change_nothing_at_the_base_are_named():
    """Rates scale at the paper's ratio: on a base without dropout, D1 and D2 train the base again."""
    base = model_config("base", {**table3_overrides(MULTI30K_BASE), "dropout": 0.0})
    jobs = [
        table3.Job(row, 42, Path(row), [], table3.variation(table3.PAPER_ROWS[row], base, 0.2, 1000))
        for row in ("base", "C1", "D1", "D2", "D3")
    ]
    assert table3.repeats_of_the_base(jobs) == ["D1", "D2"]
    assert any("Row(s) D1, D2 change nothing at this base" in note for note in table3.notes_for("multi30k", jobs, 1))


def test_e_on_a_base_with_learned_positions_is_named_a_repeat_of_the_base():
    base = model_config("base", {**table3_overrides(MULTI30K_BASE), "position_embedding_type": "learned"})
    jobs = [
        table3.Job(row, 42, Path(row), [], table3.variation(table3.PAPER_ROWS[row], base, 0.2, 1000))
        for row in ("base", "C1", "E")
    ]
    assert table3.repeats_of_the_base(jobs) == ["E"]
    sinusoidal = model_config("base", table3_overrides(MULTI30K_BASE))
    jobs = [
        table3.Job(row, 42, Path(row), [], table3.variation(table3.PAPER_ROWS[row], sinusoidal, 0.2, 1000))
        for row in ("base", "E")
    ]
    assert table3.repeats_of_the_base(jobs) == [] and jobs[1].variation.config["position_embedding_type"] == "learned"


def test_rates_above_one_half_at_the_papers_ratio_are_named():
    """On a base with dropout 0.3 and label smoothing 0.3, D2 (twice the paper's 0.1 dropout) is 0.6 and D4
    (twice its 0.1 smoothing) 0.6: named, with the rate, in the notes; the base's own rates are not."""
    base = model_config("base", {**table3_overrides(MULTI30K_BASE), "dropout": 0.3})
    jobs = [
        table3.Job(row, 42, Path(row), [], table3.variation(table3.PAPER_ROWS[row], base, 0.3, 1000))
        for row in ("base", "D1", "D2", "D3", "D4")
    ]
    assert table3.rates_above_half(jobs) == ["D2's dropout 0.6", "D4's label smoothing 0.6"]
    note = "Rates above 0.5 at the paper's ratio to this base, beyond any the paper trained: D2's dropout 0.6; D4's"
    assert any(each.startswith(note) for each in table3.notes_for("multi30k", jobs, 1))
    jobs = [
        table3.Job(row, 42, Path(row), [], table3.variation(table3.PAPER_ROWS[row], base, 0.2, 1000))
        for row in ("base", "D4")
    ]
    assert table3.rates_above_half(jobs) == [] and not any("above 0.5" in n for n in table3.notes_for("m", jobs, 1))


# ---------------------------------------------------------------------------------------------
# What the flags only name: the data files and the shared tokenizer
# ---------------------------------------------------------------------------------------------


def test_changed_data_or_tokenizer_settings_are_refused_and_a_refused_command_writes_nothing(tmp_path, monkeypatch):
    """A row's flags name its data files, not their content: a finished row was taken as finished after its
    target file was replaced (a row then compared with a base trained on other data), and a row deleted to be
    trained again with another --tokenizer_vocab_size loaded the OUTPUT/tokenizer of the old one (the table
    saying the new size)."""
    data = tmp_path / "data"
    write_pairs(data, "train", reverse_pairs(120, seed=1))
    write_pairs(data, "valid", reverse_pairs(4, seed=2))
    output = tmp_path / "table"
    command = table3_command(data, output)
    command[command.index("--rows") + 1] = "base"
    cli.main(command)
    recipes = sorted(output.glob("recipe-*.yaml"))
    monkeypatch.setattr(run, "main", lambda flags: pytest.fail("a row was trained"))

    def refused(command) -> str:
        with pytest.raises(ValueError) as error:
            table3.main(command[1:])
        assert sorted(output.glob("recipe-*.yaml")) == recipes  # nothing written by a refused command
        return str(error.value)

    # the same data: a file touched (copied, extracted again) and a path spelled another way are not a change
    os.utime(data / "train.src", ns=(time.time_ns(), time.time_ns() + 10**9))
    again = list(command)
    again[again.index("--train_source_file") + 1] = str(data / "." / "train.src")
    table3.main(again[1:])  # the finished row taken as it is (run.main fails the test)

    (data / "train.tgt").write_text((data / "train.tgt").read_text().upper())  # the same name, other targets
    error = refused(command)
    assert "holds row base (seed 42) trained on data changed since" in error
    assert f"--train_target_file {(data / 'train.tgt').resolve()}" in error and "--train_source_file" not in error

    shutil.rmtree(output / "base")  # as the refusal says; the tokenizer trained on the old data stays
    error = refused(command)
    assert f"{output / 'tokenizer'}, the tokenizer every row of this table loads, was trained with other" in error
    assert "--train_target_file" in error

    write_pairs(data, "train", reverse_pairs(120, seed=1))  # the old data back (a new modification time)
    command[command.index("--tokenizer_vocab_size") + 1] = "270"
    error = refused(command[:2] + ["--max-steps", "3"] + command[4:])  # a new recipe file: removed again
    assert "--tokenizer_vocab_size 280, now 270" in error


@pytest.mark.parametrize(
    "flags", [["--predict_with_generate", "false"], ["--no_predict_with_generate"], ["--prediction_loss_only", "true"]]
)
def test_flags_that_would_leave_the_rows_unscored_are_refused_before_any_training(flags, tmp_path, capsys):
    """They trained every row, then failed to score it ('eval_bleu'); --predict_with_generate true is harmless."""
    with pytest.raises(SystemExit) as exit:
        cli.main(["table3", "--max-steps", "2", "--rows", "base", "--output-dir", str(tmp_path / "t"), *flags])
    error = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and "every row is scored by decoding the validation set" in error, error
    assert not (tmp_path / "t").exists()


def test_a_signal_that_stops_a_row_in_this_process_ends_in_one_line_saying_to_rerun_table3(
    tmp_path, monkeypatch, capsys
):
    """train's own advice (--resume_from_checkpoint last) is refused by table3: the last line says what to do."""
    ran = []

    def stopped(flags):
        ran.append(flags)
        raise SystemExit(128 + signal.SIGINT)  # what run.main ends with after a Ctrl-C

    monkeypatch.setattr(run, "main", stopped)
    jobs = [table3.Job(row, 42, tmp_path / row, ["--output_dir", str(tmp_path / row)], None) for row in ("A1", "B1")]
    with pytest.raises(SystemExit) as exit:
        table3.run_jobs(jobs, None)
    assert exit.value.code == 130 and len(ran) == 1  # the next row does not start
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith("vanilla-transformer table3: stopped by SIGINT: to continue, run the same table3")


def test_each_row_in_this_process_compiles_from_nothing(tmp_path, monkeypatch):
    """Rows run one after another in the command's process kept every compiled graph (and, with --cuda_graphs,
    its memory pool) of the rows before, and counted them towards a row's recompilation limit."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    def step(x):
        return x * 2

    compiled, cached = torch.compile(step, backend="eager", dynamic=False), []

    def row(flags):
        cached.append(len(_debug_get_cache_entry_list(step.__code__)))
        compiled(torch.ones(len(cached)))  # a shape of its own
        assert len(_debug_get_cache_entry_list(step.__code__)) == 1

    monkeypatch.setattr(run, "main", row)
    jobs = [table3.Job(row, 42, tmp_path / row, ["--output_dir", str(tmp_path / row)], None) for row in ("A1", "B1")]
    table3.run_jobs(jobs, None, report=lambda line: None)  # each then fails to find a trained model: reported
    assert cached == [0, 0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only without a GPU")
def test_devices_without_a_gpu_are_refused_unless_the_rows_run_on_the_cpu(tmp_path, capsys):
    command = [flag for flag in table3_command(tmp_path, tmp_path / "table") if flag != "--use_cpu"]
    with pytest.raises(SystemExit) as exit:
        cli.main([*command, "--devices", "0"])
    error = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and "--devices 0: no CUDA GPU is visible here" in error
    assert not (tmp_path / "table").exists()
    table3.check_devices(["0", "1"], use_cpu=True)  # processes on the CPU (the slow test's)


def test_a_rows_gpu_is_counted_among_those_this_process_sees(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # a scheduler gave this job the machine's GPUs 2 and 3
    assert [table3.cuda_visible(device) for device in ("0", "1")] == ["2", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert table3.cuda_visible("1") == "1"


SIGNALLED_ROW = textwrap.dedent("""
    import os, signal, sys, time
    got = []
    def stop(number, frame):  # as train's StopOnSignal: finish the update, save, then exit
        print(f"got {signal.Signals(number).name}", flush=True)
        got.append(number)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    print(os.environ.get(sys.argv[1]), flush=True)  # the command's pid, for the row to stop with it
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    deadline = time.monotonic() + 30  # saving: until the second signal is seen (a fixed wait missed it under load)
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(128 + got[0])
""")


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_every_signal_to_the_command_reaches_the_rows_processes_and_no_row_starts_after(tmp_path, number):
    """--devices: SIGTERM to table3 ended table3 alone, the rows' processes training on (a rerun then found their
    folders in use); a Ctrl-C reached them only from a terminal (its process group), not from `kill -INT` to the
    command. Now the rows run in sessions of their own and each signal the command gets is passed on to them: a
    first saves, a second Ctrl-C stops at once (train's answers to one and two)."""
    processes = table3.Processes()
    logs = [tmp_path / f"row{index}.log" for index in range(2)]
    started = []
    for log in logs:
        with open(log, "w") as file:
            command = [sys.executable, "-c", SIGNALLED_ROW, checkpointing.PARENT_PID_VARIABLE]
            started.append(processes.start(command, stdout=file, stderr=subprocess.STDOUT))
    got = f"got {signal.Signals(number).name}"

    def wait_for(line: str) -> None:
        for log in logs:
            deadline = time.monotonic() + 30
            while line not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert line in log.read_text(), log.read_text()

    wait_for("ready")
    assert all(os.getpgid(process.pid) == process.pid != os.getpgid(0) for process in started)  # not the terminal's
    before = signal.getsignal(number)
    with processes.passing_signals_on():
        os.kill(os.getpid(), number)  # as `kill -INT` or `kill` of the command's pid
        wait_for(got)
        os.kill(os.getpid(), number)  # a second signal to table3, while the rows save
        assert [processes.wait(process) for process in started] == [128 + number] * 2
    assert signal.getsignal(number) == before
    assert [log.read_text().splitlines() for log in logs] == [["ready", str(os.getpid()), got, got]] * 2
    with pytest.raises(table3.RowsStopped):
        processes.start([sys.executable, "-c", "pass"])


# A table3 command with one row, as `table3.Processes` starts it (the test above): in a session of its own, given
# the command's pid (sys.argv[2] names the variable), its output in sys.argv[1]. It prints the row's pid and waits
# to be killed.
ORPHANED_ROW = textwrap.dedent("""
    import os, subprocess, sys, time
    environment = {**os.environ, sys.argv[2]: str(os.getpid())}
    with open(sys.argv[1], "w") as log:
        row = subprocess.Popen([sys.executable, "-m", "vanilla_transformer_command", "train", *sys.argv[3:]], stdout=log,
                               stderr=subprocess.STDOUT, env=environment, start_new_session=True)
    print(row.pid, flush=True)
    time.sleep(300)
""")


def test_a_rows_process_is_the_console_scripts_so_that_a_ctrl_c_while_it_imports_is_one_line(tmp_path, monkeypatch):
    """Every Ctrl-C reaches the rows now (passed on), also in the seconds a row imports torch: through the package's
    `cli` module that printed a KeyboardInterrupt traceback into its train.log; the console script's module says
    "stopped by Ctrl-C" (tests/test_cli.py checks that line)."""
    started = []

    class Started:
        stopped_by = None

        def start(self, command, **kwargs):
            started.append(command)
            return None

        def wait(self, process):
            return 0

    monkeypatch.setattr(table3, "trained_run", lambda folder: {})
    job = table3.Job("A1", 42, tmp_path / "A1", ["--output_dir", str(tmp_path / "A1")], None)
    table3.run_job(job, "0", Started())
    assert started == [[sys.executable, "-m", "vanilla_transformer_command", "train", *job.flags]]


def ended(pid: int) -> bool:
    """The process is gone, or a zombie (not every container's first process reaps its orphans)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_row_whose_command_is_killed_stops_as_on_sigterm_and_frees_its_folder(fault_runs_folder, tmp_path):
    """kill -9 of table3 --devices (or its terminal closed) left its rows training, unseen, holding their GPUs and
    folders. A row's train watches for its command and stops itself as a scheduler's SIGTERM would stop it: its
    SIGTERM line, its output folder given back."""
    from test_faults import run_argv

    log, output = tmp_path / "row.log", tmp_path / "run"
    command = subprocess.Popen(
        [sys.executable, "-c", ORPHANED_ROW, str(log), checkpointing.PARENT_PID_VARIABLE]
        + run_argv(fault_runs_folder, output, "--max_steps", "2000"),  # stopped long before
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    row = int(command.stdout.readline())
    deadline = time.monotonic() + 120
    while not (output / "_run.lock").exists() and not ended(row) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (output / "_run.lock").exists(), log.read_text()[-3000:]  # the row holds its folder
    command.kill()
    command.wait()
    deadline = time.monotonic() + 60
    while not ended(row) and time.monotonic() < deadline:
        time.sleep(0.05)
    text = log.read_text()
    assert ended(row), text[-3000:]
    assert f"the table3 command that started this run (pid {command.pid}) is gone: stopping as on SIGTERM" in text
    assert "stopped by SIGTERM" in text and "Traceback" not in text, text[-3000:]
    assert not (output / "_run.lock").exists()


def test_a_failed_rows_error_is_its_own_run_s_error_line_not_a_progress_bar(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("vanilla-transformer train: error: an older run's error\n")
    offset = log.stat().st_size
    with open(log, "a") as file:
        file.write("loading\nvanilla-transformer train: error: --output_dir x is in use by another run (pid 7)\n")
        file.write("  18%|█▊        | 27/150 [00:09<00:47,  2.58it/s]\r 19%|█▉        | 28/150")
    assert table3.row_error(log, offset) == (
        "vanilla-transformer train: error: --output_dir x is in use by another run (pid 7)"
    )
    with open(log, "a") as file:
        file.write("\nTraceback (most recent call last):\nRuntimeError: CUDA out of memory\n 20%|██ | 29/150")
    assert table3.row_error(log, log.stat().st_size - 60).endswith("CUDA out of memory")


# ---------------------------------------------------------------------------------------------
# Refused before the shared tokenizer is trained; the same command in other words is the same table
# ---------------------------------------------------------------------------------------------


def recipe_file(folder: Path, **values) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump({"dataset_name": "none", **values}), encoding="utf-8")
    return path


@pytest.mark.parametrize("key, value", [("resume_from_checkpoint", "last"), ("model_name_or_path", "some/model")])
def test_a_recipe_file_that_sets_what_table3_refuses_is_named_before_anything_is_written(key, value, tmp_path, capsys):
    """From a file they slipped past the command line's refusal: every row then failed in train (`last`: "no
    complete checkpoint"), or the base row's refusal blamed --config_overrides, which nobody gave."""
    recipe = recipe_file(tmp_path, **{key: value})
    with pytest.raises(SystemExit) as exit:
        cli.main(["table3", str(recipe), "--max-steps", "2", "--output-dir", str(tmp_path / "t")])
    error = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and f"{recipe} sets {key}: {table3.OWN_FLAGS[key]}" in error, error
    assert not (tmp_path / "t").exists()


def test_a_recipes_best_model_and_cut_validation_set_are_left_out_of_the_rows(tmp_path):
    """Each row is scored with its last weights on the whole validation set: a recipe's load_best_model_at_end
    (a checkpoint chosen on that same set) and max_eval_samples do not reach the rows."""
    recipe = recipe_file(tmp_path, load_best_model_at_end=True, metric_for_best_model="bleu", max_eval_samples=3)
    written = yaml.safe_load(table3.write_recipe(str(recipe), tmp_path / "t", 2).read_text())
    assert written["load_best_model_at_end"] is False and "max_eval_samples" not in written


def test_rows_without_validation_data_or_checkpoints_are_refused_first(data_dir, tmp_path, capsys):
    """Every row failed in train after the shared tokenizer was trained (minutes on WMT14), with advice table3
    refuses (--do_eval false); a row without checkpoints that failed after saving its model was refused by train on
    the rerun table3 advised."""
    command = table3_command(data_dir, tmp_path / "t")
    at = command.index("--validation_source_file")
    no_validation = command[:at] + command[at + 4 :]
    for flags, message in [
        (no_validation, "every row is scored on the validation set: give --validation_source_file"),
        ([*command, "--save_strategy", "no"], "--save_strategy no: a row stopped or failed after training would"),
    ]:
        with pytest.raises(SystemExit) as exit:
            cli.main(flags)
        error = capsys.readouterr().err.strip()
        assert exit.value.code == 2 and message in error, error
        assert not (tmp_path / "t").exists()


def test_config_overrides_given_as_a_mapping_in_a_recipe_file_plan_the_rows(tmp_path):
    """train took a recipe's ``config_overrides:`` mapping; table3 failed on it with an AttributeError."""
    recipe = recipe_file(
        tmp_path, train_file="t.tsv", validation_file="v.tsv", preset="tiny", config_overrides={"d_model": 32}
    )
    written = table3.write_recipe(str(recipe), tmp_path / "t", 2)
    jobs = table3.plan(written, [], ["base", "C4"], 1, tmp_path / "t", "table3")
    overrides = [job.flags[job.flags.index("--config_overrides") + 1] for job in jobs]
    # the base as the recipe's mapping says; C4: d_model 256 of 512, half the base's 32
    assert [table3_overrides(text)["d_model"] for text in overrides] == [32, 16], overrides


def test_the_same_flags_in_another_order_or_spelling_are_the_same_row():
    """A finished table was refused when run again with its flags reordered, one spelt with dashes, or ``--x=y``."""
    saved = ["r.yaml", "--seed", "42", "--config_overrides", "d_model=32", "--label_names", "labels", "x", "--use_cpu"]
    assert table3.same_flags(saved, ["r.yaml", "--use_cpu", "--config-overrides=d_model=32", "--seed", "42",
                                     "--label_names", "labels", "x"])  # fmt: skip
    assert table3.same_flags(saved, [*saved, "--seed", "42"])  # repeated: the last wins, as in argparse
    assert not table3.same_flags(saved, [*saved, "--seed", "43"])
    assert not table3.same_flags(saved, saved[:-1])  # a flag left out
    assert not table3.same_flags(saved, [*saved[:7], "y", "--use_cpu"])  # another second value
    changed = table3._changed_flags(saved, ["r.yaml", "--seed", "42", "--config-overrides", "d_model=64"])
    assert changed == (
        "--config_overrides d_model=32, now d_model=64; --label_names labels x, now (not given); "
        "--use_cpu (given without a value), now (not given)"
    )


def test_the_recipe_file_is_named_by_its_values_and_a_recipe_of_the_same_values_is_the_same(tmp_path, monkeypatch):
    """``./r.yaml`` and ``r.yaml`` wrote two recipe files (the hash covered a header naming the recipe as typed),
    so the rows of one were refused by the other."""
    monkeypatch.chdir(tmp_path)
    recipe_file(tmp_path, preset="tiny")
    first = table3.write_recipe("recipe.yaml", tmp_path / "t", 2)
    assert table3.write_recipe("./recipe.yaml", tmp_path / "t", 2) == first
    assert table3.write_recipe(str(tmp_path / "recipe.yaml"), tmp_path / "t", 3) != first
    older = first.with_name("recipe-0123456789.yaml")  # as an earlier release named it: other header, same values
    older.write_text("# recipe.yaml, written before\n" + first.read_text().split("\n", 1)[1])
    assert table3.same_flags([str(older), "--seed", "1"], [str(first), "--seed", "1"])
    older.write_text(older.read_text().replace("max_steps: 2", "max_steps: 5"))
    assert not table3.same_flags([str(older), "--seed", "1"], [str(first), "--seed", "1"])


def test_a_row_that_failed_before_training_anything_runs_with_the_new_flags(tmp_path):
    """A row whose flags train refused (it wrote no checkpoint) kept its flags record, and the corrected command
    was refused as "trained with other flags"."""
    folder = tmp_path / "base" / "seed-42"
    folder.mkdir(parents=True)
    table3.write_record(folder / table3.FLAGS_FILE, {"flags": ["r.yaml", "--seed", "42"], "data": None})
    job = table3.Job("base", 42, folder, ["r.yaml", "--seed", "42", "--validation_file", "v.tsv"], None)
    assert table3.finished(job) is None
    (folder / "checkpoint-1").mkdir()  # trained: the flags must be the same
    with pytest.raises(ValueError, match=r"trained with other flags than these \(--validation_file \(not given\)"):
        table3.finished(job)


def test_another_seed_loads_the_shared_tokenizer_other_settings_do_not(table, data_dir):
    """Rows of every seed share OUTPUT/tokenizer: a table run again with --seed 43 (to add seeds) was told to
    delete it and the finished rows; the seed counts only where it draws the held-out validation pairs."""
    recipe = next(table.glob("recipe-*.yaml"))
    flags = table3_command(data_dir, table)[table3_command(data_dir, table).index("--output-dir") + 2 :]
    table3.check_shared_tokenizer(recipe, [*flags, "--seed", "43"], table, "table3")
    with pytest.raises(ValueError, match="--tokenizer_vocab_size 280, now 270"):
        table3.check_shared_tokenizer(recipe, [*flags, "--tokenizer_vocab_size", "270"], table, "table3")


def test_a_held_out_validation_set_and_a_cut_training_set_train_the_table(data_dir, tmp_path):
    """--validation_size and --max_train_samples (numbers among the flags that choose the tokenizer's text) failed
    with a TypeError when table3 looked for the files they name: the cheapest table, one seed on held-out pairs."""
    command = table3_command(data_dir, tmp_path / "t")
    at = command.index("--validation_source_file")
    command = [*command[:at], *command[at + 4 :], "--validation_size", "8", "--max_train_samples", "100"]
    command[command.index("--rows") + 1] = "base"
    cli.main(command)
    rows = json.loads((tmp_path / "t" / "table3.json").read_text())["rows"]
    assert rows["base"]["bleu"]["n"] == 1
    scored = json.loads((tmp_path / "t" / "base" / "seed-42" / "all_results.json").read_text())
    assert round(scored["eval_samples_per_second"] * scored["eval_runtime"]) == 8  # the pairs held out
