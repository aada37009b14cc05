# Shard moves under load on Citus. A claim held while its shard is moved: the claim holds Citus's shard metadata
# lock (the direct path takes it at the claim's lookup), so the move waits for the claim's transaction and then
# moves its completed row. Then the shards of two busy tenants (one on each worker; keys, accounts and ledger
# move together) are moved to the other worker and back (block_writes and force_logical) while 8 clients pay
# to those tenants with retries and a lease client takes their leased keys over again and again
# (test/citus/load.pl prints the checks: nothing debited twice, lost or stuck, every move done, fencing numbers
# never going backwards). IDEM_CITUS_MOVE_KEYS (600) and IDEM_CITUS_LOAD_CLIENTS (8) size the load.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my @nodes = IdemNode->citus_cluster('move', 2);
my ($coordinator, $worker1, $worker2) = @nodes;
sub sql { my ($node, $statements) = @_; return scalar $node->safe_psql('app', $statements); }
sub name_of { return $_[0]->{citus_name}; }
$coordinator->citus_distribute;

my %account_on;
for my $i (1 .. 40)
{
	$account_on{ name_of($coordinator->citus_node_of(\@nodes, 'accounts', "acct-$i")) } //= "acct-$i";
	last if $account_on{worker1} && $account_on{worker2};
}
my ($a1, $a2) = @account_on{qw(worker1 worker2)};

# ---- a held claim and a move ----
my $owner = $coordinator->citus_node_of(\@nodes, 'accounts', $a1);
my ($other) = grep { $_ != $owner && $_ != $coordinator } @nodes;
my $shard = sql($coordinator, "SELECT get_shard_id_for_distribution_column('idempotency_keys', '$a1')");
my $holder = $owner->background_psql('app');
$holder->query_safe('BEGIN');
$holder->query_safe("SELECT outcome FROM idem_claim('moved-held', idem_hash('a'::text), NULL, '$a1')");
my $holder_pid = $holder->query_safe('SELECT pg_backend_pid()');
is(sql($owner, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 8 AND mode = 'ShareLock'
                AND granted AND pid = $holder_pid"), '1', "a held claim holds Citus's shard metadata lock");
my $mover = $coordinator->background_psql('app');
$mover->query_until(qr/moving/, "\\echo moving\nSELECT citus_move_shard_placement($shard,
	'127.0.0.1', ${\ $owner->port}, '127.0.0.1', ${\ $other->port}, 'block_writes');\n");
# With room for a slow start of the move on two busy cores.
ok(defined $owner->wait_until('app', "SELECT count(*) >= 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 8
	AND mode = 'ExclusiveLock' AND NOT granted", 8), "the move waits for the claim's transaction");
$holder->query_safe("SELECT idem_complete('moved-held', 201, '{\"held\": 1}', NULL, '$a1')");
$holder->query_safe('COMMIT');
$holder->quit;
$mover->quit;
is(name_of($coordinator->citus_node_of(\@nodes, 'accounts', $a1)), name_of($other),
	'after the move the shard is on ' . name_of($other));
for my $from (@nodes)
{
	is(sql($from, "SELECT outcome || '|' || http_status || '|' || response_body
	               FROM idem_claim('moved-held', idem_hash('a'::text), NULL, '$a1')"),
		'replay|201|{"held": 1}', 'the claim completed during the move replays from ' . name_of($from));
}

# ---- payments and leases while the busy tenants' shards move ----
# Logical replication needs a replica identity on every co-located table: the ledger has no primary key.
sql($coordinator, 'ALTER TABLE ledger REPLICA IDENTITY FULL');
my @checks = IdemNode::citus_load(\@nodes, '--prefix', 'move', '--keys', $ENV{IDEM_CITUS_MOVE_KEYS} // 600,
	'--clients', $ENV{IDEM_CITUS_LOAD_CLIENTS} // 8, '--move', "$a1,$a2", '--move-rounds', 2,
	'--move-modes', 'block_writes,force_logical');
is($_->[2], $_->[1], $_->[0]) for @checks;
ok(@checks > 0, 'the move test ran') unless @checks;
is(scalar(grep { /terminated by signal/ } map { split /\n/, slurp_file($_->logfile) } @nodes), 0,
	'no node logged a crash');

done_testing();
