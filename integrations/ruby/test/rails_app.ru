# frozen_string_literal: true

# The Rails application the tests serve with puma (8 threads), on ActiveRecord's own
# connection: RatelimitWeb::Middleware in its middleware stack on routes.rb's routes, and
# the controller helper (rate_limit_by) on /helper and /helper_fail.
require_relative "routes"
ENV["RAILS_ENV"] = "production"
ENV["DATABASE_URL"] = if TestApp::ENGINE == "sqlite"
                        # the connection's own busy timeout is how long a check waits for SQLite's lock
                        "sqlite3:#{TestApp::DB}?pool=8&timeout=#{((TestApp::TIMEOUT || 1.0) * 1000).to_i}"
                      else
                        "postgresql:///#{TestApp::DB.delete_prefix('dbname=')}?pool=8"
                      end
require "rails"
require "active_record/railtie"
require "action_controller/railtie"

class RailsTestApp < Rails::Application
  config.root = __dir__
  config.eager_load = false
  config.secret_key_base = "tests only"
  config.hosts.clear
  config.logger = Logger.new($stderr, level: :error)
  config.log_level = :error
  config.active_record.legacy_connection_handling = false
end

COUNTERS = RatelimitWeb::Counters.new
RatelimitWeb::Controller.limiter = RatelimitWeb::ActiveRecordLimiter.new(extension: TestApp::EXTENSION)
RatelimitWeb::Controller.options = TestApp.options
RailsTestApp.config.middleware.use(RatelimitWeb::Middleware, limiter: RatelimitWeb::Controller.limiter,
                                                             routes: TestApp.routes, counters: COUNTERS, **TestApp.options)
Rails.application.initialize!

class AnswersController < ActionController::API
  include RatelimitWeb::Controller
  rate_limit_by limits: [{ burst: 3, refill_per_minute: TestApp::NEVER_REFILLS }], name: "helper", only: %i[helper helper_fail],
                refund_on: ["5xx"]
  rate_limit_by limits: [{ burst: 300, refill_per_minute: TestApp::NEVER_REFILLS }], tiers: { free: 1, pro: 2 },
                name: "helper_exact", only: :helper_exact
  rate_limit_by policy: "web_login", sensitive: true, name: "helper_login", only: :helper_login

  def answer
    status, body = TestApp.answer(request.path, request.query_parameters, request)
    render json: body, status: status
  end

  def counts = render(json: COUNTERS.to_h)

  def runs = render(json: TestApp.runs)

  def helper = render(json: { ok: true })
  def helper_exact = render(json: { ok: true })
  def helper_login = render(json: { ok: true })

  def helper_fail
    status, body = TestApp.answer("/fail", request.query_parameters)
    render json: body, status: status
  end
end

Rails.application.routes.draw do
  get "/counts" => "answers#counts"
  get "/runs" => "answers#runs"
  get "/helper" => "answers#helper"
  get "/helper_fail" => "answers#helper_fail"
  get "/helper_exact" => "answers#helper_exact"
  post "/helper_login" => "answers#helper_login"
  match "*path" => "answers#answer", via: :all
  match "/" => "answers#answer", via: :all
end

run Rails.application
