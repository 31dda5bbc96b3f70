"""How the package's modules import each other, read from their source (ast): no circle, and the library
never imports the command (`vanilla_transformer.cli`, the console script `vanilla_transformer_command`)."""

import ast
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "vanilla_transformer"
COMMAND = {"vanilla_transformer.cli", "vanilla_transformer_command"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in [*PACKAGE.rglob("*.py"), REPO / "vanilla_transformer_command.py"]}


def is_main_block(node: ast.AST) -> bool:
    """``if __name__ == "__main__":``, where a module run with ``python -m`` may start the command."""
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def imported(name: str, main_blocks: bool = True) -> set[str]:
    """The package's modules that module ``name`` imports anywhere in its file (in functions too, and with
    ``main_blocks`` in its ``__main__`` block)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = (
        set()
        if main_blocks
        else {id(node) for block in ast.walk(tree) if is_main_block(block) for node in ast.walk(block)}
    )
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        found |= {target for target in targets if target in MODULES and target != name}
    return found


def test_no_module_of_the_package_imports_itself_back_through_others():
    graph = {name: imported(name) for name in MODULES}
    state: dict[str, str] = {}  # name -> "open" while on the path, "done" after

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for other in sorted(graph[name]):
            assert state.get(other) != "open", f"import circle: {' -> '.join(path[path.index(other) :] + [other])}"
            if other not in state:
                visit(other, path + [other])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_library_never_imports_the_command():
    """Only the command's own modules import it; a tool module's ``__main__`` block (``python -m``) may."""
    library = set(MODULES) - COMMAND - {"vanilla_transformer.__main__"}
    importers = {name: sorted(imported(name, main_blocks=False) & COMMAND) for name in sorted(library)}
    assert {name: found for name, found in importers.items() if found} == {}
    assert "vanilla_transformer_command" not in set().union(*(imported(name) for name in MODULES))


def test_the_walk_sees_the_imports_it_must():
    """A check of the reader itself, against imports written in the files."""
    assert {
        "vanilla_transformer.training.options",
        "vanilla_transformer.training.data",
        "vanilla_transformer.training.arguments",
        "vanilla_transformer.command_line",
    } <= imported("vanilla_transformer.training.run")
    assert "vanilla_transformer.training.arguments" in imported("vanilla_transformer.training.trainer")
    assert "vanilla_transformer.configuration_vanilla_transformer" in imported("vanilla_transformer")
