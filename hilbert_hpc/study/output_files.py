"""Owning an output file before writing it: refusals, an exclusive lock, a temporary name renamed into place.

Every command that writes a file (``run``, ``maxlen``, ``bandwidth -o``) goes
through here, so the same rules hold everywhere:

- the output may not be the job file, an input file, a folder, a symbolic
  link, or a file that is not an output of this program (those are never
  replaced, whatever the flags);
- an existing output is replaced only with ``--overwrite`` (``run`` also
  continues one with ``--resume``);
- the lock ``<output>.lock`` is taken before the file is read or changed, so a
  second run on a file in use is refused and the first run is unharmed;
- a new file is written under a temporary name in the same folder and renamed
  into place, so a crash never leaves a half-made file under the final name.

``OSError`` from the file system becomes one line naming the file and the cause.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from hilbert_hpc.errors import UserError

#: what h5py raises when the file system fails under it (OSError, RuntimeError for a failed flush)
IO_ERRORS = (OSError, RuntimeError)
#: errno values that mean "this file system does not do advisory locks" (some Lustre/NFS mounts)
NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class OutputError(UserError):
    """An output that cannot be written or is not ours to replace; one line, exit code 2."""


def io_error(exc: Exception, what: str, path: str | Path, hint: str = "") -> OutputError:
    """One-line error for a failed file operation: what was done, on which file, and why."""
    reason = os_reason(exc)
    if reason == os.strerror(errno.ENOSPC):
        hint = hint or "free some space and run again (with --resume for a results file)"
    return OutputError(f"cannot {what} {str(path)!r}: {reason}" + (f"; {hint}" if hint else ""), "output")


def os_reason(exc: Exception) -> str:
    """The cause of a failed file operation in a few words, also when HDF5 wraps the C library's error
    in a long text (h5py raises RuntimeError for a failed flush)."""
    text = str(exc)
    found = re.search(r"errno = (\d+)", text)
    if found:
        return os.strerror(int(found.group(1)))
    if getattr(exc, "strerror", None):
        return exc.strerror
    return " ".join(text.split()) or type(exc).__name__


def same_file(a: str | Path, b: str | Path) -> bool:
    """True when ``a`` and ``b`` name the same file (an existing one by inode, else by resolved path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def refuse_protected(path: Path, protected: Iterable[tuple[str | Path | None, str]],
                     derived: Iterable[str] = ()) -> None:
    """Refuse an output that is one of the ``protected`` (file, what it is) pairs, a folder, or not a file,
    or whose name (or a name derived from it: ``derived`` suffixes besides the lock and temporary names) is
    longer than the file system allows.

    Checked before the lock is taken, so that no lock file appears beside a job or input file.
    """
    check_name_length(path, derived)
    try:
        _refuse_protected(path, protected)
    except OSError as exc:
        raise io_error(exc, "check the output file", path) from None


def link_problem(path: Path) -> str | None:
    """Why ``path`` may not be written, when it is a symbolic link (dangling or not), or None.

    An output is written only under its own name: written through a link, the
    link would be replaced by a new file (under its own lock and parts folder)
    that shares its target's identity, or the target would be written under a
    lock that the target's own name does not take. A link to a folder above it
    is followed: the lock and parts folder are then the same files.
    """
    if not path.is_symlink():
        return None
    return (f"{str(path)!r} is a symbolic link (to {str(link_target(path))!r}); an output is written only under its "
            f"own name, never through a link")


def link_target(path: Path) -> Path:
    """What the symbolic link ``path`` names, as a path from where ``path`` is named."""
    return path.parent / os.readlink(path)


def _refuse_protected(path: Path, protected: Iterable[tuple[str | Path | None, str]]) -> None:
    link = link_problem(path)
    if link:
        raise OutputError(f"{link}: give -o {link_target(path)} (the file it names) or another file", "output")
    for other, what in protected:
        if other and same_file(path, other):
            raise OutputError(f"{str(path)!r} is the {what}; choose another output file with -o", "output")
    if path.is_dir():
        raise OutputError(f"{str(path)!r} is a folder; give a file name with -o", "output")
    if path.exists() and not path.is_file():
        raise OutputError(f"{str(path)!r} is not a regular file; choose another output file with -o", "output")
    if path.parent.exists() and not path.parent.is_dir():
        raise OutputError(f"{str(path.parent)!r} is not a folder", "output")


#: the file name limit assumed where the file system does not say (most local and parallel file systems)
NAME_MAX = 255


def name_max(folder: Path) -> int:
    """The longest file name (in bytes) that the file system of ``folder`` (or its nearest existing
    ancestor) allows."""
    for candidate in (folder, *folder.parents):
        try:
            if candidate.is_dir():
                return int(os.pathconf(candidate, "PC_NAME_MAX"))
        except (OSError, ValueError):
            continue
    return NAME_MAX


def derived_names(path: Path, derived: Iterable[str] = ()) -> dict[str, str]:
    """The files named after an output: what each is -> its name (the lock, the temporary copy, ``derived``)."""
    names = {"lock file": OutputLock(path).path.name, "temporary copy": temporary_name(path).name}
    names.update({f"{suffix} folder": path.name + suffix for suffix in derived})
    return names


def check_name_length(path: Path, derived: Iterable[str] = ()) -> None:
    """Refuse, in one line naming the file, an output whose name or derived names the file system cannot hold."""
    limit = name_max(path.parent)
    names = {"name": path.name, **derived_names(path, derived)}
    what, longest = max(names.items(), key=lambda item: len(os.fsencode(item[1])))
    size = len(os.fsencode(longest))
    if size <= limit:
        return
    room = limit - (size - len(os.fsencode(path.name)))
    whose = "its name" if what == "name" else f"the name of its {what} ({size} bytes)"
    raise OutputError(f"the output file name {path.name!r} is too long: {whose} exceeds the file system's limit of "
                      f"{limit} bytes; choose a name of at most {room} bytes with -o", "output")


def existing_output(path: Path, is_ours: Callable[[Path], bool], kind: str) -> bool:
    """True when ``path`` exists and is a ``kind`` of this program; refuse any other existing file.

    Called with the lock held, so the answer cannot change under the caller.
    """
    if not path.exists():
        return False
    if not is_ours(path):
        raise OutputError(f"{str(path)!r} exists and is not a {kind} (or is unreadable); it is not replaced: "
                          f"move it away or choose another output file with -o", "output")
    return True


def make_parent(path: Path) -> None:
    """Create the output's folder (one line if that fails)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise io_error(exc, "create the folder of", path) from None


def temporary_name(path: Path) -> Path:
    """A name in ``path``'s folder for writing a new file before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def move_into_place(tmp: Path, path: Path) -> None:
    """Atomically rename ``tmp`` to ``path`` (replacing it) and make the rename durable."""
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def hdf5_image(fill: Callable[[Any], None], current: bytes | None = None) -> io.BytesIO:
    """An HDF5 file made in memory: ``fill(h5)`` writes into an empty file, or into a copy of ``current``.

    HDF5 never writes to disk here, so a full disk shows up later as an ordinary
    OSError of plain file I/O: HDF5 does not recover from a failed write of its
    own (h5py reports it from a finalizer, and closing the object again can crash
    the process).
    """
    import h5py

    image = io.BytesIO(current if current is not None else b"")
    with h5py.File(image, "a" if current is not None else "w") as h5:
        fill(h5)
    return image


def write_synced(image: io.BytesIO, path: Path) -> None:
    """Write ``image`` to ``path`` and sync it to disk; raises what the file system raised."""
    with open(path, "wb") as fh:
        fh.write(image.getbuffer())
        fh.flush()
        os.fsync(fh.fileno())


def replace_hdf5(path: Path, fill: Callable[[Any], None], start_from_current: bool = False) -> None:
    """Write a new version of the HDF5 file ``path``: under a temporary name, synced, then renamed over it.

    ``fill(h5)`` writes into the new version: an empty file, or the current file
    with ``start_from_current``. HDF5 works on a copy in memory (:func:`hdf5_image`;
    our outputs are small: bulk output data lives in separate part files) and plain
    file I/O writes it out, so a full disk is an ordinary OSError that leaves
    ``path`` as it was. Raises what the file system or h5py raised
    (``IO_ERRORS``), after removing the temporary file.
    """
    tmp = temporary_name(path)
    try:
        write_synced(hdf5_image(fill, path.read_bytes() if start_from_current else None), tmp)
        move_into_place(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def remove_quietly(path: Path) -> None:
    """Remove a file of ours if it is there (a temporary file after a failure)."""
    try:
        path.unlink()
    except OSError:
        pass


class OutputLock:
    """Exclusive advisory lock on ``<output>.lock`` for the life of a run (held by one process).

    ``flock`` ends with the process, so a killed run never leaves a lock that
    blocks its resume; a stale ``.lock`` file is simply locked again. On a file
    system without advisory locks the run goes on with a warning.
    """

    def __init__(self, path: Path) -> None:
        self.path = path.with_name(path.name + ".lock")
        self.fd: int | None = None

    def acquire(self) -> "OutputLock":
        """Take the lock or raise OutputError naming the run that holds it."""
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise io_error(exc, "create the lock file", self.path) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    target = self.path.name[:-len(".lock")]
                    raise OutputError(f"{str(self.path.with_name(target))!r} is in use by another run"
                                      f"{f' ({holder})' if holder else ''}; wait for it to end or write to "
                                      f"another file with -o", "output") from None
                if exc.errno in NO_LOCKS:
                    print(f"hilbert-hpc: warning: {str(self.path.parent)!r} does not support file locks; nothing "
                          f"stops two runs from writing the same output", file=sys.stderr, flush=True)
                    return self
                raise io_error(exc, "lock", self.path) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:                # not a lock file that its owner unlinked between our open and flock
                break
            os.close(fd)
        self.fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        return self

    def release(self) -> None:
        """Remove the lock file and drop the lock (unlink first: a waiting run then locks a new file)."""
        if self.fd is None:
            return
        try:
            self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""


class NewOutput:
    """An output written once, at the end of a command: claimed (checked and locked) before the work starts.

    ``with NewOutput(path, kind, is_ours, overwrite=...) as out: ...; out.write(fill)``
    refuses a protected path or another program's file at once, refuses an
    existing output of ``kind`` unless ``overwrite``, holds the lock while the
    command works, and writes the HDF5 file that ``fill(h5)`` fills with
    :func:`replace_hdf5`.
    """

    def __init__(self, path: str | Path, kind: str, is_ours: Callable[[Path], bool],
                 protected: Iterable[tuple[str | Path | None, str]] = (), overwrite: bool = False) -> None:
        self.path, self.kind, self.is_ours = Path(path), kind, is_ours
        self.protected, self.overwrite = list(protected), overwrite
        self.lock = OutputLock(self.path)

    def __enter__(self) -> "NewOutput":
        self.refuse()
        self.claim()
        return self

    def refuse(self) -> None:
        """Refuse a protected path, a folder or a special file (before any lock is taken)."""
        refuse_protected(self.path, self.protected)

    def claim(self) -> None:
        """Create the folder, take the lock, then refuse an existing file that may not be replaced."""
        make_parent(self.path)
        self.acquire_lock()
        try:
            self.refuse_existing()
        except BaseException:
            self.release()
            raise

    def acquire_lock(self) -> None:
        """Take the lock on the output (:class:`OutputLock`)."""
        self.lock.acquire()

    def refuse_existing(self) -> None:
        """Refuse another program's file, and an output of ``kind`` unless ``overwrite`` (lock held)."""
        if existing_output(self.path, self.is_ours, self.kind) and not self.overwrite:
            raise OutputError(f"{str(self.path)!r} exists; replace it with --overwrite or write to another "
                              f"file with -o", "output")

    def release(self) -> None:
        """Drop the lock."""
        self.lock.release()

    def write(self, fill: Callable[[Any], None]) -> None:
        """Write the HDF5 file that ``fill(h5)`` fills, atomically (:func:`replace_hdf5`); one line on failure."""
        try:
            replace_hdf5(self.path, fill)
        except IO_ERRORS as exc:
            raise io_error(exc, "write", self.path) from None

    def write_file(self, fill: Callable[[Path], None]) -> None:
        """``fill(tmp)`` writes the new file under a temporary name, which is then renamed over the output;
        raises what ``fill`` or the file system raised, after removing the temporary file."""
        tmp = temporary_name(self.path)
        try:
            fill(tmp)
            move_into_place(tmp, self.path)
        except BaseException:
            remove_quietly(tmp)
            raise

    def __exit__(self, *exc: object) -> None:
        self.release()


def hdf5_attr_is(name: str, value: str) -> Callable[[Path], bool]:
    """A test for :class:`NewOutput`: an HDF5 file whose root attribute ``name`` equals ``value``."""
    def test(path: Path) -> bool:
        import h5py

        try:
            with h5py.File(path, "r") as f:
                return f.attrs.get(name) == value
        except Exception:  # noqa: BLE001 - not HDF5 or unreadable: not one of ours
            return False
    return test
