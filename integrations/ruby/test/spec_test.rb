# frozen_string_literal: true

# The rule cases of the behaviour spec every web package shares
# (integrations/spec/cases.json) against RatelimitWeb's rules; its HTTP cases run against
# the Rack and Rails test applications from the Python suite (test_spec.py). Run:
#   ruby -Iintegrations/ruby/lib integrations/ruby/test/spec_test.rb
require "json"
require "minitest/autorun"
require "ratelimit_web"

class SpecTest < Minitest::Test
  CASES = JSON.parse(File.read(File.expand_path("../../spec/cases.json", __dir__)))
  APP = JSON.parse(File.read(File.expand_path("../../spec/app.json", __dir__)))
  TRUSTED = RatelimitWeb.networks(APP.dig("options", "trusted_proxies"))
  BUCKET = [{ burst: 1, refill_per_minute: 1 }].freeze

  def test_a_routes_limits_callable_answers_for_each_request_checked_as_fixed_limits_are
    plans = { "ann" => "month from 3 in Europe/Paris", "bob" => "month from 20" }
    route = RatelimitWeb::Route.new(limits: ->(user) { [{ period: plans[user], quota: 3 }] }, name: "/bill")
    assert_equal [{ "period" => "month from 3 in Europe/Paris", "quota" => 3 }], route.for_request("ann").limits
    assert_equal "month from 20", route.for_request("bob").limits[0]["period"]
    assert route.per_request? && route.limits.respond_to?(:call), "the route itself is left as it was"
    fixed = RatelimitWeb::Route.new(limits: BUCKET)
    assert_same fixed, fixed.for_request("ann")
    [[], { "period" => "month" }, ["month"], nil].each do |wrong|
      error = assert_raises(ArgumentError) { RatelimitWeb::Route.new(limits: ->(_) { wrong }, name: "/bill").for_request("ann") }
      assert_match(%r{\ARoute "/bill": limits\(request\): limits must be a list of limit objects}, error.message)
    end
    assert_raises(ArgumentError) { RatelimitWeb::Route.new(limits: "month") }
  end

  def test_a_cached_refusal_is_kept_for_the_limits_it_was_given_under
    plans = { "basic" => 3, "pro" => 30 }
    plan = "basic"
    route = RatelimitWeb::Route.new(limits: ->(_) { [{ period: "month", quota: plans[plan] }] }, name: "/bill")
    rules = RatelimitWeb::Rules.new({ "/bill" => route }, refusal_cache: 10, logger: Logger.new(IO::NULL))
    refused = RatelimitWeb::Answer.new({ "admitted" => false, "retry_after_ms" => 86_400_000 },
                                       { "Retry-After" => "86400", "X-RateLimit-Limit" => "3" })
    admitted = RatelimitWeb::Answer.new({ "admitted" => true }, { "X-RateLimit-Limit" => "30" })
    asked = 0
    decide = lambda do |answer|
      rules.decide(route.for_request(nil), "kai", nil, 1) do
        asked += 1
        answer
      end
    end
    assert_equal 429, decide.call(refused).status
    assert_equal 429, decide.call(admitted).status, "the same limits: the cached refusal, no database call"
    assert_equal 1, asked
    plan = "pro"
    assert_equal 200, decide.call(admitted).status, "other limits (a new plan): asked of the database again"
    assert_equal 2, asked
  end

  CASES.fetch("address").each_with_index do |c, i|
    define_method("test_address_#{i}") do
      got = RatelimitWeb.client_address(c["peer"], c["forwarded"], TRUSTED, c.fetch("ipv6_prefix", 56))
      assert_equal c["expect"], got, c.inspect
    end
  end

  CASES.fetch("path").each_with_index do |c, i|
    define_method("test_path_#{i}") do
      got = RatelimitWeb.normalize_path(c["path"], case_insensitive: c.fetch("case_insensitive", false),
                                                   formats: c.fetch("formats", false))
      assert_equal c["expect"], got, c.inspect
    end
  end

  CASES.fetch("key").each_with_index do |c, i|
    define_method("test_key_#{i}") do
      assert_equal c["expect"], RatelimitWeb.limit_key(c["route"], c["subject"], c["index"]), c.inspect
    end
  end

  CASES.fetch("match").each_with_index do |c, i|
    define_method("test_match_#{i}") do
      routes = c["routes"].to_h { |r| [r, RatelimitWeb::Route.new(limits: BUCKET)] }
      rules = RatelimitWeb::Rules.new(routes, skip: c.fetch("skip", []), case_insensitive_paths: c.fetch("case_insensitive", false),
                                              path_formats: c.fetch("formats", false), logger: Logger.new(nil))
      route = rules.match(c["method"], c["path"])
      c["expect"].nil? ? assert_nil(route, c.inspect) : assert_equal(c["expect"], route&.name, c.inspect)
    end
  end

  CASES.fetch("identifier").each_with_index do |c, i|
    define_method("test_identifier_#{i}") do
      value = c["repeat"] ? c["input"] * c["repeat"] : c["input"]
      got = RatelimitWeb.normalize_identifier(value, case_insensitive: c.fetch("case_insensitive", false))
      if c["expect_length"]
        assert_equal c["expect_length"], got.length, c.inspect
        assert got.start_with?(c["expect_prefix"]), c.inspect
      elsif c["expect"].nil?
        assert_nil got, c.inspect
      else
        assert_equal c["expect"], got, c.inspect
      end
    end
  end

  CASES.fetch("refund").each_with_index do |c, i|
    define_method("test_refund_#{i}") do
      route = RatelimitWeb::Route.new(limits: BUCKET, refund_on: c["refund_on"], sensitive: c.fetch("sensitive", false))
      rules = RatelimitWeb::Rules.new({ "/r" => route }, refund_on: c["middleware"], logger: Logger.new(nil))
      assert_equal c["expect"], rules.refunds?(route, c["status"]), c.inspect
    end
  end

  CASES.fetch("database").each_with_index do |c, i|
    define_method("test_database_#{i}") do
      exists = ->(path) { c.fetch("file_exists", false) && path == c["db"] }
      if c["expect"].nil?
        error = assert_raises(ArgumentError) { RatelimitWeb.database_of(c["db"], is_file: exists) }
        assert_match(/names no database: a PostgreSQL one is postgresql:/, error.message)
      else
        assert_equal c["expect"], RatelimitWeb.database_of(c["db"], is_file: exists), c.inspect
      end
    end
  end

  def test_unknown_policy_codes_are_the_specs
    assert_equal CASES.dig("unknown_policy", "sqlstate"), RatelimitWeb::UNKNOWN_POLICY_SQLSTATE
    assert_equal CASES.dig("unknown_policy", "sqlite_prefixes"), RatelimitWeb::UNKNOWN_POLICY_PREFIXES
  end

  # charge and refund where the HTTP cases cannot reach; the charges themselves, on Rack and
  # Rails and both engines, are the spec's HTTP case
  def test_charge_and_refund_outside_an_admitted_request_say_so
    [{}, Object.new].each do |request|
      error = assert_raises(ArgumentError) { RatelimitWeb.charge(request, 5) }
      assert_match(/not admitted by a rate-limited route/, error.message)
    end
  end

  def test_a_cost_must_be_a_finite_number_above_zero
    [0, -1, Float::NAN, Float::INFINITY, "5", nil, 1i].each do |cost|
      error = assert_raises(ArgumentError) { RatelimitWeb.amount("charge", cost) }
      assert_equal "RatelimitWeb.charge: cost must be a finite number greater than 0, got #{cost.inspect}", error.message
    end
    assert_equal 2.5, RatelimitWeb.amount("refund", 2.5)
  end

  def test_binary_strings_are_bound_as_text
    params = RatelimitWeb.as_text(["pro".b, "caf\xC3\xA9".b, 3, nil])
    assert_equal [Encoding::UTF_8, Encoding::UTF_8], params[0, 2].map(&:encoding)
    assert_equal ["pro", "café", 3, nil], params
  end
end
