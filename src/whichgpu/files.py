"""Writing the user's files so that a killed run never leaves one half-written.

``write_atomically`` writes a new temporary file beside the target, flushes it to disk and
renames it over the target in one step (``os.replace``): a reader sees the old file or the new
one, never a mixture, and a run killed mid-write leaves at most a stray ``.NAME.*.tmp``. The
file gets the permissions the user's umask gives a new file.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

NEW_FILE_MODE = 0o666
"""Mode asked for a new file; the process's umask takes its bits away, as for any new file."""


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
