"""Every quick start of the web packages' READMEs, pasted as written into a new project.

A README's quick starts follow one layout, which this test reads and nothing else:

- the README's first `sh` block, when one comes before the quick starts, installs from a
  checkout; its lines run in the checkout (`bash scripts/package.sh` runs once for all);
- a section `## Quick start: <framework> (<engine>)` is a new project folder: its `sh`
  blocks but the last run there, in order; each other block is a file whose first line
  names it (`# app.py`, `// app.js`, `# mysite/settings.py (append)`); its last `sh` block
  serves it;
- then a sentence says what to send and what comes back:
  Then `curl -i [-X POST] localhost:8000/path` six times: five 200s, then a 429.

The project is a virtualenv of Debian's Python (whose sqlite3 loads extensions), an npm
project or a gem folder, with nothing but what its lines install. The server gets a free
port through PORT (and UVICORN_PORT, which uvicorn reads; puma 5 reads neither, so
`--port` is added to a puma command). A PostgreSQL section runs
against the test cluster: a new database whose name replaces `app` in the code, with
`CREATE EXTENSION pg_ratelimit`, as its prose asks. This machine reaches no GitHub, so
better-sqlite3 installs from the prebuilt binary scripts/better_sqlite3.sh made (the
environment's npm_config_better_sqlite3_local_prebuilds), as a download would on a
reader's machine."""
import os
import pathlib
import re
import shutil
import subprocess
import time

import httpx
import pytest

from test_middleware import ROOT, free_port

READMES = {name: os.path.join(ROOT, "integrations", name, "README.md") for name in ("python", "node", "ruby")}
READMES["next"] = os.path.join(ROOT, "integrations", "node", "examples", "next-app", "README.md")
NUMBERS = {word: n for n, word in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}


def sections(readme):
    text = open(readme).read()
    found = {}
    for match in re.finditer(r"^## Quick start: (.+)$", text, re.M):
        end = text.find("\n## ", match.end())
        found[match.group(1).strip()] = text[match.end():end if end >= 0 else len(text)]
    return found


def all_quick_starts():
    return [pytest.param(name, title, id=f"{name}: {title}") for name, readme in READMES.items()
            for title in sections(readme)]


class QuickStart:
    def __init__(self, readme, title):
        text = open(readme).read()
        self.readme, self.title = readme, title
        before = text[:text.index("\n## Quick start: ")]
        install = re.search(r"```sh\n(.*?)```", before, re.S)
        self.install = install.group(1) if install else ""
        body = sections(readme)[title]
        blocks = re.findall(r"```(\w+)\n(.*?)```", body, re.S)
        shells = [code for language, code in blocks if language == "sh"]
        assert shells, f"{title}: no sh block serves it"
        self.setup, self.serve = shells[:-1], shells[-1].strip()
        self.files = []
        for language, code in blocks:
            if language == "sh":
                continue
            first, _, rest = code.partition("\n")
            named = re.fullmatch(r"(?:#|//)\s*(\S+)( \(append\))?", first.strip())
            assert named, f"{title}: a {language} block whose first line names no file: {first!r}"
            self.files.append((named.group(1), rest, bool(named.group(2))))
        said = re.search(r"`curl -i (?:-X (\w+) )?localhost:\d+(/\S*)` (\w+) times: (\w+) (\d{3})s, then an? (\d{3})", body)
        assert said, f"{title}: no sentence says what it answers"
        method, self.path, times, first_n, status, last = said.groups()
        self.method = method or "GET"
        self.expected = [int(status)] * NUMBERS[first_n] + [int(last)] * (NUMBERS[times] - NUMBERS[first_n])
        self.postgres = "(PostgreSQL)" in title

    def kind(self):
        setup = "\n".join(self.setup) + self.install
        if re.search(r"^(pip|python)", setup, re.M):
            return "python"
        if re.search(r"^(npm|npx|bash run\.sh)", setup + self.serve, re.M):
            return "node"
        return "ruby"


@pytest.fixture(scope="module")
def packages():
    """dist/ as `bash scripts/package.sh --sqlite` leaves it (the test command built it)."""
    version = re.search(r'^version = "([^"]+)"', open(os.path.join(ROOT, "Cargo.toml")).read(), re.M).group(1)
    if not os.path.exists(os.path.join(ROOT, "dist", f"ratelimit-web-{version}.gem")):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "package.sh"), "--sqlite"], check=True, capture_output=True)


def database(tmp_path):
    """A database the quick start's `app` stands for, with pg_ratelimit created."""
    if not os.environ.get("PGHOST"):
        pytest.skip("a PostgreSQL quick start needs the test cluster (PGHOST)")
    import psycopg

    name = "rl_quick_" + re.sub(r"\W", "_", tmp_path.name).lower()[-30:]
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(dbname=name, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_ratelimit")
    return name


def drop_database(name):
    import psycopg

    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def environment(kind, folder):
    """The project's own tools first on PATH: its virtualenv, its gem folder or its npm bin."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "RUBYLIB", "PYTHONPATH", "GEM_HOME", "GEM_PATH")}
    if kind == "python":
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(folder / ".venv")], check=True)
        env.update(VIRTUAL_ENV=str(folder / ".venv"), PATH=f"{folder / '.venv' / 'bin'}:{env['PATH']}",
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
    elif kind == "ruby":
        default = subprocess.run(["gem", "env", "gempath"], capture_output=True, text=True, check=True).stdout.strip()
        env.update(GEM_HOME=str(folder / ".gems"), GEM_PATH=f"{folder / '.gems'}:{default}",
                   PATH=f"{folder / '.gems' / 'bin'}:{env['PATH']}")
    else:
        env.update(PATH=f"{folder / 'node_modules' / '.bin'}:{env['PATH']}", NEXT_TELEMETRY_DISABLED="1",
                   npm_config_audit="false", npm_config_fund="false", npm_config_loglevel="error")
    return env


def shell(lines, cwd, env, what):
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", lines], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{what} failed ({result.returncode}):\n{lines}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"


def wait_until_served(process, url, log):
    deadline = time.monotonic() + 180
    while True:
        try:
            httpx.get(url + "/", timeout=2)
            return
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"the server did not start (exit {process.poll()}):\n{open(log).read()[-4000:]}")
            time.sleep(0.3)


@pytest.mark.parametrize("name,title", all_quick_starts())
def test_the_quick_start_runs_as_pasted(tmp_path, packages, name, title):
    start = QuickStart(READMES[name], title)
    kind = start.kind()
    if kind == "ruby" and not shutil.which("puma"):
        from test_middleware import need_puma

        need_puma()
    if name == "next":  # the example is its own project, run where a reader has it
        folder = pathlib.Path(os.path.dirname(READMES["next"]))
    else:
        folder = tmp_path / "project"
        folder.mkdir()
    env = environment(kind, folder)
    name_db = database(tmp_path) if start.postgres else None
    try:
        install = "\n".join(line for line in start.install.splitlines() if not line.startswith("bash scripts/package.sh"))
        setup = "\n".join(start.setup)
        if name_db:
            setup = rename_database(setup, name_db)
        shell(f"{install}\ncd {folder}\n{setup}", ROOT, env, f"{title}: installing")
        for path, code, append in start.files:
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            code = rename_database(code, name_db) if name_db else code
            if append:
                target.write_text(target.read_text() + "\n" + code)
            else:
                target.write_text(code)
        port = free_port()
        env.update(PORT=str(port), UVICORN_PORT=str(port))
        log = tmp_path / "server.log"
        serve = start.serve
        if re.match(r"(bundle exec )?puma\b", serve):  # puma 5 reads no PORT
            serve += f" --port {port}"
        process = subprocess.Popen(["bash", "-c", f"exec {serve}"], cwd=folder, env=env,
                                   stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_served(process, url, log)
            answers = [httpx.request(start.method, url + start.path, timeout=10) for _ in start.expected]
            assert [a.status_code for a in answers] == start.expected, open(log).read()[-4000:]
            assert answers[-1].headers["Retry-After"].isdigit()
            assert answers[0].headers["RateLimit-Policy"]
        finally:
            os.killpg(process.pid, 15)
            process.wait(timeout=30)
        assert "could not be reached" not in open(log).read()
    finally:
        if name_db:
            drop_database(name_db)


def rename_database(text, name):
    """`app`, the quick start's database, is the test's own."""
    return re.sub(r"(dbname=|postgresql:///|database: \")app\b", rf"\g<1>{name}", text)
