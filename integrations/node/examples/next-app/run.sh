#!/usr/bin/env bash
# The example as a newcomer runs it, from a checkout: the packages it depends on built once
# (bash scripts/package.sh --sqlite: the SQLite extension, ratelimit-web), its dependencies
# installed, `next build` when a source is newer than the last build, then `next start` on
# port ${PORT:-3000}, on SQLite (ratelimit.db here; DATABASE_URL for PostgreSQL). Put a proxy
# that sets X-Real-IP in front before anyone else can reach it (README.md).
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../../../.. && pwd)
say() { printf '\033[1m[next-app]\033[0m %s\n' "$*" >&2; }
if [ ! -f "$root/bindings/node/libratelimit.so" ] || [ ! -f "$root/integrations/node/dist/index.js" ]; then
  say "building the SQLite extension and ratelimit-web once (bash scripts/package.sh --sqlite, about a minute)"
  bash "$root/scripts/package.sh" --sqlite >/dev/null
fi
say "installing the app's dependencies (npm install)"
# npm copies a file: dependency once and keeps that copy: take the checkout's current build
rm -rf node_modules/ratelimit-web node_modules/sqlite-ratelimit
npm install --no-audit --no-fund --loglevel=error
export NEXT_TELEMETRY_DISABLED=1
if [ ! -f .next/BUILD_ID ] || [ -n "$(find app lib proxy.ts next.config.ts package.json node_modules/ratelimit-web/dist \
      -newer .next/BUILD_ID -print -quit)" ]; then
  say "building the app (next build)"
  npx next build
fi
say "serving on http://localhost:${PORT:-3000} (next start; Ctrl-C stops it)"
exec npx next start -p "${PORT:-3000}"
