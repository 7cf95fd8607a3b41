# frozen_string_literal: true

module RatelimitWeb
  # How one route (or route pattern) is limited: a policy's name (rl_check, the tier as its
  # tier), or explicit `limits` as rl_take_all items without key and cost (any kind the engine
  # has, passed through as given: docs/guides/limits.md, rl_take_all) with `tiers` giving
  # their multipliers. `limits` may be a callable of the request that answers them, for
  # limits that differ by customer (a budget counted from each one's billing date:
  # `->(request) { [{ period: "month from #{day}", quota: quota }] }`); the engine validates
  # its answer on every call instead of at startup. `cost` is a number or a callable
  # of the request. A `sensitive` route fails closed (503) while the database is
  # unreachable; the others admit through a local bucket at the middleware's fallback_share
  # of their first bucket (for a policy, the one its last answer reported, or `fallback` =
  # [burst, refill_per_minute] until there was one).
  #
  # `refund_on` gives back what an admitted request took when its response has one of these
  # statuses: status classes and codes (["5xx"], [503]) or a callable of the status. nil
  # takes the middleware's `refund_on` (off unless set); a sensitive route refunds only what
  # it names itself. A refund lets a client whose request failed try again: never name
  # statuses a client can cause at will on a route whose handler works before it fails.
  #
  # `identify` chooses this route's subject in place of the middleware's (a callable of the
  # request, as the middleware's `identify:` gets it); nil or an empty answer falls back to
  # the middleware's `identify:`, then the signed-in user, then the client address.
  class Route
    attr_reader :policy, :limits, :tiers, :cost, :sensitive, :fallback, :refund_on, :refunds, :identify
    attr_accessor :name

    def initialize(policy: nil, limits: nil, tiers: {}, cost: 1, sensitive: false, fallback: nil, name: nil,
                   refund_on: nil, identify: nil)
      raise ArgumentError, "Route: give either policy or limits" if policy.nil? == limits.nil?

      @limits = limits.respond_to?(:call) ? limits : limits && Route.limit_list(limits, "Route")
      @policy, @tiers, @cost, @sensitive, @fallback, @name = policy, tiers.transform_keys(&:to_s), cost, sensitive, fallback, name
      @refund_on, @identify = refund_on, identify
      @refunds = RatelimitWeb.refund_rule(refund_on)
    end

    # `limits` as a list of limit objects with text keys, or an ArgumentError that starts
    # with `what`.
    def self.limit_list(limits, what)
      unless limits.is_a?(Array) && !limits.empty? && limits.all? { |l| l.is_a?(Hash) }
        raise ArgumentError, "#{what}: limits must be a list of limit objects, e.g. [{burst: 5, refill_per_minute: 5}]"
      end

      limits.map { |l| l.transform_keys(&:to_s) }
    end

    # Whether `limits` is a callable of the request (the engine checks each call's answer).
    def per_request? = @limits.respond_to?(:call)

    # This route as it limits `request`: itself, or a copy holding what its `limits`
    # callable answered for the request (what the check, its refund and a charge all use).
    def for_request(request)
      return self unless per_request?

      copy = dup
      copy.instance_variable_set(:@limits, Route.limit_list(@limits.call(request), "Route #{name.inspect}: limits(request)"))
      copy
    end

    def multiplier(tier)
      return 1.0 if tier.nil? || tiers.empty? # a route without tiers is the same for all
      raise ArgumentError, "Route #{name.inspect}: unknown tier #{tier.inspect}" unless tiers.key?(tier)

      tiers[tier].to_f
    end

    def first_bucket(tier)
      bucket = (limits || []).find { |l| l.key?("burst") }
      return fallback unless bucket

      m = multiplier(tier)
      [bucket["burst"].to_f * m, bucket["refill_per_minute"].to_f * m]
    end

    # The explicit limits as a policy definition, which the engine validates
    # (rl_policy_validate) with a policy's rules and texts.
    def definition = { "limits" => limits || [] }.merge(tiers.empty? ? {} : { "tiers" => tiers })

    # The limits as the engine read them (numbers where text was given), kept from startup on.
    def canonical!(limits) = @limits = limits.map { |l| l.transform_keys(&:to_s) }
  end
end
