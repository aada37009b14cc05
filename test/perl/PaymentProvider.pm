# PaymentProvider: a fake payment provider for the fault tests, a TCP stub on 127.0.0.1 that honours an
# idempotency key the way Stripe does (the same charge for the same key) and logs every call, so repeated calls
# are counted and a second charge for one key would show.
#
#   use PaymentProvider;
#   my $provider = PaymentProvider->start("$dir/provider.log");     # a process of its own
#   my $charge = $provider->charge(\$connection, $key, $token);    # 'ch_N'; dies "provider unreachable"
#   for my $call ($provider->calls) { ... }    # { key, token, charge, new (1 or 0), at (CLOCK_MONOTONIC) }
#   $provider->stop;
#
# The stub exits by itself when the process that started it does. Each call is logged before it is answered:
# a caller that dies before the answer arrives still made the call.
package PaymentProvider;

use strict;
use warnings;

use IO::Select;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(clock_gettime CLOCK_MONOTONIC);

sub start
{
	my ($class, $log_file) = @_;
	my $parent = $$;
	my $listener = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 64, ReuseAddr => 1)
	  or die "provider listen: $!";
	my $self = bless { port => $listener->sockport, log => $log_file }, $class;
	$self->{pid} = fork // die "fork: $!";
	if ($self->{pid} == 0)
	{
		serve($listener, $log_file, $parent);
		POSIX::_exit(0);
	}
	close $listener;
	return $self;
}

# The stub's loop: lines "CHARGE <key> <token>", each answered "OK <charge>".
sub serve
{
	my ($listener, $log_file, $parent) = @_;
	open my $log, '>>', $log_file or die "$log_file: $!";
	$log->autoflush(1);
	my (%charge, %buf, $n);
	my $sel = IO::Select->new($listener);
	while (getppid() == $parent)
	{
		for my $fh ($sel->can_read(0.5))
		{
			if ($fh == $listener)
			{
				my $c = $listener->accept or next;
				$sel->add($c);
				next;
			}
			my $got = sysread($fh, my $chunk, 4096);
			if (!$got)
			{
				$sel->remove($fh);
				delete $buf{ fileno($fh) };
				close $fh;
				next;
			}
			$buf{ fileno($fh) } .= $chunk;
			while ($buf{ fileno($fh) } =~ s/^([^\n]*)\n//)
			{
				my ($cmd, $key, $token) = split ' ', $1;
				next unless ($cmd // '') eq 'CHARGE' && defined $token;
				my $new = !exists $charge{$key};
				$charge{$key} = 'ch_' . ++$n if $new;
				# Recorded before the answer: a caller that dies now still made a call.
				print $log "call $key $token $charge{$key} ", ($new ? 'new' : 'repeat'), ' ',
				  clock_gettime(CLOCK_MONOTONIC), "\n";
				syswrite($fh, "OK $charge{$key}\n");
			}
		}
	}
}

sub port { return $_[0]->{port}; }

# Charges for $key on the caller's connection (a scalar it keeps between calls, opened or reopened here), three
# tries; returns the charge, or dies "provider unreachable".
sub charge
{
	my ($self, $connection, $key, $token) = @_;
	for my $try (1 .. 3)
	{
		$$connection //= IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $self->{port},
			Proto => 'tcp', Timeout => 5);
		my $s = $$connection or next;
		if (syswrite($s, "CHARGE $key $token\n"))
		{
			my $line = <$s>;
			return $1 if defined $line && $line =~ /^OK (\S+)/;
		}
		close $s;
		$$connection = undef;
	}
	die "provider unreachable\n";
}

# Every call so far, in the order made.
sub calls
{
	my ($self) = @_;
	open my $in, '<', $self->{log} or return ();
	my @calls;
	while (<$in>)
	{
		my (undef, $key, $token, $charge, $new, $at) = split;
		push @calls, { key => $key, token => $token, charge => $charge, new => $new eq 'new' ? 1 : 0, at => $at };
	}
	return @calls;
}

sub stop
{
	my ($self) = @_;
	kill 'TERM', $self->{pid};
	waitpid($self->{pid}, 0);
}

1;
