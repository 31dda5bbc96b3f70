"""Mixed precision on the CPU through the Trainer's flags.

--bf16: one real Trainer update (plain SGD at learning rate 1, so the weights move by exactly the
gradient) on the nastiest legal batch agrees with float32 autograd within bf16's precision and stays
finite; a model saved from bf16 training loads and decodes in bf16 and in float32.
--fp16: accelerate has no float16 autocast on the CPU, so the Trainer refuses it; the model under float16
autocast with a loss scaler (what a GPU --fp16 run does) is checked directly.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vanilla_transformer.modeling_vanilla_transformer import sinusoidal_positions
from vanilla_transformer.training import run as train
from vanilla_transformer.training.translation import translate
from vanilla_transformer.training_kernels import label_smoothed_cross_entropy

LETTERS = "a b c d e f g h i j".split()


def reversal_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = [[rng.choice(LETTERS) for _ in range(rng.randint(2, 5))] for _ in range(count)]
    return [(" ".join(w), " ".join(reversed(w))) for w in words]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reversal")
    pairs = reversal_pairs(1500, seed=1)
    (folder / "train.src").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (folder / "train.tgt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return folder


def arguments(data_dir: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--train_source_file",
        str(data_dir / "train.src"),
        "--train_target_file",
        str(data_dir / "train.tgt"),
        "--preset",
        "tiny",
        "--tokenizer_vocab_size",
        "270",
        "--output_dir",
        str(output_dir),
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--save_strategy",
        "no",
        "--logging_steps",
        "1",
        *extra,
    ]


def nastiest_legal_batch(trainer) -> dict:
    """Rows: a full sentence; a source and a target that are only </s> (an empty sentence); a target that
    is all padding (-100: no token to learn from); a source with no token at all (attention mask all 0)."""
    tokenizer = trainer.processing_class
    pairs = [("a b c d e", "e d c b a"), ("", ""), ("f g", "g f"), ("h i j", "j i h")]
    features = [
        {"input_ids": tokenizer(s)["input_ids"], "labels": tokenizer(text_target=t)["input_ids"]} for s, t in pairs
    ]
    batch = trainer.data_collator(features)
    assert batch["input_ids"][1].tolist()[:2] == [tokenizer.eos_token_id, tokenizer.pad_token_id]
    batch["labels"][2] = -100
    batch["input_ids"][3], batch["attention_mask"][3] = tokenizer.pad_token_id, 0
    return batch


# Plain SGD at a learning rate of 1 (eq. (3) with one warm-up step peaks at once), nothing clipped or
# dropped: the update is exactly minus the gradient.
ONE_SGD_STEP = (
    "--config_overrides",
    "dropout=0.0",
    "--optim",
    "sgd",
    "--learning_rate",
    "1",
    "--warmup_steps",
    "1",
    "--max_grad_norm",
    "0",
    "--max_steps",
    "1",
)


def one_trainer_update(data_dir: Path, output_dir: Path, *flags: str) -> tuple[dict, float, object]:
    """(gradient per parameter, logged loss, trainer) of one real Trainer update on the nastiest batch."""
    trainer = train.build_trainer(
        *train.parse_arguments(arguments(data_dir, output_dir, *ONE_SGD_STEP, *flags))
    ).trainer
    batch = nastiest_legal_batch(trainer)
    trainer.get_train_dataloader = lambda: [batch]  # this one batch, through the Trainer's own step
    before = copy.deepcopy(trainer.model.state_dict())
    trainer.train()
    after = trainer.model.state_dict()
    loss = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
    return {name: before[name] - after[name] for name, _ in trainer.model.named_parameters()}, loss, trainer


def relative_error(gradients: dict, reference: dict) -> float:
    difference = sum(((gradients[n] - reference[n]) ** 2).sum() for n in reference)
    return (difference / sum((reference[n] ** 2).sum() for n in reference)).sqrt().item()


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_bf16_update_follows_float32_autograd_on_the_nastiest_legal_batch(data_dir, tmp_path, attention):
    flags = ("--attn_implementation", attention)
    float32, float32_loss, trainer = one_trainer_update(data_dir, tmp_path / "fp32", *flags)
    bf16, bf16_loss, bf16_trainer = one_trainer_update(data_dir, tmp_path / "bf16", *flags, "--bf16")
    assert (bf16_trainer.accelerator.mixed_precision, bf16_trainer.accelerator.native_amp) == ("bf16", True)

    # reference: the same initial model (same seed), float32 autograd of the package's loss
    model = train.build_trainer(
        *train.parse_arguments(arguments(data_dir, tmp_path / "ref", *ONE_SGD_STEP, *flags))
    ).trainer.model
    batch = nastiest_legal_batch(trainer)
    model.train()
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
    ).logits
    loss = label_smoothed_cross_entropy(logits, batch["labels"], label_smoothing=0.1)
    loss.backward()
    reference = {name: parameter.grad for name, parameter in model.named_parameters()}

    assert all(torch.isfinite(g).all() for g in (*float32.values(), *bf16.values()))
    assert float32_loss == pytest.approx(loss.item(), rel=1e-6)
    assert relative_error(float32, reference) < 1e-5  # the update is the gradient
    assert bf16_loss == pytest.approx(loss.item(), rel=1e-2)
    assert 1e-4 < relative_error(bf16, reference) < 0.05  # bf16 did run (8-bit mantissa), and within its precision


def test_fp16_on_the_cpu_is_refused_rather_than_run_in_float32(data_dir, tmp_path):
    with pytest.raises(ValueError, match="--fp16 on cpu.*--bf16"):
        train.build_trainer(*train.parse_arguments(arguments(data_dir, tmp_path, "--fp16")))


def test_float16_autocast_with_a_loss_scaler_on_the_nastiest_legal_batch(data_dir, tmp_path):
    """What accelerate does on a GPU for --fp16: float16 autocast, loss scaled before backward, gradients
    unscaled before the step, the step skipped (and the scale halved) when they overflow."""
    trainer = train.build_trainer(*train.parse_arguments(arguments(data_dir, tmp_path, *ONE_SGD_STEP))).trainer
    model, batch = trainer.model.train(), nastiest_legal_batch(trainer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def gradients(autocast: bool, scaler=None) -> dict:
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            logits = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=batch["decoder_input_ids"],
            ).logits
            loss = label_smoothed_cross_entropy(logits, batch["labels"], label_smoothing=0.1)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        return {name: parameter.grad.clone() for name, parameter in model.named_parameters()}

    reference = gradients(autocast=False)
    scaler = torch.amp.GradScaler("cpu")
    unscaled = gradients(autocast=True, scaler=scaler)
    assert all(torch.isfinite(g).all() for g in unscaled.values())
    assert 1e-5 < relative_error(unscaled, reference) < 1e-2

    before = copy.deepcopy(model.state_dict())
    overflowing = torch.amp.GradScaler("cpu", init_scale=2.0**60)
    gradients(autocast=True, scaler=overflowing)
    overflowing.step(optimizer)
    overflowing.update()
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())  # step skipped
    assert overflowing.get_scale() == 2.0**59


# ---------------------------------------------------------------------------------------------
# A model saved from bf16 training, loaded in bf16 and in float32
# ---------------------------------------------------------------------------------------------


def train_in_bf16(data_dir: Path, output_dir: Path, steps: int) -> Path:
    train.main(
        arguments(
            data_dir,
            output_dir,
            "--bf16",
            "--max_steps",
            str(steps),
            "--learning_rate",
            "0.005",
            "--warmup_steps",
            str(max(1, steps // 5)),
            "--max_tokens",
            "600",
        )
    )
    return output_dir


def test_a_model_saved_from_bf16_training_loads_and_runs_in_bf16_and_float32(data_dir, tmp_path):
    saved = train_in_bf16(data_dir, tmp_path / "run", steps=3)
    tokenizer = AutoTokenizer.from_pretrained(saved)
    float32 = AutoModelForSeq2SeqLM.from_pretrained(saved)
    bf16 = AutoModelForSeq2SeqLM.from_pretrained(saved, dtype=torch.bfloat16)
    assert {p.dtype for p in float32.parameters()} == {torch.float32}  # bf16 training keeps float32 weights
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    table = bf16.model.encoder.embedding.positional_encoding.table
    expected = sinusoidal_positions(*table.shape).to(torch.bfloat16)
    assert table.dtype == torch.bfloat16 and torch.equal(table, expected)

    sources = [s for s, _ in reversal_pairs(6, seed=3)]
    batch = tokenizer(sources, text_target=[t for _, t in reversal_pairs(6, seed=3)], padding=True, return_tensors="pt")
    decoder_input_ids = float32.prepare_decoder_input_ids_from_labels(batch["labels"])
    with torch.no_grad():
        logits = [
            model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=decoder_input_ids,
            ).logits.float()
            for model in (float32, bf16)
        ]
    assert ((logits[1] - logits[0]).norm() / logits[0].norm()).item() < 0.03
    assert len(translate(bf16, tokenizer, sources)) == len(sources)  # beam search runs in bf16


@pytest.mark.slow
def test_a_model_trained_in_bf16_translates_the_same_in_bf16_and_float32(data_dir, tmp_path):
    saved = train_in_bf16(data_dir, tmp_path / "run", steps=250)
    tokenizer = AutoTokenizer.from_pretrained(saved)
    held_out = reversal_pairs(40, seed=3)
    sources = [s for s, _ in held_out]
    float32 = translate(AutoModelForSeq2SeqLM.from_pretrained(saved), tokenizer, sources)
    bf16 = translate(AutoModelForSeq2SeqLM.from_pretrained(saved, dtype=torch.bfloat16), tokenizer, sources)
    assert sum(h == t for h, (_, t) in zip(float32, held_out)) / len(held_out) >= 0.85  # it learned the task
    assert sum(a == b for a, b in zip(float32, bf16)) / len(sources) >= 0.9
