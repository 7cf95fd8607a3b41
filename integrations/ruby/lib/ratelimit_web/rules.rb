# frozen_string_literal: true

require "ipaddr"
require "logger"

module RatelimitWeb
  # What a request comes to: :admit (run the handler, add `headers`; a 5xx or an exception
  # gives back what the check took), :fallback (run it, admitted by a local bucket), or
  # :answer (reply `status` with the JSON `body` and `headers`, without running it).
  Decision = Struct.new(:kind, :status, :body, :headers) do
    def self.reply(status, body, headers = {}) = new(:answer, status, body, headers)
  end

  # The rules the Rack middleware and the Rails helper follow, the same as the Python and
  # Node packages': route matching, the subject, the decision, the refused-identifier
  # cache, load shedding, and the fallback when the database does not answer. `routes`:
  # {"/login" => Route, "POST /api/*" => Route} (a path or glob, optionally after a method;
  # the first match applies).
  class Rules
    attr_reader :counters, :skip, :identify, :tier

    def initialize(routes, identify: nil, tier: nil, skip: ["/health", "/ready"], trusted_proxies: [],
                   fallback_share: 0.5, unavailable_retry_after: 5, log_interval: 60.0, refusal_cache: 0,
                   max_in_flight: nil, shed_retry_after: 1, counters: nil, logger: nil)
      @routes = routes.map do |pattern, route|
        method, _, path = pattern.rpartition(" ")
        route.name ||= pattern
        [method.empty? ? nil : method.upcase, path, route]
      end
      @identify, @tier, @skip = identify, tier, skip.to_set
      @trusted = trusted_proxies.map { |a| IPAddr.new(a) }
      @fallback_share, @unavailable_retry_after, @log_interval = fallback_share, unavailable_retry_after, log_interval
      @refusals = refusal_cache.positive? ? RefusalCache.new(refusal_cache) : nil
      @max_in_flight, @shed_retry_after, @in_flight = max_in_flight, shed_retry_after, 0
      @counters = counters || Counters.new
      @log = logger || Logger.new($stderr)
      @lock = Mutex.new
      @local_buckets, @learned, @policy_logged_at = {}, {}, {}
      @outage_since, @logged_at = nil, -Float::INFINITY
    end

    def match(method, path)
      return nil if @skip.include?(path)

      @routes.each do |want, pattern, route|
        return route if (want.nil? || want == method) && File.fnmatch(pattern, path, File::FNM_DOTMATCH)
      end
      nil
    end

    def note(outcome)
      @lock.synchronize { @counters[outcome] += 1 }
    end

    # A request (not on a skip path) begins: nil, or the 503 that sheds it. Every request
    # let in must `leave` once done.
    def enter(method, path)
      admitted = @lock.synchronize do
        next false if @max_in_flight && @in_flight >= @max_in_flight

        @in_flight += 1
        true
      end
      return nil if admitted

      note(:shed)
      Decision.reply(503, { "detail" => "Service Overloaded", "retry_after" => @shed_retry_after },
                     { "Retry-After" => @shed_retry_after.to_s })
    end

    def leave = @lock.synchronize { @in_flight -= 1 }

    # `identify`'s answer, else the signed-in user, else the client address (the peer's, or,
    # when the peer is a trusted proxy, the nearest X-Forwarded-For hop that is not one).
    def subject(identified, user, peer, forwarded)
      return identified if identified && !identified.empty?
      return "user:#{user}" if user

      "ip:#{client_address(peer, forwarded)}"
    end

    def client_address(peer, forwarded)
      peer ||= "unknown"
      return peer unless trusted?(peer)

      hops = Array(forwarded).flat_map { |v| v.split(",") }.map(&:strip).reject(&:empty?)
      hops.reverse_each { |a| return a unless trusted?(a) }
      hops.first || peer
    end

    def cost(route, request) = (route.cost.respond_to?(:call) ? route.cost.call(request) : route.cost).to_f

    def policy_routes = @routes.map(&:last).select(&:policy)

    def missing(route) = "route #{route.name.inspect}: there is no policy named #{route.policy.inspect} in the database"

    # At startup: what is wrong (a route's policy is missing), or nil; a database that does
    # not answer is logged and let be (the fallback serves).
    def check_policies(limiter)
      policy_routes.each { |route| return missing(route) unless limiter.policy_exists?(route.policy) }
      nil
    rescue DatabaseUnavailable => e
      @log.warn("ratelimit_web: could not check the routes' policies at startup (#{e.message}); " \
                "the fallback serves until the database answers")
      nil
    end

    # The whole check: the cache, then the block (the limiter's call), then what it answered
    # or raised comes to.
    def decide(route, subject, tier, cost)
      cached = @refusals&.get([route.name, tier, subject])
      if cached
        note(:refused_locally)
        return Decision.reply(*cached)
      end
      begin
        answer = yield
      rescue DatabaseUnavailable => e
        note(:database_errors)
        return unavailable(route, subject, tier, cost, e)
      rescue StandardError => e
        raise unless route.policy && RatelimitWeb.missing_policy?(e)

        return policy_missing(route, e)
      end
      answered(route, subject, tier, answer)
    end

    def refund_failed(route, subject, error)
      @log.warn("ratelimit_web: could not refund #{route.name} for #{subject}: #{error.message}")
    end

    private

    def trusted?(address)
      ip = IPAddr.new(address)
      @trusted.any? { |net| net.include?(ip) }
    rescue IPAddr::Error
      false
    end

    def answered(route, subject, tier, answer)
      @lock.synchronize do
        @counters.checks += 1
        if @outage_since
          @log.warn(format("ratelimit_web: the database answers again after %.1f s", now - @outage_since))
          @outage_since = nil
        end
      end
      learn(route, tier, answer)
      if answer.admitted?
        note(:admitted)
        return Decision.new(:admit, 200, nil, answer.headers)
      end
      note(:refused)
      refusal(route, subject, tier, answer)
    end

    # 429 with the headers (kept in the refused-identifier cache until the wait ends); 413
    # for a cost above a limit, which no wait admits.
    def refusal(route, subject, tier, answer)
      h, r = answer.headers, answer.result
      too_large = r["exceeds_limit"] || (r["items"] || []).any? { |i| i["exceeds_limit"] }
      detail = if r["blocked"] then "Blocked" elsif too_large then "Cost Above Limit" else "Too Many Requests" end
      body = { "detail" => detail, "limit" => h.fetch("X-RateLimit-Limit", 0).to_i,
               "remaining" => h.fetch("X-RateLimit-Remaining", 0).to_i, "reset" => h.fetch("X-RateLimit-Reset", 0).to_i,
               "retry_after" => h["Retry-After"]&.to_i }
      wait_ms = r["retry_after_ms"]
      if @refusals && !too_large && wait_ms.is_a?(Numeric) && wait_ms.positive?
        @refusals.put([route.name, tier, subject], 429, body, h, wait_ms / 1000.0)
      end
      Decision.reply(too_large ? 413 : 429, body, h)
    end

    def policy_missing(route, error)
      note(:missing_policies)
      log_now = @lock.synchronize do
        next false if now - @policy_logged_at.fetch(route.name, -Float::INFINITY) < @log_interval

        @policy_logged_at[route.name] = now
      end
      @log.error("ratelimit_web: #{missing(route)} (#{error.message.strip})") if log_now
      Decision.reply(500, { "detail" => "Rate Limit Policy Missing", "route" => route.name, "policy" => route.policy })
    end

    # A policy's first bucket, as its answers report it, for the fallback.
    def learn(route, tier, answer)
      return unless route.policy

      item = (answer.result["items"] || []).find { |i| i["refill_seconds"].to_f.positive? }
      @lock.synchronize { @learned[[route.name, tier]] = [item["limit"], item["limit"] * 60.0 / item["refill_seconds"]] } if item
    end

    # The database did not answer: sensitive routes (and routes whose limit is not known
    # here) answer 503; the others take from a local bucket.
    def unavailable(route, subject, tier, cost, error)
      log_now = @lock.synchronize do
        @outage_since ||= now
        next false if now - @logged_at < @log_interval

        @logged_at = now
      end
      if log_now
        @log.warn("ratelimit_web: the database did not answer (#{error.message}): sensitive routes answer 503, " \
                  "the others use local buckets at #{@fallback_share} of their limit")
      end
      limit = route.sensitive ? nil : (@lock.synchronize { @learned[[route.name, tier]] } || route.first_bucket(tier))
      unless limit
        note(:fallback_refused)
        return Decision.reply(503, { "detail" => "Service Unavailable", "retry_after" => @unavailable_retry_after },
                              { "Retry-After" => @unavailable_retry_after.to_s })
      end
      bucket = @lock.synchronize do
        @local_buckets[[route.name, tier]] ||= LocalBucket.new(limit[0] * @fallback_share, limit[1] * @fallback_share)
      end
      wait = bucket.take(subject, cost)
      if wait.zero?
        note(:fallback_admitted)
        return Decision.new(:fallback, 200, nil, {})
      end
      note(:fallback_refused)
      retry_after = wait.infinite? ? nil : [1, wait.ceil].max
      Decision.reply(429, { "detail" => "Too Many Requests", "limit" => bucket.burst.to_i, "remaining" => 0,
                            "reset" => retry_after || 0, "retry_after" => retry_after },
                     retry_after ? { "Retry-After" => retry_after.to_s } : {})
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
