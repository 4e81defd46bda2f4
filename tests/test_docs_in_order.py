"""Every command the docs print runs as written, followed page after page as a reader
meets the pages, with one model of the files they leave.

The commands are read (``bash``/``sh``/``console`` blocks, ``$`` prompts in plain
blocks, and table columns headed "command") from README.md, then the docs/ pages in
the order README first links them, the examples' READMEs in the order README first
names their directories, and the plugins' READMEs in the order README first links
them; and from the ``examples:`` of every ``--help``. A handful run for real
(``--version``, ``plugins``, ``data info``, checkpoints.md's 10-update training and
its ``inspect`` against the page's sample); the rest are checked against slhub's own
parser, recipe loader and plugin sections, and against one model of the files every
earlier command, on any page, left: a fresh run needs a directory no command wrote,
a resume needs a checkpoint an earlier command of the same page (or README's main
job) made, at the same world size, with a recipe that differs only in output_dir and
steps, and updates left to train; an export, collect, convert or a script's ``--out``
needs a destination no command wrote; every path a command writes is ignored by git.

A command that does exactly what an earlier one did (same world size, recipe, resume
and destination) is the same run: not run again, and its page may read what it made.
On the same page it may be worded differently (a figure table's row); an earlier
page's run must be repeated word for word (README's summary of a page's command, a
page restating README's), since a reader who meets it in other words takes it for a
new run and collides with the first. hooks.md's tutorial runs in the reader's own
directory with the files the page has them write; those are written out and
validated. GPU, SLURM, multi-node, install, test-suite and server commands, those
that need a tracking server, and patterns with placeholders (parsed only), are named
in SKIPPED, so a new block is classified rather than silently passed over. Running
them all for real, in the same order against the same model, takes tens of minutes:
that is the docs_run test.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO, subprocess_env

#: A training run short enough to run for real in the fast suite.
RUN_STEPS = 20
#: Words that mark a command as a pattern to fill in, not one to run.
PLACEHOLDERS = re.compile(
    r"(^|[\s=/])(\.\.\.|R|R\.yaml|N|PATH|SRC|DST|CKPT|C\.pt|D|HOST:PORT|ID|<command>)($|[\s/])"
    r"|path/to/|outputs/a/|demos\.hdf5|replay\.zarr|\sout/|mypolicy:"
)
#: Why a command is not checked.
SLURM = "SLURM"
GPU = "GPU"
MULTI_NODE = "multi-node"
INSTALL = "install (the test environment is README's)"
TESTS = "a test suite (pytest runs it)"
SERVER = "a server that runs until stopped"
TRACKER = "needs the tracking server a command before it starts (not started here)"
PATTERN = "a pattern with placeholders (parsed only)"
#: Commands that are not checked, each with why. Keys are ``doc: command`` as
#: :func:`commands` extracts them; the test fails when this list and the docs part.
SKIPPED: dict[str, str] = {
    "README.md: pip install torch==2.13.0": INSTALL,
    "README.md: pip install -e .": INSTALL,
    'README.md: pip install -e ".[dev]" -e plugins/rwm -e plugins/rigidformer -e…': INSTALL,
    "README.md: OMP_NUM_THREADS=1 python -m pytest": TESTS,
    "README.md: OMP_NUM_THREADS=1 torchrun --standalone --nnodes=1 --nproc-per-n…": PATTERN,
    "README.md: CUDA_VISIBLE_DEVICES=0,1 OMP_NUM_THREADS=1 torchrun --standalone…": GPU,
    "README.md: ... train --config R --set trainer.output_dir=outputs/resumed --…": PATTERN,
    "README.md: ... train --config R --set trainer.steps=300 --resume outputs/sl…": PATTERN,
    "README.md: ... train --config R --resume auto": PATTERN,
    "README.md: ... train --config R --overwrite": PATTERN,
    "README.md: slhub data check PATH": PATTERN,
    "README.md: slhub data convert SRC DST": PATTERN,
    "docs/datasets.md: slhub data info path/to/dataset": PATTERN,
    "docs/datasets.md: slhub data check path/to/dataset": PATTERN,
    "docs/datasets.md: slhub data convert path/to/dataset out/": PATTERN,
    "docs/datasets.md: slhub data convert path/to/dataset out_lerobot/ --to lero…": PATTERN,
    "docs/datasets.md: slhub data collect out/ --env gymnasium:Hopper-v5 --episo…": PATTERN,
    "docs/launch.md: CUDA_VISIBLE_DEVICES=0,1 OMP_NUM_THREADS=1 torchrun --stand…": GPU,
    "docs/launch.md: slhub launch --nnodes=2 --nproc-per-node=1 --rdzv-backend=c…": MULTI_NODE,
    "docs/launch.md: SLURM script sl_ddp": SLURM,
    "docs/launch.md: OMP_NUM_THREADS=1 slhub launch --nnodes=2 --nproc-per-node=…": MULTI_NODE,
    'docs/nerd.md: pip install -e ".[dev]"': INSTALL,
    'docs/trackers.md: pip install -e ".[sweep]"': INSTALL,
    "docs/trackers.md: pip install -e plugins/wandb": INSTALL,
    "docs/nerd.md: python -m pytest tests/test_nerd_model.py tests/test_nerd_tra…": TESTS,
    "examples/sl_ddp/README.md: CUDA_VISIBLE_DEVICES=0,1 OMP_NUM_THREADS=1 torch…": GPU,
    "plugins/bc/README.md: pip install -e plugins/bc": INSTALL,
    "plugins/bc/README.md: python -m slhub eval --checkpoint CKPT --env gymnasiu…": PATTERN,
    "plugins/bc/README.md: OMP_NUM_THREADS=1 python -m pytest -q plugins/bc/tests": TESTS,
    "plugins/bc/README.md: OMP_NUM_THREADS=1 python -m pytest -q -m slow plugins…": TESTS,
    "plugins/rigidformer/README.md: pip install -e plugins/rigidformer": INSTALL,
    "plugins/rigidformer/README.md: cd plugins/rigidformer": TESTS,
    "plugins/rigidformer/README.md: python -m pytest -q": TESTS,
    "plugins/rwm/README.md: pip install -e plugins/rwm": INSTALL,
    "plugins/rwm/README.md: OMP_NUM_THREADS=1 python -m pytest -q plugins/rwm/te…": TESTS,
    "plugins/rwm/README.md: OMP_NUM_THREADS=1 python -m pytest -q -m slow plugin…": TESTS,
    "plugins/tensorboard/README.md: pip install -e plugins/tensorboard": INSTALL,
    "plugins/tensorboard/README.md: tensorboard --logdir outputs/sl_tensorboard/…": SERVER,
    "plugins/tensorboard/README.md: tensorboard --logdir outputs": SERVER,
    "plugins/tensorboard/README.md: OMP_NUM_THREADS=1 python -m pytest -q plugin…": TESTS,
    "plugins/wandb/README.md: pip install -e plugins/wandb": INSTALL,
    "plugins/wandb/README.md: OMP_NUM_THREADS=1 python -m pytest -q plugins/wandb": TESTS,
    "plugins/wandb/README.md: OMP_NUM_THREADS=1 python -m pytest -q -m slow plug…": TESTS,
    "docs/trackers.md: mlflow server --backend-store-uri sqlite:///outputs/mlflo…": SERVER,
    "docs/trackers.md: OMP_NUM_THREADS=1 python -m slhub train --config examples…": TRACKER,
    "docs/trackers.md: python -m slhub_mlflow.sync outputs/sl_mlflow --status do…": TRACKER,
    "plugins/mlflow/README.md: pip install -e plugins/mlflow": INSTALL,
    "plugins/mlflow/README.md: mlflow server --backend-store-uri sqlite:///outpu…": SERVER,
    "plugins/mlflow/README.md: OMP_NUM_THREADS=1 python -m slhub train --config …": TRACKER,
    "plugins/mlflow/README.md: python -m slhub_mlflow.sync outputs/sl_mlflow": TRACKER,
    "plugins/mlflow/README.md: python -m slhub_mlflow.sync outputs/sl_mlflow --s…": TRACKER,
    "plugins/mlflow/README.md: python -m slhub_mlflow.sync outputs/sl_mlflow --t…": TRACKER,
    "plugins/mlflow/README.md: OMP_NUM_THREADS=1 python -m pytest -q plugins/mlf…": TESTS,
    "plugins/mlflow/README.md: OMP_NUM_THREADS=1 python -m pytest -q -m slow plu…": TESTS,
}


@dataclass
class Command:
    """One command as a document prints it."""

    doc: str
    line: int
    text: str
    #: The error line the document shows after it (a refusal it demonstrates).
    refusal: str | None = None

    @property
    def key(self) -> str:
        """The page and the command's start: short enough for a line of SKIPPED."""
        room = 74 - len(self.doc)
        text = self.text if len(self.text) <= room else self.text[: room - 1] + "…"
        return f"{self.doc}: {text}"


def documents() -> list[Path]:
    """Every page whose commands a reader follows, in the order they meet them: README,
    the docs/ pages in the order README first links them, the examples' READMEs in the
    order README first names their directories, then the plugins' READMEs in the order
    README first links them (a page README never names comes last in its group, by
    name: test_readme_leads_to_every_page fails on it)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")

    def met(pages: list[Path], mention: str) -> list[Path]:
        def first(page: Path) -> tuple[int, str]:
            rel = page.relative_to(REPO).as_posix()
            found = readme.find(mention.format(rel=rel, dir=rel.removesuffix("README.md")))
            return (found if found >= 0 else len(readme), rel)

        return sorted(pages, key=first)

    return [
        REPO / "README.md",
        *met(list((REPO / "docs").glob("*.md")), "]({rel}"),
        *met(list((REPO / "examples").glob("**/README.md")), "{dir}"),
        *met(list((REPO / "plugins").glob("*/README.md")), "]({rel}"),
    ]


_COMMAND_START = re.compile(
    r"^(?:[A-Z_][A-Z0-9_]*=\S+ +)*(?:slhub|python|torchrun|pip|\.\.\.|tensorboard|cd|grep)(\s|$)"
)


def _join_continued(lines: list[str]) -> list[tuple[int, str]]:
    """Lines with their backslash continuations joined, each with its first line's index."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for index, raw in enumerate(lines):
        line = raw.rstrip()
        if pending is not None:
            start, text = pending
            line = text + " " + line.strip()
            index = start
        if line.endswith("\\"):
            pending = (index, line[:-1].rstrip())
            continue
        pending = None
        joined.append((index, line))
    return joined


def _strip_comment(line: str) -> str:
    """The command without its trailing ``# comment`` (a ``#`` after a space, outside
    quotes), its quoting kept as written."""
    quote = None
    for index, char in enumerate(line):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].strip()
    return line.strip()


def _block_commands(doc: str, start: int, lang: str, body: list[str]) -> list[Command]:
    found: list[Command] = []
    if any(line.startswith("#SBATCH") for line in body):  # a batch script is one unit
        first = next(line for line in body if line.startswith("#SBATCH --job-name"))
        return [Command(doc, start, f"SLURM script {first.split('=', 1)[1]}")]
    prompted = any(line.startswith("$ ") for line in body)
    if not prompted and lang not in ("bash", "sh", "console", "shell"):
        return found
    joined = _join_continued(body)
    for position, (index, line) in enumerate(joined):
        if prompted:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        text = _strip_comment(line)
        if not text or text.startswith("#"):
            continue
        refusal = None
        if prompted:
            for _, after in joined[position + 1 :]:
                if after.startswith("$ "):
                    break
                if after.startswith("slhub: error:"):
                    refusal = after
                    break
        for part in re.split(r"\s&&\s", text):
            found.append(Command(doc, start + 1 + index + 1, part.strip(), refusal))
    return found


def _table_commands(doc: str, lines: list[str]) -> list[Command]:
    """The commands in a ``command`` column, as ``code`` spans."""
    found: list[Command] = []
    column: int | None = None
    for index, line in enumerate(lines):
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            named = [i for i, cell in enumerate(cells) if re.search(r"\bcommand\b", cell)]
            column = named[0] if named else -1
            continue
        if column < 0 or column >= len(cells) or set(cells[column]) <= set("-: "):
            continue
        for span in re.findall(r"`([^`]+)`", cells[column]):
            if _COMMAND_START.match(span) and " " in span.strip():
                found.append(Command(doc, index + 1, span.strip()))
    return found


def commands(path: Path) -> list[Command]:
    """A page's commands in the order it prints them."""
    doc = path.relative_to(REPO).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    found = _table_commands(doc, lines)
    index = 0
    while index < len(lines):
        fence = re.match(r"^\s*```(\w*)\s*$", lines[index])
        if fence is None:
            index += 1
            continue
        end = index + 1
        while not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        body = [line.strip() if line.startswith("  ") else line for line in lines[index + 1 : end]]
        found += _block_commands(doc, index, fence.group(1), body)
        index = end + 1
    return sorted(found, key=lambda c: c.line)


def help_examples() -> dict[str, list[Command]]:
    """Each ``--help``'s ``examples:`` lines, by command."""
    from slhub.cli import build_parser

    parser = build_parser()
    helps = {"slhub": parser}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, child in sub.choices.items():
        helps[f"slhub {name}"] = child
        for inner in child._actions:
            if isinstance(inner, argparse._SubParsersAction):
                helps.update({f"slhub {name} {n}": c for n, c in inner.choices.items()})
    found: dict[str, list[Command]] = {}
    for name, child in helps.items():
        epilog = child.epilog or ""
        if name == "slhub launch":  # its --help is torchrun's parser with slhub's epilog
            from slhub.launch import EXAMPLES

            epilog = EXAMPLES
        block = (
            epilog.split("examples:\n", 1)[1].split("\n\n", 1)[0] if "examples:" in epilog else ""
        )
        body = [line.strip() for line in block.splitlines()]
        found[name] = _block_commands(f"{name} --help", 0, "bash", body)
    return found


# --- what a command is -------------------------------------------------------------


@dataclass
class Invocation:
    """A command taken apart: its launcher's world size and the slhub arguments."""

    kind: str  # slhub, torchrun, launch, or the tool's name
    words: list[str]
    world: int = 1
    nodes: int = 1
    argv: list[str] = field(default_factory=list)


def _launcher_options(words: list[str]) -> tuple[int, int]:
    """torchrun's ``--nnodes`` and ``--nproc-per-node`` (-1 when not a number)."""
    values: dict[str, str] = {}
    index = 0
    while index < len(words):
        word = words[index]
        if word.startswith("--") and "=" in word:
            key, value = word[2:].split("=", 1)
            values[key.replace("_", "-")] = value
        elif word in ("--nproc-per-node", "--nnodes") and index + 1 < len(words):
            values[word[2:]] = words[index + 1]
            index += 1
        index += 1
    nodes = values.get("nnodes", "1").split(":")[-1]
    per_node = values.get("nproc-per-node", "1")
    return int(nodes), int(per_node) if per_node.isdigit() else -1


def invocation(text: str) -> Invocation:
    """Which program a command runs, its world size and slhub's own arguments."""
    words = shlex.split(text.split(" | ")[0])
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    if words[:3] == ["python", "-m", "slhub"]:
        words = ["slhub", *words[3:]]
    if words[:2] == ["slhub", "launch"]:
        split = words.index("train")
        nodes, per_node = _launcher_options(words[2:split])
        return Invocation("launch", words, per_node * nodes, nodes, words[split:])
    if words[:1] == ["torchrun"] and "slhub" in words:
        split = words.index("slhub") - 1
        nodes, per_node = _launcher_options(words[1:split])
        return Invocation("torchrun", words, per_node * nodes, nodes, words[split + 2 :])
    if words[:1] == ["slhub"]:
        return Invocation("slhub", words, argv=words[1:])
    if words[:2] == ["python", "-m"]:
        return Invocation(words[2], words)
    return Invocation(words[0], words)


def _skip_reason(command: Command, call: Invocation) -> str | None:
    """Why a command is not checked here, or None."""
    text = command.text
    if text.startswith("SLURM script"):
        return SLURM
    if "cuda" in text or "CUDA_VISIBLE_DEVICES" in text:
        return GPU
    if call.nodes > 1 or "--rdzv-endpoint" in text:
        return MULTI_NODE
    if re.search(r"\b(kubectl|sbatch|srun)\b", text):
        return SLURM
    if call.kind == "pip":
        return INSTALL
    if call.kind in ("pytest", "cd"):
        return TESTS
    if call.kind in ("tensorboard", "mlflow"):
        return SERVER
    if call.kind == "slhub_mlflow.sync" or 'plugins=["mlflow"]' in text:
        return TRACKER
    return None


# --- a model of the files earlier commands left -------------------------------------


@dataclass
class Run:
    """A run directory's state."""

    #: The pages whose commands made it (a page that restates the command has it too).
    docs: set[str]
    world: int
    digest: str
    step: int
    checkpoints: set[int]
    files: set[str]


@dataclass
class Files:
    """What the commands so far wrote, and which document wrote it."""

    runs: dict[str, Run] = field(default_factory=dict)
    #: Written directories that are not runs (exports, datasets), by the pages that wrote them.
    written: dict[str, set[str]] = field(default_factory=dict)
    #: Commands that are alternatives, not steps (--help's examples): a destination
    #: another command wrote is not refused.
    alternatives: bool = False
    #: Where a tutorial's files are written.
    scratch: Path = field(default_factory=Path)
    #: Every command seen, for restatements: what it does -> the paths it wrote.
    seen: dict[str, list[str]] = field(default_factory=dict)
    #: What it does -> how each page that ran it worded it (page, line, words).
    worded: dict[str, list[tuple[str, int, str]]] = field(default_factory=dict)

    def restated(self, identity: str, command: Command) -> bool:
        """The same command ran before, on this page or, word for word, on an earlier
        one: the reader has its output, and this page may read it. An earlier page's
        run in other words is refused: a reader takes it for a new run into the
        same paths."""
        doc, words = command.doc, " ".join(command.text.split())
        if identity not in self.seen:
            self.worded[identity] = [(doc, command.line, words)]
            return False
        said = self.worded.setdefault(identity, [])
        if said and not any(d == doc or w == words for d, _, w in said):
            first, line, before = said[0]
            raise Refused(
                f"it writes {', '.join(self.seen[identity])} again, which {first}:{line} "
                f"made with `{before}`: an earlier page's run is repeated word for word, "
                "resumed, or given new paths"
            )
        said.append((doc, command.line, words))
        for path in self.seen[identity]:
            if path in self.runs:
                self.runs[path].docs.add(doc)
            else:
                self.written[path] = self.written[path] | {doc}
        return True

    def produced(self, path: str, doc: str) -> bool:
        """``path`` is a repository file, or an earlier command of ``doc`` (or README's
        main job, which every page may assume) made it."""
        if (REPO / path).exists() and not _ignored(path):
            return True
        run_dir, name = os.path.split(path.rstrip("/"))
        for where in (path.rstrip("/"), run_dir):
            run = self.runs.get(where)
            if run is not None and (doc in run.docs or where == MAIN_JOB):
                if where == path.rstrip("/") or name in run.files:
                    return True
                return False
        return doc in self.written.get(path.rstrip("/"), set())


MAIN_JOB_DOC = "README.md"
#: README's main job, which every page may build on (README's two commands as written,
#: then every doc command in order).
MAIN_JOB = "outputs/sl_ddp_cpu"


def _ignored(path: str) -> bool:
    return _git_ignored([path])[0]


_IGNORED: dict[str, bool] = {}


def _git_ignored(paths: list[str]) -> list[bool]:
    """Whether git ignores each path (``git check-ignore``, cached)."""
    missing = [p for p in paths if p not in _IGNORED]
    if missing:
        out = subprocess.run(
            ["git", "check-ignore", "--no-index", "--stdin", "-z"],
            input="\0".join(missing) + "\0",
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        ).stdout
        hits = set(filter(None, out.split("\0")))
        _IGNORED.update({p: p in hits for p in missing})
    return [_IGNORED[p] for p in paths]


def _recipe(config: str, overrides: list[str]) -> Any:
    """The recipe a train command runs, every plugin section validated as a run does."""
    from slhub.recipe import load_recipe

    recipe = load_recipe(REPO / config if not os.path.isabs(config) else config, overrides)
    recipe.validate_sections(_sections(recipe.plugin, tuple(recipe.plugins)))
    return recipe


@functools.cache
def _sections(plugin: str, plugins: tuple[str, ...]) -> dict[str, Any]:
    """The recipe sections a plugin set owns (once per set: resolving plugins is slow)."""
    from slhub.registry import build_manager

    sections: dict[str, Any] = {}
    for part in build_manager(plugin, plugins).hook.recipe_sections():
        sections.update(part or {})
    return sections


def _checkpoints(recipe: Any, start: int) -> set[int]:
    every = recipe.trainer.save_every or recipe.trainer.steps
    made = {s for s in range(start + 1, recipe.trainer.steps + 1) if s % every == 0}
    return made | {recipe.trainer.steps}


def _run_files(recipe: Any, checkpoints: set[int]) -> set[str]:
    files = {"run.json", "metrics.jsonl", "last.pt", *(f"step_{s}.pt" for s in checkpoints)}
    if "tensorboard" in recipe.plugins:
        files.add("tensorboard")
    if "wandb" in recipe.plugins:
        files.add("wandb")
    if recipe.trainer.best is not None:
        files.add("best.pt")
    return files


class Refused(Exception):
    """The command would fail as written."""


@functools.cache
def _parser() -> argparse.ArgumentParser:
    from slhub.cli import build_parser

    return build_parser()


def _parse(argv: list[str]) -> argparse.Namespace:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            return _parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:  # --help or --version: printed, and nothing else to check
            return argparse.Namespace(command="help")
        raise Refused(f"the parser refuses it: {stderr.getvalue().strip()}") from None


def _writes(path: str) -> None:
    if not _ignored(path):
        raise Refused(f"it writes {path}, which git does not ignore (.gitignore)")


def page_files(doc: str) -> dict[str, str]:
    """The files a page has its reader write (a block right after "`NAME`:")."""
    text = (REPO / doc).read_text(encoding="utf-8")
    pattern = r"^`([\w.]+\.(?:py|yaml))`[^\n]*(?:\n(?!```)[^\n]*)*?\n```\w*\n(.*?)^```"
    return dict(re.findall(pattern, text, re.M | re.S))


def _tutorial(doc: str, config: str, overrides: list[str], tmp: Path) -> str:
    """A tutorial's recipe, with the page's own files, validates (in the reader's own
    directory, not the repository: its output paths are the reader's)."""
    written = page_files(doc)
    if config not in written:
        raise Refused(f"{config} is neither a repository file nor one the page writes")
    for name, text in written.items():
        (tmp / name).write_text(text, encoding="utf-8")
    sys.path.insert(0, str(tmp))
    try:
        _recipe(str(tmp / config), overrides)
    finally:
        sys.path.remove(str(tmp))
        for name in written:  # no later test may import the tutorial's modules by chance
            sys.modules.pop(name.removesuffix(".py"), None)
    return "a tutorial recipe that validates with the page's files"


def check_train(command: Command, call: Invocation, args: argparse.Namespace, files: Files):
    """A training command against the runs before it: see the module docstring."""
    from slhub.recipe import recipe_digest

    if not (REPO / args.config).is_file():
        return _tutorial(command.doc, args.config, args.overrides, files.scratch)
    recipe = _recipe(args.config, args.overrides)
    out = str(recipe.trainer.output_dir).rstrip("/")
    identity = json.dumps([call.world, recipe.to_dict(), args.resume, args.overwrite], default=str)
    if files.restated(identity, command):
        return "restates an earlier command"
    files.seen[identity] = [out]
    _writes(out)
    data = recipe.data.get("data") or {}
    source = data.get("path") if isinstance(data, dict) else None
    if source and not files.produced(str(source), command.doc):
        raise Refused(f"it trains on {source}, which no earlier command of the page made")
    digest = recipe_digest(recipe.to_dict())
    run = files.runs.get(out)
    start = 0
    if args.resume == "auto" and run is not None and "last.pt" in run.files:
        args.resume = f"{out}/last.pt"
        if run.step >= recipe.trainer.steps:
            _compatible(run, call.world, digest, out)
            run.docs.add(command.doc)
            return "already complete (exit 0)"
    elif args.resume == "auto":
        args.resume = None
    if args.resume is not None:
        source_dir, name = os.path.split(args.resume)
        if not files.produced(args.resume, command.doc):
            raise Refused(f"it resumes {args.resume}, which no earlier command of the page wrote")
        source = files.runs[source_dir]
        _compatible(source, call.world, digest, args.resume)
        start = source.step if name == "last.pt" else int(name[5:-3])
        if start >= recipe.trainer.steps:
            raise Refused(f"{args.resume} is at update {start}: nothing to train")
        if source_dir == out:
            if source.step > start:
                raise Refused(f"{out}'s metrics reach update {source.step}, ahead of {name}")
            run = None  # continues in place
            checkpoints = source.checkpoints | _checkpoints(recipe, start)
            files.runs[out] = Run(
                source.docs | {command.doc}, call.world, digest, recipe.trainer.steps,
                checkpoints, _run_files(recipe, checkpoints),
            )  # fmt: skip
            return "resumes in place"
    if run is not None and not args.overwrite:
        raise Refused(f"{out} already holds run artifacts (of {', '.join(sorted(run.docs))})")
    if out in files.written:
        raise Refused(f"{out} already holds the output of {', '.join(sorted(files.written[out]))}")
    checkpoints = _checkpoints(recipe, start)
    files.runs[out] = Run(
        {command.doc}, call.world, digest, recipe.trainer.steps, checkpoints,
        _run_files(recipe, checkpoints),
    )  # fmt: skip
    return "trains" if start == 0 else f"resumes from update {start} into {out}"


def _compatible(run: Run, world: int, digest: str, what: str) -> None:
    if run.world != world:
        raise Refused(f"{what}: world size {run.world}, this command runs {world}")
    if run.digest != digest:
        raise Refused(f"{what}: the recipe differs from the checkpoint's")


def check(command: Command, call: Invocation, files: Files) -> str:
    """What the command does, checked; raises Refused when it would fail as written."""
    doc = command.doc
    if call.kind not in ("slhub", "torchrun", "launch"):
        words = call.words[1:]
        out = words[words.index("--out") + 1] if "--out" in words[:-1] else None
        for word in words:
            if word == out or not word.startswith(("outputs/", "exports/", "datasets/")):
                continue
            if not files.produced(word, doc):
                raise Refused(f"it reads {word}, which no earlier command of the page wrote")
        if call.kind == "python" and call.words[1].endswith(".py"):
            if not (REPO / call.words[1]).is_file():
                raise Refused(f"{call.words[1]} is not a file of the repository")
        if out is None:
            return f"{call.kind} reads what earlier commands wrote"
        identity = json.dumps(call.words)
        if files.restated(identity, command):
            return f"restates an earlier {call.kind} command"
        _claim(out, doc, identity, files)
        return f"{call.kind} writes {out}"
    if call.world < 1:
        raise Refused("the worker count is not a number")
    args = _parse(call.argv)
    name = args.command
    if name == "train":
        if command.refusal is not None:
            return check_refusal(command, args, files)
        return check_train(command, call, args, files)
    identity = json.dumps(vars(args), default=str, sort_keys=True)
    if files.restated(identity, command):
        return f"restates an earlier slhub {name}"
    if name in ("inspect", "eval", "export"):
        source = args.checkpoint
        if not files.produced(source, doc):
            raise Refused(f"it reads {source}, which no earlier command of the page wrote")
    if name == "plot":
        for run_dir in args.run_dirs:
            if not files.produced(run_dir, doc):
                raise Refused(f"it plots {run_dir}, which no earlier command of the page wrote")
    if name == "sweep":
        return check_sweep(args, doc, identity, files)
    if name == "data" and args.data_command in ("info", "check", "convert"):
        if not files.produced(args.path, doc):
            raise Refused(f"it reads {args.path}, which is neither a repository file nor made")
    destination = getattr(args, "out", None) if name in ("export", "plot") else None
    if name == "data" and args.data_command in ("convert", "collect"):
        destination = args.destination
    if destination is not None:
        _claim(destination, doc, identity, files)
    return f"slhub {name}"


def check_sweep(args: argparse.Namespace, doc: str, identity: str, files: Files) -> str:
    """A sweep: its file and search space validate against its recipe, and it writes a
    new output_dir; ``--summary`` reads one an earlier command of the page wrote."""
    from slhub.sweep import load_sweep
    from slhub.sweep.space import checked_recipe

    sweep = load_sweep(args.config)
    out = os.path.normpath(sweep.output_dir)
    if args.summary:
        if not files.produced(out, doc):
            raise Refused(f"it summarizes {out}, which no earlier command of the page wrote")
        return "slhub sweep --summary"
    checked_recipe(sweep)
    _claim(out, doc, identity, files)
    return f"slhub sweep writes {out}"


def _claim(destination: str, doc: str, identity: str, files: Files) -> None:
    """An export's, dataset's or figure's destination: ignored by git, and new."""
    destination = destination.rstrip("/")
    _writes(destination)
    taken = destination in files.written or destination in files.runs
    if taken and not files.alternatives:
        owner = files.written.get(destination) or files.runs[destination].docs
        raise Refused(
            f"{destination} already holds the output of {', '.join(sorted(owner))} (it must be new)"
        )
    files.written[destination] = {doc}
    files.seen[identity] = [destination]


def check_refusal(command: Command, args: argparse.Namespace, files: Files) -> str:
    """A command a page shows failing: it must fail, with the difference the page names."""
    from slhub.recipe import recipe_differences

    if not (args.resume and files.produced(args.resume, command.doc)):
        raise Refused(f"its refusal needs {args.resume}, which no earlier command wrote")
    base = _recipe(args.config, [])
    changed = _recipe(args.config, args.overrides)
    base.data["trainer"]["output_dir"] = changed.trainer.output_dir
    shown = recipe_differences(base.to_dict(), changed.to_dict())
    assert shown and all(d in (command.refusal or "") for d in shown), (command.refusal, shown)
    return "refused as the page shows"


def classify(command: Command) -> tuple[Invocation, str | None]:
    call = invocation(command.text) if not command.text.startswith("SLURM") else None
    call = call or Invocation("slurm", [])
    reason = _skip_reason(command, call)
    if reason is None and PLACEHOLDERS.search(command.text):
        reason = PATTERN
    return call, reason


def follow(pages: list[list[Command]], scratch: Path) -> tuple[Files, list[str], dict[str, str]]:
    """Every page's commands in order: what each does, what it would fail on, and the
    commands not checked (with why)."""
    files = Files(scratch=scratch)
    done: list[str] = []
    skipped: dict[str, str] = {}
    for page in pages:
        for command in page:
            call, reason = classify(command)
            if reason is not None:
                skipped[command.key] = reason
                if call.argv and reason == PATTERN:
                    _parse_pattern(call.argv)
                continue
            try:
                done.append(f"{command.doc}:{command.line}: {check(command, call, files)}")
            except Refused as exc:
                done.append(f"FAILS {command.doc}:{command.line}: {command.text}\n    {exc}")
            except Exception as exc:  # noqa: BLE001 - a recipe or plugin refusal, as slhub says it
                done.append(f"FAILS {command.doc}:{command.line}: {command.text}\n    {exc}")
    return files, done, skipped


def _parse_pattern(argv: list[str]) -> None:
    """A pattern still parses once its placeholders are filled in."""
    fill = {"R": "examples/sl_ddp/cpu.yaml", "R.yaml": "examples/sl_ddp/cpu.yaml"}
    filled = [fill.get(word, "train" if word == "<command>" else word) for word in argv]
    _parse(filled)


# --- the tests ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def followed(tmp_path_factory) -> tuple[Files, list[str], dict[str, str]]:
    return follow([commands(page) for page in documents()], tmp_path_factory.mktemp("pages"))


def test_every_doc_command_runs_in_order(followed):
    _, done, _ = followed
    failing = [line for line in done if line.startswith("FAILS")]
    assert not failing, "\n".join(failing)


def test_every_skipped_command_is_named(followed):
    _, _, skipped = followed
    assert skipped == SKIPPED, "classify the new commands: " + json.dumps(
        {k: v for k, v in skipped.items() if SKIPPED.get(k) != v}, indent=1
    )


def test_help_examples_run_against_the_docs_runs(followed):
    """``--help``'s examples name recipes, keys and files that the docs' runs make."""
    files, _, _ = followed
    failing = []
    for name, examples in help_examples().items():
        for command in examples:
            call, reason = classify(command)
            if reason is not None:
                if call.argv:
                    _parse_pattern(call.argv)
                continue
            args = _parse(call.argv)
            try:
                if args.command == "train":
                    _recipe(args.config, args.overrides)
                else:
                    command = Command(MAIN_JOB_DOC, 0, command.text)
                    check(command, call, _copy_runs(files))
            except Exception as exc:  # noqa: BLE001
                failing.append(f"{name}: {command.text}: {exc}")
    assert not failing, "\n".join(failing)


def _copy_runs(files: Files) -> Files:
    """What the docs made, each as if README had made it (help examples assume any of
    it); the examples are alternatives, so none writes where another did."""
    runs = {k: Run({MAIN_JOB_DOC}, *list(vars(v).values())[1:]) for k, v in files.runs.items()}
    written = {k: {MAIN_JOB_DOC} for k in files.written}
    return Files(runs, written, scratch=files.scratch, alternatives=True)


def test_help_lists_only_the_exit_statuses_a_command_can_return():
    """75 and 128+N come from stop signals, which only a training honours (75 also from
    a sweep, whose trial is a training)."""
    from slhub.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, child in sub.choices.items():
        epilog = child.epilog or ""
        if name == "launch":
            continue
        assert "exit status:" in epilog, name
        assert ("75 " in epilog) == (name in ("train", "sweep")), name  # a sweep's trial
        assert ("128+N" in epilog) == (name == "train"), name


def test_the_checker_refuses_what_a_reader_would_hit(tmp_path: Path):
    """Each way a page's commands can fail a reader who follows them in order (a
    reused output directory, a resume with nothing to train, a destination git does not
    ignore, a missing checkpoint, an unknown key, another world size, a run restated in
    other words), as a page would print it, is caught."""
    main = "OMP_NUM_THREADS=1 torchrun --standalone --nnodes=1 --nproc-per-node=2 -m slhub"
    cpu = "train --config examples/sl_ddp/cpu.yaml"
    one = "python -m slhub train --config examples/sl_ddp/cpu.yaml"
    ckpt = "--resume outputs/sl_ddp_cpu"
    plot = "python scripts/plot_nerd_rollout.py"
    page = [
        Command("README.md", 1, f"{main} {cpu}"),
        Command("x.md", 2, f"{one} --set 'plugins=[\"tensorboard\"]'"),
        Command("x.md", 3, f"{main} {cpu} --set trainer.steps=300 {ckpt}/last.pt"),
        Command("x.md", 4, f"{main} {cpu} --set trainer.steps=300 {ckpt}/step_300.pt"),
        Command("x.md", 5, "slhub export --checkpoint outputs/sl_ddp_cpu/last.pt --out exported/x"),
        Command("x.md", 6, "slhub inspect outputs/other/last.pt"),
        Command("x.md", 7, f"{one} --set optim.lr=3e-4 --set trainer.output_dir=outputs/o"),
        Command("x.md", 8, f"{one} {ckpt}/step_100.pt --set trainer.output_dir=outputs/w1"),
        Command("x.md", 9, f"slhub launch --standalone --nproc-per-node=2 {cpu}"),
        Command("x.md", 10, f"{plot} --checkpoint outputs/sl_ddp_cpu/last.pt --out docs/x.png"),
    ]
    _, done, _ = follow([page], tmp_path)
    assert done[0] == "README.md:1: trains", done
    expected = [
        "already holds run artifacts", "resumes in place", "nothing to train",
        "git does not ignore", "no earlier command", "unknown key", "world size 2",
        "repeated word for word", "git does not ignore",
    ]  # fmt: skip
    for line, words in zip(done[1:], expected, strict=True):
        assert words in line, (line, words)


def test_readme_leads_to_every_page():
    """A reader meets every page through README: it links each docs/ page and plugin
    README and names each example's directory (documents() orders them so)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    pages = [p.relative_to(REPO).as_posix() for p in documents()]
    assert pages[0] == "README.md" and len(pages) == len(set(pages)), pages
    for page in pages[1:]:
        mention = page.removesuffix("README.md") if page.startswith("examples/") else f"]({page}"
        assert mention in readme, f"README.md never leads to {page}"


def test_extraction_reads_blocks_prompts_and_command_columns(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "| what | command |\n|---|---|\n| a | `slhub plugins` and `slhub --version` |\n"
        "```bash\n# comment\nslhub train --config a.yaml \\\n  --set x=1  # why\n"
        "pip install x && slhub plugins\n```\n"
        "```\n$ slhub inspect c.pt\nstep: 1\n$ slhub train --config r.yaml\n"
        "slhub: error: nope\n```\n```python\nslhub.train()\n```\n",
        encoding="utf-8",
    )
    monkey = REPO
    try:
        globals()["REPO"] = tmp_path
        found = [(c.line, c.text, c.refusal) for c in commands(page)]
    finally:
        globals()["REPO"] = monkey
    assert found == [
        (3, "slhub plugins", None),
        (3, "slhub --version", None),
        (6, "slhub train --config a.yaml --set x=1", None),
        (8, "pip install x", None),
        (8, "slhub plugins", None),
        (11, "slhub inspect c.pt", None),
        (13, "slhub train --config r.yaml", "slhub: error: nope"),
    ]


# --- the handful run for real -------------------------------------------------------


def _cli(argv: list[str], cwd: Path) -> tuple[int, str]:
    """``slhub ARGV`` in this process (torch is imported already), with its stdout."""
    from slhub.cli import main

    out = io.StringIO()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = int(exc.code or 0)
    finally:
        os.chdir(here)
    return code, out.getvalue()


def _cheap(call: Invocation) -> bool:
    argv = call.argv
    if argv[:1] in (["--version"], ["plugins"], ["inspect"]) or "--help" in argv:
        return True
    if argv[:2] == ["data", "info"]:
        return (REPO / argv[2]).exists() and not _ignored(argv[2])  # a repository file
    if argv[:1] == ["train"] and call.world == 1:
        steps = [w.split("=", 1)[1] for w in argv if w.startswith("trainer.steps=")]
        return bool(steps) and int(steps[-1]) <= RUN_STEPS
    return False


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    """A working directory holding the repository's recipes and data, nothing else."""
    for name in ("examples", "tests", "slhub", "plugins", "scripts"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def test_the_cheap_commands_run_as_written(sandbox: Path):
    """--version, plugins, data info, a short training and inspect, for real, with the
    output the page shows after each (checkpoints.md's sample ``inspect``)."""
    ran: list[str] = []
    compared: list[str] = []
    made: set[str] = set()
    for page in documents():
        shown = _shown_outputs(page)
        for command in commands(page):
            call, reason = classify(command)
            if reason is not None or call.kind != "slhub" or not _cheap(call):
                continue
            if call.argv[0] == "inspect" and os.path.dirname(call.argv[1]) not in made:
                continue  # the fast test checks that an earlier command made it
            code, out = _cli(call.argv, sandbox)
            if call.argv[0] == "train":
                made.update(w.split("=", 1)[1] for w in call.argv if "output_dir=" in w)
            assert code == 0, (command.key, out)
            expected = shown.get(command.text)
            if expected:
                _assert_like(out, expected, command.key)
                compared.append(command.doc)
            ran.append(call.argv[0])
    assert {"plugins", "data", "train", "inspect"} <= set(ran), ran
    assert "docs/checkpoints.md" in compared  # its sample inspect output is current
    code, out = _cli(["--version"], sandbox)  # README names it in a sentence
    assert code == 0 and re.fullmatch(r"slhub \S+\n", out), out


def _shown_outputs(page: Path) -> dict[str, list[str]]:
    """The output a page prints under each ``$`` command."""
    shown: dict[str, list[str]] = {}
    current: list[str] | None = None
    for _, line in _join_continued(page.read_text(encoding="utf-8").splitlines()):
        if line.startswith("$ "):
            current = shown.setdefault(_strip_comment(line[2:]), [])
        elif line.startswith("```"):
            current = None
        elif current is not None:
            current.append(line)
    return shown


def _assert_like(out: str, shown: list[str], where: str) -> None:
    """Every line shown is printed, field for field; run ids, times and digests differ."""
    volatile = re.compile(r"[0-9a-f]{32,64}|\d{4}-\d\d-\d\dT[\d:.+]+|/\S*doccheck")
    printed = [volatile.sub("X", line.rstrip()) for line in out.splitlines()]
    for line in shown:
        assert volatile.sub("X", line.rstrip()) in printed, (where, line, out)


def test_help_runs_for_every_command():
    from slhub.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in sub.choices:
        if name == "launch":
            continue
        code, out = _cli([name, "--help"], REPO)
        assert code == 0 and "exit status:" in out, name


# --- the slow one: every command, for real, on a fresh copy -------------------------


@pytest.mark.docs_run
def test_every_doc_command_runs_for_real_on_a_fresh_copy(tmp_path: Path):
    """The commands the fast test checks, run by bash in a copy of the tracked files, in
    the same page order (documents()) and against the same one model of files (check()),
    so a run an earlier page made is never run again (tens of minutes: every example
    trains and the MuJoCo ones collect first), so neither README's test command nor
    ``-m slow`` runs it: ``python -m pytest -m docs_run``."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tmp_path / name)
    env = subprocess_env()
    env["PYTHONPATH"] = str(tmp_path)
    files = Files(scratch=tmp_path / "pages")
    files.scratch.mkdir()
    for page in documents():
        for command in commands(page):
            call, reason = classify(command)
            if reason is not None:
                continue
            try:
                what = check(command, call, files)
            except Refused as exc:
                pytest.fail(f"{command.key}: {exc}")
            if "restates" in what:
                continue  # the reader has that run already (``--resume auto`` on it runs: exit 0)
            if "tutorial" in what:
                continue  # its paths are the reader's own (hooks.md writes under /tmp)
            done = subprocess.run(
                ["bash", "-c", command.text], cwd=tmp_path, env=env, capture_output=True,
                text=True, timeout=900, check=False,
            )  # fmt: skip
            expected = 2 if command.refusal else 0
            assert done.returncode == expected, (command.key, done.stderr[-2000:])


# --- published figures ----------------------------------------------------------------


def _sl_ddp_figures() -> dict[str, dict[int, float]]:
    """examples/sl_ddp/README.md's validation/mse table, by column (run) and update."""
    text = (REPO / "examples" / "sl_ddp" / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \|$", text, re.M)
    assert len(rows) == 4, rows
    return {
        "1 process": {int(u): float(a) for u, a, _ in rows},
        "2 Gloo workers": {int(u): float(b) for u, _, b in rows},
    }


def _validation(run_dir: Path) -> dict[int, float]:
    from slhub import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    return {r["step"]: r["validation/mse"] for r in rows if "validation/mse" in r}


def _published(value: float, shown: float | str) -> bool:
    """A figure as published: to the digits it shows (``"0.00140"``: five), or within a
    spread it states over CPUs (``"0.6–0.8"``: rounded to one digit, ends included)."""
    low, _, high = str(shown).partition("–")
    digits = len(low.split(".")[1])
    return float(low) <= round(value, digits) <= float(high or low)


def test_sl_ddp_one_process_figures_reproduce(sandbox: Path):
    """The one-process column, from the page's own command (printed above the table)."""
    page = commands(REPO / "examples" / "sl_ddp" / "README.md")
    (command,) = [c for c in page if "outputs/sl_single_cpu" in c.text]
    code, _ = _cli(invocation(command.text).argv, sandbox)
    assert code == 0
    got = _validation(sandbox / "outputs" / "sl_single_cpu")
    shown = _sl_ddp_figures()["1 process"]
    assert all(_published(got[u], v) for u, v in shown.items()), (got, shown)


@pytest.mark.slow
def test_sl_ddp_two_worker_figures_and_readme_console_reproduce(tmp_path: Path):
    """The two-worker column and README's console lines, from the main job's command."""
    from helpers import run_torchrun

    out = tmp_path / "sl_ddp_cpu"
    proc = run_torchrun(
        "train", "--config", "examples/sl_ddp/cpu.yaml", "--set", f"trainer.output_dir={out}"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = _validation(out)
    shown = _sl_ddp_figures()["2 Gloo workers"]
    assert all(_published(got[u], v) for u, v in shown.items()), (got, shown)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    console = dict(re.findall(r"\[info\] validation step=(\d+) mse=([\d.]+)", readme))
    assert console and all(_published(got[int(u)], float(v)) for u, v in console.items())


#: Figure rows a test does not rerun, with why.
FIGURES_NOT_RERUN = {
    "data.path=": "trains on a dataset an earlier command collects",
}


def _figure_rows() -> list[tuple[str, str, str, str]]:
    """(page, command, first, last) of every README figure table with a command column
    and a validation/mse column, one row per command printed in it."""
    rows = []
    for page in documents():
        table = None
        for line in page.read_text(encoding="utf-8").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not line.startswith("|"):
                table = None
            elif table is None:
                named = [i for i, c in enumerate(cells) if re.search(r"\bcommand\b", c)]
                mse = [i for i, c in enumerate(cells) if c.startswith("validation/mse")]
                table = (named[0], mse[0]) if named and mse else (-1, -1)
            elif table[0] >= 0 and not set(cells[0]) <= set("-: "):
                spans = re.findall(r"`([^`]+)`", cells[table[0]])
                number = r"(\d+\.\d+(?:–\d+\.\d+)?)"  # a figure, or a range of them
                numbers = re.findall(rf"{number}(?: \(step \d+\))? → {number}", cells[table[1]])
                if spans and numbers and _COMMAND_START.match(spans[0]):
                    first, last = numbers[0]
                    rows.append((page.relative_to(REPO).as_posix(), spans[0], first, last))
    return rows


def test_figure_tables_print_their_commands():
    """Each README figure table with a validation/mse column names its commands, and
    the commands are the pages' own (the fast test checks those run)."""
    rows = _figure_rows()
    pages = {page for page, *_ in rows}
    assert {"plugins/bc/README.md", "plugins/rigidformer/README.md"} <= pages, rows
    assert "plugins/rwm/README.md" in pages, rows


@pytest.mark.slow
@pytest.mark.parametrize("page, command, first, last", _figure_rows())
def test_published_figures_reproduce(page: str, command: str, first: str, last: str, tmp_path):
    """A figure row's command, rerun (into a temporary output_dir), logs the first and
    last validation/mse the row publishes, to the digits shown."""
    why = [reason for marker, reason in FIGURES_NOT_RERUN.items() if marker in command]
    if why:
        pytest.skip(why[0])
    out = tmp_path / "run"
    text = f"{command} --set trainer.output_dir={out}"
    done = subprocess.run(
        ["bash", "-c", text], cwd=REPO, env=subprocess_env(), capture_output=True,
        text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = _validation(out)
    values = [got[s] for s in sorted(got)]
    assert _published(values[0], first) and _published(values[-1], last), (values, first, last)
