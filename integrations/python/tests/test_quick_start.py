"""The README's quick starts, pasted into a new project whose virtualenv installs the
packages `bash scripts/package.sh --sqlite` builds, served by uvicorn or gunicorn: the
first 200 and the first 429."""
import glob
import os
import re
import subprocess
import sys
import time

import httpx
import pytest

from test_middleware import HERE, ROOT, free_port

README = os.path.join(ROOT, "integrations", "python", "README.md")
VERSION = re.search(r'^version = "([^"]+)"', open(os.path.join(ROOT, "Cargo.toml")).read(), re.M).group(1)


def section(title):
    text = open(README).read()
    start = text.index(f"## Quick start: {title}")
    return text[start:text.index("\n## ", start + 1)]


def quick_start(title, block="python", index=0):
    """The section's `index`th block of that language, as written."""
    return re.findall(rf"```{block}\n(.*?)```", section(title), re.S)[index]


def run_shell_block(venv, folder, title):
    """The section's own shell lines (pip, django-admin), run in the project's virtualenv."""
    for line in quick_start(title, "sh").splitlines():
        subprocess.run(["bash", "-c", f"{venv}/bin/{line}" + (" --quiet --disable-pip-version-check" if line.startswith("pip ") else "")],
                       cwd=folder, check=True)


@pytest.fixture(scope="module")
def packages():
    wheels = [glob.glob(os.path.join(ROOT, "dist", f"{name}-{VERSION}-*.whl")) for name in ("sqlite_ratelimit", "ratelimit_web")]
    if not all(wheels) or not os.path.exists(os.path.join(ROOT, "dist", f"ratelimit-web-{VERSION}.gem")):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "package.sh"), "--sqlite"], check=True, capture_output=True)
        wheels = [glob.glob(os.path.join(ROOT, "dist", f"{name}-{VERSION}-*.whl")) for name in ("sqlite_ratelimit", "ratelimit_web")]
    return [w[0] for w in wheels]


def project(tmp_path, packages):
    """A new project folder with a virtualenv of Debian's Python (its sqlite3 loads
    extensions), where the README's own install line, run from the checkout, installs
    the built packages."""
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    text = open(README).read()
    install = next(line for line in re.search(r"```sh\n(.*?)```", text, re.S).group(1).splitlines()
                   if line.startswith("pip install"))
    subprocess.run(["bash", "-c", f"{venv}/bin/{install} --quiet --disable-pip-version-check"], cwd=ROOT, check=True)
    return venv


def serve(venv, folder, code, env=None, command=("uvicorn", "app:app", "--port")):
    """`command` (then the port) in `folder`; `code`, when given, is its app.py."""
    if code is not None:
        (folder / "app.py").write_text(code)
    port = free_port()
    arguments = [*command, str(port)] if command[-1] == "--port" else [*command, "--bind", f"127.0.0.1:{port}"]
    process = subprocess.Popen([str(venv / "bin" / arguments[0]), *arguments[1:]],
                               cwd=folder, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
            return process, f"http://127.0.0.1:{port}"
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the quick start did not start: " + process.stdout.read())
            time.sleep(0.2)


def hello_statuses(process, url):
    """Four GET /api/hello, then the server stopped."""
    try:
        return [httpx.get(url + "/api/hello").status_code for _ in range(4)]
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_sqlite_quick_start_runs_as_pasted(tmp_path, packages):
    venv = project(tmp_path, packages)
    assert hello_statuses(*serve(venv, tmp_path, quick_start("SQLite"))) == [200, 200, 200, 429]


def login_database(tmp_path):
    """A database `app` would be: pg_ratelimit and the quick start's `login` policy."""
    if not os.environ.get("PGHOST"):
        pytest.skip("the PostgreSQL quick starts need a cluster (PGHOST)")
    import psycopg

    name = "rl_quick_" + tmp_path.name.replace("-", "_").lower()[-30:]
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(dbname=name, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_ratelimit")
        conn.execute("""SELECT rl_policy_set('login', '{"limits": [{"burst": 5, "refill_per_minute": 5}]}')""")
    return name


def drop_database(name):
    import psycopg

    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.parametrize("title", ["PostgreSQL", "Flask"])
def test_the_postgres_quick_starts_run_as_pasted(tmp_path, packages, title):
    name = login_database(tmp_path)
    venv = project(tmp_path, packages)
    command = ("uvicorn", "app:app", "--port")
    if title == "Flask":
        run_shell_block(venv, tmp_path, title)
        command = ("gunicorn", "--threads", "8", "app:app")
    process, url = serve(venv, tmp_path, quick_start(title).replace('"dbname=app"', f'"dbname={name}"'), command=command)
    try:
        statuses = [httpx.post(url + "/login").status_code for _ in range(6)]
        assert statuses == [200] * 5 + [429]
    finally:
        process.terminate()
        process.wait(timeout=30)
        drop_database(name)


def test_the_django_quick_start_runs_as_pasted(tmp_path, packages):
    venv = project(tmp_path, packages)
    run_shell_block(venv, tmp_path, "Django")  # pip install, django-admin startproject
    settings = tmp_path / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + quick_start("Django", "python", 0))
    (tmp_path / "mysite" / "urls.py").write_text(quick_start("Django", "python", 1))
    assert hello_statuses(*serve(venv, tmp_path, None, command=("gunicorn", "mysite.wsgi"))) == [200, 200, 200, 429]


RUBY_README = os.path.join(ROOT, "integrations", "ruby", "README.md")


def ruby_quick_start(tmp_path, title):
    """The Ruby README's install line (the built gem into a gem folder of the project's
    own) and its `title` quick start as config.ru, served by puma: its URL and process."""
    from test_middleware import need_puma

    need_puma()
    text = open(RUBY_README).read()
    install = next(line for line in re.search(r"```sh\n(.*?)```", text, re.S).group(1).splitlines()
                   if line.startswith("gem install"))
    section = text[text.index(f"## Quick start: {title}"):]
    (tmp_path / "config.ru").write_text(re.search(r"```ruby\n(.*?)```", section, re.S).group(1))
    gems = str(tmp_path / "gems")
    default = subprocess.run(["gem", "env", "gempath"], capture_output=True, text=True, check=True).stdout.strip()
    env = dict(os.environ, GEM_HOME=gems, GEM_PATH=f"{gems}:{default}")
    env.pop("RUBYLIB", None)  # the gem as installed, not the checkout
    subprocess.run(["bash", "-c", install + " --quiet"], cwd=ROOT, env=env, check=True)
    return env


def test_the_rack_quick_start_runs_as_pasted(tmp_path, packages):
    name = login_database(tmp_path)
    env = ruby_quick_start(tmp_path, "Rack")
    code = (tmp_path / "config.ru").read_text().replace('"dbname=app"', f'"dbname={name}"')
    (tmp_path / "config.ru").write_text(code)
    port = free_port()
    process = subprocess.Popen(["puma", "--bind", f"tcp://127.0.0.1:{port}", "config.ru"], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = wait_for(process, port)
        assert [httpx.post(url + "/login").status_code for _ in range(6)] == [200] * 5 + [429]
    finally:
        process.terminate()
        process.wait(timeout=30)
        drop_database(name)


def test_the_rails_quick_start_runs_as_pasted(tmp_path, packages):
    name = login_database(tmp_path)
    env = ruby_quick_start(tmp_path, "Rails")
    env["DATABASE_URL"] = f"postgresql:///{name}"
    port = free_port()
    process = subprocess.Popen(["puma", "--bind", f"tcp://127.0.0.1:{port}", "config.ru"], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = wait_for(process, port)
        responses = [httpx.get(url + "/api/hello") for _ in range(4)]
        assert [r.status_code for r in responses] == [200, 200, 200, 429]
        assert responses[3].headers["Retry-After"] == "1"
    finally:
        process.terminate()
        process.wait(timeout=30)
        drop_database(name)


def wait_for(process, port):
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url + "/", timeout=1)
            return url
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"puma did not start (exit {process.poll()})")
            time.sleep(0.2)
