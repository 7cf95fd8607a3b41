"""docs/monitoring: every query of the postgres_exporter file runs against the built
extension as a monitoring role (a member of rl_admin) and returns exactly the columns it
declares, and every metric the Grafana dashboard reads is one an exporter emits:
postgres_exporter's `<query>_<column>` for the file's queries (its documented naming; the
exporter itself is a Go binary this machine cannot fetch), and the web packages' names as
prometheus_client writes them from the installed package."""
import datetime
import json
import os
import re
import subprocess
import time

import pytest

from conftest import ROOT, native_only

yaml = pytest.importorskip("yaml")
psycopg2 = pytest.importorskip("psycopg2")

MONITORING = os.path.join(ROOT, "docs", "monitoring")
WEB_PYTHON = os.environ.get("RL_WEB_PYTHON", "/opt/pg_ratelimit/web-venv/bin/python")
PROMQL_WORDS = {"sum", "rate", "topk", "histogram_quantile", "by", "without", "le", "irate", "increase", "avg",
                "max", "min", "count"}


def exporter_queries():
    with open(os.path.join(MONITORING, "postgres_exporter.yaml")) as f:
        return yaml.safe_load(f)


def exporter_metric_names():
    names = set()
    for query, spec in exporter_queries().items():
        for metric in spec["metrics"]:
            ((column, how),) = metric.items()
            assert how["usage"] in ("LABEL", "COUNTER", "GAUGE"), (query, column)
            assert how["description"], (query, column)
            if how["usage"] != "LABEL":
                names.add(f"{query}_{column}")
    return names


def web_metric_names():
    """The names the Python package's PrometheusMetrics writes (the Node package's are the
    same names, its own tests check them)."""
    if not os.path.exists(WEB_PYTHON):
        if os.environ.get("RL_REQUIRE_PG") == "1":
            pytest.fail(f"{WEB_PYTHON} missing (scripts/setup.sh --pg makes it)")
        pytest.skip(f"{WEB_PYTHON} missing (scripts/setup.sh --pg makes it)")
    code = ("from prometheus_client import CollectorRegistry, generate_latest\n"
            "from ratelimit_web.metrics import PrometheusMetrics\n"
            "r = CollectorRegistry(); m = PrometheusMetrics(r)\n"
            "m.count('/login', 'refused', 'login'); m.observe('/login', 0.001); m.refuse('/login', 'login', 'ip:1')\n"
            "print(generate_latest(r).decode())\n")
    out = subprocess.run([WEB_PYTHON, "-c", code], check=True, capture_output=True, text=True).stdout
    return {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0) for line in out.splitlines()
            if line and not line.startswith("#")}


@native_only
def test_every_exporter_query_answers_its_declared_columns(pg_db):
    conn, name = pg_db
    monitor = f"monitor_{name}"
    with conn.cursor() as cur:
        cur.execute(f"CREATE ROLE {monitor} NOLOGIN IN ROLE rl_admin")
        cur.execute("""SELECT rl_policy_set('login', '{"limits": [{"burst": 1, "refill_per_minute": 0.001}]}')""")
        cur.execute("SELECT rl_stats_reset()")
        cur.execute("SELECT rl_check('login', 'ip:1'), rl_check('login', 'ip:1'), rl_block('ip:2', NULL), rl_block('ip:3', 60)")
        cur.execute("SELECT rl_spend('team:7', 'month', 100, 93.5), rl_spend('team:8', 'month', 100, 20), "
                    "rl_spend('team:9', 'month from 15 09:00 in europe/paris', 100, 60)")
        cur.execute("SELECT (rl_budget('team:9', 'month from 15 09:00 in Europe/Paris', 100, 0) ->> 'resets_at')::float8"
                    " - extract(epoch FROM clock_timestamp())::float8")
        team_9_left = cur.fetchone()[0]
        cur.execute(f"SET ROLE {monitor}")
        try:
            for query, spec in exporter_queries().items():
                cur.execute(spec["query"])
                columns = [d.name for d in cur.description]
                assert columns == [next(iter(m)) for m in spec["metrics"]], query
                rows = cur.fetchall()
                assert rows, f"{query} answered no row"
                labels = [i for i, m in enumerate(spec["metrics"]) if next(iter(m.values()))["usage"] == "LABEL"]
                for row in rows:
                    for i, value in enumerate(row):
                        number = isinstance(value, (int, float)) and not isinstance(value, bool)
                        assert isinstance(value, str) if i in labels else number, (query, columns[i], value)
            cur.execute("SELECT refused, refused_blocked FROM rl_stats WHERE policy = 'login'")
            assert cur.fetchone() == (1, 0)
            cur.execute(exporter_queries()["pg_ratelimit_blocks"]["query"])
            assert cur.fetchone() == (2, 1)
            cur.execute(exporter_queries()["pg_ratelimit_budget"]["query"])
            budgets = cur.fetchall()
            assert [row[:4] for row in budgets] == [("team:7", "month", 93.5, 100.0),
                                                    ("team:9", "month from 15 09:00 in Europe/Paris", 60.0, 100.0)], \
                "from half the quota up, the largest share first, each period as stored"
            # the seconds left are each budget's own: a UTC month's, and the customer's from the 15th in Paris
            month_left = datetime.datetime(*((lambda t: (t.year + t.month // 12, t.month % 12 + 1, 1))(
                datetime.datetime.now(datetime.timezone.utc))), tzinfo=datetime.timezone.utc).timestamp() - time.time()
            assert abs(budgets[0][4] - month_left) < 60 and abs(budgets[1][4] - team_9_left) < 60, (budgets, month_left, team_9_left)
            assert 0 < budgets[1][4] <= 31 * 86400 + 3600
        finally:
            cur.execute("RESET ROLE")
            cur.execute(f"DROP ROLE {monitor}")


def test_the_dashboard_reads_only_metrics_the_exporters_emit():
    emitted = exporter_metric_names() | web_metric_names()
    with open(os.path.join(MONITORING, "grafana-dashboard.json")) as f:
        dashboard = json.load(f)
    assert dashboard["title"] and dashboard["panels"]
    read = set()
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["targets"], panel
        for target in panel["targets"]:
            expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", target["expr"])
            expr = re.sub(r"\b(by|without)\s*\([^)]*\)", " ", expr)
            for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
                if word not in PROMQL_WORDS:
                    assert word in emitted, f"panel {panel['title']!r} reads {word}, which no exporter emits"
                    read.add(word)
    # every panel's source is covered: each query of the exporter file, and the web metrics
    for query in exporter_queries():
        assert any(name.startswith(query + "_") for name in read), f"no panel reads {query}"
    assert {"ratelimit_requests_total", "ratelimit_check_seconds_bucket", "ratelimit_refused_subject_refusals"} <= read


def web_cli():
    cli = os.path.join(os.path.dirname(WEB_PYTHON), "ratelimit-web")
    if not os.path.exists(cli):
        if os.environ.get("RL_REQUIRE_PG") == "1":
            pytest.fail(f"{cli} missing (scripts/test.sh installs integrations/python into the venv)")
        pytest.skip(f"{cli} missing")
    return cli


def tmux(*args):
    return subprocess.run(["tmux", "-L", "rl_top_test", *args], check=True, capture_output=True, text=True).stdout


@native_only
def test_ratelimit_web_top_in_a_terminal_refreshes_the_operators_view(pg_db):
    """`ratelimit-web top` in a tmux pane of 120 x 40: the policy's counts, the subject
    refused most and the blocks, and the numbers move as the application is refused."""
    import shutil
    import time

    if not shutil.which("tmux"):
        pytest.fail("tmux missing (scripts/setup.sh installs it)")
    conn, name = pg_db
    with conn.cursor() as cur:
        cur.execute("""SELECT rl_policy_set('login', '{"limits": [{"burst": 1, "refill_per_minute": 0.001}]}')""")
        cur.execute("SELECT rl_stats_reset()")
        for _ in range(3):
            cur.execute("SELECT rl_check('login', 'ip:203.0.113.9')")
        cur.execute("SELECT rl_block('ip:198.51.100.1', NULL)")
        cur.execute("SELECT rl_spend('team:7', 'month', 100, 93), rl_spend('team:8', 'month', 100, 20)")
    command = f"{web_cli()} --db 'dbname={name}' top --interval 0.3"
    tmux("new-session", "-d", "-s", "top", "-x", "120", "-y", "40", command)
    try:
        def screen_with(text):
            for _ in range(300):
                shown = tmux("capture-pane", "-p", "-t", "top")
                if text in shown:
                    return shown
                time.sleep(0.1)
            pytest.fail(f"the pane never showed {text!r}:\n{shown}")

        shown = screen_with("ip:198.51.100.1")
        assert "counts: server" in shown
        assert re.search(r"^login\s+1\s+2\s+0\s+0$", shown, re.M), shown
        assert re.search(r"^login\s+ip:203\.0\.113\.9\s+2\s+0\s+\d\d:\d\d:\d\d$", shown, re.M), shown
        assert re.search(r"^ip:198\.51\.100\.1\s+0\s+until unblocked$", shown, re.M), shown
        assert "NEAR THEIR QUOTA (80% or more)" in shown and "team:8" not in shown, shown
        assert re.search(r"^team:7\s+month\s+93\s+100\s+93\.0 %\s+\d{4}-\d\d-\d\d 00:00$", shown, re.M), shown
        with conn.cursor() as cur:
            for _ in range(5):
                cur.execute("SELECT rl_check('login', 'ip:203.0.113.9')")
        shown = screen_with("login   ip:203.0.113.9         7")
        assert re.search(r"^login\s+1\s+7\s+0\s+0$", shown, re.M), shown
    finally:
        tmux("kill-server")


def test_each_web_package_ships_the_one_operators_page():
    """integrations/spec/admin.html is the page; the Python and Node packages ship copies."""
    with open(os.path.join(ROOT, "integrations", "spec", "admin.html"), "rb") as f:
        page = f.read()
    assert b"<title>Rate limits: who is being limited</title>" in page
    for copy in ("integrations/python/ratelimit_web/admin.html", "integrations/node/admin.html"):
        with open(os.path.join(ROOT, copy), "rb") as f:
            assert f.read() == page, f"{copy} differs from integrations/spec/admin.html: copy it again"
