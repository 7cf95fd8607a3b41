#!/usr/bin/env bash
# better-sqlite3, which the Node tests install into several projects, has no prebuilt binary
# reachable from here (its prebuild-install downloads from GitHub), so every `npm install`
# compiles it (2 to 3 minutes on 2 cores). This compiles it once per machine, with the
# local Node headers, and keeps the result in the layout prebuild-install reads from a local
# folder: $PREBUILDS/better-sqlite3-v<version>-node-v<ABI>-linux-x64.tar.gz. With
#   npm_config_better_sqlite3_local_prebuilds=$PREBUILDS
# in the environment (scripts/test.sh exports it), installs of that version unpack it
# instead of compiling. Prints the folder.
#   scripts/better_sqlite3.sh [version]   (default: the one integrations/node pins)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-$(node -p 'require("./integrations/node/package.json").devDependencies["better-sqlite3"]')}
prebuilds=/opt/pg_ratelimit/prebuilds
abi=$(node -p 'process.versions.modules')
tarball="$prebuilds/better-sqlite3-v$version-node-v$abi-linux-x64.tar.gz"
if [ ! -f "$tarball" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  printf '\033[1m[better-sqlite3]\033[0m compiling %s once for Node ABI %s (2 to 3 minutes)\n' "$version" "$abi" >&2
  (cd "$work" && npm init -y >/dev/null && { [ ! -d /usr/include/node ] || export npm_config_nodedir=/usr; } \
    && npm_config_build_from_source=true npm install --no-audit --no-fund --loglevel=error "better-sqlite3@$version" >/dev/null)
  mkdir -p "$prebuilds" "$work/pack/build/Release"
  cp "$work/node_modules/better-sqlite3/build/Release/better_sqlite3.node" "$work/pack/build/Release/"
  tar -czf "$tarball.tmp" -C "$work/pack" build && mv "$tarball.tmp" "$tarball"
fi
echo "$prebuilds"
