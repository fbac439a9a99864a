"""Which names may appear inside a bundle.

One rule for the manifest and for tar members, so a name that could escape
the place it is unpacked to (``..``, absolute, odd characters) is refused
wherever it shows up.
"""

from __future__ import annotations

MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.json.sig"
TOP_DIRS = ("wheelhouse", "models", "runtimes")
_MAX_NAME = 255 * 4


def path_problem(name: str) -> str | None:
    """Why ``name`` may not be a file inside a bundle, or None when it may."""
    if not name:
        return "has an empty name"
    if name.startswith("/"):
        return "is an absolute path"
    if "\\" in name or "\x00" in name or any(ord(c) < 32 for c in name):
        return "has a backslash or control character in its name"
    if len(name) > _MAX_NAME:
        return "has an overlong name"
    parts = name.split("/")
    if ".." in parts:
        return "has a '..' component (it would escape the bundle)"
    if any(part in ("", ".") for part in parts):
        return "has an empty or '.' component"
    if name in (MANIFEST_NAME, SIGNATURE_NAME):
        return None
    if len(parts) < 2 or parts[0] not in TOP_DIRS:
        return f"is outside the bundle's folders ({', '.join(TOP_DIRS)})"
    return None
