"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers 5.x model.

Read top to bottom, the file follows the paper: positional encoding (§3.5), embeddings (§3.4),
multi-head attention (§3.2), position-wise feed-forward network (§3.3), the residual connection
around every sub-layer (§3.1, §5.4), encoder and decoder layers and stacks (§3.1), then the
`PreTrainedModel` classes that plug it into the library (Auto classes, `generate()`, Trainer), the
one loss (label-smoothed cross-entropy, §5.4) and beam search (§6.1: transformers' algorithm and
bookkeeping, with less work per step).

One flag changes the architecture's shape: ``config.normalize_before`` switches every residual
connection from the paper's post-norm ``LayerNorm(x + Dropout(Sublayer(x)))`` to pre-norm
``x + Dropout(Sublayer(LayerNorm(x)))`` and adds a final LayerNorm after each stack. It is read in
one place, `ResidualConnection`, and in the stacks' constructors.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import math
from collections.abc import Callable

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria
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

# transformers 5.24 renamed the key/value cache `past_key_values` -> `cache` in generate()'s model
# kwargs, in forward arguments and in model outputs. We return it, and read generate()'s, under the
# installed version's name, and our forwards take either name (`accepts_past_key_values`).
CACHE = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


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
# §5.4 Dropout
# ---------------------------------------------------------------------------------------------


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose mask, on CPU, is drawn with ``torch.rand`` instead of ``bernoulli_``.

    The same distribution: each unit kept with probability 1 - p (a uniform float is >= p with that
    probability, to float precision) and scaled by 1 / (1 - p). On CPU ``F.dropout`` draws with
    ``bernoulli_``, about three times slower than ``torch.rand``, and dropout was a tenth of a training
    step; here the uniform draws become the scaled mask in place (kept for the backward as float32,
    4 bytes a unit where ``F.dropout`` keeps 1). Other devices keep ``F.dropout``'s fused kernel.
    """

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:  # the identity, as F.dropout returns it, without the call
            return hidden_states
        if hidden_states.device.type != "cpu" or not 0 < self.p < 1:
            return super().forward(hidden_states)
        mask = torch.rand_like(hidden_states).ge_(self.p).mul_(1 / (1 - self.p))  # 0 or 1 / (1 - p)
        return hidden_states * mask


# ---------------------------------------------------------------------------------------------
# §3.4 Embeddings: token embedding * sqrt(d_model) + positional encoding, then dropout (§5.4)
# ---------------------------------------------------------------------------------------------


class TransformerEmbedding(nn.Module):
    """Input of a stack: ``Dropout(embedding(x) * sqrt(d_model) + PE)`` (§3.4, §3.5, §5.4)."""

    def __init__(self, config: VanillaTransformerConfig, token_embedding: nn.Embedding):
        super().__init__()
        self.token_embedding = token_embedding
        self.scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.positional_encoding = POSITIONAL_ENCODINGS[config.position_embedding_type](config)
        self.max_positions = config.max_position_embeddings
        self.dropout = Dropout(config.dropout)

    def forward(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int | torch.Tensor = 0
    ) -> torch.Tensor:
        """``inputs_embeds`` stands for unscaled token embeddings; positions start at ``past_length``
        (an int, or a 0-d tensor from a static cache)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.token_embedding(input_ids)
        length = inputs_embeds.shape[1]
        if length == 0:
            raise ValueError(
                f"Got an empty sequence (shape {tuple(inputs_embeds.shape[:2])}): every input needs at least one "
                "token, e.g. the </s> that the tokenizer appends to every sentence."
            )
        # Compiled code cannot branch on a static cache's length; generate() checks the limit up front.
        if not torch.compiler.is_compiling() and int(past_length) + length > self.max_positions:
            raise ValueError(
                f"A sequence of {int(past_length) + length} tokens is longer than max_position_embeddings="
                f"{self.max_positions}. Shorten the input (or generation's max_length), or raise "
                f"max_position_embeddings in the config (sinusoidal positions need no retraining)."
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


class VanillaTransformerAttention(nn.Module):
    """Multi-head attention (§3.2.2): h heads of width d_k, concatenated and projected back.

    One class serves the three uses of §3.2.3: encoder self-attention, masked decoder
    self-attention (``is_causal``) and encoder-decoder ("cross") attention. In the decoder it
    reads and writes the key/value cache: self-attention appends this step's keys and values;
    cross-attention projects the encoder output once and reuses it at every later step.
    """

    def __init__(
        self, config: VanillaTransformerConfig, num_heads: int, is_causal: bool = False,
        is_cross_attention: bool = False, layer_idx: int | None = None,
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

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, T, d_model) -> (output (B, T, d_model), weights (B, H, T, S) or None)."""
        query = self._split_heads(self.q_proj(hidden_states))  # (B, H, T, D)
        source = encoder_hidden_states if self.is_cross_attention else hidden_states
        key, value = self._keys_and_values(source, cache)  # (B / beams, H, S, D) each
        beams = query.shape[0] // key.shape[0]  # beam search: the beams of a sentence share its encoder output
        if beams > 1:
            query = fold_beams(query, beams)  # (B / beams, H, beams * T, D)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        attention = with_chosen_backends(attention, self, hidden_states, cache)  # sdpa on CUDA: kernels by use
        output, weights = attention(
            self, query, key, value, attention_mask,
            dropout=self.attention_dropout if self.training else 0.0, scaling=self.scaling, **kwargs,
        )
        if beams > 1 and weights is not None:
            weights = unfold_beams(weights, beams)  # (B, H, T, S)
        output = output.reshape(*hidden_states.shape[:-1], -1)  # (B, T, H * D): beam-major rows unfold by themselves
        return self.out_proj(output), weights


def fold_beams(query: torch.Tensor, beams: int) -> torch.Tensor:
    """(B * beams, H, T, D) -> (B, H, beams * T, D): the beams of a sentence become more query positions.

    In beam search every beam of a sentence attends to the same encoder output, so cross-attention keeps
    its keys and values once per sentence (not once per beam: a quarter of the memory to read at beam 4,
    and nothing to reorder when the beams are reordered) and asks all the beams' queries at once.
    """
    rows, heads, length, dim = query.shape
    folded = query.view(rows // beams, beams, heads, length, dim).transpose(1, 2)
    return folded.reshape(rows // beams, heads, beams * length, dim)


def unfold_beams(weights: torch.Tensor, beams: int) -> torch.Tensor:
    """(B, H, beams * T, S) -> (B * beams, H, T, S), the inverse of `fold_beams` for attention weights."""
    sentences, heads, folded_length, source_length = weights.shape
    unfolded = weights.view(sentences, heads, beams, folded_length // beams, source_length).transpose(1, 2)
    return unfolded.reshape(sentences * beams, heads, folded_length // beams, source_length)


# ---------------------------------------------------------------------------------------------
# §3.3 Position-wise feed-forward network
# ---------------------------------------------------------------------------------------------


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, Eq. 2), with a configurable activation."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = Dropout(config.activation_dropout)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_dropout(self.activation(prepacked_linear(self.fc1, hidden_states)))
        return prepacked_linear(self.fc2, hidden_states)


# ---------------------------------------------------------------------------------------------
# §3.1 + §5.4 The residual connection around every sub-layer
# ---------------------------------------------------------------------------------------------


class ResidualConnection(nn.Module):
    """LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4); pre-norm: x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout)

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
            lambda x: self.cross_attention(
                x, encoder_attention_mask, encoder_hidden_states, cache=cache, **kwargs
            )[0],
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
            self.set_output_embeddings(self._get_resized_lm_head(projection, new_num_tokens, mean_resizing=mean_resizing))
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
    a final LayerNorm (pre-norm leaves the residual stream unnormalised)."""

    layer_class: type[nn.Module]

    def __init__(self, config: VanillaTransformerConfig, token_embedding: nn.Embedding, num_layers: int):
        super().__init__(config)
        self.embedding = TransformerEmbedding(config, token_embedding)
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
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask)
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask, **kwargs)
        return BaseModelOutput(last_hidden_state=self.layer_norm(hidden_states))


class VanillaTransformerDecoder(VanillaTransformerStack):
    """N identical layers over the embedded target prefix, attending to the encoder output (§3.1)."""

    layer_class = VanillaTransformerDecoderLayer
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
        self._check_beams_share(hidden_states.shape[0], encoder_hidden_states.shape[0])
        sentences = encoder_hidden_states.shape[0]
        cross_attention_mask = create_bidirectional_mask(  # one per sentence: its beams ask as more query positions
            config=self.config, inputs_embeds=hidden_states.reshape(sentences, -1, hidden_states.shape[-1]),
            attention_mask=encoder_attention_mask, encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states, self_attention_mask, encoder_hidden_states,  # positional for checkpointing
                encoder_attention_mask=cross_attention_mask, **{CACHE: cache}, **kwargs,  # the name checkpointing drops
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=self.layer_norm(hidden_states), **{CACHE: cache}
        )

    def _check_beams_share(self, rows: int, sentences: int) -> None:
        """Fewer encoder outputs than decoder rows means beams share their sentence's (`fold_beams`)."""
        if rows % sentences:
            raise ValueError(
                f"The decoder got {rows} rows for {sentences} encoded sentences: pass one encoder output per "
                "decoder row, or one per sentence with its beams in consecutive decoder rows."
            )
        if rows != sentences and self.config._attn_implementation not in ("eager", "sdpa"):
            raise ValueError(
                f"Beams sharing one encoder output ({rows} decoder rows for {sentences} sentences) need "
                f"attn_implementation 'eager' or 'sdpa', not {self.config._attn_implementation!r} (its CPU kernel "
                "fails on the folded queries): pass one encoder output per decoder row."
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


# §6.1: "We set the maximum output length during inference to input length + 50". Kept in the
# generation config under this name, so that it is saved, visible and can be changed or switched off.
MAX_NEW_TOKENS_BEYOND_INPUT = "max_new_tokens_beyond_input"
MAX_EXTRA_OUTPUT_TOKENS = 50
# §6.1's "length penalty alpha = 0.6" is GNMT's (Wu et al., 2016, eq. 14): a finished hypothesis Y scores
# log P(Y) / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha, as tensor2tensor computed it. transformers' beam
# search divides by |Y| ** alpha instead. The generation config says which: "gnmt" (the paper's) or
# "length" (transformers' and CTranslate2's); a config without the field is transformers' own.
LENGTH_PENALTY_FORMULA = "length_penalty_formula"
LENGTH_PENALTY_FORMULAS = ("gnmt", "length")


def penalty_formula_of(generation_config: GenerationConfig) -> str:
    """The length penalty a saved generation config decodes with: its ``length_penalty_formula``, else "length"."""
    return getattr(generation_config, LENGTH_PENALTY_FORMULA, None) or "length"


def paper_generation_config(config: VanillaTransformerConfig) -> GenerationConfig:
    """Decoding as in §6.1: beam size 4, GNMT's length penalty with alpha = 0.6, stop when 4 hypotheses
    end, and at most input length + 50 new tokens (``max_new_tokens_beyond_input``, applied by `generate()`)."""
    return GenerationConfig(
        num_beams=4,
        length_penalty=0.6,
        early_stopping=True,
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        **{MAX_NEW_TOKENS_BEYOND_INPUT: MAX_EXTRA_OUTPUT_TOKENS, LENGTH_PENALTY_FORMULA: "gnmt"},
    )


def gnmt_length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6) ** alpha, with |Y| the generated tokens, </s> included (GNMT, eq. 14)."""
    return ((5 + length) / 6) ** alpha


def label_smoothed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Per-token cross-entropy with label smoothing (§5.4), summed and divided by the number of tokens.

    ``(1 - eps) * -log p(y) + eps * mean over the vocabulary of -log p`` (Szegedy et al., 2016; the
    same as fairseq's and ``cross_entropy(label_smoothing=eps)``); labels of -100 are ignored. The
    sum is divided by ``num_items_in_batch`` when given (the Trainer's count of target tokens in the
    whole accumulated batch, over all processes), else by this batch's tokens: every token weighs
    the same however the tokens fall into micro-batches. With ``label_smoothing=0`` it is the
    negative log-likelihood per token, whose exp is the perplexity. Computed by `SmoothedCrossEntropy`
    (under ``torch.compile`` by ``cross_entropy``, which the compiler fuses itself).
    """
    labels = labels.to(logits.device)
    count = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum().clamp(min=1)
    count = count.to(logits.device) if torch.is_tensor(count) else count
    logits, labels = logits.flatten(0, -2), labels.flatten()
    if torch.compiler.is_compiling():
        total = nn.functional.cross_entropy(
            logits.float(), labels, ignore_index=-100, reduction="sum", label_smoothing=label_smoothing
        )
        return total / count
    return SmoothedCrossEntropy.apply(logits, labels, label_smoothing, count)


class SmoothedCrossEntropy(torch.autograd.Function):
    """`label_smoothed_cross_entropy` over rows of logits (N, V), with its gradient computed in the same pass.

    Per row, with L = log sum_v exp(x_v): loss = L - (1 - eps) x_y - eps mean_v(x_v), and gradient
    softmax(x) - (1 - eps) onehot(y) - eps / V (zero for a label of -100), both divided by the token
    count. A chunk of rows at a time, in float32, while the chunk is in cache: no (N, V) log-probability
    tensor, no float copy of all the logits, and the backward only scales the gradient (when the loss
    was scaled after). ``cross_entropy`` with label smoothing builds several (N, V) temporaries; on CPU
    this takes half its time (benchmarks/profile_training_step.py).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, smoothing: float, count) -> torch.Tensor:
        ignored = labels == -100
        targets = labels.masked_fill(ignored, 0)
        row_weight = (~ignored).float() / count
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        total = logits.new_zeros((), dtype=torch.float32)
        for rows in _row_chunks(logits):
            x = logits[rows].float()
            maximum = x.amax(dim=-1, keepdim=True)
            in_place = grad[rows] if grad is not None and grad.dtype == torch.float32 else None
            exp = torch.sub(x, maximum, out=in_place).exp_()
            normalizer = exp.sum(dim=-1, keepdim=True)
            target = x.gather(1, targets[rows, None])
            loss = maximum + normalizer.log() - (1 - smoothing) * target - smoothing * x.mean(dim=-1, keepdim=True)
            weight = row_weight[rows, None]
            total += (loss * weight).sum()
            if grad is not None:  # (softmax - eps / V) * weight, then -(1 - eps) * weight at the label
                torch.addcmul(weight * (-smoothing / x.shape[-1]), exp, weight / normalizer, out=exp)
                exp.scatter_add_(1, targets[rows, None], weight * (smoothing - 1))
                if in_place is None:
                    grad[rows] = exp
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad if bool(grad_total == 1) else grad * grad_total, None, None, None  # loss.backward() passes 1


def _row_chunks(logits: torch.Tensor) -> list[slice]:
    """Slices of rows of about 2^18 elements on CPU (a core's L2 cache; measured fastest), 2^28 elsewhere."""
    elements = 2**18 if logits.device.type == "cpu" else 2**28
    step = max(1, elements // logits.shape[-1])
    return [slice(start, start + step) for start in range(0, logits.shape[0], step)]


# ---------------------------------------------------------------------------------------------
# §6.1 Beam search: generate()'s algorithm and hypotheses, with less work per step
# ---------------------------------------------------------------------------------------------


def best_continuations(
    log_probs: torch.Tensor, beam_scores: torch.Tensor, keep: int, top_k: Callable = torch.topk
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``keep`` best (beam, token) continuations of each sentence, best first: scores, beams, tokens (B, keep).

    generate() adds each beam's score to all V of its token log-probabilities and takes the top ``keep``
    of those B x (beams * V) sums. A sentence's best ``keep`` can only come from each beam's best ``keep``
    tokens, so those are all this adds: the same sums, beams x keep of them instead of beams x V.
    ``log_probs`` has a row per beam (B * beams, V), or one per sentence (B, V) when its beams are still
    copies of each other (the first step).
    """
    sentences, beams = beam_scores.shape
    token_scores, tokens = top_k(log_probs, keep)  # (B * beams or B, keep)
    token_scores, tokens = (t.view(sentences, -1, keep).expand(sentences, beams, keep) for t in (token_scores, tokens))
    sums = (token_scores + beam_scores[:, :, None]).reshape(sentences, beams * keep)
    scores, picked = torch.topk(sums, keep)  # (B, keep)
    return scores, picked // keep, tokens.reshape(sentences, beams * keep).gather(1, picked)


def runs_as_defined(module: nn.Module, forward: Callable) -> bool:
    """Whether calling ``module`` runs ``forward`` and nothing else: no hooks on it (accelerate's device
    placement is one) or on every module, and no forward replaced on the instance, by a subclass or by
    ``module.compile()``. Only then may a caller compute what the call would, another way."""
    return not (
        module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook")
        or nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks
        or "forward" in vars(module) or type(module).forward is not forward
        or getattr(module, "_compiled_call_impl", None) is not None
    )


# Beam search on CPU multiplies by the decoder FFN's and the output projection's weights reordered once per
# generate() call into oneDNN's blocked layout: MKL packs a plain weight again at every product, and at
# decoding's few rows that is a large part of it (README, "Prepacked weights"). The reordered copies live
# in this context variable while the search runs (None otherwise).
PREPACKED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("prepacked_weights", default=None)


def prepacked_linear(linear: nn.Module, states: torch.Tensor) -> torch.Tensor:
    """``linear(states)``, from the weight the running beam search reordered for oneDNN (`prepack`) if it
    did; equal to x W^T + b up to float32 rounding in another order. Training and compiled code (which
    cannot trace a context variable) take ``linear(states)`` at once."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return linear(states)
    packed = (PREPACKED.get() or {}).get(linear)
    if packed is None or states.dtype != torch.float32:
        return linear(states)
    return onednn_linear(states, packed, linear.bias)


def onednn_linear(states: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b over the last dimension of ``states``, W reordered for oneDNN (`prepack`)."""
    product = torch.ops.mkldnn._linear_pointwise(states.reshape(-1, states.shape[-1]), packed, bias, "none", [], "")
    return product.view(*states.shape[:-1], product.shape[-1])


def prepack(linears: list[nn.Module], rows: int) -> dict[nn.Module, torch.Tensor]:
    """The weights of those ``linears`` that are plain float32 ``nn.Linear`` layers on the CPU, each reordered
    for oneDNN (a copy) for products of about ``rows`` rows; nothing where oneDNN is missing, switched off
    (``torch.backends.mkldnn.flags(enabled=False)``) or fails its check, under autocast, or for quantised,
    adapted, hooked or patched layers, which keep their own forward."""
    if not (torch.backends.mkldnn.enabled and not torch.is_autocast_enabled("cpu") and onednn_linear_works()):
        return {}
    return {
        linear: torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        for linear in linears
        if type(linear) is nn.Linear and type(linear.weight) is nn.Parameter and linear.weight.device.type == "cpu"
        and linear.weight.dtype == torch.float32 and runs_as_defined(linear, nn.Linear.forward)
    }


@functools.cache
def onednn_linear_works() -> bool:
    """Whether this torch has oneDNN's private linear operators as `prepacked_linear` calls them, giving
    `F.linear`'s product (checked once): where a torch version changes them, beam search keeps plain weights."""
    try:
        weight, bias, states = (torch.linspace(-1, 1, n).sin().reshape(shape) for n, shape in (
            (384, (24, 16)), (24, (24,)), (48, (3, 16))))  # fixed values: the global random state stays as it is
        product = onednn_linear(states, torch.ops.mkldnn._reorder_linear_weight(weight, 3), bias)
        return torch.allclose(product, nn.functional.linear(states, weight, bias), atol=1e-4)
    except (AttributeError, RuntimeError, TypeError):
        return False


TOP_K_BLOCK = 128


def blockwise_top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(scores, k)`` along the last dimension (V), through blocks of 128: the k best values lie
    in the k blocks with the highest maxima, so one pass takes the block maxima and the top-k runs over k
    blocks (and the last V mod 128 values) instead of all V; on CPU about twice as fast at V = 10^4. The
    same values; among exactly equal ones the indices may be others (as they may between top-k kernels).
    """
    rows, size = scores.shape
    blocks = size // TOP_K_BLOCK
    if blocks <= k:
        return torch.topk(scores, k)
    whole = scores[:, : blocks * TOP_K_BLOCK].view(rows, blocks, TOP_K_BLOCK)
    best_blocks = torch.topk(whole.amax(dim=-1), k).indices  # (rows, k)
    offsets = torch.arange(TOP_K_BLOCK, device=scores.device)
    candidates = whole.gather(1, best_blocks[:, :, None].expand(rows, k, TOP_K_BLOCK)).view(rows, -1)
    indices = (best_blocks[:, :, None] * TOP_K_BLOCK + offsets).view(rows, -1)
    rest = torch.arange(blocks * TOP_K_BLOCK, size, device=scores.device).expand(rows, -1)
    values, picked = torch.topk(torch.cat([candidates, scores[:, blocks * TOP_K_BLOCK :]], dim=1), k)
    return values, torch.cat([indices, rest], dim=1).gather(1, picked)


# Logits processors that treat every row on its own (no batch index, no per-sentence state): with them,
# leaving a finished sentence's rows out of the batch changes nothing for the other rows.
ROW_WISE_PROCESSORS = (
    MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor, NoBadWordsLogitsProcessor,
    SuppressTokensLogitsProcessor, SuppressTokensAtBeginLogitsProcessor, ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor, NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor,
)
ROW_WISE_CRITERIA = (MaxLengthCriteria, EosTokenCriteria, MaxTimeCriteria)


class BeamSearch:
    """`GenerationMixin._beam_search` (transformers 5) for this model: the same candidates, scores and
    hypotheses, with less work per step. Its bookkeeping (`_update_finished_beams` and friends) is
    transformers' own; what differs is how much the model and the vocabulary-sized tensors cost:

    - cross-attention keys and values are computed and kept once per sentence, not once per beam, and
      never reordered (`fold_beams`);
    - the best continuations come from each beam's best tokens (`best_continuations`) instead of a
      (B, beams * V) tensor of sums, and the logits are not copied first;
    - a sentence whose hypotheses can no longer change (all its beams finished, and early stopping or
      no possible improvement) leaves the batch; generate() keeps decoding it until the last one ends.
    - the cross-attention mask is made once per batch, not at every step.
    - the output projection runs on the last position only, and its logits stay inside the search;
    - on the CPU, the decoder FFN and the output projection multiply by weights reordered once per call
      for oneDNN (`prepack`, `prepacked_linear`).
    - the paper's decoding (early stopping, no logits processors) takes `_lean_step`: the same
      bookkeeping functions, called only at the steps where they can change the result.

    `covers` says which calls it serves; the rest go to transformers' `_beam_search`.
    """

    best_continuations = staticmethod(best_continuations)
    lean_steps = True  # `_lean_step` wherever it applies
    prepacked_weights = True  # `prepack` wherever it applies

    @staticmethod
    def covers(model, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs) -> bool:
        cache, encoder_outputs = model_kwargs.get(CACHE), model_kwargs.get("encoder_outputs")
        return (
            not (generation_config.do_sample or generation_config.return_dict_in_generate or synced_gpus)
            and generation_config.prefill_chunk_size is None
            and set(model_kwargs) <= {"attention_mask", "encoder_outputs", CACHE, "use_cache"}
            and bool(model_kwargs.get("use_cache"))
            and type(cache) is EncoderDecoderCache and type(cache.self_attention_cache) is DynamicCache
            and not getattr(cache, "_is_user_defined", False) and cache.get_seq_length() == 0
            and isinstance(encoder_outputs, BaseModelOutput) and list(encoder_outputs.keys()) == ["last_hidden_state"]
            and all(type(processor) in ROW_WISE_PROCESSORS for processor in logits_processor)
            and all(type(criterion) in ROW_WISE_CRITERIA for criterion in stopping_criteria)
            and model.config._attn_implementation in ("eager", "sdpa")  # flex on CPU fails on folded prompts
        )

    def __init__(self, model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs):
        self.model, self.config = model, generation_config
        self.logits_processor, self.stopping_criteria = logits_processor, stopping_criteria
        self.beams = generation_config.num_beams
        # early stopping and no logits processor (the paper's decoding): see `_lean_step`
        self.lean = self.lean_steps and generation_config.early_stopping is True and not logits_processor
        eos = generation_config._eos_token_tensor
        self.keep = max(2, 1 + (eos.shape[0] if eos is not None else 0)) * self.beams  # candidates per sentence
        self.top_beams_mask = torch.arange(self.keep, device=input_ids.device) < self.beams
        sentences, self.prompt_length = input_ids.shape[0] // self.beams, input_ids.shape[1]
        self.length = self.prompt_length
        self.row_offsets = torch.arange(sentences, device=input_ids.device)[:, None] * self.beams  # first row
        # generate() repeated every sentence's encoder output and mask for its beams: keep one of each
        self.encoder_hidden_states = model_kwargs["encoder_outputs"].last_hidden_state[:: self.beams]
        mask = model_kwargs.get("attention_mask")
        # the decoder's cross-attention mask, made once (the decoder would make it again at every step):
        # (sentences, 1, 1, source) is the same for every query position, so it serves every step
        self.attention_mask = create_bidirectional_mask(
            config=model.config, inputs_embeds=self.encoder_hidden_states[:, :1], encoder_hidden_states=
            self.encoder_hidden_states, attention_mask=mask[:: self.beams] if mask is not None else None,
        )
        self.cache = model_kwargs[CACHE]  # generate()'s, empty
        # weights reordered for oneDNN while this call runs; none for a model whose call runs more than its
        # forward (hooks, a compiled forward, which would trace the context variable)
        linears = [linear for layer in model.model.decoder.layers for linear in (layer.feed_forward.fc1, layer.feed_forward.fc2)]
        self.whole_forward = not runs_as_defined(model, VanillaTransformerForConditionalGeneration.forward)
        self.prepacked = prepack([*linears, model.get_output_embeddings()], rows=input_ids.shape[0]) if (
            self.prepacked_weights and not self.whole_forward
        ) else {}
        self.sentence_ids = torch.arange(sentences, device=input_ids.device)  # batch position of each kept sentence
        self.state = self._initial_state(input_ids, sentences)
        self.result = {name: self.state[name].clone() for name in ("sequences", "beam_indices")}

    def _initial_state(self, input_ids: torch.Tensor, sentences: int) -> dict[str, torch.Tensor]:
        """The tensors `_beam_search` starts from, with the same fill values. The lean step keeps no beam
        indices: where `_beam_search` keeps a finished hypothesis' beam indices, it keeps their count
        (what `run` crops the output by), as a (sentences, beams, 1) tensor."""
        pad, eos = self.config._pad_token_tensor, self.config._eos_token_tensor
        fill = pad or eos[0] if eos is not None else -1  # as transformers writes it
        device, shape, beams = input_ids.device, (sentences, self.beams), self.beams
        running_sequences = torch.full((*shape, self.config.max_length), fill, dtype=torch.long, device=device)
        running_sequences[:, :, : self.length] = input_ids.view(sentences, beams, -1)
        running_beam_scores = torch.zeros(shape, device=device)
        running_beam_scores[:, 1:] = -1.0e9  # only the first beam's continuations count at the first step
        state = {
            "running_sequences": running_sequences, "running_beam_scores": running_beam_scores,
            "sequences": running_sequences.clone(), "beam_scores": torch.full(shape, -1.0e9, device=device),
            "is_sent_finished": torch.zeros(shape, dtype=torch.bool, device=device),
            "is_early_stop_heuristic_unsatisfied": torch.ones((sentences, 1), dtype=torch.bool, device=device),
        }
        if self.lean:
            return {**state, "beam_indices": torch.zeros((*shape, 1), dtype=torch.long, device=device)}
        indices = torch.full((*shape, self.config.max_length - self.length), -1, dtype=torch.int32, device=device)
        return {
            **state, "running_beam_indices": indices, "beam_indices": indices.clone(),
            "next_token_hits_stopping_criteria": torch.zeros(shape, dtype=torch.bool, device=device),
        }

    def run(self) -> torch.LongTensor:
        token = PREPACKED.set(self.prepacked)  # what `prepacked_linear` multiplies by while the search runs
        try:
            return self._search()
        finally:
            PREPACKED.reset(token)

    def _search(self) -> torch.LongTensor:
        if self.lean:
            while self._lean_step():
                pass
        else:
            while True:
                self._step()
                if not self._unfinished():
                    break
                self._leave_out_finished_sentences()
        self._store(torch.ones_like(self.sentence_ids, dtype=torch.bool))
        returned = self.config.num_return_sequences
        sequences = self.result["sequences"][:, :returned].flatten(0, 1)
        beam_indices = self.result["beam_indices"][:, :returned].flatten(0, 1)
        # as `_beam_search` crops its output: to the most generated tokens among the returned hypotheses
        generated = beam_indices.max() if self.lean else (beam_indices + 1).bool().sum(dim=1).max()
        return sequences[:, : self.prompt_length + generated]

    def _step(self) -> None:
        first = self.length == self.prompt_length
        scores, beam, token = self._continuations(first)
        state, model, beams = self.state, self.model, self.beams
        candidates = model._gather_beams(state["running_sequences"], beam)
        candidates[:, :, self.length] = token
        candidate_indices = model._gather_beams(state["running_beam_indices"], beam)
        candidate_indices[:, :, self.length - self.prompt_length] = beam + self.row_offsets
        state["next_token_hits_stopping_criteria"] = self._hits(token)
        state["running_sequences"], state["running_beam_scores"], state["running_beam_indices"] = (
            model._get_running_beams_for_next_iteration(
                scores, candidates, candidate_indices, state["next_token_hits_stopping_criteria"], beams
            )
        )
        self._update_finished_beams(scores, candidates, candidate_indices, state["next_token_hits_stopping_criteria"])
        beam_idx = state["running_beam_indices"][..., self.length - self.prompt_length].flatten()
        # cross-attention: once per sentence, never reordered; after the first step, one row per beam
        self.cache.self_attention_cache.reorder_cache(beam_idx // beams if first else beam_idx)
        self.length += 1
        state["is_early_stop_heuristic_unsatisfied"] = model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=state["is_early_stop_heuristic_unsatisfied"],
            running_beam_scores=state["running_beam_scores"], beam_scores=state["beam_scores"],
            is_sent_finished=state["is_sent_finished"], cur_len=self.length, max_length=self.config.max_length,
            decoder_prompt_len=self.prompt_length, early_stopping=self.config.early_stopping,
            length_penalty=self.config.length_penalty,
        )

    def _lean_step(self) -> bool:
        """`_step` for early stopping without logits processors (the paper's decoding), with the same
        hypotheses and half the search's tensor operations per step (61 against 119 in a 3-layer model
        at beam 4 x 32, whose decoder runs 189); says whether to go on.

        With early stopping, a sentence leaves the batch as soon as all its beams have a finished
        hypothesis, so for every sentence still in it the early-stop heuristic holds (it fails only
        once every beam has one), and `_update_finished_beams` adds nothing to the scores of its
        candidates but -1e9 to those that did not just end. A step where no top candidate ends
        therefore changes only slots that hold no finished hypothesis: they rank below every finished
        one, and without logits processors (no -inf scores) the search always ends with finished
        hypotheses in the returned slots. So `_update_finished_beams` runs only at the steps where a
        hypothesis ends, `_check_early_stop_heuristic` never, and no beam indices are kept.
        """
        first = self.length == self.prompt_length
        scores, beam, token = self._continuations(first)
        state, model = self.state, self.model
        hits = self._hits(token)
        ended = bool((hits & self.top_beams_mask).any())
        if ended:  # transformers' merge, with each candidate's count of generated tokens as its "beam indices"
            candidates = model._gather_beams(state["running_sequences"], beam)
            candidates[:, :, self.length] = token
            generated = torch.full_like(beam, self.length + 1 - self.prompt_length)[:, :, None]
            self._update_finished_beams(scores, candidates, generated, hits)
        if bool(hits.all()):  # no candidate can go on (the length limit), as `_beam_search_has_unfinished_sequences`
            return False
        # the best `beams` candidates that did not end go on (`_get_running_beams_for_next_iteration`)
        running_scores = scores + hits.to(torch.float32) * -1.0e9
        picked = torch.topk(running_scores, k=self.beams)[1]
        parent = beam.gather(1, picked)
        state["running_sequences"] = model._gather_beams(state["running_sequences"], parent)
        state["running_sequences"][:, :, self.length] = token.gather(1, picked)
        state["running_beam_scores"] = running_scores.gather(1, picked)
        rows = (parent + self.row_offsets).flatten()
        # cross-attention: once per sentence, never reordered; after the first step, one row per beam
        self.cache.self_attention_cache.reorder_cache(rows // self.beams if first else rows)
        self.length += 1
        if ended:
            if bool(state["is_sent_finished"].all()):  # every sentence has its hypotheses
                return False
            self._leave_out_finished_sentences()
        return True

    def _hits(self, token: torch.Tensor) -> torch.Tensor:
        """Which candidates hit a stopping criterion. The criteria `covers` admits read a sequence's last
        token and its length only, so they get a view with those, not the candidates' sequences."""
        last_tokens = token.reshape(-1, 1).expand(-1, self.length + 1)
        return self.stopping_criteria(last_tokens, None).view(token.shape)

    def _update_finished_beams(self, scores, candidates, candidate_indices, hits) -> None:
        state = self.state
        state["sequences"], state["beam_scores"], state["beam_indices"], state["is_sent_finished"] = (
            self.model._update_finished_beams(  # by keyword, as `_beam_search` calls it (the GNMT penalty hooks in)
                sequences=state["sequences"], topk_running_sequences=candidates, beam_scores=state["beam_scores"],
                topk_log_probs=scores, beam_indices=state["beam_indices"], topk_running_beam_indices=candidate_indices,
                is_early_stop_heuristic_unsatisfied=state["is_early_stop_heuristic_unsatisfied"],
                is_sent_finished=state["is_sent_finished"], next_token_hits_stopping_criteria=hits,
                top_num_beam_mask=self.top_beams_mask, num_beams=self.beams, cur_len=self.length,
                decoder_prompt_len=self.prompt_length, length_penalty=self.config.length_penalty,
                early_stopping=self.config.early_stopping,
            )
        )

    def _continuations(self, first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode one position and pick each sentence's best continuations. On the first step the beams of
        a sentence are copies of each other, so the decoder runs on one row per sentence."""
        running = self.state["running_sequences"]
        sequences = (running[:, :1] if first else running)[:, :, : self.length].flatten(0, 1)  # (rows, length)
        logits = self._next_token_logits(
            encoder_outputs=(self.encoder_hidden_states,), attention_mask=self.attention_mask,
            decoder_input_ids=sequences if first else sequences[:, -1:], cache=self.cache, use_cache=True,
        )
        log_probs = nn.functional.log_softmax(logits.float(), dim=-1)  # (rows, V)
        log_probs = self.logits_processor(sequences, log_probs)
        # processors can leave fewer than `keep` finite scores: then tied -inf ones are picked as generate() does
        top_k = blockwise_top_k if not self.logits_processor else torch.topk
        return self.best_continuations(log_probs, self.state["running_beam_scores"], self.keep, top_k)

    def _next_token_logits(self, **inputs) -> torch.Tensor:
        """The logits at the last position (rows, V): the decoder, then the output projection on that
        position alone (`prepacked_linear`). The whole forward where calling the model runs more than its
        forward (hooks, a replaced or compiled forward): whoever put that there expects it to run."""
        model = self.model
        if self.whole_forward:  # decided once, in __init__
            return model(**inputs).logits[:, -1]
        hidden_states = model.model(**inputs).last_hidden_state[:, -1:]  # (rows, 1, d_model), as the forward has it
        return prepacked_linear(model.get_output_embeddings(), hidden_states)[:, -1]

    def _unfinished(self) -> bool:
        state = self.state
        return bool(self.model._beam_search_has_unfinished_sequences(
            state["is_early_stop_heuristic_unsatisfied"], state["is_sent_finished"],
            state["next_token_hits_stopping_criteria"], self.config.early_stopping,
        ))

    def _leave_out_finished_sentences(self) -> None:
        """Sentences whose finished hypotheses can no longer change leave the batch (and the cache)."""
        state = self.state
        improvable = state["is_early_stop_heuristic_unsatisfied"][:, 0] & (self.config.early_stopping is not True)
        done = state["is_sent_finished"].all(dim=-1) & ~improvable
        if not done.any():
            return
        self._store(done)
        kept = (~done).nonzero().squeeze(1)
        self.state = {name: tensor[kept] for name, tensor in state.items()}
        rows = (kept[:, None] * self.beams + torch.arange(self.beams, device=kept.device)).flatten()
        encoder_rows = kept if self.encoder_hidden_states.shape[0] == self.sentence_ids.shape[0] else rows
        self.sentence_ids = self.sentence_ids[kept]
        self.row_offsets = self.row_offsets[: kept.shape[0]]
        self.encoder_hidden_states = self.encoder_hidden_states[encoder_rows]
        self.attention_mask = self.attention_mask[encoder_rows] if self.attention_mask is not None else None
        self.cache.self_attention_cache.batch_select_indices(rows)
        self.cache.cross_attention_cache.batch_select_indices(encoder_rows)

    def _store(self, sentences: torch.Tensor) -> None:
        """Copy these sentences' finished hypotheses to their batch positions in the result."""
        for name, tensor in self.result.items():
            tensor[self.sentence_ids[sentences]] = self.state[name][sentences]


def pad_after_end_of_sequence(sequences: torch.Tensor, eos_token_id: int, pad_token_id: int) -> torch.Tensor:
    """Every token after a row's first ``</s>`` becomes ``<pad>``.

    Beam search in transformers fills finished rows with ``pad_token_id or eos_token_id``, so a pad
    id of 0 (falsy) fills them with ``</s>``, and whoever counts non-pad tokens (the Trainer's
    ``gen_len``) counts the filler too.
    """
    ended_before = (sequences == eos_token_id).long().cumsum(dim=-1) - (sequences == eos_token_id).long()
    return sequences.masked_fill(ended_before > 0, pad_token_id)


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
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
            target_embedding = "model.shared.weight" if config.share_encoder_decoder_embeddings else (
                "model.decoder.embedding.token_embedding.weight"
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
        **kwargs,
    ) -> Seq2SeqLMOutput:
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
        logits = self.lm_head(outputs.last_hidden_state)  # (B, T, V)
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

    def generate(self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None, **kwargs):
        """`GenerationMixin.generate` with the paper's length limit (§6.1) and outputs padded with ``<pad>``.

        Length, first match wins: ``max_length`` or ``max_new_tokens`` in the call (or in the
        ``generation_config`` passed); ``max_new_tokens`` set on the model's generation config; the
        paper's rule, at most (longest source in the batch) + ``max_new_tokens_beyond_input`` (50)
        tokens, capped by ``max_position_embeddings``. The rule beats the ``max_length`` stored in the
        model's generation config, which ``Seq2SeqTrainer`` sets to transformers' default of 20 as a
        side effect of evaluating; set ``max_new_tokens_beyond_input = None`` to use ``max_length``.
        """
        limit = self._new_tokens_limit(inputs, generation_config, kwargs)
        if limit is not None:  # as a max_length (the start token + limit), which wins over the model's own
            ours = generation_config is None
            generation_config = copy.deepcopy(generation_config or self.generation_config)
            if ours:  # the call's settings go into our copy (transformers warns when given a config and settings);
                # None (unset a default) and cache_implementation (read from the call by generate()) stay in the call
                settings = [k for k, v in kwargs.items() if v is not None and k != "cache_implementation"]
                kwargs.update(generation_config.update(**{k: kwargs.pop(k) for k in settings}))
            generation_config.max_length, generation_config.max_new_tokens = limit + 1, None
        self._check_length_fits(generation_config or self.generation_config, kwargs)
        formula = kwargs.pop(LENGTH_PENALTY_FORMULA, None) or self._setting(generation_config, LENGTH_PENALTY_FORMULA)
        if formula not in (None, *LENGTH_PENALTY_FORMULAS):
            raise ValueError(f"{LENGTH_PENALTY_FORMULA}={formula!r}: use 'gnmt' (the paper's) or 'length' (transformers').")
        self._gnmt_length_penalty = formula == "gnmt"  # read by the two beam-search scoring steps below
        try:
            output = super().generate(inputs, generation_config, **kwargs)
        finally:
            self._gnmt_length_penalty = False
        eos, pad = (self._setting(generation_config, name, kwargs) for name in ("eos_token_id", "pad_token_id"))
        eos = eos[0] if isinstance(eos, list) and len(eos) == 1 else eos
        if isinstance(eos, int) and pad is not None:  # pad what follows </s> (beam search may not: see above)
            if torch.is_tensor(output):
                return pad_after_end_of_sequence(output, eos, pad)
            output.sequences = pad_after_end_of_sequence(output.sequences, eos, pad)
        return output

    def _beam_search(
        self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False, **model_kwargs
    ):
        """generate()'s beam search: `BeamSearch` where it covers the call, else transformers' own."""
        if BeamSearch.covers(self, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs):
            return BeamSearch(self, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs).run()
        return super()._beam_search(
            input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, **model_kwargs
        )

    def _reorder_cache(self, cache: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
        """transformers' beam search reorders the cache through this: the cross-attention keys and values
        are the same for every beam of a sentence, so only self-attention's are reordered."""
        cache.self_attention_cache.reorder_cache(beam_idx)
        return cache

    # Beam search (transformers' `_beam_search`) divides a finished hypothesis' log-probability by
    # length ** length_penalty in these two steps; for GNMT's penalty they get the log-probabilities
    # rescaled by length ** alpha / lp(length), so that the division leaves log P / lp.
    _gnmt_length_penalty = False

    def _update_finished_beams(self, *, topk_log_probs, cur_len, decoder_prompt_len, length_penalty, **kwargs):
        if self._gnmt_length_penalty:
            length = cur_len + 1 - decoder_prompt_len
            topk_log_probs = topk_log_probs * (length**length_penalty / gnmt_length_penalty(length, length_penalty))
        return super()._update_finished_beams(
            topk_log_probs=topk_log_probs, cur_len=cur_len, decoder_prompt_len=decoder_prompt_len,
            length_penalty=length_penalty, **kwargs,
        )

    def _check_early_stop_heuristic(self, *, running_beam_scores, cur_len, max_length, decoder_prompt_len,
                                    early_stopping, length_penalty, **kwargs):
        if self._gnmt_length_penalty:  # the same hypothetical length as transformers' heuristic
            length = max_length if early_stopping == "never" and length_penalty > 0.0 else cur_len
            length -= decoder_prompt_len
            running_beam_scores = running_beam_scores * (
                length**length_penalty / gnmt_length_penalty(length, length_penalty))
        return GenerationMixin._check_early_stop_heuristic(
            running_beam_scores=running_beam_scores, cur_len=cur_len, max_length=max_length,
            decoder_prompt_len=decoder_prompt_len, early_stopping=early_stopping, length_penalty=length_penalty,
            **kwargs,
        )

    def _setting(self, generation_config: GenerationConfig | None, name: str, kwargs: dict | None = None):
        """A generation setting: the call's, else the passed config's, else the model's (as `generate()`
        merges them)."""
        for value in ((kwargs or {}).get(name), getattr(generation_config, name, None)):
            if value is not None:
                return value
        return getattr(self.generation_config, name, None)

    def _new_tokens_limit(self, inputs, generation_config: GenerationConfig | None, kwargs: dict) -> int | None:
        """max_new_tokens under the paper's rule, or None when a length was given or the rule is off."""
        if any(kwargs.get(k) is not None for k in ("max_length", "max_new_tokens")):
            return None
        if generation_config is not None and (generation_config.max_length or generation_config.max_new_tokens):
            return None
        if self.generation_config.max_new_tokens is not None:  # set on the model's config by the user
            return None
        holder = next(
            (c for c in (generation_config, self.generation_config) if hasattr(c, MAX_NEW_TOKENS_BEYOND_INPUT)), None
        )
        # A generation config saved before the field existed gets the paper's rule too.
        extra = getattr(holder, MAX_NEW_TOKENS_BEYOND_INPUT) if holder is not None else MAX_EXTRA_OUTPUT_TOKENS
        source_length = _source_length(inputs, kwargs)
        if extra is None or source_length is None:
            return None
        return min(source_length + extra, self.config.max_position_embeddings - 1)

    def _check_length_fits(self, generation_config: GenerationConfig, kwargs: dict) -> None:
        """Refuse, before decoding, a length the positional encoding cannot reach (the decoder's first
        position holds the start token)."""
        new_tokens = kwargs.get("max_new_tokens", generation_config.max_new_tokens)
        total = kwargs.get("max_length", generation_config.max_length)
        positions = self.config.max_position_embeddings
        if (new_tokens is not None and new_tokens >= positions) or (new_tokens is None and total and total > positions):
            asked = f"max_new_tokens={new_tokens}" if new_tokens is not None else f"max_length={total}"
            raise ValueError(
                f"{asked} is more than this model can generate: max_position_embeddings={positions} positions, one of "
                f"them for the start token. Ask for at most {positions - 1} new tokens, or raise "
                "max_position_embeddings in the config (sinusoidal positions need no retraining)."
            )


def _source_length(inputs: torch.Tensor | None, kwargs: dict) -> int | None:
    """Length of the (padded) source batch, from whichever form the source was given in."""
    if inputs is not None:
        return inputs.shape[1]
    for name in ("input_ids", "inputs_embeds"):
        if kwargs.get(name) is not None:
            return kwargs[name].shape[1]
    encoder_outputs = kwargs.get("encoder_outputs")
    if encoder_outputs is not None:
        return encoder_outputs[0].shape[1]
    return None


__all__ = [
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "label_smoothed_cross_entropy",
    "pad_after_end_of_sequence",
    "gnmt_length_penalty",
    "paper_generation_config",
    "penalty_formula_of",
    "sinusoidal_positions",
]
