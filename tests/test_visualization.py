"""Attention pictures (§3.2, Figures 3-5) against independent references.

References: softmax(Q K^T / sqrt(d_k)) recomputed by hand from the inputs of each attention module
(captured with forward hooks) and its own projection weights; the tokenizer's raw byte-level pieces
("Ġ" for a space); `model.generate` called directly; the PNG signature and an XML parser for the
files; the drawn objects of the returned matplotlib Figures read back.
"""

import ast
import math
import re
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, train_tokenizer
from vanilla_transformer.command_line import install_command
from vanilla_transformer.visualization import (
    KINDS,
    MAX_LINE_WIDTH,
    AttentionMaps,
    compute_attentions,
    plot_attention_connections,
    plot_attention_heatmap,
    readable_tokens,
    write_attention_pictures,
)

PACKAGE = Path(__file__).resolve().parent.parent / "vanilla_transformer"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SOURCE = "the law will never be perfect"
TARGET = "das gesetz wird nie perfekt sein"
PAIRS = [
    ("the law will never be perfect", "das gesetz wird nie perfekt sein"),
    ("the cat sat on the mat", "die katze sass auf der matte"),
    ("a dog runs fast in the park", "ein hund rennt schnell im park"),
    ("my house is small", "mein haus ist klein"),
    ("we will see the sea", "wir werden das meer sehen"),
    ("the children play in the garden", "die kinder spielen im garten"),
]


@pytest.fixture(scope="module")
def tokenizer():
    texts = [sentence for pair in PAIRS for sentence in pair] * 3  # a few dozen sentences
    return train_tokenizer(iter(texts), vocab_size=300)


def tiny_model(tokenizer, **overrides) -> VanillaTransformerForConditionalGeneration:
    """The "tiny" preset (2 + 2 layers, 4 heads, dropout 0.1), on sdpa, the library's default."""
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer), **overrides)
    return VanillaTransformerForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(tokenizer)


@pytest.fixture(scope="module")
def maps(model, tokenizer):
    return compute_attentions(model, tokenizer, SOURCE, TARGET)


def byte_level_pieces(tokenizer, text: str) -> list[str]:
    """The tokenizer's own pieces with the byte-level space "Ġ" shown as "▁" (ASCII text only)."""
    return [piece.replace("Ġ", "▁") for piece in tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids)]


# --- the numbers behind the pictures ------------------------------------------------------------


def test_tokens_are_the_readable_pieces_with_the_decoder_start_token_first(maps, tokenizer):
    assert maps.source_tokens == byte_level_pieces(tokenizer, SOURCE)
    assert maps.target_tokens == ["<s>"] + byte_level_pieces(tokenizer, TARGET)
    assert maps.source_tokens[-1] == maps.target_tokens[-1] == "</s>"


def test_maps_have_one_row_per_query_token_and_one_column_per_key_token(maps, model):
    config, source, target = model.config, len(maps.source_tokens), len(maps.target_tokens)
    assert maps.encoder_self_attention.shape == (config.encoder_layers, config.encoder_attention_heads, source, source)
    assert maps.decoder_self_attention.shape == (config.decoder_layers, config.decoder_attention_heads, target, target)
    assert maps.cross_attention.shape == (config.decoder_layers, config.decoder_attention_heads, target, source)


@pytest.mark.parametrize("kind", KINDS)
def test_every_row_is_a_probability_distribution_over_the_keys(maps, kind):
    weights = maps.weights(kind)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))


def test_decoder_self_attention_is_masked_so_no_position_sees_the_future(maps):
    weights = maps.decoder_self_attention
    future = torch.ones(weights.shape[-2:], dtype=torch.bool).triu(diagonal=1)
    assert (weights[..., future] == 0).all()
    assert (weights[..., ~future] > 0).all()


def attention_inputs(model) -> dict:
    """Forward pre-hooks on every attention module: what each one received, by (kind, layer)."""
    captured, handles = {}, []

    def recorder(key):
        def hook(module, args, kwargs):
            hidden_states = args[0]
            keys_from = args[2] if len(args) > 2 else kwargs.get("encoder_hidden_states", hidden_states)
            captured[key] = (module, hidden_states.detach(), keys_from.detach())

        return hook

    for layer, encoder_layer in enumerate(model.model.encoder.layers):
        handles.append(
            encoder_layer.self_attention.register_forward_pre_hook(
                recorder(("encoder_self_attention", layer)), with_kwargs=True
            )
        )
    for layer, decoder_layer in enumerate(model.model.decoder.layers):
        handles.append(
            decoder_layer.self_attention.register_forward_pre_hook(
                recorder(("decoder_self_attention", layer)), with_kwargs=True
            )
        )
        handles.append(
            decoder_layer.cross_attention.register_forward_pre_hook(
                recorder(("cross_attention", layer)), with_kwargs=True
            )
        )
    return captured, handles


def softmax_of_scaled_dot_products(module, queries_from, keys_from, heads, d_model, causal):
    """softmax(Q K^T / sqrt(d_k)) per head (§3.2.1, Eq. 1), from the module's projection weights."""
    d_k = d_model // heads
    queries = (queries_from[0] @ module.q_proj.weight.T + module.q_proj.bias).view(-1, heads, d_k).transpose(0, 1)
    keys = (keys_from[0] @ module.k_proj.weight.T + module.k_proj.bias).view(-1, heads, d_k).transpose(0, 1)
    scores = queries @ keys.transpose(1, 2) / math.sqrt(d_k)  # (H, T_q, T_k)
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


def test_maps_equal_softmax_of_scaled_dot_products_recomputed_by_hand(model, tokenizer):
    captured, handles = attention_inputs(model)
    try:
        maps = compute_attentions(model, tokenizer, SOURCE, TARGET)
    finally:
        for handle in handles:
            handle.remove()
    config = model.config
    assert len(captured) == config.encoder_layers + 2 * config.decoder_layers
    for (kind, layer), (module, queries_from, keys_from) in captured.items():
        expected = softmax_of_scaled_dot_products(
            module,
            queries_from,
            keys_from,
            config.decoder_attention_heads,
            config.d_model,
            causal=kind == "decoder_self_attention",
        )
        torch.testing.assert_close(maps.weights(kind)[layer], expected, msg=f"{kind}, layer {layer}")


def test_without_a_target_the_maps_are_those_of_the_generated_translation(model, tokenizer):
    greedy = GenerationConfig(num_beams=1, max_new_tokens=6, decoder_start_token_id=2, eos_token_id=3, pad_token_id=0)
    maps = compute_attentions(model, tokenizer, SOURCE, generation_config=greedy)
    input_ids = tokenizer(SOURCE, return_tensors="pt").input_ids
    generated = model.generate(input_ids=input_ids, generation_config=greedy)[0].tolist()
    if 3 in generated[1:]:  # the decoder reads up to and with the first </s>
        generated = generated[: generated.index(3, 1) + 1]
    assert maps.target_tokens == readable_tokens(tokenizer, generated)
    assert maps.cross_attention.shape[-2:] == (len(generated), len(maps.source_tokens))
    assert model.config._attn_implementation == "sdpa"


def test_pieces_of_a_character_show_their_bytes_and_whole_characters_show_as_text(tokenizer):
    ids = tokenizer("über", add_special_tokens=False).input_ids  # "ü" was never seen: two byte pieces
    assert readable_tokens(tokenizer, ids[:2]) == [f"\\x{byte:02x}" for byte in "ü".encode()]
    assert "".join(readable_tokens(tokenizer, ids[2:])) == "ber"
    whole = tokenizer("wir kinder", add_special_tokens=False).input_ids
    assert "".join(readable_tokens(tokenizer, whole)) == "wir▁kinder"


# --- the model is left as it was ----------------------------------------------------------------


def attention_backends(model) -> set[str]:
    return {module.config._attn_implementation for module in model.modules() if hasattr(module, "config")}


def test_sdpa_and_train_mode_come_back_and_dropout_is_off_during_the_call(tokenizer):
    model = tiny_model(tokenizer).train()  # dropout 0.1: maps would differ from call to call
    assert attention_backends(model) == {"sdpa"}
    first = compute_attentions(model, tokenizer, SOURCE, TARGET)
    second = compute_attentions(model, tokenizer, SOURCE, TARGET)
    assert attention_backends(model) == {"sdpa"}
    assert all(module.training for module in model.modules())
    torch.testing.assert_close(first.cross_attention, second.cross_attention, rtol=0, atol=0)


def test_sdpa_and_train_mode_come_back_after_an_error_inside_the_forward(tokenizer):
    model = tiny_model(tokenizer, max_position_embeddings=8).train()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        compute_attentions(model, tokenizer, "a dog", "die kinder spielen im garten und im park")
    assert attention_backends(model) == {"sdpa"}
    assert all(module.training for module in model.modules())


def test_an_eager_model_stays_eager(tokenizer):
    model = tiny_model(tokenizer)
    model.set_attn_implementation("eager")
    compute_attentions(model, tokenizer, SOURCE, TARGET)
    assert attention_backends(model) == {"eager"}
    assert not model.training


# --- heatmaps -----------------------------------------------------------------------------------


def heatmap_panels(figure):
    """The axes that hold an attention map (the colorbar's axes hold none)."""
    return [axes for axes in figure.axes if axes.get_title().startswith(("layer", "Enc", "Dec"))]


def test_heatmap_of_one_head_shows_its_weights_with_the_tokens_on_the_axes(maps):
    figure = plot_attention_heatmap(maps, "cross_attention", layer=1, head=2)
    (axes,) = heatmap_panels(figure)
    assert axes.get_title() == "Encoder-decoder (cross) attention, layer 1, head 2"
    assert [label.get_text() for label in axes.get_yticklabels()] == maps.target_tokens  # queries
    assert [label.get_text() for label in axes.get_xticklabels()] == maps.source_tokens  # keys
    shown = torch.as_tensor(axes.images[0].get_array())
    torch.testing.assert_close(shown, maps.cross_attention[1, 2])
    torch.testing.assert_close(shown.sum(-1), torch.ones(len(maps.target_tokens)))
    assert len(figure.axes) == 2  # the map and its colorbar


@pytest.mark.parametrize(
    ("layer", "panels"), [(0, [(0, h) for h in range(4)]), (None, [(layer, h) for layer in range(2) for h in range(4)])]
)
def test_heatmap_grid_has_one_panel_per_layer_and_head(maps, layer, panels):
    figure = plot_attention_heatmap(maps, "decoder_self_attention", layer=layer)
    drawn = heatmap_panels(figure)
    assert [axes.get_title() for axes in drawn] == [f"layer {layer}, head {h}" for layer, h in panels]
    for axes, (layer, h) in zip(drawn, panels):
        torch.testing.assert_close(torch.as_tensor(axes.images[0].get_array()), maps.decoder_self_attention[layer, h])
        assert [label.get_text() for label in axes.get_xticklabels()] == maps.target_tokens
    assert figure.get_suptitle() == "Decoder self-attention (masked)"


def test_tokens_with_dollar_signs_are_shown_as_written_not_as_formulas(tmp_path):
    tokens = ["$x$", "$\\alpha$", "</s>"]
    uniform = torch.full((1, 1, 3, 3), 1 / 3)
    maps = AttentionMaps(tokens, tokens, uniform, uniform, uniform)
    plot_attention_heatmap(maps, "encoder_self_attention", layer=0, head=0, path=tmp_path / "map.svg")
    plot_attention_connections(maps, "cross_attention", layer=0, head=0, path=tmp_path / "lines.svg")
    for name in ("map.svg", "lines.svg"):
        assert set(tokens) <= svg_texts(tmp_path / name)  # mathtext would have drawn "x" and "α"


def test_png_file_starts_with_the_png_signature(maps, tmp_path):
    path = tmp_path / "encoder.png"
    plot_attention_heatmap(maps, "encoder_self_attention", layer=0, head=0, path=path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def svg_texts(path: Path) -> set[str]:
    root = ElementTree.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return {"".join(element.itertext()) for element in root.iter("{http://www.w3.org/2000/svg}text")}


def test_svg_file_is_xml_whose_text_holds_every_token(maps, tmp_path):
    path = tmp_path / "cross.svg"
    plot_attention_heatmap(maps, "cross_attention", layer=0, head=1, path=path)
    texts = svg_texts(path)
    assert set(maps.source_tokens) | set(maps.target_tokens) <= texts
    assert "Encoder-decoder (cross) attention, layer 0, head 1" in texts


# --- the connection view of Figures 3-5 -----------------------------------------------------------


def column_tokens(figure, side: str) -> list[tuple[float, str]]:
    """(y, token) of the left (query) or right (key) column, top to bottom."""
    texts = [text for text in figure.axes[0].texts if (text.get_position()[0] < 0) == (side == "left")]
    texts = [text for text in texts if text.get_text() not in ("query", "key")]
    return sorted(((text.get_position()[1], text.get_text()) for text in texts), reverse=True)


def drawn_lines(figure):
    """(query index, key index, width, alpha) of every line, from its end points and the token columns."""
    from matplotlib.collections import LineCollection

    query_heights = [y for y, _ in column_tokens(figure, "left")]
    key_heights = [y for y, _ in column_tokens(figure, "right")]
    lines = []
    for collection in figure.axes[0].collections:
        assert isinstance(collection, LineCollection)
        for segment, width, colour in zip(
            collection.get_segments(), collection.get_linewidths(), collection.get_colors()
        ):
            (x0, y0), (x1, y1) = segment
            assert (x0, x1) == (0.0, 1.0)  # queries on the left, keys on the right
            lines.append((query_heights.index(y0), key_heights.index(y1), float(width), float(colour[3])))
    return lines


def test_connection_view_draws_one_line_per_pair_above_the_threshold_for_every_head(maps):
    threshold = 0.1
    figure = plot_attention_connections(maps, "encoder_self_attention", layer=1, threshold=threshold)
    weights = maps.encoder_self_attention[1]  # (heads, query, key)
    assert len(figure.axes[0].collections) == weights.shape[0]  # one colour per head
    assert len(drawn_lines(figure)) == int((weights > threshold).sum())
    assert [text.get_text() for text in figure.axes[0].get_legend().get_texts()] == [
        f"head {h}" for h in range(weights.shape[0])
    ]


def test_connection_line_width_and_opacity_grow_with_the_weight(maps):
    figure = plot_attention_connections(maps, "cross_attention", layer=1, head=3, threshold=0.0)
    weights = maps.cross_attention[1, 3]
    lines = drawn_lines(figure)
    assert {(query, key) for query, key, _, _ in lines} == {
        (q, k) for q in range(weights.shape[0]) for k in range(weights.shape[1])
    }
    for query, key, width, alpha in lines:
        assert width == pytest.approx(MAX_LINE_WIDTH * float(weights[query, key]), rel=1e-5)
        assert alpha == pytest.approx(float(weights[query, key]), rel=1e-5)


def test_connection_view_columns_are_queries_then_keys_target_then_source_for_cross_attention(maps):
    figure = plot_attention_connections(maps, "cross_attention", layer=0, head=0)
    assert [token for _, token in column_tokens(figure, "left")] == maps.target_tokens
    assert [token for _, token in column_tokens(figure, "right")] == maps.source_tokens
    assert figure.axes[0].get_title() == "Encoder-decoder (cross) attention, layer 0, head 0"
    figure = plot_attention_connections(maps, "decoder_self_attention", layer=0, head=0)
    assert [token for _, token in column_tokens(figure, "left")] == maps.target_tokens
    assert [token for _, token in column_tokens(figure, "right")] == maps.target_tokens


# --- the default set of files ---------------------------------------------------------------------


def test_write_attention_pictures_writes_the_documented_files(tokenizer, tmp_path):
    model = tiny_model(tokenizer, encoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2)
    output_dir = tmp_path / "new" / "pictures"
    written = write_attention_pictures(model, tokenizer, "my house", output_dir, target="mein haus", fmt="svg")
    expected = [
        output_dir / name
        for name in (
            "encoder_self_attention_layer0.svg",
            "encoder_self_attention_layer0_connections.svg",
            "decoder_self_attention_layer0.svg",
            "decoder_self_attention_layer1.svg",
            "decoder_self_attention_layer1_connections.svg",
            "cross_attention_layer0.svg",
            "cross_attention_layer1.svg",
            "cross_attention_layer1_connections.svg",
        )
    ]
    assert written == expected
    assert sorted(output_dir.iterdir()) == sorted(expected)
    for path in written:
        assert ElementTree.parse(path).getroot().tag == "{http://www.w3.org/2000/svg}svg"


# --- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("draw", "message"),
    [
        (lambda maps: plot_attention_heatmap(maps, "encoder_self_attention", layer=2), r"layer 2 .*0 to 1"),
        (lambda maps: plot_attention_heatmap(maps, "cross_attention", layer=0, head=-1), r"head -1 .*0 to 3"),
        (lambda maps: plot_attention_connections(maps, "decoder_self_attention", layer=0, head=4), r"head 4 .*0 to 3"),
        (lambda maps: plot_attention_heatmap(maps, "self_attention"), r"'encoder_self_attention'.*'cross_attention'"),
        (lambda maps: plot_attention_connections(maps, "encoder", layer=0), r"Unknown kind of attention 'encoder'"),
        (lambda maps: plot_attention_heatmap(maps, "cross_attention", path="map.jpg"), r"\.png or \.svg"),
        (lambda maps: plot_attention_connections(maps, "cross_attention", 0, threshold=1.0), r"threshold .*\[0, 1\)"),
    ],
)
def test_bad_choices_raise_a_value_error_naming_the_valid_ones(maps, draw, message):
    with pytest.raises(ValueError, match=message):
        draw(maps)


def test_unknown_format_fails_before_anything_is_computed_or_written(model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"'pdf'.*'png', 'svg'"):
        write_attention_pictures(model, tokenizer, SOURCE, tmp_path / "pictures", fmt="pdf")
    assert not (tmp_path / "pictures").exists()


@pytest.mark.parametrize("source", ["", "   \n"])
def test_empty_source_sentence_is_refused(model, tokenizer, source):
    with pytest.raises(ValueError, match="source sentence is empty"):
        compute_attentions(model, tokenizer, source, TARGET)


def test_without_matplotlib_the_error_names_the_plot_extra(maps, model, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    with pytest.raises(ImportError, match=re.escape(install_command("plot"))):
        plot_attention_heatmap(maps, "cross_attention", layer=0, head=0)
    with pytest.raises(ImportError, match=re.escape(install_command("plot"))):
        write_attention_pictures(model, tokenizer, SOURCE, tmp_path, target=TARGET)


# --- an optional extra stays optional -------------------------------------------------------------


def imported_modules(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {node.module or ""} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_no_package_module_imports_visualization_and_it_imports_matplotlib_only_when_drawing():
    for path in PACKAGE.glob("*.py"):
        if path.name != "visualization.py":
            assert not any("visualization" in name for name in imported_modules(path)), path.name
    visualization = PACKAGE / "visualization.py"
    assert not any(name.split(".")[0] == "matplotlib" for name in imported_modules(visualization, top_level_only=True))
    assert not any(name.split(".")[0] == "training" for name in imported_modules(visualization))
