# frozen_string_literal: true

module RatelimitWeb
  # What one middleware did in this process.
  Counters = Struct.new(:checks, :admitted, :refused, :refused_locally, :shed, :fallback_admitted,
                        :fallback_refused, :database_errors, :missing_policies) do
    def initialize(*) = super(*Array.new(9, 0))
  end

  # In-process token buckets per subject, the fallback while the database is unreachable
  # (each process its own), at most max_subjects of them (the least recently used forgotten).
  class LocalBucket
    attr_reader :burst

    def initialize(burst, refill_per_minute, max_subjects: 10_000, clock: -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) })
      @burst, @per_second, @max, @clock = burst.to_f, refill_per_minute.to_f / 60, max_subjects, clock
      @buckets = {}
      @lock = Mutex.new
    end

    # 0 when admitted, else the seconds until it would be (Infinity for a cost above the burst).
    def take(subject, cost = 1.0)
      @lock.synchronize do
        now = @clock.call
        level, at = @buckets.delete(subject) || [@burst, now]
        level = [@burst, level + (now - at) * @per_second].min
        admitted = cost <= level
        @buckets[subject] = [admitted ? level - cost : level, now]
        @buckets.delete(@buckets.keys.first) if @buckets.size > @max
        next 0.0 if admitted
        next Float::INFINITY if cost > @burst || @per_second <= 0

        (cost - level) / @per_second
      end
    end
  end

  # Subjects just refused, per route, limits and tier, until their refusal's retry time ends: at most
  # `size` (least recently used forgotten). It only ever refuses: an entry repeats the
  # database's refusal, its waits counted down.
  class RefusalCache
    def initialize(size, clock: -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) })
      @size, @clock, @entries, @lock = size, clock, {}, Mutex.new
    end

    def put(key, status, body, headers, wait_seconds)
      @lock.synchronize do
        @entries.delete(key)
        @entries[key] = [status, body, headers, @clock.call + wait_seconds]
        @entries.delete(@entries.keys.first) while @entries.size > @size
      end
    end

    def get(key)
      @lock.synchronize do
        entry = @entries.delete(key)
        next nil unless entry

        status, body, headers, til = entry
        left = til - @clock.call
        next nil if left <= 0

        @entries[key] = entry
        seconds = [1, left.ceil].max
        [status, body.merge("retry_after" => seconds), headers.merge("Retry-After" => seconds.to_s)]
      end
    end
  end
end
