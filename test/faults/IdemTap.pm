# Shared setup of the fault-injection TAP tests (test/tap/1*.pl): a throwaway
# node with the extension preloaded, DBI connections to it, small helpers.
package IdemTap;

use strict;
use warnings;

use Exporter 'import';
use DBI;
use File::Basename qw(dirname);
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils ();
use Time::HiRes ();

our @EXPORT = qw(idem_node idem_dsn idem_connect now_s start_proxy);

# Cluster::init runs pg_regress --config-auth; Debian keeps pg_regress under
# pgxs and scripts/test.sh does not export PG_REGRESS.
if (!$ENV{PG_REGRESS})
{
	my $pgxs = `pg_config --pgxs`;
	chomp $pgxs;
	$pgxs =~ s{/src/makefiles/pgxs\.mk$}{};
	$ENV{PG_REGRESS} = "$pgxs/src/test/regress/pg_regress";
}

sub now_s { return Time::HiRes::time(); }

# A started node with the extension created in database postgres.
# log_statement = none: Cluster's default (all) makes load tests log-bound.
sub idem_node
{
	my ($name, @conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf',
		join("\n", "shared_preload_libraries = 'idempotency'",
			'log_statement = none', @conf) . "\n");
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
	return $node;
}

# DSN over the node's unix socket unless host/port are given.
sub idem_dsn
{
	my ($node, %opt) = @_;
	my $host = delete $opt{host} // $node->host;
	my $port = delete $opt{port} // $node->port;
	my $dsn = "dbi:Pg:host=$host;port=$port;dbname=postgres;connect_timeout=5";
	$dsn .= ";$_=$opt{$_}" for sort keys %opt;
	return $dsn;
}

# undef instead of dying when the server is down; callers retry.
sub idem_connect
{
	my ($dsn, %attr) = @_;
	return eval {
		DBI->connect($dsn, undef, undef,
			{ AutoCommit => 1, RaiseError => 1, PrintError => 0, PrintWarn => 0, %attr });
	};
}

# Starts pg_fault_proxy.pl in front of the node's unix socket; returns (pid, port, log).
# The proxy exits by itself when this process does.
sub start_proxy
{
	my ($node, $dir) = @_;
	my $log = "$dir/proxy.log";
	my $pid = fork // die "fork: $!";
	if ($pid == 0)
	{
		{ exec($^X, dirname(__FILE__) . '/pg_fault_proxy.pl', "$dir/port",
			$node->host . '/.s.PGSQL.' . $node->port, $log); }
		POSIX::_exit(1);    # only if exec failed
	}
	my $until = now_s() + 10;
	Time::HiRes::sleep(0.05) until -e "$dir/port" || now_s() > $until;
	my $port = PostgreSQL::Test::Utils::slurp_file("$dir/port");
	chomp $port;
	return ($pid, $port, $log);
}

1;
