"""scripts/package.sh writes each file of dist/ under a temporary name beside it and renames
it into place, and each of its modes writes only its own files: a suite that reads the SQL
edition's script while the packaging runs beside it (the test command's build lane) sees
the whole old file or the whole new one, never an empty or a partial one."""
import os
import shutil
import subprocess
import threading

import pytest

from conftest import CARGO_VERSION, ROOT

DIST = os.path.join(ROOT, "dist")
EDITION_FILES = [os.path.join(DIST, f"pg_ratelimit_sql-{CARGO_VERSION}.{form}") for form in ("sql", "pg_tle.sql")]
PACKAGE = ["bash", os.path.join(ROOT, "scripts", "package.sh")]

pytestmark = pytest.mark.skipif(
    shutil.which("cargo") is None or not os.access(ROOT, os.W_OK) or (os.path.isdir(DIST) and not os.access(DIST, os.W_OK)),
    reason="needs cargo and a checkout this user may write (the packaging writes dist/)")


def package(*mode, check=True):
    return subprocess.run(PACKAGE + list(mode), check=check, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_readers_never_see_a_partial_edition_script_while_it_is_rebuilt():
    package("--sql")
    expected = {}
    for path in EDITION_FILES:
        with open(path, "rb") as f:
            expected[path] = f.read()
        assert len(expected[path]) > 100_000, path
    done = threading.Event()
    seen = {"reads": 0, "bad": []}

    def read():
        while not done.is_set():
            for path in EDITION_FILES:
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except FileNotFoundError:
                    seen["bad"].append((path, "missing"))
                    continue
                seen["reads"] += 1
                if data != expected[path]:
                    seen["bad"].append((path, len(data)))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for r in readers:
        r.start()
    try:
        for _ in range(3):
            package("--sql")
    finally:
        done.set()
        for r in readers:
            r.join()
    assert seen["reads"] > 10
    assert not seen["bad"], f"{len(seen['bad'])} of {seen['reads']} reads saw another file: {seen['bad'][:5]}"
    assert not [n for n in os.listdir(DIST) if n.startswith(".publishing.")], "a temporary file was left behind"


def test_the_build_lanes_modes_leave_the_edition_script_alone():
    """The lane's jobs (package.sh --pg N, --rls) never rewrite the edition's files, which
    the first major's suites read while they run: here --pg of a major that does not
    exist, which fails before it builds anything."""
    package("--sql")
    before = [os.stat(p) for p in EDITION_FILES]
    package("--pg", "99", check=False)
    after = [os.stat(p) for p in EDITION_FILES]
    assert [(s.st_ino, s.st_mtime_ns) for s in before] == [(s.st_ino, s.st_mtime_ns) for s in after]
