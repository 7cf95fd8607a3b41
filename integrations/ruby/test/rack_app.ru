# frozen_string_literal: true

# The Rack application the tests serve with puma (8 threads): RatelimitWeb::Middleware over
# the pg gem or the sqlite3 gem, on routes.rb's routes.
require_relative "routes"

limiter = if TestApp::ENGINE == "sqlite"
            RatelimitWeb::SqliteLimiter.new(TestApp::DB, extension: TestApp::EXTENSION, busy_timeout: TestApp::TIMEOUT)
          else
            RatelimitWeb::PostgresLimiter.new(TestApp::DB, timeout: TestApp::TIMEOUT)
          end
middleware = nil
app = lambda do |env|
  request = Rack::Request.new(env)
  next [200, { "Content-Type" => "application/json" }, [JSON.generate(middleware.counters.to_h)]] if request.path == "/counts"

  status, body = TestApp.answer(request.path, request.params)
  [status, { "Content-Type" => "application/json" }, [JSON.generate(body)]]
end
middleware = RatelimitWeb::Middleware.new(app, limiter: limiter, routes: TestApp.routes, **TestApp.options)
run middleware
