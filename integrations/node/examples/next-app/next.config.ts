import path from "node:path";
import type { NextConfig } from "next";

const nextConfig: NextConfig = {
  // the sqlite-ratelimit package finds its library next to itself: not bundled
  serverExternalPackages: ["sqlite-ratelimit"],
  // this folder is the project's root (the package above it has a lockfile of its own)
  turbopack: { root: path.join(__dirname) },
  outputFileTracingRoot: path.join(__dirname),
};

export default nextConfig;
