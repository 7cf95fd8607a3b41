# frozen_string_literal: true

require "json"

module RatelimitWeb
  # The database did not answer: connection refused or lost, locked, timed out.
  class DatabaseUnavailable < StandardError; end

  # What the database answered for one check: the rl_check / rl_take_all result and the
  # HTTP headers rl_headers made of it.
  Answer = Struct.new(:result, :headers) do
    def admitted? = result["admitted"] == true
  end

  # The subject of the startup check: never a request's (those are "user:..." or "ip:...").
  PROBE_SUBJECT = "ratelimit_web:startup-check"

  # A check of a policy that does not exist fails with this SQLSTATE on PostgreSQL
  # (undefined_object) and, on SQLite, which has none, with a message that starts with one
  # of these (the function's name, then the stable text).
  UNKNOWN_POLICY_SQLSTATE = "42704"
  UNKNOWN_POLICY_PREFIXES = ["rl_check: there is no policy named ", "rl_refund_check: there is no policy named "].freeze

  # Whether the database refused a check because its policy does not exist, by its code.
  def self.missing_policy?(error)
    if error.respond_to?(:result) && error.result
      return error.result.error_field(PG::Result::PG_DIAG_SQLSTATE) == UNKNOWN_POLICY_SQLSTATE
    end
    defined?(SQLite3::Exception) && error.is_a?(SQLite3::Exception) && error.message.start_with?(*UNKNOWN_POLICY_PREFIXES)
  end

  # The engine's refusal of a route's explicit limits, as the route's own: "limits item 2:
  # burst must be a finite number greater than 0, got 0"; nil for any other error.
  def self.refusal_of(error)
    message = error.message.strip.lines.first.to_s.strip.sub(/\AERROR:\s+/, "")
    prefix = "rl_policy_validate: "
    return nil unless message.include?(prefix)

    message[(message.index(prefix) + prefix.size)..].gsub("definition.limits", "limits")
                                                    .gsub("definition.tiers", "tiers").gsub("definition", "the route")
  end

  # The key of a route's explicit limit `index` for `subject`: rl_key('web', route, subject,
  # index), the same as the Python and Node packages'.
  def self.limit_key(route_name, subject, index) = JSON.generate(["web", route_name, subject, index.to_s])

  # The SQL texts, written once with the engine's placeholders ($n or ?), and the
  # statement of each kind of call.
  class Statements
    def initialize(&placeholder)
      p = placeholder
      # MATERIALIZED: the limit is taken once, then its headers are read
      @check = "WITH c(r) AS MATERIALIZED (SELECT rl_check(#{p[1]}, #{p[2]}, #{p[3]}, #{p[4]})) SELECT r, rl_headers(r) FROM c"
      # rl_check_limits: rl_take_all counted under the route's name, as rl_check counts a
      # policy, so the operator's page, `top` and the exporter show the route too
      @take_all = "WITH c(r) AS MATERIALIZED (SELECT rl_check_limits(#{p[1]}, #{p[2]}, #{p[3]})) SELECT r, rl_headers(r) FROM c"
      @refund_check = "SELECT rl_refund_check(#{p[1]}, #{p[2]}, #{p[3]}, #{p[4]})"
      @refund_all = "SELECT rl_refund_all(#{p[1]})"
      @charge_check = "WITH c(r) AS MATERIALIZED (SELECT rl_charge_check(#{p[1]}, #{p[2]}, #{p[3]}, #{p[4]})) SELECT r, rl_headers(r) FROM c"
      @charge_all = "WITH c(r) AS MATERIALIZED (SELECT rl_charge_all(#{p[1]})) SELECT r, rl_headers(r) FROM c"
      @validate = "SELECT rl_policy_validate(#{p[1]})"
      @policy_set = "SELECT rl_policy_set(#{p[1]}, #{p[2]})"
    end

    def for_policy_set(name, definition) = [@policy_set, [name, JSON.generate(definition)]]

    # The engine's own validation of a route's explicit limits (as a policy definition).
    def for_validation(definition) = [@validate, [JSON.generate(definition)]]

    def for_check(route, subject, tier, cost)
      return [@check, [route.policy, subject, cost, tier]] if route.policy

      [@take_all, [route.name.to_s.empty? ? "unnamed route" : route.name, subject, JSON.generate(items(route, subject, tier, cost))]]
    end

    # Gives back what an admitted check took: rl_refund_check for a policy, rl_refund_all
    # (the inverse of rl_take_all, the same items) for explicit limits.
    def for_refund(route, subject, tier, cost)
      return [@refund_check, [route.policy, subject, cost, tier]] if route.policy

      [@refund_all, [JSON.generate(items(route, subject, tier, cost))]]
    end

    # Charges a cost known after the work, whatever the limits hold (into debt, past a
    # quota): rl_charge_check for a policy, rl_charge_all over the route's items.
    def for_charge(route, subject, tier, cost)
      return [@charge_check, [route.policy, subject, cost, tier]] if route.policy

      [@charge_all, [JSON.generate(items(route, subject, tier, cost))]]
    end

    # rl_refund_check for a subject of no one's finds nothing to give back: it changes
    # nothing, and fails only for a missing policy.
    def for_probe(policy) = [@refund_check, [policy, PROBE_SUBJECT, 1, nil]]

    private

    # The route's limits as rl_take_all items, passed through whatever their kind: each with
    # its key, the cost and the tier's multiplier, which the engine applies as a policy's.
    def items(route, subject, tier, cost)
      m = route.multiplier(tier)
      route.limits.each_with_index.map do |limit, i|
        item = limit.merge("key" => RatelimitWeb.limit_key(route.name, subject, i), "cost" => cost)
        m == 1 ? item : item.merge("multiplier" => m)
      end
    end
  end

  # One statement per check, on the calling thread. Subclasses say how a statement runs
  # (`first_row`) and which errors mean the database did not answer.
  class Limiter
    def check(route, subject, tier, cost)
      row = first_row(*statements.for_check(route, subject, tier, cost))
      Answer.new(decoded(row[0]), decoded(row[1]))
    end

    def refund(route, subject, tier, cost) = first_row(*statements.for_refund(route, subject, tier, cost))

    def charge(route, subject, tier, cost)
      row = first_row(*statements.for_charge(route, subject, tier, cost))
      Answer.new(decoded(row[0]), decoded(row[1]))
    end

    # [nil, the limits as the engine read them], or [what it refuses in them, nil].
    def validate_limits(definition)
      row = first_row(*statements.for_validation(definition))
      [nil, decoded(row[0])["limits"]]
    rescue DatabaseUnavailable
      raise
    rescue StandardError => e
      problem = RatelimitWeb.refusal_of(e)
      raise unless problem

      [problem, nil]
    end

    # Inserts or replaces a policy (rl_policy_set; on PostgreSQL a member of rl_admin).
    def set_policy(name, definition) = decoded(first_row(*statements.for_policy_set(name, definition))[0])

    def policy_exists?(policy)
      first_row(*statements.for_probe(policy))
      true
    rescue DatabaseUnavailable
      raise
    rescue StandardError => e
      return false if RatelimitWeb.missing_policy?(e)

      raise
    end

    private

    def decoded(value) = value.is_a?(String) ? JSON.parse(value) : value
  end

  # PostgreSQL through the pg gem: a connection per thread (puma serves on threads), opened
  # on its first check, in autocommit; `timeout` (0.5 s) bounds connecting and each
  # statement (statement_timeout: the server cancels it, writing nothing, so the fallback
  # never admits beside a take the database is still making).
  class PostgresLimiter < Limiter
    attr_reader :timeout

    def initialize(conninfo = "", timeout: 0.5)
      require "pg"
      @conninfo, @timeout = conninfo, timeout
      @key = :"ratelimit_web_pg_#{object_id}"
    end

    def statements = @statements ||= Statements.new { |n| "$#{n}" }

    def first_row(sql, params)
      conn = connection
      conn.exec_params(sql, params.map { |v| v.nil? ? nil : v.to_s }).values.first
    rescue PG::ConnectionBad, PG::UnableToSend, PG::QueryCanceled, PG::AdminShutdown => e
      forget_connection
      raise DatabaseUnavailable, e.message.strip
    end

    private

    def forget_connection
      Thread.current[@key]&.close
    rescue PG::Error
      nil
    ensure
      Thread.current[@key] = nil
    end

    def connection
      conn = Thread.current[@key]
      return conn if conn && !conn.finished?

      ms = [1, (@timeout * 1000).to_i].max
      conn = PG.connect(@conninfo, connect_timeout: [1, @timeout.ceil].max, options: "-c statement_timeout=#{ms}")
      Thread.current[@key] = conn
    end
  end

  # SQLite through the sqlite3 gem with the loadable extension (the one shipped in the gem
  # for Linux x86_64 unless `extension:` names another): a connection per thread, WAL; a
  # writer waits for SQLite's lock up to `timeout` (1 s), then falls back, having written
  # nothing. The state tables are made when it is built, not by a request.
  class SqliteLimiter < Limiter
    attr_reader :timeout

    def initialize(path, extension: nil, timeout: 1.0, busy_timeout: nil)
      require "sqlite3"
      @path, @extension, @timeout = path, extension || RatelimitWeb.extension_path, busy_timeout || timeout
      @key = :"ratelimit_web_sqlite_#{object_id}"
      first = connect # a wrong path or extension fails here, named
      first.execute("SELECT rl_sweep(0, 1)")
      first.close
    end

    def statements = @statements ||= Statements.new { "?" }

    def first_row(sql, params)
      conn = (Thread.current[@key] ||= connect)
      conn.execute(sql, RatelimitWeb.as_text(params)).first
    rescue SQLite3::BusyException, SQLite3::LockedException, SQLite3::CantOpenException => e
      raise DatabaseUnavailable, "#{@path}: #{e.message}"
    end

    private

    def connect
      db = SQLite3::Database.new(@path)
      RatelimitWeb.load_sqlite_extension(db, @extension)
      db.busy_timeout = (@timeout * 1000).to_i
      db.execute("PRAGMA journal_mode=wal")
      db
    rescue SQLite3::Exception => e
      raise SQLite3::CantOpenException, "#{@path}: #{e.message} (the database file, its folder or the extension #{@extension})"
    end
  end

  # The SQLite extension shipped in the gem (lib/ratelimit_web/native/libratelimit.so, for
  # Linux x86_64), without its suffix as load_extension takes it; RATELIMIT_SQLITE_EXTENSION
  # names another.
  def self.extension_path
    ENV.fetch("RATELIMIT_SQLITE_EXTENSION") do
      bundled = File.expand_path("native/libratelimit", __dir__)
      unless File.exist?("#{bundled}.so")
        raise ArgumentError, "ratelimit_web: this gem carries no SQLite extension for this platform " \
                             "(#{bundled}.so): pass extension: or set RATELIMIT_SQLITE_EXTENSION"
      end
      bundled
    end
  end

  # Strings bound as SQLite text: the sqlite3 gem binds a binary string (what Rack gives
  # for a header, and so for a tier or an identifier read from one) as a blob, which the
  # functions refuse ("tier must be text").
  def self.as_text(params)
    binary = ->(v) { v.is_a?(String) && v.encoding != Encoding::UTF_8 }
    return params unless params.any?(&binary) # the usual check: nothing to copy

    params.map { |v| binary.call(v) ? v.dup.force_encoding(Encoding::UTF_8).scrub : v }
  end

  def self.load_sqlite_extension(db, extension)
    db.enable_load_extension(true)
    db.load_extension(extension)
  ensure
    db.enable_load_extension(false)
  end
end
