# Tombstones (1.4, issue 41) for keys stored by 1.3: keys claimed and completed through the 1.3 SQL (1.0's
# idem_claim and idem_complete, and the 1.3 clients' statements idem_claim_request and idem_complete_request under
# an account's scope), in both storage modes (in partitioned storage also keys in a partition that has expired whole), expire; the database
# is updated to 1.4. With idempotency.tombstone_ttl at its default 0 an expired key is claimed again as in 1.3,
# before and after the update. A DBA then turns tombstones on for the databases (ALTER DATABASE ... SET
# idempotency.tombstone_ttl = '30d'): the background sweeper turns the expired rows into tombstones (by batch
# delete, and before the expired partition's drop), and every late retry, with the request's payload or another,
# answers 'expired' (410) through idem_claim, idem_claim_wait, idem_lease and idem_claim_request, while the live
# keys still replay (a key stored by the 1.3 clients' statements: its bytes, through idem_claim_request). With tombstone_ttl lowered to 1s the sweeper removes the tombstones and the keys are
# claimed again.
# Fails on: an update without idempotency_tombstones, a sweeper that deletes expired rows without their
# tombstones (or tombstones leases), a claim that answers 'claimed' for a key within its tombstone ttl, a new
# outcome while tombstone_ttl is 0, tombstones never removed.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $node = IdemNode->create('tombstones', "idempotency.databases = 'postgres'", 'idempotency.cleanup_interval = 1s');
my %databases = (plain => 'table', parted => 'partitioned');
my $expiring = 12;

for my $db (sort keys %databases)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION idempotency VERSION '1.3'");
	$node->safe_psql($db, "SELECT idem_set_storage('partitioned', '1 hour')") if $databases{$db} eq 'partitioned';
	# Through 1.3's functions: keys that expire in 2 seconds, and live ones.
	$node->safe_psql($db, qq{
		DO \$\$ BEGIN
			FOR i IN 1..$expiring LOOP
				PERFORM idem_claim('late-' || i, idem_hash('late-' || i), interval '2 seconds');
				PERFORM idem_complete('late-' || i, 201, jsonb_build_object('charge', i));
			END LOOP;
			FOR i IN 1..3 LOOP
				PERFORM idem_claim('live-' || i, idem_hash('live-' || i), interval '1 hour');
				PERFORM idem_complete('live-' || i, 201, jsonb_build_object('charge', i));
			END LOOP;
		END \$\$});
	# Through the 1.3 clients' statements (clients/CONTRACT.md "Statements of 1.3": idem_claim_request with the
	# request's parts, content type NULL as 1.3 clients send it; idem_complete_request with the bytes answered),
	# under the scope of an account: keys that expire in 2 seconds, and a live one.
	for my $k ((map { ["rq-late-$_", '2 seconds'] } 1 .. 2), ['rq-live-1', '1 hour'])
	{
		my ($key, $ttl) = @$k;
		is($node->safe_psql($db, qq{BEGIN;
			SELECT (idem_claim_request('$key', 'acct_1', 'POST', '/payments', NULL, NULL,
			                           convert_to('{"amount_cents": 100, "order": "$key"}', 'UTF8'), '$ttl')).outcome;
			SELECT idem_complete_request('$key', 'acct_1', 201, 'application/json', '{"Location": "/payments/7"}',
			                             convert_to('{"payment_id": 7, "order": "$key"}', 'UTF8'));
			COMMIT;}), "claimed\nt", "$db: 1.3, $key stored through the 1.3 clients' statements");
	}
	if ($databases{$db} eq 'partitioned')
	{
		# A partition that has expired whole, with completed keys and a lease that ran out.
		$node->safe_psql($db, q{
			SELECT idem_create_partition(now() - interval '3 days', now() - interval '2 days');
			INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash,
			                                          lease_until)
			SELECT now() - interval '60 hours', now() - interval '4 days', 201, '', 'old-' || i,
			       decode(idem_hash('old-' || i), 'hex'), NULL
			FROM generate_series(1, 5) i
			UNION ALL SELECT now() - interval '60 hours', now() - interval '4 days', NULL, '', 'old-lease',
			       decode(idem_hash('old-lease'), 'hex'), now() - interval '60 hours'});
	}
}
sleep(3);

# A claim of an expired key in its own transaction, rolled back: its outcome.
sub late_claim
{
	my ($db, $key, $hash_of) = @_;
	return $node->safe_psql($db, qq{BEGIN; SELECT outcome FROM idem_claim('$key', idem_hash('$hash_of')); ROLLBACK;});
}

# A retry through the 1.3 clients' claim statement (idem_claim_request, content type NULL), in its own transaction,
# rolled back: outcome/http_status, and for a replay the bytes answered. $order: the request body's "order" (the
# key's own: the same request; another: another payload).
sub late_request
{
	my ($db, $key, $order) = @_;
	return $node->safe_psql($db, qq{BEGIN;
		SELECT (c).outcome || '/' || coalesce((c).http_status::text, '') || coalesce(' ' || convert_from((c).body, 'UTF8'), '')
		FROM (SELECT idem_claim_request('$key', 'acct_1', 'POST', '/payments', NULL, NULL,
		                                convert_to('{"amount_cents": 100, "order": "$order"}', 'UTF8')) AS c) s;
		ROLLBACK;});
}

for my $db (sort keys %databases)
{
	is(late_claim($db, 'late-1', 'late-1'), 'claimed', "$db: 1.3, an expired key is claimed again");
	is(late_request($db, 'rq-late-1', 'rq-late-1'), 'claimed/',
		"$db: 1.3, an expired key stored by the 1.3 clients' statements is claimed again through them");
	$node->safe_psql($db, "ALTER EXTENSION idempotency UPDATE TO '1.4'");
	is($node->safe_psql($db, 'SELECT count(*) FROM idempotency_tombstones'), '0',
		"$db: updated to 1.4, idempotency_tombstones exists, empty");
	is(late_claim($db, 'late-1', 'late-1'), 'claimed', "$db: 1.4 with tombstone_ttl 0: claimed again, as in 1.3");
	is(late_request($db, 'rq-late-1', 'rq-late-1'), 'claimed/',
		"$db: 1.4 with tombstone_ttl 0: a key stored by the 1.3 clients' statements is claimed again, as in 1.3");
	$node->safe_psql('postgres', "ALTER DATABASE $db SET idempotency.tombstone_ttl = '30d'");
}

# The sweeper takes both databases now, with each database's tombstone_ttl.
$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.databases = 'postgres, plain, parted'");
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
my $took = $node->wait_until('plain',
	"SELECT count(*) = $expiring FROM idempotency_tombstones WHERE key LIKE 'late-%'", 60);
ok(defined $took, 'plain: the sweeper turned the expired keys stored by 1.3 into tombstones');
is($node->safe_psql('plain', "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'late-%'"), '0',
	'plain: and deleted their rows');
$took = $node->wait_until('plain',
	"SELECT count(*) = 2 FROM idempotency_tombstones WHERE scope = 'acct_1' AND key LIKE 'rq-late-%'", 60);
ok(defined $took, 'plain: and the expired keys stored by the 1.3 clients\' statements too, under their scope');
$took = $node->wait_until('parted',
	"SELECT count(*) = 5 FROM idempotency_tombstones WHERE key LIKE 'old-%'", 60);
ok(defined $took, 'parted: the expired partition\'s completed keys became tombstones before its drop');
is($node->safe_psql('parted', q{SELECT count(*) FROM idem_partitions() WHERE upper_bound < now() - interval '1 day'}),
	'0', 'parted: the expired partition is dropped');
is($node->safe_psql('parted', q{SELECT count(*) FROM idempotency_tombstones WHERE key = 'old-lease'}), '0',
	'parted: a lease that ran out leaves no tombstone');

for my $db (sort keys %databases)
{
	my @late = $databases{$db} eq 'partitioned' ? ('late-2', 'old-1') : ('late-2');
	for my $key (@late)
	{
		is($node->safe_psql($db, qq{BEGIN;
			SELECT string_agg(o, ',') FROM (
				SELECT outcome || '/' || http_status AS o FROM idem_claim('$key', idem_hash('$key'))
				UNION ALL SELECT outcome || '/' || http_status FROM idem_claim('$key', idem_hash('another payload'))
				UNION ALL SELECT outcome || '/' || http_status FROM idem_claim_wait('$key', idem_hash('$key'), '10 ms')
				UNION ALL SELECT outcome || '/' || http_status FROM idem_lease('$key', idem_hash('$key'), '1 min')
				UNION ALL SELECT (c).outcome || '/' || (c).http_status
				          FROM (SELECT idem_claim_request('$key', '', 'POST', '/charges', '', 'application/json', '{}') AS c) s
			) a;
			ROLLBACK;}),
			'expired/410,expired/410,expired/410,expired/410,expired/410',
			"$db: a late retry of $key answers expired in every claim function, whatever its payload");
	}
	is($node->safe_psql($db, q{SELECT outcome || ' ' || response_body FROM idem_claim('live-1', idem_hash('live-1'))}),
		'replay {"charge": 1}', "$db: a live key stored by 1.3 still replays");
	for my $order ('rq-late-2', 'another order')
	{
		is(late_request($db, 'rq-late-2', $order), 'expired/410',
			"$db: a late retry ($order) of a key stored by the 1.3 clients' statements answers expired through "
			  . "idem_claim_request");
	}
	is(late_request($db, 'rq-live-1', 'rq-live-1'), 'replay/201 {"payment_id": 7, "order": "rq-live-1"}',
		"$db: a live key stored by the 1.3 clients' statements replays its bytes through idem_claim_request");
	is(late_claim($db, 'old-lease', 'old-lease'), 'claimed', "$db: an expired lease is taken over, not expired")
	  if $databases{$db} eq 'partitioned';
	$node->safe_psql('postgres', "ALTER DATABASE $db SET idempotency.tombstone_ttl = '1s'");
}

# Past the tombstone ttl the sweeper removes the tombstones, and the keys are claimed again.
for my $db (sort keys %databases)
{
	$took = $node->wait_until($db, 'SELECT count(*) = 0 FROM idempotency_tombstones', 60);
	ok(defined $took, "$db: the sweeper removed the tombstones past idempotency.tombstone_ttl");
	is(late_claim($db, 'late-3', 'late-3'), 'claimed', "$db: past the tombstone ttl the key is claimed again");
}

$node->stop;
done_testing();
