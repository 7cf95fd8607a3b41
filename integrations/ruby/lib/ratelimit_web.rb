# frozen_string_literal: true

require "set"
require_relative "ratelimit_web/version"
require_relative "ratelimit_web/route"
require_relative "ratelimit_web/local_state"
require_relative "ratelimit_web/limiter"
require_relative "ratelimit_web/rules"
require_relative "ratelimit_web/metrics"
require_relative "ratelimit_web/rack"

# Rate limits for Rack and Rails applications decided inside PostgreSQL (pg_ratelimit) or
# SQLite (sqlite ratelimit): a Rack middleware and a Rails controller helper.
module RatelimitWeb
  autoload :ActiveRecordLimiter, File.expand_path("ratelimit_web/active_record", __dir__)
  autoload :Controller, File.expand_path("ratelimit_web/controller", __dir__)
end
