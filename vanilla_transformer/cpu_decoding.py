"""Opt-in CPU decoding speed: the decoder's feed-forward networks and the output projection multiply by
their weights reordered once into oneDNN's blocked layout.

    from vanilla_transformer.cpu_decoding import prepack_for_cpu_decoding
    prepack_for_cpu_decoding(model)  # the one switch; model.generate(...) as before

MKL packs a plain weight again at every product, and at decoding's few rows per step that is a large part
of it (``python benchmarks/prepacked_weights.py`` measures what it saves and costs). The reordering goes
through private torch operators (``torch.ops.mkldnn._reorder_linear_weight``, ``_linear_pointwise``): where
they are missing, switched off or give another product than ``F.linear`` (checked once), the layers keep
multiplying as before. Products under autograd, under ``torch.compile``, in another dtype or on another
device take ``nn.Linear``'s own path, and a weight changed since it was reordered (an optimizer step, a
``load_state_dict``) is reordered again at the next product. Nothing about the model's files changes: the
layers keep their parameters, names, tying and hooks. Not part of the Hub remote code.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from .private_api import require

# A weight changed since it was packed is found through its version counter (private: checked at import)
require("torch.Tensor._version")


def onednn_linear(states: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b over the last dimension of ``states``, W reordered for oneDNN."""
    product = torch.ops.mkldnn._linear_pointwise(states.reshape(-1, states.shape[-1]), packed, bias, "none", [], "")
    return product.view(*states.shape[:-1], product.shape[-1])


@functools.cache
def onednn_linear_works() -> bool:
    """Whether this torch has oneDNN's private linear operators as `onednn_linear` calls them, giving
    `F.linear`'s product (checked once, with fixed values: the global random state stays as it is)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight, bias, states = (
            torch.linspace(-1, 1, n).sin().reshape(shape) for n, shape in ((384, (24, 16)), (24, (24,)), (48, (3, 16)))
        )
        product = onednn_linear(states, torch.ops.mkldnn._reorder_linear_weight(weight, 3), bias)
        return torch.allclose(product, nn.functional.linear(states, weight, bias), atol=1e-4)
    except (AttributeError, RuntimeError, TypeError):
        return False


class PrepackedLinear(nn.Linear):
    """`nn.Linear` whose inference products on float32 CPU tensors use a copy of the weight reordered for
    oneDNN (made at the first such product, made again when the weight changed)."""

    packed: torch.Tensor | None = None
    packed_from: tuple | None = None  # (address, version, tensor) of the weight the copy was made from

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        if (
            torch.is_grad_enabled()
            or torch.compiler.is_compiling()
            or states.dtype != torch.float32
            or self.weight.dtype != torch.float32
            or states.device.type != "cpu"
            or self.weight.device.type != "cpu"
            or not torch.backends.mkldnn.enabled
            or torch.is_autocast_enabled("cpu")
            or self.weight.is_inference()  # made under torch.inference_mode(): it keeps no version to check
        ):
            return super().forward(states)
        weight = self.weight.detach()
        # The tensor itself is kept with its address: a weight replaced by `.data = new` keeps its version
        # counter, and the address of a freed tensor is soon reused, so address and version alone could match
        # a new weight; a tensor still held cannot have its address reused.
        if self.packed_from is None or self.packed_from[:2] != (weight.data_ptr(), self.weight._version):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, max(1, states.numel() // states.shape[-1]))
            self.packed_from = (weight.data_ptr(), self.weight._version, self.weight.data)
        return onednn_linear(states, self.packed, self.bias)


def prepack_for_cpu_decoding(model: nn.Module) -> nn.Module:
    """Make the decoder's FFN layers and the output projection `PrepackedLinear` (in place; returns the model).

    Only plain ``nn.Linear`` layers change (quantised, adapted or subclassed ones keep theirs), and nothing
    does where oneDNN's operators are missing or disagree with ``F.linear``. Undo with `unprepack`.
    """
    if not onednn_linear_works():
        return model
    layers = [
        linear for layer in model.model.decoder.layers for linear in (layer.feed_forward.fc1, layer.feed_forward.fc2)
    ]
    for linear in [*layers, model.get_output_embeddings()]:
        if type(linear) is nn.Linear:
            linear.__class__ = PrepackedLinear
    return model


def unprepack(model: nn.Module) -> nn.Module:
    """Every `PrepackedLinear` of the model back to a plain ``nn.Linear`` (in place; returns the model)."""
    for module in model.modules():
        if type(module) is PrepackedLinear:
            module.__class__ = nn.Linear
            vars(module).pop("packed", None)
            vars(module).pop("packed_from", None)
    return model
