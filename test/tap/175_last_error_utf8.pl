# 1.3 hardening: idem_stats.last_error is cut on a character boundary.
#
# The table's owner has a trigger it enabled ALWAYS (so it fires in a sweep, see the README's "Security") that
# fails every delete with a message of 200 two-byte characters (400 bytes). The worker's sweep fails on it and
# keeps the message in idem_stats.last_error, which holds at most 255 bytes: the cut must fall between two
# characters (254 bytes, 127 characters), so the text is valid UTF-8 for every reader.
# Fails on 1.2: the message was cut at 255 bytes, in the middle of the 128th character, and reading last_error
# back through a conversion fails with "invalid byte sequence for encoding UTF8".
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $node = IdemNode->create('utf8', "idempotency.databases = ''", 'idempotency.cleanup_interval = 1s');
$node->safe_psql('postgres', q{CREATE DATABASE u8 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
$node->safe_psql('u8', q{
	CREATE EXTENSION idempotency;
	CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN RAISE EXCEPTION '%', repeat(U&'\00E9', 200); END $$;
	CREATE TRIGGER refuse BEFORE DELETE ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION refuse();
	ALTER TABLE idempotency_keys ENABLE ALWAYS TRIGGER refuse;});
$node->insert_expired('u8', 'old', 3);
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = 'u8'; SELECT pg_reload_conf()});
my $seen = $node->wait_until('u8', q{SELECT last_error IS NOT NULL FROM idem_stats}, 60);
ok(defined $seen, 'the sweep failed on the trigger and kept its message');
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = ''; SELECT pg_reload_conf()});
my ($ret, $out, $err) = $node->psql('u8',
	q{SELECT octet_length(last_error), length(convert_from(convert_to(last_error, 'UTF8'), 'UTF8')) FROM idem_stats});
is($ret, 0, 'last_error is valid UTF-8') or diag($err);
is($out, '254|127', 'cut at 254 bytes, 127 whole characters');
$node->stop;
done_testing();
