"""The opt-in prepacked weights (`vanilla_transformer.cpu_decoding`) change nothing but speed.

References: the formula x W^T + b in float64, `nn.Linear`'s own forward and gradient, and the hypotheses of
the same model with plain weights.
"""

import copy

import pytest
import torch

from test_speed_levers import BEAM_CASES, marian_that_stops, padded_sources
from vanilla_transformer.convert import from_marian
from vanilla_transformer.cpu_decoding import PrepackedLinear, onednn_linear_works, prepack_for_cpu_decoding, unprepack

needs_onednn = pytest.mark.skipif(not onednn_linear_works(), reason="torch without oneDNN's linear operators")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 40])
def test_prepacked_products_equal_x_w_transposed_and_follow_a_changed_weight(rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 24)
    states = torch.randn(rows, 1, 32)
    linear.__class__ = PrepackedLinear
    for _ in range(2):
        expected = states.double() @ linear.weight.double().T + linear.bias.double()
        with torch.no_grad():
            product = linear(states)
            assert product.shape == (rows, 1, 24) and torch.allclose(product.double(), expected, atol=1e-5)
            linear.weight.mul_(-2)  # an optimizer step: the next product uses the new weight
    trained = linear(states.requires_grad_())  # autograd on: nn.Linear's path, gradient and all
    trained.sum().backward()
    assert torch.allclose(linear.weight.grad, states.detach().sum(dim=(0, 1)).expand(24, 32), atol=1e-5)


@needs_onednn
def test_a_weight_replaced_by_another_tensor_is_packed_anew():
    """`.data = new` keeps the Parameter's version counter, and a freed tensor's address is soon reused: the
    packed copy of the old weight was once used for the new one. The reference: F.linear on the new weight."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 64)
    linear.__class__ = PrepackedLinear
    states = torch.randn(3, 64)
    with torch.no_grad():
        linear(states)
        for _ in range(20):
            for _ in range(2):  # two replacements between products: the second may take the first's freed address
                new = torch.randn(64, 64)
                linear.weight.data = new
                del new
            expected = torch.nn.functional.linear(states, linear.weight, linear.bias)
            assert torch.allclose(linear(states), expected, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("case", ["paper", "min-length"])
def test_the_switch_keeps_the_hypotheses_the_files_and_the_tying_and_undoes(case, tmp_path):
    plain = from_marian(marian_that_stops())
    packed = prepack_for_cpu_decoding(copy.deepcopy(plain))
    layers = [module for module in packed.modules() if type(module) is PrepackedLinear]
    assert len(layers) == 2 * 2 + 1 and packed.lm_head in layers  # two decoder FFNs, and the output projection
    tied = [model.lm_head.weight is model.model.decoder.get_input_embeddings().weight for model in (plain, packed)]
    assert tied[0] == tied[1]  # tied as before, or not
    expected = plain.generate(**padded_sources(), **BEAM_CASES[case])
    assert torch.equal(packed.generate(**padded_sources(), **BEAM_CASES[case]), expected)
    assert packed.state_dict().keys() == plain.state_dict().keys()
    packed.save_pretrained(tmp_path)
    reloaded = type(plain).from_pretrained(tmp_path)
    assert not any(type(module) is PrepackedLinear for module in reloaded.modules())
    assert torch.equal(reloaded.generate(**padded_sources(), **BEAM_CASES[case]), expected)
    unprepack(packed)
    assert not any(type(module) is PrepackedLinear for module in packed.modules())


@needs_onednn
def test_a_model_made_under_inference_mode_decodes_prepacked():
    """Its weights are inference tensors, which keep no version counter: the prepacked check of a changed weight
    raised on the first step ("Inference tensors do not track version counter")."""
    with torch.inference_mode():
        plain = from_marian(marian_that_stops())
        expected = plain.generate(**padded_sources(), **BEAM_CASES["paper"])
    assert plain.lm_head.weight.is_inference()
    packed = prepack_for_cpu_decoding(plain)
    with torch.no_grad():
        assert torch.equal(packed.generate(**padded_sources(), **BEAM_CASES["paper"]), expected)


def test_quantised_layers_keep_their_own_forward():
    quantised = torch.ao.quantization.quantize_dynamic(from_marian(marian_that_stops()), {torch.nn.Linear})
    prepack_for_cpu_decoding(quantised)
    assert not any(type(module) is PrepackedLinear for module in quantised.modules())
