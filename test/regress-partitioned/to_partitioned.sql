-- Run before every file of the partitioned pass (scripts/test-regress-partitioned.sh, which writes the width of
-- its pass for the 1 day below): the database's storage is partitioned, in partitions of that width, when the
-- next file starts, whatever the file before it left.
SET client_min_messages = warning;
DO $$ BEGIN
  IF idem_storage_mode() <> 'partitioned'
     OR (SELECT min(upper_bound - lower_bound) FROM idem_partitions()) <> interval '1 day' THEN
    PERFORM idem_set_storage('table');
    PERFORM idem_set_storage('partitioned', interval '1 day');
  END IF;
END $$;
SELECT idem_storage_mode(), (SELECT min(upper_bound - lower_bound) = interval '1 day' FROM idem_partitions()) AS width;
