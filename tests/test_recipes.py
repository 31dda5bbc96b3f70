"""training/recipes/*.yaml: each holds the paper's settings for its run (checked against the paper's
numbers written out below), its batch is about 25,000 tokens a side on 8 GPUs (measured with the
package's own batcher), and each runs end to end on a tiny local slice, so a broken recipe fails here.
Also the scorer the recipes report for the paper: tokenized BLEU with tensor2tensor's compound splits."""

from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from sacremoses import MosesTokenizer

from helpers import load_script
from vanilla_transformer import PRESETS, VanillaTransformerConfig
from vanilla_transformer.training import data
from vanilla_transformer.training import run as train
from vanilla_transformer.training.batching import TokenBatchSampler
from vanilla_transformer.training.bleu_chrf import split_compounds

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "training" / "recipes").glob("wmt14-*.yaml"))  # the paper's runs
MULTI30K = REPO / "training" / "recipes" / "multi30k.yaml"

# Vaswani et al. (2017): §5.1 data and vocabulary, §5.2 updates and seconds per update on 8 P100s,
# §6.1 dropout of the big models and checkpoint averaging, Table 3 model sizes.
PAPER = {
    "wmt14-en-de-base": dict(
        pair="de-en",
        target="de",
        vocab=37000,
        preset="base",
        d_model=512,
        heads=8,
        d_ff=2048,
        dropout=0.1,
        updates=100_000,
        seconds_per_update=0.4,
        averaged=5,
        tokenized_bleu=True,
    ),
    "wmt14-en-de-big": dict(
        pair="de-en",
        target="de",
        vocab=37000,
        preset="big",
        d_model=1024,
        heads=16,
        d_ff=4096,
        dropout=0.3,
        updates=300_000,
        seconds_per_update=1.0,
        averaged=20,
        tokenized_bleu=True,
    ),
    "wmt14-en-fr-base": dict(
        pair="fr-en",
        target="fr",
        vocab=32000,
        preset="base",
        d_model=512,
        heads=8,
        d_ff=2048,
        dropout=0.1,
        updates=100_000,
        seconds_per_update=0.4,
        averaged=5,
        tokenized_bleu=False,
    ),
    "wmt14-en-fr-big": dict(
        pair="fr-en",
        target="fr",
        vocab=32000,
        preset="big",
        d_model=1024,
        heads=16,
        d_ff=4096,
        dropout=0.1,
        updates=300_000,
        seconds_per_update=1.0,
        averaged=20,
        tokenized_bleu=False,
    ),
}
PAPER_GPUS = 8
PAPER_TOKENS_PER_SIDE = 25_000
CHECKPOINT_MINUTES = 10


def recipe_id(path: Path) -> str:
    return path.stem


def parse(recipe: Path, *flags: str):
    return train.parse_arguments([str(recipe), "--use_cpu", *flags])  # --bf16 needs a GPU or --use_cpu


def test_every_recipe_is_one_of_the_papers_runs_or_multi30k():
    assert {path.stem for path in RECIPES} == set(PAPER)
    assert {p.name for p in (REPO / "training" / "recipes").glob("*.yaml")} == {p.name for p in RECIPES} | {
        MULTI30K.name
    }


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_recipe_holds_the_papers_settings(recipe):
    paper = PAPER[recipe.stem]
    model_args, data_args, args = parse(recipe)
    assert (data_args.dataset_name, data_args.dataset_config_name) == ("wmt/wmt14", paper["pair"])
    assert (data_args.source_lang, data_args.target_lang) == ("en", paper["target"])
    assert (data_args.validation_split, data_args.test_split) == ("validation", "test")  # newstest2013, newstest2014
    assert model_args.tokenizer_vocab_size == paper["vocab"]
    config = VanillaTransformerConfig.from_preset(
        model_args.preset, **train.parse_overrides(model_args.config_overrides)
    )
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (paper["d_model"], 6, 6)
    assert (config.encoder_attention_heads, config.encoder_ffn_dim, config.dropout) == (
        paper["heads"],
        paper["d_ff"],
        paper["dropout"],
    )
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.98, 1e-9)
    # eq. (3) itself: its own peak (no explicit learning rate), 4000 warm-up steps
    assert (args.lr_scheduler_type, args.learning_rate, args.lr_scale, args.warmup_steps) == (
        "inverse_sqrt",
        None,
        1.0,
        4000,
    )
    assert (args.label_smoothing_factor, args.weight_decay, args.max_grad_norm) == (0.1, 0.0, 0.0)
    assert args.max_steps == paper["updates"]
    assert args.save_steps == CHECKPOINT_MINUTES * 60 / paper["seconds_per_update"]
    assert args.average_checkpoints == paper["averaged"] <= args.save_total_limit
    # decoding is the model's own generation config (beam 4, alpha 0.6, +50): nothing overrides it
    assert (args.generation_num_beams, args.generation_max_length) == (None, None)
    assert args.do_train and args.do_eval and args.do_predict
    assert data_args.compound_split_bleu == paper["tokenized_bleu"]


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_an_update_is_about_25000_tokens_a_side_on_8_gpus(recipe):
    """max_tokens x accumulation x 8 processes, counted in real (unpadded) tokens of the batches that
    TokenBatchSampler packs from WMT-like lengths."""
    _, _, args = parse(recipe)
    lengths = load_script("benchmarks/gpu.py").synthetic_lengths(200_000, seed=0)
    sampler = TokenBatchSampler(lengths, args.max_tokens, shuffle=False)
    for side in (0, 1):
        per_batch = np.add.reduceat(lengths[sampler.order, side], sampler.starts[:-1]).mean()
        per_update = per_batch * args.gradient_accumulation_steps * PAPER_GPUS
        print(f"{recipe_id(recipe)}: {per_update:,.0f} real {('source', 'target')[side]} tokens per update")  # -s
        assert per_update == pytest.approx(PAPER_TOKENS_PER_SIDE, rel=0.05), (side, per_update)


def test_dataset_name_none_drops_the_recipes_hub_dataset():
    _, data_args, _ = parse(RECIPES[0], "--dataset_name", "none")
    assert (
        data_args.dataset_name,
        data_args.dataset_config_name,
        data_args.validation_split,
        data_args.test_split,
    ) == (None, None, None, None)


# ---------------------------------------------------------------------------------------------
# Every recipe, end to end on a tiny local slice
# ---------------------------------------------------------------------------------------------

WORDS = "Haus Auto Hund Katze See Berg Stadt Land Fluss Baum".split()


def tiny_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    """Reverse a few words; some are hyphenated compounds, so that compound splitting has work to do."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 6))]
        if rng.random() < 0.3:
            words[0] += "-" + rng.choice(WORDS)
        pairs.append((" ".join(words).lower(), " ".join(reversed(words))))
    return pairs


def write_side(path: Path, lines) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tiny_slice(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("tiny-wmt")
    files = {}
    for role, count, seed in (("train", 400, 1), ("validation", 12, 2), ("test", 12, 3)):
        pairs = tiny_pairs(count, seed)
        files[role] = (
            write_side(folder / f"{role}.en", [s for s, _ in pairs]),
            write_side(folder / f"{role}.xx", [t for _, t in pairs]),
        )
    return files


def tiny_overrides(files: dict, output_dir: Path) -> list[str]:
    """Local files instead of the Hub, a tiny model and vocabulary, two updates; everything else is the recipe's."""
    flags = ["--dataset_name", "none"]
    for role in ("train", "validation", "test"):
        flags += [f"--{role}_source_file", files[role][0], f"--{role}_target_file", files[role][1]]
    return flags + [
        "--preset",
        "tiny",
        "--tokenizer_vocab_size",
        "300",
        "--max_tokens",
        "256",
        "--max_steps",
        "2",
        "--save_steps",
        "1",
        "--warmup_steps",
        "2",
        "--output_dir",
        str(output_dir),
        "--disable_tqdm",
        "true",
        "--logging_steps",
        "1",
        "--per_device_eval_batch_size",
        "12",
    ]


# with --preset tiny, the recipes differ in their data and scoring flags: en-de-base and en-fr-big (which scores
# without compound splitting) in the default suite, the other two in the slow one
QUICK_RECIPES = ("wmt14-en-de-base", "wmt14-en-fr-big")


@pytest.mark.parametrize(
    "recipe",
    [recipe if recipe.stem in QUICK_RECIPES else pytest.param(recipe, marks=pytest.mark.slow) for recipe in RECIPES],
    ids=recipe_id,
)
def test_recipe_trains_evaluates_and_predicts_on_a_tiny_local_slice(recipe, tiny_slice, tmp_path, monkeypatch):
    def no_hub(*args, **kwargs):
        raise AssertionError("with --dataset_name none the recipe must not read the Hub")

    monkeypatch.setattr(data, "hub_dataset", no_hub)
    output = tmp_path / "run"
    metrics = train.main([str(recipe), "--use_cpu", *tiny_overrides(tiny_slice, output)])
    paper = PAPER[recipe.stem]
    assert {"eval_loss", "eval_bleu", "predict_bleu", "predict_chrf"} <= set(metrics)
    assert ("predict_tokenized_bleu" in metrics) == paper["tokenized_bleu"]
    predictions = (output / train.PREDICTIONS_FILE).read_text(encoding="utf-8").split("\n")[:-1]
    assert len(predictions) == metrics["predict_samples"] == 12
    # both updates were saved (the recipe averages up to its last N) and the final model is a Hub folder
    assert sorted(p.name for p in output.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md"} <= {
        p.name for p in output.iterdir()
    }


def test_a_preset_on_the_command_line_is_built_as_it_is_not_with_the_recipes_overrides(tmp_path, caplog):
    """--preset tiny after the multi30k recipe built a 5.6M-parameter model: the recipe's config_overrides (for
    its own preset) still applied, unsaid. The preset asked for is built as it is, and the log says why the
    recipe's overrides are left out; overrides given on the command line still apply to it."""
    with caplog.at_level(logging.WARNING):
        model_args, _, _ = train.parse_arguments([str(MULTI30K), "--preset", "tiny", "--output_dir", str(tmp_path)])
    assert model_args.config_overrides is None
    assert "the recipe's config_overrides (d_model=256," in caplog.text and "--preset tiny is built as it is" in (
        caplog.text
    )
    assert train.model_config(model_args.preset, model_args.config_overrides).d_model == PRESETS["tiny"]["d_model"]
    argv = [str(MULTI30K), "--preset", "tiny", "--config_overrides", "dropout=0.2", "--output_dir", str(tmp_path)]
    model_args, _, _ = train.parse_arguments(argv)
    config = train.model_config(model_args.preset, model_args.config_overrides)
    assert (config.d_model, config.dropout) == (PRESETS["tiny"]["d_model"], 0.2)  # the command line's only
    model_args, _, _ = train.parse_arguments([*argv[:1], *argv[3:]])  # no --preset: merged with the recipe's
    config = train.model_config(model_args.preset, model_args.config_overrides)
    assert (config.d_model, config.dropout) == (256, 0.2)
    caplog.clear()
    for recipe, preset, dropout in (
        (MULTI30K, "base", 0.1),
        (REPO / "training" / "recipes" / "wmt14-en-fr-big.yaml", "big", 0.1),
    ):
        with caplog.at_level(logging.WARNING):  # the recipe's own preset, said again: its overrides still apply
            model_args, _, _ = parse(recipe, "--preset", preset, "--output_dir", str(tmp_path))
        assert train.model_config(model_args.preset, model_args.config_overrides).dropout == dropout, recipe
    assert "config_overrides" not in caplog.text


def test_the_multi30k_recipe_runs_on_a_tiny_local_slice_under_its_clock(tiny_slice, tmp_path, monkeypatch):
    """The small-data recipe: its own 25-minute clock, checkpoints by the minute (the last 10 kept), and a
    moving average of the weights as the final model."""
    model_args, data_args, args = parse(MULTI30K)
    assert (args.max_train_minutes, args.save_minutes, args.average_checkpoints, args.save_total_limit) == (
        25,
        1,
        0,
        10,
    )
    assert args.ema_decay == 0.998
    assert (model_args.length_penalty, model_args.length_penalty_formula) == (0.6, "gnmt")  # spelled out in the file
    assert (args.max_tokens, args.learning_rate, args.warmup_steps, args.max_grad_norm) == (1024, 2e-3, 800, 0.0)
    config = train.model_config(model_args.preset, model_args.config_overrides)
    assert (config.d_model, config.encoder_layers, config.encoder_attention_heads, config.encoder_ffn_dim) == (
        256,
        3,
        4,
        1024,
    )
    output = tmp_path / "run"
    overrides = [flag for flag in tiny_overrides(tiny_slice, output)]
    overrides[overrides.index("--preset") + 1] = "base"
    metrics = train.main(
        [
            str(MULTI30K),
            "--use_cpu",
            *overrides,
            "--config_overrides",
            "d_model=32,encoder_layers=1,decoder_layers=1,encoder_ffn_dim=64,decoder_ffn_dim=64",
        ]
    )
    assert {"eval_bleu", "predict_bleu"} <= set(metrics)
    assert (output / "model.safetensors").is_file()
    saved = json.loads((output / "generation_config.json").read_text())  # the recipe's decoding, §6.1's
    assert (saved["num_beams"], saved["length_penalty"], saved["length_penalty_formula"]) == (4, 0.6, "gnmt")


# ---------------------------------------------------------------------------------------------
# The paper's scorer: tokenized BLEU with compound splitting
# ---------------------------------------------------------------------------------------------

PERL_SPLIT = r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"  # tensor2tensor's get_ende_bleu.sh


def perl_split(lines: list[str]) -> list[str]:
    completed = subprocess.run(
        ["perl", "-ple", PERL_SPLIT], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True
    )
    return completed.stdout.split("\n")[:-1]


needs_perl = pytest.mark.skipif(shutil.which("perl") is None, reason="needs perl, the reference")


@needs_perl
@pytest.mark.floor
def test_compound_splitting_is_tensor2tensors_perl_one_liner():
    moses = MosesTokenizer(lang="de")
    lines = ["Die Haus-Auto-Hund-Frage, a-b-c.", "x - y", "1-2-Jahres-Plan", "E-Mail-Adresse", "kein Bindestrich"]
    tokenized = [moses.tokenize(line, return_str=True, escape=False) for line in lines]
    assert [split_compounds(line, moses) for line in lines] == perl_split(tokenized)


@needs_perl
def test_predict_reports_tokenized_bleu_as_the_paper_scored_it(tiny_slice, tmp_path, monkeypatch):
    """run.predict with the en-de recipe's --compound_split_bleu: predict_tokenized_bleu is corpus BLEU over
    Moses tokens with tensor2tensor's splits (recomputed here with perl and sacreBLEU on plain tokens);
    predict_bleu stays sacreBLEU 13a."""
    recipe = REPO / "training" / "recipes" / "wmt14-en-de-base.yaml"
    model_args, data_args, training_args = parse(recipe, *tiny_overrides(tiny_slice, tmp_path / "run"))
    prepared = train.build_trainer(model_args, data_args, training_args)
    references = list(prepared.text["test"]["target"])
    # the compounds lose their hyphens: the two BLEUs then disagree
    hypotheses = [reference.replace("-", " ") for reference in references]
    assert hypotheses != references
    monkeypatch.setattr(train, "translate", lambda model, tokenizer, sources, *args, **kwargs: hypotheses)
    results = train.predict(
        prepared.trainer, prepared.tokenizer, prepared.text["test"], data_args.sacrebleu_tokenize, data_args.target_lang
    )  # the recipe's --compound_split_bleu
    moses = MosesTokenizer(lang="de")
    split = perl_split([moses.tokenize(line, return_str=True, escape=False) for line in hypotheses + references])
    expected = sacrebleu.corpus_bleu(split[: len(hypotheses)], [split[len(hypotheses) :]], tokenize="none").score
    assert results["predict_tokenized_bleu"] == pytest.approx(expected)
    assert results["predict_bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert abs(results["predict_tokenized_bleu"] - results["predict_bleu"]) > 1


def multi_bleu(hypotheses: list[str], references: list[str]) -> float:
    """multi-bleu.perl's corpus BLEU over whitespace tokens, one reference: clipped n-gram precisions up to 4,
    no smoothing (an order without a match gives 0), the brevity penalty where the hypotheses are shorter."""
    import math
    from collections import Counter

    matches, totals, hypothesis_length, reference_length = [0] * 4, [0] * 4, 0, 0
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        h, r = hypothesis.split(), reference.split()
        hypothesis_length, reference_length = hypothesis_length + len(h), reference_length + len(r)
        for n in range(1, 5):
            grams = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            reference_grams = Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum(min(count, reference_grams[gram]) for gram, count in grams.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    if not all(matches):
        return 0.0
    penalty = math.exp(1 - reference_length / hypothesis_length) if hypothesis_length < reference_length else 1.0
    return 100 * penalty * math.exp(sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / 4)


def test_tokenized_bleu_is_multi_bleu_perls_unsmoothed_corpus_bleu():
    """The paper's number was multi-bleu.perl's, which smooths nothing: sacreBLEU's default exp smoothing gave a
    set without a matching 4-gram 33.78 where the script prints 0. And -lc lowercases it too."""
    from vanilla_transformer.training.metrics import score

    cases = [
        (["ein haus steht dort"], ["ein haus stand dort"]),  # no 4-gram in common
        (
            ["der hund läuft schnell nach hause", "die katze schläft"],
            ["der hund läuft schnell heim", "eine katze schläft"],
        ),
    ]
    for hypotheses, references in cases:
        scored = score(hypotheses, references, compound_split_bleu=True, language="de")["tokenized_bleu"]
        assert scored == pytest.approx(multi_bleu(hypotheses, references), abs=1e-9)
    assert multi_bleu(*cases[0]) == 0 and multi_bleu(*cases[1]) > 0
    upper = [hypothesis.upper() for hypothesis in cases[1][0]]
    scored = score(upper, cases[1][1], compound_split_bleu=True, language="de", lowercase=True)["tokenized_bleu"]
    assert scored == pytest.approx(multi_bleu(*cases[1]), abs=1e-9)


def test_predict_scores_the_lines_it_writes(tiny_slice, tmp_path, monkeypatch):
    """A hypothesis holding a line break is written with a space there (one line a sentence); it was scored as
    decoded, and sacreBLEU's 13a joins "Hund-\\nrennt" into one word: the saved BLEU was not the file's."""
    recipe = REPO / "training" / "recipes" / "wmt14-en-de-base.yaml"
    model_args, data_args, training_args = parse(recipe, *tiny_overrides(tiny_slice, tmp_path / "run"))
    prepared = train.build_trainer(model_args, data_args, training_args)
    references = list(prepared.text["test"]["target"])
    hypotheses = [reference.replace(" ", "-\n", 1) for reference in references]
    monkeypatch.setattr(train, "translate", lambda model, tokenizer, sources, *args, **kwargs: hypotheses)
    results = train.predict(prepared.trainer, prepared.tokenizer, prepared.text["test"], "13a", None)
    written = (tmp_path / "run" / train.PREDICTIONS_FILE).read_text(encoding="utf-8").splitlines()
    assert results["predict_bleu"] == pytest.approx(sacrebleu.corpus_bleu(written, [references]).score)
    assert results["predict_bleu"] != pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
