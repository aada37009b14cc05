-- idem_hash(jsonb, exclude): the fingerprint leaves out the named fields, top-level or nested, and
-- nothing else; bad paths are clear errors.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql

-- A retry that changes only the excluded fields has the same fingerprint.
SELECT idem_hash('{"amount": 100, "request_id": "r-1", "meta": {"sent_at": "10:00", "agent": "ios"}}'::jsonb,
                 ARRAY['request_id', 'meta.sent_at'])
     = idem_hash('{"amount": 100, "request_id": "r-2", "meta": {"sent_at": "10:05", "agent": "ios"}}'::jsonb,
                 ARRAY['request_id', 'meta.sent_at']) AS retry_matches;
-- A change to any other field does not.
SELECT idem_hash('{"amount": 100, "request_id": "r-1"}'::jsonb, ARRAY['request_id'])
     = idem_hash('{"amount": 101, "request_id": "r-1"}'::jsonb, ARRAY['request_id']) AS tampered_matches;
SELECT idem_hash('{"amount": 100, "meta": {"agent": "ios"}}'::jsonb, ARRAY['meta.sent_at'])
     = idem_hash('{"amount": 100, "meta": {"agent": "web"}}'::jsonb, ARRAY['meta.sent_at']) AS sibling_matches;
-- It is idem_hash of the payload without those fields; an absent path changes nothing.
SELECT idem_hash('{"a": 1, "b": 2}'::jsonb, ARRAY['b']) = idem_hash('{"a": 1}'::jsonb) AS same_as_removed;
SELECT idem_hash('{"a": 1}'::jsonb, ARRAY['x.y', 'z']) = idem_hash('{"a": 1}'::jsonb) AS absent_is_noop;
SELECT idem_hash('{"a": 1}'::jsonb, ARRAY[]::text[]) = idem_hash('{"a": 1}'::jsonb) AS empty_list;
-- The IETF draft's fingerprint: method, path and body, here without the body's client timestamp.
SELECT idem_hash(jsonb_build_object('method', 'POST', 'path', '/payments',
                                    'body', '{"amount": 100, "sent_at": "10:00"}'::jsonb),
                 ARRAY['body.sent_at']) = idem_hash('{"method": "POST", "path": "/payments", "body": {"amount": 100}}'::jsonb) AS draft_fingerprint;
-- STRICT: NULL in, NULL out.
SELECT idem_hash(NULL::jsonb, ARRAY['a']) IS NULL AS null_payload, idem_hash('{}'::jsonb, NULL) IS NULL AS null_list;
-- 22004 / 22023
SELECT sqlstate_of($$SELECT idem_hash('{"a": 1}'::jsonb, ARRAY['a', NULL])$$);
SELECT sqlstate_of($$SELECT idem_hash('{"a": 1}'::jsonb, ARRAY[''])$$);
DROP FUNCTION sqlstate_of(text);
