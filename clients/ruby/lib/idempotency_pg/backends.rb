# frozen_string_literal: true

module IdempotencyPg
  # A small thread-safe pool of PG::Connection for apps without ActiveRecord (Sinatra, Hanami, plain Rack). Its
  # connections are opened on demand up to `size` and kept open while idle (no idle timeout: a burst after an idle
  # spell finds them ready, CONTRACT.md idle-409); a broken connection is dropped.
  class Pool
    attr_reader :size

    def initialize(url, size: 10)
      @url, @size = url, size
      @idle = []
      @count = 0
      @mutex = Mutex.new
      @available = ConditionVariable.new
    end

    def with
      conn = checkout
      begin
        yield conn
      ensure
        checkin(conn)
      end
    end

    def close
      @mutex.synchronize do
        @idle.each(&:close)
        @idle.clear
      end
    end

    private

    def checkout
      @mutex.synchronize do
        loop do
          return @idle.pop unless @idle.empty?
          break if @count < @size

          @available.wait(@mutex)
        end
        @count += 1
      end
      begin
        PG.connect(@url)
      rescue StandardError
        @mutex.synchronize do
          @count -= 1
          @available.signal
        end
        raise
      end
    end

    def checkin(conn)
      healthy = !conn.finished? && conn.status == PG::CONNECTION_OK &&
                conn.transaction_status == PG::PQTRANS_IDLE
      @mutex.synchronize do
        if healthy
          @idle.push(conn)
        else
          @count -= 1
          conn.close unless conn.finished?
        end
        @available.signal
      end
    end
  end

  # Runs a request's transaction on a connection of an IdempotencyPg::Pool (or anything with `with { |conn| }`).
  # The block returns [commit?, value]; COMMIT or ROLLBACK follows; an exception rolls back and is raised again.
  class PgBackend
    attr_reader :pool

    def initialize(pool, isolation: nil)
      @pool = pool
      @begin = isolation ? "BEGIN ISOLATION LEVEL #{isolation.to_s.upcase.tr('_', ' ')}" : "BEGIN"
    end

    # A connection of the pool for statements of their own (autocommit): lease mode's lease, heartbeat, release.
    def connection(&block)
      @pool.with(&block)
    end

    def transaction
      @pool.with do |conn|
        conn.exec(@begin)
        begin
          commit, value = yield conn
          if commit
            ended = conn.exec("COMMIT")
            # COMMIT of a transaction an earlier (swallowed) error aborted answers ROLLBACK
            raise "the transaction was aborted by an earlier error" unless ended.cmd_status == "COMMIT"
          else
            conn.exec("ROLLBACK")
          end
          value
        rescue Exception # rubocop:disable Lint/RescueException - rolled back whatever happened, then raised again
          begin
            conn.exec("ROLLBACK") unless conn.finished? || conn.transaction_status == PG::PQTRANS_IDLE
          rescue PG::Error
            nil
          end
          raise
        end
      end
    end
  end

  # Runs a request's transaction as ActiveRecord's own (ActiveRecord::Base.transaction), so the handler's models
  # write in it on the same connection; the claim and the completion go on its raw PG::Connection.
  class ActiveRecordBackend
    def initialize(base = ::ActiveRecord::Base)
      @base = base
    end

    # ActiveRecord's raw connection for statements of their own (autocommit): lease mode's lease, heartbeat,
    # release; a thread of its own (the heartbeat's) takes a connection of the pool for the block.
    def connection
      @base.connection_pool.with_connection { |ar| yield ar.raw_connection }
    end

    def transaction
      @base.connection_pool.with_connection do |ar|
        value = nil
        ar.transaction(requires_new: true) do
          ar.materialize_transactions # BEGIN now: the claim goes on the raw connection, inside it
          commit, value = yield ar.raw_connection
          raise ::ActiveRecord::Rollback unless commit
        end
        value
      end
    end
  end
end
