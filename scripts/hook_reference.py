"""Generate the hook reference of docs/hooks.md from slhub/hookspecs.py (its one source).

    python scripts/hook_reference.py           # rewrite the generated part in place
    python scripts/hook_reference.py --check   # exit 1 with one line when it is stale

The generated part lies between the BEGIN/END marker comments of docs/hooks.md;
everything outside them is written by hand and left alone. The reference holds
a summary table, one ``## `name` `` section per hookspec in source (lifecycle)
order with its signature, stage, firstresult and docstring, the ``Trainer``
protocol's members and ``LossResult``. tests/test_docs.py fails when the file
is stale.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "hooks.md"
BEGIN = "<!-- BEGIN GENERATED: python scripts/hook_reference.py -->"
END = "<!-- END GENERATED -->"
TRAINER_ANCHOR = "#the-trainer-protocol"


def load_contract() -> ModuleType:
    """``slhub.hookspecs`` of this checkout (not of some other installed copy)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("slhub.hookspecs")


# ------------------------------------------------------------------ reading


def hookspecs_of(module: ModuleType) -> list[Any]:
    """The hookspec functions of ``module``, in the order they appear in its source."""
    marker = f"{module.PROJECT}_spec"
    specs = [
        obj for obj in vars(module).values() if inspect.isfunction(obj) and hasattr(obj, marker)
    ]
    return sorted(specs, key=lambda fn: inspect.getsourcelines(fn)[1])


def is_firstresult(spec: Any, module: ModuleType) -> bool:
    return bool(getattr(spec, f"{module.PROJECT}_spec").get("firstresult"))


def stages_of(module: ModuleType) -> list[tuple[int, str]]:
    """``(line, title)`` of the source's section banners (``# ----`` / ``# Title`` / ``# ----``)."""
    lines = inspect.getsource(module).splitlines()
    found = []
    for i in range(1, len(lines) - 1):
        banner = lines[i - 1].startswith("# ---") and lines[i + 1].startswith("# ---")
        if banner and lines[i].startswith("# "):
            found.append((i + 1, lines[i][2:].strip()))
    return found


def stage_of(spec: Any, stages: list[tuple[int, str]]) -> str:
    line = inspect.getsourcelines(spec)[1]
    titles = [title for start, title in stages if start < line]
    return titles[-1] if titles else ""


def _annotation(value: Any) -> str:
    return value if isinstance(value, str) else inspect.formatannotation(value)


def signature(fn: Any, skip_self: bool = False) -> str:
    """``name(param: type, ...) -> type`` with the annotations as written in the source."""
    sig = inspect.signature(fn)
    params = []
    for param in sig.parameters.values():
        if skip_self and param.name == "self":
            continue
        text = param.name
        if param.annotation is not inspect.Parameter.empty:
            text += f": {_annotation(param.annotation)}"
        if param.default is not inspect.Parameter.empty:
            text += f" = {param.default!r}"
        params.append(text)
    returns = ""
    if sig.return_annotation is not inspect.Signature.empty:
        returns = f" -> {_annotation(sig.return_annotation)}"
    return f"{fn.__name__}({', '.join(params)}){returns}"


# ---------------------------------------------------------------- rendering


def markdown(text: str, hooks: set[str]) -> str:
    """reST inline markup of a docstring as Markdown; hooks and contract types become links."""

    def role(match: re.Match[str]) -> str:
        kind, target = match.group(1), match.group(2).lstrip("~")
        name = target.rsplit(".", 1)[-1]
        if kind == "func" and target in hooks:
            return f"[`{target}`](#{target})"
        if kind == "class" and target in ("Trainer", "slhub.Trainer"):
            return f"[`{target}`]({TRAINER_ANCHOR})"
        if kind == "class" and name == "LossResult":
            return f"[`{target}`](#lossresult)"
        return f"`{target}`"

    text = re.sub(r":(\w+):`([^`]+)`", role, text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def split_fields(doc: str) -> tuple[str, list[tuple[str, str]]]:
    """A docstring's prose and its ``:param x:``/``:returns:`` fields, continuation lines joined."""
    prose: list[str] = []
    fields: list[tuple[str, str]] = []
    for line in doc.splitlines():
        match = re.match(r":(param (\w+)|returns|raises (\w+)):\s*(.*)", line)
        if match:
            fields.append((match.group(1), match.group(4).strip()))
        elif fields and line.startswith(" "):
            fields[-1] = (fields[-1][0], f"{fields[-1][1]} {line.strip()}")
        elif not fields:
            prose.append(line)
    return "\n".join(prose).strip(), fields


def render_fields(fields: list[tuple[str, str]], hooks: set[str]) -> list[str]:
    params = [(f[len("param ") :], text) for f, text in fields if f.startswith("param ")]
    out = []
    if params:
        out.append("- **Parameters:**")
        out += [f"  - `{name}`: {markdown(text, hooks)}" for name, text in params]
    else:
        out.append("- **Parameters:** none")
    for field, text in fields:
        if field == "returns":
            out.append(f"- **Returns:** {markdown(text, hooks)}")
        elif field.startswith("raises "):
            out.append(f"- **Raises** `{field[len('raises ') :]}`: {markdown(text, hooks)}")
    return out


def render_hook(spec: Any, module: ModuleType, stage: str, hooks: set[str]) -> list[str]:
    name = spec.__name__
    prose, fields = split_fields(inspect.getdoc(spec) or "")
    first = is_firstresult(spec, module)
    decorator = "@hookspec(firstresult=True)" if first else "@hookspec"
    if first:
        result = "yes: the first non-None result wins (the model plugin is asked first)"
    else:
        result = "no: every plugin's implementation is called"
    lines = [
        f"## `{name}`",
        "",
        "```python",
        decorator,
        f"def {signature(spec)}",
        "```",
        "",
        markdown(prose, hooks),
        "",
        f"- **Stage:** {stage}",
        f"- **firstresult:** {result}",
    ]
    if name in module.MODEL_HOOKS:
        lines.append(
            "- **Model plugin only:** an extra plugin (`plugins:`) implementing it is refused"
        )
    return [*lines, *render_fields(fields, hooks), ""]


def called(spec: Any) -> str:
    """The spec's sentence that says when and on which ranks it is called."""
    prose = " ".join(split_fields(inspect.getdoc(spec) or "")[0].split())
    match = re.search(r"\bCalled (.+?\.)(?=\s+[A-Z`]|$)", prose)
    return match.group(1) if match else ""


def render_table(specs: list[Any], module: ModuleType, hooks: set[str]) -> list[str]:
    lines = ["| hook | called | firstresult | implemented by |", "|---|---|---|---|"]
    for spec in specs:
        name = spec.__name__
        first = "yes" if is_firstresult(spec, module) else "no"
        who = "model plugin only" if name in module.MODEL_HOOKS else "any plugin"
        when = markdown(called(spec), hooks).replace("|", "\\|")
        lines.append(f"| [`{name}`](#{name}) | {when} | {first} | {who} |")
    return [*lines, ""]


def _comment_above(lines: list[str], lineno: int) -> list[str]:
    """The ``#:`` comment lines directly above source line ``lineno`` (1-based)."""
    out: list[str] = []
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#:"):
        out.insert(0, lines[i].strip()[2:].strip())
        i -= 1
    return out


def render_protocol(protocol: type, hooks: set[str]) -> list[str]:
    """The protocol's attributes (with their ``#:`` comments), properties and methods."""
    source = textwrap.dedent(inspect.getsource(protocol))
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    out = [
        "## The `Trainer` protocol",
        "",
        markdown(inspect.getdoc(protocol) or "", hooks),
        "",
    ]
    groups: list[tuple[list[str], list[str]]] = []  # (members, comment)
    previous_line = -1
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            member = f"`{node.target.id}: {ast.unparse(node.annotation)}`"
            comment = _comment_above(lines, node.lineno)
            if not comment and groups and previous_line == node.lineno - 1:
                groups[-1][0].append(member)
            else:
                groups.append(([member], comment))
            previous_line = node.lineno
        elif isinstance(node, ast.FunctionDef):
            fn = getattr(protocol, node.name)
            is_property = isinstance(fn, property)
            if is_property:
                ann = ast.unparse(node.returns) if node.returns else "Any"
                member = f"`{node.name}: {ann}` (property)"
            else:
                member = f"`{signature(fn, skip_self=True)}`"
            groups.append(([member], (inspect.getdoc(fn) or "").splitlines()))
    for members, comment in groups:
        text = markdown(" ".join(line.strip() for line in comment if line.strip()), hooks)
        out.append(f"- {', '.join(members)}" + (f": {text}" if text else ""))
    return [*out, ""]


def render_loss_result(cls: type, hooks: set[str]) -> list[str]:
    fields = []
    for f in dataclasses.fields(cls):
        default = ""
        if f.default is not dataclasses.MISSING:
            default = f" = {f.default!r}"
        elif f.default_factory is not dataclasses.MISSING:
            default = f" = field(default_factory={f.default_factory.__name__})"
        fields.append(f"    {f.name}: {_annotation(f.type)}{default}")
    return [
        "## `LossResult`",
        "",
        "```python",
        "@dataclass",
        f"class {cls.__name__}:",
        *fields,
        "```",
        "",
        markdown(inspect.getdoc(cls) or "", hooks),
        "",
    ]


def render(module: ModuleType | None = None) -> str:
    """The generated reference (without the marker lines)."""
    module = module or load_contract()
    specs = hookspecs_of(module)
    stages = stages_of(module)
    hooks = {spec.__name__ for spec in specs}
    lines = [
        "<!-- Generated from slhub/hookspecs.py; edit the docstrings there, not this part. -->",
        "",
        *render_table(specs, module, hooks),
    ]
    for spec in specs:
        lines += render_hook(spec, module, stage_of(spec, stages), hooks)
    lines += render_protocol(module.Trainer, hooks)
    lines += render_loss_result(module.LossResult, hooks)
    return "\n".join(lines).rstrip() + "\n"


def splice(text: str, generated: str) -> str:
    """``text`` with the part between the markers replaced by ``generated``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN!r} ... {END!r} markers")
    return f"{text[: start + len(BEGIN)]}\n\n{generated}\n{text[end:]}"


def is_current(path: Path = DOC, module: ModuleType | None = None) -> bool:
    text = path.read_text(encoding="utf-8")
    return splice(text, render(module)) == text


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--doc", type=Path, default=DOC, help="the page to update (docs/hooks.md)")
    args = parser.parse_args(argv)
    text = args.doc.read_text(encoding="utf-8")
    try:
        updated = splice(text, render())
    except ValueError as exc:
        print(f"{_shown(args.doc)}: {exc}", file=sys.stderr)
        return 1
    if updated == text:
        return 0
    if args.check:
        print(
            f"{_shown(args.doc)}: hook reference is stale; run python scripts/hook_reference.py",
            file=sys.stderr,
        )
        return 1
    args.doc.write_text(updated, encoding="utf-8")
    print(f"{_shown(args.doc)}: hook reference regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
