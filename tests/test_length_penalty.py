"""§6.1's length penalty: GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha through the standard generate(), or
transformers' |Y| ** alpha; each checked against the log-probability of the returned hypothesis
recomputed by a teacher-forced forward pass."""

import pytest
import torch

from test_pipeline import TEXTS, train_copying_translator
from vanilla_transformer.generation_vanilla_transformer import paper_generation_config


def gnmt(length: int, alpha: float) -> float:
    """GNMT's lp(Y) (Wu et al., 2016, eq. 14), written out: the reference, not the package's function."""
    return ((5 + length) / 6) ** alpha


@pytest.fixture(scope="module")
def trained():
    return train_copying_translator(steps=25)


def sequence_log_probability(model, batch, row: int, sequence: torch.Tensor, eos: int) -> tuple[float, int]:
    """log P(Y | X) of one generated sequence (up to and including its </s>), and |Y|."""
    tokens = sequence.tolist()
    end = tokens.index(eos, 1) + 1 if eos in tokens[1:] else len(tokens)
    decoder_input_ids = sequence[None, : end - 1]
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"][row : row + 1],
            attention_mask=batch["attention_mask"][row : row + 1],
            decoder_input_ids=decoder_input_ids,
        ).logits
    log_probs = logits.float().log_softmax(-1)[0, torch.arange(end - 1), sequence[1:end]]
    return log_probs.sum().item(), end - 1


@pytest.mark.parametrize("formula", ["gnmt", "length"])
@pytest.mark.floor
def test_beam_scores_are_the_log_probability_over_the_named_penalty(trained, formula):
    model, tokenizer = trained
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(
            **batch,
            num_beams=4,
            length_penalty=0.6,
            max_new_tokens=20,
            length_penalty_formula=formula,
            return_dict_in_generate=True,
            output_scores=True,
        )
    for row, (sequence, score) in enumerate(zip(output.sequences, output.sequences_scores)):
        log_probability, length = sequence_log_probability(model, batch, row, sequence, tokenizer.eos_token_id)
        penalty = gnmt(length, 0.6) if formula == "gnmt" else length**0.6
        assert score.item() == pytest.approx(log_probability / penalty, rel=1e-4, abs=1e-5), row


def test_the_hypothesis_returned_is_the_best_of_the_beams_finished(trained):
    """Beam search returns the highest-scoring finished hypothesis: the reference is each of its 4 best
    candidates rescored by teacher forcing and GNMT's penalty; the returned one scores their maximum, and the
    n-best list comes best first."""
    model, tokenizer = trained
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    settings = dict(num_beams=4, length_penalty=0.6, max_new_tokens=20, return_dict_in_generate=True)
    with torch.no_grad():
        best = model.generate(**batch, **settings).sequences
        nbest = model.generate(**batch, **settings, num_return_sequences=4, output_scores=True)

    def rescored(row: int, sequence: torch.Tensor) -> float:
        log_probability, length = sequence_log_probability(model, batch, row, sequence, tokenizer.eos_token_id)
        return log_probability / gnmt(length, 0.6)

    for row in range(len(TEXTS)):
        candidates = [rescored(row, sequence) for sequence in nbest.sequences[4 * row : 4 * row + 4]]
        assert rescored(row, best[row]) == pytest.approx(max(candidates), rel=1e-4, abs=1e-5), (row, candidates)
        assert all(better >= worse - 1e-5 for better, worse in zip(candidates, candidates[1:])), candidates
        torch.testing.assert_close(nbest.sequences_scores[4 * row : 4 * row + 4], torch.tensor(candidates))


def test_the_papers_penalty_is_the_default_and_saved_in_the_generation_config(trained, tmp_path):
    model, tokenizer = trained
    assert paper_generation_config(model.config).length_penalty_formula == "gnmt"
    assert model.generation_config.length_penalty_formula == "gnmt"
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        default = model.generate(**batch, max_new_tokens=20)
        gnmt = model.generate(**batch, max_new_tokens=20, length_penalty_formula="gnmt")
    assert torch.equal(default, gnmt)
    model.generation_config.save_pretrained(tmp_path)
    assert '"length_penalty_formula": "gnmt"' in (tmp_path / "generation_config.json").read_text()


def test_a_generation_config_without_the_field_keeps_transformers_penalty(trained):
    from transformers import GenerationConfig

    model, tokenizer = trained
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    legacy = GenerationConfig(
        **{
            k: v
            for k, v in model.generation_config.to_dict().items()
            if k not in ("length_penalty_formula", "transformers_version")
        }
    )
    saved, model.generation_config = model.generation_config, legacy
    try:
        with torch.no_grad():
            old = model.generate(**batch, max_new_tokens=20, return_dict_in_generate=True, output_scores=True)
            length = model.generate(
                **batch,
                max_new_tokens=20,
                length_penalty_formula="length",
                return_dict_in_generate=True,
                output_scores=True,
            )
    finally:
        model.generation_config = saved
    assert torch.equal(old.sequences, length.sequences)
    torch.testing.assert_close(old.sequences_scores, length.sequences_scores)


def test_an_unknown_formula_is_refused(trained):
    model, tokenizer = trained
    with pytest.raises(ValueError, match="length_penalty_formula='wu'"):
        model.generate(**tokenizer(TEXTS[:1], return_tensors="pt"), length_penalty_formula="wu")


def test_settings_given_to_generate_apply_under_the_papers_length_limit_without_a_deprecation_warning(
    trained, monkeypatch
):
    """Without max_new_tokens, generate() applies §6.1's limit through its own copy of the generation config;
    the call's settings must reach that copy (scores divided by the asked alpha), and transformers must not
    see a config and settings together (deprecated in transformers 5)."""
    import transformers.generation.utils as generation_utils

    warnings = []
    monkeypatch.setattr(generation_utils.logger, "warning_once", lambda message, *a, **k: warnings.append(message))
    model, tokenizer = trained
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**batch, length_penalty=2.0, return_dict_in_generate=True, output_scores=True)
    for row, (sequence, score) in enumerate(zip(output.sequences, output.sequences_scores)):
        log_probability, length = sequence_log_probability(model, batch, row, sequence, tokenizer.eos_token_id)
        assert score.item() == pytest.approx(log_probability / gnmt(length, 2.0), rel=1e-4, abs=1e-5)
    assert not [message for message in warnings if "generation_config" in message], warnings
    assert model.generation_config.length_penalty == 0.6  # the model's own config is untouched


def test_two_threads_generating_with_different_penalties_get_what_each_gets_alone(trained):
    """The penalty is the call's: generate() calls in other threads, on the same model, do not change it."""
    import threading

    model, tokenizer = trained
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    settings = dict(
        num_beams=4, length_penalty=0.6, max_new_tokens=20, return_dict_in_generate=True, output_scores=True
    )

    def decode(formula):
        with torch.no_grad():
            searched = model.generate(**batch, max_new_tokens=20, length_penalty_formula=formula)
            scored = model.generate(**batch, **settings, length_penalty_formula=formula)
        return searched, scored.sequences_scores

    alone = {formula: decode(formula) for formula in ("gnmt", "length")}
    assert not torch.allclose(alone["gnmt"][1], alone["length"][1])  # the two penalties score differently
    together, start = {"gnmt": [], "length": []}, threading.Barrier(2)

    def repeat(formula):
        start.wait()
        for _ in range(4):
            together[formula].append(decode(formula))

    threads = [threading.Thread(target=repeat, args=(formula,)) for formula in together]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for formula, results in together.items():
        assert len(results) == 4
        for searched, scores in results:
            assert torch.equal(searched, alone[formula][0]) and torch.equal(scores, alone[formula][1]), formula
