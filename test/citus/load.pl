#!/usr/bin/env perl
# Load on a Citus cluster, for test/citus/040_load.pl and 050_move.pl: --clients processes pay --keys payments
# with post_payment (test/citus/schema.sql) through the coordinator and both workers in turn, each payment sent,
# then retried once after its answer. A call that fails is retried on the next node until it is answered, at
# most --deadline seconds. The fault, one of:
#   --kill-data DIR   a few seconds in, that worker is killed (-9, the postmaster and every child) and restarted
#                     (the clients keep paying until it is back);
#   --move ACCOUNTS   the payments go to these busy tenants only, whose shards (co-located: keys, accounts and
#                     ledger together) are moved between the two workers --move-rounds times each with
#                     citus_move_shard_placement, cycling through --move-modes, while the clients pay (they keep
#                     paying until the moves are done) and a lease client takes over a leased key of each tenant
#                     again and again, recording its fencing numbers; before each move the coordinator calls
#                     idem_citus_fencing_before_move(target) (--no-fencing-helper leaves that out).
# Afterwards it prints "CHECK <name> <expected> <actual>" lines:
#   debited twice 0, acknowledged lost 0 (an answered payment without its ledger row or its stored key),
#   stuck 0 (a payment still unanswered, or in progress once everything stopped), ledger and keys in step,
#   balances matching the ledger, and that the fault did hit the calls (else the run proved nothing); with
#   --move also the moves done, and fencing numbers that never went backwards.
use strict;
use warnings;
use DBI;
use Getopt::Long;
use POSIX qw(:sys_wait_h);
use File::Temp qw(tempdir);
use Time::HiRes qw(time sleep);

my ($ports, $keys, $clients, $kill_data, $pg_bin, $log, $deadline) = ('', 2000, 8, '', '', '', 120);
my ($move, $move_rounds, $move_modes, $fencing_helper, $prefix) = ('', 2, 'block_writes', 1, 'load');
GetOptions('ports=s' => \$ports, 'keys=i' => \$keys, 'clients=i' => \$clients, 'kill-data=s' => \$kill_data,
           'pg-bin=s' => \$pg_bin, 'log=s' => \$log, 'deadline=i' => \$deadline, 'move=s' => \$move,
           'move-rounds=i' => \$move_rounds, 'move-modes=s' => \$move_modes, 'fencing-helper!' => \$fencing_helper,
           'prefix=s' => \$prefix)
    or die "usage: load.pl --ports P,P,P --keys N --clients N (--kill-data DIR --pg-bin DIR --log FILE"
         . " | --move ACCOUNT,... [--move-rounds N] [--move-modes MODE,...] [--no-fencing-helper]) [--prefix P]\n";
my @ports = split /,/, $ports;
$| = 1;
my $results = tempdir(CLEANUP => 1);
my @accounts = $move ? split(/,/, $move) : map { "acct-$_" } 1 .. 40;
# While this file exists the fault is still under way (the moves, or the kill and the restart): the clients keep
# paying past --keys, so the fault always lands on calls in flight however fast the machine pays.
my $busy = "$results/busy";

sub connect_to {
    my ($port) = @_;
    # Arguments interpolated on the client: Citus delegates a call whose distribution argument is a constant.
    return DBI->connect("dbi:Pg:dbname=app;host=127.0.0.1;port=$port;connect_timeout=3;"
                        . "options='-c statement_timeout=30000'", 'postgres', '',
                        {AutoCommit => 1, RaiseError => 0, PrintError => 0, pg_server_prepare => 0});
}

sub payment {
    my ($i) = @_;
    return ($accounts[$i % @accounts], "$prefix-$i", 1 + $i % 7);
}

# One client: its share of the payments, each sent and retried once; every answer written to its file.
sub client {
    my ($c) = @_;
    my (%dbh, $errors);
    $errors = 0;
    open my $out, '>', "$results/client-$c" or die $!;
    my $turn = $c;
    for (my $i = $c; $i < $keys || -e $busy; $i += $clients) {
        my ($account, $key, $amount) = payment($i);
        for my $call (1, 2) {
            my $give_up = time + $deadline;
            my $answer;
            while (time < $give_up) {
                my $port = $ports[$turn++ % @ports];
                $dbh{$port} = connect_to($port) unless $dbh{$port} && $dbh{$port}->ping;
                my $result = $dbh{$port} ? $dbh{$port}->selectrow_array(
                    'SELECT post_payment(?, ?, ?::bigint)', undef, $account, $key, $amount) : undef;
                if (!defined $result) {
                    # The first failure of each client is shown, to tell a fault from a broken setup.
                    print STDERR "client $c, port $port: ", ($DBI::errstr // 'no connection'), "\n" if !$errors;
                    $errors++;
                    sleep 0.2;
                    next;
                }
                my ($outcome) = $result =~ /"outcome": "(\w+)"/;
                if ($outcome eq 'in_progress') {
                    sleep 0.05;
                    next;
                }
                $answer = $outcome;
                last;
            }
            print $out defined $answer ? "answer $call $key $answer\n" : "unanswered $call $key\n";
        }
    }
    print $out "errors $errors\n";
    close $out;
    exit 0;
}

# The lease client: one leased key per tenant, taken over each time its 1-second lease has run out, never
# completed; each fencing number granted is written down in order.
sub lease_client {
    my (%dbh, $turn);
    $turn = 0;
    open my $out, '>', "$results/fencing" or die $!;
    select((select($out), $| = 1)[0]);
    while (-e $busy) {
        for my $account (@accounts) {
            my $port = $ports[$turn++ % @ports];
            $dbh{$port} = connect_to($port) unless $dbh{$port} && $dbh{$port}->ping;
            my ($outcome, $number) = $dbh{$port} ? $dbh{$port}->selectrow_array(
                "SELECT outcome, fencing_number FROM idem_lease(?, idem_hash('x'::text), '1 second', NULL, ?)",
                undef, "$prefix-lease-$account", $account) : ();
            print $out "fencing $account $number\n" if defined $outcome && $outcome eq 'claimed';
        }
        sleep 0.3;
    }
    close $out;
    exit 0;
}

my (@pids, $lease_pid);
open my $flag, '>', $busy or die $!;
for my $c (0 .. $clients - 1) {
    my $pid = fork // die "fork: $!";
    client($c) if $pid == 0;
    push @pids, $pid;
}
if ($move) {
    $lease_pid = fork // die "fork: $!";
    lease_client() if $lease_pid == 0;
}

my ($moves_done, $moves_failed, $clients_running_at_end) = (0, 0, 0);
if ($move) {
    # The shards of the busy tenants, each moved to the other worker and back, the modes taken in turn.
    my $dbh = connect_to($ports[0]) or die "no coordinator: $DBI::errstr";
    my %shards = map { $dbh->selectrow_array("SELECT get_shard_id_for_distribution_column('idempotency_keys', ?)",
                                             undef, $_) => 1 } @accounts;
    my @modes = split /,/, $move_modes;
    sleep 2;
    for my $round (1 .. $move_rounds) {
        for my $shard (sort keys %shards) {
            my ($source) = $dbh->selectrow_array(
                'SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) WHERE p.shardid = ?',
                undef, $shard);
            my ($target) = grep { $_ != $source } @ports[1, 2];
            my $mode = $modes[($moves_done + $moves_failed) % @modes];
            # A shard moved away earlier leaves its old copy until Citus's cleanup: clear it before moving back.
            $dbh->do('CALL citus_cleanup_orphaned_resources()');
            my $ok = (!$fencing_helper
                      || $dbh->do("SELECT idem_citus_fencing_before_move('127.0.0.1', ?)", undef, $target))
                && $dbh->do("SELECT citus_move_shard_placement(?, '127.0.0.1', ?, '127.0.0.1', ?, ?)",
                            undef, $shard, $source, $target, $mode);
            if ($ok) {
                $moves_done++;
                print "moved shard $shard from port $source to $target ($mode)\n";
            } else {
                $moves_failed++;
                print "moving shard $shard from port $source to $target ($mode) failed: $DBI::errstr\n";
            }
            sleep 1;
        }
    }
    # Payments still running when the last move finished: the moves happened under load.
    $clients_running_at_end = grep { waitpid($_, WNOHANG) == 0 } @pids;
    unlink $busy;
} else {
    # The crash: the worker's postmaster and its children, by pid, then a restart with crash recovery.
    sleep 4;
    my ($postmaster) = do { open my $f, '<', "$kill_data/postmaster.pid" or die $!; <$f> };
    chomp $postmaster;
    my @children = split ' ', `ps -o pid= --ppid $postmaster`;
    kill 'KILL', $postmaster, @children;
    print "killed worker postmaster $postmaster and ", scalar @children, " children\n";
    sleep 3;
    for (1 .. 50) {
        last unless kill 0, $postmaster, @children;
        sleep 0.2;
    }
    # As the data directory's owner: postgres, whom root becomes for it.
    my $start = "$pg_bin/pg_ctl -D $kill_data -l $log -w start";
    system($> == 0 ? "su postgres -c '$start' >/dev/null" : "$start >/dev/null") == 0
        or print "restarting the worker failed\n";
    print "worker restarted\n";
    sleep 1;    # payments on the restarted worker too
    unlink $busy;
}

waitpid($_, 0) for @pids;
waitpid($lease_pid, 0) if $lease_pid;

my (%first, %answers, %paid, $errors, $unanswered, $retry_claimed);
$errors = $unanswered = $retry_claimed = 0;
for my $file (glob "$results/client-*") {
    open my $f, '<', $file or die $!;
    while (<$f>) {
        my @w = split;
        $paid{$w[2]} = 1 if $w[0] eq 'answer' || $w[0] eq 'unanswered';
        if ($w[0] eq 'answer') {
            $first{$w[2]} = $w[3] if $w[1] == 1;
            $answers{$w[2]}++;
            $retry_claimed++ if $w[1] == 2 && $w[3] eq 'claimed' && ($first{$w[2]} // '') ne '';
        } elsif ($w[0] eq 'unanswered') {
            $unanswered++;
        } elsif ($w[0] eq 'errors') {
            $errors += $w[1];
        }
    }
}

my $dbh = connect_to($ports[0]) or die "no coordinator: $DBI::errstr";
$dbh->{RaiseError} = 1;
my $ours = "'^$prefix-[0-9]+\$'";
my %ledger = map { $_->[0] => $_->[1] }
    @{$dbh->selectall_arrayref("SELECT payment_key, count(*) FROM ledger WHERE payment_key ~ $ours GROUP BY 1")};
my %stored = map { $_->[0] => 1 }
    @{$dbh->selectall_arrayref("SELECT key FROM idempotency_keys WHERE key ~ $ours AND http_status = 201")};
my $twice = grep { $_ > 1 } values %ledger;
my $lost = grep { !$ledger{$_} || !$stored{$_} } keys %answers;
my $ledger_without_key = grep { !$stored{$_} } keys %ledger;
my $key_without_ledger = grep { !$ledger{$_} } keys %stored;

# Stuck: once everything stopped, every payment answers at once (replay, or claimed if it never took effect).
my $stuck = 0;
for my $i (map { /(\d+)$/ } keys %paid) {
    my ($account, $key, $amount) = payment($i);
    my ($result) = $dbh->selectrow_array('SELECT post_payment(?, ?, ?::bigint)', undef, $account, $key, $amount);
    $stuck++ unless $result =~ /"outcome": "(replay|claimed)"/;
}
my ($in_flight) = $dbh->selectrow_array("SELECT count(*) FROM idem_keys_in_flight() WHERE key ~ $ours");
my ($unbalanced) = $dbh->selectrow_array(
    'SELECT count(*) FROM accounts a WHERE a.balance <> 1000000 - coalesce((SELECT sum(amount) FROM ledger l'
    . ' WHERE l.account = a.account), 0)');

printf "payments %d, answered first calls %d, calls that failed and were retried %d\n",
    scalar keys %paid, scalar keys %first, $errors;
print "CHECK payments-answered ", scalar(keys %paid), " ", scalar(keys %answers), "\n";
print "CHECK at-least-the-payments-asked-for yes ", (keys %paid >= $keys ? 'yes' : 'no'), "\n";
print "CHECK debited-twice 0 $twice\n";
print "CHECK acknowledged-lost 0 $lost\n";
print "CHECK retry-answered-claimed-after-an-answer 0 $retry_claimed\n";
print "CHECK unanswered-within-deadline 0 $unanswered\n";
print "CHECK stuck-after-load 0 $stuck\n";
print "CHECK in-flight-after-load 0 $in_flight\n";
print "CHECK ledger-rows-without-stored-key 0 $ledger_without_key\n";
print "CHECK stored-keys-without-ledger-row 0 $key_without_ledger\n";
print "CHECK balances-off-the-ledger 0 $unbalanced\n";
if (!$move) {
    print "CHECK the-kill-interrupted-calls yes ", ($errors > 0 ? 'yes' : 'no'), "\n";
    exit 0;
}
my $expected_moves = $move_rounds * keys %{{ map { $dbh->selectrow_array(
    "SELECT get_shard_id_for_distribution_column('idempotency_keys', ?)", undef, $_) => 1 } @accounts }};
print "CHECK shard-moves-done $expected_moves $moves_done\n";
print "CHECK payments-still-running-after-the-last-move yes ", ($clients_running_at_end > 0 ? 'yes' : 'no'), "\n";
# Each tenant's leased key: its fencing numbers, in the order granted, only ever increase.
my (%numbers, $backwards, $takes);
$backwards = $takes = 0;
open my $f, '<', "$results/fencing" or die $!;
while (<$f>) {
    my (undef, $account, $number) = split;
    $takes++;
    if (defined $numbers{$account} && $number <= $numbers{$account}) {
        $backwards++;
        print "fencing number of $account went from $numbers{$account} to $number\n";
    }
    $numbers{$account} = $number;
}
printf "leases granted %d, last fencing numbers %s\n", $takes,
    join(', ', map { "$_ $numbers{$_}" } sort keys %numbers);
print "CHECK fencing-numbers-backwards 0 $backwards\n";
# A lease taken over about once a second per tenant: more takes than moves, on both sides of them.
print "CHECK leases-taken-over-across-the-moves yes ", ($takes > 2 * $expected_moves ? 'yes' : 'no'), "\n";
