"""Attention maps as pictures, like the paper's Figures 3-5.

§3.2.3 of the paper names the three uses of attention in the Transformer: encoder self-attention,
masked decoder self-attention and encoder-decoder ("cross") attention. Each head of each layer
gives a matrix of weights softmax(Q K^T / sqrt(d_k)) (§3.2.1, Eq. 1): row i says how query token
i spreads its attention over the key tokens. Figures 3-5 draw such matrices for single sentences
as lines between two columns of tokens; heatmaps show the same numbers as a grid.

    maps = compute_attentions(model, tokenizer, "The law will never be perfect.")
    plot_attention_heatmap(maps, "cross_attention", layer=5, path="cross.png")
    plot_attention_connections(maps, "encoder_self_attention", layer=4, path="fig3.svg")
    write_attention_pictures(model, tokenizer, "The law will never be perfect.", "pictures/")

Layers and heads are counted from 0, as in ``model.model.encoder.layers[i]``: the paper's
"layer 5 of 6" is layer 4 here.

Matplotlib is an optional extra (``pip install 'vanilla-transformer[plot]'``), imported only when
a picture is drawn. Figures are built on the non-interactive Agg canvas and never shown; the
global pyplot state and backend are left alone. The package does not import this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .command_line import install_command
from .private_api import require

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

# Switches the attention implementation for a call and back (private: checked at import)
require("transformers.PretrainedConfig._attn_implementation")

# The three kinds of attention of §3.2.3, named like the modules of the model.
KINDS = ("encoder_self_attention", "decoder_self_attention", "cross_attention")
KIND_TITLES = {
    "encoder_self_attention": "Encoder self-attention",
    "decoder_self_attention": "Decoder self-attention (masked)",
    "cross_attention": "Encoder-decoder (cross) attention",
}
PICTURE_FORMATS = ("png", "svg")
# Byte-level BPE pieces keep their spaces and line breaks; show them, or labels lose word boundaries.
VISIBLE_WHITESPACE = str.maketrans({" ": "▁", "\n": "\\n", "\t": "\\t", "\r": "\\r"})
MAX_LINE_WIDTH = 4.0  # points, for an attention weight of 1 in the connection view
TOKEN_INCHES = 0.17  # room for one token's tick label in a heatmap
TICK_FONT_SIZE = 8
MAX_HEATMAP_COLUMNS = 4


# ---------------------------------------------------------------------------------------------
# The numbers: one sentence pair through the model with output_attentions=True
# ---------------------------------------------------------------------------------------------


@dataclass
class AttentionMaps:
    """The attention weights of one sentence pair, no batch dimension and no padding.

    ``target_tokens`` are the tokens the decoder reads: its start token ``<s>``, then the target
    (or the translation) with its ``</s>``. Row i of decoder self-attention and cross-attention is
    the decoder reading token i, i.e. predicting token i + 1. Tokens are readable pieces of the
    byte-level BPE: a space is shown as "▁", special tokens as they are.
    """

    source_tokens: list[str]
    target_tokens: list[str]
    encoder_self_attention: torch.Tensor  # (layers, heads, source, source)
    decoder_self_attention: torch.Tensor  # (layers, heads, target, target), zero above the diagonal
    cross_attention: torch.Tensor  # (layers, heads, target, source)

    def weights(self, kind: str) -> torch.Tensor:
        """The (layers, heads, query, key) weights of one kind of attention (§3.2.3)."""
        return getattr(self, _checked_kind(kind))

    def tokens(self, kind: str) -> tuple[list[str], list[str]]:
        """(query tokens, key tokens) of one kind: cross-attention queries the target, keys the source."""
        kind = _checked_kind(kind)
        queries = self.source_tokens if kind == "encoder_self_attention" else self.target_tokens
        keys = self.target_tokens if kind == "decoder_self_attention" else self.source_tokens
        return queries, keys


def compute_attentions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    target: str | None = None,
    generation_config: GenerationConfig | None = None,
) -> AttentionMaps:
    """Attention weights of every layer and head for one sentence pair (§3.2, Figures 3-5).

    Args:
        model: a `VanillaTransformerForConditionalGeneration` (any attention backend; sdpa and
            flash return no weights, so the call runs on "eager" and switches back afterwards).
        tokenizer: the model's tokenizer.
        source: one source sentence.
        target: its translation, read with teacher forcing; None translates ``source`` with
            ``model.generate`` (the model's generation config, e.g. the paper's beam search, or
            ``generation_config``) and reads the translation.
        generation_config: only used when ``target`` is None.

    The model runs in eval mode (no dropout) and is put back in its train/eval mode and attention
    backend afterwards, also when an error is raised.
    """
    _check_sentence(source, "source")
    if target is not None:
        _check_sentence(target, "target")
    input_ids = tokenizer(source, return_tensors="pt").input_ids.to(model.device)  # (1, S)
    with _eval_mode(model), torch.no_grad():
        if target is None:  # generated on the model's own (faster) attention backend
            decoder_input_ids = _translation(model, input_ids, generation_config)
        else:
            decoder_input_ids = _teacher_forced_input(model, tokenizer, target)
        with _eager_attention(model):
            outputs = model(
                input_ids=input_ids, decoder_input_ids=decoder_input_ids, output_attentions=True, use_cache=False
            )
    return AttentionMaps(
        source_tokens=readable_tokens(tokenizer, input_ids[0]),
        target_tokens=readable_tokens(tokenizer, decoder_input_ids[0]),
        encoder_self_attention=_stack_layers(outputs.encoder_attentions),
        decoder_self_attention=_stack_layers(outputs.decoder_attentions),
        cross_attention=_stack_layers(outputs.cross_attentions),
    )


def readable_tokens(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int] | torch.Tensor) -> list[str]:
    """Each id decoded on its own: "Ġcat" -> "▁cat", "</s>" stays "</s>".

    A byte-level piece that holds only part of a UTF-8 character ("Ã" of "ü") shows its bytes
    ("\\xc3") rather than "�", so that different pieces never look the same.
    """
    return [_readable_token(tokenizer, int(token_id)) for token_id in ids]


def _readable_token(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    text = tokenizer.decode([token_id])
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if "\ufffd" in text and all(symbol in BYTE_OF_SYMBOL for symbol in piece):
        text = bytes(BYTE_OF_SYMBOL[symbol] for symbol in piece).decode("utf-8", errors="backslashreplace")
    return text.translate(VISIBLE_WHITESPACE)


def _byte_level_alphabet() -> dict[str, int]:
    """The byte each symbol of GPT-2's byte-level alphabet stands for (the ByteLevel pre-tokenizer's).

    Printable Latin-1 bytes stand for themselves; the other bytes, in order, for chr(256), chr(257)...
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return {chr(byte): byte for byte in printable} | {chr(256 + n): byte for n, byte in enumerate(others)}


BYTE_OF_SYMBOL = _byte_level_alphabet()


@contextmanager
def _eval_mode(model: PreTrainedModel) -> Iterator[None]:
    """Dropout would blur the maps (and change the translation); the model's mode comes back on exit."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextmanager
def _eager_attention(model: PreTrainedModel) -> Iterator[None]:
    """Only eager attention returns its weights (sdpa, flash do not); the backend comes back on exit."""
    implementation = model.config._attn_implementation
    if implementation == "eager":
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(implementation)


def _translation(model, input_ids: torch.Tensor, generation_config) -> torch.Tensor:
    """The generated sequence (start token first), cut after its first </s>: (1, T)."""
    generated = model.generate(input_ids=input_ids, generation_config=generation_config)[:1]
    ends = (generated[0, 1:] == model.config.eos_token_id).nonzero()
    return generated[:, : int(ends[0]) + 2] if len(ends) else generated


def _teacher_forced_input(model, tokenizer, target: str) -> torch.Tensor:
    """Start token, then the whole target with its </s>: every target token appears as a query."""
    target_ids = tokenizer(text_target=target, return_tensors="pt").input_ids.to(model.device)
    start = target_ids.new_full((1, 1), model.config.decoder_start_token_id)
    return torch.cat([start, target_ids], dim=1)  # (1, T)


def _stack_layers(per_layer: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.stack([weights[0] for weights in per_layer]).float().cpu()  # (layers, heads, T_q, T_k)


def _check_sentence(sentence, name: str) -> None:
    if not isinstance(sentence, str):
        raise TypeError(f"{name} must be one sentence (a str), got {type(sentence).__name__}.")
    if not sentence.strip():
        raise ValueError(f"The {name} sentence is empty; attention maps need at least one word.")


def _checked_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"Unknown kind of attention {kind!r}; choose one of {', '.join(map(repr, KINDS))}.")
    return kind


def _checked_index(index, count: int, what: str) -> int:
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError(f"{what} must be an int, got {type(index).__name__}.")
    if not 0 <= index < count:
        raise ValueError(f"{what} {index} is out of range: there are {count}, numbered 0 to {count - 1}.")
    return index


def _selected(index: int | None, count: int, what: str) -> list[int]:
    """All indices for None, else the one checked index."""
    return list(range(count)) if index is None else [_checked_index(index, count, what)]


# ---------------------------------------------------------------------------------------------
# Drawing: heatmaps and the connection view of Figures 3-5
# ---------------------------------------------------------------------------------------------


def plot_attention_heatmap(
    maps: AttentionMaps,
    kind: str,
    layer: int | None = None,
    head: int | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Heatmaps of attention weights: query tokens on the y axis, key tokens on the x axis (§3.2).

    ``layer`` and ``head`` pick one; None takes them all, so ``layer=2`` draws all heads of layer 2
    (at most four to a row) and ``layer=None, head=None`` a grid of layers (rows) x heads
    (columns). The colour scale runs from 0 to 1 in every map. Writes ``path`` (.png or .svg)
    when given. Returns the matplotlib Figure.
    """
    weights = maps.weights(kind)
    layers = _selected(layer, weights.shape[0], "layer")
    heads = _selected(head, weights.shape[1], "head")
    queries, keys = maps.tokens(kind)
    _check_picture_path(path)
    panels = [(layer_index, head_index) for layer_index in layers for head_index in heads]
    columns = len(heads) if len(layers) > 1 else min(len(heads), MAX_HEATMAP_COLUMNS)
    rows = -(-len(panels) // columns)
    figure = _new_figure(  # inches, so that one tick label per token fits
        width=columns * (max(2.0, TOKEN_INCHES * len(keys)) + 1.0) + 1.0,
        height=rows * (max(2.0, TOKEN_INCHES * len(queries)) + 1.0) + 0.5,
    )
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    for cell, (layer_index, head_index) in zip(axes, panels):
        title = f"layer {layer_index}, head {head_index}"
        if len(panels) == 1:
            title = f"{KIND_TITLES[kind]}, {title}"
        image = _draw_heatmap(cell, weights[layer_index, head_index], queries, keys, title)
    for unused in axes[len(panels) :]:
        unused.remove()
    figure.colorbar(image, ax=axes[: len(panels)].tolist(), label="attention weight", shrink=0.8)
    if len(panels) > 1:
        figure.suptitle(KIND_TITLES[kind])
    _save(figure, path)
    return figure


def _draw_heatmap(axes: Axes, weights: torch.Tensor, queries: list[str], keys: list[str], title: str):
    """One map; tokens are shown as written (parse_math=False: "$x$" is a token, not a formula)."""
    image = axes.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(len(keys)), labels=keys, rotation=90, fontsize=TICK_FONT_SIZE, parse_math=False)
    axes.set_yticks(range(len(queries)), labels=queries, fontsize=TICK_FONT_SIZE, parse_math=False)
    axes.set_xlabel("key")
    axes.set_ylabel("query")
    axes.set_title(title, fontsize=10)
    return image


def plot_attention_connections(
    maps: AttentionMaps,
    kind: str,
    layer: int,
    head: int | None = None,
    path: str | Path | None = None,
    threshold: float = 0.05,
) -> Figure:
    """The paper's Figures 3-5: query tokens on the left joined to the key tokens they attend to.

    One line per (query, key) pair whose weight is above ``threshold``; its width and opacity grow
    with the weight. ``head=None`` overlays all heads of ``layer``, one colour per head, as in
    Figure 3. For self-attention both columns hold the same sentence; for cross-attention the left
    column is the target and the right one the source. Writes ``path`` (.png or .svg) when given.
    """
    weights = maps.weights(kind)
    _checked_index(layer, weights.shape[0], "layer")
    heads = _selected(head, weights.shape[1], "head")
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"threshold must be in [0, 1), got {threshold}.")
    queries, keys = maps.tokens(kind)
    _check_picture_path(path)
    figure = _new_figure(width=6.0, height=max(3.0, 0.3 * max(len(queries), len(keys)) + 1.2))
    axes = figure.subplots()
    positions = _draw_token_columns(axes, queries, keys)
    for head_index in heads:
        _draw_connections(axes, weights[layer, head_index], head_index, threshold, positions)
    which = f"head {head}" if head is not None else "all heads"
    axes.set_title(f"{KIND_TITLES[kind]}, layer {layer}, {which}", fontsize=10)
    if len(heads) > 1:
        _head_legend(axes, heads)
    _save(figure, path)
    return figure


def _draw_token_columns(axes: Axes, queries: list[str], keys: list[str]) -> tuple[list[float], list[float]]:
    """Queries at x = 0, keys at x = 1, top to bottom; returns the y of every query and key token."""
    span = max(len(queries), len(keys))
    positions = _column_positions(len(queries), span), _column_positions(len(keys), span)
    for column, tokens, heights in ((0.0, queries, positions[0]), (1.0, keys, positions[1])):
        alignment, offset = ("right", -0.03) if column == 0.0 else ("left", 0.03)
        for token, height in zip(tokens, heights):
            axes.text(column + offset, height, token, ha=alignment, va="center", fontsize=9, parse_math=False)
    axes.text(0.0, 1.0, "query", ha="center", fontsize=9, style="italic")
    axes.text(1.0, 1.0, "key", ha="center", fontsize=9, style="italic")
    axes.set_xlim(-1.0, 2.0)
    axes.set_ylim(-span, 1.6)
    axes.axis("off")
    return positions


def _column_positions(count: int, span: int) -> list[float]:
    """Token i at y = -i; a shorter column (cross-attention) is spread over the height of the longer."""
    step = (span - 1) / (count - 1) if count > 1 else 0.0
    return [-index * step for index in range(count)]


def _draw_connections(
    axes: Axes, weights: torch.Tensor, head: int, threshold: float, positions: tuple[list[float], list[float]]
) -> None:
    """One LineCollection per head, a segment per (query, key) pair; width and alpha = weight."""
    from matplotlib.collections import LineCollection

    query_heights, key_heights = positions
    pairs = (weights > threshold).nonzero().tolist()  # [(query, key), ...] in row-major order
    strengths = [float(weights[query, key]) for query, key in pairs]
    red, green, blue = _head_colour(head)
    lines = LineCollection(
        [[(0.0, query_heights[query]), (1.0, key_heights[key])] for query, key in pairs],
        linewidths=[MAX_LINE_WIDTH * strength for strength in strengths],
        colors=[(red, green, blue, min(1.0, strength)) for strength in strengths],
    )
    axes.add_collection(lines)


def _head_colour(head: int) -> tuple[float, float, float]:
    from matplotlib import colormaps

    return colormaps["tab10"](head % 10)[:3]


def _head_legend(axes: Axes, heads: list[int]) -> None:
    """Solid sample lines: the drawn ones are faint wherever weights are small."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=_head_colour(head), linewidth=2.0) for head in heads]
    labels = [f"head {head}" for head in heads]
    axes.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=min(len(heads), 8), fontsize=8)


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def write_attention_pictures(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    output_dir: str | Path,
    target: str | None = None,
    fmt: str = "png",
) -> list[Path]:
    """Write the default set of attention pictures of one sentence pair into ``output_dir``.

    For each kind of attention (§3.2.3) and each layer, a heatmap of all heads
    (``{kind}_layer{L}.{fmt}``); for the last layer of each kind, the connection view of
    Figures 3-5 with all heads overlaid (``{kind}_layer{L}_connections.{fmt}``). ``target=None``
    translates ``source`` with the model's generation config first (see `compute_attentions`).
    ``fmt`` is "png" or "svg". Returns the paths written, in a fixed order; existing files with
    these names are replaced.
    """
    if fmt not in PICTURE_FORMATS:
        raise ValueError(f"Unknown picture format {fmt!r}; use one of {', '.join(map(repr, PICTURE_FORMATS))}.")
    _require_matplotlib()  # before the model runs
    maps = compute_attentions(model, tokenizer, source, target)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in KINDS:
        last_layer = maps.weights(kind).shape[0] - 1
        for layer in range(last_layer + 1):
            written.append(output_dir / f"{kind}_layer{layer}.{fmt}")
            plot_attention_heatmap(maps, kind, layer=layer, path=written[-1])
        written.append(output_dir / f"{kind}_layer{last_layer}_connections.{fmt}")
        plot_attention_connections(maps, kind, layer=last_layer, path=written[-1])
    return written


def _check_picture_path(path: str | Path | None) -> None:
    """Fail before drawing: the file suffix picks the format."""
    if path is not None and Path(path).suffix.lower().lstrip(".") not in PICTURE_FORMATS:
        raise ValueError(
            f"Cannot write {str(path)!r}: unknown picture format {Path(path).suffix!r}; "
            f"use a file name ending in {' or '.join('.' + f for f in PICTURE_FORMATS)}."
        )


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise ImportError(f"Attention pictures need matplotlib: {install_command('plot')}") from error


def _new_figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas: never shown, and pyplot's global state is not touched."""
    _require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: str | Path | None) -> None:
    """PNG or SVG by suffix; SVG keeps its text as text (searchable, and tokens stay selectable)."""
    if path is None:
        return
    from matplotlib import rc_context

    with rc_context({"svg.fonttype": "none"}):
        figure.savefig(path, dpi=120)


__all__ = [
    "KINDS",
    "AttentionMaps",
    "compute_attentions",
    "plot_attention_connections",
    "plot_attention_heatmap",
    "readable_tokens",
    "write_attention_pictures",
]
