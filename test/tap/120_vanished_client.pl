# A client claims a key and goes silent in the middle of its transaction. The key must
# answer in_progress until the server gives up on the session, and be claimable again
# within idle_in_transaction_session_timeout + 1 s; the vanished client, when it wakes
# up, must not be able to commit its now stale claim.
#
# What bounds a vanished client, by where it vanished:
#  - idle in transaction (this test): idle_in_transaction_session_timeout ends the
#    session, rolls back and frees the key's lock.
#  - while its statement runs: statement_timeout; client_connection_check_interval
#    (Linux) notices a peer that closed its socket without waiting for the statement.
#  - a peer that vanished without closing (power loss, partition) while the server
#    writes or waits: tcp_keepalives_idle/interval/count (and tcp_user_timeout) bound
#    how long the kernel keeps the dead connection; a unix socket has no such case.
#  - idle outside a transaction: holds no key lock, nothing to bound.
#
# Fails on: a claim of the key before the bound (the lock was not held), a key not
# claimable within bound + 1 s (the lock outlived the session), a late commit of the
# vanished client that succeeds, or a second ledger row.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use Digest::SHA qw(sha256_hex);
use IO::Handle;
use POSIX ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my $BOUND  = 2;    # seconds of idle_in_transaction_session_timeout
my $TRIALS = 3;    # per way of vanishing

my $node = IdemNode->create('vanished', "idle_in_transaction_session_timeout = '${BOUND}s'");
my $key_table = $node->key_table;
$node->safe_psql('postgres', 'CREATE TABLE ledger (key text NOT NULL, exec text NOT NULL)');

my $work = PostgreSQL::Test::Utils::tempdir();
my ($proxy, $proxy_port, $proxy_log) = $node->start_proxy($work);

my $poller = idem_connect($node->dsn(), AutoCommit => 0) or BAIL_OUT('no connection');

# The client: claims, executes, reports its backend's pid, waits for "go", then tries
# to finish. Reports "late acked" or "late failed".
sub start_client
{
	my ($key, $dsn, $session_sql) = @_;
	pipe(my $from_child, my $to_parent) or die;
	pipe(my $from_parent, my $to_child) or die;
	my $pid = fork // die;
	if ($pid == 0)
	{
		close $from_child;
		close $to_child;
		$to_parent->autoflush(1);
		my $dbh = idem_connect($dsn, AutoCommit => 0) or POSIX::_exit(1);
		$dbh->do($session_sql) if $session_sql;
		my ($outcome) = $dbh->selectrow_array('SELECT outcome FROM idem_claim($1, $2)',
			undef, $key, sha256_hex($key));
		$dbh->do('INSERT INTO ledger VALUES ($1, $2)', undef, $key, 'vanished');
		print $to_parent "$outcome ", $dbh->{pg_pid}, "\n";
		<$from_parent>;
		my $late = eval {
			$dbh->do(q{SELECT idem_complete($1, 201, '{"exec": "vanished"}')}, undef, $key);
			$dbh->commit;
			1;
		};
		print $to_parent $late ? "late acked\n" : "late failed\n";
		POSIX::_exit(0);
	}
	close $from_parent;
	close $to_parent;
	$to_child->autoflush(1);
	my ($outcome, $backend) = split ' ', scalar <$from_child>;
	return { pid => $pid, outcome => $outcome, idle_since => idle_since($backend),
		in => $from_child, out => $to_child };
}

# When the backend went idle in transaction, by the server's clock: the timeout's start.
sub idle_since
{
	my ($backend) = @_;
	for (1 .. 100)
	{
		my ($since) = $poller->selectrow_array(q{SELECT extract(epoch FROM state_change) FROM pg_stat_activity
			WHERE pid = $1 AND state = 'idle in transaction'}, undef, $backend);
		$poller->rollback;
		return $since if $since;
		sleep 0.01;
	}
	die "backend $backend never went idle in transaction\n";
}

# Polls the key every 50 ms for at most $limit s after the client went idle; the first
# claim executes and commits. Returns (seconds until claimed or undef, in_progress
# answers, claims before the bound).
sub poll_until_claimed
{
	my ($key, $idle_since, $limit) = @_;
	my ($in_progress, $early) = (0, 0);
	while (now_s() - $idle_since < $limit)
	{
		my $t = now_s() - $idle_since;
		my ($outcome) = $poller->selectrow_array('SELECT outcome FROM idem_claim($1, $2)',
			undef, $key, sha256_hex($key));
		if ($outcome eq 'claimed')
		{
			$poller->do('INSERT INTO ledger VALUES ($1, $2)', undef, $key, 'poller');
			$poller->do(q{SELECT idem_complete($1, 201, '{"exec": "poller"}')}, undef, $key);
			$poller->commit;
			$early++ if $t < $BOUND - 0.1;
			return ($t, $in_progress, $early);
		}
		$poller->rollback;
		$in_progress++ if $outcome eq 'in_progress';
		sleep 0.05;
	}
	return (undef, $in_progress, $early);
}

sub proxy_child_of
{
	my ($app) = @_;
	my $until = now_s() + 5;
	while (now_s() < $until)
	{
		my ($line) = grep { / open \Q$app\E$/ } split /\n/, PostgreSQL::Test::Utils::slurp_file($proxy_log);
		return (split ' ', $line)[0] if $line;
		sleep 0.05;
	}
	return undef;
}

my @report;
for my $way (qw(sigstop-client silent-proxy))
{
	for my $trial (1 .. $TRIALS)
	{
		my $key = "$way-$trial";
		my $client = $way eq 'sigstop-client'
		  ? start_client($key, $node->dsn())
		  : start_client($key, $node->proxy_dsn($proxy_port, $key));
		my $frozen = $way eq 'sigstop-client' ? $client->{pid} : proxy_child_of($key);
		kill 'STOP', $frozen;
		my ($secs, $in_progress, $early) = poll_until_claimed($key, $client->{idle_since}, $BOUND + 3);
		kill 'CONT', $frozen;
		print { $client->{out} } "go\n";
		my $late = readline($client->{in}) // 'no answer';
		chomp $late;
		waitpid $client->{pid}, 0;
		my ($body, $rows) = $poller->selectrow_array(
			qq{SELECT (SELECT response_body->>'exec' FROM $key_table WHERE key = \$1),
			         (SELECT count(*) FROM ledger WHERE key = \$1)}, undef, $key);
		$poller->rollback;
		push @report, sprintf('%s: claimed again after %s s (%d in_progress before), %s', $key,
			defined $secs ? sprintf('%.2f', $secs) : 'never', $in_progress, $late);

		is($client->{outcome}, 'claimed', "$key: the client claimed the key");
		cmp_ok($in_progress, '>', 0, "$key: in_progress while the client is silent");
		is($early, 0, "$key: never claimable before the ${BOUND} s bound");
		ok(defined $secs && $secs <= $BOUND + 1, "$key: claimable again within bound + 1 s");
		is($late, 'late failed', "$key: the vanished client cannot commit when it wakes up");
		is("$body $rows", 'poller 1', "$key: the new claimant's body is stored, one ledger row");
	}
}

# Control: the same silence with the timeout off in that session keeps the key in
# progress past bound + 1 s, so what frees it above is the timeout (then the client is
# killed: a closed socket frees the key at once).
{
	my $key = 'control-no-timeout';
	my $client = start_client($key, $node->dsn(), 'SET idle_in_transaction_session_timeout = 0');
	kill 'STOP', $client->{pid};
	my ($secs, $in_progress) = poll_until_claimed($key, $client->{idle_since}, $BOUND + 1.5);
	my $killed_at = now_s();
	kill 'KILL', $client->{pid};
	waitpid $client->{pid}, 0;
	my ($after_kill) = poll_until_claimed($key, $killed_at, 5);
	push @report, sprintf('%s: %s after %.1f s silence (%d in_progress); after kill -9 of the client '
		  . 'claimable in %.2f s', $key, defined $secs ? 'claimed' : 'still in_progress', $BOUND + 1.5,
		$in_progress, $after_kill // -1);
	ok(!defined $secs, 'control: without the timeout the key stays in_progress past bound + 1 s');
	ok(defined $after_kill && $after_kill < 1, 'control: a killed client frees the key within 1 s');
}
$poller->disconnect;
kill 'TERM', $proxy;
waitpid $proxy, 0;

diag("vanished_client: $_") for @report;
done_testing();
