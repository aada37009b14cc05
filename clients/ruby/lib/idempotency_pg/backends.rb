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
  # The block gets the connection and the Transaction, and returns [commit?, value]; COMMIT or ROLLBACK follows
  # (unless the last statement carried COMMIT); an exception rolls back and is raised again. BEGIN is not sent
  # before the block: it goes with the block's first statement (the claim: one round trip), or alone before a
  # handler that runs without a claim (Transaction#open!). pipeline: false sends each statement in its own round
  # trip (BEGIN first, COMMIT last: 5 round trips on a new key), for a proxy that mishandles pipelined messages.
  class PgBackend
    attr_reader :pool

    def initialize(pool, isolation: nil, pipeline: true)
      @pool, @pipeline = pool, pipeline
      @begin = isolation ? "BEGIN ISOLATION LEVEL #{isolation.to_s.upcase.tr('_', ' ')}" : "BEGIN"
    end

    # A connection of the pool for statements of their own (autocommit): lease mode's lease, heartbeat, release.
    def connection(&block)
      @pool.with(&block)
    end

    def transaction
      @pool.with do |conn|
        tx = Transaction.new(conn, @begin)
        begin
          tx.open! unless @pipeline
          commit, value = yield conn, (tx if @pipeline)
          tx.finish(commit)
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

  # The state of PgBackend's transaction: BEGIN not sent yet (pending), sent (open), or ended by the statement
  # that carried COMMIT (ended).
  class Transaction
    def initialize(conn, begin_sql)
      @conn, @begin_sql, @state = conn, begin_sql, :pending
    end

    # The BEGIN to send in front of the next statement, in the same round trip; nil once taken.
    def take_begin
      return nil unless @state == :pending

      @state = :open
      @begin_sql
    end

    # BEGIN alone, unless it went already (a handler that runs without a claim).
    def open!
      sql = take_begin
      @conn.exec(sql) if sql
    end

    # The last statement carried COMMIT: nothing more to send.
    def committed!
      @state = :ended
    end

    def finish(commit)
      state, @state = @state, :ended
      return unless state == :open # pending: nothing was sent; ended: COMMIT went already

      unless commit
        @conn.exec("ROLLBACK")
        return
      end
      # COMMIT of a transaction an earlier (swallowed) error aborted answers ROLLBACK
      raise "the transaction was aborted by an earlier error" unless @conn.exec("COMMIT").cmd_status == "COMMIT"
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
