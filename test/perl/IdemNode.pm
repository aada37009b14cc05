# IdemNode: a PostgreSQL::Test::Cluster node for the TAP tests of the idempotency extension (test/tap/*.pl).
#
#   use FindBin;
#   use lib "$FindBin::RealBin/../perl";
#   use IdemNode;
#
#   my $node = IdemNode->create('worker', "idempotency.databases = 'postgres'");
#   my $dbh = idem_connect($node->dsn(application_name => 'client1'));
#   ok(defined $node->wait_until('postgres', 'SELECT true', 10), 'answers');
#
# A node is a PostgreSQL::Test::Cluster, so every method of that class works on it (safe_psql, restart, backup,
# init_from_backup, ...); this class adds what the extension's tests share: a node started with the library
# preloaded and the extension created, DBI data source names, the fault proxy (pg_fault_proxy.pl beside this
# file), waits, the expired rows the worker sweeps, and a Citus cluster of a coordinator and workers (citus_cluster,
# for test/citus/*.pl). It also exports two plain functions, idem_connect and now_s.
package IdemNode;

use strict;
use warnings;

use parent 'PostgreSQL::Test::Cluster';

use DBI;
use Test::More ();
use Exporter 'import';
use File::Basename qw(dirname);
use POSIX ();
use PostgreSQL::Test::Utils ();
use Time::HiRes ();

our @EXPORT = qw(idem_connect now_s fencing_not_above);

# Cluster::init runs pg_regress --config-auth; Debian keeps pg_regress under pgxs, and `make prove_installcheck`
# as scripts/test.sh runs it does not export PG_REGRESS.
if (!$ENV{PG_REGRESS})
{
	my $pgxs = `pg_config --pgxs`;
	chomp $pgxs;
	$pgxs =~ s{/src/makefiles/pgxs\.mk$}{};
	$ENV{PG_REGRESS} = "$pgxs/src/test/regress/pg_regress";
}

# IdemNode->create($name, [\%options], @conf): a started node with the extension created in database postgres.
# With IDEM_TAP_STORAGE=partitioned in the environment (scripts/test.sh's stage tap-p), that database's storage is
# then switched to partitioned (1-day partitions), so that a test written against the API runs again in partitioned
# storage; such a test reads stored rows from $node->key_table.
# @conf are more postgresql.conf lines. %options go to Cluster::init ({ allows_streaming => 1 }), except
# preload => 0, which leaves the library out of shared_preload_libraries (no worker, no shared memory).
# log_statement = none: Cluster's default (all) makes the load tests log-bound.
sub create
{
	my ($class, $name, @conf) = @_;
	my %init = ref $conf[0] eq 'HASH' ? %{ shift @conf } : ();
	my $preload = delete $init{preload} // 1;
	my $node = $class->new($name);
	$node->init(%init);
	unshift @conf, "shared_preload_libraries = 'idempotency'" if $preload;
	$node->append_conf('postgresql.conf', join("\n", 'log_statement = none', @conf) . "\n");
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
	if (($ENV{IDEM_TAP_STORAGE} // 'table') eq 'partitioned')
	{
		$node->safe_psql('postgres', "SELECT idem_set_storage('partitioned')");
		Test::More::note("$name: database postgres in partitioned storage (IDEM_TAP_STORAGE)");
	}
	return $node;
}

# The key table of $db's storage mode (default database postgres): idempotency_keys, or
# idempotency_keys_partitioned in partitioned storage. For tests that read the stored rows and run in both modes.
sub key_table
{
	my ($self, $db) = @_;
	return $self->safe_psql($db // 'postgres', 'SELECT idem_storage_mode()') eq 'partitioned'
	  ? 'idempotency_keys_partitioned' : 'idempotency_keys';
}

# IdemNode->citus_cluster($name, $workers, @conf): a Citus cluster on loopback, a coordinator and $workers
# workers (nodes "${name}_coordinator", "${name}_worker1", ...), each started with citus and idempotency preloaded,
# wal_level = logical (shard moves by logical replication), the sweeper on database app every second, and database
# app with the citus extension; the workers are added to the coordinator and the idempotency extension is created
# there (Citus propagates it to the workers). @conf are more postgresql.conf lines for every node. Needs a
# PostgreSQL with Citus built in (scripts/build-citus.sh). Returns the nodes, coordinator first; each knows its
# name in the cluster ($node->{citus_name}: coordinator, worker1, ...).
sub citus_cluster
{
	my ($class, $name, $workers, @conf) = @_;
	my @nodes;
	for my $i (0 .. $workers)
	{
		my $role = $i == 0 ? 'coordinator' : "worker$i";
		my $node = $class->new("${name}_$role");
		$node->init;
		$node->append_conf('postgresql.conf', join("\n",
			"shared_preload_libraries = 'citus,idempotency'", "listen_addresses = '127.0.0.1'",
			'log_statement = none', 'log_min_messages = warning', 'wal_level = logical', 'max_wal_senders = 10',
			'max_replication_slots = 10',
			'max_prepared_transactions = 100', 'max_connections = 200', 'citus.shard_replication_factor = 1',
			"idempotency.databases = 'app'", 'idempotency.cleanup_interval = 1', @conf) . "\n");
		$node->start;
		$node->safe_psql('postgres', 'CREATE DATABASE app');
		$node->safe_psql('app', 'CREATE EXTENSION citus');
		$node->{citus_name} = $role;
		push @nodes, $node;
	}
	my ($coordinator, @workers) = @nodes;
	$coordinator->safe_psql('app', join(';',
		"SELECT citus_set_coordinator_host('127.0.0.1', ${\ $coordinator->port})",
		map { "SELECT citus_add_node('127.0.0.1', ${\ $_->port})" } @workers));
	$coordinator->safe_psql('app', 'CREATE EXTENSION idempotency');
	return @nodes;
}

# On a Citus coordinator: the business side of the Citus tests (test/citus/schema.sql, distribute.sql) and
# idem_citus_distribute('accounts'), which co-locates the keys with the accounts. Returns its output.
sub citus_distribute
{
	my ($self) = @_;
	my $dir = dirname(__FILE__) . '/../citus';
	$self->safe_psql('app', PostgreSQL::Test::Utils::slurp_file("$dir/$_")) for qw(schema.sql distribute.sql);
	return scalar $self->safe_psql('app', "SELECT idem_citus_distribute('accounts')");
}

# On a Citus coordinator: the nodes' names in the cluster (coordinator, worker1, ...) by port, and the name of
# the node that holds the shard of $value in $table.
sub citus_node_of
{
	my ($self, $nodes, $table, $value) = @_;
	my $port = $self->safe_psql('app', qq{
		SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
		WHERE p.shardid = get_shard_id_for_distribution_column('$table', '$value')});
	my ($node) = grep { $_->port == $port } @$nodes;
	return $node;
}

# test/citus/load.pl on a Citus cluster (the nodes, coordinator first) with more of its options; returns its
# checks, each [name, expected, actual], after printing its output as notes.
sub citus_load
{
	my ($nodes, @options) = @_;
	my $script = dirname(__FILE__) . '/../citus/load.pl';
	my $ports = join(',', map { $_->port } @$nodes);
	open my $run, '-|', $^X, $script, '--ports', $ports, @options or die "load.pl: $!";
	my @checks;
	while (my $line = <$run>)
	{
		chomp $line;
		Test::More::note($line);
		push @checks, [ split ' ', $1, 3 ] if $line =~ /^CHECK (.*)$/;
	}
	close $run;
	return @checks;
}

# One assertion: $sql fails in $db with a message matching $regexp (its lines joined by spaces).
sub fails_like
{
	my ($self, $db, $sql, $regexp, $name) = @_;
	my ($rc, $stdout, $stderr) = $self->psql($db, $sql);
	$stderr =~ s/\n/ /g;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return Test::More::ok($rc != 0 && $stderr =~ $regexp, $name)
	  || Test::More::diag($rc == 0 ? "succeeded: $stdout" : "failed otherwise: $stderr");
}

# DBI data source over the node's unix socket to database postgres, unless host, port or dbname say otherwise;
# other %opt become libpq options (application_name, user, sslmode, ...).
sub dsn
{
	my ($self, %opt) = @_;
	my $host = delete $opt{host} // $self->host;
	my $port = delete $opt{port} // $self->port;
	my $dbname = delete $opt{dbname} // 'postgres';
	my $dsn = "dbi:Pg:host=$host;port=$port;dbname=$dbname;connect_timeout=5";
	$dsn .= ";$_=$opt{$_}" for sort keys %opt;
	return $dsn;
}

# Data source through the fault proxy on 127.0.0.1:$proxy_port; the proxy's log names the connection by
# $application_name, which also picks the fault (see pg_fault_proxy.pl). No SSL or GSS negotiation for the
# proxy to pass.
sub proxy_dsn
{
	my ($self, $proxy_port, $application_name) = @_;
	return $self->dsn(host => '127.0.0.1', port => $proxy_port,
		application_name => $application_name, sslmode => 'disable', gssencmode => 'disable');
}

# Starts pg_fault_proxy.pl in front of the node's unix socket; returns (pid, port, log file in $dir).
# The proxy exits by itself when this process does.
sub start_proxy
{
	my ($self, $dir) = @_;
	my $log = "$dir/proxy.log";
	my $pid = fork // die "fork: $!";
	if ($pid == 0)
	{
		{ exec($^X, dirname(__FILE__) . '/pg_fault_proxy.pl', "$dir/port",
			$self->host . '/.s.PGSQL.' . $self->port, $log); }
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
	my ($self, $db, $sql, $limit) = @_;
	my $start = now_s();
	for (;;)
	{
		return now_s() - $start if $self->safe_psql($db, $sql) eq 't';
		return undef if now_s() - $start > $limit;
		Time::HiRes::sleep(0.1);
	}
}

# $n expired rows with keys $prefix1 .. $prefix$n in $db, written directly: only the worker or idem_cleanup()
# removes them.
sub insert_expired
{
	my ($self, $db, $prefix, $n, $expires_in_s) = @_;
	# $expires_in_s (optional): the keys expire that many seconds from now instead of an hour ago.
	my $expires = defined $expires_in_s ? "now() + interval '$expires_in_s s'" : "now() - interval '1 hour'";
	$self->safe_psql($db, qq{
		INSERT INTO idempotency_keys
		SELECT $expires, now() - interval '2 hours', 200, '', '$prefix' || i,
		       sha256(i::text::bytea), NULL, NULL
		FROM generate_series(1, $n) i});
}

# How many keys in $db start with $prefix.
sub count_keys
{
	my ($self, $db, $prefix) = @_;
	my $table = $self->key_table($db);
	return $self->safe_psql($db, "SELECT count(*) FROM $table WHERE key LIKE '$prefix%'");
}

# How many lines of the node's log after byte $offset match $regexp.
sub log_lines
{
	my ($self, $offset, $regexp) = @_;
	return scalar grep { /$regexp/ } split /\n/, PostgreSQL::Test::Utils::slurp_file($self->logfile, $offset);
}

# Fencing numbers (1.4): one lease grant per key of @$keys in $db, each in its own transaction, after the last
# round's 50 ms leases ran out (a sleep of 200 ms; a busier machine only makes it longer), so each is a grant (a new
# key or a takeover). Returns the numbers by key; dies on any other outcome.
sub lease_round
{
	my ($self, $db, $keys) = @_;
	Time::HiRes::sleep(0.2);
	my $sql = join '', map { "SELECT '$_', outcome, fencing_number FROM idem_lease('$_', idem_hash('p'),"
		  . " interval '50 milliseconds');\n" } @$keys;
	my %got;
	for my $line (split /\n/, $self->safe_psql($db, $sql))
	{
		my ($key, $outcome, $number) = split /\|/, $line;
		die "$db: $key answered $outcome" unless $outcome eq 'claimed';
		$got{$key} = $number;
	}
	return \%got;
}

# The keys whose number in $got (a lease_round) is not above every number in $handed->{key} (lists of numbers
# handed before), as "key:number<=highest"; '' when every one is above.
sub fencing_not_above
{
	my ($handed, $got) = @_;
	my @bad;
	for my $key (sort keys %$got)
	{
		my ($highest) = sort { $b <=> $a } @{ $handed->{$key} // [] };
		push @bad, "$key:$got->{$key}<=$highest" if defined $highest && $got->{$key} <= $highest;
	}
	return join ' ', @bad;
}

# A DBI connection, or undef instead of dying when the server is down (callers retry).
sub idem_connect
{
	my ($dsn, %attr) = @_;
	return eval {
		DBI->connect($dsn, undef, undef,
			{ AutoCommit => 1, RaiseError => 1, PrintError => 0, PrintWarn => 0, %attr });
	};
}

sub now_s { return Time::HiRes::time(); }

1;
