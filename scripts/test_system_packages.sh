#!/usr/bin/env bash
# The PostgreSQL packages as a user installs them (as root, after scripts/package.sh), for each
# supported major, each followed by the conformance suite and the in-server checks
# (rl_self_test) against a cluster using it:
# - the .deb with dpkg -i over a server of that major in the PostgreSQL project's apt layout
#   (/usr/lib/postgresql/NN/{bin,lib}, /usr/share/postgresql/NN): 15 is Debian's own; for the
#   others this machine has no package, so the relocatable server the tests use is arranged in
#   that layout and an equivs stand-in for postgresql-NN satisfies the Depends (both removed
#   afterwards); dpkg -r must then leave none of the package's files behind;
# - the tarball's files copied where its INSTALL says, into the tree the tests use (from which
#   the files a `cargo pgrx install` put in place are removed first).
# The release build the tests use is installed again afterwards (scripts/pg_install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pg_versions.sh
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
work=$(mktemp -d)
arranged=()
cleanup() {
  bash scripts/pg_cluster.sh stop
  for v in "${arranged[@]}"; do
    dpkg -r "postgresql-$v-pg-ratelimit" "postgresql-$v" >/dev/null 2>&1 || true
    rm -rf "/usr/lib/postgresql/$v" "/usr/share/postgresql/$v"
  done
  rm -rf "$work"
}
trap cleanup EXIT
export RL_PG_BIN RL_PG_DIR=/tmp/pg_ratelimit_packages RL_PG_PORT=54331 PG_CONFIG RL_PG_PRELOAD=pg_ratelimit

conformance() {  # $1: the server's bin folder, $2: the library folder it must load from
  local settings loads_from
  RL_PG_BIN=$1 PG_CONFIG=$1/pg_config
  settings=$(bash scripts/pg_cluster.sh start)
  eval "$settings"
  loads_from=$(psql -XAtc "SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'")
  [ "$(realpath "$loads_from")" = "$(realpath "$2")" ] \
    || { echo "the server loads libraries from $loads_from, not $2" >&2; exit 1; }
  RL_REQUIRE_PG=1 RL_SQLITE=0 /usr/bin/python3 -m pytest -p no:cacheprovider -q tests/test_conformance.py \
    tests/test_postgres.py::test_the_in_server_checks_pass_on_this_server
  bash scripts/pg_cluster.sh stop
}

# Major $1's relocatable tree copied into the apt layout; its library and share folders, which
# the server finds relative to its bin folder, become links to the layout's folders.
arrange_apt_layout() {
  local v=$1 pg_config root lib share
  pg_config=$(pg_config_of "$v")
  root=$(dirname "$(dirname "$pg_config")")
  lib=$("$pg_config" --pkglibdir) lib=${lib#"$root"/}
  share=$("$pg_config" --sharedir) share=${share#"$root"/}
  [ ! -e "/usr/lib/postgresql/$v" ] && [ ! -e "/usr/share/postgresql/$v" ] \
    || { echo "/usr/lib/postgresql/$v or /usr/share/postgresql/$v exists already: not arranging over it" >&2; exit 1; }
  arranged+=("$v")
  mkdir -p /usr/lib/postgresql /usr/share/postgresql
  cp -a "$root" "/usr/lib/postgresql/$v"
  local dest=/usr/lib/postgresql/$v
  rm -f "$dest"/lib/pg_ratelimit.so "$dest"/lib/postgresql/pg_ratelimit.so
  if [ "$lib" != lib ]; then
    cp -a "$dest/$lib/." "$dest/lib/" && rm -rf "${dest:?}/$lib" && ln -s "$(realpath --relative-to="$(dirname "$dest/$lib")" "$dest/lib")" "$dest/$lib"
  fi
  mv "$dest/$share" "/usr/share/postgresql/$v" && ln -s "/usr/share/postgresql/$v" "$dest/$share"
  # A wheel keeps its private libraries beside the package (auditwheel's <name>.libs) and its
  # programs find them by a relative rpath: they move into lib/, and the rpaths point there.
  local private f
  for private in "$(dirname "$(dirname "$root")")"/*.libs; do
    [ ! -d "$private" ] || cp -a "$private/." "$dest/lib/"
  done
  while IFS= read -r f; do
    if readelf -d "$f" 2>/dev/null | grep -E '\((RPATH|RUNPATH)\)' | grep -q '\.libs'; then
      patchelf --set-rpath "\$ORIGIN/$(realpath --relative-to="$(dirname "$f")" "$dest/lib")" "$f"
    fi
  done < <(find "$dest" -type f \( -perm -u+x -o -name '*.so*' \))
  rm -f "/usr/share/postgresql/$v"/extension/pg_ratelimit*
  # the stand-in package, so that dpkg -i sees the Depends met as on a machine with the real one
  cat > "$work/postgresql-$v.control" <<CONTROL
Section: database
Priority: optional
Standards-Version: 4.6.2
Package: postgresql-$v
Version: $v.0~standin
Maintainer: pg_ratelimit tests <noreply@pg-ratelimit.invalid>
Description: stand-in for PostgreSQL $v (test only)
 Marks the server arranged under /usr/lib/postgresql/$v as installed.
CONTROL
  (cd "$work" && equivs-build "postgresql-$v.control" >"$work/equivs-$v.log" 2>&1) \
    || { cat "$work/equivs-$v.log" >&2; exit 1; }
  dpkg -i "$work/postgresql-${v}_$v.0~standin_all.deb" >/dev/null
}

for v in "${PG_VERSIONS[@]}"; do
  deb=dist/postgresql-$v-pg-ratelimit_${version}_amd64.deb
  tarball=dist/pg_ratelimit-${version}-pg$v-linux-x86_64.tar.gz
  for f in "$deb" "$tarball"; do [ -f "$f" ] || { echo "no $f: run bash scripts/package.sh" >&2; exit 1; }; done
  mapfile -t files < <(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { sub(/^\./, "", $6); print $6 }')
  bash scripts/pg_cluster.sh stop
  if [ "$v" = 15 ]; then
    rm -f "${files[@]}"  # what `cargo pgrx install` put in Debian's own tree
  else
    arrange_apt_layout "$v"
  fi
  for f in "${files[@]}"; do [ ! -e "$f" ] || { echo "$f exists before dpkg -i" >&2; exit 1; }; done
  dpkg -i "$deb" >/dev/null
  for f in "${files[@]}"; do [ -e "$f" ] || { echo "dpkg -i did not install $f" >&2; exit 1; }; done
  conformance "/usr/lib/postgresql/$v/bin" "/usr/lib/postgresql/$v/lib"
  # (the stand-in owns no folders, so dpkg keeps those the server's files are in, and says so)
  dpkg -r "postgresql-$v-pg-ratelimit" 2>&1 >/dev/null | { grep -v "not empty so not removed" || true; } >&2
  for f in "${files[@]}"; do [ ! -e "$f" ] || { echo "dpkg -r left $f behind" >&2; exit 1; }; done
  echo "PostgreSQL $v: the .deb installed, conformance passed, removed without a trace (${#files[@]} files)"
  if [ "$v" != 15 ]; then
    dpkg -r "postgresql-$v" >/dev/null
    rm -rf "/usr/lib/postgresql/$v" "/usr/share/postgresql/$v"
  fi

  pg_config=$(pg_config_of "$v")
  rm -f "$("$pg_config" --pkglibdir)/pg_ratelimit.so" "$("$pg_config" --sharedir)"/extension/pg_ratelimit*
  mkdir "$work/tar$v"
  tar -xzf "$tarball" -C "$work/tar$v"
  (cd "$work/tar$v"/pg_ratelimit-* && cp lib/pg_ratelimit.so "$("$pg_config" --pkglibdir)/" \
    && cp share/extension/* "$("$pg_config" --sharedir)/extension/")
  conformance "$(dirname "$pg_config")" "$("$pg_config" --pkglibdir)"
  echo "PostgreSQL $v: the tarball installed as its INSTALL says, conformance passed"
  bash scripts/pg_install.sh "$v"
done
