# Least privilege and tenants. An application role `app` (login, not superuser, not the
# owner) with only SELECT, INSERT, UPDATE on the key table runs the whole API; it cannot
# rewrite another scope's stored response through it. With row level security on the
# scope (app.tenant), two tenants using the same key strings never see or block each
# other, in both storage modes.
# Fails on: an API call `app` cannot make with those grants, a grant that turns out not to
# be needed (control role without grants succeeds), a claim of another scope's live key
# that does not replay, a complete/release without a claim that succeeds, a cross-tenant
# replay or in_progress, or another tenant's stored body changed.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use Digest::SHA qw(sha256_hex);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my $TENANT_KEYS = 20;

my $node = IdemNode->create('privileges');
$node->safe_psql('postgres', q{
	CREATE ROLE app NOLOGIN;
	ALTER ROLE app LOGIN;
	GRANT SELECT, INSERT, UPDATE ON idempotency_keys TO app;
	CREATE ROLE nobody LOGIN;
	-- another scope's live key, stored by the owner
	BEGIN;
	SELECT idem_claim('shared', idem_hash('pay 10'), scope => 'victim');
	SELECT idem_complete('shared', 201, '"victim body"', scope => 'victim');
	COMMIT;});

sub as_role
{
	my ($role, $tenant) = @_;
	my $dbh = idem_connect($node->dsn(user => $role), AutoCommit => 0) or BAIL_OUT("no $role connection");
	$dbh->do('SET app.tenant = ' . $dbh->quote($tenant)) if defined $tenant;
	$dbh->commit;
	return $dbh;
}

# Runs SQL in its own transaction; returns the first column of the first row, or
# "ERROR <sqlstate>".
sub run
{
	my ($dbh, $sql, @bind) = @_;
	my $v = eval { my @row = $dbh->selectrow_array($sql, undef, @bind); $row[0] // 'NULL' };
	$v = 'ERROR ' . $dbh->state unless defined $v;
	$dbh->rollback;
	return $v;
}

# claim + complete (or release, or 5xx) in one transaction; returns the step answers.
sub request
{
	my ($dbh, $key, $payload, %opt) = @_;
	my $scope = $opt{scope} // '';
	my @answers;
	eval {
		my ($outcome, $body) = $dbh->selectrow_array(
			q{SELECT outcome, response_body #>> '{}' FROM idem_claim($1, idem_hash($2::text), $3::interval, $4)},
			undef, $key, $payload, $opt{ttl}, $scope);
		push @answers, $outcome eq 'replay' ? "replay $body" : $outcome;
		if ($outcome eq 'claimed' && ($opt{finish} // '') eq 'release')
		{
			push @answers, $dbh->selectrow_array('SELECT idem_release($1, $2)', undef, $key, $scope);
		}
		elsif ($outcome eq 'claimed' && ($opt{finish} // '') ne 'none')
		{
			push @answers, $dbh->selectrow_array(q{SELECT idem_complete($1, $2, to_jsonb($3::text), NULL, $4)},
				undef, $key, $opt{status} // 201, $opt{body}, $scope);
		}
		$opt{hold} ? 1 : $dbh->commit;
	} or do { push @answers, 'ERROR ' . $dbh->state; $dbh->rollback; };
	return join ' ', map { $_ eq '1' ? 'true' : $_ eq '0' ? 'false' : $_ } @answers;
}

# (c) least privilege
my $app = as_role('app');
is(run($app, q{SELECT rolsuper OR rolcreaterole OR rolbypassrls FROM pg_roles WHERE rolname = current_user}),
	0, 'app: no superuser, createrole or bypassrls');
is(run($app, q{SELECT pg_has_role('app', relowner, 'USAGE') FROM pg_class WHERE oid = 'idempotency_keys'::regclass}),
	0, 'app: not (a member of) the table owner');
is(request($app, 'c1', 'p', body => 'one'), 'claimed true', 'app: claim + complete');
is(request($app, 'c1', 'p'), 'replay one', 'app: replay');
is(request($app, 'c1', 'other'), 'mismatch', 'app: mismatch');
is(request($app, 'c2', 'p', finish => 'release'), 'claimed true', 'app: claim + release');
is(request($app, 'c2', 'p', body => 'two'), 'claimed true', 'app: a released key is claimed again');
is(request($app, 'c3', 'p', status => 503), 'claimed false', 'app: a 5xx is not stored');
is(request($app, 'c3', 'p', body => 'three'), 'claimed true', 'app: and the key is claimed again');
is(request($app, 'c4', 'p', body => 'old', ttl => '1 millisecond'), 'claimed true', 'app: short ttl');
sleep 0.01;
is(request($app, 'c4', 'p', body => 'new'), 'claimed true', 'app: an expired key is replaced (UPDATE)');
is(request($app, 'c4', 'p'), 'replay new', 'app: the replacement replays');

# Another scope's live key, through the API.
is(request($app, 'shared', 'pay 10', scope => 'victim', body => 'forged'), 'replay victim body',
	"app: a claim of another scope's live key replays, never claims");
is(request($app, 'shared', 'pay 99', scope => 'victim', body => 'forged'), 'mismatch',
	"app: with another payload it is a mismatch");
is(run($app, q{SELECT idem_complete('shared', 201, '"forged"', scope => 'victim')}), 'ERROR 55000',
	'app: complete without a claim fails');
is(run($app, q{SELECT idem_release('shared', scope => 'victim')}), 'ERROR 55000',
	'app: release without a claim fails');
my %denied = map { $_ => run($app, $_) } (
	'DELETE FROM idempotency_keys', 'TRUNCATE idempotency_keys', 'SELECT idem_cleanup()',
	q{SELECT idem_set_storage('partitioned')}, 'SELECT idem_stats_reset()');
is($denied{$_}, 'ERROR 42501', "app: denied: $_") for sort keys %denied;
my $nobody = as_role('nobody');
is(request($nobody, 'n1', 'p', body => 'x'), 'ERROR 42501', 'control: a role without the grants cannot claim');
$nobody->disconnect;
$app->disconnect;
is($node->safe_psql('postgres', q{SELECT response_body #>> '{}' FROM idempotency_keys WHERE scope = 'victim'}),
	'victim body', "the other scope's stored body is unchanged");
# Not through the API: UPDATE (needed to replace expired keys) reaches every scope's
# rows unless row level security confines it, below.

# (d) row level security: two tenants, the same key strings and payloads.
sub tenants
{
	my ($mode) = @_;
	my $a = as_role('app', 'tenant_a');
	my $b = as_role('app', 'tenant_b');
	my ($conflicts, $a_ok, $b_ok, $cross_replays, $own_replays) = (0, 0, 0, 0, 0);
	for my $i (1 .. $TENANT_KEYS)
	{
		my $key = "$mode-order-$i";
		# A holds its claim open while B claims the same key string in its own scope.
		my $ra = request($a, $key, 'pay', scope => 'tenant_a', body => "a-$i", hold => 1);
		my $rb = request($b, $key, 'pay', scope => 'tenant_b', body => "b-$i");
		$a->commit;
		$conflicts++ if $rb !~ /^claimed/;
		$a_ok++ if $ra eq 'claimed true';
		$b_ok++ if $rb eq 'claimed true';
		for ([ $a, 'tenant_a', "a-$i" ], [ $b, 'tenant_b', "b-$i" ])
		{
			my ($dbh, $scope, $own) = @$_;
			my $answer = request($dbh, $key, 'pay', scope => $scope);
			$own_replays++ if $answer eq "replay $own";
			$cross_replays++ if $answer =~ /^replay / && $answer ne "replay $own";
		}
	}
	# A names B's scope explicitly: RLS hides B's row from A.
	my $explicit = request($a, "$mode-order-1", 'pay', scope => 'tenant_b', body => 'from a');
	my $explicit_read = run($a, q{SELECT count(*) FROM idempotency_keys WHERE scope = 'tenant_b'});
	my $explicit_update = run($a, q{UPDATE idempotency_keys SET response_body = '"x"' WHERE scope = 'tenant_b'
		RETURNING 1});
	# B holds a claim; A probing it under B's scope.
	request($b, "$mode-inflight", 'pay', scope => 'tenant_b', body => 'b', hold => 1);
	my $probe = request($a, "$mode-inflight", 'pay', scope => 'tenant_b', body => 'a');
	$b->rollback;
	# The reverse: A holds a claim under B's scope (RLS does not cover the key's lock).
	my $squat = request($a, "$mode-squat", 'pay', scope => 'tenant_b', finish => 'none', hold => 1);
	my $victim = request($b, "$mode-squat", 'pay', scope => 'tenant_b', body => 'b');
	$a->rollback;
	$a->disconnect;
	$b->disconnect;
	my $b_bodies = $node->safe_psql('postgres', qq{SELECT count(*) FROM
		(SELECT key, response_body #>> '{}' AS body FROM idempotency_keys WHERE scope = 'tenant_b'
		 UNION ALL SELECT key, response_body #>> '{}' FROM idempotency_keys_partitioned WHERE scope = 'tenant_b') r
		WHERE key LIKE '$mode-order-%' AND body = 'b-' || split_part(key, '-', 3)});

	diag("rls $mode: $TENANT_KEYS keys in two tenants: claimed+stored a=$a_ok b=$b_ok, cross-scope conflicts "
		  . "$conflicts, own replays $own_replays, cross-scope replays $cross_replays; tenant_a naming tenant_b's "
		  . "scope: claim+complete answered '$explicit', SELECT sees $explicit_read rows, UPDATE '$explicit_update'; "
		  . "tenant_a probing tenant_b's in-flight key: '$probe'; while tenant_a holds a claim under "
		  . "tenant_b's scope ('$squat'), tenant_b's own request answers '$victim'");
	is($a_ok + $b_ok, 2 * $TENANT_KEYS, "$mode: both tenants claim and complete every key");
	is($conflicts, 0, "$mode: cross-scope conflicts: 0");
	is($cross_replays, 0, "$mode: cross-scope replays: 0");
	is($own_replays, 2 * $TENANT_KEYS, "$mode: each tenant replays its own body");
	unlike($explicit, qr/^replay|true$/, "$mode: naming another tenant's scope neither replays nor stores");
	is("$explicit_read $explicit_update", '0 NULL', "$mode: another tenant's rows are invisible to SQL");
	is($b_bodies, $TENANT_KEYS, "$mode: tenant_b's stored bodies are intact");
}

$node->safe_psql('postgres', q{
	ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
	ALTER TABLE idempotency_keys FORCE ROW LEVEL SECURITY;
	CREATE POLICY tenant ON idempotency_keys USING (scope = current_setting('app.tenant'));});
tenants('table');

# Partitioned storage keeps its rows in idempotency_keys_partitioned: it needs the same
# grant and its own policy (a policy on idempotency_keys does not cover it).
# Fails if idem_set_storage moves RLS-protected keys into a table without the policy
# (tenant_a would then replay tenant_b's responses).
my ($switch_rc, $switch_out, $switch_err) =
  $node->psql('postgres', q{SELECT idem_set_storage('partitioned')});
like($switch_err, qr/row level security on the current table is missing on the other one/,
	'switching to partitioned storage is refused while its table lacks the policy');
is($node->safe_psql('postgres', 'SELECT idem_storage_mode()'), 'table', 'and the mode is unchanged');
$node->safe_psql('postgres', q{
	GRANT SELECT, INSERT, UPDATE ON idempotency_keys_partitioned TO app;
	ALTER TABLE idempotency_keys_partitioned ENABLE ROW LEVEL SECURITY;
	ALTER TABLE idempotency_keys_partitioned FORCE ROW LEVEL SECURITY;
	CREATE POLICY tenant ON idempotency_keys_partitioned USING (scope = current_setting('app.tenant'));
	SELECT idem_set_storage('partitioned');});
tenants('partitioned');

done_testing();
