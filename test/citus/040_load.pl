# Load on Citus with a worker killed: 8 clients pay 2,000 payments with retries through the three nodes while
# worker2 is killed (-9, the postmaster and every child) and restarted (test/citus/load.pl does the load and
# prints its checks: nothing debited twice, nothing acknowledged and lost, nothing stuck, ledger and keys in
# step, and that the kill did interrupt calls). IDEM_CITUS_LOAD_KEYS (2000) and IDEM_CITUS_LOAD_CLIENTS (8)
# size it.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my @nodes = IdemNode->citus_cluster('load', 2);
my ($coordinator, $worker1, $worker2) = @nodes;
$coordinator->citus_distribute;

my $bindir = `pg_config --bindir`;
chomp $bindir;
my @checks = IdemNode::citus_load(\@nodes, '--keys', $ENV{IDEM_CITUS_LOAD_KEYS} // 2000,
	'--clients', $ENV{IDEM_CITUS_LOAD_CLIENTS} // 8,
	'--kill-data', $worker2->data_dir, '--pg-bin', $bindir, '--log', $worker2->logfile);
# load.pl restarted the worker with pg_ctl: the node's postmaster is another process now.
$worker2->_update_pid(1);
is($_->[2], $_->[1], $_->[0]) for @checks;
ok(@checks > 0, 'the load test ran') unless @checks;

done_testing();
