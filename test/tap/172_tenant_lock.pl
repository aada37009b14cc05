# 1.3 hardening: a lock held in one database stalls no other database's sweep.
#
# Two databases on one worker, stuck and free. In stuck an application role, which has UPDATE on the keys as
# the README documents (and so may LOCK the table in any mode), holds LOCK TABLE idempotency_keys IN SHARE MODE
# in an open transaction; later in ACCESS EXCLUSIVE MODE. Expired keys are planted in free while the lock is
# held: they must be gone within a bound far above the worker's own wait (200 ms for its table's lock, 1 s for
# any other) plus a sweep interval (1 s), and far below forever (the bound holds with both cores busy). The log
# names the table that blocked the sweep and idem_stats counts it (sweeps_blocked). When the lock goes, stuck is
# swept too.
# Fails on 1.2: the sweeper of stuck waited for the lock with no timeout and the launcher waited for it, so free
# was never swept while the lock was held.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $BOUND_S = 20;
my $node = IdemNode->create('tenants', "idempotency.databases = ''", 'idempotency.cleanup_interval = 1s');
$node->safe_psql('postgres', 'CREATE ROLE app LOGIN; CREATE DATABASE stuck; CREATE DATABASE free');
for my $db (qw(stuck free))
{
	$node->safe_psql($db, 'CREATE EXTENSION idempotency; GRANT SELECT, INSERT, UPDATE ON idempotency_keys TO app');
}
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = 'stuck,free'; SELECT pg_reload_conf()});

for my $mode ('SHARE', 'ACCESS EXCLUSIVE')
{
	my $log_from = -s $node->logfile;
	# (Read through jsonb, so that the test runs on 1.2 too, where the column does not exist.)
	my $blocked_before = $node->safe_psql('free', q{SELECT coalesce((to_jsonb(s) ->> 'sweeps_blocked')::bigint, 0) FROM idem_stats s});
	# stuck's keys expire only after the lock is taken (a sweep between the insert and the LOCK would take them
	# otherwise): 10 s is the margin for connecting and locking with both cores busy.
	$node->insert_expired('stuck', 'held', 30, 10);
	my $app = idem_connect($node->dsn(dbname => 'stuck', user => 'app'), AutoCommit => 0)
	  or die 'no connection as app';
	$app->do("LOCK TABLE idempotency_keys IN $mode MODE");
	my ($unexpired) = $app->selectrow_array(
		q{SELECT count(*) FROM idempotency_keys WHERE key LIKE 'held%' AND expires_at > clock_timestamp()});
	is($unexpired, 30, "the $mode lock is held in stuck before its keys expire");
	# The sweeps that started before the lock are over after two intervals.
	sleep 3;
	$node->insert_expired('free', "free_$mode", 30);
	my $took = $node->wait_until('free', "SELECT NOT EXISTS (SELECT FROM idempotency_keys WHERE key LIKE 'free_$mode%')",
		$BOUND_S);
	diag(sprintf('%s lock in stuck: free swept %s', $mode, defined $took ? sprintf('%.1f s after its keys expired', $took) : 'never'));
	ok(defined $took, "with a $mode lock held in stuck, free is still swept within $BOUND_S s");
	if ($mode eq 'SHARE')
	{
		# (Under ACCESS EXCLUSIVE nobody else can read the table to count.) stuck's keys have expired, and two
		# sweep intervals have passed since, before they are counted.
		$node->wait_until('stuck', q{SELECT now() > max(expires_at) + interval '3 s' FROM idempotency_keys WHERE key LIKE 'held%'}, 30);
		is($node->count_keys('stuck', 'held'), 30, "stuck's expired keys wait while the $mode lock is held");
		cmp_ok($node->log_lines($log_from, qr/in database "stuck", table public\.idempotency_keys was locked by another session/),
			'>=', 1, 'the log names the database and the table that blocked the sweep');
		cmp_ok($node->safe_psql('free', q{SELECT coalesce((to_jsonb(s) ->> 'sweeps_blocked')::bigint, 0) FROM idem_stats s}), '>', $blocked_before,
			'idem_stats.sweeps_blocked counts it');
	}
	else
	{
		cmp_ok($node->log_lines($log_from, qr/lock timeout/), '>=', 1, 'the log says a lock timed out');
	}
	$app->rollback;
	$app->disconnect;
	my $released = $node->wait_until('stuck', "SELECT NOT EXISTS (SELECT FROM idempotency_keys WHERE key LIKE 'held%')", 60);
	ok(defined $released, "once the $mode lock is gone, stuck is swept");
}

$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = ''; SELECT pg_reload_conf()});
is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, 'no process crashed');
$node->stop;
done_testing();
