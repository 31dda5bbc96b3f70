"""The speed levers of issue 19 change nothing but speed.

References: MarianMTModel's generate() (transformers' beam search on another implementation of the same
weights), transformers' own `_beam_search` on our model, a brute-force top-k, the
unfolded (per-beam) cross-attention, PyTorch's ``cross_entropy(label_smoothing=...)`` and its autograd,
the binomial law of a dropout mask, and the eager model for the compiled paths.
"""

import copy

import pytest
import torch
from transformers import GenerationMixin, MarianConfig, MarianMTModel

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.convert import from_marian
from vanilla_transformer.modeling_vanilla_transformer import (
    BeamSearch,
    Dropout,
    best_continuations,
    PREPACKED,
    label_smoothed_cross_entropy,
    prepack,
    prepacked_linear,
)

VOCAB, PAD, EOS, START = 40, 0, 3, 0


def marian_that_stops(seed: int = 0, eos_bias: float = 1.2) -> MarianMTModel:
    """A random MarianMTModel whose final_logits_bias makes </s> likely, so that beams and sentences
    end at different steps (random weights alone almost never emit </s>)."""
    torch.manual_seed(seed)
    marian = MarianMTModel(MarianConfig(
        vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=128, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=START,
        forced_eos_token_id=None, activation_function="relu", scale_embedding=True, init_std=0.1,
    )).eval()
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
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    return rows


# --- beam search ------------------------------------------------------------------------------------

BEAM_CASES = {
    "paper": dict(num_beams=4, length_penalty=0.6, early_stopping=True, max_new_tokens=12),
    "not-early": dict(num_beams=4, length_penalty=0.6, early_stopping=False, max_new_tokens=12),
    "never": dict(num_beams=4, length_penalty=0.6, early_stopping="never", max_new_tokens=12),
    "returns-3": dict(num_beams=4, num_return_sequences=3, length_penalty=-0.5, max_new_tokens=12),
    "min-length": dict(num_beams=4, min_new_tokens=4, max_new_tokens=12, length_penalty=0.6),
}


SENTENCES_END_EARLY = {"paper", "returns-3"}


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


def test_the_papers_decoding_is_served_by_our_beam_search(monkeypatch):
    """generate() hands the cache over under the installed transformers' name (5.24 renamed it to
    `cache`); were it looked for under another, the call would silently go to transformers' search."""
    served = []
    run = BeamSearch.run
    monkeypatch.setattr(BeamSearch, "run", lambda search: served.append(search) or run(search))
    ours = from_marian(marian_that_stops())
    ours.generate(**padded_sources(), **BEAM_CASES["paper"])
    assert len(served) == 1


@pytest.mark.parametrize("case", ["paper", "returns-3"])
def test_beam_search_equals_transformers_own_on_our_model(case):
    ours = from_marian(marian_that_stops(seed=2))
    inputs = padded_sources(seed=3)
    expected = copy.deepcopy(ours)

    class Stock(VanillaTransformerForConditionalGeneration):
        _beam_search = GenerationMixin._beam_search

    expected.__class__ = Stock
    assert torch.equal(ours.generate(**inputs, **BEAM_CASES[case]), expected.generate(**inputs, **BEAM_CASES[case]))


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


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [2, 7, 40])
def test_prepacked_products_equal_x_w_transposed_and_serve_only_float32_cpu_inference_in_the_search(rows, bias):
    """x W^T + b (the formula) from the copy `prepack` reordered, while a search has it in `PREPACKED`; the
    layer's own forward otherwise: outside a search, in training (with its gradient), in float64."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 24, bias=bias)
    states = torch.randn(rows, 1, 32)
    expected = states.double() @ linear.weight.double().T + (linear.bias.double() if bias else 0)
    with torch.no_grad():
        assert torch.equal(prepacked_linear(linear, states), linear(states))  # no search running
        packed = prepack([linear], 128)  # reordered for 128 rows, as a search's first call might be: any count works
        assert list(packed) == [linear]
        weight = linear.weight.clone()
        linear.weight.zero_()  # the reordered copy is what multiplies now: the plain weight no longer counts
    token = PREPACKED.set(packed)
    try:
        with torch.no_grad():
            product = prepacked_linear(linear, states)
            assert product.shape == (rows, 1, 24) and torch.allclose(product.double(), expected, atol=1e-5)
            assert torch.equal(prepacked_linear(linear.double(), states.double()), linear(states.double()))
            linear.float()
        trained = prepacked_linear(linear, states.requires_grad_())  # autograd on: nn.Linear, gradient and all
        assert torch.equal(trained, linear(states))
        trained.sum().backward()
        assert torch.allclose(linear.weight.grad, states.detach().sum(dim=(0, 1)).expand(24, 32), atol=1e-5)
    finally:
        PREPACKED.reset(token)
    with torch.no_grad():
        linear.weight.copy_(weight)


def test_prepack_leaves_layers_that_run_more_than_nn_linear_or_run_elsewhere_to_their_forward():
    """Nothing is reordered for a hooked or patched layer, a quantised one, float64 weights, or under autocast."""
    if not torch.backends.mkldnn.is_available():
        assert prepack([torch.nn.Linear(8, 4)], 4) == {}
        return
    plain, hooked, patched, wide = (torch.nn.Linear(8, 4) for _ in range(4))
    hooked.register_forward_pre_hook(lambda *args: None)
    patched.forward = lambda inputs: inputs
    quantised = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(8, 4)), {torch.nn.Linear})[0]
    assert list(prepack([plain, hooked, patched, quantised, wide.double()], 4)) == [plain]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert prepack([plain], 4) == {}
    with torch.backends.mkldnn.flags(enabled=False):  # oneDNN switched off by the user
        assert prepack([plain], 4) == {}


def test_the_model_compiles_as_one_graph_with_the_prepacked_products_in_it():
    """`FeedForward` and the search's output projection go through `prepacked_linear`, which compiled code must
    trace whole (transformers compiles the forward with fullgraph=True for static caches)."""
    ours = from_marian(marian_that_stops())
    batch = padded_sources()
    compiled = torch.compile(ours.forward, fullgraph=True, backend="eager")
    with torch.no_grad():
        expected = ours(**batch, decoder_input_ids=batch["input_ids"][:, :4]).logits
        assert torch.equal(compiled(**batch, decoder_input_ids=batch["input_ids"][:, :4]).logits, expected)


def test_the_search_multiplies_by_prepacked_weights_only_while_it_runs():
    """generate() leaves no reordered weights behind, also when it fails: after it, the layers multiply by
    their own weights."""
    ours = from_marian(marian_that_stops())
    expected = ours.generate(**padded_sources(), **BEAM_CASES["paper"])
    assert PREPACKED.get() is None
    steps = []

    def fail_at_the_third_step(*args):
        steps.append(1)
        if len(steps) == 3:
            raise KeyboardInterrupt

    handle = ours.model.decoder.register_forward_pre_hook(fail_at_the_third_step)
    with pytest.raises(KeyboardInterrupt):
        ours.generate(**padded_sources(), **BEAM_CASES["paper"])
    handle.remove()
    assert PREPACKED.get() is None
    seen = []
    ours.model.decoder.register_forward_pre_hook(lambda *args: seen.append(dict(PREPACKED.get())))
    assert torch.equal(ours.generate(**padded_sources(), **BEAM_CASES["paper"]), expected)
    feed_forward = ours.model.decoder.layers[0].feed_forward
    if torch.backends.mkldnn.is_available():  # the FFNs and the output projection, at every step
        assert all(set(packed) == {*(layer.feed_forward.fc1 for layer in ours.model.decoder.layers),
                                   *(layer.feed_forward.fc2 for layer in ours.model.decoder.layers), ours.lm_head}
                   for packed in seen)
    assert PREPACKED.get() is None
    with torch.no_grad():
        states = torch.randn(3, 1, 32)
        assert torch.equal(feed_forward(states), feed_forward.fc2(feed_forward.activation(feed_forward.fc1(states))))


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
        handles.append(torch.nn.modules.module.register_module_forward_hook(
            lambda module, *args: calls.append(1) if module is ours else None))
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


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@torch.no_grad()
def test_beams_sharing_one_encoder_output_equal_one_output_per_beam(implementation):
    ours = from_marian(marian_that_stops(seed=6))
    ours.set_attn_implementation(implementation)
    inputs, beams = padded_sources(seed=7, sentences=3), 4
    encoder_output = ours.get_encoder()(**inputs).last_hidden_state
    decoder_input_ids = torch.randint(4, VOCAB, (3 * beams, 5), generator=torch.Generator().manual_seed(8))
    outputs = {}
    for name, states, mask in (
        ("per beam", encoder_output.repeat_interleave(beams, 0), inputs["attention_mask"].repeat_interleave(beams, 0)),
        ("per sentence", encoder_output, inputs["attention_mask"]),
    ):
        outputs[name] = ours(encoder_outputs=(states,), attention_mask=mask, decoder_input_ids=decoder_input_ids,
                             output_attentions=implementation == "eager")
    torch.testing.assert_close(outputs["per sentence"].logits, outputs["per beam"].logits, atol=1e-5, rtol=1e-5)
    if implementation == "eager":  # attention pictures: one (H, T, S) map per decoder row either way
        for shared, per_beam in zip(outputs["per sentence"].cross_attentions, outputs["per beam"].cross_attentions):
            assert shared.shape == per_beam.shape == (3 * beams, 4, 5, 10)
            torch.testing.assert_close(shared, per_beam, atol=1e-6, rtol=1e-5)


@torch.no_grad()
def test_a_shared_encoder_output_with_flex_attention_is_an_error_not_a_kernel_crash():
    ours = from_marian(marian_that_stops(seed=6))
    ours.set_attn_implementation("flex_attention")
    inputs = padded_sources(seed=7, sentences=3)
    encoder_output = ours.get_encoder()(**inputs).last_hidden_state
    with pytest.raises(ValueError, match="need attn_implementation 'eager' or 'sdpa'"):
        ours(encoder_outputs=(encoder_output,), attention_mask=inputs["attention_mask"],
             decoder_input_ids=torch.full((12, 1), START))


def test_decoder_rows_that_are_not_a_multiple_of_the_sentences_are_an_error():
    ours = from_marian(marian_that_stops())
    inputs = padded_sources(sentences=3)
    encoder_output = ours.get_encoder()(**inputs).last_hidden_state
    with pytest.raises(ValueError, match="7 rows for 3 encoded sentences"):
        ours(encoder_outputs=(encoder_output,), attention_mask=inputs["attention_mask"],
             decoder_input_ids=torch.full((7, 1), START))


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
        reference.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=smoothing)
    (2 * expected).backward()
    loss = label_smoothed_cross_entropy(logits, labels, label_smoothing=smoothing)
    (2 * loss).backward()  # a scaled loss scales the gradient
    tolerance = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(loss, expected, **tolerance)
    torch.testing.assert_close(logits.grad.float(), reference.grad, **tolerance)
    assert logits.grad.dtype == dtype


def test_loss_divides_by_num_items_in_batch_and_needs_no_gradient_in_eval():
    logits = torch.randn(2, 4, 50)
    labels = torch.randint(0, 50, (2, 4))
    total = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum",
                                              label_smoothing=0.1)
    with torch.no_grad():
        loss = label_smoothed_cross_entropy(logits, labels, torch.tensor(20), label_smoothing=0.1)
    torch.testing.assert_close(loss, total / 20)


# --- dropout ----------------------------------------------------------------------------------------


def test_dropout_keeps_each_unit_with_probability_1_minus_p_and_scales_it():
    torch.manual_seed(0)
    dropout = Dropout(0.3).train()
    inputs = torch.full((1000, 1000), 2.0, requires_grad=True)
    outputs = dropout(inputs)
    kept = outputs != 0
    # binomial: 10^6 draws with p = 0.7, standard deviation 458 units; allow 5 of them
    assert abs(kept.sum().item() - 700_000) < 5 * 458
    assert torch.equal(outputs[kept], torch.full((kept.sum().item(),), 2.0 / 0.7))
    outputs.sum().backward()
    assert torch.equal(inputs.grad, kept.float() / 0.7)


def test_dropout_is_the_identity_in_eval_and_at_p_0():
    inputs = torch.randn(5, 7)
    assert Dropout(0.3).eval()(inputs) is inputs
    assert torch.equal(Dropout(0.0).train()(inputs), inputs)


# --- compiled paths (issue 17) ----------------------------------------------------------------------


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


def test_dynamic_int8_quantisation_is_a_one_liner_that_generate_accepts():
    model = from_marian(marian_that_stops())
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
    assert all("quantized" in type(module).__module__ for module in (quantized.lm_head, quantized.model.encoder
                                                                    .layers[0].feed_forward.fc1))
    inputs = padded_sources()
    produced = quantized.generate(**inputs, **BEAM_CASES["paper"])
    expected = model.generate(**inputs, **BEAM_CASES["paper"])
    assert produced.shape[0] == expected.shape[0] and torch.equal(produced[:, 0], expected[:, 0])
