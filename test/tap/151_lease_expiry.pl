# Lease rows expire like completed rows: the expiry worker and idem_cleanup() remove
# expired leases (with or without a recovery point) and expired completions alike, and
# keep live leases, lapsed leases of keys that have not expired (their recovery point is
# what a takeover resumes from), leases extended past their first expiry, and live
# completions. In both storage modes: four databases, table and partitioned (1-minute
# partitions), each swept by the worker or by idem_cleanup() by hand. In partitioned
# storage an expired row goes when its partition is dropped, after the next minute
# boundary: this file waits up to ~65 s.
#
# Fails on: an expired lease or completion left behind, a live or lapsed-but-unexpired
# lease removed, a takeover after the sweep without its recovery point, idem_cleanup()
# returning another count than the rows it removed, an extended lease that is not
# in_progress, a live completion that does not replay.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my $HASH = 'c' x 64;
my %N = (exp_lease => 20, exp_ckpt => 10, exp_done => 20, exp_claim => 10,
	live_lease => 10, lapsed => 10, live_done => 10, extended => 5);
my $EXPIRED = $N{exp_lease} + $N{exp_ckpt} + $N{exp_done} + $N{exp_claim};

# idempotency.ttl = 2min: 1-minute partitions need ttl + 2 partitions <= 64 partitions.
my $node = IdemNode->create('lease_expiry', "idempotency.databases = 'wtable, wpart'",
	'idempotency.cleanup_interval = 1s', 'idempotency.ttl = 2min');
my %mode = (wtable => 'table', wpart => 'partitioned', ctable => 'table', cpart => 'partitioned');
for my $db (sort keys %mode)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}

# Rows expiring within 1 s must not straddle a minute boundary by much: at most ~60 s of waiting.
my $second = (gmtime)[0];
sleep 61 - $second if $second > 55;

for my $db (grep { $mode{$_} eq 'partitioned' } sort keys %mode)
{
	$node->safe_psql($db, "SELECT idem_set_storage('partitioned', interval '1 minute')");
	is($node->safe_psql($db, 'SELECT idem_storage_mode()'), 'partitioned', "$db: storage is partitioned");
}

my %dbh = map { $_ => idem_connect($node->dsn() =~ s/dbname=postgres/dbname=$_/r) } sort keys %mode;
sub lease
{
	my ($h, $key, $lease, $ttl) = @_;
	return $h->selectrow_hashref(q{SELECT * FROM idem_lease($1, $2, lease => $3, ttl => $4)},
		undef, $key, $HASH, $lease, $ttl);
}
sub checkpoint
{
	my ($h, $key, $token) = @_;
	$h->do(q{SELECT idem_checkpoint($1, $2, 'charge_created', '{"charge_id": "ch_x"}')}, undef, $key, $token);
}
sub table_of { return $mode{ $_[0] } eq 'partitioned' ? 'idempotency_keys_partitioned' : 'idempotency_keys'; }
sub count_prefix
{
	my ($db, $prefix) = @_;
	return $dbh{$db}->selectrow_array('SELECT count(*) FROM ' . table_of($db) . ' WHERE key LIKE $1', undef,
		"$prefix%");
}

for my $db (sort keys %mode)
{
	my $h = $dbh{$db};
	# Expired when their 1 s lease runs out: the holder died (with and without a checkpoint).
	lease($h, "exp_lease$_", '1 s', '1 s') for 1 .. $N{exp_lease};
	checkpoint($h, "exp_ckpt$_", lease($h, "exp_ckpt$_", '1 s', '1 s')->{lease_token}) for 1 .. $N{exp_ckpt};
	# Expired completions, by lease mode and by 1.0 claims.
	for (1 .. $N{exp_done})
	{
		my $t = lease($h, "exp_done$_", '1 s', '1 s')->{lease_token};
		$h->do(q{SELECT idem_lease_complete($1, $2, 201, '{"ok": true}')}, undef, "exp_done$_", $t);
	}
	for (1 .. $N{exp_claim})
	{
		$h->begin_work;
		$h->do(q{SELECT idem_claim($1, $2, interval '1 s')}, undef, "exp_claim$_", $HASH);
		$h->do(q{SELECT idem_complete($1, 201, '{"ok": true}')}, undef, "exp_claim$_");
		$h->commit;
	}
	# Kept: a live lease, a lapsed lease of a live key, an extended lease, a live completion.
	lease($h, "live_lease$_", '1 hour', undef) for 1 .. $N{live_lease};
	checkpoint($h, "lapsed$_", lease($h, "lapsed$_", '1 s', '1 hour')->{lease_token}) for 1 .. $N{lapsed};
	for (1 .. $N{extended})
	{
		my $t = lease($h, "extended$_", '1 s', '1 s')->{lease_token};
		$h->do(q{SELECT idem_lease_extend($1, $2, interval '1 hour')}, undef, "extended$_", $t);
	}
	for (1 .. $N{live_done})
	{
		my $t = lease($h, "live_done$_", '1 s', '1 hour')->{lease_token};
		$h->do(q{SELECT idem_lease_complete($1, $2, 201, '{"ok": true}')}, undef, "live_done$_", $t);
	}
	is(count_prefix($db, ''), $EXPIRED + $N{live_lease} + $N{lapsed} + $N{extended} + $N{live_done},
		"$db ($mode{$db}): all rows written");
}
sleep 1.2;    # every 1 s lease and ttl has run out

# In partitioned storage the expired rows go with their partition: wait until it has ended.
for my $db (grep { $mode{$_} eq 'partitioned' } sort keys %mode)
{
	my $wait = $dbh{$db}->selectrow_array(q{
		SELECT greatest(extract(epoch FROM max(p.upper_bound) - clock_timestamp()), 0)
		FROM idem_partitions() p
		WHERE EXISTS (SELECT FROM idempotency_keys_partitioned k
		              WHERE k.key LIKE 'exp%' AND k.expires_at >= p.lower_bound AND k.expires_at < p.upper_bound)});
	ok(defined $wait && $wait < 70, "$db: the expired rows are in partitions ending within 70 s")
	  or diag("wait $wait");
	# Fails if an expired row were parked in the default partition or a partition far ahead.
	is($dbh{$db}->selectrow_array(q{
		SELECT count(*) FROM idempotency_keys_partitioned_default WHERE key LIKE 'exp%'}), '0',
		"$db: no expired row in the default partition");
	sleep(($wait // 0) + 0.3);
}

# By hand: idem_cleanup() removes exactly the expired rows, and says so.
for my $db (qw(ctable cpart))
{
	my $removed = $dbh{$db}->selectrow_array('SELECT idem_cleanup()');
	is($removed, $EXPIRED, "$db ($mode{$db}): idem_cleanup() removed $EXPIRED rows (expired leases and completions)");
}
# The worker: within a few sweeps.
for my $db (qw(wtable wpart))
{
	my $until = now_s() + 10;
	sleep 0.2 while count_prefix($db, 'exp') > 0 && now_s() < $until;
}

for my $db (sort keys %mode)
{
	my $h = $dbh{$db};
	my $by = $db =~ /^w/ ? 'the worker' : 'idem_cleanup()';
	for my $kind (qw(exp_lease exp_ckpt exp_done exp_claim))
	{
		is(count_prefix($db, $kind), '0', "$db ($mode{$db}): $by removed every $kind row");
	}
	for my $kind (qw(live_lease lapsed extended live_done))
	{
		is(count_prefix($db, $kind), $N{$kind}, "$db ($mode{$db}): every $kind row stays");
	}
	# What the kept rows answer.
	my %answer;
	for my $kind (qw(live_lease lapsed extended live_done exp_ckpt))
	{
		for my $i (1 .. ($kind eq 'exp_ckpt' ? 3 : $N{$kind}))
		{
			my $r = lease($h, "$kind$i", '1 min', undef);
			$answer{$kind}{ join '|', $r->{outcome}, $r->{recovery_point} // '-', $r->{recovery_state} // '-',
				  defined $r->{lease_until} ? 'until' : '-', $r->{http_status} // '-' }++;
		}
	}
	my $show = sub { my ($k) = @_; return join(', ', map { "$_ x$answer{$k}{$_}" } sort keys %{ $answer{$k} }); };
	is($show->('live_lease'), "in_progress|-|-|until|409 x$N{live_lease}", "$db: a live lease answers in_progress");
	is($show->('extended'), "in_progress|-|-|until|409 x$N{extended}", "$db: an extended lease answers in_progress");
	is($show->('lapsed'), qq{claimed|charge_created|{"charge_id": "ch_x"}|until|- x$N{lapsed}},
		"$db: a lapsed lease of a live key is taken over with its recovery point");
	is($show->('live_done'), "replay|-|-|-|201 x$N{live_done}", "$db: a live completion replays");
	is($show->('exp_ckpt'), 'claimed|-|-|until|- x3', "$db: an expired lease's key is new again");
}

# A lease's key outlives the lease by the ttl: even with ttl = lease, a lapsed lease is taken
# over with its recovery point (before the fix the key expired the instant its lease ran out).
{
	my $h = $dbh{ctable};
	my $t = lease($h, 'short_ttl', '1 s', '1 s')->{lease_token};
	checkpoint($h, 'short_ttl', $t);
	sleep 1.2;
	my $r = lease($h, 'short_ttl', '1 s', '1 s');
	is(($r->{outcome} // '') . '|' . ($r->{recovery_point} // '-'), 'claimed|charge_created',
		'ttl = lease: a takeover after the lease ran out still gets the recovery point');
}

my $stats = $dbh{wtable}->selectrow_hashref('SELECT keys_removed, last_error FROM idem_stats');
cmp_ok($stats->{keys_removed}, '>=', 4 * $EXPIRED, 'idem_stats.keys_removed counts every removed row');
is($stats->{last_error}, undef, 'no sweep failed');
$_->disconnect for values %dbh;
done_testing();
