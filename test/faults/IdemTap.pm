# Shared setup of the TAP tests (test/tap/*.pl): a throwaway node with the
# extension preloaded, DBI connections to it, the fault proxy, small helpers.
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

our @EXPORT = qw(idem_node idem_dsn proxy_dsn idem_connect now_s start_proxy
  wait_until insert_expired count_keys log_lines);

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

# A started node with the extension created in database postgres; @conf are more
# postgresql.conf lines, after an optional hash of Cluster::init options
# ({ allows_streaming => 1 }).
# log_statement = none: Cluster's default (all) makes load tests log-bound.
sub idem_node
{
	my ($name, @conf) = @_;
	my %init = ref $conf[0] eq 'HASH' ? %{ shift @conf } : ();
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%init);
	$node->append_conf('postgresql.conf',
		join("\n", "shared_preload_libraries = 'idempotency'",
			'log_statement = none', @conf) . "\n");
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
	return $node;
}

# DSN over the node's unix socket to database postgres unless host/port/dbname are given.
sub idem_dsn
{
	my ($node, %opt) = @_;
	my $host = delete $opt{host} // $node->host;
	my $port = delete $opt{port} // $node->port;
	my $dbname = delete $opt{dbname} // 'postgres';
	my $dsn = "dbi:Pg:host=$host;port=$port;dbname=$dbname;connect_timeout=5";
	$dsn .= ";$_=$opt{$_}" for sort keys %opt;
	return $dsn;
}

# DSN through the fault proxy on 127.0.0.1:$proxy_port; the proxy's log names the
# connection by $application_name. No SSL or GSS negotiation for the proxy to pass.
sub proxy_dsn
{
	my ($node, $proxy_port, $application_name) = @_;
	return idem_dsn($node, host => '127.0.0.1', port => $proxy_port,
		application_name => $application_name, sslmode => 'disable', gssencmode => 'disable');
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

# Seconds until $sql returns true in $db, or undef after $limit seconds.
sub wait_until
{
	my ($node, $db, $sql, $limit) = @_;
	my $start = now_s();
	for (;;)
	{
		return now_s() - $start if $node->safe_psql($db, $sql) eq 't';
		return undef if now_s() - $start > $limit;
		Time::HiRes::sleep(0.1);
	}
}

# $n expired rows with keys $prefix1 .. $prefix$n, written directly: only the worker
# or idem_cleanup() removes them.
sub insert_expired
{
	my ($node, $db, $prefix, $n) = @_;
	$node->safe_psql($db, qq{
		INSERT INTO idempotency_keys
		SELECT now() - interval '1 hour', now() - interval '2 hours', 200, '', '$prefix' || i,
		       sha256(i::text::bytea), NULL, NULL
		FROM generate_series(1, $n) i});
}

# How many keys in $db start with $prefix.
sub count_keys
{
	my ($node, $db, $prefix) = @_;
	return $node->safe_psql($db, "SELECT count(*) FROM idempotency_keys WHERE key LIKE '$prefix%'");
}

# How many lines of the node's log after byte $offset match $regexp.
sub log_lines
{
	my ($node, $offset, $regexp) = @_;
	return scalar grep { /$regexp/ } split /\n/, PostgreSQL::Test::Utils::slurp_file($node->logfile, $offset);
}

1;
