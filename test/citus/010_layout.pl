# The layouts of the key table on Citus: each unsupported one refused with its message (partitioned storage,
# keys local beside distributed tables, a tenant column of another type or collation, a reference table, a call
# on a worker), then idem_citus_distribute('accounts') and what it leaves: keys co-located with the accounts, an
# empty shell on the coordinator, a second call that changes nothing, and the refusals after it.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my ($coordinator, $worker1) = IdemNode->citus_cluster('layout', 2);
sub sql { my ($node, $statements) = @_; return scalar $node->safe_psql('app', $statements); }
my $dir = "$FindBin::RealBin";

# Keys stored before the layout exists: one unscoped, one of acct-1 (both local on the coordinator for now).
sql($coordinator, q{BEGIN; SELECT outcome FROM idem_claim('pre-unscoped', idem_hash('a'::text));
	SELECT idem_complete('pre-unscoped', 201, '{"pre": 1}'); COMMIT});
sql($coordinator, q{BEGIN; SELECT outcome FROM idem_claim('pre-1', idem_hash('a'::text), NULL, 'acct-1');
	SELECT idem_complete('pre-1', 201, '{"pre": 1}', NULL, 'acct-1'); COMMIT});
$coordinator->fails_like('app', q{CREATE TABLE plain_local (tenant text COLLATE "C");
	SELECT idem_citus_distribute('plain_local')},
	qr/is not distributed by Citus/, 'without distributed tables: idem_citus_distribute of a local table');
sql($coordinator, "SELECT idem_set_storage('partitioned', '1 hour')");
$coordinator->fails_like('app', q{CREATE TABLE t0 (tenant text COLLATE "C");
	SELECT create_distributed_table('t0', 'tenant'); SELECT idem_citus_distribute('t0')},
	qr/partitioned storage is not supported on Citus/, 'partitioned storage refused');
sql($coordinator, "SELECT idem_set_storage('table')");
sql($coordinator, slurp_file("$dir/schema.sql") . slurp_file("$dir/distribute.sql"));
$coordinator->fails_like('app', q{SELECT outcome FROM idem_claim('local-1', idem_hash('a'::text), NULL, 'acct-1')},
	qr/idempotency_keys is local on this node while Citus distributes other tables/,
	'keys local on the coordinator beside distributed tables: a claim refuses');
sql($coordinator, q{CREATE TABLE by_number (tenant bigint); SELECT create_distributed_table('by_number', 'tenant');
	CREATE TABLE by_default_collation (tenant text);
	SELECT create_distributed_table('by_default_collation', 'tenant');
	CREATE TABLE currencies (code text COLLATE "C" PRIMARY KEY); SELECT create_reference_table('currencies')});
$coordinator->fails_like('app', "SELECT idem_citus_distribute('by_number')",
	qr/by_number.tenant is bigint COLLATE none.*HINT:.*/
	  . qr/ALTER TABLE (public.)?by_number ALTER COLUMN tenant TYPE text COLLATE "C"/,
	'a bigint tenant column: refused with the fix');
$coordinator->fails_like('app', "SELECT idem_citus_distribute('by_default_collation')",
	qr/by_default_collation.tenant is text COLLATE "default"/, 'a text tenant column of another collation: refused');
$coordinator->fails_like('app', "SELECT idem_citus_distribute('currencies')",
	qr/currencies is a reference table/, 'a reference table: refused');
$worker1->fails_like('app', "SELECT idem_citus_distribute('accounts')",
	qr/must run on the Citus coordinator/, 'idem_citus_distribute on a worker: refused');

my ($rc, $stdout, $stderr) = $coordinator->psql('app', "SELECT idem_citus_distribute('accounts')");
note($stdout, $stderr);
like($stdout, qr/distributed by scope, co-located with (public.)?accounts; 12 functions delegated/,
	"idem_citus_distribute('accounts')");
like($stderr,
	qr/WARNING:  idem_citus_distribute: 1 stored keys have no scope; all unscoped keys land on one shard/,
	'unscoped keys: warned');
is(sql($coordinator, q{SELECT (SELECT colocationid FROM pg_dist_partition
	                              WHERE logicalrelid = 'idempotency_keys'::regclass)
	= (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'accounts'::regclass)}),
	't', "the keys' shards are co-located with the accounts'");
is(sql($coordinator, "SELECT pg_relation_size('idempotency_keys')"), '0',
	"the coordinator's shell is empty after distributing");
like(sql($coordinator, "SELECT idem_citus_distribute('accounts')"), qr/12 functions delegated/,
	'a second call changes nothing');
$coordinator->fails_like('app', "SELECT undistribute_table('idempotency_keys')", qr/extension/,
	'undistributing the keys: refused');
$coordinator->fails_like('app', "SELECT idem_set_storage('partitioned')",
	qr/partitioned storage is not supported for keys distributed by Citus/,
	'partitioned storage after distributing: refused by idem_set_storage');
$coordinator->fails_like('app', q{CREATE TABLE other_tenants (tenant text COLLATE "C");
	SELECT create_distributed_table('other_tenants', 'tenant', colocate_with => 'none');
	SELECT idem_citus_distribute('other_tenants')},
	qr/already in Citus's metadata, not co-located with (public.)?other_tenants/,
	'another co-location afterwards: refused');

# Tombstones (1.4) are not supported on a distributed key table: idempotency.tombstone_ttl above 0 is refused
# with 0A000 where a session sets it (SET, set_config), and where it comes from elsewhere (the startup options,
# ALTER DATABASE on the coordinator) by every claim, by idem_cleanup() and by the background sweeper; back at 0
# the claims work as before.
my $refused = qr/0A000: idempotency: tombstones are not supported on a Citus-distributed key table/;
for my $node ($coordinator, $worker1)
{
	$node->fails_like('app', "\\set VERBOSITY verbose\nSET idempotency.tombstone_ttl = '30d'", $refused,
		"$node->{citus_name}: SET idempotency.tombstone_ttl above 0 refused");
	$node->fails_like('app', "\\set VERBOSITY verbose\nSELECT set_config('idempotency.tombstone_ttl', '1h', true)",
		$refused, "$node->{citus_name}: set_config of idempotency.tombstone_ttl above 0 refused");
}
is(sql($worker1, "SET idempotency.tombstone_ttl = 0; SHOW idempotency.tombstone_ttl"), '0', 'SET to 0 is allowed');
{
	# A value the session did not SET (here the client's startup options, which reach no other node): every claim
	# and sweep of that session refuses.
	local $ENV{PGOPTIONS} = '-c idempotency.tombstone_ttl=30d';
	$worker1->fails_like('app', "\\set VERBOSITY verbose\nSELECT idem_claim('late-1', idem_hash('a'::text), NULL, 'acct-1')",
		$refused, "worker1 with tombstone_ttl from the startup options: a claim refuses");
	for my $node ($coordinator, $worker1)
	{
		$node->fails_like('app', "\\set VERBOSITY verbose\nSELECT idem_cleanup()", $refused,
			"$node->{citus_name} with tombstone_ttl from the startup options: idem_cleanup() refuses");
	}
}
# ALTER DATABASE on the coordinator (Citus refuses it on a worker and propagates it to the workers): a claim
# delegated to the scope's worker refuses there, and every node's sweeper refuses.
sql($coordinator, "ALTER DATABASE app SET idempotency.tombstone_ttl = '30d'");
is(sql($worker1, 'SHOW idempotency.tombstone_ttl'), '30d', "the coordinator's ALTER DATABASE reached worker1");
$coordinator->fails_like('app', "\\set VERBOSITY verbose\nSELECT idem_claim('late-2', idem_hash('a'::text), NULL, 'acct-1')",
	$refused, 'with ALTER DATABASE ... SET tombstone_ttl: a claim through the coordinator refuses');
for my $node ($coordinator, $worker1)
{
	ok($node->poll_query_until('app', "SELECT coalesce(last_error, '') LIKE "
		  . "'%tombstones are not supported on a Citus-distributed key table%' FROM idem_stats"),
		"$node->{citus_name} with ALTER DATABASE ... SET tombstone_ttl: its sweeper refuses (idem_stats.last_error)");
}
sql($coordinator, 'ALTER DATABASE app RESET idempotency.tombstone_ttl');
is(sql($coordinator, q{SELECT outcome FROM idem_claim('after-reset', idem_hash('a'::text), NULL, 'acct-1')}),
	'claimed', 'tombstone_ttl back at 0: a claim works again');

done_testing();
