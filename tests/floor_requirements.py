"""Print the oldest supported version of each dependency, as pip pins: every ``name>=X`` of the package's
dependencies and of its ``train`` extra in pyproject.toml becomes ``name==X``.

`make test` installs these in ``.venv-floor`` and runs the tests marked ``floor`` there, so that each floor
pyproject.toml claims is a version the tests ran against. Run: ``python3 tests/floor_requirements.py``.
"""

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
EXTRAS = ("train",)


def floor_pins(text: str) -> list[str]:
    lists = [re.search(r"^dependencies = \[(.*?)\]", text, re.S | re.M).group(1)]
    lists += [re.search(rf"^{extra} = \[(.*?)\]", text, re.S | re.M).group(1) for extra in EXTRAS]
    requirements = [r for block in lists for r in re.findall(r'"([^"]+)"', block)]
    pins = []
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)(?:\s*,\s*<\s*[0-9.]+)?", requirement)
        if match is None:
            sys.exit(f"{PYPROJECT}: {requirement!r} has no floor (name>=version[,<ceiling]); give it one")
        pins.append(f"{match.group(1)}=={match.group(2)}")
    return pins


if __name__ == "__main__":
    print(" ".join(floor_pins(PYPROJECT.read_text())))
