# Ambiguous commits: a proxy (test/perl/pg_fault_proxy.pl) lets the client's COMMIT
# reach the server and cuts the connection before the answer reaches the client. The
# client cannot know whether it committed; it retries on a fresh connection.
# Fails on: a retry that claims (or gets anything but the very body the cut transaction
# stored) after a committed 2xx, a second ledger row for a key, a retry of a cut 5xx that
# does not claim again, or a proxy that did not really cut after a real COMMIT.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use Digest::SHA qw(sha256_hex);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my $CUT_2XX = 120;    # half cut_await (commit known done), half cut_drop (closed at once)
my $CUT_5XX = 20;     # a cut 503: nothing stored, the retry must claim
my $PASS    = 10;     # control: through the proxy without a cut, the commit is acknowledged

my $node = IdemNode->create('ambiguous');
$node->safe_psql('postgres', 'CREATE TABLE ledger (key text NOT NULL, exec text NOT NULL)');

my $work = PostgreSQL::Test::Utils::tempdir();
my ($proxy, $proxy_port, $proxy_log) = $node->start_proxy($work);

sub via_proxy
{
	my ($mode) = @_;
	return idem_connect($node->proxy_dsn($proxy_port, $mode), AutoCommit => 0);
}
my $direct = idem_connect($node->dsn(), AutoCommit => 0) or BAIL_OUT('no direct connection');
my $in_progress_waits = 0;

# One request through the proxy: claim, execute, store; returns whether COMMIT was acknowledged.
sub first_attempt
{
	my ($mode, $key, $status) = @_;
	my $dbh = via_proxy($mode) or return 'no-connection';
	my $acked = eval {
		my ($outcome) = $dbh->selectrow_array('SELECT outcome FROM idem_claim($1, $2)',
			undef, $key, sha256_hex($key));
		die "first claim answered $outcome\n" unless $outcome eq 'claimed';
		$dbh->do('INSERT INTO ledger VALUES ($1, $2)', undef, $key, "first-$key") if $status < 500;
		$dbh->do(q{SELECT idem_complete($1, $2, jsonb_build_object('exec', $3::text))},
			undef, $key, $status, "first-$key");
		$dbh->commit;
		1;
	};
	my $err = $@;
	eval { $dbh->disconnect };
	return $acked ? 'acked' : $err =~ /first claim/ ? $err : 'lost';
}

# The retry on a fresh connection: waits out in_progress (the cut backend may still be
# finishing), executes when claimed, returns "outcome body".
sub retry
{
	my ($key) = @_;
	my $deadline = now_s() + 10;
	while (now_s() < $deadline)
	{
		my ($outcome, $exec) = $direct->selectrow_array(
			q{SELECT outcome, response_body->>'exec' FROM idem_claim($1, $2)}, undef, $key, sha256_hex($key));
		if ($outcome eq 'in_progress')
		{
			$direct->rollback;
			$in_progress_waits++;
			sleep 0.02;
			next;
		}
		if ($outcome eq 'claimed')
		{
			$exec = "retry-$key";
			$direct->do('INSERT INTO ledger VALUES ($1, $2)', undef, $key, $exec);
			$direct->do(q{SELECT idem_complete($1, 201, jsonb_build_object('exec', $2::text))},
				undef, $key, $exec);
			$direct->commit;
		}
		else { $direct->rollback; }
		return "$outcome " . ($exec // '');
	}
	return 'gave-up';
}

my (%first, %retried);
my @cases = (
	(map { [ "a2xx-$_", $_ % 2 ? 'cut_await' : 'cut_drop', 201 ] } 1 .. $CUT_2XX),
	(map { [ "a5xx-$_", $_ % 2 ? 'cut_await' : 'cut_drop', 503 ] } 1 .. $CUT_5XX),
	(map { [ "pass-$_", 'pass', 201 ] } 1 .. $PASS));
my $started = now_s();
for my $case (@cases)
{
	my ($key, $mode, $status) = @$case;
	$first{$key} = first_attempt($mode, $key, $status);
	$retried{$key} = retry($key);
}
my $secs = now_s() - $started;

# Tally.
my %tally;
for my $case (@cases)
{
	my ($key, $mode, $status) = @$case;
	my $kind = $status >= 500 ? 'cut 5xx' : $mode eq 'pass' ? 'pass' : 'cut 2xx';
	my $want = $status >= 500 ? "claimed retry-$key" : "replay first-$key";
	$tally{$kind}{total}++;
	$tally{$kind}{ $first{$key} eq 'acked' ? 'acked' : 'commit lost' }++;
	$tally{$kind}{ $retried{$key} eq $want ? 'expected retry' : "unexpected: $retried{$key}" }++;
}
my $ledger_dupes = $direct->selectrow_array(
	'SELECT count(*) FROM (SELECT key FROM ledger GROUP BY key HAVING count(*) > 1) d');
my $key_table = $node->key_table;
my $stored_5xx = $direct->selectrow_array(
	qq{SELECT count(*) FROM $key_table WHERE http_status >= 500 OR response_body->>'exec' LIKE 'first-a5xx%'});
$direct->rollback;
$direct->disconnect;

my %proxy_events;
for (split /\n/, PostgreSQL::Test::Utils::slurp_file($proxy_log))
{
	my (undef, @event) = split;    # pid, event
	$proxy_events{"@event"}++;
}
kill 'TERM', $proxy;
waitpid $proxy, 0;

diag(sprintf('ambiguous_commit: %d cases in %.1f s; %s', scalar(@cases), $secs,
	join('; ', map { my $k = $_; "$k: " . join(', ', map { "$_ $tally{$k}{$_}" } sort keys %{ $tally{$k} }) }
		sort keys %tally)));
diag('ambiguous_commit: proxy events: ' . join(', ', map { "$_ x$proxy_events{$_}" } sort keys %proxy_events));
diag("ambiguous_commit: keys with two ledger rows $ledger_dupes, stored 5xx $stored_5xx, "
	  . "retries that first met in_progress (cut backend still finishing) $in_progress_waits");

is($tally{'cut 2xx'}{'commit lost'}, $CUT_2XX, "the client never saw any of the $CUT_2XX cut COMMITs answered");
is($proxy_events{'cut_await COMMIT'}, ($CUT_2XX + $CUT_5XX) / 2, 'the server answered COMMIT to every cut_await case');
is($proxy_events{'cut_drop'}, $CUT_2XX / 2 + $CUT_5XX / 2, 'every cut_drop case was cut');
is($tally{'cut 2xx'}{'expected retry'}, $CUT_2XX, 'every retry of a cut 2xx replays the very body committed');
is($tally{'cut 5xx'}{'commit lost'}, $CUT_5XX, 'every cut 5xx COMMIT was cut too');
is($tally{'cut 5xx'}{'expected retry'}, $CUT_5XX, 'every retry of a cut 5xx claims and executes');
is($tally{pass}{acked}, $PASS, 'control: without a cut the proxy delivers the COMMIT answer');
is($tally{pass}{'expected retry'}, $PASS, 'control: an acknowledged request replays');
is($ledger_dupes, 0, 'duplicate executions: 0');
is($stored_5xx, 0, 'no 5xx stored');

done_testing();
