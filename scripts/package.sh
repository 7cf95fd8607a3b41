#!/usr/bin/env bash
# Builds the packages users install, into dist/ (publishes nothing):
#   dist/sqlite_ratelimit-<version>-py3-none-linux_x86_64.whl   the SQLite extension for Python (pip)
#   dist/sqlite-ratelimit-<version>.tgz                         the SQLite extension for Node (npm)
#   dist/postgresql-15-pg-ratelimit_<version>_amd64.deb        the PostgreSQL 15 extension for Debian
#   dist/pg_ratelimit-<version>-pg18-linux-x86_64.tar.gz       the PostgreSQL 18 extension (no Debian
#                                                               package of 18 to depend on): lib/ and
#                                                               share/extension/ of that server's tree
#   dist/pg_ratelimit_sql-<version>.sql                         the SQL edition (managed PostgreSQL): the
#                                                               database owner runs it with psql -f
#   dist/pg_ratelimit_sql-<version>.pg_tle.sql                  the same registered with pg_tle, then
#                                                               CREATE EXTENSION pg_ratelimit_sql
# Expects scripts/setup.sh --pg to have run; builds what it packages.
#   bash scripts/package.sh --sql   the two SQL edition files only: needs cargo, no cargo-pgrx
#                                   and no PostgreSQL (seconds once the core is built)
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
mkdir -p dist

# The SQL edition: the script shared/src/sql_edition.rs writes, and pg_tle's registration
# of its extension form (the body between dollar quotes no script of ours contains).
cargo run --quiet -p ratelimit_core --example sql_edition -- plain > "dist/pg_ratelimit_sql-$version.sql"
# A server with no release of it registered gets this one; one with an earlier release gets
# this version's script and an update path from each earlier one (the script is idempotent, so
# it serves as the update too), then ALTER EXTENSION pg_ratelimit_sql UPDATE.
extension_script=$(cargo run --quiet -p ratelimit_core --example sql_edition -- extension)
q='$_pg_ratelimit_sql_$'
cat > "dist/pg_ratelimit_sql-$version.pg_tle.sql" <<TLE
-- pg_ratelimit $version, SQL edition, registered with pg_tle. Run as a member of pgtle_admin, then
-- in each database that wants it: CREATE EXTENSION pg_ratelimit_sql (or, over an earlier
-- release: ALTER EXTENSION pg_ratelimit_sql UPDATE).
DO \$rl_register\$
BEGIN
    IF NOT EXISTS (SELECT FROM pgtle.available_extensions() WHERE name = 'pg_ratelimit_sql') THEN
        PERFORM pgtle.install_extension('pg_ratelimit_sql', '$version',
            'rate limits and spending budgets inside PostgreSQL, in SQL and PL/pgSQL', $q
$extension_script
$q);
    ELSE
        PERFORM pgtle.install_extension_version_sql('pg_ratelimit_sql', '$version', $q
$extension_script
$q);
        PERFORM pgtle.install_update_path('pg_ratelimit_sql', v.version, '$version', $q
$extension_script
$q)
        FROM pgtle.available_extension_versions() AS v
        WHERE v.name = 'pg_ratelimit_sql' AND v.version <> '$version';
        PERFORM pgtle.set_default_version('pg_ratelimit_sql', '$version');
    END IF;
END
\$rl_register\$;
TLE
if [ "${1:-}" = "--sql" ]; then
  echo "dist/pg_ratelimit_sql-$version.sql dist/pg_ratelimit_sql-$version.pg_tle.sql"
  exit 0
fi
source scripts/pg_versions.sh

cargo build --quiet --release -p sqlite_ratelimit
# Python: the library next to the package's __init__.py, built in a throwaway copy.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r bindings/python "$work/python"
cp target/release/libratelimit.so "$work/python/sqlite_ratelimit/"
/usr/bin/python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check setuptools wheel
(cd "$work/python" && SQLITE_RATELIMIT_VERSION=$version "$work/venv/bin/pip" wheel --quiet --no-deps \
  --no-build-isolation --wheel-dir "$OLDPWD/dist" .)

# Node: the library next to index.js; npm pack writes the tarball npm install takes.
cp -r bindings/node "$work/node"
cp target/release/libratelimit.so "$work/node/"
(cd "$work/node" && npm pkg set version="$version" >/dev/null && npm pack --silent --pack-destination "$OLDPWD/dist" >/dev/null)

# Debian: what cargo pgrx package lays out for PostgreSQL 15, with a control file.
package_root=target/release/pg_ratelimit-pg15
rm -rf "$package_root"
cargo pgrx package -p pg_ratelimit --pg-config /usr/lib/postgresql/15/bin/pg_config >/dev/null
deb_root="$work/deb"
cp -r "$package_root" "$deb_root"
mkdir "$deb_root/DEBIAN"
cat > "$deb_root/DEBIAN/control" <<CONTROL
Package: postgresql-15-pg-ratelimit
Version: $version
Architecture: amd64
Maintainer: pg_ratelimit developers <noreply@pg-ratelimit.invalid>
Depends: postgresql-15, libc6 (>= 2.34)
Section: database
Priority: optional
Description: rate limits and spending budgets inside PostgreSQL 15
 pg_ratelimit keeps token buckets and calendar spending budgets in the database:
 SELECT rl_take(...) from any language, atomic inside the server. CREATE EXTENSION
 pg_ratelimit in each database; for the memory store add pg_ratelimit to
 shared_preload_libraries. Restart the server after an upgrade if it preloads it.
CONTROL
dpkg-deb --build --root-owner-group "$deb_root" "dist/postgresql-15-pg-ratelimit_${version}_amd64.deb" >/dev/null

# PostgreSQL 18: the same files laid out as the server's tree names them (pg_config
# --pkglibdir is lib/, --sharedir is share/), with how to install them.
pg18=$(pg_config_of 18)
package_root=target/release/pg_ratelimit-pg18
rm -rf "$package_root"
CC=clang cargo pgrx package -p pg_ratelimit --pg-config "$pg18" --no-default-features --features pg18 >/dev/null
tree="$work/pg18/pg_ratelimit-$version-pg18"
mkdir -p "$tree/lib" "$tree/share/extension"
cp "$package_root$("$pg18" --pkglibdir)/pg_ratelimit.so" "$tree/lib/"
cp "$package_root$("$pg18" --sharedir)"/extension/pg_ratelimit* "$tree/share/extension/"
cat > "$tree/INSTALL" <<INSTALL
pg_ratelimit $version for PostgreSQL 18 (Linux x86_64). As the owner of the server's files,
with the server stopped if it preloads pg_ratelimit (never overwrite a library in use):
  cp lib/pg_ratelimit.so "\$(pg_config --pkglibdir)/"
  cp share/extension/* "\$(pg_config --sharedir)/extension/"
then CREATE EXTENSION pg_ratelimit in each database (ALTER EXTENSION pg_ratelimit UPDATE
after an upgrade; restart the server first if it preloads pg_ratelimit).
INSTALL
tar -czf "dist/pg_ratelimit-$version-pg18-linux-x86_64.tar.gz" -C "$work/pg18" "pg_ratelimit-$version-pg18"
ls dist
