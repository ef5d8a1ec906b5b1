"""Atomic file writes: a reader (or a crash) sees the old file or the whole new one, never a part."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from typing import BinaryIO, Callable, Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]


def fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable; not possible (nor needed) on every platform."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: PathLike, *, durable: bool = True) -> Iterator[str]:
    """Yield a temporary path beside ``path``; when the block succeeds it replaces ``path``.

    The temporary name starts with a dot and ends in ``.tmp`` (so it is never mistaken for a
    finished file) and is removed when the block fails. ``durable`` fsyncs the file and its
    folder so the result survives a power loss, not only a crash of this process.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give it an ordinary file's mode
        if durable:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(folder)


def atomic_write(path: PathLike, write: Callable[[BinaryIO], object], *, durable: bool = True) -> None:
    """Call ``write(binary file)`` on a temporary file, then rename it over ``path``."""
    with atomic_path(path, durable=durable) as tmp:
        with open(tmp, "wb") as fh:
            write(fh)


def atomic_write_text(path: PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) atomically and durably."""
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))
