"""Where the time of one call goes: a load runs under `perf record -a --call-graph dwarf`,
every sample is put in the first category (below) whose function is on its stack, and
each category's share of all the machine's CPU time is turned into microseconds per call
with the call rate the benchmark measured without the profiler:

    us(category) = share(category) x cores x 1e6 / (calls/s)

so the categories of a system add up to the CPU time the whole machine spends per call
(the client's and the kernel's included, idle time apart). perf's own overhead lowers the
rate under the profiler, not the shares, which is why the rate comes from the unprofiled run.

Used by bench.py (the targets section); needs perf (Debian's linux-perf)."""
import collections
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

# PostgreSQL: (category, functions that put a sample in it), the first category with one
# of its functions anywhere on the sample's stack wins, so the more specific come first.
# Debian's postgres has no static symbols: a frame perf cannot name is placed by the
# named frames around it.
POSTGRES = [
    ("result printed for the client (jsonb_out)", ("OutputFunctionCall", "jsonb_out", "printtup")),
    ("jsonb answer built", ("JsonbResult", "jsonb::push")),
    ("the inner UPDATE's plan, executor and SQL callbacks (SPI)", ("SPI_", "_SPI_", "decision_slot")),
    ("row found, changed, index kept (heap and btree)", ("heap_change::change_in", "ExecModifyTable", "ExecUpdate",
                                                         "index_getnext_slot", "heap_update", "heap_page_prune")),
    ("decision and memory store (hash, part lock, bucket arithmetic)", ("calls::state", "change_bucket")),
    ("function call: arguments, clock, pgrx guards", ("rl_take_wrapper", "fmgr_security_definer", "pg_ratelimit::run")),
    ("transaction start and commit, WAL", ("StartTransactionCommand", "CommitTransactionCommand",
                                           "finish_xact_command", "XLogInsert", "XLogFlush", "RecordTransactionCommit")),
    ("statement start and end (portal, executor)", ("PortalStart", "ExecutorStart", "ExecutorEnd", "PortalDrop",
                                                    "ExecInitNode", "standard_ExecutorRun", "PortalRun")),
    ("protocol: read, parse and bind, send (backend and kernel)", ("pq_getbyte", "secure_read", "secure_write",
                                                                   "pq_flush", "socket_flush", "pq_getmessage",
                                                                   "exec_bind_message", "exec_execute_message",
                                                                   "ReadyForQuery", "EndCommand", "PostgresMain")),
]
CLIENTS = ("pgbench", "redis-benchmark")
SQLITE_DRIVER_COMM = "rl_sqlite_drive"  # /tmp/rl_sqlite_driver, as the kernel truncates it
IDLE = "idle"
OTHER = "other (kernel threads, other processes)"


def available():
    return shutil.which("perf") is not None


def profile(run_load, seconds=2.0, frequency=499):
    """Samples the whole machine while `run_load()` runs (it must run for about a second
    longer than `seconds`); returns {category: share of all CPU time, idle included}."""
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        worker = threading.Thread(target=run_load)
        worker.start()
        time.sleep(0.7)  # past the load's connection set-up
        subprocess.run(["perf", "record", "-q", "-a", "-F", str(frequency), "--call-graph", "dwarf,8192", "-o", data,
                        "--", "sleep", str(seconds)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        worker.join()
        script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,ip,sym,dso"], capture_output=True,
                                text=True, errors="replace", check=True).stdout
    counts, total = collections.Counter(), 0
    for comm, frames in _samples(script):
        total += 1
        counts[category(comm, frames)] += 1
    return {k: v / max(total, 1) for k, v in counts.items()}


def _samples(script):
    """(comm, [(function, object file)], leaf first) per sample of `perf script`."""
    comm, frames = None, []
    for line in script.splitlines():
        if not line.strip():
            if comm is not None:
                yield comm, frames
            comm, frames = None, []
        elif not line.startswith(("\t", " ")):
            comm, frames = line.split()[0], []
        else:
            m = re.match(r"\s*[0-9a-f]+ (.*?)(?:\+0x[0-9a-f]+)? \((.*)\)$", line)
            if m:
                frames.append((m.group(1), os.path.basename(m.group(2))))
    if comm is not None:
        yield comm, frames


def category(comm, frames):
    if comm == "swapper":
        return IDLE
    if comm in CLIENTS:
        return "client (pgbench, redis-benchmark)"
    if comm == "redis-server":
        return "redis-server"
    if comm == SQLITE_DRIVER_COMM:
        return _sqlite_category(frames)
    if comm != "postgres":
        return OTHER
    stack = " | ".join(f for f, _ in frames)
    for name, marks in POSTGRES:
        if any(mark in stack for mark in marks):
            return name
    return "other backend work"


def _sqlite_category(frames):
    """By the object file of the nearest frame that is not the C library: the extension's
    code, SQLite's, the kernel's (the WAL's writes), or the driver's loop (the client)."""
    if not any(f == "sqlite3_step" for f, _ in frames):
        return "client (the SQLite driver's loop)"
    for function, dso in frames:
        if dso.startswith("libratelimit"):
            return "SQLite: the extension (arguments, decision, JSON text, its statements' binding)"
        if dso.startswith("libsqlite3"):
            return "SQLite: the library (VDBE, B-tree, pager, WAL)"
        if dso.startswith("[kernel"):
            return "SQLite: the kernel (WAL writes, locks)"
    return "SQLite: the library (VDBE, B-tree, pager, WAL)"


def microseconds(shares, calls_per_s, cores=None):
    """{category: microseconds of CPU per call}, idle left out."""
    cores = cores or os.cpu_count()
    return {k: v * cores * 1e6 / calls_per_s for k, v in shares.items() if k != IDLE}
