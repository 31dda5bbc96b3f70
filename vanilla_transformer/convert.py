"""Interoperability: import MarianMT checkpoints exactly, export to CTranslate2.

**From MarianMT** (`from_marian`, `convert_marian`). `MarianMTModel` is the paper's post-norm
Transformer with a few differences, each mapped exactly rather than ignored:

- Positions: Marian's sinusoidal table puts all the sines in the first half of the vector and all
  the cosines in the second; §3.5 (and our table) interleaves them. Instead of a config option, every
  weight that reads or writes the residual stream is permuted along the model dimension (token
  embeddings, q/k/v and fc1 inputs, out_proj and fc2 outputs, LayerNorm weights and biases, the
  pre-softmax projection): the converted model then runs Marian's computation with every
  d_model-vector reordered, and LayerNorm does not care about order. Marian's table is checked to be
  the sinusoidal one before relying on it.
- ``final_logits_bias`` (Marian's output-layer bias, ``decoder_ff_logit_out_b``; nonzero in trained
  opus-mt checkpoints): dropped when all zero. Otherwise it is folded exactly into the pre-softmax
  projection, which our model keeps bias-free: the last decoder LayerNorm emits
  ``h = gamma * n + beta`` with ``sum(n) = 0``, so ``w = 1 / (d_model * gamma)`` satisfies
  ``w . h = 1`` for every input once ``beta`` is set to ``gamma``. Then ``E' = E + r w^T`` with
  ``r = b - E (gamma - beta)`` gives ``E' h' = E h + b`` exactly (see `_fold_logits_bias`). The
  price: the projection is untied from the target embedding (one more vocab x d_model matrix), and
  the decoder's last hidden state differs from Marian's by that constant shift (logits do not).
  A LayerNorm weight with an exact zero makes the fold impossible: refused.
- Decoder start: Marian starts from ``<pad>`` (the last id); the ids, ``scale_embedding``,
  ``max_position_embeddings``, the activation (opus-mt uses swish), the dropouts and the LayerNorm
  epsilon (``nn.LayerNorm``'s default 1e-5) are copied; the generation config is copied as is
  (opus-mt's ``num_beams``, ``max_length``, ``bad_words_ids=[[pad]]``...), so that ``generate()``
  decodes as the original did.
- Shared / tied embeddings are read from the tensors Marian actually uses, not from its flags: with
  transformers 5, ``tie_word_embeddings=False`` also unties Marian's encoder and decoder embeddings
  when ``share_encoder_decoder_embeddings=True`` (three separate matrices).

Refused, with an error naming the field: configs that claim an architecture `MarianMTModel` does
not run (legacy ``normalize_before``, ``normalize_embedding``, ``add_final_layer_norm``,
``static_position_embeddings=False``), nonzero ``encoder_layerdrop``/``decoder_layerdrop``, several
eos ids, an odd ``d_model``, a ``decoder_vocab_size`` that disagrees with a shared vocabulary, and a
position table that is not sinusoidal. Marian's tokenizer is sentencepiece-based: `convert_marian`
saves whatever tokenizer it is given with that tokenizer's own ``save_pretrained``.

**To CTranslate2** (`to_ctranslate2`). CTranslate2's `TransformersConverter` only knows registered
model types, so the `ctranslate2.specs.TransformerSpec` is built here: pre- or post-norm, activation,
heads (encoder and decoder separately), ``head_dim``, embedding scale, LayerNorm epsilon, and the
position table set explicitly (ours, sinusoidal interleaved or learned). Decoding starts from our
``decoder_start_token_id`` through the model's ``decoder_start_token`` setting; ``<pad>`` stays an
ordinary vocabulary entry (unlike CTranslate2's Marian loader, which drops it). To decode like
``generate()``, call ``translate_batch(..., beam_size=4, length_penalty=0.6, return_end_token=True,
min_decoding_length=0, max_decoding_length=N)`` with ``generate(..., max_new_tokens=N)``; CTranslate2's
``max_decoding_length`` is the batch's (default 256), where §6.1's rule stops each sentence at its own
length + 50 (give each sentence alone, with N = its length + 50, for that). CTranslate2 has one length penalty, transformers' ``length ** alpha``, not
the paper's GNMT penalty ``((5 + length) / 6) ** alpha`` that our generation config selects
(``length_penalty_formula="gnmt"``): outputs are identical to ``generate(...,
length_penalty_formula="length")``, and can differ from the default in which finished hypothesis
wins. Both libraries then divide the summed log-probability by ``length ** length_penalty``, but
CTranslate2 counts ``</s>`` in the length
only with ``return_end_token=True`` (transformers always counts it), and its default
``min_decoding_length=1`` forbids an immediate ``</s>``. CTranslate2 stops once ``beam_size``
hypotheses have finished, which is ``early_stopping=True`` (the paper's config) in transformers.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer, MarianMTModel

from .checkpoint_files import check_has_tokenizer, check_model_folder, from_pretrained_named, has_tokenizer, is_local
from .command_line import CommandParser, install_command
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, sinusoidal_positions

# ---------------------------------------------------------------------------------------------
# From MarianMT: what we refuse
# ---------------------------------------------------------------------------------------------

# Legacy config fields (kept in opus-mt config.json files) that MarianMTModel ignores: any value other
# than the one it implements means the weights were trained for another architecture.
MARIAN_ARCHITECTURE_FIELDS = {
    "normalize_before": (False, "pre-norm layers"),
    "normalize_embedding": (False, "a LayerNorm after the embeddings (BART's layernorm_embedding)"),
    "add_final_layer_norm": (False, "a LayerNorm after each stack"),
    "static_position_embeddings": (True, "learned position embeddings"),
}


def _refuse_unsupported_marian(config) -> None:
    """Raise ValueError, naming the field, for every Marian variant we cannot convert exactly."""
    fields = config.to_dict()
    for name, (supported, meaning) in MARIAN_ARCHITECTURE_FIELDS.items():
        if name in fields and fields[name] != supported:
            raise ValueError(
                f"Marian config has {name}={fields[name]!r}, which means {meaning}; MarianMTModel (and this "
                f"converter) implement only {name}={supported!r}, so these weights cannot be converted exactly."
            )
    for name in ("encoder_layerdrop", "decoder_layerdrop"):
        if fields.get(name):
            raise ValueError(
                f"Marian config has {name}={fields[name]}; the Transformer has no LayerDrop. Set "
                f"config.{name} = 0 on the Marian model first if you accept losing it (it only acts in training)."
            )
    if isinstance(config.eos_token_id, list) and len(config.eos_token_id) != 1:
        raise ValueError(f"Marian config has several eos_token_id {config.eos_token_id}; the Transformer has one.")
    if config.d_model % 2:
        raise ValueError(
            f"Marian config has an odd d_model={config.d_model}: its sinusoidal table then has one more sine "
            f"than cosines, which §3.5's sin/cos pairs cannot express."
        )


def _single_eos(eos_token_id) -> int | None:
    return eos_token_id[0] if isinstance(eos_token_id, list) else eos_token_id


# ---------------------------------------------------------------------------------------------
# From MarianMT: positions and the residual-stream permutation
# ---------------------------------------------------------------------------------------------


def marian_to_interleaved(d_model: int) -> torch.Tensor:
    """Indices p with ``ours = marian[..., p]``: Marian's [sin_0..sin_h-1, cos_0..cos_h-1] -> [sin_0, cos_0, ...]."""
    half = torch.arange(d_model // 2)
    return torch.stack([half, half + d_model // 2], dim=1).flatten()  # (d_model,)


def _check_positions(marian: MarianMTModel) -> None:
    """Refuse a Marian position table that is not §3.5's table in Marian's layout."""
    permutation = marian_to_interleaved(marian.config.d_model)
    for where, stack in (("encoder", marian.model.encoder), ("decoder", marian.model.decoder)):
        table = stack.embed_positions.weight.detach().cpu()
        tolerance = max(1e-5, torch.finfo(table.dtype).eps)  # a float16 Marian stores a rounded table
        if not torch.allclose(table.float()[:, permutation], sinusoidal_positions(*table.shape), atol=tolerance):
            raise ValueError(
                f"Marian's {where}.embed_positions.weight is not the sinusoidal table "
                f"(static_position_embeddings); only sinusoidal positions can be converted."
            )


def _reads(linear: nn.Linear, p: torch.Tensor) -> dict[str, torch.Tensor]:
    """A layer reading the residual stream: permute its input dimension."""
    return {"weight": linear.weight[:, p], "bias": linear.bias}


def _writes(linear: nn.Linear, p: torch.Tensor) -> dict[str, torch.Tensor]:
    """A layer writing the residual stream: permute its output dimension."""
    return {"weight": linear.weight[p], "bias": linear.bias[p]}


def _norm(layer_norm: nn.LayerNorm, p: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"weight": layer_norm.weight[p], "bias": layer_norm.bias[p]}


def _attention(attention: nn.Module, p: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
    """q, k, v read the residual stream (or the encoder output, which is one too); out_proj writes it."""
    return {
        "q_proj": _reads(attention.q_proj, p),
        "k_proj": _reads(attention.k_proj, p),
        "v_proj": _reads(attention.v_proj, p),
        "out_proj": _writes(attention.out_proj, p),
    }


def _encoder_layer(layer: nn.Module, p: torch.Tensor) -> dict[str, dict]:
    return {
        "self_attention": _attention(layer.self_attn, p),
        "self_attention_residual.layer_norm": _norm(layer.self_attn_layer_norm, p),
        "feed_forward.fc1": _reads(layer.fc1, p),
        "feed_forward.fc2": _writes(layer.fc2, p),
        "feed_forward_residual.layer_norm": _norm(layer.final_layer_norm, p),
    }


def _decoder_layer(layer: nn.Module, p: torch.Tensor) -> dict[str, dict]:
    return {
        "self_attention": _attention(layer.self_attn, p),
        "self_attention_residual.layer_norm": _norm(layer.self_attn_layer_norm, p),
        "cross_attention": _attention(layer.encoder_attn, p),
        "cross_attention_residual.layer_norm": _norm(layer.encoder_attn_layer_norm, p),
        "feed_forward.fc1": _reads(layer.fc1, p),
        "feed_forward.fc2": _writes(layer.fc2, p),
        "feed_forward_residual.layer_norm": _norm(layer.final_layer_norm, p),
    }


def _flatten(prefix: str, tree: dict) -> dict[str, torch.Tensor]:
    """{"a": {"b": tensor}} -> {"prefix.a.b": tensor}."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}"
        flat.update(_flatten(name, value) if isinstance(value, dict) else {name: value})
    return flat


def _marian_weights(marian: MarianMTModel, shared: bool, tied: bool) -> dict[str, torch.Tensor]:
    """Our parameter names -> Marian's tensors with the model dimension in our (interleaved) order."""
    p = marian_to_interleaved(marian.config.d_model)
    encoder, decoder = marian.model.encoder, marian.model.decoder
    weights = {"model.shared.weight": encoder.embed_tokens.weight[:, p]}
    if not shared:
        weights["model.decoder.embedding.token_embedding.weight"] = decoder.embed_tokens.weight[:, p]
    if not tied:
        weights["lm_head.weight"] = marian.lm_head.weight[:, p]
    for i, layer in enumerate(encoder.layers):
        weights.update(_flatten(f"model.encoder.layers.{i}", _encoder_layer(layer, p)))
    for i, layer in enumerate(decoder.layers):
        weights.update(_flatten(f"model.decoder.layers.{i}", _decoder_layer(layer, p)))
    return {name: tensor.detach() for name, tensor in weights.items()}


# ---------------------------------------------------------------------------------------------
# From MarianMT: final_logits_bias
# ---------------------------------------------------------------------------------------------


def _fold_logits_bias(weights: dict[str, torch.Tensor], bias: torch.Tensor, final_norm: str) -> None:
    """Fold a logits bias b into the bias-free projection E, exactly, through the last LayerNorm.

    The post-norm decoder ends in ``h = gamma * n + beta`` where ``n`` is the normalised vector,
    whose components sum to zero whatever the input. With ``beta' = gamma`` and
    ``w = 1 / (d_model * gamma)``: ``w . h' = (sum(n) + d_model) / d_model = 1`` for every input, so
    ``E' = E + r w^T`` with ``r = b - E (beta' - beta)`` gives ``E' h' = E h + b``. Computed in float64;
    the rounding of ``E' h'`` in float32 stays at the scale of the logits because ``h'_j`` is
    proportional to ``gamma_j`` wherever ``w_j`` is large.
    """
    gamma = weights[f"{final_norm}.weight"].double()
    beta = weights[f"{final_norm}.bias"].double()
    if torch.any(gamma == 0):
        raise ValueError(
            "final_logits_bias is nonzero and the last decoder LayerNorm has a weight of exactly 0, so the "
            "bias cannot be folded into the pre-softmax projection (our model has no logits bias)."
        )
    projection = weights["lm_head.weight"].double()  # (V, d)
    new_beta = gamma
    residual = bias.double() - projection @ (new_beta - beta)  # (V,)
    direction = 1.0 / (gamma * gamma.numel())  # (d,), w . h' = 1
    dtype = weights["lm_head.weight"].dtype
    weights["lm_head.weight"] = (projection + torch.outer(residual, direction)).to(dtype)
    weights[f"{final_norm}.bias"] = new_beta.to(dtype)


# ---------------------------------------------------------------------------------------------
# From MarianMT: config, model, folder
# ---------------------------------------------------------------------------------------------


def _layer_norm_eps(marian: MarianMTModel) -> float:
    epsilons = {module.eps for module in marian.modules() if isinstance(module, nn.LayerNorm)}
    if len(epsilons) != 1:
        raise ValueError(f"Marian's LayerNorms use several epsilons {sorted(epsilons)}; the Transformer has one.")
    return epsilons.pop()


def _config_from_marian(marian: MarianMTModel, shared: bool, tied: bool) -> VanillaTransformerConfig:
    c = marian.config
    return VanillaTransformerConfig(
        vocab_size=marian.model.encoder.embed_tokens.weight.shape[0],
        decoder_vocab_size=marian.model.decoder.embed_tokens.weight.shape[0],
        d_model=c.d_model,
        encoder_layers=c.encoder_layers,
        decoder_layers=c.decoder_layers,
        encoder_attention_heads=c.encoder_attention_heads,
        decoder_attention_heads=c.decoder_attention_heads,
        encoder_ffn_dim=c.encoder_ffn_dim,
        decoder_ffn_dim=c.decoder_ffn_dim,
        activation_function=c.activation_function,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation_dropout=c.activation_dropout,
        max_position_embeddings=c.max_position_embeddings,
        position_embedding_type="sinusoidal",
        scale_embedding=c.scale_embedding,
        normalize_before=False,
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=tied,
        layer_norm_eps=_layer_norm_eps(marian),
        pad_token_id=c.pad_token_id,
        bos_token_id=c.bos_token_id,
        eos_token_id=_single_eos(c.eos_token_id),
        decoder_start_token_id=c.decoder_start_token_id,
    )


def _embedding_wiring(marian: MarianMTModel) -> tuple[bool, bool]:
    """(shared, tied) as the Marian model computes, i.e. which tensors are the same object."""
    encoder, decoder = marian.model.encoder.embed_tokens, marian.model.decoder.embed_tokens
    shared = encoder.weight is decoder.weight
    if marian.config.share_encoder_decoder_embeddings and decoder.num_embeddings != encoder.num_embeddings:
        raise ValueError(
            f"Marian config shares one vocabulary (share_encoder_decoder_embeddings=True) but has "
            f"decoder_vocab_size={marian.config.decoder_vocab_size} != vocab_size={marian.config.vocab_size}."
        )
    return shared, marian.lm_head.weight is decoder.weight


def _check_tokenizer(tokenizer, config: VanillaTransformerConfig, size: int, side: str = "source") -> None:
    """A tokenizer must use the model's pad and eos ids and fit in the model's vocabulary on its side."""
    for name in ("pad_token_id", "eos_token_id"):
        ours, theirs = getattr(config, name), getattr(tokenizer, name)
        if theirs is not None and ours is not None and ours != theirs:
            raise ValueError(f"The {side} tokenizer's {name}={theirs} differs from the model's {name}={ours}.")
    if len(tokenizer) > size:
        raise ValueError(
            f"The {side} tokenizer has {len(tokenizer)} tokens, more than the model's {side} vocabulary of {size}."
        )


def _load_marian(marian_model_or_path) -> MarianMTModel:
    if isinstance(marian_model_or_path, (str, os.PathLike)):
        config = from_pretrained_named(AutoConfig.from_pretrained, marian_model_or_path, str(marian_model_or_path))
        model_type = config.model_type
        if model_type != "marian":
            raise ValueError(
                f"{marian_model_or_path} describes a {model_type!r} model (config.json), not a MarianMT one: give "
                "a MarianMT folder or Hub id (e.g. Helsinki-NLP/opus-mt-en-de)."
            )
        return MarianMTModel.from_pretrained(marian_model_or_path)
    if not isinstance(marian_model_or_path, MarianMTModel):
        raise TypeError(f"Expected a MarianMTModel or a path to one, got {type(marian_model_or_path).__name__}.")
    return marian_model_or_path


@torch.no_grad()
def from_marian(marian_model_or_path, tokenizer=None) -> VanillaTransformerForConditionalGeneration:
    """A `VanillaTransformerForConditionalGeneration` computing the same logits as a `MarianMTModel`.

    Args:
        marian_model_or_path: a `MarianMTModel`, or a name or folder for `MarianMTModel.from_pretrained`.
        tokenizer: optional; when given, its pad and eos ids and size are checked against the model.

    Returns the model in eval mode, in the Marian model's dtype, with Marian's generation config.
    See the module docstring for what is mapped and what is refused.
    """
    marian = _load_marian(marian_model_or_path)
    _refuse_unsupported_marian(marian.config)
    _check_positions(marian)
    shared, tied = _embedding_wiring(marian)
    bias = marian.final_logits_bias.detach()[0]
    fold_bias = bool(torch.any(bias != 0))
    tied = tied and not fold_bias  # a folded bias changes the projection, which then needs its own matrix
    weights = _marian_weights(marian, shared, tied)
    if fold_bias:
        last = marian.config.decoder_layers - 1
        _fold_logits_bias(weights, bias, f"model.decoder.layers.{last}.feed_forward_residual.layer_norm")
    config = _config_from_marian(marian, shared, tied)
    if tokenizer is not None:
        _check_tokenizer(tokenizer, config, config.vocab_size)
    model = VanillaTransformerForConditionalGeneration(config)
    _assign(model, weights)
    model.generation_config = copy.deepcopy(marian.generation_config)
    # Marian's own length limit (max_length), not §6.1's input + 50 that our configs default to; a config marked
    # as made from the model's config loses every field of ours when read back, so it is marked as written
    model.generation_config.max_new_tokens_beyond_input = None
    model.generation_config._from_model_config = False
    return model.to(marian.dtype).eval()


def _assign(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy every parameter (each tied one once) and check that nothing is left out or extra."""
    parameters = dict(model.named_parameters())  # tied parameters appear once, under their source name
    if set(parameters) != set(weights):
        raise RuntimeError(
            f"Marian mapping out of step with the model: missing {sorted(set(parameters) - set(weights))}, "
            f"extra {sorted(set(weights) - set(parameters))}."
        )
    for name, tensor in weights.items():
        parameters[name].copy_(tensor)


def convert_marian(marian_model_or_path, output_dir, tokenizer=None) -> VanillaTransformerForConditionalGeneration:
    """`from_marian`, saved as a Hub folder (config, weights, generation config, modeling code).

    The tokenizer, when given, is saved next to it with its own ``save_pretrained``: for opus-mt that is
    a sentencepiece `MarianTokenizer` (loading it back needs the ``sentencepiece`` package).
    """
    if Path(output_dir).exists() and not Path(output_dir).is_dir():
        raise NotADirectoryError(f"{output_dir} is a file; give a folder for the converted model.")
    model = from_marian(marian_model_or_path, tokenizer)
    model.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    return model


# ---------------------------------------------------------------------------------------------
# To CTranslate2
# ---------------------------------------------------------------------------------------------


def _import_ctranslate2():
    try:
        return importlib.import_module("ctranslate2")
    except ImportError as error:
        raise ImportError(
            f"Export to CTranslate2 needs the ctranslate2 package: {install_command('ctranslate2')}"
        ) from error


def _activation(ctranslate2, name: str):
    """CTranslate2's activation for an ACT2FN name (the same table as its own transformers converter)."""
    activations = ctranslate2.specs.Activation
    table = {
        "relu": activations.RELU,
        "silu": activations.SWISH,
        "swish": activations.SWISH,
        "gelu": activations.GELU,
        "gelu_python": activations.GELU,
        "gelu_new": activations.GELUTanh,
        "gelu_fast": activations.GELUTanh,
        "gelu_pytorch_tanh": activations.GELUTanh,
        "quick_gelu": activations.GELUSigmoid,
    }
    if name not in table:
        raise ValueError(f"CTranslate2 has no activation_function {name!r}; it supports {', '.join(sorted(table))}.")
    return table[name]


def _transformer_spec(ctranslate2, config: VanillaTransformerConfig):
    """The empty TransformerSpec of our architecture (encoder and decoder head counts may differ)."""
    specs = ctranslate2.specs
    common = dict(
        pre_norm=config.normalize_before,
        activation=_activation(ctranslate2, config.activation_function),
        head_dim=config.head_dim,
    )
    encoder = specs.TransformerEncoderSpec(config.encoder_layers, config.encoder_attention_heads, **common)
    decoder = specs.TransformerDecoderSpec(config.decoder_layers, config.decoder_attention_heads, **common)
    return specs.TransformerSpec(encoder, decoder)


def _set_linear(spec, *linears: nn.Linear) -> None:
    """One CTranslate2 linear; several of ours are fused along the output (q|k|v or k|v)."""
    spec.weight = torch.cat([linear.weight for linear in linears]).detach()
    spec.bias = torch.cat([linear.bias for linear in linears]).detach()


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy for the spec: ``spec.optimize(quantization=...)`` rewrites some variables in place, which
    would otherwise change the exported model's own weights (int8 did, to the tied embedding)."""
    return tensor.detach().clone()


def _set_layer_norm(spec, layer_norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _copy(layer_norm.weight), _copy(layer_norm.bias)


def _set_self_attention(spec, attention: nn.Module, residual: nn.Module) -> None:
    _set_linear(spec.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
    _set_linear(spec.linear[1], attention.out_proj)
    _set_layer_norm(spec.layer_norm, residual.layer_norm)


def _set_cross_attention(spec, attention: nn.Module, residual: nn.Module) -> None:
    _set_linear(spec.linear[0], attention.q_proj)
    _set_linear(spec.linear[1], attention.k_proj, attention.v_proj)
    _set_linear(spec.linear[2], attention.out_proj)
    _set_layer_norm(spec.layer_norm, residual.layer_norm)


def _set_feed_forward(spec, layer: nn.Module) -> None:
    _set_linear(spec.linear_0, layer.feed_forward.fc1)
    _set_linear(spec.linear_1, layer.feed_forward.fc2)
    _set_layer_norm(spec.layer_norm, layer.feed_forward_residual.layer_norm)


def _set_stack(spec, stack: nn.Module, config: VanillaTransformerConfig) -> None:
    """Embedding scale, positions (our table, set explicitly), and the final pre-norm LayerNorm."""
    embedding = stack.embedding
    spec.scale_embeddings = embedding.scale
    positions = embedding.positional_encoding  # CTranslate2's own sinusoidal table is not ours: set it
    table = positions.table if config.position_embedding_type == "sinusoidal" else positions.weight
    spec.position_encodings.encodings = _copy(table)
    if config.normalize_before:
        _set_layer_norm(spec.layer_norm, stack.layer_norm)


def _fill_spec(spec, model: VanillaTransformerForConditionalGeneration) -> None:
    encoder, decoder, config = model.model.encoder, model.model.decoder, model.config
    _set_stack(spec.encoder, encoder, config)
    spec.encoder.embeddings[0].weight = _copy(encoder.embedding.token_embedding.weight)
    for layer_spec, layer in zip(spec.encoder.layer, encoder.layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_residual)
        _set_feed_forward(layer_spec.ffn, layer)
    _set_stack(spec.decoder, decoder, config)
    spec.decoder.embeddings.weight = _copy(decoder.embedding.token_embedding.weight)
    for layer_spec, layer in zip(spec.decoder.layer, decoder.layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_residual)
        _set_cross_attention(layer_spec.attention, layer.cross_attention, layer.cross_attention_residual)
        _set_feed_forward(layer_spec.ffn, layer)
    spec.decoder.projection.weight = _copy(model.lm_head.weight)


def _pieces(tokenizer, size: int, side: str) -> list[str]:
    """The tokenizer's pieces by id; ids beyond the tokenizer (a padded embedding) get placeholder names."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"The {side} tokenizer maps several ids to one piece; CTranslate2 needs one id per piece.")
    taken, index = set(tokens), 0
    while len(tokens) < size:
        name, index = f"<unused_{index}>", index + 1
        if name not in taken:
            tokens.append(name)
    return tokens


def _set_special_tokens(spec, config: VanillaTransformerConfig, target: list[str], tokenizer) -> None:
    start = config.decoder_start_token_id
    spec.config.decoder_start_token = target[start]  # CTranslate2 feeds it first, as generate() does
    spec.config.bos_token = target[config.bos_token_id if config.bos_token_id is not None else start]
    spec.config.eos_token = target[config.eos_token_id]
    if tokenizer.unk_token is not None:
        spec.config.unk_token = tokenizer.unk_token
    spec.config.layer_norm_epsilon = config.layer_norm_eps


def _vocabularies(config: VanillaTransformerConfig, tokenizer, target_tokenizer) -> tuple[list[str], list[str]]:
    """Source and target pieces, once the tokenizers are checked against the model."""
    if not config.share_encoder_decoder_embeddings and target_tokenizer is None:
        raise ValueError("The model has separate source and target embeddings: pass target_tokenizer= as well.")
    _check_tokenizer(tokenizer, config, config.vocab_size)
    source = _pieces(tokenizer, config.vocab_size, "source")
    if target_tokenizer is None:
        return source, source
    _check_tokenizer(target_tokenizer, config, config.decoder_vocab_size, "target")
    return source, _pieces(target_tokenizer, config.decoder_vocab_size, "target")


# What `TransformerSpec.save` writes; with force=True these (and only these) are replaced.
CTRANSLATE2_FILES = (
    "model.bin",
    "config.json",
    "shared_vocabulary.json",
    "source_vocabulary.json",
    "target_vocabulary.json",
)


def _refuse_a_transformers_model_folder(output_dir: Path) -> None:
    """CTranslate2 writes its own ``config.json``: never over a transformers model's (one with a
    ``model_type``), not even with ``force``, which replaces an earlier export's files only."""
    try:
        config = json.loads((output_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(config, dict) and "model_type" in config:
        raise FileExistsError(
            f"{output_dir} holds a transformers model (its config.json has model_type "
            f"{config['model_type']!r}), whose config.json the CTranslate2 export would replace; give another "
            "folder (--force replaces an earlier export's files only)."
        )


def _save(spec, output_dir: Path, quantization: str | None) -> None:
    spec.validate()
    spec.optimize(quantization=quantization)  # also aliases identical tensors (tied embeddings) to one
    for stale in CTRANSLATE2_FILES:  # e.g. source/target vocabularies left next to a new shared one
        (output_dir / stale).unlink(missing_ok=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(output_dir))


def _load_for_export(model_or_path, tokenizer):
    if not isinstance(model_or_path, (str, os.PathLike)):
        if tokenizer is None:
            raise ValueError("Pass tokenizer=: CTranslate2 stores the vocabulary as the tokenizer's pieces.")
        return model_or_path, tokenizer
    model = from_pretrained_named(
        VanillaTransformerForConditionalGeneration.from_pretrained, model_or_path, str(model_or_path)
    )
    return model, tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_or_path)


@torch.no_grad()
def to_ctranslate2(
    model_or_path,
    output_dir,
    quantization: str | None = None,
    tokenizer=None,
    target_tokenizer=None,
    force: bool = False,
) -> Path:
    """Write a CTranslate2 model directory (``model.bin``, ``config.json``, vocabulary JSON files).

    Args:
        model_or_path: a `VanillaTransformerForConditionalGeneration`, or a folder saved with
            ``save_pretrained`` (its tokenizer is then loaded from the same folder unless given).
        output_dir: the directory to create; with ``force=True`` an existing one gets its CTranslate2
            files replaced (nothing else in it is touched).
        quantization: CTranslate2 weight type: None (keep), "int8", "int8_float32", "int8_float16",
            "int8_bfloat16", "int16", "float16", "bfloat16" or "float32".
        tokenizer: gives the source vocabulary (and the target one when the model shares it) as the
            tokenizer's pieces, in id order: ``shared_vocabulary.json``.
        target_tokenizer: the target tokenizer, required when the model has separate embeddings
            (``share_encoder_decoder_embeddings=False``; pass the same tokenizer for a joint vocabulary).

    Checked (tests/test_convert.py): the log-probabilities of `ctranslate2.Translator.score_batch`
    equal the model's, and ``translate_batch(beam_size=1 or 4, length_penalty=0.6,
    return_end_token=True, min_decoding_length=0, max_decoding_length=N)`` returns ``generate(...,
    max_new_tokens=N)``'s tokens and scores
    (``num_beams=4, length_penalty=0.6, early_stopping=True``); see the module docstring for why those
    two CTranslate2 options are needed.
    """
    ctranslate2 = _import_ctranslate2()
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise NotADirectoryError(f"{output_dir} is a file; give a folder for the CTranslate2 model.")
    if output_dir.exists() and any(output_dir.iterdir()) and not force:
        raise FileExistsError(f"{output_dir} exists and is not empty; pass force=True (--force) to write into it.")
    _refuse_a_transformers_model_folder(output_dir)
    model, tokenizer = _load_for_export(model_or_path, tokenizer)
    source, target = _vocabularies(model.config, tokenizer, target_tokenizer)
    spec = _transformer_spec(ctranslate2, model.config)
    _fill_spec(spec, model)
    spec.register_source_vocabulary(source)
    spec.register_target_vocabulary(target)
    _set_special_tokens(spec, model.config, target, target_tokenizer or tokenizer)
    _save(spec, output_dir, quantization)
    return output_dir


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def build_parser(prog: str = "vanilla-transformer convert") -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        description="Import MarianMT checkpoints exactly; export to CTranslate2.",
        epilog="Every flag is also accepted with underscores (--target_tokenizer).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    marian = commands.add_parser("from-marian", help="convert a MarianMT model into a Hub folder of this model")
    marian.add_argument("source", help="MarianMT model name or folder")
    marian.add_argument("output_dir", type=Path, help="folder to save the converted model in")
    marian.add_argument("--tokenizer", help="tokenizer to save alongside (default: the source's)")
    marian.add_argument("--no-tokenizer", action="store_true", help="save the model only")
    marian.add_argument("--force", action="store_true", help="write into a folder that already holds a model")
    ct2 = commands.add_parser("to-ctranslate2", help="export a saved model folder to a CTranslate2 directory")
    ct2.add_argument("model", help="folder saved with save_pretrained (with its tokenizer)")
    ct2.add_argument("output_dir", type=Path, help="CTranslate2 model directory to create")
    ct2.add_argument("--quantization", help=", ".join(QUANTIZATIONS))
    ct2.add_argument("--tokenizer", help="source (or joint) tokenizer (default: the model folder's)")
    ct2.add_argument("--target-tokenizer", help="target tokenizer, for separate vocabularies")
    ct2.add_argument(
        "--force", action="store_true", help="write into an existing directory, replacing its CTranslate2 files"
    )
    return parser


# CTranslate2's weight types (its converters' --quantization).
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def _check_arguments(args: argparse.Namespace) -> None:
    """Folders, tokenizers and names checked before any model is loaded or written."""
    if args.command == "from-marian":
        if args.tokenizer and args.no_tokenizer:
            raise ValueError("--tokenizer and --no-tokenizer contradict each other; give one.")
        check_model_folder(args.source, f"from-marian SOURCE {args.source}")
        if not args.no_tokenizer and not args.tokenizer and is_local(args.source) and not has_tokenizer(args.source):
            raise ValueError(
                f"Could not load the Marian tokenizer from {args.source}: it has no tokenizer files. Give "
                "--tokenizer NAME_OR_FOLDER, or --no-tokenizer to save the model alone."
            )
        if (args.output_dir / "config.json").exists() and not args.force:
            raise FileExistsError(
                f"{args.output_dir} already holds a model; choose a new folder, or pass --force to replace it."
            )
        return
    check_model_folder(args.model, f"to-ctranslate2 MODEL {args.model}")
    if not args.tokenizer:
        check_has_tokenizer(
            args.model,
            f"to-ctranslate2 MODEL {args.model}",
            "Give the tokenizer the model was trained with: --tokenizer FOLDER.",
        )
    for flag, name in (("--tokenizer", args.tokenizer), ("--target-tokenizer", args.target_tokenizer)):
        if name:
            check_has_tokenizer(name, f"{flag} {name}", "Give the folder the tokenizer was saved in.")
    if args.quantization is not None and args.quantization not in QUANTIZATIONS:
        raise ValueError(
            f"--quantization {args.quantization!r} does not exist; choose one of {', '.join(QUANTIZATIONS)}."
        )


def _tokenizer_for(path: str, what: str):
    try:
        return from_pretrained_named(AutoTokenizer.from_pretrained, path, f"Could not load the {what} tokenizer {path}")
    except (OSError, ValueError, ImportError) as error:
        if isinstance(error, OSError) and not is_local(path):
            raise  # named in one line already
        raise ValueError(f"Could not load the {what} tokenizer from {path}: {error}") from error


def _run(args: argparse.Namespace) -> str:
    _check_arguments(args)
    if args.command == "from-marian":
        tokenizer = None if args.no_tokenizer else _tokenizer_for(args.tokenizer or args.source, "Marian")
        convert_marian(args.source, args.output_dir, tokenizer)
        return f"Saved the converted model{'' if tokenizer is None else ' and its tokenizer'} to {args.output_dir}"
    tokenizer = _tokenizer_for(args.tokenizer, "source") if args.tokenizer else None
    target = _tokenizer_for(args.target_tokenizer, "target") if args.target_tokenizer else None
    to_ctranslate2(args.model, args.output_dir, args.quantization, tokenizer, target, force=args.force)
    return f"Saved a CTranslate2 model to {args.output_dir}"


def main(argv: Sequence[str] | None = None, prog: str = "vanilla-transformer convert") -> None:
    """``vanilla-transformer convert``: ``from-marian SOURCE OUTPUT_DIR`` and ``to-ctranslate2 MODEL OUTPUT_DIR``;
    bad input ends in one line, exit status 2."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        message = _run(args)
    except (TypeError, ValueError, OSError, ImportError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    print(message)


__all__ = ["convert_marian", "from_marian", "main", "marian_to_interleaved", "to_ctranslate2"]


if __name__ == "__main__":
    import sys

    from vanilla_transformer.cli import run_command

    run_command("convert", sys.argv[1:])
