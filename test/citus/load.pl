#!/usr/bin/env perl
# Load on a Citus cluster (scripts/test-citus.sh): --clients processes pay --keys payments with post_payment
# (test/citus/schema.sql) through the coordinator and both workers in turn, each payment sent, then retried
# once after its answer. A few seconds in, one worker is killed (-9, the postmaster and every child) and
# restarted. A call that fails is retried on the next node until it is answered, at most --deadline seconds.
# Afterwards it prints "CHECK <name> <expected> <actual>" lines:
#   debited twice 0, acknowledged lost 0 (an answered payment without its ledger row or its stored key),
#   stuck 0 (a payment still unanswered, or in progress once everything stopped), ledger and keys in step,
#   balances matching the ledger, and that the kill did interrupt calls (else the run proved nothing).
use strict;
use warnings;
use DBI;
use Getopt::Long;
use File::Temp qw(tempdir);
use Time::HiRes qw(time sleep);

my ($ports, $keys, $clients, $kill_data, $pg_bin, $log, $deadline) = ('', 2000, 8, '', '', '', 120);
GetOptions('ports=s' => \$ports, 'keys=i' => \$keys, 'clients=i' => \$clients, 'kill-data=s' => \$kill_data,
           'pg-bin=s' => \$pg_bin, 'log=s' => \$log, 'deadline=i' => \$deadline)
    or die "usage: load.pl --ports P,P,P --keys N --clients N --kill-data DIR --pg-bin DIR --log FILE\n";
my @ports = split /,/, $ports;
$| = 1;
my $results = tempdir(CLEANUP => 1);
my $accounts = 40;

sub connect_to {
    my ($port) = @_;
    # Arguments interpolated on the client: Citus delegates a call whose distribution argument is a constant.
    return DBI->connect("dbi:Pg:dbname=app;host=127.0.0.1;port=$port;connect_timeout=3;"
                        . "options='-c statement_timeout=30000'", 'postgres', '',
                        {AutoCommit => 1, RaiseError => 0, PrintError => 0, pg_server_prepare => 0});
}

sub payment {
    my ($i) = @_;
    return ('acct-' . (1 + $i % $accounts), "load-$i", 1 + $i % 7);
}

# One client: its share of the payments, each sent and retried once; every answer written to its file.
sub client {
    my ($c) = @_;
    my (%dbh, $errors);
    $errors = 0;
    open my $out, '>', "$results/client-$c" or die $!;
    my $turn = $c;
    for (my $i = $c; $i < $keys; $i += $clients) {
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

my @pids;
for my $c (0 .. $clients - 1) {
    my $pid = fork // die "fork: $!";
    client($c) if $pid == 0;
    push @pids, $pid;
}

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
system("su postgres -c '$pg_bin/pg_ctl -D $kill_data -l $log -w start' >/dev/null") == 0
    or print "restarting the worker failed\n";
print "worker restarted\n";

waitpid($_, 0) for @pids;

my (%first, %answers, $errors, $unanswered, $retry_claimed);
$errors = $unanswered = $retry_claimed = 0;
for my $file (glob "$results/client-*") {
    open my $f, '<', $file or die $!;
    while (<$f>) {
        my @w = split;
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
my %ledger = map { $_->[0] => $_->[1] }
    @{$dbh->selectall_arrayref("SELECT payment_key, count(*) FROM ledger WHERE payment_key LIKE 'load-%' GROUP BY 1")};
my %stored = map { $_->[0] => 1 }
    @{$dbh->selectall_arrayref("SELECT key FROM idempotency_keys WHERE key LIKE 'load-%' AND http_status = 201")};
my $twice = grep { $_ > 1 } values %ledger;
my $lost = grep { !$ledger{$_} || !$stored{$_} } keys %answers;
my $ledger_without_key = grep { !$stored{$_} } keys %ledger;
my $key_without_ledger = grep { !$ledger{$_} } keys %stored;

# Stuck: once everything stopped, every payment answers at once (replay, or claimed if it never took effect).
my $stuck = 0;
for my $i (0 .. $keys - 1) {
    my ($account, $key, $amount) = payment($i);
    my ($result) = $dbh->selectrow_array('SELECT post_payment(?, ?, ?::bigint)', undef, $account, $key, $amount);
    $stuck++ unless $result =~ /"outcome": "(replay|claimed)"/;
}
my ($in_flight) = $dbh->selectrow_array("SELECT count(*) FROM idem_keys_in_flight() WHERE key LIKE 'load-%'");
my ($unbalanced) = $dbh->selectrow_array(
    'SELECT count(*) FROM accounts a WHERE a.balance <> 1000000 - coalesce((SELECT sum(amount) FROM ledger l'
    . ' WHERE l.account = a.account), 0)');

printf "payments %d, answered first calls %d, calls that failed and were retried %d\n",
    $keys, scalar keys %first, $errors;
print "CHECK payments-answered $keys ", scalar(keys %answers), "\n";
print "CHECK debited-twice 0 $twice\n";
print "CHECK acknowledged-lost 0 $lost\n";
print "CHECK retry-answered-claimed-after-an-answer 0 $retry_claimed\n";
print "CHECK unanswered-within-deadline 0 $unanswered\n";
print "CHECK stuck-after-load 0 $stuck\n";
print "CHECK in-flight-after-load 0 $in_flight\n";
print "CHECK ledger-rows-without-stored-key 0 $ledger_without_key\n";
print "CHECK stored-keys-without-ledger-row 0 $key_without_ledger\n";
print "CHECK balances-off-the-ledger 0 $unbalanced\n";
print "CHECK the-kill-interrupted-calls yes ", ($errors > 0 ? 'yes' : 'no'), "\n";
