# frozen_string_literal: true

require_relative "lib/ratelimit_web/version"

Gem::Specification.new do |spec|
  spec.name = "ratelimit-web"
  spec.version = RatelimitWeb::VERSION
  spec.summary = "Rack and Rails rate limiting over pg_ratelimit (PostgreSQL) and sqlite ratelimit (SQLite)"
  spec.description = "A Rack middleware and a Rails controller helper whose limits are decided inside the " \
                     "application's own database, atomically: routes, policies, tiers, refunds and a fallback."
  spec.license = "MIT"
  spec.authors = ["pg_ratelimit developers"]
  spec.required_ruby_version = ">= 3.0"
  # the SQLite extension for Linux x86_64 (scripts/package.sh puts it in lib/ratelimit_web/native)
  spec.files = Dir["lib/**/*.rb"] + Dir["lib/ratelimit_web/native/*.so"] + ["README.md", "exe/ratelimit-web"]
  spec.require_paths = ["lib"]
  spec.bindir = "exe"
  spec.executables = ["ratelimit-web"]
  spec.add_dependency "rack", ">= 2.2"
end
