# Hostile search_path: a session whose search_path puts a temporary table, a schema with
# tables, operators and functions named like the extension's (and pg_catalog after them)
# first. The extension must read and write only its own table, in both storage modes.
# Fails on: a replay of a forged row (from the temp or the shadowing table), a claim
# answer decided by a shadowing operator or function, a write or delete that lands in
# a shadowing table, or a genuine key that does not replay.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use Digest::SHA qw(sha256_hex);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my $FORGED = 50;    # keys that exist only in the shadowing tables

my $node = IdemNode->create('search_path');
$node->safe_psql('postgres', q{
	CREATE ROLE mallory;
	CREATE SCHEMA evil AUTHORIZATION mallory;
	CREATE TABLE evil.idempotency_keys (LIKE public.idempotency_keys);
	CREATE TABLE evil.idempotency_keys_partitioned (LIKE public.idempotency_keys);
	CREATE TABLE evil.idempotency_keys_partitioned_default (LIKE public.idempotency_keys);
	SET ROLE mallory;
	-- Operators that match everything, and functions the C code or the SQL functions
	-- might call unqualified.
	CREATE FUNCTION evil.yes(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
	CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.yes);
	CREATE FUNCTION evil.yes_ts(timestamptz, timestamptz) RETURNS boolean LANGUAGE sql AS 'SELECT true';
	CREATE OPERATOR evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.yes_ts);
	CREATE OPERATOR evil.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.yes_ts);
	CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$SELECT timestamptz '2000-01-01'$$;
	CREATE FUNCTION evil.idem_storage_mode() RETURNS text LANGUAGE sql AS $$SELECT 'partitioned'$$;
	CREATE FUNCTION evil.current_setting(text) RETURNS text LANGUAGE sql AS $$SELECT '1 s'$$;
	RESET ROLE;
});

# Forged rows: the same hash as the genuine requests, body "forged", live for a day,
# plus expired ones that a hijacked cleanup would delete.
sub forge
{
	my ($dbh, $table, $keys) = @_;
	for my $key (@$keys)
	{
		for my $expiry ('1 day', '-1 day')
		{
			$dbh->do(qq{INSERT INTO $table VALUES (pg_catalog.now() OPERATOR(pg_catalog.+) interval '$expiry',
				pg_catalog.now(), 200, '', \$1, pg_catalog.decode(\$2, 'hex'), NULL, '"forged"')}, undef, ($expiry eq '1 day' ? $key : "expired-$key"),
				sha256_hex($key));
		}
	}
}

sub hostile_session
{
	my $dbh = idem_connect($node->dsn(), AutoCommit => 1) or BAIL_OUT('no connection');
	# Set before the first call, so the extension's cached plans are made under it too.
	$dbh->do('SET search_path = pg_temp, evil, pg_catalog, public');
	$dbh->do('CREATE TEMP TABLE idempotency_keys (LIKE public.idempotency_keys)');
	$dbh->do('CREATE TEMP TABLE idempotency_keys_partitioned (LIKE public.idempotency_keys)');
	return $dbh;
}

sub claim
{
	my ($dbh, $key, $hash) = @_;
	return $dbh->selectrow_array(q{SELECT outcome, response_body #>> '{}' FROM public.idem_claim($1, $2)},
		undef, $key, $hash // sha256_hex($key));
}

sub run_mode
{
	my ($mode) = @_;
	my @forged = map { "$mode-forged-$_" } 1 .. $FORGED;
	my $genuine = "$mode-genuine";
	my $expired_genuine = "$mode-expired-genuine";

	my $owner = idem_connect($node->dsn()) or BAIL_OUT('no connection');
	$owner->do('SELECT public.idem_set_storage($1)', undef, $mode) if $mode eq 'partitioned';
	for my $k ([ $genuine, '1 day' ], [ $expired_genuine, '1 millisecond' ])
	{
		$owner->begin_work;
		$owner->do('SELECT public.idem_claim($1, $2, $3)', undef, $k->[0], sha256_hex($k->[0]), $k->[1]);
		$owner->do(q{SELECT public.idem_complete($1, 200, '"genuine"')}, undef, $k->[0]);
		$owner->commit;
	}
	forge($owner, "evil.$_", [ $genuine, @forged ])
	  for qw(idempotency_keys idempotency_keys_partitioned idempotency_keys_partitioned_default);

	my $dbh = hostile_session();
	forge($dbh, "pg_temp.$_", [ $genuine, @forged ]) for qw(idempotency_keys idempotency_keys_partitioned);
	my $count_shadows = q{SELECT (SELECT count(*) FROM evil.idempotency_keys)
		+ (SELECT count(*) FROM evil.idempotency_keys_partitioned)
		+ (SELECT count(*) FROM evil.idempotency_keys_partitioned_default)
		+ (SELECT count(*) FROM pg_temp.idempotency_keys)
		+ (SELECT count(*) FROM pg_temp.idempotency_keys_partitioned)};
	my $shadow_rows = $dbh->selectrow_array($count_shadows);

	my ($forged_replays, $claimed, $stored_ok) = (0, 0, 0);
	my ($outcome, $body) = claim($dbh, $genuine);
	my $genuine_answer = "$outcome $body";
	my ($mismatch) = claim($dbh, $genuine, sha256_hex('another payload'));
	for my $key (@forged)
	{
		$dbh->begin_work;
		($outcome, $body) = claim($dbh, $key);
		$forged_replays++ if $outcome eq 'replay';
		if ($outcome eq 'claimed')
		{
			$claimed++;
			$dbh->do(q{SELECT public.idem_complete($1, 201, '"real"')}, undef, $key);
		}
		$dbh->commit;
		($outcome, $body) = claim($dbh, $key);
		$stored_ok++ if "$outcome $body" eq 'replay real';
	}
	sleep 0.01;    # the 1 ms genuine key has expired
	my $removed = $dbh->selectrow_array('SELECT public.idem_cleanup()');
	my ($expired_answer) = claim($dbh, $expired_genuine);
	my $shadow_rows_after = $dbh->selectrow_array($count_shadows);
	$dbh->disconnect;
	my $public_rows = $owner->selectrow_array(q{SELECT count(*) FROM public.idempotency_keys
		WHERE key LIKE $1 AND expires_at > now()}, undef, "$mode-%");
	$public_rows += $owner->selectrow_array(q{SELECT count(*) FROM public.idempotency_keys_partitioned
		WHERE key LIKE $1 AND expires_at > now()}, undef, "$mode-%");
	$owner->do('DELETE FROM evil.' . $_) for qw(idempotency_keys idempotency_keys_partitioned
		idempotency_keys_partitioned_default);
	$owner->disconnect;

	diag("search_path $mode: genuine key answered '$genuine_answer', other payload '$mismatch'; "
		  . "$FORGED forged-only keys: $forged_replays forged replays, $claimed claimed, $stored_ok "
		  . "stored in the extension's table; idem_cleanup removed $removed; shadow rows "
		  . "$shadow_rows before, $shadow_rows_after after; extension rows $public_rows");
	is($genuine_answer, 'replay genuine', "$mode: the genuine key replays its genuine body");
	is($mismatch, 'mismatch', "$mode: another payload is a mismatch (hash compared in the real row)");
	is($forged_replays, 0, "$mode: forged replays: 0");
	is($claimed, $FORGED, "$mode: every forged-only key is claimed");
	is($stored_ok, $FORGED, "$mode: their completions land in the extension's table and replay");
	is($shadow_rows_after, $shadow_rows, "$mode: no shadowing row written or deleted");
	is($public_rows, $FORGED + 1, "$mode: the extension's table holds exactly the genuine live rows");
	# Partitioned storage deletes only from the default partition; the rest goes by DROP later.
	cmp_ok($removed, '>=', 1, "$mode: idem_cleanup removed the expired genuine key") if $mode eq 'table';
	is($expired_answer, 'claimed', "$mode: the expired genuine key is claimable");
}

run_mode('table');
run_mode('partitioned');

done_testing();
