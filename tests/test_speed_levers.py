"""The speed levers change nothing but speed.

References: MarianMTModel's generate() (transformers' beam search on another implementation of the same
weights), transformers' own `_beam_search` on our model, a brute-force top-k, the whole
projection for `logits_to_keep`, PyTorch's ``cross_entropy(label_smoothing=...)`` and its autograd,
the binomial law of a dropout mask, and the eager model for the compiled paths.
"""

import copy
import math

import pytest
import torch
from transformers import GenerationMixin, MarianConfig, MarianMTModel

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.convert import from_marian
from vanilla_transformer.generation_vanilla_transformer import BeamSearch, best_continuations, top_tokens
from vanilla_transformer.training_kernels import UniformMaskDropout, label_smoothed_cross_entropy

VOCAB, PAD, EOS, START = 40, 0, 3, 0


def marian_that_stops(seed: int = 0, eos_bias: float = 1.2, vocabulary: int = VOCAB) -> MarianMTModel:
    """A random MarianMTModel whose final_logits_bias makes </s> likely, so that beams and sentences
    end at different steps (random weights alone almost never emit </s>)."""
    torch.manual_seed(seed)
    marian = MarianMTModel(
        MarianConfig(
            vocab_size=vocabulary,
            decoder_vocab_size=vocabulary,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=128,
            pad_token_id=PAD,
            eos_token_id=EOS,
            decoder_start_token_id=START,
            forced_eos_token_id=None,
            activation_function="relu",
            scale_embedding=True,
            init_std=0.1,
        )
    ).eval()
    with torch.no_grad():
        marian.final_logits_bias[0, EOS] = eos_bias
    return marian


def padded_sources(seed: int = 1, sentences: int = 6):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, VOCAB, (sentences, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, length in enumerate(range(10, 10 - sentences, -1)):
        input_ids[row, length - 1] = EOS
        input_ids[row, length:] = PAD
        attention_mask[row, length:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def rows_per_decoder_call(model) -> list[int]:
    """Record the number of decoder rows of every forward call (to see sentences leave the batch)."""
    rows = []
    model.model.decoder.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    return rows


# --- beam search ------------------------------------------------------------------------------------

BEAM_CASES = {
    "paper": dict(num_beams=4, length_penalty=0.6, early_stopping=True, max_new_tokens=12),
    "not-early": dict(num_beams=4, length_penalty=0.6, early_stopping=False, max_new_tokens=12),
    "never": dict(num_beams=4, length_penalty=0.6, early_stopping="never", max_new_tokens=12),
    "returns-3": dict(num_beams=4, num_return_sequences=3, length_penalty=-0.5, max_new_tokens=12),
    "min-length": dict(num_beams=4, min_new_tokens=4, max_new_tokens=12, length_penalty=0.6),
    "no-repeat-ngram": dict(num_beams=4, no_repeat_ngram_size=2, early_stopping=True, max_new_tokens=12),
    "repetition-penalty": dict(num_beams=4, repetition_penalty=1.5, early_stopping=True, max_new_tokens=12),
}


SENTENCES_END_EARLY = {"paper", "returns-3", "no-repeat-ngram", "repetition-penalty"}


@pytest.mark.parametrize("case", BEAM_CASES)
def test_beam_search_gives_marians_hypotheses_while_finished_sentences_leave_the_batch(case):
    marian = marian_that_stops()
    ours = from_marian(marian)
    rows = rows_per_decoder_call(ours)
    inputs = padded_sources()
    expected = marian.generate(**inputs, **BEAM_CASES[case])
    produced = ours.generate(**inputs, **BEAM_CASES[case])
    ended = expected == EOS
    assert ended.any(dim=1).sum() > 1  # the case is a real one: several hypotheses end early
    expected = expected.masked_fill(ended.long().cumsum(1) - ended.long() > 0, PAD)  # Marian fills with </s>
    assert torch.equal(produced, expected)
    if case in SENTENCES_END_EARLY:
        assert min(rows) < max(rows)  # some sentence finished before the others and left the batch


def test_more_beams_than_the_vocabulary_can_fill_decode_as_transformers_does():
    """2 x 24 beams keep 48 candidates a step, more than the 40 tokens of a row: transformers takes them over
    beams x vocabulary, so the call is handed to its loop (a top-48 of 40 tokens would fail)."""
    marian = marian_that_stops()
    ours, inputs = from_marian(marian), padded_sources(sentences=2)
    settings = dict(num_beams=24, length_penalty=0.6, early_stopping=True, max_new_tokens=6)
    expected = marian.generate(**inputs, **settings)
    ended = expected == EOS
    expected = expected.masked_fill(ended.long().cumsum(1) - ended.long() > 0, PAD)  # Marian fills with </s>
    assert torch.equal(ours.generate(**inputs, **settings), expected)


def test_the_papers_decoding_is_served_by_our_beam_search(monkeypatch):
    """generate() hands the cache over under the installed transformers' name (5.24 renamed it to
    `cache`); were it looked for under another, the call would silently go to transformers' search."""
    served = []
    run = BeamSearch.run
    monkeypatch.setattr(BeamSearch, "run", lambda search: served.append(search) or run(search))
    ours = from_marian(marian_that_stops())
    ours.generate(**padded_sources(), **BEAM_CASES["paper"])
    assert len(served) == 1


def test_beam_search_in_bfloat16_equals_transformers_own_where_scores_tie():
    """bfloat16 logits tie exactly at most steps; `top_tokens`' blocks ordered ties otherwise than torch.topk,
    and this batch (a vocabulary long enough for blocks) then ended with another hypothesis than transformers'."""
    ours = from_marian(marian_that_stops(seed=11, eos_bias=0.5, vocabulary=2000)).to(torch.bfloat16)
    expected = copy.deepcopy(ours)

    class Stock(VanillaTransformerForConditionalGeneration):
        _beam_search = GenerationMixin._beam_search

    expected.__class__ = Stock
    inputs, settings = padded_sources(seed=11, sentences=4), dict(num_beams=4, max_new_tokens=12)
    assert torch.equal(ours.generate(**inputs, **settings), expected.generate(**inputs, **settings))


@pytest.mark.parametrize("case", ["paper", "returns-3"])
def test_beam_search_equals_transformers_own_on_our_model(case):
    ours = from_marian(marian_that_stops(seed=2))
    inputs = padded_sources(seed=3)
    expected = copy.deepcopy(ours)

    class Stock(VanillaTransformerForConditionalGeneration):
        _beam_search = GenerationMixin._beam_search

    expected.__class__ = Stock
    assert torch.equal(ours.generate(**inputs, **BEAM_CASES[case]), expected.generate(**inputs, **BEAM_CASES[case]))


def test_a_call_the_search_does_not_cover_is_logged_once_at_debug_level_with_the_reason(caplog, monkeypatch):
    """transformers' loop serves it, with the same hypotheses; the log names why, once per process."""
    import vanilla_transformer.generation_vanilla_transformer as generation

    monkeypatch.setattr(generation, "_LOGGED", set())
    ours = from_marian(marian_that_stops(seed=4))
    plain = ours.generate(**padded_sources(), **BEAM_CASES["paper"])
    logger = generation.logger
    monkeypatch.setattr(logger, "level", 10)  # transformers' loggers do not propagate to the root's level
    with caplog.at_level("DEBUG", logger=logger.name):
        for _ in range(2):
            scored = ours.generate(**padded_sources(), **BEAM_CASES["paper"], return_dict_in_generate=True)
            assert torch.equal(scored.sequences, plain)
    messages = [record.getMessage() for record in caplog.records if record.name == logger.name]
    assert messages == [
        "beam search: transformers' own loop, because it samples, returns a dict, syncs GPUs, prefills in chunks or "
        "asks for low_memory"
    ]


def test_low_memory_gets_transformers_own_refusal_not_a_silent_decoding():
    """transformers' beam search refuses ``low_memory=True``; ours decoded as if it were not given."""
    ours = from_marian(marian_that_stops(seed=4))
    with pytest.raises(ValueError, match="low_memory=True"):
        ours.generate(**padded_sources(), **BEAM_CASES["paper"], low_memory=True)


HOST_SYNCS = ("__bool__", "item", "tolist", "__int__", "__float__", "nonzero")


@pytest.mark.parametrize("case", ["paper", "min-length", "never"])
def test_the_search_waits_for_the_device_no_more_often_per_step_than_transformers_loop(case, monkeypatch):
    """Each read of a tensor's value on the host (bool(), .item(), .tolist(), int(), nonzero) waits for a GPU.
    Counted on the CPU between one decoder call and the next (a step's reads, the model's own included), the
    search reads no more often than transformers' `_beam_search` on the same model and call."""
    ours = from_marian(marian_that_stops(seed=2))
    stock = copy.deepcopy(ours)

    class Stock(VanillaTransformerForConditionalGeneration):
        _beam_search = GenerationMixin._beam_search

    stock.__class__ = Stock
    per_step = {}
    for name, model in (("ours", ours), ("stock", stock)):
        reads, marks = [], []
        model.model.decoder.register_forward_pre_hook(lambda *args: marks.append(len(reads)))  # noqa: B023 (used in this iteration)
        with monkeypatch.context() as patch:
            for method in HOST_SYNCS:
                original = getattr(torch.Tensor, method)
                patch.setattr(
                    torch.Tensor,
                    method,
                    lambda *args, _original=original, **kwargs: reads.append(1) or _original(*args, **kwargs),  # noqa: B023 (used in this iteration)
                )
            model.generate(**padded_sources(seed=3), **BEAM_CASES[case])
        marks.append(len(reads))
        per_step[name] = [after - before for before, after in zip(marks, marks[1:])]
    assert len(per_step["ours"]) > 3 and max(per_step["stock"]) > 0  # the count sees the reads
    assert max(per_step["ours"]) <= max(per_step["stock"]) and sum(per_step["ours"]) <= sum(per_step["stock"]), per_step


def test_calls_beam_search_does_not_cover_still_get_the_same_hypotheses():
    ours = from_marian(marian_that_stops(seed=4))
    inputs = padded_sources(seed=5)
    plain = ours.generate(**inputs, **BEAM_CASES["paper"])
    with_scores = ours.generate(**inputs, **BEAM_CASES["paper"], return_dict_in_generate=True, output_scores=True)
    assert torch.equal(with_scores.sequences, plain)


LEAN_CASES = {
    # name: (seed, eos bias: how soon hypotheses end, generate() arguments)
    "sentences-leave-gnmt": (6, 0.3, dict(length_penalty_formula="gnmt")),
    "sentences-leave-length": (6, 0.3, dict(length_penalty_formula="length")),
    "returns-2": (6, 0.3, dict(num_return_sequences=2, length_penalty_formula="gnmt")),
    "all-end-within-3-steps": (6, 1.2, dict(length_penalty_formula="gnmt")),
    "some-end": (7, 1.2, dict(length_penalty_formula="gnmt")),
    "negative-penalty": (7, 1.2, dict(length_penalty=-0.5, length_penalty_formula="length")),
    "none-end": (6, -30.0, dict(length_penalty_formula="gnmt")),
}


@pytest.mark.parametrize("case", LEAN_CASES)
def test_lean_step_merges_finished_hypotheses_only_when_one_ends_and_keeps_the_hypotheses(case):
    """The paper's decoding (early stopping, no logits processor) calls transformers' finished-beam merge
    only at the steps where a hypothesis ends; the hypotheses equal transformers' `_beam_search`, which
    merges at every step."""
    seed, eos_bias, arguments = LEAN_CASES[case]
    ours = from_marian(marian_that_stops(seed=seed, eos_bias=eos_bias))
    stock = copy.deepcopy(ours)

    class Stock(VanillaTransformerForConditionalGeneration):
        _beam_search = GenerationMixin._beam_search

    stock.__class__ = Stock
    merges = {"ours": 0, "stock": 0}
    for name, model in (("ours", ours), ("stock", stock)):

        def counted(*args, _name=name, _merge=model._update_finished_beams, **kwargs):
            merges[_name] += 1
            return _merge(*args, **kwargs)

        model._update_finished_beams = counted
    rows = rows_per_decoder_call(ours)
    settings = dict(num_beams=4, length_penalty=0.6, early_stopping=True, max_new_tokens=12) | arguments
    inputs = padded_sources(seed=seed + 10)
    produced, expected = ours.generate(**inputs, **settings), stock.generate(**inputs, **settings)
    assert torch.equal(produced, expected)
    assert merges["stock"] >= len(rows) and 0 < merges["ours"] <= len(rows)
    if case.startswith("sentences-leave"):  # the case is a real one
        assert min(rows) < max(rows) and (produced == EOS).any(dim=1).all()
    if case in ("sentences-leave-gnmt", "some-end"):  # merged only at the steps where a hypothesis ended
        assert merges["ours"] < len(rows) // 2
    if case == "none-end":  # every hypothesis reaches the limit: one merge, at the last step
        assert merges["ours"] == 1 and produced.shape[1] == 1 + 12 and not (produced == EOS).any()


SECOND_EOS = 5


@pytest.mark.parametrize(
    "arguments",
    [
        dict(early_stopping=True),
        dict(early_stopping=True, num_return_sequences=2),
        dict(early_stopping=False),
        dict(early_stopping=True, repetition_penalty=1.3),
    ],
    ids=["paper", "returns-2", "not-early", "with-a-processor"],
)
def test_sentences_that_end_at_the_first_step_leave_the_batch_with_transformers_hypotheses(arguments):
    """With two end-of-sentence tokens and two beams, a sentence can have all its hypotheses end at the first
    step, when the decoder still runs one row per sentence: it leaves in the first reorder of the cache."""
    marian = marian_that_stops(seed=2, eos_bias=1.5)
    with torch.no_grad():
        marian.final_logits_bias[0, SECOND_EOS] = 1.5
    ours = from_marian(marian)
    stock = copy.deepcopy(ours)

    class Stock(VanillaTransformerForConditionalGeneration):
        _beam_search = GenerationMixin._beam_search

    stock.__class__ = Stock
    rows = rows_per_decoder_call(ours)
    settings = dict(num_beams=2, max_new_tokens=6, eos_token_id=[EOS, SECOND_EOS], pad_token_id=PAD) | arguments
    inputs = padded_sources(seed=3)
    produced, expected = ours.generate(**inputs, **settings), stock.generate(**inputs, **settings)
    assert torch.equal(produced, expected)
    sentences = inputs["input_ids"].shape[0]
    if arguments.get("early_stopping"):  # the case is a real one: some sentences left after the first step
        assert rows[0] == sentences and rows[1] < 2 * sentences, rows  # one row per sentence, then 2 per kept one


@pytest.mark.parametrize("num_beams", [1, 2])
def test_with_two_end_ids_what_follows_either_is_padding(num_beams):
    """A pad id of 0 is falsy, so transformers fills ended hypotheses with the first end id; with two end ids
    every token after a row's first end (either id) must still be ``<pad>``, as with one."""
    marian = marian_that_stops(seed=4, eos_bias=0.6)  # some rows end with the second id, others never
    with torch.no_grad():
        marian.final_logits_bias[0, SECOND_EOS] = 0.6
    ours = from_marian(marian)
    settings = dict(num_beams=num_beams, max_new_tokens=6, eos_token_id=[EOS, SECOND_EOS], pad_token_id=PAD)
    produced = ours.generate(**padded_sources(seed=3), **settings)
    ended_by_second = 0
    for row in produced.tolist():
        generated = row[1:]  # after the decoder's start token
        ends = [position for position, token in enumerate(generated) if token in (EOS, SECOND_EOS)]
        if ends:
            assert all(token == PAD for token in generated[ends[0] + 1 :]), row
            ended_by_second += generated[ends[0]] == SECOND_EOS and ends[0] + 1 < len(generated)
    assert ended_by_second  # the case is a real one: a row ends with the second id before the longest


def test_best_continuations_equal_the_top_k_over_all_beams_and_tokens():
    generator = torch.Generator().manual_seed(0)
    sentences, beams, vocabulary, keep = 5, 4, 30, 8
    log_probs = torch.randn(sentences * beams, vocabulary, generator=generator).log_softmax(-1)
    beam_scores = torch.randn(sentences, beams, generator=generator) * 3
    scores, beam, token = best_continuations(log_probs, beam_scores, keep)
    sums = (log_probs.view(sentences, beams, vocabulary) + beam_scores[:, :, None]).view(sentences, -1)
    expected_scores, flat = torch.topk(sums, keep)
    assert torch.equal(scores, expected_scores)
    assert torch.equal(beam, flat // vocabulary) and torch.equal(token, flat % vocabulary)


@pytest.mark.parametrize("vocabulary", [8000, 8003, 37000])  # whole blocks, a partial last block, WMT's size
def test_top_tokens_by_blocks_equal_torch_topk_over_the_whole_vocabulary(vocabulary):
    generator = torch.Generator().manual_seed(vocabulary)
    log_probs = (torch.randn(64, vocabulary, generator=generator) * 4).log_softmax(-1)
    log_probs[1, :-5] = -math.inf  # a processor left five tokens, all in the partial block when there is one
    log_probs[2, 3::7] = -math.inf
    log_probs[3, vocabulary - 1] = 50.0  # the best token is the last one
    log_probs[4, 100:200] = 10.0  # more equal best scores than kept, in two blocks
    for keep in (1, 8, 12):
        scores, tokens = top_tokens(log_probs, keep)
        expected_scores, expected_tokens = torch.topk(log_probs, keep)
        assert torch.equal(scores, expected_scores)
        assert torch.equal(log_probs.gather(1, tokens), scores)  # each token carries its score
        assert all(len(set(row)) == keep for row in tokens.tolist())
        # rows without equal scores among their best keep + 1 (row 1's -inf, row 4's 10.0): the same tokens
        best = torch.topk(log_probs, keep + 1).values
        distinct = [row for row in range(64) if len(set(best[row].tolist())) == keep + 1]
        assert len(distinct) >= 61 and torch.equal(tokens[distinct], expected_tokens[distinct])


def test_the_model_compiles_as_one_graph():
    """transformers compiles the forward with fullgraph=True for static caches: nothing in it may break the graph."""
    ours = from_marian(marian_that_stops())
    batch = padded_sources()
    compiled = torch.compile(ours.forward, fullgraph=True, backend="eager")
    with torch.no_grad():
        expected = ours(**batch, decoder_input_ids=batch["input_ids"][:, :4]).logits
        assert torch.equal(compiled(**batch, decoder_input_ids=batch["input_ids"][:, :4]).logits, expected)


@pytest.mark.parametrize("replaced", ["hooked", "hooked on every module", "patched", "subclassed", "compiled"])
@pytest.mark.parametrize("case", ["paper", "returns-3"])
def test_beam_search_calls_the_whole_forward_where_calling_the_model_runs_more_and_keeps_the_hypotheses(case, replaced):
    """A forward hook on the model (accelerate's device placement is one) or on every module, a forward
    replaced on the instance (``model.forward = torch.compile(model.forward)``) or by a subclass, or
    ``model.compile()`` (simulated: its `_compiled_call_impl`, wrapping the plain call): each sees every
    decoding step, because the beam search then calls the model, not the decoder and output projection on
    their own."""
    ours = from_marian(marian_that_stops())
    expected = ours.generate(**padded_sources(), **BEAM_CASES[case])
    calls, handles = [], []
    if replaced == "hooked":
        handles.append(ours.register_forward_hook(lambda *args: calls.append(1)))
    elif replaced == "hooked on every module":
        handles.append(
            torch.nn.modules.module.register_module_forward_hook(
                lambda module, *args: calls.append(1) if module is ours else None
            )
        )
    elif replaced == "patched":
        forward = ours.forward
        ours.forward = lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs)
    elif replaced == "subclassed":

        class Counted(type(ours)):
            def forward(self, *args, **kwargs):
                calls.append(1)
                return super().forward(*args, **kwargs)

        ours.__class__ = Counted
    else:
        ours._compiled_call_impl = lambda *args, **kwargs: calls.append(1) or ours._call_impl(*args, **kwargs)
    rows = rows_per_decoder_call(ours)
    try:
        assert torch.equal(ours.generate(**padded_sources(), **BEAM_CASES[case]), expected)
    finally:
        for handle in handles:
            handle.remove()
    assert len(calls) == len(rows)  # every decoder step (generate() runs the encoder on its own)


def test_hooks_on_the_output_projection_see_the_forwards_shapes_during_beam_search():
    """A hook on the output projection makes the search call it, with (rows, 1, d_model) as the forward does."""
    ours = from_marian(marian_that_stops())
    expected = ours.generate(**padded_sources(), **BEAM_CASES["paper"])
    shapes = []
    ours.lm_head.register_forward_hook(lambda module, inputs, output: shapes.append((inputs[0].shape, output.shape)))
    assert torch.equal(ours.generate(**padded_sources(), **BEAM_CASES["paper"]), expected)
    assert shapes and all(len(given) == 3 and given[1] == 1 and made == (*given[:2], VOCAB) for given, made in shapes)


@pytest.mark.parametrize("logits_to_keep", [1, 3, torch.tensor([0, 4])])
@torch.no_grad()
def test_logits_to_keep_gives_those_positions_of_the_whole_projection(logits_to_keep):
    """transformers' contract: the last N positions (an int), or the positions a tensor lists."""
    ours = from_marian(marian_that_stops())
    inputs = dict(**padded_sources(sentences=3), decoder_input_ids=torch.randint(4, VOCAB, (3, 5)))
    whole = ours(**inputs).logits
    kept = ours(**inputs, logits_to_keep=logits_to_keep).logits
    positions = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    torch.testing.assert_close(kept, whole[:, positions])
    assert ours._supports_logits_to_keep()  # generate() asks for the last position only


# --- the loss ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loss_and_gradient_equal_cross_entropy_with_label_smoothing(smoothing, dtype):
    generator = torch.Generator().manual_seed(0)
    vocabulary = 3000  # 87 rows per chunk: the 3 x 70 rows below cross chunk boundaries
    logits = (torch.randn(3, 70, vocabulary, generator=generator) * 3).to(dtype).requires_grad_()
    labels = torch.randint(0, vocabulary, (3, 70), generator=generator)
    labels[0, 50:] = -100
    labels[2, 5] = -100
    reference = logits.detach().float().requires_grad_()
    expected = torch.nn.functional.cross_entropy(
        reference.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=smoothing
    )
    (2 * expected).backward()
    loss = label_smoothed_cross_entropy(logits, labels, label_smoothing=smoothing)
    (2 * loss).backward()  # a scaled loss scales the gradient
    # bfloat16: the reference takes the same rounded logits in float32, so the loss differs only by the kernel's
    # float32 sums, and each gradient entry by its rounding to bfloat16 (2^-8 of itself); a tolerance in absolute
    # terms would pass any gradient here, whose entries are at most about 0.01
    rounding = 1e-5 if dtype == torch.float32 else 2**-8
    torch.testing.assert_close(loss.float(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(
        logits.grad.float(), reference.grad, atol=rounding * reference.grad.abs().max(), rtol=rounding
    )
    assert (logits.grad.float() - reference.grad).norm() <= rounding * reference.grad.norm()
    assert logits.grad.dtype == dtype


def test_loss_divides_by_num_items_in_batch_and_needs_no_gradient_in_eval():
    logits = torch.randn(2, 4, 50)
    labels = torch.randint(0, 50, (2, 4))
    total = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), reduction="sum", label_smoothing=0.1
    )
    with torch.no_grad():
        loss = label_smoothed_cross_entropy(logits, labels, torch.tensor(20), label_smoothing=0.1)
    torch.testing.assert_close(loss, total / 20)


# --- dropout ----------------------------------------------------------------------------------------


def test_dropout_keeps_each_unit_with_probability_1_minus_p_and_scales_it():
    torch.manual_seed(0)
    dropout = UniformMaskDropout(0.3).train()
    inputs = torch.full((1000, 1000), 2.0, requires_grad=True)
    outputs = dropout(inputs)
    kept = outputs != 0
    # binomial: 10^6 draws with p = 0.7, standard deviation 458 units; allow 5 of them
    assert abs(kept.sum().item() - 700_000) < 5 * 458
    assert torch.equal(outputs[kept], torch.full((kept.sum().item(),), 2.0 / 0.7))
    outputs.sum().backward()
    assert torch.equal(inputs.grad, kept.float() / 0.7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_of_half_precision_units_keeps_each_with_probability_1_minus_p(dtype, p):
    """Under autocast the sub-layer outputs are bf16: uniforms drawn in bf16 take about 1.7k values in [0, 1), and
    ``u >= 0.1`` held for 89.8% of them. The reference is §5.4's rate, as a binomial."""
    torch.manual_seed(0)
    units = 4_000_000
    outputs = UniformMaskDropout(p).train()(torch.ones(units, dtype=dtype))
    assert outputs.dtype == dtype
    kept = (outputs != 0).sum().item()
    assert abs(kept - (1 - p) * units) < 5 * (p * (1 - p) * units) ** 0.5
    assert torch.equal(outputs.unique(), torch.tensor([0, 1 / (1 - p)], dtype=dtype))


def test_dropout_is_the_identity_in_eval_and_at_p_0():
    inputs = torch.randn(5, 7)
    assert UniformMaskDropout(0.3).eval()(inputs) is inputs
    assert torch.equal(UniformMaskDropout(0.0).train()(inputs), inputs)


# --- compiled paths --------------------------------------------------------------------------------


def tiny_model() -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=64, dropout=0.0)
    return VanillaTransformerForConditionalGeneration(config)


@pytest.mark.slow
def test_a_compiled_training_step_equals_the_eager_one():
    inputs = padded_sources()
    labels = torch.randint(4, VOCAB, (6, 7), generator=torch.Generator().manual_seed(9))
    gradients = []
    for compiled in (False, True):
        model = tiny_model().train()
        forward = torch.compile(model) if compiled else model
        logits = forward(**inputs, decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels)).logits
        loss = label_smoothed_cross_entropy(logits, labels, label_smoothing=0.1)
        loss.backward()
        gradients.append((loss.detach(), {name: p.grad for name, p in model.named_parameters()}))
    torch.testing.assert_close(gradients[1][0], gradients[0][0], atol=1e-5, rtol=1e-5)
    for name, grad in gradients[0][1].items():
        torch.testing.assert_close(gradients[1][1][name], grad, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_beam_search_with_a_static_cache_under_torch_compile_equals_eager():
    model = tiny_model().eval()
    inputs = padded_sources()
    settings = dict(num_beams=4, max_new_tokens=8)
    eager = model.generate(**inputs, **settings)
    compiled = copy.deepcopy(model)
    compiled.generation_config.cache_implementation = "static"
    compiled.forward = torch.compile(compiled.forward, fullgraph=True)
    assert torch.equal(compiled.generate(**inputs, **settings), eager)


def test_beam_search_over_a_static_cache_compiles_its_step_where_transformers_would_and_equals_eager():
    """transformers compiles the decoding step over a static cache in greedy search and sampling (on CUDA, or
    with a CompileConfig for every device), not in beam search; ours compiles it for beam search too, with the
    generation config's CompileConfig (dynamo's eager backend here: the graphs, not inductor's code; inductor
    gave the same hypotheses on this CPU, 2026-11-29), once for the calls after it, the first step uncompiled as
    transformers leaves it. The hypotheses are the dynamic cache's; the model's forward is its own again after each
    call; a forward the user compiled is kept."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    torch._dynamo.reset()
    counters.clear()
    model = tiny_model().eval()
    inputs, settings = padded_sources(), dict(num_beams=4, max_new_tokens=8, min_new_tokens=8)
    expected = model.generate(**inputs, **settings)
    assert torch.equal(model.generate(**inputs, **settings, cache_implementation="static"), expected)
    assert counters["stats"]["unique_graphs"] == 0  # on a CPU without a CompileConfig: uncompiled, as transformers
    config = CompileConfig(backend="eager", mode=None)
    config._compile_all_devices = True  # transformers' switch for devices other than CUDA
    model.generation_config.compile_config = config
    for call in range(2):
        produced = model.generate(**inputs, **settings, cache_implementation="static", return_dict_in_generate=True)
        assert torch.equal(produced.sequences, expected), call
        assert "forward" not in vars(model)  # the class's own again
        if call == 0:
            graphs = counters["stats"]["unique_graphs"]
            assert graphs >= 1
        # the first step ran uncompiled, so the buffers it made are marked for CUDA graphs (a traced step's are not)
        cache = getattr(produced, "cache", None) or produced.past_key_values
        for part in (cache.self_attention_cache, cache.cross_attention_cache):
            assert all(hasattr(layer.keys, "_dynamo_static_input_type") for layer in part.layers)
    assert counters["stats"]["unique_graphs"] == graphs  # the second call compiled nothing more
    own = copy.deepcopy(model)
    own.forward = own.forward  # as a user who compiled it would have set it
    before = counters["stats"]["calls_captured"]
    assert torch.equal(own.generate(**inputs, **settings, cache_implementation="static"), expected)
    assert counters["stats"]["calls_captured"] == before and own.forward.__self__ is own


@pytest.mark.parametrize("kept", ["output_attentions", "output_hidden_states"])
def test_beam_search_that_returns_each_steps_attentions_or_states_decodes_uncompiled(kept):
    """Beam search keeps every step's attentions or hidden states where the call returns them; a CUDA graph's
    replay overwrites the outputs of the one before, and torch refuses to read them then: such a call decoded by
    the compiled step failed on CUDA once it read them. It decodes uncompiled (the hypotheses the same)."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    torch._dynamo.reset()
    counters.clear()
    model = tiny_model().eval()
    inputs, settings = padded_sources(), dict(num_beams=4, max_new_tokens=6, min_new_tokens=6)
    expected = model.generate(**inputs, **settings)
    config = CompileConfig(backend="eager", mode=None)
    config._compile_all_devices = True  # as on CUDA: a static cache compiles the step
    model.generation_config.compile_config = config
    produced = model.generate(
        **inputs, **settings, cache_implementation="static", return_dict_in_generate=True, **{kept: True}
    )
    assert counters["stats"]["unique_graphs"] == 0 and torch.equal(produced.sequences, expected)
    steps = produced.decoder_attentions if kept == "output_attentions" else produced.decoder_hidden_states
    assert len(steps) == 6
    model.generate(**inputs, **settings, cache_implementation="static", return_dict_in_generate=True)
    assert counters["stats"]["unique_graphs"] >= 1  # the same call without them: compiled


def test_a_static_cache_is_reordered_in_place_for_the_graphs_that_read_it():
    """Beam search reorders the decoder's cache at every step; a static cache's own reorder makes new tensors,
    where a recorded CUDA graph would read the old ones: ours copies the reordered rows into the same buffers,
    equal to the cache's own reorder."""
    from transformers.cache_utils import EncoderDecoderCache, StaticCache

    model = tiny_model().eval()
    config, decoder = model.config, model.config.get_text_config(decoder=True)  # the latter as generate() builds
    caches = [
        EncoderDecoderCache(StaticCache(decoder, max_cache_len=6), StaticCache(decoder, max_cache_len=6))
        for _ in range(2)
    ]
    generator = torch.Generator().manual_seed(3)
    heads, width = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
    for layer in range(config.decoder_layers):
        keys, values = (torch.randn(4, heads, 2, width, generator=generator) for _ in range(2))
        for cache in caches:
            cache.self_attention_cache.update(keys, values, layer, {"cache_position": torch.arange(2)})
    beam_idx = torch.tensor([2, 2, 0, 3])
    buffers = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in caches[0].self_attention_cache.layers]
    model._reorder_cache(caches[0], beam_idx)
    caches[1].self_attention_cache.reorder_cache(beam_idx)  # the cache's own
    for ours, theirs, (keys, values) in zip(
        caches[0].self_attention_cache.layers, caches[1].self_attention_cache.layers, buffers
    ):
        assert (ours.keys.data_ptr(), ours.values.data_ptr()) == (keys, values)
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)


# --- int8 -------------------------------------------------------------------------------------------


def test_bfloat16_weights_decode_through_generate_with_float32_beam_scores():
    """The benchmark's bfloat16 lever: every weight in bfloat16, the beam scores still float32; on this
    small model the hypotheses' first tokens equal float32's."""
    from helpers import load_script

    model = from_marian(marian_that_stops())
    half = load_script("benchmarks/decoding.py").bfloat16(model)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16} and model.dtype == torch.float32
    inputs = padded_sources()
    produced = half.generate(**inputs, **BEAM_CASES["paper"], output_scores=True, return_dict_in_generate=True)
    expected = model.generate(**inputs, **BEAM_CASES["paper"])
    assert produced.sequences_scores.dtype == torch.float32
    assert produced.sequences.shape[0] == expected.shape[0] and torch.equal(produced.sequences[:, :2], expected[:, :2])
    assert_close_log_probabilities(half, model, inputs, expected, 1e-2)  # 0.1% measured


def assert_close_log_probabilities(lower, model, inputs, hypotheses, tolerance: float) -> None:
    """``lower``'s (reduced-precision) log-probabilities of ``hypotheses``, teacher-forced, within ``tolerance``
    of the float32 model's, relative to their norm: rounding moves them by a fraction of a percent, a wrong
    weight (a lost scale, a zeroed projection) by far more."""
    with torch.no_grad():
        reference = model(**inputs, decoder_input_ids=hypotheses).logits.log_softmax(-1)
        lowered = lower(**inputs, decoder_input_ids=hypotheses).logits.float().log_softmax(-1)
    assert (lowered - reference).norm() <= tolerance * reference.norm()


def test_dynamic_int8_quantisation_is_a_one_liner_that_generate_accepts():
    model = from_marian(marian_that_stops())
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
    assert all(
        "quantized" in type(module).__module__
        for module in (quantized.lm_head, quantized.model.encoder.layers[0].feed_forward.fc1)
    )
    inputs = padded_sources()
    produced = quantized.generate(**inputs, **BEAM_CASES["paper"])
    expected = model.generate(**inputs, **BEAM_CASES["paper"])
    assert produced.shape[0] == expected.shape[0] and torch.equal(produced[:, :2], expected[:, :2])
    assert_close_log_probabilities(quantized, model, inputs, expected, 2e-2)  # 0.3% measured
