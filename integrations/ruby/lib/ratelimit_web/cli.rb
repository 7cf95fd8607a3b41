# frozen_string_literal: true

require "json"
require "optparse"

module RatelimitWeb
  # `ratelimit-web`: policies and blocks from the command line, over a database URL
  # (PostgreSQL: postgresql://... or a libpq string such as dbname=app) or a SQLite file,
  # the same commands as the Python and Node packages' tool:
  #
  #   ratelimit-web --db app.db policy set login '{"limits": [{"burst": 5, "refill_per_minute": 5}]}'
  #   ratelimit-web --db app.db policy list | policy drop login
  #   ratelimit-web --db app.db block ip:203.0.113.9 --seconds 3600 | blocks | unblock ip:203.0.113.9
  #
  # --db defaults to RATELIMIT_DATABASE. An error of the engine is printed as it says it,
  # with exit status 1.
  module CLI
    USAGE = "usage: ratelimit-web [--db DB] policy set NAME JSON | policy list | policy drop NAME | " \
            "block SUBJECT [--seconds N] | unblock SUBJECT | blocks"

    # One connection: rows(sql, params) with $n placeholders on both engines.
    class Database
      def initialize(text)
        kind, db = RatelimitWeb.database_of(text)
        if kind == "postgres"
          require "pg"
          @pg = PG.connect(db)
        else
          require "sqlite3"
          @sqlite = SQLite3::Database.new(db)
          @sqlite.busy_timeout = 5000
          RatelimitWeb.load_sqlite_extension(@sqlite, RatelimitWeb.extension_path)
        end
      end

      def rows(sql, params = [])
        return @pg.exec_params(sql, params.map { |v| v&.to_s }).values if @pg

        @sqlite.execute(sql.gsub(/\$\d+/, "?"), params)
      end

      def value(sql, params = [])
        value = rows(sql, params).dig(0, 0)
        value.is_a?(String) && value.start_with?("{", "[") ? JSON.parse(value) : value
      end

      def truthy?(value) = [true, 1, "t", "true"].include?(value)
    end

    # What a terminal must never be sent raw: controls (C0, DEL, C1, which move the cursor,
    # clear the screen, set the title or write the clipboard), format characters
    # (bidirectional overrides, zero-width ones), line and paragraph separators, and code
    # points that are unassigned or private.
    HIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Co}\p{Cn}]/

    # `text` safe to write to a terminal: every character a terminal would act on, or that
    # hides or reorders what follows, written as its \uXXXX escape (JSON's own, so a JSON
    # line stays JSON); bytes that are not UTF-8 as U+FFFD.
    def self.visible(text)
      text.to_s.dup.force_encoding(Encoding::UTF_8).scrub.gsub(HIDDEN) do |ch|
        ch.encode(Encoding::UTF_16BE).unpack("n*").map { |u| format("\\u%04x", u) }.join
      end
    end

    # An output stream that writes every line through `visible`.
    class Visible
      def initialize(io) = @io = io
      def puts(line) = @io.puts(CLI.visible(line))
    end

    def self.run(argv, out: $stdout, err: $stderr)
      out, err = Visible.new(out), Visible.new(err)
      db, seconds = ENV.fetch("RATELIMIT_DATABASE", nil), nil
      args = OptionParser.new do |o|
        o.on("--db DB") { |v| db = v }
        o.on("--seconds N", Float) { |v| seconds = v }
      end.parse(argv)
      return usage(err, "give --db (or set RATELIMIT_DATABASE)") unless db

      conn = nil
      command = args.shift(args.first == "policy" ? 2 : 1)
      case [command, args.size]
      in [["policy", "set"], 2]
        out.puts JSON.generate(Database.new(db).value("SELECT rl_policy_set($1, $2)", args))
      in [["policy", "list"], 0]
        Database.new(db).rows("SELECT name, definition FROM rl_policies ORDER BY name").each do |name, definition|
          out.puts JSON.generate("name" => name, "definition" => definition.is_a?(String) ? JSON.parse(definition) : definition)
        end
      in [["policy", "drop"], 1]
        conn = Database.new(db)
        out.puts(conn.truthy?(conn.value("SELECT rl_policy_drop($1)", args)) ? "dropped #{args[0]}" : "there was no policy named #{args[0]}")
      in [["block"], 1]
        out.puts JSON.generate(Database.new(db).value("SELECT rl_block($1, $2)", [args[0], seconds]))
      in [["unblock"], 1]
        conn = Database.new(db)
        out.puts(conn.truthy?(conn.value("SELECT rl_unblock($1)", args)) ? "unblocked #{args[0]}" : "#{args[0]} was not blocked")
      in [["blocks"], 0]
        Database.new(db).rows("SELECT subject, strikes, blocked_until_ms FROM rl_blocks ORDER BY subject").each do |subject, strikes, until_ms|
          out.puts JSON.generate("subject" => subject, "strikes" => strikes.to_i, "blocked_until_ms" => until_ms&.to_i)
        end
      else
        return usage(err)
      end
      0
    rescue OptionParser::ParseError => e
      usage(err, e.message)
    rescue StandardError => e
      err.puts "ratelimit-web: #{e.message.strip.lines.first&.strip || e.class.name}"
      1
    end

    def self.usage(err, problem = nil)
      err.puts "ratelimit-web: #{problem}" if problem
      err.puts USAGE
      2
    end
  end
end
