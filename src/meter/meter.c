/*
 * The meter: every LLM call an agent makes is reported here and charged to
 * its AgentTask, atomically, against the budgets (DESIGN section 6
 * "Meter", section 7). Also the token index: minting, revoking and
 * pruning the macaroons of tasks.
 *
 * On the embedded store a charge is one transaction over the task and the
 * namespace's token index (charge, suspension and revocation commit
 * together). On a real cluster it is a read-modify-write of the task's
 * status with its resourceVersion, retried from a fresh read on 409 so
 * that concurrent calls never lose an increment; the suspension of the
 * spec and the revocation follow it (a crash in between is repaired by the
 * reconciler, which revokes the token of every paused task).
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "k8s/k8s.h"
#include "meter/meter.h"
#include "util/jscan.h"
#include "util/util.h"

#define RING 32
#define MAX_REQUEST_ID 256
#define MAX_MODEL 256
#define MAX_TOKENS_USED INT64_C(1000000000000)	/* 10^12 */
#define MAX_COST_MICRO INT64_C(1000000000000)	/* $10^6 */

struct lane;

struct meter {
	struct meter_config cfg;
	unsigned char key[MACAROON_KEY_LEN];
	pthread_mutex_t mu;	/* REST lanes */
	pthread_cond_t cv;
	struct lane *lanes;
};

/* ------------------------------------------------------------ money */

#define MAX_SIG 40

/* Parse a JSON number as micro-USD, half to even past 6 decimals. */
int
meter_parse_usd(const char *text, size_t len, int64_t max_micro,
    int64_t *out)
{
	char d[MAX_SIG];	/* significant digits, no leading zeros */
	size_t nd = 0, i = 0, k;
	long exp10 = 0, e = 0;	/* value = d * 10^(exp10 + e) */
	int point = 0, sticky = 0, any = 0, rnd = 0, esign = 1, minus = 0;
	int64_t v = 0;
	long shift;

	if (len == 0 || text[0] == '+')
		return -1;
	/* "-0", "-0.0" are zero (json.dumps(-0.0)); any other sign is not */
	if (text[0] == '-') {
		minus = 1;
		i = 1;
	}
	for (; i < len; i++) {
		char c = text[i];

		if (c == '.') {
			if (point || !any)
				return -1;
			point = 1;
			continue;
		}
		if (c < '0' || c > '9')
			break;
		any = 1;
		if (point)
			exp10--;
		if (nd == 0 && c == '0')
			continue;
		if (nd < MAX_SIG) {
			d[nd++] = c;
		} else {
			/*
			 * beyond 40 digits the digit is dropped, its place
			 * kept (after the point this undoes the decrement):
			 * too large unless an exponent brings it down
			 * ("1000...0e-51"); only rounding sees it
			 */
			exp10++;
			if (c != '0')
				sticky = 1;
		}
	}
	if (!any || (point && text[i - 1] == '.'))
		return -1;
	if (i < len && (text[i] == 'e' || text[i] == 'E')) {
		i++;
		if (i < len && (text[i] == '+' || text[i] == '-'))
			esign = text[i++] == '-' ? -1 : 1;
		if (i == len)
			return -1;
		for (; i < len && text[i] >= '0' && text[i] <= '9'; i++)
			if (e < 100000)
				e = e * 10 + (text[i] - '0');
		e *= esign;
	}
	if (i != len)
		return -1;
	if (nd == 0) {
		*out = 0;
		return 0;
	}
	if (minus)
		return -1;
	/* micro = d * 10^(exp10 + e + 6) */
	shift = exp10 + e + 6;
	if (shift > 30)
		return -1;
	if (shift >= 0) {
		for (k = 0; k < nd; k++) {
			if (v > (INT64_MAX - (d[k] - '0')) / 10)
				return -1;
			v = v * 10 + (d[k] - '0');
		}
		for (; shift > 0; shift--) {
			if (v > INT64_MAX / 10)
				return -1;
			v *= 10;
		}
	} else {
		long keep = (long)nd + shift;	/* digits above 1e-6 USD */

		for (k = 0; (long)k < keep; k++) {
			if (v > (INT64_MAX - (d[k] - '0')) / 10)
				return -1;
			v = v * 10 + (d[k] - '0');
		}
		if (keep >= 0) {
			rnd = d[keep] - '0';
			for (k = (size_t)keep + 1; k < nd; k++)
				if (d[k] != '0')
					sticky = 1;
		} else {
			/* every digit is below half a micro-USD */
			rnd = 0;
			sticky = 1;
		}
		if (rnd > 5 || (rnd == 5 && (sticky || (v & 1)))) {
			if (v == INT64_MAX)
				return -1;
			v++;
		}
	}
	if (v > max_micro)
		return -1;
	*out = v;
	return 0;
}

/* 6 decimals. */
void
meter_format_usd(int64_t micro, char out[32])
{
	snprintf(out, 32, "%lld.%06lld", (long long)(micro / 1000000),
	    (long long)(micro % 1000000));
}

/*
 * A decimal string (as stored: "5.00", "0.022500") to micro-USD. Every
 * total a charge may write (up to INT64_MAX) reads back.
 */
static int64_t
usd_string(const char *s)
{
	int64_t v = 0;

	if (s == NULL || meter_parse_usd(s, strlen(s), INT64_MAX, &v) < 0)
		return 0;
	return v;
}

/* The number text of micro-USD, shortest: 0.0225, 5, 0. */
static void
usd_number(int64_t micro, char out[32])
{
	size_t n;

	meter_format_usd(micro, out);
	n = strlen(out);
	while (n > 0 && out[n - 1] == '0')
		out[--n] = '\0';
	if (n > 0 && out[n - 1] == '.')
		out[--n] = '\0';
}

/* ------------------------------------------------------------ replies */

/* Free a reply's body. */
void
meter_reply_release(struct meter_reply *r)
{
	free(r->body);
	r->body = NULL;
	r->reason = NULL;
}

static void
reply_error(struct meter_reply *out, int status, const char *error,
    const char *field)
{
	struct buf b;

	buf_init(&b, 4096);
	buf_addstr(&b, "{\"error\":");
	jscan_escape(&b, error);
	if (field != NULL) {
		buf_addstr(&b, ",\"field\":");
		jscan_escape(&b, field);
	}
	buf_addstr(&b, "}");
	out->status = status;
	out->body = buf_detach(&b, NULL);
	/* one reason for every malformed body: a label, not a message */
	out->reason = status == 400 ? "invalid body" : error;
}

/* ------------------------------------------------------------ metrics */

/*
 * Charges are counted with atomics read when /metrics is scraped: the
 * store's writer answers them, and it is the meter's bottleneck. The rest
 * (refusals, suspensions, completions) are rare and go to the registry.
 */
static atomic_uint_fast64_t n_charges, n_tokens, n_micro_usd, n_duplicates;

static double
read_usd(void *arg)
{
	return metrics_read_atomic(arg) / 1e6;
}

/* Declare the meter's metrics (idempotent: every meter_new). */
static void
metrics_init(void)
{
	static const struct {
		const char *name, *help;
		double (*fn)(void *);
		atomic_uint_fast64_t *v;
	} counters[] = {
		{ "diverge_meter_charges_total", "LLM calls charged to their "
		  "task.", metrics_read_atomic, &n_charges },
		{ "diverge_meter_charged_tokens_total", "Tokens charged, all "
		  "tasks.", metrics_read_atomic, &n_tokens },
		{ "diverge_meter_charged_usd_total", "US dollars charged, all "
		  "tasks.", read_usd, &n_micro_usd },
		{ "diverge_meter_duplicates_total", "Retried calls answered "
		  "from the requestId ring, not charged again.",
		  metrics_read_atomic, &n_duplicates },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(counters); i++) {
		metrics_describe(counters[i].name, METRIC_COUNTER,
		    counters[i].help);
		metrics_gauge_fn(counters[i].name, "", counters[i].fn,
		    (void *)counters[i].v);
	}
	metrics_describe("diverge_meter_refusals_total", METRIC_COUNTER,
	    "Meter and complete calls refused, by endpoint, status code and "
	    "reason.");
	metrics_describe("diverge_meter_suspensions_total", METRIC_COUNTER,
	    "Tasks suspended by the meter, by reason.");
	metrics_describe("diverge_meter_completions_total", METRIC_COUNTER,
	    "Task ends reported by agents (complete), by result.");
	{
		static const char *const reasons[] = {
		    "reason=\"budget exceeded\"",
		    "reason=\"max iterations exceeded\"", NULL };
		static const char *const results[] = {
		    "result=\"succeeded\"", "result=\"failed\"", NULL };

		metrics_zero("diverge_meter_suspensions_total", reasons);
		metrics_zero("diverge_meter_completions_total", results);
	}
}

/* The outcome of one call to endpoint, once its reply is final. */
static void
count_reply(const char *endpoint, const struct meter_reply *r)
{
	char *why;
	char labels[256];

	if (r->status == 200)
		return;
	why = metrics_label_escape(r->reason != NULL ? r->reason :
	    "unknown");
	snprintf(labels, sizeof(labels), "endpoint=\"%s\",code=\"%d\","
	    "reason=\"%s\"", endpoint, r->status, why);
	free(why);
	metrics_inc("diverge_meter_refusals_total", labels, 1);
}

/* ------------------------------------------------------------ request */

struct meter_req {
	char *request_id;
	int64_t iteration;
	char *model;		/* NULL when absent */
	int64_t tokens;
	int64_t cost;		/* micro-USD */
};

static void
req_release(struct meter_req *r)
{
	free(r->request_id);
	free(r->model);
	memset(r, 0, sizeof(*r));
}

static const char *const body_paths[] = {
	"requestId", "iteration", "model", "tokensUsed", "costUSD"
};

/* Validate the body; on error fill out and return -1. */
static int
parse_body(const char *body, size_t len, struct meter_req *r,
    struct meter_reply *out)
{
	struct jfield f[ARRAY_SIZE(body_paths)];
	const char *err;
	size_t i, n;

	memset(r, 0, sizeof(*r));
	for (i = 0; i < ARRAY_SIZE(body_paths); i++)
		f[i].path = body_paths[i];
	if (jscan(body, len, f, ARRAY_SIZE(f), 16, &err) < 0) {
		reply_error(out, 400, "body is not valid JSON", NULL);
		return -1;
	}
	for (i = 0; i < len && (body[i] == ' ' || body[i] == '\n' ||
	    body[i] == '\r' || body[i] == '\t'); i++)
		;
	if (i == len || body[i] != '{') {
		reply_error(out, 400, "body is not a JSON object", NULL);
		return -1;
	}
	for (i = 0; i < ARRAY_SIZE(f); i++)
		if (f[i].count > 1) {
			reply_error(out, 400, "duplicate field", f[i].path);
			return -1;
		}
	if (f[0].type != JT_STRING || jscan_string(&f[0], &r->request_id,
	    &n) < 0 || n == 0 || n > MAX_REQUEST_ID) {
		reply_error(out, 400, "requestId must be a non-empty string "
		    "of at most 256 bytes", "requestId");
		goto fail;
	}
	if (f[1].type != JT_NUMBER || jscan_int(&f[1], &r->iteration) < 0 ||
	    r->iteration < 0 || r->iteration > 1000000000) {
		reply_error(out, 400, "iteration must be an integer >= 0",
		    "iteration");
		goto fail;
	}
	if (f[2].type != JT_ABSENT && f[2].type != JT_NULL &&
	    (f[2].type != JT_STRING || jscan_string(&f[2], &r->model,
	    &n) < 0 || n > MAX_MODEL)) {
		reply_error(out, 400, "model must be a string", "model");
		goto fail;
	}
	if (r->model != NULL && r->model[0] == '\0') {
		free(r->model);
		r->model = NULL;
	}
	if (f[3].type != JT_NUMBER || jscan_int(&f[3], &r->tokens) < 0 ||
	    r->tokens < 0 || r->tokens > MAX_TOKENS_USED) {
		reply_error(out, 400, "tokensUsed must be an integer between "
		    "0 and 10^12", "tokensUsed");
		goto fail;
	}
	if (f[4].type != JT_NUMBER || meter_parse_usd(f[4].start, f[4].len,
	    MAX_COST_MICRO, &r->cost) < 0) {
		reply_error(out, 400, "costUSD must be a number between 0 and "
		    "1000000", "costUSD");
		goto fail;
	}
	return 0;
fail:
	req_release(r);
	return -1;
}

/* ------------------------------------------------------------ tokens */

static const char *
bearer(const char *authorization)
{
	if (authorization == NULL)
		return NULL;
	while (*authorization == ' ')
		authorization++;
	if (strncasecmp(authorization, "Bearer ", 7) != 0)
		return NULL;
	authorization += 7;
	while (*authorization == ' ')
		authorization++;
	return *authorization ? authorization : NULL;
}

/*
 * Verify the token's signature and caveats (not its model, not its
 * revocation: those need the task). On success *mac holds it.
 */
static int
authenticate(struct meter *m, const char *authorization,
    struct macaroon **mac, struct meter_reply *out)
{
	const char *token = bearer(authorization);
	struct macaroon_context ctx;
	const char *reason = NULL;
	struct macaroon *t = NULL;
	int rc;

	if (token == NULL) {
		reply_error(out, 401, "missing token", NULL);
		return -1;
	}
	rc = macaroon_deserialize(token, strlen(token), &t, NULL);
	if (rc < 0) {
		reply_error(out, 401, macaroon_strerror(rc), NULL);
		return -1;
	}
	memset(&ctx, 0, sizeof(ctx));
	/* the token names its task; the caveats must then agree */
	ctx.task_id = macaroon_value(t, "task_id");
	ctx.namespace = macaroon_value(t, "namespace");
	ctx.model = NULL;
	ctx.now = now_unix();
	if (ctx.task_id == NULL || ctx.namespace == NULL) {
		macaroon_free(t);
		reply_error(out, 401, "caveat not met: task_id", NULL);
		return -1;
	}
	rc = macaroon_verify(m->key, sizeof(m->key), t, &ctx, &reason);
	if (rc < 0) {
		macaroon_free(t);
		reply_error(out, 401, reason, NULL);
		return -1;
	}
	*mac = t;
	return 0;
}

/* --------------------------------------------------------- task state */

static json_t *
obj_child(json_t *o, const char *k)
{
	json_t *c = json_object_get(o, k);

	if (!json_is_object(c)) {
		c = json_object();
		json_object_set_new(o, k, c);
	}
	return c;
}

static const char *
task_phase(const json_t *task)
{
	return json_string_value(json_object_get(json_object_get(task,
	    "status"), "phase"));
}

static int
task_live(const json_t *task)
{
	const char *p = task_phase(task);

	return p != NULL && (strcmp(p, "Provisioning") == 0 ||
	    strcmp(p, "Active") == 0);
}

/* The index entry of id in the index Secret (NULL when absent). */
static json_t *
index_entry(const json_t *index, const char *id)
{
	const char *v = json_string_value(json_object_get(json_object_get(
	    index, "data"), id));
	unsigned char *raw = NULL;
	size_t n;
	json_t *j;

	if (v == NULL || base64_decode(v, strlen(v), &raw, &n) < 0)
		return NULL;
	j = json_loadb((const char *)raw, n, 0, NULL);
	free(raw);
	return j;
}

static void
index_set(json_t *index, const char *id, const json_t *entry)
{
	char *text = json_dumps(entry, JSON_COMPACT | JSON_SORT_KEYS);
	char *b64 = base64_encode((const unsigned char *)text, strlen(text),
	    0, 1);

	json_object_set_new(obj_child(index, "data"), id, json_string(b64));
	free(b64);
	free(text);
}

/* A JT_STRING field that is exactly s (compared as written, unescaped). */
static int
field_is(const struct jfield *f, const char *s)
{
	size_t n = strlen(s);

	return f->type == JT_STRING && f->count == 1 && f->len == n &&
	    memcmp(f->start, s, n) == 0;
}

/*
 * Whether jansson reads the JSON text (valid for jscan) as jscan does: it
 * holds no escape (jansson refuses a \u0000 that jscan takes) and no
 * number (jansson refuses one out of the range of json_int_t or double).
 * Without escapes a string is the run between two quotes. The entries
 * the daemon writes hold strings alone.
 */
static int
scan_agrees(const char *text, size_t n)
{
	size_t i;
	int in_string = 0;

	for (i = 0; i < n; i++) {
		if (text[i] == '\\')
			return 0;
		if (text[i] == '"')
			in_string = !in_string;
		else if (!in_string && (text[i] == '-' ||
		    (text[i] >= '0' && text[i] <= '9')))
			return 0;
	}
	return 1;
}

/*
 * Whether the index names token id as active for task. Every charge asks,
 * so the entry is scanned in place (jscan on the decoded text, no tree);
 * an entry with an escape or a number, which jansson might refuse, or a
 * duplicate key takes the parsing path, which is the reference (revocation
 * reads the entry with it): an entry it refuses is not active.
 */
static int
token_active(const json_t *index, const char *id, const char *task,
    const json_t *obj)
{
	const char *v = json_string_value(json_object_get(json_object_get(
	    index, "data"), id));
	const char *uid = json_string_value(json_object_get(json_object_get(
	    obj, "metadata"), "uid"));
	struct jfield f[3] = { { .path = "state" }, { .path = "task" },
	    { .path = "taskUid" } };
	unsigned char *raw = NULL;
	const char *err;
	json_t *e;
	size_t n;
	int ok;

	if (v == NULL || base64_decode(v, strlen(v), &raw, &n) < 0)
		return 0;
	if (jscan((const char *)raw, n, f, 3, 8, &err) < 0) {
		free(raw);
		return 0;
	}
	/* an entry that names the task's uid names this very task */
	if (scan_agrees((const char *)raw, n) && f[0].count <= 1 &&
	    f[1].count <= 1 && f[2].count <= 1) {
		ok = field_is(&f[0], "active") && field_is(&f[1], task) &&
		    (f[2].type == JT_ABSENT || uid == NULL ||
		    field_is(&f[2], uid));
		free(raw);
		return ok;
	}
	e = json_loadb((const char *)raw, n, 0, NULL);
	free(raw);
	ok = e != NULL && json_is_string(json_object_get(e, "state")) &&
	    strcmp(json_string_value(json_object_get(e, "state")),
	    "active") == 0 && json_string_value(json_object_get(e, "task")) !=
	    NULL && strcmp(json_string_value(json_object_get(e, "task")),
	    task) == 0 && (json_object_get(e, "taskUid") == NULL ||
	    uid == NULL || (json_is_string(json_object_get(e, "taskUid")) &&
	    strcmp(json_string_value(json_object_get(e, "taskUid")), uid) ==
	    0));
	json_decref(e);
	return ok;
}

/*
 * The same check on the stored text of the index Secret, without parsing
 * all of it: one scan for data.<id> (ids are hex: no dots).
 */
/*
 * Mark id revoked in index (JSON of the Secret); 1 if it changed. An
 * entry that does not read as a JSON object (it authenticates nothing) is
 * replaced by a revoked one, so that no reader can take it for active.
 */
static int
index_revoke(json_t *index, const char *id)
{
	json_t *e;
	char ts[32];

	if (json_object_get(json_object_get(index, "data"), id) == NULL)
		return 0;
	e = index_entry(index, id);
	if (!json_is_object(e)) {
		json_decref(e);
		e = json_object();
	}
	if (strcmp(json_string_value(json_object_get(e, "state")) ?
	    json_string_value(json_object_get(e, "state")) : "",
	    "revoked") == 0) {
		json_decref(e);
		return 0;
	}
	time_rfc3339(now_unix(), ts);
	json_object_set_new(e, "state", json_string("revoked"));
	json_object_set_new(e, "revokedAt", json_string(ts));
	index_set(index, id, e);
	json_decref(e);
	return 1;
}

static json_t *
new_index(const char *ns)
{
	return json_pack("{s:s,s:s,s:{s:s,s:s,s:{s:s}},s:s,s:{}}",
	    "apiVersion", "v1", "kind", "Secret", "metadata", "name",
	    METER_INDEX_SECRET, "namespace", ns, "labels",
	    "app.kubernetes.io/managed-by", "diverged", "type", "Opaque",
	    "data");
}

/* ------------------------------------------------------------- charge */

struct charge {
	struct meter *m;
	const struct meter_req *req;
	const struct macaroon *mac;
	const char *id;		/* token identifier */
	const char *task_name;
	const char *ns;
	int token_ok;		/* active in the index, for this task */
	/* results */
	int suspended_now;	/* this call suspended the task */
	int charged;		/* this call was added to the totals */
	const char *suspend_reason;	/* static, when suspended_now */
	struct meter_reply reply;
	int done;		/* REST lanes */
	int rc;
};

struct totals {
	int64_t tokens;
	int64_t cost;
	int64_t iteration;
	int64_t max_iterations;
};

static void
read_totals(const json_t *task, struct totals *t)
{
	const json_t *st = json_object_get(task, "status");

	t->tokens = json_integer_value(json_object_get(st, "tokensConsumed"));
	t->cost = usd_string(json_string_value(json_object_get(st,
	    "costUSD")));
	t->iteration = json_integer_value(json_object_get(st, "iteration"));
	t->max_iterations = json_integer_value(json_object_get(json_object_get(
	    task, "spec"), "maxIterations"));
}

static void
reply_totals(struct meter_reply *out, int status, const json_t *task,
    const char *reason, int charged)
{
	struct totals t;
	struct buf b;
	char cost[32];
	const char *guidance = json_string_value(json_object_get(
	    json_object_get(json_object_get(task, "metadata"), "annotations"),
	    "divergedev.com/guidance"));
	const char *preview = json_string_value(json_object_get(
	    json_object_get(task, "status"), "previewUrl"));

	read_totals(task, &t);
	usd_number(t.cost, cost);
	/*
	 * room for the worst case (every byte of the guidance and the URL
	 * escaped as \u00XX): a reply is never cut short, however large the
	 * annotation
	 */
	buf_init(&b, 4096 + 6 * ((guidance ? strlen(guidance) : 0) +
	    (preview ? strlen(preview) : 0)));
	/* "charged" is ours: whether this call was added to the totals */
	buf_printf(&b, "{\"allowed\":%s,\"suspended\":%s,\"charged\":%s,",
	    status == 200 ? "true" : "false",
	    status == 200 ? "false" : "true", charged ? "true" : "false");
	if (reason != NULL) {
		buf_addstr(&b, "\"reason\":");
		jscan_escape(&b, reason);
		buf_addstr(&b, ",");
	}
	buf_printf(&b, "\"totalTokensUsed\":%lld,\"totalCostUSD\":%s,"
	    "\"iteration\":%lld,\"maxIterations\":%lld,\"guidance\":",
	    (long long)t.tokens, cost, (long long)t.iteration,
	    (long long)t.max_iterations);
	if (guidance != NULL)
		jscan_escape(&b, guidance);
	else
		buf_addstr(&b, "null");
	buf_addstr(&b, ",\"previewUrl\":");
	if (preview != NULL)
		jscan_escape(&b, preview);
	else
		buf_addstr(&b, "null");
	buf_addstr(&b, "}");
	out->status = status;
	out->body = buf_detach(&b, NULL);
	out->reason = reason;
}

static int
ring_has(const json_t *task, const char *id)
{
	const json_t *ring = json_object_get(json_object_get(task, "status"),
	    "lastMeterRequestIds");
	size_t i, n = strlen(id);
	json_t *v;

	/*
	 * ids of one agent share long prefixes and differ at the end (a
	 * counter): lengths first, then the last byte, then memcmp
	 */
	json_array_foreach((json_t *)ring, i, v)
		if (json_is_string(v) && json_string_length(v) == n &&
		    (n == 0 || json_string_value(v)[n - 1] == id[n - 1]) &&
		    memcmp(json_string_value(v), id, n) == 0)
			return 1;
	return 0;
}

static int
ring_last_is(const json_t *task, const char *id)
{
	const json_t *ring = json_object_get(json_object_get(task, "status"),
	    "lastMeterRequestIds");
	size_t n = json_array_size(ring);

	return n > 0 && json_string_value(json_array_get(ring, n - 1)) &&
	    strcmp(json_string_value(json_array_get(ring, n - 1)), id) == 0;
}

static int
model_allowed(const struct charge *c, const json_t *task)
{
	const json_t *caps = json_object_get(json_object_get(task, "spec"),
	    "capabilities");
	const char *model = c->req->model;
	size_t i;
	json_t *v;
	int ok;

	/* a call names its model (DESIGN 6, step 3) */
	if (model == NULL || *model == '\0')
		return 0;
	/*
	 * every models caveat of the token: one a holder appended to narrow
	 * it counts too, whatever the first said (no caveat: any model)
	 */
	if (!macaroon_allows_model(c->mac, model))
		return 0;
	/* spec.capabilities, when it lists any */
	if (json_array_size(caps) == 0)
		return 1;
	ok = 0;
	json_array_foreach((json_t *)caps, i, v)
		if (macaroon_model_match(json_string_value(v), model))
			ok = 1;
	return ok;
}

static int64_t
effective(int64_t spec, int have_caveat, int64_t caveat, int64_t dflt)
{
	if (spec > 0)
		return spec;
	if (have_caveat)
		return caveat;
	return dflt;
}

/*
 * The whole decision, on copies of the task and the index: returns 1 when
 * task (and index) were changed and must be written, 0 when nothing is to
 * be written (c->reply is then final), and fills c->reply either way.
 */
static int
charge_apply(struct charge *c, json_t *task)
{
	const struct meter_req *r = c->req;
	json_t *status, *ring, *spec;
	struct totals t;
	int64_t max_cost, max_tokens, caveat = 0;
	int have;
	const char *reason = NULL;
	char cost[32];

	c->charged = 0;
	/* 2: revoked or not live (but the retry of the suspending call) */
	if (!c->token_ok || !task_live(task)) {
		const char *phase = task_phase(task);
		const char *why = json_string_value(json_object_get(
		    json_object_get(task, "status"), "reason"));

		if (phase != NULL && strcmp(phase, "Paused") == 0 &&
		    why != NULL && strcmp(why, "BudgetExceeded") == 0 &&
		    ring_last_is(task, r->request_id)) {
			const char *msg = json_string_value(json_object_get(
			    json_object_get(task, "status"), "message"));

			/* a literal: the reply outlives the task (reason) */
			reply_totals(&c->reply, 429, task, msg != NULL &&
			    strcmp(msg, "max iterations exceeded") == 0 ?
			    "max iterations exceeded" : "budget exceeded", 0);
			return 0;
		}
		reply_error(&c->reply, 401, !task_live(task) ?
		    "task not live" : "revoked", NULL);
		return 0;
	}
	/* 3: the model */
	if (!model_allowed(c, task)) {
		reply_error(&c->reply, 403, r->model == NULL ?
		    "model required" : "model not allowed", "model");
		return 0;
	}
	/* 4: a retry */
	if (ring_has(task, r->request_id)) {
		reply_totals(&c->reply, 200, task, NULL, 0);
		return 0;
	}
	/* 5: charge */
	read_totals(task, &t);
	if (t.tokens > INT64_MAX - r->tokens || t.cost > INT64_MAX - r->cost) {
		reply_error(&c->reply, 400, "totals would overflow", NULL);
		return 0;
	}
	t.tokens += r->tokens;
	t.cost += r->cost;
	if (r->iteration > t.iteration)
		t.iteration = r->iteration;
	status = obj_child(task, "status");
	json_object_set_new(status, "tokensConsumed", json_integer(t.tokens));
	meter_format_usd(t.cost, cost);
	json_object_set_new(status, "costUSD", json_string(cost));
	json_object_set_new(status, "iteration", json_integer(t.iteration));
	ring = json_object_get(status, "lastMeterRequestIds");
	if (!json_is_array(ring)) {
		ring = json_array();
		json_object_set_new(status, "lastMeterRequestIds", ring);
	}
	json_array_append_new(ring, json_string(r->request_id));
	while (json_array_size(ring) > RING)
		json_array_remove(ring, 0);
	/* 6: effective budgets */
	spec = json_object_get(task, "spec");
	have = macaroon_max_cost_usd(c->mac, &caveat) == 0;
	max_cost = effective(usd_string(json_string_value(json_object_get(
	    spec, "budgetUSD"))), have, caveat, c->m->cfg.
	    default_budget_usd_micro);
	have = macaroon_max_tokens(c->mac, &caveat) == 0;
	max_tokens = effective(json_integer_value(json_object_get(spec,
	    "budgetTokens")), have, caveat, c->m->cfg.default_budget_tokens);
	if ((max_cost > 0 && t.cost > max_cost) ||
	    (max_tokens > 0 && t.tokens > max_tokens))
		reason = "budget exceeded";
	else if (t.max_iterations > 0 && t.iteration > t.max_iterations)
		reason = "max iterations exceeded";
	if (reason != NULL) {
		char ts[32];

		json_object_set_new(status, "phase", json_string("Paused"));
		json_object_set_new(status, "reason",
		    json_string("BudgetExceeded"));
		json_object_set_new(status, "message", json_string(reason));
		/* spec may be shared with the store's copy (task_cow) */
		if (json_is_object(json_object_get(task, "spec")))
			json_object_set_new(task, "spec", json_copy(
			    json_object_get(task, "spec")));
		json_object_set_new(obj_child(task, "spec"), "suspended",
		    json_true());
		time_rfc3339(now_unix(), ts);
		(void)ts;
		/* the caller revokes the token with the same write */
		c->token_ok = 0;
		c->suspended_now = 1;
		c->suspend_reason = reason;
		c->charged = 1;
		reply_totals(&c->reply, 429, task, reason, 1);
		return 1;
	}
	/* 7 */
	c->charged = 1;
	reply_totals(&c->reply, 200, task, NULL, 1);
	return 1;
}

/* Embedded: one transaction over the task and the index. */
/*
 * The task to charge, made from the store's shared copy: new containers
 * along the paths a charge writes (the object, its metadata, its status
 * and the status's request-id ring), everything else shared and left
 * alone (charge_apply copies spec before it suspends).
 */
static json_t *
task_cow(const json_t *cur)
{
	json_t *t = json_copy((json_t *)cur), *v, *ring;

	if (t == NULL)
		return NULL;
	if ((v = json_object_get(cur, "metadata")) != NULL)
		json_object_set_new(t, "metadata", json_copy(v));
	if ((v = json_object_get(cur, "status")) != NULL) {
		v = json_copy(v);
		if ((ring = json_object_get(v, "lastMeterRequestIds")) != NULL)
			json_object_set_new(v, "lastMeterRequestIds",
			    json_copy(ring));
		json_object_set_new(t, "status", v);
	}
	return t;
}

static int
charge_txn(struct k8s_txn *tx, void *arg, struct k8s_status *st)
{
	struct charge *c = arg;
	json_t *task = NULL, *index = NULL, *copy, *cur = NULL;
	int rc;

	meter_reply_release(&c->reply);
	c->suspended_now = 0;
	rc = k8s_txn_peek(tx, &K8S_AGENTTASK, c->ns, c->task_name, &cur, st);
	if (rc == 0) {
		task = task_cow(cur);
		json_decref(cur);
	}
	if (rc == K8S_ENOTFOUND) {
		reply_error(&c->reply, 401, "task not live", NULL);
		return 0;
	}
	if (rc < 0)
		return rc;
	/* the index is large and shared: looked at, copied only to change */
	rc = k8s_txn_peek(tx, &K8S_SECRET, c->ns, METER_INDEX_SECRET, &index,
	    st);
	if (rc == K8S_ENOTFOUND) {
		k8s_status_release(st);
		rc = 0;
	}
	if (rc < 0) {
		json_decref(task);
		return rc;
	}
	c->token_ok = index != NULL && token_active(index, c->id,
	    c->task_name, task);
	if (charge_apply(c, task)) {
		/* the put takes task */
		rc = k8s_txn_put(tx, &K8S_AGENTTASK, c->ns, task, NULL, st);
		task = NULL;
		if (rc == 0 && c->suspended_now && index != NULL) {
			copy = json_deep_copy(index);
			if (index_revoke(copy, c->id))
				rc = k8s_txn_put(tx, &K8S_SECRET, c->ns, copy,
				    NULL, st);
			else
				json_decref(copy);
		}
	}
	json_decref(task);
	json_decref(index);
	return rc;
}

/* Jittered wait before retrying a lost race, growing to about 20 ms. */
static void
conflict_pause(int tries)
{
	uint32_t r = 0;
	int64_t cap = tries < 4 ? 2 << tries : 20;

	random_bytes(&r, sizeof(r));
	sleep_ms((int64_t)(r % (uint32_t)cap) + 1);
}

/*
 * REST: the charges waiting for one task are applied together: one read of
 * the task and its index, every charge in order on that copy, one status
 * write with the resourceVersion read; a 409 (someone else wrote the task)
 * starts the round again from a fresh read. One writer per task in this
 * process, so concurrent calls cost one round trip each, not a storm of
 * conflicts.
 */
static int
charge_round(struct meter *m, struct charge **cs, size_t n,
    struct k8s_status *st)
{
	struct k8s_api *api = m->cfg.store;
	const char *ns = cs[0]->ns, *name = cs[0]->task_name;
	int tries, rc = K8S_ECONFLICT;
	size_t i;

	for (tries = 0; tries < m->cfg.max_conflict_retries; tries++) {
		json_t *task = NULL, *index = NULL;
		int write = 0, suspended = 0;

		rc = k8s_get(api, &K8S_AGENTTASK, ns, name, &task, st);
		if (rc == K8S_ENOTFOUND) {
			k8s_status_release(st);
			for (i = 0; i < n; i++) {
				meter_reply_release(&cs[i]->reply);
				reply_error(&cs[i]->reply, 401,
				    "task not live", NULL);
			}
			return 0;
		}
		if (rc < 0)
			return rc;
		rc = k8s_get(api, &K8S_SECRET, ns, METER_INDEX_SECRET, &index,
		    st);
		if (rc == K8S_ENOTFOUND) {
			k8s_status_release(st);
			index = new_index(ns);
		} else if (rc < 0) {
			json_decref(task);
			return rc;
		}
		for (i = 0; i < n; i++) {
			meter_reply_release(&cs[i]->reply);
			cs[i]->suspended_now = 0;
			cs[i]->token_ok = token_active(index, cs[i]->id,
			    cs[i]->task_name, task);
			write |= charge_apply(cs[i], task);
			suspended |= cs[i]->suspended_now;
			/* later charges of this round see the revocation */
			if (cs[i]->suspended_now)
				index_revoke(index, cs[i]->id);
		}
		json_decref(index);
		rc = 0;
		if (write)
			rc = k8s_update_status(api, &K8S_AGENTTASK, ns, name,
			    task, NULL, st);
		json_decref(task);
		if (rc == K8S_ECONFLICT) {
			k8s_status_release(st);
			conflict_pause(tries);
			continue;
		}
		if (rc < 0)
			return rc;
		for (i = 0; suspended && i < n; i++) {
			json_t *p;
			char *cause = NULL;

			if (!cs[i]->suspended_now)
				continue;
			p = json_pack("{s:{s:b}}", "spec", "suspended", 1);
			k8s_patch(api, &K8S_AGENTTASK, ns, name, 0, p, NULL,
			    NULL);
			json_decref(p);
			if (meter_revoke_token(m, ns, cs[i]->id, &cause) < 0) {
				log_kv(LOG_ERROR, "meter: revocation failed",
				    "task", name, "error", cause, NULL);
				free(cause);
			}
		}
		return 0;
	}
	if (st != NULL && st->message == NULL)
		k8s_status_set(st, K8S_ECONFLICT, "too many conflicting writes",
		    NULL);
	return rc;
}

/* The charges of one task waiting for its writer. */
struct lane {
	struct lane *next;
	char *key;		/* namespace/name */
	struct charge **queue;
	size_t n, cap;
	int busy;
};

static int
charge_rest(struct meter *m, struct charge *c, struct k8s_status *st)
{
	char *key = xasprintf("%s/%s", c->ns, c->task_name);
	struct lane *l, **pl;
	int rc = 0;

	pthread_mutex_lock(&m->mu);
	for (l = m->lanes; l != NULL; l = l->next)
		if (strcmp(l->key, key) == 0)
			break;
	if (l == NULL) {
		l = xcalloc(1, sizeof(*l));
		l->key = key;
		key = NULL;
		l->next = m->lanes;
		m->lanes = l;
	}
	free(key);
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 16;
		l->queue = xrealloc(l->queue, l->cap * sizeof(*l->queue));
	}
	l->queue[l->n++] = c;
	c->done = 0;
	/* done first: once done, the lane may be gone */
	while (!c->done && l->busy)
		pthread_cond_wait(&m->cv, &m->mu);
	if (c->done) {
		rc = c->rc;
		goto out;
	}
	/* this thread writes for the lane until it is empty */
	l->busy = 1;
	while (l->n > 0) {
		struct charge **batch = l->queue;
		size_t n = l->n, i;
		struct k8s_status bst = { 0 };
		int brc;

		l->queue = NULL;
		l->n = l->cap = 0;
		pthread_mutex_unlock(&m->mu);
		brc = charge_round(m, batch, n, &bst);
		pthread_mutex_lock(&m->mu);
		for (i = 0; i < n; i++) {
			batch[i]->rc = brc;
			batch[i]->done = 1;
			if (batch[i] == c && st != NULL) {
				k8s_status_release(st);
				*st = bst;
				memset(&bst, 0, sizeof(bst));
			}
		}
		k8s_status_release(&bst);
		free(batch);
		pthread_cond_broadcast(&m->cv);
	}
	l->busy = 0;
	rc = c->rc;
	/* an idle lane goes away */
	for (pl = &m->lanes; *pl != NULL; pl = &(*pl)->next)
		if (*pl == l) {
			*pl = l->next;
			free(l->key);
			free(l->queue);
			free(l);
			break;
		}
out:
	pthread_mutex_unlock(&m->mu);
	return rc;
}

/* One charge from its request to its reply. */
struct charge_job {
	struct charge c;
	struct meter_req req;
	struct macaroon *mac;
	meter_done_fn done;	/* async */
	void *done_arg;
};

/*
 * Steps 1 and 2 (the body, the token) and the names the charge needs:
 * 0 when the charge is to run, -1 when *out already holds the reply.
 */
static int
charge_prepare(struct meter *m, const char *authorization, const char *body,
    size_t len, struct charge_job *j, struct meter_reply *out)
{
	size_t idlen;

	memset(out, 0, sizeof(*out));
	if (parse_body(body, len, &j->req, out) < 0)
		return -1;
	if (authenticate(m, authorization, &j->mac, out) < 0)
		return -1;
	j->c.m = m;
	j->c.req = &j->req;
	j->c.mac = j->mac;
	j->c.id = macaroon_identifier(j->mac, &idlen);
	j->c.task_name = macaroon_value(j->mac, "task_id");
	j->c.ns = macaroon_value(j->mac, "namespace");
	if (strlen(j->c.id) != idlen) {
		reply_error(out, 401, "malformed token", NULL);
		return -1;
	}
	return 0;
}

/* The reply once the charge ran (rc < 0: the store failed). */
static void
charge_reply(struct charge_job *j, int rc, const struct k8s_status *st,
    struct meter_reply *out)
{
	struct charge *c = &j->c;

	if (rc < 0) {
		meter_reply_release(&c->reply);
		log_kv(LOG_ERROR, "meter: store failed", "task", c->task_name,
		    "namespace", c->ns, "error", st->message, NULL);
		reply_error(out, 503, "the store is unavailable, retry", NULL);
		return;
	}
	if (c->suspended_now) {
		char labels[64];

		log_kv(LOG_INFO, "task suspended by the meter", "task",
		    c->task_name, "namespace", c->ns, "request",
		    j->req.request_id, NULL);
		snprintf(labels, sizeof(labels), "reason=\"%s\"",
		    c->suspend_reason);
		metrics_inc("diverge_meter_suspensions_total", labels, 1);
	}
	if (c->charged) {
		atomic_fetch_add_explicit(&n_charges, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&n_tokens,
		    (uint_fast64_t)j->req.tokens, memory_order_relaxed);
		atomic_fetch_add_explicit(&n_micro_usd,
		    (uint_fast64_t)j->req.cost, memory_order_relaxed);
	} else if (c->reply.status == 200) {
		atomic_fetch_add_explicit(&n_duplicates, 1,
		    memory_order_relaxed);
	}
	*out = c->reply;
	memset(&c->reply, 0, sizeof(c->reply));
}

static void
charge_job_free(struct charge_job *j)
{
	meter_reply_release(&j->c.reply);
	macaroon_free(j->mac);
	req_release(&j->req);
	free(j);
}

/* Charge one reported LLM call. */
void
meter_charge(struct meter *m, const char *authorization, const char *body,
    size_t len, struct meter_reply *out)
{
	struct charge_job *j = xcalloc(1, sizeof(*j));
	struct k8s_status st = { 0 };
	int rc;

	if (charge_prepare(m, authorization, body, len, j, out) == 0) {
		if (k8s_is_embedded(m->cfg.store))
			rc = k8s_embedded_transact(m->cfg.store, charge_txn,
			    &j->c, &st);
		else
			rc = charge_rest(m, &j->c, &st);
		charge_reply(j, rc, &st, out);
	}
	count_reply("meter", out);
	k8s_status_release(&st);
	charge_job_free(j);
}

static void
charge_async_done(void *arg, int rc, struct k8s_status *st)
{
	struct charge_job *j = arg;
	struct meter_reply out;

	charge_reply(j, rc, st, &out);
	count_reply("meter", &out);
	j->done(j->done_arg, &out);
	meter_reply_release(&out);
	charge_job_free(j);
}

int
meter_is_async(const struct meter *m)
{
	return k8s_is_embedded(m->cfg.store);
}

void
meter_charge_async(struct meter *m, const char *authorization,
    const char *body, size_t len, meter_done_fn done, void *done_arg)
{
	struct charge_job *j = xcalloc(1, sizeof(*j));
	struct meter_reply out;

	j->done = done;
	j->done_arg = done_arg;
	if (charge_prepare(m, authorization, body, len, j, &out) < 0) {
		count_reply("meter", &out);
		done(done_arg, &out);
		meter_reply_release(&out);
		charge_job_free(j);
		return;
	}
	k8s_embedded_transact_async(m->cfg.store, charge_txn, &j->c,
	    charge_async_done, j);
}

/* ----------------------------------------------------------- complete */

/*
 * The runner's report lands in status.result, where people and tools
 * read it as a commit, a branch and a link: each must be what its name
 * says, not text an agent chose (a javascript: link, a terminal escape).
 */

/* A commit id: 4 to 64 hex digits (short SHA-1 to full SHA-256). */
static int
commit_ok(const char *s)
{
	size_t n = strlen(s);

	return n >= 4 && n <= 64 && strspn(s, "0123456789abcdefABCDEF") == n;
}

/* A branch name that git check-ref-format --branch accepts. */
static int
branch_ok(const char *s)
{
	size_t n = strlen(s), i;

	if (n == 0 || s[0] == '-' || s[0] == '/' || s[n - 1] == '/' ||
	    s[n - 1] == '.' || strcmp(s, "@") == 0 || strstr(s, "..") ||
	    strstr(s, "//") || strstr(s, "@{") || strstr(s, "/.") ||
	    s[0] == '.' || (n >= 5 && strcmp(s + n - 5, ".lock") == 0) ||
	    strstr(s, ".lock/"))
		return 0;
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c <= ' ' || c == 0x7f || strchr("~^:?*[\\", c) != NULL)
			return 0;
	}
	return 1;
}

/*
 * The host[:port] of an http(s) URL (*len bytes at the return), or NULL
 * when u is not one.
 */
static const char *
url_host(const char *u, size_t *len)
{
	const char *h;

	if (strncasecmp(u, "https://", 8) == 0)
		h = u + 8;
	else if (strncasecmp(u, "http://", 7) == 0)
		h = u + 7;
	else
		return NULL;
	*len = strcspn(h, "/?#");
	return *len > 0 ? h : NULL;
}

/*
 * A link to show: http(s), a host without user info, printable ASCII of
 * RFC 3986 (no space, quote or angle bracket to break out of a link).
 */
static int
pr_url_ok(const char *s)
{
	static const char ok[] = "-._~:/?#[]@!$&'()*+,;=%";
	const char *h;
	size_t n, i;

	h = url_host(s, &n);
	if (h == NULL || memchr(h, '@', n) != NULL)
		return 0;
	for (i = 0; s[i]; i++) {
		unsigned char c = (unsigned char)s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		    (c >= '0' && c <= '9') || strchr(ok, c) != NULL))
			return 0;
	}
	return 1;
}

struct completion {
	struct meter *m;
	const char *id, *task_name, *ns;
	int succeeded;
	char *message, *commit, *branch, *pr_url;
	struct meter_reply reply;
};

/*
 * Whether url is on the host of the task's spec.repository.url (true
 * when that is no http(s) URL: nothing to compare with).
 */
static int
same_host(const char *url, const json_t *task)
{
	const char *repo = json_string_value(json_object_get(json_object_get(
	    json_object_get(task, "spec"), "repository"), "url"));
	const char *a, *b, *at;
	size_t na, nb;

	if (repo == NULL || (b = url_host(repo, &nb)) == NULL)
		return 1;
	/* user info of the repository URL is not part of the host */
	if ((at = memchr(b, '@', nb)) != NULL) {
		nb -= (size_t)(at + 1 - b);
		b = at + 1;
	}
	a = url_host(url, &na);
	return a != NULL && na == nb && strncasecmp(a, b, na) == 0;
}

static int
complete_apply(struct completion *c, json_t *task, json_t *index)
{
	const char *phase = task_phase(task);
	json_t *status;
	char ts[32];
	int changed = 0;

	if (phase != NULL && (strcmp(phase, "Completed") == 0 ||
	    strcmp(phase, "Failed") == 0)) {
		/* idempotent: the same answer again */
		changed = index_revoke(index, c->id);
		c->reply.status = 200;
		c->reply.body = xasprintf("{\"completed\":true,\"phase\":"
		    "\"%s\"}", phase);
		return changed ? 2 : 0;
	}
	if (!token_active(index, c->id, c->task_name, task) ||
	    !task_live(task)) {
		reply_error(&c->reply, 401, !task_live(task) ? "task not live" :
		    "revoked", NULL);
		return 0;
	}
	if (c->pr_url != NULL && !same_host(c->pr_url, task)) {
		reply_error(&c->reply, 400, "pullRequestUrl must be on the "
		    "host of the task's repository", "pullRequestUrl");
		return 0;
	}
	status = obj_child(task, "status");
	json_object_set_new(status, "phase", json_string(c->succeeded ?
	    "Completed" : "Failed"));
	json_object_set_new(status, "reason", json_string(c->succeeded ?
	    "Succeeded" : "AgentFailed"));
	if (c->message != NULL)
		json_object_set_new(status, "message",
		    json_string(c->message));
	time_rfc3339(now_unix(), ts);
	json_object_set_new(status, "completedAt", json_string(ts));
	if (c->commit != NULL || c->branch != NULL || c->pr_url != NULL) {
		json_t *res = obj_child(status, "result");

		if (c->commit != NULL)
			json_object_set_new(res, "commit",
			    json_string(c->commit));
		if (c->branch != NULL)
			json_object_set_new(res, "branch",
			    json_string(c->branch));
		if (c->pr_url != NULL)
			json_object_set_new(res, "pullRequestUrl",
			    json_string(c->pr_url));
	}
	index_revoke(index, c->id);
	c->reply.status = 200;
	c->reply.body = xasprintf("{\"completed\":true,\"phase\":\"%s\"}",
	    c->succeeded ? "Completed" : "Failed");
	return 1;
}

static int
complete_txn(struct k8s_txn *tx, void *arg, struct k8s_status *st)
{
	struct completion *c = arg;
	json_t *task = NULL, *index = NULL;
	int rc, write;

	meter_reply_release(&c->reply);
	rc = k8s_txn_get(tx, &K8S_AGENTTASK, c->ns, c->task_name, &task, st);
	if (rc == K8S_ENOTFOUND) {
		reply_error(&c->reply, 401, "task not live", NULL);
		return 0;
	}
	if (rc < 0)
		return rc;
	rc = k8s_txn_get(tx, &K8S_SECRET, c->ns, METER_INDEX_SECRET, &index,
	    st);
	if (rc == K8S_ENOTFOUND) {
		index = new_index(c->ns);
		rc = 0;
	}
	if (rc < 0) {
		json_decref(task);
		return rc;
	}
	write = complete_apply(c, task, index);
	/* a put takes its object */
	if (write == 1) {
		rc = k8s_txn_put(tx, &K8S_AGENTTASK, c->ns, task, NULL, st);
		task = NULL;
	}
	if (rc == 0 && write > 0) {
		rc = k8s_txn_put(tx, &K8S_SECRET, c->ns, index, NULL, st);
		index = NULL;
	}
	json_decref(task);
	json_decref(index);
	return rc;
}

static int
complete_rest(struct meter *m, struct completion *c, struct k8s_status *st)
{
	int tries, rc = K8S_ECONFLICT;

	for (tries = 0; tries < m->cfg.max_conflict_retries; tries++) {
		json_t *task = NULL, *index = NULL;
		int write;

		meter_reply_release(&c->reply);
		rc = k8s_get(m->cfg.store, &K8S_AGENTTASK, c->ns, c->task_name,
		    &task, st);
		if (rc == K8S_ENOTFOUND) {
			reply_error(&c->reply, 401, "task not live", NULL);
			return 0;
		}
		if (rc < 0)
			return rc;
		if (k8s_get(m->cfg.store, &K8S_SECRET, c->ns,
		    METER_INDEX_SECRET, &index, NULL) < 0)
			index = new_index(c->ns);
		write = complete_apply(c, task, index);
		json_decref(index);
		rc = 0;
		if (write == 1)
			rc = k8s_update_status(m->cfg.store, &K8S_AGENTTASK,
			    c->ns, c->task_name, task, NULL, st);
		json_decref(task);
		if (rc == K8S_ECONFLICT) {
			k8s_status_release(st);
			continue;
		}
		if (rc == 0 && write > 0)
			meter_revoke_token(m, c->ns, c->id, NULL);
		return rc;
	}
	return rc;
}

static int
opt_string(const struct jfield *f, char **out, size_t max)
{
	size_t n;

	*out = NULL;
	if (f->type == JT_ABSENT || f->type == JT_NULL)
		return 0;
	if (f->type != JT_STRING || jscan_string(f, out, &n) < 0)
		return -1;
	if (n > max) {
		free(*out);
		*out = NULL;
		return -1;
	}
	return 0;
}

/* End a task on the runner's report. */
void
meter_complete(struct meter *m, const char *authorization, const char *body,
    size_t len, struct meter_reply *out)
{
	static const char *const paths[] = { "result", "message", "commit",
	    "branch", "pullRequestUrl" };
	struct jfield f[ARRAY_SIZE(paths)];
	struct completion c;
	struct macaroon *mac = NULL;
	struct k8s_status st = { 0 };
	const char *err;
	char *result = NULL;
	size_t i, idlen;
	int rc;

	memset(out, 0, sizeof(*out));
	memset(&c, 0, sizeof(c));
	for (i = 0; i < ARRAY_SIZE(paths); i++)
		f[i].path = paths[i];
	for (i = 0; i < len && (body[i] == ' ' || body[i] == '\n' ||
	    body[i] == '\r' || body[i] == '\t'); i++)
		;
	if (jscan(body, len, f, ARRAY_SIZE(f), 16, &err) < 0 || i == len ||
	    body[i] != '{') {
		reply_error(out, 400, "body is not a JSON object", NULL);
		count_reply("complete", out);
		return;
	}
	if (opt_string(&f[0], &result, 16) < 0 || result == NULL ||
	    (strcmp(result, "succeeded") != 0 &&
	    strcmp(result, "failed") != 0)) {
		free(result);
		reply_error(out, 400, "result must be \"succeeded\" or "
		    "\"failed\"", "result");
		count_reply("complete", out);
		return;
	}
	c.succeeded = strcmp(result, "succeeded") == 0;
	free(result);
	if (opt_string(&f[1], &c.message, 4096) < 0) {
		reply_error(out, 400, "message must be a string of at most "
		    "4096 bytes", "message");
		goto out;
	}
	if (opt_string(&f[2], &c.commit, 256) < 0 || (c.commit != NULL &&
	    !commit_ok(c.commit))) {
		reply_error(out, 400, "commit must be a commit id (4 to 64 "
		    "hex digits)", "commit");
		goto out;
	}
	if (opt_string(&f[3], &c.branch, 256) < 0 || (c.branch != NULL &&
	    !branch_ok(c.branch))) {
		reply_error(out, 400, "branch must be a valid branch name",
		    "branch");
		goto out;
	}
	if (opt_string(&f[4], &c.pr_url, 2048) < 0 || (c.pr_url != NULL &&
	    !pr_url_ok(c.pr_url))) {
		reply_error(out, 400, "pullRequestUrl must be an http(s) URL",
		    "pullRequestUrl");
		goto out;
	}
	if (authenticate(m, authorization, &mac, out) < 0)
		goto out;
	c.m = m;
	c.id = macaroon_identifier(mac, &idlen);
	c.task_name = macaroon_value(mac, "task_id");
	c.ns = macaroon_value(mac, "namespace");
	if (k8s_is_embedded(m->cfg.store))
		rc = k8s_embedded_transact(m->cfg.store, complete_txn, &c, &st);
	else
		rc = complete_rest(m, &c, &st);
	if (rc < 0) {
		meter_reply_release(&c.reply);
		reply_error(out, 503, "the store is unavailable, retry", NULL);
		goto out;
	}
	*out = c.reply;
	c.reply.body = NULL;
	log_kv(LOG_INFO, "task completion reported", "task", c.task_name,
	    "namespace", c.ns, "result", c.succeeded ? "succeeded" : "failed",
	    NULL);
	if (out->status == 200)
		metrics_inc("diverge_meter_completions_total", c.succeeded ?
		    "result=\"succeeded\"" : "result=\"failed\"", 1);
out:
	count_reply("complete", out);
	k8s_status_release(&st);
	macaroon_free(mac);
	meter_reply_release(&c.reply);
	free(c.message);
	free(c.commit);
	free(c.branch);
	free(c.pr_url);
}

/* -------------------------------------------------------------- index */

/*
 * Read-modify-write of the index Secret of ns with its resourceVersion,
 * retried on 409; create it when missing (AlreadyExists: retry), and
 * again when it went between the read and the update. 0 or the API's
 * negative enum k8s_err: the reconciler tells a refusal for good (403,
 * 422) from one that passes by that code.
 */
static int
index_update(struct meter *m, const char *ns,
    int (*edit)(json_t *index, void *arg), void *arg, char **cause)
{
	struct k8s_status st = { 0 };
	int tries, rc = K8S_ECONFLICT;

	for (tries = 0; tries < m->cfg.max_conflict_retries; tries++) {
		json_t *index = NULL;
		int exists;

		rc = k8s_get(m->cfg.store, &K8S_SECRET, ns, METER_INDEX_SECRET,
		    &index, &st);
		exists = rc == 0;
		if (rc == K8S_ENOTFOUND) {
			index = new_index(ns);
			rc = 0;
		}
		k8s_status_release(&st);
		if (rc < 0)
			break;
		if (edit(index, arg) == 0) {
			json_decref(index);
			return 0;	/* nothing to write */
		}
		if (exists)
			rc = k8s_update(m->cfg.store, &K8S_SECRET, ns,
			    METER_INDEX_SECRET, index, NULL, &st);
		else
			rc = k8s_create(m->cfg.store, &K8S_SECRET, ns, index,
			    NULL, &st);
		json_decref(index);
		if (rc == K8S_ECONFLICT || rc == K8S_EEXISTS ||
		    (exists && rc == K8S_ENOTFOUND)) {
			k8s_status_release(&st);
			continue;
		}
		break;
	}
	if (rc < 0 && cause != NULL)
		*cause = xasprintf("token index secret '%s/%s': %s", ns,
		    METER_INDEX_SECRET, st.message ? st.message :
		    "too many conflicting writers");
	k8s_status_release(&st);
	return rc < 0 ? rc : 0;
}

struct issue_arg {
	const char *id;
	const char *task;
	const char *uid;	/* the task's metadata.uid, or NULL */
	int64_t expires;
};

static int
edit_issue(json_t *index, void *arg)
{
	struct issue_arg *a = arg;
	char ts[32], ex[32];
	json_t *e;

	time_rfc3339(now_unix(), ts);
	time_rfc3339(a->expires, ex);
	e = json_pack("{s:s,s:s,s:s,s:s}", "task", a->task, "state", "active",
	    "issuedAt", ts, "expiresAt", ex);
	/* the task, not only its name: one re-created under it is another */
	if (a->uid != NULL)
		json_object_set_new(e, "taskUid", json_string(a->uid));
	index_set(index, a->id, e);
	json_decref(e);
	return 1;
}

static void
add_caveat(char ***v, size_t *n, const char *key, const char *value)
{
	if (value == NULL || *value == '\0')
		return;
	*v = xrealloc(*v, (*n + 1) * sizeof(char *));
	(*v)[(*n)++] = xasprintf("%s = %s", key, value);
}

static char *
join_list(const json_t *arr)
{
	struct buf b;
	size_t i;
	json_t *v;

	if (json_array_size(arr) == 0)
		return NULL;
	buf_init(&b, 8192);
	json_array_foreach((json_t *)arr, i, v) {
		if (!json_is_string(v))
			continue;
		if (b.len > 0)
			buf_addstr(&b, ",");
		buf_addstr(&b, json_string_value(v));
	}
	return buf_detach(&b, NULL);
}

/* Mint and record a token for a task. */
int
meter_issue_token(struct meter *m, const json_t *task, int64_t expires,
    char **token_out, char **id_out, char **cause)
{
	const json_t *spec = json_object_get(task, "spec");
	const json_t *repo = json_object_get(spec, "repository");
	const char *name = k8s_meta_str(task, "name");
	const char *ns = k8s_meta_str(task, "namespace");
	char **cav = NULL, *token = NULL, *list, ex[32], money[32], num[32];
	unsigned char rnd[16];
	char id[33];
	size_t n = 0, i;
	int64_t usd, tokens;
	struct issue_arg ia;
	int rc;

	if (name == NULL || ns == NULL) {
		*cause = xstrdup("the task has no name or namespace");
		return K8S_EINVALID;
	}
	random_bytes(rnd, sizeof(rnd));
	hex_encode(rnd, sizeof(rnd), id);
	add_caveat(&cav, &n, "task_id", name);
	add_caveat(&cav, &n, "namespace", ns);
	add_caveat(&cav, &n, "repo", json_string_value(json_object_get(repo,
	    "url")));
	add_caveat(&cav, &n, "branch", json_string_value(json_object_get(repo,
	    "workingBranch")));
	list = join_list(json_object_get(spec, "allowedTools"));
	add_caveat(&cav, &n, "tools", list);
	free(list);
	list = join_list(json_object_get(spec, "capabilities"));
	add_caveat(&cav, &n, "models", list);
	free(list);
	/*
	 * Both budgets, always, 0 (unlimited) included: a holder may append
	 * caveats, and one appended to a token that had none would be taken
	 * as its budget (a "max_cost_usd = 0", unlimited, past a default set
	 * later); beside the minted one it is a second value, and refused
	 */
	usd = usd_string(json_string_value(json_object_get(spec,
	    "budgetUSD")));
	if (usd <= 0)
		usd = m->cfg.default_budget_usd_micro;
	meter_format_usd(usd > 0 ? usd : 0, money);
	add_caveat(&cav, &n, "max_cost_usd", money);
	tokens = json_integer_value(json_object_get(spec, "budgetTokens"));
	if (tokens <= 0)
		tokens = m->cfg.default_budget_tokens;
	snprintf(num, sizeof(num), "%lld", (long long)(tokens > 0 ? tokens :
	    0));
	add_caveat(&cav, &n, "max_tokens", num);
	time_rfc3339(expires, ex);
	add_caveat(&cav, &n, "expires", ex);
	rc = macaroon_mint(m->key, sizeof(m->key), id, m->cfg.location,
	    (const char *const *)cav, n, &token, cause);
	for (i = 0; i < n; i++)
		free(cav[i]);
	free(cav);
	if (rc < 0)
		return K8S_EINTERNAL;	/* not the API's: not for good */
	ia.id = id;
	ia.task = name;
	ia.uid = json_string_value(json_object_get(json_object_get(task,
	    "metadata"), "uid"));
	ia.expires = expires;
	rc = index_update(m, ns, edit_issue, &ia, cause);
	if (rc < 0) {
		free(token);
		return rc;
	}
	*token_out = token;
	*id_out = xstrdup(id);
	return 0;
}

static int
edit_revoke(json_t *index, void *arg)
{
	return index_revoke(index, arg);
}

/* Revoke a token id. */
int
meter_revoke_token(struct meter *m, const char *ns, const char *id,
    char **cause)
{
	return index_update(m, ns, edit_revoke, (void *)id, cause);
}

struct revoke_task_arg {
	const char *task;
	const char *keep;
};

static int
edit_revoke_task(json_t *index, void *arg)
{
	struct revoke_task_arg *a = arg;
	const char *k, *task;
	json_t *v, *tmp, *e;
	int changed = 0;

	json_object_foreach_safe(json_object_get(index, "data"), tmp, k, v) {
		if (a->keep != NULL && strcmp(k, a->keep) == 0)
			continue;
		e = index_entry(index, k);
		task = json_string_value(json_object_get(e, "task"));
		if (task != NULL && strcmp(task, a->task) == 0 &&
		    index_revoke(index, k))
			changed = 1;
		json_decref(e);
	}
	return changed;
}

/* Revoke every token of a task but one. */
int
meter_revoke_task_tokens(struct meter *m, const char *ns, const char *task,
    const char *keep, char **cause)
{
	struct revoke_task_arg a = { task, keep };

	return index_update(m, ns, edit_revoke_task, &a, cause);
}

struct prune_arg {
	struct meter *m;
	const char *ns;
	int64_t now;
};

static int
edit_prune(json_t *index, void *arg)
{
	struct prune_arg *p = arg;
	json_t *data = json_object_get(index, "data");
	const char *k;
	json_t *v, *tmp;
	int changed = 0;

	json_object_foreach_safe(data, tmp, k, v) {
		json_t *e = index_entry(index, k);
		const char *task = json_string_value(json_object_get(e,
		    "task"));
		const char *ex = json_string_value(json_object_get(e,
		    "expiresAt"));
		const char *uid = json_string_value(json_object_get(e,
		    "taskUid"));
		json_t *t = NULL;
		int gone = 0, rc = 0;

		if (e != NULL && task != NULL)
			rc = k8s_get(p->m->cfg.store, &K8S_AGENTTASK, p->ns,
			    task, &t, NULL);
		if (e == NULL || task == NULL || rc == K8S_ENOTFOUND) {
			gone = 1;
		} else if (rc == 0 && uid != NULL && (k8s_meta_str(t, "uid") ==
		    NULL || strcmp(uid, k8s_meta_str(t, "uid")) != 0)) {
			/* its task was deleted: this one is made again */
			gone = 1;
		} else if (ex != NULL) {
			char now[32];

			time_rfc3339(p->now - MACAROON_EXPIRES_LEEWAY, now);
			/* RFC 3339 UTC strings compare in time order */
			gone = strcmp(ex, now) < 0;
		}
		json_decref(t);
		json_decref(e);
		if (gone) {
			json_object_del(data, k);
			changed = 1;
		}
	}
	return changed;
}

/* Drop the entries of deleted tasks and expired tokens. */
int
meter_prune_index(struct meter *m, const char *ns, char **cause)
{
	struct prune_arg p = { m, ns, now_unix() };

	return index_update(m, ns, edit_prune, &p, cause);
}

/* Prune the index of every namespace that has one. */
int
meter_prune_all(struct meter *m, char **cause)
{
	struct k8s_list_opts o = { NULL, "metadata.name=" METER_INDEX_SECRET,
	    NULL };
	struct k8s_status st = { 0 };
	json_t *l = NULL, *item;
	size_t i;
	int ret = 0;

	if (k8s_list(m->cfg.store, &K8S_SECRET, NULL, &o, &l, &st) < 0) {
		*cause = xasprintf("listing token indexes: %s", st.message ?
		    st.message : "failed");
		k8s_status_release(&st);
		return -1;
	}
	json_array_foreach(json_object_get(l, "items"), i, item) {
		const char *ns = k8s_meta_str(item, "namespace");

		if (ns != NULL && meter_prune_index(m, ns, cause) < 0) {
			ret = -1;
			break;
		}
	}
	json_decref(l);
	return ret;
}

/* ---------------------------------------------------------------- life */

/* Create a meter. */
int
meter_new(struct meter **out, const struct meter_config *cfg, char **cause)
{
	struct meter *m;

	if (cfg->store == NULL || cfg->root_key == NULL) {
		*cause = xstrdup("meter: a store and a root key are required");
		return -1;
	}
	m = xcalloc(1, sizeof(*m));
	m->cfg = *cfg;
	m->cfg.root_key = NULL;
	memcpy(m->key, cfg->root_key, MACAROON_KEY_LEN);
	if (m->cfg.max_conflict_retries <= 0)
		m->cfg.max_conflict_retries = 200;
	pthread_mutex_init(&m->mu, NULL);
	pthread_cond_init(&m->cv, NULL);
	metrics_init();
	*out = m;
	return 0;
}

/* Free a meter; the key is wiped. */
void
meter_free(struct meter *m)
{
	if (m == NULL)
		return;
	secure_wipe(m->key, sizeof(m->key));
	pthread_mutex_destroy(&m->mu);
	pthread_cond_destroy(&m->cv);
	free(m);
}
