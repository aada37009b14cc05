# The worker in partitioned storage with 1-minute partitions and idempotency.ttl = 2min:
# it keeps partitions ahead of claims, drops the first partition once it has expired
# (at the next minute boundary, so this file waits up to ~70 s), moves parked rows out
# of the default partition, and claims running all along never fail.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);

use IdemNode;

my $CLIENTS = 2;
my $HASH = 'ab' x 32;

my $node = IdemNode->create('partitioned', "idempotency.databases = 'appdb'", 'idempotency.cleanup_interval = 1s',
	'idempotency.ttl = 2min');
$node->safe_psql('postgres', 'CREATE DATABASE appdb');
$node->safe_psql('appdb', 'CREATE EXTENSION idempotency');

# Less than 8 s before a minute boundary the first partition could be dropped before
# the rows below are in it: start just after the boundary instead.
my $second = (gmtime)[0];
sleep 61 - $second if $second > 52;

$node->safe_psql('appdb', "SELECT idem_set_storage('partitioned', interval '1 minute')");
is($node->safe_psql('appdb', 'SELECT idem_storage_mode()'), 'partitioned', 'storage is partitioned');
my ($first, $first_upper, $second_name, $last_upper) = split /\|/, $node->safe_psql('appdb', q{
	SELECT (array_agg(partition_name ORDER BY lower_bound))[1],
	       extract(epoch FROM (array_agg(upper_bound ORDER BY lower_bound))[1]),
	       (array_agg(partition_name ORDER BY lower_bound))[2],
	       max(upper_bound)
	FROM idem_partitions()});
$node->safe_psql('appdb', 'SELECT idem_stats_reset()');

# Rows written directly (no claim needed): 20 in the first partition, 20 in the second,
# 20 already expired (below every partition: default partition, row deletes),
# one beyond the last partition (parked in the default partition until its own exists).
$node->safe_psql('appdb', qq{
	INSERT INTO idempotency_keys_partitioned
	SELECT ts, now(), 200, '', name || i, decode('$HASH', 'hex'), NULL, '{"n": 1}'
	FROM generate_series(1, 20) i,
	     (SELECT 'first' AS name, upper_bound - interval '1 ms' AS ts FROM idem_partitions()
	        WHERE partition_name = '$first'
	      UNION ALL
	      SELECT 'second', upper_bound - interval '1 s' FROM idem_partitions()
	        WHERE partition_name = '$second_name'
	      UNION ALL
	      SELECT 'past', now() - interval '1 hour') AS t;
	INSERT INTO idempotency_keys_partitioned
	VALUES ('$last_upper'::timestamptz + interval '30 s', now(), 200, '', 'far', decode('$HASH', 'hex'), NULL, NULL)});
is($node->safe_psql('appdb', qq{
	SELECT string_agg(DISTINCT k || ':' || t, ',' ORDER BY k || ':' || t) FROM (
		SELECT regexp_replace(key, '[0-9]+\$', '') AS k,
		       CASE tableoid::regclass::text WHEN '$first' THEN 'p1' WHEN '$second_name' THEN 'p2'
		            ELSE tableoid::regclass::text END AS t
		FROM idempotency_keys_partitioned) s}),
	'far:idempotency_keys_partitioned_default,first:p1,past:idempotency_keys_partitioned_default,second:p2',
	'the rows start in the partitions meant');
# Fails if the sweeper skips the default partition in partitioned mode.
ok(defined $node->wait_until('appdb',
		"SELECT count(*) = 0 FROM idempotency_keys_partitioned WHERE key LIKE 'past%'", 5),
	'expired rows in the default partition are deleted');

# Clients claiming and completing with ttl 2min the whole time; each writes a summary.
my $work = PostgreSQL::Test::Utils::tempdir();
my $dsn = $node->dsn(dbname => 'appdb');
my @children;
for my $c (1 .. $CLIENTS)
{
	my $pid = fork // die "fork: $!";
	if ($pid == 0)
	{
		my ($done, $errors, $max_latency, %messages) = (0, 0, 0);
		my $dbh = idem_connect($dsn, AutoCommit => 0) or die "client $c: no connection\n";
		for (my $n = 0; !-e "$work/stop"; $n++)
		{
			my $started = time;
			eval {
				my ($outcome) = $dbh->selectrow_array(
					q{SELECT outcome FROM idem_claim($1, $2, interval '2 min')}, undef, "c${c}_$n", $HASH);
				die "outcome $outcome\n" unless $outcome eq 'claimed';
				$dbh->selectrow_array(q{SELECT idem_complete($1, 201)}, undef, "c${c}_$n");
				$dbh->commit;
				$done++;
			};
			if ($@)
			{
				$errors++;
				$messages{ $@ =~ s/\s+$//r }++;
				eval { $dbh->rollback };
			}
			my $latency = time - $started;
			$max_latency = $latency if $latency > $max_latency;
			sleep 0.005;
		}
		open my $out, '>', "$work/client$c" or die;
		print $out "$done $errors $max_latency\n", map { "$_ ($messages{$_}x)\n" } sort keys %messages;
		close $out;
		POSIX::_exit(0);
	}
	push @children, $pid;
}

# Sample the horizon until the first partition is dropped, then 6 s more.
my ($min_margin, $dropped_at) = (1e9, undef);
my $deadline = $first_upper + 20;
while (time < $deadline && (!defined $dropped_at || time < $dropped_at + 6))
{
	my ($margin, $dropped) = split /\|/, $node->safe_psql('appdb', q{
		SELECT extract(epoch FROM max(upper_bound) - now() - current_setting('idempotency.ttl')::interval),
		       (SELECT partitions_dropped FROM idem_stats) >= 1
		FROM idem_partitions()});
	$min_margin = $margin if $margin < $min_margin;
	$dropped_at //= time if $dropped eq 't';
	sleep 0.5;
}
# Fails if the sweep never drops expired partitions, or late.
ok(defined $dropped_at && $dropped_at - $first_upper <= 3,
	sprintf('the first partition is dropped within 3 s of its upper bound (%s)',
		defined $dropped_at ? sprintf('%.1f s after', $dropped_at - $first_upper) : 'never'));
# Fails if partitions are not made ahead: a claim with the default ttl would land in
# the default partition (or fail with "no partition of relation").
cmp_ok($min_margin, '>=', 0, "max(upper_bound) stayed >= now() + ttl (least margin ${min_margin} s)");
# The documented target is now() + ttl + 2 partitions; allow one interval plus slack of lag.
# Fails if the worker does not premake partitions as time passes.
is($node->safe_psql('appdb', q{
	SELECT max(upper_bound) >= now() + current_setting('idempotency.ttl')::interval
	                          + 2 * interval '1 minute' - interval '3 s'
	FROM idem_partitions()}), 't', 'partitions reach now() + ttl + 2 widths');

POSIX::close(POSIX::open("$work/stop", POSIX::O_CREAT() | POSIX::O_WRONLY()));
waitpid($_, 0) for @children;
my ($claimed, $errors, $max_latency, @messages) = (0, 0, 0);
for my $c (1 .. $CLIENTS)
{
	open my $in, '<', "$work/client$c" or die "client $c wrote no summary";
	my ($d, $e, $l) = split ' ', scalar <$in>;
	push @messages, <$in>;
	($claimed, $errors) = ($claimed + $d, $errors + $e);
	$max_latency = $l if $l > $max_latency;
}
diag(sprintf('%d claims completed, %d errors, slowest claim+complete %.3f s', $claimed, $errors, $max_latency));
diag("client error: $_") for @messages;
# Fails if the clients were stuck, which would make the next test vacuous.
cmp_ok($claimed, '>', 1000, 'the clients kept claiming');
# Fails on "no partition of relation", lock timeouts or deadlocks met by claims.
is($errors, 0, 'no claim or completion failed');
# Fails if claims queued behind partition DDL for long.
cmp_ok($max_latency, '<', 5, 'no claim waited 5 s or more');

is($node->safe_psql('appdb', "SELECT to_regclass('$first') IS NULL AND NOT EXISTS
		(SELECT FROM idem_partitions() WHERE partition_name = '$first')"), 't', 'the first partition is gone');
is($node->safe_psql('appdb', "SELECT count(*) FROM idempotency_keys_partitioned WHERE key LIKE 'first%'"),
	'0', 'its keys are gone');
# Fails if a drop takes a partition that has live keys.
is($node->safe_psql('appdb', qq{SELECT count(*) FROM idempotency_keys_partitioned
		WHERE key LIKE 'second%' AND tableoid = '$second_name'::regclass}),
	'20', 'keys in the next partition stay');
# All claimed keys expire 2 min after the start, later than now.
is($node->safe_psql('appdb', "SELECT count(*) FROM idempotency_keys_partitioned WHERE key LIKE 'c%'"),
	$claimed, 'every completed claim is stored');
# Fails if idem_create_partition does not take over rows parked in the default partition.
ok(defined $node->wait_until('appdb', q{
		SELECT tableoid::regclass::text <> 'idempotency_keys_partitioned_default'
		FROM idempotency_keys_partitioned WHERE key = 'far'}, 10),
	'the parked row moved to its new partition');
is($node->safe_psql('appdb', "SELECT outcome FROM idem_claim('far', '$HASH')"), 'replay',
	'and still replays');
# Fails if the sweeper's counters or error report are wrong.
is($node->safe_psql('appdb', q{
	SELECT partitions_dropped >= 1, partitions_created >= 1, keys_removed >= 40, last_error
	FROM idem_stats}), 't|t|t|', 'idem_stats: partitions dropped and created, keys removed, no error');
is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, 'no process crashed');

$node->stop;
done_testing();
