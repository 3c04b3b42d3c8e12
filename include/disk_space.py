"""A full disk, told in one line: the path that could not be written and what to do.

Spark (Hadoop's ``FSError``), delta-rs (``os error 28``) and Python (``OSError`` errno 28) each
report a full disk in their own words, deep in a chained exception or a JVM traceback that also
carries a Python one. :func:`no_space_left` recognises all three; the store raises
:class:`NoSpaceLeftError` naming the table it was writing, and the stream runner and the command
line turn any other full-disk failure into one.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator
from pathlib import Path

NO_SPACE = re.compile(r"no space left on device|os error 28|Errno 28\b|\bENOSPC\b|disk quota exceeded", re.IGNORECASE)
WHAT_TO_DO = "free space and run the same command again"
MESSAGE = re.compile(r"no space left on device writing (\S+): " + re.escape(WHAT_TO_DO))


class NoSpaceLeftError(RuntimeError):
    """The file system of ``path`` is full. Every write is whole or absent (Delta commits, Spark's
    checkpoint logs), so once space is freed the same command continues where it stopped."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        super().__init__(f"no space left on device writing {self.path}: {WHAT_TO_DO}")


def no_space_left(error: BaseException | str) -> bool:
    """Whether ``error`` (an exception, with its causes, or an error's text) is a full disk."""
    if isinstance(error, str):
        return NO_SPACE.search(error) is not None
    return any(isinstance(each, OSError) and each.errno in (errno.ENOSPC, errno.EDQUOT)
               or NO_SPACE.search(str(each)) for each in _chain(error))


def as_no_space_left(error: BaseException | str, path: str | Path) -> NoSpaceLeftError | None:
    """``error`` as a :class:`NoSpaceLeftError`, or None when it is no full disk. Its path: the
    one a store or Python named inside it (the most precise), else ``path`` (what was written)."""
    if isinstance(error, NoSpaceLeftError):
        return error
    if not no_space_left(error):
        return None
    found = MESSAGE.search(str(error))
    if found:
        return NoSpaceLeftError(found.group(1))
    for each in _chain(error) if isinstance(error, BaseException) else ():
        if isinstance(each, OSError) and each.errno in (errno.ENOSPC, errno.EDQUOT) and each.filename:
            return NoSpaceLeftError(each.filename)
    return NoSpaceLeftError(path)


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


__all__ = ["NoSpaceLeftError", "as_no_space_left", "no_space_left"]
