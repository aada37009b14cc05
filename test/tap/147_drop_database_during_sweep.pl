# A listed database can be dropped or renamed while the worker sweeps it.
#
# Three listed databases, swept one after another: dropdb and renamedb hold 200,000 expired
# keys each and idempotency.cleanup_keys_per_second = 500 makes each sweep last ~400 s;
# thirddb holds 3,000. While dropdb's sweep runs, DROP DATABASE dropdb (no FORCE); then, while
# renamedb's runs, ALTER DATABASE renamedb RENAME. Each must succeed within 10 s (the time is
# printed), and the launcher must go on to sweep thirddb.
# Fails on: a DROP or RENAME refused or slower than 10 s (1.1: the sweeper stays connected,
# so both fail after 5 s with 55006 "database is being accessed by other users"), a sweep that
# was not running when the command started (the test would prove nothing), thirddb not swept.
# When a command fails, the test frees the database (WITH (FORCE), or by ending the sweeper)
# so that the later steps are still judged.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $BIG = 200_000;
my $SMALL = 3_000;
my $LIMIT = 10;    # seconds a DROP or RENAME may take

my $node = IdemNode->create('drop_during_sweep', "idempotency.databases = ''", 'idempotency.cleanup_interval = 1s',
	'idempotency.cleanup_keys_per_second = 500');
my %keys = (dropdb => $BIG, renamedb => $BIG, thirddb => $SMALL);
for my $db (sort keys %keys)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	$node->insert_expired($db, 'expired', $keys{$db});
}
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = 'dropdb, renamedb, thirddb'});
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');

my $sweeping = q{SELECT count(*) > 0 FROM pg_stat_activity
	WHERE backend_type = 'idempotency cleanup' AND datname = '%s'};

# Waits until the sweep of $db is under way (running, and some keys gone); then runs $sql in
# database postgres and returns (whether the sweep was running just before, seconds taken,
# error or '').
sub during_sweep
{
	my ($db, $sql) = @_;
	my $under_way = $node->wait_until($db, sprintf($sweeping, $db)
		  . " AND (SELECT count(*) FROM idempotency_keys) < $keys{$db} - 1000", 90);
	my $running = defined $under_way && $node->safe_psql('postgres', sprintf($sweeping, $db)) eq 't';
	my $left = $node->safe_psql($db, 'SELECT count(*) FROM idempotency_keys');
	my $start = now_s();
	my ($rc, $out, $err) = $node->psql('postgres', $sql, timeout => 120);
	my $took = now_s() - $start;
	diag(sprintf('%s: %s, %d of %d keys left, sweep running: %s; took %.2f s%s', $db, $sql, $left, $keys{$db},
		$running ? 'yes' : 'no', $took, $rc ? ": $err" : ''));
	return ($running, $took, $rc ? ($err || "exit $rc") : '');
}

# ---- DROP DATABASE while the sweep of dropdb runs ----
my ($running, $took, $err) = during_sweep('dropdb', 'DROP DATABASE dropdb');
ok($running, 'a sweep of dropdb was running when DROP DATABASE started');
# Fails if the sweeper stays connected (1.1: ERROR 55006 after 5 s).
ok($err eq '' && $took <= $LIMIT,
	sprintf('DROP DATABASE dropdb succeeds during the sweep within %d s (%s after %.2f s)', $LIMIT,
		$err ? 'failed' : 'done', $took));
$node->safe_psql('postgres', 'DROP DATABASE IF EXISTS dropdb WITH (FORCE)') if $err;

# ---- ALTER DATABASE ... RENAME while the sweep of renamedb runs ----
($running, $took, $err) = during_sweep('renamedb', 'ALTER DATABASE renamedb RENAME TO renamed');
ok($running, 'a sweep of renamedb was running when ALTER DATABASE ... RENAME started');
ok($err eq '' && $took <= $LIMIT,
	sprintf('ALTER DATABASE renamedb RENAME succeeds during the sweep within %d s (%s after %.2f s)', $LIMIT,
		$err ? 'failed' : 'done', $took));
if ($err)
{
	# Frees the launcher for the last step: ends the sweep that blocked the rename.
	$node->safe_psql('postgres', q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE backend_type = 'idempotency cleanup' AND datname = 'renamedb'});
}

# ---- the launcher carries on ----
my $third = $node->wait_until('thirddb', 'SELECT count(*) = 0 FROM idempotency_keys', 120);
# Fails if the launcher waits on (or died with) a sweep it could not finish.
ok(defined $third, sprintf('the launcher goes on: thirddb swept clean (%s)',
	defined $third ? sprintf('%.1f s after the rename', $third) : 'not within 120 s'));
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'}),
	'1', 'the launcher is running');

is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, 'no process crashed');
$node->stop;
done_testing();
