# ALTER EXTENSION idempotency UPDATE from 1.0 to 1.1, in both storage modes.
# Before the update the 1.1 library serves the 1.0 SQL as 1.0 did (claims, replays,
# completions, stats); after it every key stored at 1.0 still replays, lease mode
# works in both modes, and a fresh 1.1 install has the same objects as an updated one.
# Fails on: a 1.0 key that no longer replays, a 1.0 database the library cannot
# serve, an update script that misses an object, or lease rows the partitioned
# storage or the cleanup cannot handle.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $node = IdemNode->new('update');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\nlog_statement = none\n");
$node->start;

my %databases = (plain => 'table', parted => 'partitioned');
my $keys = 200;

for my $db (sort keys %databases)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION idempotency VERSION '1.0'");
	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
		'1.0', "$db: installed at 1.0");
	$node->safe_psql($db, "SELECT idem_set_storage('partitioned', '1 hour')")
	  if $databases{$db} eq 'partitioned';
	is($node->safe_psql($db, 'SELECT idem_storage_mode()'), $databases{$db}, "$db: $databases{$db} storage");

	# The 1.1 library serves the 1.0 SQL: keys claimed and completed, one by one.
	my $stored = 0;
	for my $i (1 .. $keys)
	{
		$stored += $node->safe_psql($db, qq{
			BEGIN;
			SELECT outcome FROM idem_claim('key-$i', idem_hash('body-$i'), scope => 'tenant-' || ($i % 3));
			SELECT idem_complete('key-$i', 201, jsonb_build_object('payment', $i),
			                     '{"Location": "/payments/$i"}', 'tenant-' || ($i % 3));
			COMMIT;}) =~ /claimed\s+t$/ ? 1 : 0;
	}
	is($stored, $keys, "$db: $keys keys claimed and completed at 1.0 SQL");
	is($node->safe_psql($db, "SELECT outcome || ' ' || http_status FROM idem_claim('key-1', idem_hash('body-1'), scope => 'tenant-1')"),
		'replay 201', "$db: replay at 1.0 SQL");
	is($node->safe_psql($db, "SELECT outcome FROM idem_claim('key-1', idem_hash('other'), scope => 'tenant-1')"),
		'mismatch', "$db: mismatch at 1.0 SQL");
	is($node->safe_psql($db, 'SELECT count(*) FROM idem_stats'), '1', "$db: idem_stats (19 columns) reads at 1.0");
	is($node->safe_psql($db, "SELECT count(*) FROM pg_proc WHERE proname = 'idem_lease'"), '0',
		"$db: no lease functions before the update");

	$node->safe_psql($db, "ALTER EXTENSION idempotency UPDATE TO '1.1'");
	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
		'1.1', "$db: updated to 1.1");
	is($node->safe_psql($db, 'SELECT idem_storage_mode()'), $databases{$db}, "$db: storage mode kept");

	# Every key stored at 1.0 replays its body and headers, in its own scope only.
	my $replayed = $node->safe_psql($db, qq{
		SELECT count(*) FROM generate_series(1, $keys) i,
		     LATERAL idem_claim('key-' || i, idem_hash('body-' || i), scope => 'tenant-' || (i % 3)) c
		WHERE c.outcome = 'replay' AND c.http_status = 201
		  AND c.response_body = jsonb_build_object('payment', i)
		  AND c.response_headers = jsonb_build_object('Location', '/payments/' || i)});
	is($replayed, $keys, "$db: all $keys keys stored at 1.0 replay after the update");
	is($node->safe_psql($db, "SELECT outcome FROM idem_lease('key-2', idem_hash('body-2'), '1 min', scope => 'tenant-2')"),
		'replay', "$db: a 1.0 key replays through idem_lease too");
	is($node->safe_psql($db, "SELECT outcome FROM idem_claim('key-2', idem_hash('body-2'), scope => 'tenant-1')"),
		'claimed', "$db: another scope does not see the key");

	# Lease mode on the updated database: lease, checkpoint, takeover, completion, replay.
	# The lease must outlive several psql starts on a busy machine (5 s), and the takeover is polled for.
	my $token = $node->safe_psql($db, "SELECT lease_token FROM idem_lease('lease-1', idem_hash('l'), '5 s')");
	like($token, qr/^[0-9a-f-]{36}$/, "$db: a lease token");
	$node->safe_psql($db, "SELECT idem_checkpoint('lease-1', '$token', 'charge_created', '{\"charge\": \"ch_1\"}')");
	is($node->safe_psql($db, "SELECT outcome FROM idem_lease('lease-1', idem_hash('l'), '1 min')"),
		'in_progress', "$db: the live lease answers in_progress");
	my ($outcome, $point, $new_token);
	my $deadline = time + 60;
	do
	{
		sleep 1;
		($outcome, $point, $new_token) = split /\|/, $node->safe_psql($db,
			"SELECT outcome, recovery_point, lease_token FROM idem_lease('lease-1', idem_hash('l'), '1 min')");
	} while ($outcome eq 'in_progress' && time < $deadline);
	is("$outcome $point", 'claimed charge_created', "$db: takeover resumes at the recovery point");
	my ($rc, $out, $err) = $node->psql($db, "SELECT idem_lease_complete('lease-1', '$token', 201)");
	like($err, qr/lease token is not the current one/, "$db: the stale holder cannot complete");
	is($node->safe_psql($db, "SELECT idem_lease_complete('lease-1', '$new_token', 201, '{\"ok\": true}')"),
		't', "$db: the new holder completes");
	is($node->safe_psql($db, "SELECT outcome || ' ' || response_body FROM idem_claim('lease-1', idem_hash('l'))"),
		'replay {"ok": true}', "$db: the leased key replays through idem_claim");

	# Expired lease rows go like expired responses: deleted by the cleanup in table storage, with
	# their partition in partitioned storage (until then they behave as absent).
	$node->safe_psql($db, "SELECT idem_lease('lease-short', idem_hash('s'), '1 s', ttl => '1 s')");
	$node->safe_psql($db, qq{
		BEGIN; SELECT idem_claim('done-short', idem_hash('d'), ttl => '1 s');
		SELECT idem_complete('done-short', 200); COMMIT;});
	sleep 2;
	if ($databases{$db} eq 'table')
	{
		$node->safe_psql($db, 'SELECT idem_cleanup()');
		is($node->safe_psql($db, "SELECT count(*) FROM idempotency_keys WHERE key IN ('lease-short', 'done-short')"),
			'0', "$db: the cleanup removes an expired lease and an expired response alike");
	}
	else
	{
		is($node->safe_psql($db, "SELECT string_agg(outcome, ',') FROM (SELECT (idem_lease(k, idem_hash('new'), '1 min')).outcome FROM unnest(ARRAY['lease-short', 'done-short']) k) c"),
			'claimed,claimed', "$db: an expired lease and an expired response behave as absent");
	}
	like($node->safe_psql($db, 'SELECT leases || \',\' || lease_takeovers || \',\' || checkpoints FROM idem_stats'),
		qr/^\d+,[1-9]\d*,[1-9]\d*$/, "$db: idem_stats counts leases, takeovers and checkpoints");
}

# Updated on to 1.4, a 1.0 database has the same objects as a fresh 1.4 install (definitions compared in
# 148_install_equals_update.pl).
$node->safe_psql($_, "ALTER EXTENSION idempotency UPDATE") for sort keys %databases;
is($node->safe_psql('plain', "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"), '1.4',
	'updated on to 1.4');
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
my $objects = q{
	SELECT string_agg(pg_describe_object(classid, objid, objsubid), E'\n'
	                  ORDER BY pg_describe_object(classid, objid, objsubid))
	FROM pg_depend WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
	  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')};
my $columns = q{
	SELECT string_agg(attrelid::regclass || '.' || attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attrelid::regclass::text, attnum)
	FROM pg_attribute WHERE attrelid IN ('idempotency_keys'::regclass, 'idempotency_keys_partitioned'::regclass)
	  AND attnum > 0 AND NOT attisdropped};
is($node->safe_psql('plain', $objects), $node->safe_psql('fresh', $objects),
	'an updated database has the same extension objects as a fresh 1.4 install');
is($node->safe_psql('plain', $columns), $node->safe_psql('fresh', $columns),
	'and the same columns in the same order');

$node->stop;
done_testing();
