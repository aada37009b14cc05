# IdemFaults: the server-side faults of the fault tests, for an IdemNode (test/perl/IdemNode.pm) under load.
#
#   use IdemFaults;
#   IdemFaults::backend_kill9($node, $pid);          # kill -9 of one backend; returns after the crash restart
#   IdemFaults::postmaster_kill9($node);             # kill -9 of the postmaster, its orphans gone, restarted
#   IdemFaults::terminate_backend($dbh, $pid);       # pg_terminate_backend through a monitor connection
#   IdemFaults::cut_connection($proxy_log, qr/^app/);  # kill -9 of the fault proxy's child carrying one
#   IdemFaults::alive($pid); IdemFaults::proc_stat($pid);   # process state and parent, from /proc
#
# Each returns 1 when the fault was delivered and 0 when there was nothing to deliver it to. The client-side
# faults (a client killed, or dying or stalling at a step boundary) belong to each test's own client protocol.
package IdemFaults;

use strict;
use warnings;

use PostgreSQL::Test::Utils ();
use Test::More ();
use Time::HiRes qw(sleep);

use IdemNode;

# (state, parent pid) of a process, ('X', 0) when it is gone.
sub proc_stat
{
	open(my $stat, '<', "/proc/$_[0]/stat") or return ('X', 0);
	return (<$stat> // '') =~ /\)\s+(\S+)\s+(\d+)/ ? ($1, $2) : ('X', 0);
}

sub alive { return (proc_stat($_[0]))[0] !~ /^[XZ]$/; }

# kill -9 of one backend: the postmaster ends every session and reinitializes (restart_after_crash = on).
sub backend_kill9
{
	my ($node, $pid) = @_;
	my $offset = -s $node->logfile;
	kill 'KILL', $pid or return 0;
	$node->wait_for_log(qr/reinitializing.*ready to accept connections/s, $offset);
	return 1;
}

sub terminate_backend
{
	my ($dbh, $pid) = @_;
	return $dbh->selectrow_array('SELECT pg_terminate_backend($1)', undef, $pid) ? 1 : 0;
}

# kill -9 of the postmaster, then a restart once its orphaned backends are gone (a new postmaster refuses to
# start while they hold the old shared memory). BAIL_OUT when it does not come back.
sub postmaster_kill9
{
	my ($node) = @_;
	my $postmaster = $node->{_pid};
	my @children = grep { (proc_stat($_))[1] == $postmaster } map { m{(\d+)$} } glob('/proc/[0-9]*');
	$node->kill9;
	my $until = IdemNode::now_s() + 30;
	sleep 0.05 while (grep({ alive($_) } @children) || kill(0, $postmaster)) && IdemNode::now_s() < $until;
	unlink($node->data_dir . '/postmaster.pid', $node->host . '/.s.PGSQL.' . $node->port . '.lock')
	  unless alive($postmaster) || !kill(0, $postmaster);
	for my $try (1 .. 5)
	{
		return 1 if $node->start(fail_ok => 1);
		$node->{_pid} = undef;
		sleep 1;
	}
	Test::More::BAIL_OUT('postmaster does not restart');
}

# kill -9 of a live child of the fault proxy (test/perl/pg_fault_proxy.pl) carrying a connection whose
# application_name matches $application: one of the last two opened.
sub cut_connection
{
	my ($proxy_log, $application) = @_;
	my @open;
	for my $line (split /\n/, PostgreSQL::Test::Utils::slurp_file($proxy_log))
	{
		my ($pid, $name) = $line =~ /^(\d+) open (\S+)$/ or next;
		push @open, $pid if $name =~ $application;
	}
	my @live = grep { alive($_) } @open or return 0;
	my $last_two = @live < 2 ? scalar @live : 2;
	return kill('KILL', $live[ -1 - int rand($last_two) ]) ? 1 : 0;
}

1;
