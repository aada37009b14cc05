# Maintenance runs as the key table's owner, restricted: a trigger planted on the key table
# must not turn the expiry sweep into a way to superuser.
#
# Two attackers, each in table and in partitioned storage, each swept once by the worker and
# once by a superuser calling idem_cleanup() (eight databases):
# - grantee: a role `mallory_*` with GRANT ALL on idempotency_keys and idempotency_keys_partitioned;
# - owner: a non-superuser `tableowner_*` that owns both tables and every partition, and may
#   therefore also ENABLE ALWAYS its trigger (session_replication_role does not stop it).
# Each plants a BEFORE DELETE ... FOR EACH ROW trigger whose SECURITY INVOKER function records
# current_user (and whether it was a superuser) into a table the attacker owns, then tries
# ALTER ROLE <itself> SUPERUSER inside an exception block (a failure is logged, the delete goes
# on), and inserts an expired key. Partitioned storage also has an expired range partition
# (removed by DROP TABLE, no row trigger) and, on the worker's side, a larger idempotency.ttl
# so that the sweep makes new partitions; an event trigger of the test's own records who runs
# the sweep's DDL.
#
# Fails on: an attacker that is superuser afterwards; a planted trigger that ran as a
# superuser (or, for the owner, as anyone but the owner); an expired key, row or partition the
# sweep left behind; partitions made or dropped by anyone but the table's owner, or owned by
# another role. Accepted: the trigger does not fire at all, or fires as a non-superuser.
# On 1.1 the worker runs as the bootstrap superuser and idem_cleanup() as its caller, so every
# attacker becomes superuser and the partitions are made and dropped by the superuser.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $HASH = 'e' x 64;

# The worker's databases are listed only once every trap is in place (below), so that no
# sweep runs half way through the setup.
my $node = IdemNode->create('maintenance_owner', "idempotency.databases = ''", 'idempotency.cleanup_interval = 1s',
	"idempotency.ttl = '1h'");

my @scenarios;
for my $attacker (qw(grantee owner))
{
	for my $mode (qw(table partitioned))
	{
		for my $path (qw(worker cleanup))
		{
			my $db = "${attacker}_${mode}_$path";
			push @scenarios, {
				db => $db, attacker => $attacker, mode => $mode, path => $path,
				role => ($attacker eq 'grantee' ? 'mallory' : 'tableowner') . "_${mode}_$path",
			};
		}
	}
}

# The key table of a mode.
sub key_table { return $_[0] eq 'partitioned' ? 'public.idempotency_keys_partitioned' : 'public.idempotency_keys'; }

sub set_up
{
	my ($s) = @_;
	my ($db, $role, $mode) = @$s{qw(db role mode)};
	my $table = key_table($mode);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	$node->safe_psql('postgres', "CREATE ROLE $role LOGIN");

	if ($mode eq 'partitioned')
	{
		$node->safe_psql($db, q{SELECT idem_set_storage('partitioned', interval '1 hour')});
		# One range partition wholly in the past (upper bound one hour before the current
		# partition's lower bound), holding one expired key: the sweep drops it.
		$s->{past} = $node->safe_psql($db, q{
			SELECT idem_create_partition(min(lower_bound) - interval '2 hours', min(lower_bound) - interval '1 hour')
			FROM idem_partitions()});
		$node->safe_psql($db, qq{
			INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash)
			SELECT lower_bound + interval '30 minutes', lower_bound, 200, '', 'past', decode('$HASH', 'hex')
			FROM idem_partitions() WHERE partition_name = '$s->{past}'});
		$s->{max_upper} = $node->safe_psql($db, 'SELECT max(upper_bound) FROM idem_partitions()');
	}

	if ($s->{attacker} eq 'grantee')
	{
		# Every partition too: a trigger on a partitioned table is made on each partition,
		# which needs the TRIGGER privilege there.
		$node->safe_psql($db, "GRANT ALL ON ALL TABLES IN SCHEMA public TO $role");
	}
	else
	{
		# The owner owns every table of the extension, partitions included. It makes the
		# partitions in the extension's schema with idem_create_partition, so it may create
		# objects there and run that function (README: a non-superuser owner's partition rights).
		$node->safe_psql($db, qq{
			DO \$\$
			DECLARE t regclass;
			BEGIN
				FOR t IN SELECT 'public.idempotency_keys'::regclass
				         UNION ALL SELECT 'public.idempotency_keys_partitioned'::regclass
				         UNION ALL SELECT inhrelid::regclass FROM pg_inherits
				                   WHERE inhparent = 'public.idempotency_keys_partitioned'::regclass LOOP
					EXECUTE format('ALTER TABLE %s OWNER TO $role', t);
				END LOOP;
			END \$\$;
			GRANT CREATE ON SCHEMA public TO $role;
			GRANT EXECUTE ON FUNCTION public.idem_create_partition(timestamptz, timestamptz) TO $role});
	}

	# The test's own witness of DDL (event triggers are superuser-only): who ran it, from
	# which kind of backend. Never fails the command it watches. A sweep that makes or drops
	# partitions without ProcessUtility (no event trigger fires) is judged by the owner of the
	# partitions it makes alone.
	$node->safe_psql($db, q{
		CREATE SCHEMA audit;
		GRANT USAGE ON SCHEMA audit TO PUBLIC;
		CREATE TABLE audit.ddl_seen (who name, tag text, backend text, at timestamptz DEFAULT clock_timestamp());
		GRANT INSERT ON audit.ddl_seen TO PUBLIC;
		CREATE FUNCTION audit.note_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO audit.ddl_seen (who, tag, backend)
			VALUES (current_user, tg_tag,
			        (SELECT backend_type FROM pg_catalog.pg_stat_activity WHERE pid = pg_catalog.pg_backend_pid()));
		EXCEPTION WHEN OTHERS THEN
			RAISE LOG 'audit.note_ddl: %', SQLERRM;
		END $$;
		CREATE EVENT TRIGGER note_ddl_end ON ddl_command_end EXECUTE FUNCTION audit.note_ddl();
		CREATE EVENT TRIGGER note_ddl_drop ON sql_drop EXECUTE FUNCTION audit.note_ddl();
		-- Also under session_replication_role = replica, which a sweep may use to silence triggers.
		ALTER EVENT TRIGGER note_ddl_end ENABLE ALWAYS;
		ALTER EVENT TRIGGER note_ddl_drop ENABLE ALWAYS;});

	# The attack, as the attacker.
	$node->safe_psql($db, "CREATE SCHEMA $role AUTHORIZATION $role");
	my $enable_always = $s->{attacker} eq 'owner'
	  ? join('', map { "ALTER TABLE $_ ENABLE ALWAYS TRIGGER escalate;\n" }
		  ($table, $mode eq 'partitioned' ? 'public.idempotency_keys_partitioned_default' : ()))
	  : '';
	$node->safe_psql($db, qq{
		SET ROLE $role;
		CREATE TABLE $role.seen (who name, was_superuser boolean, on_table name,
		                         at timestamptz DEFAULT clock_timestamp());
		GRANT USAGE ON SCHEMA $role TO PUBLIC;
		GRANT INSERT ON $role.seen TO PUBLIC;
		CREATE FUNCTION $role.escalate() RETURNS trigger LANGUAGE plpgsql SECURITY INVOKER AS \$\$
		BEGIN
			INSERT INTO $role.seen (who, was_superuser, on_table)
			VALUES (current_user, (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user), TG_TABLE_NAME);
			BEGIN
				ALTER ROLE $role SUPERUSER;
			EXCEPTION WHEN OTHERS THEN
				RAISE LOG 'planted trigger of $role: ALTER ROLE as % failed: % (%)', current_user, SQLERRM, SQLSTATE;
			END;
			RETURN OLD;
		END \$\$;
		CREATE TRIGGER escalate BEFORE DELETE ON $table FOR EACH ROW EXECUTE FUNCTION $role.escalate();
		$enable_always
		INSERT INTO $table (expires_at, created_at, http_status, scope, key, request_hash)
		VALUES (now() - interval '1 day', now() - interval '2 days', 200, '', 'attack', decode('$HASH', 'hex'));
		RESET ROLE;});
	# Only the DDL of the sweep counts from here on.
	$node->safe_psql($db, 'TRUNCATE audit.ddl_seen');
}

set_up($_) for @scenarios;

# Sweeps. The worker: a larger ttl in its partitioned databases makes it premake partitions too.
my @worker = grep { $_->{path} eq 'worker' } @scenarios;
my @by_hand = grep { $_->{path} eq 'cleanup' } @scenarios;
$node->safe_psql($_->{db}, "ALTER DATABASE $_->{db} SET idempotency.ttl = '3h'")
  for grep { $_->{mode} eq 'partitioned' } @worker;
$node->safe_psql('postgres',
	"ALTER SYSTEM SET idempotency.databases = '" . join(', ', map { $_->{db} } @worker) . "'");
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
# By hand: a superuser's idem_cleanup(), which drops expired partitions and deletes expired rows.
for my $s (@by_hand)
{
	my ($rc, $out, $err) = $node->psql($s->{db}, 'SELECT idem_cleanup()');
	$s->{cleanup_answer} = $rc == 0 ? "removed $out" : "failed: $err";
}

# What the sweep must have done in a database: deleted the expired keys (and in partitioned
# storage dropped the expired partition); the worker also made partitions for the larger ttl.
sub swept_sql
{
	my ($s) = @_;
	my $sql = 'SELECT NOT EXISTS (SELECT FROM ' . key_table($s->{mode}) . " WHERE key IN ('attack', 'past'))";
	$sql .= " AND to_regclass('public.$s->{past}') IS NULL" if $s->{mode} eq 'partitioned';
	return $sql;
}

sub made_sql
{
	my ($s) = @_;
	return "SELECT (SELECT max(upper_bound) FROM idem_partitions()) > '$s->{max_upper}'";
}

for my $s (@scenarios)
{
	my ($db, $role, $mode, $path) = @$s{qw(db role mode path)};
	my $name = "$s->{attacker}, $mode storage, $path";
	my $took = $node->wait_until($db, swept_sql($s), $path eq 'worker' ? 60 : 0);
	my $made = $mode eq 'partitioned' && $path eq 'worker' ? $node->wait_until($db, made_sql($s), 30) : undef;
	my $owner = $node->safe_psql($db, "SELECT relowner::regrole FROM pg_class WHERE oid = '"
		  . key_table($mode) . "'::regclass");
	my $fired = $node->safe_psql($db, qq{
		SELECT count(*) || ' firings' || coalesce(': ' || string_agg(DISTINCT who || CASE WHEN was_superuser
		       THEN ' (superuser)' ELSE '' END, ', '), '')
		FROM $role.seen});
	my $ddl = $node->safe_psql($db, qq{SELECT coalesce(string_agg(DISTINCT who || ' ' || tag, ', '), 'none')
		FROM audit.ddl_seen});
	diag("$name: swept " . (defined $took ? sprintf('after %.1f s', $took) : 'never')
		  . ($s->{cleanup_answer} ? " (idem_cleanup() $s->{cleanup_answer})" : '')
		  . "; table owner $owner; planted trigger: $fired; sweep DDL by: $ddl");

	# Fails if the planted trigger ran as a superuser (1.1: the worker's bootstrap superuser,
	# or idem_cleanup()'s caller).
	is($node->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = '$role'"), 'f',
		"$name: $role is not superuser");
	is($node->safe_psql($db, "SELECT count(*) FROM $role.seen WHERE was_superuser IS NOT false"), '0',
		"$name: the planted trigger never ran as a superuser");
	# The owner's own trigger may run as the owner, and as nobody else.
	is($node->safe_psql($db, "SELECT count(*) FROM $role.seen WHERE who <> '$role'"), '0',
		"$name: the planted trigger ran as the owner at most")
	  if $s->{attacker} eq 'owner';
	# A planted trigger the worker did not fire is named in the log, so that the attempt shows.
	if ($path eq 'worker'
		&& $node->safe_psql($db, "SELECT count(*) FROM $role.seen") eq '0')
	{
		cmp_ok($node->log_lines(0, qr/LOG:(?!\s+statement:).*\b\Q$db\E\b.*\bescalate\b/), '>=', 1,
			"$name: the trigger the sweep did not fire is named in a LOG line");
	}
	# Fails if the fix stops expiry instead (the sweep failing on the trap, or on privileges).
	ok(defined $took, "$name: the expired keys are deleted"
		  . ($mode eq 'partitioned' ? ' and the expired partition dropped' : ''));
	ok(defined $made, "$name: the sweep makes partitions") if $mode eq 'partitioned' && $path eq 'worker';
	if ($mode eq 'partitioned')
	{
		# Fails if the sweep's DDL ran as another role than the table's owner (1.1: the superuser).
		is($node->safe_psql($db, qq{SELECT coalesce(string_agg(DISTINCT who::text, ', '), 'nobody else')
			FROM audit.ddl_seen WHERE who <> '$owner' AND backend = '}
			  . ($path eq 'worker' ? 'idempotency cleanup' : 'client backend') . q{'}),
			'nobody else', "$name: the sweep's DDL ran as the table owner $owner");
		is($node->safe_psql($db, qq{SELECT count(*) FROM idem_partitions() p
			JOIN pg_class c ON c.relname = p.partition_name AND c.relnamespace = 'public'::regnamespace
			WHERE p.upper_bound > '$s->{max_upper}' AND c.relowner <> '$owner'::regrole}), '0',
			"$name: the partitions the sweep made belong to the table owner")
		  if $path eq 'worker';
	}
}

is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, 'no process crashed');
$node->stop;
done_testing();
