# Lease mode on Citus: a holder's heartbeats (idem_lease_extend), checkpoint, completion and release through
# every node, on the node that holds the key's shard and across a move of that shard; and the shard metadata
# lock the direct path takes is the one Citus's own router writes take.
#
# Fails on the code before 1.3's fix: idem_lease_extend failed on every node with 0A000 ("STABLE functions used
# in UPDATE queries cannot be called with column references"), so every heartbeat on Citus failed.
# Fails if a Citus release changes how its writes lock a shard's metadata (class, co-location, index) and the
# direct path no longer takes the same lock: a shard move would then not wait for a claim.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use POSIX ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my @nodes = IdemNode->citus_cluster('lease', 2);
my ($coordinator, @workers) = @nodes;
$coordinator->citus_distribute;

sub sql { my ($node, $statements) = @_; return scalar $node->safe_psql('app', $statements); }
sub name_of { return $_[0]->{citus_name}; }

# An account on each worker.
my %account_on;
for my $i (1 .. 40)
{
	my $owner = name_of($coordinator->citus_node_of(\@nodes, 'accounts', "acct-$i"));
	$account_on{$owner} //= "acct-$i";
	last if $account_on{worker1} && $account_on{worker2};
}
my @accounts = @account_on{qw(worker1 worker2)};
note("accounts: $accounts[0] on worker1, $accounts[1] on worker2");

# The key's gap between lease end and expiry, read through the coordinator.
sub gap_of
{
	my ($key, $account) = @_;
	return sql($coordinator, "SELECT expires_at - lease_until FROM idempotency_keys
	                        WHERE key = '$key' AND scope = '$account'");
}

# ---- heartbeats through every node, for a key granted through every node, on both workers ----
for my $account (@accounts)
{
	my $owner = $coordinator->citus_node_of(\@nodes, 'accounts', $account);
	for my $from (@nodes)
	{
		my $key = 'hb-' . name_of($from) . "-$account";
		my ($token, $until) = split /\|/, sql($from,
			"SELECT lease_token, lease_until
			 FROM idem_lease('$key', idem_hash('a'::text), '30 seconds', NULL, '$account')");
		is(length($token), 36, name_of($from) . ", $account: lease granted");
		my $gap = gap_of($key, $account);
		for my $via (@nodes)
		{
			my $later = sql($via, "SELECT idem_lease_extend('$key', '$token', '60 seconds', '$account')");
			is(sql($via, "SELECT '$later'::timestamptz > '$until'::timestamptz"), 't',
				name_of($from) . ", $account: a heartbeat through " . name_of($via) . ' extends the lease');
			$until = $later;
		}
		is(gap_of($key, $account), $gap,
			name_of($from) . ", $account: the key outlives its lease by as much as before");
		sql($owner, "SELECT idem_checkpoint('$key', '$token', 'charged', '{\"charge\": 1}', '$account')");
		is(sql($workers[0], "SELECT outcome
		                     FROM idem_lease('$key', idem_hash('a'::text), '1 second', NULL, '$account')"),
			'in_progress', name_of($from) . ", $account: extended, the lease is still held");
		sql($coordinator, "SELECT idem_lease_complete('$key', '$token', 201, '{\"done\": 1}', NULL, '$account')");
		for my $again (@nodes)
		{
			is(sql($again, "SELECT outcome || '|' || http_status || '|' || response_body
			              FROM idem_claim('$key', idem_hash('a'::text), NULL, '$account')"),
				'replay|201|{"done": 1}', name_of($from) . ", $account: completed, it replays from " . name_of($again));
		}
	}
}

# The statements through Citus's planner (idempotency.citus_direct off) extend too, and a release ends the lease.
{
	my $account = $accounts[0];
	my $owner = $coordinator->citus_node_of(\@nodes, 'accounts', $account);
	my $token = sql($owner,
		"SELECT lease_token FROM idem_lease('sql-hb', idem_hash('a'::text), '30 seconds', NULL, '$account')");
	is(sql($owner, "SET idempotency.citus_direct = off;
	              SELECT idem_lease_extend('sql-hb', '$token', '60 seconds', '$account') IS NOT NULL"), 't',
		'citus_direct off: a heartbeat on the owner extends the lease');
	is(sql($workers[1], "SELECT idem_lease_release('sql-hb', '$token', '$account')"), 't',
		'released through the other worker');
	is(sql($coordinator,
		"SELECT outcome FROM idem_lease('sql-hb', idem_hash('a'::text), '30 seconds', NULL, '$account')"),
		'claimed', 'released, the key is granted again');
}

# 1.3: the bytes form (idem_lease_complete_request) is delegated by scope like the others: completed through the
# coordinator, idem_lease replays the stored bytes and content type from every node.
{
	my $account = $accounts[1];
	my $token = sql($coordinator,
		"SELECT lease_token FROM idem_lease('bytes-1', idem_hash('a'::text), '30 seconds', NULL, '$account')");
	is(sql($coordinator, "SELECT idem_lease_complete_request('bytes-1', '$account', '$token', 201, 'text/plain',
	                                                         NULL, '\\x6f6b0a'::bytea)"),
		't', 'the bytes form completes through the coordinator');
	for my $again (@nodes)
	{
		is(sql($again, "SELECT outcome || '|' || response_content_type || '|' || encode(response_bytes, 'hex')
		              FROM idem_lease('bytes-1', idem_hash('a'::text), '30 seconds', NULL, '$account')"),
			'replay|text/plain|6f6b0a', 'the bytes replay from ' . name_of($again));
	}
}

# ---- the lock: the one Citus's router writes take on the shard's metadata ----
# A claim's lookup on the direct path and an UPDATE of the tenant's account row, each in a transaction on the
# owner: the advisory locks each holds in ShareLock besides the key's own (objsubid 0x1DE7 = 7655).
{
	my $account = $accounts[0];
	my $owner = $coordinator->citus_node_of(\@nodes, 'accounts', $account);
	my $locks = "SELECT coalesce(string_agg(format('%s/%s/%s', l.classid, l.objid, l.objsubid), ','
	                     ORDER BY l.classid, l.objid, l.objsubid), 'none')
	             FROM pg_locks l WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid()
	               AND l.mode = 'ShareLock' AND l.objsubid <> 7655";
	my (undef, $claim_locks) = split /\n/, sql($owner, "BEGIN;
		SELECT outcome FROM idem_claim('lock-probe', idem_hash('a'::text), NULL, '$account'); $locks; ROLLBACK");
	my $write_locks = sql($owner,
		"BEGIN; UPDATE accounts SET balance = balance WHERE account = '$account'; $locks; ROLLBACK");
	note("locks in ShareLock: a claim $claim_locks, Citus's write $write_locks");
	isnt($write_locks, 'none', "Citus's router write holds a shard metadata lock");
	is($claim_locks, $write_locks, "a claim on the direct path holds the very lock Citus's router write holds");
	# The tag is Citus's (from lock_shard_metadata), not a copy: the class Citus 14 uses is 8.
	like($claim_locks, qr{^\d+/\d+/8$}, "the lock is Citus 14's co-located shards metadata lock (class 8)");
}

# ---- across a shard move: a held lease keeps beating, through every node ----
{
	my $account = $accounts[0];
	my $owner = $coordinator->citus_node_of(\@nodes, 'accounts', $account);
	my ($other) = grep { $_ != $owner && $_ != $coordinator } @nodes;
	my $key = 'moved-lease';
	my $token = sql($owner,
		"SELECT lease_token FROM idem_lease('$key', idem_hash('a'::text), '10 seconds', NULL, '$account')");

	# A heartbeat process: an extend every 0.3 s through the nodes in turn, each result logged.
	my $log = PostgreSQL::Test::Utils::tempdir() . '/heartbeats';
	my $beater = fork // die "fork: $!";
	if ($beater == 0)
	{
		open my $out, '>', $log or die $!;
		$out->autoflush(1);
		my $turn = 0;
		while (-e "$log.go" || $turn == 0)
		{
			my $via = $nodes[$turn++ % @nodes];
			# The call alone in its statement, so that Citus delegates it (an expression around it would not be).
			my ($rc, $stdout, $stderr) = $via->psql('app',
				"SELECT idem_lease_extend('$key', '$token', '10 seconds', '$account')", on_error_die => 0);
			$stderr =~ s/\s+/ /g;
			printf $out "%.3f %s %s %s\n", IdemNode::now_s(), name_of($via),
			  ($rc != 0 ? 'error' : $stdout =~ /^\d{4}-/ ? 't' : 'f'), $rc == 0 ? '' : $stderr;
			sleep 0.3;
		}
		# Not exit: the nodes belong to the parent, and Cluster's END block would stop them.
		POSIX::_exit(0);
	}
	open my $go, '>', "$log.go" or die $!;
	close $go;
	sleep 1;
	my $shard = sql($coordinator, "SELECT get_shard_id_for_distribution_column('idempotency_keys', '$account')");
	for my $mode (qw(block_writes force_logical))
	{
		my ($from, $to) = ($coordinator->citus_node_of(\@nodes, 'accounts', $account) == $owner)
		  ? ($owner, $other) : ($other, $owner);
		sql($coordinator, "SELECT citus_move_shard_placement($shard, '127.0.0.1', ${\ $from->port},
		                 '127.0.0.1', ${\ $to->port}, '$mode')");
		is(name_of($coordinator->citus_node_of(\@nodes, 'accounts', $account)), name_of($to),
			"moved ($mode): the shard is on " . name_of($to));
		sleep 1;
	}
	unlink "$log.go";
	waitpid($beater, 0);

	my @beats = map { [ split ' ', $_, 4 ] } split /\n/, slurp_file($log);
	my @good = grep { $_->[2] eq 't' } @beats;
	my $longest = 0;
	for my $i (1 .. $#good) { my $gap = $good[$i][0] - $good[ $i - 1 ][0]; $longest = $gap if $gap > $longest; }
	my @failed = grep { $_->[2] ne 't' } @beats;
	note(sprintf('%d heartbeats across two moves, %d extended, longest time without one %.1f s; failed: %s',
		scalar @beats, scalar @good, $longest, join('; ', map { "$_->[1]: $_->[3]" } @failed) || 'none'));
	cmp_ok(scalar @good, '>=', 6, 'heartbeats extended the lease while its shard moved');
	# Well under the 10-second lease, with room for a move's blocked writes on two busy cores.
	cmp_ok($longest, '<', 8, 'the lease never went 8 s without a heartbeat across the moves');
	is(scalar(grep { $_->[2] eq 'f' } @beats), 0, 'no heartbeat found its lease gone');
	for my $via (@nodes)
	{
		like(sql($via, "SELECT idem_lease_extend('$key', '$token', '30 seconds', '$account')"), qr/^\d{4}-/,
			'after the moves, a heartbeat through ' . name_of($via) . ' extends the lease');
	}
	my $holder = $coordinator->citus_node_of(\@nodes, 'accounts', $account);
	sql($holder, "SELECT idem_checkpoint('$key', '$token', 'charged', '{\"charge\": 2}', '$account')");
	sql($coordinator, "SELECT idem_lease_complete('$key', '$token', 201, '{\"moved\": 1}', NULL, '$account')");
	for my $again (@nodes)
	{
		is(sql($again, "SELECT outcome || '|' || http_status || '|' || response_body
		              FROM idem_claim('$key', idem_hash('a'::text), NULL, '$account')"),
			'replay|201|{"moved": 1}', 'completed after the moves, it replays from ' . name_of($again));
	}
}

done_testing();
