"""How long a web check takes under a burst, to choose the limiters' default timeouts.

Serves the web packages' test application (integrations/python/tests: uvicorn with two
worker processes, or gunicorn, or puma) on SQLite and, with PGHOST set, on PostgreSQL,
sends it 2,000 requests from 32 concurrent keep-alive clients at a route of limit 300
(the load test's burst) and prints each request's latency as the client saw it: the
check, its queueing behind the other 31 clients, and the handler. The slowest of these
bounds the slowest check, which is what a timeout must stay above.

    /opt/pg_ratelimit/web-venv/bin/python bench/web/check_latency.py [asgi flask rack ...]

Writes bench/results/web_check_latency.md."""
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "integrations" / "python" / "tests"))

import httpx  # noqa: E402

from test_middleware import Database, Server  # noqa: E402

REQUESTS, CLIENTS = 2000, 32


def burst(url):
    left = iter(range(REQUESTS))
    latencies = []

    def client(_):
        with httpx.Client(base_url=url, timeout=30) as c:
            for _ in left:
                started = time.perf_counter()
                c.get("/exact")
                latencies.append(time.perf_counter() - started)

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    return sorted(latencies)


def main(frameworks):
    engines = ["sqlite"] + (["postgres"] if os.environ.get("PGHOST") else [])
    rows = []
    for engine in engines:
        for framework in frameworks:
            with tempfile.TemporaryDirectory() as folder:
                db = Database(engine, Path(folder))
                server = Server(db, framework=framework, workers=2)
                try:
                    ms = [x * 1000 for x in burst(server.url)]
                finally:
                    log = server.output()
                fallbacks = log.count("could not be reached")
                row = (engine, framework, statistics.median(ms), ms[int(len(ms) * 0.99)], ms[-1], fallbacks)
                rows.append(row)
                print("%-8s %-13s p50 %7.1f ms  p99 %7.1f ms  max %7.1f ms  fallbacks %d" % row, flush=True)
    out = ROOT / "bench" / "results" / "web_check_latency.md"
    lines = ["# Web check latency under the load test's burst", "",
             f"{REQUESTS} requests from {CLIENTS} concurrent clients at a route of limit 300, on "
             f"{os.cpu_count()} cores (bench/web/check_latency.py; {time.strftime('%Y-%m-%d')}). "
             "Latency as the client saw it: the check, queueing and the handler.", "",
             "| engine | server | p50 ms | p99 ms | max ms | fallbacks |", "|---|---|---|---|---|---|"]
    lines += ["| %s | %s | %.1f | %.1f | %.1f | %d |" % r for r in rows]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["asgi", "django-async", "flask", "rack"])
