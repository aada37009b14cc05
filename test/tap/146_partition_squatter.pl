# Expiry never stops, and the 64-partition cap holds wherever partitions are made.
#
# (1) Squatter: in partitioned storage (1-hour partitions), a role with CREATE on the
# extension's schema pre-creates tables named like the next two partitions the worker will
# make (idempotency_keys_pYYYYMMDD_HH24MISS of the lower bound in UTC, computed from
# idem_partitions()'s newest upper bound and width). A larger idempotency.ttl then makes the
# worker premake three partitions, the first two squatted.
# Fails on: expired keys left in the default partition, an expired partition not dropped
# (1.1: premake is the sweep's first step and fails on the name, so nothing is ever deleted
# again), no LOG line naming the squatted name, no partition made past the squatted ones, a
# squatter's table touched (attached, written, emptied, owned by someone else).
#
# (2) Cap: the database owner (not a superuser) sets idempotency.ttl = '30d' (30 days: the
# setting counts seconds and takes no unit above d) on a database with 1-hour partitions, where
# idem_set_storage would refuse that combination. The worker must keep making partitions, up
# to 64 range partitions and never more.
# Fails on: more than 64 range partitions after three sweeps with that setting (1.1 makes
# ~720), or no partition made at all (the setting not seen, so the test would prove nothing).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my $HASH = 'd' x 64;

my $node = IdemNode->create('squatter', "idempotency.databases = ''", 'idempotency.cleanup_interval = 1s',
	"idempotency.ttl = '1h'");

sub reload_databases
{
	my ($list) = @_;
	$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.databases = '$list'");
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
}

# ---- (1) squatted partition names ----
$node->safe_psql('postgres', 'CREATE ROLE squatter LOGIN; CREATE DATABASE appdb');
$node->safe_psql('appdb', q{
	CREATE EXTENSION idempotency;
	GRANT CREATE ON SCHEMA public TO squatter;
	SELECT idem_set_storage('partitioned', interval '1 hour');});
# An expired range partition below the current one, with 5 keys (the drop path), and 5 expired
# keys below every partition, in the default partition (the delete path).
my $past = $node->safe_psql('appdb', q{
	SELECT idem_create_partition(min(lower_bound) - interval '2 hours', min(lower_bound) - interval '1 hour')
	FROM idem_partitions()});
$node->safe_psql('appdb', qq{
	INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash)
	SELECT lower_bound + interval '30 minutes', lower_bound, 200, '', 'past' || i, decode('$HASH', 'hex')
	FROM idem_partitions(), generate_series(1, 5) i WHERE partition_name = '$past';
	INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash)
	SELECT now() - interval '1 day', now() - interval '2 days', 200, '', 'expired' || i, decode('$HASH', 'hex')
	FROM generate_series(1, 5) i;});

# The next partitions start at the newest upper bound, one width apart.
my $newest_upper = $node->safe_psql('appdb', 'SELECT max(upper_bound) FROM idem_partitions()');
my @squatted = split /\n/, $node->safe_psql('appdb', qq{
	SELECT 'idempotency_keys_p' || to_char((timestamptz '$newest_upper' + n * width) AT TIME ZONE 'UTC',
	                                       'YYYYMMDD"_"HH24MISS')
	FROM (SELECT upper_bound - lower_bound AS width FROM idem_partitions() ORDER BY upper_bound DESC LIMIT 1) w,
	     generate_series(0, 1) n
	ORDER BY n});
$node->safe_psql('appdb', join "\n", 'SET ROLE squatter;',
	map { "CREATE TABLE public.$_ (squat text); INSERT INTO public.$_ VALUES ('mine');" } @squatted);
diag("newest partition ends at $newest_upper; squatted: @squatted");

# ttl 4h: the worker must make partitions up to now() + 6 h, three past the newest: two squatted.
$node->safe_psql('appdb', q{ALTER DATABASE appdb SET idempotency.ttl = '4h'});
my $log_from = -s $node->logfile;
reload_databases('appdb');

my $expired_gone = $node->wait_until('appdb', qq{
	SELECT NOT EXISTS (SELECT FROM idempotency_keys_partitioned WHERE key LIKE 'expired%')}, 60);
my $partition_dropped = $node->wait_until('appdb', qq{
	SELECT to_regclass('public.$past') IS NULL
	   AND NOT EXISTS (SELECT FROM idempotency_keys_partitioned WHERE key LIKE 'past%')}, 30);
# The partition after the two squatted ones.
my $made = $node->wait_until('appdb', qq{
	SELECT max(upper_bound) >= timestamptz '$newest_upper' + 3 * interval '1 hour' FROM idem_partitions()}, 30);
# Fails if premake's failure stops the sweep (1.1: the CREATE TABLE of the first name fails).
ok(defined $expired_gone, 'the sweep still deletes the expired keys in the default partition');
ok(defined $partition_dropped, 'and still drops the expired partition');
ok(defined $made, 'partitions past the squatted names are still made');
diag('partitions now: ' . $node->safe_psql('appdb', q{
	SELECT string_agg(partition_name || ' [' || to_char(lower_bound AT TIME ZONE 'UTC', 'HH24:MI') || ', '
	                  || to_char(upper_bound AT TIME ZONE 'UTC', 'HH24:MI') || ')', ', ' ORDER BY lower_bound)
	FROM idem_partitions()}));
for my $name (@squatted)
{
	# Fails if the operator is not told which name is taken.
	# A logged statement of the test's own (log_statement) does not count.
	cmp_ok($node->log_lines($log_from, qr/LOG:(?!\s+statement:).*\b\Q$name\E\b/), '>=', 1,
		"a LOG line names the squatted $name");
	# Fails if the squatter's table was attached, written, emptied or given away.
	is($node->safe_psql('appdb', qq{
		SELECT c.relispartition, c.relowner::regrole,
		       (SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
		        WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped),
		       (SELECT string_agg(squat, ',') FROM public.$name)
		FROM pg_class c WHERE c.oid = 'public.$name'::regclass}),
		'f|squatter|squat|mine', "the squatter's $name is untouched");
}
# Fails if a partition took the squatter's name anyway (in another schema it would be harmless,
# but then idem_partitions() must still list it by its real name).
is($node->safe_psql('appdb', q{SELECT count(*) FROM idem_partitions() WHERE partition_name IN ('}
	  . join("', '", @squatted) . q{')}), '0', 'no partition goes by a squatted name');

# ---- (2) the 64-partition cap against a database owner's idempotency.ttl ----
$node->safe_psql('postgres', 'CREATE ROLE capowner LOGIN; CREATE DATABASE capdb OWNER capowner');
$node->safe_psql('capdb', q{
	CREATE EXTENSION idempotency;
	SELECT idem_set_storage('partitioned', interval '1 hour');});
my $before = $node->safe_psql('capdb', 'SELECT count(*) FROM idem_partitions()');
# The database owner may: idempotency.ttl is a user setting.
$node->psql('capdb', q{SET ROLE capowner; ALTER DATABASE capdb SET idempotency.ttl = '30d'}, on_error_die => 1);
my $mark = $node->safe_psql('postgres', 'SELECT now()');
reload_databases('capdb');

# Three sweeps of capdb after the setting, finished well or not; the count sampled all along.
my ($most, %sweeps) = ($before);
my $deadline = now_s() + 240;
while (keys %sweeps < 3 && now_s() < $deadline)
{
	my ($count, $swept) = split /\|/, $node->safe_psql('capdb', qq{
		SELECT (SELECT count(*) FROM idem_partitions()),
		       (SELECT CASE WHEN last_sweep_database = 'capdb' AND last_sweep_started_at > '$mark'
		                    THEN last_sweep_started_at::text END FROM idem_stats)});
	$most = $count if $count > $most;
	$sweeps{$swept} = 1 if $swept;
	sleep 0.2;
}
my $after = $node->safe_psql('capdb', 'SELECT count(*) FROM idem_partitions()');
$most = $after if $after > $most;
diag(sprintf('capdb: %d range partitions before, at most %d seen over %d sweeps with idempotency.ttl = 30d, '
	  . '%d at the end', $before, $most, scalar keys %sweeps, $after));
is(scalar keys %sweeps, 3, 'the worker swept capdb three times with idempotency.ttl = 30d');
cmp_ok($after, '>', $before, 'the worker made partitions with that setting');
# Fails if the worker makes as many partitions as the owner's ttl asks for (1.1: ~720).
cmp_ok($most, '<=', 64, 'never more than 64 range partitions');

reload_databases('');
is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, 'no process crashed');
$node->stop;
done_testing();
