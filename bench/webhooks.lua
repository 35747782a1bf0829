-- wrk script for bench/webhooks: POST one signed GitHub issue_comment
-- delivery over and over, each with its own X-GitHub-Delivery, so a
-- receiver that deduplicates by delivery id stores every one of them.
--
--   wrk ... -s bench/webhooks.lua URL -- BODY_FILE SIGNATURE RUN_PREFIX
--
-- BODY_FILE holds the JSON body, SIGNATURE is "sha256=<hex>" of that body,
-- RUN_PREFIX is 8 hex digits unique to this wrk run. Delivery ids look
-- like GitHub's (a UUID): RUN_PREFIX-<thread>-4000-8000-<counter>.
-- At the end the script prints one "status <code> <count>" line per
-- status code seen, for bench/webhooks to read.

local threads = {}
local next_id = 0

function setup(thread)
	thread:set("tid", next_id)
	next_id = next_id + 1
	table.insert(threads, thread)
end

local body, signature, prefix
local my_tid, counter = 0, 0
statuses = {}

function init(args)
	local f = assert(io.open(args[1], "rb"))
	body = f:read("*a")
	f:close()
	signature = args[2]
	prefix = args[3]
	my_tid = tonumber(tid) or 0 -- the global set by setup()
	wrk.method = "POST"
	wrk.path = "/webhooks/github"
end

function request()
	counter = counter + 1
	local id = string.format("%s-%04x-4000-8000-%012x", prefix, my_tid,
		counter)
	return wrk.format("POST", "/webhooks/github", {
		["Content-Type"] = "application/json",
		["User-Agent"] = "GitHub-Hookshot/bench",
		["X-GitHub-Event"] = "issue_comment",
		["X-GitHub-Delivery"] = id,
		["X-Hub-Signature-256"] = signature,
	}, body)
end

function response(status, headers, resp_body)
	statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
	local total = {}
	for _, thread in ipairs(threads) do
		local s = thread:get("statuses")
		for code, n in pairs(s) do
			total[code] = (total[code] or 0) + n
		end
	end
	for code, n in pairs(total) do
		io.write(string.format("status %d %d\n", code, n))
	end
end
