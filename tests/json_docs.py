"""The JSON schemas docs/json.md documents, read from its tables, and a check
of a command's output against them (field names exactly, and types)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parent.parent / "docs" / "json.md"
_BASIC: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "list": (list,),
}


def _rows(block: str) -> list[list[str]]:
    rows = []
    for line in block.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[1:]  # without the header


@cache
def kinds() -> dict[str, dict[str, str]]:
    """Kind -> field -> documented type."""
    text = DOC.read_text().split("\n## Objects\n", 1)[1]
    found = {}
    for section in re.split(r"\n### ", "\n" + text)[1:]:
        name, _, body = section.partition("\n")
        found[name.strip()] = {r[0].strip("`"): r[1] for r in _rows(body)}
    return found


@cache
def commands() -> dict[str, str]:
    """Command line (as documented, after `letsinfer`) -> what it prints."""
    text = DOC.read_text().split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    return {r[0].strip("`"): r[1] for r in _rows(text)}


def _check(value: Any, typ: str, where: str) -> None:
    alternatives = [t.strip() for t in typ.split(" or ")]
    if value is None:
        assert "null" in alternatives, f"{where}: null, documented as {typ}"
        return
    for alt in alternatives:
        if alt == "null":
            continue
        if alt.startswith("list of "):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    _check(item, alt.removeprefix("list of "), f"{where}[{i}]")
                return
        elif alt in _BASIC:
            # bool is an int to Python, never to JSON's readers
            if isinstance(value, _BASIC[alt]) and (alt == "boolean") == isinstance(value, bool):
                return
        else:
            assert isinstance(value, dict), f"{where}: {value!r} is not a {alt} object"
            conforms(value, alt, where)
            return
    raise AssertionError(f"{where}: {value!r} is not {typ}")


def conforms(obj: dict[str, Any], kind: str, where: str = "") -> None:
    """``obj`` has exactly the fields docs/json.md gives ``kind``, each of its type."""
    fields = kinds()[kind]
    where = where or kind
    assert set(obj) == set(fields), (
        f"{where}: undocumented {sorted(set(obj) - set(fields))}, "
        f"missing {sorted(set(fields) - set(obj))}"
    )
    for name, typ in fields.items():
        _check(obj[name], typ, f"{where}.{name}")


def printed(command: str, data: Any) -> None:
    """``data`` is what docs/json.md says ``command`` prints."""
    what = commands()[command]
    if what.startswith("list of "):
        assert isinstance(data, list), f"{command}: not a list"
        for i, item in enumerate(data):
            conforms(item, what.removeprefix("list of "), f"{command}[{i}]")
    else:
        conforms(data, what, command)
