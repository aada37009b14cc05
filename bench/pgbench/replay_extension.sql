-- replay: a claim of one of the 100k completed keys.
\set n 1000000000000000000 + random(1, 100000)
SELECT * FROM public.idem_claim(:kp || :n, :h);
