# Crash-and-retry: clients in pairs walk the same keys in opposite order and retry
# each key until it is answered, while the server is repeatedly killed (kill -9 of a
# client backend, immediate shutdown, kill -9 of the postmaster).
# Fails on: a key executed twice (two ledger rows), an acknowledged or replayed body
# that is not the stored one, a key still in_progress after recovery, ledger rows !=
# stored completions, or a client giving up on a key.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use Digest::SHA qw(sha256_hex);
use List::Util qw(shuffle sum0);
use POSIX ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my $PAIRS       = 2;        # 4 client processes
my $BLOCK       = 50;       # keys a pair walks in opposite order before the next block
my $MIN_KEYS    = 8000;     # in all pairs together
my $FAULT_ROUNDS = 3;       # each round: one fault of each kind, in random order
my $KEY_GIVE_UP = 60;       # seconds a client retries one key before giving up (a failure)
my $CLIENT_LIMIT = 150;     # seconds; after it a client stops taking new blocks

# fsync = off (set by Cluster) is sound here: every fault is a process crash, never an
# OS crash, so WAL written at COMMIT survives in the page cache. synchronous_commit
# stays on: with it off an acknowledged commit could be lost in a crash by design.
my $node = IdemNode->create('crash', 'restart_after_crash = on', 'max_connections = 40');
$node->safe_psql('postgres', 'CREATE TABLE ledger (key text NOT NULL, exec text NOT NULL)');

my $work = PostgreSQL::Test::Utils::tempdir();
my $stop_file = "$work/stop";
my $parent = $$;    # clients stop when it is gone
my $min_blocks = int($MIN_KEYS / $PAIRS / $BLOCK) + 1;

# One client: a forked process with its own connection, writing one line per answer.
sub client
{
	my ($id, $pair, $descending) = @_;
	open my $out, '>', "$work/client$id" or die;
	$out->autoflush(1);
	my $dsn = $node->dsn(application_name => "crash_client$id");
	my ($dbh, $executions, $in_progress, $lost_claims, $ambiguous, $errors) = (undef, 0, 0, 0, 0, 0);
	my $started = now_s();

	for (my $b = 0;; $b++)
	{
		last if $b >= $min_blocks && -e $stop_file;
		last if now_s() - $started > $CLIENT_LIMIT || getppid() != $parent;
		my @order = $descending ? reverse(0 .. $BLOCK - 1) : (0 .. $BLOCK - 1);
		for my $i (@order)
		{
			my $key  = "p${pair}b${b}k$i";
			my $hash = sha256_hex($key);
			my $give_up = now_s() + $KEY_GIVE_UP;
			my $answered = 0;
			while (!$answered && getppid() == $parent)
			{
				if (now_s() > $give_up) { print $out "gaveup $key\n"; last; }
				$dbh //= idem_connect($dsn, AutoCommit => 0);
				if (!$dbh) { sleep 0.05; next; }
				my $stage = 'claim';
				eval {
					my ($outcome, $exec) = $dbh->selectrow_array(
						q{SELECT outcome, response_body->>'exec' FROM idem_claim($1, $2)},
						undef, $key, $hash);
					if ($outcome eq 'claimed')
					{
						$stage = 'claimed';
						$exec = "c$id-" . ++$executions;
						$dbh->do('INSERT INTO ledger (key, exec) VALUES ($1, $2)', undef, $key, $exec);
						sleep rand(0.002);    # widen the window a crash can hit
						my ($stored) = $dbh->selectrow_array(
							q{SELECT idem_complete($1, 201, jsonb_build_object('exec', $2::text))},
							undef, $key, $exec);
						die "idem_complete returned $stored\n" unless $stored;
						$stage = "commit $exec";
						$dbh->commit;
						print $out "ack $key $exec\n";
						$answered = 1;
					}
					elsif ($outcome eq 'replay')
					{
						$dbh->rollback;
						print $out "replay $key $exec\n";
						$answered = 1;
					}
					elsif ($outcome eq 'in_progress')
					{
						$dbh->rollback;
						$in_progress++;
						sleep 0.005 + rand(0.015);
					}
					else
					{
						$dbh->rollback;
						print $out "bad $key $outcome\n";
						$answered = 1;
					}
					1;
				} or do {
					if ($stage =~ /^commit (\S+)/) { $ambiguous++; print $out "ambiguous $key $1\n"; }
					elsif ($stage eq 'claimed') { $lost_claims++; }
					$errors++;
					eval { $dbh->disconnect };
					$dbh = undef;
					sleep 0.02;
				};
			}
		}
	}
	print $out "stats $in_progress $lost_claims $ambiguous $errors\n";
	close $out;
	POSIX::_exit(0);    # no END blocks: they would stop the node
}

my %clients;    # pid => id
for my $pair (0 .. $PAIRS - 1)
{
	for my $descending (0, 1)
	{
		my $id = 2 * $pair + $descending;
		my $pid = fork // die "fork: $!";
		client($id, $pair, $descending) if $pid == 0;
		$clients{$pid} = $id;
	}
}

my %exited;
sub clients_running
{
	while ((my $pid = waitpid(-1, POSIX::WNOHANG())) > 0) { $exited{$pid} = $?; }
	return scalar(grep { !exists $exited{$_} } keys %clients);
}
sub progress { return sum0(map { -s "$work/client$_" // 0 } values %clients); }

# Lets the clients make progress between faults (bounded).
sub wait_progress
{
	my $from = progress();
	my $until = now_s() + 30;
	sleep 0.1 while progress() < $from + 6000 && now_s() < $until;
}

# (state, parent pid) from /proc; a zombie counts as gone (PID 1 may not reap).
sub proc_stat
{
	open(my $stat, '<', "/proc/$_[0]/stat") or return ('X', 0);
	return (<$stat> // '') =~ /\)\s+(\S+)\s+(\d+)/ ? ($1, $2) : ('X', 0);
}
sub alive { return (proc_stat($_[0]))[0] !~ /^[XZ]$/; }

my %faults;
my $kills_mid_transaction = 0;
my $faults_with_all_clients = 0;
my %inject = (
	backend => sub {
		my $offset = -s $node->logfile;
		my ($ret, $rows) = $node->psql('postgres',
			"SELECT pid, state FROM pg_stat_activity WHERE application_name LIKE 'crash_client%'");
		my @candidates = map { [ split /\|/ ] } split /\n/, $rows // '';
		my @busy = grep { $_->[1] ne 'idle' } @candidates;
		my $victim = (@busy ? $busy[rand @busy] : $candidates[rand @candidates]) or return 0;
		$kills_mid_transaction++ if $victim->[1] ne 'idle';
		kill 'KILL', $victim->[0] or return 0;
		$node->wait_for_log(qr/reinitializing.*ready to accept connections/s, $offset);
		return 1;
	},
	immediate => sub {
		$node->stop('immediate');
		$node->start;
		return 1;
	},
	postmaster => sub {
		my $postmaster = $node->{_pid};
		my @children = grep { (proc_stat($_))[1] == $postmaster } map { m{(\d+)$} } glob('/proc/[0-9]*');
		$node->kill9;
		# A new postmaster refuses to start while orphaned backends hold the old shared
		# memory, or while the old postmaster's pid exists, even as a zombie (PID 1 may
		# reap late). A zombie that outlasts the wait is dead: its lock files are stale.
		my $until = now_s() + 30;
		sleep 0.05 while (grep({ alive($_) } @children) || kill(0, $postmaster)) && now_s() < $until;
		unlink($node->data_dir . '/postmaster.pid', $node->host . '/.s.PGSQL.' . $node->port . '.lock')
		  unless alive($postmaster) || !kill(0, $postmaster);
		for my $try (1 .. 5)
		{
			return 1 if $node->start(fail_ok => 1);
			$node->{_pid} = undef;    # start() may adopt the stale pid on failure
			sleep 1;
		}
		return 0;
	});

my $fault_start = now_s();
for my $round (1 .. $FAULT_ROUNDS)
{
	for my $kind (shuffle keys %inject)
	{
		for my $try (1 .. 5)    # a victim backend may exit before the kill
		{
			wait_progress();
			my $all = clients_running() == keys %clients;
			next unless $inject{$kind}->();
			$faults{$kind}++;
			$faults_with_all_clients++ if $all;
			last;
		}
	}
}
my $fault_secs = now_s() - $fault_start;
wait_progress();
open my $stop, '>', $stop_file or die;
close $stop;

my $until = now_s() + $CLIENT_LIMIT + $KEY_GIVE_UP;
sleep 0.2 while clients_running() && now_s() < $until;
kill 'KILL', grep { !exists $exited{$_} } keys %clients;
clients_running();

# What the clients saw.
my (%acked, %replayed, %walked, %ambiguous_execs, @bad, @gave_up);
my ($ack_n, $replay_n, $in_progress, $lost_claims, $ambiguous, $errors) = (0) x 6;
for my $id (values %clients)
{
	open my $in, '<', "$work/client$id" or die;
	while (<$in>)
	{
		my ($what, $key, $exec) = split;
		if ($what eq 'ack') { push @{ $acked{$key} }, $exec; $walked{$key} = 1; $ack_n++; }
		elsif ($what eq 'replay') { push @{ $replayed{$key} }, $exec; $walked{$key} = 1; $replay_n++; }
		elsif ($what eq 'bad') { push @bad, "$key $exec"; }
		elsif ($what eq 'gaveup') { push @gave_up, $key; }
		elsif ($what eq 'ambiguous') { push @{ $ambiguous_execs{$key} }, $exec; }
		elsif ($what eq 'stats')
		{
			my @s = split;
			$in_progress += $s[1]; $lost_claims += $s[2]; $ambiguous += $s[3]; $errors += $s[4];
		}
	}
}

# What the database kept.
my $dbh = idem_connect($node->dsn()) or BAIL_OUT('no connection after the run');
my $key_table = $node->key_table;
my %stored = map { $_->[0] => $_->[1] } @{ $dbh->selectall_arrayref(
	qq{SELECT key, response_body->>'exec' FROM $key_table}) };
my %ledger;
push @{ $ledger{ $_->[0] } }, $_->[1] for @{ $dbh->selectall_arrayref('SELECT key, exec FROM ledger') };
my $ledger_rows = sum0(map { scalar @$_ } values %ledger);
my $duplicates = grep { @{ $ledger{$_} } > 1 } keys %ledger;
my $ack_missing = grep {
	my $k = $_;
	grep { ($stored{$k} // '') ne $_ || !grep({ $_ eq $stored{$k} } @{ $ledger{$k} // [] }) } @{ $acked{$k} }
} keys %acked;
my $replay_wrong = grep {
	my $k = $_;
	grep { ($stored{$k} // '') ne ($_ // '') } @{ $replayed{$k} }
} keys %replayed;
# An unacknowledged COMMIT may or may not have happened; the stored row says which.
my $ambiguous_committed = grep { my $k = $_; grep { $_ eq ($stored{$k} // '') } @{ $ambiguous_execs{$k} } }
  keys %ambiguous_execs;
my $ledger_unstored = grep { !exists $stored{$_} || $ledger{$_}[0] ne $stored{$_} } keys %ledger;

# After recovery every walked key must replay: none in_progress, none claimable again.
my %final;
my @keys = sort keys %walked;
while (my @chunk = splice(@keys, 0, 500))
{
	$dbh->begin_work;
	$final{ $_->[0] } += $_->[1] for @{ $dbh->selectall_arrayref(
		'SELECT c.outcome, count(*) FROM unnest($1::text[]) k, idem_claim(k, idem_hash(k)) c GROUP BY 1',
		undef, \@chunk) };
	$dbh->rollback;
}
$dbh->disconnect;

my $walked = keys %walked;
diag(sprintf('crash_retry: %d keys walked by %d clients in %.0f s of faults; faults %s '
	  . '(%d backend kills mid-transaction); answers: %d executed+acked, %d replays, %d in_progress retries, '
	  . '%d claims lost to a crash, %d ambiguous commits (%d of them had committed), %d client errors',
	$walked, scalar(keys %clients), $fault_secs,
	join(', ', map { "$_=" . ($faults{$_} // 0) } sort keys %inject),
	$kills_mid_transaction, $ack_n, $replay_n, $in_progress, $lost_claims, $ambiguous, $ambiguous_committed,
	$errors));
diag(sprintf('crash_retry: stored %d, ledger rows %d, duplicate executions %d, acked-but-missing %d, '
	  . 'wrong replays %d, final outcomes %s',
	scalar(keys %stored), $ledger_rows, $duplicates, $ack_missing, $replay_wrong,
	join(', ', map { "$_=$final{$_}" } sort keys %final)));

is(scalar(grep { $exited{$_} != 0 } keys %clients), 0, 'every client exited normally');
cmp_ok($faults{$_} // 0, '>=', $FAULT_ROUNDS, "at least $FAULT_ROUNDS faults of kind $_") for sort keys %inject;
is($faults_with_all_clients, 3 * $FAULT_ROUNDS, 'every fault hit while all clients were running');
cmp_ok($walked, '>=', $MIN_KEYS, "at least $MIN_KEYS keys walked");
cmp_ok($in_progress, '>', 0, 'duplicates were really in flight together (in_progress answers seen)');
is(scalar(@gave_up), 0, 'no client gave up on a key') or diag("gave up: @gave_up[0 .. 9]");
is(scalar(@bad), 0, 'no unexpected claim outcome') or diag("bad: @bad[0 .. 9]");
is($duplicates, 0, 'duplicate executions: 0 (ledger rows per key <= 1)');
is($ack_missing, 0, 'acknowledged-but-missing: 0 (each acked body is stored and in the ledger)');
is($replay_wrong, 0, 'every replay a client saw is the stored body');
is($ledger_rows, scalar(keys %stored), 'ledger rows = stored completions');
is($ledger_unstored, 0, 'each ledger row is the execution whose body is stored');
is(scalar(keys %stored), $walked, 'every walked key has a stored completion');
is($final{in_progress} // 0, 0, 'keys stuck in progress after recovery: 0');
is($final{replay} // 0, $walked, 'every walked key replays after recovery');

done_testing();
