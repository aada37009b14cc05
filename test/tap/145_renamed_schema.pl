# A renamed extension schema hands nothing to whoever recreates the old name.
#
# The extension lives in public, which a database owner owns in PostgreSQL 15 (through
# pg_database_owner). The owner, a non-superuser, renames public to oldpublic, creates a new
# public and plants there a look-alike of every function the extension's SQL and PL/pgSQL
# bodies name (idem_storage_mode, idem_partitions, idem_hash(jsonb/text/bytea),
# idem_create_partition, idem_premake_partitions, idem_drop_expired_partitions,
# idem_keys_in_flight_claims) and tables named like the extension's, with forged rows and
# row/TRUNCATE triggers. Every planted function and trigger logs (server log and a table) and
# tries ALTER ROLE <owner> SUPERUSER inside an exception block; idem_hash(jsonb) answers one
# constant for any payload.
#
# Four databases, each with its own owner: the worker sweeps wtable (table storage) and
# wpart (partitioned, with an expired partition and a larger idempotency.ttl so that it also
# makes partitions); a superuser calls oldpublic.idem_hash(jsonb, text[]),
# oldpublic.idem_keys_in_flight(), oldpublic.idem_cleanup() and oldpublic.idem_set_storage()
# in ctable, and idem_keys_in_flight() and idem_cleanup() in cpart, one call at a time (the
# owner is made NOSUPERUSER again and the log emptied between calls, so that each call is
# judged alone).
#
# Fails on: any planted function or trigger run (by anyone), an owner that is superuser
# afterwards, expired keys or partitions left behind, idem_hash(jsonb, text[]) other than
# idem_hash(jsonb) of the payload without the excluded path, a tampered retry that replays
# instead of answering mismatch, forged rows listed by idem_keys_in_flight(), a storage switch
# that does not move the real keys.
# On 1.1 the bodies name public.* when called (the schema name was written into them at
# CREATE EXTENSION), so the superuser's calls and the worker's partitioned sweep run the
# planted code and each owner becomes superuser.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $HASH = 'f' x 64;
my $PLANTED_HASH = '0' x 64;

# Listed only once the trap is set.
my $node = IdemNode->create('renamed_schema', "idempotency.databases = ''", 'idempotency.cleanup_interval = 1s',
	"idempotency.ttl = '1h'");

my %mode = (wtable => 'table', wpart => 'partitioned', ctable => 'table', cpart => 'partitioned');
my %past;         # database => name of its expired range partition
my %max_upper;    # database => newest upper bound before the sweep

# The real key table of a database, named through the renamed schema.
sub real_table
{
	return $mode{ $_[0] } eq 'partitioned' ? 'oldpublic.idempotency_keys_partitioned' : 'oldpublic.idempotency_keys';
}

# $n expired keys $prefix1..$prefixN in the real table, named through $schema.
sub insert_expired_into
{
	my ($db, $table, $prefix, $n) = @_;
	$node->safe_psql($db, qq{
		INSERT INTO $table (expires_at, created_at, http_status, scope, key, request_hash)
		SELECT now() - interval '1 day', now() - interval '2 days', 200, '', '$prefix' || i, decode('$HASH', 'hex')
		FROM generate_series(1, $n) i});
}

# Before the rename, as a superuser, with the genuine extension.
for my $db (sort keys %mode)
{
	$node->safe_psql('postgres', "CREATE ROLE owner_$db LOGIN; CREATE DATABASE $db OWNER owner_$db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	next unless $mode{$db} eq 'partitioned';
	$node->safe_psql($db, q{SELECT idem_set_storage('partitioned', interval '1 hour')});
	# An expired range partition with 5 keys, below the current one: the sweep drops it.
	$past{$db} = $node->safe_psql($db, q{
		SELECT idem_create_partition(min(lower_bound) - interval '2 hours', min(lower_bound) - interval '1 hour')
		FROM idem_partitions()});
	$node->safe_psql($db, qq{
		INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash)
		SELECT lower_bound + interval '30 minutes', lower_bound, 200, '', 'past' || i, decode('$HASH', 'hex')
		FROM idem_partitions(), generate_series(1, 5) i WHERE partition_name = '$past{$db}'});
	$max_upper{$db} = $node->safe_psql($db, 'SELECT max(upper_bound) FROM idem_partitions()');
}

# The trap, as the database owner.
sub plant
{
	my ($db) = @_;
	my $owner = "owner_$db";
	my $columns = q{expires_at timestamptz NOT NULL, created_at timestamptz NOT NULL, http_status integer,
		scope text NOT NULL, key text NOT NULL, request_hash bytea NOT NULL, response_headers jsonb,
		response_body jsonb, lease_until timestamptz, lease_token uuid, recovery_point text,
		recovery_state jsonb};
	my $tables = join "\n", map { qq{
		CREATE TABLE public.$_ ($columns);
		INSERT INTO public.$_ VALUES (now() + interval '1 day', now(), NULL, '', 'forged-lease',
			decode('$HASH', 'hex'), NULL, NULL, now() + interval '1 day', gen_random_uuid(), 'forged', NULL);
		CREATE TRIGGER planted_row BEFORE INSERT OR UPDATE OR DELETE ON public.$_
			FOR EACH ROW EXECUTE FUNCTION public.planted_trigger();
		CREATE TRIGGER planted_truncate BEFORE TRUNCATE ON public.$_
			FOR EACH STATEMENT EXECUTE FUNCTION public.planted_trigger();
		GRANT ALL ON public.$_ TO PUBLIC;} }
	  qw(idempotency_keys idempotency_keys_partitioned idempotency_keys_partitioned_default);
	$node->safe_psql($db, qq{
		SET ROLE $owner;
		ALTER SCHEMA public RENAME TO oldpublic;
		CREATE SCHEMA public;
		GRANT USAGE ON SCHEMA public TO PUBLIC;
		CREATE TABLE public.planted_log (fn text, who name, was_superuser boolean, backend text,
		                                 at timestamptz DEFAULT clock_timestamp());
		GRANT INSERT ON public.planted_log TO PUBLIC;
		-- What every planted object does when run: say so, and try to make its author superuser.
		CREATE FUNCTION public.planted(fn text) RETURNS void LANGUAGE plpgsql AS \$\$
		BEGIN
			RAISE LOG 'planted public.% ran as % in database %', fn, current_user, current_database();
			BEGIN
				INSERT INTO public.planted_log (fn, who, was_superuser, backend)
				VALUES (fn, current_user, (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user),
				        (SELECT backend_type FROM pg_catalog.pg_stat_activity WHERE pid = pg_catalog.pg_backend_pid()));
			EXCEPTION WHEN OTHERS THEN
				RAISE LOG 'planted public.%: could not log: %', fn, SQLERRM;
			END;
			BEGIN
				ALTER ROLE $owner SUPERUSER;
			EXCEPTION WHEN OTHERS THEN
				RAISE LOG 'planted public.%: ALTER ROLE as % failed: %', fn, current_user, SQLERRM;
			END;
		END \$\$;
		CREATE FUNCTION public.planted_trigger() RETURNS trigger LANGUAGE plpgsql AS \$\$
		BEGIN
			PERFORM public.planted('trigger on ' || TG_TABLE_NAME || ' ' || TG_OP);
			RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
		END \$\$;
		CREATE FUNCTION public.idem_storage_mode() RETURNS text LANGUAGE plpgsql AS \$\$
		BEGIN PERFORM public.planted('idem_storage_mode()'); RETURN 'partitioned'; END \$\$;
		CREATE FUNCTION public.idem_partitions(OUT partition_name name, OUT lower_bound timestamptz,
		                                       OUT upper_bound timestamptz) RETURNS SETOF record
		LANGUAGE plpgsql AS \$\$ BEGIN PERFORM public.planted('idem_partitions()'); RETURN; END \$\$;
		CREATE FUNCTION public.idem_hash(payload jsonb) RETURNS text LANGUAGE plpgsql AS \$\$
		BEGIN PERFORM public.planted('idem_hash(jsonb)'); RETURN '$PLANTED_HASH'; END \$\$;
		CREATE FUNCTION public.idem_hash(payload text) RETURNS text LANGUAGE plpgsql AS \$\$
		BEGIN PERFORM public.planted('idem_hash(text)'); RETURN '$PLANTED_HASH'; END \$\$;
		CREATE FUNCTION public.idem_hash(payload bytea) RETURNS text LANGUAGE plpgsql AS \$\$
		BEGIN PERFORM public.planted('idem_hash(bytea)'); RETURN '$PLANTED_HASH'; END \$\$;
		CREATE FUNCTION public.idem_create_partition(lower_bound timestamptz, upper_bound timestamptz)
		RETURNS name LANGUAGE plpgsql AS \$\$
		BEGIN PERFORM public.planted('idem_create_partition()'); RETURN 'planted'; END \$\$;
		CREATE FUNCTION public.idem_premake_partitions() RETURNS integer LANGUAGE plpgsql AS \$\$
		BEGIN PERFORM public.planted('idem_premake_partitions()'); RETURN 0; END \$\$;
		CREATE FUNCTION public.idem_drop_expired_partitions(OUT partitions_dropped integer, OUT keys_removed bigint)
		LANGUAGE plpgsql AS \$\$
		BEGIN
			PERFORM public.planted('idem_drop_expired_partitions()');
			partitions_dropped := 0;
			keys_removed := 0;
		END \$\$;
		CREATE FUNCTION public.idem_keys_in_flight_claims(OUT scope text, OUT key text, OUT pid integer,
		                                                  OUT since timestamptz) RETURNS SETOF record
		LANGUAGE plpgsql AS \$\$
		BEGIN
			PERFORM public.planted('idem_keys_in_flight_claims()');
			RETURN QUERY SELECT ''::text, 'forged-claim'::text, 0, now();
		END \$\$;
		$tables
		RESET ROLE;});
}

plant($_) for sort keys %mode;
is($node->safe_psql('wtable', q{SELECT extnamespace::regnamespace FROM pg_extension WHERE extname = 'idempotency'}),
	'oldpublic', 'the extension now lives in oldpublic, and public is the owner\'s new schema');
my $log_offset = -s $node->logfile;

# Judges what happened in $db since the last call: no planted code ran, the owner is not
# superuser; then makes the owner NOSUPERUSER again and empties the log for the next call.
sub no_planted_code
{
	my ($db, $what) = @_;
	my $ran = $node->safe_psql($db, q{SELECT count(*) || coalesce(': ' || string_agg(DISTINCT fn || ' as ' || who
		|| CASE WHEN was_superuser THEN ' (superuser)' ELSE '' END || ' from ' || backend, '; '), '')
		FROM public.planted_log});
	my $lines = $node->log_lines($log_offset, qr/planted public\..* in database $db\b/);
	my $super = $node->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'owner_$db'");
	diag("$db: $what: planted code ran $ran; server log lines $lines; owner_$db superuser: $super");
	is("$ran / $lines", '0 / 0', "$db: $what: no planted function or trigger ran");
	is($super, 'f', "$db: $what: owner_$db is not superuser");
	$node->safe_psql($db, "TRUNCATE public.planted_log; ALTER ROLE owner_$db NOSUPERUSER");
	$log_offset = -s $node->logfile;
}

# ---- the worker sweeps wtable and wpart ----
insert_expired_into($_, real_table($_), 'expired', 10) for qw(wtable wpart);
$node->safe_psql('wpart', "ALTER DATABASE wpart SET idempotency.ttl = '3h'");    # partitions to make
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = 'wtable, wpart'});
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
my %swept = (
	wtable => q{SELECT NOT EXISTS (SELECT FROM oldpublic.idempotency_keys WHERE key LIKE 'expired%')},
	wpart => qq{SELECT NOT EXISTS (SELECT FROM oldpublic.idempotency_keys_partitioned
	                               WHERE key LIKE 'expired%' OR key LIKE 'past%')
		AND to_regclass('oldpublic.$past{wpart}') IS NULL
		AND (SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		     WHERE i.inhparent = 'oldpublic.idempotency_keys_partitioned'::regclass
		       AND pg_get_expr(c.relpartbound, c.oid) ~ '^FOR VALUES FROM'
		       AND (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \\(''([^'']+)''\\)'))[1]::timestamptz
		           > '$max_upper{wpart}') > 0});
my %took = map { $_ => $node->wait_until($_, $swept{$_}, 60) } qw(wtable wpart);
# Fails if the sweep stops (or is stopped) by the planted objects.
ok(defined $took{wtable}, 'wtable: the worker deletes the expired keys');
ok(defined $took{wpart}, 'wpart: the worker deletes the expired keys, drops the expired partition and makes new ones');
# Further sweeps must not run anything planted either.
my $mark = $node->safe_psql('postgres', q{SELECT now() + interval '2 s'});
ok(defined $node->wait_until('postgres', "SELECT last_sweep_started_at > '$mark' FROM idem_stats", 30),
	'the worker sweeps again (a later sweep is judged too)');
$node->wait_until('postgres', q{SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup'}, 10);
no_planted_code($_, 'worker sweeps') for qw(wtable wpart);
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = ''});
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');

# ---- ctable, by a superuser: idem_hash(jsonb, text[]) and a tampered retry ----
{
	my $sent = '{"amount": 10, "request_id": "r1"}';
	my $tampered = '{"amount": 99, "request_id": "r2"}';
	my ($subset, $whole) = split /\|/, $node->safe_psql('ctable', qq{
		SELECT oldpublic.idem_hash('$sent'::jsonb, '{request_id}'),
		       oldpublic.idem_hash('$sent'::jsonb #- '{request_id}')});
	# Fails if the body's idem_hash(jsonb) is looked up by name (1.1: public.idem_hash, planted).
	is($subset, $whole, 'ctable: idem_hash(jsonb, text[]) is idem_hash(jsonb) of the payload without the path');
	my $answer = $node->safe_psql('ctable', qq{
		BEGIN;
		SELECT outcome FROM oldpublic.idem_claim('order-1', oldpublic.idem_hash('$sent'::jsonb, '{request_id}'));
		SELECT oldpublic.idem_complete('order-1', 201, '"charged 10"');
		COMMIT;
		SELECT outcome FROM oldpublic.idem_claim('order-1', oldpublic.idem_hash('$tampered'::jsonb, '{request_id}'));});
	# Fails if the tampered payload hashes like the first one (1.1: both are the planted constant).
	is($answer, "claimed\nt\nmismatch", 'ctable: a retry with another amount is a mismatch, not a replay');
	no_planted_code('ctable', 'idem_hash(jsonb, text[])');
}

# ---- idem_keys_in_flight(), by a superuser: only the real lease ----
for my $db (qw(ctable cpart))
{
	$node->safe_psql($db, qq{SELECT outcome FROM oldpublic.idem_lease('real-lease', '$HASH', lease => interval '1 hour')});
	my $listed = $node->safe_psql($db, q{SELECT string_agg(key || ' ' || holder, ', ' ORDER BY key)
		FROM oldpublic.idem_keys_in_flight()});
	# Fails if the forged claim or the planted table's forged lease is listed.
	is($listed, 'real-lease lease', "$db: idem_keys_in_flight() lists the real lease and nothing forged");
	no_planted_code($db, 'idem_keys_in_flight()');
}

# ---- idem_cleanup(), by a superuser ----
for my $db (qw(ctable cpart))
{
	insert_expired_into($db, real_table($db), 'expired', 10);
	my ($rc, $removed, $err) = $node->psql($db, 'SELECT oldpublic.idem_cleanup()');
	my $left = $node->safe_psql($db, 'SELECT count(*) FROM ' . real_table($db)
		  . q{ WHERE key LIKE 'expired%' OR key LIKE 'past%'});
	my $expected = $mode{$db} eq 'partitioned' ? 15 : 10;
	# Fails if idem_cleanup() runs the planted idem_partitions() (1.1: the expired partition stays).
	is("$removed $left" . ($rc ? " $err" : ''), "$expected 0", "$db: idem_cleanup() removes all $expected expired keys");
	is($node->safe_psql($db, "SELECT to_regclass('oldpublic.$past{$db}') IS NULL"), 't',
		"$db: and drops the expired partition")
	  if $mode{$db} eq 'partitioned';
	no_planted_code($db, 'idem_cleanup()');
}

# ---- idem_set_storage(), by a superuser: the real keys move both ways ----
{
	my $range_partitions = q{SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'oldpublic.idempotency_keys_partitioned'::regclass
		  AND c.relnamespace = 'oldpublic'::regnamespace
		  AND pg_get_expr(c.relpartbound, c.oid) ~ '^FOR VALUES FROM'};
	my $where = q{(SELECT count(*) FROM oldpublic.idempotency_keys WHERE key = 'real-lease') || '/'
		|| (SELECT count(*) FROM oldpublic.idempotency_keys_partitioned WHERE key = 'real-lease')};
	my ($rc, $out, $err) = $node->psql('ctable', q{SELECT oldpublic.idem_set_storage('partitioned', interval '1 hour')});
	# Fails if the switch works on the planted tables or asks the planted functions for the mode.
	is(($rc ? "error: $err" : '') . $node->safe_psql('ctable', "SELECT ($range_partitions) > 0, $where"),
		't|0/1', 'ctable: idem_set_storage(partitioned) makes real partitions and moves the real lease');
	no_planted_code('ctable', q{idem_set_storage('partitioned')});
	($rc, $out, $err) = $node->psql('ctable', q{SELECT oldpublic.idem_set_storage('table')});
	is(($rc ? "error: $err" : '') . $node->safe_psql('ctable', "SELECT ($range_partitions) = 0, $where"),
		't|1/0', 'ctable: idem_set_storage(table) drops the real partitions and moves the lease back');
	no_planted_code('ctable', q{idem_set_storage('table')});
}

# The planted tables keep exactly their forged row each: nothing was written to or deleted from them.
for my $db (sort keys %mode)
{
	is($node->safe_psql($db, q{SELECT concat((SELECT count(*) FROM public.idempotency_keys),
		(SELECT count(*) FROM public.idempotency_keys_partitioned),
		(SELECT count(*) FROM public.idempotency_keys_partitioned_default))}), '111',
		"$db: the planted tables are untouched");
}

is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, 'no process crashed');
$node->stop;
done_testing();
