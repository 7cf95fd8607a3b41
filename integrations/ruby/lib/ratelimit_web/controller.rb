# frozen_string_literal: true

module RatelimitWeb
  # A Rails controller helper over ActiveRecord's connection:
  #
  #   class SessionsController < ApplicationController
  #     include RatelimitWeb::Controller
  #     rate_limit_by policy: "login", sensitive: true, only: :create
  #   end
  #
  # The fields of Route, plus `only`/`except` (the actions) and `name` (the key of its
  # limits; default "controller#actions"). Options for every helper (identify, tier,
  # trusted_proxies, ...) are RatelimitWeb::Controller.options; `identify` and `tier` get
  # the controller's request. The subject defaults to current_user.id when the controller has
  # one, else the client address. A route's policy is checked on its first request; a
  # missing one answers a JSON 500. On SQLite the extension is the gem's own
  # (RatelimitWeb.extension_path) unless Controller.limiter says otherwise.
  module Controller
    class << self
      attr_writer :options, :limiter

      def options = @options || {}

      def limiter = @limiter ||= ActiveRecordLimiter.new
    end

    def self.included(base)
      base.extend(ClassMethods)
    end

    module ClassMethods
      def rate_limit_by(only: nil, except: nil, name: nil, **route_fields)
        route = Route.new(**route_fields, name: name || "#{controller_path}##{Array(only || 'all').join(',')}")
        rules = nil
        filter = { only: only, except: except }.compact
        around_action(**filter) do |controller, action|
          rules ||= Rules.new({ route.name => route }, **RatelimitWeb::Controller.options)
          controller.send(:ratelimit_web_around, rules, route, action)
        end
      end
    end

    private

    def ratelimit_web_around(rules, route, action)
      user = respond_to?(:current_user, true) ? send(:current_user)&.id : nil
      check = Check.new(rules, RatelimitWeb::Controller.limiter, route, request,
                        user: user, peer: request.remote_addr, forwarded: request.headers["X-Forwarded-For"])
      decision = check.decide
      if decision.kind == :answer
        response.headers.merge!(decision.headers)
        return render(json: decision.body, status: decision.status)
      end
      request.env[LIMITS] = check # for RatelimitWeb.charge(request, cost) in the action
      return action.call if decision.kind == :fallback

      begin
        action.call
      rescue StandardError
        check.give_back if check.refunds?(500)
        raise
      end
      check.give_back if check.refunds?(response.status)
      response.headers.merge!(check.headers)
    end
  end
end
