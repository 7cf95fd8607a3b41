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

      env[LIMITS] = check # for RatelimitWeb.charge(request, cost) in the handler
      return @app.call(env) if decision.kind == :fallback

      check.run { @app.call(env) }
    end
  end

  # Where the middleware and the controller helper leave an admitted request's Check, in
  # its Rack env: RatelimitWeb.charge and RatelimitWeb.refund find it there.
  LIMITS = "ratelimit_web.limits"

  # One request's check and what follows it, for the Rack middleware and the Rails helper.
  class Check
    # The headers the response gets: the check's, or the state after a charge.
    attr_reader :headers

    def initialize(rules, limiter, route, request, user:, peer:, forwarded:)
      route = route.for_request(request)
      @rules, @limiter, @route = rules, limiter, route
      identified = route.identify&.call(request) # the route's own first, then the middleware's
      identified = rules.identify&.call(request) if identified.nil? || identified.to_s.empty?
      @subject = rules.subject(identified, user, peer, forwarded)
      @tier = rules.tier&.call(request)
      @cost = rules.cost(route, request)
    end

    def decide
      @decision = @rules.decide(@route, @subject, @tier, @cost) { @limiter.check(@route, @subject, @tier, @cost) }
      @headers = @decision.headers.dup
      @decision
    end

    # Charges `cost`, known after the work, to the route's limits whatever they hold
    # (rl_charge_check / rl_charge_all: a bucket into debt, a budget past its quota); the
    # response carries the headers after it. The Answer, or nil when the database did not
    # answer (logged).
    def charge(cost)
      answer = @limiter.charge(@route, @subject, @tier, RatelimitWeb.amount("charge", cost))
      @headers = answer.headers.dup
      answer
    rescue DatabaseUnavailable => e
      @rules.charge_failed(@route, @subject, e)
      nil
    end

    # Gives `cost` back to the route's limits (rl_refund_check / rl_refund_all); the headers
    # stay as they were.
    def refund(cost)
      @limiter.refund(@route, @subject, @tier, RatelimitWeb.amount("refund", cost))
      nil
    rescue DatabaseUnavailable => e
      @rules.refund_failed(@route, @subject, e)
      nil
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
      [status, headers.merge(@headers), body]
    rescue StandardError
      give_back if refunds?(500)
      raise
    end
  end

  # `cost` as a Float, or an ArgumentError naming the call and the argument.
  def self.amount(call, cost)
    unless cost.is_a?(Numeric) && cost.real? && cost.to_f.finite? && cost.positive?
      raise ArgumentError, "RatelimitWeb.#{call}: cost must be a finite number greater than 0, got #{cost.inspect}"
    end

    cost.to_f
  end

  def self.limits_of(request)
    env = request.respond_to?(:env) ? request.env : request
    check = env.is_a?(Hash) ? env[LIMITS] : nil
    return check if check

    raise ArgumentError, "RatelimitWeb: this request was not admitted by a rate-limited route (charge and refund " \
                         "work in the handler of a route the middleware or rate_limit_by limits)"
  end

  # Charges `cost` (a finite number above 0), known after the work, to the limits of the
  # route that admitted `request` (a Rack::Request, an ActionDispatch::Request or a Rack
  # env), whatever they hold, and puts the state after the charge in the response's
  # headers. Returns the engine's Answer, or nil when the database did not answer.
  def self.charge(request, cost) = limits_of(request).charge(cost)

  # Gives `cost` back to the limits of the route that admitted `request` (what an estimate
  # took too much).
  def self.refund(request, cost) = limits_of(request).refund(cost)

  def self.reply(decision)
    data = JSON.generate(decision.body)
    [decision.status, { "Content-Type" => "application/json", "Content-Length" => data.bytesize.to_s }.merge(decision.headers), [data]]
  end
end
