# frozen_string_literal: true

require "digest"
require "ipaddr"
require "logger"
require "uri"

module RatelimitWeb
  # What a request comes to: :admit (run the handler, add `headers`; a status the route
  # refunds gives back what the check took), :fallback (run it, admitted by a local bucket),
  # or :answer (reply `status` with the JSON `body` and `headers`, without running it).
  SQLITE_SUFFIXES = %w[.db .sqlite .sqlite3 .db3].freeze

  # What a --db names, never guessed: ["postgres", the connection string] for a URL
  # (postgresql://, postgres://) or a libpq string (dbname=app host=...); ["sqlite", the
  # path] for sqlite:PATH (sqlite:///abs/path), a file that exists, or a name ending in .db,
  # .sqlite, .sqlite3 or .db3. Anything else (`app`) raises ArgumentError saying both forms,
  # rather than opening a new SQLite file.
  def self.database_of(text, is_file: ->(path) { File.file?(path) })
    t = text.to_s.strip
    return ["postgres", t] if t.start_with?("postgres://", "postgresql://") || t.include?("=")

    if t.start_with?("sqlite:")
      path = t.delete_prefix("sqlite:")
      path = path[2..] if path.start_with?("//")
      return ["sqlite", path] unless path.empty?
    elsif !t.empty? && (is_file.call(t) || t.downcase.end_with?(*SQLITE_SUFFIXES))
      return ["sqlite", t]
    end
    raise ArgumentError, "#{t.inspect} names no database: a PostgreSQL one is postgresql://HOST/NAME or dbname=NAME, " \
                         "a SQLite one an existing file, a name ending in .db, .sqlite or .sqlite3, or sqlite:PATH"
  end

  Decision = Struct.new(:kind, :status, :body, :headers) do
    def self.reply(status, body, headers = {}) = new(:answer, status, body, headers)
  end

  # An identifier longer than this, in UTF-8 bytes, is kept as its SHA-256 instead.
  IDENTIFIER_MAX_BYTES = 256

  # The pure rules, the same as the Python and Node packages' (integrations/spec/cases.json
  # holds the cases all three run).
  module_function

  # An IP address as a server or a proxy writes it, or nil: IPv4, IPv6 in any spelling,
  # bracketed and with a port, IPv4 with a port, with a zone id; IPv4-mapped IPv6 is IPv4.
  def parse_address(text)
    return nil if text.nil? || text.empty?

    t = text.strip.delete('"')
    if t.start_with?("[")
      close = t.index("]") or return nil
      t = t[1...close]
    elsif t.count(":") == 1
      t = t.split(":", 2).first
    end
    t = t.split("%", 2).first
    ip = IPAddr.new(t)
    return nil unless ip.to_range.first == ip.to_range.last # an address, not a network

    ip.ipv6? && ip.ipv4_mapped? ? ip.native : ip
  rescue IPAddr::Error, ArgumentError
    nil
  end

  # What an address counts as: IPv4 itself, IPv6 its /ipv6_prefix (/56), one spelling.
  def address_subject(ip, ipv6_prefix = 56)
    return ip.to_s if ip.ipv4? || ipv6_prefix >= 128

    "#{ip.mask(ipv6_prefix)}/#{ipv6_prefix}"
  end

  def networks(addresses)
    addresses.map do |a|
      net = IPAddr.new(a.strip)
      net.ipv6? && net.ipv4_mapped? ? IPAddr.new("#{net.native}/#{[net.prefix - 96, 0].max}") : net
    end
  end

  def trusted?(ip, networks) = !ip.nil? && networks.any? { |n| n.family == ip.family && n.include?(ip) }

  # The client's address: the peer's, or, when the peer is a trusted proxy, the
  # X-Forwarded-For hop that proxy appended, and so on leftwards while each hop is itself
  # trusted. A hop left of the first untrusted one was the client's to write: never read.
  def client_address(peer, forwarded, trusted, ipv6_prefix = 56)
    ip = parse_address(peer)
    return bounded(peer.nil? || peer.empty? ? "unknown" : peer) if ip.nil?
    return address_subject(ip, ipv6_prefix) unless trusted?(ip, trusted)

    hops = Array(forwarded).flat_map { |v| v.split(",") }.map(&:strip).reject(&:empty?)
    hops.reverse_each do |hop|
      hop_ip = parse_address(hop)
      return bounded(hop) if hop_ip.nil? # written by the trusted proxy on its right, but no address

      ip = hop_ip
      break unless trusted?(ip, trusted)
    end
    address_subject(ip, ipv6_prefix)
  end

  # The path as a router dispatches it: percent-decoded once, repeated slashes merged, `.`
  # and `..` resolved, no trailing slash; lower case where the router ignores case; a format
  # suffix (/login.json) dropped where the router reads one (Rails).
  def normalize_path(path, case_insensitive: false, formats: false)
    segments = []
    URI.decode_www_form_component((path.nil? || path.empty? ? "/" : path).gsub("+", "%2B")).split("/").each do |segment|
      next if segment.empty? || segment == "."

      if segment == ".."
        segments.pop
        next
      end
      segments << segment
    end
    if formats && !segments.empty?
      stem, dot, extension = segments.last.rpartition(".")
      segments[-1] = stem if !dot.empty? && !stem.empty? && extension.match?(/\A[[:alnum:]]+\z/)
    end
    normalized = "/#{segments.join('/')}"
    case_insensitive ? normalized.downcase : normalized
  end

  # Text of at most IDENTIFIER_MAX_BYTES bytes as it is; longer, "sha256:" and its hash.
  def bounded(text)
    return text if text.bytesize <= IDENTIFIER_MAX_BYTES

    "sha256:#{Digest::SHA256.hexdigest(text)}"
  end

  # An identifier: Unicode NFKC, case-folded where identifiers are case-insensitive,
  # bounded; nil when empty (the address decides then).
  def normalize_identifier(value, case_insensitive: false)
    return nil if value.nil?

    text = value.to_s.dup.force_encoding(Encoding::UTF_8).unicode_normalize(:nfkc)
    text = text.downcase(:fold) if case_insensitive
    text.empty? ? nil : bounded(text)
  end

  # refund_on as a callable of the status: nil (never), status classes and codes (["5xx"],
  # [503, "4xx"]) or a callable.
  def refund_rule(refund_on)
    return nil if refund_on.nil?
    return refund_on if refund_on.respond_to?(:call)

    classes = Array(refund_on).map do |item|
      text = item.to_s.downcase
      raise ArgumentError, "refund_on: #{item.inspect} is no status class (\"5xx\") or code (503)" unless text.match?(/\A[1-5](xx|\d\d)\z/)

      text
    end
    ->(status) { classes.include?(status.to_s) || classes.include?("#{status.to_s[0]}xx") }
  end

  # The rules the Rack middleware and the Rails helper follow, the same as the Python and
  # Node packages': route matching, the subject, the decision, the refused-identifier
  # cache, load shedding, and the fallback when the database does not answer. `routes`:
  # {"/login" => Route, "POST /api/*" => Route} (a path or glob, optionally after a method;
  # the first match applies; a GET route covers HEAD).
  class Rules
    attr_reader :counters, :skip, :identify, :tier

    def initialize(routes, identify: nil, tier: nil, skip: ["/health", "/ready"], trusted_proxies: [], ipv6_prefix: 56,
                   fallback_share: 0.5, unavailable_retry_after: 5, log_interval: 60.0, refusal_cache: 0,
                   checks_per_subject: 8, max_in_flight: nil, shed_retry_after: 1, refund_on: nil,
                   case_insensitive_paths: false, path_formats: true, case_insensitive_identifiers: false,
                   policies: {}, counters: nil, logger: nil, metrics: nil)
      @case_insensitive_paths, @path_formats = case_insensitive_paths, path_formats
      @case_insensitive_identifiers = case_insensitive_identifiers
      raise ArgumentError, "ipv6_prefix must be 0 to 128, got #{ipv6_prefix.inspect}" unless (0..128).cover?(ipv6_prefix)

      @ipv6_prefix = ipv6_prefix
      @policies = policies
      @routes = routes.map do |pattern, route|
        method, _, path = pattern.rpartition(" ")
        route.name ||= pattern
        [method.empty? ? nil : method.upcase, normalize(path), route]
      end
      @identify, @tier, @skip = identify, tier, skip.to_set
      @trusted = RatelimitWeb.networks(trusted_proxies)
      @default_refunds = RatelimitWeb.refund_rule(refund_on)
      @fallback_share, @unavailable_retry_after, @log_interval = fallback_share, unavailable_retry_after, log_interval
      @refusals = refusal_cache.positive? ? RefusalCache.new(refusal_cache) : nil
      @checks_per_subject = refusal_cache.positive? ? checks_per_subject : nil
      @checking = Hash.new(0)
      @max_in_flight, @shed_retry_after, @in_flight, @receiving = max_in_flight, shed_retry_after, 0, 0
      @counters = counters || Counters.new
      @metrics = metrics
      @log = logger || Logger.new($stderr)
      @lock = Mutex.new
      @local_buckets, @learned, @policy_logged_at = {}, {}, {}
      @outage_since, @logged_at = nil, -Float::INFINITY
    end

    def normalize(path) = RatelimitWeb.normalize_path(path, case_insensitive: @case_insensitive_paths, formats: @path_formats)

    def skipped?(path) = @skip.include?(path) || @skip.include?(normalize(path))

    def match(method, path)
      return nil if skipped?(path)

      path, method = normalize(path), method.to_s.upcase
      @routes.each do |want, pattern, route|
        next unless want.nil? || want == method || (want == "GET" && method == "HEAD")
        return route if File.fnmatch(pattern, path, File::FNM_DOTMATCH | File::FNM_PATHNAME) ||
                        File.fnmatch(pattern, path, File::FNM_DOTMATCH)
      end
      nil
    end

    # Counts what a request came to (a field of Counters), and tells the metrics.
    def note(outcome, route = nil)
      @lock.synchronize { @counters[outcome] += 1 }
      @metrics&.count(route&.name, outcome.to_s, route&.policy)
    end

    # A request (not on a skip path) begins: nil, or the 503 that sheds it. Every request
    # let in must `leave` once done; one whose body is still `receiving` counts from
    # `received` on.
    def enter(method, path, receiving: false)
      admitted = @lock.synchronize do
        next false if @max_in_flight && @in_flight >= @max_in_flight

        receiving ? @receiving += 1 : @in_flight += 1
        true
      end
      return nil if admitted

      note(:shed)
      Decision.reply(503, { "detail" => "Service Overloaded", "retry_after" => @shed_retry_after },
                     { "Retry-After" => @shed_retry_after.to_s })
    end

    def received = @lock.synchronize { @receiving -= 1; @in_flight += 1 }

    def leave(receiving: false) = @lock.synchronize { receiving ? @receiving -= 1 : @in_flight -= 1 }

    # `identify`'s answer, else the signed-in user, else the client address; an empty
    # identifier is none.
    def subject(identified, user, peer, forwarded)
      identified = RatelimitWeb.normalize_identifier(identified, case_insensitive: @case_insensitive_identifiers)
      return identified if identified

      user = RatelimitWeb.normalize_identifier(user, case_insensitive: @case_insensitive_identifiers)
      return "user:#{user}" if user

      "ip:#{RatelimitWeb.client_address(peer, forwarded, @trusted, @ipv6_prefix)}"
    end

    def cost(route, request) = (route.cost.respond_to?(:call) ? route.cost.call(request) : route.cost).to_f

    # Whether an admitted request whose response has `status` gets its cost back.
    def refunds?(route, status)
      rule = route.refunds || (route.sensitive ? nil : @default_refunds)
      !rule.nil? && rule.call(status.to_i) ? true : false
    end

    def missing(route) = "route #{route.name.inspect}: there is no policy named #{route.policy.inspect} in the database"

    # At startup: sets the `policies` given (name => definition), then says what is wrong
    # with a route (limits the engine refuses, naming the route and
    # the field; a policy that does not exist), or nil. The engine's reading of explicit
    # limits is kept. A database that does not answer is logged and let be.
    def check_routes(limiter)
      @policies.each { |name, definition| limiter.set_policy(name.to_s, definition) }
      @routes.each do |_, _, route|
        next if route.per_request? # limits per request: the engine checks each call's

        if route.limits
          problem, limits = limiter.validate_limits(route.definition)
          return "route #{route.name.inspect}: #{problem}" if problem

          route.canonical!(limits)
        elsif !limiter.policy_exists?(route.policy)
          return missing(route)
        end
      end
      nil
    rescue DatabaseUnavailable => e
      @log.warn("ratelimit_web: could not check the routes at startup (#{e.message}); " \
                "the fallback serves until the database answers")
      nil
    end

    # A refusal's place in the refused-identifier cache: the limits are part of it, so a
    # request whose limits differ (a customer's new plan, another billing period) is not
    # answered with a refusal under the old ones.
    def refusal_key(route, tier, subject) = [route.name, route.limits, tier, subject]

    # The whole check: the cache and the subject's waiting checks, then the block (the
    # limiter's call), then what it answered or raised comes to.
    def decide(route, subject, tier, cost)
      cached = @refusals&.get(refusal_key(route, tier, subject))
      if cached
        note(:refused_locally, route)
        return Decision.reply(*cached)
      end
      slot = [route.name, tier, subject]
      if @checks_per_subject
        surplus = @lock.synchronize do
          next true if @checking[slot] >= @checks_per_subject

          @checking[slot] += 1
          false
        end
        if surplus
          note(:refused_locally, route)
          return Decision.reply(429, { "detail" => "Too Many Requests", "retry_after" => 1 }, { "Retry-After" => "1" })
        end
      end
      begin
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        answer = yield
        @metrics&.observe(route.name, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
      rescue DatabaseUnavailable => e
        note(:database_errors, route)
        return unavailable(route, subject, tier, cost, e)
      rescue StandardError => e
        raise unless route.policy && RatelimitWeb.missing_policy?(e)

        return policy_missing(route, e)
      ensure
        @lock.synchronize { (@checking[slot] -= 1).zero? && @checking.delete(slot) } if @checks_per_subject
      end
      answered(route, subject, tier, answer)
    end

    def refund_failed(route, subject, error)
      @log.warn("ratelimit_web: could not refund #{route.name} for #{subject}: #{error.message}")
    end

    def charge_failed(route, subject, error)
      @log.warn("ratelimit_web: could not charge #{route.name} for #{subject}: #{error.message}")
    end

    private

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
        note(:admitted, route)
        return Decision.new(:admit, 200, nil, answer.headers)
      end
      note(:refused, route)
      @metrics&.refuse(route.name, route.policy, subject)
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
        @refusals.put(refusal_key(route, tier, subject), 429, body, h, wait_ms / 1000.0)
      end
      Decision.reply(too_large ? 413 : 429, body, h)
    end

    def policy_missing(route, error)
      note(:missing_policies, route)
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
        @log.warn("ratelimit_web: the database could not be reached (#{error.message}): sensitive routes answer 503, " \
                  "the others use local buckets at #{@fallback_share} of their limit")
      end
      limit = route.sensitive ? nil : (@lock.synchronize { @learned[[route.name, tier]] } || route.first_bucket(tier))
      unless limit
        note(:fallback_refused, route)
        return Decision.reply(503, { "detail" => "Service Unavailable", "retry_after" => @unavailable_retry_after },
                              { "Retry-After" => @unavailable_retry_after.to_s })
      end
      bucket = @lock.synchronize do
        @local_buckets[[route.name, tier]] ||= LocalBucket.new(limit[0] * @fallback_share, limit[1] * @fallback_share)
      end
      wait = bucket.take(subject, cost)
      if wait.zero?
        note(:fallback_admitted, route)
        return Decision.new(:fallback, 200, nil, {})
      end
      note(:fallback_refused, route)
      retry_after = wait.infinite? ? nil : [1, wait.ceil].max
      Decision.reply(429, { "detail" => "Too Many Requests", "limit" => bucket.burst.to_i, "remaining" => 0,
                            "reset" => retry_after || 0, "retry_after" => retry_after },
                     retry_after ? { "Retry-After" => retry_after.to_s } : {})
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
