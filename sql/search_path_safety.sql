-- Objects a user puts on the search_path are never read or written by the extension.
TRUNCATE idempotency_keys;
BEGIN;
SELECT outcome FROM idem_claim('sp', idem_hash('real'));
SELECT idem_complete('sp', 201, '"genuine"');
COMMIT;

-- A temporary table shadows the real one for unqualified names.
CREATE TEMP TABLE idempotency_keys (LIKE public.idempotency_keys);
INSERT INTO idempotency_keys
SELECT now() + interval '1 day', now(), 200, '', 'sp', decode(idem_hash('real'), 'hex'), NULL, '"forged"';
INSERT INTO idempotency_keys
SELECT now() + interval '1 day', now(), 200, '', 'forged-only', decode(idem_hash('real'), 'hex'), NULL, '"forged"';
SELECT outcome, response_body FROM idem_claim('sp', idem_hash('real'));
SELECT outcome FROM idem_claim('forged-only', idem_hash('real'));

-- A schema first on the search_path with a table and an = operator of the same names.
CREATE SCHEMA evil;
CREATE TABLE evil.idempotency_keys (LIKE public.idempotency_keys);
CREATE FUNCTION evil.always_true(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.always_true);
SET search_path = evil, pg_catalog, public, pg_temp;
BEGIN;
SELECT outcome, response_body FROM idem_claim('sp', idem_hash('real'));
SELECT outcome FROM idem_claim('new-key', idem_hash('real'));
SELECT idem_complete('new-key', 200, '"real row"');
COMMIT;
RESET search_path;
SELECT count(*) AS evil_rows FROM evil.idempotency_keys;
SELECT count(*) AS temp_rows FROM pg_temp.idempotency_keys;
SELECT key, response_body FROM public.idempotency_keys ORDER BY key;
DROP TABLE pg_temp.idempotency_keys;
DROP SCHEMA evil CASCADE;
