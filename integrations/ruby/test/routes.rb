# frozen_string_literal: true

# The test applications' settings and routes, from the environment, the same as the Python
# tests' routes.py (integrations/python/tests drives these servers too): RL_WEB_ENGINE
# (sqlite or postgres), RL_WEB_DB (a file, or a libpq connection string), RL_WEB_EXTENSION,
# RL_WEB_TIMEOUT, RL_WEB_REFUSAL_CACHE, RL_WEB_MAX_IN_FLIGHT and RL_WEB_EXTRA_POLICY.
require "ratelimit_web"

module TestApp
  NEVER_REFILLS = 1e-6 # tokens per minute: a run sees exactly the burst
  ENGINE = ENV.fetch("RL_WEB_ENGINE")
  DB = ENV.fetch("RL_WEB_DB")
  EXTENSION = ENV["RL_WEB_EXTENSION"]
  TIMEOUT = Float(ENV.fetch("RL_WEB_TIMEOUT", "0.05"))
  R = RatelimitWeb::Route

  def self.options
    { identify: ->(request) { (u = request.get_header("HTTP_X_USER")) && "user:#{u}" },
      tier: ->(request) { request.get_header("HTTP_X_PLAN") },
      trusted_proxies: ["127.0.0.1/32"], skip: ["/health", "/ready", "/counts", "/metrics"],
      refusal_cache: Integer(ENV.fetch("RL_WEB_REFUSAL_CACHE", "0")),
      max_in_flight: ENV["RL_WEB_MAX_IN_FLIGHT"]&.then { |n| Integer(n) } }
  end

  def self.routes
    extra = ENV["RL_WEB_EXTRA_POLICY"]
    {
      "/exact" => R.new(limits: [{ burst: 300, refill_per_minute: NEVER_REFILLS }]),
      "/policy" => R.new(policy: "web_exact"),
      "/login" => R.new(policy: "web_login", sensitive: true),
      "GET /api/*" => R.new(limits: [{ burst: 5, refill_per_minute: NEVER_REFILLS }, { period: "day", quota: 8 }],
                            tiers: { free: 1, pro: 2 }),
      "/fail" => R.new(limits: [{ burst: 2, refill_per_minute: NEVER_REFILLS }]),
      "/pfail" => R.new(policy: "web_fail"),
      "/open" => R.new(limits: [{ burst: 40, refill_per_minute: NEVER_REFILLS }]),
      "/retry" => R.new(limits: [{ burst: 1, refill_per_minute: 60 }]),
      "/big" => R.new(limits: [{ burst: 5, refill_per_minute: 60 }], cost: 10),
      "/slow" => R.new(limits: [{ burst: 1000, refill_per_minute: NEVER_REFILLS }]),
      "/flood" => R.new(policy: "web_flood"),
      "/gone" => R.new(policy: "web_gone"),
      **(extra ? { "/extra" => R.new(policy: extra) } : {})
    }
  end

  # The handlers every test application serves: /fail and /pfail fail as asked, /slow
  # sleeps, the rest answer {ok, path}.
  def self.answer(path, params)
    case path
    when "/fail", "/pfail"
      return [503, { "ok" => false }] if params["how"] == "503"
      return [200, { "ok" => true }] if params["how"] == "ok"

      raise "the handler failed"
    when "/slow"
      sleep(Float(params.fetch("seconds", "0.5")))
    end
    [200, { "ok" => true, "path" => path }]
  end
end
