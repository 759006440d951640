"""Writing the user's files so that a killed run never leaves one half-written.

``write_atomically`` writes a new temporary file beside the target, flushes it to disk and
renames it over the target in one step (``os.replace``): a reader sees the old file or the new
one, never a mixture, and a run killed mid-write leaves at most a stray ``.NAME.*.tmp``. The
file gets the permissions the user's umask gives a new file.

``check_output_file`` is asked first by every command that writes a file the user names
(``results export FILE``, ``report --out FILE``): it refuses a folder, a path under a file, the
files a caller protects (the results store) and any SQLite database, which is likely a store.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from whichgpu.errors import UsageError

NEW_FILE_MODE = 0o666
"""Mode asked for a new file; the process's umask takes its bits away, as for any new file."""

SQLITE_HEADER = b"SQLite format 3\x00"
"""The first bytes of every SQLite database file."""


def is_sqlite_file(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts as a SQLite database does (False if
    unreadable). Only regular files are opened: reading a pipe or a terminal would wait."""
    try:
        if not Path(path).is_file():
            return False
        with Path(path).open("rb") as stream:
            return stream.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def path_problem(path: Path) -> str | None:
    """Why ``path`` cannot name a file to read or write, in words that follow "it" (``is a
    folder, not a file``; ``is under notes.txt, which is a file, not a directory``); None when
    it can."""
    if path.is_dir():
        return "is a folder, not a file"
    for parent in path.parents:  # the nearest that exists must be a folder
        if parent.exists():
            if not parent.is_dir():
                return f"is under {parent}, which is a file, not a directory"
            break
    return None


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same file on disk when both exist (hard links,
    case-insensitive file systems), else the same resolved path."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.expanduser().resolve() == b.expanduser().resolve()
    except OSError:
        return False


def check_output_file(
    path: Path,
    option: str = "",
    protected: Iterable[tuple[Path, str]] = (),
    example: str | None = None,
) -> None:
    """Refuse (``UsageError``) to write ``path`` where writing would lose the user's data.

    Refused: a folder (``example``, a file name, is suggested in it), a path under a file, any
    of the ``protected`` paths (each with what it is, such as ``the results store``) and any
    existing SQLite database, which is likely a results store. ``option`` (``--out``) names
    the argument in the message."""
    name = f"{option} {path}" if option else str(path)
    problem = path_problem(path)
    if problem is not None:
        if not path.is_dir():
            advice = "Choose a file in a folder"
        elif example:
            advice = f"Give a file name, such as {path / example}"
        else:
            advice = "Give a file name"
        raise UsageError(f"Cannot write {name}: it {problem}. {advice}.")
    for kept, what in protected:
        if same_file(path, kept):
            raise UsageError(
                f"Cannot write {name}: it is {what} ({kept}), and writing it would destroy what "
                "it holds. Choose another file name."
            )
    if is_sqlite_file(path):
        raise UsageError(
            f"Cannot write {name}: it is a SQLite database, probably a results store, and "
            "whichgpu never overwrites one. Choose another file name (or move that file away "
            "first if you are sure it is not needed)."
        )


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Create or replace ``path`` with what ``write`` writes; raises ``OSError`` on failure
    (the target is then unchanged and the temporary file removed).

    A symbolic link is written through: the file it points to is replaced and the link kept.
    A path that is neither a file nor a folder (``/dev/stdout``, a named pipe) is written in
    place, as a stream: there is no file to replace."""
    if not path.name:
        raise IsADirectoryError(errno.EISDIR, "not a file name", str(path))
    if path.exists() and not path.is_file() and not path.is_dir():
        with path.open("wb") as stream:
            write(stream)
        return
    if path.is_symlink():
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, NEW_FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise


def write_json_gz_atomically(path: Path, doc: Any) -> None:
    """Create or replace ``path`` with ``doc`` as compact, gzip-compressed JSON, atomically
    (``write_atomically``). The gzip header holds no time or name, so the same document always
    gives the same bytes (what checksums of shipped files rely on)."""
    data = gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), mtime=0)
    write_atomically(path, lambda out: out.write(data))
