-- Partitioned storage's direct path (issue 39, key_store_partitioned.c): what it probes and locks, the answers
-- it gives beside expired rows and in the default partition, its partition list seen again after a change,
-- privileges checked on the parent, and the statements where it does not apply (a trigger on a partition).
TRUNCATE idempotency_keys;
SELECT idem_set_storage('partitioned', interval '1 hour') ~ '^partitioned' AS partitioned;
CREATE FUNCTION complete_key(k text, body jsonb, ttl interval DEFAULT NULL) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    answer text;
BEGIN
    SELECT outcome INTO answer FROM idem_claim(k, idem_hash(k), ttl);
    IF answer = 'claimed' THEN
        PERFORM idem_complete(k, 200, body);
    END IF;
    RETURN answer;
END $$;
-- The range partitions this transaction holds a lock on, and whether the default partition is among them; the
-- locks are read before idem_partitions(), which takes its own.
CREATE FUNCTION locked_partitions(OUT range_partitions bigint, OUT default_partition boolean)
LANGUAGE plpgsql AS $$
DECLARE
    held oid[];
BEGIN
    SELECT array_agg(relation) INTO held FROM pg_locks
    WHERE pid = pg_backend_pid() AND locktype = 'relation' AND relation IS NOT NULL;
    SELECT count(*) INTO range_partitions FROM idem_partitions() p
    WHERE p.partition_name::regclass::oid = ANY (held);
    default_partition := 'idempotency_keys_partitioned_default'::regclass::oid = ANY (held);
END $$;

SELECT complete_key('one', '"first"');
-- A replay locks the default partition and the range partitions from the latest bound down to the one holding
-- the row, no further (the statements locked every live partition).
BEGIN;
SELECT outcome, response_body FROM idem_claim('one', idem_hash('one'));
-- (read before any statement on the parent, which would lock every partition)
SELECT range_partitions AS locked, default_partition FROM locked_partitions() \gset
COMMIT;
SELECT :locked = (SELECT count(*) FROM idem_partitions() p
                  WHERE p.upper_bound > (SELECT expires_at FROM idempotency_keys_partitioned
                                         WHERE key = 'one')) AS down_to_the_row,
       :locked < (SELECT count(*) FROM idem_partitions()) AS not_all, :'default_partition'::boolean AS default_partition;
-- A new key is looked for in every partition that can hold a live row.
BEGIN;
SELECT outcome FROM idem_claim('two', idem_hash('two'));
SELECT range_partitions AS locked, default_partition FROM locked_partitions() \gset
SELECT :locked = (SELECT count(*) FROM idem_partitions() WHERE upper_bound > now()) AS every_live_one,
       :'default_partition'::boolean AS default_partition;
ROLLBACK;

-- An expired row of the key stays beside its new row until its partition goes; the claim sees only the new one.
SELECT idem_create_partition(date_trunc('hour', now()) - interval '3 hours',
                             date_trunc('hour', now()) - interval '2 hours') IS NOT NULL AS past_partition;
INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash)
VALUES (date_trunc('hour', now()) - interval '150 minutes', now() - interval '1 day', 299, '', 'again',
        decode(idem_hash('old request'), 'hex'));
BEGIN;
SELECT complete_key('again', '"new"');
-- The partition whose rows have all expired is neither probed nor locked.
SELECT range_partitions AS locked FROM locked_partitions() \gset
SELECT :locked = (SELECT count(*) FROM idem_partitions() WHERE upper_bound > now()) AS live_ones_only;
COMMIT;
SELECT outcome, http_status, response_body FROM idem_claim('again', idem_hash('again'));
SELECT count(*) AS rows_of_again FROM idempotency_keys_partitioned WHERE key = 'again';

-- A row beyond the last partition waits in the default partition; it is found there, and a key with a row in
-- both the default partition and a range partition answers with the later one.
SELECT complete_key('far', '"far"', interval '400 days');
SELECT tableoid::regclass AS stored_in FROM idempotency_keys_partitioned WHERE key = 'far';
SELECT outcome, response_body FROM idem_claim('far', idem_hash('far'));
INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash,
                                          response_body)
SELECT now() + interval '500 days', now(), 201, '', 'one', decode(idem_hash('one'), 'hex'), '"later"';
SELECT outcome, http_status, response_body FROM idem_claim('one', idem_hash('one'));
DELETE FROM idempotency_keys_partitioned_default WHERE key = 'one';

-- The partition list is seen again after a partition is made: a row routed into the new partition lands there,
-- not in the default partition where the list remembered from before would put it.
SELECT complete_key('before-new-partition', '"b"', interval '30 days');
SELECT tableoid::regclass AS stored_in FROM idempotency_keys_partitioned WHERE key = 'before-new-partition';
SELECT idem_create_partition(date_trunc('hour', now()) + interval '40 days',
                             date_trunc('hour', now()) + interval '42 days') IS NOT NULL AS made;
SELECT complete_key('after-new-partition', '"a"', interval '41 days') AS outcome;
SELECT regexp_replace(tableoid::regclass::text, '\d{8}_\d{6}$', 'YYYYMMDD_HHMMSS') AS stored_in
FROM idempotency_keys_partitioned WHERE key = 'after-new-partition';
SELECT outcome, response_body FROM idem_claim('after-new-partition', idem_hash('after-new-partition'));

-- Privileges are the parent's, as the statements check them: a role that may not read the keys is refused.
CREATE ROLE idem_direct_reader;
GRANT USAGE ON SCHEMA public TO idem_direct_reader;
SET ROLE idem_direct_reader;
SELECT outcome FROM idem_claim('one', idem_hash('one'));
RESET ROLE;
DROP OWNED BY idem_direct_reader;
DROP ROLE idem_direct_reader;

-- A trigger on a partition: the direct path leaves that partition's writes to the statements, which fire it.
SELECT idem_create_partition(date_trunc('hour', now()) + interval '50 days',
                             date_trunc('hour', now()) + interval '52 days') AS trigger_partition \gset
CREATE FUNCTION say_stored() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'trigger saw %', NEW.key;
    RETURN NEW;
END $$;
CREATE TRIGGER say_stored BEFORE INSERT ON :"trigger_partition" FOR EACH ROW EXECUTE FUNCTION say_stored();
SELECT complete_key('triggered', '"t"', interval '51 days');
SELECT outcome, response_body FROM idem_claim('triggered', idem_hash('triggered'));
DROP TRIGGER say_stored ON :"trigger_partition";
DROP FUNCTION say_stored();

-- Lease writes take the direct path too: an extension locks the partitions a lookup of its row locks (the
-- default partition, the range partitions from the latest bound down to the row's), not every partition as the
-- UPDATE statement did, and moves the row to the partition of its new expiry as a cross-partition UPDATE does.
SELECT lease_token AS lease_token, fencing_number AS first_fence
FROM idem_lease('leased', idem_hash('leased'), interval '1 minute', interval '2 hours') \gset
SELECT expires_at AS leased_expiry, lease_until AS leased_until, tableoid AS leased_in
FROM idempotency_keys_partitioned WHERE key = 'leased' \gset
BEGIN;
SELECT idem_lease_extend('leased', :'lease_token', interval '5 hours') > now() + interval '4 hours' AS extended;
SELECT range_partitions AS locked, default_partition FROM locked_partitions() \gset
COMMIT;
SELECT :locked = (SELECT count(*) FROM idem_partitions() p WHERE p.upper_bound > :'leased_expiry') AS down_to_the_row,
       :locked < (SELECT count(*) FROM idem_partitions()) AS not_all, :'default_partition'::boolean AS default_partition;
-- One row, in the partition whose bounds hold its new expiry, the key outliving its lease by as much as before,
-- its fencing number kept.
SELECT count(*) AS rows, bool_and(tableoid <> :'leased_in') AS moved,
       bool_and(tableoid::regclass::text = (SELECT partition_name FROM idem_partitions()
                                            WHERE lower_bound <= expires_at AND upper_bound > expires_at)) AS routed,
       bool_and(expires_at - lease_until = :'leased_expiry'::timestamptz - :'leased_until'::timestamptz) AS outlives,
       bool_and(fencing_number = :first_fence) AS fence_kept
FROM idempotency_keys_partitioned WHERE key = 'leased';
-- A checkpoint and a release in place; a takeover after the release keeps the recovery point, draws a larger
-- fencing number and moves the row to its later expiry.
SELECT idem_checkpoint('leased', :'lease_token', 'step 1', '{"done": 1}');
SELECT idem_lease_release('leased', :'lease_token');
SELECT tableoid AS released_in FROM idempotency_keys_partitioned WHERE key = 'leased' \gset
SELECT lease_token AS second_token, fencing_number > :first_fence AS fence_grew, outcome, recovery_point,
       recovery_state
FROM idem_lease('leased', idem_hash('leased'), interval '1 minute', interval '30 hours') \gset
SELECT :'fence_grew' AS fence_grew, :'outcome' AS outcome, :'recovery_point' AS recovery_point,
       :'recovery_state' AS recovery_state;
SELECT count(*) AS rows, bool_and(tableoid <> :'released_in') AS moved,
       bool_and(lease_token = :'second_token') AS second_holder
FROM idempotency_keys_partitioned WHERE key = 'leased';
-- The first holder's token is stale (55000, nothing written); the second holder completes, and it replays.
SELECT idem_lease_extend('leased', :'lease_token', interval '1 hour');
SELECT idem_lease_complete('leased', :'second_token', 201, '{"by": "second"}');
SELECT outcome, http_status, response_body FROM idem_claim('leased', idem_hash('leased'));
SELECT count(*) AS rows, bool_and(lease_token IS NULL AND lease_until IS NULL) AS lease_ended
FROM idempotency_keys_partitioned WHERE key = 'leased';
-- A transactional claim of a key whose lease ran out replaces the lease's row (an UPDATE), not a second row.
SELECT lease_token AS lapsed_token FROM idem_lease('lapsed', idem_hash('lapsed'), interval '1 minute') \gset
UPDATE idempotency_keys_partitioned SET lease_until = now() - interval '1 minute' WHERE key = 'lapsed';
SELECT complete_key('lapsed', '"replaced"');
SELECT count(*) AS rows, bool_and(lease_token IS NULL) AS lease_gone, min(response_body::text) AS body
FROM idempotency_keys_partitioned WHERE key = 'lapsed';
-- Privileges are the UPDATE statement's, on the parent: a role that may insert a lease's row but not update
-- it is refused the extension.
CREATE ROLE idem_lease_writer;
GRANT USAGE ON SCHEMA public TO idem_lease_writer;
GRANT SELECT, INSERT ON idempotency_keys, idempotency_keys_partitioned TO idem_lease_writer;
SET ROLE idem_lease_writer;
SELECT lease_token AS writer_token FROM idem_lease('writer', idem_hash('writer'), interval '1 minute') \gset
SELECT idem_lease_extend('writer', :'writer_token', interval '2 minutes');
RESET ROLE;
SELECT count(*) AS rows, bool_and(lease_until < now() + interval '90 seconds') AS not_extended
FROM idempotency_keys_partitioned WHERE key = 'writer';
DROP OWNED BY idem_lease_writer;
DROP ROLE idem_lease_writer;
-- A trigger on the partition a lease's row is in: its writes go to the statements, which fire it.
CREATE FUNCTION say_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'trigger saw % of %', TG_OP, OLD.key;
    RETURN NEW;
END $$;
CREATE TRIGGER say_updated BEFORE UPDATE ON :"trigger_partition" FOR EACH ROW EXECUTE FUNCTION say_updated();
SELECT lease_token AS far_token FROM idem_lease('far-lease', idem_hash('far-lease'), interval '1 minute',
                                                interval '51 days') \gset
SELECT idem_checkpoint('far-lease', :'far_token', 'far step');
SELECT recovery_point FROM idempotency_keys_partitioned WHERE key = 'far-lease';
DROP TRIGGER say_updated ON :"trigger_partition";
DROP FUNCTION say_updated();

-- Back to table storage for the suites after this one.
SELECT idem_set_storage('table') ~ '^table' AS table_mode;
DROP FUNCTION complete_key(text, jsonb, interval);
DROP FUNCTION locked_partitions();
TRUNCATE idempotency_keys;
