"""Where names live: decoding names in the generation module, the training kernels in theirs, each imported
from the module that defines it (the model file does not pass them on)."""

import ast
from pathlib import Path

import vanilla_transformer.generation_vanilla_transformer as generation
import vanilla_transformer.training_kernels as kernels

ROOT = Path(__file__).resolve().parent.parent
MODEL_MODULE = "modeling_vanilla_transformer"


def names_defined_in(module) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
    return names


def test_generation_and_kernel_names_are_imported_from_their_own_modules():
    elsewhere = names_defined_in(generation) | names_defined_in(kernels)
    assert {"LENGTH_PENALTY_FORMULAS", "penalty_formula_of", "CACHE", "label_smoothed_cross_entropy"} <= elsewhere
    through_the_model = []
    for folder in ("vanilla_transformer", "tests", "benchmarks", "training"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(MODEL_MODULE):
                    through_the_model += [
                        f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}"
                        for alias in node.names
                        if alias.name in elsewhere
                    ]
    assert through_the_model == []


def test_the_model_file_leaves_torchs_names_alone_and_holds_no_autograd_function():
    tree = ast.parse((ROOT / "vanilla_transformer" / f"{MODEL_MODULE}.py").read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    assert not {"Dropout", "Linear", "LayerNorm", "Embedding"} & set(classes)
    bases = {ast.unparse(base) for node in classes.values() for base in node.bases}
    assert "torch.autograd.Function" not in bases
