#!/usr/bin/perl
# A PostgreSQL wire-protocol proxy for fault tests, on loopback TCP in front of the
# server's unix socket. One forked child per connection. The connection's
# application_name picks what it does:
#   cut_await  forward a simple-query COMMIT, wait for the server's answer, drop it and
#              close both sides: the commit happened, the client never hears of it
#   cut_drop   forward the COMMIT and close both sides at once, without waiting
#   anything else: plain forwarding (SIGSTOP the child to make the network go silent)
# Usage: pg_fault_proxy.pl PORT_FILE SERVER_SOCKET LOG_FILE
# Writes the chosen port to PORT_FILE and one line per event to LOG_FILE.
use strict;
use warnings;

use IO::Select;
use IO::Socket::INET;
use IO::Socket::UNIX;
use POSIX ();

my ($port_file, $server_socket, $log_file) = @ARGV;
die "usage: $0 PORT_FILE SERVER_SOCKET LOG_FILE\n" unless defined $log_file;

my $listener = IO::Socket::INET->new(
	LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 64, ReuseAddr => 1) or die "listen: $!";
open my $log, '>>', $log_file or die "$log_file: $!";
$log->autoflush(1);
$SIG{CHLD} = 'IGNORE';
my $parent = getppid();

# Port file written last: its presence means the proxy is accepting.
open my $pf, '>', "$port_file.tmp" or die;
print $pf $listener->sockport, "\n";
close $pf;
rename "$port_file.tmp", $port_file or die;

my $accepting = IO::Select->new($listener);
while (getppid() == $parent)    # exits with the test that started it
{
	next unless $accepting->can_read(0.5);
	my $client = $listener->accept or next;
	my $pid = fork // die "fork: $!";
	if ($pid == 0)
	{
		$listener->close;
		serve($client);
		POSIX::_exit(0);
	}
	$client->close;
}

sub say_log { print $log "@_\n"; }

# Reads whole protocol messages from a buffer: [type] int32 length, payload.
sub take_message
{
	my ($buf, $typed) = @_;
	my $head = $typed ? 5 : 4;
	return undef if length($$buf) < $head;
	my $len = unpack('N', substr($$buf, $typed ? 1 : 0, 4));
	my $total = $len + ($typed ? 1 : 0);
	return undef if length($$buf) < $total;
	return substr($$buf, 0, $total, '');
}

sub serve
{
	my ($client) = @_;
	my $server = IO::Socket::UNIX->new(Peer => $server_socket, Type => SOCK_STREAM)
	  or do { say_log("$$ connect-failed $!"); return; };
	my $sel = IO::Select->new($client, $server);
	my ($from_client, $mode, $typed) = ('', 'pass', 0);

	while (1)
	{
		for my $fh ($sel->can_read)
		{
			my $n = sysread($fh, my $chunk, 65536);
			return unless $n;    # either side closed: close the other (on return)
			if ($fh == $server)
			{
				syswrite($client, $chunk) // return;
				next;
			}
			$from_client .= $chunk;
			while (defined(my $msg = take_message(\$from_client, $typed)))
			{
				if (!$typed)
				{
					my $code = unpack('N', substr($msg, 4, 4));
					# SSLRequest and GSSENCRequest come before the startup message.
					$typed = 1 unless $code == 80877103 || $code == 80877104;
					if ($code == 196608)
					{
						my %params = split /\0/, substr($msg, 8);
						$mode = $params{application_name} // 'pass';
						say_log("$$ open $mode");
					}
				}
				elsif (substr($msg, 0, 1) eq 'Q' && substr($msg, 5) =~ /^\s*commit\b/i
					&& $mode =~ /^cut_/)
				{
					syswrite($server, $msg) // return;
					cut($server, $mode);
					return;
				}
				syswrite($server, $msg) // return;
			}
		}
	}
}

# The COMMIT is on its way to the server; the client gets nothing more.
sub cut
{
	my ($server, $mode) = @_;
	if ($mode eq 'cut_drop')
	{
		say_log("$$ cut_drop");
		return;
	}
	my ($reply, $tag) = ('', '?');
	my $deadline = time + 10;
	my $sel = IO::Select->new($server);
	while (time < $deadline && $sel->can_read(1))
	{
		sysread($server, my $chunk, 65536) or last;
		$reply .= $chunk;
		while (defined(my $msg = take_message(\$reply, 1)))
		{
			$tag = unpack('Z*', substr($msg, 5)) if substr($msg, 0, 1) eq 'C';
			if (substr($msg, 0, 1) eq 'Z')
			{
				say_log("$$ cut_await $tag");
				return;
			}
		}
	}
	say_log("$$ cut_await no-reply");
}
