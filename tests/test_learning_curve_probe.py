"""benchmarks/learning_curve_probe.py: every initialisation scheme draws what it names, the tied
embedding is never overwritten through the pre-softmax projection, the schedule is eq. (3), and an
end-to-end run on a tiny stand-in corpus gives every variant the same batches."""

from __future__ import annotations

import gzip
import json
import math
import random

import pytest
import torch
from torch import nn

import vanilla_transformer
from helpers import load_script

probe = load_script("benchmarks/learning_curve_probe.py")

D = probe.DIMENSIONS["d_model"]
SMALL = math.sqrt(2 / (5 * D))
XAVIER_SQUARE = math.sqrt(2 / (D + D))  # std of Xavier-uniform for a d x d weight
WORDS = "a dog runs man woman sits on the bench two children play in park red ball".split()


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(6)) for _ in range(200)]
    return vanilla_transformer.train_tokenizer(iter(sentences + [s.upper() for s in sentences]), vocab_size=300)


def weight(model: nn.Module, suffix: str) -> torch.Tensor:
    return next(m.weight for n, m in model.named_modules() if n.endswith(suffix))


# (query projection std, second FFN layer std, embedding std); fc2 is 256 x 1024, Xavier std sqrt(2 / 1280)
EXPECTED = {
    "ours": (SMALL, SMALL, D**-0.5),
    "ours:xavier": (XAVIER_SQUARE, math.sqrt(2 / 1280), D**-0.5),
    "ours:small-init": (SMALL, SMALL, D**-0.5),
    "ours:marian-init": (0.02, 0.02, 0.02),
    "ours:linears-0.02": (0.02, 0.02, D**-0.5),
    "ours:xavier-embeddings-0.02": (XAVIER_SQUARE, math.sqrt(2 / 1280), 0.02),
    "ours:small-qk": (0.02, math.sqrt(2 / 1280), D**-0.5),
    "ours:small-rest": (XAVIER_SQUARE, 0.02, D**-0.5),
    "marian": (0.02, 0.02, 0.02),
    "marian:xavier": (XAVIER_SQUARE, math.sqrt(2 / 1280), D**-0.5),
}


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_each_scheme_draws_the_stds_it_names_and_keeps_the_projection_tied(variant, tokenizer):
    model = probe.build(variant, tokenizer, seed=0)
    query, fc2, embedding = EXPECTED[variant]
    assert weight(model, "q_proj").std().item() == pytest.approx(query, rel=0.05)
    assert weight(model, "fc2").std().item() == pytest.approx(fc2, rel=0.05)
    embeddings = model.get_input_embeddings().weight
    assert embeddings[4:].std().item() == pytest.approx(embedding, rel=0.1)
    assert model.get_output_embeddings().weight is embeddings
    assert all(
        torch.count_nonzero(m.bias) == 0 for m in model.modules() if isinstance(m, nn.Linear) and m.bias is not None
    )


def test_unknown_system_or_scheme_is_an_error_naming_the_choices(tokenizer):
    with pytest.raises(ValueError, match="use ours"):
        probe.build("fairseq", tokenizer, seed=0)
    with pytest.raises(ValueError, match="use one of default, xavier, small-init"):
        probe.build("ours:kaiming", tokenizer, seed=0)


def test_schedule_is_equation_3_rescaled_to_its_peak():
    warmup, peak = 200, 7e-4
    for update in (1, 50, 199, 200, 201, 800, 5000):
        paper = D**-0.5 * min(update**-0.5, update * warmup**-1.5)
        assert probe.learning_rate(update, peak, warmup) == pytest.approx(paper * peak / (D**-0.5 * warmup**-0.5))


def test_missing_data_folder_is_reported_not_an_error(tmp_path, capsys):
    assert probe.main(["--tokenizer", "unused", "--variant", "ours", "--data-dir", str(tmp_path / "absent")]) is None
    assert "Multi30k not found" in capsys.readouterr().out


@pytest.mark.slow  # 18 s: a probe of benchmarks/ (make test-slow)
def test_a_tiny_run_repeats_exactly_and_tells_initialisations_apart(tmp_path, tokenizer, monkeypatch):
    """Each variant starts training from the same random state whatever its initialisation drew (so
    one system's variants share dropout masks), and a variant run alone repeats its curve exactly;
    another initialisation gives another curve. 120 short pairs make fewer batches than 100
    updates, so the batches run over into further epochs."""
    rng = random.Random(1)
    english = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) for _ in range(120)]
    for lang, lines in (("en", english), ("de", [s.upper() for s in english])):
        with gzip.open(tmp_path / f"train.{lang}.gz", "wt", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    states, loss = [], probe.label_smoothed_cross_entropy

    def recording_loss(*args, **kwargs):
        states.append(torch.get_rng_state())  # after the first forward's dropout
        return loss(*args, **kwargs)

    monkeypatch.setattr(probe, "label_smoothed_cross_entropy", recording_loss)
    common = [
        "--tokenizer",
        str(tmp_path / "tokenizer"),
        "--data-dir",
        str(tmp_path),
        "--updates",
        "100",
        "--max-tokens",
        "64",
        "--threads",
        "1",
    ]
    both = probe.main(common + ["--variant", "ours:xavier", "--variant", "ours", "--output", str(tmp_path / "c.json")])
    assert torch.equal(states[0], states[100])  # ours:xavier's first update vs ours' first update
    alone = probe.main(common + ["--variant", "ours"])
    assert alone["ours"] == both["ours"]
    assert all(len(curve) == 2 and 0 < curve[1] < curve[0] < 20 for curve in both.values())
    assert both["ours:xavier"] != pytest.approx(both["ours"], abs=1e-3)
    assert json.loads((tmp_path / "c.json").read_text()) == both
