/*
 * The meter (DESIGN section 6 "Meter"), run on the three stores of
 * storeenv.h: every status code and body, budgets, the request ring,
 * completion, and 64 threads charging one task at once.
 */
#include "config.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "meter/meter.h"
#include "storeenv.h"
#include "testutil.h"

#define NS "meter"

static struct storeenv env;
static struct meter *meter;
static unsigned char key[MACAROON_KEY_LEN];
static int counter;

static int
setup(void **state)
{
	struct meter_config mc;
	char *cause = NULL;

	(void)state;
	util_json_init();
	log_setup(LOG_ERROR, 0);
	if (storeenv_open(&env, STORE_MODE, 1000) < 0)
		return -1;
	random_bytes(key, sizeof(key));
	memset(&mc, 0, sizeof(mc));
	mc.store = env.api;
	mc.root_key = key;
	mc.location = "http://127.0.0.1:8080";
	if (meter_new(&meter, &mc, &cause) < 0)
		return -1;
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	meter_free(meter);
	storeenv_close(&env);
	return 0;
}

/* ---- fixtures ---- */

struct task {
	char *name;
	char *token;
	char *id;
	char *auth;
};

static void
task_release(struct task *t)
{
	free(t->name);
	free(t->token);
	free(t->id);
	free(t->auth);
}

/*
 * Create an Active task named name with spec fields from spec_json, and a
 * token for it (expiring in an hour unless expires is given).
 */
static void
make_named_task(struct task *t, const char *name, const char *spec_json,
    int64_t expires)
{
	struct k8s_status st = { 0 };
	json_t *spec = json_loads(spec_json, 0, NULL), *obj, *out = NULL;
	char *cause = NULL;

	assert_non_null(spec);
	t->name = xstrdup(name);
	if (json_object_get(spec, "objective") == NULL)
		json_object_set_new(spec, "objective", json_string("meter me"));
	obj = json_pack("{s:s,s:s,s:{s:s,s:{s:s}},s:o}", "apiVersion",
	    "divergedev.com/v1alpha1", "kind", "AgentTask", "metadata",
	    "name", t->name, "annotations", "divergedev.com/guidance",
	    "keep it small", "spec", spec);
	assert_int_equal(k8s_create(env.api, &K8S_AGENTTASK, NS, obj, &out,
	    &st), 0);
	json_decref(obj);
	json_object_set_new(out, "status", json_pack("{s:s,s:s}", "phase",
	    "Active", "previewUrl", "https://preview.example/?_diverge_env=x"));
	assert_int_equal(k8s_update_status(env.api, &K8S_AGENTTASK, NS,
	    t->name, out, NULL, &st), 0);
	if (meter_issue_token(meter, out, expires ? expires : now_unix() +
	    3600, &t->token, &t->id, &cause) < 0) {
		fprintf(stderr, "# %s\n", cause);
		fail();
	}
	t->auth = xasprintf("Bearer %s", t->token);
	json_decref(out);
}

/* The same, named task-N. */
static void
make_task(struct task *t, const char *spec_json, int64_t expires)
{
	char *name = xasprintf("task-%d", ++counter);

	make_named_task(t, name, spec_json, expires);
	free(name);
}

static json_t *
get_task(const char *name)
{
	struct k8s_status st = { 0 };
	json_t *o = NULL;

	assert_int_equal(k8s_get(env.api, &K8S_AGENTTASK, NS, name, &o, &st),
	    0);
	return o;
}

/* An async charge's reply, waited for. */
struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
	int status;
	char *body;
};

static void
async_done(void *arg, struct meter_reply *r)
{
	struct waiter *w = arg;

	pthread_mutex_lock(&w->mu);
	w->status = r->status;
	w->body = xstrdup(r->body);
	w->done = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static unsigned calls_made;

/*
 * Call the meter; returns the status and *out the parsed body. Where the
 * meter is async (the embedded store), every other call takes the async
 * path (as diverged does), so every case runs both.
 */
static int
charge(const char *auth, const char *body, json_t **out)
{
	struct meter_reply r;
	int status;

	if (meter_is_async(meter) &&
	    __atomic_fetch_add(&calls_made, 1, __ATOMIC_RELAXED) % 2 == 1) {
		struct waiter w;

		memset(&w, 0, sizeof(w));
		pthread_mutex_init(&w.mu, NULL);
		pthread_cond_init(&w.cv, NULL);
		meter_charge_async(meter, auth, body, strlen(body), async_done,
		    &w);
		pthread_mutex_lock(&w.mu);
		while (!w.done)
			pthread_cond_wait(&w.cv, &w.mu);
		pthread_mutex_unlock(&w.mu);
		pthread_cond_destroy(&w.cv);
		pthread_mutex_destroy(&w.mu);
		*out = json_loads(w.body, 0, NULL);
		assert_non_null(*out);
		free(w.body);
		return w.status;
	}
	meter_charge(meter, auth, body, strlen(body), &r);
	status = r.status;
	*out = json_loads(r.body, 0, NULL);
	assert_non_null(*out);
	meter_reply_release(&r);
	return status;
}

static int
call(const struct task *t, const char *rid, int64_t iteration,
    const char *model, int64_t tokens, const char *cost, json_t **out)
{
	char *body = xasprintf("{\"requestId\":\"%s\",\"iteration\":%lld,"
	    "%s%s%s\"tokensUsed\":%lld,\"costUSD\":%s}", rid,
	    (long long)iteration, model ? "\"model\":\"" : "",
	    model ? model : "", model ? "\"," : "", (long long)tokens, cost);
	int s = charge(t->auth, body, out);

	free(body);
	return s;
}

static const char *
jstr(const json_t *j, const char *k)
{
	return json_string_value(json_object_get(j, k));
}

static int64_t
jint(const json_t *j, const char *k)
{
	return json_integer_value(json_object_get(j, k));
}

/* The totals the task's status holds. */
static void
stored_totals(const char *name, const char *cost, int64_t tokens)
{
	json_t *task = get_task(name);

	assert_string_equal(jstr(json_object_get(task, "status"), "costUSD"),
	    cost);
	assert_int_equal(jint(json_object_get(task, "status"),
	    "tokensConsumed"), tokens);
	json_decref(task);
}

/* Merge status (taken) into the task's status. */
static void
patch_status(const char *name, json_t *status)
{
	struct k8s_status st = { 0 };
	json_t *p = json_pack("{s:o}", "status", status);

	assert_int_equal(k8s_patch(env.api, &K8S_AGENTTASK, NS, name, 1, p,
	    NULL, &st), 0);
	json_decref(p);
}

/* ---- cases ---- */

static void
usd_parsing(void **state)
{
	static const struct {
		const char *text;
		int64_t want;	/* -1: refused */
	} cases[] = {
		{ "0", 0 }, { "0.0225", 22500 }, { "1", 1000000 },
		{ "5.00", 5000000 }, { "0.000001", 1 }, { "0.0000005", 0 },
		{ "0.0000015", 2 }, { "0.0000025", 2 }, { "0.00000251", 3 },
		{ "0.0000035", 4 }, { "1e-6", 1 }, { "2.5e-7", 0 },
		{ "7.5E-7", 1 }, { "1.23456789", 1234568 },
		{ "1000000", INT64_C(1000000000000) }, { "1e6",
		    INT64_C(1000000000000) }, { "1000000.000001", -1 },
		{ "1e400", -1 }, { "-1", -1 }, { "0e0", 0 },
		{ "0.1234565", 123456 }, { "0.1234575", 123458 },
		{ "123.", -1 }, { ".5", -1 }, { "-.5", -1 }, { "", -1 },
		{ "abc", -1 },
		{ "0.00000000000000000000000000000000000000000000001", 0 },
		/* JSON numbers of value 0 with a sign: zero, not negative */
		{ "-0", 0 }, { "-0.0", 0 }, { "-0e5", 0 }, { "-0.0000001", -1 },
		{ "-1e-9", -1 },
		/* more than 40 digits before the point, brought down by the
		 * exponent: $123456.789012 and $1 */
		{ "12345678901234567890123456789012345678901234567890e-44",
		    123456789012 },
		{ "1000000000000000000000000000000000000000000000000000e-51",
		    1000000 },
		{ "12345678901234567890123456789012345678901234567890", -1 },
	};
	size_t i;
	int64_t v;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		int rc = meter_parse_usd(cases[i].text, strlen(cases[i].text),
		    INT64_C(1000000000000), &v);

		if ((cases[i].want < 0 && rc == 0) || (cases[i].want >= 0 &&
		    (rc != 0 || v != cases[i].want)))
			fprintf(stderr, "# usd '%s': rc %d v %lld\n",
			    cases[i].text, rc, (long long)v);
		if (cases[i].want < 0) {
			assert_int_equal(rc, -1);
		} else {
			assert_int_equal(rc, 0);
			assert_int_equal(v, cases[i].want);
		}
	}
}

/* A refused meter body and the field its 400 names. */
struct bad_body {
	const char *body, *field;
};

static void
body_validation(void **state)
{
	static const struct bad_body cases[] = {
		{ "{\"iteration\":1,\"tokensUsed\":1,\"costUSD\":0}", "requestId" },
		{ "{\"requestId\":\"\",\"iteration\":1,\"tokensUsed\":1,\"costUSD\":0}", "requestId" },
		{ "{\"requestId\":7,\"iteration\":1,\"tokensUsed\":1,\"costUSD\":0}", "requestId" },
		{ "{\"requestId\":\"a\",\"tokensUsed\":1,\"costUSD\":0}", "iteration" },
		{ "{\"requestId\":\"a\",\"iteration\":-1,\"tokensUsed\":1,\"costUSD\":0}", "iteration" },
		{ "{\"requestId\":\"a\",\"iteration\":1.5,\"tokensUsed\":1,\"costUSD\":0}", "iteration" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"model\":3,\"tokensUsed\":1,\"costUSD\":0}", "model" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"costUSD\":0}", "tokensUsed" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"tokensUsed\":-5,\"costUSD\":0}", "tokensUsed" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"tokensUsed\":1000000000001,\"costUSD\":0}", "tokensUsed" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"tokensUsed\":1}", "costUSD" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"tokensUsed\":1,\"costUSD\":-0.01}", "costUSD" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"tokensUsed\":1,\"costUSD\":1000000.01}", "costUSD" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"tokensUsed\":1,\"costUSD\":\"0.1\"}", "costUSD" },
	};
	static const struct bad_body dups[] = {
		{ "{\"requestId\":\"a\",\"iteration\":1,\"tokensUsed\":0,\"tokensUsed\":5000,\"costUSD\":0}", "tokensUsed" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"tokensUsed\":1,\"costUSD\":9,\"costUSD\":0}", "costUSD" },
		{ "{\"requestId\":\"a\",\"requestId\":\"b\",\"iteration\":1,\"tokensUsed\":1,\"costUSD\":0}", "requestId" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"iteration\":2,\"iteration\":3,\"tokensUsed\":1,\"costUSD\":0}", "iteration" },
		{ "{\"requestId\":\"a\",\"iteration\":1,\"model\":\"m\",\"tokensUsed\":1,\"model\":\"n\",\"costUSD\":0}", "model" },
	};
	struct task t, big;
	char rid[257], *body;
	size_t i;
	json_t *j;

	make_task(&t, "{}", 0);
	make_task(&big, "{\"budgetTokens\":1000000000000}", 0);
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		assert_int_equal(charge(t.auth, cases[i].body, &j), 400);
		assert_non_null(jstr(j, "error"));
		if (jstr(j, "field") == NULL ||
		    strcmp(jstr(j, "field"), cases[i].field) != 0)
			fprintf(stderr, "# case %zu: %s\n", i, jstr(j, "error"));
		assert_string_equal(jstr(j, "field"), cases[i].field);
		json_decref(j);
	}
	/*
	 * a field given twice is refused, whatever the values: a parser
	 * keeping the first and one keeping the last would charge different
	 * amounts for the same body
	 */
	for (i = 0; i < ARRAY_SIZE(dups); i++) {
		assert_int_equal(charge(t.auth, dups[i].body, &j), 400);
		assert_string_equal(jstr(j, "error"), "duplicate field");
		assert_string_equal(jstr(j, "field"), dups[i].field);
		json_decref(j);
	}
	assert_int_equal(charge(t.auth, "{", &j), 400);
	json_decref(j);
	assert_int_equal(charge(t.auth, "[1]", &j), 400);
	assert_string_equal(jstr(j, "error"), "body is not a JSON object");
	json_decref(j);
	/* the bounds themselves are taken: a 256-byte requestId, 10^12 tokens */
	memset(rid, 'r', sizeof(rid) - 1);
	rid[sizeof(rid) - 1] = '\0';
	assert_int_equal(call(&big, rid, 1, "m", INT64_C(1000000000000), "0",
	    &j), 200);
	assert_int_equal(jint(j, "totalTokensUsed"), INT64_C(1000000000000));
	json_decref(j);
	rid[sizeof(rid) - 2] = 's';
	assert_int_equal(call(&big, rid, 2, "m", 0, "0", &j), 200);
	json_decref(j);
	/* one byte more is refused */
	body = xasprintf("{\"requestId\":\"%sx\",\"iteration\":3,"
	    "\"model\":\"m\",\"tokensUsed\":1,\"costUSD\":0}", rid);
	assert_int_equal(charge(big.auth, body, &j), 400);
	assert_string_equal(jstr(j, "field"), "requestId");
	json_decref(j);
	free(body);
	stored_totals(big.name, "0.000000", INT64_C(1000000000000));
	task_release(&big);
	/* the body is checked before the token */
	assert_int_equal(charge(NULL, "{}", &j), 400);
	json_decref(j);
	task_release(&t);
}

static void
authentication(void **state)
{
	const char *ok = "{\"requestId\":\"r1\",\"iteration\":1,"
	    "\"model\":\"m\",\"tokensUsed\":1,\"costUSD\":0.01}";
	unsigned char other[MACAROON_KEY_LEN];
	struct task t, past;
	char *forged = NULL, *auth, *cause = NULL;
	const char *cav[2];
	json_t *j;

	make_task(&t, "{}", 0);
	assert_int_equal(charge(NULL, ok, &j), 401);
	assert_string_equal(jstr(j, "error"), "missing token");
	json_decref(j);
	assert_int_equal(charge("Basic abc", ok, &j), 401);
	json_decref(j);
	/* an auth scheme is case-insensitive (RFC 9110, 11.1) */
	auth = xasprintf("bearer  %s", t.token);
	assert_int_equal(charge(auth, ok, &j), 200);
	json_decref(j);
	free(auth);
	assert_int_equal(charge("Bearer not-a-token!", ok, &j), 401);
	assert_string_equal(jstr(j, "error"), "malformed token");
	json_decref(j);
	/* the same caveats under another root key */
	random_bytes(other, sizeof(other));
	cav[0] = xasprintf("task_id = %s", t.name);
	cav[1] = "namespace = " NS;
	assert_int_equal(macaroon_mint(other, sizeof(other), t.id, NULL, cav,
	    2, &forged, &cause), 0);
	auth = xasprintf("Bearer %s", forged);
	assert_int_equal(charge(auth, ok, &j), 401);
	assert_string_equal(jstr(j, "error"), "bad signature");
	json_decref(j);
	free(auth);
	free(forged);
	free((char *)cav[0]);
	/* expired beyond the leeway */
	make_task(&past, "{}", now_unix() - 60);
	assert_int_equal(charge(past.auth, ok, &j), 401);
	assert_string_equal(jstr(j, "error"), "expired");
	json_decref(j);
	/* revoked */
	assert_int_equal(meter_revoke_token(meter, NS, t.id, &cause), 0);
	assert_int_equal(charge(t.auth, ok, &j), 401);
	assert_string_equal(jstr(j, "error"), "revoked");
	json_decref(j);
	task_release(&t);
	task_release(&past);
}

static void
not_live(void **state)
{
	const char *ok = "{\"requestId\":\"r1\",\"iteration\":1,"
	    "\"model\":\"m\",\"tokensUsed\":1,\"costUSD\":0.01}";
	struct k8s_status st = { 0 };
	struct task t;
	json_t *j, *p;

	make_task(&t, "{}", 0);
	p = json_pack("{s:{s:s}}", "status", "phase", "Pending");
	assert_int_equal(k8s_patch(env.api, &K8S_AGENTTASK, NS, t.name, 1, p,
	    NULL, &st), 0);
	json_decref(p);
	assert_int_equal(charge(t.auth, ok, &j), 401);
	assert_string_equal(jstr(j, "error"), "task not live");
	json_decref(j);
	/* Provisioning is live: the agent may call before Ready */
	p = json_pack("{s:{s:s}}", "status", "phase", "Provisioning");
	assert_int_equal(k8s_patch(env.api, &K8S_AGENTTASK, NS, t.name, 1, p,
	    NULL, &st), 0);
	json_decref(p);
	assert_int_equal(charge(t.auth, ok, &j), 200);
	json_decref(j);
	/* a deleted task */
	assert_int_equal(k8s_delete(env.api, &K8S_AGENTTASK, NS, t.name, NULL,
	    &st), 0);
	assert_int_equal(charge(t.auth, ok, &j), 401);
	json_decref(j);
	task_release(&t);
}

static void
models(void **state)
{
	struct task t, open;
	json_t *j;

	make_task(&t, "{\"capabilities\":[\"claude-3-7-sonnet\","
	    "\"gemini-*\"]}", 0);
	assert_int_equal(call(&t, "m1", 1, "claude-3-7-sonnet", 1, "0", &j),
	    200);
	json_decref(j);
	assert_int_equal(call(&t, "m2", 1, "gemini-2.5-pro", 1, "0", &j), 200);
	json_decref(j);
	assert_int_equal(call(&t, "m3", 1, "gpt-4o", 1, "0", &j), 403);
	assert_string_equal(jstr(j, "field"), "model");
	json_decref(j);
	assert_int_equal(call(&t, "m4", 1, NULL, 1, "0", &j), 403);
	assert_string_equal(jstr(j, "error"), "model required");
	json_decref(j);
	assert_int_equal(call(&t, "m5", 1, "claude-3-7-sonnet-x", 1, "0", &j),
	    403);
	json_decref(j);
	/*
	 * spec.capabilities narrowed after the token was minted: its models
	 * caveat still allows gemini-*, the task no longer does (both rule)
	 */
	{
		struct k8s_status st = { 0 };
		json_t *p = json_pack("{s:{s:[s]}}", "spec", "capabilities",
		    "claude-3-7-sonnet");

		assert_int_equal(k8s_patch(env.api, &K8S_AGENTTASK, NS, t.name,
		    0, p, NULL, &st), 0);
		json_decref(p);
	}
	assert_int_equal(call(&t, "m6", 1, "gemini-2.5-pro", 1, "0", &j), 403);
	assert_string_equal(jstr(j, "error"), "model not allowed");
	json_decref(j);
	assert_int_equal(call(&t, "m7", 1, "claude-3-7-sonnet", 1, "0", &j),
	    200);
	json_decref(j);
	/* no capabilities anywhere: any model, but a model */
	make_task(&open, "{}", 0);
	assert_int_equal(call(&open, "o1", 1, "anything", 1, "0", &j), 200);
	json_decref(j);
	assert_int_equal(call(&open, "o2", 1, NULL, 1, "0", &j), 403);
	assert_string_equal(jstr(j, "error"), "model required");
	json_decref(j);
	assert_int_equal(call(&open, "o3", 1, "", 1, "0", &j), 403);
	assert_string_equal(jstr(j, "error"), "model required");
	json_decref(j);
	task_release(&t);
	task_release(&open);
}

/*
 * The token of t with one more caveat, as its holder would append it
 * (the same chain as minting them all with the root key).
 */
static char *
attenuate(const struct task *t, const char *caveat)
{
	struct macaroon *m = NULL;
	const char *cav[MACAROON_MAX_CAVEATS + 1];
	char *token = NULL, *auth;
	size_t i, n, len;

	assert_int_equal(macaroon_deserialize(t->token, strlen(t->token), &m,
	    NULL), 0);
	n = macaroon_caveat_count(m);
	for (i = 0; i < n; i++)
		cav[i] = macaroon_caveat(m, i, &len);
	cav[n] = caveat;
	assert_int_equal(macaroon_mint(key, sizeof(key),
	    macaroon_identifier(m, &len), "http://127.0.0.1:8080", cav, n + 1,
	    &token, NULL), 0);
	macaroon_free(m);
	auth = xasprintf("Bearer %s", token);
	free(token);
	return auth;
}

/* A charge of one token for model: its status (the reply is dropped). */
static int
charge_model(const char *auth, const char *rid, const char *model)
{
	char *b = xasprintf("{\"requestId\":\"%s\",\"iteration\":1,"
	    "\"model\":\"%s\",\"tokensUsed\":1,\"costUSD\":0}", rid, model);
	json_t *j;
	int s = charge(auth, b, &j);

	json_decref(j);
	free(b);
	return s;
}

/* A models caveat a holder appends narrows the token: all of them hold. */
static void
models_attenuated(void **state)
{
	struct task t, open;
	char *narrow, *gem, *none;

	(void)state;
	make_task(&t, "{\"capabilities\":[\"claude-*\"]}", 0);
	narrow = attenuate(&t, "models = claude-3-haiku");
	assert_int_equal(charge_model(narrow, "n1", "claude-3-opus"), 403);
	assert_int_equal(charge_model(narrow, "n2", "claude-3-haiku"), 200);
	/* a task with no capabilities: the appended caveat alone decides */
	make_task(&open, "{}", 0);
	gem = attenuate(&open, "models = gemini-*");
	assert_int_equal(charge_model(gem, "n3", "claude-3-opus"), 403);
	assert_int_equal(charge_model(gem, "n4", "gemini-2.5-pro"), 200);
	/* an empty list allows no model */
	none = attenuate(&t, "models = ,");
	assert_int_equal(charge_model(none, "n5", "claude-3-haiku"), 403);
	free(none);
	free(gem);
	free(narrow);
	task_release(&t);
	task_release(&open);
}

/* However large the guidance annotation, the reply is whole JSON. */
static void
large_guidance(void **state)
{
	struct k8s_status st = { 0 };
	size_t n = 300000, i;
	char *g = xmalloc(n + 1);
	json_t *p, *j;
	struct task t;

	(void)state;
	for (i = 0; i < n; i++)
		g[i] = (char)(i % 2 ? 0x01 : '"');
	g[n] = '\0';
	make_task(&t, "{}", 0);
	p = json_pack("{s:{s:{s:s}}}", "metadata", "annotations",
	    "divergedev.com/guidance", g);
	assert_int_equal(k8s_patch(env.api, &K8S_AGENTTASK, NS, t.name, 0, p,
	    NULL, &st), 0);
	json_decref(p);
	assert_int_equal(call(&t, "g1", 1, "m", 1, "0", &j), 200);
	assert_non_null(j);
	assert_string_equal(jstr(j, "guidance"), g);
	json_decref(j);
	free(g);
	task_release(&t);
}

static void
ok_reply_and_ring(void **state)
{
	struct task t;
	json_t *j, *task;
	char rid[32];
	int i;

	make_task(&t, "{\"maxIterations\":8}", 0);
	assert_int_equal(call(&t, "a", 1, "m", 1500, "0.0225", &j), 200);
	assert_true(json_is_true(json_object_get(j, "allowed")));
	assert_true(json_is_false(json_object_get(j, "suspended")));
	assert_true(json_is_true(json_object_get(j, "charged")));
	assert_int_equal(jint(j, "totalTokensUsed"), 1500);
	assert_true(json_is_number(json_object_get(j, "totalCostUSD")));
	assert_int_equal(jint(j, "iteration"), 1);
	assert_int_equal(jint(j, "maxIterations"), 8);
	assert_string_equal(jstr(j, "guidance"), "keep it small");
	assert_string_equal(jstr(j, "previewUrl"),
	    "https://preview.example/?_diverge_env=x");
	json_decref(j);
	/* the same request again: not charged */
	assert_int_equal(call(&t, "a", 1, "m", 1500, "0.0225", &j), 200);
	assert_true(json_is_false(json_object_get(j, "charged")));
	assert_int_equal(jint(j, "totalTokensUsed"), 1500);
	json_decref(j);
	/* iteration is the maximum seen */
	assert_int_equal(call(&t, "b", 3, "m", 1, "0.000001", &j), 200);
	json_decref(j);
	assert_int_equal(call(&t, "c", 2, "m", 1, "0.000001", &j), 200);
	assert_int_equal(jint(j, "iteration"), 3);
	json_decref(j);
	stored_totals(t.name, "0.022502", 1502);
	/* -0.0 (Python's json.dumps of a rounded tiny negative) is 0 */
	assert_int_equal(call(&t, "z", 3, "m", 7, "-0.0", &j), 200);
	assert_int_equal(jint(j, "totalTokensUsed"), 1509);
	json_decref(j);
	/* the ring keeps the last 32 */
	for (i = 0; i < 40; i++) {
		snprintf(rid, sizeof(rid), "ring-%d", i);
		assert_int_equal(call(&t, rid, 3, "m", 1, "0", &j), 200);
		json_decref(j);
	}
	task = get_task(t.name);
	assert_int_equal(json_array_size(json_object_get(json_object_get(task,
	    "status"), "lastMeterRequestIds")), 32);
	assert_string_equal(json_string_value(json_array_get(json_object_get(
	    json_object_get(task, "status"), "lastMeterRequestIds"), 31)),
	    "ring-39");
	json_decref(task);
	task_release(&t);
}

static void
budgets(void **state)
{
	struct task t, cav;
	json_t *j, *task;
	char *cause = NULL;
	struct meter_config mc;
	struct meter *small;

	/* spec.budgetUSD replaces the caveat: $1 caveat, $5 spec */
	memset(&mc, 0, sizeof(mc));
	mc.store = env.api;
	mc.root_key = key;
	mc.default_budget_usd_micro = 1000000;
	assert_int_equal(meter_new(&small, &mc, &cause), 0);
	{
		struct meter *keep = meter;

		meter = small;
		make_task(&t, "{\"budgetUSD\":\"5.00\"}", 0);
		make_task(&cav, "{}", 0);
		meter = keep;
	}
	assert_int_equal(call(&t, "x1", 1, "m", 1, "4.99", &j), 200);
	json_decref(j);
	/* exactly the budget is still allowed */
	assert_int_equal(call(&t, "x2", 1, "m", 1, "0.01", &j), 200);
	json_decref(j);
	assert_int_equal(call(&t, "x3", 1, "m", 1, "0.01", &j), 429);
	assert_string_equal(jstr(j, "reason"), "budget exceeded");
	assert_true(json_is_false(json_object_get(j, "allowed")));
	assert_true(json_is_true(json_object_get(j, "suspended")));
	json_decref(j);
	task = get_task(t.name);
	assert_string_equal(jstr(json_object_get(task, "status"), "phase"),
	    "Paused");
	assert_string_equal(jstr(json_object_get(task, "status"), "reason"),
	    "BudgetExceeded");
	assert_true(json_is_true(json_object_get(json_object_get(task, "spec"),
	    "suspended")));
	json_decref(task);
	/* the retry of the suspending call: the same 429, nothing more */
	assert_int_equal(call(&t, "x3", 1, "m", 1, "0.01", &j), 429);
	assert_true(json_is_false(json_object_get(j, "charged")));
	json_decref(j);
	/* anything else: 401, the token is revoked */
	assert_int_equal(call(&t, "x4", 1, "m", 1, "0.01", &j), 401);
	assert_string_equal(jstr(j, "error"), "task not live");
	json_decref(j);
	/* an earlier call's retry too, though its id is in the ring */
	assert_int_equal(call(&t, "x2", 1, "m", 1, "0.01", &j), 401);
	json_decref(j);
	/* no spec budget: the $1.00 caveat applies */
	assert_int_equal(call(&cav, "y1", 1, "m", 1, "1.00", &j), 200);
	json_decref(j);
	assert_int_equal(call(&cav, "y2", 1, "m", 1, "0.000001", &j), 429);
	json_decref(j);
	meter_free(small);
	task_release(&t);
	task_release(&cav);
}

/*
 * A token carries both budgets as minted, unlimited (0) included, so a
 * budget caveat its holder appends is a second value, refused: minted
 * without one while the defaults were unlimited, a token with an
 * appended "max_cost_usd = 1000000" escaped a default set later (a
 * restart with mc.default_budget_usd_micro = $1: a $50 call was charged).
 * And the token keeps the budget it was minted with.
 */
static void
appended_budget(void **state)
{
	struct task t;
	json_t *j;
	char *cause = NULL, *usd, *tok;
	struct meter_config mc;
	struct meter *capped, *keep = meter;

	(void)state;
	make_task(&t, "{}", 0);		/* defaults: unlimited */
	memset(&mc, 0, sizeof(mc));
	mc.store = env.api;
	mc.root_key = key;
	mc.location = "http://127.0.0.1:8080";
	mc.default_budget_usd_micro = 1000000;
	mc.default_budget_tokens = 1000;
	assert_int_equal(meter_new(&capped, &mc, &cause), 0);
	meter = capped;
	usd = attenuate(&t, "max_cost_usd = 1000000");
	assert_int_equal(charge(usd, "{\"requestId\":\"a1\",\"iteration\":1,"
	    "\"model\":\"m\",\"tokensUsed\":1,\"costUSD\":50}", &j), 401);
	assert_string_equal(jstr(j, "error"), "caveat not met: max_cost_usd");
	json_decref(j);
	tok = attenuate(&t, "max_tokens = 100000000");
	assert_int_equal(charge(tok, "{\"requestId\":\"a2\",\"iteration\":1,"
	    "\"model\":\"m\",\"tokensUsed\":5000,\"costUSD\":0}", &j), 401);
	assert_string_equal(jstr(j, "error"), "caveat not met: max_tokens");
	json_decref(j);
	/* the token as minted: unlimited, whatever the default now */
	assert_int_equal(call(&t, "a3", 1, "m", 5000, "50", &j), 200);
	json_decref(j);
	meter = keep;
	meter_free(capped);
	free(usd);
	free(tok);
	task_release(&t);
}

/*
 * Totals are read back as they were written: past $922,337,203,685 (a
 * tenth of int64 micro-USD) status.costUSD was read as 0, so an unlimited
 * task's spend started again from nothing, and a spec.budgetUSD above it
 * (up to 12 digits are valid) counted as unset.
 */
static void
large_totals(void **state)
{
	struct task t, b;
	json_t *j;
	int64_t v = 0;

	(void)state;
	/* the largest total a charge may write reads back */
	assert_int_equal(meter_parse_usd("9223372036854.775807", 20,
	    INT64_MAX, &v), 0);
	assert_true(v == INT64_MAX);
	assert_int_equal(meter_parse_usd("9223372036854.775808", 20,
	    INT64_MAX, &v), -1);
	assert_int_equal(meter_parse_usd("9223372036854.7758075", 21,
	    INT64_MAX, &v), -1);
	make_task(&t, "{}", 0);
	patch_status(t.name, json_pack("{s:s,s:I}", "costUSD",
	    "922337203000.000000", "tokensConsumed", (json_int_t)5));
	assert_int_equal(call(&t, "l1", 1, "m", 1, "1000000", &j), 200);
	json_decref(j);
	assert_int_equal(call(&t, "l2", 1, "m", 1, "0.000001", &j), 200);
	json_decref(j);
	stored_totals(t.name, "922338203000.000001", 7);
	/* tokens: a total that would pass INT64_MAX is refused, not wrapped */
	patch_status(t.name, json_pack("{s:I}", "tokensConsumed",
	    (json_int_t)(INT64_MAX - 5)));
	assert_int_equal(call(&t, "l5", 1, "m", 6, "0", &j), 400);
	assert_string_equal(jstr(j, "error"), "totals would overflow");
	json_decref(j);
	assert_int_equal(call(&t, "l6", 1, "m", 5, "0", &j), 200);
	json_decref(j);
	stored_totals(t.name, "922338203000.000001", INT64_MAX);
	/* a $950,000,000,000 budget: crossed, not replaced by "no budget" */
	make_task(&b, "{\"budgetUSD\":\"950000000000\"}", 0);
	patch_status(b.name, json_pack("{s:s}", "costUSD", "949999999999.5"));
	assert_int_equal(call(&b, "l3", 1, "m", 1, "0.5", &j), 200);
	json_decref(j);
	assert_int_equal(call(&b, "l4", 1, "m", 1, "0.000001", &j), 429);
	assert_string_equal(jstr(j, "reason"), "budget exceeded");
	json_decref(j);
	task_release(&t);
	task_release(&b);
}

static void
iterations(void **state)
{
	struct task t, both;
	json_t *j, *task;

	make_task(&t, "{\"maxIterations\":3}", 0);
	assert_int_equal(call(&t, "i3", 3, "m", 1, "0", &j), 200);
	json_decref(j);
	assert_int_equal(call(&t, "i4", 4, "m", 1, "0", &j), 429);
	assert_string_equal(jstr(j, "reason"), "max iterations exceeded");
	json_decref(j);
	task = get_task(t.name);
	assert_string_equal(jstr(json_object_get(task, "status"), "phase"),
	    "Paused");
	json_decref(task);
	/* a token budget reached exactly is still allowed; one more is not */
	{
		struct task tb;

		make_task(&tb, "{\"budgetTokens\":100}", 0);
		assert_int_equal(call(&tb, "t1", 1, "m", 60, "0", &j), 200);
		json_decref(j);
		assert_int_equal(call(&tb, "t2", 1, "m", 40, "0", &j), 200);
		assert_int_equal(jint(j, "totalTokensUsed"), 100);
		json_decref(j);
		assert_int_equal(call(&tb, "t3", 1, "m", 1, "0", &j), 429);
		assert_string_equal(jstr(j, "reason"), "budget exceeded");
		json_decref(j);
		task_release(&tb);
	}
	/* both crossed at once: budget wins */
	make_task(&both, "{\"maxIterations\":1,\"budgetTokens\":10}", 0);
	assert_int_equal(call(&both, "b1", 2, "m", 11, "0", &j), 429);
	assert_string_equal(jstr(j, "reason"), "budget exceeded");
	json_decref(j);
	task_release(&t);
	task_release(&both);
}

static void
completion(void **state)
{
	struct meter_reply r;
	struct task t;
	json_t *j, *task;
	const char *body = "{\"result\":\"succeeded\",\"message\":\"done\","
	    "\"commit\":\"abc123\",\"branch\":\"fix/x\","
	    "\"pullRequestUrl\":\"https://example/pr/1\"}";

	make_task(&t, "{}", 0);
	meter_complete(meter, t.auth, body, strlen(body), &r);
	assert_int_equal(r.status, 200);
	meter_reply_release(&r);
	task = get_task(t.name);
	assert_string_equal(jstr(json_object_get(task, "status"), "phase"),
	    "Completed");
	json_decref(task);
	/* idempotent */
	meter_complete(meter, t.auth, body, strlen(body), &r);
	assert_int_equal(r.status, 200);
	meter_reply_release(&r);
	/* the token no longer meters */
	assert_int_equal(call(&t, "after", 1, "m", 1, "0", &j), 401);
	json_decref(j);
	meter_complete(meter, t.auth, "{\"result\":\"maybe\"}", 19, &r);
	assert_int_equal(r.status, 400);
	meter_reply_release(&r);
	task_release(&t);
	make_task(&t, "{}", 0);
	meter_complete(meter, t.auth, "{\"result\":\"failed\"}", 19, &r);
	assert_int_equal(r.status, 200);
	meter_reply_release(&r);
	task = get_task(t.name);
	assert_string_equal(jstr(json_object_get(task, "status"), "phase"),
	    "Failed");
	json_decref(task);
	task_release(&t);
}

/*
 * What the runner reports lands in status.result as a commit, a branch and
 * a link: a hostile agent's script link, terminal escape, quote or other
 * host is refused with a 400 naming the field, and the task stays live.
 */
static void
completion_fields(void **state)
{
	static const char *const bad[][2] = {
		{ "commit", "not a sha" },
		{ "commit", "abc" },
		{ "commit", "abc1234\\u001b]52;c;aGk=\\u0007" },
		/* 65 hex digits: longer than any object id */
		{ "commit", "0123456789abcdef0123456789abcdef"
		    "0123456789abcdef0123456789abcdef0" },
		{ "branch", "a b" },
		{ "branch", "fix/x\\n@here" },
		{ "branch", "-x" },
		{ "branch", "x..y" },
		{ "branch", "x\\u001b[2J" },
		{ "branch", "refs/heads/x.lock" },
		{ "branch", "fix/.hidden" },
		{ "pullRequestUrl", "javascript:alert(1)" },
		{ "pullRequestUrl", "data:text/html,<script>x</script>" },
		{ "pullRequestUrl", "JaVaScRiPt:alert(1)//https://github.com/" },
		{ "pullRequestUrl", "https://github.com/o/r/pull/1\\\")<img>" },
		{ "pullRequestUrl", "https://github.com/o/r/pull/1 x" },
		{ "pullRequestUrl", "https://github.com@evil.example/o/r/pull/1" },
		/* the last three: refused for their host only */
		{ "pullRequestUrl", "https://evil.example/o/r/pull/1" },
		{ "pullRequestUrl", "https://github.com.evil.example/o/r" },
		{ "pullRequestUrl", "https://github.co/o/r/pull/1" },
	};
	struct meter_reply r;
	struct task t;
	json_t *j, *task;
	char *body;
	size_t i;

	(void)state;
	/*
	 * a task with no repository URL has no host to compare with: each
	 * value is refused on its own (a script link, user info), not only
	 * because its host differs
	 */
	make_task(&t, "{}", 0);
	for (i = 0; i < ARRAY_SIZE(bad) - 3; i++) {
		body = xasprintf("{\"result\":\"succeeded\",\"%s\":\"%s\"}",
		    bad[i][0], bad[i][1]);
		meter_complete(meter, t.auth, body, strlen(body), &r);
		if (r.status != 400)
			fail_msg("no repository: %s: %d %s", body, r.status,
			    r.body);
		meter_reply_release(&r);
		free(body);
	}
	task_release(&t);
	/*
	 * the repository URL's user info (a clone token) is not part of its
	 * host: a link on that host is taken
	 */
	make_task(&t, "{\"repository\":{\"url\":"
	    "\"https://x-access-token:t0k@github.com/o/r.git\"}}", 0);
	body = xstrdup("{\"result\":\"succeeded\",\"pullRequestUrl\":"
	    "\"https://github.com/o/r/pull/7\"}");
	meter_complete(meter, t.auth, body, strlen(body), &r);
	if (r.status != 200)
		fail_msg("user info in the repository URL: %d %s", r.status,
		    r.body);
	meter_reply_release(&r);
	free(body);
	task_release(&t);
	make_task(&t, "{\"repository\":{\"url\":"
	    "\"https://GitHub.com/o/r.git\"}}", 0);
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		body = xasprintf("{\"result\":\"succeeded\",\"%s\":\"%s\"}",
		    bad[i][0], bad[i][1]);
		meter_complete(meter, t.auth, body, strlen(body), &r);
		if (r.status != 400)
			fail_msg("%s: %d %s", body, r.status, r.body);
		j = json_loads(r.body, 0, NULL);
		assert_string_equal(jstr(j, "field"), bad[i][0]);
		json_decref(j);
		meter_reply_release(&r);
		free(body);
	}
	task = get_task(t.name);
	assert_string_equal(jstr(json_object_get(task, "status"), "phase"),
	    "Active");
	json_decref(task);
	/* a real report is taken */
	body = xstrdup("{\"result\":\"succeeded\",\"commit\":"
	    "\"0123456789abcdef0123456789abcdef01234567\",\"branch\":"
	    "\"diverge/fix-pr-42_v1.2\",\"pullRequestUrl\":"
	    "\"https://github.com/o/r/pull/42#issuecomment-1\"}");
	meter_complete(meter, t.auth, body, strlen(body), &r);
	assert_int_equal(r.status, 200);
	meter_reply_release(&r);
	free(body);
	task = get_task(t.name);
	assert_string_equal(jstr(json_object_get(task, "status"), "phase"),
	    "Completed");
#if STORE_MODE == 1
	/* (the CRD has no status.result: an API server prunes it) */
	assert_string_equal(jstr(json_object_get(json_object_get(task,
	    "status"), "result"), "pullRequestUrl"),
	    "https://github.com/o/r/pull/42#issuecomment-1");
#endif
	json_decref(task);
	task_release(&t);
}

/* Replace token id's entry in the index Secret with the JSON text. */
static void
index_write(const char *id, const char *text)
{
	struct k8s_status st = { 0 };
	json_t *sec = NULL;
	char *b64 = base64_encode((const unsigned char *)text, strlen(text),
	    0, 1);

	assert_int_equal(k8s_get(env.api, &K8S_SECRET, NS, METER_INDEX_SECRET,
	    &sec, &st), 0);
	json_object_set_new(json_object_get(sec, "data"), id,
	    json_string(b64));
	assert_int_equal(k8s_update(env.api, &K8S_SECRET, NS,
	    METER_INDEX_SECRET, sec, NULL, &st), 0);
	json_decref(sec);
	free(b64);
}

/*
 * The index entry is read as JSON is: escapes decoded, the last of
 * duplicate keys winning (jansson's rule), the task compared whole.
 */
static void
index_entries_as_written(void **state)
{
	/* each entry: pre, the task's name, post */
	static const struct {
		const char *pre, *post;
		int status;
	} cases[] = {
		{ "{\"state\":\"active\",\"task\":\"", "\"}", 200 },
		{ "{\"state\":\"\\u0061ctive\",\"task\":\"", "\"}", 200 },
		{ "{\"task\":\"", "\",\"state\":\"active\",\"state\":"
		    "\"revoked\"}", 401 },
		{ "{\"state\":\"revoked\",\"state\":\"active\",\"task\":"
		    "\"", "\"}", 200 },
		{ "{\"state\":\"active\",\"task\":\"", "x\"}", 401 },
		{ "{\"state\":\"active\",\"task\":\"x", "\"}", 401 },
		{ "{\"state\":\"activ\",\"task\":\"", "\"}", 401 },
		{ "{\"state\":true,\"task\":\"", "\"}", 401 },
		{ "{\"state\":\"active\",\"task\":\"", "\"", 401 },
		/* a number is read as jansson reads it */
		{ "{\"state\":\"active\",\"n\":-1.5e3,\"task\":\"",
		    "\"}", 200 },
		/* refused by jansson, as the revocation reads it: not active */
		{ "{\"state\":\"active\",\"n\":1e999,\"task\":\"",
		    "\"}", 401 },
		{ "{\"state\":\"active\",\"task\":\"", "\",\"n\":"
		    "99999999999999999999}", 401 },
		{ "{\"state\":\"active\",\"x\":\"\\u0000\",\"task\":\"",
		    "\"}", 401 },
	};
	struct task t;
	size_t i;

	(void)state;
	make_task(&t, "{}", 0);
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		char *e = xasprintf("%s%s%s", cases[i].pre, t.name,
		    cases[i].post);
		char *b = xasprintf("{\"requestId\":\"idx-%zu\",\"iteration\""
		    ":1,\"model\":\"m\",\"tokensUsed\":1,\"costUSD\":0}", i);
		json_t *j;

		index_write(t.id, e);
		if (charge(t.auth, b, &j) != cases[i].status) {
			fprintf(stderr, "# entry %s: %s\n", e,
			    json_dumps(j, JSON_COMPACT));
			fail();
		}
		json_decref(j);
		free(b);
		free(e);
	}
	task_release(&t);
}

/* Token id's entry in the index Secret, parsed (NULL: it does not). */
static json_t *
index_read(const char *id)
{
	struct k8s_status st = { 0 };
	json_t *sec = NULL, *e = NULL;
	const char *v;
	unsigned char *raw = NULL;
	size_t n;

	assert_int_equal(k8s_get(env.api, &K8S_SECRET, NS, METER_INDEX_SECRET,
	    &sec, &st), 0);
	v = jstr(json_object_get(sec, "data"), id);
	assert_non_null(v);
	assert_int_equal(base64_decode(v, strlen(v), &raw, &n), 0);
	e = json_loadb((const char *)raw, n, 0, NULL);
	free(raw);
	json_decref(sec);
	return e;
}

/*
 * An entry that jansson refuses (a number out of range) is not active,
 * and revoking its token replaces it with a revoked entry: nothing that
 * reads the index can take it for active afterwards.
 */
static void
malformed_entry_revoked(void **state)
{
	struct task t;
	char *e, *cause = NULL;
	json_t *j;

	(void)state;
	make_task(&t, "{}", 0);
	e = xasprintf("{\"state\":\"active\",\"task\":\"%s\",\"n\":1e999}",
	    t.name);
	index_write(t.id, e);
	free(e);
	assert_null(index_read(t.id));
	assert_int_equal(charge_model(t.auth, "m1", "m"), 401);
	assert_int_equal(meter_revoke_token(meter, NS, t.id, &cause), 0);
	j = index_read(t.id);
	assert_non_null(j);
	assert_string_equal(jstr(j, "state"), "revoked");
	json_decref(j);
	assert_int_equal(charge_model(t.auth, "m2", "m"), 401);
	task_release(&t);
}

/*
 * A token is the task's, not its name's: a task deleted and created again
 * under the same name (its token's revocation missed, say a watch that
 * fell behind) does not take the old token.
 */
static void
recreated_task(void **state)
{
	struct k8s_status st = { 0 };
	struct task t;
	json_t *old, *obj, *out = NULL;

	(void)state;
	make_task(&t, "{}", 0);
	assert_int_equal(charge_model(t.auth, "u1", "m"), 200);
	old = get_task(t.name);
	assert_int_equal(k8s_delete(env.api, &K8S_AGENTTASK, NS, t.name, NULL,
	    &st), 0);
	obj = json_pack("{s:s,s:s,s:{s:s},s:{s:s}}", "apiVersion",
	    "divergedev.com/v1alpha1", "kind", "AgentTask", "metadata", "name",
	    t.name, "spec", "objective", "again");
	assert_int_equal(k8s_create(env.api, &K8S_AGENTTASK, NS, obj, &out,
	    &st), 0);
	json_decref(obj);
	assert_string_not_equal(jstr(json_object_get(out, "metadata"), "uid"),
	    jstr(json_object_get(old, "metadata"), "uid"));
	json_object_set_new(out, "status", json_pack("{s:s}", "phase",
	    "Active"));
	assert_int_equal(k8s_update_status(env.api, &K8S_AGENTTASK, NS,
	    t.name, out, NULL, &st), 0);
	json_decref(out);
	json_decref(old);
	assert_int_equal(charge_model(t.auth, "u2", "m"), 401);
	task_release(&t);
}

/*
 * A task may hold several active tokens (an extended one and the one that
 * extends it): all of its tokens but the one kept are revoked, another
 * task's are not.
 */
static void
revoke_task_tokens(void **state)
{
	struct task t, other;
	char *tok2 = NULL, *id2 = NULL, *auth2, *cause = NULL;
	json_t *task;

	(void)state;
	make_task(&t, "{}", 0);
	make_task(&other, "{}", 0);
	task = get_task(t.name);
	assert_int_equal(meter_issue_token(meter, task, now_unix() + 7200,
	    &tok2, &id2, &cause), 0);
	json_decref(task);
	auth2 = xasprintf("Bearer %s", tok2);
	assert_int_equal(charge_model(t.auth, "k1", "m"), 200);
	assert_int_equal(charge_model(auth2, "k2", "m"), 200);
	assert_int_equal(meter_revoke_task_tokens(meter, NS, t.name, id2,
	    &cause), 0);
	assert_int_equal(charge_model(t.auth, "k3", "m"), 401);
	assert_int_equal(charge_model(auth2, "k4", "m"), 200);
	assert_int_equal(charge_model(other.auth, "k5", "m"), 200);
	/* again, keeping none; idempotent */
	assert_int_equal(meter_revoke_task_tokens(meter, NS, t.name, NULL,
	    &cause), 0);
	assert_int_equal(meter_revoke_task_tokens(meter, NS, t.name, NULL,
	    &cause), 0);
	assert_int_equal(charge_model(auth2, "k6", "m"), 401);
	assert_int_equal(charge_model(other.auth, "k7", "m"), 200);
	free(auth2);
	free(id2);
	free(tok2);
	task_release(&other);
	task_release(&t);
}

static int
index_has(const char *id)
{
	struct k8s_status st = { 0 };
	json_t *sec = NULL;
	int has;

	assert_int_equal(k8s_get(env.api, &K8S_SECRET, NS, METER_INDEX_SECRET,
	    &sec, &st), 0);
	has = json_object_get(json_object_get(sec, "data"), id) != NULL;
	json_decref(sec);
	return has;
}

static void
pruning(void **state)
{
	struct k8s_status st = { 0 };
	struct task live, gone, expired, old, again;
	char *cause = NULL;

	make_task(&live, "{}", 0);
	make_task(&gone, "{}", 0);
	make_task(&expired, "{}", now_unix() - 3600);
	make_task(&old, "{}", 0);
	assert_true(index_has(live.id) && index_has(gone.id) &&
	    index_has(expired.id) && index_has(old.id));
	assert_int_equal(k8s_delete(env.api, &K8S_AGENTTASK, NS, gone.name,
	    NULL, &st), 0);
	/*
	 * a task deleted and made again under its name (fix-pr-42 deleted,
	 * then /diverge fix): the entries of the deleted one go too
	 */
	assert_int_equal(k8s_delete(env.api, &K8S_AGENTTASK, NS, old.name,
	    NULL, &st), 0);
	make_named_task(&again, old.name, "{}", 0);
	assert_int_equal(meter_prune_all(meter, &cause), 0);
	assert_true(index_has(live.id));
	assert_false(index_has(gone.id));
	assert_false(index_has(expired.id));
	assert_false(index_has(old.id));
	assert_true(index_has(again.id));
	task_release(&live);
	task_release(&gone);
	task_release(&expired);
	task_release(&old);
	task_release(&again);
}

/* ---- 64 threads at once ---- */

#define THREADS 64
#define CALLS 500

struct racer {
	const struct task *t;
	int id;
	int64_t charged_tokens;
	int64_t charged_cost;
	int first_429;		/* charged 429s seen */
	int64_t total_at_429;	/* the totals that 429 reported */
	int64_t max_total_200;	/* the largest total a charged 200 saw */
	int errors;
};

static void *
racer_main(void *arg)
{
	struct racer *r = arg;
	uint32_t seed = (uint32_t)r->id * 2654435761u;
	char rid[64];
	int i, last = -1;

	for (i = 0; i < CALLS; i++) {
		json_t *j;
		int s, n, tokens;

		seed = seed * 1103515245u + 12345u;
		/* a quarter of the calls repeat the previous request id */
		n = (last >= 0 && (seed >> 16) % 4 == 0) ? last : i;
		last = n;
		snprintf(rid, sizeof(rid), "t%d-r%d", r->id, n);
		tokens = (int)(((unsigned)r->id * 131u + (unsigned)n * 7u) %
		    1000u) + 1;
		s = call(r->t, rid, 1, "m", tokens, "0.001", &j);
		if (s == 200 || s == 429) {
			int charged = json_is_true(json_object_get(j,
			    "charged"));

			int64_t total = jint(j, "totalTokensUsed");

			if (charged) {
				r->charged_tokens += tokens;
				r->charged_cost += 1000;
			}
			if (s == 200 && charged && total > r->max_total_200)
				r->max_total_200 = total;
			if (s == 429 && charged) {
				r->first_429++;
				r->total_at_429 = total;
			}
		} else if (s != 401) {
			r->errors++;
			fprintf(stderr, "# racer: %d %s\n", s, jstr(j,
			    "error"));
		}
		json_decref(j);
	}
	return NULL;
}

static void
concurrent(void **state)
{
	struct racer r[THREADS];
	pthread_t th[THREADS];
	struct task t;
	json_t *task;
	int64_t tokens = 0, cost = 0, start = now_mono_ms();
	int64_t at_429 = 0, max_200 = 0;
	int i, first = 0, errors = 0;
	char *spec;

	/* the budget runs out about two thirds of the way */
	spec = xasprintf("{\"budgetUSD\":\"%d.%03d\"}",
	    THREADS * CALLS * 2 / 3 / 1000, THREADS * CALLS * 2 / 3 % 1000);
	make_task(&t, spec, 0);
	free(spec);
	for (i = 0; i < THREADS; i++) {
		memset(&r[i], 0, sizeof(r[i]));
		r[i].t = &t;
		r[i].id = i;
		pthread_create(&th[i], NULL, racer_main, &r[i]);
	}
	for (i = 0; i < THREADS; i++) {
		pthread_join(th[i], NULL);
		tokens += r[i].charged_tokens;
		cost += r[i].charged_cost;
		first += r[i].first_429;
		if (r[i].first_429)
			at_429 = r[i].total_at_429;
		if (r[i].max_total_200 > max_200)
			max_200 = r[i].max_total_200;
		errors += r[i].errors;
	}
	fprintf(stderr, "# %d x %d calls in %lld ms\n", THREADS, CALLS,
	    (long long)(now_mono_ms() - start));
	task = get_task(t.name);
	assert_int_equal(errors, 0);
	/* every charge acknowledged is in the totals, and nothing else */
	assert_int_equal(jint(json_object_get(task, "status"),
	    "tokensConsumed"), tokens);
	{
		char want[32];

		meter_format_usd(cost, want);
		assert_string_equal(jstr(json_object_get(task, "status"),
		    "costUSD"), want);
	}
	/*
	 * The budget was crossed by exactly one request; it was the last
	 * charge (its totals are the final ones) and every charge before it
	 * reported less.
	 */
	assert_int_equal(first, 1);
	assert_int_equal(jint(json_object_get(task, "status"),
	    "tokensConsumed"), at_429);
	assert_true(max_200 < at_429);
	assert_string_equal(jstr(json_object_get(task, "status"), "phase"),
	    "Paused");
	json_decref(task);
	task_release(&t);
}

/*
 * complete revokes the task's token in the index (DESIGN 6), on every
 * store: not only is the task ended, its entry says revoked.
 */
static void
completion_revokes(void **state)
{
	const char *body = "{\"result\":\"succeeded\"}";
	struct meter_reply r;
	struct task t;
	json_t *e;

	(void)state;
	make_task(&t, "{}", 0);
	e = index_read(t.id);
	assert_string_equal(jstr(e, "state"), "active");
	json_decref(e);
	meter_complete(meter, t.auth, body, strlen(body), &r);
	assert_int_equal(r.status, 200);
	meter_reply_release(&r);
	e = index_read(t.id);
	assert_string_equal(jstr(e, "state"), "revoked");
	json_decref(e);
	task_release(&t);
	/*
	 * a task that ended another way (the reconciler's timeout) with its
	 * token still active: the agent's completion gets the same answer as
	 * a repeated one, and the token is revoked all the same
	 */
	make_task(&t, "{}", 0);
	patch_status(t.name, json_pack("{s:s}", "phase", "Failed"));
	meter_complete(meter, t.auth, body, strlen(body), &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.body, "{\"completed\":true,\"phase\":\"Failed\"}");
	meter_reply_release(&r);
	e = index_read(t.id);
	assert_string_equal(jstr(e, "state"), "revoked");
	json_decref(e);
	task_release(&t);
}

#if STORE_MODE == 3
/*
 * Another writer changes the task between the meter's read and its status
 * write: the write gets the API server's 409 (a stale resourceVersion)
 * and the meter starts again from a fresh read, so that neither the
 * charge (or the completion) nor the other write is lost. The fake holds
 * the meter's first status PUT while the test writes the task.
 */
struct raced {
	const struct task *t;
	int complete;
	int status;
	json_t *reply;
};

static void *
raced_main(void *arg)
{
	struct raced *x = arg;
	const char *body = "{\"result\":\"succeeded\"}";
	struct meter_reply r;

	if (x->complete) {
		meter_complete(meter, x->t->auth, body, strlen(body), &r);
		x->status = r.status;
		meter_reply_release(&r);
	} else {
		x->status = call(x->t, "raced-1", 1, "m", 100, "0.01",
		    &x->reply);
	}
	return NULL;
}

static void
write_during(struct raced *x, const char *note)
{
	struct k8s_status st = { 0 };
	pthread_t th;
	json_t *p;
	int i;

	json_decref(storeenv_fake(&env, "DELETE", "/_fake/requests", NULL));
	json_decref(storeenv_fake(&env, "POST", "/_fake/delay",
	    "{\"ms\":700,\"count\":1,\"method\":\"PUT\",\"match\":\"/status\"}"));
	assert_int_equal(pthread_create(&th, NULL, raced_main, x), 0);
	/* the meter's status PUT has arrived, and the fake holds it */
	for (i = 0; i < 400 && storeenv_fake_count(&env, "PUT", "/status") ==
	    0; i++)
		sleep_ms(5);
	assert_int_equal(storeenv_fake_count(&env, "PUT", "/status"), 1);
	p = json_pack("{s:{s:{s:s}}}", "metadata", "annotations",
	    "example.com/note", note);
	assert_int_equal(k8s_patch(env.api, &K8S_AGENTTASK, NS, x->t->name, 0,
	    p, NULL, &st), 0);
	json_decref(p);
	assert_int_equal(pthread_join(th, NULL), 0);
	/* the first PUT was refused (409), the second, from a new read, not */
	assert_int_equal(storeenv_fake_count(&env, "PUT", "/status"), 2);
}

static void
conflicting_writer(void **state)
{
	struct raced x = { 0 };
	struct task t;
	json_t *task, *e;

	(void)state;
	make_task(&t, "{}", 0);
	x.t = &t;
	write_during(&x, "one");
	assert_int_equal(x.status, 200);
	assert_true(json_is_true(json_object_get(x.reply, "charged")));
	assert_int_equal(jint(x.reply, "totalTokensUsed"), 100);
	json_decref(x.reply);
	task = get_task(t.name);
	assert_int_equal(jint(json_object_get(task, "status"),
	    "tokensConsumed"), 100);
	assert_string_equal(jstr(json_object_get(json_object_get(task,
	    "metadata"), "annotations"), "example.com/note"), "one");
	json_decref(task);
	/* the same for complete */
	memset(&x, 0, sizeof(x));
	x.t = &t;
	x.complete = 1;
	write_during(&x, "two");
	assert_int_equal(x.status, 200);
	task = get_task(t.name);
	assert_string_equal(jstr(json_object_get(task, "status"), "phase"),
	    "Completed");
	assert_int_equal(jint(json_object_get(task, "status"),
	    "tokensConsumed"), 100);
	assert_string_equal(jstr(json_object_get(json_object_get(task,
	    "metadata"), "annotations"), "example.com/note"), "two");
	json_decref(task);
	e = index_read(t.id);
	assert_string_equal(jstr(e, "state"), "revoked");
	json_decref(e);
	task_release(&t);
}

/*
 * The status write of a charge is done, but its answer is lost (a 504, a
 * dropped connection): the client does not send it again; the charge is
 * answered 503, and the agent's retry with the same requestId finds it in
 * the ring: charged once.
 */
static void
lost_answer(void **state)
{
	static const char *const rules[] = {
	    "{\"status\":504,\"after\":true,\"method\":\"PUT\","
	    "\"match\":\"/status\"}",
	    "{\"close\":true,\"after\":true,\"method\":\"PUT\","
	    "\"match\":\"/status\"}" };
	struct task t;
	json_t *j, *task, *ring;
	char rid[16];
	size_t i, k, seen;
	int s;

	make_task(&t, "{}", 0);
	for (i = 0; i < ARRAY_SIZE(rules); i++) {
		snprintf(rid, sizeof(rid), "lost-%zu", i);
		json_decref(storeenv_fake(&env, "POST", "/_fake/faults",
		    rules[i]));
		s = call(&t, rid, 1, "m", 100, "0.01", &j);
		json_decref(j);
		assert_int_equal(s, 503);
		assert_int_equal(call(&t, rid, 1, "m", 100, "0.01", &j), 200);
		assert_true(json_is_false(json_object_get(j, "charged")));
		assert_int_equal(jint(j, "totalTokensUsed"), 100 * (i + 1));
		json_decref(j);
	}
	task = get_task(t.name);
	assert_int_equal(jint(json_object_get(task, "status"),
	    "tokensConsumed"), 200);
	assert_string_equal(jstr(json_object_get(task, "status"), "costUSD"),
	    "0.020000");
	ring = json_object_get(json_object_get(task, "status"),
	    "lastMeterRequestIds");
	for (i = 0; i < ARRAY_SIZE(rules); i++) {
		snprintf(rid, sizeof(rid), "lost-%zu", i);
		for (k = 0, seen = 0; k < json_array_size(ring); k++)
			seen += strcmp(json_string_value(json_array_get(ring,
			    k)), rid) == 0;
		assert_int_equal(seen, 1);
	}
	json_decref(task);
	task_release(&t);
}
#endif

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(usd_parsing),
		cmocka_unit_test(body_validation),
		cmocka_unit_test(authentication),
		cmocka_unit_test(index_entries_as_written),
		cmocka_unit_test(malformed_entry_revoked),
		cmocka_unit_test(recreated_task),
		cmocka_unit_test(revoke_task_tokens),
		cmocka_unit_test(not_live),
		cmocka_unit_test(models),
		cmocka_unit_test(models_attenuated),
		cmocka_unit_test(large_guidance),
		cmocka_unit_test(ok_reply_and_ring),
		cmocka_unit_test(budgets),
		cmocka_unit_test(appended_budget),
		cmocka_unit_test(large_totals),
		cmocka_unit_test(iterations),
		cmocka_unit_test(completion),
		cmocka_unit_test(completion_fields),
		cmocka_unit_test(completion_revokes),
		cmocka_unit_test(pruning),
		cmocka_unit_test(concurrent),
#if STORE_MODE == 3
		cmocka_unit_test(lost_answer),
		cmocka_unit_test(conflicting_writer),
#endif
	};

	return cmocka_run_group_tests_name(STORE_MODE == 1 ? "meter-embedded" :
	    STORE_MODE == 2 ? "meter-http" : "meter-fake", tests, setup,
	    teardown);
}
