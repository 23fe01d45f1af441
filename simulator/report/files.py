"""Output files, written the way users expect.

- The location is checked before any work starts (`output_file`, `output_dir`): one sentence and exit 2
  for an empty name, a name too long for the file system, a folder that cannot be written (tried with a
  temporary file: permission bits can say yes where /proc or /sys say no), a file where a folder is
  expected, or a folder, device, FIFO or socket where a file is expected.
- A symlink is followed: its target is written, the link stays.
- A regular file is replaced atomically (temporary file beside it, then rename), so a reader, a crash
  or Ctrl-C never sees half a file, and no temporary file survives an error or Ctrl-C.
- Permissions are the normal ones: a replaced file keeps its mode, a new one gets 0666 & ~umask
  (not mkstemp's 0600).
"""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from simulator.errors import UserError

NOT_A_FILE = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
              stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


def _existing_ancestor(path: Path) -> Path:
    """The nearest part of absolute `path` (itself included) that exists."""
    return next(p for p in (path, *path.parents) if os.path.lexists(p))


def _check_names(path: str | Path, what: str) -> None:
    """Every part of `path` still to be created fits the file system's name limit."""
    path = Path(os.path.abspath(path))
    anchor = _existing_ancestor(path)
    try:
        limit = os.pathconf(anchor if anchor.is_dir() else anchor.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in path.relative_to(anchor).parts:
        if len(os.fsencode(part)) > limit:
            raise UserError(f"{what}: the name {part[:24]}... is {len(os.fsencode(part))} bytes, "
                            f"longer than the {limit} this file system allows.")


def _check_folder(folder: Path, what: str) -> None:
    """`folder` is, or can be created as, a folder this process may write in."""
    anchor = _existing_ancestor(Path(os.path.abspath(folder)))
    if not anchor.is_dir():
        raise UserError(f"{what} {str(folder)!r}: {anchor} is a file, not a folder.")
    if not os.access(anchor, os.W_OK | os.X_OK):
        reason = "is on a read-only file system" if _read_only(anchor) else "is not writable"
        raise UserError(f"{what} {str(folder)!r}: the folder {anchor} {reason}.")
    try:  # permission bits can say yes where creating a file fails (/proc, /sys, some mounts): try one
        tempfile.TemporaryFile(dir=anchor).close()
    except OSError as exc:
        raise UserError(f"{what} {str(folder)!r}: no file can be created in {anchor} ({exc.strerror}).") from None


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _nonempty(path: str | Path, what: str) -> Path:
    if not str(path).strip():
        raise UserError(f"{what} '' is an empty name: give a path.")
    return Path(path)


def output_file(path: str | Path, what: str = "output file") -> Path:
    """The real file `path` will write (a symlink followed); UserError when it cannot be written."""
    _check_names(_nonempty(path, what), what)
    target = Path(os.path.realpath(path))
    if target.exists():
        kind = NOT_A_FILE.get(stat.S_IFMT(target.stat().st_mode))
        if kind:
            shown = f"{path} (-> {target})" if Path(path).is_symlink() else str(path)
            raise UserError(f"{what} {shown} is {kind}, not a regular file: name a file to write.")
    _check_folder(target.parent, what)
    return target


def output_dir(path: str | Path, what: str = "output folder") -> Path:
    """A folder to write files into (created later if missing); UserError when it cannot be."""
    folder = _nonempty(path, what)
    _check_names(folder, what)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{what} {folder} is a file, not a folder: name a folder (it is created if missing).")
    _check_folder(folder, what)
    return folder


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path`'s real target; on success it takes the target's place with normal
    permissions, on any error or Ctrl-C it is removed."""
    target = output_file(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o666 & ~_umask()
    fd, name = tempfile.mkstemp(prefix=f".{target.name[:200]}.", suffix=".tmp", dir=target.parent)
    tmp = Path(name)
    try:
        os.close(fd)
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to `path` (its target if a symlink) atomically; see the module docstring."""
    with replacing(path) as tmp:
        try:
            tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        except OSError as exc:  # a full disk, a quota
            raise UserError(f"cannot write {path}: {exc.strerror}.") from None
    return Path(os.path.realpath(path))
