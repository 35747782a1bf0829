/*
 * The AgentTask reconciler on the embedded store (and, for the happy path
 * and pause/resume, through the REST client against the embedded store
 * served over HTTP). Nothing runs Sandboxes here, so the tests play the
 * agent-sandbox controller: they write Sandbox status the way
 * reference/agent-sandbox.md describes it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sys/stat.h>

#include "config/config.h"
#include "controller/controller.h"
#include "controller/slots.h"
#include "meter/meter.h"
#include "notifier/notifier.h"
#include "scm/scm.h"
#include "storeenv.h"

#define NS "rec"

static struct storeenv env;
static struct k8s_api *store;	/* the embedded store itself */
static struct meter *meter;
static struct config cfg;
static struct controller_config cc;
static unsigned char key[MACAROON_KEY_LEN];
static int counter;

static int
streq_safe(const char *a, const char *b)
{
	return a != NULL && b != NULL && strcmp(a, b) == 0;
}

/* Open the store of mode (see storeenv.h) and the meter on it; 0 or -1. */
static int
open_store(int mode, size_t history)
{
	struct meter_config mc;
	char *cause = NULL;

	if (storeenv_open(&env, mode, history) < 0)
		return -1;
	store = mode == 1 ? env.api : env.backing;
	memset(&mc, 0, sizeof(mc));
	mc.store = env.api;
	mc.root_key = key;
	mc.location = "http://127.0.0.1:8080";
	mc.default_budget_usd_micro = cfg.defaults.budget_usd_micro;
	mc.default_budget_tokens = cfg.defaults.budget_tokens;
	assert_int_equal(meter_new(&meter, &mc, &cause), 0);
	memset(&cc, 0, sizeof(cc));
	cc.store = env.api;
	cc.meter = meter;
	cc.cfg = &cfg;
	return 0;
}

static void
open_history(int mode, size_t history)
{
	assert_int_equal(open_store(mode, history), 0);
}

static void
open_all(int mode)
{
	open_history(mode, 1000);
}

static void
close_all(void)
{
	meter_free(meter);
	meter = NULL;
	storeenv_close(&env);
}

/*
 * The store of mode afresh; 0, or -1 when the fake kube-apiserver (mode
 * 3) does not start: said, and the embedded store is back for the tests
 * that follow.
 */
static int
reopen_store(int mode)
{
	close_all();
	if (open_store(mode, 1000) == 0)
		return 0;
	assert_int_equal(mode, 3);
	fprintf(stderr, "# skip: the fake kube-apiserver does not start "
	    "(python3, openssl)\n");
	storeenv_close(&env);
	open_all(1);
	return -1;
}

static int
setup(void **state)
{
	(void)state;
	util_json_init();
	log_setup(LOG_ERROR, 0);
	random_bytes(key, sizeof(key));
	config_defaults(&cfg);
	cfg.preview.url_template = xstrdup("https://preview.example.com/"
	    "?_diverge_env={env}");
	open_all(1);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	close_all();
	config_release(&cfg);
	return 0;
}

/* ---------------------------------------------------------- fixtures */

/* Create task name (taken) in NS; returns name. */
static char *
new_task_named(char *name, const char *spec_extra, const char *ann_extra)
{
	struct k8s_status st = { 0 };
	char *text = xasprintf("{\"apiVersion\":\"divergedev.com/v1alpha1\","
	    "\"kind\":\"AgentTask\",\"metadata\":{\"name\":\"%s\","
	    "\"annotations\":{\"divergedev.com/preview-service\":\"web\","
	    "\"divergedev.com/preview-port\":\"8080\"%s}},\"spec\":{"
	    "\"objective\":\"fix the N+1 queries\",\"repository\":{\"url\":"
	    "\"https://github.com/o/r\",\"baseBranch\":\"main\","
	    "\"workingBranch\":\"diverge/fix-1\"},\"maxIterations\":8,"
	    "\"capabilities\":[\"claude-*\"],\"allowedTools\":[\"bash\","
	    "\"git\"],\"budgetUSD\":\"2.50\",\"budgetTokens\":100000,"
	    "\"sandbox\":{\"provider\":\"agent-sandbox\",\"timeoutSeconds\":"
	    "1800}%s}}", name, ann_extra ? ann_extra : "", spec_extra ?
	    spec_extra : "");
	json_t *o = json_loads(text, 0, NULL);

	assert_non_null(o);
	assert_int_equal(k8s_create(env.api, &K8S_AGENTTASK, NS, o, NULL,
	    &st), 0);
	json_decref(o);
	free(text);
	return name;
}

static char *
new_task(const char *spec_extra, const char *ann_extra)
{
	return new_task_named(xasprintf("t%d", ++counter), spec_extra,
	    ann_extra);
}

static json_t *
get(const struct k8s_resource *r, const char *name)
{
	struct k8s_status st = { 0 };
	json_t *o = NULL;
	int rc = k8s_get(env.api, r, NS, name, &o, &st);

	k8s_status_release(&st);
	return rc == 0 ? o : NULL;
}

static json_t *
get_task(const char *name)
{
	json_t *o = get(&K8S_AGENTTASK, name);

	assert_non_null(o);
	return o;
}

static const json_t *
jget(const json_t *o, const char *path)
{
	char p[256], *seg, *save = NULL;
	const json_t *cur = o;

	snprintf(p, sizeof(p), "%s", path);
	for (seg = strtok_r(p, ".", &save); seg != NULL && cur != NULL;
	    seg = strtok_r(NULL, ".", &save)) {
		/* label and annotation keys hold dots: the rest is the key */
		if (strcmp(seg, "labels") == 0 ||
		    strcmp(seg, "annotations") == 0) {
			cur = json_object_get(cur, seg);
			seg = strtok_r(NULL, "", &save);
			if (seg != NULL)
				cur = json_object_get(cur, seg);
			break;
		}
		if (json_is_array(cur))
			cur = json_array_get(cur, (size_t)strtol(seg, NULL,
			    10));
		else
			cur = json_object_get(cur, seg);
	}
	return cur;
}

static const char *
jp(const json_t *o, const char *path)
{
	static char buf[16][256];
	static int slot;
	char *p = buf[slot++ % 16];
	const json_t *cur;

	snprintf(p, 256, "%s", path);
	cur = jget(o, p);
	return json_string_value(cur);
}

static void
reconcile(const char *name)
{
	char *cause = NULL;
	int rc = controller_reconcile(&cc, NS, name, NULL, NULL, &cause);

	if (rc != 0)
		fprintf(stderr, "# reconcile: %s\n", cause ? cause : "?");
	assert_int_equal(rc, 0);
	free(cause);
}

static void
assert_phase(const char *name, const char *phase)
{
	json_t *t = get_task(name);

	if (!streq_safe(jp(t, "status.phase"), phase))
		fprintf(stderr, "# %s: phase %s, want %s (%s)\n", name,
		    jp(t, "status.phase"), phase, jp(t, "status.message"));
	assert_string_equal(jp(t, "status.phase"), phase);
	json_decref(t);
}
static void
assert_reason(const char *name, const char *reason)
{
	json_t *t = get_task(name);

	assert_string_equal(jp(t, "status.reason"), reason);
	json_decref(t);
}
/* A pass, and the task is in phase: the task read (to json_decref). */
static json_t *
pass_to(const char *name, const char *phase)
{
	reconcile(name);
	assert_phase(name, phase);
	return get_task(name);
}

/* Two passes, then the task is in phase and has no member path. */
static void
twice_without(const char *name, const char *phase, const char *path)
{
	json_t *t;

	reconcile(name);
	t = pass_to(name, phase);
	assert_null(jget(t, path));
	json_decref(t);
}

static const json_t *
cond(const json_t *obj, const char *type)
{
	size_t i;
	json_t *c;

	json_array_foreach(json_object_get(json_object_get(obj, "status"),
	    "conditions"), i, c)
		if (strcmp(json_string_value(json_object_get(c, "type")),
		    type) == 0)
			return c;
	return NULL;
}

/*
 * Play the agent-sandbox controller: Ready status/reason for the current
 * generation (gen_delta -1: a stale one), a pod IP or none, and the
 * Suspended condition.
 */
static void
play_msg(const char *name, const char *ready, const char *reason,
    const char *message, int gen_delta, const char *ip, int suspended,
    int64_t ltt)
{
	struct k8s_status st = { 0 };
	json_t *sb = get(&K8S_SANDBOX, name), *status;
	char ts[32];

	assert_non_null(sb);
	time_rfc3339(ltt ? ltt : now_unix(), ts);
	status = json_pack("{s:[{s:s,s:s,s:s,s:s,s:I,s:s},{s:s,s:s,s:s,s:s,"
	    "s:I,s:s}]}", "conditions", "type", "Ready", "status", ready,
	    "reason", reason, "message", message, "observedGeneration",
	    (json_int_t)(k8s_meta_int(sb, "generation") + gen_delta),
	    "lastTransitionTime", ts, "type", "Suspended", "status",
	    suspended ? "True" : "False", "reason", suspended ?
	    "PodTerminated" : "NotSuspended", "message", "",
	    "observedGeneration", (json_int_t)k8s_meta_int(sb, "generation"),
	    "lastTransitionTime", ts);
	if (ip != NULL)
		json_object_set_new(status, "podIPs", json_pack("[s]", ip));
	json_object_set_new(sb, "status", status);
	assert_int_equal(k8s_update_status(env.api, &K8S_SANDBOX, NS, name,
	    sb, NULL, &st), 0);
	json_decref(sb);
}

static void
play(const char *name, const char *ready, const char *reason, int gen_delta,
    const char *ip, int suspended, int64_t ltt)
{
	play_msg(name, ready, reason, "played", gen_delta, ip, suspended,
	    ltt);
}
/* The Sandbox Suspended as play says, then a pass: the task in phase. */
static void
played(const char *name, const char *ready, const char *reason,
    const char *ip, const char *phase)
{
	play(name, ready, reason, 0, ip, 1, 0);
	reconcile(name);
	assert_phase(name, phase);
}

static void
set_suspended(const char *name, int on)
{
	struct k8s_status st = { 0 };
	json_t *p = json_pack("{s:{s:b}}", "spec", "suspended", on);

	assert_int_equal(k8s_patch(env.api, &K8S_AGENTTASK, NS, name, 0, p,
	    NULL, &st), 0);
	json_decref(p);
}

/* A merge patch on the task (status: on its status subresource). */
static void
patch_task(const char *name, int status, const char *json)
{
	struct k8s_status st = { 0 };
	json_t *p = json_loads(json, 0, NULL);

	assert_non_null(p);
	assert_int_equal(k8s_patch(env.api, &K8S_AGENTTASK, NS, name, status,
	    p, NULL, &st), 0);
	json_decref(p);
}

static void
patch_status(const char *name, const char *json)
{
	patch_task(name, 1, json);
}

/* The token of the task's Secret (a new string). */
static char *
token_of(const char *name)
{
	char *sname = xasprintf("%s-token", name);
	json_t *s = get(&K8S_SECRET, sname);
	const char *b64;
	unsigned char *raw = NULL;
	size_t n;

	assert_non_null(s);
	b64 = jp(s, "data.token");
	assert_non_null(b64);
	assert_int_equal(base64_decode(b64, strlen(b64), &raw, &n), 0);
	json_decref(s);
	free(sname);
	return (char *)raw;
}

/* The state of token id in the index ("active", "revoked" or NULL). */
static char *
index_state(const char *id)
{
	json_t *idx = get(&K8S_SECRET, METER_INDEX_SECRET), *e;
	const char *v;
	unsigned char *raw = NULL;
	size_t n;
	char *state = NULL;

	v = json_string_value(json_object_get(json_object_get(idx, "data"),
	    id));
	if (v != NULL && base64_decode(v, strlen(v), &raw, &n) == 0) {
		e = json_loadb((char *)raw, n, 0, NULL);
		if (json_string_value(json_object_get(e, "state")) != NULL)
			state = xstrdup(json_string_value(json_object_get(e,
			    "state")));
		json_decref(e);
	}
	free(raw);
	json_decref(idx);
	return state;
}

/* How many tokens of the task named name the index has active. */
static int
index_active_tokens(const char *name)
{
	json_t *idx = get(&K8S_SECRET, METER_INDEX_SECRET), *e, *v;
	unsigned char *raw = NULL;
	const char *k;
	size_t n;
	int count = 0;

	json_object_foreach(json_object_get(idx, "data"), k, v) {
		if (base64_decode(json_string_value(v), strlen(
		    json_string_value(v)), &raw, &n) < 0)
			continue;
		e = json_loadb((char *)raw, n, 0, NULL);
		if (streq_safe(jp(e, "task"), name) &&
		    streq_safe(jp(e, "state"), "active"))
			count++;
		json_decref(e);
		free(raw);
		raw = NULL;
	}
	json_decref(idx);
	return count;
}

static void
assert_index(const char *id, const char *state)
{
	char *s = index_state(id);

	assert_non_null(s);
	assert_string_equal(s, state);
	free(s);
}

static int
charge(const char *token, int64_t tokens, const char *rid)
{
	struct meter_reply r = { 0 };
	char *auth = xasprintf("Bearer %s", token);
	char *body = xasprintf("{\"requestId\":\"%s\",\"iteration\":1,"
	    "\"model\":\"claude-3\",\"tokensUsed\":%lld,\"costUSD\":0.01}",
	    rid, (long long)tokens);
	int status;

	meter_charge(meter, auth, body, strlen(body), &r);
	status = r.status;
	meter_reply_release(&r);
	free(auth);
	free(body);
	return status;
}

/*
 * The task's token was replaced: a new id active in the index, the old
 * one revoked; the old token is refused, the new one charges.
 */
static void
assert_token_replaced(const char *name, const char *old_id,
    const char *old_tok)
{
	json_t *t = get_task(name);
	char *tok = token_of(name);

	assert_string_not_equal(jp(t, "status.tokenId"), old_id);
	assert_index(jp(t, "status.tokenId"), "active");
	assert_index(old_id, "revoked");
	assert_int_equal(charge(old_tok, 1, "replaced-old"), 401);
	assert_int_equal(charge(tok, 1, "replaced-new"), 200);
	json_decref(t);
	free(tok);
}

static uint64_t
writes(void)
{
	return k8s_embedded_write_count(store);
}

static const char *
env_value(const json_t *container, const char *name)
{
	size_t i;
	json_t *e;

	json_array_foreach(json_object_get(container, "env"), i, e)
		if (strcmp(json_string_value(json_object_get(e, "name")),
		    name) == 0)
			return json_string_value(json_object_get(e, "value"));
	return NULL;
}

/* The owner reference and labels every child carries. */
static void
assert_owned(const json_t *child, const json_t *task)
{
	const json_t *ref = jget(child, "metadata.ownerReferences.0");

	assert_int_equal(json_array_size(jget(child,
	    "metadata.ownerReferences")), 1);
	assert_string_equal(jp(ref, "apiVersion"), "divergedev.com/v1alpha1");
	assert_string_equal(jp(ref, "kind"), "AgentTask");
	assert_string_equal(jp(ref, "name"), k8s_meta_str(task, "name"));
	assert_string_equal(jp(ref, "uid"), k8s_meta_str(task, "uid"));
	assert_true(json_is_true(json_object_get(ref, "controller")));
	assert_string_equal(jp(child, "metadata.labels.divergedev.com/task"),
	    k8s_meta_str(task, "name"));
}

/* Bring a new task to Provisioning (two passes); returns name. */
static char *
provision(char *name)
{
	reconcile(name);
	assert_phase(name, "Pending");
	reconcile(name);
	assert_phase(name, "Provisioning");
	return name;
}

/* Create a task and bring it to Provisioning. */
static char *
provisioned(const char *spec_extra, const char *ann_extra)
{
	return provision(new_task(spec_extra, ann_extra));
}

static char *
active(void)
{
	char *name = provisioned(NULL, NULL);

	play(name, "True", "DependenciesReady", 0, "10.0.0.7", 0, 0);
	reconcile(name);
	assert_phase(name, "Active");
	return name;
}

/* Pause a live task: Pausing, the Sandbox stops, Paused. */
static void
pause_task(const char *name)
{
	set_suspended(name, 1);
	reconcile(name);
	assert_phase(name, "Pausing");
	play(name, "False", "SandboxSuspended", 0, NULL, 1, 0);
	reconcile(name);
	assert_phase(name, "Paused");
}

/* The task's status.tokenId (a new string). */
static char *
task_token_id(const char *name)
{
	json_t *t = get_task(name);
	char *id;

	assert_non_null(jp(t, "status.tokenId"));
	id = xstrdup(jp(t, "status.tokenId"));
	json_decref(t);
	return id;
}

/* A pass takes name to Provisioning with a new live token, not old_id. */
static void
assert_minted_anew(const char *name, const char *old_id)
{
	json_t *t = pass_to(name, "Provisioning");

	assert_non_null(jp(t, "status.tokenId"));
	assert_string_not_equal(jp(t, "status.tokenId"), old_id);
	assert_index(jp(t, "status.tokenId"), "active");
	json_decref(t);
}

/*
 * The task's Sandbox has operatingMode mode and records token_id (when
 * not NULL) as the token its pod was started with.
 */
static void
assert_sandbox(const char *name, const char *mode, const char *token_id)
{
	json_t *sb = get(&K8S_SANDBOX, name);
	const char *id = jp(sb, "metadata.annotations.divergedev.com/"
	    "token-id");

	assert_non_null(sb);
	assert_string_equal(jp(sb, "spec.operatingMode"), mode);
	if (token_id != NULL) {
		assert_non_null(id);
		assert_string_equal(id, token_id);
	}
	json_decref(sb);
}

/*
 * The task's token was replaced while the Sandbox's pod (started with
 * old_id) may still run: no Active, the Sandbox Suspended until its pod
 * is gone, then Running, recording the new token (which its new pod
 * mounts), and Active once Ready.
 */
static void
assert_sandbox_rolled(const char *name, const char *old_id)
{
	json_t *t = get_task(name);
	char *id;

	assert_phase(name, "Provisioning");
	assert_sandbox(name, "Suspended", old_id);
	assert_string_equal(jp(t, "status.message"),
	    "restarting the sandbox with the new token");
	json_decref(t);
	/* a Ready of the old pod counts for nothing */
	play(name, "True", "DependenciesReady", 0, "10.0.0.7", 0, 0);
	reconcile(name);
	assert_phase(name, "Provisioning");
	assert_sandbox(name, "Suspended", old_id);
	/* the pod is gone: Running, with the live token */
	play(name, "False", "SandboxSuspended", 0, NULL, 1, 0);
	reconcile(name);
	assert_phase(name, "Provisioning");
	id = task_token_id(name);
	assert_string_not_equal(id, old_id);
	assert_sandbox(name, "Running", id);
	free(id);
	play(name, "True", "DependenciesReady", 0, "10.0.0.8", 0, 0);
	reconcile(name);
	assert_phase(name, "Active");
}

/* ------------------------------------------------------------- tests */

/* (new) -> Pending, nothing else written, and a pass again at once. */
static void
test_new_pending(void **state)
{
	char *name = new_task(NULL, NULL), *cause = NULL;
	uint64_t w0 = writes();
	int64_t requeue = -1;
	json_t *t;
	char *sname = xasprintf("%s-token", name);

	(void)state;
	assert_int_equal(controller_reconcile(&cc, NS, name, &requeue, NULL,
	    &cause), 0);
	assert_int_equal(writes() - w0, 1);
	/* the next pass, which provisions it, at once */
	assert_int_equal(requeue, 0);
	t = get_task(name);
	assert_string_equal(jp(t, "status.phase"), "Pending");
	assert_int_equal(json_integer_value(jget(t,
	    "status.observedGeneration")), 1);
	assert_null(get(&K8S_SANDBOX, name));
	assert_null(get(&K8S_SECRET, sname));
	json_decref(t);
	free(sname);
	free(name);
}

/* Pending -> Provisioning: every child, exactly shaped. */
static void
test_provisioning_children(void **state)
{
	char *name = provisioned(NULL, NULL), *sname, *ename, *token;
	json_t *t = get_task(name), *sec, *sb, *envo, *np, *pod, *c;
	struct macaroon *m = NULL;
	int64_t exp = 0;
	const char *id;
	char purl[256];

	(void)state;
	sname = xasprintf("%s-token", name);
	ename = xasprintf("agent-preview-%s", name);
	snprintf(purl, sizeof(purl), "https://preview.example.com/"
	    "?_diverge_env=%s", ename);

	/* token Secret, index entry, status.tokenId, caveats */
	sec = get(&K8S_SECRET, sname);
	assert_non_null(sec);
	assert_owned(sec, t);
	assert_string_equal(jp(sec, "type"), "Opaque");
	id = jp(t, "status.tokenId");
	assert_non_null(id);
	assert_string_equal(jp(sec, "metadata.annotations."
	    "divergedev.com/token-id"), id);
	assert_index(id, "active");
	token = token_of(name);
	assert_int_equal(macaroon_inspect(token, strlen(token), &m, NULL), 0);
	assert_string_equal(macaroon_value(m, "task_id"), name);
	assert_string_equal(macaroon_value(m, "namespace"), NS);
	assert_string_equal(macaroon_value(m, "repo"),
	    "https://github.com/o/r");
	assert_string_equal(macaroon_value(m, "branch"), "diverge/fix-1");
	assert_string_equal(macaroon_value(m, "tools"), "bash,git");
	assert_string_equal(macaroon_value(m, "models"), "claude-*");
	assert_string_equal(macaroon_value(m, "max_cost_usd"), "2.500000");
	assert_string_equal(macaroon_value(m, "max_tokens"), "100000");
	assert_int_equal(macaroon_expires(m, &exp), 0);
	assert_true(exp >= now_unix() + 1800 + 3600 - 5 &&
	    exp <= now_unix() + 1800 + 3600);
	macaroon_free(m);
	assert_int_equal(charge(token, 10, "r1"), 200);
	free(token);

	/* Environment */
	envo = get(&K8S_ENVIRONMENT, ename);
	assert_non_null(envo);
	assert_owned(envo, t);
	assert_string_equal(jp(envo, "apiVersion"), "divergedev.com/v1alpha1");
	assert_string_equal(jp(envo, "spec.branch"), "diverge/fix-1");
	assert_string_equal(jp(envo, "spec.repository"),
	    "https://github.com/o/r");
	assert_string_equal(jp(envo, "spec.service"), "web");
	assert_int_equal(json_integer_value(jget(envo, "spec.port")), 8080);
	assert_null(jget(envo, "metadata.annotations.divergedev.com/"
	    "hibernated"));
	assert_string_equal(jp(t, "metadata.annotations.divergedev.com/"
	    "preview-environment"), ename);
	assert_string_equal(jp(t, "metadata.annotations.divergedev.com/"
	    "preview-url"), purl);
	assert_string_equal(jp(t, "status.previewEnvironment"), ename);
	assert_string_equal(jp(t, "status.previewUrl"), purl);

	/* Sandbox */
	sb = get(&K8S_SANDBOX, name);
	assert_non_null(sb);
	assert_owned(sb, t);
	assert_string_equal(jp(sb, "apiVersion"), "agents.x-k8s.io/v1beta1");
	assert_string_equal(jp(sb, "spec.operatingMode"), "Running");
	assert_null(jget(sb, "spec.shutdownTime"));
	assert_null(jget(sb, "spec.replicas"));
	assert_string_equal(jp(sb, "spec.podTemplate.metadata.labels."
	    "divergedev.com/task"), name);
	pod = (json_t *)jget(sb, "spec.podTemplate.spec");
	assert_true(json_is_false(json_object_get(pod,
	    "automountServiceAccountToken")));
	assert_null(json_object_get(pod, "runtimeClassName"));
	assert_true(json_is_true(jget(pod, "securityContext.runAsNonRoot")));
	assert_int_equal(json_integer_value(jget(pod,
	    "securityContext.runAsUser")), 64000);
	assert_int_equal(json_integer_value(jget(pod,
	    "securityContext.runAsGroup")), 64000);
	assert_int_equal(json_integer_value(jget(pod,
	    "securityContext.fsGroup")), 64000);
	assert_string_equal(jp(pod, "securityContext.seccompProfile.type"),
	    "RuntimeDefault");
	assert_int_equal(json_array_size(json_object_get(pod, "containers")),
	    1);
	c = json_array_get(json_object_get(pod, "containers"), 0);
	assert_string_equal(jp(c, "image"),
	    "ghcr.io/divergedev/agent-runner:latest");
	assert_true(json_is_true(jget(c,
	    "securityContext.readOnlyRootFilesystem")));
	assert_true(json_is_false(jget(c,
	    "securityContext.allowPrivilegeEscalation")));
	assert_true(json_is_true(jget(c, "securityContext.runAsNonRoot")));
	assert_string_equal(jp(c, "securityContext.capabilities.drop.0"),
	    "ALL");
	assert_int_equal(json_array_size(jget(c,
	    "securityContext.capabilities.drop")), 1);
	assert_non_null(jget(c, "resources.requests.cpu"));
	assert_null(jget(c, "resources.limits"));
	assert_string_equal(env_value(c, "DIVERGE_TASK_NAME"), name);
	assert_string_equal(env_value(c, "DIVERGE_OBJECTIVE"),
	    "fix the N+1 queries");
	assert_string_equal(env_value(c, "DIVERGE_REPO_URL"),
	    "https://github.com/o/r");
	assert_string_equal(env_value(c, "DIVERGE_BASE_BRANCH"), "main");
	assert_string_equal(env_value(c, "DIVERGE_WORKING_BRANCH"),
	    "diverge/fix-1");
	assert_string_equal(env_value(c, "DIVERGE_MAX_ITERATIONS"), "8");
	assert_string_equal(env_value(c, "DIVERGE_METER_URL"),
	    "http://127.0.0.1:8080/api/v1/agenttask/meter");
	assert_string_equal(env_value(c, "DIVERGE_TOKEN_FILE"),
	    "/etc/diverge/token/token");
	assert_string_equal(env_value(c, "DIVERGE_PREVIEW_URL"), purl);
	assert_string_equal(env_value(c, "DIVERGE_PREVIEW_HEADER_KEY"),
	    "x-diverge-env");
	assert_string_equal(env_value(c, "DIVERGE_PREVIEW_HEADER_VALUE"),
	    ename);
	assert_null(env_value(c, "DIVERGE_MACAROON_TOKEN"));
	assert_string_equal(jp(c, "volumeMounts.0.name"), "token");
	assert_string_equal(jp(c, "volumeMounts.0.mountPath"),
	    "/etc/diverge/token");
	assert_true(json_is_true(jget(c, "volumeMounts.0.readOnly")));
	assert_string_equal(jp(c, "volumeMounts.1.mountPath"), "/tmp");
	assert_string_equal(jp(c, "volumeMounts.2.name"), "workspace");
	assert_string_equal(jp(c, "volumeMounts.2.mountPath"), "/workspace");
	assert_string_equal(jp(pod, "volumes.0.secret.secretName"), sname);
	/* the token file: the agent's uid and group read it, no one else */
	assert_int_equal(json_integer_value(jget(pod,
	    "volumes.0.secret.defaultMode")), 0440);
	assert_non_null(jget(pod, "volumes.1.emptyDir"));
	assert_string_equal(jp(sb, "spec.volumeClaimTemplates.0.metadata."
	    "name"), "workspace");
	assert_string_equal(jp(sb, "spec.volumeClaimTemplates.0.spec."
	    "resources.requests.storage"), "5Gi");
	assert_string_equal(jp(sb, "spec.volumeClaimTemplates.0.spec."
	    "accessModes.0"), "ReadWriteOnce");

	/* NetworkPolicy */
	np = get(&K8S_NETWORKPOLICY, CONTROLLER_NETPOL);
	assert_non_null(np);
	assert_string_equal(jp(np, "metadata.labels.app.kubernetes.io/"
	    "managed-by"), "diverged");
	assert_string_equal(jp(np, "spec.policyTypes.0"), "Ingress");
	assert_string_equal(jp(np, "spec.policyTypes.1"), "Egress");
	assert_int_equal(json_array_size(jget(np, "spec.ingress")), 0);
	assert_int_equal(json_integer_value(jget(np,
	    "spec.egress.0.ports.0.port")), 53);
	assert_string_equal(jp(np, "spec.egress.0.ports.0.protocol"), "UDP");
	assert_string_equal(jp(np, "spec.egress.1.to.0.ipBlock.except.0"),
	    "169.254.0.0/16");
	assert_int_equal(json_integer_value(jget(np,
	    "spec.egress.1.ports.0.port")), 443);
	assert_int_equal(json_integer_value(jget(np,
	    "spec.egress.1.ports.1.port")), 22);

	/* status */
	assert_string_equal(jp(t, "status.sandboxName"), name);
	assert_string_equal(jp(cond(t, "TokenIssued"), "status"), "True");
	assert_string_equal(jp(cond(t, "Ready"), "status"), "False");
	assert_string_equal(jp(cond(t, "SandboxReady"), "status"), "False");
	assert_string_equal(jp(cond(t, "PreviewReady"), "status"), "True");
	assert_non_null(jp(t, "status.startedAt"));

	json_decref(t);
	json_decref(sec);
	json_decref(envo);
	json_decref(sb);
	json_decref(np);
	free(sname);
	free(ename);
	free(name);
}

/*
 * A task with no budgets of its own gets the configured defaults in its
 * token, never 0 (unlimited): a call past the default token budget is
 * refused.
 */
static void
test_token_default_budgets(void **state)
{
	char *name = provisioned(",\"budgetUSD\":null,\"budgetTokens\":0",
	    NULL);
	char *token = token_of(name), money[32], num[32];
	struct macaroon *m = NULL;

	(void)state;
	assert_true(cfg.defaults.budget_usd_micro > 0);
	assert_true(cfg.defaults.budget_tokens > 0);
	assert_int_equal(macaroon_inspect(token, strlen(token), &m, NULL), 0);
	meter_format_usd(cfg.defaults.budget_usd_micro, money);
	snprintf(num, sizeof(num), "%lld",
	    (long long)cfg.defaults.budget_tokens);
	assert_string_equal(macaroon_value(m, "max_cost_usd"), money);
	assert_string_equal(macaroon_value(m, "max_tokens"), num);
	macaroon_free(m);
	assert_int_equal(charge(token, cfg.defaults.budget_tokens, "d1"), 200);
	assert_int_equal(charge(token, 1, "d2"), 429);
	free(token);
	free(name);
}

/* Reconciling an unchanged state writes nothing, in every phase. */
static void
test_idempotent(void **state)
{
	char *name = provisioned(NULL, NULL);
	uint64_t w0;

	(void)state;
	w0 = writes();
	reconcile(name);
	reconcile(name);
	assert_int_equal(writes(), w0);
	play(name, "True", "DependenciesReady", 0, "10.0.0.7", 0, 0);
	reconcile(name);
	assert_phase(name, "Active");
	w0 = writes();
	reconcile(name);
	assert_int_equal(writes(), w0);
	set_suspended(name, 1);
	reconcile(name);
	w0 = writes();
	reconcile(name);
	assert_int_equal(writes(), w0);
	free(name);
}

/*
 * A NetworkPolicy read back from a real API server has no "ingress" when
 * it was written with "ingress": [] (omitempty): that is no difference to
 * repair, or every reconcile would rewrite it.
 */
static void
test_netpol_omitempty(void **state)
{
	struct k8s_status st = { 0 };
	char *name = provisioned(NULL, NULL);
	json_t *np, *p;
	uint64_t w0;

	(void)state;
	p = json_pack("{s:{s:n}}", "spec", "ingress");
	assert_int_equal(k8s_patch(env.api, &K8S_NETWORKPOLICY, NS,
	    CONTROLLER_NETPOL, 0, p, NULL, &st), 0);
	json_decref(p);
	np = get(&K8S_NETWORKPOLICY, CONTROLLER_NETPOL);
	assert_null(jget(np, "spec.ingress"));
	json_decref(np);
	w0 = writes();
	reconcile(name);
	reconcile(name);
	assert_int_equal(writes(), w0);
	free(name);
}

static pthread_mutex_t mmu = PTHREAD_MUTEX_INITIALIZER;
static struct { int64_t id; char *body; } cm[64];
static int ncm, nfinal, nupdates;
static int64_t nextid = 100;
static void (*in_update)(void);

static int m_list(struct scm_client *c, const struct scm_repo *r, int64_t n,
    struct scm_comment **out, size_t *nout, char **cause)
{
	int i;
	pthread_mutex_lock(&mmu);
	*out = xcalloc((size_t)ncm + 1, sizeof(**out));
	for (i = 0; i < ncm; i++) {
		(*out)[i].id = cm[i].id;
		(*out)[i].author = xstrdup("diverge-bot");
		(*out)[i].body = xstrdup(cm[i].body);
	}
	*nout = (size_t)ncm;
	pthread_mutex_unlock(&mmu);
	return SCM_OK;
}
static int m_create(struct scm_client *c, const struct scm_repo *r, int64_t n,
    const char *body, int64_t *id, char **cause)
{
	pthread_mutex_lock(&mmu);
	cm[ncm].id = *id = nextid++;
	cm[ncm].body = xstrdup(body);
	if (strstr(body, NOTIFIER_MARKER) == NULL)
		nfinal++;
	ncm++;
	pthread_mutex_unlock(&mmu);
	return SCM_OK;
}
static int m_update(struct scm_client *c, const struct scm_repo *r, int64_t n,
    int64_t id, const char *body, char **cause)
{
	int i;
	if (in_update != NULL) { void (*f)(void) = in_update; in_update = NULL; f(); }
	pthread_mutex_lock(&mmu);
	nupdates++;
	for (i = 0; i < ncm; i++)
		if (cm[i].id == id) { free(cm[i].body); cm[i].body = xstrdup(body); }
	pthread_mutex_unlock(&mmu);
	return SCM_OK;
}
static int m_delete(struct scm_client *c, const struct scm_repo *r, int64_t n,
    int64_t id, char **cause) { return SCM_OK; }
static int m_whoami(struct scm_client *c, char **login, int64_t *id, char **cause)
{ *login = xstrdup("diverge-bot"); *id = 900; return SCM_OK; }

static struct scm_ops mops;
static struct scm_client mcl;
static const char *tname;

static int
wait_reported(const char *name, const char *phase, int64_t ms)
{
	int64_t end = now_mono_ms() + ms;
	while (now_mono_ms() < end) {
		json_t *t = get(&K8S_AGENTTASK, name);
		int ok = t && streq_safe(jp(t, "status.notifier.reportedPhase"), phase);
		json_decref(t);
		if (ok) return 1;
		sleep_ms(10);
	}
	return 0;
}

/* /diverge fix (as actions.c writes it), and the new run fails at once */
static void
rerun_and_fail(void)
{
	struct k8s_status st = { 0 };
	json_t *t = get_task(tname), *s = json_object_get(t, "status");

	json_object_set_new(s, "run", json_integer(json_integer_value(json_object_get(s, "run")) + 1));
	json_object_set_new(s, "phase", json_string("Pending"));
	json_object_del(json_object_get(s, "notifier"), "reportedPhase");
	assert_int_equal(k8s_update_status(env.api, &K8S_AGENTTASK, NS, tname, t, NULL, &st), 0);
	json_decref(t);
	patch_status(tname, "{\"status\":{\"phase\":\"Failed\",\"reason\":\"PullRequestClosed\"}}");
}

/*
 * The notifier's status write, retried after a 409, must not put the
 * finished run's reportedPhase onto a task that was re-run meanwhile (a
 * re-run drops it so that the next end is reported): here run 2 fails
 * at once, during the notifier's comment update for run 1, and still gets
 * its own final comment. Mock SCM client: comments in memory.
 */
static void
test_rerun_race(void **state)
{
	struct notifier *n = NULL;
	struct notifier_config nc;
	char *cause = NULL, *name;
	json_t *t;

	(void)state;
	mops.name = "github"; mops.list_comments = m_list; mops.create_comment = m_create;
	mops.update_comment = m_update; mops.delete_comment = m_delete; mops.whoami = m_whoami;
	mcl.ops = &mops;
	name = new_task(NULL, ",\"divergedev.com/provider\":\"github\","
	    "\"divergedev.com/project\":\"o/r\",\"divergedev.com/pr-number\":\"7\","
	    "\"divergedev.com/requested-by\":\"alice\"");
	tname = name;
	patch_status(name, "{\"status\":{\"phase\":\"Active\",\"run\":1}}");
	memset(&nc, 0, sizeof(nc));
	nc.store = env.api; nc.github = &mcl; nc.cfg = &cfg; nc.throttle_ms = 200;
	assert_int_equal(notifier_start(&n, &nc, &cause), 0);
	assert_true(wait_reported(name, "Active", 5000));
	patch_status(name, "{\"status\":{\"phase\":\"Failed\",\"reason\":\"SandboxFailed\"}}");
	assert_true(wait_reported(name, "Failed", 5000));
	assert_int_equal(nfinal, 1);
	/* more spend reported on run 1: a content update, during which the rerun happens */
	in_update = rerun_and_fail;
	patch_status(name, "{\"status\":{\"iteration\":3}}");
	sleep_ms(3000);
	t = get_task(name);
	assert_string_equal(jp(t, "status.phase"), "Failed");
	json_decref(t);
	/* the second run's end is reported too: its own final comment */
	assert_true(wait_reported(name, "Failed", 5000));
	for (int64_t end = now_mono_ms() + 5000; nfinal < 2 &&
	    now_mono_ms() < end;)
		sleep_ms(20);
	assert_int_equal(nfinal, 2);
	notifier_stop(n);
	free(name);
}

/* Provisioning -> Active only for Ready=True of the current generation. */
static void
test_active_needs_current_generation(void **state)
{
	char *name = provisioned(NULL, NULL), *ename;
	json_t *envo, *t;

	(void)state;
	play(name, "True", "DependenciesReady", -1, "10.0.0.7", 0, 0);
	reconcile(name);
	assert_phase(name, "Provisioning");
	play(name, "False", "DependenciesNotReady", 0, NULL, 0, 0);
	reconcile(name);
	assert_phase(name, "Provisioning");
	play(name, "True", "DependenciesReady", 0, "10.0.0.7", 0, 0);
	reconcile(name);
	assert_phase(name, "Active");
	t = get_task(name);
	assert_string_equal(jp(cond(t, "Ready"), "status"), "True");
	assert_string_equal(jp(cond(t, "SandboxReady"), "status"), "True");
	assert_string_equal(jp(cond(t, "SandboxReady"), "reason"),
	    "DependenciesReady");
	json_decref(t);
	/* the pod IP is mirrored onto the Environment */
	ename = xasprintf("agent-preview-%s", name);
	envo = get(&K8S_ENVIRONMENT, ename);
	assert_string_equal(jp(envo, "metadata.annotations.divergedev.com/"
	    "sandbox-ip"), "10.0.0.7");
	json_decref(envo);
	free(ename);
	free(name);
}

/*
 * The pass that sees Ready=True also rewrites the Sandbox (the objective
 * changed): that Ready is for the generation replaced, so no Active until
 * the Sandbox is Ready for the new one.
 */
static void
test_active_not_on_replaced_generation(void **state)
{
	char *name = provisioned(NULL, NULL);
	json_t *t, *sb;

	(void)state;
	play(name, "True", "DependenciesReady", 0, "10.0.0.7", 0, 0);
	patch_task(name, 0, "{\"spec\":{\"objective\":"
	    "\"a new objective\"}}");
	reconcile(name);
	assert_phase(name, "Provisioning");
	sb = get(&K8S_SANDBOX, name);
	assert_int_equal(k8s_meta_int(sb, "generation"), 2);
	assert_string_equal(env_value(jget(sb, "spec.podTemplate.spec."
	    "containers.0"), "DIVERGE_OBJECTIVE"), "a new objective");
	json_decref(sb);
	t = get_task(name);
	assert_string_equal(jp(cond(t, "Ready"), "status"), "False");
	assert_string_equal(jp(cond(t, "SandboxReady"), "status"), "False");
	json_decref(t);
	play(name, "True", "DependenciesReady", 0, "10.0.0.7", 0, 0);
	reconcile(name);
	assert_phase(name, "Active");
	free(name);
}

/* Active -> Pausing -> Paused; Paused -> Provisioning with a new token. */
static void
test_pause_resume(void **state)
{
	char *name = active(), *ename, *old_tok, *old_id;
	json_t *t, *sb, *envo;

	(void)state;
	ename = xasprintf("agent-preview-%s", name);
	old_tok = token_of(name);
	t = get_task(name);
	old_id = xstrdup(jp(t, "status.tokenId"));
	json_decref(t);
	set_suspended(name, 1);
	reconcile(name);
	assert_phase(name, "Pausing");
	assert_index(old_id, "revoked");
	assert_int_equal(charge(old_tok, 1, "p1"), 401);
	sb = get(&K8S_SANDBOX, name);
	assert_string_equal(jp(sb, "spec.operatingMode"), "Suspended");
	json_decref(sb);
	envo = get(&K8S_ENVIRONMENT, ename);
	assert_string_equal(jp(envo, "metadata.annotations.divergedev.com/"
	    "hibernated"), "true");
	assert_null(jget(envo, "metadata.annotations.divergedev.com/"
	    "sandbox-ip"));
	json_decref(envo);
	/* still running as far as the sandbox controller says */
	reconcile(name);
	assert_phase(name, "Pausing");
	play(name, "False", "SandboxSuspended", 0, NULL, 1, 0);
	reconcile(name);
	assert_phase(name, "Paused");
	t = get_task(name);
	assert_string_equal(jp(cond(t, "TokenIssued"), "status"), "False");
	assert_string_equal(jp(cond(t, "TokenIssued"), "reason"), "Revoked");
	assert_string_equal(jp(cond(t, "PreviewReady"), "reason"),
	    "Hibernated");
	assert_non_null(jget(t, "status.activeSeconds"));
	json_decref(t);

	/* resume */
	set_suspended(name, 0);
	reconcile(name);
	assert_phase(name, "Provisioning");
	assert_token_replaced(name, old_id, old_tok);
	/* the pod is gone: the next one mounts the new token, no restart */
	free(old_id);
	old_id = task_token_id(name);
	assert_sandbox(name, "Running", old_id);
	envo = get(&K8S_ENVIRONMENT, ename);
	assert_null(jget(envo, "metadata.annotations.divergedev.com/"
	    "hibernated"));
	json_decref(envo);
	play(name, "True", "DependenciesReady", 0, "10.0.0.8", 0, 0);
	reconcile(name);
	assert_phase(name, "Active");
	free(old_tok);
	free(old_id);
	free(ename);
	free(name);
}

/*
 * Pausing ends when the Sandbox has stopped: Suspended, not Ready, its
 * Ready reason SandboxSuspended, and its Suspended condition True (its
 * podIPs may lag) or no pod IP left. A Ready Sandbox still runs.
 */
static void
test_pausing_until_stopped(void **state)
{
	char *name = active();

	(void)state;
	set_suspended(name, 1);
	reconcile(name);
	assert_phase(name, "Pausing");
	assert_reason(name, "Suspending");
	/* Ready: it still runs */
	played(name, "True", "SandboxSuspended", NULL, "Pausing");
	/* Suspended, its podIPs not cleared yet: stopped */
	played(name, "False", "SandboxSuspended", "10.0.0.7", "Paused");
	free(name);
}

/*
 * A resume finds no token index (deleted meanwhile): its Secret's old
 * token is not live, and a new one is minted, the index made again.
 */
static void
test_resume_index_lost(void **state)
{
	struct k8s_status st = { 0 };
	char *name = active(), *old_id = task_token_id(name);

	(void)state;
	pause_task(name);
	assert_int_equal(k8s_delete(env.api, &K8S_SECRET, NS,
	    METER_INDEX_SECRET, NULL, &st), 0);
	k8s_status_release(&st);
	set_suspended(name, 0);
	assert_minted_anew(name, old_id);
	free(old_id);
	free(name);
}

/*
 * Resumed before the Sandbox stopped (Pausing -> Provisioning): the pod
 * that may still run holds the token the pause revoked, so the Sandbox
 * stays Suspended until it is gone and only then runs, with the new one.
 */
static void
test_resume_before_stopped(void **state)
{
	char *name = active(), *old_id = task_token_id(name);
	json_t *sb;

	(void)state;
	set_suspended(name, 1);
	reconcile(name);
	assert_phase(name, "Pausing");
	set_suspended(name, 0);
	reconcile(name);
	sb = get(&K8S_SANDBOX, name);
	assert_string_equal(jp(sb, "spec.operatingMode"), "Suspended");
	json_decref(sb);
	assert_sandbox_rolled(name, old_id);
	free(old_id);
	free(name);
}

/* ------------------------------------------ the order of the Sandbox writes */

/*
 * The store's ops with the Sandbox writes watched (watch_sandbox_writes):
 * at each write that tells a Sandbox to run (made Running, or Running
 * after Suspended) they record what an agent whose pod starts at that
 * very moment meets: the phase of watched_task and the meter's answer to
 * a call with the token of its Secret (the one the pod gets); while
 * fail_runs is above 0 such a write fails instead (after the record).
 * At each write that suspends a Sandbox that ran, the meter's answer to
 * a call with stop_token (the token the stopping pod holds). Nothing
 * here waits: the records are taken in the write itself, before it is
 * made.
 */
static struct k8s_ops sandbox_watch_ops;
static const struct k8s_ops *watched_ops;
static int seen_runs, seen_run_charge, seen_stops, seen_stop_charge;
static int fail_runs;
static char *seen_phase;
static const char *watched_task, *stop_token;

/* Record (see above) the write of Sandbox name as obj; 0 or an error. */
static int
sandbox_write_seen(struct k8s_api *api, const char *ns, const char *name,
    const json_t *obj, struct k8s_status *st)
{
	struct k8s_status gst = { 0 };
	json_t *cur = NULL, *t;
	const char *mode = jp(obj, "spec.operatingMode"), *was;
	char *tok, *rid;
	int rc = 0;

	if (watched_ops->get(api, &K8S_SANDBOX, ns, name, &cur, &gst) < 0)
		cur = NULL;
	k8s_status_release(&gst);
	was = cur != NULL ? jp(cur, "spec.operatingMode") : NULL;
	if (streq_safe(mode, "Running") && (cur == NULL ||
	    streq_safe(was, "Suspended"))) {
		seen_runs++;
		t = get_task(watched_task);
		free(seen_phase);
		seen_phase = jp(t, "status.phase") != NULL ?
		    xstrdup(jp(t, "status.phase")) : NULL;
		json_decref(t);
		tok = token_of(watched_task);
		rid = xasprintf("at-run-%d", seen_runs);
		seen_run_charge = charge(tok, 1, rid);
		free(rid);
		free(tok);
		if (fail_runs > 0) {
			fail_runs--;
			rc = k8s_status_set(st, K8S_EUNAVAILABLE,
			    "injected: the sandbox write failed", NULL);
		}
	} else if (streq_safe(mode, "Suspended") && cur != NULL &&
	    !streq_safe(was, "Suspended") && stop_token != NULL) {
		seen_stops++;
		rid = xasprintf("at-stop-%d", seen_stops);
		seen_stop_charge = charge(stop_token, 1, rid);
		free(rid);
	}
	json_decref(cur);
	return rc;
}

static int
watched_create(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const json_t *obj, json_t **out, struct k8s_status *st)
{
	int rc = r == &K8S_SANDBOX ? sandbox_write_seen(api, ns,
	    k8s_meta_str(obj, "name"), obj, st) : 0;

	if (rc < 0)
		return rc;
	return watched_ops->create(api, r, ns, obj, out, st);
}

static int
watched_update(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, const json_t *obj, json_t **out,
    struct k8s_status *st)
{
	int rc = r == &K8S_SANDBOX ? sandbox_write_seen(api, ns, name, obj,
	    st) : 0;

	if (rc < 0)
		return rc;
	return watched_ops->update(api, r, ns, name, obj, out, st);
}

/* A merge patch of a Sandbox (warm-pool mode: the bound one's mode). */
static int
watched_patch(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, int status, const json_t *patch,
    json_t **out, struct k8s_status *st)
{
	int rc = r == &K8S_SANDBOX && !status ? sandbox_write_seen(api, ns,
	    name, patch, st) : 0;

	if (rc < 0)
		return rc;
	return watched_ops->patch(api, r, ns, name, status, patch, out, st);
}

/* The Sandbox writes of task are watched (see above). */
static void
watch_sandbox_writes(const char *task)
{
	watched_ops = env.api->ops;
	sandbox_watch_ops = *watched_ops;
	sandbox_watch_ops.create = watched_create;
	sandbox_watch_ops.update = watched_update;
	sandbox_watch_ops.patch = watched_patch;
	watched_task = task;
	seen_runs = seen_stops = fail_runs = 0;
	seen_run_charge = seen_stop_charge = 0;
	stop_token = NULL;
	env.api->ops = &sandbox_watch_ops;
}

static void
unwatch_sandbox_writes(void)
{
	env.api->ops = watched_ops;
	free(seen_phase);
	seen_phase = NULL;
	watched_task = stop_token = NULL;
}

/*
 * The order of the writes of a start, a pause and a resume, on the store
 * of mode: a Sandbox is told to run only once the task's status is live
 * and its token active, so the agent's first meter call is taken (not a
 * 401 "task not live"); it is suspended only once the token its pod
 * holds is revoked, so a paused agent spends nothing more.
 */
static void
sandbox_write_order(int mode)
{
	char *name, *old_tok, *id;

	if (mode != 1 && reopen_store(mode) < 0)
		return;
	/* the start: made Running once Provisioning */
	name = new_task(NULL, NULL);
	watch_sandbox_writes(name);
	provision(name);
	assert_int_equal(seen_runs, 1);
	assert_string_equal(seen_phase, "Provisioning");
	assert_int_equal(seen_run_charge, 200);
	play(name, "True", "DependenciesReady", 0, "10.0.0.7", 0, 0);
	reconcile(name);
	assert_phase(name, "Active");

	/* the pause: the token revoked before the Sandbox is suspended */
	old_tok = token_of(name);
	stop_token = old_tok;
	set_suspended(name, 1);
	reconcile(name);
	assert_phase(name, "Pausing");
	assert_int_equal(seen_stops, 1);
	assert_int_equal(seen_stop_charge, 401);
	play(name, "False", "SandboxSuspended", 0, NULL, 1, 0);
	reconcile(name);
	assert_phase(name, "Paused");
	assert_int_equal(seen_runs, 1);

	/* the resume: Running once live, with a new token that charges */
	set_suspended(name, 0);
	reconcile(name);
	assert_int_equal(seen_runs, 2);
	assert_string_equal(seen_phase, "Provisioning");
	assert_int_equal(seen_run_charge, 200);
	assert_phase(name, "Provisioning");
	id = task_token_id(name);
	assert_sandbox(name, "Running", id);
	assert_int_equal(charge(old_tok, 1, "old-after-resume"), 401);
	unwatch_sandbox_writes();
	free(id);
	free(old_tok);
	free(name);
	if (mode != 1) {
		close_all();
		open_all(1);
	}
}

static void
test_sandbox_write_order(void **state)
{
	(void)state;
	sandbox_write_order(1);
}

static void
test_rest_sandbox_write_order(void **state)
{
	(void)state;
	sandbox_write_order(2);
}

static void
test_kube_sandbox_write_order(void **state)
{
	(void)state;
	sandbox_write_order(3);
}

/*
 * A resume whose status is written but whose Sandbox write fails: the
 * task is live (its token charges) but nothing runs, which neither its
 * status nor its sticky comment calls running; the next pass starts the
 * Sandbox.
 */
static void
test_resume_sandbox_write_fails(void **state)
{
	char *name = active(), *cause = NULL, *body;
	size_t len;
	json_t *t;
	int rc;

	(void)state;
	pause_task(name);
	watch_sandbox_writes(name);
	fail_runs = 1;
	set_suspended(name, 0);
	rc = controller_reconcile(&cc, NS, name, NULL, NULL, &cause);
	assert_true(rc < 0);
	free(cause);
	assert_int_equal(seen_runs, 1);
	assert_int_equal(seen_run_charge, 200);
	assert_sandbox(name, "Suspended", NULL);
	t = get_task(name);
	assert_string_equal(jp(t, "status.phase"), "Provisioning");
	assert_string_equal(jp(t, "status.message"), "starting the sandbox");
	assert_string_equal(jp(cond(t, "Ready"), "status"), "False");
	assert_string_equal(jp(cond(t, "TokenIssued"), "status"), "True");
	body = notifier_render(t, NULL, &len);
	assert_non_null(strstr(body, "(provisioning)"));
	assert_non_null(strstr(body, "starting the sandbox"));
	assert_null(strstr(body, "the agent is running"));
	free(body);
	json_decref(t);
	/* the next pass finishes the job */
	reconcile(name);
	assert_int_equal(seen_runs, 2);
	assert_string_equal(seen_phase, "Provisioning");
	assert_int_equal(seen_run_charge, 200);
	assert_sandbox(name, "Running", NULL);
	assert_phase(name, "Provisioning");
	unwatch_sandbox_writes();
	play(name, "True", "DependenciesReady", 0, "10.0.0.8", 0, 0);
	reconcile(name);
	assert_phase(name, "Active");
	free(name);
}

/*
 * A pass that puts back the task's preview annotations keeps an unchanged
 * phase (Paused, Failed): the phase must not point into the task object
 * that the annotation write replaces (ASan: heap-use-after-free).
 */
static void
test_annotations_keep_phase(void **state)
{
	static const char *const ends[] = { "Paused", "Failed" };
	char *name = active(), *ename = xasprintf("agent-preview-%s", name);
	json_t *t;
	size_t i;

	(void)state;
	pause_task(name);
	for (i = 0; i < sizeof(ends) / sizeof(ends[0]); i++) {
		if (strcmp(ends[i], "Failed") == 0) {
			patch_status(name, "{\"status\":{\"phase\":"
			    "\"Failed\",\"reason\":\"PullRequestClosed\"}}");
			reconcile(name);
		}
		patch_task(name, 0, "{\"metadata\":{\"annotations\":{"
		    "\"divergedev.com/preview-environment\":null}}}");
		reconcile(name);
		t = get_task(name);
		assert_string_equal(jp(t, "status.phase"), ends[i]);
		assert_string_equal(jp(t, "metadata.annotations."
		    "divergedev.com/preview-environment"), ename);
		json_decref(t);
	}
	free(ename);
	free(name);
}

/*
 * A live task whose token Secret is lost: a new token, the old revoked;
 * the running pod holds the old one, so the Sandbox is restarted.
 */
static void
test_token_replaced_revoked(void **state)
{
	char *name = active(), *sname = xasprintf("%s-token", name);
	char *old_tok = token_of(name), *old_id;
	struct k8s_status st = { 0 };
	json_t *t;

	(void)state;
	t = get_task(name);
	old_id = xstrdup(jp(t, "status.tokenId"));
	json_decref(t);
	assert_int_equal(k8s_delete(env.api, &K8S_SECRET, NS, sname, NULL,
	    &st), 0);
	k8s_status_release(&st);
	reconcile(name);
	assert_token_replaced(name, old_id, old_tok);
	assert_sandbox_rolled(name, old_id);
	free(old_tok);
	free(old_id);
	free(sname);
	free(name);
}

/* The expires caveat of a token, in unix seconds. */
static int64_t
token_expires(const char *tok)
{
	struct macaroon *m = NULL;
	int64_t exp = 0;

	assert_int_equal(macaroon_inspect(tok, strlen(tok), &m, NULL), 0);
	assert_int_equal(macaroon_expires(m, &exp), 0);
	macaroon_free(m);
	return exp;
}

/* Set the task's spec.sandbox.timeoutSeconds (as a user edits it). */
static void
set_timeout(const char *name, int64_t seconds)
{
	char *p = xasprintf("{\"spec\":{\"sandbox\":{\"timeoutSeconds\":"
	    "%lld}}}", (long long)seconds);

	patch_task(name, 0, p);
	free(p);
}

/*
 * The task's token was extended for a timeout of timeout seconds: a new
 * token in the Secret and status.tokenId, expiring when the task would
 * time out plus the slack; the old one (old_id, old_tok) still active, so
 * the pod may use either; the Sandbox not restarted but recording the
 * new token; the task still Active.
 */
static void
assert_token_extended(const char *name, const char *old_id,
    const char *old_tok, int64_t timeout)
{
	char *sname = xasprintf("%s-token", name), *tok = token_of(name);
	json_t *t = get_task(name), *sec = get(&K8S_SECRET, sname);
	const char *id = jp(t, "status.tokenId");
	int64_t exp = token_expires(tok);

	assert_phase(name, "Active");
	assert_non_null(id);
	assert_string_not_equal(id, old_id);
	assert_string_equal(jp(sec, "metadata.annotations.divergedev.com/"
	    "token-id"), id);
	assert_string_equal(jp(sec, "metadata.annotations.divergedev.com/"
	    "token-extends"), old_id);
	assert_true(exp > token_expires(old_tok));
	assert_true(exp >= now_unix() + timeout + CONTROLLER_TOKEN_SLACK_S -
	    10 && exp <= now_unix() + timeout + CONTROLLER_TOKEN_SLACK_S);
	assert_index(id, "active");
	assert_index(old_id, "active");
	assert_sandbox(name, "Running", id);
	assert_int_equal(charge(tok, 1, "extended-new"), 200);
	assert_int_equal(charge(old_tok, 1, "extended-old"), 200);
	json_decref(sec);
	json_decref(t);
	free(tok);
	free(sname);
}

/*
 * A token id in the task's Secret that the index has active for another
 * task is not the task's live token (someone edited the Secret): a new
 * one is minted, the other task's left alone.
 */
static void
test_token_of_other_task(void **state)
{
	struct k8s_status st = { 0 };
	char *a = active(), *b = active(), *ida = task_token_id(a), *text;
	char *sname = xasprintf("%s-token", b);
	json_t *p;

	(void)state;
	text = xasprintf("{\"metadata\":{\"annotations\":{\"divergedev.com/"
	    "token-id\":\"%s\"}}}", ida);
	p = json_loads(text, 0, NULL);
	assert_int_equal(k8s_patch(env.api, &K8S_SECRET, NS, sname, 0, p,
	    NULL, &st), 0);
	json_decref(p);
	assert_minted_anew(b, ida);
	assert_index(ida, "active");
	free(text);
	free(sname);
	free(ida);
	free(b);
	free(a);
}

/*
 * A timeout raised while the task runs, past what its token covers: the
 * token is extended in place, once; the pod is not restarted; a pause
 * revokes every token of the task.
 */
static void
test_token_extended(void **state)
{
	char *name = active(), *tok0 = token_of(name);
	char *id0 = task_token_id(name), *id1, *id2, *tok1;
	uint64_t w;

	(void)state;
	/* a raise the slack still covers mints nothing */
	set_timeout(name, 1800 + CONTROLLER_TOKEN_SLACK_S / 4);
	reconcile(name);
	id1 = task_token_id(name);
	assert_string_equal(id1, id0);
	free(id1);
	/* 30 min -> 4 h: the token would expire first */
	set_timeout(name, 4 * 3600);
	reconcile(name);
	assert_token_extended(name, id0, tok0, 4 * 3600);
	w = writes();
	reconcile(name);
	assert_int_equal(writes(), w);
	/* again, from the extended one */
	id1 = task_token_id(name);
	tok1 = token_of(name);
	set_timeout(name, 8 * 3600);
	reconcile(name);
	assert_token_extended(name, id1, tok1, 8 * 3600);
	id2 = task_token_id(name);
	pause_task(name);
	assert_index(id0, "revoked");
	assert_index(id1, "revoked");
	assert_index(id2, "revoked");
	free(id2);
	free(tok1);
	free(id1);
	free(id0);
	free(tok0);
	free(name);
}

/*
 * An extended token whose Secret is then lost is replaced: the new one
 * live, every earlier one revoked (the one it extended too), the Sandbox
 * restarted.
 */
static void
test_token_extended_lost(void **state)
{
	char *name = active(), *tok0 = token_of(name);
	char *id0 = task_token_id(name), *id1, *tok1;
	char *sname = xasprintf("%s-token", name);
	struct k8s_status st = { 0 };

	(void)state;
	set_timeout(name, 4 * 3600);
	reconcile(name);
	assert_token_extended(name, id0, tok0, 4 * 3600);
	id1 = task_token_id(name);
	tok1 = token_of(name);
	assert_int_equal(k8s_delete(env.api, &K8S_SECRET, NS, sname, NULL,
	    &st), 0);
	k8s_status_release(&st);
	reconcile(name);
	assert_token_replaced(name, id1, tok1);
	assert_index(id0, "revoked");
	assert_int_equal(charge(tok0, 1, "lost-old"), 401);
	assert_sandbox_rolled(name, id1);
	free(tok1);
	free(id1);
	free(sname);
	free(id0);
	free(tok0);
	free(name);
}

/* Provisioning/Active + PodFailed -> Failed (SandboxFailed). */
static void
test_pod_failed(void **state)
{
	char *name = active(), *id;
	json_t *t, *sb;
	int64_t done;
	char want[32];

	(void)state;
	t = get_task(name);
	id = xstrdup(jp(t, "status.tokenId"));
	json_decref(t);
	play(name, "False", "PodFailed", 0, NULL, 0, 0);
	reconcile(name);
	assert_phase(name, "Failed");
	t = get_task(name);
	assert_string_equal(jp(t, "status.reason"), "SandboxFailed");
	assert_index(id, "revoked");
	assert_string_equal(jp(cond(t, "TokenIssued"), "status"), "False");
	done = 0;
	{
		int y, mo, d, h, mi, s;
		struct tm tm;

		assert_int_equal(sscanf(jp(t, "status.completedAt"),
		    "%d-%d-%dT%d:%d:%d", &y, &mo, &d, &h, &mi, &s), 6);
		memset(&tm, 0, sizeof(tm));
		tm.tm_year = y - 1900;
		tm.tm_mon = mo - 1;
		tm.tm_mday = d;
		tm.tm_hour = h;
		tm.tm_min = mi;
		tm.tm_sec = s;
		done = (int64_t)timegm(&tm);
	}
	time_rfc3339(done + 24 * 3600, want);
	sb = get(&K8S_SANDBOX, name);
	assert_string_equal(jp(sb, "spec.shutdownTime"), want);
	json_decref(sb);
	json_decref(t);
	free(id);
	free(name);
}

/*
 * A re-run reuses the failed run's Sandbox: its PodFailed conditions are
 * for a generation the re-run replaced and do not fail the new run, and
 * its pod is replaced by one with the new run's token.
 */
static void
test_rerun_after_pod_failed(void **state)
{
	char *name = active(), *old_id = task_token_id(name);
	struct k8s_status st = { 0 };
	json_t *sb;

	(void)state;
	play(name, "False", "PodFailed", 0, NULL, 0, 0);
	sb = get(&K8S_SANDBOX, name);
	json_array_append_new(json_object_get(json_object_get(sb, "status"),
	    "conditions"), json_pack("{s:s,s:s,s:s,s:I}", "type", "Finished",
	    "status", "True", "reason", "PodFailed", "observedGeneration",
	    (json_int_t)k8s_meta_int(sb, "generation")));
	assert_int_equal(k8s_update_status(env.api, &K8S_SANDBOX, NS, name,
	    sb, NULL, &st), 0);
	json_decref(sb);
	reconcile(name);
	assert_phase(name, "Failed");
	/* what the re-run of scm/actions.c writes */
	patch_status(name, "{\"status\":{\"run\":1,\"phase\":\"Pending\","
	    "\"reason\":null,\"message\":null,\"completedAt\":null}}");
	reconcile(name);
	assert_sandbox_rolled(name, old_id);
	free(old_id);
	free(name);
}

/* ReconcilerError: transient under 5 minutes, Failed after. */
static void
test_reconciler_error(void **state)
{
	char *name = provisioned(NULL, NULL), *cause = NULL;
	int64_t requeue = -1;
	json_t *t;

	(void)state;
	/* a Ready True is no error, whatever its reason says */
	play(name, "True", "ReconcilerError", 0, "10.0.0.7", 0, now_unix() -
	    301);
	reconcile(name);
	assert_phase(name, "Active");
	play(name, "False", "ReconcilerError", 0, NULL, 0, now_unix() - 10);
	assert_int_equal(controller_reconcile(&cc, NS, name, &requeue, NULL,
	    &cause), 0);
	assert_phase(name, "Provisioning");
	assert_true(requeue > 280 * 1000 && requeue <= 292 * 1000);
	play(name, "False", "ReconcilerError", 0, NULL, 0, now_unix() - 301);
	reconcile(name);
	assert_phase(name, "Failed");
	t = get_task(name);
	assert_string_equal(jp(t, "status.reason"), "SandboxFailed");
	json_decref(t);
	free(name);
}

/* Move the start of name's open period (TokenIssued) back to secs ago. */
static void
backdate_open_period(const char *name, int64_t secs)
{
	char ts[32], *json, *p;
	json_t *t = get_task(name), *conds, *c;
	size_t i;

	time_rfc3339(now_unix() - secs, ts);
	conds = json_deep_copy(jget(t, "status.conditions"));
	json_decref(t);
	json_array_foreach(conds, i, c)
		if (strcmp(jp(c, "type"), "TokenIssued") == 0)
			json_object_set_new(c, "lastTransitionTime",
			    json_string(ts));
	json = json_dumps(conds, JSON_COMPACT);
	p = xasprintf("{\"status\":{\"conditions\":%s}}", json);
	patch_status(name, p);
	free(p);
	free(json);
	json_decref(conds);
}

/* activeSeconds past timeoutSeconds -> Failed (Timeout); paused excluded. */
static void
test_timeout(void **state)
{
	char *name = active();
	json_t *t;

	(void)state;
	/* 100 s of closed live time, paused since: no timeout */
	set_suspended(name, 1);
	reconcile(name);
	play(name, "False", "SandboxSuspended", 0, NULL, 1, 0);
	reconcile(name);
	assert_phase(name, "Paused");
	patch_status(name, "{\"status\":{\"activeSeconds\":100}}");
	set_suspended(name, 0);
	reconcile(name);
	assert_phase(name, "Provisioning");
	/* the open period started 5000 s ago: over the 1800 s timeout */
	backdate_open_period(name, 5000);
	reconcile(name);
	assert_phase(name, "Failed");
	t = get_task(name);
	assert_string_equal(jp(t, "status.reason"), "Timeout");
	assert_true(json_integer_value(jget(t, "status.activeSeconds")) >=
	    5100);
	json_decref(t);
	free(name);
}

/*
 * The open live period is counted from TokenIssued's transition at every
 * pass and written to activeSeconds only when it closes: passes of a
 * live task do not add it twice (1000 s open, twice, is still under the
 * 1800 s timeout).
 */
static void
test_open_period_counted_once(void **state)
{
	char *name = active();

	(void)state;
	backdate_open_period(name, 1000);
	twice_without(name, "Active", "status.activeSeconds");
	free(name);
}

/* The runner reports success: Completed, token revoked, audit window. */
static void
test_completed(void **state)
{
	char *name = active(), *tok = token_of(name), *auth, ts[32], *old_id;
	const char *body = "{\"result\":\"succeeded\",\"message\":\"done\"}";
	struct meter_reply r = { 0 };
	json_t *t, *sb;
	uint64_t w0;

	(void)state;
	auth = xasprintf("Bearer %s", tok);
	meter_complete(meter, auth, body, strlen(body), &r);
	assert_int_equal(r.status, 200);
	meter_reply_release(&r);
	reconcile(name);
	assert_phase(name, "Completed");
	t = get_task(name);
	assert_index(jp(t, "status.tokenId"), "revoked");
	sb = get(&K8S_SANDBOX, name);
	assert_non_null(jp(sb, "spec.shutdownTime"));
	time_rfc3339(now_unix() + 24 * 3600 + 1, ts);
	assert_true(strcmp(jp(sb, "spec.shutdownTime"), ts) <= 0);
	assert_string_equal(jp(t, "status.reason"), "Succeeded");
	json_decref(sb);
	json_decref(t);
	w0 = writes();
	reconcile(name);
	assert_int_equal(writes(), w0);

	/* /diverge fix again: Pending, then a fresh run in a fresh pod */
	old_id = task_token_id(name);
	patch_status(name, "{\"status\":{\"phase\":\"Pending\",\"run\":1,"
	    "\"completedAt\":null}}");
	reconcile(name);
	assert_phase(name, "Provisioning");
	sb = get(&K8S_SANDBOX, name);
	assert_null(jget(sb, "spec.shutdownTime"));
	json_decref(sb);
	t = get_task(name);
	assert_index(jp(t, "status.tokenId"), "active");
	json_decref(t);
	assert_sandbox_rolled(name, old_id);
	free(old_id);
	free(auth);
	free(tok);
	free(name);
}

/*
 * On a cluster the meter pauses a task in two writes: the status (Paused,
 * BudgetExceeded), then spec.suspended: true. A pass between the two (or
 * after a second write that failed) keeps the task Paused with its token:
 * only a change of the spec after the pause resumes it.
 */
static void
test_meter_pause_two_writes(void **state)
{
	char *name = active(), *old_id;
	json_t *t;

	(void)state;
	t = get_task(name);
	old_id = xstrdup(jp(t, "status.tokenId"));
	json_decref(t);
	/* the meter's first write only */
	patch_status(name, "{\"status\":{\"phase\":\"Paused\",\"reason\":"
	    "\"BudgetExceeded\",\"message\":\"budget exceeded\"}}");
	reconcile(name);
	assert_phase(name, "Paused");
	t = get_task(name);
	assert_string_equal(jp(t, "status.tokenId"), old_id);
	assert_string_equal(jp(t, "status.reason"), "BudgetExceeded");
	assert_string_equal(jp(t, "status.message"), "budget exceeded");
	json_decref(t);
	/* its second write, then a resume with a bigger budget */
	patch_task(name, 0, "{\"spec\":{\"suspended\":true}}");
	reconcile(name);
	assert_phase(name, "Paused");
	patch_task(name, 0, "{\"spec\":{\"suspended\":false,"
	    "\"budgetTokens\":10000000}}");
	reconcile(name);
	assert_phase(name, "Provisioning");
	t = get_task(name);
	assert_string_not_equal(jp(t, "status.tokenId"), old_id);
	json_decref(t);
	free(old_id);
	free(name);
}

/*
 * A resume read before any pass saw the meter's pause: the status still
 * says TokenIssued for the token the meter revoked, and the phase is no
 * longer live, so that token is not taken as live: a new one is minted.
 */
static void
test_resume_after_meter_pause(void **state)
{
	char *name = active(), *old_id = task_token_id(name), *cause = NULL;

	(void)state;
	patch_status(name, "{\"status\":{\"phase\":\"Paused\",\"reason\":"
	    "\"BudgetExceeded\",\"message\":\"budget exceeded\"}}");
	assert_int_equal(meter_revoke_token(meter, NS, old_id, &cause), 0);
	patch_task(name, 0, "{\"spec\":{\"budgetTokens\":10000000}}");
	assert_minted_anew(name, old_id);
	free(old_id);
	free(name);
}

/*
 * A meter 429 while Active pauses the task (atomically, by the meter);
 * the reconciler then suspends the Sandbox and hibernates the
 * Environment; resume mints a new token and the old one gets 401.
 */
static void
test_meter_429(void **state)
{
	char *name = active(), *tok = token_of(name), *ename, *old_id;
	json_t *t, *sb, *envo;

	(void)state;
	ename = xasprintf("agent-preview-%s", name);
	assert_int_equal(charge(tok, 200000, "big"), 429);
	assert_phase(name, "Paused");
	t = get_task(name);
	old_id = xstrdup(jp(t, "status.tokenId"));
	json_decref(t);
	reconcile(name);
	assert_phase(name, "Paused");
	t = get_task(name);
	assert_string_equal(jp(t, "status.reason"), "BudgetExceeded");
	json_decref(t);
	sb = get(&K8S_SANDBOX, name);
	assert_string_equal(jp(sb, "spec.operatingMode"), "Suspended");
	json_decref(sb);
	envo = get(&K8S_ENVIRONMENT, ename);
	assert_string_equal(jp(envo, "metadata.annotations.divergedev.com/"
	    "hibernated"), "true");
	json_decref(envo);
	/* resume with a bigger budget */
	{
		struct k8s_status st = { 0 };
		json_t *p = json_pack("{s:{s:b,s:I}}", "spec", "suspended", 0,
		    "budgetTokens", (json_int_t)10000000);

		assert_int_equal(k8s_patch(env.api, &K8S_AGENTTASK, NS, name,
		    0, p, NULL, &st), 0);
		json_decref(p);
	}
	reconcile(name);
	assert_phase(name, "Provisioning");
	assert_token_replaced(name, old_id, tok);
	free(tok);
	free(old_id);
	free(ename);
	free(name);
}

/* The Sandbox name, someone else's, is as it was made: not adopted. */
static void
assert_sandbox_foreign(const char *name)
{
	json_t *sb = get(&K8S_SANDBOX, name);

	assert_non_null(sb);
	assert_null(jget(sb, "metadata.ownerReferences"));
	assert_null(jget(sb, "spec.operatingMode"));
	assert_int_equal(k8s_meta_int(sb, "generation"), 1);
	json_decref(sb);
}

/* An object that is not the task's is never adopted: a conflict. */
static void
test_conflict(void **state)
{
	char *name = new_task(NULL, NULL);
	struct k8s_status st = { 0 };
	json_t *foreign, *t;

	(void)state;
	foreign = json_pack("{s:s,s:s,s:{s:s,s:{s:s}},s:{s:{s:{s:[]}}}}",
	    "apiVersion", "agents.x-k8s.io/v1beta1", "kind", "Sandbox",
	    "metadata", "name", name, "labels", "team", "other", "spec",
	    "podTemplate", "spec", "containers");
	assert_int_equal(k8s_create(env.api, &K8S_SANDBOX, NS, foreign, NULL,
	    &st), 0);
	json_decref(foreign);
	reconcile(name);
	reconcile(name);
	assert_phase(name, "Provisioning");
	t = get_task(name);
	assert_string_equal(jp(cond(t, "Ready"), "reason"), "ChildConflict");
	assert_string_equal(jp(cond(t, "SandboxReady"), "reason"),
	    "ChildConflict");
	assert_non_null(strstr(jp(t, "status.message"), "sandbox"));
	assert_non_null(strstr(jp(t, "status.message"), "not owned"));
	json_decref(t);
	assert_sandbox_foreign(name);
	free(name);
}

/*
 * Someone else's <task>-token Secret is never mounted: no Sandbox while it
 * is there, the conflict reported; once it is gone the task goes on.
 */
static void
test_foreign_token_secret(void **state)
{
	struct k8s_status st = { 0 };
	char *name, *sname = xasprintf("t%d-token", counter + 1);
	json_t *sec, *t, *sb;

	(void)state;
	sec = json_pack("{s:s,s:s,s:{s:s},s:{s:s}}", "apiVersion", "v1",
	    "kind", "Secret", "metadata", "name", sname, "data", "token",
	    "c2VjcmV0");
	assert_int_equal(k8s_create(env.api, &K8S_SECRET, NS, sec, NULL, &st),
	    0);
	json_decref(sec);
	name = provisioned(NULL, NULL);
	assert_null(get(&K8S_SANDBOX, name));
	t = get_task(name);
	assert_string_equal(jp(cond(t, "Ready"), "reason"), "ChildConflict");
	assert_string_equal(jp(cond(t, "TokenIssued"), "reason"),
	    "ChildConflict");
	assert_non_null(strstr(jp(t, "status.message"), sname));
	json_decref(t);
	sec = get(&K8S_SECRET, sname);
	assert_null(jget(sec, "metadata.ownerReferences"));
	assert_string_equal(jp(sec, "data.token"), "c2VjcmV0");
	json_decref(sec);

	assert_int_equal(k8s_delete(env.api, &K8S_SECRET, NS, sname, NULL,
	    &st), 0);
	k8s_status_release(&st);
	reconcile(name);
	assert_phase(name, "Provisioning");
	sb = get(&K8S_SANDBOX, name);
	assert_non_null(sb);
	assert_string_equal(jp(sb, "spec.podTemplate.spec.volumes.0.secret."
	    "secretName"), sname);
	json_decref(sb);
	t = get_task(name);
	sec = get(&K8S_SECRET, sname);
	assert_owned(sec, t);
	assert_index(jp(t, "status.tokenId"), "active");
	json_decref(sec);
	json_decref(t);
	free(sname);
	free(name);
}

/* Create obj (JSON text) of kind r in NS. */
static void
create_text(const struct k8s_resource *r, const char *text)
{
	struct k8s_status st = { 0 };
	json_t *o = json_loads(text, 0, NULL);

	assert_non_null(o);
	assert_int_equal(k8s_create(env.api, r, NS, o, NULL, &st), 0);
	k8s_status_release(&st);
	json_decref(o);
}

/* Someone else's <name>-token Secret, with its own token. */
static void
foreign_token_secret(const char *name)
{
	char *text = xasprintf("{\"apiVersion\":\"v1\",\"kind\":"
	    "\"Secret\",\"metadata\":{\"name\":\"%s-token\"},\"data\":{"
	    "\"token\":\"c2VjcmV0\"}}", name);

	create_text(&K8S_SECRET, text);
	free(text);
}
/*
 * Someone else's Sandbox (text, taken) of the task's name: the task,
 * provisioned, reports the conflict.
 */
static void
sandbox_conflict(char *name, char *text)
{
	json_t *t;

	create_text(&K8S_SANDBOX, text);
	free(text);
	provision(name);
	t = get_task(name);
	assert_string_equal(jp(cond(t, "SandboxReady"), "reason"),
	    "ChildConflict");
	json_decref(t);
}

/*
 * A child-named object someone else made may carry the task's label but
 * no controller owner reference of the task's uid (only the label, or an
 * owner reference to the task with controller false): it is not adopted
 * but a conflict, left as it was.
 */
static void
test_foreign_labelled(void **state)
{
	char *name = xasprintf("t%d", counter + 1);
	char *sname = xasprintf("%s-token", name), *ename, *text;
	json_t *sec, *t;

	(void)state;
	/* a Secret with the task's label, the tenant's own token */
	text = xasprintf("{\"apiVersion\":\"v1\",\"kind\":\"Secret\","
	    "\"metadata\":{\"name\":\"%s\",\"labels\":{\"divergedev.com/"
	    "task\":\"%s\"}},\"data\":{\"token\":\"c2VjcmV0\"}}", sname,
	    name);
	create_text(&K8S_SECRET, text);
	free(text);
	{
		char *made = provisioned(NULL, NULL);

		/* the task the Secret was named for */
		assert_string_equal(made, name);
		free(name);
		name = made;
	}
	sec = get(&K8S_SECRET, sname);
	assert_null(jget(sec, "metadata.ownerReferences"));
	assert_string_equal(jp(sec, "data.token"), "c2VjcmV0");
	json_decref(sec);
	assert_null(get(&K8S_SANDBOX, name));
	t = get_task(name);
	assert_string_equal(jp(cond(t, "Ready"), "reason"), "ChildConflict");
	assert_null(jp(t, "status.tokenId"));
	json_decref(t);
	free(sname);
	free(name);

	/* an Environment with the label, an owner reference not controller */
	name = new_task(NULL, NULL);
	t = get_task(name);
	ename = xasprintf("agent-preview-%s", name);
	text = xasprintf("{\"apiVersion\":\"divergedev.com/v1alpha1\","
	    "\"kind\":\"Environment\",\"metadata\":{\"name\":\"%s\","
	    "\"labels\":{\"divergedev.com/task\":\"%s\"},"
	    "\"ownerReferences\":[{\"apiVersion\":\"divergedev.com/v1alpha1\","
	    "\"kind\":\"AgentTask\",\"name\":\"%s\",\"uid\":\"%s\","
	    "\"controller\":false}]},\"spec\":{\"branch\":\"evil\","
	    "\"image\":\"evil/image\"}}", ename, name, name,
	    k8s_meta_str(t, "uid"));
	json_decref(t);
	create_text(&K8S_ENVIRONMENT, text);
	free(text);
	provision(name);
	sec = get(&K8S_ENVIRONMENT, ename);
	assert_string_equal(jp(sec, "spec.branch"), "evil");
	assert_false(json_is_true(jget(sec,
	    "metadata.ownerReferences.0.controller")));
	json_decref(sec);
	t = get_task(name);
	assert_string_equal(jp(cond(t, "Ready"), "reason"), "ChildConflict");
	json_decref(t);
	free(ename);
	free(name);

	/* a Sandbox with the label, the tenant's pod, no owner reference */
	name = new_task(NULL, NULL);
	text = xasprintf("{\"apiVersion\":\"agents.x-k8s.io/v1beta1\","
	    "\"kind\":\"Sandbox\",\"metadata\":{\"name\":\"%s\","
	    "\"labels\":{\"divergedev.com/task\":\"%s\"}},\"spec\":{"
	    "\"podTemplate\":{\"spec\":{\"serviceAccountName\":\"admin\","
	    "\"containers\":[]}}}}", name, name);
	sandbox_conflict(name, text);
	assert_sandbox_foreign(name);
	free(name);
}

/*
 * A controller owner reference with the task's uid but another kind is
 * not the task's: a Sandbox of the task's name under it is a conflict,
 * left as it was.
 */
static void
test_foreign_owner_kind(void **state)
{
	char *name = new_task(NULL, NULL), *text;
	json_t *t = get_task(name);

	(void)state;
	text = xasprintf("{\"apiVersion\":\"agents.x-k8s.io/v1beta1\","
	    "\"kind\":\"Sandbox\",\"metadata\":{\"name\":\"%s\","
	    "\"ownerReferences\":[{\"apiVersion\":\"v1\",\"kind\":"
	    "\"ConfigMap\",\"name\":\"%s\",\"uid\":\"%s\",\"controller\":"
	    "true}]},\"spec\":{\"podTemplate\":{\"spec\":{\"containers\":"
	    "[]}}}}", name, name, k8s_meta_str(t, "uid"));
	json_decref(t);
	sandbox_conflict(name, text);
	t = get(&K8S_SANDBOX, name);
	assert_null(jget(t, "spec.operatingMode"));
	assert_int_equal(k8s_meta_int(t, "generation"), 1);
	json_decref(t);
	free(name);
}

/*
 * Warm-pool mode: a claim whose status names a Sandbox its claim does not
 * control (another claim's) is not bound to it: that Sandbox gets no
 * token and no mode, and the task does not name it.
 */
static void
test_warm_pool_other_sandbox(void **state)
{
	struct k8s_status st = { 0 };
	char *name;
	json_t *claim, *sb;

	(void)state;
	cfg.sandbox.warm_pool = 2;
	name = provisioned(NULL, NULL);
	create_text(&K8S_SANDBOXCLAIM, "{\"apiVersion\":\"extensions.agents."
	    "x-k8s.io/v1beta1\",\"kind\":\"SandboxClaim\",\"metadata\":{"
	    "\"name\":\"other\"},\"spec\":{\"warmPoolRef\":{\"name\":"
	    "\"pool\"}}}");
	claim = get(&K8S_SANDBOXCLAIM, "other");
	sb = json_pack("{s:s,s:s,s:{s:s,s:[{s:s,s:s,s:s,s:s,s:b}]},"
	    "s:{s:s,s:{s:{s:[{s:s,s:s}]}}}}", "apiVersion",
	    "agents.x-k8s.io/v1beta1", "kind", "Sandbox", "metadata", "name",
	    "pool-other", "ownerReferences", "apiVersion",
	    "extensions.agents.x-k8s.io/v1beta1", "kind", "SandboxClaim",
	    "name", "other", "uid", k8s_meta_str(claim, "uid"), "controller", 1,
	    "spec", "operatingMode", "Suspended", "podTemplate", "spec",
	    "containers", "name", "runner", "image", "runner:1");
	assert_int_equal(k8s_create(env.api, &K8S_SANDBOX, NS, sb, NULL, &st),
	    0);
	json_decref(sb);
	json_decref(claim);
	play("pool-other", "True", "DependenciesReady", 0, "10.0.0.9", 0, 0);
	claim = get(&K8S_SANDBOXCLAIM, name);
	json_object_set_new(claim, "status", json_pack("{s:{s:s}}", "sandbox",
	    "name", "pool-other"));
	assert_int_equal(k8s_update_status(env.api, &K8S_SANDBOXCLAIM, NS,
	    name, claim, NULL, &st), 0);
	json_decref(claim);
	twice_without(name, "Provisioning", "status.sandboxName");
	sb = get(&K8S_SANDBOX, "pool-other");
	assert_string_equal(jp(sb, "spec.operatingMode"), "Suspended");
	assert_null(jget(sb, "metadata.annotations"));
	assert_null(env_value(jget(sb, "spec.podTemplate.spec.containers.0"),
	    "DIVERGE_MACAROON_TOKEN"));
	json_decref(sb);
	cfg.sandbox.warm_pool = 0;
	free(name);
}

/*
 * Someone else's agent-preview-<task> Environment is not the task's
 * preview: the agent is not sent to it (no DIVERGE_PREVIEW_* in its
 * Sandbox) while it is there; once it is gone the task's own is made and
 * the agent gets it.
 */
static void
test_foreign_environment(void **state)
{
	struct k8s_status st = { 0 };
	char *name = xasprintf("t%d", counter + 1), *text;
	char *ename = xasprintf("agent-preview-%s", name);
	const json_t *c;
	json_t *sb, *t;

	(void)state;
	text = xasprintf("{\"apiVersion\":\"divergedev.com/v1alpha1\","
	    "\"kind\":\"Environment\",\"metadata\":{\"name\":\"%s\"},"
	    "\"spec\":{\"image\":\"tenant/listener\"}}", ename);
	create_text(&K8S_ENVIRONMENT, text);
	free(text);
	free(name);
	name = provisioned(NULL, NULL);
	t = get_task(name);
	assert_string_equal(jp(cond(t, "PreviewReady"), "reason"),
	    "ChildConflict");
	assert_null(jp(t, "status.previewUrl"));
	json_decref(t);
	sb = get(&K8S_SANDBOX, name);
	assert_non_null(sb);
	c = jget(sb, "spec.podTemplate.spec.containers.0");
	assert_non_null(env_value(c, "DIVERGE_TASK_NAME"));
	assert_null(env_value(c, "DIVERGE_PREVIEW_URL"));
	assert_null(env_value(c, "DIVERGE_PREVIEW_HEADER_VALUE"));
	json_decref(sb);

	assert_int_equal(k8s_delete(env.api, &K8S_ENVIRONMENT, NS, ename,
	    NULL, &st), 0);
	k8s_status_release(&st);
	reconcile(name);
	t = get_task(name);
	sb = get(&K8S_SANDBOX, name);
	c = jget(sb, "spec.podTemplate.spec.containers.0");
	assert_non_null(jp(t, "status.previewUrl"));
	assert_string_equal(env_value(c, "DIVERGE_PREVIEW_URL"),
	    jp(t, "status.previewUrl"));
	assert_string_equal(env_value(c, "DIVERGE_PREVIEW_HEADER_VALUE"),
	    ename);
	json_decref(sb);
	json_decref(t);
	free(ename);
	free(name);
}

/* No Environment without a repository URL or with preview disabled. */
/*
 * Every child carries the task's name as a label value (at most 63
 * characters): a longer name (a valid AgentTask name, up to 253) fails
 * the task at once, with no token and no child; 63 is fine.
 */
static void
test_long_name(void **state)
{
	char *name = xasprintf("%0*d", CONTROLLER_NAME_MAX + 1, ++counter);
	char *sname = xasprintf("%s-token", name);
	char *ename = xasprintf("agent-preview-%s", name);
	json_t *t;

	(void)state;
	new_task_named(name, NULL, NULL);
	reconcile(name);
	reconcile(name);
	t = get_task(name);
	assert_string_equal(jp(t, "status.phase"), "Failed");
	assert_string_equal(jp(t, "status.reason"), "InvalidName");
	assert_non_null(strstr(jp(t, "status.message"), "64 characters"));
	assert_null(jp(t, "status.tokenId"));
	assert_null(get(&K8S_SECRET, sname));
	assert_null(get(&K8S_SANDBOX, name));
	assert_null(get(&K8S_SANDBOXCLAIM, name));
	assert_null(get(&K8S_ENVIRONMENT, ename));
	json_decref(t);
	free(name);
	free(sname);
	free(ename);
	name = provision(new_task_named(xasprintf("%0*d",
	    CONTROLLER_NAME_MAX, ++counter), NULL, NULL));
	sname = xasprintf("%s-token", name);
	t = get(&K8S_SECRET, sname);
	assert_non_null(t);
	json_decref(t);
	free(sname);
	free(name);
}

/*
 * A Sandbox condition message may have 32768 characters, as many as the
 * task's whole status.message: quoted there, it is cut (on a character
 * boundary), not a status write the API refuses on every pass.
 */
static void
test_sandbox_long_message(void **state)
{
	char *name = provisioned(NULL, NULL), *m = xmalloc(32769);
	const char *sm;
	json_t *t;

	(void)state;
	/* 32767 characters in 32768 bytes, U+00E9 across byte 4096 */
	memset(m, 'x', 32768);
	memcpy(m + 4095, "\xc3\xa9", 2);
	m[32768] = '\0';
	play_msg(name, "False", "DependenciesNotReady", m, 0, NULL, 0, 0);
	reconcile(name);
	t = get_task(name);
	sm = jp(t, "status.message");
	assert_non_null(sm);
	assert_true(strncmp(sm, "waiting for the sandbox: xxx", 28) == 0);
	assert_true(strlen(sm) <= 32768);
	json_decref(t);
	/* the same message as a ReconcilerError for over 5 minutes */
	play_msg(name, "False", "ReconcilerError", m, 0, NULL, 0,
	    now_unix() - CONTROLLER_ERROR_GRACE_S - 10);
	reconcile(name);
	assert_phase(name, "Failed");
	t = get_task(name);
	assert_string_equal(jp(t, "status.reason"), "SandboxFailed");
	assert_true(strlen(jp(t, "status.message")) <= 32768);
	json_decref(t);
	free(m);
	free(name);
}

static void
test_no_preview(void **state)
{
	char *a = provisioned(NULL, ",\"divergedev.com/preview-enabled\":"
	    "\"false\""), *ename;
	json_t *t, *sb;

	(void)state;
	ename = xasprintf("agent-preview-%s", a);
	assert_null(get(&K8S_ENVIRONMENT, ename));
	t = get_task(a);
	assert_null(jget(t, "metadata.annotations.divergedev.com/"
	    "preview-environment"));
	assert_string_equal(jp(cond(t, "PreviewReady"), "reason"),
	    "PreviewDisabled");
	json_decref(t);
	sb = get(&K8S_SANDBOX, a);
	assert_null(env_value(jget(sb, "spec.podTemplate.spec.containers.0"),
	    "DIVERGE_PREVIEW_URL"));
	json_decref(sb);
	free(ename);
	free(a);
}

/*
 * Preview disabled on a running task: the task no longer names the
 * Environment (status and annotations), PreviewReady says so.
 */
static void
test_preview_disabled_later(void **state)
{
	char *name = active();
	json_t *t = get_task(name);

	(void)state;
	assert_non_null(jp(t, "status.previewUrl"));
	assert_non_null(jp(t, "metadata.annotations.divergedev.com/"
	    "preview-url"));
	json_decref(t);
	patch_task(name, 0, "{\"metadata\":{\"annotations\":{\"divergedev."
	    "com/preview-enabled\":\"false\"}}}");
	reconcile(name);
	t = get_task(name);
	assert_null(jget(t, "status.previewUrl"));
	assert_null(jget(t, "status.previewEnvironment"));
	assert_null(jget(t, "metadata.annotations.divergedev.com/"
	    "preview-url"));
	assert_null(jget(t, "metadata.annotations.divergedev.com/"
	    "preview-environment"));
	assert_string_equal(jp(cond(t, "PreviewReady"), "reason"),
	    "PreviewDisabled");
	json_decref(t);
	free(name);
}

/*
 * A new preview.url_template (a SIGHUP) moves the task's preview URL, in
 * its status and its annotation, the Environment staying the same.
 */
static void
test_preview_url_moved(void **state)
{
	char *name = active(), *was = cfg.preview.url_template, *want;
	json_t *t;

	(void)state;
	cfg.preview.url_template = xstrdup("https://p2.example.com/{env}");
	reconcile(name);
	free(cfg.preview.url_template);
	cfg.preview.url_template = was;
	want = xasprintf("https://p2.example.com/agent-preview-%s", name);
	t = get_task(name);
	assert_string_equal(jp(t, "status.previewUrl"), want);
	assert_string_equal(jp(t, "metadata.annotations.divergedev.com/"
	    "preview-url"), want);
	json_decref(t);
	free(want);
	free(name);
}

/* Created suspended: Pending -> Paused, nothing provisioned. */
static void
test_created_suspended(void **state)
{
	char *name = new_task(",\"suspended\":true", NULL);

	(void)state;
	reconcile(name);
	reconcile(name);
	assert_phase(name, "Paused");
	assert_null(get(&K8S_SANDBOX, name));
	set_suspended(name, 0);
	reconcile(name);
	assert_phase(name, "Provisioning");
	free(name);
}

/* Warm-pool mode: a SandboxClaim carrying the token in its env. */
static void
test_warm_pool(void **state)
{
	char *name, *tok;
	json_t *claim, *t;

	(void)state;
	cfg.sandbox.warm_pool = 2;
	name = provisioned(NULL, NULL);
	cfg.sandbox.warm_pool = 0;
	assert_null(get(&K8S_SANDBOX, name));
	claim = get(&K8S_SANDBOXCLAIM, name);
	assert_non_null(claim);
	t = get_task(name);
	assert_owned(claim, t);
	assert_string_equal(jp(claim, "spec.warmPoolRef.name"),
	    CONTROLLER_WARM_POOL);
	tok = token_of(name);
	assert_string_equal(env_value(json_object_get(claim, "spec"),
	    "DIVERGE_MACAROON_TOKEN"), tok);
	assert_null(env_value(json_object_get(claim, "spec"),
	    "DIVERGE_TOKEN_FILE"));
	json_decref(claim);
	/*
	 * a raised timeout does not extend the token: the claim's pod has it
	 * in its environment, a new one would never reach it
	 */
	cfg.sandbox.warm_pool = 2;
	set_timeout(name, 4 * 3600);
	reconcile(name);
	cfg.sandbox.warm_pool = 0;
	claim = get(&K8S_SANDBOXCLAIM, name);
	assert_string_equal(env_value(json_object_get(claim, "spec"),
	    "DIVERGE_MACAROON_TOKEN"), tok);
	free(tok);
	tok = token_of(name);
	assert_string_equal(env_value(json_object_get(claim, "spec"),
	    "DIVERGE_MACAROON_TOKEN"), tok);
	free(tok);
	json_decref(t);
	json_decref(claim);
	free(name);
}

/* network_policy: false creates none. */
static void
test_netpol_disabled(void **state)
{
	char *name;

	(void)state;
	close_all();
	open_all(1);
	cfg.sandbox.network_policy = 0;
	name = provisioned(NULL, NULL);
	cfg.sandbox.network_policy = 1;
	assert_null(get(&K8S_NETWORKPOLICY, CONTROLLER_NETPOL));
	free(name);
}

/*
 * In a cluster (KUBERNETES_SERVICE_HOST set) the API server's service
 * address is excepted from the policy's open 443 as a /32, beside the
 * metadata range; an IPv6 address adds nothing, since the policy opens
 * IPv4 (0.0.0.0/0) only and an IPv6 except there would be invalid.
 */
static void
test_netpol_apiserver(void **state)
{
	static const char *hosts[] = { "10.96.0.1", "fd00:10:96::1" };
	char *name;
	json_t *np;
	const json_t *ex;
	size_t i;

	(void)state;
	for (i = 0; i < 2; i++) {
		close_all();
		open_all(1);
		setenv("KUBERNETES_SERVICE_HOST", hosts[i], 1);
		name = provisioned(NULL, NULL);
		unsetenv("KUBERNETES_SERVICE_HOST");
		np = get(&K8S_NETWORKPOLICY, CONTROLLER_NETPOL);
		assert_non_null(np);
		assert_string_equal(jp(np, "spec.egress.1.to.0.ipBlock.cidr"),
		    "0.0.0.0/0");
		ex = jget(np, "spec.egress.1.to.0.ipBlock.except");
		assert_string_equal(json_string_value(json_array_get(ex, 0)),
		    "169.254.0.0/16");
		if (i == 0) {
			assert_int_equal(json_array_size(ex), 2);
			assert_string_equal(json_string_value(
			    json_array_get(ex, 1)), "10.96.0.1/32");
		} else {
			assert_int_equal(json_array_size(ex), 1);
		}
		json_decref(np);
		free(name);
	}
}

/* live -> Failed (PullRequestClosed, by the SCM side): the effects. */
static void
test_pr_closed(void **state)
{
	char *name = active(), *tok = token_of(name);
	json_t *t, *sb;
	uint64_t w0;

	(void)state;
	patch_status(name, "{\"status\":{\"phase\":\"Failed\","
	    "\"reason\":\"PullRequestClosed\",\"message\":\"the pull "
	    "request was closed\"}}");
	reconcile(name);
	assert_phase(name, "Failed");
	t = get_task(name);
	assert_string_equal(jp(t, "status.reason"), "PullRequestClosed");
	assert_string_equal(jp(t, "status.message"),
	    "the pull request was closed");
	assert_index(jp(t, "status.tokenId"), "revoked");
	assert_non_null(jp(t, "status.completedAt"));
	assert_int_equal(charge(tok, 1, "closed"), 401);
	sb = get(&K8S_SANDBOX, name);
	assert_non_null(jp(sb, "spec.shutdownTime"));
	json_decref(sb);
	json_decref(t);
	w0 = writes();
	reconcile(name);
	assert_int_equal(writes(), w0);
	free(tok);
	free(name);
}

/*
 * A Paused task that ends (its PR closed): the Sandbox stays Suspended
 * until its shutdownTime and the Environment stays hibernated.
 */
static void
test_paused_then_finished(void **state)
{
	char *name = active(), *ename = xasprintf("agent-preview-%s", name);
	json_t *t, *sb, *envo;
	uint64_t w0;

	(void)state;
	pause_task(name);
	patch_status(name, "{\"status\":{\"phase\":\"Failed\","
	    "\"reason\":\"PullRequestClosed\"}}");
	reconcile(name);
	assert_phase(name, "Failed");
	sb = get(&K8S_SANDBOX, name);
	assert_string_equal(jp(sb, "spec.operatingMode"), "Suspended");
	assert_non_null(jp(sb, "spec.shutdownTime"));
	json_decref(sb);
	envo = get(&K8S_ENVIRONMENT, ename);
	assert_string_equal(jp(envo, "metadata.annotations.divergedev.com/"
	    "hibernated"), "true");
	json_decref(envo);
	t = get_task(name);
	assert_string_equal(jp(cond(t, "PreviewReady"), "reason"),
	    "Hibernated");
	json_decref(t);
	w0 = writes();
	reconcile(name);
	assert_int_equal(writes(), w0);
	free(ename);
	free(name);
}

/* Warm-pool mode: a pass, and the task runs Active in Sandbox sbname. */
static void
assert_active_in(const char *name, const char *sbname)
{
	json_t *t = pass_to(name, "Active");

	assert_string_equal(jp(t, "status.sandboxName"), sbname);
	json_decref(t);
}

/* Warm-pool mode: the claim's Sandbox is paused, and only ours. */
static void
test_warm_pool_pause(void **state)
{
	struct k8s_status st = { 0 };
	char *name, sbname[64];
	json_t *claim, *sb;

	(void)state;
	cfg.sandbox.warm_pool = 2;
	name = provisioned(NULL, NULL);
	claim = get(&K8S_SANDBOXCLAIM, name);
	/* the claim controller adopted a pool Sandbox and made it Ready */
	snprintf(sbname, sizeof(sbname), "pool-%s", name);
	sb = json_pack("{s:s,s:s,s:{s:s,s:[{s:s,s:s,s:s,s:s,s:b}]},"
	    "s:{s:s,s:{s:{s:[{s:s,s:s,s:O}]}}}}", "apiVersion",
	    "agents.x-k8s.io/v1beta1", "kind", "Sandbox", "metadata", "name",
	    sbname, "ownerReferences", "apiVersion",
	    "extensions.agents.x-k8s.io/v1beta1", "kind", "SandboxClaim",
	    "name", name, "uid", k8s_meta_str(claim, "uid"), "controller", 1,
	    "spec", "operatingMode", "Running", "podTemplate", "spec",
	    "containers", "name", "runner", "image", "runner:1", "env",
	    (json_t *)jget(claim, "spec.env"));
	assert_int_equal(k8s_create(env.api, &K8S_SANDBOX, NS, sb, NULL, &st),
	    0);
	json_decref(sb);
	play(sbname, "True", "DependenciesReady", 0, "10.0.0.5", 0, 0);
	json_object_set_new(claim, "status", json_pack("{s:{s:s,s:[s]},"
	    "s:[{s:s,s:s,s:s,s:s,s:s}]}", "sandbox", "name", sbname,
	    "podIPs", "10.0.0.5", "conditions", "type", "Ready", "status",
	    "True", "reason", "DependenciesReady", "message", "",
	    "lastTransitionTime", "2026-01-01T00:00:00Z"));
	assert_int_equal(k8s_update_status(env.api, &K8S_SANDBOXCLAIM, NS,
	    name, claim, NULL, &st), 0);
	json_decref(claim);
	assert_active_in(name, sbname);
	set_suspended(name, 1);
	reconcile(name);
	assert_phase(name, "Pausing");
	sb = get(&K8S_SANDBOX, sbname);
	assert_string_equal(jp(sb, "spec.operatingMode"), "Suspended");
	json_decref(sb);
	play(sbname, "False", "SandboxSuspended", 0, NULL, 1, 0);
	reconcile(name);
	assert_phase(name, "Paused");
	cfg.sandbox.warm_pool = 0;
	free(name);
}

/*
 * Play the claim controller's cold start of a claim with env (reference/
 * agent-sandbox.md section 4): a Sandbox named as the claim, controlled by
 * it, from the pool's template with the claim's env in its first
 * container, then Ready; the claim's status not yet written.
 */
static void
play_claim_sandbox(const char *name)
{
	struct k8s_status st = { 0 };
	json_t *claim = get(&K8S_SANDBOXCLAIM, name), *sb;

	assert_non_null(claim);
	sb = json_pack("{s:s,s:s,s:{s:s,s:{s:s,s:s},s:[{s:s,s:s,s:s,s:s,"
	    "s:b}]},s:{s:s,s:{s:{s:{s:s,s:s}},s:{s:[{s:s,s:s,s:O}]}}}}",
	    "apiVersion", "agents.x-k8s.io/v1beta1", "kind", "Sandbox",
	    "metadata", "name", name, "labels", "agents.x-k8s.io/claim-uid",
	    k8s_meta_str(claim, "uid"), "agents.x-k8s.io/launch-type", "cold",
	    "ownerReferences", "apiVersion",
	    "extensions.agents.x-k8s.io/v1beta1", "kind", "SandboxClaim",
	    "name", name, "uid", k8s_meta_str(claim, "uid"), "controller", 1,
	    "spec", "operatingMode", "Running", "podTemplate", "metadata",
	    "labels", "agents.x-k8s.io/claim-uid", k8s_meta_str(claim, "uid"),
	    "app", "pool-template", "spec", "containers", "name", "runner",
	    "image", "runner:1", "env", (json_t *)jget(claim, "spec.env"));
	assert_int_equal(k8s_create(env.api, &K8S_SANDBOX, NS, sb, NULL, &st),
	    0);
	json_decref(sb);
	play(name, "True", "DependenciesReady", 0, "10.0.0.5", 0, 0);
	json_decref(claim);
}

/* ... and the claim binds it. */
static void
play_claim_cold(const char *name)
{
	struct k8s_status st = { 0 };
	json_t *claim;

	play_claim_sandbox(name);
	claim = get(&K8S_SANDBOXCLAIM, name);
	json_object_set_new(claim, "status", json_pack("{s:{s:s}}", "sandbox",
	    "name", name));
	assert_int_equal(k8s_update_status(env.api, &K8S_SANDBOXCLAIM, NS,
	    name, claim, NULL, &st), 0);
	json_decref(claim);
}

/*
 * The token the pod template of the claim's Sandbox carries (the one a
 * pod started from it holds), or NULL.
 */
static char *
warm_pod_token(const char *name)
{
	json_t *sb = get(&K8S_SANDBOX, name);
	const char *v;
	char *tok;

	assert_non_null(sb);
	v = env_value(jget(sb, "spec.podTemplate.spec.containers.0"),
	    "DIVERGE_MACAROON_TOKEN");
	tok = v != NULL ? xstrdup(v) : NULL;
	json_decref(sb);
	return tok;
}

/*
 * Warm-pool mode: the claim's Sandbox runs with the task's live token
 * (and records its id), the claim's env carries it too, the podTemplate
 * metadata is the claim controller's, and the token the pod has charges.
 */
static void
assert_warm_current(const char *name)
{
	char *id = task_token_id(name), *tok = token_of(name);
	char *ptok = warm_pod_token(name);
	json_t *claim = get(&K8S_SANDBOXCLAIM, name);
	json_t *sb = get(&K8S_SANDBOX, name);

	assert_non_null(ptok);
	assert_string_equal(ptok, tok);
	assert_string_equal(env_value(json_object_get(claim, "spec"),
	    "DIVERGE_MACAROON_TOKEN"), tok);
	assert_index(id, "active");
	assert_int_equal(charge(ptok, 1, id), 200);
	assert_string_equal(jp(sb, "spec.podTemplate.spec.containers.0.name"),
	    "runner");
	assert_string_equal(jp(sb, "spec.podTemplate.metadata.labels.app"),
	    "pool-template");
	assert_null(jget(sb, "spec.podTemplate.metadata.annotations"));
	assert_non_null(jp(sb, "metadata.annotations.divergedev.com/"
	    "token-id"));
	assert_string_equal(jp(sb, "metadata.annotations.divergedev.com/"
	    "token-id"), id);
	json_decref(claim);
	json_decref(sb);
	free(ptok);
	free(tok);
	free(id);
}

/* Back to Sandboxes after a warm-pool test, also one that failed. */
static int
warm_off(void **state)
{
	(void)state;
	cfg.sandbox.warm_pool = 0;
	return 0;
}

/* A warm-pool task, its claim's Sandbox cold-started and the task Active. */
static char *
warm_active(void)
{
	char *name = provisioned(NULL, NULL);

	play_claim_cold(name);
	reconcile(name);
	assert_phase(name, "Active");
	assert_sandbox(name, "Running", NULL);
	assert_warm_current(name);
	return name;
}

/*
 * A warm-pool task, Active, then paused and resumed (no pass since);
 * *old_id and *old_tok get its token before (new strings).
 */
static char *
warm_paused_resumed(char **old_id, char **old_tok)
{
	char *name = warm_active();

	*old_id = task_token_id(name);
	*old_tok = warm_pod_token(name);
	pause_task(name);
	assert_int_equal(charge(*old_tok, 1, "w-paused"), 401);
	set_suspended(name, 0);
	return name;
}

/* After the resume's pass: the Sandbox runs with the new token. */
static void
assert_warm_resumed(const char *name, const char *old_id,
    const char *old_tok)
{
	assert_phase(name, "Provisioning");
	assert_sandbox(name, "Running", NULL);
	assert_warm_current(name);
	assert_index(old_id, "revoked");
	assert_int_equal(charge(old_tok, 1, "w-old"), 401);
}

/*
 * Warm-pool mode, paused and resumed: the resume mints a new token, and
 * the claim controller applies a claim's env only when it makes the
 * Sandbox, so the reconciler writes the new one into the bound Sandbox's
 * pod template before it runs again: the resumed pod has the live token,
 * the old one is revoked.
 */
static void
test_warm_pool_resume(void **state)
{
	char *name, *old_id, *old_tok;
	uint64_t w0;

	(void)state;
	cfg.sandbox.warm_pool = 2;
	name = warm_paused_resumed(&old_id, &old_tok);
	reconcile(name);
	assert_warm_resumed(name, old_id, old_tok);
	play(name, "True", "DependenciesReady", 0, "10.0.0.6", 0, 0);
	reconcile(name);
	assert_phase(name, "Active");
	assert_warm_current(name);
	if (store == env.api) {
		w0 = writes();
		reconcile(name);
		assert_int_equal(writes(), w0);
	}
	cfg.sandbox.warm_pool = 0;
	free(old_tok);
	free(old_id);
	free(name);
}

/*
 * Warm-pool mode: the cold-started Sandbox is named as the claim and
 * counts as soon as it exists, before the claim's status names it.
 */
static void
test_warm_pool_unbound_sandbox(void **state)
{
	char *name;

	(void)state;
	cfg.sandbox.warm_pool = 2;
	name = provisioned(NULL, NULL);
	play_claim_sandbox(name);
	assert_active_in(name, name);
	assert_warm_current(name);
	cfg.sandbox.warm_pool = 0;
	free(name);
}

/* Warm-pool mode: a claim with no Sandbox yet has nothing to stop. */
static void
test_warm_pool_pause_unbound(void **state)
{
	char *name;

	(void)state;
	cfg.sandbox.warm_pool = 2;
	name = provisioned(NULL, NULL);
	set_suspended(name, 1);
	reconcile(name);
	assert_phase(name, "Paused");
	cfg.sandbox.warm_pool = 0;
	free(name);
}

/*
 * Warm-pool mode: the bound Sandbox of a resumed task runs again only
 * once its status is live, with the new token (a merge patch of it).
 */
static void
test_warm_pool_write_order(void **state)
{
	char *name, *old_id, *old_tok;

	(void)state;
	cfg.sandbox.warm_pool = 2;
	name = warm_paused_resumed(&old_id, &old_tok);
	watch_sandbox_writes(name);
	reconcile(name);
	assert_int_equal(seen_runs, 1);
	assert_string_equal(seen_phase, "Provisioning");
	assert_int_equal(seen_run_charge, 200);
	unwatch_sandbox_writes();
	assert_warm_resumed(name, old_id, old_tok);
	cfg.sandbox.warm_pool = 0;
	free(old_tok);
	free(old_id);
	free(name);
}

/*
 * Warm-pool mode, the token replaced while the claim's pod may still run
 * (resumed before it stopped, the Secret lost): the Sandbox stays or goes
 * Suspended, its template unchanged, until the pod is gone, and then runs
 * with the new token in its template; the task is not Active meanwhile.
 */
static void
warm_rolled(const char *name, const char *old_id, const char *old_tok)
{
	char *ptok = warm_pod_token(name);

	/* not yet written: the pod may still run with the old one */
	assert_string_equal(ptok, old_tok);
	free(ptok);
	assert_sandbox_rolled(name, old_id);
	assert_warm_current(name);
	assert_int_equal(charge(old_tok, 1, "rolled-old"), 401);
}

static void
test_warm_pool_roll(void **state)
{
	struct k8s_status st = { 0 };
	char *name, *old_tok, *old_id, *sname;

	(void)state;
	cfg.sandbox.warm_pool = 2;
	/* resumed before the pod stopped */
	name = warm_active();
	old_tok = warm_pod_token(name);
	old_id = task_token_id(name);
	set_suspended(name, 1);
	reconcile(name);
	assert_phase(name, "Pausing");
	set_suspended(name, 0);
	reconcile(name);
	warm_rolled(name, old_id, old_tok);
	free(old_tok);
	free(old_id);
	/* the Secret lost while Active */
	old_tok = warm_pod_token(name);
	old_id = task_token_id(name);
	sname = xasprintf("%s-token", name);
	assert_int_equal(k8s_delete(env.api, &K8S_SECRET, NS, sname, NULL,
	    &st), 0);
	k8s_status_release(&st);
	reconcile(name);
	warm_rolled(name, old_id, old_tok);
	cfg.sandbox.warm_pool = 0;
	free(sname);
	free(old_tok);
	free(old_id);
	free(name);
}

/*
 * Reconcile task name in a child process killed (SIGKILL) after its
 * crash_at-th child write, then open the store and the meter again, as a
 * restarted diverged does.
 */
static void
crash_reconcile(const char *name, int crash_at)
{
	struct k8s_embedded_config ec = { 1000, 3600, 0 };
	char *path = xasprintf("%s/diverge.db", env.dir);
	struct meter_config mc;
	char *cause = NULL;
	int status;
	pid_t pid;

	meter_free(meter);
	meter = NULL;
	k8s_api_free(env.api);
	env.api = NULL;
	memset(&mc, 0, sizeof(mc));
	mc.root_key = key;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (k8s_embedded_open(&env.api, path, &ec, &cause) < 0)
			_exit(2);
		mc.store = env.api;
		if (meter_new(&meter, &mc, &cause) < 0)
			_exit(2);
		cc.store = env.api;
		cc.meter = meter;
		cc.crash_after_writes = crash_at;
		controller_reconcile(&cc, NS, name, NULL, NULL, &cause);
		_exit(3);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status));
	assert_int_equal(WTERMSIG(status), SIGKILL);
	/* restart */
	assert_int_equal(k8s_embedded_open(&env.api, path, &ec, &cause), 0);
	store = env.api;
	mc.store = env.api;
	assert_int_equal(meter_new(&meter, &mc, &cause), 0);
	cc.store = env.api;
	cc.meter = meter;
	free(path);
}

/* kill -9 between two child writes; the restart finishes the job. */
static void
test_crash_recovery(void **state)
{
	char *name;
	int crash_at;

	(void)state;
	for (crash_at = 1; crash_at <= 4; crash_at++) {
		json_t *t, *sb;

		close_all();
		open_all(1);
		name = new_task(NULL, NULL);
		reconcile(name);
		assert_phase(name, "Pending");
		crash_reconcile(name, crash_at);
		reconcile(name);
		assert_phase(name, "Provisioning");
		t = get_task(name);
		assert_index(jp(t, "status.tokenId"), "active");
		{
			char *sname = xasprintf("%s-token", name);
			json_t *sec = get(&K8S_SECRET, sname);

			assert_string_equal(jp(sec, "metadata.annotations."
			    "divergedev.com/token-id"), jp(t,
			    "status.tokenId"));
			json_decref(sec);
			free(sname);
		}
		sb = get(&K8S_SANDBOX, name);
		assert_non_null(sb);
		json_decref(sb);
		sb = get(&K8S_NETWORKPOLICY, CONTROLLER_NETPOL);
		assert_non_null(sb);
		json_decref(sb);
		json_decref(t);
		free(name);
	}
}

/*
 * kill -9 at each step of a token extension (the mint, the Secret, the
 * Sandbox's record): the restart ends extended, with nothing revoked
 * and no restart of the Sandbox.
 */
static void
test_token_extended_crash(void **state)
{
	char *name, *tok0, *id0;
	int crash_at;

	(void)state;
	for (crash_at = 1; crash_at <= 3; crash_at++) {
		close_all();
		open_all(1);
		name = active();
		tok0 = token_of(name);
		id0 = task_token_id(name);
		set_timeout(name, 4 * 3600);
		crash_reconcile(name, crash_at);
		reconcile(name);
		assert_token_extended(name, id0, tok0, 4 * 3600);
		free(id0);
		free(tok0);
		free(name);
	}
}

/*
 * Only a settled token is extended: one a restart left in the Secret
 * (its Secret lost and a new token written, the status not yet) is taken
 * as the live one as it is, though the timeout was raised meanwhile; the
 * pass after that settles it extends it.
 */
static void
test_token_unsettled_not_extended(void **state)
{
	struct k8s_status st = { 0 };
	char *name, *sname, *id;
	json_t *t, *sec;

	(void)state;
	close_all();
	open_all(1);
	name = active();
	sname = xasprintf("%s-token", name);
	assert_int_equal(k8s_delete(env.api, &K8S_SECRET, NS, sname, NULL,
	    &st), 0);
	k8s_status_release(&st);
	/* the new token and its Secret written, then the crash */
	crash_reconcile(name, 2);
	sec = get(&K8S_SECRET, sname);
	assert_non_null(sec);
	id = xstrdup(jp(sec, "metadata.annotations.divergedev.com/token-id"));
	json_decref(sec);
	set_timeout(name, 4 * 3600);
	reconcile(name);
	t = get_task(name);
	assert_string_equal(jp(t, "status.tokenId"), id);
	json_decref(t);
	reconcile(name);
	t = get_task(name);
	assert_string_not_equal(jp(t, "status.tokenId"), id);
	json_decref(t);
	sec = get(&K8S_SECRET, sname);
	assert_string_equal(jp(sec, "metadata.annotations.divergedev.com/"
	    "token-extends"), id);
	json_decref(sec);
	free(id);
	free(sname);
	free(name);
}

/*
 * Warm-pool mode: kill -9 at each step of a resume (the mint, the
 * Secret, the claim, the Sandbox): the restart ends with the Sandbox
 * running the live token, the old one revoked.
 */
static void
test_warm_pool_resume_crash(void **state)
{
	char *name, *old_tok, *old_id;
	int crash_at;

	(void)state;
	cfg.sandbox.warm_pool = 2;
	for (crash_at = 1; crash_at <= 4; crash_at++) {
		close_all();
		open_all(1);
		name = warm_paused_resumed(&old_id, &old_tok);
		crash_reconcile(name, crash_at);
		reconcile(name);
		assert_warm_resumed(name, old_id, old_tok);
		free(old_tok);
		free(old_id);
		free(name);
	}
	cfg.sandbox.warm_pool = 0;
}

/*
 * With RECONCILER_DUMP_DIR set, write the objects the reconciler made in
 * each shape (tests/integration/test_reconcile_schemas.py validates them
 * against the upstream schemas); otherwise do nothing.
 */
static void
dump(const char *dir, const char *label, const json_t *o)
{
	char *path = xasprintf("%s/%s.json", dir, label);

	assert_non_null(o);
	assert_int_equal(json_dump_file(o, path, JSON_INDENT(1) |
	    JSON_SORT_KEYS), 0);
	free(path);
}

static void
dump_get(const char *dir, const char *label, const struct k8s_resource *r,
    const char *name)
{
	json_t *o = get(r, name);

	dump(dir, label, o);
	json_decref(o);
}

/* Dump the task and what it has of each child (label-kind.json). */
static void
dump_task(const char *dir, const char *label, const char *name)
{
	const struct {
		const char *kind, *pre, *suf;
		const struct k8s_resource *r;
	} c[] = {
		{ "agenttask", "", "", &K8S_AGENTTASK },
		{ "sandbox", "", "", &K8S_SANDBOX },
		{ "sandboxclaim", "", "", &K8S_SANDBOXCLAIM },
		{ "secret-token", "", "-token", &K8S_SECRET },
		{ "environment", "agent-preview-", "", &K8S_ENVIRONMENT },
	};
	size_t i;

	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		char *n = xasprintf("%s%s%s", c[i].pre, name, c[i].suf);
		char *l = xasprintf("%s-%s", label, c[i].kind);
		json_t *o = get(c[i].r, n);

		if (o != NULL)
			dump(dir, l, o);
		json_decref(o);
		free(l);
		free(n);
	}
}

/*
 * A task named n characters long (a DNS-1123 subdomain with dots), with
 * a repository, branches and objective that are not names at all, one
 * pass past Provisioning (Active when it has a Sandbox).
 */
static char *
odd_task(int n)
{
	char *name = xasprintf("fix-pr-42.my-org.checkout-service.%0*d",
	    n - 34, 7);
	json_t *sb;

	assert_int_equal((int)strlen(name), n);
	new_task_named(name, NULL, NULL);
	patch_task(name, 0, "{\"spec\":{\"objective\":\"\\u4fee\\u590d "
	    "N+1 \\u2014 \\u00fcn\\u00efc\\u00f6d\\u00e9 \\ud83d\\ude80\","
	    "\"repository\":{\"url\":\"https://github.com/My_Org/"
	    "Checkout.Service_V2.git\",\"baseBranch\":\"Release/2026.11_RC\","
	    "\"workingBranch\":\"diverge/Fix_N+1.Queries-in-Checkout_"
	    "Service-for-the-2026.11-release-candidate-and-everything-that-"
	    "depends-on-it-including-the-payment-and-shipping-services-"
	    "which-are-also-affected-by-the-regression-introduced-in-pr-"
	    "41-of-the-monorepo\"}}}");
	reconcile(name);
	reconcile(name);
	sb = get(&K8S_SANDBOX, name);
	if (sb != NULL) {
		play(name, "True", "DependenciesReady", 0, "10.0.0.9", 0, 0);
		reconcile(name);
	}
	json_decref(sb);
	return name;
}

static void
test_dump(void **state)
{

	const char *dir = getenv("RECONCILER_DUMP_DIR");
	char *name, *sname, *ename, *tok, *auth;
	const char *body = "{\"result\":\"succeeded\"}";
	struct meter_reply r = { 0 };
	const struct {
		int len, warm;
		const char *label;
	} odd[] = {
		{ 63, 0, "odd63" }, { 100, 0, "odd100" },
		{ 62, 2, "odd62-warm" }, { 120, 2, "odd120-warm" },
	};
	size_t i;

	(void)state;
	/* not cmocka's skip(): its "not ok # SKIP" fails automake's TAP */
	if (dir == NULL)
		return;
	name = active();
	sname = xasprintf("%s-token", name);
	ename = xasprintf("agent-preview-%s", name);
	dump_get(dir, "sandbox-running", &K8S_SANDBOX, name);
	dump_get(dir, "secret-token", &K8S_SECRET, sname);
	dump_get(dir, "secret-index", &K8S_SECRET, METER_INDEX_SECRET);
	dump_get(dir, "networkpolicy", &K8S_NETWORKPOLICY, CONTROLLER_NETPOL);
	dump_get(dir, "environment", &K8S_ENVIRONMENT, ename);
	dump_get(dir, "agenttask-active", &K8S_AGENTTASK, name);
	set_suspended(name, 1);
	reconcile(name);
	dump_get(dir, "sandbox-suspended", &K8S_SANDBOX, name);
	dump_get(dir, "environment-hibernated", &K8S_ENVIRONMENT, ename);
	set_suspended(name, 0);
	reconcile(name);
	tok = token_of(name);
	auth = xasprintf("Bearer %s", tok);
	meter_complete(meter, auth, body, strlen(body), &r);
	assert_int_equal(r.status, 200);
	meter_reply_release(&r);
	reconcile(name);
	dump_get(dir, "sandbox-completed", &K8S_SANDBOX, name);
	dump_get(dir, "agenttask-completed", &K8S_AGENTTASK, name);
	free(tok);
	free(auth);
	free(sname);
	free(ename);
	free(name);
	/* warm-pool mode */
	cfg.sandbox.warm_pool = 2;
	name = provisioned(NULL, NULL);
	dump_get(dir, "sandboxclaim-running", &K8S_SANDBOXCLAIM, name);
	patch_status(name, "{\"status\":{\"phase\":\"Failed\","
	    "\"reason\":\"PullRequestClosed\"}}");
	reconcile(name);
	dump_get(dir, "sandboxclaim-failed", &K8S_SANDBOXCLAIM, name);
	cfg.sandbox.warm_pool = 0;
	free(name);
	/* names at and over the label limit, in both modes */
	for (i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		cfg.sandbox.warm_pool = odd[i].warm;
		name = odd_task(odd[i].len);
		dump_task(dir, odd[i].label, name);
		free(name);
	}
	cfg.sandbox.warm_pool = 0;
}

/* ------------------------------------------------------------ queue */

static void
test_queue(void **state)
{
	struct controller_queue *q = controller_queue_new();
	char *a, *b;
	int64_t t0;
	unsigned n;

	(void)state;
	controller_queue_add(q, "ns/a");
	controller_queue_add(q, "ns/a");
	controller_queue_add(q, "ns/b");
	assert_int_equal(controller_queue_len(q), 2);
	a = controller_queue_get(q, 0);
	assert_string_equal(a, "ns/a");
	/* a is processing: another add waits until done */
	controller_queue_add(q, "ns/a");
	b = controller_queue_get(q, 0);
	assert_string_equal(b, "ns/b");
	assert_null(controller_queue_get(q, 10));
	controller_queue_done(q, a);
	free(a);
	a = controller_queue_get(q, 0);
	assert_string_equal(a, "ns/a");
	controller_queue_done(q, a);
	controller_queue_done(q, b);
	free(a);
	free(b);
	/* delayed */
	t0 = now_mono_ms();
	controller_queue_add_after(q, "ns/c", 50);
	controller_queue_add_after(q, "ns/c", 500);
	a = controller_queue_get(q, 2000);
	assert_string_equal(a, "ns/c");
	assert_true(now_mono_ms() - t0 >= 45 && now_mono_ms() - t0 < 400);
	controller_queue_done(q, a);
	free(a);
	/* backoff: 5 ms doubling to 5 min, jittered between half and all */
	assert_true(controller_backoff_ms(1, 0) >= 2 &&
	    controller_backoff_ms(1, 0) <= 5);
	assert_int_equal(controller_backoff_ms(1, 1024), 5);
	assert_int_equal(controller_backoff_ms(3, 1024), 20);
	for (n = 1; n < 100; n++) {
		int64_t d = controller_backoff_ms(n, (uint32_t)n * 7919);

		assert_true(d >= 2 && d <= 300000);
	}
	assert_int_equal(controller_backoff_ms(40, 1024), 300000);
	assert_true(controller_backoff_ms(40, 0) >= 150000);
	controller_queue_shutdown(q);
	assert_null(controller_queue_get(q, 1000));
	controller_queue_free(q);
}

/* Add the keys ns/k<*last>.. (n of them), counting *last on. */
static void
queue_add_n(struct controller_queue *q, int *last, int n)
{
	char k[32];

	for (; n > 0; n--) {
		snprintf(k, sizeof(k), "ns/k%d", (*last)++);
		controller_queue_add(q, k);
	}
}

/* Take n keys, which must be ns/k<*next>.. in that order. */
static void
queue_take_n(struct controller_queue *q, int *next, int n)
{
	char k[32], *got;

	for (; n > 0; n--) {
		snprintf(k, sizeof(k), "ns/k%d", (*next)++);
		got = controller_queue_get(q, 0);
		assert_non_null(got);
		assert_string_equal(got, k);
		controller_queue_done(q, got);
		free(got);
	}
}

/*
 * The waiting keys come out in the order they went in when their ring
 * (64 at first) wraps around its end, and when it grows while wrapped.
 */
static void
test_queue_ring(void **state)
{
	struct controller_queue *q = controller_queue_new();
	int last = 0, next = 0, i;

	(void)state;
	for (i = 0; i < 50; i++) {
		queue_add_n(q, &last, 1);
		queue_take_n(q, &next, 1);
	}
	/* 30 from slot 50 on: past the end */
	queue_add_n(q, &last, 30);
	assert_int_equal(controller_queue_len(q), 30);
	queue_take_n(q, &next, 20);
	/* the ring full from slot 6 round to slot 5, then grown */
	queue_add_n(q, &last, 60);
	assert_int_equal(controller_queue_len(q), 70);
	queue_take_n(q, &next, 70);
	assert_int_equal(next, last);
	assert_null(controller_queue_get(q, 0));
	controller_queue_free(q);
}

/* The next key of q, within ms: want; done with it. */
static void
take_key(struct controller_queue *q, int64_t ms, const char *want)
{
	char *got = controller_queue_get(q, ms);

	assert_non_null(got);
	assert_string_equal(got, want);
	controller_queue_done(q, got);
	free(got);
}

/*
 * A delay of 0 is none; of two delays for one key the sooner wins,
 * whichever was asked first, and the key comes once, not again at the
 * later time; a key due soon wakes a get while a later one waits.
 */
static void
test_queue_delays(void **state)
{
	struct controller_queue *q = controller_queue_new();
	char *got;
	int64_t t0;

	(void)state;
	controller_queue_add_after(q, "ns/now", 0);
	assert_int_equal(controller_queue_len(q), 1);
	take_key(q, 0, "ns/now");

	controller_queue_add_after(q, "ns/d", 60000);
	controller_queue_add_after(q, "ns/d", 50);
	take_key(q, 3000, "ns/d");

	controller_queue_add_after(q, "ns/e", 50);
	controller_queue_add_after(q, "ns/e", 500);
	take_key(q, 3000, "ns/e");
	assert_null(controller_queue_get(q, 1500));

	/* (the get would end after 30 s; 15 s is a loaded machine's slack) */
	controller_queue_add_after(q, "ns/late", 60000);
	controller_queue_add_after(q, "ns/soon", 50);
	t0 = now_mono_ms();
	got = controller_queue_get(q, 30000);
	assert_non_null(got);
	assert_string_equal(got, "ns/soon");
	assert_true(now_mono_ms() - t0 < 15000);
	controller_queue_done(q, got);
	free(got);
	controller_queue_free(q);
}

/* A get of up to 30 s on another thread (test_queue_wakeups). */
struct queue_waiter {
	struct controller_queue *q;
	char *key;
	int64_t at;	/* when the get returned */
};

static void *
queue_waiter_main(void *arg)
{
	struct queue_waiter *w = arg;

	w->key = controller_queue_get(w->q, 30000);
	w->at = now_mono_ms();
	return NULL;
}

/*
 * Start a waiter on q, give it time to wait (if it did not yet, it finds
 * the key at once: the test then proves less, but does not fail), do
 * what (0: add ns/a, 1: add ns/a after 50 ms, 2: shut down); the key it
 * got, and in *took how long after that it returned.
 */
static char *
queue_wake(struct controller_queue *q, int what, int64_t *took)
{
	struct queue_waiter w = { q, NULL, 0 };
	pthread_t th;
	int64_t t0;

	assert_int_equal(pthread_create(&th, NULL, queue_waiter_main, &w), 0);
	sleep_ms(200);
	t0 = now_mono_ms();
	if (what == 0)
		controller_queue_add(q, "ns/a");
	else if (what == 1)
		controller_queue_add_after(q, "ns/a", 50);
	else
		controller_queue_shutdown(q);
	pthread_join(th, NULL);
	*took = w.at - t0;
	return w.key;
}

/*
 * A worker waiting for a key is woken by an add, by an add after a delay
 * shorter than its wait, and by a shutdown, not left to its timeout (30
 * s; 15 s is a loaded machine's slack). A queue shut down takes no key.
 */
static void
test_queue_wakeups(void **state)
{
	struct controller_queue *q = controller_queue_new();
	int64_t took;
	char *got;
	int what;

	(void)state;
	for (what = 0; what < 2; what++) {
		got = queue_wake(q, what, &took);
		assert_non_null(got);
		assert_string_equal(got, "ns/a");
		assert_true(took < 15000);
		controller_queue_done(q, got);
		free(got);
	}
	assert_null(queue_wake(q, 2, &took));
	assert_true(took < 15000);
	controller_queue_add(q, "ns/b");
	assert_int_equal(controller_queue_len(q), 0);
	controller_queue_free(q);
}

/*
 * Each failure in a row of a key at least doubles its back-off (the
 * eighth waits 320 ms or more); another key's is its own, and forget
 * starts the first again at 5 ms.
 */
static void
test_queue_rate_limited(void **state)
{
	struct controller_queue *q = controller_queue_new();
	int64_t t0, took;
	char *got;
	unsigned n;

	(void)state;
	for (n = 1; n <= 8; n++) {
		t0 = now_mono_ms();
		controller_queue_add_rate_limited(q, "ns/f");
		got = controller_queue_get(q, 60000);
		took = now_mono_ms() - t0;
		assert_non_null(got);
		assert_string_equal(got, "ns/f");
		if (took < controller_backoff_ms(n, 0))
			fail_msg("failure %u came back after %lld ms", n,
			    (long long)took);
		controller_queue_done(q, got);
		free(got);
	}
	assert_true(controller_backoff_ms(8, 0) >= 320);
	/* 5 ms for each, due long before the get's end */
	controller_queue_add_rate_limited(q, "ns/g");
	take_key(q, 250, "ns/g");
	controller_queue_forget(q, "ns/f");
	controller_queue_add_rate_limited(q, "ns/f");
	take_key(q, 250, "ns/f");
	controller_queue_free(q);
}

/* ----------------------------------------- the running controller */

static int
wait_phase(const char *name, const char *phase, int64_t ms)
{
	int64_t end = now_mono_ms() + ms;

	while (now_mono_ms() < end) {
		json_t *t = get(&K8S_AGENTTASK, name);
		int ok = t != NULL && jp(t, "status.phase") != NULL &&
		    strcmp(jp(t, "status.phase"), phase) == 0;

		json_decref(t);
		if (ok)
			return 1;
		sleep_ms(5);
	}
	return 0;
}

/* Whether the task's status.message becomes msg within ms. */
static int
wait_message(const char *name, const char *msg, int64_t ms)
{
	int64_t end = now_mono_ms() + ms;

	while (now_mono_ms() < end) {
		json_t *t = get_task(name);
		int ok = streq_safe(jp(t, "status.message"), msg);

		json_decref(t);
		if (ok)
			return 1;
		sleep_ms(20);
	}
	return 0;
}

static int
wait_sandbox(const char *name, const char *mode, int64_t ms)
{
	int64_t end = now_mono_ms() + ms;

	while (now_mono_ms() < end) {
		json_t *s = get(&K8S_SANDBOX, name);
		int ok = s != NULL && streq_safe(jp(s, "spec.operatingMode"),
		    mode);

		json_decref(s);
		if (ok)
			return 1;
		sleep_ms(5);
	}
	return 0;
}


/* A status write that loses a race with the meter starts again. */
static char *hook_token;
static int hook_fired;

static void
conflict_hook(void *arg, const char *point)
{
	(void)arg;
	if (strcmp(point, "status") != 0 || hook_fired || hook_token == NULL)
		return;
	hook_fired = 1;
	assert_int_equal(charge(hook_token, 7, "during"), 200);
}

static void
test_status_conflict(void **state)
{
	char *name = active();
	json_t *t;
	size_t i;
	json_t *v;
	int found = 0;

	(void)state;
	hook_token = token_of(name);
	hook_fired = 0;
	play(name, "False", "DependenciesNotReady", 0, NULL, 0, 0);
	cc.test_hook = conflict_hook;
	reconcile(name);
	cc.test_hook = NULL;
	assert_int_equal(hook_fired, 1);
	assert_phase(name, "Provisioning");
	t = get_task(name);
	assert_int_equal(json_integer_value(jget(t, "status.tokensConsumed")),
	    7);
	json_array_foreach((json_t *)jget(t, "status.lastMeterRequestIds"), i,
	    v)
		found |= strcmp(json_string_value(v), "during") == 0;
	assert_true(found);
	assert_string_equal(jp(cond(t, "SandboxReady"), "reason"),
	    "DependenciesNotReady");
	json_decref(t);
	free(hook_token);
	hook_token = NULL;
	free(name);
}

/* count Environments in namespace noise, named prefix0, prefix1... */
static void
make_noise(const char *prefix, int count)
{
	int i;

	for (i = 0; i < count; i++) {
		struct k8s_status st = { 0 };
		char n[32];
		json_t *o;

		snprintf(n, sizeof(n), "%s%d", prefix, i);
		o = json_pack("{s:s,s:s,s:{s:s},s:{}}", "apiVersion",
		    "divergedev.com/v1alpha1", "kind", "Environment",
		    "metadata", "name", n, "spec");
		assert_int_equal(k8s_create(env.api, &K8S_ENVIRONMENT,
		    "noise", o, NULL, &st), 0);
		json_decref(o);
	}
}

/* A watch that falls behind the store's window (410) relists. */
static atomic_int stall;

static void
stall_hook(void *arg, const char *point)
{
	(void)arg;
	if (strcmp(point, "watch") == 0)
		while (stall)
			sleep_ms(2);
}

/*
 * A controller on a fresh store that keeps 20 events, whose watches
 * stall_hook can hold back, with an hour's resync.
 */
static struct controller *
start_stallable(void)
{
	struct controller *c = NULL;
	char *cause = NULL;

	close_all();
	open_history(1, 20);
	cc.test_hook = stall_hook;
	cc.resync_ms = 3600 * 1000;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	return c;
}

static void
test_watch_relist(void **state)
{
	struct controller *c;
	char *name;

	(void)state;
	c = start_stallable();
	sleep_ms(300);
	stall = 1;
	sleep_ms(400);
	make_noise("noise-", 50);
	name = new_task(NULL, NULL);
	make_noise("noise-b", 50);
	stall = 0;
	assert_true(wait_phase(name, "Provisioning", 10000));
	assert_true(controller_relists(c) >= 1);
	controller_stop(c);
	cc.test_hook = NULL;
	cc.resync_ms = 0;
	close_all();
	open_all(1);
	free(name);
}

/* A controller a failed test left running is stopped before the next. */
static struct controller *running;

static int
stop_running(void **state)
{
	(void)state;
	controller_stop(running);
	running = NULL;
	cc.workers = 0;
	return 0;
}

/*
 * A stop during an API server outage does not wait for the watchers'
 * back-off, which doubles with each failed watch up to 5 minutes. The
 * fake kube-apiserver refuses every watch with a 403: the REST client
 * does not retry that, so each refusal is one request and one back-off of
 * the watcher (an outage ends there too, after the client's own retries,
 * only more slowly). After the tasks' watcher was refused 8 times it waits
 * 20 to 41 s; the stop must be done within 10 s.
 */
static void
test_stop_during_watch_backoff(void **state)
{
	struct controller *c = NULL;
	char *cause = NULL;
	int64_t t0, end, took;
	json_t *j;

	(void)state;
	if (reopen_store(3) < 0)
		skip();
	j = storeenv_fake(&env, "POST", "/_fake/faults", "{\"status\":403,"
	    "\"count\":100000,\"method\":\"GET\",\"match\":"
	    "\"watch=true\"}");
	assert_non_null(j);
	json_decref(j);
	cc.workers = 1;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	end = now_mono_ms() + 120000;
	while (storeenv_fake_count(&env, "GET", "/agenttasks") < 8 &&
	    now_mono_ms() < end)
		sleep_ms(100);
	assert_int_equal(storeenv_fake_count(&env, "GET", "/agenttasks"), 8);
	t0 = now_mono_ms();
	stop_running(NULL);
	took = now_mono_ms() - t0;
	fprintf(stderr, "# stopped in %lld ms during the back-off\n",
	    (long long)took);
	assert_true(took < 10000);
	close_all();
	open_all(1);
}

/*
 * The resourceVersion of the second watch of the tasks the fake has seen
 * (its query's, "" when it had none), or NULL when there is none yet.
 */
static char *
rewatch_rv(void)
{
	json_t *reqs = storeenv_fake(&env, "GET", "/_fake/requests", NULL);
	json_t *r;
	const char *p, *q, *v;
	char *out = NULL;
	size_t i;
	int n = 0;

	json_array_foreach(reqs, i, r) {
		p = json_string_value(json_object_get(r, "path"));
		q = json_string_value(json_object_get(r, "query"));
		if (p == NULL || q == NULL || strlen(p) < 11 ||
		    strcmp(p + strlen(p) - 11, "/agenttasks") != 0 ||
		    strstr(q, "watch=") == NULL || ++n < 2)
			continue;
		v = strstr(q, "resourceVersion=");
		out = v == NULL ? xstrdup("") : xstrndup(v + 16,
		    strcspn(v + 16, "&"));
		break;
	}
	json_decref(reqs);
	return out;
}

/*
 * A watch that ends in error (not 410 Gone) is opened again from the
 * newest resourceVersion the controller was given, not the last: a watch
 * from scratch sends its ADDED events in the order of the names, so the
 * last can be old (on a real cluster long compacted: a 410, and a relist
 * of everything). Through the fake kube-apiserver, whose request log
 * shows the watches; every write is refused meanwhile, so that no pass
 * moves the version on.
 */
static void
test_watch_resume_newest(void **state)
{
	static const char *const writes[] = { "POST", "PUT", "PATCH",
	    "DELETE" };
	struct controller *c = NULL;
	char *cause = NULL, *older, *newer, *want, *got = NULL, *rule;
	int64_t end;
	json_t *j;
	size_t i;

	(void)state;
	if (reopen_store(3) < 0)
		skip();
	/* made second, the first by name */
	older = new_task_named(xstrdup("zz-older"), NULL, NULL);
	newer = new_task_named(xstrdup("aa-newer"), NULL, NULL);
	j = get_task(newer);
	want = xstrdup(k8s_meta_str(j, "resourceVersion"));
	json_decref(j);
	for (i = 0; i < ARRAY_SIZE(writes); i++) {
		rule = xasprintf("{\"status\":503,\"count\":100000,"
		    "\"method\":\"%s\"}", writes[i]);
		j = storeenv_fake(&env, "POST", "/_fake/faults", rule);
		assert_non_null(j);
		json_decref(j);
		free(rule);
	}
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/requests", NULL));
	cc.workers = 1;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	/* the stream ends with an ERROR 500 once it is open */
	end = now_mono_ms() + 60000;
	while ((got = rewatch_rv()) == NULL && now_mono_ms() < end) {
		json_decref(storeenv_fake(&env, "POST", "/_fake/end_watches",
		    "{\"mode\":\"error\"}"));
		sleep_ms(200);
	}
	stop_running(NULL);
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/faults", NULL));
	fprintf(stderr, "# watched again from %s; the newest task: %s\n",
	    got != NULL ? got : "(none)", want);
	assert_non_null(got);
	assert_string_equal(got, want);
	free(got);
	free(want);
	free(older);
	free(newer);
	close_all();
	open_all(1);
}

/* ---------------------------------------------- controller.max_active_tasks */

/*
 * A fresh store of mode with at most limit tasks running; 0, or -1 when
 * the fake kube-apiserver (mode 3) does not start.
 */
static int
open_limited(int mode, int limit)
{
	cfg.controller.max_active_tasks = limit;
	return reopen_store(mode);
}

/*
 * The store's ops with a list of AgentTasks that fails while
 * fail_task_lists is above 0 (each failure counts it down), and once
 * they no longer fail, is slow: it waits while hold_task_lists is set;
 * the reads of the task named counted_task are counted in counted_gets.
 * The other calls go to the store the copy was made from.
 */
static struct k8s_ops failing_list_ops;
static const struct k8s_ops *real_ops;
static atomic_int fail_task_lists, task_lists, hold_task_lists;
static atomic_int counted_gets;
static const char *counted_task;

static int
unlimit(void **state)
{
	hold_task_lists = 0;	/* a watcher may wait in a slow list */
	stop_running(state);
	cc.test_hook = NULL;
	cc.resync_ms = 0;
	cfg.controller.max_active_tasks = 0;
	close_all();
	open_all(1);
	return 0;
}

/* The task is phase, reason Queued, with message. */
static void
assert_queued(const char *name, const char *phase, const char *message)
{
	json_t *t = get_task(name);
	int64_t ahead;

	assert_phase(name, phase);
	assert_string_equal(jp(t, "status.reason"), "Queued");
	assert_string_equal(jp(t, "status.message"), message);
	assert_true(k8s_task_queued(t, &ahead));
	assert_int_equal(ahead, strtoll(strrchr(message, ';') + 2, NULL, 10));
	assert_string_equal(jp(cond(t, "Ready"), "reason"), "Queued");
	assert_string_equal(jp(cond(t, "TokenIssued"), "status"), "False");
	json_decref(t);
}

/* Nothing provisioned: no token Secret, no Sandbox, no Environment. */
static void
assert_no_children(const char *name)
{
	char *sname = xasprintf("%s-token", name);
	char *ename = xasprintf("agent-preview-%s", name);
	json_t *o;

	assert_null((o = get(&K8S_SECRET, sname)));
	assert_null((o = get(&K8S_SANDBOX, name)));
	assert_null((o = get(&K8S_ENVIRONMENT, ename)));
	free(sname);
	free(ename);
}

static void
delete_task(const char *name)
{
	struct k8s_status st = { 0 };

	assert_int_equal(k8s_delete(env.api, &K8S_AGENTTASK, NS, name, NULL,
	    &st), 0);
	k8s_status_release(&st);
}

/* What the meter does when the runner reports the end. */
static void
complete_task(const char *name)
{
	patch_status(name, "{\"status\":{\"phase\":\"Completed\","
	    "\"reason\":\"Succeeded\"}}");
	reconcile(name);
	assert_phase(name, "Completed");
}

/*
 * A task that ends while its <task>-token Secret is someone else's (the
 * task's own deleted, another made in its place) still shuts its
 * Sandbox down: the Sandbox gets its shutdownTime, the Secret is left,
 * and the task's message stays how it ended.
 */
static void
test_foreign_token_secret_end(void **state)
{
	struct k8s_status st = { 0 };
	char *name = active(), *sname = xasprintf("%s-token", name);
	json_t *t, *sb, *sec;

	(void)state;
	assert_int_equal(k8s_delete(env.api, &K8S_SECRET, NS, sname, NULL,
	    &st), 0);
	k8s_status_release(&st);
	foreign_token_secret(name);
	patch_status(name, "{\"status\":{\"phase\":\"Completed\","
	    "\"reason\":\"Succeeded\",\"message\":\"all done\"}}");
	reconcile(name);
	t = get_task(name);
	sb = get(&K8S_SANDBOX, name);
	sec = get(&K8S_SECRET, sname);
	assert_string_equal(jp(t, "status.phase"), "Completed");
	assert_non_null(jp(sb, "spec.shutdownTime"));
	assert_string_equal(jp(sec, "data.token"), "c2VjcmV0");
	/* the conflict does not hide how the task ended */
	assert_string_equal(jp(t, "status.message"), "all done");
	json_decref(sec);
	json_decref(sb);
	json_decref(t);
	free(sname);
	free(name);
}

/*
 * Four tasks and two slots: the first two (FIFO: creationTimestamp, then
 * name) are provisioned, the others wait, Pending with reason Queued and
 * their place, and a later one never overtakes an earlier one. A task
 * that completes, is paused (once its Sandbox stopped: Pausing still
 * holds its slot) or is deleted frees its slot; a paused task that
 * resumes waits for one too, Paused.
 */
static void
queue_admission(int mode)
{
	char *q[5];
	int i;

	if (open_limited(mode, 2) < 0)
		return;
	for (i = 1; i <= 4; i++) {
		q[i] = new_task_named(xasprintf("q%d", i), NULL, NULL);
		reconcile(q[i]);
		assert_phase(q[i], "Pending");
	}
	/* the last first: all three ahead of it want a slot */
	reconcile(q[4]);
	assert_queued(q[4], "Pending", "waiting for a free slot: 0 of 2 "
	    "tasks are running; 3 queued ahead");
	reconcile(q[3]);
	assert_queued(q[3], "Pending", "waiting for a free slot: 0 of 2 "
	    "tasks are running; 2 queued ahead");
	reconcile(q[1]);
	assert_phase(q[1], "Provisioning");
	reconcile(q[2]);
	assert_phase(q[2], "Provisioning");
	reconcile(q[4]);
	assert_queued(q[4], "Pending", "waiting for a free slot: 2 of 2 "
	    "tasks are running; 1 queued ahead");
	reconcile(q[3]);
	assert_queued(q[3], "Pending", "waiting for a free slot: 2 of 2 "
	    "tasks are running; 0 queued ahead");
	reconcile(q[3]);
	assert_no_children(q[3]);
	assert_no_children(q[4]);

	/* q1 completes: q3 takes its slot, q4 cannot overtake it */
	play(q[1], "True", "DependenciesReady", 0, "10.0.0.7", 0, 0);
	reconcile(q[1]);
	assert_phase(q[1], "Active");
	complete_task(q[1]);
	reconcile(q[4]);
	assert_queued(q[4], "Pending", "waiting for a free slot: 1 of 2 "
	    "tasks are running; 1 queued ahead");
	reconcile(q[3]);
	assert_phase(q[3], "Provisioning");
	reconcile(q[4]);
	assert_queued(q[4], "Pending", "waiting for a free slot: 2 of 2 "
	    "tasks are running; 0 queued ahead");

	/* q2 pauses: Pausing holds its slot, Paused frees it */
	set_suspended(q[2], 1);
	reconcile(q[2]);
	assert_phase(q[2], "Pausing");
	reconcile(q[4]);
	assert_phase(q[4], "Pending");
	play(q[2], "False", "SandboxSuspended", 0, NULL, 1, 0);
	reconcile(q[2]);
	assert_phase(q[2], "Paused");
	/* what the task watch would show the slot cache: a pass reads it */
	reconcile(q[2]);
	reconcile(q[4]);
	assert_phase(q[4], "Provisioning");

	/* q2 resumes: it waits for a slot, Paused, its Sandbox Suspended */
	set_suspended(q[2], 0);
	reconcile(q[2]);
	assert_queued(q[2], "Paused", "waiting for a free slot to resume: 2 "
	    "of 2 tasks are running; 0 queued ahead");
	assert_sandbox(q[2], "Suspended", NULL);
	/* paused again while it waits: no longer queued */
	set_suspended(q[2], 1);
	reconcile(q[2]);
	{
		json_t *t = get_task(q[2]);

		assert_string_equal(jp(t, "status.phase"), "Paused");
		assert_string_equal(jp(t, "status.reason"), "Suspended");
		assert_string_equal(jp(t, "status.message"),
		    "the task is paused");
		assert_false(k8s_task_queued(t, NULL));
		json_decref(t);
	}
	set_suspended(q[2], 0);
	reconcile(q[2]);
	assert_queued(q[2], "Paused", "waiting for a free slot to resume: 2 "
	    "of 2 tasks are running; 0 queued ahead");

	/* q3 is deleted: q2 resumes with a fresh token */
	delete_task(q[3]);
	reconcile(q[3]);	/* not found: as the watch's DELETED */
	reconcile(q[2]);
	assert_phase(q[2], "Provisioning");
	assert_sandbox(q[2], "Running", NULL);

	/* no limit: nothing waits */
	cfg.controller.max_active_tasks = 0;
	q[0] = provision(new_task_named(xasprintf("q5"), NULL, NULL));
	for (i = 0; i <= 4; i++)
		free(q[i]);
}

/*
 * With a limit, a pass whose read of the task is older than what the
 * slot cache knows (a watch event ahead of it) decides nothing on it:
 * it reads again, and while the cache stays ahead the task is not
 * admitted (a conflict).
 */
static void
test_queue_stale_read(void **state)
{
	char *name, *cause = NULL;
	json_t *t;

	(void)state;
	assert_int_equal(open_limited(1, 2), 0);
	name = new_task(NULL, NULL);
	reconcile(name);
	t = get_task(name);
	json_object_set_new(json_object_get(t, "metadata"), "resourceVersion",
	    json_string("999999999"));
	assert_int_equal(controller_slots_observe(controller_slots_of(
	    env.api), t, 0), 1);
	json_decref(t);
	assert_int_equal(controller_reconcile(&cc, NS, name, NULL, NULL,
	    &cause), K8S_ECONFLICT);
	free(cause);
	assert_phase(name, "Pending");
	assert_no_children(name);
	free(name);
}

/*
 * The queue is in order of age: a task created a second earlier waits
 * ahead of a later one, whatever their names.
 */
static void
test_queue_age(void **state)
{
	char *hold, *old, *young;

	(void)state;
	if (open_limited(1, 1) < 0)
		return;
	hold = provision(new_task_named(xasprintf("qa-hold"), NULL, NULL));
	old = new_task_named(xasprintf("qa-z-old"), NULL, NULL);
	sleep_ms(1100);		/* creationTimestamp counts seconds */
	young = new_task_named(xasprintf("qa-a-young"), NULL, NULL);
	reconcile(old);
	reconcile(old);
	assert_queued(old, "Pending", "waiting for a free slot: 1 of 1 "
	    "tasks are running; 0 queued ahead");
	reconcile(young);
	reconcile(young);
	assert_queued(young, "Pending", "waiting for a free slot: 1 of 1 "
	    "tasks are running; 1 queued ahead");
	free(hold);
	free(old);
	free(young);
}

/* On the embedded store, then through the REST client on the fake. */
static void
test_queue_admission(void **state)
{
	(void)state;
	queue_admission(1);
	queue_admission(3);
}

/*
 * A queued task does not time out: its live time starts when it is
 * admitted. A re-run that waits leaves the finished run's Sandbox as it
 * is (its shutdownTime stays) until it is admitted.
 */
static void
test_queue_timeout_rerun(void **state)
{
	char *a, *b, *c, *sb_rv;
	json_t *sb, *t;

	(void)state;
	if (open_limited(1, 1) < 0)
		skip();
	a = active();
	complete_task(a);
	sb = get(&K8S_SANDBOX, a);
	assert_non_null(jp(sb, "spec.shutdownTime"));
	sb_rv = xstrdup(jp(sb, "metadata.resourceVersion"));
	json_decref(sb);
	b = provisioned(NULL, NULL);
	c = new_task(NULL, NULL);
	patch_task(c, 0, "{\"spec\":{\"sandbox\":{\"timeoutSeconds\":1}}}");
	reconcile(c);
	reconcile(c);
	assert_phase(c, "Pending");
	/* a's re-run (what /diverge fix does to a finished task) */
	patch_status(a, "{\"status\":{\"phase\":\"Pending\",\"run\":2,"
	    "\"reason\":null,\"message\":null,\"completedAt\":null,"
	    "\"activeSeconds\":0}}");
	reconcile(a);
	assert_queued(a, "Pending", "waiting for a free slot: 1 of 1 tasks "
	    "are running; 0 queued ahead");
	sb = get(&K8S_SANDBOX, a);
	assert_string_equal(jp(sb, "metadata.resourceVersion"), sb_rv);
	json_decref(sb);
	sleep_ms(2200);
	reconcile(c);
	assert_queued(c, "Pending", "waiting for a free slot: 1 of 1 tasks "
	    "are running; 1 queued ahead");
	complete_task(b);
	reconcile(c);
	assert_phase(c, "Pending");
	/* a was created first: it runs again, with a new token */
	reconcile(a);
	assert_phase(a, "Provisioning");
	assert_string_equal(jp((t = get_task(a)), "status.reason"),
	    "Provisioning");
	json_decref(t);
	complete_task(a);
	reconcile(c);
	assert_phase(c, "Provisioning");
	t = get_task(c);
	assert_int_equal(json_integer_value(jget(t, "status.activeSeconds")),
	    0);
	json_decref(t);
	free(sb_rv);
	free(a);
	free(b);
	free(c);
}

/*
 * Many workers at once never admit more than the limit, and admit the
 * first tasks of the queue: each pass waits in its status write (the
 * test hook) after its decision, a wide window for decisions to meet.
 */
struct racer {
	const char *name;
	pthread_barrier_t *go;
	int rc;
};

static void
slow_status_hook(void *arg, const char *point)
{
	(void)arg;
	if (strcmp(point, "status") == 0)
		sleep_ms(30);
}

static void *
racer_main(void *arg)
{
	struct racer *r = arg;
	char *cause = NULL;

	pthread_barrier_wait(r->go);
	r->rc = controller_reconcile(&cc, NS, r->name, NULL, NULL, &cause);
	free(cause);
	return NULL;
}

/* Reconcile the tasks n[0..k) at once, from k threads. */
static void
race(char **n, int k)
{
	pthread_barrier_t go;
	pthread_t th[8];
	struct racer r[8];
	int i;

	pthread_barrier_init(&go, NULL, (unsigned)k);
	for (i = 0; i < k; i++) {
		r[i].name = n[i];
		r[i].go = &go;
		r[i].rc = -1;
		assert_int_equal(pthread_create(&th[i], NULL, racer_main,
		    &r[i]), 0);
	}
	for (i = 0; i < k; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(r[i].rc, 0);
	}
	pthread_barrier_destroy(&go);
}

static int
count_phase(char **n, int k, const char *phase)
{
	int i, c = 0;

	for (i = 0; i < k; i++) {
		json_t *t = get_task(n[i]);

		c += streq_safe(jp(t, "status.phase"), phase);
		json_decref(t);
	}
	return c;
}

static void
queue_race(int mode)
{
	char *n[8];
	int i;

	if (open_limited(mode, 2) < 0)
		skip();
	for (i = 0; i < 8; i++) {
		n[i] = new_task_named(xasprintf("r%d", i), NULL, NULL);
		reconcile(n[i]);
	}
	cc.test_hook = slow_status_hook;
	race(n, 8);
	assert_int_equal(count_phase(n, 8, "Provisioning"), 2);
	assert_int_equal(count_phase(n, 8, "Pending"), 6);
	/* FIFO: the first two */
	assert_phase(n[0], "Provisioning");
	assert_phase(n[1], "Provisioning");
	cc.test_hook = NULL;
	complete_task(n[0]);
	complete_task(n[1]);
	cc.test_hook = slow_status_hook;
	race(n + 2, 6);
	cc.test_hook = NULL;
	assert_int_equal(count_phase(n, 8, "Provisioning"), 2);
	assert_phase(n[2], "Provisioning");
	assert_phase(n[3], "Provisioning");
	/* its message says what it saw when it was decided: look again */
	reconcile(n[7]);
	assert_queued(n[7], "Pending", "waiting for a free slot: 2 of 2 tasks "
	    "are running; 3 queued ahead");
	for (i = 0; i < 8; i++)
		free(n[i]);
}

/* On the embedded store, then through the REST client. */
static void
test_queue_race(void **state)
{
	(void)state;
	queue_race(1);
	queue_race(2);
}

/*
 * One slot; task *a (named na) Paused, then a later task *b (nb) Pending
 * and not yet decided.
 */
static void
paused_and_pending(const char *na, char **a, const char *nb, char **b)
{
	if (open_limited(1, 1) < 0)
		skip();
	*a = new_task_named(xstrdup(na), NULL, NULL);
	set_suspended(*a, 1);
	reconcile(*a);
	reconcile(*a);
	assert_phase(*a, "Paused");
	*b = new_task_named(xstrdup(nb), NULL, NULL);
	reconcile(*b);
}

/*
 * A task admitted counts as running before its status says so: while a
 * later task's Provisioning is being written, an earlier one resumes and
 * is decided (FIFO puts it first, the store still says Pending for the
 * other); it waits.
 */
static char *resume_in_hook;

static void
resume_hook(void *arg, const char *point)
{
	char *name = resume_in_hook;

	(void)arg;
	if (strcmp(point, "status") != 0 || name == NULL)
		return;
	resume_in_hook = NULL;
	set_suspended(name, 0);
	reconcile(name);
}

static void
test_queue_admitted_counts(void **state)
{
	char *a, *b;

	(void)state;
	paused_and_pending("s1", &a, "s2", &b);
	resume_in_hook = a;
	cc.test_hook = resume_hook;
	reconcile(b);
	cc.test_hook = NULL;
	assert_null(resume_in_hook);
	assert_phase(b, "Provisioning");
	assert_queued(a, "Paused", "waiting for a free slot to resume: 1 of 1 "
	    "tasks are running; 0 queued ahead");
	free(a);
	free(b);
}

/*
 * A task admitted whose pass fails after it made its token (its status
 * write keeps losing to another writer, or the API server fails) keeps
 * its slot: its token is live and its next pass starts its Sandbox, so
 * until it is Provisioning it still counts as running, and an earlier
 * task that resumes meanwhile (or a re-run, FIFO puts both first)
 * waits. Given the slot back, the resumed task was admitted too: two
 * Sandboxes running with a limit of 1, and the first task then queued
 * beside its own.
 */
static const char *conflict_task;

static void
status_conflict_hook(void *arg, const char *point)
{
	static int n;
	char *p;

	(void)arg;
	if (strcmp(point, "status") != 0 || conflict_task == NULL)
		return;
	/* another writer: the pass's resourceVersion is stale */
	p = xasprintf("{\"metadata\":{\"annotations\":{\"test/bump\":"
	    "\"%d\"}}}", ++n);
	patch_task(conflict_task, 0, p);
	free(p);
}

static void
test_queue_failed_write_keeps_slot(void **state)
{
	char *a, *b, *cause = NULL;
	json_t *t;

	(void)state;
	paused_and_pending("f1", &a, "f2", &b);
	/* b is admitted, makes its children, its status write fails */
	conflict_task = b;
	cc.test_hook = status_conflict_hook;
	assert_true(controller_reconcile(&cc, NS, b, NULL, NULL, &cause) < 0);
	free(cause);
	cc.test_hook = NULL;
	conflict_task = NULL;
	assert_phase(b, "Pending");
	/* no Sandbox runs before the status says Provisioning */
	t = get(&K8S_SANDBOX, b);
	assert_null(t);
	/* a resumes: b's slot stands, so a waits */
	set_suspended(a, 0);
	reconcile(a);
	assert_queued(a, "Paused", "waiting for a free slot to resume: 1 of 1 "
	    "tasks are running; 0 queued ahead");
	/* b's next pass takes its slot up again */
	reconcile(b);
	assert_phase(b, "Provisioning");
	assert_sandbox(b, "Running", NULL);
	t = get_task(b);
	assert_index(jp(t, "status.tokenId"), "active");
	json_decref(t);
	reconcile(a);
	assert_phase(a, "Paused");
	/* b deleted: its slot is a's */
	delete_task(b);
	reconcile(b);	/* not found: as the watch's DELETED */
	reconcile(a);
	assert_phase(a, "Provisioning");
	free(a);
	free(b);
}

/* ------------------------------------------------------- stalled tasks */

/*
 * The fake kube-apiserver answers the next count requests of method whose
 * path contains match with status, and a Status whose message is message
 * (NULL: the fake's for status).
 */
static void
refuse_calls(const char *method, const char *match, int status, int count,
    const char *message)
{
	json_t *rule = json_pack("{s:i,s:i,s:s,s:s}", "status", status,
	    "count", count, "method", method, "match", match), *j;
	char *text;

	if (message != NULL)
		json_object_set_new(rule, "message", json_string(message));
	text = json_dumps(rule, JSON_COMPACT);
	j = storeenv_fake(&env, "POST", "/_fake/faults", text);
	assert_non_null(j);
	json_decref(j);
	json_decref(rule);
	free(text);
}

/*
 * Someone else's <task>-token Secret made after the pass looked (here: a
 * read that missed it) is found when the new token is written: a
 * conflict, and the token minted for it revoked, since no Secret of the
 * task holds it.
 */
static void
test_foreign_token_secret_late(void **state)
{
	char *name, *path;
	json_t *t;

	(void)state;
	if (reopen_store(3) < 0)
		return;
	name = new_task(NULL, NULL);
	reconcile(name);
	foreign_token_secret(name);
	path = xasprintf("/secrets/%s-token", name);
	refuse_calls("GET", path, 404, 1, NULL);
	free(path);
	reconcile(name);
	assert_phase(name, "Provisioning");
	t = get_task(name);
	assert_string_equal(jp(cond(t, "TokenIssued"), "reason"),
	    "ChildConflict");
	assert_null(jp(t, "status.tokenId"));
	json_decref(t);
	assert_int_equal(index_active_tokens(name), 0);
	assert_null(get(&K8S_SANDBOX, name));
	free(name);
	close_all();
	open_all(1);
}

/* The next count Sandbox requests of method are answered status. */
static void
refuse_sandbox_calls(const char *method, int status, int count)
{
	refuse_calls(method, "/sandboxes", status, count, NULL);
}

/* ... of the next count Sandbox creates. */
static void
refuse_sandboxes(int status, int count)
{
	refuse_sandbox_calls("POST", status, count);
}

/* One pass of name that fails; its requeue hint. */
static int64_t
reconcile_fails(const char *name, const char *want_cause)
{
	int64_t requeue = 0;
	char *cause = NULL;

	assert_true(controller_reconcile(&cc, NS, name, &requeue, NULL,
	    &cause) < 0);
	assert_non_null(cause);
	assert_non_null(strstr(cause, want_cause));
	free(cause);
	return requeue;
}

/* Move the Stalled condition of name back by secs. */
static void
backdate_stalled(const char *name, int64_t secs)
{
	json_t *t = get_task(name), *conds, *c, *patch;
	char ts[32], *text;
	size_t i;

	conds = json_deep_copy(json_object_get(json_object_get(t, "status"),
	    "conditions"));
	json_array_foreach(conds, i, c) {
		if (!streq_safe(jp(c, "type"), "Stalled"))
			continue;
		time_rfc3339(now_unix() - secs, ts);
		json_object_set_new(c, "lastTransitionTime", json_string(ts));
	}
	patch = json_pack("{s:{s:o}}", "status", "conditions", conds);
	text = json_dumps(patch, JSON_COMPACT);
	patch_status(name, text);
	free(text);
	json_decref(patch);
	json_decref(t);
}

/*
 * A pass the API server refuses for good (here a 403 on every Sandbox
 * create: RBAC, a quota, an admission webhook) no longer leaves the task
 * Provisioning (its status is live before its Sandbox is made) for ever
 * in the only slot: the task says so at once (condition
 * Stalled, the cause; status.message does not carry it to the pull
 * request), asks for another look when the grace ends, and fails once it
 * has been stalled for longer than CONTROLLER_ERROR_GRACE_S; its token is
 * revoked and its slot goes to the next task. A pass that succeeds
 * removes the condition. Through the REST client on the fake
 * kube-apiserver, whose faults are real API errors.
 */
static void
test_stalled_task_fails(void **state)
{
	char *a, *b, *c, *msg, *rv;
	json_t *t;
	int64_t requeue;

	(void)state;
	if (open_limited(3, 1) < 0)
		skip();
	refuse_sandboxes(403, 100000);
	a = new_task_named(xstrdup("stall-a"), NULL, NULL);
	reconcile(a);
	assert_phase(a, "Pending");
	requeue = reconcile_fails(a, "injected fault");
	assert_true(requeue > (CONTROLLER_ERROR_GRACE_S - 5) * 1000);
	assert_true(requeue <= (CONTROLLER_ERROR_GRACE_S + 1) * 1000);
	t = get_task(a);
	assert_string_equal(jp(t, "status.phase"), "Provisioning");
	assert_string_equal(jp(cond(t, "Stalled"), "status"), "True");
	assert_string_equal(jp(cond(t, "Stalled"), "reason"),
	    CONTROLLER_REASON_STALLED);
	assert_non_null(strstr(jp(cond(t, "Stalled"), "message"),
	    "forbidden: injected fault"));
	assert_null(strstr(jp(t, "status.message"), "forbidden"));
	rv = xstrdup(jp(t, "metadata.resourceVersion"));
	json_decref(t);

	/* a stalled task holds its slot meanwhile */
	b = new_task_named(xstrdup("stall-b"), NULL, NULL);
	reconcile(b);
	reconcile(b);
	assert_queued(b, "Pending", "waiting for a free slot: 1 of 1 tasks "
	    "are running; 0 queued ahead");

	/* the same refusal again writes nothing */
	reconcile_fails(a, "injected fault");
	t = get_task(a);
	assert_string_equal(jp(t, "metadata.resourceVersion"), rv);
	json_decref(t);
	free(rv);

	/* past the grace it fails, then its next pass ends it */
	backdate_stalled(a, CONTROLLER_ERROR_GRACE_S + 10);
	assert_true(reconcile_fails(a, "injected fault") == -1);
	t = get_task(a);
	assert_string_equal(jp(t, "status.phase"), "Failed");
	assert_string_equal(jp(t, "status.reason"),
	    CONTROLLER_REASON_STALLED);
	assert_non_null(jp(t, "status.completedAt"));
	msg = xasprintf("the controller could not reconcile the task for %d "
	    "s (its Stalled condition says why)", CONTROLLER_ERROR_GRACE_S +
	    10);
	if (!streq_safe(jp(t, "status.message"), msg))	/* a second passed */
		assert_non_null(strstr(jp(t, "status.message"), "(its "
		    "Stalled condition says why)"));
	free(msg);
	json_decref(t);
	reconcile(a);
	t = get_task(a);
	assert_string_equal(jp(t, "status.phase"), "Failed");
	assert_null(cond(t, "Stalled"));
	assert_string_equal(jp(cond(t, "TokenIssued"), "status"), "False");
	json_decref(t);
	/* the token its first pass made */
	t = get(&K8S_SECRET, "stall-a-token");
	assert_non_null(t);
	assert_index(jp(t, "metadata.annotations.divergedev.com/token-id"),
	    "revoked");
	json_decref(t);

	/* its slot is b's, once the API server takes Sandboxes again */
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/faults", NULL));
	reconcile(b);
	assert_phase(b, "Provisioning");
	assert_sandbox(b, "Running", NULL);

	/* one refusal, then a pass that succeeds: the condition goes */
	cfg.controller.max_active_tasks = 0;
	refuse_sandboxes(422, 1);
	c = new_task_named(xstrdup("stall-c"), NULL, NULL);
	reconcile(c);
	reconcile_fails(c, "injected fault");
	t = get_task(c);
	assert_string_equal(jp(cond(t, "Stalled"), "status"), "True");
	json_decref(t);
	reconcile(c);
	t = get_task(c);
	assert_string_equal(jp(t, "status.phase"), "Provisioning");
	assert_null(cond(t, "Stalled"));
	json_decref(t);
	free(a);
	free(b);
	free(c);
}

/*
 * A suspended task stalls (here its Sandbox cannot be stopped: every
 * update and patch of it is refused) and does not fail when the grace
 * ends, as a pause could not stop it either: its failed passes keep the
 * error backoff, with no requeue hint. The hint that the grace ends
 * would be in the past by then, and every pass would be queued again at
 * once, against the API server, for as long as the task stays so.
 */
static void
test_stalled_suspended(void **state)
{
	char *a;
	json_t *t;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	a = active();
	refuse_sandbox_calls("PUT", 403, 100000);
	refuse_sandbox_calls("PATCH", 403, 100000);
	set_suspended(a, 1);
	assert_true(reconcile_fails(a, "injected fault") > 0);
	t = get_task(a);
	assert_string_equal(jp(cond(t, "Stalled"), "status"), "True");
	json_decref(t);

	backdate_stalled(a, CONTROLLER_ERROR_GRACE_S + 10);
	assert_true(reconcile_fails(a, "injected fault") == -1);
	assert_true(reconcile_fails(a, "injected fault") == -1);
	t = get_task(a);
	assert_string_not_equal(jp(t, "status.phase"), "Failed");
	assert_string_equal(jp(cond(t, "Stalled"), "status"), "True");
	json_decref(t);

	/* once the API server takes the stop, the pass succeeds */
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/faults", NULL));
	reconcile(a);
	t = get_task(a);
	assert_null(cond(t, "Stalled"));
	json_decref(t);
	free(a);
}

/* The API server answers every request again. */
static void
grant_all(void)
{
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/faults", NULL));
}

/* The Stalled condition of name is True and its message quotes each of want. */
static void
assert_stalled(const char *name, const char *const *want)
{
	json_t *t = get_task(name);
	const char *msg;

	assert_non_null(cond(t, "Stalled"));
	assert_string_equal(jp(cond(t, "Stalled"), "status"), "True");
	assert_string_equal(jp(cond(t, "Stalled"), "reason"),
	    CONTROLLER_REASON_STALLED);
	msg = jp(cond(t, "Stalled"), "message");
	for (; *want != NULL; want++)
		if (strstr(msg, *want) == NULL)
			fail_msg("Stalled says '%s', not '%s'", msg, *want);
	json_decref(t);
}

/* The task has no Stalled condition. */
static void
assert_not_stalled(const char *name)
{
	json_t *t = get_task(name);

	assert_null(cond(t, "Stalled"));
	json_decref(t);
}

/*
 * The token index Secret is written as any child is, and a refusal of it
 * stalls the task as theirs do, where it was retried with the back-off
 * for ever, unseen: a quota on Secrets refuses the index's create (the
 * first token of the namespace), RBAC its update (a revocation on pause).
 * The condition names the Secret and quotes the API's refusal; once the
 * quota is raised or the RBAC granted, the next pass clears it and goes
 * on. Through the fake kube-apiserver, whose refusals are real Status
 * objects (403 Forbidden).
 */
static void
test_stalled_token_index(void **state)
{
	static const char *const quota[] = { "token index secret '" NS "/"
	    METER_INDEX_SECRET "'", "exceeded quota: secrets", NULL };
	static const char *const rbac[] = { "token index secret '" NS "/"
	    METER_INDEX_SECRET "'", "forbidden: injected fault", NULL };
	char *a, *id;
	json_t *t;
	int64_t requeue;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	a = new_task_named(xstrdup("stall-index"), NULL, NULL);
	reconcile(a);		/* Pending: its next pass mints its token */
	refuse_calls("POST", "/namespaces/" NS "/secrets", 403, 100000,
	    "secrets \"" METER_INDEX_SECRET "\" is forbidden: exceeded quota: "
	    "secrets, requested: count/secrets=1, used: count/secrets=10, "
	    "limited: count/secrets=10");
	requeue = reconcile_fails(a, "exceeded quota");
	/* the grace, as for any refusal */
	assert_true(requeue > (CONTROLLER_ERROR_GRACE_S - 5) * 1000);
	assert_stalled(a, quota);
	assert_phase(a, "Pending");
	assert_null((t = get(&K8S_SECRET, "stall-index-token")));

	/* the quota raised: the next pass clears the condition, goes on */
	grant_all();
	reconcile(a);
	assert_phase(a, "Provisioning");
	t = get_task(a);
	assert_null(cond(t, "Stalled"));
	assert_string_equal(jp(cond(t, "TokenIssued"), "status"), "True");
	json_decref(t);
	id = task_token_id(a);
	assert_index(id, "active");

	/* a transient error is retried with the back-off: no condition */
	set_suspended(a, 1);
	refuse_calls("PUT", "/secrets/" METER_INDEX_SECRET, 500, 1, NULL);
	assert_int_equal(reconcile_fails(a, "Internal error occurred"), -1);
	assert_not_stalled(a);

	/* no update of the index: a pause cannot revoke the token */
	refuse_calls("PUT", "/secrets/" METER_INDEX_SECRET, 403, 100000, NULL);
	reconcile_fails(a, "forbidden: injected fault");
	assert_stalled(a, rbac);
	assert_phase(a, "Provisioning");
	assert_index(id, "active");

	/* granted: revoked, and pausing */
	grant_all();
	reconcile(a);
	assert_phase(a, "Pausing");
	assert_not_stalled(a);
	assert_index(id, "revoked");
	free(id);
	free(a);
}

/*
 * The task's own children were already refused for good as the Sandbox
 * is, and stay so: RBAC refusing the <task>-token Secret's create, then
 * an admission webhook the NetworkPolicy's, each give Stalled naming the
 * kind and quoting the API server (as it words them), and the next pass
 * once granted clears it and provisions the task. A token minted for a
 * Secret that was refused is revoked: no one holds it.
 */
static void
test_stalled_children(void **state)
{
	static const char *const secret[] = { "secret: ", "cannot create "
	    "resource \"secrets\"", NULL };
	static const char *const netpol[] = { "networkpolicy: ",
	    "denied the request", NULL };
	char *a, *b;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	a = new_task_named(xstrdup("stall-netpol"), NULL, NULL);
	reconcile(a);
	refuse_calls("POST", "/networkpolicies", 422, 100000,
	    "admission webhook \"policy.example.com\" denied the request: "
	    "egress to 0.0.0.0/0 is not allowed");
	reconcile_fails(a, "denied the request");
	assert_stalled(a, netpol);
	assert_phase(a, "Pending");
	grant_all();
	reconcile(a);
	assert_phase(a, "Provisioning");
	assert_not_stalled(a);

	/* the index exists: its update is a PUT, the first POST the Secret's */
	b = new_task_named(xstrdup("stall-secret"), NULL, NULL);
	reconcile(b);
	refuse_calls("POST", "/namespaces/" NS "/secrets", 403, 100000,
	    "secrets \"stall-secret-token\" is forbidden: User \"system:"
	    "serviceaccount:diverge-system:diverged\" cannot create resource "
	    "\"secrets\" in API group \"\" in the namespace \"" NS "\"");
	reconcile_fails(b, "cannot create resource");
	reconcile_fails(b, "cannot create resource");
	assert_stalled(b, secret);
	assert_phase(b, "Pending");
	/* the tokens minted for it, in no Secret, are revoked */
	assert_int_equal(index_active_tokens(b), 0);
	grant_all();
	reconcile(b);
	assert_phase(b, "Provisioning");
	assert_not_stalled(b);
	assert_int_equal(index_active_tokens(b), 1);
	free(a);
	free(b);
}

/*
 * With every request of method whose path has match refused (status,
 * message as the API server words it), a pass of name fails and stalls
 * it in phase, with Stalled quoting each of want (want[1] in the pass's
 * cause too); once granted, the next pass clears it and brings it to
 * next.
 */
static void
stall_then_grant(const char *name, const char *method, const char *match,
    int status, const char *message, const char *const *want,
    const char *phase, const char *next)
{
	refuse_calls(method, match, status, 100000, message);
	reconcile_fails(name, want[1]);
	assert_stalled(name, want);
	assert_phase(name, phase);
	grant_all();
	reconcile(name);
	assert_phase(name, next);
	assert_not_stalled(name);
}

/*
 * The preview Environment goes through apply_child as the Secret and the
 * NetworkPolicy do, and a refusal of it stalls the task in the same way:
 * an admission webhook denying its create (the task stays Pending), RBAC
 * its update (the hibernation of a pause). Stalled names the kind and
 * quotes the API server; once granted the next pass clears it and goes
 * on. This guards code that already worked.
 */
static void
test_stalled_environment(void **state)
{
	static const char *const webhook[] = { "environment: ",
	    "denied the request: previews are frozen", NULL };
	static const char *const rbac[] = { "environment: ",
	    "cannot update resource \"environments\"", NULL };
	json_t *o;
	char *a;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	a = new_task_named(xstrdup("stall-env"), NULL, NULL);
	reconcile(a);
	stall_then_grant(a, "POST", "/environments", 422, "admission webhook "
	    "\"previews.example.com\" denied the request: previews are "
	    "frozen in namespace " NS, webhook, "Pending", "Provisioning");
	assert_non_null((o = get(&K8S_ENVIRONMENT, "agent-preview-stall-env")));
	json_decref(o);

	set_suspended(a, 1);
	stall_then_grant(a, "PUT", "/environments/agent-preview-stall-env",
	    403, "environments.divergedev.com \"agent-preview-stall-env\" is "
	    "forbidden: User \"system:serviceaccount:diverge-system:diverged\""
	    " cannot update resource \"environments\" in API group \""
	    "divergedev.com\" in the namespace \"" NS "\"", rbac,
	    "Provisioning", "Pausing");
	o = get(&K8S_ENVIRONMENT, "agent-preview-stall-env");
	assert_string_equal(jp(o, "metadata.annotations.divergedev.com/"
	    "hibernated"), "true");
	json_decref(o);
	free(a);
}

/*
 * Warm-pool mode: RBAC refusing the SandboxClaim's create, then the
 * patch of the Sandbox it bound (apply_bound: the live token into its
 * pod template, its id into its annotation), each stall the task, named
 * as the API server names them, and the next pass once granted clears
 * the condition: the claim is made, then the task is Active with its
 * token in the bound Sandbox. This guards code that already worked.
 */
static void
test_stalled_warm_pool(void **state)
{
	static const char *const claim[] = { "sandboxclaim: ",
	    "cannot create resource \"sandboxclaims\"", NULL };
	static const char *const bound[] = { "sandbox: ",
	    "cannot patch resource \"sandboxes\"", NULL };
	json_t *o;
	char *a;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	cfg.sandbox.warm_pool = 2;
	a = new_task_named(xstrdup("stall-warm"), NULL, NULL);
	reconcile(a);
	stall_then_grant(a, "POST", "/sandboxclaims", 403, "sandboxclaims."
	    "extensions.agents.x-k8s.io is forbidden: User \"system:"
	    "serviceaccount:diverge-system:diverged\" cannot create resource "
	    "\"sandboxclaims\" in API group \"extensions.agents.x-k8s.io\" "
	    "in the namespace \"" NS "\"", claim, "Provisioning",
	    "Provisioning");
	assert_non_null((o = get(&K8S_SANDBOXCLAIM, a)));
	json_decref(o);

	/* the claim controller binds a Sandbox, which diverged patches */
	play_claim_cold(a);
	stall_then_grant(a, "PATCH", "/sandboxes/stall-warm", 403, "sandboxes."
	    "agents.x-k8s.io \"stall-warm\" is forbidden: User \"system:"
	    "serviceaccount:diverge-system:diverged\" cannot patch resource "
	    "\"sandboxes\" in API group \"agents.x-k8s.io\" in the "
	    "namespace \"" NS "\"", bound, "Provisioning", "Active");
	assert_warm_current(a);
	cfg.sandbox.warm_pool = 0;
	free(a);
}

/* After a warm-pool test on a limited store (also one that failed). */
static int
warm_unlimit(void **state)
{
	warm_off(state);
	return unlimit(state);
}

/*
 * Admission reads the slot cache, not the store: with 2,000 finished
 * tasks in the store (they are never deleted), deciding three tasks
 * lists none of them. Through the fake kube-apiserver, whose request log
 * counts the lists (GET .../agenttasks; one task is .../agenttasks/NAME).
 */
#define FINISHED_TASKS 2000

static void
test_queue_no_list(void **state)
{
	char *q[3], name[32];
	int64_t t0;
	json_t *j;
	int i;

	(void)state;
	if (open_limited(3, 2) < 0)
		skip();
	for (i = 0; i < FINISHED_TASKS; i++) {
		snprintf(name, sizeof(name), "done%d", i);
		free(new_task_named(xstrdup(name), NULL, NULL));
		patch_status(name, "{\"status\":{\"phase\":\"Completed\","
		    "\"reason\":\"Succeeded\"}}");
	}
	for (i = 0; i < 3; i++) {
		q[i] = new_task_named(xasprintf("n%d", i), NULL, NULL);
		reconcile(q[i]);
		assert_phase(q[i], "Pending");
	}
	j = storeenv_fake(&env, "DELETE", "/_fake/requests", NULL);
	assert_non_null(j);
	json_decref(j);
	t0 = now_mono_ms();
	for (i = 2; i >= 0; i--)
		reconcile(q[i]);
	fprintf(stderr, "# 3 passes that decide an admission, %d finished "
	    "tasks: %lld ms\n", FINISHED_TASKS, (long long)(now_mono_ms() -
	    t0));
	assert_int_equal(storeenv_fake_count(&env, "GET", "/agenttasks"), 0);
	assert_queued(q[2], "Pending", "waiting for a free slot: 0 of 2 tasks "
	    "are running; 2 queued ahead");
	assert_phase(q[1], "Provisioning");
	assert_phase(q[0], "Provisioning");
	reconcile(q[2]);
	assert_queued(q[2], "Pending", "waiting for a free slot: 2 of 2 tasks "
	    "are running; 0 queued ahead");
	for (i = 0; i < 3; i++)
		free(q[i]);
}

/*
 * A task admitted counts as running until the slot cache shows it in its
 * slot, not only until its status write returns: here nothing shows the
 * cache b's Provisioning (no watch runs, no pass of b reads it again), so
 * when a, earlier, resumes, b counts by its record alone; dropped with
 * the write, a would be admitted too, two running with a limit of 1.
 */
static void
test_queue_assumed_until_seen(void **state)
{
	char *a, *b;

	(void)state;
	paused_and_pending("v1", &a, "v2", &b);
	reconcile(b);
	assert_phase(b, "Provisioning");
	set_suspended(a, 0);
	reconcile(a);
	assert_queued(a, "Paused", "waiting for a free slot to resume: 1 of 1 "
	    "tasks are running; 0 queued ahead");
	/* once the cache sees b in its slot, the record goes; a still waits */
	reconcile(b);
	reconcile(a);
	assert_queued(a, "Paused", "waiting for a free slot to resume: 1 of 1 "
	    "tasks are running; 0 queued ahead");
	free(a);
	free(b);
}

/* The slot cache from a list of the store: a restarted controller's. */
static void
relist_slots(void)
{
	struct k8s_status st = { 0 };
	json_t *list = NULL;

	assert_int_equal(k8s_list(env.api, &K8S_AGENTTASK, NULL, NULL, &list,
	    &st), 0);
	controller_slots_relist(controller_slots_of(env.api), list);
	json_decref(list);
}

/*
 * kill -9 of an admitted pass after it made its token and before its
 * Provisioning write: the admission record (in memory) is lost, and the
 * task is Pending with a live token, but no Sandbox: one is made only
 * once the status says Provisioning. After the restart (its relist
 * shows a, earlier, resumed meanwhile) a takes the slot, first in line,
 * and b waits, its token revoked; nothing of b ever ran with it, so
 * never two tasks run with a limit of 1.
 */
static void
test_queue_crash_admitted(void **state)
{
	char *a, *b, *sname, *id;
	json_t *sec;

	(void)state;
	paused_and_pending("x1", &a, "x2", &b);
	crash_reconcile(b, 4);
	assert_phase(b, "Pending");
	assert_null(get(&K8S_SANDBOX, b));
	sname = xasprintf("%s-token", b);
	sec = get(&K8S_SECRET, sname);
	assert_non_null(sec);
	id = xstrdup(jp(sec, "metadata.annotations.divergedev.com/token-id"));
	json_decref(sec);
	assert_index(id, "active");
	set_suspended(a, 0);
	relist_slots();
	reconcile(b);
	assert_queued(b, "Pending", "waiting for a free slot: 0 of 1 tasks "
	    "are running; 1 queued ahead");
	assert_index(id, "revoked");
	assert_null(get(&K8S_SANDBOX, b));
	reconcile(a);
	assert_phase(a, "Provisioning");
	assert_sandbox(a, "Running", NULL);
	reconcile(b);
	assert_queued(b, "Pending", "waiting for a free slot: 1 of 1 tasks "
	    "are running; 0 queued ahead");
	free(id);
	free(sname);
	free(a);
	free(b);
}

/* The value of a metric series, or -1. */
static double
metric(const char *series)
{
	struct buf m;
	char *want = xasprintf("\n%s ", series), *p;
	double v = -1;

	buf_init(&m, 1 << 22);
	assert_int_equal(metrics_render(&m), 0);
	p = strstr(m.data, want);
	if (p != NULL)
		v = strtod(p + strlen(want), NULL);
	buf_release(&m);
	free(want);
	return v;
}

static int
wait_metric(const char *series, double want, int64_t ms)
{
	int64_t end = now_mono_ms() + ms;

	while (now_mono_ms() < end) {
		if (metric(series) == want)
			return 1;
		sleep_ms(10);
	}
	return 0;
}

/* ------------------------------------------- controller.ttl_after_finished */

static int
no_ttl(void **state)
{
	cc.test_hook = NULL;
	cfg.controller.ttl_after_finished_s = 0;
	return unlimit(state);
}

/* One pass of name; its requeue hint. */
static int64_t
reconcile_requeue(const char *name)
{
	int64_t requeue = 0;
	char *cause = NULL;
	int rc = controller_reconcile(&cc, NS, name, &requeue, NULL, &cause);

	if (rc != 0)
		fprintf(stderr, "# reconcile: %s\n", cause ? cause : "?");
	assert_int_equal(rc, 0);
	free(cause);
	return requeue;
}

/* Move status.completedAt of name back to secs ago. */
static void
backdate_completed(const char *name, int64_t secs)
{
	char ts[32], *p;

	time_rfc3339(now_unix() - secs, ts);
	p = xasprintf("{\"status\":{\"completedAt\":\"%s\"}}", ts);
	patch_status(name, p);
	free(p);
}

/* Over its timeout while its Sandbox stops (Pausing): Failed, Timeout. */
static void
test_timeout_pausing(void **state)
{
	char *name = active();
	json_t *t;

	(void)state;
	backdate_open_period(name, 5000);	/* the timeout is 1800 s */
	set_suspended(name, 1);
	reconcile(name);
	assert_phase(name, "Failed");
	t = get_task(name);
	assert_string_equal(jp(t, "status.reason"), "Timeout");
	json_decref(t);
	free(name);
}

/* A live task is looked at again when its timeout falls due. */
static void
test_timeout_requeue(void **state)
{
	char *name = active();
	int64_t requeue;

	(void)state;
	backdate_open_period(name, 1790);	/* 10 s of 1800 left */
	requeue = reconcile_requeue(name);
	assert_phase(name, "Active");
	assert_true(requeue > 0 && requeue <= 12 * 1000);
	free(name);
}

/* Whether the object is gone within a few seconds (a cluster's GC). */
static int
gone(const struct k8s_resource *r, const char *name)
{
	int64_t end = now_mono_ms() + 5000;
	json_t *o;

	while ((o = get(r, name)) != NULL && now_mono_ms() < end) {
		json_decref(o);
		sleep_ms(50);
	}
	json_decref(o);
	return o == NULL;
}

static const char *rerun_in_hook;

/* A re-run lands between the pass's read and its deletion. */
static void
rerun_hook(void *arg, const char *point)
{
	const char *name = rerun_in_hook;

	(void)arg;
	if (strcmp(point, "delete") != 0 || name == NULL)
		return;
	rerun_in_hook = NULL;
	patch_status(name, "{\"status\":{\"phase\":\"Pending\","
	    "\"reason\":\"Rerun\",\"completedAt\":null}}");
}

/*
 * A finished task is deleted ttl_after_finished after its completedAt,
 * with its children; not before (its pass asks for a look when it is
 * due), not by a pass that wrote something (at once by the next), and
 * not when it changed after the pass read it (a re-run): the
 * deletion's preconditions make that a 409, and the next pass sees it
 * Pending. Without a TTL a finished task stays and asks for no look.
 */
static void
ttl_after_finished(int mode)
{
	char *a, *b, *sname;
	int64_t requeue;
	double before;
	json_t *t;

	if (open_limited(mode, 0) < 0)
		return;
	cfg.controller.ttl_after_finished_s = 0;
	a = active();
	complete_task(a);
	assert_int_equal(reconcile_requeue(a), -1);

	/* due after the next resync (10 minutes): left to a resync */
	cfg.controller.ttl_after_finished_s = 2 * 86400;
	assert_int_equal(reconcile_requeue(a), -1);
	backdate_completed(a, 2 * 86400 - 3600);
	assert_int_equal(reconcile_requeue(a), -1);	/* shutdownTime moved */
	assert_int_equal(reconcile_requeue(a), -1);
	/* due before it: a look when it is */
	backdate_completed(a, 2 * 86400 - 300);
	requeue = reconcile_requeue(a);
	assert_true(requeue > 290 * 1000 && requeue <= 300 * 1000);
	assert_non_null((t = get_task(a)));
	json_decref(t);

	/* due: the task goes, and its children with it */
	before = metric("diverge_agenttasks_expired_total");
	backdate_completed(a, 2 * 86400 + 5);
	/* the Sandbox's shutdownTime moved back with it: written, not due */
	assert_int_equal(reconcile_requeue(a), 0);
	assert_non_null((t = get_task(a)));
	json_decref(t);
	reconcile(a);
	assert_null((t = get(&K8S_AGENTTASK, a)));
	sname = xasprintf("%s-token", a);
	assert_true(gone(&K8S_SECRET, sname));
	assert_true(gone(&K8S_SANDBOX, a));
	free(sname);
	assert_true(metric("diverge_agenttasks_expired_total") ==
	    (before < 0 ? 0 : before) + 1);
	reconcile(a);		/* gone: nothing to do */

	/* a re-run between the read and the deletion wins */
	b = active();
	complete_task(b);
	backdate_completed(b, 2 * 86400 + 5);
	assert_int_equal(reconcile_requeue(b), 0);
	rerun_in_hook = b;
	cc.test_hook = rerun_hook;
	reconcile(b);
	cc.test_hook = NULL;
	assert_null(rerun_in_hook);
	assert_non_null((t = get_task(b)));
	json_decref(t);
	assert_phase(b, "Provisioning");
	cfg.controller.ttl_after_finished_s = 0;
	free(a);
	free(b);
}

static void
test_ttl_after_finished(void **state)
{
	(void)state;
	ttl_after_finished(1);
	ttl_after_finished(3);
}

/*
 * A finished task whose token cannot be revoked (an admission webhook
 * denies the index's update: 422 Invalid) or that cannot be deleted when
 * its ttl_after_finished ends (RBAC: 403) stalls too, where its passes
 * were retried for ever, unseen: Stalled names what was refused, the
 * phase stays (it is not failed again, even past the grace), the same
 * refusal writes nothing again, and once granted the next pass revokes
 * the token (the condition goes), the one after deletes the task.
 */
static void
test_stalled_finished(void **state)
{
	static const char *const webhook[] = { "token index secret '" NS "/"
	    METER_INDEX_SECRET "'", "admission webhook", NULL };
	static const char *const rbac[] = { "task delete",
	    "forbidden: injected fault", NULL };
	char *a, *id, *rv;
	json_t *t;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	a = active();
	id = task_token_id(a);
	refuse_calls("PUT", "/secrets/" METER_INDEX_SECRET, 422, 100000,
	    "admission webhook \"tokens.example.com\" denied the request: "
	    "secrets in " NS " are frozen");
	patch_status(a, "{\"status\":{\"phase\":\"Completed\","
	    "\"reason\":\"Succeeded\"}}");
	assert_true(reconcile_fails(a, "denied the request") < 0);
	assert_stalled(a, webhook);
	assert_phase(a, "Completed");
	assert_index(id, "active");
	backdate_stalled(a, CONTROLLER_ERROR_GRACE_S + 10);
	reconcile_fails(a, "denied the request");
	t = get_task(a);
	assert_string_equal(jp(t, "status.phase"), "Completed");
	assert_string_equal(jp(t, "status.reason"), "Succeeded");
	json_decref(t);

	grant_all();
	reconcile(a);
	assert_not_stalled(a);
	assert_index(id, "revoked");

	/* due for deletion, which RBAC refuses */
	cfg.controller.ttl_after_finished_s = 2 * 86400;
	backdate_completed(a, 2 * 86400 + 5);
	reconcile(a);		/* the Sandbox's shutdownTime moved */
	refuse_calls("DELETE", "/agenttasks/", 403, 100000, NULL);
	reconcile_fails(a, "forbidden: injected fault");
	assert_stalled(a, rbac);
	assert_phase(a, "Completed");
	t = get_task(a);
	rv = xstrdup(jp(t, "metadata.resourceVersion"));
	json_decref(t);
	/* the next refused pass writes nothing: no flapping condition */
	reconcile_fails(a, "forbidden: injected fault");
	t = get_task(a);
	assert_string_equal(jp(t, "metadata.resourceVersion"), rv);
	json_decref(t);

	grant_all();
	reconcile(a);
	assert_null((t = get(&K8S_AGENTTASK, a)));
	free(rv);
	free(id);
	free(a);
}

/*
 * With the watches and workers: a task that leaves its slot (completes,
 * is deleted) has the first queued task admitted at once, not at the
 * next resync (an hour here); the gauges count the running and the
 * queued tasks.
 */
static void
queue_controller(int mode)
{
	struct controller *c = NULL;
	char *cause = NULL, *n[4];
	int i;

	if (open_limited(mode, 1) < 0)
		skip();
	cc.workers = 3;
	cc.resync_ms = 3600 * 1000;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	for (i = 0; i < 3; i++) {
		n[i] = new_task_named(xasprintf("k%d", i), NULL, NULL);
		if (i == 0)
			assert_true(wait_phase(n[0], "Provisioning", 10000));
	}
	assert_true(wait_metric("diverge_tasks_queued", 2, 10000));
	assert_true(wait_metric("diverge_tasks_active", 1, 10000));
	assert_queued(n[1], "Pending", "waiting for a free slot: 1 of 1 tasks "
	    "are running; 0 queued ahead");
	assert_queued(n[2], "Pending", "waiting for a free slot: 1 of 1 tasks "
	    "are running; 1 queued ahead");
	patch_status(n[0], "{\"status\":{\"phase\":\"Completed\"}}");
	assert_true(wait_phase(n[1], "Provisioning", 5000));
	assert_true(wait_metric("diverge_tasks_queued", 1, 5000));
	assert_phase(n[2], "Pending");
	delete_task(n[1]);
	assert_true(wait_phase(n[2], "Provisioning", 5000));
	assert_true(wait_metric("diverge_tasks_queued", 0, 5000));
	assert_true(wait_metric("diverge_tasks_active", 1, 5000));
	stop_running(NULL);
	cc.resync_ms = 0;
	for (i = 0; i < 3; i++)
		free(n[i]);
}

/*
 * A task that waits for a slot without being said to be queued yet (its
 * passes fail: here every status write of it loses to another writer)
 * counts for the tasks behind it; when it is deleted, they are looked at
 * again at once, as when a queued or running task leaves, not at the
 * next resync (an hour here).
 */
static const char *bumped;

static void
bump_hook(void *arg, const char *point)
{
	static int n;
	struct k8s_status st = { 0 };
	const char *name = bumped;
	char v[16];
	json_t *p;

	(void)arg;
	if (strcmp(point, "status") != 0 || name == NULL)
		return;
	/* whichever pass writes: the bumped task's is stale (if it is) */
	snprintf(v, sizeof(v), "%d", ++n);
	p = json_pack("{s:{s:{s:s}}}", "metadata", "annotations", "test/bump",
	    v);
	(void)k8s_patch(env.api, &K8S_AGENTTASK, NS, name, 0, p, NULL, &st);
	k8s_status_release(&st);
	json_decref(p);
}

static void
test_queue_waiting_deleted(void **state)
{
	struct controller *c = NULL;
	char *cause = NULL, *a, *b;
	json_t *t;

	(void)state;
	if (open_limited(1, 1) < 0)
		skip();
	a = new_task_named(xstrdup("w1"), NULL, NULL);
	reconcile(a);
	assert_phase(a, "Pending");
	bumped = a;
	cc.test_hook = bump_hook;
	cc.workers = 2;
	cc.resync_ms = 3600 * 1000;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	b = new_task_named(xstrdup("w2"), NULL, NULL);
	assert_true(wait_metric("diverge_tasks_queued", 1, 10000));
	t = get_task(a);
	assert_string_equal(jp(t, "status.phase"), "Pending");
	assert_false(k8s_task_queued(t, NULL));
	json_decref(t);
	delete_task(a);
	assert_true(wait_phase(b, "Provisioning", 5000));
	stop_running(NULL);
	bumped = NULL;
	free(a);
	free(b);
}

/*
 * The gauges follow a watch that falls behind the store's window (410)
 * and starts again from a fresh list: a task deleted meanwhile, whose
 * DELETED event the watch never sees, no longer counts as running (the
 * resync that would count again is an hour away).
 */
static void
test_slots_after_relist(void **state)
{
	struct controller *c;
	char *name;
	int i;

	(void)state;
	c = running = start_stallable();
	name = new_task(NULL, NULL);
	assert_true(wait_phase(name, "Provisioning", 10000));
	assert_true(wait_metric("diverge_tasks_active", 1, 10000));
	stall = 1;
	sleep_ms(400);
	delete_task(name);
	for (i = 0; i < 30; i++) {
		char n[32];

		snprintf(n, sizeof(n), "noise-c%d", i);
		free(new_task_named(xstrdup(n), NULL, NULL));
		delete_task(n);
	}
	stall = 0;
	for (i = 0; i < 200 && controller_relists(c) < 1; i++)
		sleep_ms(25);
	assert_true(controller_relists(c) >= 1);
	assert_true(wait_metric("diverge_tasks_active", 0, 5000));
	stop_running(NULL);
	free(name);
}

/*
 * A periodic resync no longer looks at finished tasks that are settled:
 * on a cluster each look is five reads, for every finished task kept, at
 * every resync. A paused task is still looked at. Through the fake
 * kube-apiserver, whose request log counts each task's reads; resyncs
 * every 200 ms (the task watcher checks every 250 ms).
 */
static void
test_resync_skips_settled(void **state)
{
	struct controller *c = NULL;
	char *done, *paused, *cause = NULL, *pd, *pp;
	json_t *t;
	int64_t end;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	done = active();
	complete_task(done);
	reconcile(done);
	paused = active();
	pause_task(paused);
	assert_true(k8s_task_settled((t = get_task(done))));
	json_decref(t);
	assert_false(k8s_task_settled((t = get_task(paused))));
	json_decref(t);
	pd = xasprintf("/agenttasks/%s", done);
	pp = xasprintf("/agenttasks/%s", paused);
	cc.workers = 1;
	cc.resync_ms = 200;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	/* the start's watch brings both once */
	end = now_mono_ms() + 10000;
	while ((storeenv_fake_count(&env, "GET", pd) < 1 ||
	    storeenv_fake_count(&env, "GET", pp) < 1) && now_mono_ms() < end)
		sleep_ms(50);
	sleep_ms(300);
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/requests", NULL));
	end = now_mono_ms() + 10000;
	while (storeenv_fake_count(&env, "GET", pp) < 3 &&
	    now_mono_ms() < end)
		sleep_ms(50);
	assert_true(storeenv_fake_count(&env, "GET", pp) >= 3);
	assert_int_equal(storeenv_fake_count(&env, "GET", pd), 0);
	stop_running(NULL);
	cc.resync_ms = 0;
	free(pd);
	free(pp);
	free(done);
	free(paused);
}

/*
 * diverge_tasks_stalled counts the tasks whose passes the API server
 * refuses for good, from the task watch: 1 while every Sandbox create is
 * a 403, 0 once one goes through.
 */
static void
test_stalled_gauge(void **state)
{
	struct controller *c = NULL;
	char *name, *cause = NULL;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	refuse_sandboxes(403, 100000);
	cc.workers = 1;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	assert_true(wait_metric("diverge_tasks_stalled", 0, 5000));
	name = new_task(NULL, NULL);
	assert_true(wait_metric("diverge_tasks_stalled", 1, 10000));
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/faults", NULL));
	assert_true(wait_metric("diverge_tasks_stalled", 0, 15000));
	assert_true(wait_phase(name, "Provisioning", 5000));
	stop_running(NULL);
	free(name);
}

/* RBAC without agenttasks/status, as the API server words the refusal. */
#define STATUS_RBAC "agenttasks.divergedev.com \"stall-status\" is " \
	"forbidden: User \"system:serviceaccount:diverge-system:diverged\" " \
	"cannot patch resource \"agenttasks/status\" in API group " \
	"\"divergedev.com\" in the namespace \"" NS "\""

/* The status of stall-status is refused for good (RBAC). */
static void
refuse_status(void)
{
	refuse_calls("PATCH", "/agenttasks/stall-status/status", 403, 100000,
	    STATUS_RBAC);
}

/* The test hook that deletes stall-status before its status write. */
static void
delete_hook(void *arg, const char *point)
{
	(void)arg;
	if (strcmp(point, "status") == 0)
		delete_task("stall-status");
}

/* One pass of name; its status outcome, and its cause has want. */
static int
reconcile_status(const char *name, int want_rc, const char *want)
{
	char *cause = NULL;
	int status = 7, rc;

	rc = controller_reconcile(&cc, NS, name, NULL, &status, &cause);
	if (want_rc == 0)
		assert_int_equal(rc, 0);
	else
		assert_true(rc < 0);
	if (want != NULL && (cause == NULL || strstr(cause, want) == NULL))
		fail_msg("cause '%s', not '%s'", cause, want);
	free(cause);
	return status;
}

/*
 * A status the API server refuses for good (RBAC without
 * agenttasks/status, an admission webhook on status) leaves no condition
 * to tell it: the pass tells its caller (status -1, the cause quoting the
 * refusal), and a write that goes through (1). When a child was refused
 * too, the cause names both: the Stalled condition that would say the
 * first could not be written.
 */
static void
test_status_refused(void **state)
{
	char *a;
	json_t *t;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	a = new_task_named(xstrdup("stall-status"), NULL, NULL);
	refuse_status();
	assert_int_equal(reconcile_status(a, -1, "task status: " STATUS_RBAC),
	    -1);
	assert_int_equal(reconcile_status(a, -1, "cannot patch resource"),
	    -1);
	t = get_task(a);
	assert_null(json_object_get(t, "status"));
	json_decref(t);
	grant_all();
	assert_int_equal(reconcile_status(a, 0, NULL), 1);
	assert_phase(a, "Pending");

	refuse_calls("POST", "/networkpolicies", 403, 100000, NULL);
	refuse_status();
	assert_int_equal(reconcile_status(a, -1, "networkpolicy: forbidden: "
	    "injected fault; task status: " STATUS_RBAC), -1);
	assert_phase(a, "Pending");
	assert_not_stalled(a);
	grant_all();
	assert_int_equal(reconcile_status(a, 0, NULL), 1);
	assert_phase(a, "Provisioning");
	/* nothing to write: the stored status is as wanted */
	assert_int_equal(reconcile_status(a, 0, NULL), 1);

	/* a 404 of a task still there: its CRD has no status subresource */
	set_suspended(a, 1);
	refuse_calls("PATCH", "/agenttasks/stall-status/status", 404, 100000,
	    NULL);
	assert_int_equal(reconcile_status(a, -1, "task status: the server "
	    "could not find the requested resource"), -1);
	/* ... of a task deleted during the pass: nothing left to tell */
	grant_all();
	cc.test_hook = delete_hook;
	assert_int_equal(reconcile_status(a, -1, NULL), 1);
	cc.test_hook = NULL;
	assert_null((t = get(&K8S_AGENTTASK, a)));
	free(a);
}

/* Run fn with stderr in a file; the file's text (a new string). */
static char *
capture_stderr(void (*fn)(void))
{
	char path[] = "/tmp/test_reconciler.XXXXXX";
	struct buf b;
	char chunk[4096];
	size_t n;
	int fd, saved;
	FILE *f;

	fd = mkstemp(path);
	assert_true(fd >= 0);
	fflush(stderr);
	saved = dup(2);
	dup2(fd, 2);
	fn();
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	close(fd);
	f = fopen(path, "r");
	assert_non_null(f);
	buf_init(&b, 1 << 24);
	while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
		assert_int_equal(buf_add(&b, chunk, n), 0);
	buf_add(&b, "", 1);
	fclose(f);
	unlink(path);
	return buf_detach(&b, NULL);
}

static int
count_of(const char *text, const char *what)
{
	int n = 0;

	for (; (text = strstr(text, what)) != NULL; text += strlen(what))
		n++;
	return n;
}

/* The running controller with every status write of stall-status refused. */
static void
run_status_refused(void)
{
	struct controller *c = NULL;
	char *name, *cause = NULL;
	int64_t end;

	refuse_status();
	cc.workers = 1;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	assert_true(wait_metric("diverge_tasks_stalled", 0, 5000));
	name = new_task_named(xstrdup("stall-status"), NULL, NULL);
	assert_true(wait_metric("diverge_tasks_stalled", 1, 10000));
	/* back-off passes, each refused: logged once */
	end = now_mono_ms() + 10000;
	while (storeenv_fake_count(&env, "PATCH", "/stall-status/status") <
	    8 && now_mono_ms() < end)
		sleep_ms(20);
	assert_true(storeenv_fake_count(&env, "PATCH",
	    "/stall-status/status") >= 8);
	assert_true(metric("diverge_tasks_stalled") == 1);
	grant_all();
	assert_true(wait_metric("diverge_tasks_stalled", 0, 15000));
	assert_true(wait_phase(name, "Provisioning", 5000));
	free(name);
}

/*
 * diverge_tasks_stalled counts a task whose status the API server
 * refuses for good, which no Stalled condition can tell, until a status
 * write goes through or the task is deleted; the refusal is logged once
 * (the first stretch of refusals: the second ends in a deletion, which
 * may race with a pass in flight),
 * at error level, naming the task and namespace and quoting the API
 * server, not at every back-off pass.
 */
static void
test_status_refused_gauge(void **state)
{
	char *log;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	log = capture_stderr(run_status_refused);
	if (count_of(log, "task status refused") != 1)
		fail_msg("log: %s", log);
	assert_non_null(strstr(log, "task=stall-status namespace=" NS));
	assert_non_null(strstr(log, "cannot patch resource"));
	free(log);

	/* refused again, then the task goes away: so does the count */
	refuse_status();
	set_suspended("stall-status", 1);
	assert_true(wait_metric("diverge_tasks_stalled", 1, 10000));
	delete_task("stall-status");
	assert_true(wait_metric("diverge_tasks_stalled", 0, 10000));
	stop_running(NULL);
}

/*
 * run_status_refused with a resync every 200 ms: the status of
 * stall-status refused through at least 5 resyncs (each lists the tasks
 * and queues it, and its pass is refused again).
 */
static void
run_status_refused_resync(void)
{
	struct controller *c = NULL;
	char *name, *cause = NULL;
	int lists;
	int64_t end;

	refuse_status();
	cc.workers = 1;
	cc.resync_ms = 200;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	name = new_task_named(xstrdup("stall-status"), NULL, NULL);
	assert_true(wait_metric("diverge_tasks_stalled", 1, 10000));
	lists = storeenv_fake_count(&env, "GET", "/agenttasks");
	end = now_mono_ms() + 20000;
	while (storeenv_fake_count(&env, "GET", "/agenttasks") < lists + 5 &&
	    now_mono_ms() < end)
		sleep_ms(50);
	assert_true(storeenv_fake_count(&env, "GET", "/agenttasks") >=
	    lists + 5);
	assert_true(metric("diverge_tasks_stalled") == 1);
	stop_running(NULL);
	free(name);
}

/*
 * A resync keeps the refusal of a task's status that a pass saw (the
 * list cannot tell it: no condition says it): the refusal is logged
 * once, not again at the pass of each resync, and the task still counts
 * in diverge_tasks_stalled.
 */
static void
test_status_refused_resync(void **state)
{
	char *log;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	log = capture_stderr(run_status_refused_resync);
	if (count_of(log, "task status refused") != 1)
		fail_msg("log: %s", log);
	free(log);
}

/*
 * race_hook: the task stall-status is deleted after a pass found its
 * status refused and before the worker counts the refusal, and the
 * worker goes on only once the task watcher has seen the deletion.
 */
static atomic_int race_armed, race_deleted;

static void
race_hook(void *arg, const char *point)
{
	int64_t end;

	(void)arg;
	if (strcmp(point, "deleted") == 0) {
		race_deleted = 1;
		return;
	}
	if (strcmp(point, "refused") != 0 || !race_armed)
		return;
	race_armed = 0;
	delete_task("stall-status");
	end = now_mono_ms() + 10000;
	while (!race_deleted && now_mono_ms() < end)
		sleep_ms(2);
}

/*
 * A task deleted while the pass that found its status refused is still
 * in flight: the watcher takes it out of diverge_tasks_stalled before
 * the worker counts the refusal, and the worker must not put it back
 * (nothing would take it out before the next resync, an hour here).
 */
static void
test_status_refused_deleted(void **state)
{
	struct controller *c = NULL;
	const char *errors = "diverge_reconciles_total{result=\"error\"}";
	char *name, *cause = NULL;
	double before;
	int64_t end;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	refuse_status();
	race_deleted = 0;
	race_armed = 1;
	cc.test_hook = race_hook;
	cc.resync_ms = 3600 * 1000;
	cc.workers = 1;
	before = metric(errors);
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	name = new_task_named(xstrdup("stall-status"), NULL, NULL);
	/* the refused pass is counted once its refusal is marked */
	end = now_mono_ms() + 10000;
	while ((race_armed || metric(errors) <= before) &&
	    now_mono_ms() < end)
		sleep_ms(10);
	assert_false(race_armed);
	assert_true(race_deleted);
	assert_true(metric(errors) > before);
	assert_true(metric("diverge_tasks_stalled") == 0);
	assert_null(get(&K8S_AGENTTASK, name));
	stop_running(NULL);
	cc.test_hook = NULL;
	free(name);
}

/* The list of failing_list_ops (above). */
static int
failing_list(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const struct k8s_list_opts *opts, json_t **out,
    struct k8s_status *st)
{
	if (r == &K8S_AGENTTASK) {
		task_lists++;
		if (fail_task_lists > 0) {
			fail_task_lists--;
			return k8s_status_set(st, K8S_EUNAVAILABLE,
			    "injected: the list failed", NULL);
		}
		while (hold_task_lists)
			sleep_ms(2);
	}
	return real_ops->list(api, r, ns, opts, out, st);
}

static int
counting_get(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, json_t **out, struct k8s_status *st)
{
	if (r == &K8S_AGENTTASK && streq_safe(name, counted_task))
		counted_gets++;
	return real_ops->get(api, r, ns, name, out, st);
}

/* A new task named name, Pending as if a pass had seen it. */
static char *
pending_named(const char *name)
{
	char *t = new_task_named(xstrdup(name), NULL, NULL);

	patch_status(t, "{\"status\":{\"phase\":\"Pending\"}}");
	return t;
}

/* The store's ops become failing_list_ops, with fails lists failing. */
static void
use_failing_list_ops(int fails)
{
	real_ops = env.api->ops;
	failing_list_ops = *real_ops;
	failing_list_ops.list = failing_list;
	failing_list_ops.get = counting_get;
	fail_task_lists = fails;
	task_lists = counted_gets = 0;
	env.api->ops = &failing_list_ops;
}

/* watch_next of stalling_ops: waits while stall is set. */
static int
stalling_watch_next(struct k8s_watch *w, int timeout_ms, struct k8s_event *ev,
    struct k8s_status *st)
{
	while (stall)
		sleep_ms(2);
	return real_ops->watch_next(w, timeout_ms, ev, st);
}

/*
 * A task deleted while the notifier's watch is down (it fell behind the
 * store's 20 events: 410 Gone), on a PR/MR that nothing queues again, is
 * no longer tracked after the relist that follows: the list does not
 * show it, and no DELETED event will come.
 */
static void
test_notifier_relist_drops_gone(void **state)
{
	static struct k8s_ops stalling_ops;
	struct notifier *n = NULL;
	struct notifier_config nc;
	char *cause = NULL, *a, *b;
	int64_t end;

	(void)state;
	close_all();
	open_history(1, 20);
	a = new_task(NULL, ",\"divergedev.com/provider\":\"github\","
	    "\"divergedev.com/project\":\"o/r\","
	    "\"divergedev.com/pr-number\":\"1\"");
	b = new_task(NULL, ",\"divergedev.com/provider\":\"github\","
	    "\"divergedev.com/project\":\"o/r\","
	    "\"divergedev.com/pr-number\":\"2\"");
	use_failing_list_ops(0);
	stalling_ops = failing_list_ops;
	stalling_ops.watch_next = stalling_watch_next;
	env.api->ops = &stalling_ops;
	memset(&nc, 0, sizeof(nc));
	nc.store = env.api;	/* no SCM client: tracked, never posted */
	nc.cfg = &cfg;
	nc.resync_ms = 3600 * 1000;
	assert_int_equal(notifier_start(&n, &nc, &cause), 0);
	for (end = now_mono_ms() + 5000; notifier_tracked(n) < 2 &&
	    now_mono_ms() < end;)
		sleep_ms(10);
	assert_int_equal(notifier_tracked(n), 2);
	assert_int_equal(task_lists, 1);
	/* the watch down past its 1 s wait, b deleted, the window moves on */
	stall = 1;
	sleep_ms(1200);
	delete_task(b);
	make_noise("noise-", 30);
	stall = 0;
	for (end = now_mono_ms() + 5000; task_lists < 2 &&
	    now_mono_ms() < end;)
		sleep_ms(10);
	assert_int_equal(task_lists, 2);	/* the 410 made it relist */
	for (end = now_mono_ms() + 2000; notifier_tracked(n) != 1 &&
	    now_mono_ms() < end;)
		sleep_ms(10);
	assert_int_equal(notifier_tracked(n), 1);
	notifier_stop(n);
	env.api->ops = real_ops;
	close_all();
	open_all(1);
	free(a);
	free(b);
}

/* Each watcher stops before its second wait while stall is set. */
static void
stall_after_one_hook(void *arg, const char *point)
{
	static __thread int waits;

	(void)arg;
	if (strcmp(point, "watch") == 0 && ++waits >= 2)
		while (stall)
			sleep_ms(2);
}

/*
 * A controller whose first list of the tasks fails (an API server under
 * load at start) must not decide admissions on what the watch has
 * delivered so far: here only a-wait's ADDED event, not z-hold's, which
 * holds the only slot. a-wait is not admitted; once the watch goes on,
 * the list is taken again (the resync is an hour away) and a-wait is
 * queued behind z-hold.
 */
static void
test_queue_first_list_fails(void **state)
{
	struct controller *c = NULL;
	char *cause = NULL, *h, *a;
	const char *msg;
	int64_t end;
	int admitted = 0;

	(void)state;
	if (open_limited(1, 1) < 0)
		skip();
	/* as a previous process left them: no pass of this one saw them */
	h = new_task_named(xstrdup("z-hold"), NULL, NULL);
	patch_status(h, "{\"status\":{\"phase\":\"Provisioning\"}}");
	a = pending_named("a-wait");

	use_failing_list_ops(1);
	stall = 1;
	cc.test_hook = stall_after_one_hook;
	cc.workers = 2;
	cc.resync_ms = 3600 * 1000;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	/* the decision waits for a list (3 s), then for the watch */
	end = now_mono_ms() + 4500;
	while (now_mono_ms() < end && !admitted) {
		json_t *t = get_task(a);

		admitted = streq_safe(jp(t, "status.phase"), "Provisioning");
		json_decref(t);
		sleep_ms(20);
	}
	stall = 0;
	assert_false(admitted);
	msg = "waiting for a free slot: 1 of 1 tasks are running; 0 queued "
	    "ahead";
	(void)wait_message(a, msg, 10000);
	assert_queued(a, "Pending", msg);
	assert_true(task_lists >= 2);
	assert_phase(h, "Provisioning");
	stop_running(NULL);
	env.api->ops = real_ops;
	cc.test_hook = NULL;
	free(h);
	free(a);
}

/*
 * The slot cache catches up by a list rather than by the tasks' own
 * events (through the fake kube-apiserver): the first list of a
 * controller's task watch fails and the next one is slow (an API server
 * under load) once the watch has delivered the tasks' ADDED events, so
 * their passes find the cache behind (it reached nothing until a list
 * replaced it) for 8 s. A cache behind is not a failure of the task: no
 * pass counts as an error, and when the list ends, a-first, the earliest
 * queued, is looked at again at once and admitted within 2 s (the list
 * ends 300 ms after one of a-first's passes); b-later is queued behind
 * it. Before, each of those passes failed and
 * backed off (the decision's wait for the watch is 50 ms here, so after
 * 8 s of them the back-off is 5 to 10 s), and the list woke none of
 * them: the only slot stayed free until a-first's back-off ended.
 */
static void
test_queue_cache_behind(void **state)
{
	struct controller *c = NULL;
	char *cause = NULL, *a, *b;
	const char *msg;
	uint64_t errors = 0;
	int64_t end, t0;
	int seen;

	(void)state;
	if (open_limited(3, 1) < 0)
		skip();
	a = pending_named("a-first");
	b = pending_named("b-later");
	use_failing_list_ops(1);
	hold_task_lists = 1;
	counted_task = a;
	cc.workers = 2;
	cc.resync_ms = 3600 * 1000;
	cc.sync_wait_ms = 50;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	sleep_ms(8000);
	seen = counted_gets;
	assert_true(seen > 0);
	end = now_mono_ms() + 15000;
	while (counted_gets == seen && now_mono_ms() < end)
		sleep_ms(2);
	assert_true(counted_gets > seen);
	sleep_ms(300);
	assert_phase(a, "Pending");
	assert_phase(b, "Pending");
	(void)controller_reconciles(c, &errors);
	t0 = now_mono_ms();
	hold_task_lists = 0;
	assert_true(wait_phase(a, "Provisioning", 2000));
	fprintf(stderr, "# a-first admitted %lld ms after the list was let "
	    "go; %llu passes failed while the cache was behind\n",
	    (long long)(now_mono_ms() - t0), (unsigned long long)errors);
	assert_int_equal(errors, 0);
	msg = "waiting for a free slot: 1 of 1 tasks are running; 0 queued "
	    "ahead";
	(void)wait_message(b, msg, 5000);
	assert_queued(b, "Pending", msg);
	assert_phase(a, "Provisioning");
	stop_running(NULL);
	env.api->ops = real_ops;
	counted_task = NULL;
	free(a);
	free(b);
}

/*
 * The store's ops with every read of the task "flaky" by a thread other
 * than the test's failing (503) while flaky_fail is set; such reads are
 * counted in flaky_reads, and the failed ones' times kept in flaky_at.
 */
static struct k8s_ops flaky_ops;
static pthread_t flaky_tester;
static pthread_mutex_t flaky_mu = PTHREAD_MUTEX_INITIALIZER;
static int flaky_fail, flaky_reads, flaky_failed;
static int64_t flaky_at[64];

static int
flaky_get(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const char *name, json_t **out, struct k8s_status *st)
{
	int fail = 0;

	if (r == &K8S_AGENTTASK && streq_safe(name, "flaky") &&
	    !pthread_equal(pthread_self(), flaky_tester)) {
		pthread_mutex_lock(&flaky_mu);
		flaky_reads++;
		if ((fail = flaky_fail) != 0 && flaky_failed < 64)
			flaky_at[flaky_failed] = now_mono_ms();
		flaky_failed += fail;
		pthread_mutex_unlock(&flaky_mu);
	}
	if (fail)
		return k8s_status_set(st, K8S_EUNAVAILABLE,
		    "injected: the read failed", NULL);
	return real_ops->get(api, r, ns, name, out, st);
}

static void
flaky_set(int fail)
{
	pthread_mutex_lock(&flaky_mu);
	flaky_fail = fail;
	pthread_mutex_unlock(&flaky_mu);
}

/* The reads of flaky so far, and the failed ones in *failed. */
static int
flaky_count(int *failed)
{
	int n;

	pthread_mutex_lock(&flaky_mu);
	n = flaky_reads;
	if (failed != NULL)
		*failed = flaky_failed;
	pthread_mutex_unlock(&flaky_mu);
	return n;
}

/* Whether flaky_failed reaches n within ms. */
static int
wait_flaky_failed(int n, int64_t ms)
{
	int64_t end = now_mono_ms() + ms;
	int failed;

	for (;;) {
		(void)flaky_count(&failed);
		if (failed >= n)
			return 1;
		if (now_mono_ms() >= end)
			return 0;
		sleep_ms(5);
	}
}

/*
 * A pass that fails is tried again, after a back-off that grows (not at
 * once, not never), and a pass that goes through resets it: after 11
 * failures in a row (the next back-off 2.5 s or more) and a success, a
 * failure is tried again within milliseconds (2.5 s is a loaded
 * machine's slack). The task is suspended, so that its passes write no
 * children, whose events would bring other passes.
 */
static void
test_controller_backoff(void **state)
{
	struct controller *c = NULL;
	char *name, *cause = NULL;
	int64_t end, gap;
	int reads, failed, n;

	(void)state;
	if (open_limited(1, 0) < 0)
		skip();
	name = new_task_named(xstrdup("flaky"), ",\"suspended\":true", NULL);
	real_ops = env.api->ops;
	flaky_ops = *real_ops;
	flaky_ops.get = flaky_get;
	flaky_tester = pthread_self();
	flaky_reads = flaky_failed = 0;
	flaky_set(1);
	env.api->ops = &flaky_ops;
	cc.workers = 1;
	cc.resync_ms = 3600 * 1000;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	assert_true(wait_flaky_failed(11, 30000));
	pthread_mutex_lock(&flaky_mu);
	gap = flaky_at[10] - flaky_at[0];
	pthread_mutex_unlock(&flaky_mu);
	if (gap < 1000)
		fail_msg("11 failed passes in %lld ms", (long long)gap);

	flaky_set(0);
	assert_true(wait_phase(name, "Paused", 30000));
	/* quiet (if a pass came later, the test would only prove less) */
	end = now_mono_ms() + 10000;
	do {
		reads = flaky_count(NULL);
		sleep_ms(500);
	} while (flaky_count(NULL) != reads && now_mono_ms() < end);

	(void)flaky_count(&failed);
	flaky_set(1);
	controller_enqueue(c, NS, name);
	assert_true(wait_flaky_failed(failed + 2, 30000));
	pthread_mutex_lock(&flaky_mu);
	n = failed + 1 < 64 ? failed + 1 : 63;
	gap = flaky_at[n] - flaky_at[n - 1];
	pthread_mutex_unlock(&flaky_mu);
	if (gap >= 2500)
		fail_msg("a failure after a success came back after %lld ms",
		    (long long)gap);
	stop_running(NULL);
	env.api->ops = real_ops;
	free(name);
}

/*
 * The store's ops for test_controller_grace: the first 11 reads of the
 * task "grace" by a thread other than the test's fail (503); from the
 * next on (at grace_t1, monotonic) the task read shows a Stalled
 * condition, when it has none, that began 299 s before, and every create
 * of another kind is refused for good (403).
 */
static struct k8s_ops grace_ops;
static int grace_failed;
static int64_t grace_t1, grace_since;

static int
grace_get(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const char *name, json_t **out, struct k8s_status *st)
{
	json_t *status, *conds, *c;
	int64_t since = 0;
	char ts[32];
	size_t i;
	int rc, stalled = 0;

	if (r == &K8S_AGENTTASK && streq_safe(name, "grace") &&
	    !pthread_equal(pthread_self(), flaky_tester)) {
		pthread_mutex_lock(&flaky_mu);
		if (grace_failed < 11) {
			grace_failed++;
			pthread_mutex_unlock(&flaky_mu);
			return k8s_status_set(st, K8S_EUNAVAILABLE,
			    "injected: the read failed", NULL);
		}
		if (grace_t1 == 0) {
			grace_t1 = now_mono_ms();
			grace_since = now_unix() - CONTROLLER_ERROR_GRACE_S + 1;
		}
		since = grace_since;
		pthread_mutex_unlock(&flaky_mu);
	}
	rc = real_ops->get(api, r, ns, name, out, st);
	if (rc < 0 || since == 0)
		return rc;
	status = json_object_get(*out, "status");
	if (!json_is_object(status))
		json_object_set_new(*out, "status", (status = json_object()));
	conds = json_object_get(status, "conditions");
	if (!json_is_array(conds))
		json_object_set_new(status, "conditions", (conds =
		    json_array()));
	json_array_foreach(conds, i, c)
		stalled |= streq_safe(jp(c, "type"), "Stalled");
	if (!stalled) {
		time_rfc3339(since, ts);
		json_array_append_new(conds, json_pack("{s:s,s:s,s:s,s:s,s:s}",
		    "type", "Stalled", "status", "True", "reason",
		    CONTROLLER_REASON_STALLED, "message", "injected",
		    "lastTransitionTime", ts));
	}
	return rc;
}

static int
grace_create(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const json_t *obj, json_t **out, struct k8s_status *st)
{
	int refuse;

	pthread_mutex_lock(&flaky_mu);
	refuse = grace_t1 != 0 && r != &K8S_AGENTTASK;
	pthread_mutex_unlock(&flaky_mu);
	if (refuse)
		return k8s_status_set(st, K8S_EFORBIDDEN,
		    "injected: forbidden", NULL);
	return real_ops->create(api, r, ns, obj, out, st);
}

/*
 * A stalled task fails when its grace ends, not at its next back-off
 * pass: its pass that fails asks for a look then, and the worker takes
 * the earlier of the two. After 11 failed passes (the next back-off is
 * 5.12 s or more), the first pass refused for good finds the task
 * Stalled for 299 s of the 300: it fails 2 s later (4.5 s is a loaded
 * machine's slack).
 */
static void
test_controller_grace(void **state)
{
	struct controller *c = NULL;
	char *name, *cause = NULL;
	int64_t end, t1 = 0;

	(void)state;
	if (open_limited(1, 0) < 0)
		skip();
	name = pending_named("grace");
	real_ops = env.api->ops;
	grace_ops = *real_ops;
	grace_ops.get = grace_get;
	grace_ops.create = grace_create;
	flaky_tester = pthread_self();
	grace_failed = 0;
	grace_t1 = grace_since = 0;
	env.api->ops = &grace_ops;
	cc.workers = 1;
	cc.resync_ms = 3600 * 1000;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	end = now_mono_ms() + 30000;
	while (t1 == 0 && now_mono_ms() < end) {
		pthread_mutex_lock(&flaky_mu);
		t1 = grace_t1;
		pthread_mutex_unlock(&flaky_mu);
		sleep_ms(5);
	}
	assert_true(t1 > 0);
	end = t1 + 4500 - now_mono_ms();
	if (!wait_phase(name, "Failed", end > 0 ? end : 0))
		fail_msg("not Failed %lld ms after its first refused pass",
		    (long long)(now_mono_ms() - t1));
	fprintf(stderr, "# Failed %lld ms after its first refused pass\n",
	    (long long)(now_mono_ms() - t1));
	stop_running(NULL);
	env.api->ops = real_ops;
	free(name);
}

/*
 * The times (unix seconds) of the watches of the tasks in the fake's
 * request log, up to max of them; how many.
 */
static int
task_watch_times(double *out, int max)
{
	json_t *reqs = storeenv_fake(&env, "GET", "/_fake/requests", NULL);
	json_t *r;
	const char *p, *q;
	size_t i;
	int n = 0;

	json_array_foreach(reqs, i, r) {
		p = json_string_value(json_object_get(r, "path"));
		q = json_string_value(json_object_get(r, "query"));
		if (p == NULL || q == NULL || strlen(p) < 11 ||
		    strcmp(p + strlen(p) - 11, "/agenttasks") != 0 ||
		    strstr(q, "watch=true") == NULL || n >= max)
			continue;
		out[n++] = json_real_value(json_object_get(r, "time"));
	}
	json_decref(reqs);
	return n;
}

/*
 * A watch that delivers events starts its back-off again: after 4
 * refused watches (the next wait would be 2.56 s or more) the watch of
 * the tasks goes through and brings the task's ADDED event; when it
 * later breaks and the next watch is refused, the one after is made
 * 160 to 320 ms after it (2.5 s is a loaded machine's slack). Through
 * the fake kube-apiserver, whose request log has the times.
 */
static void
test_watch_backoff_reset(void **state)
{
	struct controller *c = NULL;
	char *name, *cause = NULL;
	double at[2];
	int64_t end;
	json_t *j;

	(void)state;
	if (open_limited(3, 0) < 0)
		skip();
	name = new_task_named(xstrdup("rewatch"), NULL, NULL);
	refuse_calls("GET", "/agenttasks?watch=true", 403, 4, NULL);
	cc.workers = 1;
	cc.resync_ms = 3600 * 1000;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	/* its pass follows the ADDED event */
	assert_true(wait_phase(name, "Pending", 30000));

	json_decref(storeenv_fake(&env, "DELETE", "/_fake/requests", NULL));
	refuse_calls("GET", "/agenttasks?watch=true", 403, 1, NULL);
	j = storeenv_fake(&env, "POST", "/_fake/end_watches",
	    "{\"mode\":\"error\"}");
	assert_non_null(j);
	json_decref(j);
	end = now_mono_ms() + 30000;
	while (task_watch_times(at, 2) < 2 && now_mono_ms() < end)
		sleep_ms(20);
	assert_int_equal(task_watch_times(at, 2), 2);
	fprintf(stderr, "# watched again %.0f ms after the refusal\n",
	    (at[1] - at[0]) * 1000);
	assert_true((at[1] - at[0]) * 1000 < 2500);
	stop_running(NULL);
	free(name);
}

/*
 * breaking_ops: every watch opens (the store's own) and its stream then
 * breaks at once, as when the API server sends an ERROR event (500) the
 * moment a watch starts; the watches of the tasks are counted.
 */
static struct k8s_ops breaking_ops;
static atomic_int task_watches;

static int
counting_watch(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const struct k8s_list_opts *opts,
    struct k8s_watch **out, struct k8s_status *st)
{
	if (r == &K8S_AGENTTASK)
		task_watches++;
	return real_ops->watch(api, r, ns, opts, out, st);
}

static int
breaking_watch_next(struct k8s_watch *w, int timeout_ms, struct k8s_event *ev,
    struct k8s_status *st)
{
	(void)w;
	(void)timeout_ms;
	(void)ev;
	return k8s_status_set(st, K8S_EINTERNAL, "injected: etcdserver: "
	    "request timed out", NULL);
}

/* The store's ops become breaking_ops, the count at 0. */
static void
use_breaking_ops(void)
{
	real_ops = env.api->ops;
	breaking_ops = *real_ops;
	breaking_ops.watch = counting_watch;
	breaking_ops.watch_next = breaking_watch_next;
	task_watches = 0;
	env.api->ops = &breaking_ops;
}

/*
 * A watch whose stream breaks as soon as it opens is watched again after
 * the watcher's back-off (160 to 320 ms, then doubling), as client-go's
 * reflector backs off, not at once: in 3 s the tasks are watched 3 to 6
 * times (at once again: thousands of watches, and as many lists and
 * warnings). A stop during that back-off is not held up by it.
 */
static void
test_watch_broken_backoff(void **state)
{
	struct controller *c = NULL;
	char *cause = NULL;
	int64_t t0, took;
	int n;

	(void)state;
	use_breaking_ops();
	cc.workers = 1;
	cc.resync_ms = 3600 * 1000;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	sleep_ms(3000);
	n = task_watches;
	fprintf(stderr, "# the tasks watched %d times in 3 s\n", n);
	assert_in_range(n, 3, 6);
	t0 = now_mono_ms();
	stop_running(NULL);
	took = now_mono_ms() - t0;
	assert_true(took < 2000);
	env.api->ops = real_ops;
}

/*
 * The notifier's watch of the tasks backs off too when its stream breaks
 * the moment it opens: 250 to 500 ms, doubling up to 30 s, so in 8 s it
 * watches (and lists) the tasks 4 to 8 times, not every 500 ms (16); a
 * stop in the middle of a wait ends it (within 1 s, not after the 2 to
 * 8 s it has left).
 */
static void
test_notifier_broken_backoff(void **state)
{
	struct notifier *n = NULL;
	struct notifier_config nc;
	char *cause = NULL;
	int64_t t0, took;
	int k;

	(void)state;
	use_breaking_ops();
	memset(&nc, 0, sizeof(nc));
	nc.store = env.api;	/* no SCM client: tracked, never posted */
	nc.cfg = &cfg;
	nc.resync_ms = 3600 * 1000;
	assert_int_equal(notifier_start(&n, &nc, &cause), 0);
	sleep_ms(8000);
	k = task_watches;
	fprintf(stderr, "# the notifier watched the tasks %d times in 8 s\n",
	    k);
	t0 = now_mono_ms();
	notifier_stop(n);
	took = now_mono_ms() - t0;
	env.api->ops = real_ops;
	assert_in_range(k, 4, 8);
	assert_true(took < 1000);
}

/*
 * A resync_ms of 0 is the default, 10 minutes: the task watcher lists
 * the tasks once, when its watch starts, not at every wait for an event
 * (each 250 ms: 1.5 s would see 6 more).
 */
static void
test_resync_default(void **state)
{
	struct controller *c = NULL;
	char *cause = NULL;
	int64_t end;

	(void)state;
	if (open_limited(1, 0) < 0)
		skip();
	use_failing_list_ops(0);
	cc.workers = 1;
	cc.resync_ms = 0;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	end = now_mono_ms() + 10000;
	while (task_lists < 1 && now_mono_ms() < end)
		sleep_ms(10);
	sleep_ms(1500);
	assert_int_equal(task_lists, 1);
	stop_running(NULL);
	env.api->ops = real_ops;
}

/*
 * A settled task asks for no look days ahead (the work queue would hold
 * a timer for every finished task of the last ttl_after_finished): the
 * resync before its TTL ends queues it, and it is deleted on time.
 */
static void
test_ttl_by_resync(void **state)
{
	struct controller *c = NULL;
	char *done, *cause = NULL;
	json_t *t = NULL;
	int64_t end;

	(void)state;
	if (open_limited(1, 0) < 0)
		skip();
	cc.resync_ms = 200;
	done = active();
	complete_task(done);
	cfg.controller.ttl_after_finished_s = 2 * 86400;
	backdate_completed(done, 2 * 86400 - 3);
	reconcile(done);
	assert_int_equal(reconcile_requeue(done), -1);
	cc.workers = 1;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	end = now_mono_ms() + 10000;
	while ((t = get(&K8S_AGENTTASK, done)) != NULL &&
	    now_mono_ms() < end) {
		json_decref(t);
		sleep_ms(50);
	}
	assert_null(t);
	stop_running(NULL);
	cc.resync_ms = 0;
	cfg.controller.ttl_after_finished_s = 0;
	free(done);
}

/* A task of namespace ns as a watch or a read shows it. */
static json_t *
slot_task_in(const char *ns, const char *name, const char *uid,
    const char *rv, const char *phase)
{
	return json_pack("{s:{s:s,s:s,s:s,s:s,s:s},s:{s:s}}", "metadata",
	    "namespace", ns, "name", name, "uid", uid, "resourceVersion", rv,
	    "creationTimestamp", "2026-01-01T00:00:00Z", "status", "phase",
	    phase);
}

static json_t *
slot_task(const char *name, const char *uid, const char *rv,
    const char *phase)
{
	return slot_task_in(NS, name, uid, rv, phase);
}

/* controller_slots_observe of a task made by slot_task_in, then freed. */
static int
slots_observe(struct controller_slots *s, json_t *t, int deleted)
{
	int rc = controller_slots_observe(s, t, deleted);

	json_decref(t);
	return rc;
}

/* The tasks the cache shows in a slot. */
static int64_t
slots_holding(struct controller_slots *s)
{
	int64_t holds, queued;
	json_t *keys;
	int look;

	controller_slots_changes(s, &look, &holds, &queued, &keys);
	json_decref(keys);
	return holds;
}

/*
 * Two stale observations the slot cache turns away (found in review):
 * one older than the latest list of a task that list left out (a pass
 * whose read came before a deletion and a relist), and none that shuts
 * out a task made again under a name a stale read found empty.
 */
static void
test_slots_stale_observations(void **state)
{
	struct controller_slots *s;
	json_t *t, *list;

	(void)state;
	if (open_limited(1, 0) < 0)
		skip();
	s = controller_slots_of(env.api);
	list = json_pack("{s:{s:s},s:[]}", "metadata", "resourceVersion",
	    "100", "items");
	controller_slots_relist(s, list);
	json_decref(list);
	/* read at 50, before the list at 100 that has no such task */
	t = slot_task("gone-x", "uid-x1", "50", "Provisioning");
	assert_int_equal(controller_slots_observe(s, t, 0), -1);
	json_decref(t);
	assert_int_equal(slots_holding(s), 0);
	/* made since the list: taken */
	t = slot_task("gone-x", "uid-x2", "150", "Provisioning");
	assert_int_equal(controller_slots_observe(s, t, 0), 1);
	json_decref(t);
	assert_int_equal(slots_holding(s), 1);

	/* a read that found nothing, older than the task made again */
	t = slot_task("again-a", "uid-a1", "160", "Provisioning");
	assert_int_equal(controller_slots_observe(s, t, 0), 1);
	json_decref(t);
	t = slot_task("again-a", "uid-a2", "170", "Pending");
	assert_int_equal(controller_slots_observe(s, t, 0), 1);
	json_decref(t);
	controller_slots_not_found(s, NS, "again-a");
	t = slot_task("again-a", "uid-a2", "171", "Provisioning");
	assert_int_equal(controller_slots_observe(s, t, 0), 1);
	json_decref(t);
	assert_int_equal(slots_holding(s), 2);
	/* what it found gone, no newer, stays out */
	controller_slots_not_found(s, NS, "again-a");
	t = slot_task("again-a", "uid-a2", "171", "Provisioning");
	assert_int_equal(controller_slots_observe(s, t, 0), 0);
	json_decref(t);
	assert_int_equal(slots_holding(s), 1);
}

/*
 * The slot cache's rules, each on its own (mutation testing found no
 * test that noticed any of them broken): a deleted uid never comes back;
 * an observation at exactly the version of a list that left its task out
 * is stale; a relist keeps what was observed after it and what was made
 * since; the namespace breaks a tie in the queue before the name does; a
 * task whose own Sandbox runs (force) is admitted over a full limit; a
 * new task watch is taken to have reached nothing until its list.
 */
static void
test_slots_cache_rules(void **state)
{
	struct controller_slots *s;
	int64_t run, ahead;
	json_t *t, *u, *list;

	(void)state;
	if (open_limited(1, 0) < 0)
		skip();
	s = controller_slots_of(env.api);

	/* deleted, then a newer version of the same uid: still gone */
	assert_int_equal(slots_observe(s, slot_task("del-d", "uid-d1", "10",
	    "Provisioning"), 0), 1);
	assert_int_equal(slots_observe(s, slot_task("del-d", "uid-d1", "11",
	    "Provisioning"), 1), 1);
	assert_int_equal(slots_holding(s), 0);
	assert_int_equal(slots_observe(s, slot_task("del-d", "uid-d1", "12",
	    "Provisioning"), 0), -1);
	assert_int_equal(slots_holding(s), 0);
	/* another uid under the name is another task */
	assert_int_equal(slots_observe(s, slot_task("del-d", "uid-d2", "13",
	    "Provisioning"), 0), 1);
	assert_int_equal(slots_holding(s), 1);

	/*
	 * a relist at 120: "seen-b" was observed at 150, after the list,
	 * which shows it older (wanting a slot); "new-c" was made at 160,
	 * after it too; del-d is in neither, so gone
	 */
	assert_int_equal(slots_observe(s, slot_task("seen-b", "uid-b", "150",
	    "Active"), 0), 1);
	assert_int_equal(slots_observe(s, slot_task("new-c", "uid-c", "160",
	    "Provisioning"), 0), 1);
	assert_int_equal(slots_holding(s), 3);
	list = json_pack("{s:{s:s},s:[o]}", "metadata", "resourceVersion",
	    "120", "items", slot_task("seen-b", "uid-b", "110", "Pending"));
	controller_slots_relist(s, list);
	json_decref(list);
	assert_int_equal(slots_holding(s), 2);
	/* at exactly the list's version, of a task it left out: stale */
	assert_int_equal(slots_observe(s, slot_task("old-e", "uid-e", "120",
	    "Provisioning"), 0), -1);
	assert_int_equal(slots_observe(s, slot_task("old-e", "uid-e", "119",
	    "Provisioning"), 0), -1);
	assert_int_equal(slots_holding(s), 2);
	/* force: its own Sandbox runs, over a full limit */
	t = slot_task("force-f", "uid-f", "170", "Pending");
	assert_int_equal(slots_observe(s, json_incref(t), 0), 1);
	assert_int_equal(controller_slots_admit(s, t, 2, 0, 0, &run,
	    &ahead), 0);
	assert_int_equal(run, 2);
	assert_int_equal(controller_slots_admit(s, t, 2, 1, 0, &run,
	    &ahead), 1);
	assert_int_equal(run, 3);
	json_decref(t);

	/*
	 * the same creationTimestamp: namespace "a-ns" comes before "b-ns",
	 * though its name sorts after (both queued: the slots are taken)
	 */
	t = slot_task_in("a-ns", "zz-g", "uid-g", "180", "Pending");
	assert_int_equal(slots_observe(s, json_incref(t), 0), 1);
	u = slot_task_in("b-ns", "aa-h", "uid-h", "181", "Pending");
	assert_int_equal(slots_observe(s, json_incref(u), 0), 1);
	assert_int_equal(controller_slots_admit(s, t, 1, 0, 0, &run,
	    &ahead), 0);
	assert_int_equal(ahead, 0);
	assert_int_equal(controller_slots_admit(s, u, 1, 0, 0, &run,
	    &ahead), 0);
	assert_int_equal(ahead, 1);
	json_decref(u);
	json_decref(t);

	/*
	 * a watch that stopped and starts again: what it says it reached
	 * counts only after its list, so a decision waits (then gives up)
	 */
	t = slot_task("wait-i", "uid-i", "250", "Pending");
	assert_int_equal(slots_observe(s, json_incref(t), 0), 1);
	controller_slots_feed(s, 1);
	list = json_pack("{s:{s:s},s:[]}", "metadata", "resourceVersion",
	    "200", "items");
	controller_slots_relist(s, list);
	json_decref(list);
	controller_slots_synced(s, 300);
	controller_slots_feed(s, 0);
	controller_slots_feed(s, 1);
	controller_slots_synced(s, 300);
	assert_int_equal(controller_slots_admit(s, t, 10, 0, 50, &run,
	    &ahead), CONTROLLER_SLOTS_BEHIND);
	list = json_pack("{s:{s:s},s:[O]}", "metadata", "resourceVersion",
	    "300", "items", t);
	controller_slots_relist(s, list);
	json_decref(list);
	assert_int_equal(controller_slots_admit(s, t, 10, 0, 50, &run,
	    &ahead), 1);
	controller_slots_feed(s, 0);
	json_decref(t);
}

/* On the embedded store, then through the REST client. */
static void
test_queue_controller(void **state)
{
	(void)state;
	queue_controller(1);
	queue_controller(2);
}

/* Happy path and pause/resume with the watches and workers. */
static void
run_controller(int mode)
{
	struct controller *c = NULL;
	char *cause = NULL, *name, *id1;
	json_t *t;

	close_all();
	open_all(mode);
	cc.workers = 3;
	assert_int_equal(controller_start(&c, &cc, &cause), 0);
	running = c;
	name = new_task(NULL, NULL);
	assert_true(wait_phase(name, "Provisioning", 10000));
	assert_true(wait_sandbox(name, "Running", 10000));
	play(name, "True", "DependenciesReady", 0, "10.0.0.9", 0, 0);
	assert_true(wait_phase(name, "Active", 10000));
	t = get_task(name);
	id1 = xstrdup(jp(t, "status.tokenId"));
	json_decref(t);
	set_suspended(name, 1);
	assert_true(wait_phase(name, "Pausing", 10000));
	assert_true(wait_sandbox(name, "Suspended", 10000));
	play(name, "False", "SandboxSuspended", 0, NULL, 1, 0);
	assert_true(wait_phase(name, "Paused", 10000));
	set_suspended(name, 0);
	assert_true(wait_phase(name, "Provisioning", 10000));
	assert_true(wait_sandbox(name, "Running", 10000));
	play(name, "True", "DependenciesReady", 0, "10.0.0.9", 0, 0);
	assert_true(wait_phase(name, "Active", 10000));
	t = get_task(name);
	assert_string_not_equal(jp(t, "status.tokenId"), id1);
	json_decref(t);
	assert_index(id1, "revoked");
	/* deletion revokes the live token */
	{
		struct k8s_status st = { 0 };
		char *live;
		int64_t end = now_mono_ms() + 10000;
		char *s = NULL;

		t = get_task(name);
		live = xstrdup(jp(t, "status.tokenId"));
		json_decref(t);
		assert_int_equal(k8s_delete(env.api, &K8S_AGENTTASK, NS, name,
		    NULL, &st), 0);
		while (now_mono_ms() < end) {
			free(s);
			s = index_state(live);
			if (s != NULL && strcmp(s, "revoked") == 0)
				break;
			sleep_ms(10);
		}
		assert_non_null(s);
		assert_string_equal(s, "revoked");
		free(s);
		free(live);
		assert_null(get(&K8S_SANDBOX, name));
	}
	stop_running(NULL);
	free(id1);
	free(name);
}

static void
test_controller_embedded(void **state)
{
	(void)state;
	run_controller(1);
}

static void
test_controller_rest(void **state)
{
	(void)state;
	run_controller(2);
	close_all();
	open_all(1);
}

/* Sequential reconciles through the REST client too. */
static void
test_rest_pause_resume(void **state)
{
	(void)state;
	close_all();
	open_all(2);
	test_pause_resume(state);
	test_idempotent(state);
	close_all();
	open_all(1);
}

/* Warm-pool resume and roll through the REST client. */
static void
test_rest_warm_pool(void **state)
{
	close_all();
	open_all(2);
	test_warm_pool_resume(state);
	test_warm_pool_roll(state);
	close_all();
	open_all(1);
}

/* A token extension through the REST client (the Secret updated in place). */
static void
test_rest_token_extended(void **state)
{
	close_all();
	open_all(2);
	test_token_extended(state);
	close_all();
	open_all(1);
}

/* Whether name is one of the comma-separated list. */
static int
name_listed(const char *list, const char *name)
{
	size_t n = strlen(name);
	const char *p;

	for (p = list; (p = strstr(p, name)) != NULL; p += n)
		if ((p == list || p[-1] == ',') && (p[n] == ',' ||
		    p[n] == '\0'))
			return 1;
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_queue),
		cmocka_unit_test(test_queue_ring),
		cmocka_unit_test(test_queue_delays),
		cmocka_unit_test(test_queue_wakeups),
		cmocka_unit_test(test_queue_rate_limited),
		cmocka_unit_test(test_new_pending),
		cmocka_unit_test(test_provisioning_children),
		cmocka_unit_test(test_token_default_budgets),
		cmocka_unit_test(test_idempotent),
		cmocka_unit_test(test_netpol_omitempty),
		cmocka_unit_test(test_rerun_race),
		cmocka_unit_test(test_active_needs_current_generation),
		cmocka_unit_test(test_active_not_on_replaced_generation),
		cmocka_unit_test(test_pause_resume),
		cmocka_unit_test(test_pausing_until_stopped),
		cmocka_unit_test(test_resume_index_lost),
		cmocka_unit_test(test_resume_before_stopped),
		cmocka_unit_test(test_sandbox_write_order),
		cmocka_unit_test(test_rest_sandbox_write_order),
		cmocka_unit_test(test_kube_sandbox_write_order),
		cmocka_unit_test(test_resume_sandbox_write_fails),
		cmocka_unit_test(test_warm_pool_write_order),
		cmocka_unit_test(test_annotations_keep_phase),
		cmocka_unit_test(test_token_replaced_revoked),
		cmocka_unit_test(test_token_of_other_task),
		cmocka_unit_test(test_token_extended),
		cmocka_unit_test(test_token_extended_lost),
		cmocka_unit_test(test_pod_failed),
		cmocka_unit_test(test_rerun_after_pod_failed),
		cmocka_unit_test(test_reconciler_error),
		cmocka_unit_test(test_timeout),
		cmocka_unit_test(test_open_period_counted_once),
		cmocka_unit_test(test_timeout_pausing),
		cmocka_unit_test(test_timeout_requeue),
		cmocka_unit_test(test_completed),
		cmocka_unit_test(test_meter_429),
		cmocka_unit_test(test_meter_pause_two_writes),
		cmocka_unit_test(test_resume_after_meter_pause),
		cmocka_unit_test(test_conflict),
		cmocka_unit_test(test_foreign_token_secret),
		cmocka_unit_test(test_foreign_labelled),
		cmocka_unit_test(test_foreign_environment),
		cmocka_unit_test(test_foreign_owner_kind),
		cmocka_unit_test_teardown(test_warm_pool_other_sandbox,
		    warm_off),
		cmocka_unit_test(test_long_name),
		cmocka_unit_test(test_sandbox_long_message),
		cmocka_unit_test(test_no_preview),
		cmocka_unit_test(test_preview_disabled_later),
		cmocka_unit_test(test_preview_url_moved),
		cmocka_unit_test(test_created_suspended),
		cmocka_unit_test(test_warm_pool),
		cmocka_unit_test(test_warm_pool_pause),
		cmocka_unit_test_teardown(test_warm_pool_resume, warm_off),
		cmocka_unit_test_teardown(test_warm_pool_roll, warm_off),
		cmocka_unit_test_teardown(test_warm_pool_unbound_sandbox,
		    warm_off),
		cmocka_unit_test_teardown(test_warm_pool_pause_unbound,
		    warm_off),
		cmocka_unit_test(test_pr_closed),
		cmocka_unit_test(test_paused_then_finished),
		cmocka_unit_test(test_netpol_disabled),
		cmocka_unit_test(test_netpol_apiserver),
		cmocka_unit_test(test_crash_recovery),
		cmocka_unit_test(test_token_extended_crash),
		cmocka_unit_test(test_token_unsettled_not_extended),
		cmocka_unit_test_teardown(test_warm_pool_resume_crash,
		    warm_off),
		cmocka_unit_test(test_rest_pause_resume),
		cmocka_unit_test(test_rest_token_extended),
		cmocka_unit_test_teardown(test_rest_warm_pool, warm_off),
		cmocka_unit_test_teardown(test_controller_embedded,
		    stop_running),
		cmocka_unit_test_teardown(test_controller_rest, stop_running),
		cmocka_unit_test(test_status_conflict),
		cmocka_unit_test(test_watch_relist),
		cmocka_unit_test(test_notifier_relist_drops_gone),
		cmocka_unit_test_teardown(test_stop_during_watch_backoff,
		    stop_running),
		cmocka_unit_test_teardown(test_watch_resume_newest,
		    stop_running),
		cmocka_unit_test(test_dump),
		cmocka_unit_test(test_foreign_token_secret_late),
		cmocka_unit_test(test_foreign_token_secret_end),
		cmocka_unit_test_teardown(test_stalled_task_fails, unlimit),
		cmocka_unit_test_teardown(test_stalled_suspended, unlimit),
		cmocka_unit_test_teardown(test_stalled_token_index, unlimit),
		cmocka_unit_test_teardown(test_stalled_finished, no_ttl),
		cmocka_unit_test_teardown(test_stalled_children, unlimit),
		cmocka_unit_test_teardown(test_stalled_environment, unlimit),
		cmocka_unit_test_teardown(test_stalled_warm_pool,
		    warm_unlimit),
		cmocka_unit_test_teardown(test_status_refused, unlimit),
		cmocka_unit_test_teardown(test_status_refused_gauge, unlimit),
		cmocka_unit_test_teardown(test_status_refused_deleted, unlimit),
		cmocka_unit_test_teardown(test_ttl_after_finished, no_ttl),
		cmocka_unit_test_teardown(test_queue_admission, unlimit),
		cmocka_unit_test_teardown(test_queue_age, unlimit),
		cmocka_unit_test_teardown(test_queue_stale_read, unlimit),
		cmocka_unit_test_teardown(test_queue_timeout_rerun, unlimit),
		cmocka_unit_test_teardown(test_queue_race, unlimit),
		cmocka_unit_test_teardown(test_queue_admitted_counts, unlimit),
		cmocka_unit_test_teardown(test_queue_failed_write_keeps_slot,
		    unlimit),
		cmocka_unit_test_teardown(test_queue_no_list, unlimit),
		cmocka_unit_test_teardown(test_queue_assumed_until_seen,
		    unlimit),
		cmocka_unit_test_teardown(test_queue_crash_admitted, unlimit),
		cmocka_unit_test_teardown(test_queue_controller, unlimit),
		cmocka_unit_test_teardown(test_queue_waiting_deleted, unlimit),
		cmocka_unit_test_teardown(test_slots_after_relist, unlimit),
		cmocka_unit_test_teardown(test_resync_skips_settled, unlimit),
		cmocka_unit_test_teardown(test_stalled_gauge, unlimit),
		cmocka_unit_test_teardown(test_ttl_by_resync, no_ttl),
		cmocka_unit_test_teardown(test_slots_stale_observations,
		    unlimit),
		cmocka_unit_test_teardown(test_slots_cache_rules, unlimit),
		cmocka_unit_test_teardown(test_queue_first_list_fails, unlimit),
		cmocka_unit_test_teardown(test_queue_cache_behind, unlimit),
		cmocka_unit_test_teardown(test_controller_backoff, unlimit),
		cmocka_unit_test_teardown(test_controller_grace, unlimit),
		cmocka_unit_test_teardown(test_watch_backoff_reset, unlimit),
		cmocka_unit_test_teardown(test_watch_broken_backoff, unlimit),
		cmocka_unit_test(test_notifier_broken_backoff),
		cmocka_unit_test_teardown(test_resync_default, unlimit),
		cmocka_unit_test_teardown(test_status_refused_resync, unlimit),
	};

	struct CMUnitTest run[sizeof(tests) / sizeof(tests[0])];
	const char *skip = getenv("TEST_SKIP");
	size_t i, n = 0;

	if (getenv("TEST_FILTER") != NULL)
		cmocka_set_test_filter(getenv("TEST_FILTER"));
	/* TEST_SKIP: a comma-separated list of test names not to run */
	for (i = 0; i < sizeof(tests) / sizeof(tests[0]); i++)
		if (skip == NULL || !name_listed(skip, tests[i].name))
			run[n++] = tests[i];
	return _cmocka_run_group_tests("reconciler", run, n, setup,
	    teardown);
}
