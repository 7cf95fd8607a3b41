# frozen_string_literal: true

# The test application's routes, policies and options, read from the spec every web package
# shares (integrations/spec/app.json), and what each Ruby test application (rack_app.ru,
# rails_app.ru) does alike: who is signed in (a bearer token signed with the spec's secret,
# never a header the client chooses) and the handlers' runs. The Python tests
# (integrations/python/tests) drive these servers. Settings from the environment:
# RL_WEB_ENGINE (sqlite or postgres), RL_WEB_DB (a file, or a libpq connection string),
# RL_WEB_EXTENSION, RL_WEB_TIMEOUT, RL_WEB_REFUSAL_CACHE, RL_WEB_MAX_IN_FLIGHT,
# RL_WEB_EXTRA_POLICY and RL_WEB_EXTRA_LIMITS.
require "cgi"
require "json"
require "openssl"
require "ratelimit_web"

module TestApp
  SPEC = JSON.parse(File.read(File.expand_path("../../spec/app.json", __dir__)))
  NEVER_REFILLS = SPEC.fetch("never_refills")
  ENGINE = ENV.fetch("RL_WEB_ENGINE")
  DB = ENV.fetch("RL_WEB_DB")
  EXTENSION = ENV["RL_WEB_EXTENSION"]
  # the limiter's timeout when a test sets one; else the limiter's default, as a user gets it
  TIMEOUT = ENV["RL_WEB_TIMEOUT"].to_s.empty? ? nil : Float(ENV["RL_WEB_TIMEOUT"])
  R = RatelimitWeb::Route
  RUNS = Hash.new(0)
  RUNS_LOCK = Mutex.new

  def self.limiter_options = TIMEOUT ? { timeout: TIMEOUT } : {}

  # (user, plan) of a valid bearer token, else [nil, nil].
  def self.signed_in(authorization)
    return [nil, nil] unless authorization.to_s.start_with?("Bearer ")

    claim, _, sig = authorization.delete_prefix("Bearer ").rpartition(".")
    expected = OpenSSL::HMAC.hexdigest("SHA256", SPEC.fetch("secret"), claim)[0, 16]
    return [nil, nil] if claim.empty? || !Rack::Utils.secure_compare(sig, expected)

    user, _, plan = claim.partition(":")
    [CGI.unescape(user), plan.empty? ? nil : plan]
  end

  def self.options
    { identify: ->(request) { (u = signed_in(request.get_header("HTTP_AUTHORIZATION"))[0]) && "user:#{u}" },
      tier: ->(request) { signed_in(request.get_header("HTTP_AUTHORIZATION"))[1] },
      trusted_proxies: SPEC.dig("options", "trusted_proxies"), skip: SPEC.dig("options", "skip"),
      refusal_cache: Integer(ENV.fetch("RL_WEB_REFUSAL_CACHE", "0")),
      max_in_flight: ENV["RL_WEB_MAX_IN_FLIGHT"]&.then { |n| Integer(n) } }
  end

  def self.routes
    found = SPEC.fetch("routes").to_h { |pattern, fields| [pattern, route_of(fields)] }
    found["/extra"] = R.new(policy: ENV["RL_WEB_EXTRA_POLICY"]) if ENV["RL_WEB_EXTRA_POLICY"]
    found["/extra"] = R.new(limits: JSON.parse(ENV["RL_WEB_EXTRA_LIMITS"])) if ENV["RL_WEB_EXTRA_LIMITS"]
    found
  end

  # A route of the spec; `identify_by_query` becomes the route's own identify (a query
  # parameter of the Rack::Request).
  def self.route_of(fields)
    fields = fields.transform_keys(&:to_sym)
    if (name = fields.delete(:identify_by_query))
      fields[:identify] = ->(request) { request.params[name] }
    end
    if (param = fields.delete(:period_by_query)) # a customer's own billing period
      limits = fields[:limits]
      fields[:limits] = lambda do |request|
        period = request.params[param]
        limits.map { |l| period && !period.empty? && l.key?("period") ? l.merge("period" => period) : l }
      end
    end
    R.new(**fields)
  end

  def self.ran(path) = RUNS_LOCK.synchronize { RUNS[RatelimitWeb.normalize_path(path, formats: true)] += 1 }

  def self.runs = RUNS_LOCK.synchronize { RUNS.dup }

  # The handlers every test application serves: /ai, /pai and /bill charge `tokens` (or refund
  # `refund`) after the work, through RatelimitWeb.charge on `request`; /fail, /pfail, /sms and
  # /refund/* fail as asked (a run counted first), /slow sleeps, the rest answer {ok, path}.
  def self.answer(path, params, request = nil)
    ran(path) unless path == "/slow"
    case RatelimitWeb.normalize_path(path, formats: true)
    when "/ai", "/pai", "/bill"
      RatelimitWeb.charge(request, Float(params["tokens"])) if params["tokens"]
      RatelimitWeb.refund(request, Float(params["refund"])) if params["refund"]
    when "/fail", "/pfail", "/sms", %r{\A/refund/}
      return [503, { "ok" => false }] if params["how"] == "503"
      return [200, { "ok" => true }] if params["how"] == "ok"

      raise "the handler failed"
    when "/slow"
      sleep(Float(params.fetch("seconds", "0.5")))
    end
    [200, { "ok" => true, "path" => path }]
  end
end
