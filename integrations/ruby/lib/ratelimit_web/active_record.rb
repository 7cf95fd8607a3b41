# frozen_string_literal: true

module RatelimitWeb
  # Checks on the connection ActiveRecord already has for this thread (PostgreSQL, or SQLite
  # with the loadable extension, the gem's own unless `extension:` names another, loaded into
  # each of its connections): no pool of its own, and inside the request's transaction when
  # there is one.
  class ActiveRecordLimiter < Limiter
    def initialize(base = ::ActiveRecord::Base, extension: nil)
      @base, @extension = base, extension
    end

    def statements
      @statements ||= if postgres?
                        Statements.new { |n| "$#{n}" }
                      else
                        Statements.new { "?" }
                      end
    end

    def first_row(sql, params)
      raw = @base.connection.raw_connection
      if postgres?
        raw.exec_params(sql, params.map { |v| v&.to_s }).values.first
      else
        unless raw.instance_variable_get(:@ratelimit_web_loaded)
          RatelimitWeb.load_sqlite_extension(raw, @extension || RatelimitWeb.extension_path)
          raw.instance_variable_set(:@ratelimit_web_loaded, true)
        end
        raw.execute(sql, RatelimitWeb.as_text(params)).first
      end
    rescue ::ActiveRecord::ConnectionNotEstablished, ::ActiveRecord::ConnectionTimeoutError => e
      raise DatabaseUnavailable, e.message.strip
    rescue StandardError => e
      raise DatabaseUnavailable, e.message.strip if unavailable?(e)

      raise
    end

    private

    def postgres? = @postgres.nil? ? (@postgres = @base.connection_db_config.adapter.to_s.start_with?("postg")) : @postgres

    def unavailable?(error)
      names = %w[PG::ConnectionBad PG::UnableToSend PG::AdminShutdown SQLite3::BusyException SQLite3::LockedException]
      names.include?(error.class.name)
    end
  end
end
