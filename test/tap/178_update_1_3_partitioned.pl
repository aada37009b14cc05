# ALTER EXTENSION idempotency UPDATE from 1.3 to 1.4 with the keys in partitioned storage (issue 39, whose direct
# path reads and writes the partitions without SPI): the database is made at 1.3 (the frozen scripts, 1.0 and its
# update steps), switched to partitioned storage with 1-hour partitions, and keys are stored through the 1.3
# functions: completed keys in several partitions (jsonb and bytes responses), a key parked in the default
# partition (its ttl beyond the premade partitions), an expired key in a live partition, a partition expired whole,
# and leases with their fencing numbers: one held across the update (a transactional claim cannot be: the update
# takes the key table's lock, so a lease is how a key stays in flight across it), one that runs out. After the
# update every stored key replays with its response, the held lease answers in_progress to others and its holder
# checkpoints and completes with its 1.3 token, the lapsed lease is taken over with a fencing number above the one
# 1.3 handed out and the stale holder is fenced off (55000), expired keys are claimed again, new keys are claimed
# and stored in the partition of their expiry, and the sweeper drops the expired partition while the live keys
# keep replaying.
# Fails on: an update that misses a partition (a column absent from one), a stored key that does not replay after
# the update (a partition or the default partition not looked at), a held lease lost or its token refused, a
# fencing number not above 1.3's, a stale holder's write accepted, a new key stored outside its own range, an
# expired partition the sweeper leaves.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $node = IdemNode->create('update_1_3_parted', 'idempotency.cleanup_interval = 1s');
my $db = 'parted';
my $keys = 30;

$node->safe_psql('postgres', "CREATE DATABASE $db");
$node->safe_psql($db, "CREATE EXTENSION idempotency VERSION '1.3'");
$node->safe_psql($db, "SELECT idem_set_storage('partitioned', '1 hour')");
is($node->safe_psql($db, 'SELECT extversion || \' \' || idem_storage_mode() FROM pg_extension WHERE extname = \'idempotency\''),
	'1.3 partitioned', '1.3, partitioned storage');

# Through 1.3's functions: completed keys whose ttls (1 to 12 hours) spread them over the partitions, bytes
# responses, a key parked in the default partition, and a key that expires in 2 seconds.
$node->safe_psql($db, qq{
	DO \$\$ BEGIN
		FOR i IN 1..$keys LOOP
			PERFORM idem_claim('done-' || i, idem_hash('done-' || i), make_interval(hours => 1 + i % 12));
			PERFORM idem_complete('done-' || i, 201, jsonb_build_object('charge', i));
		END LOOP;
		FOR i IN 1..3 LOOP
			PERFORM idem_claim_request('bytes-' || i, '', 'POST', '/charges', NULL, 'text/plain', convert_to('b' || i, 'UTF8'));
			PERFORM idem_complete_request('bytes-' || i, '', 201, 'text/plain', NULL, convert_to('paid ' || i, 'UTF8'));
		END LOOP;
		PERFORM idem_claim('far', idem_hash('far'), interval '400 days');
		PERFORM idem_complete('far', 201, jsonb_build_object('charge', 'far'));
		PERFORM idem_claim('short', idem_hash('short'), interval '2 seconds');
		PERFORM idem_complete('short', 201, jsonb_build_object('charge', 'short'));
	END \$\$});
# A partition that has expired whole, with completed keys.
$node->safe_psql($db, q{
	SELECT idem_create_partition(now() - interval '3 days', now() - interval '2 days');
	INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash, response_body)
	SELECT now() - interval '60 hours', now() - interval '4 days', 201, '', 'old-' || i,
	       decode(idem_hash('old-' || i), 'hex'), jsonb_build_object('charge', i)
	FROM generate_series(1, 5) i});
# Leases through 1.3: one held across the update (1 hour), one that runs out (2 seconds).
my ($held_token, $held_fence) = split /\|/, $node->safe_psql($db,
	q{SELECT lease_token, fencing_number FROM idem_lease('lease-held', idem_hash('lease-held'), '1 hour')});
my ($lapsed_token, $lapsed_fence) = split /\|/, $node->safe_psql($db,
	q{SELECT lease_token, fencing_number FROM idem_lease('lease-lapsed', idem_hash('lease-lapsed'), '2 seconds')});
ok($held_token && $held_fence && $lapsed_fence, "1.3 handed out leases (fencing numbers $held_fence, $lapsed_fence)");
is($node->safe_psql($db, q{SELECT count(*) FROM idempotency_keys_partitioned
	WHERE tableoid = 'idempotency_keys_partitioned_default'::regclass AND key = 'far'}), '1',
	'the 400-day key is parked in the default partition');
my $partitions = $node->safe_psql($db, 'SELECT count(*) FROM idem_partitions()');
cmp_ok($partitions, '>=', 14, "1.3 made $partitions partitions");
sleep(3);    # 'short' and 'lease-lapsed' run out

$node->safe_psql($db, "ALTER EXTENSION idempotency UPDATE TO '1.4'");
is($node->safe_psql($db, q{SELECT extversion || ' ' || idem_storage_mode() FROM pg_extension WHERE extname = 'idempotency'}),
	'1.4 partitioned', 'updated to 1.4, storage still partitioned');
is($node->safe_psql($db, 'SELECT count(*) FROM idem_partitions()'), $partitions, 'every partition kept');
is($node->safe_psql($db, q{SELECT count(*) FILTER (WHERE NOT EXISTS (SELECT FROM pg_attribute a
	WHERE a.attrelid = i.inhrelid AND a.attname = 'fencing_number' AND NOT a.attisdropped))
	FROM pg_inherits i WHERE i.inhparent = 'idempotency_keys_partitioned'::regclass}), '0',
	'every partition, the default one too, has the 1.4 column');

# Every stored key replays with its response, in a fresh session (nothing cached from before the update) and
# again in the same session.
my $replays = qq{SELECT count(*) FILTER (WHERE c.outcome = 'replay' AND c.http_status = 201
	AND c.response_body = jsonb_build_object('charge', i)) FROM generate_series(1, $keys) i,
	LATERAL idem_claim('done-' || i, idem_hash('done-' || i), make_interval(hours => 1 + i % 12)) c};
is($node->safe_psql($db, "$replays; $replays"), "$keys\n$keys", "every completed 1.3 key replays ($keys keys, twice)");
is($node->safe_psql($db, q{SELECT string_agg((c).outcome || ' ' || convert_from((c).body, 'UTF8'), ', ' ORDER BY i)
	FROM generate_series(1, 3) i, LATERAL (SELECT idem_claim_request('bytes-' || i, '', 'POST', '/charges', NULL,
	'text/plain', convert_to('b' || i, 'UTF8')) AS c) s}),
	'replay paid 1, replay paid 2, replay paid 3', 'the bytes responses replay as their bytes');
is($node->safe_psql($db, q{SELECT outcome || ' ' || response_body FROM idem_claim('far', idem_hash('far'), interval '400 days')}),
	'replay {"charge": "far"}', 'the key in the default partition replays');
is($node->safe_psql($db, q{BEGIN; SELECT outcome FROM idem_claim('short', idem_hash('short')); ROLLBACK;}),
	'claimed', 'an expired key in a live partition is claimed again');

# The lease held across the update: others get in_progress; its holder, with its 1.3 token, checkpoints and
# completes; then it replays.
is($node->safe_psql($db, q{SELECT outcome FROM idem_claim('lease-held', idem_hash('lease-held'))}), 'in_progress',
	'the lease held across the update answers in_progress to a claim');
is($node->safe_psql($db, q{SELECT outcome FROM idem_lease('lease-held', idem_hash('lease-held'), '1 min')}),
	'in_progress', '... and to a lease');
$node->safe_psql($db, qq{SELECT idem_checkpoint('lease-held', '$held_token', 'charged', '{"step": 1}')});
is($node->safe_psql($db, qq{SELECT idem_lease_complete('lease-held', '$held_token', 201, '{"charge": "held"}')}), 't',
	'its holder checkpoints and completes with the token 1.3 gave it');
is($node->safe_psql($db, q{SELECT outcome || ' ' || response_body FROM idem_claim('lease-held', idem_hash('lease-held'))}),
	'replay {"charge": "held"}', 'and the key replays');

# The lapsed lease: a takeover's fencing number is above 1.3's; the stale holder is fenced off.
my ($new_token, $new_fence, $outcome) = split /\|/, $node->safe_psql($db,
	q{SELECT lease_token, fencing_number, outcome FROM idem_lease('lease-lapsed', idem_hash('lease-lapsed'), '1 min')});
is($outcome, 'claimed', 'the lapsed lease is taken over');
cmp_ok($new_fence, '>', $lapsed_fence, "its fencing number is above the one 1.3 handed out ($new_fence > $lapsed_fence)");
cmp_ok($new_fence, '>', $held_fence, 'and above every number 1.3 handed out');
$node->fails_like($db, qq{SELECT idem_lease_complete('lease-lapsed', '$lapsed_token', 201, '{"by": "stale"}')},
	qr/not the current one/, 'the stale 1.3 holder cannot complete (55000)');
is($node->safe_psql($db, qq{SELECT idem_lease_complete('lease-lapsed', '$new_token', 201, '{"by": "new"}')}), 't',
	'the new holder completes');
is($node->safe_psql($db, q{SELECT outcome || ' ' || response_body FROM idem_claim('lease-lapsed', idem_hash('lease-lapsed'))}),
	'replay {"by": "new"}', 'and its response is the one stored');

# New keys: claimed, stored in the partition of their expiry (or the default one beyond the premade partitions).
$node->safe_psql($db, q{
	DO $$ BEGIN
		FOR i IN 1..10 LOOP
			IF (idem_claim('new-' || i, idem_hash('new-' || i), make_interval(hours => i))).outcome <> 'claimed' THEN
				RAISE EXCEPTION 'new-% not claimed', i;
			END IF;
			PERFORM idem_complete('new-' || i, 201, jsonb_build_object('new', i));
		END LOOP;
	END $$});
is($node->safe_psql($db, q{SELECT count(*) FILTER (WHERE k.expires_at >= p.lower_bound AND k.expires_at < p.upper_bound)
	|| ' of ' || count(*) FROM idempotency_keys_partitioned k
	JOIN idem_partitions() p ON p.partition_name = k.tableoid::regclass::name WHERE k.key LIKE 'new-%'}),
	'10 of 10', 'new keys are claimed and stored in the partition of their expiry');
is($node->safe_psql($db, q{SELECT count(*) FILTER (WHERE (idem_claim('new-' || i, idem_hash('new-' || i))).outcome = 'replay')
	FROM generate_series(1, 10) i}), '10', 'and replay');

# The sweeper, once it serves the database, drops the expired partition; its keys are claimable, the rest replay.
is($node->safe_psql($db, q{SELECT count(*) FROM idem_partitions() WHERE upper_bound <= now() - interval '1 day'}), '1',
	'the partition expired whole is still there before the sweeper serves the database');
$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.databases = 'postgres, $db'");
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
my $took = $node->wait_until($db, q{SELECT count(*) = 0 FROM idem_partitions() WHERE upper_bound <= now() - interval '1 day'}, 60);
ok(defined $took, 'the sweeper dropped the partition that had expired whole' . (defined $took ? " (${took}s)" : ''));
is($node->safe_psql($db, q{SELECT count(*) FROM idempotency_keys_partitioned WHERE key LIKE 'old-%'}), '0',
	'with its keys');
is($node->safe_psql($db, q{BEGIN; SELECT outcome FROM idem_claim('old-1', idem_hash('old-1')); ROLLBACK;}), 'claimed',
	'a key of the dropped partition is claimed again');
is($node->safe_psql($db, $replays), $keys, 'the live 1.3 keys still replay after the sweep');

$node->stop;
done_testing();
