"""Documentation is tested: the hook reference is generated from the contract and
current, every public name of slhub's public modules is documented, and the pages and
docstrings describe the project as it is, not its history."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from helpers import REPO, script_module

DOCS = REPO / "docs"
#: Public modules whose ``__all__`` the docs must cover.
PUBLIC = ("slhub", "slhub.export", "slhub.sim", "slhub.testing")


def test_hook_reference_in_docs_is_current():
    script = script_module("hook_reference")
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    assert script.splice(text, script.render()) == text, (
        "docs/hooks.md is stale: run python scripts/hook_reference.py"
    )


def test_hook_reference_check_reports_a_stale_page(tmp_path: Path, capsys):
    script = script_module("hook_reference")
    page = tmp_path / "hooks.md"
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    page.write_text(text.replace("## `sample`", "## `sample` (edited by hand)"), encoding="utf-8")
    assert script.main(["--check", "--doc", str(page)]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert script.main(["--doc", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == text
    assert script.main(["--check", "--doc", str(page)]) == 0


def test_hook_reference_documents_every_hook_and_protocol_member():
    from slhub import hookspecs

    reference = script_module("hook_reference").render()
    for name in script_module("hook_reference").hookspecs_of(hookspecs):
        assert re.search(rf"^## `{name.__name__}`", reference, re.M), name.__name__
    members = [n for n in vars(hookspecs.Trainer) if not n.startswith("_")]
    members += list(hookspecs.Trainer.__annotations__)
    for member in members:
        assert f"`{member}" in reference, f"Trainer.{member} is not in the reference"


def _public_names() -> list[str]:
    return [f"{m}.{n}" for m in PUBLIC for n in importlib.import_module(m).__all__]


@pytest.mark.parametrize("qualified", _public_names())
def test_every_public_name_is_documented(qualified: str):
    """datasette's docs-as-test: each public name appears, qualified, on a docs page."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(qualified)}(?!\w)")
    pages = sorted(DOCS.glob("*.md"))
    assert any(pattern.search(p.read_text(encoding="utf-8")) for p in pages), (
        f"{qualified} is public (in __all__) but no page of docs/ mentions it"
    )


def test_ci_runs_the_readme_test_command_and_then_the_slow_tests():
    """README's test command is what CI runs, and CI also runs what it leaves out."""
    readme = (REPO / "README.md").read_text()
    (command,) = re.findall(r"OMP_NUM_THREADS=1 (python -m pytest[^\n`]*)\n", readme)
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert command.strip() in ci
    assert ci.index(command.strip()) < ci.index("python -m pytest -q -m slow")


# --- docs of the present -------------------------------------------------------------

#: Wording that tells the project's history instead of what is true now: git keeps the
#: history, the pages and docstrings say what the code does and what it measures.
HISTORY = {
    "a stop of the work": re.compile(r"\b[Ss]tops? \d+\b"),
    "an issue by number": re.compile(r"\b[Ii]ssues? #?\d+\b"),
    "an issue's item": re.compile(r"\b[Ii]tems? \d+\b"),
    "the issue as a narrator": re.compile(r"\b[Ii]ssue's\b|\b(?:[Tt]he|[Tt]his|[Tt]hat) issue\b"),
    "who found it": re.compile(r"(?<!\w)[Nn]ewcomers?\b"),
    "a work session": re.compile(
        r"\b(?:this|that|later|next|previous|earlier|future|other|last|same|each|every)"
        r" sessions?\b|\bsessions? \d+\b",
        re.IGNORECASE,
    ),
    "a past time": re.compile(r"\b(?:at|of) that time\b|\bwhen the \w+ was filed\b", re.I),
    "a commit as narrative": re.compile(
        r"\b(?:at|in|since|before|after|until|from) (?:commit )?[0-9a-f]{7,40}\b"
        r"|\bcommit [0-9a-f]{7,40}\b"
    ),
}
#: Files left out of the scan, each with why.
HISTORY_ALLOWED = {
    "tests/test_docs.py": "holds the examples of history wording the patterns must catch",
}


def _present_tense_files() -> list[Path]:
    """Every doc page a reader meets and every .py file of the code, tests, benchmarks
    and scripts (build outputs and packaging metadata left out)."""
    files = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
    files += sorted((REPO / "examples").glob("**/README.md"))
    files += sorted((REPO / "plugins").glob("*/README.md"))
    for top in ("slhub", "plugins", "tests", "benchmarks", "scripts"):
        for path in sorted((REPO / top).rglob("*.py")):
            parts = path.relative_to(REPO).parts
            if not any(
                p.startswith(".") or p in ("build", "outputs", "__pycache__")
                or p.endswith(".egg-info")
                for p in parts
            ):  # fmt: skip
                files.append(path)
    return files


def _history(text: str) -> list[str]:
    return [f"[{why}] {m.group(0)!r}" for why, p in HISTORY.items() for m in p.finditer(text)]


def test_docs_and_docstrings_describe_the_present():
    """No page, docstring or comment tells the history (work stops, sessions, issue
    numbers, who found what, commits as a story): it says what is true now."""
    found = []
    for path in _present_tense_files():
        rel = path.relative_to(REPO).as_posix()
        if rel in HISTORY_ALLOWED:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{rel}:{number}: {hit}" for hit in _history(line)]
    assert not found, "history wording (git keeps the history):\n" + "\n".join(found)
    for rel in HISTORY_ALLOWED:
        assert (REPO / rel).is_file(), f"HISTORY_ALLOWED names a missing file: {rel}"


@pytest.mark.parametrize(
    "text",
    [
        "## Stop 18: instructions per update",
        "what stop 16 found (below)",
        "Earlier: slhub against a hand-written DDP loop (issue 3)",
        'Dataset windows and memory (issue 21, "Speed and memory")',
        "the BC this issue's newcomer met",
        "a test docstring (issue 24, item 4)",
        "the issue's bare write",
        "against 0.6 ms when the issue was filed",
        "The last bad inputs a newcomer hit",
        "no GPU was lent in this or the two previous sessions",
        "What a later session should fix",
        "the BC of that time",
        "The first measurement (ff3dc04, below) was 1.23x; fixed in 38a7c14",
        "at commit 850f2bb the ratio",
    ],
)
def test_history_wording_is_caught(text: str):
    assert _history(text), text


@pytest.mark.parametrize(
    "text",
    [
        "From `validate` it writes the state and issues no collective",
        "a rank issues one all-reduce per update",
        "https://github.com/huggingface/lerobot/issues/888",
        "see huggingface/lerobot #888",
        'session = onnxruntime.InferenceSession("model.onnx")',
        '@pytest.fixture(scope="session")',
        'plugins=["test_newcomer_inputs:FreeForm"]',
        "NVlabs/neural-robot-dynamics (commit `370e89d`)",
        "the previous handlers come back when training ends",
        "stop the run at step 5; items of the batch",
    ],
)
def test_present_wording_passes(text: str):
    assert not _history(text), _history(text)
