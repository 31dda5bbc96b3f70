"""vanilla_transformer.attention_backends: which SDPA kernels each attention call may use on a GPU.

No GPU here: the decisions are checked on the CPU by letting the choice apply to CPU calls (where
flash and math attention run), against the uses the model's structure says each call has, and the
outputs against the same model without any choice."""

import types

import pytest
import torch

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer import attention_backends as backends
from vanilla_transformer.attention_backends import BACKENDS, CROSS, CUDNN, DECODER, DECODING, ENCODER, MATH


def tiny_model(implementation="sdpa"):
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=50, dropout=0.0)
    return VanillaTransformerForConditionalGeneration._from_config(config, attn_implementation=implementation)


def inputs():
    input_ids = torch.randint(4, 50, (3, 7))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0  # padding: the encoder's and cross-attention's masks are not all ones
    return {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": torch.randint(4, 50, (3, 5))}


@pytest.fixture
def applied_on_cpu(monkeypatch):
    """Let the choice apply to CPU calls, recording (training, use) of each call."""
    calls = []
    use = backends.attention_use
    monkeypatch.setattr(
        backends, "_applies", lambda module, hidden_states, cache: module.config._attn_implementation == "sdpa"
    )

    def recorded(module, hidden_states, cache):
        calls.append((module.training and torch.is_grad_enabled(), use(module, hidden_states, cache)))
        return calls[-1][1]

    monkeypatch.setattr(backends, "attention_use", recorded)
    return calls


def test_no_use_plans_cudnn_attention_per_shape():
    """Measured on an H200 (docs/benchmarks/gpu.md, 2026-11-27): cuDNN first in training made the first pass over
    new batch shapes 3.6x slower and the steady state 4% slower; no use of attention takes it."""
    assert set(BACKENDS) == {
        (training, use) for training in (True, False) for use in (ENCODER, DECODER, CROSS, DECODING)
    }
    for choice in BACKENDS.values():
        assert choice[-1] == MATH  # every call has a kernel that takes it
        assert CUDNN not in choice


def test_each_call_of_a_training_step_is_classified_by_its_use(applied_on_cpu):
    model = tiny_model().train()
    model(**inputs())  # a forward with a cache (use_cache), as in training: nothing earlier in it
    layers = model.config.encoder_layers
    assert applied_on_cpu == [(True, ENCODER)] * layers + [(True, DECODER), (True, CROSS)] * model.config.decoder_layers


def test_decoding_steps_are_classified_as_decoding_with_a_cache(applied_on_cpu):
    model = tiny_model().eval()
    batch = inputs()
    with torch.no_grad():
        model.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            num_beams=1,
            do_sample=False,
            max_new_tokens=4,
            min_new_tokens=4,
        )
    uses = [use for training, use in applied_on_cpu]
    assert not any(training for training, _ in applied_on_cpu)
    decoder_layers = model.config.decoder_layers
    first_step = (
        2 * decoder_layers
    )  # the first step's self-attention has no earlier keys; cross-attention fills the cache
    assert uses[: model.config.encoder_layers] == [ENCODER] * model.config.encoder_layers
    assert set(uses[model.config.encoder_layers + first_step :]) == {DECODING}


def test_outputs_are_the_same_with_the_chosen_kernels(applied_on_cpu):
    batch = inputs()
    model = tiny_model().eval()
    chosen = model(**batch).logits
    assert applied_on_cpu  # the choice did apply
    applied_on_cpu.clear()
    backends._applies = lambda module, hidden_states, cache: False  # monkeypatch restores it
    plain = model(**batch).logits
    assert not applied_on_cpu
    torch.testing.assert_close(chosen, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "training, cache",
    [(True, None), (False, None), (False, "dynamic"), (False, "static")],
    ids=["training", "evaluation", "dynamic-cache", "static-cache"],
)
def test_under_torch_compile_only_the_static_cache_decoding_leaves_the_choice_to_torch(training, cache, monkeypatch):
    """A compiled lever row must differ from the eager step by its compilation alone, so training keeps the
    table under torch.compile (dynamo records the choice in the graph: test below). Layers compiled for training
    (--compile_layers) evaluate and decode compiled too, over shapes the input brings: the table, as eager (they
    took torch's order, cuDNN first on Hopper: a plan per new shape). The compiled decoding over a static cache,
    fixed shapes, keeps torch's own order, as it was measured."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache

    model = tiny_model("sdpa")
    module = model.model.decoder.layers[0].self_attention.train(training)
    decoder = model.config.get_text_config(decoder=True)
    made = {
        None: None,
        "dynamic": EncoderDecoderCache(DynamicCache(), DynamicCache()),
        "static": EncoderDecoderCache(StaticCache(decoder, max_cache_len=8), StaticCache(decoder, max_cache_len=8)),
    }[cache]
    on_cuda = types.SimpleNamespace(device=torch.device("cuda"), shape=(1, 3, 64))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    chosen = backends.chosen_backends(module, on_cuda, made)
    assert chosen == (None if cache == "static" else backends.BACKENDS[training, backends.DECODER])


def test_dynamo_records_the_kernel_choice_in_the_graph_without_a_break():
    """What the above relies on: `sdpa_kernel` (with its priority) traced into the compiled graph, no break."""
    import torch._dynamo

    def attend(q):
        with backends.sdpa_kernel(list(backends.BACKENDS[True, backends.ENCODER]), set_priority=True):
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    explained = torch._dynamo.explain(attend)(torch.randn(1, 2, 4, 8))
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    assert "_sdpa_kernel" in explained.graphs[0].code


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_only_sdpa_calls_on_cuda_tensors_get_a_choice(implementation):
    module = tiny_model(implementation).model.encoder.layers[0].self_attention
    on_cuda = types.SimpleNamespace(device=torch.device("cuda"), shape=(1, 3, 64))
    expected = implementation == "sdpa"
    assert (backends.chosen_backends(module, on_cuda, None) is not None) == expected
    on_cpu = torch.zeros(1, 3, 64)
    assert backends.chosen_backends(module, on_cpu, None) is None
    attention = object()
    assert backends.with_chosen_backends(attention, module, on_cpu, None) is attention
