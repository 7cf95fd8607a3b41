#!/usr/bin/env bash
# Builds the packages users install, into dist/ (publishes nothing):
#   dist/sqlite_ratelimit-<version>-py3-none-linux_x86_64.whl   the SQLite extension for Python (pip)
#   dist/sqlite-ratelimit-<version>.tgz                         the SQLite extension for Node (npm)
#   dist/postgresql-NN-pg-ratelimit_<version>_amd64.deb        the PostgreSQL NN extension for Debian and
#                                                               Ubuntu (the PostgreSQL project's apt layout),
#                                                               NN = 15, 16, 17, 18 (pg_versions.sh)
#   dist/pg_ratelimit-<version>-pgNN-linux-x86_64.tar.gz       the same files for other layouts: lib/ and
#                                                               share/extension/, copied where pg_config says
#   dist/pg_ratelimit_sql-<version>.sql                         the SQL edition (managed PostgreSQL): the
#                                                               database owner runs it with psql -f
#   dist/pg_ratelimit_sql-<version>.pg_tle.sql                  the same registered with pg_tle, then
#                                                               CREATE EXTENSION pg_ratelimit_sql
# Expects scripts/setup.sh --pg to have run; builds what it packages.
#   dist/ratelimit_web-<version>-py3-none-any.whl               the web middleware for Python (ASGI)
#   dist/ratelimit-web-<version>.tgz                            the web middleware for Node (Express, Next.js)
#   dist/ratelimit-web-<version>.gem                            the web middleware for Ruby (Rack, Rails)
#   dist/ratelimit-rls_<version>_amd64.deb                      Envoy's rate limit service (ratelimit-rls):
#                                                               the binary, a systemd unit, an example config
#   bash scripts/package.sh --rls     that .deb only (cargo; no PostgreSQL)
#   bash scripts/package.sh --sql     the two SQL edition files only: needs cargo, no cargo-pgrx
#                                     and no PostgreSQL (seconds once the core is built)
#   bash scripts/package.sh --sqlite  the SQL edition files, the SQLite extension's wheel and npm
#                                     package and the three web packages: cargo, python3-venv,
#                                     npm and gem, no cargo-pgrx and no PostgreSQL
#   bash scripts/package.sh --pg 16 17  those majors' .deb and tarball only (scripts/test.sh
#                                     builds the majors after the first this way, beside the
#                                     first one's tests, which read the SQL edition's files)
# The PostgreSQL builds use a target folder of their own (target/pg, or $RL_PG_TARGET_DIR):
# a cargo run for them never waits on the lock of one for the core or SQLite, and back.
#
# Every file of dist/ (and each copy of the SQLite library in the packages' folders) is
# written under a temporary name beside it and renamed into place, so a test or a job that
# reads it while this runs sees the old file or the new one, never half of one. Each mode
# writes only its own files: --pg and --rls leave the SQL edition's alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_TARGET_DIR=${RL_PG_TARGET_DIR:-target/pg}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
mkdir -p dist
work=$(mktemp -d)
# On exit, this run's own unfinished files go, never another's: the build lane's
# package.sh --pg N may run beside the suites' package.sh --sql in the same folders.
trap 'if [ -f "$work/staged" ]; then xargs -r rm -f < "$work/staged"; fi; rm -rf "$work"' EXIT

# A new name in the folder of $1, for a file to be renamed onto $1 once whole (remembered,
# so that an interrupted run removes it).
staging() { local t; t=$(mktemp "$(cd "$(dirname "$1")" && pwd)/.publishing.XXXXXX"); echo "$t" >> "$work/staged"; echo "$t"; }
# Moves the finished file $1 onto $2 in one rename (same file system), readable by all.
publish() { chmod 644 "$1"; mv -f "$1" "$2"; }
# Copies $1 onto $2 the same way.
publish_copy() { local t; t=$(staging "$2"); cp "$1" "$t"; publish "$t" "$2"; chmod "${3:-644}" "$2"; }
# Moves every file of the folder $1 into dist/, each by one rename.
publish_all() { local f t; for f in "$1"/*; do t=$(staging "dist/${f##*/}"); cp "$f" "$t"; publish "$t" "dist/${f##*/}"; done; }

# The SQL edition: the script codegen/src/sql_edition.rs writes, and pg_tle's registration
# of its extension form (the body between dollar quotes no script of ours contains).
sql_edition() {
local plain tle
plain=$(staging "dist/pg_ratelimit_sql-$version.sql")
cargo run --quiet -p ratelimit_codegen --example sql_edition -- plain > "$plain"
# A server with no release of it registered gets this one; one with an earlier release gets
# this version's script and an update path from each earlier one (the script is idempotent, so
# it serves as the update too), then ALTER EXTENSION pg_ratelimit_sql UPDATE.
extension_script=$(cargo run --quiet -p ratelimit_codegen --example sql_edition -- extension)
q='$_pg_ratelimit_sql_$'
tle=$(staging "dist/pg_ratelimit_sql-$version.pg_tle.sql")
cat > "$tle" <<TLE
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
publish "$plain" "dist/pg_ratelimit_sql-$version.sql"
publish "$tle" "dist/pg_ratelimit_sql-$version.pg_tle.sql"
}
case "${1:-}" in
  --pg|--rls) ;;
  *) sql_edition ;;
esac
if [ "${1:-}" = "--sql" ]; then
  echo "dist/pg_ratelimit_sql-$version.sql dist/pg_ratelimit_sql-$version.pg_tle.sql"
  exit 0
fi
# The SQLite extension's packages and the web packages: cargo, python3-venv and npm, no
# cargo-pgrx and no PostgreSQL.
say() { printf '\033[1m[package]\033[0m %s\n' "$*" >&2; }
# ratelimit-rls as a Debian package: /usr/bin/ratelimit-rls, a systemd unit that reads
# /etc/default/ratelimit-rls, and the example configurations beside the folder it reads
# (/etc/ratelimit-rls/examples; the operator copies the ones wanted into config/).
rls_package() {
  say "building ratelimit-rls"
  # a target folder of its own (target/rls): its build of the SQLite crate links SQLite
  # normally, and must never share target/release/deps with the loadable extension's
  CARGO_TARGET_DIR=target/rls cargo build --quiet --release -p ratelimit-rls
  local root="$work/rls" name=ratelimit-rls
  mkdir -p "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/default" "$root/etc/$name/config" \
    "$root/etc/$name/examples" "$root/usr/share/doc/$name"
  install -m 755 target/rls/release/ratelimit-rls "$root/usr/bin/"
  cp rls/config/examples/*.yaml "$root/etc/$name/examples/"
  cp LICENSE "$root/usr/share/doc/$name/copyright"
  cp rls/envoy-types-NOTICE rls/LICENSE-envoy-types-Apache-2.0 "$root/usr/share/doc/$name/"
  cat > "$root/etc/default/$name" <<DEFAULT
# ratelimit-rls settings (see ratelimit-rls --help): one YAML file per domain in RLS_CONFIG
RLS_CONFIG=/etc/$name/config
RLS_DATABASE_URL=postgres://ratelimit@localhost/app
RLS_GRPC=0.0.0.0:8081
RLS_HTTP=127.0.0.1:8080
DEFAULT
  cat > "$root/lib/systemd/system/$name.service" <<UNIT
[Unit]
Description=Envoy rate limit service backed by pg_ratelimit
After=network-online.target postgresql.service
Wants=network-online.target

[Service]
EnvironmentFile=/etc/default/$name
ExecStart=/usr/bin/ratelimit-rls
DynamicUser=yes
StateDirectory=$name
Restart=on-failure
KillSignal=SIGTERM
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
UNIT
  echo "/etc/default/$name" > "$root/DEBIAN/conffiles"
  for f in "$root/etc/$name/examples/"*.yaml; do echo "/etc/$name/examples/${f##*/}" >> "$root/DEBIAN/conffiles"; done
  cat > "$root/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: amd64
Maintainer: pg_ratelimit developers <noreply@pg-ratelimit.invalid>
Depends: libc6 (>= 2.34), libgcc-s1, libsqlite3-0 (>= 3.40)
Section: net
Priority: optional
Description: Envoy's rate limit service backed by pg_ratelimit
 Answers envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit for Envoy, Istio and
 Envoy Gateway with limits kept in PostgreSQL (pg_ratelimit or its SQL edition), all
 descriptors of a call charged or none, in envoyproxy/ratelimit's configuration format.
CONTROL
  dpkg-deb --build --root-owner-group "$root" "$work/${name}_${version}_amd64.deb" >/dev/null
  publish_copy "$work/${name}_${version}_amd64.deb" "dist/${name}_${version}_amd64.deb"
  ls "dist/${name}_${version}_amd64.deb"
}
if [ "${1:-}" = "--rls" ]; then
  rls_package
  exit 0
fi
sqlite_and_web_packages() {
  say "building the SQLite extension (cargo build --release -p sqlite_ratelimit)"
  cargo build --quiet --release -p sqlite_ratelimit
  # the library beside the Node binding and inside the gem, where a checkout's projects (the
  # Next.js example, the tests) and the packages below find it without a path
  publish_copy target/release/libratelimit.so bindings/node/libratelimit.so 755
  mkdir -p integrations/ruby/lib/ratelimit_web/native
  publish_copy target/release/libratelimit.so integrations/ruby/lib/ratelimit_web/native/libratelimit.so 755
  # Python: the library next to the package's __init__.py, built in a throwaway copy.
  cp -r bindings/python "$work/python"
  cp target/release/libratelimit.so "$work/python/sqlite_ratelimit/"
  /usr/bin/python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install --quiet --disable-pip-version-check setuptools wheel
  mkdir -p "$work/out"
  (cd "$work/python" && SQLITE_RATELIMIT_VERSION=$version "$work/venv/bin/pip" wheel --quiet --no-deps \
    --no-build-isolation --wheel-dir "$work/out" .)
  "$work/venv/bin/pip" wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --wheel-dir "$work/out" ./integrations/python
  command -v npm >/dev/null || { echo "package.sh: npm is needed for the Node packages (apt-get install npm)" >&2; exit 1; }
  say "packing sqlite_ratelimit (pip), sqlite-ratelimit (npm), ratelimit-web (pip, npm, gem) into dist/"
  # Node: the library next to index.js; npm pack writes the tarball npm install takes.
  node_version=$(sed -n 's/.*"version": "\(.*\)".*/\1/p' bindings/node/package.json)
  [ "$node_version" = "$version" ] || { echo "package.sh: bindings/node says $node_version, Cargo.toml $version" >&2; exit 1; }
  (cd bindings/node && npm pack --silent --pack-destination "$work/out" >/dev/null)
  # the web package compiles its TypeScript when packed (better-sqlite3 builds against the local Node headers)
  if [ ! -d integrations/node/node_modules ]; then
    (cd integrations/node && { [ ! -d /usr/include/node ] || export npm_config_nodedir=/usr; } \
      && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  else
    (cd integrations/node && npx tsc -p .)
  fi
  (cd integrations/node && npm pack --silent --pack-destination "$work/out" >/dev/null)
  command -v gem >/dev/null || { echo "package.sh: gem is needed for the Ruby package (apt-get install ruby)" >&2; exit 1; }
  gem_version=$(sed -n 's/.*VERSION = "\(.*\)"/\1/p' integrations/ruby/lib/ratelimit_web/version.rb)
  [ "$gem_version" = "$version" ] || { echo "package.sh: integrations/ruby says $gem_version, Cargo.toml $version" >&2; exit 1; }
  (cd integrations/ruby && gem build --silent ratelimit_web.gemspec -o "$work/out/ratelimit-web-$version.gem" >/dev/null)
  publish_all "$work/out"
}
majors=()
if [ "${1:-}" = "--pg" ]; then
  shift
  majors=("$@")
  [ ${#majors[@]} -gt 0 ] || { echo "package.sh --pg: name the majors, e.g. --pg 16 17" >&2; exit 2; }
else
  sqlite_and_web_packages
fi
if [ "${1:-}" = "--sqlite" ]; then
  ls dist/sqlite_ratelimit-"$version"-*.whl dist/sqlite-ratelimit-"$version".tgz dist/ratelimit_web-"$version"-*.whl \
    dist/ratelimit-web-"$version".tgz dist/ratelimit-web-"$version".gem
  say "done: install them as the READMEs of integrations/python, integrations/node and integrations/ruby say"
  exit 0
fi
source scripts/pg_versions.sh

# PostgreSQL, for each supported major: the files `cargo pgrx package` builds, laid out twice.
#   - a .deb in the layout of the PostgreSQL project's own apt packages of that major
#     (/usr/lib/postgresql/NN/lib, /usr/share/postgresql/NN/extension; Depends: postgresql-NN);
#   - a tarball of lib/ and share/extension/ with an INSTALL, for any other layout (pg_config
#     names the folders).
[ ${#majors[@]} -gt 0 ] || majors=("${PG_VERSIONS[@]}")
for v in "${majors[@]}"; do
  pg_config=$(pg_config_of "$v")
  say "building the PostgreSQL $v extension (cargo pgrx package: the one compile of this major)"
  package_root=$PG_TARGET_DIR/release/pg_ratelimit-pg$v
  rm -rf "$package_root"
  CC=clang CARGO_TARGET_DIR=$PG_TARGET_DIR cargo pgrx package -p pg_ratelimit --pg-config "$pg_config" \
    --no-default-features --features "pg$v" >/dev/null
  library="$package_root$("$pg_config" --pkglibdir)/pg_ratelimit.so"
  extension_files=("$package_root$("$pg_config" --sharedir)"/extension/pg_ratelimit*)

  name=postgresql-$v-pg-ratelimit
  deb_root="$work/deb$v"
  mkdir -p "$deb_root/DEBIAN" "$deb_root/usr/lib/postgresql/$v/lib" "$deb_root/usr/share/postgresql/$v/extension" \
    "$deb_root/usr/share/doc/$name"
  cp "$library" "$deb_root/usr/lib/postgresql/$v/lib/"
  cp "${extension_files[@]}" "$deb_root/usr/share/postgresql/$v/extension/"
  cp LICENSE "$deb_root/usr/share/doc/$name/copyright"
  cat > "$deb_root/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: amd64
Maintainer: pg_ratelimit developers <noreply@pg-ratelimit.invalid>
Depends: postgresql-$v, libc6 (>= 2.34)
Section: database
Priority: optional
Description: rate limits and spending budgets inside PostgreSQL $v
 pg_ratelimit keeps token buckets and calendar spending budgets in the database:
 SELECT rl_take(...) from any language, atomic inside the server. CREATE EXTENSION
 pg_ratelimit in each database; for the memory store add pg_ratelimit to
 shared_preload_libraries. Restart the server after an upgrade if it preloads it.
CONTROL
  dpkg-deb --build --root-owner-group "$deb_root" "$work/${name}_${version}_amd64.deb" >/dev/null
  publish_copy "$work/${name}_${version}_amd64.deb" "dist/${name}_${version}_amd64.deb"

  tree="$work/tar$v/pg_ratelimit-$version-pg$v"
  mkdir -p "$tree/lib" "$tree/share/extension"
  cp "$library" "$tree/lib/"
  cp "${extension_files[@]}" "$tree/share/extension/"
  cat > "$tree/INSTALL" <<INSTALL
pg_ratelimit $version for PostgreSQL $v (Linux x86_64). As the owner of the server's files,
with the server stopped if it preloads pg_ratelimit (never overwrite a library in use):
  cp lib/pg_ratelimit.so "\$(pg_config --pkglibdir)/"
  cp share/extension/* "\$(pg_config --sharedir)/extension/"
then CREATE EXTENSION pg_ratelimit in each database (ALTER EXTENSION pg_ratelimit UPDATE
after an upgrade; restart the server first if it preloads pg_ratelimit).
INSTALL
  tarball=dist/pg_ratelimit-$version-pg$v-linux-x86_64.tar.gz
  staged=$(staging "$tarball")
  tar -czf "$staged" -C "$work/tar$v" "pg_ratelimit-$version-pg$v"
  publish "$staged" "$tarball"
done
ls dist
