# frozen_string_literal: true

module RatelimitWeb
  # How one route (or route pattern) is limited: a policy's name (rl_check, the tier as its
  # tier), or explicit `limits` as rl_take_all items without key and cost (buckets
  # {burst:, refill_per_minute:}, budgets {period:, quota:}) with `tiers` giving their
  # multipliers. `cost` is a number or a callable of the request. A `sensitive` route fails
  # closed (503) while the database is unreachable; the others admit through a local bucket
  # at the middleware's fallback_share of their first bucket (for a policy, the one its last
  # answer reported, or `fallback` = [burst, refill_per_minute] until there was one).
  class Route
    attr_reader :policy, :limits, :tiers, :cost, :sensitive, :fallback
    attr_accessor :name

    def initialize(policy: nil, limits: nil, tiers: {}, cost: 1, sensitive: false, fallback: nil, name: nil)
      raise ArgumentError, "Route: give either policy or limits" if policy.nil? == limits.nil?

      @limits = limits&.map { |l| l.transform_keys(&:to_s) }
      (@limits || []).each do |l|
        bucket = l.key?("burst") && l.key?("refill_per_minute")
        budget = l.key?("period") && l.key?("quota")
        raise ArgumentError, "Route: limit #{l.inspect} is neither a bucket nor a budget" unless bucket || budget
      end
      @policy, @tiers, @cost, @sensitive, @fallback, @name = policy, tiers.transform_keys(&:to_s), cost, sensitive, fallback, name
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
      [bucket["burst"] * m, bucket["refill_per_minute"] * m]
    end
  end
end
