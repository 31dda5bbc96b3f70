"""benchmarks/gpu.py runs anywhere: on this CPU with a tiny model, its numbers add up."""

import json
import re
import shutil
import subprocess

import accelerate
import pytest
import torch
import transformers

from helpers import REPO, load_script
from vanilla_transformer import VanillaTransformerConfig
from vanilla_transformer.command_line import install_command
from vanilla_transformer.training.flops import training_flops_per_target_token

gpu = load_script("benchmarks/gpu.py")


@pytest.fixture(autouse=True)
def one_gpu_at_most(monkeypatch):
    """These tests pass --device cuda with torch.cuda's answers replaced; on a machine with several GPUs, gpu.py
    would refuse them (it measures one): they see one at most, as on a lent machine."""
    seen = torch.cuda.device_count()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: min(seen, 1))


def test_synthetic_lengths_look_like_wmt():
    lengths = gpu.synthetic_lengths(20000, seed=0)
    assert 24 < lengths.mean() < 32 and lengths.min() >= 2 and lengths.max() <= 250


def test_a_tiny_cpu_run_measures_training_and_decoding(tmp_path):
    output = tmp_path / "gpu.json"
    results = gpu.main(
        [
            "--no-recipe",
            "--device",
            "cpu",
            "--presets",
            "tiny",
            "--modes",
            "eager",
            "--dtype",
            "bfloat16",
            "--max-tokens",
            "512",
            "--vocab-size",
            "1000",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--decode-presets",
            "tiny",
            "--decode-batch",
            "3",
            "--decode-tokens",
            "4",
            "--decode-repeats",
            "1",
            "--no-loop",
            "--no-train-run",
            "--decode-modes",
            "eager",
            "--no-profile",
            "--eval-preset",
            "tiny",
            "--eval-sentences",
            "4",
            "--eval-batch",
            "2",
            "--eval-repeats",
            "1",
            "--eval-larger-batch",
            "4",
            "--budget-minutes",
            "0",
            "--output",
            str(output),
        ]
    )
    machine, training, evaluation, decoding = results  # evaluation before decoding: never measured on a GPU
    assert machine["device"] == "cpu" and "error" not in training and "error" not in decoding
    if (REPO / ".git").exists() and shutil.which("git"):  # the commit a recorded table cites, as git names it
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True)
        assert machine["commit"].removesuffix("-dirty") == head.stdout.strip()
        assert f"commit {machine['commit']}" in output.with_suffix(".md").read_text().splitlines()[0]
    assert machine["transformers"] == transformers.__version__ and machine["accelerate"] == accelerate.__version__
    assert training["steps"] == 2
    for model in ("ours", "marian"):
        for phase in ("unseen", "steady"):
            entry = training[f"{model}_{phase}"]
            assert entry["tokens_per_second"] > entry["target_tokens_per_second"] > 0
            assert entry["worst_step_seconds"] >= entry["median_step_seconds"] > 0
    ratio = training["marian_over_ours_steady"]
    assert ratio["quartiles"][0] <= ratio["median"] <= ratio["quartiles"][1]
    assert training["padding_fraction"] < 0.25  # a few batches padded to bucket shapes
    assert decoding["new_tokens"] == 4 and decoding["sentences_per_second"] > 0
    assert decoding["ours_over_marian"] == pytest.approx(
        decoding["sentences_per_second"] / decoding["marian_sentences_per_second"]
    )
    first = decoding["first_call_seconds"]  # the untimed first calls, apart (cuDNN's plans, compilations)
    assert set(first) >= {"ours", "marian"} and min(first.values()) > 0
    assert "cudnn_first" not in decoding  # the attention table applies on CUDA only
    assert evaluation["sentences"] == 4 and evaluation["batch_size"] == 2, evaluation
    for order in ("input", "length"):
        assert evaluation[order]["sentences_per_second"] > 0 and len(evaluation[order]["seconds"]) == 1
    # the same sentences, other batches: bfloat16 autocast moves the last digits of the loss
    assert evaluation["input"]["loss"] == pytest.approx(evaluation["length"]["loss"], rel=1e-3)
    larger = evaluation["length, larger batch"]
    assert larger["batch_size"] == 4 and larger["sentences_per_second"] > 0
    assert evaluation["larger_over_length"] == pytest.approx(evaluation["length"]["seconds"][0] / larger["seconds"][0])
    assert json.loads(output.read_text()) == json.loads(json.dumps(results))
    table = output.with_suffix(".md").read_text()
    assert "training tiny eager, steady state" in table and "decoding tiny eager, beam 4" in table
    assert "| decoding tiny eager, beam 4, first call | " in table
    assert "train's evaluation tiny, beam 4, 4 sentences" in table and "`--eval_order length`" in table
    assert "train's evaluation tiny, sorted, batch 4 |" in table and "batch 4 / 2" in table


def test_shapes_only_an_epoch_has_few_shapes_and_little_padding(capsys):
    """The targets for an epoch of WMT-like pairs: at most 128 shapes, at most 12% padding; then the same epoch
    without buckets, as docs/training.md quotes it beside them: several times the shapes, almost no padding."""
    result, plain = gpu.main(["--shapes-only", "--pairs", "1000000", "--max-tokens", "12288"])
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [result, plain]
    assert result["batches"] > 2000 and result["distinct_shapes"] <= 128 and result["padding_fraction"] <= 0.12
    # Within ~20% of max_tokens per side: no batch is left half-empty to save a shape.
    assert result["real_tokens_per_batch_and_side"] > 0.8 * 12288
    assert (result["pad_to_buckets"], plain["pad_to_buckets"]) == (True, False)
    assert plain["distinct_shapes"] > 5 * result["distinct_shapes"] and plain["padding_fraction"] < 0.02


def test_loop_times_the_training_loop_against_the_raw_step():
    """--loop runs train.py's loop (build_trainer) and the raw step on the same batches, alternating."""
    machine, loop = gpu.main(
        [
            "--loop",
            "--device",
            "cpu",
            "--presets",
            "tiny",
            "--dtype",
            "float32",
            "--max-tokens",
            "256",
            "--loop-steps",
            "12",
        ]
    )
    assert machine["what"] == "machine" and loop["what"] == "loop" and loop["updates"] == 9
    assert loop["raw_step_seconds"] > 0 and loop["loop_seconds_per_update"] > 0
    assert loop["loop_over_raw"] == loop["loop_seconds_per_update"] / loop["raw_step_seconds"]
    assert loop["loop_over_raw_quartiles"][0] <= loop["loop_over_raw_quartiles"][1]


def test_train_run_reads_target_tokens_per_second_from_the_runs_own_metrics(tmp_path):
    """The real train.py (`run.main`) for a budget in minutes; its MFU from the pairs' FLOPs per target token."""
    output = tmp_path / "gpu.json"
    machine, run = gpu.main(
        [
            "--no-recipe",
            "--no-eval",
            "--device",
            "cpu",
            "--presets",
            "tiny",
            "--dtype",
            "float32",
            "--max-tokens",
            "512",
            "--no-decode",
            "--no-loop",
            "--modes",
            "",
            "--train-run-minutes",
            "0.1",
            "--train-run-pairs",
            "2000",
            "--train-run-vocab",
            "600",
            "--peak-tflops",
            "1",
            "--no-profile",
            "--budget-minutes",
            "0",
            "--output",
            str(output),
        ]
    )[:2]
    assert run["what"] == "train_run" and "error" not in run, run
    assert run["dtype"] == "float32" and run["vocab_size"] >= 600 and run["updates"] > 0
    assert 24 < run["mean_target_tokens"] < 34  # WMT-like after the run's BPE: about a token a word
    # The budget of 6 s stopped training (the bound of 1,000,000 updates did not).
    assert 0.9 * 6 <= run["train_runtime"] < 6 + 10  # a step or two past it on a busy machine
    assert run["target_tokens_per_second"] == pytest.approx(run["train_target_tokens"] / run["train_runtime"], rel=1e-3)
    # Per target token: the mean pair's FLOPs (flops.py on mean lengths), but for the quadratic attention terms.
    mean = training_flops_per_target_token(
        VanillaTransformerConfig.from_preset("tiny", vocab_size=run["vocab_size"]),
        run["mean_source_tokens"],
        run["mean_target_tokens"],
    )
    assert run["flops_per_target_token"] == pytest.approx(mean, rel=0.05)
    assert run["mfu"] == pytest.approx(run["target_tokens_per_second"] * run["flops_per_target_token"] / 1e12)
    table = output.with_suffix(".md").read_text()
    assert "train.py tiny float32, 0.1 min on synthetic WMT-like text" in table and "MFU" in table


def test_ctranslate2_decodes_the_same_sentences_to_the_same_hypotheses(tmp_path):
    """In float32 on the CPU, CTranslate2 holding our weights finds generate()'s beam-4 hypotheses."""
    pytest.importorskip("ctranslate2")
    output = tmp_path / "gpu.json"
    results = gpu.main(
        [
            "--no-recipe",
            "--no-eval",
            "--device",
            "cpu",
            "--presets",
            "",
            "--modes",
            "eager",
            "--dtype",
            "float32",
            "--vocab-size",
            "1000",
            "--decode-presets",
            "tiny",
            "--decode-batch",
            "6",
            "--decode-tokens",
            "5",
            "--decode-repeats",
            "1",
            "--no-loop",
            "--no-train-run",
            "--decode-modes",
            "eager",
            "--no-profile",
            "--output",
            str(output),
        ]
    )
    machine, decoding = results
    ct2 = decoding["ctranslate2"]
    assert "skipped" not in ct2, ct2
    assert ct2["compute_type"] == "float32" and ct2["sentences"] == 6 and ct2["sentences_per_second"] > 0
    assert ct2["equal_to_ours"] == 6
    assert ct2["ours_over_ctranslate2"] == pytest.approx(decoding["sentences_per_second"] / ct2["sentences_per_second"])
    assert "decoding tiny eager, beam 4, CTranslate2" in output.with_suffix(".md").read_text()


def refuse_export(*args, **kwargs):
    raise ValueError("CTranslate2 has no activation_function 'tanh'")


@pytest.mark.parametrize("case", ["not importable", "export fails", "decoding fails"])
def test_decoding_without_ctranslate2_says_why_and_measures_the_rest(case, monkeypatch, tmp_path):
    """A variant beside ours and MarianMTModel (CTranslate2, cuDNN's attention first) that cannot run, or fails
    while decoding, is named in its cell; the row keeps ours and MarianMTModel's times."""
    import sys

    import vanilla_transformer.convert

    if case == "not importable":
        monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` raises ImportError
    elif case == "export fails":
        pytest.importorskip("ctranslate2")
        monkeypatch.setattr(vanilla_transformer.convert, "to_ctranslate2", refuse_export)
    else:
        pytest.importorskip("ctranslate2")
        decoder = gpu.ctranslate2_decoder

        def failing(*args, **kwargs):
            made, calls = decoder(*args, **kwargs), []
            translate = made["translate"]

            def second_call_fails():  # after its first call, timed: a variant left in the middle of the passes
                calls.append(1)
                return translate() if len(calls) == 1 else refuse_export()

            made["translate"] = second_call_fails
            return made

        monkeypatch.setattr(gpu, "ctranslate2_decoder", failing)
    machine, decoding = gpu.main(
        [
            "--no-recipe",
            "--no-eval",
            "--device",
            "cpu",
            "--presets",
            "",
            "--modes",
            "eager",
            "--dtype",
            "float32",
            "--vocab-size",
            "1000",
            "--decode-presets",
            "tiny",
            "--decode-batch",
            "2",
            "--decode-tokens",
            "2",
            "--decode-repeats",
            "1",
            "--no-loop",
            "--no-train-run",
            "--decode-modes",
            "eager",
            "--no-profile",
            "--output",
            str(tmp_path / "gpu.json"),
        ]
    )
    assert decoding["sentences_per_second"] > 0 and decoding["marian_sentences_per_second"] > 0
    if case == "decoding fails":
        error = "ValueError: CTranslate2 has no activation_function 'tanh'"
        assert decoding["ctranslate2"]["error"] == error and "sentences_per_second" not in decoding["ctranslate2"]
        assert set(decoding["first_call_seconds"]) == {"ours", "marian"}  # none for the variant that failed
        assert f"CTranslate2 | {error} |" in gpu.markdown_table([machine, decoding])
        return
    skipped = decoding["ctranslate2"]["skipped"]
    if case == "not importable":
        assert skipped.startswith("ctranslate2 is not importable") and install_command("ctranslate2") in skipped
    else:
        assert (
            skipped
            == "export to or loading in CTranslate2 failed: ValueError: CTranslate2 has no activation_function 'tanh'"
        )
    assert f"CTranslate2 | skipped: {skipped} |" in gpu.markdown_table([machine, decoding])


def test_synthetic_text_is_written_at_once_with_wmt_like_lengths(tmp_path):
    """80,000 lines of an 18,500-word vocabulary in a few seconds (one draw of indices, not a
    `rng.choice` per line), with the lengths of `synthetic_lengths` less the end-of-sentence token."""
    import time

    words = gpu.letter_words(18_500)
    started = time.perf_counter()
    flags = gpu.write_synthetic_text(tmp_path, pairs=80_000, seed=3, words=words)
    assert time.perf_counter() - started < 15  # ~0.3 s alone; the per-line draw took 100-200 s
    assert flags == [
        "--train_source_file",
        str(tmp_path / "train.src"),
        "--train_target_file",
        str(tmp_path / "train.tgt"),
    ]
    lengths = gpu.synthetic_lengths(80_000, seed=3)
    for side, name in ((0, "train.src"), (1, "train.tgt")):
        lines = (tmp_path / name).read_text(encoding="utf-8").splitlines()
        assert [len(line.split()) for line in lines] == (lengths[:, side] - 1).tolist()
        assert set(lines[0].split()) <= set(words)
    assert 24 < lengths.mean() < 32


def test_the_train_run_reports_how_long_each_phase_took(tmp_path):
    """Timed inside train.py's run: each phase has a time, and together they are no more than the whole run."""
    machine, run = gpu.main(
        [
            "--no-recipe",
            "--no-eval",
            "--device",
            "cpu",
            "--presets",
            "tiny",
            "--dtype",
            "float32",
            "--max-tokens",
            "512",
            "--no-decode",
            "--no-loop",
            "--modes",
            "",
            "--train-run-minutes",
            "0.05",
            "--train-run-pairs",
            "800",
            "--train-run-vocab",
            "400",
            "--budget-minutes",
            "0",
            "--output",
            str(tmp_path / "gpu.json"),
        ]
    )[:2]
    assert "error" not in run, run
    phases = run["phase_seconds"]
    assert list(phases) == [
        *("data", "tokenizer", "tokenization", "model", "memory probe", "first update", "training", "save", "total")
    ]
    assert all(phases[name] is not None and phases[name] >= 0 for name in phases), phases
    assert sum(value for name, value in phases.items() if name != "total") <= phases["total"] + 0.1
    assert phases["training"] + phases["first update"] == pytest.approx(run["train_runtime"], abs=2.0)
    assert "train.py tiny, phases | writing the text" in (tmp_path / "gpu.md").read_text()


def test_a_measurement_that_does_not_fit_the_budget_is_named_not_run(tmp_path):
    """The jobs of a run, most telling first; those whose estimate exceeds what is left say so."""
    args = gpu.parse_args([])
    assert args.output == "gpu-results/gpu.json" and args.budget_minutes == 7.5
    assert gpu.jobs_of(args)[:3] == [
        ("training", "big", "eager"),
        ("recipe", "multi30k", "eager"),
        ("evaluation", "multi30k", "eager"),
    ]
    results = gpu.main(
        [
            "--no-recipe",
            "--no-eval",
            "--device",
            "cpu",
            "--presets",
            "tiny",
            "--modes",
            "eager",
            "--no-decode",
            "--no-loop",
            "--no-train-run",
            "--budget-minutes",
            "0.01",
            "--output",
            str(tmp_path / "gpu.json"),
        ]
    )
    assert results[1]["what"] == "training" and results[1]["skipped"].startswith("expected to take")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["gpu.json", "gpu.md", "gpu.rows.jsonl"]
    assert "training tiny eager | skipped: expected to take" in (tmp_path / "gpu.md").read_text()


def test_a_measurement_past_the_budget_is_stopped():
    import time

    started = time.perf_counter()
    with pytest.raises(gpu.OutOfTime, match=r"stopped after \d+ s"):  # 0 s, or 1 s on a loaded machine
        with gpu.time_limit(0.2):
            while time.perf_counter() - started < 30:
                pass
    assert time.perf_counter() - started < 5


def test_a_stop_names_the_limit_that_ran_out_and_an_enclosing_limit_holds_after_an_inner_one():
    import time

    with pytest.raises(gpu.OutOfTime, match=r"stopped after \d+ s, at the end of --budget-minutes"):
        with gpu.time_limit(0.3):  # the budget runs out first, inside a row's longer cap
            with gpu.time_limit(60, "at the 60 s that one lever row may take"):
                time.sleep(5)
    with pytest.raises(gpu.OutOfTime, match="at the 0 s that one lever row may take"):
        with gpu.time_limit(60):
            with gpu.time_limit(0.2, "at the 0 s that one lever row may take"):
                time.sleep(5)
    started = time.perf_counter()
    with pytest.raises(gpu.OutOfTime, match="at the end of --budget-minutes"):
        with gpu.time_limit(0.5):
            with gpu.time_limit(60, "inner"):
                pass
            time.sleep(5)  # the enclosing limit is armed again when the inner one ends
    assert time.perf_counter() - started < 3 and gpu.LIMITS == []


def test_on_a_cpu_the_synthetic_batches_are_sized_to_finish_and_on_a_gpu_are_the_papers():
    cpu = gpu.parse_args(["--levers", "--device", "cpu", "--presets", "tiny"])
    assert (cpu.vocab_size, cpu.max_tokens, cpu.lever_steps) == (1000, 1024, 4)
    cuda = gpu.parse_args(["--levers", "--device", "cuda"])
    assert (cuda.vocab_size, cuda.max_tokens, cuda.lever_steps) == (37000, 12288, 20)
    given = gpu.parse_args(["--device", "cpu", "--max-tokens", "256", "--vocab-size", "300", "--lever-steps", "2"])
    assert (given.vocab_size, given.max_tokens, given.lever_steps) == (300, 256, 2)
    assert gpu.parse_args(["--shapes-only", "--device", "cpu"]).max_tokens == 12288  # the paper's epoch, no device


def test_a_measurement_that_swallows_the_first_stop_is_stopped_by_the_next(monkeypatch):
    """Code that catches every exception (a library's retry loop) may swallow the first `OutOfTime`: the alarm
    comes again, so the limit still holds."""
    import time

    monkeypatch.setattr(gpu, "REPEAT_SECONDS", 0.2)
    started, swallowed = time.perf_counter(), []
    with pytest.raises(gpu.OutOfTime):
        with gpu.time_limit(0.2):
            while time.perf_counter() - started < 30:
                try:
                    while time.perf_counter() - started < 30:
                        pass
                except Exception as error:  # the first stop, swallowed
                    if swallowed:
                        raise
                    swallowed.append(error)
    assert len(swallowed) == 1 and time.perf_counter() - started < 5


def test_a_measurement_far_past_its_estimate_leaves_the_next_ones_their_time(tmp_path, monkeypatch):
    """A job that runs away (a first pass over shapes far slower than thought) stops at 3x its estimate (or
    a minute), not at the end of the whole budget: the jobs after it still run."""
    import time

    def runs_away(preset, mode, args, limit):
        while True:
            time.sleep(0.01)

    monkeypatch.setattr(gpu, "RUNAWAY_MIN_SECONDS", 0.3)
    monkeypatch.setitem(gpu.ESTIMATE_SECONDS, "training", 0.05)  # 3x: 0.03 s, so the floor of 0.3 s stops it
    monkeypatch.setitem(gpu.MEASURES, "training", runs_away)
    monkeypatch.setitem(
        gpu.MEASURES, "decoding", lambda preset, mode, args, limit: {"what": "decoding", "skipped": "ran after it"}
    )
    started = time.perf_counter()
    argv = ["--no-recipe", "--no-eval", "--no-loop", "--no-train-run", "--device", "cpu", "--presets", "tiny"]
    argv += ["--modes", "eager", "--budget-minutes", "1", "--output", str(tmp_path / "gpu.json")]
    results = gpu.main(argv)
    rows = {row["what"]: row for row in results[1:]}
    assert re.fullmatch(r"stopped after \d+ s, at 3x its estimate of 0 s", rows["training"]["skipped"]), rows
    assert rows["decoding"]["skipped"] == "ran after it"
    assert time.perf_counter() - started < 20


def test_levers_run_end_to_end_on_the_cpu(tmp_path):
    """``--levers --device cpu --presets tiny``: a row for every lever of `LEVERS` after the plain step's, each
    measured, refused in one line naming its flag (CUDA or FP8 only), or skipped for the budget. The compiled
    rows capture their graphs with dynamo and run them as they are (backend eager: no AOT autograd, no inductor
    code; 10 s here, aot_eager 23 s, inductor 50 s of a cold cache; the compiled levers train like eager, AOT
    autograd and inductor included, in tests/test_levers.py)."""
    output = tmp_path / "levers.json"
    machine, levers = gpu.main(
        [
            "--levers",
            "--compile-backend",
            "eager",
            "--no-recipe",  # test_the_multi30k_recipe_runs_on_the_cpu
            "--device",
            "cpu",
            "--presets",
            "tiny",
            "--dtype",
            "float32",
            "--max-tokens",
            "256",
            "--vocab-size",
            "300",
            "--lever-steps",
            "2",
            "--budget-minutes",
            "1.5",
            "--output",
            str(output),
        ]
    )
    assert levers["what"] == "levers" and "error" not in levers, levers
    rows = {row["lever"]: row for row in levers["rows"]}
    assert list(rows) == ["plain", *gpu.LEVERS]
    plain = rows["plain"]
    assert plain["steady_target_tokens_per_second"] > 0 and plain["marian_steady_target_tokens_per_second"] > 0
    assert plain["loss_after"] == pytest.approx(plain["plain_loss_after"], rel=1e-4)  # the same step twice
    for name in ("training_attention cudnn", "cuda_graphs", "fused_loss liger", "fp8 + compile_layers", "fp8"):
        flag = gpu.LEVERS[name].get("refused_as") or gpu.LEVERS[name]["flags"][0]  # the flag a refusal names
        assert rows[name]["skipped"].startswith(flag), rows[name]
    for name, row in rows.items():
        assert "error" not in row, row
        if "skipped" not in row:  # measured: the lever trains like the plain step on the same batches
            assert row["loss_after"] == pytest.approx(row["plain_loss_after"], rel=0.02), name
    # what each row compiled: nothing for the plain step, graphs without a break for the compiled layers
    assert plain["compile_counters"]["unique_graphs"] == 0
    if "skipped" not in rows["compile_layers"]:
        counted = rows["compile_layers"]["compile_counters"]
        assert counted["unique_graphs"] > 0 and counted["graph_break"] == 0, counted
    # the peer's own first pass over the same batches, and its steady rate (the plain row's)
    marian = levers["marian"]
    assert marian["first_pass_target_tokens_per_second"] > 0 and marian["step_peak_gib"] is None  # no CUDA
    assert marian["steady_target_tokens_per_second"] == plain["marian_steady_target_tokens_per_second"]
    table = output.with_suffix(".md").read_text()
    assert "| lever | first pass tok/s | steady tok/s | warm-up s |" in table and "| plain |" in table
    assert "| MarianMTModel (the peer) | " in table and "| loss after 4 updates (plain) |" in table
    assert levers["compile_backend"] == "eager" and "two passes, compiled by eager (CUDA graphs: inductor)) |" in table
    # each measured (or failed) row was also written as it came, for a run killed before the job ends
    # (after the machine's row, written first: a machine taken back in the first job still names its card)
    first, *written = [json.loads(line) for line in output.with_suffix(".rows.jsonl").read_text().splitlines()]
    assert first == {key: value for key, value in machine.items() if key != "seconds"}
    measured = [row for row in levers["rows"] if "skipped" not in row or "seconds" in row]
    assert [row["lever"] for row in written] == [row["lever"] for row in measured] and written
    assert all(row["what"] == "levers" and row["preset"] == "tiny" for row in written)


def test_lever_rows_measure_the_named_rows_in_their_order_and_the_sync_free_row_a_pass_without_waits(tmp_path):
    """``--lever-rows``: the plain step, then the rows named, in that order (a lent GPU's minutes go to the rows
    that decide most); an unknown name is refused naming the rows. The sync-free row also times a pass of each
    without a synchronisation per step, where its saving (the host no longer waiting) can show."""
    output = tmp_path / "levers.json"
    rows = "sync_free_step, fused_loss chunked"
    small = ["--device", "cpu", "--presets", "tiny", "--dtype", "float32", "--max-tokens", "256"]
    _, levers = gpu.main(
        [
            "--levers",
            "--no-recipe",
            *small,
            "--vocab-size",
            "300",
            "--lever-steps",
            "2",
            "--lever-rows",
            rows,
            "--output",
            str(output),
        ]  # fmt: skip
    )
    assert [row["lever"] for row in levers["rows"]] == ["plain", "sync_free_step", "fused_loss chunked"]
    sync_free = levers["rows"][1]
    passes = sync_free["unsynchronized_pass"]
    assert passes["lever_time_over_plain"] == pytest.approx(
        passes["plain_target_tokens_per_second"] / passes["lever_target_tokens_per_second"]
    )
    assert "unsynchronized_pass" not in levers["rows"][2] and sync_free["updates"] == levers["rows"][2]["updates"]
    assert "sync_free_step, a pass each without a synchronisation per step" in output.with_suffix(".md").read_text()
    with pytest.raises(SystemExit):
        gpu.parse_args(["--levers", "--lever-rows", "fp8,fused loss"])


def test_an_attention_kernel_row_names_the_uses_its_kernel_declines(monkeypatch):
    """torch falls back in silence where the kernel put first declines a call (cuDNN with some masks or
    shapes): the row would time a mix under the kernel's name. Each use is tried with the kernel alone first;
    those declined are named in the row and its table cell, and the default table is back after."""
    from vanilla_transformer import attention_backends as backends

    class Trainee:  # a step whose decoder self-attention the kernel alone declines, as torch says it
        attention, model = "cudnn", torch.nn.Linear(1, 1)

        def loss(self, batch):
            if backends.BACKENDS[True, backends.DECODER] == (backends.CUDNN,):
                raise RuntimeError("No available kernel. Aborting execution.\nmore")
            return self.model(torch.ones(1)).sum()

    assert gpu.declined_uses(Trainee(), {}) == [f"{backends.DECODER} (No available kernel. Aborting execution.)"]
    assert backends.BACKENDS == backends.DEFAULT_BACKENDS
    row = {"lever": "training_attention cudnn", "declined_uses": ["cross-attention (No | kernel)"]}
    row |= {key: 1.0 for key in ("first_pass_target_tokens_per_second", "steady_target_tokens_per_second")}
    row |= {"warmup_seconds": 0, "lever_time_over_plain": {"median": 1, "quartiles": [1, 1]}, "loss_after": 1}
    row |= {"plain_steady_target_tokens_per_second": 1, "marian_steady_target_tokens_per_second": 1}
    row |= {"plain_loss_after": 1, "step_peak_gib": None, "plain_step_peak_gib": None, "updates": 4}
    lines = gpu.lever_lines({"preset": "big", "rows": [row]})
    assert "| training_attention cudnn (falls back for: cross-attention (No \\| kernel)) |" in "\n".join(lines)


def test_profile_runs_on_the_cpu(tmp_path):
    """``--profile`` on a CPU: the top operators of one update and of one decoding step (no kernels, no idle time)."""
    machine, profile = gpu.main(
        [
            "--profile",
            "--device",
            "cpu",
            "--presets",
            "tiny",
            "--dtype",
            "float32",
            "--max-tokens",
            "256",
            "--vocab-size",
            "300",
            "--decode-batch",
            "2",
            "--output",
            str(tmp_path / "gpu.json"),
        ]
    )
    assert profile["what"] == "profile" and "error" not in profile, profile
    for part in ("update", "decoding_step"):
        entry = profile[part]
        assert 0 < len(entry["top"]) <= 12 and entry["seconds"] > 0 and entry["kernel_launches"] is None
        assert sum(op["ms"] for op in entry["top"]) <= entry["seconds"] * 1e3 * 1.5
    assert profile["decoding_step"]["rows"] == 8
    table = (tmp_path / "gpu.md").read_text()
    assert "one training update" in table and "one beam-4 decoding step" in table


def test_a_stop_wrapped_by_a_library_is_still_a_stop():
    class Wrapped(Exception):
        def __init__(self, inner):
            super().__init__("backend failed")
            self.inner_exception = inner

    stop = gpu.OutOfTime("stopped after 3 s, at the end of --budget-minutes")
    assert gpu.out_of_time(Wrapped(stop)) is stop and gpu.out_of_time(ValueError("x")) is None
    try:
        try:
            raise stop
        except gpu.OutOfTime as inner:
            raise RuntimeError("during compilation") from inner
    except RuntimeError as outer:
        assert gpu.out_of_time(outer) is stop


def test_the_default_gpu_run_orders_its_rows_and_fits_the_budget_by_estimate():
    """`python benchmarks/gpu.py` on a GPU: big's training step against MarianMTModel; then the rows that the
    goals no GPU has measured wait on (the Multi30k recipe's train.py runs, train's evaluation); eager and compiled
    decoding; then the rest. The estimates of the first six fit 7.5 minutes with the imports (15 s), which the
    budget counts since it counts from the process's start."""
    args = gpu.parse_args(["--device", "cuda"])
    jobs = gpu.jobs_of(args)
    assert jobs == [
        ("training", "big", "eager"),
        ("recipe", "multi30k", "eager"),
        ("evaluation", "multi30k", "eager"),
        ("decoding", "big", "eager"),
        ("decoding", "multi30k", "eager"),
        ("decoding", "big", "compiled"),
        ("training", "base", "eager"),
        ("profile", "big", "eager"),
        ("train_run", "big", "eager"),
        ("train_run", "base", "eager"),
        ("loop", "big", "eager"),
        ("loop", "base", "eager"),
        ("decoding", "multi30k", "compiled"),
    ]
    assert sum(gpu.estimate_seconds(*job, args) for job in jobs[:6]) < 7.5 * 60 - 15
    assert ("recipe", "multi30k", "eager") not in gpu.jobs_of(gpu.parse_args(["--device", "cuda", "--no-recipe"]))
    levers = gpu.parse_args(["--levers", "--device", "cuda"])
    assert levers.output == "gpu-results/levers.json"
    assert gpu.jobs_of(levers) == [
        ("levers", "big", "eager"),
        ("recipe", "multi30k", "eager"),
        ("levers", "multi30k", "eager"),
    ]
    assert gpu.jobs_of(gpu.parse_args(["--levers", "--no-recipe"]))[1] == ("levers", "multi30k", "eager")
    recipe = gpu.parse_args(["--recipe"])
    assert gpu.jobs_of(recipe) == [("recipe", "multi30k", "eager")] and recipe.output == "gpu-results/recipe.json"
    profile = gpu.parse_args(["--profile"])  # once wrote gpu.json and gpu.md over the whole run's
    assert gpu.jobs_of(profile) == [("profile", "big", "eager")] and profile.output == "gpu-results/profile.json"
    # --levers keeps what the recipe's runs need (plain and --cuda_graphs), so that both run within the budget
    need = gpu.estimate_seconds("recipe", "multi30k", "eager", levers)
    assert levers.recipe_variants == "plain,cuda_graphs" and need == 2 * (60 * levers.recipe_minutes + 20)
    assert need < levers.budget_minutes * 60 / 2


def test_the_recipes_reserve_never_leaves_bigs_levers_too_little_to_start():
    """`--levers --presets big --budget-minutes 3.5` held back the recipe's 160 s, left big's lever rows 50 s of
    their 60, and skipped them: the one call of a lent GPU measured no big lever. The recipe is kept time for
    only where it fits beside every lever job's estimate."""
    big = gpu.parse_args(["--levers", "--presets", "big", "--device", "cuda", "--budget-minutes", "3.5"])
    jobs = gpu.jobs_of(big)
    assert jobs == [("levers", "big", "eager"), ("recipe", "multi30k", "eager")]
    recipe, lever = (gpu.estimate_seconds(*job, big) for job in (jobs[1], jobs[0]))
    assert 210 - recipe < lever  # the case: both do not fit
    assert gpu.lever_share(jobs, 0, 210, big) == 210
    both = gpu.parse_args(["--levers", "--device", "cuda", "--budget-minutes", "5"])
    jobs = gpu.jobs_of(both)
    assert [job[1] for job in jobs] == ["big", "multi30k", "multi30k"]
    assert gpu.lever_share(jobs, 0, 300, both) == (300 - recipe) / 2  # all fit: the recipe keeps its time
    assert gpu.lever_share(jobs, 2, 70, both) == 70  # the last lever job takes what is left
    assert gpu.lever_share(jobs, 0, 210, both) == 105
    for left in (250, 279):  # the levers' estimates (84 s) fit in what the recipe leaves, but not big's share
        assert gpu.lever_share(jobs, 0, left, both) == left / 2 >= lever


def test_the_documented_gpu_call_fits_a_lent_machine_and_measures_bigs_levers():
    """docs/benchmarks/gpu.md's one call, read from the page: it names its commit first (the copy has no .git),
    every step (the wheels' install too) under `timeout -k` (a hang in CUDA code ignores a Python handler), the
    timeouts and their graces within a lent machine's 10 minutes, every file under $OUT (what comes back), each
    gpu.py budget ending 15 s inside its timeout, and big's lever rows given at least their estimate."""
    import re
    import shlex

    page = (REPO / "docs/benchmarks/gpu.md").read_text()
    section = page.split("## Measuring on a GPU, in one call")[1]
    block = section.split("```bash\n")[1].split("```")[0].replace("\\\n", " ")
    assert block.startswith(f"export {gpu.COMMIT_VARIABLE}=")
    steps = [line.split("#")[0] for line in block.splitlines() if "timeout" in line]
    assert len(steps) == 4 and "pip install" in steps[0]
    limits = []
    for step in steps:
        words = shlex.split(step[step.index("timeout") :].split(";")[0].split(">")[0].split("||")[0])
        assert words[:2] == ["timeout", "-k"], step
        grace, limit = int(words[2]), int(words[3])
        limits.append(grace + limit)
        if words[5] == "benchmarks/gpu.py":
            args = gpu.parse_args([*words[6:], "--device", "cuda"])
            assert args.output.startswith("$OUT/") and 60 * args.budget_minutes + 15 <= limit, step
            if args.levers:
                jobs = gpu.jobs_of(args)
                budget = 60 * args.budget_minutes
                assert gpu.lever_share(jobs, 0, budget, args) >= gpu.estimate_seconds(*jobs[0], args), step
        elif "pytest" in words:
            assert re.search(r'> "\$OUT/[^"]+" 2>&1', step), step
    assert sum(limits) <= 600 - 10, limits
    assert f"{sum(limits)} s" in section  # as the page says


def test_the_budget_counts_from_the_start_of_the_process(tmp_path):
    """A lent machine's timeout counts the imports of torch and transformers: the command line's budget does
    too (`seconds_since_start`), so that a run given 60 s of its timeout's 75 ends inside it."""
    import time

    if not gpu.Path("/proc/self/stat").exists():
        pytest.skip("the start of a process is read from Linux's /proc")
    before = gpu.seconds_since_start()
    time.sleep(0.3)
    assert before > 1 and 0.25 <= gpu.seconds_since_start() - before <= 1.5  # pytest has run for seconds
    tiny = ["--device", "cpu", "--presets", "tiny", "--no-decode", "--no-loop", "--no-train-run", "--no-eval"]
    flags = [*tiny, "--no-recipe", "--budget-minutes", "1", "--output", str(tmp_path / "gpu.json")]
    results = gpu.main(flags, started=time.perf_counter() - 59.9)  # a process that took its budget to start
    assert results[1]["skipped"].startswith("expected to take") and results[0]["seconds"] >= 59.9


def test_an_update_is_split_at_the_trainers_callback_events(monkeypatch):
    """`PhaseClock.update_breakdown`: each update's host time between the Trainer's events, averaged over the
    second half of training, against a scripted clock; the profiled window's updates and the one after it (which
    waits for the profile's summary) are left out."""
    now = [0.0]
    monkeypatch.setattr(gpu.time, "perf_counter", lambda: now[0])

    def summary(*args, **kwargs):  # the profile's summary takes its time, within the last profiled update's end
        now[0] += 0.5
        return {"kernel_launches": None, "top": [], "ranked_by": "CPU operator self time"}

    monkeypatch.setattr(gpu, "profile_summary", summary)
    clock, args = gpu.PhaseClock(module=None, profile_after=3.0, profile_updates=2), type("A", (), {})()
    args.device = type("D", (), {"type": "cpu"})()

    class Profiler:  # torch.profiler's context manager, doing nothing
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr("torch.profiler.profile", lambda **kwargs: Profiler())
    clock.on_train_begin(args, None, None)
    for update in range(12):  # 1 ms between updates, 6 forward and backward, 2 optimizer, 1 after
        slow = update in (1, 2)  # the profiled updates, from 3 s after the first update's end
        for event, seconds in (("on_step_begin", 1), ("on_pre_optimizer_step", 6), ("on_optimizer_step", 2)):
            now[0] += (100 if slow else 1) * seconds / 1e3
            getattr(clock, event)(args, None, None)
        now[0] += 1 / 1e3
        clock.on_step_end(args, None, None)
        if update == 0:
            now[0] += 3.0  # the next update starts the profiled window
    clock.on_train_end(args, None, None)
    assert clock.profile["updates"] == 2 and not clock.profile["window_cut_by_the_run_end"]
    breakdown = clock.update_breakdown(fraction=1.0)
    assert breakdown["updates"] == 12 - 1 - 2 - 1  # not the first (no update before it), the window, the one after
    assert [round(breakdown[phase], 6) for phase in gpu.PhaseClock.UPDATE_PHASES] == [1, 6, 2, 1]
    assert breakdown["update_ms"] == pytest.approx(10)
    assert clock.steady_updates_per_second(fraction=1.0) == pytest.approx(100)  # the same updates, 10 ms each


def test_the_profiled_window_starts_by_its_deadline_after_a_slow_first_update(monkeypatch):
    """The recipe run profiles updates from ``profile_after`` seconds after the first update's end; a loaded machine
    whose first update ended late in the run's minutes left no window at all (a profile of None). The window now
    starts ``profile_by`` seconds after training began at the latest."""
    now = [0.0]
    monkeypatch.setattr(gpu.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(
        gpu, "profile_summary", lambda *a, **k: {"kernel_launches": None, "top": [], "ranked_by": "CPU self time"}
    )

    class Profiler:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr("torch.profiler.profile", lambda **kwargs: Profiler())
    args = type("A", (), {"device": type("D", (), {"type": "cpu"})()})()
    for profile_by, started_at in ((None, None), (3.6, 1)):  # 1.44 s after the first update; by 3.6 s of 7.2
        clock = gpu.PhaseClock(module=None, profile_after=1.44, profile_updates=3, profile_by=profile_by)
        clock.on_train_begin(args, None, None)
        starts = []
        for update in range(5):
            now[0] += 5.0 if update == 0 else 0.3  # a first update of 5 s, then 0.3 s each: the run ends at 6.2 s
            clock.on_step_begin(args, None, None)
            starts.append(clock.profiler is not None)
            for event in ("on_pre_optimizer_step", "on_optimizer_step", "on_step_end"):
                getattr(clock, event)(args, None, None)
        clock.on_train_end(args, None, None)
        assert (starts.index(True) if True in starts else None) == started_at, starts
    assert clock.profile["updates"] == 3


def test_the_profiled_window_never_outlives_the_run(monkeypatch):
    """Training that ends inside the profiled window stops the profiler with the updates it had; a run stopped by an
    error (or the budget) inside it stops it too, so that no later measurement runs under the profiler."""
    from torch.autograd import profiler

    args = type("A", (), {"device": type("D", (), {"type": "cpu"})()})()
    linear = torch.nn.Linear(4, 4)
    clock = gpu.PhaseClock(module=None, profile_after=0.0, profile_updates=100)
    with clock:
        clock.on_train_begin(args, None, None)
        for _ in range(4):
            clock.on_step_begin(args, None, None)
            linear(torch.ones(2, 4)).sum().backward()
            clock.on_pre_optimizer_step(args, None, None)
            clock.on_optimizer_step(args, None, None)
            clock.on_step_end(args, None, None)
        assert profiler._is_profiler_enabled
        clock.on_train_end(args, None, None)
    assert not profiler._is_profiler_enabled and clock.profile["updates"] == 3  # the window starts after the first
    assert clock.profile["window_cut_by_the_run_end"]  # and the table says so
    line = gpu.update_lines({"variant": "plain", "profile": clock.profile})[0]
    assert "profiled 3 update(s): the run ended inside the window" in line
    stopped = gpu.PhaseClock(module=None, profile_after=0.0)
    with pytest.raises(RuntimeError, match="stopped"):
        with stopped:
            stopped.on_train_begin(args, None, None)
            for _ in range(2):
                stopped.on_step_begin(args, None, None)
                stopped.on_step_end(args, None, None)
            raise RuntimeError("stopped")
    assert not profiler._is_profiler_enabled and stopped.profile is None


# The recipe's model made small for a CPU test: the recipe's own took 1.5-3.5 s an update on 2 shared cores, and
# the few of a short budget were too few for a steady rate and a profiled window.
SMALL_RECIPE_MODEL = [
    "--config_overrides",
    "d_model=64,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
    "encoder_ffn_dim=128,decoder_ffn_dim=128",
    "--tokenizer_vocab_size",
    "1000",
    "--max_tokens",
    "256",
]


def test_the_multi30k_recipe_runs_on_the_cpu(tmp_path, monkeypatch):
    """``--recipe``: train.py with the packaged Multi30k recipe on synthetic pairs, a row per variant: measured
    (updates/s from the run's own log, and at steady state from the step ends), or refused in one line naming its
    flag; an unknown variant is refused before anything runs."""
    monkeypatch.setitem(gpu.RECIPE_VARIANTS, "plain", SMALL_RECIPE_MODEL)
    output = tmp_path / "recipe.json"
    machine, recipe = gpu.main(
        [
            "--recipe",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--recipe-variants",
            "plain,cuda_graphs",
            "--recipe-minutes",
            "0.06",
            "--recipe-pairs",
            "1500",
            "--output",
            str(output),
        ]
    )
    assert recipe["what"] == "recipe" and [row["variant"] for row in recipe["rows"]] == ["plain", "cuda_graphs"]
    plain, graphs = recipe["rows"]
    assert plain["updates"] >= 3 and plain["updates_per_second"] == pytest.approx(
        plain["updates"] / plain["train_runtime"]
    )
    assert 0 < plain["steady_updates_per_second"] < 10 * plain["updates_per_second"]
    # where an update went: the phases add up to the mean update, which is the steady rate's (both the second half)
    breakdown = plain["update_breakdown"]
    assert sum(breakdown[phase] for phase in gpu.PhaseClock.UPDATE_PHASES) == pytest.approx(breakdown["update_ms"])
    assert breakdown["update_ms"] == pytest.approx(1e3 / plain["steady_updates_per_second"], rel=0.3)
    profile = plain["profile"]  # a CPU profiles operators: no kernels, no device time
    assert profile["top"] and profile["device_busy_seconds_per_update"] is None
    # three updates, or those the run had left when its minutes ran out inside the window (a loaded machine)
    assert profile["updates"] == 3 or (profile["window_cut_by_the_run_end"] and 1 <= profile["updates"] < 3)
    assert graphs["skipped"].startswith("--cuda_graphs needs a CUDA GPU"), graphs
    # how long each phase of the run took (the default run's train.py row: data, tokenizer, ..., save)
    phases = plain["phase_seconds"]
    assert list(phases) == [*gpu.PhaseClock.PHASES, "total"] and None not in phases.values(), phases
    assert sum(phases[phase] for phase in gpu.PhaseClock.PHASES) <= phases["total"] + 0.1
    assert phases["first update"] == plain["first_update_seconds"]
    table = output.with_suffix(".md").read_text()
    assert (
        f"| train.py multi30k recipe float32, 0.06 min, {' '.join(SMALL_RECIPE_MODEL)} |" in table
        and "skipped: --cuda_graphs" in table
    )
    assert "| plain: phases | data " in table and ", save " in table
    with pytest.raises(SystemExit):
        gpu.parse_args(["--recipe", "--recipe-variants", "plain,fast"])


def test_the_markdown_keeps_one_table_and_an_error_in_one_cell():
    """Rows after a levers table once lost their table (they followed the levers' own), and an inductor error of
    many lines, with column bars in it, broke the table it was in."""
    machine = {"device": "cuda", "gpu": "H100", "torch": "2.11.0", "transformers": "5.24.0"}
    levers = {
        "what": "levers",
        "preset": "multi30k",
        "batches": 20,
        "distinct_shapes": 13,
        "rows": [{"lever": "compile_layers", "error": "InductorError: a | b\n  File 'x.py', line 1\n" + "y" * 500}],
    }
    after = {"what": "training", "preset": "big", "mode": "eager", "skipped": "expected to take 90 s\nmore"}
    text = gpu.markdown_table([machine, levers, after])
    main, _, levers_part = text.partition("Levers, multi30k")
    assert "| training big eager | skipped: expected to take 90 s | | |" in main  # in the first table
    assert "| levers multi30k (20 batches, 13 shapes, two passes) | see below | | |" in main
    assert "| compile_layers | InductorError: a \\| b | | | | | | | |" in levers_part
    assert "File 'x.py'" not in text and "y" * 300 not in text
    long = {"what": "training", "preset": "base", "mode": "eager", "error": "z" * 400}
    assert "| training base eager | " + "z" * 297 + "... | | |" in gpu.markdown_table([machine, long])


def test_the_decoding_row_puts_cudnn_first_outside_training_only_while_it_runs():
    """The row that decides whether generate() leaves cuDNN's attention out (only training's choice is measured):
    inside, every use outside training takes cuDNN first, the rest in the default order; training keeps its own
    table; after it, the default is back, also after an error."""
    from vanilla_transformer import attention_backends as backends

    default = dict(backends.BACKENDS)
    assert all(backends.CUDNN not in order for order in default.values())  # the default: no use takes cuDNN
    with pytest.raises(RuntimeError, match="inside"):
        with gpu.cudnn_first_outside_training():
            for (training, use), order in backends.BACKENDS.items():
                expected = default[training, use] if training else (backends.CUDNN, *default[training, use])
                assert order == expected, (training, use)
            raise RuntimeError("inside")
    assert backends.BACKENDS == default
    row = {
        "what": "decoding",
        "preset": "big",
        "mode": "eager",
        "sentences_per_second": 400.0,
        "marian_sentences_per_second": 380.0,
        "ours_over_marian": 400 / 380,
        "first_call_seconds": {"ours": 1.5, "marian": 4.25, "ours, cuDNN first": 9.0},
        "cudnn_first": {"sentences_per_second": 500.0, "over_default": 1.25, "same_hypotheses": True},
    }
    machine = {"device": "cuda", "gpu": "H100", "torch": "2.11.0", "transformers": "5.24.0"}
    table = gpu.markdown_table([machine, row])
    assert "| decoding big eager, beam 4, first call | 1.50 s | 4.25 s | |" in table
    assert (
        "| decoding big eager, beam 4, cuDNN attention first | 500.0 sentences/s, first call 9.00 s, the same "
        "hypotheses | | default / cuDNN first 1.25 |"
    ) in table
    failed = {**row, "cudnn_first": {"error": "RuntimeError: cuDNN Frontend error: | no plan"}}
    table = gpu.markdown_table([machine, failed])  # the variant's error; ours and MarianMTModel's times stay
    assert (
        "| decoding big eager, beam 4, cuDNN attention first | RuntimeError: cuDNN Frontend error: \\| no plan |"
        in table
    )
    assert "| decoding big eager, beam 4 | 400.0 sentences/s | 380.0 sentences/s | 1.05 |" in table


def test_bucketed_decoding_times_translates_static_cache_over_few_shapes(tmp_path):
    """``--decode-modes buckets``: translate --static-cache's batches (sorted, padded to a multiple of 16 tokens),
    ours and MarianMTModel with a static and a dynamic cache, two passes each; on a CPU nothing is compiled."""
    _, result = gpu.main(
        [
            *("--presets", "", "--decode-presets", "tiny", "--decode-modes", "buckets", "--device", "cpu"),
            *("--dtype", "float32", "--vocab-size", "300", "--decode-batch", "4", "--decode-batches", "3"),
            *("--decode-tokens", "3", "--no-eval", "--no-recipe", "--no-loop", "--no-train-run"),
            *("--output", str(tmp_path / "buckets.json")),
        ]
    )
    assert result["what"] == "decoding buckets" and result["batches"] == 3 and 1 <= result["shapes"] <= 3
    rates = result["sentences_per_second"]
    assert set(rates) == {"ours, static", "marian, static", "ours, dynamic", "marian, dynamic"}
    assert all(rate["first_pass"] > 0 and rate["second_pass"] > 0 for rate in rates.values())
    assert result["compiled"] is False and "translate --static-cache" in (tmp_path / "buckets.md").read_text()


def test_the_evaluation_row_times_static_cache_decoding_to_the_same_scores(tmp_path):
    """``--eval-static-cache``: train's evaluation sorted by length, also with --static_cache_decoding; the same
    hypotheses, so the same BLEU, loss and lengths as the dynamic cache's."""
    _, result = gpu.main(
        [
            *("--presets", "", "--no-decode", "--no-recipe", "--no-loop", "--no-train-run", "--device", "cpu"),
            *("--dtype", "float32", "--vocab-size", "300", "--eval-preset", "tiny", "--eval-sentences", "3"),
            *("--eval-batch", "3", "--eval-repeats", "1", "--eval-larger-batch", "0", "--eval-static-cache"),
            *("--output", str(tmp_path / "evaluation.json")),
        ]
    )
    static, dynamic = result["length, static cache"], result["length"]
    assert static["bleu"] == dynamic["bleu"] and static["gen_len"] == dynamic["gen_len"]
    assert static["loss"] == pytest.approx(dynamic["loss"], rel=1e-6)  # sources of another width: other roundings
    assert result["static_over_length"] > 0 and "`--static_cache_decoding`" in (tmp_path / "evaluation.md").read_text()


def test_the_commit_is_the_variables_where_it_names_one_else_gits(monkeypatch):
    """A copy of the tree without .git names its commit in VANILLA_TRANSFORMER_COMMIT; the documented call's
    placeholder pasted unedited ("COMMIT") is no commit, and git's answer (or none) is recorded instead."""
    args = gpu.parse_args(["--device", "cpu"])
    monkeypatch.setattr(gpu, "checkout_commit", lambda: "1234abc")
    monkeypatch.setenv(gpu.COMMIT_VARIABLE, "f0a1d28")
    assert gpu.machine(args)["commit"] == "f0a1d28"
    for unedited in ("COMMIT", "", "<commit>"):
        monkeypatch.setenv(gpu.COMMIT_VARIABLE, unedited)
        assert gpu.machine(args)["commit"] == "1234abc", unedited


def test_a_cuda_profile_without_kernel_events_says_so_rather_than_ranking_cpu_operators():
    """A profile on CUDA whose kernels went uncollected ranked the CPU's operators under "CUDA kernel self time",
    with 0 launches and the device idle throughout: a table that looked measured. Said instead."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        torch.ones(64, 64) @ torch.ones(64, 64)
    assert gpu.profile_summary(profiler, False, 0.01, top=3)["top"]  # the CPU's operators, as a CPU profile
    summary = gpu.profile_summary(profiler, True, 0.01, top=3)
    assert summary["top"] == [] and summary["ranked_by"] == "nothing: the profiler collected no CUDA kernel events"
    assert summary["kernel_launches"] is None and summary["device_idle_seconds"] is None


@pytest.mark.parametrize("device, count", [("cuda", 2), ("cuda:1", 2), ("cuda:1", 1)])
def test_one_gpu_is_measured_and_another_or_several_are_refused_before_anything_runs(
    device, count, monkeypatch, capsys
):
    """torch.cuda.synchronize() and the memory statistics read the current GPU (the first), and train.py's runs
    train on the first or refuse several: --device cuda:1 timed steps without waiting for them, and several
    visible GPUs failed the recipe's rows. One line naming the flag and CUDA_VISIBLE_DEVICES, at once."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(SystemExit) as refused:
        gpu.main(["--device", device])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert refused.value.code == 2 and f"error: --device {device}: gpu.py measures " in error, error
    assert f"CUDA_VISIBLE_DEVICES={torch.device(device).index or 0} python benchmarks/gpu.py" in error
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert gpu.one_gpu_refusal("cuda") is None and gpu.one_gpu_refusal("cuda:0") is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")  # a scheduler's: this process's cuda:1 is the machine's 5
    assert "run it with CUDA_VISIBLE_DEVICES=5 python" in gpu.one_gpu_refusal("cuda:1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert "with one visible: CUDA_VISIBLE_DEVICES=4 python" in gpu.one_gpu_refusal("cuda")
    assert gpu.one_gpu_refusal("cuda:x").startswith("--device cuda:x: ")


def test_a_recipe_rows_empty_profile_is_said_in_its_table_line():
    """The recipe's "where an update goes" line printed "top operators, ms per update: " and nothing after it."""
    profile = {"device_busy_seconds_per_update": None, "top": [], "updates": 20}
    profile["ranked_by"] = "nothing: the profiler collected no CUDA kernel events"
    (line,) = gpu.update_lines({"variant": "plain", "profile": profile})
    assert "profiled: nothing: the profiler collected no CUDA kernel events" in line and "top operators" not in line
