"""`tk_cute.dsl_cache`: the CuTe DSL's disk cache of compiled code lives in a private directory
that tk_cute checks, not at the DSL's predictable shared path."""

import os
import subprocess
import sys
import textwrap

import pytest

from tk_cute import dsl_cache

# A host program whose compiled code prints its message: the message is part of the traced IR,
# so each message is its own cache entry (file name: a hash of the traced program).
HELLO = textwrap.dedent("""
    import sys
    if sys.argv[2] == "tk_cute":
        import tk_cute  # noqa: F401
    import cutlass.cute as cute

    MESSAGE = sys.argv[1]

    @cute.jit
    def hello():
        cute.printf(MESSAGE)

    hello()
""")


def test_an_entry_planted_at_the_dsls_shared_path_does_not_run(tmp_path):
    """Someone who can write to ``$TMPDIR/$USER/cutlass_python_cache`` swaps the entry of a
    program for their own: the DSL alone then runs theirs; a process that imports tk_cute
    compiles and runs its own program."""
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    env = {k: v for k, v in os.environ.items() if k not in (dsl_cache.DIR_VAR, dsl_cache.OFF_VAR)}
    env.update(TMPDIR=str(tmp_path / "tmp"), USER="someone", XDG_CACHE_HOME=str(tmp_path / "home"))

    def run(message, first):
        done = subprocess.run([sys.executable, str(script), message, first], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    shared = tmp_path / "tmp" / "someone" / "cutlass_python_cache"
    assert run("mine", "dsl") == "mine\n"
    (mine,) = shared.glob("*.mlir")
    mine.unlink()
    assert run("PLANTED", "dsl") == "PLANTED\n"
    (theirs,) = shared.glob("*.mlir")
    theirs.rename(mine)  # the planted program under the name of "mine"'s entry
    assert run("mine", "dsl") == "PLANTED\n"  # the DSL alone runs what it finds there
    assert run("mine", "tk_cute") == "mine\n"
    assert [p.name for p in shared.glob("*.mlir")] == [mine.name]  # not read, not rewritten
    private = tmp_path / "home" / "tk_cute" / "cute_dsl"
    assert [p.name for p in private.glob("*.mlir")] == [mine.name]
    assert (private.stat().st_mode & 0o777) == 0o700


def test_this_process_uses_the_private_directory():
    from cutlass.base_dsl.cache_helpers import get_default_generated_ir_path

    path = get_default_generated_ir_path("CUTE_DSL")
    off = os.environ.get(dsl_cache.OFF_VAR, "").strip().lower() in ("1", "true", "yes", "on")
    assert off or ("cutlass_python_cache" not in path and dsl_cache.check_private(path))


def test_a_shared_or_foreign_directory_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # (mkdir's mode passes through the umask)
    with pytest.raises(PermissionError, match=r"mode 0777 \(group or others may write\)"):
        dsl_cache.check_private(shared)
    mine = dsl_cache.private_dir(tmp_path / "a" / "b")
    assert (mine.stat().st_mode & 0o777) == 0o700
    link = tmp_path / "link"
    link.symlink_to(mine)
    with pytest.raises(PermissionError, match="is not a directory \\(a link\\)"):
        dsl_cache.check_private(link)
    monkeypatch.setattr(os, "getuid", lambda: mine.stat().st_uid + 1)
    with pytest.raises(PermissionError, match="is owned by uid .*, not this user"):
        dsl_cache.check_private(mine)


def test_configure_checks_a_given_directory_and_can_turn_the_cache_off(tmp_path, monkeypatch):
    given = tmp_path / "given"
    given.mkdir()
    given.chmod(0o775)
    monkeypatch.setenv(dsl_cache.DIR_VAR, str(given))
    with pytest.raises(PermissionError, match="group or others may write"):
        dsl_cache.configure()
    monkeypatch.setenv(dsl_cache.OFF_VAR, "1")
    assert dsl_cache.configure() is None
    monkeypatch.delenv(dsl_cache.OFF_VAR)
    monkeypatch.delenv(dsl_cache.DIR_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    made = dsl_cache.configure()
    assert made == os.environ[dsl_cache.DIR_VAR] == str(tmp_path / "home/tk_cute/cute_dsl")
