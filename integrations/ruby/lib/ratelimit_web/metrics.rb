# frozen_string_literal: true

module RatelimitWeb
  # Prometheus metrics of the middleware, the same series as the Python and Node packages',
  # written in the text format without a client gem:
  # - `ratelimit_requests_total{route, policy, outcome}`: what each request came to;
  # - `ratelimit_check_seconds{route}`: a histogram of the time the database took to answer;
  # - `ratelimit_refused_subject_refusals{route, policy, subject}`: the subjects the
  #   database refused most per route (at most `top_subjects` each, a space-saving summary:
  #   a listed count may be above the true one by what the subject it replaced had).
  # Pass it as the middleware's `metrics:`, and serve `metrics.rack_app` (or `render`) on a
  # route of your own, e.g. `map("/metrics") { run metrics.rack_app }`.
  class PrometheusMetrics
    BUCKETS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0].freeze

    def initialize(namespace: "ratelimit", top_subjects: 10)
      @namespace, @top_subjects = namespace, top_subjects
      @lock = Mutex.new
      @requests = Hash.new(0)
      @checks = {}
      @tops = {}
    end

    def count(route, outcome, policy = nil)
      @lock.synchronize { @requests[[route || "", policy || "", outcome]] += 1 }
    end

    def observe(route, seconds)
      @lock.synchronize do
        h = (@checks[route || ""] ||= { buckets: Array.new(BUCKETS.size, 0), count: 0, sum: 0.0 })
        BUCKETS.each_with_index { |bound, i| h[:buckets][i] += 1 if seconds <= bound }
        h[:count] += 1
        h[:sum] += seconds
      end
    end

    # The database refused `subject` on `route`: its place in the route's top list. A new
    # subject past `top_subjects` takes the place of the least refused, with its count.
    def refuse(route, policy, subject)
      @lock.synchronize do
        top = (@tops[[route || "", policy || ""]] ||= {})
        if top.key?(subject)
          top[subject] += 1
        elsif top.size < @top_subjects
          top[subject] = 1
        else
          victim, least = top.min_by { |_, n| n }
          top.delete(victim)
          top[subject] = least + 1
        end
      end
    end

    def render
      lines = []
      @lock.synchronize do
        series(lines, "requests_total", "counter", "Requests the rate-limit middleware decided, by route, policy and outcome")
        @requests.each { |(route, policy, outcome), n| lines << sample("requests_total", { outcome:, policy:, route: }, n) }
        series(lines, "check_seconds", "histogram", "Time the database took to answer a rate-limit check")
        @checks.each do |route, h|
          BUCKETS.each_with_index { |bound, i| lines << sample("check_seconds_bucket", { le: bound.to_s, route: }, h[:buckets][i]) }
          lines << sample("check_seconds_bucket", { le: "+Inf", route: }, h[:count])
          lines << sample("check_seconds_count", { route: }, h[:count])
          lines << sample("check_seconds_sum", { route: }, h[:sum])
        end
        series(lines, "refused_subject_refusals", "gauge",
               "Refusals of the subjects the database refused most, per route (at most top_subjects per route)")
        @tops.each do |(route, policy), top|
          top.each { |subject, n| lines << sample("refused_subject_refusals", { policy:, route:, subject: }, n) }
        end
      end
      "#{lines.join("\n")}\n"
    end

    # A Rack application answering the text format.
    def rack_app
      lambda do |_env|
        text = render
        [200, { "Content-Type" => "text/plain; version=0.0.4; charset=utf-8", "Content-Length" => text.bytesize.to_s }, [text]]
      end
    end

    private

    def series(lines, name, type, help)
      lines << "# HELP #{@namespace}_#{name} #{help}"
      lines << "# TYPE #{@namespace}_#{name.delete_suffix('_total')} #{type}"
    end

    def sample(name, labels, value)
      text = labels.sort.map { |k, v| "#{k}=\"#{escape(v.to_s)}\"" }.join(",")
      "#{@namespace}_#{name}{#{text}} #{value.to_f}"
    end

    def escape(value) = value.gsub("\\") { "\\\\" }.gsub("\n", "\\n").gsub('"') { '\\"' }
  end
end
