"""benchmarks/decoding.py on a tiny corpus: every system decodes, and the identity claims it prints hold.

The reference: MarianMTModel.generate() on the same weights (ours and CTranslate2 float32 must produce its
hypotheses token for token; the script compares them and prints "identical" only when they are equal).
"""

from __future__ import annotations

import gzip
import json
import tempfile

import pytest
import torch

from helpers import REPO, load_script

decoding = load_script("benchmarks/decoding.py")

WORDS = "a man dog runs the street in red shirt woman child plays ball park green".split()


def write_split(folder, name: str, lines: int, seed: int) -> None:
    import random

    generator = random.Random(seed)
    for side in ("en", "de"):
        text = "\n".join(" ".join(generator.choices(WORDS, k=generator.randint(3, 9))) for _ in range(lines))
        with gzip.open(folder / f"{name}.{side}.gz", "wt", encoding="utf-8") as handle:
            handle.write(text + "\n")


def test_missing_data_folder_is_reported_not_an_error(tmp_path, capsys):
    assert decoding.main(["--data-dir", str(tmp_path / "absent")]) is None
    assert "Multi30k not found" in capsys.readouterr().out


def test_every_system_decodes_and_ours_and_ctranslate2_float32_equal_marianmt(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ctranslate2")
    write_split(tmp_path, "train", 200, seed=0)
    write_split(tmp_path, "test_2016_flickr", 12, seed=1)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temporary"))  # CTranslate2's converted models there
    (tmp_path / "temporary").mkdir()
    results = decoding.main(
        [
            "--data-dir",
            str(tmp_path),
            "--sentences",
            "8",
            "--sentences-batch-1",
            "2",
            "--repeats",
            "1",
            "--configurations",
            "4x4,1x1",
            "--no-compile",
            "--output",
            str(tmp_path / "out" / "decoding.json"),
        ]
    )
    printed = capsys.readouterr().out
    # --output: the timings as JSON, and what it printed as markdown beside them
    assert json.loads((tmp_path / "out" / "decoding.json").read_text()) == {
        f"{beam}x{batch}": seconds for (beam, batch), seconds in results.items()
    }
    assert (tmp_path / "out" / "decoding.md").read_text() == printed
    assert not list((tmp_path / "temporary").iterdir())  # removed when it returned
    assert set(results) == {(4, 4), (1, 1)}
    for seconds in results.values():
        assert set(seconds) == {"MarianMT", "ours", "CTranslate2 float32", "CTranslate2 int8"}
        assert all(len(times) == 1 and times[0] > 0 for times in seconds.values())
    rows = [line for line in printed.splitlines() if line.startswith(("| ours |", "| CTranslate2 float32 |"))]
    assert len(rows) == 4 and all(row.rstrip().endswith("| identical |") for row in rows), rows


def test_search_ab_compares_a_commits_search_with_the_working_trees_on_one_model(tmp_path):
    """The A/B script runs both searches on the same batches; against HEAD (here the same code) the hypotheses
    are identical, and a commit git cannot show is refused naming the flag."""
    import shutil
    import subprocess

    if (
        shutil.which("git") is None
        or subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True).returncode
    ):
        pytest.skip("needs the git history of the repository")
    write_split(tmp_path, "train", 200, seed=0)
    write_split(tmp_path, "test_2016_flickr", 12, seed=1)
    search_ab = load_script("benchmarks/search_ab.py")
    threads = torch.get_num_threads()
    try:  # it times one thread
        result = search_ab.main(["--data-dir", str(tmp_path), "--base", "HEAD", "--sentences", "8", "--rounds", "2"])
    finally:
        torch.set_num_threads(threads)
    assert result["identical"] and len(result["ratios"]) == 2 and set(result["medians"]) == {"base", "working tree"}
    assert result["median_ratio"] == pytest.approx(sum(result["ratios"]) / 2)  # the median of two
    with pytest.raises(SystemExit, match="--base no-such-commit: git cannot show"):
        search_ab.main(["--data-dir", str(tmp_path), "--base", "no-such-commit"])


profile = load_script("benchmarks/profile_training_step.py")


def test_training_step_benchmark_checks_both_compute_the_same_loss_and_gradient_then_times_them(tmp_path, capsys):
    write_split(tmp_path, "train", 1500, seed=2)  # the script takes pairs 1200-1400 by length of the first 3000
    results = profile.main(["--data-dir", str(tmp_path), "--steps", "1", "--warmup", "0", "--no-compile"])
    printed = capsys.readouterr().out
    assert "same computation: loss" in printed  # it raises instead when ours and MarianMT disagree
    assert set(results["series"]) == {"MarianMT", "ours"} and results["levers"] == {}
    assert all(len(times) == 1 and times[0] > 0 for times in results["series"].values())


@pytest.mark.parametrize("text", ["4by32", "4x", "0x32", "4x-1"])
def test_a_malformed_configuration_is_refused_naming_the_flag(text, capsys):
    with pytest.raises(SystemExit):
        decoding.parse_args(["--configurations", text])
    error = capsys.readouterr().err
    assert "--configurations" in error and repr(text) in error and "BEAMxBATCH" in error


def test_levers_are_chosen_by_name_and_an_unknown_name_is_refused_with_the_choices(capsys):
    chosen = [decoding.STOCK_SEARCH, decoding.INT8, decoding.BF16]
    assert decoding.parse_args(["--levers", *[f"--lever={name}" for name in chosen]]).lever == chosen
    with pytest.raises(SystemExit):
        decoding.parse_args(["--levers", "--lever", "no such lever"])
    error = capsys.readouterr().err
    assert "'no such lever' is not a lever" in error and decoding.STOCK_SEARCH in error
    with pytest.raises(SystemExit):
        decoding.parse_args(["--lever", decoding.INT8])
    assert "add --levers" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["min_new_tokens", "top_k=3", "repetition_penalty=high"])
def test_a_processor_setting_that_is_not_name_value_is_refused_naming_the_flag(text, capsys):
    with pytest.raises(SystemExit):
        decoding.parse_args(["--processor", text])
    error = capsys.readouterr().err
    assert "--processor" in error and repr(text) in error and "no_repeat_ngram_size" in error


def test_processor_settings_are_parsed_with_their_types():
    args = decoding.parse_args(["--processor", "min_new_tokens=5", "--processor", "repetition_penalty=1.2"])
    assert args.processors == {"min_new_tokens": 5, "repetition_penalty": 1.2}


def test_configurations_are_parsed_into_beam_and_batch():
    assert decoding.parse_args(["--configurations", "4x32, 1x1,"]).configurations == [(4, 32), (1, 1)]


def test_the_floor_counts_the_model_s_operations_and_the_vocabulary_softmax_and_nothing_else():

    a, b, scores = torch.randn(64, 64), torch.randn(64, 64), torch.randn(8, 1000)
    query, norm = torch.randn(1, 2, 5, 8), torch.nn.LayerNorm(64)

    def required_only():
        torch.nn.functional.linear(a, b, torch.zeros(64)), a @ b
        torch.nn.functional.scaled_dot_product_attention(query, query, query)
        torch.relu(norm(a + b))
        return torch.log_softmax(scores, dim=-1)

    _, seconds = decoding.required_seconds(required_only)
    assert set(seconds) == set(decoding.REQUIRED) and all(value > 0 for value in seconds.values()), seconds
    _, seconds = decoding.required_seconds(
        lambda: (
            torch.cumsum(scores, 1),
            scores.topk(4),
            torch.cat([a, b]),
            a.index_select(0, torch.tensor([1, 0])),
            a.add_(1),
        )
    )
    assert set(seconds.values()) == {0.0}
    # each operation counts once, in its own group: addmm is a matrix product, not an add
    assert decoding.required_group("aten::addmm") == "matrix products and attention"
    assert decoding.required_group("mkldnn::_linear_pointwise") == "matrix products and attention"  # prepacked
    assert decoding.required_group("aten::add") == "layer norm, residual adds, ReLU, embedding"
    assert (
        decoding.required_group("aten::_scaled_dot_product_flash_attention_for_cpu") == "matrix products and attention"
    )
    assert (
        decoding.required_group("aten::add_") is decoding.required_group("aten::scaled_dot_product_attention") is None
    )
    _, seconds = decoding.required_seconds(lambda: torch.addmm(torch.zeros(64), a, b))
    assert seconds["matrix products and attention"] > 0 and seconds["layer norm, residual adds, ReLU, embedding"] == 0


def test_the_floor_names_what_ours_spends_beyond_the_required_work_and_the_bound_it_implies():
    found = decoding.floor(
        [4.0, 4.2, 4.4],
        [2.0, 2.1, 2.2],
        (2.5, {"matrix products and attention": 1.4, "layer norm": 0.2, "log-softmax": 0.2}),
    )
    assert found["marian"] == 4.2 and found["ours"] == 2.1 and found["profiled"] == 2.5  # medians; the profiled pass
    assert found["rest"] == pytest.approx(2.1 - 1.8)
    assert found["speed"] == pytest.approx(2.0) and found["bound"] == pytest.approx(4.2 / 1.8)
    table = decoding.floor_text(found)
    assert "| the rest (search, cache, indexing, copies, Python) | 0.30 | 7% |" in table  # 0.3 of 4.2
    assert "| layer norm | 0.20 | 5% |" in table


def test_the_floor_needs_the_beam_4_batch_32_configuration(capsys):
    with pytest.raises(SystemExit):
        decoding.parse_args(["--floor", "--configurations", "1x1"])
    assert "--floor" in capsys.readouterr().err
    assert decoding.parse_args(["--floor"]).floor


def test_the_floor_runs_end_to_end_on_ours_as_shipped(tmp_path, capsys):
    write_split(tmp_path, "train", 200, seed=0)
    write_split(tmp_path, "test_2016_flickr", 32, seed=1)
    results = decoding.main(
        [
            "--data-dir",
            str(tmp_path),
            "--sentences",
            "32",
            "--repeats",
            "1",
            "--configurations",
            "4x32",
            "--no-compile",
            "--no-ctranslate2",
            "--floor",
        ]
    )
    found = results["floor"]
    assert set(found["required"]) == set(decoding.REQUIRED) and all(value > 0 for value in found["required"].values())
    assert found["bound"] == pytest.approx(found["marian"] / sum(found["required"].values()))
    printed = capsys.readouterr().out
    assert all(f"| {group} | {seconds:.2f} |" in printed for group, seconds in found["required"].items())


def test_the_stock_search_lever_runs_transformers_loop_through_generate_arguments_with_the_same_hypotheses():
    """The lever row reaches transformers' own beam search by a public generate() argument; the hypotheses
    must not change, and the decoder must really run every row at every step (no sentence leaves)."""
    from transformers import MarianConfig, MarianMTModel

    from vanilla_transformer.convert import from_marian

    torch.manual_seed(0)
    marian = MarianMTModel(
        MarianConfig(
            vocab_size=40,
            decoder_vocab_size=40,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            pad_token_id=0,
            eos_token_id=3,
            decoder_start_token_id=0,
            forced_eos_token_id=None,
            activation_function="relu",
            scale_embedding=True,
            init_std=0.1,
        )
    ).eval()
    with torch.no_grad():
        marian.final_logits_bias[0, 3] = 1.2  # sentences end at different steps
    ours = from_marian(marian)
    input_ids = torch.randint(4, 40, (6, 9), generator=torch.Generator().manual_seed(1))
    input_ids[:, -1] = 3
    settings = dict(num_beams=4, length_penalty=0.6, early_stopping=True, max_new_tokens=12)
    expected = ours.generate(input_ids=input_ids, **settings)
    assert (expected == 3).any(dim=1).sum() > 1
    ((model, added),) = decoding.lever_variants(ours, [decoding.STOCK_SEARCH]).values()
    rows = []
    model.model.decoder.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    assert torch.equal(model.generate(input_ids=input_ids, **settings, **added).sequences, expected)
    assert set(rows) == {6 * 4}
    assert set(decoding.lever_variants(ours)) == set(decoding.LEVERS)


def test_training_step_benchmark_times_both_systems_under_bf16_autocast_with_bf16_products(tmp_path):
    """--bf16 adds both systems under CPU bfloat16 autocast (the Trainer's --bf16) to the same series,
    and their matrix products do run in bfloat16 while the weights stay float32."""

    write_split(tmp_path, "train", 1500, seed=2)
    results = profile.main(["--data-dir", str(tmp_path), "--steps", "1", "--warmup", "0", "--no-compile", "--bf16"])
    assert set(results["series"]) == {"MarianMT", "ours", "MarianMT, bf16 autocast", "ours, bf16 autocast"}
    layer = torch.nn.Linear(4, 4)
    seen = []
    layer.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    step = profile.trainer_step(layer, torch.randn(2, 4), lambda model, batch: model(batch).float().sum(), bf16=True)
    step()
    assert seen == [torch.bfloat16] and layer.weight.dtype == torch.float32
