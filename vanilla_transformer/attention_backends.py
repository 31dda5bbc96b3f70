"""Which fused kernel runs each attention call (§3.2.1, scaled dot-product attention) on a CUDA GPU.

PyTorch's ``scaled_dot_product_attention`` picks one of several kernels for each call by a fixed
priority. On Hopper GPUs it prefers cuDNN's attention, which builds an execution plan for each new
(batch, heads, query length, key length) shape and caches it: about 0.3-1 s for forward and backward
together, paid again at every shape it has not seen (pytorch/pytorch#138522, #162073, #171627,
#155958; transformers#48163). cuDNN is left out of every use:

- training: measured on an NVIDIA H200 (2026-11-27, torch 2.11.0+cu130, commit 596b346,
  docs/benchmarks/gpu.md), cuDNN first made the first pass over a run's batch shapes 3.6x slower than
  the same batches again (37.7k against 151.5k target tokens/s for the big model) and the steady state
  4% slower than without it (151.5k against 158.6k). Flash attention (no mask) and memory-efficient
  attention (any mask) take no plan per shape.
- anything else (evaluation, ``generate()``, translating): batch and sentence lengths are whatever the
  input brings, and a decoding step's key length grows by one at every step, so every call could be
  a new plan.

The choice is one table, `BACKENDS`, keyed by (training or not, the use of the attention), so that a
measurement (``benchmarks/gpu.py`` on a GPU) can change it in one place. It applies only to the
``sdpa`` attention implementation on CUDA tensors: in training also under ``torch.compile`` (dynamo records
the choice in the graph, so that a compiled lever, ``--compile_layers`` or ``--cuda_graphs``, differs from
the eager step by its compilation alone), and elsewhere but in the compiled decoding over a static cache,
whose shapes are fixed (it keeps torch's own order, as measured on an H100 on 2026-11-27); eager, flex,
``output_attentions`` and every CPU call run exactly as before (flex attention on the CPU first checks that
torch can build its kernel). This file is flat and imports nothing beyond torch and packaging (a dependency of
transformers), so that it travels with the model as Hub remote code.
"""

from __future__ import annotations

import functools
import inspect

import torch
from packaging.version import Version
from torch.nn.attention import SDPBackend, sdpa_kernel

from .private_api import require

# Reads the attention implementation in use (private: checked at import)
require("transformers.PretrainedConfig._attn_implementation")

CUDNN, FLASH, EFFICIENT, MATH = (
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)

# The uses of attention in the model (§3.2.3).
ENCODER = "encoder self-attention"  # with the source's padding mask
DECODER = "decoder self-attention"  # causal, over a whole target (training, scoring)
CROSS = "cross-attention"  # decoder queries over the encoder output, with its padding mask
DECODING = "decoding with a cache"  # a few new query positions over the cached keys

# (training, use) -> backends in order of preference; MATH last, so that every call has one that takes it.
BACKENDS: dict[tuple[bool, str], tuple[SDPBackend, ...]] = {
    (training, use): (FLASH, EFFICIENT, MATH)
    for training in (True, False)
    for use in (ENCODER, DECODER, CROSS, DECODING)
}

# The kernels by name, for a choice of the first one in training (train.py --training_attention; not measured
# against the default but for cuDNN, see above): ``benchmarks/gpu.py --levers`` compares each as a row.
KERNELS = {"cudnn": CUDNN, "flash": FLASH, "efficient": EFFICIENT, "math": MATH}
DEFAULT_BACKENDS = dict(BACKENDS)


def prefer_in_training(kernel: str) -> None:
    """Put the kernel named ``kernel`` (a key of `KERNELS`, or "default" for the table as measured) first for
    every use in training, the others after it in the default order; decoding and evaluation keep theirs."""
    if kernel != "default" and kernel not in KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; choose one of default, {', '.join(KERNELS)}.")
    for (training, use), default in DEFAULT_BACKENDS.items():
        if training:
            first = () if kernel == "default" else (KERNELS[kernel],)
            BACKENDS[training, use] = first + tuple(backend for backend in default if backend not in first)


_SETS_PRIORITY = "set_priority" in inspect.signature(sdpa_kernel).parameters  # torch >= 2.6

# Flex attention on the CPU compiles a C++ kernel that torch 2.7.0 (the package's torch floor) and 2.8.0 fail to
# build (C++ errors, 2026-11-27); torch 2.9.0 builds and runs it (tests/test_modeling.py's flex tests).
CPU_FLEX_ATTENTION_TORCH = "2.9.0"


def torch_version() -> str:
    return str(torch.__version__)


def check_flex_attention_on_cpu(option: str) -> None:
    """A one-line ``ValueError`` where flex attention on the CPU needs a newer torch than the installed one;
    ``option`` names what asked for it, as the user wrote it (``--attn_implementation flex_attention``)."""
    installed = torch_version()
    if Version(installed).release < Version(CPU_FLEX_ATTENTION_TORCH).release:
        raise ValueError(
            f"{option}: flex attention on the CPU needs torch >= {CPU_FLEX_ATTENTION_TORCH} (the compiled "
            f"kernel of torch {installed} fails to build); pip install 'torch>={CPU_FLEX_ATTENTION_TORCH}' "
            "or use attn_implementation='sdpa'."
        )


def attention_use(module, hidden_states: torch.Tensor, cache) -> str:
    """Which of the uses in `BACKENDS` a call of ``module`` (a VanillaTransformerAttention) on
    ``hidden_states`` (B, T, d_model) is. Decoding: the layer's self-attention cache holds keys of
    earlier steps besides this call's T positions (the self-attention has run, and cached, first)."""
    if cache is not None and cache.get_seq_length(module.layer_idx) > hidden_states.shape[-2]:
        return DECODING
    if module.is_cross_attention:
        return CROSS
    return DECODER if module.is_causal else ENCODER


def chosen_backends(module, hidden_states: torch.Tensor, cache) -> tuple[SDPBackend, ...] | None:
    """The backends a call should be limited to, or None where the choice is left to torch (not sdpa, not
    CUDA, the compiled decoding over a static cache)."""
    if not _applies(module, hidden_states, cache):
        return None
    training = module.training and torch.is_grad_enabled()
    return BACKENDS[training, attention_use(module, hidden_states, cache)]


def _applies(module, hidden_states, cache) -> bool:
    """sdpa on CUDA, but for the compiled decoding over a static cache (fixed shapes: torch's own order, as
    measured). Layers compiled for training (--compile_layers) still evaluate and decode with the table: those
    shapes are what the input brings."""
    training = module.training and torch.is_grad_enabled()
    static_decoding = torch.compiler.is_compiling() and getattr(cache, "is_compileable", False)
    return (
        module.config._attn_implementation == "sdpa"
        and hidden_states.device.type == "cuda"
        and (training or not static_decoding)
    )


def with_chosen_backends(attention, module, hidden_states: torch.Tensor, cache):
    """``attention`` itself, or, where `chosen_backends` has a choice, ``attention`` called under it."""
    if module.config._attn_implementation == "flex_attention" and hidden_states.device.type == "cpu":
        check_flex_attention_on_cpu("attn_implementation='flex_attention'")
    backends = chosen_backends(module, hidden_states, cache)
    if backends is None:
        return attention
    return functools.partial(_call_with_backends, attention, list(backends))


def _call_with_backends(attention, backends: list, *args, **kwargs):
    with sdpa_kernel(backends, set_priority=True) if _SETS_PRIORITY else sdpa_kernel(backends):
        return attention(*args, **kwargs)


__all__ = [
    "BACKENDS",
    "CPU_FLEX_ATTENTION_TORCH",
    "CROSS",
    "DECODER",
    "DECODING",
    "ENCODER",
    "KERNELS",
    "attention_use",
    "check_flex_attention_on_cpu",
    "chosen_backends",
    "prefer_in_training",
    "with_chosen_backends",
]
