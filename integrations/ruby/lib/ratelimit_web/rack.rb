# frozen_string_literal: true

require "json"
require "rack"

module RatelimitWeb
  # A Rack middleware: `use RatelimitWeb::Middleware, limiter: ..., routes: {...}, **options`
  # (the options of Rules; `identify` and `tier` get a Rack::Request). The subject defaults
  # to env["REMOTE_USER"], else the client address. Every route is checked when it is
  # built: limits the engine refuses, or a policy that does not exist, raise ArgumentError
  # naming the route. Paths are matched as Rails dispatches them (a format suffix such as
  # .json is the same route). Puma reads a request's body before the application sees it,
  # so slow bodies never count toward max_in_flight.
  class Middleware
    attr_reader :rules

    def initialize(app, limiter:, routes:, **options)
      @app, @limiter = app, limiter
      @rules = Rules.new(routes, **options)
      problem = @rules.check_routes(limiter)
      raise ArgumentError, "ratelimit_web: #{problem}" if problem
    end

    def counters = @rules.counters

    def call(env)
      method, path = env["REQUEST_METHOD"], env["PATH_INFO"].to_s.empty? ? "/" : env["PATH_INFO"]
      return @app.call(env) if @rules.skipped?(path)

      shed = @rules.enter(method, path)
      return RatelimitWeb.reply(shed) if shed

      begin
        limited(env, method, path)
      ensure
        @rules.leave
      end
    end

    private

    def limited(env, method, path)
      route = @rules.match(method, path)
      return @app.call(env) unless route

      request = ::Rack::Request.new(env)
      check = Check.new(@rules, @limiter, route, request,
                        user: env["REMOTE_USER"], peer: env["REMOTE_ADDR"], forwarded: env["HTTP_X_FORWARDED_FOR"])
      decision = check.decide
      return RatelimitWeb.reply(decision) if decision.kind == :answer
      return @app.call(env) if decision.kind == :fallback

      check.run { @app.call(env) }
    end
  end

  # One request's check and what follows it, for the Rack middleware and the Rails helper.
  class Check
    def initialize(rules, limiter, route, request, user:, peer:, forwarded:)
      @rules, @limiter, @route = rules, limiter, route
      @subject = rules.subject(rules.identify&.call(request), user, peer, forwarded)
      @tier = rules.tier&.call(request)
      @cost = rules.cost(route, request)
    end

    def decide
      @decision = @rules.decide(@route, @subject, @tier, @cost) { @limiter.check(@route, @subject, @tier, @cost) }
    end

    def give_back
      @limiter.refund(@route, @subject, @tier, @cost)
    rescue DatabaseUnavailable => e
      @rules.refund_failed(@route, @subject, e)
    end

    # Whether the route gives back what the check took for this status (refund_on).
    def refunds?(status) = @rules.refunds?(@route, status)

    # The handler (a Rack triple), with the limit's headers on its response; a status the
    # route refunds, or an exception where it refunds a 500, gives back what the check took.
    def run
      status, headers, body = yield
      give_back if refunds?(status)
      [status, headers.merge(@decision.headers), body]
    rescue StandardError
      give_back if refunds?(500)
      raise
    end
  end

  def self.reply(decision)
    data = JSON.generate(decision.body)
    [decision.status, { "Content-Type" => "application/json", "Content-Length" => data.bytesize.to_s }.merge(decision.headers), [data]]
  end
end
