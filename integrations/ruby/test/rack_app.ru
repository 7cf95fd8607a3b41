# frozen_string_literal: true

# The Rack application the tests serve with puma (8 threads): RatelimitWeb::Middleware over
# the pg gem or the sqlite3 gem, on routes.rb's routes.
require_relative "routes"

limiter = if TestApp::ENGINE == "sqlite"
            RatelimitWeb::SqliteLimiter.new(TestApp::DB, extension: TestApp::EXTENSION, **TestApp.limiter_options)
          else
            RatelimitWeb::PostgresLimiter.new(TestApp::DB, **TestApp.limiter_options)
          end
middleware = nil
metrics = RatelimitWeb::PrometheusMetrics.new
app = lambda do |env|
  request = Rack::Request.new(env)
  next [200, { "Content-Type" => "application/json" }, [JSON.generate(middleware.counters.to_h)]] if request.path == "/counts"
  next metrics.rack_app.call(env) if request.path == "/metrics"
  next [200, { "Content-Type" => "application/json" }, [JSON.generate(TestApp.runs)]] if request.path == "/runs"

  status, body = TestApp.answer(request.path, request.params, request)
  [status, { "Content-Type" => "application/json" }, [JSON.generate(body)]]
end
middleware = RatelimitWeb::Middleware.new(app, limiter: limiter, routes: TestApp.routes, metrics: metrics, **TestApp.options)
run middleware
