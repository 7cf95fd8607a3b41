"""Throwaway PostgreSQL clusters of their own, for tests that restart, crash or replicate
a server (the shared test cluster must stay up for the others). Each runs as the postgres
user when the tests run as root, on a private port and socket folder, and is removed
afterwards."""
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time

BIN = os.environ.get("RL_PG_BIN", "/usr/lib/postgresql/15/bin")


def as_server_user(cmd):
    return (["runuser", "-u", "postgres", "--"] + cmd) if os.geteuid() == 0 else cmd


class Cluster:
    def __init__(self, folder, port, settings):
        self.folder, self.port, self.settings = folder, port, settings
        self.data = os.path.join(folder, "data")

    def run(self, *cmd, **kw):
        return subprocess.run(as_server_user(list(cmd)), check=True, capture_output=True, text=True, **kw)

    def initdb(self):
        self.run(f"{BIN}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8")
        self.write_settings()

    def write_settings(self):
        lines = [f"port = {self.port}", f"unix_socket_directories = '{self.folder}'", "listen_addresses = ''"]
        lines += [f"{k} = '{v}'" for k, v in self.settings.items()]
        with open(os.path.join(self.data, "postgresql.auto.conf"), "a") as f:
            f.write("\n".join(lines) + "\n")

    def start(self):
        self.run(f"{BIN}/pg_ctl", "-D", self.data, "-l", os.path.join(self.folder, "server.log"), "-w", "-t", "60", "start")

    def stop(self, mode="fast"):
        self.run(f"{BIN}/pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop")

    def postmaster_pid(self):
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())

    def kill_everything(self):
        """kill -9 the postmaster and every backend, as a power cut would."""
        pm = self.postmaster_pid()
        children = subprocess.run(["pgrep", "-P", str(pm)], capture_output=True, text=True).stdout.split()
        for pid in [pm] + [int(c) for c in children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not os.path.exists(f"/proc/{pm}"):
                break
            time.sleep(0.1)

    def wait_ready(self, seconds=60):
        for _ in range(seconds * 10):
            if subprocess.run([f"{BIN}/pg_isready", "-h", self.folder, "-p", str(self.port)],
                              capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"cluster on port {self.port} did not come back; see {self.folder}/server.log")

    def connect(self, dbname="postgres", autocommit=True):
        import psycopg2

        conn = psycopg2.connect(host=self.folder, port=self.port, user="postgres", dbname=dbname)
        conn.autocommit = autocommit
        return conn

    def sql(self, statement, dbname="postgres"):
        conn = self.connect(dbname)
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
                return cur.fetchone() if cur.description else None
        finally:
            conn.close()

    def log(self):
        with open(os.path.join(self.folder, "server.log")) as f:
            return f.read()


@contextlib.contextmanager
def running(prefix, port, settings, create):
    """A cluster in a new folder, made by `create(cluster)` and started; stopped and removed after."""
    folder = tempfile.mkdtemp(prefix=prefix)
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    c = Cluster(folder, port, settings)
    try:
        create(c)
        c.start()
        yield c
    finally:
        with contextlib.suppress(Exception):
            c.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


def cluster(port, **settings):
    """A new, started cluster with `settings` in its configuration."""
    return running("rl_cluster_", port, settings, Cluster.initdb)


def standby_of(primary, port):
    """A hot standby streaming from `primary` (pg_basebackup -R), with the same settings."""

    def base_backup(s):
        s.run(f"{BIN}/pg_basebackup", "-h", primary.folder, "-p", str(primary.port), "-U", "postgres",
              "-D", s.data, "-R", "-X", "stream", "-c", "fast")
        s.write_settings()

    return running("rl_standby_", port, primary.settings, base_backup)
