"""The README's examples as a newcomer runs them: every SQL statement in a ```sql block
runs on SQLite (and on PostgreSQL when a cluster is there) and gives the output shown
under it (`-- ` lines, compared as JSON), every `sqlite>` line of the shell transcript
gives the line shown after it, and the demo prints what examples/demo.out holds, whatever
the date."""
import json
import os
import re
import subprocess

import pytest

from conftest import ROOT, SQLITE_EXT, pg_available, pg_connect, pg_database, sqlite_connect

with open(os.path.join(ROOT, "README.md")) as f:
    README = f.read()


def examples():
    """(statement, expected output or None, the statements before it in its block) for
    every statement in a ```sql block: a block runs in one database, in order, as a
    newcomer pasting it would."""
    found = []
    for block in re.findall(r"```sql\n(.*?)```", README, re.S):
        first, pending = len(found), []
        for line in block.splitlines():
            if line.startswith("-- ") and not pending and len(found) > first:
                sql, shown, before = found[-1]
                found[-1] = (sql, f"{shown} {line[3:]}" if shown else line[3:], before)
            elif line.strip():
                pending.append(line)
                if re.search(r";\s*(--.*)?$", line):
                    found.append(("\n".join(pending), None, tuple(f[0] for f in found[first:])))
                    pending = []
    return found


def transcript():
    """(statement, expected line) for each `sqlite> SELECT` line of the README."""
    lines = README.splitlines()
    return [(line[len("sqlite> "):], lines[i + 1]) for i, line in enumerate(lines)
            if line.startswith("sqlite> SELECT")]


def same(got, expected):
    """Whether a result equals the output shown, both read as JSON where they are JSON."""
    def value(v):
        try:
            return json.loads(v) if isinstance(v, str) else v
        except json.JSONDecodeError:
            return v
    return value(got) == value(expected)


def test_the_readme_has_examples_with_outputs():
    shown = [e for e in examples() if e[1] is not None]
    assert len(examples()) >= 4 and len(shown) >= 2 and len(transcript()) >= 1


@pytest.mark.parametrize("sql, expected, before", examples())
def test_sql_example_on_sqlite(sql, expected, before):
    conn = sqlite_connect(":memory:")
    for earlier in before:
        conn.execute(earlier).fetchall()
    (got,) = conn.execute(sql).fetchone()
    if expected is not None:
        assert same(got, expected), f"{sql}\ngave {got}\nREADME shows {expected}"


@pytest.mark.parametrize("sql, expected, before", examples())
def test_sql_example_on_postgres(sql, expected, before):
    if not pg_available():
        pytest.skip("PGHOST not set")
    with pg_database("rl_readme") as name:
        conn = pg_connect(name)
        with conn.cursor() as cur:
            for earlier in before:
                cur.execute(earlier)
            cur.execute(sql)
            (got,) = cur.fetchone()
        conn.close()
    if expected is not None:
        got = json.dumps(got) if isinstance(got, (dict, list)) else got
        assert same(got, expected), f"{sql}\ngave {got}\nREADME shows {expected}"


@pytest.mark.parametrize("sql, expected", transcript())
def test_shell_transcript(tmp_path, sql, expected):
    script = f".load {SQLITE_EXT}\n{sql}\n"
    out = subprocess.run(["sqlite3", str(tmp_path / "app.db")], input=script, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == expected


def test_demo_prints_the_same_walk_on_any_date():
    out = subprocess.run(["sqlite3", ":memory:", "-cmd", f".load {SQLITE_EXT}"],
                         stdin=open(os.path.join(ROOT, "examples", "demo.sql")),
                         capture_output=True, text=True, check=True, cwd=ROOT)
    with open(os.path.join(ROOT, "examples", "demo.out")) as f:
        assert out.stdout == f.read()
    assert "│ true " in out.stdout and "│ false " in out.stdout, "booleans read true/false"


def test_postgres_demo_prints_the_same_walk():
    """examples/demo_pg.sql (scripts/demo.sh --postgres) prints examples/demo_pg.out: the
    same answers as the SQLite walk."""
    if not pg_available():
        pytest.skip("PGHOST not set: no PostgreSQL cluster for client tests")
    with pg_database("rl_demo") as name:
        conn = pg_connect(name)
        conn.cursor().execute(f"ALTER DATABASE {name} SET pg_ratelimit.allow_explicit_clock = on")
        conn.close()
        out = subprocess.run(["psql", "-X", "-q", "-d", name], stdin=open(os.path.join(ROOT, "examples", "demo_pg.sql")),
                             capture_output=True, text=True, check=True)
    with open(os.path.join(ROOT, "examples", "demo_pg.out")) as f:
        assert out.stdout == f.read()
