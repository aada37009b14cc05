-- replay: a trivial statement with the parameters of the claim.
\set n 1000000000000000000 + random(1, 100000)
SELECT :kp || :n, :h;
