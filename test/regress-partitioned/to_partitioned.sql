-- Run before every file of the partitioned pass (scripts/test-regress-partitioned.sh): the database's storage is
-- partitioned (1-day partitions, the default width) when the next file starts, whatever the file before it left.
SET client_min_messages = warning;
DO $$ BEGIN
  IF idem_storage_mode() <> 'partitioned' THEN
    PERFORM idem_set_storage('partitioned');
  END IF;
END $$;
SELECT idem_storage_mode();
