"""Checkpoint averaging (§6.1: "a single model obtained by averaging the last 5 checkpoints").

References: the mean of the tiny models' tensors computed here with ``torch.stack(...).mean(0)``,
a model whose state dict is set to that mean, and the files of the input checkpoints.
"""

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from helpers import legacy_tokenizer_file
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, train_tokenizer
from vanilla_transformer.cli import run_command
from vanilla_transformer.training.averaging import average_checkpoints, average_tensors, last_checkpoints, main

SOURCE = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
SOURCE_MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
TARGET_PREFIX = torch.tensor([[2, 11, 12], [2, 13, 14]])


def tiny_model(seed: int, **overrides) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny", **overrides)).eval()


def save(model, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder


@torch.no_grad()
def logits_of(model) -> torch.Tensor:
    return model(input_ids=SOURCE, attention_mask=SOURCE_MASK, decoder_input_ids=TARGET_PREFIX).logits


def mean_state_dict(models) -> dict[str, torch.Tensor]:
    """The reference: every tensor's mean over the models, in float64, cast back to its dtype."""
    states = [model.state_dict() for model in models]
    return {
        name: torch.stack([state[name].double() for state in states]).mean(0).to(tensor.dtype)
        for name, tensor in states[0].items()
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Three tiny models with different seeds, each saved; returns (models, folders)."""
    models = [tiny_model(seed) for seed in (1, 2, 3)]
    folders = [save(model, tmp_path_factory.mktemp(f"seed{seed}")) for seed, model in zip((1, 2, 3), models)]
    return models, folders


def stored(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


# ---------------------------------------------------------------------------------------------
# The average
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [2, 3])
def test_every_stored_tensor_is_the_mean_of_the_checkpoints(checkpoints, tmp_path, count):
    models, folders = checkpoints
    average_checkpoints(folders[:count], tmp_path / "avg")
    expected = mean_state_dict(models[:count])
    result = stored(tmp_path / "avg")
    assert set(result) == set(stored(folders[0]))
    for name, tensor in result.items():
        assert torch.equal(tensor, expected[name]), name
        # and the plain float32 mean, up to rounding
        plain = torch.stack([model.state_dict()[name] for model in models[:count]]).mean(0)
        torch.testing.assert_close(tensor, plain, rtol=1e-6, atol=1e-7)


def test_linear_weights_give_the_k_th_oldest_checkpoint_weight_k(checkpoints, tmp_path):
    """Reference: (1 a + 2 b + 3 c) / 6 written out, in float64 and cast back; and the model it loads."""
    models, folders = checkpoints
    average_checkpoints(folders, tmp_path / "avg", weights="linear")
    states = [model.state_dict() for model in models]
    result = stored(tmp_path / "avg")
    for name, tensor in result.items():
        a, b, c = (state[name].double() for state in states)
        assert torch.equal(tensor, ((a + 2 * b + 3 * c) / 6).to(tensor.dtype)), name
    reference = tiny_model(0)
    reference.load_state_dict({name: tensor for name, tensor in result.items()}, strict=False)
    assert torch.equal(logits_of(AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg").eval()), logits_of(reference))
    # the order matters: the newest counts most, so reversing the inputs gives another model
    average_checkpoints(folders[::-1], tmp_path / "reversed", weights="linear")
    assert not torch.equal(stored(tmp_path / "reversed")["model.shared.weight"], result["model.shared.weight"])


def test_linear_weights_of_one_checkpoint_reproduce_it_and_unknown_weights_are_refused(checkpoints, tmp_path):
    _, folders = checkpoints
    average_checkpoints(folders[:1], tmp_path / "one", weights="linear")
    assert all(torch.equal(stored(tmp_path / "one")[name], tensor) for name, tensor in stored(folders[0]).items())
    with pytest.raises(ValueError, match="Unknown averaging weights 'exponential'; choose one of uniform, linear"):
        average_checkpoints(folders, tmp_path / "bad", weights="exponential")
    assert not (tmp_path / "bad").exists()  # refused before anything was read or written


def test_cli_weights_flag(checkpoints, tmp_path, capsys):
    models, folders = checkpoints
    main(["--inputs", *map(str, folders[:2]), "--output-dir", str(tmp_path / "avg"), "--weights", "linear"])
    assert "linear weights" in capsys.readouterr().out
    states = [model.state_dict() for model in models[:2]]
    name = "model.shared.weight"
    assert torch.equal(
        stored(tmp_path / "avg")[name], ((states[0][name].double() + 2 * states[1][name].double()) / 3).float()
    )
    with pytest.raises(SystemExit):  # argparse names the flag and its choices
        main(["--inputs", str(folders[0]), "--output-dir", str(tmp_path / "x"), "--weights", "exp"])


def test_averaged_folder_loads_and_gives_the_logits_of_the_mean_model(checkpoints, tmp_path):
    models, folders = checkpoints
    average_checkpoints(folders, tmp_path / "avg")
    reloaded, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg", output_loading_info=True)
    assert type(reloaded) is VanillaTransformerForConditionalGeneration
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    reference = tiny_model(0)
    reference.load_state_dict(mean_state_dict(models), strict=True)
    assert torch.equal(logits_of(reloaded.eval()), logits_of(reference))
    assert not torch.equal(logits_of(reloaded), logits_of(models[0]))


def test_tied_weights_stay_tied_after_reload(checkpoints, tmp_path):
    _, folders = checkpoints
    average_checkpoints(folders[:2], tmp_path / "avg")
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg")
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert model.model.encoder.embedding.token_embedding.weight is shared
    assert model.model.decoder.embedding.token_embedding.weight is shared
    assert sum(t.shape == shared.shape for t in stored(tmp_path / "avg").values()) == 1  # stored once


def test_untied_projection_is_averaged_on_its_own(tmp_path):
    models = [tiny_model(seed, tie_word_embeddings=False) for seed in (1, 2)]
    folders = [save(model, tmp_path / f"c{i}") for i, model in enumerate(models)]
    average_checkpoints(folders, tmp_path / "avg")
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg")
    expected = mean_state_dict(models)
    assert torch.equal(reloaded.lm_head.weight, expected["lm_head.weight"])
    assert reloaded.lm_head.weight is not reloaded.model.shared.weight


def test_one_checkpoint_is_reproduced_exactly(checkpoints, tmp_path):
    models, folders = checkpoints
    average_checkpoints(folders[:1], tmp_path / "avg")
    original, result = stored(folders[0]), stored(tmp_path / "avg")
    assert set(result) == set(original)
    assert all(torch.equal(result[name], original[name]) for name in original)
    assert torch.equal(logits_of(AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg")), logits_of(models[0]))


def test_stored_dtype_is_kept(tmp_path):
    models = [tiny_model(seed).to(torch.bfloat16) for seed in (1, 2)]
    folders = [save(model, tmp_path / f"c{i}") for i, model in enumerate(models)]
    average_checkpoints(folders, tmp_path / "avg")
    expected = mean_state_dict(models)
    for name, tensor in stored(tmp_path / "avg").items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, expected[name]), name


def test_integer_tensors_are_kept_when_equal_and_refused_when_not(tmp_path):
    for i, (weight, steps) in enumerate([(1.0, 7), (3.0, 7), (5.0, 8)]):
        (tmp_path / f"c{i}").mkdir()
        tensors = {"w": torch.full((2,), weight), "steps": torch.tensor([steps])}
        save_file(tensors, tmp_path / f"c{i}" / "model.safetensors")
    averaged = average_tensors([tmp_path / "c0", tmp_path / "c1"])
    assert torch.equal(averaged["w"], torch.full((2,), 2.0)) and torch.equal(averaged["steps"], torch.tensor([7]))
    with pytest.raises(ValueError, match=r"Integer/bool tensor 'steps' differs between checkpoint .*c2"):
        average_tensors([tmp_path / "c0", tmp_path / "c2"])


# ---------------------------------------------------------------------------------------------
# The folder
# ---------------------------------------------------------------------------------------------


def test_a_sentencepiece_tokenizer_is_copied_whole(checkpoints, tmp_path):
    """A converted MarianMT's checkpoints hold MarianTokenizer's files; the average loads its tokenizer only
    with all of them (the names are transformers' VOCAB_FILES_NAMES for Marian, see test_publish.py)."""
    from test_publish import marian_vocabulary_files

    _, folders = checkpoints
    copies = [shutil.copytree(folder, tmp_path / folder.name) for folder in folders[:2]]
    names = set(marian_vocabulary_files().values()) - {"tokenizer_config.json"}
    for copy in copies:
        for name in names:
            (copy / name).write_bytes(f"{name} of the run".encode())
    average_checkpoints(copies, tmp_path / "avg")
    assert all((tmp_path / "avg" / name).read_bytes() == f"{name} of the run".encode() for name in names)


def test_tokenizer_and_generation_config_come_from_the_last_checkpoint(checkpoints, tmp_path):
    _, folders = checkpoints
    last = shutil.copytree(folders[1], tmp_path / "last")
    tokenizer = train_tokenizer(iter(["one two three", "eins zwei drei"] * 20), vocab_size=270)
    tokenizer.save_pretrained(last)
    generation = json.loads((last / "generation_config.json").read_text())
    (last / "generation_config.json").write_text(json.dumps({**generation, "num_beams": 5}))
    average_checkpoints([folders[0], last], tmp_path / "avg")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / "avg" / name).read_bytes() == (last / name).read_bytes(), name
    assert AutoTokenizer.from_pretrained(tmp_path / "avg")("one two").input_ids == tokenizer("one two").input_ids
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg").generation_config.num_beams == 5
    for name in ("modeling_vanilla_transformer.py", "configuration_vanilla_transformer.py"):
        assert (tmp_path / "avg" / name).is_file()  # still loads with trust_remote_code


def test_one_tokenizer_written_by_two_tokenizers_releases_is_one_tokenizer(checkpoints, tmp_path):
    """A run resumed after upgrading tokenizers holds checkpoints whose tokenizer.json spell the merges two ways:
    the same ids (the tokenizers read both alike), so they average; other ids are still refused."""
    _, folders = checkpoints
    tokenizer = train_tokenizer(iter(["one two three", "eins zwei drei"] * 20), vocab_size=270)
    older, newer = (shutil.copytree(folder, tmp_path / name) for folder, name in zip(folders, ("older", "newer")))
    for folder in (older, newer):
        tokenizer.save_pretrained(folder)
    legacy_tokenizer_file(older)
    assert AutoTokenizer.from_pretrained(older)("one two").input_ids == tokenizer("one two").input_ids
    average_checkpoints([older, newer], tmp_path / "avg")
    vocab = json.loads((older / "tokenizer.json").read_text())
    swapped = [token for token in vocab["model"]["vocab"] if vocab["model"]["vocab"][token] >= 10][:2]
    ids = vocab["model"]["vocab"]
    ids[swapped[0]], ids[swapped[1]] = ids[swapped[1]], ids[swapped[0]]
    (older / "tokenizer.json").write_text(json.dumps(vocab))
    with pytest.raises(ValueError, match=f"{older} was trained with another tokenizer .*differ in model"):
        average_checkpoints([older, newer], tmp_path / "avg2")
    # a file the installed tokenizers cannot read (a later release's) is compared as it is: equal passes
    unknown = json.loads((newer / "tokenizer.json").read_text())
    unknown["normalizer"] = {"type": "SomeLaterNormalizer"}
    for folder in (older, newer):
        (folder / "tokenizer.json").write_text(json.dumps(unknown))
    average_checkpoints([older, newer], tmp_path / "avg3")
    (older / "tokenizer.json").write_text(json.dumps({**unknown, "normalizer": {"type": "AnotherOne"}}))
    with pytest.raises(ValueError, match=f"{older} was trained with another tokenizer .*differ in normalizer"):
        average_checkpoints([older, newer], tmp_path / "avg4")


# ---------------------------------------------------------------------------------------------
# --checkpoint-root / --last and the command line
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def trainer_dir(tmp_path):
    """A Trainer output dir whose lexical order differs from its step order; returns (root, models by step)."""
    root = tmp_path / "run"
    models = {step: tiny_model(step) for step in (100, 900, 1000)}
    for step, model in models.items():
        save(model, root / f"checkpoint-{step}")
    (root / "runs").mkdir()  # TensorBoard logs and other files are ignored
    (root / "checkpoint-final-notes").mkdir()
    return root, models


def test_last_picks_the_highest_steps_numerically(trainer_dir, tmp_path):
    root, models = trainer_dir
    assert [p.name for p in last_checkpoints(root, 2)] == ["checkpoint-900", "checkpoint-1000"]
    main(["--checkpoint-root", str(root), "--last", "2", "--output-dir", str(tmp_path / "avg")])
    expected = mean_state_dict([models[900], models[1000]])
    assert all(torch.equal(t, expected[name]) for name, t in stored(tmp_path / "avg").items())


def test_cli_with_explicit_inputs(checkpoints, tmp_path, capsys):
    models, folders = checkpoints
    output = main(["--inputs", *map(str, folders[:2]), "--output-dir", str(tmp_path / "avg")])
    assert output == tmp_path / "avg"
    assert "averaged 2 checkpoint(s)" in capsys.readouterr().out
    expected = mean_state_dict(models[:2])
    assert all(torch.equal(t, expected[name]) for name, t in stored(output).items())


def test_inputs_out_of_update_order_are_refused_with_the_order_to_give(trainer_dir, tmp_path):
    """A shell glob (``run/checkpoint-*``) gives checkpoint-1000 before checkpoint-900: the newest must be last
    (it gives the side files; linear weights follow the order). Refused naming both, with the order to paste;
    the updates come from trainer_state.json where there is one (here against the folder's name)."""
    root, models = trainer_dir
    globbed = sorted(str(folder) for folder in root.glob("checkpoint-[0-9]*"))
    assert [Path(folder).name for folder in globbed] == ["checkpoint-100", "checkpoint-1000", "checkpoint-900"]
    with pytest.raises(ValueError) as error:
        main(["--inputs", *globbed, "--output-dir", str(tmp_path / "avg")])
    message = str(error.value)
    assert f"{root / 'checkpoint-1000'} (update 1000) comes before {root / 'checkpoint-900'} (update 900)" in message
    in_order = [str(root / f"checkpoint-{step}") for step in (100, 900, 1000)]
    assert message.endswith(f"--inputs {' '.join(in_order)}")
    main(["--inputs", *in_order, "--output-dir", str(tmp_path / "avg")])  # the order it names is accepted
    # trainer_state.json's global_step is the update, whatever the folder is called
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for step, name in ((1000, "a"), (900, "b")):
        shutil.copytree(root / f"checkpoint-{step}", renamed / name)
        (renamed / name / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    with pytest.raises(ValueError, match="update 1000\\) comes before .* \\(update 900\\)"):
        average_checkpoints([renamed / "a", renamed / "b"], tmp_path / "avg2")
    average_checkpoints([renamed / "b", renamed / "a", tmp_path / "avg"], tmp_path / "avg3")  # no step: any place


def test_two_checkpoints_at_the_same_update_are_named_as_two_runs(trainer_dir, tmp_path, caplog):
    root, _ = trainer_dir
    other = tmp_path / "other-run" / "checkpoint-900"
    shutil.copytree(root / "checkpoint-900", other)
    with caplog.at_level(logging.WARNING):
        average_checkpoints([root / "checkpoint-900", other], tmp_path / "avg")
    assert f"{root / 'checkpoint-900'} and {other} are both at update 900: checkpoints of two runs?" in caplog.text


def test_checkpoints_whose_runs_logged_other_losses_are_named_as_two_runs(trainer_dir, tmp_path, caplog):
    """The same-update test missed two runs saved at different updates (a run of seed 7 at 100 and one of seed 42
    at 300 averaged to BLEU 0 without a word), and took a run's folder with its last checkpoint for two runs. The
    runs' logged losses tell: one run logged the same loss at every update both checkpoints saw."""

    def saved(name: str, step: int, losses: dict) -> Path:
        folder = tmp_path / name
        shutil.copytree(trainer_dir[0] / "checkpoint-900", folder)
        history = [{"step": each, "loss": loss} for each, loss in losses.items()]
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": history}))
        return folder

    one_run = {10: 6.5, 20: 5.25}
    early, late = saved("run-a/checkpoint-20", 20, one_run), saved("run-a/checkpoint-30", 30, {**one_run, 30: 4.0})
    other = saved("run-b/checkpoint-30", 30, {10: 6.75, 20: 5.5, 30: 4.5})
    final = saved("run-a-final", 30, {**one_run, 30: 4.0})
    with caplog.at_level(logging.WARNING):
        average_checkpoints([early, late], tmp_path / "avg1")
    assert not caplog.records  # one run
    diverged = {**one_run, 30: float("nan")}  # a non-finite loss logged (the divergence guard turned off)
    before = saved("run-c/checkpoint-30", 30, diverged)
    with caplog.at_level(logging.WARNING):
        average_checkpoints([before, saved("run-c/checkpoint-40", 40, {**diverged, 40: 3.5})], tmp_path / "avg4")
    assert not caplog.records  # NaN and NaN: the same run
    with caplog.at_level(logging.WARNING):
        average_checkpoints([early, other], tmp_path / "avg2")
    assert f"{early} and {other} are checkpoints of two runs: their runs logged different losses at update 10 " in (
        caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        average_checkpoints([late, final], tmp_path / "avg3")
    assert f"{late} and {final} are the same update (30) of one run" in caplog.text and "two runs" not in caplog.text


def test_an_average_that_replaces_a_model_removes_the_card_that_described_it(trainer_dir, tmp_path, caplog):
    """`average --output-dir RUN --force` replaced the weights and left RUN's card with the scores of the
    weights before, which publish would upload as the average's."""
    root, _ = trainer_dir
    output = tmp_path / "replaced-run"
    shutil.copytree(root / "checkpoint-1000", output)
    (output / "README.md").write_text("---\nlanguage: [en, de]\n---\nBLEU 79.71 on the validation set\n")
    with caplog.at_level(logging.WARNING):
        main(
            [
                "--inputs",
                str(root / "checkpoint-900"),
                str(root / "checkpoint-1000"),
                "--output-dir",
                str(output),
                "--force",
            ]
        )
    assert not (output / "README.md").exists() and f"removed {output / 'README.md'}: it described the model" in (
        caplog.text
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--checkpoint-root", "x", "--output-dir", "o"],
        ["--last", "5", "--inputs", "a", "--output-dir", "o"],
        ["--inputs", "a", "--checkpoint-root", "x", "--last", "1", "--output-dir", "o"],
        ["--inputs", "a"],
    ],
)
def test_cli_rejects_inconsistent_arguments(argv):
    with pytest.raises(SystemExit):
        main(argv)


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------


def test_refuses_no_checkpoints(tmp_path):
    with pytest.raises(ValueError, match="at least one checkpoint"):
        average_checkpoints([], tmp_path / "avg")


def test_refuses_last_larger_than_available(trainer_dir, tmp_path):
    root, _ = trainer_dir
    with pytest.raises(ValueError, match=r"--last 5 .* it has 3 checkpoint-<step> folder\(s\)"):
        main(["--checkpoint-root", str(root), "--last", "5", "--output-dir", str(tmp_path / "avg")])
    with pytest.raises(ValueError, match="at least 1"):
        last_checkpoints(root, 0)


def test_refuses_folder_without_weights(checkpoints, tmp_path):
    _, folders = checkpoints
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"Checkpoint {empty} has no model.safetensors"):
        average_checkpoints([folders[0], empty], tmp_path / "avg")


def test_refuses_an_output_folder_under_a_file_before_averaging(checkpoints, tmp_path, capsys):
    """It failed after the averaging work, with Python's "[Errno 20] Not a directory" naming no flag."""
    _, folders = checkpoints
    (tmp_path / "a-file").write_text("")
    output = tmp_path / "a-file" / "avg"
    with pytest.raises(SystemExit) as exit_info:
        run_command("average", ["--inputs", *map(str, folders[:2]), "--output-dir", str(output)])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"--output-dir {output} lies under {tmp_path / 'a-file'}, a file" in error


def test_refuses_output_dir_among_inputs(checkpoints):
    _, folders = checkpoints
    with pytest.raises(ValueError, match="is one of the inputs"):
        average_checkpoints(folders[:2], folders[1])


def test_in_python_a_saved_model_is_replaced_only_with_force(checkpoints, tmp_path):
    """The command line refused to overwrite a model without --force; the library function it calls replaced one
    (weights, config, card) without a word."""
    models, folders = checkpoints
    kept = save(tiny_model(7, d_model=32), tmp_path / "kept")
    before = {path.name: path.read_bytes() for path in kept.iterdir()}
    with pytest.raises(FileExistsError, match=f"output_dir {kept} already holds a model .*pass force=True"):
        average_checkpoints(folders[:2], kept)
    assert {path.name: path.read_bytes() for path in kept.iterdir()} == before
    average_checkpoints(folders[:2], kept, force=True)
    expected = mean_state_dict(models[:2])
    assert all(torch.equal(tensor, expected[name]) for name, tensor in stored(kept).items())


FC1_BIAS = "model.encoder.layers.0.feed_forward.fc1.bias"


def rewrite_weights(folder: Path, tmp_path: Path, change) -> Path:
    """A copy of `folder` whose stored tensors were changed by `change(tensors)`."""
    copy = shutil.copytree(folder, tmp_path / "changed")
    tensors = load_file(copy / "model.safetensors")
    change(tensors)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    return copy


@pytest.mark.parametrize(
    "change, difference",
    [
        (lambda t: t.pop(FC1_BIAS), rf"lacks \['{FC1_BIAS}'\]"),
        (lambda t: t.update({"lm_head.weight": t["model.shared.weight"].clone()}), r"has extra \['lm_head.weight'\]"),
    ],
)
def test_refuses_different_tensor_names(checkpoints, tmp_path, change, difference):
    _, folders = checkpoints
    changed = rewrite_weights(folders[1], tmp_path, change)
    message = rf"Checkpoint .*changed has different tensors from .*seed1.*: it {difference}"
    with pytest.raises(ValueError, match=message):
        average_checkpoints([folders[0], changed], tmp_path / "avg")


def test_refuses_different_shapes(checkpoints, tmp_path):
    _, folders = checkpoints
    changed = rewrite_weights(folders[1], tmp_path, lambda t: t.update({FC1_BIAS: torch.zeros(64)}))
    message = rf"Tensor '{FC1_BIAS}' has shape \(64,\) in checkpoint .*changed but \(128,\) in .*seed1"
    with pytest.raises(ValueError, match=message):
        average_checkpoints([folders[0], changed], tmp_path / "avg")


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64), "d_model: 64 vs 32"),
        (dict(encoder_attention_heads=2), "encoder_attention_heads: 4 vs 2"),  # same shapes, other model
    ],
)
def test_refuses_different_architectures(checkpoints, tmp_path, overrides, field):
    _, folders = checkpoints
    other = save(tiny_model(5, **overrides), tmp_path / "other")
    with pytest.raises(ValueError, match=f"Checkpoint {other} has a different model architecture .*{field}"):
        average_checkpoints([folders[0], other], tmp_path / "avg")


def test_dropout_may_differ(checkpoints, tmp_path):
    # A training-only setting, not the architecture.
    models, folders = checkpoints
    other = save(tiny_model(5, dropout=0.3), tmp_path / "other")
    average_checkpoints([folders[0], other], tmp_path / "avg")
    assert (tmp_path / "avg" / "model.safetensors").is_file()
