# Lease mode under faults: the rocket-rides flow against a fake payment provider.
#
# Clients (forked DBI processes, in pairs walking the same keys in opposite order)
# run each request as three steps, each in its own short transaction:
#   started         idem_lease(key, hash, lease => 1 s), committed at once
#   charge_created  call the provider (only when no recovery point says it is done),
#                   then idem_checkpoint(key, token, 'charge_created', {charge_id})
#   ride_created    ledger insert + idem_lease_complete(key, token, 201, body), one transaction
# A client that gets in_progress retries the key later; after a takeover it resumes from
# the recovery point. The provider (a TCP stub on 127.0.0.1) honours the idempotency key
# the way Stripe does (same charge for the same key) and logs every call, so repeated
# calls are counted and a second charge for one key would show (test/perl/PaymentProvider.pm).
#
# Faults while it runs, in rounds (one of each kind per round, random order): kill -9 of a
# client backend (crash restart), pg_terminate_backend, kill -9 of the postmaster (then
# restart), kill -9 of a client process, a client that kills itself right after the
# provider call (before its checkpoint) or right after its checkpoint, a connection cut
# (kill -9 of the proxy child carrying it), and a holder that stalls past its lease at a
# step boundary while a rival takes the key over (its next step must get 55000). All
# along, about one claimed key in 150 ($CUT_EVERY) has its checkpoint or completion COMMIT cut
# after the server answered (test/perl/pg_fault_proxy.pl, cut_await). At the end every
# client kills itself between two steps, the leases run out, and a final pass finishes
# every key. Killed clients are respawned and redo their current block.
#
# Fails on: a key with two distinct charges, a provider call by a holder whose claim
# began after the key's charge_created checkpoint was acknowledged (lost recovery point),
# a claim after an acknowledged completion, a key stuck in_progress past its lease, a key
# not finishable in the final pass, a ledger row count per key other than 1, an
# acknowledged body that does not replay (idem_lease and idem_claim), no takeovers.
#
# The whole scenario runs twice on one node, in table storage and then, after
# idem_set_storage('partitioned'), in partitioned storage, each pass with keys of its own and its
# assertions in a subtest of its own. One key in five is short: lease 0.6 s, ttl 0.2 s, so that
# completed and abandoned ones expire during the run and are claimed anew (in partitioned storage
# the expired row stays beside the new one), and now and then its holder sleeps past the key's
# expiry at a step boundary: its next step must get 55000.
#
# The recorded history: every grant (client logs: fencing number, the server's lease end and
# expiry, the client's clock around the call) and every checkpoint and completion that committed
# (table history, written in the same transaction). Fails on a stale write (one whose transaction
# began after its holder's key expired, or after a holder with a larger fencing number was
# granted the key), a double completion (a key completed again while its earlier response was
# live), fencing numbers that do not strictly increase per key in grant order.
#
# Waiters: the odd clients retry an in_progress key with wait => 2 s, and three waiter processes
# each take a key with one connection and ask for it with wait => 3 s on another while the holder
# abandons it (the wait ends in a takeover; the holder's late checkpoint must get 55000) or
# completes it (the wait ends in a replay of that body). Fails on a grant after a wait that leaves
# less than the lease minus 0.4 s at its return (by the client's clock), a grant returned
# already lapsed, a wait that runs out, a late holder's write.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use Digest::SHA qw(sha256_hex);
use List::Util qw(shuffle sum0 max min);
use DBD::Pg qw(:async);
use POSIX ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep clock_gettime CLOCK_MONOTONIC);

use IdemFaults;
use IdemNode;
use PaymentProvider;

my $LEASE       = '1 s';
my $PAIRS       = 2;       # 4 client processes
my $BLOCK       = 50;      # keys a pair walks in opposite order before the next block
my $MIN_KEYS    = 2000;
my $ROUNDS      = 3;       # each round: one fault of each kind, in random order
my $CUT_EVERY   = 150;     # about one claimed key in this many has a step's COMMIT cut
my $STALL_S     = 2.5;     # a stalled holder: longer than the lease
my $STUCK_S     = 10;      # a key in_progress for longer than this is stuck (lease + restarts)
my $RUN_LIMIT   = 60;      # seconds of client work at most
# Short keys (one in $SHORT_EVERY of each block, named "$mode/short/..."): their key expires
# $SHORT_TTL_S after the lease ends, and one holder in $SLOW_EVERY of them sleeps $SLOW_S at a step
# boundary, past its key's expiry, while its pair's other client re-claims the key (a new row beside
# the expired one, in partitioned storage). The sleeper's next step must get 55000. Only a client's
# first attempt at a key sleeps, so a key waiting for its retry is not held up by sleeps at others.
my $SHORT_EVERY   = 5;
my $SHORT_LEASE_S = 0.6;
my $SHORT_TTL_S   = 0.2;
my $SLOW_EVERY    = 20;
my $SLOW_S        = $SHORT_LEASE_S + $SHORT_TTL_S + 0.6;
# Waiters: the odd clients retry a key that answered in_progress with wait => $WAIT_S s, and
# $WAITERS processes of their own each hold a key with one connection and wait for it with another
# while the holder abandons it (the wait ends in a takeover) or completes it (in a replay).
# A grant after a wait must leave the full lease from its return but $MARGIN_S: the time from the
# server's grant to the client's clock read, with both cores busy (at a load average of 12 to 21 on 2
# cores, the most that any of some 13,000 grants lost was 0.17 s). A lease timed from the call, as
# before 1.2, is short by the whole wait: the waiters' waits last about a lease, well over the margin.
my $WAIT_S        = 2;
my $WAITERS       = 3;
my $MARGIN_S      = 0.4;
# The whole scenario runs once per storage mode: partitioned storage keeps an expired row beside the
# re-claimed key's new one, so its fence is not table storage's. With idempotency.ttl = 1 hour,
# 10-minute partitions make 8 of them (every claim reads each one); both are well inside the 64 allowed.
my @MODES          = qw(table partitioned);
my $PARTITION_SPAN = '10 minutes';

sub mono { return clock_gettime(CLOCK_MONOTONIC); }
# sleep that a signal does not cut short: the clients get the faults' signals at any time.
sub sleep_fully { my $until = mono() + $_[0]; sleep($until - mono()) while mono() < $until; }

# fsync = off (Cluster's default) is sound: every fault is a process crash, never an OS crash.
my $node = IdemNode->create('lease', 'restart_after_crash = on', 'max_connections = 60', 'idempotency.ttl = 1h');
$node->safe_psql('postgres',
	'CREATE TABLE ledger (key text NOT NULL, charge_id text NOT NULL, token uuid NOT NULL, client text NOT NULL)');
# The recorded history: every checkpoint and completion that committed, written in its own
# transaction, with the holder's grant (fencing number, lease end and expiry as idem_lease returned
# them; epoch seconds) and when the write began: by the client's CLOCK_MONOTONIC before it sent
# the write, and the server's now() (the transaction's start, where expiry is judged).
$node->safe_psql('postgres', q{
	CREATE TABLE history (key text NOT NULL, token uuid NOT NULL, fencing bigint NOT NULL, step text NOT NULL,
		client_start float8 NOT NULL, tx_start float8 NOT NULL DEFAULT extract(epoch FROM now()),
		lease_until float8 NOT NULL, expires float8 NOT NULL, lease_s float8 NOT NULL)});

# One node and one provider for both passes; what a pass writes (its log directory, its keys, named
# "$mode/...") is its own. $KEYS is where the storage mode keeps the rows.
my $root = PostgreSQL::Test::Utils::tempdir();
my ($mode, $work, $KEYS, $started_at);
my $parent = $$;
$SIG{PIPE} = 'IGNORE';

# ---- the payment provider stub (test/perl/PaymentProvider.pm): keyed like Stripe, records every call ----
my $provider = PaymentProvider->start("$root/provider.log");

my ($proxy, $proxy_port, $proxy_log) = $node->start_proxy($root);

sub client_dsn
{
	my ($id, $app) = @_;
	return $id % 2
	  ? $node->dsn(host => '127.0.0.1', port => $proxy_port, application_name => $app,
		sslmode => 'disable', gssencmode => 'disable')
	  : $node->dsn(application_name => $app);
}
sub cut_dsn
{
	return $node->dsn(host => '127.0.0.1', port => $proxy_port, application_name => 'cut_await',
		sslmode => 'disable', gssencmode => 'disable');
}

# ---- the request flow, shared by the clients and the final pass ----
# $ctx: { id, out (log handle), dsn, dbh, prov, die_at (boundary to die at), cut (allow cuts) }
# Log lines: claim KEY TOKEN RP CHARGE T0 | ckpt KEY TOKEN CHARGE T | ack KEY TOKEN CHARGE T |
# replay KEY STATUS CHARGE TOKEN | wait KEY | stale KEY STAGE | error KEY STAGE | cut STEP KEY TOKEN |
# suicide KEY BOUNDARY | stuck KEY | bad KEY OUTCOME | slow KEY BOUNDARY | slow_fenced KEY | slow_wrote KEY |
# slow_error KEY (the step after a slow holder's sleep: 55000, success, another error) |
# grant KEY TOKEN FENCING LEASE_S WAIT_S CALLED RETURNED RETURNED_WALL LEASE_UNTIL EXPIRES
# (CALLED, RETURNED: CLOCK_MONOTONIC around the idem_lease call; the rest epoch seconds)
sub provider_charge
{
	my ($ctx, $key, $token) = @_;
	return $provider->charge(\$ctx->{prov}, $key, $token);
}

sub boundary
{
	my ($ctx, $key, $where) = @_;
	if (($ctx->{slow_at} // '') eq $where)
	{
		# A short key's holder slower than its key's life: the key expires meanwhile.
		$ctx->{slow_at} = undef;
		out($ctx, 'slow', $key, $where);
		sleep_fully($SLOW_S);
		# Past the expiry its grant returned: a takeover keeps the later of two expiries, so a short key
		# once granted with a longer ttl (a waiter's) can outlive this holder's sleep, and then it may write.
		$ctx->{slowed} = $key if now_s() > ($ctx->{grant_expires} // 0) + 0.05;
	}
	if (($ctx->{stall_at} // '') eq $where)
	{
		# A holder slower than its lease: someone takes the key over meanwhile.
		$ctx->{stall_at} = undef;
		out($ctx, 'stall', $key, $where);
		sleep_fully($STALL_S);
	}
	my $d = $ctx->{die_at} or return;
	# The final kill leaves its lease on a key that must end answered, never on a short key.
	return unless ($d eq 'any' && !is_short($key)) || $d eq $where;
	print { $ctx->{out} } "suicide $key $where\n";
	kill 'KILL', $$;
	sleep 1 while 1;
}

sub out { my $ctx = shift; print { $ctx->{out} } "@_\n"; }

# One attempt at a key: 'done' (answered), or 'later' (in_progress, stale, error).
sub attempt
{
	my ($ctx, $key, $retry) = @_;
	my $hash = sha256_hex("ride:$key");
	my $short = is_short($key);
	my $lease_s = $short ? $SHORT_LEASE_S : 1;
	my $wait_s = $retry && $ctx->{wait} ? $WAIT_S : 0;
	$ctx->{dbh} //= idem_connect($ctx->{dsn});
	if (!$ctx->{dbh}) { sleep 0.05; return 'later'; }
	my $dbh = $ctx->{dbh};
	my ($stage, $cutdbh, $cutting) = ('lease', undef, 0);
	$ctx->{slowed} = undef;
	my $t0 = mono();
	my $result = eval {
		my $r = $dbh->selectrow_hashref(q{
			SELECT outcome, http_status, lease_token, recovery_point,
			       recovery_state->>'charge_id' AS rs_charge,
			       response_body->>'charge_id' AS body_charge, response_body->>'token' AS body_token,
			       fencing_number, extract(epoch FROM lease_until) AS lease_until,
			       extract(epoch FROM expires_at) AS expires
			FROM idem_lease($1, $2, lease => $3, ttl => $4, wait => $5)}, undef, $key, $hash,
			$short ? "$SHORT_LEASE_S s" : $LEASE, $short ? "$SHORT_TTL_S s" : undef, $wait_s ? "$wait_s s" : undef);
		my ($returned_wall, $returned) = (now_s(), mono());
		my $outcome = $r->{outcome};
		if ($outcome eq 'replay')
		{
			out($ctx, 'replay', $key, $r->{http_status} // '-', $r->{body_charge} // '-', $r->{body_token} // '-');
			return 'done';
		}
		if ($outcome eq 'in_progress')
		{
			out($ctx, 'wait', $key);
			return 'later';
		}
		if ($outcome ne 'claimed')
		{
			out($ctx, 'bad', $key, $outcome);
			return 'done';
		}
		my $token = $r->{lease_token};
		my $rp = $r->{recovery_point} // '-';
		out($ctx, 'claim', $key, $token, $rp, $r->{rs_charge} // '-', $t0);
		out($ctx, 'grant', $key, $token, $r->{fencing_number}, $lease_s, $wait_s, $t0, $returned, $returned_wall,
			$r->{lease_until}, $r->{expires});
		# What the history row of each write of this holder records about its grant.
		my @grant = ($token, $r->{fencing_number}, $r->{lease_until}, $r->{expires}, $lease_s);
		$ctx->{grant_expires} = $r->{expires};
		$ctx->{slow_at} = $rp eq 'charge_created' || rand() < 0.5 ? 'after_checkpoint' : 'after_charge'
		  if $short && $ctx->{slow} && !$retry && rand($SLOW_EVERY) < 1;
		boundary($ctx, $key, 'after_lease');
		my $charge;
		if ($rp eq 'charge_created')
		{
			$charge = $r->{rs_charge};
		}
		else
		{
			$stage = 'provider';
			$charge = provider_charge($ctx, $key, $token);
			boundary($ctx, $key, 'after_charge');
			sleep rand(0.002);    # widen the window between the call and its checkpoint
			$stage = 'checkpoint';
			# One statement: the history row commits with the checkpoint or not at all.
			my $ckpt = q{
				INSERT INTO history (key, token, fencing, step, client_start, lease_until, expires, lease_s)
				SELECT $1, $2, $3, 'checkpoint', $4, $5, $6, $7
				FROM idem_checkpoint($1, $2, 'charge_created', jsonb_build_object('charge_id', $8::text))};
			my @args = ($key, @grant[0, 1], mono(), @grant[2 .. 4], $charge);
			if ($ctx->{cut} && rand($CUT_EVERY) < 1)
			{
				# The COMMIT reaches the server, its answer never reaches us: we must assume
				# nothing and come back later (the takeover must resume at charge_created).
				$cutdbh = idem_connect(cut_dsn(), AutoCommit => 0) or die "no cut connection\n";
				$cutdbh->do($ckpt, undef, @args);
				out($ctx, 'cut', 'checkpoint', $key, $token);
				$cutting = 1;
				$cutdbh->commit;
				die "cut did not cut\n";
			}
			$dbh->do($ckpt, undef, @args);
			out($ctx, 'ckpt', $key, $token, $charge, mono());
			out($ctx, 'slow_wrote', $key) if $ctx->{slowed};
		}
		boundary($ctx, $key, 'after_checkpoint');
		$stage = 'complete';
		my $started = mono();
		my $h = $dbh;
		if ($ctx->{cut} && rand($CUT_EVERY) < 1)
		{
			$cutdbh = idem_connect(cut_dsn(), AutoCommit => 0) or die "no cut connection\n";
			$h = $cutdbh;
			$h->begin_work if $h->{AutoCommit};
		}
		else { $h->begin_work; }
		$h->do('INSERT INTO ledger (key, charge_id, token, client) VALUES ($1, $2, $3, $4)',
			undef, $key, $charge, $token, "c$ctx->{id}");
		my ($stored) = $h->selectrow_array(q{
			SELECT idem_lease_complete($1, $2::uuid, 201, jsonb_build_object('charge_id', $3::text, 'token', $4::text))},
			undef, $key, $token, $charge, $token);
		die "idem_lease_complete returned false\n" unless $stored;
		$h->do(q{INSERT INTO history (key, token, fencing, step, client_start, lease_until, expires, lease_s)
			VALUES ($1, $2, $3, 'complete', $4, $5, $6, $7)}, undef, $key, @grant[0, 1], $started, @grant[2 .. 4]);
		$stage = 'commit';
		if ($cutdbh) { out($ctx, 'cut', 'complete', $key, $token); $cutting = 1; }
		$h->commit;
		die "cut did not cut\n" if $cutdbh;
		out($ctx, 'ack', $key, $token, $charge, mono());
		out($ctx, 'slow_wrote', $key) if $ctx->{slowed};
		return 'done';
	};
	return $result if defined $result;
	my $err = $@;
	if ($cutdbh)
	{
		eval { $cutdbh->disconnect };
		die $err if $err =~ /did not cut/;    # the proxy is broken: fail loudly
		return 'later' if $cutting;           # the expected cut
	}
	if ($err =~ /not the current one/)
	{
		out($ctx, 'stale', $key, $stage);
		out($ctx, 'slow_fenced', $key) if $ctx->{slowed};
		eval { $dbh->rollback unless $dbh->{AutoCommit} } unless $cutdbh;
		return 'later';
	}
	die $err if $err =~ /provider unreachable|returned false/;
	(my $why = substr($err, 0, 80)) =~ s/\s+/_/g;
	out($ctx, 'error', $key, $stage, $why);
	out($ctx, 'slow_error', $key) if $ctx->{slowed};
	return 'later' if $cutdbh && $dbh->ping;    # only the cut connection failed
	eval { $dbh->disconnect };
	$ctx->{dbh} = undef;
	sleep 0.02;
	return 'later';
}

# Answers every key of @keys, retrying those in_progress later; logs a key stuck past $STUCK_S.
sub walk
{
	my ($ctx, @todo) = @_;
	my %first_wait;
	while (@todo)
	{
		return scalar(@todo) if $ctx->{deadline} && now_s() > $ctx->{deadline};
		my @later;
		for my $key (@todo)
		{
			if (attempt($ctx, $key, exists $first_wait{$key}) eq 'later')
			{
				push @later, $key;
				$first_wait{$key} //= now_s();
				if (now_s() - $first_wait{$key} > $STUCK_S && !$ctx->{stuck}{$key}++)
				{
					out($ctx, 'stuck', $key);
				}
			}
		}
		@todo = @later;
		sleep 0.02 + rand(0.03) if @todo;
	}
	return 0;
}

sub pair_key
{
	my ($pair, $b, $i) = @_;
	return $i % $SHORT_EVERY == $SHORT_EVERY - 1 ? "$mode/short/p${pair}b${b}k$i" : "$mode/p${pair}b${b}k$i";
}
sub is_short { return $_[0] =~ m{^[^/]+/short/}; }

sub client
{
	my ($id) = @_;
	my ($pair, $descending) = (int($id / 2), $id % 2);
	$SIG{PIPE} = 'IGNORE';
	my %ctx = (id => $id, dsn => client_dsn($id, "lease_client$id"), cut => 1, slow => 1, wait => $id % 2);
	$SIG{USR1} = sub { $ctx{die_at} = 'after_charge' };
	$SIG{HUP} = sub { $ctx{die_at} = 'after_checkpoint' };
	$SIG{TERM} = sub { $ctx{die_at} = 'any' };
	$SIG{USR2} = sub { $ctx{stall_at} = 'after_charge' };
	$SIG{WINCH} = sub { $ctx{stall_at} = 'after_checkpoint' };
	open $ctx{out}, '>>', "$work/client$id" or die;
	$ctx{out}->autoflush(1);
	my $b = -e "$work/block$id" ? slurp_file("$work/block$id") + 0 : 0;
	# A child never dies through Perl: END blocks would stop the node.
	eval {
		for (;; $b++)
		{
			last if getppid() != $parent || now_s() - $started_at > 300;
			open my $st, '>', "$work/block$id.tmp" or die;
			print $st $b;
			close $st;
			rename "$work/block$id.tmp", "$work/block$id";
			my @order = $descending ? reverse(0 .. $BLOCK - 1) : (0 .. $BLOCK - 1);
			walk(\%ctx, map { pair_key($pair, $b, $_) } @order);
		}
		1;
	} or do {
		(my $why = $@) =~ s/\s+/_/g;
		out(\%ctx, 'fatal', $why);
		POSIX::_exit(3);
	};
	POSIX::_exit(0);    # no END blocks: they would stop the node
}

# ---- the waiters ----
# Log lines: grant (as the clients') | wreplay KEY own|other | wout KEY OUTCOME | wlate KEY fenced|wrote |
# wcomplete KEY fenced|done | werror WHY
my $WAIT_GRANT = q{
	SELECT outcome, lease_token, fencing_number, extract(epoch FROM lease_until) AS lease_until,
	       extract(epoch FROM expires_at) AS expires, response_body->>'token' AS body_token
	FROM idem_lease($1, $2, lease => '1 s', wait => $3)};
my $HISTORY_COMPLETE = q{
	INSERT INTO history (key, token, fencing, step, client_start, lease_until, expires, lease_s)
	SELECT $1, $2, $3, 'complete', $4, $5, $6, 1
	FROM idem_lease_complete($1, $2, 200, jsonb_build_object('token', $2::uuid)) c WHERE c};

sub waiter
{
	my ($id) = @_;
	$SIG{PIPE} = 'IGNORE';
	my $stop;
	$SIG{TERM} = sub { $stop = 1 };
	my %ctx = (id => "waiter$id");
	open $ctx{out}, '>>', "$work/waiter$id" or die;
	$ctx{out}->autoflush(1);
	my ($holder, $waiter);
	for (my $n = 0; !$stop && getppid() == $parent && now_s() - $started_at < 300; $n++)
	{
		my $key = "$mode/wait/w$id-$n";
		my $hash = sha256_hex("wait:$key");
		# No connection while the server restarts: try again shortly.
		$holder //= idem_connect($node->dsn(application_name => "lease_holder$id"));
		$waiter //= idem_connect($node->dsn(application_name => "lease_waiter$id"));
		if (!$holder || !$waiter) { sleep 0.1; next; }
		my $ok = eval {
			my $called = mono();
			my $g = $holder->selectrow_hashref($WAIT_GRANT, undef, $key, $hash, undef);
			my ($returned_wall, $returned) = (now_s(), mono());
			die "the holder got $g->{outcome}\n" unless $g->{outcome} eq 'claimed';
			my @grant = ($g->{lease_token}, $g->{fencing_number}, $g->{lease_until}, $g->{expires});
			out(\%ctx, 'grant', $key, @grant[0, 1], 1, 0, $called, $returned, $returned_wall, @grant[2, 3]);

			# The other connection asks while the lease is live, and waits.
			my $sth = $waiter->prepare($WAIT_GRANT, { pg_async => PG_ASYNC });
			my $wait_called = mono();
			$sth->execute($key, $hash, '3 s');
			if (rand() < 0.3)
			{
				sleep 0.1 + rand(0.5);
				my $done = eval { $holder->do($HISTORY_COMPLETE, undef, $key, @grant[0, 1], mono(), @grant[2, 3]); 1 };
				die $@ unless $done || $@ =~ /not the current one/;    # a slow holder may lose its lease
				out(\%ctx, 'wcomplete', $key, $done ? 'done' : 'fenced');
			}
			# The answer's return is read off the clock as soon as it is there.
			my $until = mono() + 10;
			sleep 0.002 until $waiter->pg_ready || mono() > $until;
			my ($wait_returned_wall, $wait_returned) = (now_s(), mono());
			die "the wait did not end\n" unless $waiter->pg_ready;
			$waiter->pg_result;
			my $w = $sth->fetchrow_hashref;
			$sth->finish;
			if ($w->{outcome} eq 'claimed')
			{
				out(\%ctx, 'grant', $key, $w->{lease_token}, $w->{fencing_number}, 1, 3, $wait_called, $wait_returned,
					$wait_returned_wall, $w->{lease_until}, $w->{expires});
				# The holder that abandoned the key comes back: 55000, and nothing written.
				my $late = eval {
					$holder->do(q{
						INSERT INTO history (key, token, fencing, step, client_start, lease_until, expires, lease_s)
						SELECT $1, $2, $3, 'checkpoint', $4, $5, $6, 1 FROM idem_checkpoint($1, $2, 'late')},
						undef, $key, @grant[0, 1], mono(), @grant[2, 3]);
					1;
				};
				die $@ unless $late || $@ =~ /not the current one/;
				out(\%ctx, 'wlate', $key, $late ? 'wrote' : 'fenced');
				$waiter->do($HISTORY_COMPLETE, undef, $key, $w->{lease_token}, $w->{fencing_number}, mono(),
					$w->{lease_until}, $w->{expires});
			}
			elsif ($w->{outcome} eq 'replay')
			{
				out(\%ctx, 'wreplay', $key, ($w->{body_token} // '') eq $grant[0] ? 'own' : 'other');
			}
			else { out(\%ctx, 'wout', $key, $w->{outcome}); }
			1;
		};
		next if $ok;
		(my $why = substr($@, 0, 80)) =~ s/\s+/_/g;
		out(\%ctx, 'werror', $why);
		eval { $_->disconnect } for grep { defined } $holder, $waiter;
		($holder, $waiter) = ();
		sleep 0.1;
	}
	POSIX::_exit(0);
}

# ---- the parent: clients, monitor, faults ----
my (%clients, %exited, $final_phase, $respawns);    # pid => id
sub spawn
{
	my ($id) = @_;
	my $pid = fork // die "fork: $!";
	client($id) if $pid == 0;
	$clients{$pid} = $id;
	return $pid;
}
sub pid_of { my ($id) = @_; my ($pid) = grep { $clients{$_} == $id && !exists $exited{$_} } keys %clients; return $pid; }

sub reap
{
	while ((my $pid = waitpid(-1, POSIX::WNOHANG())) > 0)
	{
		$exited{$pid} = $?;
		next unless exists $clients{$pid};
		if (!$final_phase) { spawn($clients{$pid}); $respawns++; }
	}
}

my $mon;
sub mon
{
	return $mon if $mon && eval { $mon->ping };
	$mon = undef;
	for (1 .. 100)
	{
		$mon = idem_connect($node->dsn(application_name => 'lease_monitor'), AutoInactiveDestroy => 1);
		return $mon if $mon;
		sleep 0.1;
	}
	BAIL_OUT('monitor cannot connect');
}

# Counters live in shared memory and start again at 0 after a crash restart: sum them.
my (%stats_base, %stats_last);
my @COUNTERS = qw(leases lease_takeovers checkpoints stale_tokens);
sub stats_poll
{
	my $cur = eval { mon()->selectrow_hashref('SELECT ' . join(', ', @COUNTERS) . ' FROM idem_stats') } or return;
	if (%stats_last && $cur->{leases} < $stats_last{leases})
	{
		$stats_base{$_} += $stats_last{$_} for @COUNTERS;
	}
	%stats_last = %$cur;
}
sub stats_total { return { map { $_ => ($stats_base{$_} // 0) + ($stats_last{$_} // 0) } @COUNTERS }; }

sub progress { return sum0(map { -s "$work/client$_" // 0 } 0 .. 2 * $PAIRS - 1); }
sub pause_s
{
	my ($secs) = @_;
	my $until = now_s() + $secs;
	while (now_s() < $until) { reap(); sleep 0.05; }
}
sub wait_progress
{
	my $from = progress();
	my $until = now_s() + 3;
	pause_s(0.3);
	while (progress() < $from + 20000 && now_s() < $until) { reap(); stats_poll(); pause_s(0.1); }
}

sub client_backends
{
	my $rows = eval { mon()->selectall_arrayref(
		q{SELECT pid, state FROM pg_stat_activity WHERE application_name LIKE 'lease_client%'}) } // [];
	my @busy = grep { ($_->[1] // '') ne 'idle' } @$rows;
	return @busy ? @busy : @$rows;
}

# A holder stalls past its lease at a step boundary; a rival takes the key over and
# finishes it; the stalled holder's next step must fail with 55000 and write nothing.
my (%rival_ctx, %stale_seen, %stall_missed, %stall_cut);
# Clients told to die at their next step boundary (pid => 1): one of them, if stalled, would die
# after its stall instead of taking its next step, so it is never picked to stall.
my %dying;
sub stale_holder
{
	my ($signal, $where) = @_;
	my @ready = grep { my $pid = pid_of($_); $pid && !$dying{$pid} } 0 .. 2 * $PAIRS - 1 or return 0;
	my $id = $ready[rand @ready];
	my $pid = pid_of($id) or return 0;
	my $log = "$work/client$id";
	my $offset = -s $log;
	kill $signal, $pid or return 0;
	my ($key, $until) = (undef, now_s() + 3);
	while (!defined $key && now_s() < $until)
	{
		($key) = substr(slurp_file($log), $offset) =~ /^stall (\S+) $where$/m;
		sleep 0.01 unless defined $key;
	}
	return 0 unless defined $key;
	my $left = eval { mon()->selectrow_array(qq{
		SELECT greatest(extract(epoch FROM lease_until - clock_timestamp()), 0)
		FROM $KEYS WHERE key = \$1 AND http_status IS NULL AND expires_at > now()
		ORDER BY expires_at DESC LIMIT 1}, undef, $key) };
	sleep(($left // 0) + 0.05);
	$rival_ctx{deadline} = now_s() + 10;
	walk(\%rival_ctx, $key);
	$until = now_s() + 2 * $STALL_S;
	my ($stale, $cut);
	while (!$stale && !$cut && now_s() < $until)
	{
		my $since = substr(slurp_file($log), $offset);
		$stale = $since =~ /^stale \Q$key\E /m;
		# Another fault (a killed backend or postmaster, a cut connection) can end the stalled holder's
		# connection before its next step reaches the server: it then never asks, and writes nothing
		# (the recorded-history check below holds every write to the fence).
		$cut = !$stale && $since =~ /^error \Q$key\E \S+ DBD::Pg::\S*(?:server_closed|terminat|connection)/mi;
		pause_s(0.02) unless $stale || $cut;
	}
	if ($stale) { $stale_seen{$where}++; }
	elsif ($cut)
	{
		$stall_cut{$where}++;
		diag("stalled holder client$id, key $key ($where): its connection was cut by another fault before its "
			  . 'next step reached the server');
	}
	else
	{
		$stall_missed{$where}++;
		diag("stalled holder client$id, key $key ($where): no 55000 seen; its log since: "
			  . join(' | ', grep { /\Q$key\E|suicide|fatal/ } split /\n/, substr(slurp_file($log), $offset)));
	}
	return 1;
}

my %inject = (
	backend_kill9 => sub {
		my @b = client_backends() or return 0;
		stats_poll();
		$mon = undef;
		return IdemFaults::backend_kill9($node, $b[rand @b][0]);
	},
	backend_terminate => sub {
		my @b = client_backends() or return 0;
		return IdemFaults::terminate_backend(mon(), $b[rand @b][0]);
	},
	postmaster_kill9 => sub {
		stats_poll();
		$mon = undef;
		return IdemFaults::postmaster_kill9($node);
	},
	client_kill9 => sub {
		my $pid = pid_of(int rand(2 * $PAIRS)) or return 0;
		return kill('KILL', $pid) ? 1 : 0;
	},
	client_dies_after_charge => sub {
		my $pid = pid_of(int rand(2 * $PAIRS)) or return 0;
		kill('USR1', $pid) or return 0;
		$dying{$pid} = 1;
		return 1;
	},
	client_dies_after_checkpoint => sub {
		my $pid = pid_of(int rand(2 * $PAIRS)) or return 0;
		kill('HUP', $pid) or return 0;
		$dying{$pid} = 1;
		return 1;
	},
	# The proxy child carrying an odd (proxied) client's connection.
	connection_cut => sub { return IdemFaults::cut_connection($proxy_log, qr/^lease_client\d+$/); },
	stale_holder_after_charge => sub { return stale_holder('USR2', 'after_charge'); },
	stale_holder_after_checkpoint => sub { return stale_holder('WINCH', 'after_checkpoint'); });

# Enough keys, then every client dies between two steps: their leases must run out.
sub keys_walked_so_far
{
	my $n = 0;
	for my $pair (0 .. $PAIRS - 1)
	{
		my $blocks = max(map { -e "$work/block$_" ? slurp_file("$work/block$_") + 1 : 0 } 2 * $pair, 2 * $pair + 1);
		$n += $blocks * $BLOCK;
	}
	return $n;
}

# ---- one pass of the whole scenario in the current storage mode ----
sub run_pass
{
	$started_at = now_s();
	$work = "$root/$mode";
	mkdir $work or die "mkdir $work: $!";
	$KEYS = $mode eq 'table' ? 'idempotency_keys' : 'idempotency_keys_partitioned';
	%clients = %exited = %stats_base = %stats_last = %stale_seen = %stall_missed = %stall_cut = %dying = ();
	($final_phase, $respawns) = (0, 0);
	%rival_ctx = (id => 'rival', dsn => $node->dsn(application_name => 'lease_rival'), cut => 0);
	open $rival_ctx{out}, '>>', "$work/rival" or die;
	$rival_ctx{out}->autoflush(1);
	my $proxy_offset = -s $proxy_log // 0;
	my %faults;
	mon()->do('TRUNCATE ledger, history');
	mon()->do('SELECT idem_stats_reset()');

	spawn($_) for 0 .. 2 * $PAIRS - 1;
	my @waiters = map {
		my $id = $_;
		my $pid = fork // die "fork: $!";
		waiter($id) if $pid == 0;
		$pid;
	} 1 .. $WAITERS;
	my $fault_start = now_s();
	for my $round (1 .. $ROUNDS)
	{
		for my $kind (shuffle sort keys %inject)
		{
			for my $try (1 .. 5)
			{
				wait_progress();
				next unless $inject{$kind}->();
				$faults{$kind}++;
				last;
			}
		}
	}
	my $fault_secs = now_s() - $fault_start;

	my $until = now_s() + $RUN_LIMIT;
	pause_s(0.2) while keys_walked_so_far() < $MIN_KEYS + 4 * $BLOCK && now_s() < $until;
	$final_phase = 1;
	# The waiters finish their round first.
	kill 'TERM', @waiters;
	$until = now_s() + 10;
	sleep 0.05 while (reap(), grep { !exists $exited{$_} } @waiters) && now_s() < $until;
	kill 'KILL', grep { !exists $exited{$_} } @waiters;
	sleep 0.05 while (reap(), grep { !exists $exited{$_} } @waiters);
	reap();
	kill 'TERM', grep { !exists $exited{$_} } keys %clients;
	$until = now_s() + 5;
	sleep 0.05 while (reap(), grep { !exists $exited{$_} } keys %clients) && now_s() < $until;
	my $hard_killed = kill 'KILL', grep { !exists $exited{$_} } keys %clients;
	sleep 0.05 while (reap(), grep { !exists $exited{$_} } keys %clients);
	my $run_secs = now_s() - $fault_start;

	# ---- after the last lease has run out, finish every key ----
	stats_poll();
	# %walked: the keys that must end answered; %short: the short keys, which may end expired.
	my (%walked, %short);
	for my $pair (0 .. $PAIRS - 1)
	{
		my $blocks = max(map { -e "$work/block$_" ? slurp_file("$work/block$_") + 1 : 0 } 2 * $pair, 2 * $pair + 1);
		for my $b (0 .. $blocks - 1)
		{
			for my $key (map { pair_key($pair, $b, $_) } 0 .. $BLOCK - 1)
			{
				if (is_short($key)) { $short{$key} = 1; } else { $walked{$key} = 1; }
			}
		}
	}
	my $dbh = mon();
	# No client is left to take a short key: none may live longer than a lease and a ttl from now.
	my $short_life_left = $dbh->selectrow_array(qq{
		SELECT coalesce(extract(epoch FROM max(expires_at) - clock_timestamp()), 0) FROM $KEYS WHERE key LIKE \$1},
		undef, "$mode/short/%");
	my ($left_leases, $wait_lease) = $dbh->selectrow_array(qq{
		SELECT count(*), greatest(extract(epoch FROM max(lease_until) - clock_timestamp()), 0)
		FROM $KEYS WHERE http_status IS NULL AND lease_until IS NOT NULL});
	sleep(($wait_lease // 0) + 0.05);
	my $live_after = $dbh->selectrow_array(qq{
		SELECT count(*) FROM $KEYS WHERE http_status IS NULL AND lease_until > clock_timestamp()});
	my %done = map { $_->[0] => 1 } @{ $dbh->selectall_arrayref("SELECT key FROM $KEYS WHERE http_status IS NOT NULL") };
	my %lapsed = map { $_->[0] => 1 } @{ $dbh->selectall_arrayref("SELECT key FROM $KEYS WHERE http_status IS NULL") };
	my @unfinished = sort grep { !$done{$_} } keys %walked;
	my %final_ctx = (id => 'final', dsn => $node->dsn(application_name => 'lease_final'), cut => 0);
	open $final_ctx{out}, '>', "$work/final" or die;
	$final_ctx{out}->autoflush(1);
	# No fault from here on: the counters of the final pass must be exact.
	$dbh->do('SELECT idem_stats_reset()');
	$final_ctx{deadline} = now_s() + 20;
	my $final_left = walk(\%final_ctx, @unfinished);
	close $final_ctx{out};
	$final_ctx{dbh}->disconnect if $final_ctx{dbh};
	my $final_stats = $dbh->selectrow_hashref('SELECT ' . join(', ', @COUNTERS) . ' FROM idem_stats');
	$stats_base{$_} += $stats_last{$_} // 0 for @COUNTERS;
	%stats_last = %$final_stats;
	my $stats = stats_total();

	# ---- what everyone saw ----
	my (%calls, %charges, %claims, %first_ckpt, %first_ack, %acks, %replays, %cut, %count, %grants);
	for my $file ((map { "client$_" } 0 .. 2 * $PAIRS - 1), 'rival', 'final', map { "waiter$_" } 1 .. $WAITERS)
	{
		open my $in, '<', "$work/$file" or next;
		while (<$in>)
		{
			my ($what, @f) = split;
			next unless defined $what;
			$count{$what}++;
			$count{"final_$what"}++ if $file eq 'final';
			if ($what eq 'claim') { push @{ $claims{ $f[0] } }, [ @f[1 .. 4] ]; }
			elsif ($what eq 'ckpt') { $first_ckpt{ $f[0] } = min($first_ckpt{ $f[0] } // $f[3], $f[3]); }
			elsif ($what eq 'ack') { push @{ $acks{ $f[0] } }, [ $f[1], $f[2] ]; $first_ack{ $f[0] } = min($first_ack{ $f[0] } // $f[3], $f[3]); }
			elsif ($what eq 'replay') { push @{ $replays{ $f[0] } }, [ @f[0 .. 3] ]; }
			elsif ($what eq 'cut') { $cut{ $f[0] }++; }
			elsif ($what eq 'suicide') { $count{"suicide_$f[1]"}++; }
			elsif ($what eq 'stale') { $count{"stale_$f[1]"}++; }
			elsif ($what =~ /^w(?:replay|late|complete|out)$/) { $count{"${what}_$f[1]"}++; }
			elsif ($what eq 'grant')
			{
				my %g;
				@g{qw(token fencing lease wait called returned returned_wall lease_until expires)} = @f[1 .. 9];
				# The moment of the grant, by the server's clock: the lease runs from it.
				$g{granted} = $g{lease_until} - $g{lease};
				push @{ $grants{ $f[0] } }, \%g;
			}
		}
	}
	my $provider_calls = 0;
	for my $call ($provider->calls)
	{
		my ($key, $charge) = @$call{qw(key charge)};
		next unless index($key, "$mode/") == 0;
		$provider_calls++;
		$calls{$key}++;
		$charges{$key}{$charge} = 1;
	}
	my $keys_charged = keys %calls;
	# In the final pass every lease has run out: any in_progress answer there is a stuck key.
	my $final_stuck = $count{final_wait} // 0;
	my $repeated_calls = $provider_calls - $keys_charged;
	my $double_charged = grep { keys %{ $charges{$_} } > 1 } keys %charges;
	my $charge_of = sub { my ($key) = @_; my ($c) = keys %{ $charges{$key} // {} }; return $c // '-'; };

	# A claim that began after the key's checkpoint (or completion) was acknowledged must
	# resume there (or not happen at all): the clock is CLOCK_MONOTONIC, shared by all processes.
	my ($lost_recovery, $claimed_after_ack, $resumed, $wrong_resume) = (0, 0, 0, 0);
	my @lost_examples;
	for my $key (keys %claims)
	{
		for my $c (@{ $claims{$key} })
		{
			my ($token, $rp, $rs_charge, $t0) = @$c;
			if ($rp eq 'charge_created')
			{
				$resumed++;
				$wrong_resume++ if $rs_charge ne $charge_of->($key);
			}
			elsif ($walked{$key} && defined $first_ckpt{$key} && $t0 > $first_ckpt{$key})
			{
				$lost_recovery++;
				push @lost_examples, $key;
			}
			# A short key's completion expires: a claim after it starts the key anew.
			$claimed_after_ack++ if $walked{$key} && defined $first_ack{$key} && $t0 > $first_ack{$key};
		}
	}

	# What the database kept.
	$dbh = mon();
	my %ledger;
	push @{ $ledger{ $_->[0] } }, [ $_->[1], $_->[2] ]
	  for @{ $dbh->selectall_arrayref('SELECT key, charge_id, token FROM ledger') };
	my $ledger_not_one = grep { @{ $ledger{$_} // [] } != 1 } keys %walked;
	my $ledger_foreign = grep { !$walked{$_} && !$short{$_} } keys %ledger;
	my $ledger_wrong_charge = grep { @{ $ledger{$_} // [] } && $ledger{$_}[0][0] ne $charge_of->($_) } keys %walked;

	# Every key replays, through idem_lease and through idem_claim (rolled back), with its charge.
	my (%lease_replay, %claim_replay);
	my @keys = sort keys %walked;
	while (my @chunk = splice(@keys, 0, 1000))
	{
		for my $r (@{ $dbh->selectall_arrayref(q{
			SELECT k, l.outcome, l.http_status, l.response_body->>'charge_id', l.response_body->>'token'
			FROM unnest($1::text[]) k, idem_lease(k, encode(sha256(convert_to('ride:' || k, 'UTF8')), 'hex'), lease => '1 s') l},
			undef, \@chunk) })
		{
			$lease_replay{ $r->[0] } = [ @$r[1 .. 4] ];
		}
		$dbh->begin_work;
		for my $r (@{ $dbh->selectall_arrayref(q{
			SELECT k, c.outcome, c.http_status, c.response_body->>'charge_id', c.response_body->>'token'
			FROM unnest($1::text[]) k, idem_claim(k, encode(sha256(convert_to('ride:' || k, 'UTF8')), 'hex')) c},
			undef, \@chunk) })
		{
			$claim_replay{ $r->[0] } = [ @$r[1 .. 4] ];
		}
		$dbh->rollback;
	}
	my %ledger_token = map { $_ => $ledger{$_}[0][1] } grep { @{ $ledger{$_} } } keys %ledger;
	my $not_replayed = grep {
		my $l = $lease_replay{$_} // [];
		my $c = $claim_replay{$_} // [];
		($l->[0] // '') ne 'replay' || ($c->[0] // '') ne 'replay'
		  || $l->[1] != 201 || $c->[1] != 201 || $l->[2] ne $charge_of->($_) || $c->[2] ne $charge_of->($_)
		  || ($l->[3] // '') ne ($ledger_token{$_} // '')
	} keys %walked;
	# Each acknowledged 201: the replay is its very body (charge and token), and so is each replay seen.
	my $acked_keys = keys %acks;
	my $ack_wrong = grep {
		my $k = $_;
		grep { $_->[0] ne ($lease_replay{$k}[3] // '') || $_->[1] ne ($lease_replay{$k}[2] // '') } @{ $acks{$k} }
	} grep { $walked{$_} } keys %acks;
	my $replay_seen_wrong = grep {
		my $k = $_;
		grep { $_->[1] ne '201' || $_->[2] ne ($lease_replay{$k}[2] // '') || $_->[3] ne ($lease_replay{$k}[3] // '') }
		  @{ $replays{$k} }
	} grep { $walked{$_} } keys %replays;
	# A short key may have been completed once per life: each replay seen is one of its completions.
	my $short_replay_wrong = grep {
		my $k = $_;
		grep {
			my $seen = $_;
			$seen->[1] ne '201' || !grep { $_->[0] eq $seen->[2] && $_->[1] eq $seen->[3] } @{ $ledger{$k} // [] }
		} @{ $replays{$k} }
	} grep { $short{$_} } keys %replays;
	my $short_ledger_wrong_charge = grep {
		my $k = $_;
		grep { $_->[0] ne $charge_of->($k) } @{ $ledger{$k} // [] }
	} keys %short;

	# ---- the recorded history: grants (client logs) and the writes that committed (table history) ----
	# Fencing numbers: for each key they strictly increase in the order of the grants, by the server's
	# moment of the grant, and by the clients' clock (a grant returned before another was asked for).
	my ($fence_disorder, $fence_disorder_client, $grant_count, $regranted, $reclaimed_after_expiry) = (0) x 5;
	for my $key (keys %grants)
	{
		my @g = sort { $a->{granted} <=> $b->{granted} } @{ $grants{$key} };
		$grant_count += @g;
		$regranted++ if @g > 1;
		for my $i (1 .. $#g)
		{
			$fence_disorder++ if $g[$i]{fencing} <= $g[ $i - 1 ]{fencing};
			$reclaimed_after_expiry++ if $g[$i]{granted} >= $g[ $i - 1 ]{expires};
		}
		for my $x (@g)
		{
			$fence_disorder_client += grep { $x->{returned} < $_->{called} && $x->{fencing} >= $_->{fencing} } @g;
		}
	}
	# The lease left when a grant returned, by the server's lease end and the client's clock read right
	# after the call returned (both the system clock): never nothing, and after a wait the full lease
	# but the margin. A wait counts when the call took longer than the margin.
	my ($lapsed_grants, $most_lost, @waited) = (0, 0);
	for my $g (map { @$_ } values %grants)
	{
		$g->{left} = $g->{lease_until} - $g->{returned_wall};
		$most_lost = max($most_lost, $g->{lease} - $g->{left});
		$lapsed_grants++ if $g->{left} <= 0;
		push @waited, $g if $g->{wait} > 0 && $g->{returned} - $g->{called} > $MARGIN_S;
	}
	my @waited_short = grep { $_->{left} < $_->{lease} - $MARGIN_S } @waited;
	my $most_lost_waited = max(0, map { $_->{lease} - $_->{left} } @waited);
	my $max_waited = max(0, map { $_->{returned} - $_->{called} } @waited);

	# A stale write: one that committed although, when its transaction began, the holder's key had
	# expired, or a holder with a larger fencing number had been granted the key (by the server's
	# clock: that grant's moment; by the clients' clock: that grant had returned before the write was sent).
	my $history = $dbh->selectall_arrayref(
		'SELECT key, token, fencing, step, client_start, tx_start, lease_until, expires, lease_s FROM history',
		{ Slice => {} });
	my ($stale_writes, %stale_write, @stale_examples, %completions) = (0);
	for my $w (@$history)
	{
		my @why;
		push @why, 'expired' if $w->{tx_start} >= $w->{expires};
		my @newer = grep { $_->{fencing} > $w->{fencing} } @{ $grants{ $w->{key} } // [] };
		push @why, 'superseded' if grep { $_->{granted} < $w->{tx_start} } @newer;
		push @why, 'superseded_client' if grep { $_->{returned} < $w->{client_start} } @newer;
		$stale_write{$_}++ for @why;
		$stale_writes++ if @why;
		push @stale_examples, "$w->{step} $w->{key} fencing $w->{fencing} (@why)" if @why;
		push @{ $completions{ $w->{key} } }, $w if $w->{step} eq 'complete';
	}
	# A double completion: a key completed again while an earlier completion was still live (the later
	# holder was granted the key before the earlier response expired).
	my $double_completions = 0;
	for my $key (keys %completions)
	{
		my @c = sort { $a->{fencing} <=> $b->{fencing} } @{ $completions{$key} };
		$double_completions += grep {
			$c[$_]{fencing} == $c[ $_ - 1 ]{fencing} || $c[$_]{lease_until} - $c[$_]{lease_s} < $c[ $_ - 1 ]{expires}
		} 1 .. $#c;
	}
	my %steps;
	$steps{ $_->{step} }++ for @$history;
	my $client_completions = grep { $_->{step} eq 'complete' && $_->{key} !~ m{^[^/]+/wait/} } @$history;
	my $beside = $dbh->selectrow_array(qq{
		SELECT count(*) FROM (SELECT key FROM $KEYS WHERE key LIKE \$1 GROUP BY key HAVING count(*) > 1) k},
		undef, "$mode/short/%");
	my $uncharged = grep { !$calls{$_} } keys %walked;
	my $wall = now_s() - $started_at;

	my %proxy_events;
	for (split /\n/, substr(slurp_file($proxy_log), $proxy_offset))
	{
		my (undef, @event) = split;
		$proxy_events{ $event[0] eq 'open' ? 'open' : "@event" }++;
	}
	my $walked = keys %walked;
	my $total_faults = sum0(values %faults) + ($cut{checkpoint} // 0) + ($cut{complete} // 0) + 1;
	diag("lease_faults ($mode): " . sprintf('%d keys (%d of them short) in %.0f s of client work (%.0f s of faults), '
		  . 'wall %.0f s; faults: %s; cut COMMITs: checkpoint %d, complete %d (proxy: %s); final kill of every client '
		  . 'between steps (suicides %s, hard-killed %d); client respawns %d',
		$walked + keys %short, scalar(keys %short), $run_secs, $fault_secs, $wall, join(', ', map { "$_=" . ($faults{$_} // 0) } sort keys %inject),
		$cut{checkpoint} // 0, $cut{complete} // 0, join(', ', map { "$_ x$proxy_events{$_}" } sort keys %proxy_events),
		join(', ', map { "$_=$count{$_}" } sort grep { /^suicide_/ } keys %count), $hard_killed, $respawns));
	diag("lease_faults ($mode): " . sprintf('provider: %d calls for %d keys, %d repeated calls, %d keys charged twice; '
		  . 'claims %d (%d resumed at charge_created), acks %d, replays seen %d, in_progress answers %d, '
		  . 'stale tokens %s (stalled holders fenced: %s), step errors %d',
		$provider_calls, $keys_charged, $repeated_calls, $double_charged, $count{claim} // 0, $resumed,
		$count{ack} // 0, $count{replay} // 0, $count{wait} // 0,
		join(', ', map { "$_=$count{$_}" } sort grep { /^stale_/ } keys %count) || 0,
		join(', ', map { "$_=$stale_seen{$_}" } sort keys %stale_seen) || 0, $count{error} // 0));
	diag("lease_faults ($mode): " . sprintf('final pass: %d leases left at the end, %d unfinished keys (%d of them lapsed '
		  . 'leases), %d not claimable at once; idem_stats summed over all restarts (approximate: '
		  . 'counts since the last poll before a crash are lost): %s; of the final pass alone: %s',
		$left_leases, scalar(@unfinished), scalar(grep { $lapsed{$_} } @unfinished), $final_stuck,
		join(', ', map { "$_=$stats->{$_}" } @COUNTERS), join(', ', map { "$_=$final_stats->{$_}" } @COUNTERS)));

	my $short_n = keys %short;
	my $ledger_rows = sum0(map { scalar @$_ } values %ledger);
	diag("lease_faults ($mode): " . sprintf('history: %d grants for %d keys (%d keys granted more than once, %d '
		  . 'times claimed anew after the key expired); fencing numbers out of grant order: %d by the server\'s '
		  . 'clock, %d by the clients\' clock; writes committed: %s; stale writes: %d (%s); double completions: %d; '
		  . '%d short keys: slow holders %d (fenced %d, wrote %d, other error %d), keys with an expired row beside a new one %d, '
		  . 'short key life left when the clients stopped %.2f s',
		$grant_count, scalar(keys %grants), $regranted, $reclaimed_after_expiry, $fence_disorder,
		$fence_disorder_client, join(', ', map { "$_=$steps{$_}" } sort keys %steps), $stale_writes,
		join(', ', map { "$_=$stale_write{$_}" } sort keys %stale_write) || '-', $double_completions, $short_n,
		$count{slow} // 0, $count{slow_fenced} // 0, $count{slow_wrote} // 0, $count{slow_error} // 0, $beside,
		$short_life_left));

	diag("lease_faults ($mode): " . sprintf('waits: %d grants after a wait longer than %.1f s (the longest %.2f s; %d of '
		  . 'them by the waiter processes); lease lost between the grant and its return (the lease less what was '
		  . 'left when the client read its clock): at most %.3f s after a wait, %.3f s of any of the %d grants; '
		  . 'grants already lapsed when returned: %d; waiter processes: '
		  . 'replays after a wait %d (of another holder\'s body %d), waits that ran out %d, abandoned holders fenced '
		  . 'after the takeover %d (wrote %d), holders completing during a wait %d (fenced %d), errors %d',
		scalar @waited, $MARGIN_S, $max_waited, scalar(grep { $_->{wait} == 3 } @waited), $most_lost_waited,
		$most_lost, $grant_count, $lapsed_grants, $count{wreplay_own} // 0, $count{wreplay_other} // 0,
		sum0(map { $count{$_} } grep { /^wout_/ } keys %count), $count{wlate_fenced} // 0, $count{wlate_wrote} // 0,
		$count{wcomplete_done} // 0, $count{wcomplete_fenced} // 0, $count{werror} // 0));

	subtest "$mode storage" => sub {
		cmp_ok($walked + $short_n, '>=', $MIN_KEYS, "at least $MIN_KEYS keys ($walked answered in full, $short_n short)");
		cmp_ok($faults{$_} // 0, '>=', $ROUNDS, "$ROUNDS faults of kind $_") for sort keys %inject;
		cmp_ok($total_faults, '>=', 9, 'at least 9 faults in all');
		cmp_ok(($cut{checkpoint} // 0) + ($cut{complete} // 0), '>', 0, 'some COMMITs were cut after the server answered');
		for my $where (qw(after_charge after_checkpoint))
		{
			is(($stale_seen{$where} // 0) + ($stall_cut{$where} // 0), $faults{"stale_holder_$where"} // 0,
				"every holder stalled $where past its lease got 55000 at its next step (or another fault cut its "
				  . "connection first: " . ($stall_cut{$where} // 0) . ')');
			cmp_ok($stale_seen{$where} // 0, '>=', 1, "a holder stalled $where reached the server and got 55000");
		}
		is($count{fatal} // 0, 0, 'no client died of an unexpected error');
		is($count{bad} // 0, 0, 'no mismatch or unknown outcome');
		is($double_charged, 0, 'keys with more than one distinct external charge: 0');
		is($lost_recovery, 0, 'provider calls by a claim that began after the charge_created checkpoint was acknowledged: 0')
		  or diag("lost recovery points: @lost_examples[0 .. min(9, $#lost_examples)]");
		is($wrong_resume, 0, 'every resume at charge_created carries the charge the provider made');
		is($claimed_after_ack, 0, 'claims after an acknowledged completion: 0');
		is($count{stuck} // 0, 0, "keys in_progress for more than $STUCK_S s during the run: 0");
		is($live_after, 0, 'no lease still live after the last one ran out');
		is($final_left, 0, 'the final pass finished every key');
		is($final_stuck, 0, 'keys stuck past their lease: 0 (every unfinished key claimable at once)');
		cmp_ok(scalar(grep { $lapsed{$_} } @unfinished), '>', 0, 'the final pass took over lapsed leases');
		is($ledger_not_one, 0, 'ledger: exactly one row for every key');
		is($ledger_foreign, 0, 'ledger: no row for a key nobody walked');
		is($ledger_wrong_charge, 0, 'ledger: each row has the key\'s one charge');
		is($uncharged, 0, 'every key was charged');
		is($not_replayed, 0, 'every key replays 201 with its charge via idem_lease and idem_claim');
		cmp_ok($acked_keys, '>', 0, 'some requests were acknowledged');
		is($ack_wrong, 0, 'every acknowledged 201 replays its very body');
		is($replay_seen_wrong, 0, 'every replay a client saw is the stored body');
		cmp_ok($stats->{lease_takeovers}, '>', 0, 'idem_stats: lease_takeovers > 0');
		cmp_ok($stats->{checkpoints}, '>', 0, 'idem_stats: checkpoints > 0');
		is($final_stats->{leases}, $count{final_claim} // 0, 'idem_stats of the final pass: leases = its claims');
		is($final_stats->{lease_takeovers}, scalar(grep { $lapsed{$_} } @unfinished),
			'idem_stats of the final pass: lease_takeovers = the lapsed leases it found');
		is($final_stats->{checkpoints}, $count{final_ckpt} // 0, 'idem_stats of the final pass: checkpoints = its checkpoints');
		cmp_ok($wall, '<', 150, 'wall time under 150 s');

		# The recorded history.
		is($client_completions, $ledger_rows, 'history: a completion row for each ledger row (same transaction)');
		cmp_ok($steps{checkpoint} // 0, '>', 0, 'history: checkpoints recorded');
		is($stale_writes, 0, 'history: stale writes (by a holder whose key had expired or had a newer holder): 0')
		  or diag('stale writes: ' . join('; ', @stale_examples[0 .. min(9, $#stale_examples)]));
		is($double_completions, 0, 'history: double completions (a key completed again while its response was live): 0');
		is($fence_disorder, 0, 'fencing numbers strictly increase per key in the order of the grants');
		is($fence_disorder_client, 0, 'a grant returned before another was asked for has the smaller fencing number');
		cmp_ok($regranted, '>', 0, 'some keys were granted more than once (takeovers, re-claims)');
		cmp_ok($reclaimed_after_expiry, '>', 0, 'some keys expired and were claimed anew');
		cmp_ok($count{slow} // 0, '>', 0, 'some short-key holders slept past their key\'s expiry');
		cmp_ok($count{slow_fenced} // 0, '>', 0, 'holders that slept past their key\'s expiry got 55000');
		is($count{slow_wrote} // 0, 0, 'no holder that slept past the expiry its grant returned wrote');
		cmp_ok($short_life_left, '<=', $SHORT_LEASE_S + $SHORT_TTL_S, 'no short key outlives a lease and a ttl');
		is($short_replay_wrong, 0, 'every replay a client saw of a short key is one of its completions');
		is($short_ledger_wrong_charge, 0, 'ledger: every row of a short key has the key\'s one charge');
		cmp_ok($beside, '>', 0, 'expired rows kept beside the new rows of keys claimed anew')
		  if $mode eq 'partitioned';

		# Waits.
		cmp_ok(scalar(grep { $_->{wait} == 3 } @waited), '>=', 20, 'at least 20 grants after a wait by the waiter processes');
		is(scalar @waited_short, 0, "every grant after a wait leaves the full lease but $MARGIN_S s at its return")
		  or diag('short grants after a wait: ' . join('; ', map {
			sprintf('fencing %d: %.3f s left of %.1f s after waiting %.3f s', $_->{fencing}, $_->{left}, $_->{lease},
				$_->{returned} - $_->{called}) } @waited_short[0 .. min(9, $#waited_short)]));
		is($lapsed_grants, 0, 'no grant returned already lapsed');
		cmp_ok($count{wreplay_own} // 0, '>', 0, 'waits that ended when the holder completed answer replay');
		is($count{wreplay_other} // 0, 0, 'every replay after a wait is the body of the holder that completed');
		is(sum0(map { $count{$_} } grep { /^wout_/ } keys %count), 0, 'no 3 s wait on a 1 s lease ran out');
		cmp_ok($count{wlate_fenced} // 0, '>', 0, 'abandoned holders came back after the takeover and got 55000');
		is($count{wlate_wrote} // 0, 0, 'no abandoned holder wrote after the takeover');
		done_testing();
	};
}

for my $pass (@MODES)
{
	$mode = $pass;
	# The keys of the table pass move too, completed and all.
	$node->safe_psql('postgres', "SELECT idem_set_storage('partitioned', interval '$PARTITION_SPAN')")
	  if $mode eq 'partitioned';
	is($node->safe_psql('postgres', 'SELECT idem_storage_mode()'), $mode, "storage mode $mode");
	run_pass();
}

kill 'TERM', $proxy;
waitpid($proxy, 0);
$provider->stop;
$mon->disconnect if $mon;
done_testing();
