"""Instructions per call, counted by valgrind's callgrind: the figure that does not move
with a busy machine. On the 2-core machines we run on, calls/s of the same build differ by
10 to 15 % from one run to the next, so a change worth 5 % cannot be seen there; counted
instructions repeat to within a few hundred per call.

How: the databases the section set up are copied while the cluster is stopped, and a
single-user backend (`postgres --single`) on the copy runs n1, then n2 calls of one
statement, each its own transaction, under callgrind. Their difference over n2 - n1 is one
call's instructions, start-up and first-call caching cancelled. The statement is prepared
once and executed with a key each time, as pgbench -M prepared runs it; `SELECT $1` counted
the same way is subtracted, which leaves what the function itself costs. No client and no network: the kernel's part of a call
(sockets, WAL writes, the walwriter's wake-ups) is not counted, so this is the database's
own work, the part an edition can change.

Used by bench.py (RL_BENCH_ONLY=instructions); needs valgrind."""
import os
import random
import re
import shutil
import subprocess
import tempfile

N1, N2 = 300, 1300


def _as_postgres(cmd, **kw):
    return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], **kw) if os.geteuid() == 0 else \
        subprocess.run(cmd, **kw)


def _count(bin_dir, pristine, db, statements, work):
    """Instructions a single-user backend spends running these statements on db, in a copy
    of the stopped cluster's data folder made for this count alone."""
    data = os.path.join(work, "data")
    shutil.rmtree(data, ignore_errors=True)
    subprocess.run(["cp", "-a", pristine, data], check=True)
    script = os.path.join(work, "in.sql")
    with open(script, "w") as f:
        f.write("\n".join(statements) + "\n")
    out = os.path.join(work, "callgrind.out")
    with open(script) as stdin:
        _as_postgres(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                      os.path.join(bin_dir, "postgres"), "--single", "-D", data,
                      # the copy's own settings are the bench cluster's: keep the memory
                      # store and the shared buffers small, their set-up is not the call's
                      "-c", "shared_preload_libraries=", "-c", "shared_buffers=128MB",
                      "-c", "synchronous_commit=off", db],
                     stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    with open(out) as f:
        totals = [line for line in f if line.startswith("totals:") or line.startswith("summary:")]
    os.remove(out)
    shutil.rmtree(data)
    return int(re.split(r"\s+", totals[-1].strip())[1])


def per_call(bin_dir, data, db, statement, work, keys):
    """Instructions of one call of statement, a pgbench line whose key is 'k' || :k: prepared
    once, as pgbench -M prepared does, then executed with keys drawn from 1..keys."""
    rng = random.Random(1)
    prepare = "PREPARE rl_call(text) AS " + statement.replace("'k' || :k", "$1")
    calls = [prepare] + [f"EXECUTE rl_call('k{rng.randint(1, keys)}');" for _ in range(N2)]
    return (_count(bin_dir, data, db, calls, work)
            - _count(bin_dir, data, db, calls[:N1 + 1], work)) / (N2 - N1)


def measure(bin_dir, cluster_data, stop, start, cells, keys):
    """cells: {name: (db, statement)}. Stops the cluster, copies its data folder, starts it
    again and counts on the copy; returns {name: instructions per call}, SELECT $1's taken off."""
    if not shutil.which("valgrind"):
        raise SystemExit("bench: the instructions section needs valgrind (scripts/setup.sh --bench installs it)")
    work = tempfile.mkdtemp(prefix="rl_instructions.")
    os.chmod(work, 0o777)
    data = os.path.join(work, "pristine")
    stop()
    try:
        subprocess.run(["cp", "-a", cluster_data, data], check=True)
    finally:
        start()
    for stale in ("postmaster.pid", "postmaster.opts"):
        if os.path.exists(os.path.join(data, stale)):
            os.remove(os.path.join(data, stale))
    try:
        base = {}
        result = {}
        for name, (db, statement) in cells.items():
            if db not in base:
                base[db] = per_call(bin_dir, data, db, "SELECT 'k' || :k;", work, keys)
            result[name] = per_call(bin_dir, data, db, statement, work, keys) - base[db]
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
