"""Man pages (section 1) written from the commands' own help: one page per
command and group (``letsinfer-model-pull.1`` for ``letsinfer model pull``).

The tree is walked with ``list_commands``/``get_command``, so every lazily
loaded subcommand is found (click-man walks ``Group.commands``, which holds
only the subcommands already imported). A page holds nothing that changes
between runs (no date; subcommands sorted), so a committed page is stale
exactly when the help it came from changed.

    python -m letsinfer.cli.man_pages DIR     (in a checkout: ./dev man)
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from letsinfer import __version__

# Each page names what to run when its command's help changed.
REGENERATE = "./dev man"


def page_name(command_path: str) -> str:
    """``letsinfer model pull`` -> ``letsinfer-model-pull.1``."""
    return "-".join(command_path.split()) + ".1"


def contexts(command: click.Command, name: str = "letsinfer") -> Iterator[click.Context]:
    """A context for ``command`` and for each visible subcommand below it, in
    order. Building a context runs no command's callback."""

    def walk(ctx: click.Context) -> Iterator[click.Context]:
        yield ctx
        group = ctx.command
        if isinstance(group, click.Group):
            for sub_name in group.list_commands(ctx):
                sub = group.get_command(ctx, sub_name)  # imports a lazy one
                if sub is not None and not sub.hidden:
                    yield from walk(click.Context(sub, info_name=sub_name, parent=ctx))

    return walk(click.Context(command, info_name=name))


def _text(text: str) -> str:
    """Plain text as roff: backslashes, hyphens and quotes kept as typed (an
    option copied from the page works), no line read as a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-").replace("'", "\\(aq").replace("`", "\\(ga")
    return "\n".join(f"\\&{line}" if line.startswith(".") else line for line in text.split("\n"))


def _paragraphs(text: str) -> list[str]:
    """click's paragraphs: rewrapped, except one that starts with ``\\b``."""
    out: list[str] = []
    for block in inspect.cleandoc(text).split("\n\n"):
        lines = block.strip("\n").split("\n")
        if lines and lines[0].strip() == "\b":
            out.append(".nf\n" + _text("\n".join(lines[1:])) + "\n.fi")
        elif block.strip():
            out.append(_text(" ".join(block.split())))
    return out


def _option_names(record: str) -> str:
    """``-n, --name TEXT`` -> the names bold, the value's placeholder italic."""
    words = []
    for word in record.split(" "):
        if word.startswith("-"):
            comma = "," if word.endswith(",") else ""
            words.append(f"\\fB{_text(word.rstrip(','))}\\fR{comma}")
        elif word == "/":
            words.append(word)
        else:
            words.append(f"\\fI{_text(word)}\\fR")
    return " ".join(words)


def _summary(command: click.Command) -> str:
    """The first sentence of the help, whole (the group listings' own)."""
    return command.get_short_help_str(limit=1000)


def render(ctx: click.Context) -> str:
    """One command's page."""
    command = ctx.command
    path = ctx.command_path
    title = page_name(path)[: -len(".1")]
    lines = [
        f'.\\" {page_name(path)}: written from `{path} --help` by `{REGENERATE}`; '
        "edit the help, not this file.",
        f'.TH {_text(title.upper())} 1 "" "letsinfer {__version__}" "letsinfer manual"',
        ".nh",  # no word broken at a line's end (an option name stays whole)
        ".ad l",
        ".SH NAME",
        f"{_text(title)} \\- {_text(_summary(command))}",
        ".SH SYNOPSIS",
        f"\\fB{_text(path)}\\fR {_text(' '.join(command.collect_usage_pieces(ctx)))}",
    ]
    help_text = inspect.cleandoc(command.help or "").partition("\f")[0]
    if command.deprecated:
        help_text = f"{help_text}\n\n(Deprecated.)"
    if help_text.strip():
        lines.append(".SH DESCRIPTION")
        lines.append("\n.PP\n".join(_paragraphs(help_text)))
    # What --help lists under Options (click shows arguments only in the usage).
    records = [
        record
        for param in command.get_params(ctx)
        if isinstance(param, click.Option) and (record := param.get_help_record(ctx))
    ]
    if records:
        lines.append(".SH OPTIONS")
        for names, help_ in records:
            lines += [".TP", _option_names(names), *(_paragraphs(help_) or [""])]
    subcommands: list[tuple[str, click.Command]] = []
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                subcommands.append((name, sub))
    if subcommands:
        lines.append(".SH COMMANDS")
        for name, sub in subcommands:
            lines += [".TP", f"\\fB{_text(name)}\\fR", _text(_summary(sub))]
    related = ([ctx.parent.command_path] if ctx.parent else []) + [
        f"{path} {name}" for name, _ in subcommands
    ]
    if related:
        lines.append(".SH SEE ALSO")
        refs = [f"\\fB{_text(page_name(r)[: -len('.1')])}\\fR(1)" for r in related]
        lines.append(",\n".join(refs))
    return "\n".join(lines) + "\n"


def pages(command: click.Command | None = None) -> dict[str, str]:
    """File name -> page, for the ``letsinfer`` command and every command below it."""
    if command is None:
        from letsinfer.cli import cli

        command = cli
    return {page_name(ctx.command_path): render(ctx) for ctx in contexts(command)}


def write(folder: Path) -> tuple[list[str], list[str]]:
    """Make ``folder`` hold exactly the current pages: returns the pages
    written (new or changed) and those removed (their command is gone)."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = pages()
    removed = sorted(p.name for p in folder.glob("letsinfer*.1") if p.name not in wanted)
    for name in removed:
        (folder / name).unlink()
    written = []
    for name, text in sorted(wanted.items()):
        target = folder / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            written.append(name)
    return written, removed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m letsinfer.cli.man_pages DIR", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    written, removed = write(folder)
    for name in written:
        print(f"wrote {folder / name}")
    for name in removed:
        print(f"removed {folder / name} (no such command)")
    print(f"{folder}: {len(list(folder.glob('letsinfer*.1')))} pages, {len(written)} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
