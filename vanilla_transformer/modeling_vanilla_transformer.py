"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers 5.x model.

Read top to bottom, the file follows the paper: positional encoding (§3.5), embeddings (§3.4),
multi-head attention (§3.2), position-wise feed-forward network (§3.3), the residual connection
around every sub-layer (§3.1, §5.4), encoder and decoder layers and stacks (§3.1), then the
`PreTrainedModel` classes that plug it into the library (Auto classes, `generate()`, Trainer), whose
loss is the cross-entropy per target token (§5.4's label smoothing is the trainer's, ``label_smoothing_factor``:
``model(..., labels=...).loss`` is the plain NLL). Two files sit beside this one: ``training_kernels.py``
computes dropout and that loss (torch's results, computed faster on the CPU), and
``generation_vanilla_transformer.py`` decodes (§6.1), talking to the model through its forward and the cache.

One flag changes the architecture's shape: ``config.normalize_before`` switches every residual
connection from the paper's post-norm ``LayerNorm(x + Dropout(Sublayer(x)))`` to pre-norm
``x + Dropout(Sublayer(LayerNorm(x)))`` and adds a final LayerNorm after each stack. It is read in
one place, `ResidualConnection`, and in the stacks' constructors.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from safetensors import SafetensorError
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .attention_backends import with_chosen_backends
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .generation_vanilla_transformer import CACHE, VanillaTransformerGenerationMixin, paper_generation_config
from .private_api import require
from .training_kernels import UniformMaskDropout, label_smoothed_cross_entropy

# Private members overridden (vocabulary resizing) or read (the attention implementation) below: checked at import
require(
    "transformers.PreTrainedModel._resize_token_embeddings",
    "transformers.PreTrainedModel._get_resized_embeddings",
    "transformers.PreTrainedModel._get_resized_lm_head",
    "transformers.PretrainedConfig._attn_implementation",
)


def accepts_past_key_values(forward: Callable) -> Callable:
    """A forward taking `cache` also takes it as `past_key_values`: generate() passes that name before
    transformers 5.24, and users' code written for it still does."""

    @functools.wraps(forward)
    def forward_taking_either_name(*args, past_key_values: EncoderDecoderCache | None = None, **kwargs):
        if past_key_values is not None:
            if kwargs.get("cache") is not None:
                raise ValueError(
                    "Pass the key/value cache once: as `cache`, or as `past_key_values` (its name before 5.24)."
                )
            kwargs["cache"] = past_key_values
        return forward(*args, **kwargs)

    return forward_taking_either_name


# ---------------------------------------------------------------------------------------------
# §3.5 Positional encoding
# ---------------------------------------------------------------------------------------------


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), interleaved (§3.5)."""
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    frequency = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (d/2,)
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """The fixed table of §3.5, kept as a buffer that is recomputed, never saved.

    It is created in the default dtype, which ``from_pretrained(..., dtype=...)`` sets while it builds
    the model, so that the table follows the weights (bfloat16 weights get a bfloat16 table).
    """

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        table = sinusoidal_positions(config.max_position_embeddings, config.d_model).to(torch.get_default_dtype())
        self.register_buffer("table", table, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]


class LearnedPositionalEncoding(nn.Embedding):
    """Learned positional embeddings, the alternative of Table 3, row E."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config.max_position_embeddings, config.d_model)


POSITIONAL_ENCODINGS = {"sinusoidal": SinusoidalPositionalEncoding, "learned": LearnedPositionalEncoding}


# ---------------------------------------------------------------------------------------------
# §3.4 Embeddings: token embedding * sqrt(d_model) + positional encoding, then dropout (§5.4)
# ---------------------------------------------------------------------------------------------


class TransformerEmbedding(nn.Module):
    """Input of a stack: ``Dropout(embedding(x) * sqrt(d_model) + PE)`` (§3.4, §3.5, §5.4)."""

    def __init__(self, config: VanillaTransformerConfig, token_embedding: nn.Embedding, inputs: str = "input_ids"):
        super().__init__()
        self.inputs = inputs  # what the model's caller names this stack's tokens, for the errors below
        self.token_embedding = token_embedding
        self.scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.positional_encoding = POSITIONAL_ENCODINGS[config.position_embedding_type](config)
        self.max_positions = config.max_position_embeddings
        self.dropout = UniformMaskDropout(config.dropout)

    def forward(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int | torch.Tensor = 0
    ) -> torch.Tensor:
        """``inputs_embeds`` stands for unscaled token embeddings; positions start at ``past_length``
        (an int, or a 0-d tensor from a static cache)."""
        if (input_ids is None) == (inputs_embeds is None):
            embeds = "decoder_inputs_embeds" if self.inputs.startswith("decoder") else "inputs_embeds"
            got = f"no {self.inputs} and no {embeds}" if input_ids is None else f"both {self.inputs} and {embeds}"
            raise ValueError(f"Got {got}: pass exactly one of them.")
        if inputs_embeds is None:
            inputs_embeds = self.token_embedding(input_ids)
        length = inputs_embeds.shape[1]
        if length == 0:
            raise ValueError(
                f"Got an empty sequence in {self.inputs} (shape {tuple(inputs_embeds.shape[:2])}): every input needs "
                "at least one token, e.g. the </s> that the tokenizer appends to every sentence."
            )
        # Compiled code cannot branch on a static cache's length; generate() checks the limit up front.
        if not torch.compiler.is_compiling() and int(past_length) + length > self.max_positions:
            raise ValueError(
                f"A sequence of {int(past_length) + length} tokens in {self.inputs} is longer than "
                f"max_position_embeddings={self.max_positions}. Shorten the input (the tokenizer's truncation=True "
                "cuts it at model_max_length, as pipeline(..., truncation=True) does), or generation's max_length, "
                "or raise max_position_embeddings in the config (sinusoidal positions need no retraining)."
            )
        position_ids = torch.arange(length, device=inputs_embeds.device) + past_length
        return self.dropout(inputs_embeds * self.scale + self.positional_encoding(position_ids))


# ---------------------------------------------------------------------------------------------
# §3.2 Attention
# ---------------------------------------------------------------------------------------------


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (§3.2.1, Eq. 1); the mask is additive."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, T_q, T_k)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, T_q, H, D)
    return output, weights


# One source, several decodings (beams, sampled outputs): cross-attention may get the encoder output once per
# source, keys and values (B, H, S, D), and the decoder's queries in G consecutive rows per source, (B * G, H, T, D).
# Attention implementations take one batch size, so each source's G query rows become G * T query positions
# of its one row: Eq. 1 treats every query position on its own, and the keys are read once instead of G times.


def share_keys(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None):
    """Queries (B * G, H, T, D) -> (B, H, G * T, D), a mask with T query positions -> G * T, and G."""
    group, left_over = query.shape[0] // key.shape[0], query.shape[0] % key.shape[0]  # (divmod breaks dynamo)
    if group == 0 or left_over:
        raise ValueError(
            f"The decoder input has {query.shape[0]} rows and the encoder output {key.shape[0]}: give one encoder row "
            "per decoder row, or one per source with the decoder rows of each source next to each other (a whole "
            "number of them per source)."
        )
    if group == 1:
        return query, attention_mask, group
    rows, heads, length, dim = query.shape
    query = query.view(rows // group, group, heads, length, dim).transpose(1, 2)
    if isinstance(attention_mask, BlockMask):  # flex attention: a mask function, evaluated again over G * T
        attention_mask = repeat_block_mask(attention_mask, length, group)
    elif attention_mask is not None and attention_mask.shape[-2] > 1:
        attention_mask = attention_mask.repeat(1, 1, group, 1)
    return query.reshape(rows // group, heads, group * length, dim), attention_mask, group


def repeat_block_mask(mask: BlockMask, length: int, group: int) -> BlockMask:
    """A flex attention mask over T query positions -> the same over G * T, query position q read as q mod T."""
    rows, heads, _, key_length = mask.shape

    def mask_mod(row, head, query_position, key_position):
        return mask.mask_mod(row, head, query_position % length, key_position)

    return create_block_mask(
        mask_mod, rows, heads, group * length, key_length, device=mask.kv_num_blocks.device, BLOCK_SIZE=mask.BLOCK_SIZE
    )


def unshare_keys(output: torch.Tensor, weights: torch.Tensor | None, group: int):
    """`share_keys` undone: output (B, G * T, H, D) -> (B * G, T, H, D), weights (B, H, G * T, S) -> (B * G, H, T, S)."""
    if group == 1:
        return output, weights
    sources, positions, heads, dim = output.shape
    output = output.reshape(sources * group, positions // group, heads, dim)
    if weights is not None:
        weights = weights.unflatten(2, (group, -1)).transpose(1, 2).flatten(0, 1)
    return output, weights


class VanillaTransformerAttention(nn.Module):
    """Multi-head attention (§3.2.2): h heads of width d_k, concatenated and projected back.

    One class serves the three uses of §3.2.3: encoder self-attention, masked decoder
    self-attention (``is_causal``) and encoder-decoder ("cross") attention. In the decoder it
    reads and writes the key/value cache: self-attention appends this step's keys and values;
    cross-attention projects the encoder output once and reuses it at every later step. The encoder
    output may have fewer rows than the decoder's input (`share_keys`).

    ``fused_projections`` (set by the training lever ``--fuse_projections``, never saved): without a cache,
    the projections that read the same input run as one matrix product of their weights stacked (q, k and v
    in self-attention; k and v of the encoder output), fewer and larger kernels. The same parameters either way.
    """

    fused_projections = False

    def __init__(
        self,
        config: VanillaTransformerConfig,
        num_heads: int,
        is_causal: bool = False,
        is_cross_attention: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.head_dim or config.d_model // num_heads
        self.scaling = self.head_dim**-0.5  # the 1/sqrt(d_k) of Eq. 1
        self.attention_dropout = config.attention_dropout
        self.is_causal = is_causal  # read by sdpa when no mask is given
        self.is_cross_attention = is_cross_attention
        self.layer_idx = layer_idx
        inner_dim = num_heads * self.head_dim
        self.q_proj = nn.Linear(config.d_model, inner_dim)
        self.k_proj = nn.Linear(config.d_model, inner_dim)
        self.v_proj = nn.Linear(config.d_model, inner_dim)
        self.out_proj = nn.Linear(inner_dim, config.d_model)

    def _split_heads(self, states: torch.Tensor) -> torch.Tensor:
        return states.view(*states.shape[:-1], -1, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def _keys_and_values(
        self, states: torch.Tensor, cache: EncoderDecoderCache | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Project keys and values, going through the cache when there is one."""
        if cache is None:
            return self._split_heads(self.k_proj(states)), self._split_heads(self.v_proj(states))
        if self.is_cross_attention:
            layers = cache.cross_attention_cache
            if cache.is_updated.get(self.layer_idx):  # encoder output already projected
                return layers.layers[self.layer_idx].keys, layers.layers[self.layer_idx].values
            cache.is_updated[self.layer_idx] = True
        else:
            layers = cache.self_attention_cache
        keys, values = self._split_heads(self.k_proj(states)), self._split_heads(self.v_proj(states))
        return layers.update(keys, values, self.layer_idx)

    def _fused_query_key_value(
        self, hidden_states: torch.Tensor, source: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`fused_projections`: one product for the projections of each input, split into heads."""
        stacked = [self.k_proj, self.v_proj] if self.is_cross_attention else [self.q_proj, self.k_proj, self.v_proj]
        weight = torch.cat([linear.weight for linear in stacked])
        bias = None if stacked[0].bias is None else torch.cat([linear.bias for linear in stacked])
        projected = nn.functional.linear(source, weight, bias).split(self.k_proj.out_features, dim=-1)
        if self.is_cross_attention:
            projected = (self.q_proj(hidden_states), *projected)
        return tuple(self._split_heads(states) for states in projected)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, T, d_model) -> (output (B, T, d_model), weights (B, H, T, S) or None)."""
        source = encoder_hidden_states if self.is_cross_attention else hidden_states
        if self.fused_projections and cache is None:
            query, key, value = self._fused_query_key_value(hidden_states, source)
        else:
            query = self._split_heads(self.q_proj(hidden_states))  # (B, H, T, D)
            key, value = self._keys_and_values(source, cache)  # (B, H, S, D) each
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        attention = with_chosen_backends(attention, self, hidden_states, cache)  # sdpa on CUDA: kernels by use
        query, attention_mask, group = share_keys(query, key, attention_mask)  # group > 1: a shared encoder output
        output, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output, weights = unshare_keys(output, weights, group)
        output = output.reshape(*hidden_states.shape[:-1], -1)  # (B, T, H * D)
        return self.out_proj(output), weights


# ---------------------------------------------------------------------------------------------
# §3.3 Position-wise feed-forward network
# ---------------------------------------------------------------------------------------------


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, Eq. 2), with a configurable activation."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = UniformMaskDropout(config.activation_dropout)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_dropout(self.activation(self.fc1(hidden_states))))


# ---------------------------------------------------------------------------------------------
# §3.1 + §5.4 The residual connection around every sub-layer
# ---------------------------------------------------------------------------------------------


class ResidualConnection(nn.Module):
    """LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4); pre-norm: x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = UniformMaskDropout(config.dropout)

    def forward(self, hidden_states: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.normalize_before:
            return hidden_states + self.dropout(sublayer(self.layer_norm(hidden_states)))
        return self.layer_norm(hidden_states + self.dropout(sublayer(hidden_states)))


# ---------------------------------------------------------------------------------------------
# §3.1 Encoder and decoder layers
# ---------------------------------------------------------------------------------------------


class VanillaTransformerEncoderLayer(GradientCheckpointingLayer):
    """Self-attention, then the feed-forward network, each inside a residual connection (§3.1)."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int):
        super().__init__()
        self.self_attention = VanillaTransformerAttention(config, config.encoder_attention_heads, layer_idx=layer_idx)
        self.self_attention_residual = ResidualConnection(config)
        self.feed_forward = FeedForward(config, config.encoder_ffn_dim)
        self.feed_forward_residual = ResidualConnection(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs) -> torch.Tensor:
        hidden_states = self.self_attention_residual(
            hidden_states, lambda x: self.self_attention(x, attention_mask, **kwargs)[0]
        )
        return self.feed_forward_residual(hidden_states, self.feed_forward)


class VanillaTransformerDecoderLayer(GradientCheckpointingLayer):
    """Masked self-attention, attention over the encoder output, then the FFN (§3.1)."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int):
        super().__init__()
        heads = config.decoder_attention_heads
        self.self_attention = VanillaTransformerAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attention_residual = ResidualConnection(config)
        self.cross_attention = VanillaTransformerAttention(config, heads, is_cross_attention=True, layer_idx=layer_idx)
        self.cross_attention_residual = ResidualConnection(config)
        self.feed_forward = FeedForward(config, config.decoder_ffn_dim)
        self.feed_forward_residual = ResidualConnection(config)

    @accepts_past_key_values
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        hidden_states = self.self_attention_residual(
            hidden_states,
            lambda x: self.self_attention(x, attention_mask, cache=cache, **kwargs)[0],
        )
        hidden_states = self.cross_attention_residual(
            hidden_states,
            lambda x: self.cross_attention(x, encoder_attention_mask, encoder_hidden_states, cache=cache, **kwargs)[0],
        )
        return self.feed_forward_residual(hidden_states, self.feed_forward)


# ---------------------------------------------------------------------------------------------
# PreTrainedModel base: initialisation and the library's contracts
# ---------------------------------------------------------------------------------------------

MODEL_TAGS = ("translation", "vanilla-transformer", "custom_code")


class VanillaTransformerPreTrainedModel(PreTrainedModel):
    """Weight initialisation and the library-facing class attributes shared by every model class.

    Initialisation (the paper gives none): every linear weight N(0, sqrt(2 / (5 d_model))), the
    "small init" of Nguyen & Salazar (2019), or per ``linear_init`` / ``linear_init_std``, with zero
    bias; token embeddings (and learned positions) normal with std ``init_std`` = d_model^-0.5 so
    that ``embedding * sqrt(d_model)`` has unit variance, as in fairseq; the padding row zero,
    LayerNorm weight 1 and bias 0. The tied pre-softmax projection is the embedding (§3.4).
    """

    config_class = VanillaTransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = True
    _can_compile_fullgraph = True

    def __init__(self, config: VanillaTransformerConfig, *args, **kwargs):
        config.validate()  # a config edited after construction (config.d_model = 63) fails here, not in a layer
        super().__init__(config, *args, **kwargs)
        # transformers' mechanism for a model to name itself in the cards that push_to_hub (the model's or
        # the Trainer's) writes: the task, this package, and that the checkpoint carries its code.
        self.model_tags = list(MODEL_TAGS)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        std = self.config.init_std or self.config.d_model**-0.5
        if isinstance(module, nn.Linear):
            if self.config.linear_init == "xavier_uniform":
                init.xavier_uniform_(module.weight)
            else:
                linear_std = self.config.linear_init_std or math.sqrt(2 / (5 * self.config.d_model))
                init.normal_(module.weight, mean=0.0, std=linear_std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, SinusoidalPositionalEncoding):
            init.copy_(module.table, sinusoidal_positions(*module.table.shape))

    def resize_token_embeddings(self, *args, **kwargs) -> nn.Embedding:
        """Resize the source vocabulary, or the joint one (with the target embedding and the pre-softmax
        projection) when the vocabularies are shared. A separate target vocabulary is resized with
        `resize_decoder_token_embeddings`."""
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        if self.config.share_encoder_decoder_embeddings:
            self.config.decoder_vocab_size = self.config.vocab_size
        return embeddings

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        if self.config.share_encoder_decoder_embeddings:  # one vocabulary: the library resizes all of it
            return super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        old = self.get_input_embeddings()  # the source side only; the target side keeps its size
        new = self._get_resized_embeddings(old, new_num_tokens, pad_to_multiple_of, mean_resizing)
        new.requires_grad_(old.weight.requires_grad)
        self.set_input_embeddings(new)
        return new

    def resize_decoder_token_embeddings(self, new_num_tokens: int, mean_resizing: bool = True) -> nn.Embedding:
        """Resize a separate target vocabulary: the decoder's embedding and the pre-softmax projection
        (re-tied to it, or resized with it when untied). MarianMT's method of the same name."""
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError(
                "The source and target vocabularies are one (share_encoder_decoder_embeddings=True): resize both "
                "with resize_token_embeddings."
            )
        decoder = self.base_model.decoder
        old = decoder.get_input_embeddings()
        new = self._get_resized_embeddings(old, new_num_tokens, mean_resizing=mean_resizing)
        new.requires_grad_(old.weight.requires_grad)
        decoder.set_input_embeddings(new)
        projection = self.get_output_embeddings()
        if projection is not None and not self.config.tie_word_embeddings:
            self.set_output_embeddings(
                self._get_resized_lm_head(projection, new_num_tokens, mean_resizing=mean_resizing)
            )
        self.config.decoder_vocab_size = new_num_tokens
        self.tie_weights()
        return new

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, saying which weights are unreadable and what to do about it."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as error:  # its own message names neither the checkpoint nor a remedy
            raise OSError(
                f"The weights of {pretrained_model_name_or_path} cannot be read ({error}): a .safetensors file is "
                "truncated or corrupt, e.g. by an interrupted save, copy or download. Save the model again, or "
                "download it again with from_pretrained(..., force_download=True)."
            ) from error


# ---------------------------------------------------------------------------------------------
# §3.1 The encoder and decoder stacks
# ---------------------------------------------------------------------------------------------


class VanillaTransformerStack(VanillaTransformerPreTrainedModel):
    """What encoder and decoder share (§3.1): the embedded input, N identical layers, and for pre-norm
    a final LayerNorm (pre-norm leaves the residual stream unnormalised).

    ``drops_unpadded_masks`` (cleared by the training lever ``--sync_free_step``, never saved): transformers'
    mask builder asks whether a batch has any padding (a read of the mask on the host, which waits for the
    GPU) so that an unpadded batch attends without a mask; cleared, every batch keeps its mask and nothing
    is read back. The same attention either way."""

    layer_class: type[nn.Module]
    inputs: str  # the name of its tokens in the model's forward
    drops_unpadded_masks = True

    def _bidirectional_mask(self, **kwargs):
        if not self.drops_unpadded_masks:  # transformers 5.15+ (levers.refusal checks it)
            kwargs["allow_is_bidirectional_skip"] = False
        return create_bidirectional_mask(config=self.config, **kwargs)

    def __init__(self, config: VanillaTransformerConfig, token_embedding: nn.Embedding, num_layers: int):
        super().__init__(config)
        self.embedding = TransformerEmbedding(config, token_embedding, self.inputs)
        self.layers = nn.ModuleList([self.layer_class(config, layer_idx=i) for i in range(num_layers)])
        self.layer_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else nn.Identity()
        )
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embedding.token_embedding

    def set_input_embeddings(self, value: nn.Embedding):
        self.embedding.token_embedding = value


class VanillaTransformerEncoder(VanillaTransformerStack):
    """N identical layers over the embedded source (§3.1); attention sees every source position."""

    layer_class = VanillaTransformerEncoderLayer
    inputs = "input_ids"
    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig, token_embedding: nn.Embedding):
        super().__init__(config, token_embedding, config.encoder_layers)

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        hidden_states = self.embedding(input_ids, inputs_embeds)  # (B, S, d_model)
        mask = self._bidirectional_mask(inputs_embeds=hidden_states, attention_mask=attention_mask)
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask, **kwargs)
        return BaseModelOutput(last_hidden_state=self.layer_norm(hidden_states))


class VanillaTransformerDecoder(VanillaTransformerStack):
    """N identical layers over the embedded target prefix, attending to the encoder output (§3.1)."""

    layer_class = VanillaTransformerDecoderLayer
    inputs = "decoder_input_ids (or labels)"
    _can_record_outputs = {
        "hidden_states": VanillaTransformerDecoderLayer,
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attention"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="cross_attention"),
    }

    def __init__(self, config: VanillaTransformerConfig, token_embedding: nn.Embedding):
        super().__init__(config, token_embedding, config.decoder_layers)

    @accepts_past_key_values
    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if encoder_hidden_states is None:
            raise ValueError("The decoder attends to the encoder output: pass encoder_hidden_states.")
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        hidden_states = self.embedding(input_ids, inputs_embeds, past_length)  # (B, T, d_model)
        self_attention_mask = create_causal_mask(  # the cache is positional: its keyword's name changed in 5.24
            self.config, hidden_states, attention_mask, cache.self_attention_cache if cache is not None else None
        )
        cross_attention_mask = self._bidirectional_mask(
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                self_attention_mask,
                encoder_hidden_states,  # positional for checkpointing
                encoder_attention_mask=cross_attention_mask,
                **{CACHE: cache},
                **kwargs,  # the name checkpointing drops
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=self.layer_norm(hidden_states), **{CACHE: cache}
        )


# ---------------------------------------------------------------------------------------------
# The models users load: encoder-decoder, and encoder-decoder with the pre-softmax projection
# ---------------------------------------------------------------------------------------------


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder input for teacher forcing: the start token, then the labels without their last token."""
    decoder_input_ids = labels.new_full(labels.shape, pad_token_id)
    decoder_input_ids[:, 0] = decoder_start_token_id
    decoder_input_ids[:, 1:] = labels[:, :-1]
    return decoder_input_ids.masked_fill(decoder_input_ids == -100, pad_token_id)


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """Encoder and decoder with their embeddings; returns the decoder's last hidden states."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        if config.share_encoder_decoder_embeddings:  # §3.4: one matrix for both embedding layers
            target_embedding = self.shared
            self._tied_weights_keys = {
                "encoder.embedding.token_embedding.weight": "shared.weight",
                "decoder.embedding.token_embedding.weight": "shared.weight",
            }
        else:
            self._tied_weights_keys = {"encoder.embedding.token_embedding.weight": "shared.weight"}
            target_embedding = nn.Embedding(config.decoder_vocab_size, config.d_model, config.pad_token_id)
        self.encoder = VanillaTransformerEncoder(config, self.shared)
        self.decoder = VanillaTransformerDecoder(config, target_embedding)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding):
        self.shared = value
        self.encoder.set_input_embeddings(value)
        if self.config.share_encoder_decoder_embeddings:
            self.decoder.set_input_embeddings(value)

    @accepts_past_key_values
    @can_return_tuple  # return_dict=False gives a tuple, as in every transformers model
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{CACHE: getattr(decoder_outputs, CACHE)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class VanillaTransformerForConditionalGeneration(VanillaTransformerGenerationMixin, VanillaTransformerPreTrainedModel):
    """The full model: encoder-decoder + linear pre-softmax projection (§3.4), with a loss and `generate()`.

    The loss is the token-level cross-entropy over labels that are not -100. Under gradient
    accumulation the Trainer passes ``num_items_in_batch`` (the number of target tokens in the
    whole accumulated batch): the loss is then a sum divided by it, so that N accumulated
    micro-batches give the gradient of one batch N times as large.
    """

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.decoder_vocab_size, bias=False)
        self._tied_weights_keys = {
            f"model.{target}": f"model.{source}" for target, source in self.model._tied_weights_keys.items()
        }
        if config.tie_word_embeddings:  # §3.4: the pre-softmax projection is the target embedding
            target_embedding = (
                "model.shared.weight"
                if config.share_encoder_decoder_embeddings
                else ("model.decoder.embedding.token_embedding.weight")
            )
            self._tied_weights_keys["lm_head.weight"] = target_embedding
        self.post_init()
        self.generation_config = paper_generation_config(config)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding):
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear):
        self.lm_head = value

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @accepts_past_key_values
    @can_return_tuple  # return_dict=False gives a tuple, as in every transformers model
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """``logits_to_keep``: the pre-softmax projection runs on the last that many positions only (0: all),
        or on the positions a 1-D tensor lists; generate() asks for the last one."""
        if labels is not None:
            use_cache = False  # teacher forcing sees the whole target at once
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        positions = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(outputs.last_hidden_state[:, positions])  # (B, T or logits_to_keep, V)
        loss = None if labels is None else label_smoothed_cross_entropy(logits, labels, num_items_in_batch)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE: getattr(outputs, CACHE)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )


__all__ = [
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "sinusoidal_positions",
]
