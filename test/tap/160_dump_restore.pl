# pg_dump and pg_restore keep every key and the storage mode, in both modes.
# A database in table storage and one in partitioned storage (with one key parked in
# the default partition, beyond the partitions made ahead) are dumped with pg_dump -Fc
# and restored into fresh databases. The restore must finish without an error, come
# back in the same mode, and every completed key must replay with its stored response;
# a new key is claimed and stored in the restored mode.
# 1.2: a key at the maximum ttl (3650 days) and a lease at the maximum lease and ttl survive the round trip (a
# timestamp past the last one would make the restore lose every key), and the fencing numbers go on increasing
# after the restore (the sequence's position is dumped).
# Fails on: a restore that errors (the 1.0 marker made every ATTACH fail), partitioned
# storage restored as table storage, a key that no longer replays, or a lost parked key.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $node = IdemNode->create('dump');

my %modes = (plain => 'table', parted => 'partitioned');
my $keys = 300;
my $dump_dir = PostgreSQL::Test::Utils::tempdir;

for my $db (sort keys %modes)
{
	my $mode = $modes{$db};
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	$node->safe_psql($db, "SELECT idem_set_storage('partitioned', '1 hour')") if $mode eq 'partitioned';
	$node->safe_psql($db, qq{
		DO \$\$ BEGIN
		  FOR i IN 1..$keys LOOP
		    PERFORM idem_claim('key-' || i, idem_hash('body-' || i), scope => 'tenant-' || (i % 3));
		    PERFORM idem_complete('key-' || i, 201, jsonb_build_object('payment', i),
		                          jsonb_build_object('Location', '/payments/' || i), 'tenant-' || (i % 3));
		  END LOOP;
		  -- Thirty days out: beyond every partition made ahead, so it waits in the default one.
		  PERFORM idem_claim('parked', idem_hash('parked'), interval '30 days');
		  PERFORM idem_complete('parked', 200, '"parked"');
		  -- The longest ttl, and the longest lease with the longest ttl after it.
		  PERFORM idem_claim('longest', idem_hash('longest'), interval '3650 days');
		  PERFORM idem_complete('longest', 201, '"ten years"');
		END \$\$;});
	my $fence_before = $node->safe_psql($db,
		"SELECT fencing_number FROM idem_lease('longest-lease', idem_hash('l'), interval '365 days', interval '3650 days')");
	if ($mode eq 'partitioned')
	{
		is($node->safe_psql($db, "SELECT count(*) FROM ONLY idempotency_keys_partitioned_default WHERE key = 'parked'"), '1',
			"$db: one key parked in the default partition");
	}

	my $file = "$dump_dir/$db.dump";
	$node->command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr($db), '-f', $file ], "$db: pg_dump");
	$node->safe_psql('postgres', "CREATE DATABASE ${db}_restored");
	# --exit-on-error: any failed statement (an ATTACH, a COPY) fails the restore.
	$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr("${db}_restored"), $file ],
		"$db: pg_restore without an error");

	my $restored = "${db}_restored";
	is($node->safe_psql($restored, 'SELECT idem_storage_mode()'), $mode, "$db: restored in $mode storage");
	is($node->safe_psql($restored, qq{
		SELECT count(*) FROM generate_series(1, $keys) i,
		     LATERAL idem_claim('key-' || i, idem_hash('body-' || i), scope => 'tenant-' || (i % 3)) c
		WHERE c.outcome = 'replay' AND c.http_status = 201
		  AND c.response_body = jsonb_build_object('payment', i)
		  AND c.response_headers = jsonb_build_object('Location', '/payments/' || i)}),
		$keys, "$db: all $keys keys replay their stored response after the restore");
	is($node->safe_psql($restored, "SELECT outcome || ' ' || response_body FROM idem_claim('parked', idem_hash('parked'))"),
		'replay "parked"', "$db: the parked key replays");
	is($node->safe_psql($restored, "SELECT outcome || ' ' || response_body FROM idem_claim('longest', idem_hash('longest'))"),
		'replay "ten years"', "$db: the key at the maximum ttl replays");
	is($node->safe_psql($restored, "SELECT outcome FROM idem_lease('longest-lease', idem_hash('l'), '1 min')"),
		'in_progress', "$db: the lease at the maximum lease is still held");
	my $fence_after = $node->safe_psql($restored,
		"SELECT fencing_number FROM idem_lease('fence-after-restore', idem_hash('f'), '1 min')");
	cmp_ok($fence_after, '>', $fence_before, "$db: fencing numbers go on increasing after the restore");
	is($node->safe_psql($restored, "SELECT outcome FROM idem_claim('key-1', idem_hash('other'), scope => 'tenant-1')"),
		'mismatch', "$db: another payload is still a mismatch");
	is($node->safe_psql($restored, "SELECT outcome FROM idem_claim('key-1', idem_hash('body-1'), scope => 'tenant-2')"),
		'claimed', "$db: scopes stay apart");

	# The restored database keeps working in its mode: a new key lands in the active table.
	$node->safe_psql($restored, q{
		BEGIN;
		SELECT idem_claim('after-restore', idem_hash('new'));
		SELECT idem_complete('after-restore', 201, '"new"');
		COMMIT;});
	my $table = $mode eq 'partitioned' ? 'idempotency_keys_partitioned' : 'ONLY idempotency_keys';
	is($node->safe_psql($restored, "SELECT count(*) FROM $table WHERE key = 'after-restore'"), '1',
		"$db: a new key is stored in the $mode table after the restore");
	if ($mode eq 'partitioned')
	{
		is($node->safe_psql($restored, 'SELECT count(*) FROM idem_partitions()'),
			$node->safe_psql($db, 'SELECT count(*) FROM idem_partitions()'),
			"$db: every partition is attached again");
		is($node->safe_psql($restored, 'SELECT count(*) FROM ONLY idempotency_keys'), '0',
			"$db: the plain table stays empty");
		is($node->safe_psql($restored, 'SELECT idem_premake_partitions() >= 0'), 't',
			"$db: the worker's partition upkeep runs on the restored database");
	}
	is($node->safe_psql($restored, 'SELECT count(*) FROM pg_constraint WHERE conname = \'idempotency_keys_inactive\''),
		'0', "$db: no storage marker to get out of step");
}

$node->stop;
done_testing();
