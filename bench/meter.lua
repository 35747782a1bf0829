-- wrk script for bench/meter: report LLM calls to diverged's meter, each
-- with its own requestId, spread round-robin over the benchmark's tasks,
-- each task's call carrying that task's macaroon.
--
--   wrk ... -s bench/meter.lua URL -- MODE TOKENS_FILE RUN_PREFIX THREADS \
--       [BODY_FILE SIGNATURE]
--
-- MODE "meter": POST /api/v1/agenttask/meter, a new body per request:
--   {"requestId":"<RUN_PREFIX>-<thread>-<counter, 8 hex>","iteration":1,
--    "model":"bench-model","tokensUsed":100,"costUSD":0.0001}
-- MODE "ceiling": the same request line and headers, but always the body
--   of BODY_FILE (a meter body of the same length) with
--   X-Hub-Signature-256: SIGNATURE, so bench/ceiling does its whole work
--   (read, HMAC, compare) and answers 202.
-- MODE "durable": as "ceiling", with X-GitHub-Delivery: the requestId the
--   meter mode would send, under which bench/durable stores the call.
-- TOKENS_FILE holds one token per line, line i (from 0) for task t-i.
-- RUN_PREFIX is 8 hex digits unique to this wrk run; THREADS is wrk's -t,
-- so that thread k starts at task k * n / THREADS (its offset) and then
-- takes the next task for every request.
-- At the end the script prints one "status <code> <count>" line per status
-- code seen and "sent <count>" (requests written, answered or not), for
-- bench/meter to read.

local threads = {}
local next_id = 0

function setup(thread)
	thread:set("tid", next_id)
	next_id = next_id + 1
	table.insert(threads, thread)
end

local mode, prefix, body, signature
local auth = {}
local ntasks = 0
local my_tid, counter, task = 0, 0, 0
local path = "/api/v1/agenttask/meter"
statuses = {}
sent = 0

function init(args)
	mode = args[1]
	local f = assert(io.open(args[2], "r"))
	for line in f:lines() do
		if line ~= "" then
			auth[ntasks] = "Bearer " .. line
			ntasks = ntasks + 1
		end
	end
	f:close()
	assert(ntasks > 0, "no tokens in " .. args[2])
	prefix = args[3]
	local nthreads = tonumber(args[4]) or 1
	my_tid = tonumber(tid) or 0 -- the global set by setup()
	task = math.floor(my_tid * ntasks / nthreads) % ntasks
	if mode == "ceiling" or mode == "durable" then
		f = assert(io.open(args[5], "rb"))
		body = f:read("*a")
		f:close()
		signature = args[6]
	else
		assert(mode == "meter", "MODE must be meter, ceiling or durable")
	end
	wrk.method = "POST"
	wrk.path = path
end

function request()
	local headers = {
		["Content-Type"] = "application/json",
		["Authorization"] = auth[task],
	}
	local b = body
	counter = counter + 1
	task = (task + 1) % ntasks
	if mode == "ceiling" or mode == "durable" then
		headers["X-Hub-Signature-256"] = signature
		if mode == "durable" then
			headers["X-GitHub-Delivery"] = string.format("%s-%d-%08x",
				prefix, my_tid, counter)
		end
	else
		b = string.format('{"requestId":"%s-%d-%08x","iteration":1,' ..
			'"model":"bench-model","tokensUsed":100,"costUSD":0.0001}',
			prefix, my_tid, counter)
	end
	sent = sent + 1
	return wrk.format("POST", path, headers, b)
end

function response(status, headers, resp_body)
	statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
	local total, nsent = {}, 0
	for _, thread in ipairs(threads) do
		local s = thread:get("statuses")
		for code, n in pairs(s) do
			total[code] = (total[code] or 0) + n
		end
		nsent = nsent + (tonumber(thread:get("sent")) or 0)
	end
	for code, n in pairs(total) do
		io.write(string.format("status %d %d\n", code, n))
	end
	io.write(string.format("sent %d\n", nsent))
end
