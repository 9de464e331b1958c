"""Folders Graft replaces whole (HF exports): where it may write, and how it knows its own.

An export is written next to its target and then swapped in, replacing the whole folder. So
before anything is written, `check_output_dir` decides whether the target may be replaced: a
folder that does not exist, an empty one, or one Graft wrote itself (its `MARKER` lists every
file Graft put there, and nothing else is in it). Anything else needs ``--force``; and no
target may ever be the checkpoint being read, the run directory, the working directory, the
home directory, or a folder above one of them, nor hold a Graft checkpoint. Every
folder-writing path (``graft export``, the end-of-run ``<run_dir>/hf``, `HFDirectorySink`)
goes through this one function.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from graft.errors import ConfigError, few

__all__ = ["MARKER", "check_output_dir", "give_umask_modes", "umask_file_mode", "write_folder",
           "write_marker"]

# Written last into every folder `HFDirectorySink` writes: the files Graft put there.
MARKER = ".graft-export.json"


def check_output_dir(target: str | Path, *, protected: Mapping[str, Path] | None = None,
                     force: bool = False, label: str = "the output folder",
                     hint: str | None = None) -> Path:
    """The absolute, symlink-free folder to write for ``target``; `ConfigError` when writing
    there would replace something Graft did not write.

    ``protected`` maps a description ("the checkpoint") to a folder the target must be neither
    nor contain (the working and home directories are always protected). ``force`` allows
    replacing an existing folder Graft did not write (never a protected one). ``label`` names
    the target in messages (``--out``); ``hint`` says what to do about a folder Graft did not
    write (default: choose a new or empty folder).
    """
    given = Path(target).expanduser()
    # abspath first: "." and "./" get a name; resolve: a symlink to a protected folder is caught,
    # and the export replaces the folder the link points to (the link itself stays).
    resolved = Path(os.path.abspath(given)).resolve()
    where = f"{label} {given}" + (f" ({resolved})" if str(resolved) != str(given) else "")
    _refuse_protected(resolved, where, protected or {})
    _refuse_file_in_the_way(resolved, where)
    if not resolved.is_dir():
        return resolved
    entries = _entries(resolved)  # an empty folder (or only empty subfolders) has none
    checkpoint = _graft_checkpoint_in(entries)
    if checkpoint is not None:
        raise ConfigError(f"{where} holds a Graft checkpoint ({resolved / checkpoint}) that the "
                          f"export would delete (--force does not allow this); choose another "
                          f"folder")
    if not force:
        _refuse_foreign(resolved, entries, where, hint)
    return resolved


def _refuse_foreign(resolved: Path, entries: set[str], where: str, hint: str | None) -> None:
    foreign = sorted(entries - _marked_files(resolved))
    if not foreign:
        return
    shown = few(foreign)
    unmarked = "" if (resolved / MARKER).is_file() else (
        f"; there is no {MARKER}, which lists the files of an export by Graft")
    raise ConfigError(f"{where} already exists and holds files Graft did not write ({shown}"
                      f"{unmarked}); the export replaces the whole folder: "
                      f"{hint or 'choose a new or empty folder'}")


def _refuse_protected(resolved: Path, where: str, protected: Mapping[str, Path]) -> None:
    folders = {**protected, "the working directory": Path.cwd(), "the home directory": Path.home()}
    kept = {what: Path(os.path.abspath(folder)).resolve() for what, folder in folders.items()}
    # "is the run directory" says more than "contains the checkpoint": equality first.
    clashes = [(what, "is") for what, folder in kept.items() if folder == resolved]
    clashes += [(what, "contains") for what, folder in kept.items() if resolved in folder.parents]
    if clashes:
        what, relation = clashes[0]
        raise ConfigError(f"{where} {relation} {what} ({kept[what]}); the export replaces the "
                          f"whole folder, so it must go elsewhere (--force does not allow "
                          f"this). Choose another folder")


def _refuse_file_in_the_way(resolved: Path, where: str) -> None:
    for path in (resolved, *resolved.parents):
        if path.exists():
            if not path.is_dir():
                what = "is a file" if path == resolved else f"is inside {path}, a file"
                raise ConfigError(f"{where} {what}, not a folder; choose a folder")
            return


def _graft_checkpoint_in(entries: set[str]) -> str | None:
    """The first folder among ``entries`` that is a Graft checkpoint (DCP ``.metadata`` next
    to Graft's ``manifest.json``), or None."""
    for entry in sorted(entries):
        path = Path(entry)
        if path.name == ".metadata" and (path.parent / "manifest.json").as_posix() in entries:
            return path.parent.as_posix()
    return None


def _entries(folder: Path) -> set[str]:
    """Every file and link under ``folder`` (links to folders not followed), relative."""
    found = set()
    for root, dirs, files in os.walk(folder, onerror=_unreadable):
        names = files + [d for d in dirs if os.path.islink(os.path.join(root, d))]
        found.update(Path(root, name).relative_to(folder).as_posix() for name in names)
    found.discard(MARKER)
    return found


def _unreadable(error: OSError) -> None:
    # A folder that cannot be listed may hold anything: never count it as empty.
    raise ConfigError(f"cannot list {error.filename} ({error.strerror}), so Graft cannot tell "
                      f"whether the export would replace files it did not write; choose "
                      f"another folder") from error


def _marked_files(folder: Path) -> set[str]:
    """The files `MARKER` says Graft wrote into ``folder`` (empty without a readable marker)."""
    try:
        files = json.loads((folder / MARKER).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {f for f in files if isinstance(f, str)}


def write_folder(target: Path, write: Callable[[Path], None], *, written_by: str,
                 protected: Mapping[str, Path] | None = None, force: bool = False,
                 label: str = "the output folder") -> None:
    """``write(folder)`` into a new folder next to ``target``, marked as Graft's (`MARKER`) and
    swapped in whole, after `check_output_dir` allowed replacing ``target`` (``protected``,
    ``force``, ``label`` as there): a rerun replaces what Graft wrote, a folder of anyone
    else's files is refused, and a failed ``write`` leaves ``target`` as it was."""
    import shutil
    import uuid

    from graft.checkpoint.layout import TMP_PREFIX, replace_dir

    resolved = check_output_dir(target, protected=protected, force=force, label=label)
    resolved.parent.mkdir(parents=True, exist_ok=True)
    tmp = resolved.with_name(f"{TMP_PREFIX}{resolved.name}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        write(tmp)
        give_umask_modes(tmp)
        write_marker(tmp, written_by=written_by)
        replace_dir(tmp, resolved)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_marker(folder: Path, *, written_by: str) -> None:
    """Record in ``folder`` every file now in it as written by Graft (``written_by``)."""
    text = json.dumps({"written_by": written_by, "files": sorted(_entries(folder))}, indent=1)
    (folder / MARKER).write_text(text + "\n")


def umask_file_mode() -> int:
    """The mode ``open()`` gives a new file under this process's umask (0o644 for umask 022)."""
    return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux >= 4.7 shows it; reading it changes nothing
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o022)  # elsewhere: set and restore at once
    os.umask(current)
    return current


def give_umask_modes(folder: Path) -> None:
    """Give every file under ``folder`` the umask mode: some writers (safetensors' ``save_file``
    writes through a private temporary file) leave 0o600."""
    mode = umask_file_mode()
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, mode)
