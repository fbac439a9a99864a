"""The files on the main a controller may name to add (`model add --gguf`,
`model adapter add`): those under the main's model store, its mirror, and
the directories ``[control] add_from`` lists. Any other path is refused
before the main looks for it, in the words a missing file gets, so a
controller learns nothing of what else the main holds (its keys, its
authority) and cannot make it open anything else."""

import os
from pathlib import Path

from fastapi import HTTPException

from letsinfer import config
from letsinfer.home import Home
from letsinfer.mirror.layout import MirrorLayout


def accepted_dirs(home: Home, settings: config.Settings) -> list[Path]:
    return [
        home.model_store,
        MirrorLayout.for_home(home).root,
        *(Path(d) for d in settings.control.add_from),
    ]


PULL_IT = ", or `letsinfer model pull` it from the hub or the main's mirror"


def main_file(
    home: Home,
    settings: config.Settings,
    main: str,
    given: str,
    command: str,
    otherwise: str = PULL_IT,
) -> Path:
    """The file ``given`` names, if a controller may add it; else 400 (nothing
    changed). ``otherwise``: how else to get such a file there."""
    dirs = accepted_dirs(home, settings)
    listed = ", ".join(str(d) for d in dirs)
    refused = HTTPException(
        400,
        f"no file {given} that a controller may add on the main {main}: from a controller, "
        f"`{command}` takes the absolute path of a file already on the main under one of "
        f"{listed} (its model store, its mirror, and [control] add_from; nothing is "
        f"uploaded). Copy it there first{otherwise}. Nothing changed.",
    )
    if not given.startswith("/") or "\0" in given:
        raise refused
    # Lexically first: a path outside is refused without a look at the disk.
    if not any(_within(Path(os.path.normpath(given)), d) for d in dirs):
        raise refused
    real = Path(os.path.realpath(given))  # a link inside may point outside
    if not any(_within(real, Path(os.path.realpath(d))) for d in dirs) or not real.is_file():
        raise refused
    return real


def _within(path: Path, directory: Path) -> bool:
    return path != directory and path.is_relative_to(directory)
