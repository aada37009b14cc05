# Operations on Citus: the sweeper of every node removes the expired keys of that node's shards (the coordinator
# has none and no error), nothing logs a failing sweep, and idem_citus_stats() on the coordinator has a row per
# node with the workers' claims. idem_cleanup() leaves citus.enable_manual_changes_to_shards as the caller's
# transaction had it (before issue 38 it stayed on).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my @nodes = IdemNode->citus_cluster('ops', 2);
my ($coordinator, @workers) = @nodes;
sub sql { my ($node, $statements) = @_; return scalar $node->safe_psql('app', $statements); }
$coordinator->citus_distribute;

# Keys with a 1-second ttl in 20 scopes, on both workers; the sweepers remove them.
sql($coordinator, join("\n", map { "BEGIN;
	SELECT outcome FROM idem_claim('short-$_', idem_hash('a'::text), '1 second', 'acct-$_');
	SELECT idem_complete('short-$_', 201, NULL, NULL, 'acct-$_'); COMMIT;" } 1 .. 20));
my $short = "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'short-%'";
is(sql($coordinator, $short), '20', '20 short-lived keys stored on both workers');
for (1 .. 60)
{
	last if sql($coordinator, $short) eq '0';
	sleep 0.5;
}
is(sql($coordinator, $short), '0', 'the sweepers removed them');
for my $worker (@workers)
{
	is(sql($worker, 'SELECT keys_removed > 0 FROM idem_stats'), 't',
		"$worker->{citus_name}: its sweeper removed keys of its shards");
	is(sql($worker, 'SELECT last_error FROM idem_stats'), '', "$worker->{citus_name}: no sweep error");
}
is(sql($coordinator, "SELECT keys_removed || '|' || coalesce(last_error, '') FROM idem_stats"), '0|',
	"the coordinator's sweeper has nothing to remove and no error");
is(scalar(grep { /cannot perform distributed planning|idempotency.*ERROR|ERROR.*expired keys/ }
	map { split /\n/, slurp_file($_->logfile) } @nodes), 0, 'no node logged a failing sweep');
# idem_cleanup() on a worker sweeps its shards by name with citus.enable_manual_changes_to_shards on, in its own
# settings only: the rest of the caller's transaction has it as before (issue 38; it stayed on before).
for my $worker (@workers)
{
	is(sql($worker, "BEGIN;
		SELECT current_setting('citus.enable_manual_changes_to_shards') AS before \\gset
		SELECT idem_cleanup() >= 0;
		SELECT :'before' || ' -> ' || current_setting('citus.enable_manual_changes_to_shards');
		COMMIT;"), "t\noff -> off",
		"$worker->{citus_name}: citus.enable_manual_changes_to_shards after idem_cleanup() is what it was");
}
is(sql($coordinator, 'SELECT count(*) FROM idem_citus_stats()'), '3',
	'idem_citus_stats() on the coordinator: one row per node');
is(sql($coordinator, "SELECT sum((stats->>'claims')::bigint) >= 20 FROM idem_citus_stats()"), 't',
	"idem_citus_stats(): the workers' claims add up (the 20 above)");

done_testing();
