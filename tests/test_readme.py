"""The documentation's examples as a newcomer runs them: every SQL statement in a ```sql
block of the README and of every page under docs/ runs on SQLite (and on PostgreSQL when a
cluster is there) and gives the output shown under it (`-- ` lines, compared as JSON),
every `sqlite>` line of the shell transcript gives the line shown after it, every relative
link leads to a file and heading that exist, and the demo prints what examples/demo.out
holds, whatever the date."""
import glob
import json
import os
import re
import subprocess

import pytest

from conftest import ROOT, SQLITE_EXT, pg_available, pg_connect, pg_database, sqlite_connect

# the pages whose examples run: the README and everything under docs/
PAGES = ["README.md"] + sorted(glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True))
# docs/managed-postgres.md's blocks need a platform's roles: tests/test_platforms.py runs them
# on each platform's emulation
EXAMPLE_PAGES = [p for p in PAGES if p != "docs/managed-postgres.md"]
# the pages whose links are checked: those, and the other pages a reader reaches from them
LINKED_PAGES = PAGES + ["ARCHITECTURE.md", "CONTRIBUTING.md", "CHANGELOG.md", "bench/README.md",
                        "integrations/python/README.md", "integrations/node/README.md",
                        "integrations/ruby/README.md"]


def read(page):
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


README = read("README.md")


def examples(page=None):
    """(statement, expected output or None, the statements before it in its block) for
    every statement in a ```sql block of a page (of every page in PAGES when None): a
    block runs in one database, in order, as a newcomer pasting it would."""
    if page is None:
        return [e for p in EXAMPLE_PAGES for e in examples(p)]
    found = []
    for block in re.findall(r"```sql\n(.*?)```", read(page), re.S):
        first, pending = len(found), []
        for line in block.splitlines():
            if line.startswith("-- ") and not pending and len(found) > first:
                sql, shown, before = found[-1]
                found[-1] = (sql, f"{shown} {line[3:]}" if shown else line[3:], before)
            elif line.strip():
                pending.append(line)
                if re.search(r";\s*(--.*)?$", line):
                    # CREATE EXTENSION is the reader's setup: SQLite has no such statement, and
                    # the PostgreSQL test database has the extension already
                    if not pending[0].startswith("CREATE EXTENSION"):
                        found.append(("\n".join(pending), None, tuple(f[0] for f in found[first:])))
                    pending = []
    return found


def example_params():
    return [pytest.param(*e, id=f"{page}:{i}") for page in EXAMPLE_PAGES for i, e in enumerate(examples(page))]


def heading_anchor(line):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower())
    return text.replace(" ", "-")


def links():
    """(page, target) for every relative link outside code blocks of the linked pages."""
    found = []
    for page in LINKED_PAGES:
        text = re.sub(r"```.*?```", "", read(page), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if not target.startswith(("http://", "https://", "mailto:")):
                found.append((page, target))
    return found


@pytest.mark.parametrize("page, target", links())
def test_relative_link_leads_somewhere(page, target):
    path, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
    assert os.path.exists(full), f"{page} links to {target}: no such file"
    if anchor and full.endswith(".md"):
        with open(full) as f:
            text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
        anchors = {heading_anchor(line) for line in text.splitlines() if line.startswith("#")}
        assert anchor in anchors, f"{page} links to {target}: no such heading"


def test_every_docs_page_is_linked_from_the_readme_or_another_page():
    linked = {os.path.normpath(os.path.join(os.path.dirname(p), t.partition("#")[0])) for p, t in links()}
    assert set(PAGES) - {"README.md"} <= linked


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


def test_the_readme_and_the_guides_have_examples_with_outputs():
    shown = [e for e in examples("README.md") if e[1] is not None]
    assert len(examples("README.md")) >= 2 and len(shown) >= 1 and len(transcript()) >= 1
    assert len(examples("docs/guides/limits.md")) >= 8
    assert len([e for e in examples("docs/guides/choosing-limits.md") if e[1] is not None]) >= 8


@pytest.mark.parametrize("sql, expected, before", example_params())
def test_sql_example_on_sqlite(sql, expected, before):
    conn = sqlite_connect(":memory:")
    for earlier in before:
        conn.execute(earlier).fetchall()
    (got,) = conn.execute(sql).fetchone()
    if expected is not None:
        assert same(got, expected), f"{sql}\ngave {got}\nREADME shows {expected}"


@pytest.mark.parametrize("sql, expected, before", example_params())
def test_sql_example_on_postgres(sql, expected, before):
    if not pg_available():
        pytest.skip("PGHOST not set")
    with pg_database("rl_readme") as name:
        # the examples pass now_ms so that their answers hold on any day
        setup = pg_connect(name)
        setup.cursor().execute(f"ALTER DATABASE {name} SET pg_ratelimit.allow_explicit_clock = on")
        setup.close()
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
