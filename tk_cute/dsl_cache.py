"""Where the CuTe DSL keeps compiled programs on disk: a private directory of this user's.

The DSL writes every program it compiles to a cache directory (MLIR bytecode checked by a CRC
only) and RUNS what it loads from there on a later compile of the same program. Its default
directory, ``$TMPDIR/$USER/cutlass_python_cache``, is a predictable path whose owner it does not
check: whoever can write there (another user who created it first, world-writable) runs code in
this process. So importing `tk_cute` calls `configure` before anything imports the DSL, and
every compile of the process (`eval_cute_layout`, `viz`, `tk_cute.compile.build`, the kernels)
uses `default_dir`, ``$XDG_CACHE_HOME/tk_cute/cute_dsl`` (``~/.cache/tk_cute/cute_dsl``
without it), created with mode 0700.

The cache directory must be a directory, not a link, owned by this user, that neither its
group nor others can write; anything else raises PermissionError when tk_cute is imported.
Choices, made in the environment before the import: ``CUTE_DSL_CACHE_DIR=PATH`` uses PATH
(checked the same way, created 0700 if missing); ``CUTE_DSL_DISABLE_FILE_CACHING=1`` turns the
disk cache off (each process compiles afresh; nothing is created or checked). The DSL reads the
directory at each compile, so a process that imported ``cutlass`` first is covered from the
moment it imports tk_cute.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_VAR = "CUTE_DSL_CACHE_DIR"
OFF_VAR = "CUTE_DSL_DISABLE_FILE_CACHING"
_TRUE = ("1", "true", "yes", "on")  # the DSL's truthy words (its get_bool_env_var)


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/tk_cute/cute_dsl``, or ``~/.cache/tk_cute/cute_dsl``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tk_cute" / "cute_dsl"


def check_private(path: str | os.PathLike) -> Path:
    """`path` if it is a directory (not a link) owned by this user that its group and others
    cannot write; else PermissionError naming the path and what is wrong with it."""
    path = Path(path)
    info = os.lstat(path)
    problems = []
    if not stat.S_ISDIR(info.st_mode):
        problems.append("is not a directory" + (" (a link)" if stat.S_ISLNK(info.st_mode) else ""))
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        problems.append(f"is owned by uid {info.st_uid}, not this user (uid {os.getuid()})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problems.append(f"has mode {stat.S_IMODE(info.st_mode):04o} (group or others may write)")
    if problems:
        raise PermissionError(
            f"the CuTe DSL's cache directory {str(path)!r} " + " and ".join(problems) + ": the "
            f"DSL runs the code it loads from there, so tk_cute refuses it. Use a private one "
            f"(mode 0700, yours: chmod 700, or remove it and tk_cute makes it), set {DIR_VAR} "
            f"to one, or {OFF_VAR}=1 to cache nothing on disk")
    return path


def private_dir(path: str | os.PathLike) -> Path:
    """`path`, made with mode 0700 (and its missing parents) if it does not exist, once
    `check_private` accepts it."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return check_private(path)


def configure() -> str | None:
    """Point the DSL's disk cache at a checked private directory (the module docstring): the
    given ``CUTE_DSL_CACHE_DIR`` or `default_dir`, which is then set in ``os.environ``. Returns
    the directory, or None where ``CUTE_DSL_DISABLE_FILE_CACHING`` turns the cache off (set here
    too where the default directory cannot be made, e.g. under a read-only home).

    Raises:
        PermissionError: the directory is not this user's private directory.
    """
    if os.environ.get(OFF_VAR, "").strip().lower() in _TRUE:
        return None
    given = os.environ.get(DIR_VAR, "").strip()
    if given:
        return str(private_dir(given))
    path = default_dir()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:  # no writable cache home (a read-only HOME): cache nothing on disk
        os.environ[OFF_VAR] = "1"
        return None
    os.environ[DIR_VAR] = str(check_private(path))
    return os.environ[DIR_VAR]
