-- wrk script for bench/clients: POST a fixed payment with a fresh Idempotency-Key on every request.
-- Usage: wrk -s keys.lua URL -- RUNID   (RUNID starts with a letter, unique per run, so no key repeats)
local threads = 0

function setup(thread)
    threads = threads + 1
    thread:set("tid", threads)
end

function init(args)
    runid = args[1] or "bench"
    n = 0
    body = '{"amount_cents":100,"currency":"EUR"}'
    headers = {
        ["Authorization"] = "Bearer bench",
        ["Content-Type"] = "application/json",
    }
end

function request()
    n = n + 1
    headers["Idempotency-Key"] = runid .. "-" .. tid .. "-" .. n
    return wrk.format("POST", nil, headers, body)
end
