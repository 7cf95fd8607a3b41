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

  def self.missing_policy?(error) = error.message.include?("there is no policy named")

  # The key of a route's explicit limit `index` for `subject`: rl_key('web', route, subject,
  # index), the same as the Python and Node packages'.
  def self.limit_key(route_name, subject, index) = JSON.generate(["web", route_name, subject, index.to_s])

  # The SQL texts, written once with the engine's placeholders ($n or ?), and the
  # statement of each kind of call.
  class Statements
    def initialize(&placeholder)
      @p = placeholder
      p = ->(n) { @p.call(n) }
      # MATERIALIZED: the limit is taken once, then its headers are read
      @check = "WITH c(r) AS MATERIALIZED (SELECT rl_check(#{p[1]}, #{p[2]}, #{p[3]}, #{p[4]})) SELECT r, rl_headers(r) FROM c"
      @take_all = "WITH c(r) AS MATERIALIZED (SELECT rl_take_all(#{p[1]})) SELECT r, rl_headers(r) FROM c"
      @refund_check = "SELECT rl_refund_check(#{p[1]}, #{p[2]}, #{p[3]}, #{p[4]})"
    end

    def for_check(route, subject, tier, cost)
      return [@check, [route.policy, subject, cost, tier]] if route.policy

      [@take_all, [JSON.generate(items(route, subject, tier, cost))]]
    end

    # Gives back what an admitted check took: rl_refund_check, or rl_refund and rl_refund_budget.
    def for_refund(route, subject, tier, cost)
      return [@refund_check, [route.policy, subject, cost, tier]] if route.policy

      calls, params = [], []
      param = ->(value) { params << value; @p.call(params.size) }
      items(route, subject, tier, cost).each do |item|
        calls << if item.key?("period")
                   "rl_refund_budget(#{param[item['key']]}, #{param[item['period']]}, #{param[item['cost']]})"
                 else
                   "rl_refund(#{param[item['key']]}, #{param[item['burst']]}, #{param[item['refill_per_minute']]}, #{param[item['cost']]})"
                 end
      end
      ["SELECT #{calls.join(', ')}", params]
    end

    # rl_refund_check for a subject of no one's finds nothing to give back: it changes
    # nothing, and fails only for a missing policy.
    def for_probe(policy) = [@refund_check, [policy, PROBE_SUBJECT, 1, nil]]

    private

    def items(route, subject, tier, cost)
      m = route.multiplier(tier)
      route.limits.each_with_index.map do |limit, i|
        item = { "key" => RatelimitWeb.limit_key(route.name, subject, i), "cost" => cost }
        if limit.key?("period")
          item.merge("period" => limit["period"], "quota" => limit["quota"] * m)
        else
          item.merge("burst" => limit["burst"] * m, "refill_per_minute" => limit["refill_per_minute"] * m)
        end
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
  # on its first check, in autocommit; `timeout` (seconds) bounds connecting and each
  # statement.
  class PostgresLimiter < Limiter
    def initialize(conninfo = "", timeout: 0.05)
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

  # SQLite through the sqlite3 gem with the loadable extension: a connection per thread,
  # WAL; a writer waits for SQLite's lock up to busy_timeout seconds, then falls back.
  class SqliteLimiter < Limiter
    def initialize(path, extension:, busy_timeout: 0.05)
      require "sqlite3"
      @path, @extension, @busy_timeout = path, extension, busy_timeout
      @key = :"ratelimit_web_sqlite_#{object_id}"
      connect.close # a wrong path or extension fails here, named
    end

    def statements = @statements ||= Statements.new { "?" }

    def first_row(sql, params)
      conn = (Thread.current[@key] ||= connect)
      conn.execute(sql, params).first
    rescue SQLite3::BusyException, SQLite3::LockedException, SQLite3::CantOpenException => e
      raise DatabaseUnavailable, "#{@path}: #{e.message}"
    end

    private

    def connect
      db = SQLite3::Database.new(@path)
      RatelimitWeb.load_sqlite_extension(db, @extension)
      db.busy_timeout = (@busy_timeout * 1000).to_i
      db.execute("PRAGMA journal_mode=wal")
      db
    rescue SQLite3::Exception => e
      raise SQLite3::CantOpenException, "#{@path}: #{e.message} (the database file, its folder or the extension #{@extension})"
    end
  end

  def self.load_sqlite_extension(db, extension)
    db.enable_load_extension(true)
    db.load_extension(extension)
  ensure
    db.enable_load_extension(false)
  end
end
