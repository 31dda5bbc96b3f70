"""The README and docs/ say what is true of the repository: the set-up commands are the Makefile's, every link
and anchor resolves, every benchmark number drawn in a picture is one the benchmark pages report, every commit
they cite exists, and the project speaks of itself by dates, machines and commits."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from helpers import REPO

DOCS = REPO / "docs"
BENCHMARKS = DOCS / "benchmarks"
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
# Written by the command-line reference's own generator (and checked by its test), not by hand.
GENERATED = {DOCS / "cli.md"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
NUMBER = r"(?<![\d.]){}(?![\d])"


def headings_slugs(path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    slugs = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        slugs.add(slug)
    return slugs


def test_the_readme_gives_the_makefiles_two_set_up_commands_as_ci_runs_them():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert re.search(rf"^make {target}\b", readme, re.M), f"README lost `make {target}`"
        assert re.search(rf"^{target}: setup$", makefile, re.M), f"the Makefile lost its `{target}` target"
    assert "make test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_the_readme_stays_a_guide():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; measurement history belongs in docs/benchmarks/"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if path in GENERATED:
            continue
        assert path.exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"
        if anchor:
            assert anchor in headings_slugs(path), f"{page.relative_to(REPO)} links to {target}: no such heading"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(REPO)))
def test_the_project_speaks_of_itself_by_dates_machines_and_commits(page):
    text = page.read_text(encoding="utf-8")
    for phrase in (r"\bsessions? \d", r"\bsession-\d", r"\bthis machine\b", r"\bthe issue\b", r"\bissue \d"):
        assert not re.search(phrase, text, re.I), f"{page.relative_to(REPO)}: {phrase!r}"


def measured_series():
    """(name, values, decimals) of every measured series in measurements.json, as the pages print them."""
    data = json.loads((BENCHMARKS / "measurements.json").read_text(encoding="utf-8"))
    for comparison in data["multi30k_en_de_test_bleu"]["comparisons"]:
        yield comparison["commit"], comparison["ours"] + comparison["marian"], 2
    for system, rates in data["decoding_sentences_per_second"]["systems"].items():
        yield system, rates, 1
    for key in ("gnmt", "length"):
        yield key, data["length_penalty_val_bleu"][key], 2
    for key in ("uniform", "linear"):
        yield key, data["averaging_window_val_bleu"][key], 2


def test_every_number_drawn_is_one_the_benchmark_pages_report():
    pages = "\n".join(path.read_text(encoding="utf-8") for path in BENCHMARKS.glob("*.md"))
    for name, values, decimals in measured_series():
        for value in values:
            printed = f"{value:.{decimals}f}"
            assert re.search(NUMBER.format(re.escape(printed)), pages), f"{name}: {printed} is in no benchmark page"


def test_every_measurement_names_a_commit_and_a_command_the_pages_cite():
    data = json.loads((BENCHMARKS / "measurements.json").read_text(encoding="utf-8"))
    pages = "\n".join(path.read_text(encoding="utf-8") for path in BENCHMARKS.glob("*.md"))
    records = [
        *data["multi30k_en_de_test_bleu"]["comparisons"],
        *data["headlines"]["records"],
        *(data[key] for key in data if key not in ("multi30k_en_de_test_bleu", "headlines")),
    ]
    for record in records:
        assert record["commit"] in pages and record["machine"] in pages and record["date"] in pages
        assert record["command"].startswith(("python benchmarks/", "vanilla-transformer "))  # a script or the command


@pytest.mark.slow  # the numbers drawn are checked by test_every_number_drawn_is_one_the_benchmark_pages_report
def test_the_pictures_are_drawn_from_the_recorded_numbers(tmp_path):
    pytest.importorskip("matplotlib")
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "plot.py"), "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    drawn = sorted(path.name for path in tmp_path.glob("*.png"))
    committed = sorted(path.name for path in BENCHMARKS.glob("*.png"))
    assert drawn == committed and len(drawn) == 5
    referenced = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
    for name in committed:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert name in referenced, f"{name} is shown on no page"
        assert (BENCHMARKS / name).stat().st_size < 100_000, f"{name}: keep committed pictures small"


def cited_commits() -> set[str]:
    text = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
    return set(re.findall(r"\bcommits? ([0-9a-f]{7})\b", text)) | set(
        re.findall(r"(?<=, )([0-9a-f]{7})(?= \||,| \(|\))", text)
    )


def test_every_cited_commit_exists():
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    shallow = subprocess.run([git, "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True, text=True)
    if shallow.stdout.strip() != "false":
        pytest.skip("a shallow clone does not hold the history the pages cite")
    commits = cited_commits()
    assert len(commits) > 30
    for commit in sorted(commits):
        found = subprocess.run([git, "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True)
        assert found.returncode == 0, f"commit {commit} is cited but not in the history"


def test_every_number_in_the_readmes_results_is_in_the_measurement_history():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    results = readme.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in results.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    pages = "\n".join(path.read_text(encoding="utf-8") for path in BENCHMARKS.glob("*.md"))
    without_separators = re.sub(r"(?<=\d),(?=\d{3})", "", pages)  # 1,556 and 1556 are one number
    numbers = [number for row in rows[1:] for number in re.findall(r"\d+,\d{3}|\d+\.\d+", row)]
    assert len(numbers) > 30
    for number in numbers:
        plain = number.replace(",", "")
        found = re.search(NUMBER.format(re.escape(plain)), without_separators)
        assert found, f"README's {number} is in no benchmark page"
    for commit in re.findall(r"\b[0-9a-f]{7}\b", "\n".join(rows)):
        assert commit in pages, f"README cites commit {commit}, which no benchmark page records"


def readme_part(start: str, end: str) -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return readme.split(start, 1)[1].split(end, 1)[0]


HEADLINES = json.loads((BENCHMARKS / "measurements.json").read_text(encoding="utf-8"))["headlines"]["records"]


@pytest.mark.parametrize("record", HEADLINES, ids=lambda record: record["name"])
def test_every_headline_is_quoted_as_recorded_by_the_readme_and_its_page(record):
    """One source for each headline number: measurements.json's record. README's status line and its page
    print it as recorded; a gain is the difference of the two scores recorded with it, which the results
    table prints."""
    printed = record["quote"].format(record["value"])
    found = re.compile(NUMBER.format(re.escape(printed)))
    status = readme_part("**Status**", "\n## ")
    results = readme_part("\n## Results\n", "\n## Troubleshooting")
    assert found.search(status), f"README's status line does not say {printed} ({record['what']})"
    assert found.search((BENCHMARKS / record["page"]).read_text(encoding="utf-8")), f"{record['page']}: no {printed}"
    if "ours" in record:
        assert record["value"] == pytest.approx(record["ours"] - record["marian"], abs=0.005)
        row = next(line for line in results.splitlines() if f"**{record['ours']:.2f}**" in line)
        assert f"| {record['marian']:.2f} |" in row and record["commit"] in row, row
    else:
        assert found.search(results), f"README's results do not say {printed} ({record['what']})"


def test_the_readmes_status_line_quotes_only_recorded_headlines():
    """Every speed ratio (1.23x) and BLEU gain (+1.23) the status line states is a headline of
    measurements.json, so that a new measurement cannot leave an old figure standing there."""
    status = readme_part("**Status**", "\n## ")
    claims = re.findall(r"(?<![\d.])(\+?\d+\.\d+x?)", status)
    claims = [claim for claim in claims if claim.startswith("+") or claim.endswith("x")]
    recorded = {record["quote"].format(record["value"]) for record in HEADLINES}
    assert claims, status
    assert set(claims) <= recorded, f"the status line states {sorted(set(claims) - recorded)}, recorded nowhere"


def test_the_suites_processes_follow_the_cgroups_cpu_quota(tmp_path):
    """`make test`'s process count: a container's quota of 1.5 CPUs on more cores is 2 processes; no quota, the
    cores the affinity gives (tests/cores.py)."""
    import os

    import cores

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")
    assert cores.usable_cores(quota) == min(affinity, 2)
    quota.write_text("max 100000\n")
    assert cores.usable_cores(quota) == affinity
    assert cores.usable_cores(tmp_path / "absent") == affinity
