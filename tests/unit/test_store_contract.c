/*
 * The resource store contract (DESIGN section 10), one suite run three
 * ways with the same assertions (STORE_MODE):
 *   1 the embedded backend, in process;
 *   2 the REST client against the embedded store served over HTTP;
 *   3 the REST client against the independent fake kube-apiserver of
 *     tests/fakes (TLS with a test CA, bearer token).
 * Every backend keeps at most 50 watch events of history here, so the 410
 * case is reachable in all three.
 */
#include "config.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "k8s/k8s.h"
#include "meter/meter.h"
#include "storeenv.h"
#include "testutil.h"

#define HISTORY 50

static struct storeenv env;
static struct k8s_api *api;
static int counter;

static int
setup(void **state)
{
	(void)state;
	util_json_init();
	log_setup(LOG_ERROR, 0);
	if (storeenv_open(&env, STORE_MODE, HISTORY) < 0)
		return -1;
	api = env.api;
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	storeenv_close(&env);
	return 0;
}

/* ---- helpers ---- */

static char *
uniq(const char *prefix)
{
	return xasprintf("%s-%d-%d", prefix, (int)getpid() % 1000, ++counter);
}

static json_t *
task(const char *name, const char *objective)
{
	return json_pack("{s:s,s:s,s:{s:s,s:{s:s}},s:{s:s,s:i,s:s}}",
	    "apiVersion", "divergedev.com/v1alpha1", "kind", "AgentTask",
	    "metadata", "name", name, "labels", "team", "a",
	    "spec", "objective", objective, "maxIterations", 3,
	    "budgetUSD", "5.00");
}

static json_t *
create_task(const char *ns, const char *name)
{
	json_t *in = task(name, "fix it"), *out = NULL;
	struct k8s_status st = { 0 };

	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, ns, in, &out, &st),
	    0);
	json_decref(in);
	return out;
}

static const char *
spec_str(const json_t *o, const char *k)
{
	return json_string_value(json_object_get(json_object_get(o, "spec"),
	    k));
}

/* ---- cases ---- */

static void
create_get(void **state)
{
	char *name = uniq("t");
	json_t *obj = create_task("default", name), *got = NULL, *again;
	struct k8s_status st = { 0 };

	assert_non_null(k8s_meta_str(obj, "uid"));
	assert_non_null(k8s_meta_str(obj, "creationTimestamp"));
	assert_true(k8s_resource_version(obj) > 0);
	assert_int_equal(k8s_meta_int(obj, "generation"), 1);
	assert_string_equal(k8s_meta_str(obj, "namespace"), "default");
	assert_string_equal(json_string_value(json_object_get(obj, "kind")),
	    "AgentTask");
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &got,
	    &st), 0);
	assert_string_equal(k8s_meta_str(got, "uid"), k8s_meta_str(obj,
	    "uid"));
	assert_string_equal(spec_str(got, "objective"), "fix it");
	/* a second create: 409 AlreadyExists */
	again = task(name, "again");
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", again,
	    NULL, &st), K8S_EEXISTS);
	assert_string_equal(st.reason, "AlreadyExists");
	assert_int_equal(st.code, 409);
	assert_non_null(strstr(st.message, "already exists"));
	k8s_status_release(&st);
	/* the same name in another namespace is another object */
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "other", again, NULL,
	    &st), 0);
	json_decref(again);
	json_decref(obj);
	json_decref(got);
	free(name);
}

static void
not_found(void **state)
{
	struct k8s_status st = { 0 };
	json_t *out = NULL, *empty = json_object();

	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", "nope-x",
	    &out, &st), K8S_ENOTFOUND);
	assert_int_equal(st.code, 404);
	assert_string_equal(st.reason, "NotFound");
	assert_string_equal(st.message,
	    "agenttasks.divergedev.com \"nope-x\" not found");
	k8s_status_release(&st);
	assert_int_equal(k8s_delete(api, &K8S_AGENTTASK, "default", "nope-x",
	    NULL, &st), K8S_ENOTFOUND);
	k8s_status_release(&st);
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", "nope-x", 0,
	    empty, NULL, &st), K8S_ENOTFOUND);
	k8s_status_release(&st);
	json_decref(empty);
}

static void
update_conflicts(void **state)
{
	char *name = uniq("u");
	json_t *obj = create_task("default", name), *v1, *v2 = NULL, *stale;
	struct k8s_status st = { 0 };
	const char *rv1 = k8s_meta_str(obj, "resourceVersion");

	/* spec change: new rv, generation + 1 */
	v1 = json_deep_copy(obj);
	json_object_set_new(json_object_get(v1, "spec"), "objective",
	    json_string("fix it better"));
	assert_int_equal(k8s_update(api, &K8S_AGENTTASK, "default", name, v1,
	    &v2, &st), 0);
	assert_int_equal(k8s_meta_int(v2, "generation"), 2);
	assert_string_not_equal(k8s_meta_str(v2, "resourceVersion"), rv1);
	assert_string_equal(spec_str(v2, "objective"), "fix it better");
	/* the same stale version again: 409 Conflict */
	stale = json_deep_copy(v1);
	json_object_set_new(json_object_get(stale, "spec"), "objective",
	    json_string("stale"));
	assert_int_equal(k8s_update(api, &K8S_AGENTTASK, "default", name,
	    stale, NULL, &st), K8S_ECONFLICT);
	assert_string_equal(st.reason, "Conflict");
	assert_non_null(strstr(st.message, "the object has been modified"));
	k8s_status_release(&st);
	/* no resourceVersion: 422 */
	json_object_del(json_object_get(stale, "metadata"), "resourceVersion");
	assert_int_equal(k8s_update(api, &K8S_AGENTTASK, "default", name,
	    stale, NULL, &st), K8S_EINVALID);
	k8s_status_release(&st);
	/* a metadata-only change keeps the generation */
	json_decref(v1);
	v1 = json_deep_copy(v2);
	json_decref(v2);
	v2 = NULL;
	json_object_set_new(json_object_get(json_object_get(v1, "metadata"),
	    "labels"), "team", json_string("b"));
	assert_int_equal(k8s_update(api, &K8S_AGENTTASK, "default", name, v1,
	    &v2, &st), 0);
	assert_int_equal(k8s_meta_int(v2, "generation"), 2);
	json_decref(obj);
	json_decref(v1);
	json_decref(v2);
	json_decref(stale);
	free(name);
}

/*
 * A PUT without metadata.resourceVersion, of the object or its /status:
 * 422 for a custom resource (CRDs allow no unconditional update), applied
 * for a built-in kind such as a Secret.
 */
static void
unconditional_update(void **state)
{
	char *name = uniq("uu"), *want;
	json_t *obj = create_task("default", name), *in, *out = NULL, *s;
	struct k8s_status st = { 0 };
	int status;

	(void)state;
	want = xasprintf("agenttasks.divergedev.com \"%s\" is invalid: "
	    "metadata.resourceVersion: Invalid value: 0x0: must be specified "
	    "for an update", name);
	in = json_deep_copy(obj);
	json_object_del(json_object_get(in, "metadata"), "resourceVersion");
	json_object_set_new(in, "status", json_pack("{s:s}", "phase",
	    "Active"));
	for (status = 1; status >= 0; status--) {
		assert_int_equal(status ? k8s_update_status(api, &K8S_AGENTTASK,
		    "default", name, in, NULL, &st) : k8s_update(api,
		    &K8S_AGENTTASK, "default", name, in, NULL, &st),
		    K8S_EINVALID);
		assert_int_equal(st.code, 422);
		assert_string_equal(st.message, want);
		k8s_status_release(&st);
	}
	s = json_pack("{s:s,s:s,s:{s:s},s:{s:s}}", "apiVersion", "v1", "kind",
	    "Secret", "metadata", "name", name, "data", "k", "eHl6");
	assert_int_equal(k8s_create(api, &K8S_SECRET, "default", s, NULL, &st),
	    0);
	json_object_set_new(json_object_get(s, "data"), "k",
	    json_string("YWJj"));
	assert_int_equal(k8s_update(api, &K8S_SECRET, "default", name, s, &out,
	    &st), 0);
	assert_string_equal(json_string_value(json_object_get(json_object_get(
	    out, "data"), "k")), "YWJj");
	json_decref(out);
	json_decref(s);
	json_decref(in);
	json_decref(obj);
	free(want);
	free(name);
}

static void
status_subresource(void **state)
{
	char *name = uniq("s");
	json_t *obj = create_task("default", name), *in, *out = NULL;
	struct k8s_status st = { 0 };

	/* /status takes only .status */
	in = json_deep_copy(obj);
	json_object_set_new(in, "status", json_pack("{s:s,s:i}", "phase",
	    "Active", "iteration", 2));
	json_object_set_new(json_object_get(in, "spec"), "objective",
	    json_string("ignored"));
	assert_int_equal(k8s_update_status(api, &K8S_AGENTTASK, "default",
	    name, in, &out, &st), 0);
	assert_string_equal(json_string_value(json_object_get(
	    json_object_get(out, "status"), "phase")), "Active");
	assert_string_equal(spec_str(out, "objective"), "fix it");
	assert_int_equal(k8s_meta_int(out, "generation"), 1);
	json_decref(in);
	/* the main resource ignores .status */
	in = json_deep_copy(out);
	json_decref(out);
	out = NULL;
	json_object_set_new(json_object_get(in, "status"), "phase",
	    json_string("Failed"));
	json_object_set_new(json_object_get(in, "spec"), "suspended",
	    json_true());
	assert_int_equal(k8s_update(api, &K8S_AGENTTASK, "default", name, in,
	    &out, &st), 0);
	assert_string_equal(json_string_value(json_object_get(
	    json_object_get(out, "status"), "phase")), "Active");
	assert_true(json_is_true(json_object_get(json_object_get(out, "spec"),
	    "suspended")));
	json_decref(in);
	json_decref(out);
	/* merge patch on status */
	out = NULL;
	in = json_pack("{s:{s:i},s:{s:s}}", "status", "iteration", 5, "spec",
	    "objective", "ignored again");
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", name, 1,
	    in, &out, &st), 0);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(
	    out, "status"), "iteration")), 5);
	assert_string_equal(json_string_value(json_object_get(
	    json_object_get(out, "status"), "phase")), "Active");
	assert_string_equal(spec_str(out, "objective"), "fix it");
	json_decref(in);
	json_decref(out);
	json_decref(obj);
	free(name);
}

static void
merge_patch(void **state)
{
	char *name = uniq("p");
	json_t *obj = create_task("default", name), *patch, *out = NULL;
	struct k8s_status st = { 0 };

	patch = json_pack("{s:{s:s,s:n,s:[s]},s:{s:{s:s}}}", "spec",
	    "objective", "patched", "budgetUSD", "capabilities", "claude-*",
	    "metadata", "annotations", "divergedev.com/guidance", "go");
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", name, 0,
	    patch, &out, &st), 0);
	assert_string_equal(spec_str(out, "objective"), "patched");
	assert_null(json_object_get(json_object_get(out, "spec"),
	    "budgetUSD"));
	assert_int_equal(json_integer_value(json_object_get(json_object_get(
	    out, "spec"), "maxIterations")), 3);
	assert_int_equal(json_array_size(json_object_get(json_object_get(out,
	    "spec"), "capabilities")), 1);
	assert_string_equal(json_string_value(json_object_get(json_object_get(
	    json_object_get(out, "metadata"), "annotations"),
	    "divergedev.com/guidance")), "go");
	assert_int_equal(k8s_meta_int(out, "generation"), 2);
	json_decref(patch);
	/* arrays are replaced whole */
	json_decref(out);
	out = NULL;
	patch = json_pack("{s:{s:[s,s]}}", "spec", "capabilities", "a", "b");
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", name, 0,
	    patch, &out, &st), 0);
	assert_int_equal(json_array_size(json_object_get(json_object_get(out,
	    "spec"), "capabilities")), 2);
	json_decref(patch);
	/* a resourceVersion in the patch makes it conditional */
	patch = json_pack("{s:{s:s},s:{s:b}}", "metadata", "resourceVersion",
	    k8s_meta_str(obj, "resourceVersion"), "spec", "suspended", 1);
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", name, 0,
	    patch, NULL, &st), K8S_ECONFLICT);
	k8s_status_release(&st);
	json_decref(patch);
	patch = json_pack("{s:{s:s},s:{s:b}}", "metadata", "resourceVersion",
	    k8s_meta_str(out, "resourceVersion"), "spec", "suspended", 1);
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", name, 0,
	    patch, NULL, &st), 0);
	json_decref(patch);
	json_decref(out);
	json_decref(obj);
	free(name);
}

static void
validation(void **state)
{
	struct k8s_status st = { 0 };
	json_t *bad = json_pack("{s:s,s:s,s:{s:s},s:{s:i}}", "apiVersion",
	    "divergedev.com/v1alpha1", "kind", "AgentTask", "metadata", "name",
	    "invalid-1", "spec", "maxIterations", 3);

	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", bad, NULL,
	    &st), K8S_EINVALID);
	assert_int_equal(st.code, 422);
	assert_non_null(strstr(st.message, "spec.objective"));
	k8s_status_release(&st);
	json_object_set_new(json_object_get(bad, "spec"), "objective",
	    json_string("x"));
	json_object_set_new(json_object_get(bad, "spec"), "maxIterations",
	    json_integer(-1));
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", bad, NULL,
	    &st), K8S_EINVALID);
	assert_non_null(strstr(st.message, "spec.maxIterations"));
	k8s_status_release(&st);
	json_object_set_new(json_object_get(bad, "spec"), "maxIterations",
	    json_integer(1));
	json_object_set_new(json_object_get(bad, "spec"), "budgetUSD",
	    json_string("five"));
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", bad, NULL,
	    &st), K8S_EINVALID);
	assert_non_null(strstr(st.message, "spec.budgetUSD"));
	k8s_status_release(&st);
	json_decref(bad);
}

/*
 * The bounds of the divergedev.com kinds are the same on every backend:
 * the embedded store's checks and the CRDs an API server enforces (the
 * fake validates with deploy/crds). Each value at its bound is taken,
 * one past it refused with a 422 naming the field.
 */
struct schema_limit {
	int env;		/* an Environment, else an AgentTask */
	const char *path;	/* dotted, from the object's root */
	char type;		/* 'i' integer, 's' string, 'a' list of strings */
	int64_t at;		/* the largest value, length or item count */
};

/* A JSON value just at (over 0) or one past (over 1) limit l. */
static json_t *
limit_value(const struct schema_limit *l, int over)
{
	int64_t n = l->at + over, i;
	json_t *a;
	char *str;

	if (l->type == 'i')
		return json_integer(n);
	if (l->type == 'a') {
		a = json_array();
		for (i = 0; i < n; i++)
			json_array_append_new(a, json_string("m"));
		return a;
	}
	str = xmalloc((size_t)n + 1);
	memset(str, 'x', (size_t)n);
	str[n] = '\0';
	a = json_string(str);
	free(str);
	return a;
}

/* Set obj's dotted path to v (taken), making the objects on the way. */
static void
set_path(json_t *obj, const char *path, json_t *v)
{
	char *p = xstrdup(path), *dot, *k = p;

	while ((dot = strchr(k, '.')) != NULL) {
		*dot = '\0';
		if (json_object_get(obj, k) == NULL)
			json_object_set_new(obj, k, json_object());
		obj = json_object_get(obj, k);
		k = dot + 1;
	}
	json_object_set_new(obj, k, v);
	free(p);
}

/* Write the object of limit l with its value at or past the bound. */
static int
write_limit(const struct schema_limit *l, int over, struct k8s_status *st)
{
	char *name = uniq("limit");
	json_t *obj, *out = NULL;
	int rc;

	if (l->env)
		obj = json_pack("{s:s,s:s,s:{s:s},s:{s:s}}", "apiVersion",
		    "divergedev.com/v1alpha1", "kind", "Environment",
		    "metadata", "name", name, "spec", "branch", "main");
	else
		obj = task(name, "fix it");
	if (strncmp(l->path, "status.", 7) != 0) {
		set_path(obj, l->path, limit_value(l, over));
		rc = k8s_create(api, l->env ? &K8S_ENVIRONMENT :
		    &K8S_AGENTTASK, "default", obj, NULL, st);
	} else {
		assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default",
		    obj, &out, st), 0);
		set_path(out, "status.phase", json_string("Pending"));
		set_path(out, l->path, limit_value(l, over));
		rc = k8s_update_status(api, &K8S_AGENTTASK, "default", name,
		    out, NULL, st);
		json_decref(out);
	}
	json_decref(obj);
	free(name);
	return rc;
}

static void
schema_limits(void **state)
{
	static const struct schema_limit limits[] = {
		{ 0, "spec.objective", 's', 4000 },
		{ 0, "spec.maxIterations", 'i', 1000000 },
		{ 0, "spec.budgetTokens", 'i', INT64_C(1000000000000) },
		{ 0, "spec.repository.url", 's', 2048 },
		{ 0, "spec.repository.baseBranch", 's', 255 },
		{ 0, "spec.repository.workingBranch", 's', 255 },
		{ 0, "spec.capabilities", 'a', 256 },
		{ 0, "spec.allowedTools", 'a', 256 },
		{ 0, "spec.sandbox.timeoutSeconds", 'i', 30 * 86400 },
		{ 0, "spec.sandbox.image", 's', 1024 },
		{ 0, "spec.sandbox.runtimeClassName", 's', 253 },
		{ 0, "status.reason", 's', 256 },
		{ 0, "status.message", 's', 32768 },
		{ 0, "status.lastMeterRequestIds", 'a', 32 },
		{ 1, "spec.branch", 's', 255 },
		{ 1, "spec.service", 's', 253 },
		{ 1, "spec.image", 's', 1024 },
		{ 1, "spec.port", 'i', 65535 },
		{ 1, "spec.repository", 's', 2048 },
	};
	struct k8s_status st = { 0 };
	size_t i;
	int rc;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(limits); i++) {
		rc = write_limit(&limits[i], 0, &st);
		if (rc != 0)
			fail_msg("%s at %lld: %d %s", limits[i].path,
			    (long long)limits[i].at, rc, st.message);
		k8s_status_release(&st);
		rc = write_limit(&limits[i], 1, &st);
		if (rc != K8S_EINVALID || st.code != 422 || st.message == NULL ||
		    strstr(st.message, limits[i].path) == NULL)
			fail_msg("%s past %lld: %d %d %s", limits[i].path,
			    (long long)limits[i].at, rc, st.code,
			    st.message ? st.message : "");
		k8s_status_release(&st);
	}
}

/*
 * Label keys and values, and annotation keys, are validated as the
 * apiserver's ObjectMeta validation does (a value a selector cannot
 * name is a 422, not a label nobody can select on).
 */
static void
label_validation(void **state)
{
	static const char *const bad[][3] = {
		{ "labels", "team", "b c" },
		{ "labels", "team", "-x" },
		{ "labels", "team",
		  "0123456789012345678901234567890123456789012345678901234567890123" },
		{ "labels", "a b", "x" },
		{ "labels", "Bad_Prefix/x", "x" },
		{ "labels", "a/b/c", "x" },
		{ "labels", "example.com/", "x" },
		{ "annotations", "not ok", "anything goes here" },
	};
	struct k8s_status st = { 0 };
	json_t *t, *out = NULL;
	char *name;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		name = uniq("lv");
		t = task(name, "x");
		json_object_set_new(json_object_get(t, "metadata"), bad[i][0],
		    json_pack("{s:s}", bad[i][1], bad[i][2]));
		assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", t,
		    NULL, &st), K8S_EINVALID);
		assert_int_equal(st.code, 422);
		assert_non_null(strstr(st.message, bad[i][0]));
		k8s_status_release(&st);
		json_decref(t);
		free(name);
	}
	/* what is fine: a prefixed key, an empty value, any annotation */
	name = uniq("lv");
	t = task(name, "x");
	json_object_set_new(json_object_get(t, "metadata"), "labels",
	    json_pack("{s:s,s:s,s:s}", "divergedev.com/repo", "a1_b.c-D",
	    "empty", "", "team", "a"));
	json_object_set_new(json_object_get(t, "metadata"), "annotations",
	    json_pack("{s:s}", "example.com/note", "any text, even / and :"));
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", t, &out,
	    &st), 0);
	json_decref(out);
	json_decref(t);
	free(name);
}

static int
count_items(const char *ns, const char *sel)
{
	struct k8s_list_opts o = { sel, NULL, NULL };
	struct k8s_status st = { 0 };
	json_t *l = NULL;
	int n;

	if (k8s_list(api, &K8S_SECRET, ns, &o, &l, &st) < 0) {
		k8s_status_release(&st);
		return -1;
	}
	assert_string_equal(json_string_value(json_object_get(l, "kind")),
	    "SecretList");
	assert_non_null(k8s_meta_str(l, "resourceVersion"));
	n = (int)json_array_size(json_object_get(l, "items"));
	json_decref(l);
	return n;
}

static void
list_selectors(void **state)
{
	char *ns = uniq("sel");
	static const char *const envs[] = { "prod", "dev", "test", NULL };
	struct k8s_status st = { 0 };
	int i;

	for (i = 0; i < 4; i++) {
		char *n = xasprintf("sec-%d", i);
		json_t *s = json_pack("{s:s,s:s,s:{s:s,s:{}},s:{s:s}}",
		    "apiVersion", "v1", "kind", "Secret", "metadata", "name",
		    n, "labels", "data", "k", "dmFsdWU=");

		if (envs[i] != NULL)
			json_object_set_new(json_object_get(json_object_get(s,
			    "metadata"), "labels"), "env",
			    json_string(envs[i]));
		assert_int_equal(k8s_create(api, &K8S_SECRET, ns, s, NULL,
		    &st), 0);
		json_decref(s);
		free(n);
	}
	assert_int_equal(count_items(ns, NULL), 4);
	assert_int_equal(count_items(ns, "env=prod"), 1);
	assert_int_equal(count_items(ns, "env==dev"), 1);
	assert_int_equal(count_items(ns, "env!=prod"), 3);	/* no env too */
	assert_int_equal(count_items(ns, "env in (prod,dev)"), 2);
	assert_int_equal(count_items(ns, "env notin (prod)"), 3);
	assert_int_equal(count_items(ns, "env"), 3);
	assert_int_equal(count_items(ns, "!env"), 1);
	assert_int_equal(count_items(ns, "env,env!=test"), 2);
	assert_int_equal(count_items(ns, "env in (prod"), -1);
	/* all namespaces see at least these */
	assert_true(count_items(NULL, "env=prod") >= 1);
	free(ns);
}

/* Poll a get until the object is gone (a real cluster's GC takes a while). */
static int
wait_gone_in(const struct k8s_resource *r, const char *ns, const char *name)
{
	struct k8s_status st = { 0 };
	json_t *g = NULL;
	int i, rc = 0;

	for (i = 0; i < 50; i++) {
		rc = k8s_get(api, r, ns, name, &g, &st);
		k8s_status_release(&st);
		if (rc == K8S_ENOTFOUND)
			break;
		json_decref(g);
		g = NULL;
		sleep_ms(20);
	}
	return rc;
}

static int
wait_gone(const struct k8s_resource *r, const char *name)
{
	return wait_gone_in(r, "default", name);
}

static void
delete_cascade(void **state)
{
	char *name = uniq("c");
	json_t *owner = create_task("default", name), *child, *out = NULL;
	struct k8s_status st = { 0 };
	char *cname = xasprintf("%s-token", name);

	child = json_pack("{s:s,s:s,s:{s:s,s:[{s:s,s:s,s:s,s:s,s:b}]},"
	    "s:{s:s}}", "apiVersion", "v1", "kind", "Secret", "metadata",
	    "name", cname, "ownerReferences", "apiVersion",
	    "divergedev.com/v1alpha1", "kind", "AgentTask", "name", name, "uid",
	    k8s_meta_str(owner, "uid"), "controller", 1, "data", "token",
	    "eHl6");
	assert_int_equal(k8s_create(api, &K8S_SECRET, "default", child, NULL,
	    &st), 0);
	assert_int_equal(k8s_delete(api, &K8S_AGENTTASK, "default", name, &out,
	    &st), 0);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, NULL,
	    &st), K8S_ENOTFOUND);
	k8s_status_release(&st);
	/* the dependent goes too (eventually, on a real cluster's GC) */
	assert_int_equal(wait_gone(&K8S_SECRET, cname), K8S_ENOTFOUND);
	json_decref(out);
	json_decref(child);
	json_decref(owner);
	free(cname);
	free(name);
}

/*
 * DeleteOptions.preconditions: a stale resourceVersion or another uid is
 * a 409 with the apiserver's message, and nothing is deleted; the current
 * ones delete it. A missing object is a 404 whatever they say.
 */
static void
delete_preconditions(void **state)
{
	char *name = uniq("pre");
	json_t *t = create_task("default", name), *out = NULL, *p;
	struct k8s_status st = { 0 };
	const char *uid = k8s_meta_str(t, "uid");
	char *rv = xstrdup(k8s_meta_str(t, "resourceVersion"));

	(void)state;
	p = json_pack("{s:{s:{s:s}}}", "metadata", "labels", "x", "y");
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", name, 0, p,
	    NULL, &st), 0);
	json_decref(p);
	assert_int_equal(k8s_delete_if(api, &K8S_AGENTTASK, "default", name,
	    K8S_PROPAGATE_DEFAULT, uid, rv, NULL, &st), K8S_ECONFLICT);
	assert_non_null(strstr(st.message, "Precondition failed: "
	    "ResourceVersion in precondition: "));
	k8s_status_release(&st);
	assert_int_equal(k8s_delete_if(api, &K8S_AGENTTASK, "default", name,
	    K8S_PROPAGATE_DEFAULT, "0b5c53ef-6d7b-4b6e-9f7c-2a1f3c4d5e6f",
	    NULL, NULL, &st), K8S_ECONFLICT);
	assert_non_null(strstr(st.message, "Precondition failed: UID in "
	    "precondition: 0b5c53ef-6d7b-4b6e-9f7c-2a1f3c4d5e6f, UID in "
	    "object meta: "));
	k8s_status_release(&st);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &out,
	    &st), 0);
	free(rv);
	rv = xstrdup(k8s_meta_str(out, "resourceVersion"));
	json_decref(out);
	out = NULL;
	assert_int_equal(k8s_delete_if(api, &K8S_AGENTTASK, "default", name,
	    K8S_PROPAGATE_DEFAULT, uid, rv, NULL, &st), 0);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, NULL,
	    &st), K8S_ENOTFOUND);
	k8s_status_release(&st);
	assert_int_equal(k8s_delete_if(api, &K8S_AGENTTASK, "default", name,
	    K8S_PROPAGATE_DEFAULT, uid, rv, NULL, &st), K8S_ENOTFOUND);
	k8s_status_release(&st);
	json_decref(t);
	free(rv);
	free(name);
}

/*
 * A dependent written after its owner is gone (a reconcile that raced with
 * the deletion): the create succeeds, as on a real cluster, and the
 * garbage collector removes it; one whose owner lives stays.
 */
static void
dangling_owner(void **state)
{
	char *name = uniq("d"), *orphan = xasprintf("%s-orphan", name);
	char *kept = xasprintf("%s-kept", name);
	json_t *owner = create_task("default", name), *child, *g = NULL;
	struct k8s_status st = { 0 };

	(void)state;
	child = json_pack("{s:s,s:s,s:{s:s,s:[{s:s,s:s,s:s,s:s,s:b}]},"
	    "s:{s:s}}", "apiVersion", "v1", "kind", "Secret", "metadata",
	    "name", orphan, "ownerReferences", "apiVersion",
	    "divergedev.com/v1alpha1", "kind", "AgentTask", "name", "gone",
	    "uid", "00000000-0000-4000-8000-000000000000", "controller", 1,
	    "data", "token", "eHl6");
	assert_int_equal(k8s_create(api, &K8S_SECRET, "default", child, NULL,
	    &st), 0);
	json_decref(child);
	child = json_pack("{s:s,s:s,s:{s:s,s:[{s:s,s:s,s:s,s:s,s:b}]},"
	    "s:{s:s}}", "apiVersion", "v1", "kind", "Secret", "metadata",
	    "name", kept, "ownerReferences", "apiVersion",
	    "divergedev.com/v1alpha1", "kind", "AgentTask", "name", name,
	    "uid", k8s_meta_str(owner, "uid"), "controller", 1, "data",
	    "token", "eHl6");
	assert_int_equal(k8s_create(api, &K8S_SECRET, "default", child, NULL,
	    &st), 0);
	json_decref(child);
	assert_int_equal(wait_gone(&K8S_SECRET, orphan), K8S_ENOTFOUND);
	assert_int_equal(k8s_get(api, &K8S_SECRET, "default", kept, &g, &st),
	    0);
	json_decref(g);
	assert_int_equal(k8s_delete(api, &K8S_AGENTTASK, "default", name, NULL,
	    &st), 0);
	json_decref(owner);
	free(kept);
	free(orphan);
	free(name);
}

/* An ownerReference to an AgentTask. */
static json_t *
task_ref(const json_t *owner)
{
	return json_pack("{s:s,s:s,s:s,s:s}", "apiVersion",
	    "divergedev.com/v1alpha1", "kind", "AgentTask", "name",
	    k8s_meta_str(owner, "name"), "uid", k8s_meta_str(owner, "uid"));
}

/* Set an object's ownerReferences (refs taken) with a merge patch. */
static void
set_owners(const struct k8s_resource *r, const char *ns, const char *name,
    json_t *refs)
{
	struct k8s_status st = { 0 };
	json_t *p = json_pack("{s:{s:o}}", "metadata", "ownerReferences",
	    refs);

	assert_int_equal(k8s_patch(api, r, ns, name, 0, p, NULL, &st), 0);
	json_decref(p);
}

/* A watch of r in ns from now (the list's resourceVersion). */
static struct k8s_watch *
watch_from_now(const struct k8s_resource *r, const char *ns,
    const char *label_selector)
{
	struct k8s_list_opts o = { label_selector, NULL, NULL };
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	json_t *l = NULL;

	assert_int_equal(k8s_list(api, r, ns, NULL, &l, &st), 0);
	o.resource_version = k8s_meta_str(l, "resourceVersion");
	assert_int_equal(k8s_watch(api, r, ns, &o, &w, &st), 0);
	json_decref(l);
	return w;
}

/*
 * The events of w until it is quiet for 500 ms (then freed), as an array
 * of {"type", "name", "object"}.
 */
static json_t *
drain(struct k8s_watch *w)
{
	struct k8s_status st = { 0 };
	struct k8s_event ev;
	json_t *evs = json_array();

	while (k8s_watch_next(w, 500, &ev, &st) == 1) {
		if (ev.type != K8S_BOOKMARK)
			json_array_append_new(evs, json_pack("{s:s,s:s,s:O}",
			    "type", k8s_event_type_name(ev.type), "name",
			    k8s_meta_str(ev.object, "name"), "object",
			    ev.object));
		json_decref(ev.object);
	}
	k8s_status_release(&st);
	k8s_watch_free(w);
	return evs;
}

/* How many events of evs have that type and name. */
static int
count_events(const json_t *evs, const char *type, const char *name)
{
	size_t i;
	json_t *e;
	int n = 0;

	json_array_foreach((json_t *)evs, i, e)
		n += strcmp(json_string_value(json_object_get(e, "type")),
		    type) == 0 && strcmp(json_string_value(json_object_get(e,
		    "name")), name) == 0;
	return n;
}

/*
 * Finalizers hold a deletion, as in the apiserver: DELETE of an object
 * with finalizers only sets metadata.deletionTimestamp (a MODIFIED
 * event, the object still readable and writable); the update that removes
 * the last finalizer removes it (one DELETED event), and its dependents
 * go then.
 */
static void
delete_finalizers(void **state)
{
	char *ns = uniq("fz"), *name = uniq("f");
	char *cname = xasprintf("%s-token", name);
	json_t *in = task(name, "fix it"), *owner = NULL, *out = NULL, *got;
	json_t *p, *evs, *child;
	struct k8s_status st = { 0 };
	struct k8s_watch *w;

	(void)state;
	json_object_set_new(json_object_get(in, "metadata"), "finalizers",
	    json_pack("[s]", "example.com/hold"));
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, ns, in, &owner, &st),
	    0);
	child = json_pack("{s:s,s:s,s:{s:s,s:[o]},s:{s:s}}", "apiVersion",
	    "v1", "kind", "Secret", "metadata", "name", cname,
	    "ownerReferences", task_ref(owner), "data", "token", "eHl6");
	assert_int_equal(k8s_create(api, &K8S_SECRET, ns, child, NULL, &st),
	    0);
	w = watch_from_now(&K8S_AGENTTASK, ns, NULL);
	assert_int_equal(k8s_delete(api, &K8S_AGENTTASK, ns, name, &out, &st),
	    0);
	json_decref(out);
	got = NULL;
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, ns, name, &got, &st), 0);
	assert_non_null(k8s_meta_str(got, "deletionTimestamp"));
	json_decref(got);
	/* a second DELETE changes nothing */
	out = NULL;
	assert_int_equal(k8s_delete(api, &K8S_AGENTTASK, ns, name, &out, &st),
	    0);
	json_decref(out);
	/* the owner is still there: so is its dependent */
	got = NULL;
	assert_int_equal(k8s_get(api, &K8S_SECRET, ns, cname, &got, &st), 0);
	json_decref(got);
	/* the last finalizer goes: so does the object */
	p = json_pack("{s:{s:n}}", "metadata", "finalizers");
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, ns, name, 0, p, NULL,
	    &st), 0);
	json_decref(p);
	assert_int_equal(wait_gone_in(&K8S_AGENTTASK, ns, name),
	    K8S_ENOTFOUND);
	assert_int_equal(wait_gone_in(&K8S_SECRET, ns, cname), K8S_ENOTFOUND);
	evs = drain(w);
	assert_int_equal(count_events(evs, "MODIFIED", name), 1);
	assert_int_equal(count_events(evs, "DELETED", name), 1);
	assert_int_equal(json_array_size(evs), 2);
	k8s_status_release(&st);
	json_decref(evs);
	json_decref(child);
	json_decref(owner);
	json_decref(in);
	free(cname);
	free(name);
	free(ns);
}

/*
 * Two objects that own each other: deleting one deletes both, each once,
 * one DELETED event each.
 */
static void
delete_cycle(void **state)
{
	char *ns = uniq("cy"), *a = uniq("ca"), *b = uniq("cb");
	json_t *oa = create_task(ns, a), *ob = create_task(ns, b), *evs;
	struct k8s_status st = { 0 };
	struct k8s_watch *w;

	(void)state;
	set_owners(&K8S_AGENTTASK, ns, b, json_pack("[o]", task_ref(oa)));
	set_owners(&K8S_AGENTTASK, ns, a, json_pack("[o]", task_ref(ob)));
	w = watch_from_now(&K8S_AGENTTASK, ns, NULL);
	assert_int_equal(k8s_delete(api, &K8S_AGENTTASK, ns, a, NULL, &st), 0);
	assert_int_equal(wait_gone_in(&K8S_AGENTTASK, ns, b), K8S_ENOTFOUND);
	evs = drain(w);
	assert_int_equal(count_events(evs, "DELETED", a), 1);
	assert_int_equal(count_events(evs, "DELETED", b), 1);
	assert_int_equal(json_array_size(evs), 2);
	json_decref(evs);
	json_decref(oa);
	json_decref(ob);
	free(ns);
	free(a);
	free(b);
}

/* A Secret in ns owned by the objects of refs (taken). */
static void
create_owned_secret(const char *ns, const char *name, json_t *refs)
{
	struct k8s_status st = { 0 };
	json_t *s = json_pack("{s:s,s:s,s:{s:s,s:o},s:{s:s}}", "apiVersion",
	    "v1", "kind", "Secret", "metadata", "name", name,
	    "ownerReferences", refs, "data", "k", "eHl6");

	assert_int_equal(k8s_create(api, &K8S_SECRET, ns, s, NULL, &st), 0);
	json_decref(s);
}

/*
 * The uids of a Secret's ownerReferences, joined by spaces, once they
 * number want (a real cluster's GC takes a while); NULL when it is gone.
 */
static char *
owner_uids(const char *ns, const char *name, size_t want)
{
	struct k8s_status st = { 0 };
	json_t *g = NULL, *refs, *o;
	char *uids = NULL;
	size_t i;
	int n;

	for (n = 0; n < 50; n++) {
		json_decref(g);
		g = NULL;
		if (k8s_get(api, &K8S_SECRET, ns, name, &g, &st) < 0) {
			k8s_status_release(&st);
			return NULL;
		}
		refs = json_object_get(json_object_get(g, "metadata"),
		    "ownerReferences");
		if (json_array_size(refs) == want)
			break;
		sleep_ms(20);
	}
	uids = xstrdup("");
	json_array_foreach(json_object_get(json_object_get(g, "metadata"),
	    "ownerReferences"), i, o) {
		char *next = xasprintf("%s%s%s", uids, i ? " " : "",
		    json_string_value(json_object_get(o, "uid")));

		free(uids);
		uids = next;
	}
	json_decref(g);
	return uids;
}

/*
 * propagationPolicy Orphan: the dependents stay, each without its
 * reference to the deleted owner (and with its other references).
 */
static void
delete_orphan(void **state)
{
	char *ns = uniq("or"), *o3 = uniq("o3"), *o4 = uniq("o4");
	json_t *t3 = create_task(ns, o3), *t4 = create_task(ns, o4);
	struct k8s_status st = { 0 };
	char *uids;

	(void)state;
	create_owned_secret(ns, "only", json_pack("[o]", task_ref(t3)));
	create_owned_secret(ns, "both", json_pack("[o,o]", task_ref(t3),
	    task_ref(t4)));
	assert_int_equal(k8s_delete_policy(api, &K8S_AGENTTASK, ns, o3,
	    K8S_PROPAGATE_ORPHAN, NULL, &st), 0);
	assert_int_equal(wait_gone_in(&K8S_AGENTTASK, ns, o3), K8S_ENOTFOUND);
	uids = owner_uids(ns, "only", 0);
	assert_non_null(uids);
	assert_string_equal(uids, "");
	free(uids);
	uids = owner_uids(ns, "both", 1);
	assert_non_null(uids);
	assert_string_equal(uids, k8s_meta_str(t4, "uid"));
	free(uids);
	json_decref(t3);
	json_decref(t4);
	free(ns);
	free(o3);
	free(o4);
}

/*
 * Background and Foreground: a dependent with another owner that still
 * exists stays and only loses its reference to the deleted one; once its
 * last owner goes, it goes.
 */
static void
delete_shared_dependent(void **state)
{
	static const enum k8s_propagation policies[] = {
		K8S_PROPAGATE_DEFAULT, K8S_PROPAGATE_FOREGROUND
	};
	struct k8s_status st = { 0 };
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(policies); i++) {
		char *ns = uniq("sh"), *o1 = uniq("o1"), *o2 = uniq("o2");
		json_t *t1 = create_task(ns, o1), *t2 = create_task(ns, o2);
		char *uids;

		create_owned_secret(ns, "shared", json_pack("[o,o]",
		    task_ref(t1), task_ref(t2)));
		create_owned_secret(ns, "mine", json_pack("[o]",
		    task_ref(t1)));
		assert_int_equal(k8s_delete_policy(api, &K8S_AGENTTASK, ns, o1,
		    policies[i], NULL, &st), 0);
		assert_int_equal(wait_gone_in(&K8S_SECRET, ns, "mine"),
		    K8S_ENOTFOUND);
		uids = owner_uids(ns, "shared", 1);
		assert_non_null(uids);
		assert_string_equal(uids, k8s_meta_str(t2, "uid"));
		free(uids);
		assert_int_equal(k8s_delete_policy(api, &K8S_AGENTTASK, ns, o2,
		    policies[i], NULL, &st), 0);
		assert_int_equal(wait_gone_in(&K8S_SECRET, ns, "shared"),
		    K8S_ENOTFOUND);
		json_decref(t1);
		json_decref(t2);
		free(ns);
		free(o1);
		free(o2);
	}
}

static int
next_event(struct k8s_watch *w, struct k8s_event *ev)
{
	struct k8s_status st = { 0 };
	int rc;

	do {
		rc = k8s_watch_next(w, 5000, ev, &st);
		if (rc == 1 && ev->type == K8S_BOOKMARK) {
			json_decref(ev->object);
			continue;
		}
		break;
	} while (1);
	k8s_status_release(&st);
	return rc;
}

/*
 * A watch whose selector matches none of the writes still learns how far
 * the store has gone: its next BOOKMARK carries a resourceVersion at least
 * that of the last write (the point of bookmarks: a reconnect from there
 * needs no replay of what it skipped, and no 410 once that is old).
 */
static void
watch_bookmark_progress(void **state)
{
	char *ns = uniq("bm"), *name = NULL;
	struct k8s_status st = { 0 };
	struct k8s_watch *w;
	struct k8s_event ev;
	json_t *last = NULL;
	int64_t want, end = now_mono_ms() + 30000, seen = 0;
	int i, rc, others = 0;

	(void)state;
	w = watch_from_now(&K8S_AGENTTASK, ns, "team=nobody");
	for (i = 0; i < 3; i++) {
		free(name);
		name = uniq("bt");
		json_decref(last);
		last = create_task(ns, name);
	}
	want = k8s_resource_version(last);
	while (seen < want && now_mono_ms() < end) {
		memset(&ev, 0, sizeof(ev));
		rc = k8s_watch_next(w, 1000, &ev, &st);
		assert_true(rc >= 0);
		if (rc == 1 && ev.type == K8S_BOOKMARK && ev.rv > seen)
			seen = ev.rv;
		else if (rc == 1)
			others++;
		json_decref(ev.object);
	}
	assert_true(seen >= want);
	assert_int_equal(others, 0);
	k8s_watch_free(w);
	k8s_status_release(&st);
	json_decref(last);
	free(name);
	free(ns);
}

static void
watch_events(void **state)
{
	char *ns = uniq("w"), *name = uniq("wt");
	struct k8s_list_opts o = { NULL, NULL, NULL };
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	struct k8s_event ev;
	json_t *l = NULL, *obj, *p;
	int64_t last;
	char *other = uniq("wo");

	/* an existing object, then a watch from the list's version */
	obj = create_task(ns, other);
	json_decref(obj);
	assert_int_equal(k8s_list(api, &K8S_AGENTTASK, ns, NULL, &l, &st), 0);
	o.resource_version = k8s_meta_str(l, "resourceVersion");
	assert_int_equal(k8s_watch(api, &K8S_AGENTTASK, ns, &o, &w, &st), 0);
	json_decref(l);
	obj = create_task(ns, name);
	p = json_pack("{s:{s:b}}", "spec", "suspended", 1);
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, ns, name, 0, p, NULL,
	    &st), 0);
	json_decref(p);
	assert_int_equal(k8s_delete(api, &K8S_AGENTTASK, ns, name, NULL, &st),
	    0);
	assert_int_equal(next_event(w, &ev), 1);
	assert_int_equal(ev.type, K8S_ADDED);
	assert_string_equal(k8s_meta_str(ev.object, "name"), name);
	last = ev.rv;
	json_decref(ev.object);
	assert_int_equal(next_event(w, &ev), 1);
	assert_int_equal(ev.type, K8S_MODIFIED);
	assert_true(ev.rv > last);
	assert_true(json_is_true(json_object_get(json_object_get(ev.object,
	    "spec"), "suspended")));
	last = ev.rv;
	json_decref(ev.object);
	assert_int_equal(next_event(w, &ev), 1);
	assert_int_equal(ev.type, K8S_DELETED);
	assert_true(ev.rv > last);
	json_decref(ev.object);
	/* nothing more */
	assert_int_equal(k8s_watch_next(w, 300, &ev, &st), 0);
	k8s_watch_free(w);
	json_decref(obj);

	/* from "0": a synthetic ADDED for what exists */
	o.resource_version = "0";
	o.field_selector = NULL;
	assert_int_equal(k8s_watch(api, &K8S_AGENTTASK, ns, &o, &w, &st), 0);
	assert_int_equal(next_event(w, &ev), 1);
	assert_int_equal(ev.type, K8S_ADDED);
	assert_string_equal(k8s_meta_str(ev.object, "name"), other);
	json_decref(ev.object);
	k8s_watch_free(w);
	free(ns);
	free(name);
	free(other);
}

/* Patch a task's metadata.labels.team; the new resourceVersion. */
static char *
relabel(const char *ns, const char *name, const char *team)
{
	struct k8s_status st = { 0 };
	json_t *p = json_pack("{s:{s:{s:s}}}", "metadata", "labels", "team",
	    team), *out = NULL;
	char *rv;

	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, ns, name, 0, p, &out,
	    &st), 0);
	rv = xstrdup(k8s_meta_str(out, "resourceVersion"));
	json_decref(out);
	json_decref(p);
	return rv;
}

/*
 * A watch with a label selector, like kube-apiserver's watch cache: an
 * object that a change takes out of the selection is DELETED for the
 * watcher (as it was, at the change's resourceVersion), one that a change
 * brings in is ADDED.
 */
static void
watch_selector_transitions(void **state)
{
	char *ns = uniq("ws"), *name = uniq("wl"), *other = uniq("wn"), *rv;
	json_t *obj = create_task(ns, name), *o2 = create_task(ns, other);
	json_t *evs, *left, *p;
	struct k8s_status st = { 0 };
	struct k8s_watch *w;

	(void)state;
	free(relabel(ns, other, "z"));
	w = watch_from_now(&K8S_AGENTTASK, ns, "team=a");
	rv = relabel(ns, name, "b");		/* leaves */
	free(relabel(ns, name, "a"));		/* comes back */
	p = json_pack("{s:{s:b}}", "spec", "suspended", 1);
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, ns, name, 0, p, NULL,
	    &st), 0);			/* stays */
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, ns, other, 0, p, NULL,
	    &st), 0);			/* never in */
	json_decref(p);
	assert_int_equal(k8s_delete(api, &K8S_AGENTTASK, ns, name, NULL, &st),
	    0);
	evs = drain(w);
	assert_int_equal(json_array_size(evs), 4);
	assert_int_equal(count_events(evs, "DELETED", name), 2);
	assert_int_equal(count_events(evs, "ADDED", name), 1);
	assert_int_equal(count_events(evs, "MODIFIED", name), 1);
	left = json_array_get(evs, 0);
	assert_string_equal(json_string_value(json_object_get(left, "type")),
	    "DELETED");
	left = json_object_get(left, "object");
	assert_string_equal(k8s_meta_str(left, "resourceVersion"), rv);
	assert_string_equal(json_string_value(json_object_get(json_object_get(
	    json_object_get(left, "metadata"), "labels"), "team")), "a");
	assert_string_equal(json_string_value(json_object_get(json_array_get(
	    evs, 1), "type")), "ADDED");
	json_decref(evs);
	json_decref(obj);
	json_decref(o2);
	free(rv);
	free(ns);
	free(name);
	free(other);
}

/*
 * Patch the task HISTORY + 10 times, pushing every older version out of
 * the watch window; the resourceVersion of the last patch.
 */
static int64_t
push_history(const char *ns, const char *name)
{
	struct k8s_status st = { 0 };
	int64_t newest = 0;
	json_t *out;
	int i;

	for (i = 0; i < HISTORY + 10; i++) {
		json_t *p = json_pack("{s:{s:i}}", "spec", "maxIterations",
		    i + 1);

		out = NULL;
		assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, ns, name, 0, p,
		    &out, &st), 0);
		newest = k8s_resource_version(out);
		json_decref(out);
		json_decref(p);
	}
	return newest;
}

#if STORE_MODE != 3
/*
 * The edge of the window exactly (the embedded store keeps the last
 * HISTORY events, with consecutive versions): a watch from the version
 * just before the oldest event kept gets that event first; one version
 * older is a 410, not a watch that silently starts after an event it
 * never saw.
 */
static void
watch_gone_edge(void **state)
{
	struct k8s_list_opts o = { NULL, NULL, NULL };
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	struct k8s_event ev;
	char *ns = uniq("ge"), *name = uniq("gte"), cur[32];
	json_t *obj;
	int64_t newest;
	int rc;

	(void)state;
	obj = create_task(ns, name);
	newest = push_history(ns, name);
	/* the oldest event kept is newest - HISTORY + 1 */
	snprintf(cur, sizeof(cur), "%lld", (long long)(newest - HISTORY));
	o.resource_version = cur;
	assert_int_equal(k8s_watch(api, &K8S_AGENTTASK, ns, &o, &w, &st), 0);
	assert_int_equal(k8s_watch_next(w, 5000, &ev, &st), 1);
	assert_int_equal(ev.rv, newest - HISTORY + 1);
	json_decref(ev.object);
	k8s_watch_free(w);
	snprintf(cur, sizeof(cur), "%lld", (long long)(newest - HISTORY - 1));
	w = NULL;
	rc = k8s_watch(api, &K8S_AGENTTASK, ns, &o, &w, &st);
	if (rc == 0) {
		rc = k8s_watch_next(w, 5000, &ev, &st);
		if (rc == 1)
			json_decref(ev.object);
		k8s_watch_free(w);
	}
	assert_int_equal(rc, K8S_EGONE);
	k8s_status_release(&st);
	json_decref(obj);
	free(ns);
	free(name);
}
#endif

static void
watch_gone(void **state)
{
	char *ns = uniq("g");
	struct k8s_list_opts o = { NULL, NULL, NULL };
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	struct k8s_event ev;
	json_t *obj, *l = NULL;
	char *name = uniq("gt"), *rv;
	int rc;

	obj = create_task(ns, name);
	rv = xstrdup(k8s_meta_str(obj, "resourceVersion"));
	push_history(ns, name);
	o.resource_version = rv;
	rc = k8s_watch(api, &K8S_AGENTTASK, ns, &o, &w, &st);
	if (rc == 0) {
		rc = k8s_watch_next(w, 5000, &ev, &st);
		k8s_watch_free(w);
	}
	assert_int_equal(rc, K8S_EGONE);
	k8s_status_release(&st);
	/* relist and watch again from the list: fine */
	assert_int_equal(k8s_list(api, &K8S_AGENTTASK, ns, NULL, &l, &st), 0);
	o.resource_version = k8s_meta_str(l, "resourceVersion");
	assert_int_equal(k8s_watch(api, &K8S_AGENTTASK, ns, &o, &w, &st), 0);
	assert_int_equal(k8s_watch_next(w, 200, &ev, &st), 0);
	k8s_watch_free(w);
	json_decref(l);
	json_decref(obj);
	free(rv);
	free(ns);
	free(name);
}

/* ---- cases from the mutation pass over src/k8s/embedded.c ---- */

/*
 * A write that changes nothing (a PUT of the object as it is, a merge
 * patch that sets what is already there) is not a write: the answer keeps
 * the resourceVersion and generation, and watchers see no event.
 */
static void
noop_write(void **state)
{
	char *ns = uniq("np"), *name = uniq("nt");
	json_t *obj = create_task(ns, name), *in, *out = NULL, *p, *evs;
	struct k8s_status st = { 0 };
	struct k8s_watch *w;

	(void)state;
	w = watch_from_now(&K8S_AGENTTASK, ns, NULL);
	in = json_deep_copy(obj);
	assert_int_equal(k8s_update(api, &K8S_AGENTTASK, ns, name, in, &out,
	    &st), 0);
	assert_string_equal(k8s_meta_str(out, "resourceVersion"),
	    k8s_meta_str(obj, "resourceVersion"));
	assert_int_equal(k8s_meta_int(out, "generation"), 1);
	json_decref(out);
	out = NULL;
	p = json_pack("{s:{s:{s:s}},s:{s:s}}", "metadata", "labels", "team",
	    "a", "spec", "objective", "fix it");
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, ns, name, 0, p, &out,
	    &st), 0);
	assert_string_equal(k8s_meta_str(out, "resourceVersion"),
	    k8s_meta_str(obj, "resourceVersion"));
	json_decref(p);
	json_decref(out);
	evs = drain(w);
	assert_int_equal(json_array_size(evs), 0);
	json_decref(evs);
	json_decref(in);
	json_decref(obj);
	free(name);
	free(ns);
}

/*
 * An empty metadata.resourceVersion is no resourceVersion (not one that
 * conflicts): a PUT of a Secret with it applies, a PUT of a custom
 * resource with it is the 422 of an update without one, and a merge
 * patch with it applies to the current object.
 */
static void
empty_resource_version(void **state)
{
	char *name = uniq("erv");
	json_t *obj = create_task("default", name), *in, *out = NULL, *s, *p;
	struct k8s_status st = { 0 };

	(void)state;
	s = json_pack("{s:s,s:s,s:{s:s},s:{s:s}}", "apiVersion", "v1", "kind",
	    "Secret", "metadata", "name", name, "data", "k", "eHl6");
	assert_int_equal(k8s_create(api, &K8S_SECRET, "default", s, NULL, &st),
	    0);
	json_object_set_new(json_object_get(s, "metadata"), "resourceVersion",
	    json_string(""));
	json_object_set_new(json_object_get(s, "data"), "k",
	    json_string("YWJj"));
	assert_int_equal(k8s_update(api, &K8S_SECRET, "default", name, s, &out,
	    &st), 0);
	assert_string_equal(json_string_value(json_object_get(json_object_get(
	    out, "data"), "k")), "YWJj");
	json_decref(out);
	out = NULL;
	in = json_deep_copy(obj);
	json_object_set_new(json_object_get(in, "metadata"), "resourceVersion",
	    json_string(""));
	json_object_set_new(json_object_get(in, "spec"), "objective",
	    json_string("changed"));
	assert_int_equal(k8s_update(api, &K8S_AGENTTASK, "default", name, in,
	    NULL, &st), K8S_EINVALID);
	assert_int_equal(st.code, 422);
	k8s_status_release(&st);
	p = json_pack("{s:{s:s},s:{s:s}}", "metadata", "resourceVersion", "",
	    "spec", "objective", "patched");
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", name, 0, p,
	    &out, &st), 0);
	assert_string_equal(spec_str(out, "objective"), "patched");
	json_decref(p);
	json_decref(out);
	json_decref(in);
	json_decref(s);
	json_decref(obj);
	free(name);
}

/*
 * A PUT whose body names another object than the URL is a 400, and
 * changes neither of them.
 */
static void
update_name_mismatch(void **state)
{
	char *name = uniq("nm"), *other = uniq("nmo");
	json_t *obj = create_task("default", name), *in, *got = NULL;
	struct k8s_status st = { 0 };

	(void)state;
	in = json_deep_copy(obj);
	json_object_set_new(json_object_get(in, "metadata"), "name",
	    json_string(other));
	json_object_set_new(json_object_get(in, "spec"), "objective",
	    json_string("renamed"));
	assert_int_equal(k8s_update(api, &K8S_AGENTTASK, "default", name, in,
	    NULL, &st), K8S_EBADREQUEST);
	assert_int_equal(st.code, 400);
	k8s_status_release(&st);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &got,
	    &st), 0);
	assert_string_equal(spec_str(got, "objective"), "fix it");
	assert_string_equal(k8s_meta_str(got, "resourceVersion"),
	    k8s_meta_str(obj, "resourceVersion"));
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", other, NULL,
	    &st), K8S_ENOTFOUND);
	k8s_status_release(&st);
	json_decref(got);
	json_decref(in);
	json_decref(obj);
	free(other);
	free(name);
}

/*
 * Foreground deletion of an owner that has finalizers: the owner is only
 * marked (deletionTimestamp set, generation + 1, as the apiserver's
 * BeforeDelete does) and stays until its finalizers are done, but its
 * dependents are deleted at once, not when the owner finally goes.
 */
static void
delete_foreground_finalizers(void **state)
{
	char *ns = uniq("ff"), *name = uniq("ffo");
	char *cname = xasprintf("%s-dep", name);
	json_t *in = task(name, "fix it"), *owner = NULL, *got = NULL, *p;
	struct k8s_status st = { 0 };

	(void)state;
	json_object_set_new(json_object_get(in, "metadata"), "finalizers",
	    json_pack("[s]", "example.com/hold"));
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, ns, in, &owner, &st),
	    0);
	create_owned_secret(ns, cname, json_pack("[o]", task_ref(owner)));
	assert_int_equal(k8s_delete_policy(api, &K8S_AGENTTASK, ns, name,
	    K8S_PROPAGATE_FOREGROUND, NULL, &st), 0);
	assert_int_equal(wait_gone_in(&K8S_SECRET, ns, cname), K8S_ENOTFOUND);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, ns, name, &got, &st), 0);
	assert_non_null(k8s_meta_str(got, "deletionTimestamp"));
	assert_int_equal(k8s_meta_int(got, "generation"), 2);
	json_decref(got);
	p = json_pack("{s:{s:n}}", "metadata", "finalizers");
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, ns, name, 0, p, NULL,
	    &st), 0);
	json_decref(p);
	assert_int_equal(wait_gone_in(&K8S_AGENTTASK, ns, name),
	    K8S_ENOTFOUND);
	json_decref(owner);
	json_decref(in);
	free(cname);
	free(name);
	free(ns);
}

/*
 * An ownerReference names its owner by uid: one whose name is that of an
 * existing object but whose uid is not (an owner deleted and created again
 * under the same name) is dangling, and the garbage collector removes
 * the dependent.
 */
static void
owner_uid_mismatch(void **state)
{
	char *name = uniq("um"), *cname = xasprintf("%s-dep", name);
	json_t *owner = create_task("default", name), *ref;

	(void)state;
	ref = task_ref(owner);
	json_object_set_new(ref, "uid",
	    json_string("00000000-0000-4000-8000-00000000beef"));
	create_owned_secret("default", cname, json_pack("[o]", ref));
	assert_int_equal(wait_gone(&K8S_SECRET, cname), K8S_ENOTFOUND);
	json_decref(owner);
	free(cname);
	free(name);
}

/*
 * A watch of one namespace sees the writes of that namespace only, even
 * to objects of the same name elsewhere.
 */
static void
watch_namespace_scope(void **state)
{
	char *ns = uniq("wn"), *ns2 = uniq("wx"), *name = uniq("wnt");
	json_t *a, *b, *evs, *o;
	struct k8s_watch *w;

	(void)state;
	w = watch_from_now(&K8S_AGENTTASK, ns, NULL);
	b = create_task(ns2, name);
	free(relabel(ns2, name, "z"));
	a = create_task(ns, name);
	evs = drain(w);
	assert_int_equal(json_array_size(evs), 1);
	assert_int_equal(count_events(evs, "ADDED", name), 1);
	o = json_object_get(json_array_get(evs, 0), "object");
	assert_string_equal(k8s_meta_str(o, "namespace"), ns);
	assert_string_equal(k8s_meta_str(o, "uid"), k8s_meta_str(a, "uid"));
	json_decref(evs);
	json_decref(a);
	json_decref(b);
	free(name);
	free(ns2);
	free(ns);
}

/*
 * The server owns metadata.generation and deletionTimestamp, and .status
 * of a kind with a status subresource: a create that sends them gets
 * none of them, and an update that sends another generation keeps the
 * stored one.
 */
static void
server_owned_fields(void **state)
{
	char *name = uniq("so");
	json_t *in = task(name, "fix it"), *out = NULL, *got = NULL, *up;
	struct k8s_status st = { 0 };

	(void)state;
	json_object_set_new(json_object_get(in, "metadata"),
	    "deletionTimestamp", json_string("2026-01-01T00:00:00Z"));
	json_object_set_new(json_object_get(in, "metadata"), "generation",
	    json_integer(9));
	json_object_set_new(in, "status", json_pack("{s:s}", "phase",
	    "Active"));
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", in, &out,
	    &st), 0);
	assert_null(k8s_meta_str(out, "deletionTimestamp"));
	assert_int_equal(k8s_meta_int(out, "generation"), 1);
	assert_null(json_object_get(json_object_get(out, "status"), "phase"));
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &got,
	    &st), 0);
	assert_null(k8s_meta_str(got, "deletionTimestamp"));
	assert_null(json_object_get(json_object_get(got, "status"), "phase"));
	/* a metadata-only update that claims generation 7 */
	up = json_deep_copy(got);
	json_object_set_new(json_object_get(up, "metadata"), "generation",
	    json_integer(7));
	json_object_set_new(json_object_get(json_object_get(up, "metadata"),
	    "labels"), "team", json_string("b"));
	json_decref(out);
	out = NULL;
	assert_int_equal(k8s_update(api, &K8S_AGENTTASK, "default", name, up,
	    &out, &st), 0);
	assert_int_equal(k8s_meta_int(out, "generation"), 1);
	json_decref(up);
	json_decref(got);
	json_decref(out);
	json_decref(in);
	free(name);
}

/*
 * metadata.generation is tracked where a cluster tracks it: a
 * NetworkPolicy gets 1 on create and + 1 per spec change (a label change
 * keeps it); a Secret has none, whatever the client sends.
 */
static void
generation_tracking(void **state)
{
	char *name = uniq("gen");
	json_t *s, *np, *out = NULL, *got = NULL;
	struct k8s_status st = { 0 };

	(void)state;
	s = json_pack("{s:s,s:s,s:{s:s,s:i},s:{s:s}}", "apiVersion", "v1",
	    "kind", "Secret", "metadata", "name", name, "generation", 5,
	    "data", "k", "eHl6");
	assert_int_equal(k8s_create(api, &K8S_SECRET, "default", s, &out,
	    &st), 0);
	assert_null(json_object_get(json_object_get(out, "metadata"),
	    "generation"));
	json_decref(out);
	out = NULL;
	assert_int_equal(k8s_get(api, &K8S_SECRET, "default", name, &got,
	    &st), 0);
	assert_null(json_object_get(json_object_get(got, "metadata"),
	    "generation"));
	json_object_set_new(json_object_get(got, "data"), "k",
	    json_string("YWJj"));
	assert_int_equal(k8s_update(api, &K8S_SECRET, "default", name, got,
	    &out, &st), 0);
	assert_null(json_object_get(json_object_get(out, "metadata"),
	    "generation"));
	json_decref(out);
	out = NULL;
	json_decref(got);
	got = NULL;

	np = json_pack("{s:s,s:s,s:{s:s,s:i},s:{s:{},s:[s]}}", "apiVersion",
	    "networking.k8s.io/v1", "kind", "NetworkPolicy", "metadata",
	    "name", name, "generation", 9, "spec", "podSelector",
	    "policyTypes", "Ingress");
	assert_int_equal(k8s_create(api, &K8S_NETWORKPOLICY, "default", np,
	    &out, &st), 0);
	assert_int_equal(k8s_meta_int(out, "generation"), 1);
	json_decref(out);
	out = NULL;
	assert_int_equal(k8s_get(api, &K8S_NETWORKPOLICY, "default", name,
	    &got, &st), 0);
	json_array_append_new(json_object_get(json_object_get(got, "spec"),
	    "policyTypes"), json_string("Egress"));
	assert_int_equal(k8s_update(api, &K8S_NETWORKPOLICY, "default", name,
	    got, &out, &st), 0);
	assert_int_equal(k8s_meta_int(out, "generation"), 2);
	json_decref(got);
	got = out;
	out = NULL;
	json_object_set_new(json_object_get(got, "metadata"), "labels",
	    json_pack("{s:s}", "team", "b"));
	assert_int_equal(k8s_update(api, &K8S_NETWORKPOLICY, "default", name,
	    got, &out, &st), 0);
	assert_int_equal(k8s_meta_int(out, "generation"), 2);
	assert_string_equal(json_string_value(json_object_get(json_object_get(
	    json_object_get(out, "metadata"), "labels"), "team")), "b");
	json_decref(out);
	json_decref(got);
	json_decref(np);
	json_decref(s);
	free(name);
}

/*
 * When the garbage collector takes the last ownerReference off a
 * dependent (Orphan), the field goes, as the apiserver serializes an
 * empty list (omitempty): no "ownerReferences": [] is left behind.
 */
static void
orphan_drops_empty_owner_refs(void **state)
{
	char *ns = uniq("oe"), *o = uniq("oeo");
	json_t *t = create_task(ns, o), *g = NULL;
	struct k8s_status st = { 0 };
	char *uids;

	(void)state;
	create_owned_secret(ns, "dep", json_pack("[o]", task_ref(t)));
	assert_int_equal(k8s_delete_policy(api, &K8S_AGENTTASK, ns, o,
	    K8S_PROPAGATE_ORPHAN, NULL, &st), 0);
	uids = owner_uids(ns, "dep", 0);
	assert_non_null(uids);
	free(uids);
	assert_int_equal(k8s_get(api, &K8S_SECRET, ns, "dep", &g, &st), 0);
	assert_null(json_object_get(json_object_get(g, "metadata"),
	    "ownerReferences"));
	json_decref(g);
	json_decref(t);
	free(o);
	free(ns);
}

/*
 * A resourceVersion precondition alone (no uid) is checked: stale, a 409
 * and the object stays; current, the object goes.
 */
static void
delete_precondition_rv_only(void **state)
{
	char *name = uniq("pr");
	json_t *t = create_task("default", name), *out = NULL;
	struct k8s_status st = { 0 };
	char *rv = xstrdup(k8s_meta_str(t, "resourceVersion"));

	(void)state;
	free(relabel("default", name, "b"));
	assert_int_equal(k8s_delete_if(api, &K8S_AGENTTASK, "default", name,
	    K8S_PROPAGATE_DEFAULT, NULL, rv, NULL, &st), K8S_ECONFLICT);
	assert_int_equal(st.code, 409);
	k8s_status_release(&st);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &out,
	    &st), 0);
	free(rv);
	rv = xstrdup(k8s_meta_str(out, "resourceVersion"));
	assert_int_equal(k8s_delete_if(api, &K8S_AGENTTASK, "default", name,
	    K8S_PROPAGATE_DEFAULT, NULL, rv, NULL, &st), 0);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, NULL,
	    &st), K8S_ENOTFOUND);
	k8s_status_release(&st);
	json_decref(out);
	json_decref(t);
	free(rv);
	free(name);
}

#if STORE_MODE == 1
/*
 * A dry-run write takes no resourceVersion: the versions of real writes
 * stay consecutive, which the watch window relies on, so a watch from the
 * version a list gives after a dry run sees the next write.
 */
static void
dry_run_keeps_versions(void **state)
{
	struct k8s_api *dry = k8s_embedded_dry_run(api);
	char *ns = uniq("dr"), *name = uniq("drt"), *dname = uniq("drd");
	json_t *in = task(dname, "fix it"), *obj, *evs;
	struct k8s_status st = { 0 };
	struct k8s_watch *w;

	(void)state;
	assert_non_null(dry);
	assert_int_equal(k8s_create(dry, &K8S_AGENTTASK, ns, in, NULL, &st),
	    0);
	w = watch_from_now(&K8S_AGENTTASK, ns, NULL);
	obj = create_task(ns, name);
	evs = drain(w);
	assert_int_equal(json_array_size(evs), 1);
	assert_int_equal(count_events(evs, "ADDED", name), 1);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, ns, dname, NULL, &st),
	    K8S_ENOTFOUND);
	k8s_status_release(&st);
	json_decref(evs);
	json_decref(obj);
	json_decref(in);
	free(dname);
	free(name);
	free(ns);
}
#endif

struct racer {
	const char *name;
	json_t *base;
	int rc;
};

static void *
race(void *arg)
{
	struct racer *r = arg;
	struct k8s_status st = { 0 };

	r->rc = k8s_update(api, &K8S_AGENTTASK, "default", r->name, r->base,
	    NULL, &st);
	k8s_status_release(&st);
	return NULL;
}

static void
optimistic_race(void **state)
{
	char *name = uniq("r");
	json_t *obj = create_task("default", name);
	struct racer r[8];
	pthread_t t[8];
	int i, ok = 0, conflict = 0;

	for (i = 0; i < 8; i++) {
		r[i].name = name;
		r[i].base = json_deep_copy(obj);
		json_object_set_new(json_object_get(r[i].base, "spec"),
		    "objective", json_sprintf("writer %d", i));
		pthread_create(&t[i], NULL, race, &r[i]);
	}
	for (i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		ok += r[i].rc == 0;
		conflict += r[i].rc == K8S_ECONFLICT;
		json_decref(r[i].base);
	}
	/* exactly one update from the same version wins */
	assert_int_equal(ok, 1);
	assert_int_equal(conflict, 7);
	json_decref(obj);
	free(name);
}

/* The applied-commands annotation of task name, "" when it has none. */
static const char *
applied_of(const char *name)
{
	static char list[K8S_TASK_APPLIED_MAX * (K8S_TASK_MAX_ONCE + 1)];
	struct k8s_status st = { 0 };
	json_t *o = NULL;
	const char *v;

	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &o,
	    &st), 0);
	v = json_string_value(json_object_get(json_object_get(
	    json_object_get(o, "metadata"), "annotations"),
	    K8S_TASK_ANNOTATION_APPLIED));
	snprintf(list, sizeof(list), "%s", v != NULL ? v : "");
	json_decref(o);
	return list;
}

/* Bump task name by $5 as operation once: want_ret, and budget after. */
static void
bump_once(const char *name, const char *once, int want_ret,
    const char *want_budget)
{
	struct k8s_task_bump bump = { .usd_micro = 5000000 };
	struct k8s_status st = { 0 };
	json_t *out = NULL;

	assert_int_equal(k8s_task_budget(api, "default", name, &bump, once,
	    &out, &st), want_ret);
	if (want_ret >= 0)
		assert_string_equal(spec_str(out, "budgetUSD"), want_budget);
	else
		assert_null(out);
	k8s_status_release(&st);
	json_decref(out);
}

/* Bumping task name with bump is refused (nothing written), saying why. */
static void
bump_refused(const char *name, const struct k8s_task_bump *bump,
    const char *why)
{
	struct k8s_status st = { 0 };
	json_t *out = NULL;
	int rc;

	rc = k8s_task_budget(api, "default", name, bump, NULL, &out, &st);
	if (rc != K8S_EINVALID || st.message == NULL ||
	    strstr(st.message, why) == NULL)
		fail_msg("%d '%s'; wanted a refusal saying '%s'", rc,
		    st.message ? st.message : "(none)", why);
	assert_null(out);
	k8s_status_release(&st);
}

/* Task name of the default namespace, read back. */
static json_t *
get_task_obj(const char *name)
{
	struct k8s_status st = { 0 };
	json_t *o = NULL;

	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &o,
	    &st), 0);
	return o;
}

/* A task of name without spec.budgetUSD or budgetTokens. */
static void
create_unbudgeted(const char *name)
{
	json_t *in = task(name, "fix it");
	struct k8s_status st = { 0 };

	json_object_del(json_object_get(in, "spec"), "budgetUSD");
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", in, NULL,
	    &st), 0);
	json_decref(in);
}

/*
 * What a bump refuses, writing nothing: a budget nobody can know (no spec
 * value, no token, no default), an unlimited one (0: it stays unlimited),
 * a sum past int64. And a token minted without budget caveats (the
 * defaults were 0 then) leaves the budgets unlimited, from the token,
 * even once the defaults are unknown.
 */
static void
task_bump_refusals(void **state)
{
	static const unsigned char key[32] = { 7, 7, 7 };
	struct k8s_task_bump bump = { .default_usd_micro = -1,
	    .default_tokens = -1 };
	struct k8s_task_budgets b;
	struct k8s_status st = { 0 };
	char *name = uniq("bumps"), *name2 = uniq("bumps"), *tok = NULL;
	char *c0, *sname, *b64;
	const char *cavs[2];
	json_t *patch, *sec, *t = NULL;

	(void)state;
	create_unbudgeted(name);
	bump.usd_micro = 1000000;
	bump_refused(name, &bump, "cannot bump the USD budget of task");
	bump.usd_micro = 0;
	bump.tokens = 1000;
	bump_refused(name, &bump, "cannot bump the token budget of task");
	bump.default_tokens = 0;
	bump_refused(name, &bump, "is unlimited (0 in the configured "
	    "default)");
	bump.tokens = 0;
	bump.usd_micro = 1000000;
	bump.default_usd_micro = 0;
	bump_refused(name, &bump, "is unlimited (0 in the configured "
	    "default)");
	assert_null(spec_str(t = get_task_obj(name), "budgetUSD"));
	json_decref(t);

	/* the largest budgets the schema takes, and a bump past int64 */
	patch = json_pack("{s:{s:s,s:I}}", "spec", "budgetUSD", "1000000.00",
	    "budgetTokens", (json_int_t)1000000000000);
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", name, 0,
	    patch, NULL, &st), 0);
	json_decref(patch);
	bump.usd_micro = INT64_MAX - INT64_C(1000000000000) + 1;
	c0 = xasprintf("the USD budget of task \"%s\" would be too large",
	    name);
	bump_refused(name, &bump, c0);
	free(c0);
	bump.usd_micro = 0;
	bump.tokens = INT64_MAX - INT64_C(1000000000000) + 1;
	c0 = xasprintf("the token budget of task \"%s\" would be too large",
	    name);
	bump_refused(name, &bump, c0);
	free(c0);

	/* a token with no budget caveats: unlimited, from the token */
	create_unbudgeted(name2);
	c0 = xasprintf("task_id = %s", name2);
	cavs[0] = c0;
	cavs[1] = "namespace = default";
	assert_int_equal(macaroon_mint(key, sizeof(key), "id", NULL, cavs, 2,
	    &tok, NULL), 0);
	b64 = base64_encode((const unsigned char *)tok, strlen(tok), 0, 1);
	sname = xasprintf("%s-token", name2);
	sec = json_pack("{s:s,s:s,s:{s:s},s:{s:s}}", "apiVersion", "v1",
	    "kind", "Secret", "metadata", "name", sname, "data", "token",
	    b64);
	assert_int_equal(k8s_create(api, &K8S_SECRET, "default", sec, NULL,
	    &st), 0);
	json_decref(sec);
	t = get_task_obj(name2);
	k8s_task_budgets(api, t, -1, -1, &b);
	assert_int_equal(b.usd.source, K8S_TASK_TOKEN);
	assert_int_equal(b.usd.value, 0);
	assert_int_equal(b.tokens.source, K8S_TASK_TOKEN);
	assert_int_equal(b.tokens.value, 0);
	/* while a default is configured, it applies */
	k8s_task_budgets(api, t, 7000000, 9, &b);
	assert_int_equal(b.usd.source, K8S_TASK_DEFAULT);
	assert_int_equal(b.usd.value, 7000000);
	assert_int_equal(b.tokens.source, K8S_TASK_DEFAULT);
	assert_int_equal(b.tokens.value, 9);
	json_decref(t);
	/* and a bump of it says where the unlimited budget comes from */
	bump.tokens = 0;
	bump.usd_micro = 1000000;
	bump.default_usd_micro = -1;
	bump_refused(name2, &bump, "is unlimited (0 in its token)");
	free(c0);
	free(tok);
	free(b64);
	free(sname);
	free(name);
	free(name2);
}

/*
 * An operation with an id (a slash command of a comment) takes effect
 * once: its write records the id in the task, and an id the task records
 * is not applied again; the record keeps the last K8S_TASK_APPLIED_MAX.
 */
static void
task_once(void **state)
{
	struct k8s_task_bump bump = { .usd_micro = 5000000 };
	struct k8s_status st = { 0 };
	char *name = uniq("once"), id[32];
	json_t *obj = create_task("default", name);
	struct buf want;
	int i;

	bump_once(name, "7#0", 0, "10.00");
	assert_string_equal(applied_of(name), "7#0");
	/* the same command again (a retry): nothing written */
	bump_once(name, "7#0", 1, "10.00");
	assert_int_equal(k8s_task_resume(api, "default", name, &bump, "7#0",
	    NULL, &st), 1);
	/* another command (or the next one of the comment) applies */
	bump_once(name, "7#1", 0, "15.00");
	assert_string_equal(applied_of(name), "7#0 7#1");
	/* without an id: applied every time, as before */
	bump_once(name, NULL, 0, "20.00");
	assert_string_equal(applied_of(name), "7#0 7#1");
	/* a command that changes nothing else is recorded all the same */
	assert_int_equal(k8s_task_pause(api, "default", name, "review:8#0",
	    NULL, &st), 0);
	assert_int_equal(k8s_task_pause(api, "default", name, "9#0", NULL,
	    &st), 0);
	assert_string_equal(applied_of(name), "7#0 7#1 review:8#0 9#0");
	/* bounded: the oldest ids go first */
	buf_init(&want, sizeof(id) * (K8S_TASK_APPLIED_MAX + 3));
	for (i = 0; i < K8S_TASK_APPLIED_MAX + 3; i++) {
		snprintf(id, sizeof(id), "%d#0", 100 + i);
		assert_int_equal(k8s_task_guide(api, "default", name, "hint",
		    id, NULL, &st), 0);
		if (i >= 3)
			buf_printf(&want, "%s%s", want.len > 0 ? " " : "", id);
	}
	assert_string_equal(applied_of(name), want.data);
	buf_release(&want);
	/* so a command out of the record would apply again */
	bump_once(name, "7#0", 0, "25.00");
	/* an id the list cannot hold is refused, nothing written */
	bump_once(name, "7 0", K8S_EINVALID, NULL);
	bump_once(name, "", K8S_EINVALID, NULL);
	json_decref(obj);
	free(name);
}

#if STORE_MODE == 1
/* Embedded only: multi-object transactions. */
struct txn_arg {
	const char *a, *b;
	int fail;
};

static int
two_writes(struct k8s_txn *tx, void *arg, struct k8s_status *st)
{
	struct txn_arg *t = arg;
	int rc = k8s_txn_put(tx, &K8S_AGENTTASK, "txn", task(t->a, "one"),
	    NULL, st);

	if (rc < 0)
		return rc;
	rc = k8s_txn_put(tx, &K8S_AGENTTASK, "txn", task(t->b, "two"), NULL,
	    st);
	if (rc < 0)
		return rc;
	if (t->fail)
		return k8s_status_set(st, K8S_EINVALID, "planned", NULL);
	return 0;
}

static int
bump(struct k8s_txn *tx, void *arg, struct k8s_status *st)
{
	json_t *o = NULL, *s;
	int rc = k8s_txn_get(tx, &K8S_AGENTTASK, "txn", "counter", &o, st);

	if (rc < 0)
		return rc;
	s = json_object_get(o, "status");
	if (s == NULL) {
		s = json_object();
		json_object_set_new(o, "status", s);
	}
	json_object_set_new(s, "iteration", json_integer(json_integer_value(
	    json_object_get(s, "iteration")) + 1));
	/* the put takes o */
	return k8s_txn_put(tx, &K8S_AGENTTASK, "txn", o, NULL, st);
}

static int
bump_then_fail(struct k8s_txn *tx, void *arg, struct k8s_status *st)
{
	int rc = bump(tx, arg, st);

	if (rc < 0)
		return rc;
	return k8s_status_set(st, K8S_EINVALID, "planned", NULL);
}

static int64_t
counter_value(void)
{
	struct k8s_status st = { 0 };
	json_t *o = NULL;
	int64_t v;

	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "txn", "counter", &o,
	    &st), 0);
	v = json_integer_value(json_object_get(json_object_get(o, "status"),
	    "iteration"));
	json_decref(o);
	return v;
}

static void *
bumper(void *arg)
{
	struct k8s_status st = { 0 };
	int i;

	for (i = 0; i < 100; i++)
		if (k8s_embedded_transact(api, bump, NULL, &st) < 0)
			abort();
	return NULL;
}

static void
transactions(void **state)
{
	struct txn_arg a = { "ta", "tb", 1 };
	struct k8s_status st = { 0 };
	json_t *o = NULL;
	pthread_t t[16];
	int i;

	assert_true(k8s_is_embedded(api));
	assert_int_equal(k8s_embedded_transact(api, two_writes, &a, &st),
	    K8S_EINVALID);
	k8s_status_release(&st);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "txn", "ta", &o, &st),
	    K8S_ENOTFOUND);
	k8s_status_release(&st);
	a.fail = 0;
	assert_int_equal(k8s_embedded_transact(api, two_writes, &a, &st), 0);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "txn", "tb", &o, &st),
	    0);
	json_decref(o);
	o = task("counter", "count");
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "txn", o, NULL, &st),
	    0);
	json_decref(o);
	for (i = 0; i < 16; i++)
		pthread_create(&t[i], NULL, bumper, NULL);
	for (i = 0; i < 16; i++)
		pthread_join(t[i], NULL);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "txn", "counter", &o,
	    &st), 0);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(o,
	    "status"), "iteration")), 1600);
	json_decref(o);
	/* a write rolled back leaves nothing behind, not even in memory */
	assert_int_equal(k8s_embedded_transact(api, bump_then_fail, NULL, &st),
	    K8S_EINVALID);
	k8s_status_release(&st);
	assert_int_equal(k8s_embedded_transact(api, bump, NULL, &st), 0);
	assert_int_equal(counter_value(), 1601);
	/* what a write returns is the caller's own copy */
	{
		json_t *patch = json_pack("{s:{s:s}}", "spec", "objective",
		    "count again"), *out = NULL;

		assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "txn",
		    "counter", 0, patch, &out, &st), 0);
		json_object_set_new(json_object_get(out, "status"),
		    "iteration", json_integer(5000));
		json_decref(out);
		json_decref(patch);
	}
	assert_int_equal(k8s_embedded_transact(api, bump, NULL, &st), 0);
	assert_int_equal(counter_value(), 1602);
}
#endif

#if STORE_MODE == 1
/*
 * Embedded only: the watch window holds at most watch_window_bytes of
 * objects (as stored), whatever their count: 10,000 events of objects of
 * tens of KiB (the token index Secret) kept hundreds of MiB in memory for
 * an hour. A watch from a version the bytes pushed out is a 410.
 */
static void
watch_window_bytes(void **state)
{
	struct k8s_embedded_config ec = { 10000, 3600, 64 * 1024 };
	struct k8s_list_opts o = { NULL, NULL, NULL };
	struct k8s_status st = { 0 };
	struct k8s_api *small = NULL;
	struct k8s_watch *w = NULL;
	struct k8s_event ev;
	char *dir = storeenv_tmpdir(), *path, *cause = NULL, *pad, *rv0;
	char rv[32] = "";
	json_t *obj = task("big", "fill the window"), *out = NULL;
	int i, rc;

	(void)state;
	path = xasprintf("%s/diverge.db", dir);
	assert_int_equal(k8s_embedded_open(&small, path, &ec, &cause), 0);
	assert_int_equal(k8s_create(small, &K8S_AGENTTASK, "w", obj, &out,
	    &st), 0);
	rv0 = xstrdup(k8s_meta_str(out, "resourceVersion"));
	json_decref(out);
	/* 16 versions of 8 KiB and more: 128 KiB, twice the window */
	pad = xmalloc(8193);
	for (i = 0; i < 16; i++) {
		json_t *p;

		memset(pad, 'a' + i, 8192);
		pad[8192] = '\0';
		p = json_pack("{s:{s:{s:s}}}", "metadata", "annotations", "pad",
		    pad);
		out = NULL;
		assert_int_equal(k8s_patch(small, &K8S_AGENTTASK, "w", "big", 0,
		    p, &out, &st), 0);
		if (i == 12)	/* three versions (24 KiB) later: kept */
			snprintf(rv, sizeof(rv), "%s", k8s_meta_str(out,
			    "resourceVersion"));
		json_decref(out);
		json_decref(p);
	}
	o.resource_version = rv0;
	rc = k8s_watch(small, &K8S_AGENTTASK, "w", &o, &w, &st);
	if (rc == 0) {
		memset(&ev, 0, sizeof(ev));
		rc = k8s_watch_next(w, 1000, &ev, &st);
		json_decref(ev.object);
		k8s_watch_free(w);
	}
	assert_int_equal(rc, K8S_EGONE);
	k8s_status_release(&st);
	o.resource_version = rv;
	assert_int_equal(k8s_watch(small, &K8S_AGENTTASK, "w", &o, &w, &st),
	    0);
	memset(&ev, 0, sizeof(ev));
	assert_int_equal(k8s_watch_next(w, 1000, &ev, &st), 1);
	assert_int_equal(ev.type, K8S_MODIFIED);
	json_decref(ev.object);
	k8s_watch_free(w);
	k8s_api_free(small);
	json_decref(obj);
	free(pad);
	free(rv0);
	free(path);
	free(dir);
}

/* The SQL that made the objects table, from the file at path. */
static char *
objects_sql(const char *path)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *q = NULL;
	char *sql = NULL;

	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, "SELECT sql FROM sqlite_master"
	    " WHERE type = 'table' AND name = 'objects'", -1, &q, NULL),
	    SQLITE_OK);
	if (sqlite3_step(q) == SQLITE_ROW)
		sql = xstrdup((const char *)sqlite3_column_text(q, 0));
	sqlite3_finalize(q);
	sqlite3_close(db);
	assert_non_null(sql);
	return sql;
}

/*
 * The API server refuses by itself to listen beyond loopback without both
 * TLS and a token, whoever starts it (diverged's configuration refuses
 * the same first): neither, a token only, TLS only. On loopback it starts
 * with neither.
 */
static void
apiserver_off_loopback(void **state)
{
	static const char *const tokens[] = { NULL, "t0ken", NULL };
	static const char *const certs[] = { NULL, NULL, "/nonexistent/c.pem" };
	struct k8s_apiserver_config sc;
	struct k8s_apiserver *s = NULL;
	char *cause = NULL;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(tokens); i++) {
		memset(&sc, 0, sizeof(sc));
		sc.listen = "0.0.0.0:0";
		sc.token = tokens[i];
		sc.tls_cert = certs[i];
		sc.tls_key = certs[i] != NULL ? "/nonexistent/k.pem" : NULL;
		if (k8s_apiserver_start(&s, api, &sc, &cause) == 0) {
			k8s_apiserver_stop(s);
			fail_msg("case %zu: started on 0.0.0.0", i);
		}
		assert_string_equal(cause, "api listen address '0.0.0.0:0' is "
		    "not loopback: it needs tls_cert, tls_key and token");
		free(cause);
		cause = NULL;
	}
	memset(&sc, 0, sizeof(sc));
	sc.listen = "127.0.0.1:0";
	assert_int_equal(k8s_apiserver_start(&s, api, &sc, &cause), 0);
	assert_true(k8s_apiserver_port(s) > 0);
	k8s_apiserver_stop(s);
}

/*
 * Embedded only: a database whose objects table is the older WITHOUT ROWID
 * layout (where every task spilled into an overflow page) is converted at
 * open, keeping every object and the resourceVersion, and works as before;
 * opening it again changes nothing.
 */
static void
objects_layout_migration(void **state)
{
	struct k8s_status st = { 0 };
	struct k8s_api *s = NULL;
	char *dir = storeenv_tmpdir(), *path, *cause = NULL, *sql, *rv;
	json_t *in = task("old", "from an older diverged"), *out = NULL;
	json_t *p;
	sqlite3 *db = NULL;
	int i;

	(void)state;
	path = xasprintf("%s/diverge.db", dir);
	assert_int_equal(k8s_embedded_open(&s, path, NULL, &cause), 0);
	assert_int_equal(k8s_create(s, &K8S_AGENTTASK, "m", in, &out, &st),
	    0);
	rv = xstrdup(k8s_meta_str(out, "resourceVersion"));
	json_decref(out);
	k8s_api_free(s);
	sql = objects_sql(path);
	assert_null(strstr(sql, "WITHOUT ROWID"));
	free(sql);
	/* back to the layout an older diverged made */
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, "BEGIN;"
	    "CREATE TABLE objects_old (rkey TEXT NOT NULL,"
	    " namespace TEXT NOT NULL, name TEXT NOT NULL, uid TEXT NOT NULL,"
	    " rv INTEGER NOT NULL, body TEXT NOT NULL,"
	    " PRIMARY KEY (rkey, namespace, name)) WITHOUT ROWID;"
	    "INSERT INTO objects_old SELECT rkey, namespace, name, uid, rv,"
	    " body FROM objects;"
	    "DROP TABLE objects;"
	    "ALTER TABLE objects_old RENAME TO objects;"
	    "COMMIT;", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db);
	sql = objects_sql(path);
	assert_non_null(strstr(sql, "WITHOUT ROWID"));
	free(sql);
	for (i = 0; i < 2; i++) {
		assert_int_equal(k8s_embedded_open(&s, path, NULL, &cause), 0);
		sql = objects_sql(path);
		assert_null(strstr(sql, "WITHOUT ROWID"));
		free(sql);
		out = NULL;
		assert_int_equal(k8s_get(s, &K8S_AGENTTASK, "m", "old", &out,
		    &st), 0);
		assert_string_equal(spec_str(out, "objective"),
		    "from an older diverged");
		if (i == 0)
			assert_string_equal(k8s_meta_str(out,
			    "resourceVersion"), rv);
		json_decref(out);
		/* a write and a unique key as before */
		p = json_pack("{s:{s:s}}", "status", "phase", "Active");
		out = NULL;
		assert_int_equal(k8s_patch(s, &K8S_AGENTTASK, "m", "old", 1, p,
		    &out, &st), 0);
		json_decref(out);
		json_decref(p);
		out = NULL;
		assert_int_equal(k8s_create(s, &K8S_AGENTTASK, "m", in, &out,
		    &st), K8S_EEXISTS);
		k8s_status_release(&st);
		k8s_api_free(s);
	}
	json_decref(in);
	free(rv);
	free(path);
	free(dir);
}
#endif

#if STORE_MODE == 3
/*
 * ---- the REST client's retries, on the fake's injected faults ----
 * A write is sent again only where it cannot have taken effect (429, or
 * a 5xx with Retry-After); a write whose answer was lost (a 5xx without
 * Retry-After, a dropped connection) is not, and says it may have been
 * done (st.maybe_done) so that its callers do not repeat it.
 */

static void
fault(const char *rule)
{
	json_t *j = storeenv_fake(&env, "POST", "/_fake/faults", rule);

	assert_non_null(j);
	json_decref(j);
}

static void
requests_clear(void)
{
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/requests", NULL));
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/faults", NULL));
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/delay", NULL));
}

static const char *
budget_of(const char *name)
{
	static char money[32];
	struct k8s_status st = { 0 };
	json_t *o = NULL;

	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &o,
	    &st), 0);
	snprintf(money, sizeof(money), "%s", spec_str(o, "budgetUSD"));
	json_decref(o);
	return money;
}

/*
 * Bump the USD budget of task name by $5 with a fault (the members of a
 * rule, or NULL) set on its PATCH; check the answer, the PATCHes the fake
 * saw and the budget after.
 */
static void
bump_with_fault(const char *name, const char *what, const char *once,
    int want_ret, int want_patches, const char *want_budget)
{
	struct k8s_task_bump bump = { .usd_micro = 5000000 };
	struct k8s_status st = { 0 };
	json_t *out = NULL;
	char *rule;

	requests_clear();
	if (what != NULL) {
		rule = xasprintf("{%s,\"method\":\"PATCH\",\"match\":"
		    "\"/%s\"}", what, name);
		fault(rule);
		free(rule);
	}
	assert_int_equal(k8s_task_budget(api, "default", name, &bump, once,
	    &out, &st), want_ret);
	if (want_ret < 0) {
		assert_null(out);
		assert_true(st.maybe_done);
		if (want_ret == K8S_ECONFLICT)
			assert_non_null(strstr(st.message,
			    "may have been applied"));
	}
	k8s_status_release(&st);
	json_decref(out);
	assert_int_equal(storeenv_fake_count(&env, "PATCH", name),
	    want_patches);
	assert_string_equal(budget_of(name), want_budget);
}

/* A bump whose PATCH took effect but lost its answer is made once. */
static void
retry_lost_patch(void **state)
{
	char *name = uniq("lost");
	json_t *obj = create_task("default", name);

	/* committed, then answered 504 (no Retry-After) */
	bump_with_fault(name, "\"status\":504,\"after\":true", NULL,
	    K8S_ETIMEOUT, 1, "10.00");
	/* committed, then the connection dropped without an answer */
	bump_with_fault(name, "\"close\":true,\"after\":true", NULL,
	    K8S_EUNAVAILABLE, 1, "15.00");
	/*
	 * committed, then 503 with Retry-After (the server asks for the
	 * retry): sent again, the retry meets a Conflict of its own making
	 * and the edit stops there instead of bumping again
	 */
	bump_with_fault(name, "\"status\":503,\"retry_after\":1,"
	    "\"after\":true", NULL, K8S_ECONFLICT, 2, "20.00");
	/* and without faults, one bump is one PATCH */
	bump_with_fault(name, NULL, NULL, 0, 1, "25.00");
	/*
	 * With an id the write records itself: the caller's retry of a
	 * bump whose answer was lost finds it applied (1, no PATCH) ...
	 */
	bump_with_fault(name, "\"status\":504,\"after\":true", "5#0",
	    K8S_ETIMEOUT, 1, "30.00");
	bump_with_fault(name, NULL, "5#0", 1, 0, "30.00");
	/*
	 * ... and a Conflict of its own making is read again instead of
	 * failed: the record says the first attempt took effect
	 */
	bump_with_fault(name, "\"status\":503,\"retry_after\":1,"
	    "\"after\":true", "6#0", 1, 2, "35.00");
	json_decref(obj);
	free(name);
}

/* A create that took effect but lost its answer is not made twice. */
static void
retry_lost_create(void **state)
{
	struct k8s_status st = { 0 };
	char *name = uniq("lostc");
	json_t *in = task(name, "once"), *out = NULL;

	requests_clear();
	fault("{\"status\":503,\"after\":true,\"method\":\"POST\","
	    "\"match\":\"/agenttasks\"}");
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", in, &out,
	    &st), K8S_EUNAVAILABLE);
	assert_null(out);
	assert_int_equal(st.code, 503);
	assert_true(st.maybe_done);
	k8s_status_release(&st);
	assert_int_equal(storeenv_fake_count(&env, "POST", "/agenttasks"), 1);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &out,
	    &st), 0);
	json_decref(out);
	out = NULL;

	/* with Retry-After it is sent again: AlreadyExists, maybe its own */
	free(name);
	name = uniq("lostc");
	json_decref(in);
	in = task(name, "once");
	requests_clear();
	fault("{\"status\":503,\"retry_after\":1,\"after\":true,"
	    "\"method\":\"POST\",\"match\":\"/agenttasks\"}");
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", in, &out,
	    &st), K8S_EEXISTS);
	assert_true(st.maybe_done);
	k8s_status_release(&st);
	assert_int_equal(storeenv_fake_count(&env, "POST", "/agenttasks"), 2);

	/* a plain AlreadyExists is not one */
	assert_int_equal(k8s_create(api, &K8S_AGENTTASK, "default", in, &out,
	    &st), K8S_EEXISTS);
	assert_false(st.maybe_done);
	k8s_status_release(&st);
	json_decref(in);
	free(name);
}

/* What is still retried: reads, 429s, 5xx with Retry-After. */
static void
retry_policy(void **state)
{
	struct k8s_status st = { 0 };
	char *name = uniq("pol");
	json_t *obj = create_task("default", name), *out = NULL, *patch;

	patch = json_pack("{s:{s:s}}", "spec", "objective", "patched");
	/* a GET: on a 503 without Retry-After, and on a dropped connection */
	requests_clear();
	fault("{\"status\":503,\"count\":2,\"method\":\"GET\"}");
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &out,
	    &st), 0);
	json_decref(out);
	out = NULL;
	assert_int_equal(storeenv_fake_count(&env, "GET", name), 3);
	requests_clear();
	fault("{\"close\":true,\"method\":\"GET\"}");
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &out,
	    &st), 0);
	json_decref(out);
	out = NULL;
	assert_int_equal(storeenv_fake_count(&env, "GET", name), 2);
	/* not on a 501 Not Implemented: the same request gets the same */
	requests_clear();
	fault("{\"status\":501,\"method\":\"GET\"}");
	assert_int_not_equal(k8s_get(api, &K8S_AGENTTASK, "default", name,
	    &out, &st), 0);
	assert_int_equal(st.code, 501);
	k8s_status_release(&st);
	assert_int_equal(storeenv_fake_count(&env, "GET", name), 1);

	/*
	 * a write: on a 429 (here a bare one, as a proxy may send; the
	 * apiserver's own say Retry-After: 1), on a 503 with Retry-After
	 */
	requests_clear();
	fault("{\"status\":429,\"retry_after\":null,\"method\":\"PATCH\"}");
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", name, 0,
	    patch, NULL, &st), 0);
	assert_int_equal(storeenv_fake_count(&env, "PATCH", name), 2);
	requests_clear();
	fault("{\"status\":503,\"retry_after\":1,\"method\":\"PUT\"}");
	assert_int_equal(k8s_update(api, &K8S_AGENTTASK, "default", name, obj,
	    NULL, &st), K8S_ECONFLICT);	/* the patch moved it on */
	assert_true(st.maybe_done);
	k8s_status_release(&st);
	assert_int_equal(storeenv_fake_count(&env, "PUT", name), 2);

	/* not on a 500 without Retry-After, nor a dropped connection */
	requests_clear();
	fault("{\"status\":500,\"method\":\"PATCH\"}");
	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, "default", name, 0,
	    patch, NULL, &st), K8S_EINTERNAL);
	assert_int_equal(st.code, 500);
	k8s_status_release(&st);
	assert_int_equal(storeenv_fake_count(&env, "PATCH", name), 1);
	requests_clear();
	fault("{\"close\":true,\"method\":\"DELETE\"}");
	assert_int_equal(k8s_delete(api, &K8S_AGENTTASK, "default", name,
	    NULL, &st), K8S_EUNAVAILABLE);
	k8s_status_release(&st);
	assert_int_equal(storeenv_fake_count(&env, "DELETE", name), 1);
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &out,
	    &st), 0);
	json_decref(out);
	requests_clear();
	json_decref(patch);
	json_decref(obj);
	free(name);
}

/* A REST client of server (the fake's CA and token), settings cfg. */
static struct k8s_api *
server_api(const char *server, const struct k8s_rest_config *cfg)
{
	struct k8s_cluster c;
	struct k8s_api *a = NULL;
	char *cause = NULL;

	memset(&c, 0, sizeof(c));
	c.server = (char *)server;
	c.ca_file = env.fake_ca;
	c.token = (char *)"contract-token";
	assert_int_equal(k8s_rest_open(&a, &c, cfg, &cause), 0);
	return a;
}

/* A REST client of the fake with the retry settings cfg. */
static struct k8s_api *
fake_api(const struct k8s_rest_config *cfg)
{
	return server_api(env.fake_server, cfg);
}

/*
 * A call ends within its deadline, attempts and waits included, and a
 * Retry-After longer than what is left ends it at once with the error.
 */
static void
retry_deadline(void **state)
{
	struct k8s_rest_config cfg = { .connect_timeout_ms = 1000,
	    .timeout_ms = 5000, .max_retries = 10,
	    .max_retry_wait_ms = 10000, .deadline_ms = 2500 };
	struct k8s_status st = { 0 };
	struct k8s_api *short_api;
	char *name = uniq("late"), *rule;
	json_t *obj = create_task("default", name), *out = NULL, *patch;
	int64_t t0, took;

	/* the defaults (60 s): a Retry-After of 120 s is not waited for */
	requests_clear();
	fault("{\"status\":503,\"retry_after\":120,\"method\":\"GET\"}");
	t0 = now_mono_ms();
	assert_int_equal(k8s_get(api, &K8S_AGENTTASK, "default", name, &out,
	    &st), K8S_EUNAVAILABLE);
	took = now_mono_ms() - t0;
	assert_null(out);
	assert_int_equal(st.code, 503);
	k8s_status_release(&st);
	assert_true(took < 2000);
	assert_int_equal(storeenv_fake_count(&env, "GET", name), 1);

	short_api = fake_api(&cfg);

	/* an answer slower than the deadline: the attempt is cut there */
	requests_clear();
	rule = xasprintf("{\"ms\":4000,\"match\":\"/%s\"}", name);
	json_decref(storeenv_fake(&env, "POST", "/_fake/delay", rule));
	free(rule);
	t0 = now_mono_ms();
	assert_int_equal(k8s_get(short_api, &K8S_AGENTTASK, "default", name,
	    &out, &st), K8S_ETIMEOUT);
	took = now_mono_ms() - t0;
	k8s_status_release(&st);
	assert_true(took >= 2400 && took < 3500);

	/* slow 503s without end: retried until the deadline, not 11 times */
	requests_clear();
	rule = xasprintf("{\"ms\":900,\"count\":20,\"match\":\"/%s\"}",
	    name);
	json_decref(storeenv_fake(&env, "POST", "/_fake/delay", rule));
	free(rule);
	fault("{\"status\":503,\"count\":20,\"method\":\"GET\"}");
	t0 = now_mono_ms();
	assert_int_equal(k8s_get(short_api, &K8S_AGENTTASK, "default", name,
	    &out, &st), K8S_EUNAVAILABLE);
	took = now_mono_ms() - t0;
	k8s_status_release(&st);
	assert_true(took < 3500);
	assert_true(storeenv_fake_count(&env, "GET", name) >= 2);

	/* a Retry-After of 2 s with 2.5 s left: no time for an attempt */
	requests_clear();
	fault("{\"status\":429,\"retry_after\":2,\"method\":\"GET\"}");
	t0 = now_mono_ms();
	assert_int_equal(k8s_get(short_api, &K8S_AGENTTASK, "default", name,
	    &out, &st), K8S_EUNAVAILABLE);
	took = now_mono_ms() - t0;
	assert_int_equal(st.code, 429);
	k8s_status_release(&st);
	assert_true(took < 1500);
	/* one of 1 s is waited for */
	requests_clear();
	fault("{\"status\":429,\"retry_after\":1,\"method\":\"GET\"}");
	assert_int_equal(k8s_get(short_api, &K8S_AGENTTASK, "default", name,
	    &out, &st), 0);
	json_decref(out);
	assert_int_equal(storeenv_fake_count(&env, "GET", name), 2);
	k8s_api_free(short_api);

	/*
	 * a GET that runs out of its own time (timeout_ms) is not sent
	 * again: a server that slow would be asked again and again
	 */
	cfg.timeout_ms = 500;
	cfg.deadline_ms = 10000;
	short_api = fake_api(&cfg);
	requests_clear();
	rule = xasprintf("{\"ms\":1500,\"count\":20,\"match\":\"/%s\"}",
	    name);
	json_decref(storeenv_fake(&env, "POST", "/_fake/delay", rule));
	free(rule);
	assert_int_equal(k8s_get(short_api, &K8S_AGENTTASK, "default", name,
	    &out, &st), K8S_ETIMEOUT);
	k8s_status_release(&st);
	assert_int_equal(storeenv_fake_count(&env, "GET", name), 1);
	requests_clear();
	k8s_api_free(short_api);

	/* a write that never left (connection refused) was not done */
	cfg.max_retries = 1;
	short_api = server_api("https://127.0.0.1:1", &cfg);
	patch = json_pack("{s:{s:s}}", "spec", "objective", "never");
	assert_int_equal(k8s_patch(short_api, &K8S_AGENTTASK, "default", name,
	    0, patch, NULL, &st), K8S_EUNAVAILABLE);
	assert_false(st.maybe_done);
	k8s_status_release(&st);
	json_decref(patch);
	k8s_api_free(short_api);
	json_decref(obj);
	free(name);
}

/*
 * When the fake saw the first and the second request of method whose path
 * ends with suffix (its clock, s); -1 for one it did not see.
 */
static void
request_times(const char *method, const char *suffix, double t[2])
{
	json_t *reqs = storeenv_fake(&env, "GET", "/_fake/requests", NULL);
	json_t *r;
	const char *m, *p;
	size_t i, n = 0, sl = strlen(suffix);

	t[0] = t[1] = -1;
	json_array_foreach(reqs, i, r) {
		m = json_string_value(json_object_get(r, "method"));
		p = json_string_value(json_object_get(r, "path"));
		if (m == NULL || p == NULL || strcmp(m, method) != 0 ||
		    strlen(p) < sl || strcmp(p + strlen(p) - sl, suffix) != 0)
			continue;
		if (n < 2)
			t[n++] = json_real_value(json_object_get(r, "time"));
	}
	json_decref(reqs);
}

/*
 * A Retry-After longer than max_retry_wait_ms (the cap of the client's
 * own backoff) is waited in full, as client-go does: not cut short to
 * the cap (asking again sooner than the server said), nor ending the call
 * (the caller's requeue would come sooner still). One longer than the
 * call's deadline ends it (retry_deadline).
 */
static void
retry_after_cap(void **state)
{
	struct k8s_rest_config cfg = { .connect_timeout_ms = 1000,
	    .timeout_ms = 5000, .max_retries = 4,
	    .max_retry_wait_ms = 1000, .deadline_ms = 20000 };
	struct k8s_status st = { 0 };
	struct k8s_api *capped = fake_api(&cfg);
	char *name = uniq("cap");
	json_t *obj = create_task("default", name), *out = NULL, *patch;
	double t[2];

	(void)state;
	patch = json_pack("{s:{s:s}}", "spec", "objective", "capped");

	/* 2 s asked, a 1 s cap: asked again after 2 s */
	requests_clear();
	fault("{\"status\":429,\"retry_after\":2,\"method\":\"GET\"}");
	assert_int_equal(k8s_get(capped, &K8S_AGENTTASK, "default", name,
	    &out, &st), 0);
	json_decref(out);
	request_times("GET", name, t);
	fprintf(stderr, "# 429, Retry-After: 2: asked again after %.3f s\n",
	    t[1] - t[0]);
	assert_true(t[0] >= 0 && t[1] - t[0] >= 2.0);
	requests_clear();
	fault("{\"status\":503,\"retry_after\":2,\"method\":\"PATCH\"}");
	assert_int_equal(k8s_patch(capped, &K8S_AGENTTASK, "default", name,
	    0, patch, NULL, &st), 0);
	request_times("PATCH", name, t);
	fprintf(stderr, "# 503, Retry-After: 2: sent again after %.3f s\n",
	    t[1] - t[0]);
	assert_true(t[0] >= 0 && t[1] - t[0] >= 2.0);
	requests_clear();
	k8s_api_free(capped);
	json_decref(patch);
	json_decref(obj);
	free(name);
}

/* The next event of w that is not a BOOKMARK (10 s at most). */
static int
next_change(struct k8s_watch *w, struct k8s_event *ev,
    struct k8s_status *st)
{
	int64_t end = now_mono_ms() + 10000;
	int rc;

	do {
		memset(ev, 0, sizeof(*ev));
		rc = k8s_watch_next(w, 1000, ev, st);
		if (rc != 1 || ev->type != K8S_BOOKMARK)
			return rc;
		json_decref(ev->object);
	} while (now_mono_ms() < end);
	return 0;
}

/*
 * Patch task name's maxIterations to n (its new version in *rv); whether
 * the next change w sees is just that. Not an assertion: a test fails
 * only once its watch is freed (a failure would end the test, then the
 * suite's api, under the watch's thread).
 */
static int
patch_seen(struct k8s_watch *w, const char *ns, const char *name, int n,
    int64_t *rv)
{
	struct k8s_status st = { 0 };
	struct k8s_event ev;
	json_t *p = json_pack("{s:{s:i}}", "spec", "maxIterations", n);
	json_t *out = NULL;
	int ok;

	assert_int_equal(k8s_patch(api, &K8S_AGENTTASK, ns, name, 0, p,
	    &out, &st), 0);
	*rv = k8s_resource_version(out);
	ok = next_change(w, &ev, &st) == 1 && ev.type == K8S_MODIFIED &&
	    ev.rv == *rv;
	json_decref(ev.object);
	k8s_status_release(&st);
	json_decref(out);
	json_decref(p);
	return ok;
}

/* The i-th watch request in the fake's log (to json_decref), or NULL. */
static json_t *
watch_request(size_t want)
{
	json_t *reqs = storeenv_fake(&env, "GET", "/_fake/requests", NULL);
	json_t *r, *found = NULL;
	const char *q;
	size_t i, n = 0;

	json_array_foreach(reqs, i, r) {
		q = json_string_value(json_object_get(r, "query"));
		if (q != NULL && strstr(q, "watch=true") != NULL &&
		    n++ == want) {
			found = json_incref(r);
			break;
		}
	}
	json_decref(reqs);
	return found;
}

/* The resourceVersion the i-th watch request asked, 0 none, -1 no such. */
static int64_t
watch_request_rv(size_t want)
{
	json_t *r = watch_request(want);
	const char *v = json_string_value(json_object_get(r, "query"));
	int64_t rv = -1;

	if (v != NULL) {
		v = strstr(v, "resourceVersion=");
		rv = v != NULL ? strtoll(v + 16, NULL, 10) : 0;
	}
	json_decref(r);
	return rv;
}

/* When the fake saw the i-th watch request (its clock, s), -1 no such. */
static double
watch_request_time(size_t want)
{
	json_t *r = watch_request(want);
	double t = r != NULL ? json_real_value(json_object_get(r, "time")) :
	    -1;

	json_decref(r);
	return t;
}

/*
 * A watch stream the server ends (its timeout: the clean end of the
 * body; a dropped connection in the middle of an event line) goes on
 * from the last resourceVersion seen, without losing or repeating an
 * event; when that version is gone meanwhile, next() says 410.
 */
static void
watch_resume(void **state)
{
	char *ns = uniq("rs"), *name = uniq("rt");
	struct k8s_status st = { 0 };
	struct k8s_watch *w;
	struct k8s_event ev;
	json_t *obj, *j;
	int64_t rv1, rv2 = 0, rv3 = 0, rv4;
	int ok, rc;

	(void)state;
	memset(&ev, 0, sizeof(ev));
	requests_clear();
	w = watch_from_now(&K8S_AGENTTASK, ns, NULL);
	obj = create_task(ns, name);
	rv1 = k8s_resource_version(obj);
	ok = next_change(w, &ev, &st) == 1 && ev.type == K8S_ADDED &&
	    ev.rv == rv1;
	json_decref(ev.object);

	/* the clean end of the stream */
	j = storeenv_fake(&env, "POST", "/_fake/end_watches",
	    "{\"mode\":\"close\"}");
	ok = ok && json_integer_value(json_object_get(j, "watches")) >= 1;
	json_decref(j);
	ok = ok && patch_seen(w, ns, name, 4, &rv2);
	/* the stream cut in the middle of an event */
	j = storeenv_fake(&env, "POST", "/_fake/end_watches",
	    "{\"mode\":\"cut\"}");
	ok = ok && json_integer_value(json_object_get(j, "watches")) >= 1;
	json_decref(j);
	ok = ok && patch_seen(w, ns, name, 5, &rv3);
	ok = ok && patch_seen(w, ns, name, 6, &rv4);	/* and rv3 once */

	/* an ERROR event 410 (its revision compacted): the watch ends */
	json_decref(storeenv_fake(&env, "POST", "/_fake/end_watches",
	    "{\"mode\":\"expire\"}"));
	rc = ok ? next_change(w, &ev, &st) : 0;
	k8s_watch_free(w);
	assert_true(ok);
	assert_int_equal(rc, K8S_EGONE);
	assert_int_equal(st.code, 410);
	k8s_status_release(&st);
	/* each reconnect asked for what followed the last event seen */
	assert_true(watch_request_rv(1) >= rv1 && watch_request_rv(1) < rv2);
	assert_true(watch_request_rv(2) >= rv2 && watch_request_rv(2) < rv3);
	requests_clear();
	json_decref(obj);
	free(name);
	free(ns);
}

/*
 * A watch without a resourceVersion starts with a synthetic ADDED for
 * each object, in name order, not in resourceVersion order; the state
 * they show is as of the newest of them. A stream ended after them
 * resumes from there, not from the last one's version: else the newer
 * objects come again (or a 410, once the older version is compacted).
 */
static void
watch_resume_initial(void **state)
{
	char *ns = uniq("ri"), *older = uniq("b"), *newer = uniq("a");
	struct k8s_list_opts o = { NULL, NULL, NULL };
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	struct k8s_event ev;
	json_t *b = create_task(ns, older), *a = create_task(ns, newer);
	int64_t rv;
	int ok;

	(void)state;
	memset(&ev, 0, sizeof(ev));
	requests_clear();
	assert_int_equal(k8s_watch(api, &K8S_AGENTTASK, ns, &o, &w, &st), 0);
	ok = next_change(w, &ev, &st) == 1 && ev.type == K8S_ADDED &&
	    strcmp(k8s_meta_str(ev.object, "name"), newer) == 0;
	json_decref(ev.object);
	ok = ok && next_change(w, &ev, &st) == 1 && ev.type == K8S_ADDED &&
	    strcmp(k8s_meta_str(ev.object, "name"), older) == 0;
	json_decref(ev.object);
	json_decref(storeenv_fake(&env, "POST", "/_fake/end_watches",
	    "{\"mode\":\"close\"}"));
	/* the next change is the patch, not the newer task again */
	ok = ok && patch_seen(w, ns, older, 4, &rv);
	k8s_watch_free(w);
	k8s_status_release(&st);
	assert_true(ok);
	assert_true(watch_request_rv(1) >= k8s_resource_version(a));
	requests_clear();
	json_decref(a);
	json_decref(b);
	free(newer);
	free(older);
	free(ns);
}

/*
 * A watch refused with 429 and a Retry-After longer than the cap of a
 * call's waits connects again only once that Retry-After has passed:
 * the second request comes at least 3 s after the first (a lower bound,
 * which load cannot break).
 */
static void
watch_retry_after(void **state)
{
	struct k8s_rest_config cfg = { .connect_timeout_ms = 2000,
	    .timeout_ms = 10000, .max_retries = 4,
	    .max_retry_wait_ms = 1000, .deadline_ms = 20000 };
	struct k8s_list_opts o = { NULL, NULL, NULL };
	struct k8s_api *capped = fake_api(&cfg);
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	char *ns = uniq("wra");
	json_t *l = NULL;

	(void)state;
	assert_int_equal(k8s_list(capped, &K8S_AGENTTASK, ns, NULL, &l, &st),
	    0);
	o.resource_version = k8s_meta_str(l, "resourceVersion");
	requests_clear();
	fault("{\"status\":429,\"retry_after\":3,\"method\":\"GET\","
	    "\"match\":\"watch=true\"}");
	assert_int_equal(k8s_watch(capped, &K8S_AGENTTASK, ns, &o, &w, &st),
	    0);
	k8s_watch_free(w);
	w = NULL;
	assert_true(watch_request_time(1) >= 0);
	assert_true(watch_request_time(1) - watch_request_time(0) >= 3.0);
	/* a 503 without Retry-After is retried too, a 501 is not */
	requests_clear();
	fault("{\"status\":503,\"method\":\"GET\",\"match\":\"watch=true\"}");
	assert_int_equal(k8s_watch(capped, &K8S_AGENTTASK, ns, &o, &w, &st),
	    0);
	k8s_watch_free(w);
	w = NULL;
	assert_true(watch_request_time(1) >= 0);
	requests_clear();
	fault("{\"status\":501,\"method\":\"GET\",\"match\":\"watch=true\"}");
	assert_int_not_equal(k8s_watch(capped, &K8S_AGENTTASK, ns, &o, &w,
	    &st), 0);
	assert_int_equal(st.code, 501);
	k8s_status_release(&st);
	k8s_watch_free(w);
	assert_true(watch_request_time(1) < 0);
	requests_clear();
	json_decref(l);
	k8s_api_free(capped);
	free(ns);
}

/* A client of the fake that gives a broken watch up soon: 2 retries. */
static struct k8s_api *
few_retries_api(void)
{
	struct k8s_rest_config cfg = { .connect_timeout_ms = 2000,
	    .timeout_ms = 10000, .max_retries = 2,
	    .max_retry_wait_ms = 1000, .deadline_ms = 20000 };

	return fake_api(&cfg);
}

/*
 * Read w, ending its streams each time when end_streams, until it fails
 * (8 s at most): it must, saying the server keeps closing the stream.
 */
static void
watch_gives_up(struct k8s_watch *w, int end_streams)
{
	struct k8s_status st = { 0 };
	struct k8s_event ev;
	int64_t end = now_mono_ms() + 8000;
	int rc = 0;

	while (rc >= 0 && now_mono_ms() < end) {
		if (end_streams)
			json_decref(storeenv_fake(&env, "POST",
			    "/_fake/end_watches", "{\"mode\":\"close\"}"));
		memset(&ev, 0, sizeof(ev));
		rc = k8s_watch_next(w, 50, &ev, &st);
		if (rc > 0)
			json_decref(ev.object);
	}
	assert_true(rc < 0);
	assert_non_null(st.message);
	assert_non_null(strstr(st.message, "keeps closing"));
	k8s_status_release(&st);
}

/*
 * A server that ends every watch stream at once, before any event: the
 * client reconnects with a growing wait and, after max_retries such
 * ends in a row, gives up with an error (the caller lists again), not
 * reconnecting at once for ever.
 */
static void
watch_keeps_closing(void **state)
{
	struct k8s_list_opts o = { NULL, NULL, NULL };
	struct k8s_api *a = few_retries_api();
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	char *ns = uniq("wkc");

	(void)state;
	assert_int_equal(k8s_watch(a, &K8S_AGENTTASK, ns, &o, &w, &st), 0);
	watch_gives_up(w, 1);
	k8s_watch_free(w);
	requests_clear();
	k8s_api_free(a);
	free(ns);
}

/*
 * A server that answers every watch with one event the client had already
 * (its resourceVersion older than the resume point), then ends the
 * stream: that is no progress, and is backed off and given up as a stream
 * that ends at once is, not re-opened at once for ever (50 watches in
 * 53 ms before).
 */
static void
watch_stale_events(void **state)
{
	struct k8s_list_opts o = { NULL, NULL, NULL };
	struct k8s_api *a = few_retries_api();
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	char *ns = uniq("wst"), *suffix, *match, *line, *rule;
	json_t *t = create_task(ns, "t1"), *l = NULL, *j;

	(void)state;
	assert_int_equal(k8s_list(a, &K8S_AGENTTASK, ns, NULL, &l, &st), 0);
	o.resource_version = k8s_meta_str(l, "resourceVersion");
	j = json_pack("{s:s,s:{s:s,s:s,s:{s:s,s:s,s:s}}}", "type", "ADDED",
	    "object", "apiVersion", "divergedev.com/v1alpha1", "kind",
	    "AgentTask", "metadata", "name", "t1", "namespace", ns,
	    "resourceVersion", "1");
	rule = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	line = xasprintf("%s\n", rule);
	free(rule);
	suffix = xasprintf("/%s/agenttasks", ns);
	match = xasprintf("%s?watch=true", suffix);
	j = json_pack("{s:i,s:i,s:s,s:s,s:s}", "status", 200, "count", 50,
	    "method", "GET", "match", match, "body", line);
	rule = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	requests_clear();
	fault(rule);
	assert_int_equal(k8s_watch(a, &K8S_AGENTTASK, ns, &o, &w, &st), 0);
	watch_gives_up(w, 0);
	/* the first watch and max_retries more */
	assert_int_equal(storeenv_fake_count(&env, "GET", suffix), 3);
	k8s_watch_free(w);
	requests_clear();
	k8s_api_free(a);
	json_decref(l);
	json_decref(t);
	free(rule);
	free(match);
	free(line);
	free(suffix);
	free(ns);
}
#endif

/*
 * ---- a list longer than a page ----
 * The REST client reads lists in chunks of 500 (limit, continue), as
 * client-go's pager: one list of every item comes back, with the first
 * page's resourceVersion. The embedded store answers in one page.
 */

#define CHUNK_OBJECTS 1203
#define CHUNK_NS "chunks"
#define CHUNK_SEL "chunk=yes"

static char *
chunk_name(int i)
{
	return xasprintf("c-%04d", i);
}

static json_t *
chunk_secret(const char *name)
{
	return json_pack("{s:s,s:s,s:{s:s,s:{s:s}}}", "apiVersion", "v1",
	    "kind", "Secret", "metadata", "name", name, "labels", "chunk",
	    "yes");
}

/* Every c-NNNN of 0 to CHUNK_OBJECTS - 1, once, in order, and no other. */
static void
assert_chunk_list(const json_t *l)
{
	const json_t *items = json_object_get(l, "items"), *it;
	char *want;
	size_t i;

	assert_int_equal(json_array_size(items), CHUNK_OBJECTS);
	json_array_foreach(items, i, it) {
		want = chunk_name((int)i);
		assert_string_equal(k8s_meta_str(it, "name"), want);
		assert_string_equal(json_string_value(json_object_get(it,
		    "kind")), "Secret");
		free(want);
	}
	assert_string_equal(json_string_value(json_object_get(l, "kind")),
	    "SecretList");
	assert_null(json_object_get(json_object_get(l, "metadata"),
	    "remainingItemCount"));
}

#if STORE_MODE == 3
/* The secret of list l named name, or NULL. */
static const json_t *
chunk_item(const json_t *l, const char *name)
{
	const json_t *it;
	size_t i;

	json_array_foreach(json_object_get(l, "items"), i, it)
		if (strcmp(k8s_meta_str(it, "name"), name) == 0)
			return it;
	return NULL;
}

struct chunk_writer {
	pthread_t thread;
	int seen;		/* the first continue request arrived */
	int done;		/* and the writes below are made */
	atomic_int stop;	/* set by the test while the writer runs */
};

/* Whether the fake has seen a list request with a continue token. */
static int
saw_continue(void)
{
	json_t *reqs = storeenv_fake(&env, "GET", "/_fake/requests", NULL);
	const json_t *r;
	const char *q;
	size_t i;
	int seen = 0;

	json_array_foreach(reqs, i, r) {
		q = json_string_value(json_object_get(r, "query"));
		if (q != NULL && strstr(q, "continue=") != NULL)
			seen = 1;
	}
	json_decref(reqs);
	return seen;
}

/*
 * While the first continue request is held by the fake, change objects
 * the list has not reached and add some: none of it is in the list.
 */
static void *
chunk_write(void *arg)
{
	struct chunk_writer *w = arg;
	struct k8s_status st = { 0 };
	json_t *s, *p;

	while (!w->stop && !saw_continue())
		sleep_ms(20);
	if (w->stop)
		return NULL;
	w->seen = 1;
	s = chunk_secret("c-0000a");		/* before the cursor */
	if (k8s_create(api, &K8S_SECRET, CHUNK_NS, s, NULL, &st) < 0)
		goto out;
	json_decref(s);
	s = chunk_secret("c-9999");		/* after the last page */
	if (k8s_create(api, &K8S_SECRET, CHUNK_NS, s, NULL, &st) < 0)
		goto out;
	if (k8s_delete(api, &K8S_SECRET, CHUNK_NS, "c-1100", NULL, &st) < 0)
		goto out;
	p = json_pack("{s:{s:{s:s}}}", "metadata", "labels", "changed",
	    "yes");
	if (k8s_patch(api, &K8S_SECRET, CHUNK_NS, "c-0700", 0, p, NULL,
	    &st) == 0)
		w->done = 1;
	json_decref(p);
out:
	json_decref(s);
	k8s_status_release(&st);
	return NULL;
}

/* When the fake got the first request of method whose target has s. */
static double
request_time(const char *method, const char *s)
{
	json_t *reqs = storeenv_fake(&env, "GET", "/_fake/requests", NULL);
	const json_t *r;
	const char *m, *p, *q;
	double t = -1;
	size_t i;

	json_array_foreach(reqs, i, r) {
		m = json_string_value(json_object_get(r, "method"));
		p = json_string_value(json_object_get(r, "path"));
		q = json_string_value(json_object_get(r, "query"));
		if (m != NULL && strcmp(m, method) == 0 && ((p != NULL &&
		    strstr(p, s) != NULL) || (q != NULL &&
		    strstr(q, s) != NULL))) {
			t = json_number_value(json_object_get(r, "time"));
			break;
		}
	}
	json_decref(reqs);
	return t;
}

/*
 * The list requests of the fake's log: how many asked for a first page
 * (*first) and for a next one (*next); every one must say limit=500, and
 * no continue request may carry a resourceVersion.
 */
static void
chunk_requests(int *first, int *next)
{
	json_t *reqs = storeenv_fake(&env, "GET", "/_fake/requests", NULL);
	const json_t *r;
	const char *m, *q, *p;
	size_t i;

	*first = *next = 0;
	json_array_foreach(reqs, i, r) {
		m = json_string_value(json_object_get(r, "method"));
		p = json_string_value(json_object_get(r, "path"));
		q = json_string_value(json_object_get(r, "query"));
		if (m == NULL || strcmp(m, "GET") != 0 || p == NULL ||
		    strcmp(p, "/api/v1/namespaces/" CHUNK_NS "/secrets") != 0)
			continue;
		assert_non_null(q);
		assert_non_null(strstr(q, "limit=500"));
		assert_non_null(strstr(q, "labelSelector=chunk%3Dyes"));
		if (strstr(q, "continue=") != NULL) {
			assert_null(strstr(q, "resourceVersion="));
			(*next)++;
		} else
			(*first)++;
	}
	json_decref(reqs);
}
#endif

static void
list_chunks(void **state)
{
	struct k8s_list_opts o = { CHUNK_SEL, NULL, NULL };
	struct k8s_status st = { 0 };
	json_t *s, *l = NULL, *made = NULL;
	char *name, *rv;
	int i;
#if STORE_MODE == 3
	const json_t *it;
	struct chunk_writer w;
	int first, next;
#endif

	for (i = 0; i < CHUNK_OBJECTS; i++) {
		name = chunk_name(i);
		s = chunk_secret(name);
		json_decref(made);
		made = NULL;
		assert_int_equal(k8s_create(api, &K8S_SECRET, CHUNK_NS, s,
		    &made, &st), 0);
		json_decref(s);
		free(name);
	}
	rv = xstrdup(k8s_meta_str(made, "resourceVersion"));
	json_decref(made);
#if STORE_MODE == 3
	/*
	 * The first continue request is held 2 s while another thread
	 * makes, deletes and changes objects: the pages after the first
	 * are the first's snapshot, at its resourceVersion
	 */
	requests_clear();
	memset(&w, 0, sizeof(w));
	json_decref(storeenv_fake(&env, "POST", "/_fake/delay",
	    "{\"ms\":2000,\"match\":\"continue=\"}"));
	assert_int_equal(pthread_create(&w.thread, NULL, chunk_write, &w), 0);
#endif
	assert_int_equal(k8s_list(api, &K8S_SECRET, CHUNK_NS, &o, &l, &st),
	    0);
#if STORE_MODE == 3
	w.stop = 1;
	pthread_join(w.thread, NULL);
	assert_true(w.seen);
	assert_true(w.done);
	/* the writes were done while the continue request was held */
	assert_true(request_time("PATCH", "c-0700") <
	    request_time("GET", "continue=") + 1.5);
	assert_string_equal(k8s_meta_str(l, "resourceVersion"), rv);
	it = chunk_item(l, "c-0700");
	assert_non_null(it);
	assert_null(json_object_get(json_object_get(json_object_get(it,
	    "metadata"), "labels"), "changed"));
	assert_non_null(chunk_item(l, "c-1100"));
	assert_null(chunk_item(l, "c-0000a"));
	assert_null(chunk_item(l, "c-9999"));
	chunk_requests(&first, &next);
	assert_int_equal(first, 1);
	assert_int_equal(next, 2);	/* 500 + 500 + 203 */
#endif
	assert_chunk_list(l);
	json_decref(l);
	l = NULL;
#if STORE_MODE == 3
	/* put the objects back as they were listed */
	assert_int_equal(k8s_delete(api, &K8S_SECRET, CHUNK_NS, "c-0000a",
	    NULL, &st), 0);
	assert_int_equal(k8s_delete(api, &K8S_SECRET, CHUNK_NS, "c-9999",
	    NULL, &st), 0);
	s = chunk_secret("c-1100");
	assert_int_equal(k8s_create(api, &K8S_SECRET, CHUNK_NS, s, NULL,
	    &st), 0);
	json_decref(s);

	/*
	 * a continue token expired (410): the list starts again, once; its
	 * resourceVersion goes on first pages only (the server refuses it
	 * with a continue token)
	 */
	requests_clear();
	json_decref(storeenv_fake(&env, "POST", "/_fake/expire_continue",
	    "{\"count\":1}"));
	o.resource_version = rv;
	assert_int_equal(k8s_list(api, &K8S_SECRET, CHUNK_NS, &o, &l, &st),
	    0);
	o.resource_version = NULL;
	assert_chunk_list(l);
	json_decref(l);
	l = NULL;
	chunk_requests(&first, &next);
	assert_int_equal(first, 2);
	assert_int_equal(next, 3);	/* the expired one, then two */

	/* expired every time: three restarts, then the error, which says */
	requests_clear();
	json_decref(storeenv_fake(&env, "POST", "/_fake/expire_continue",
	    "{\"count\":100}"));
	assert_int_equal(k8s_list(api, &K8S_SECRET, CHUNK_NS, &o, &l, &st),
	    K8S_EGONE);
	assert_null(l);
	assert_int_equal(st.code, 410);
	assert_string_equal(st.reason, "Expired");
	assert_non_null(strstr(st.message, "continue token expired before "
	    "its last page 4 times in a row"));
	assert_non_null(strstr(st.message, "The provided continue parameter "
	    "is too old"));
	k8s_status_release(&st);
	chunk_requests(&first, &next);
	assert_int_equal(first, 4);
	assert_int_equal(next, 4);
	json_decref(storeenv_fake(&env, "DELETE", "/_fake/expire_continue",
	    NULL));
	requests_clear();
#endif
	free(rv);
}

#if STORE_MODE == 3
#define PAGES_NS "pages"
#define PAGES_MAX 1000		/* rest.c's LIST_MAX_PAGES */

/*
 * A fault rule: the next count GETs whose target has match get a page of
 * a secret list, with continue token cont and a secret of each uid.
 */
static json_t *
page_rule(const char *match, int count, const char *cont,
    const char *uid)
{
	json_t *items = json_array();

	if (uid != NULL)
		json_array_append_new(items, json_pack("{s:{s:s,s:s,s:s,s:s}}",
		    "metadata", "name", uid, "namespace", PAGES_NS, "uid", uid,
		    "resourceVersion", "7"));
	return json_pack("{s:i,s:i,s:s,s:s,s:{s:s,s:s,s:{s:s,s:s},s:o}}",
	    "status", 200, "count", count, "method", "GET", "match", match,
	    "body", "kind", "SecretList", "apiVersion", "v1", "metadata",
	    "resourceVersion", "7", "continue", cont, "items", items);
}

/*
 * Give the fake the page rules (taken) and a first page with continue
 * token cont and a secret first_uid: listing PAGES_NS's secrets must fail,
 * for why, after requests requests.
 */
static void
list_fails(json_t *rules, const char *cont, const char *first_uid,
    const char *why, int requests)
{
	struct k8s_status st = { 0 };
	json_t *l = NULL;
	char *s;

	json_array_append_new(rules, page_rule("secrets?limit=", 1, cont,
	    first_uid));
	s = json_dumps(rules, JSON_COMPACT);
	json_decref(rules);
	requests_clear();
	fault(s);
	free(s);
	assert_int_equal(k8s_list(api, &K8S_SECRET, PAGES_NS, NULL, &l, &st),
	    K8S_EINTERNAL);
	assert_null(l);
	assert_non_null(strstr(st.message, why));
	k8s_status_release(&st);
	assert_int_equal(storeenv_fake_count(&env, "GET", "/" PAGES_NS
	    "/secrets"), requests);
	requests_clear();
}

/*
 * A server (or a proxy in front of it) whose pages do not make one list:
 * continue tokens that come round again (A, B, A, ...: 202 pages before,
 * ended only by the fake's rules running out), a page repeating the items
 * of an earlier one (the continue parameter dropped on the way: the item
 * came twice before), tokens without end (1013 pages before, until the
 * rules ran out). The list fails, saying why, after the page that shows
 * it (or PAGES_MAX), not reading pages for ever and not returning items
 * twice.
 */
static void
list_bad_pages(void **state)
{
	json_t *rules;
	char match[32], cont[32];
	int i;

	(void)state;
	rules = json_array();
	json_array_append_new(rules, page_rule("continue=cyc-a", 100, "cyc-b",
	    "u-2"));
	json_array_append_new(rules, page_rule("continue=cyc-b", 100, "cyc-a",
	    NULL));
	list_fails(rules, "cyc-a", "u-1", "a continue token it gave before",
	    3);

	rules = json_array();
	json_array_append_new(rules, page_rule("continue=ovl-a", 1, "",
	    "u-1"));
	list_fails(rules, "ovl-a", "u-1", "items of an earlier page", 2);

	rules = json_array();
	for (i = 0; i <= PAGES_MAX + 10; i++) {
		snprintf(match, sizeof(match), "continue=t%05d", i);
		snprintf(cont, sizeof(cont), "t%05d", i + 1);
		json_array_append_new(rules, page_rule(match, 1, cont, NULL));
	}
	list_fails(rules, "t00000", NULL, "more than 1000 pages", PAGES_MAX);
}
#endif

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(create_get),
		cmocka_unit_test(not_found),
		cmocka_unit_test(update_conflicts),
		cmocka_unit_test(unconditional_update),
		cmocka_unit_test(status_subresource),
		cmocka_unit_test(merge_patch),
		cmocka_unit_test(validation),
		cmocka_unit_test(schema_limits),
		cmocka_unit_test(label_validation),
		cmocka_unit_test(list_selectors),
		cmocka_unit_test(delete_cascade),
		cmocka_unit_test(delete_preconditions),
		cmocka_unit_test(delete_finalizers),
		cmocka_unit_test(dangling_owner),
		cmocka_unit_test(delete_cycle),
		cmocka_unit_test(delete_orphan),
		cmocka_unit_test(delete_shared_dependent),
		cmocka_unit_test(watch_events),
		cmocka_unit_test(watch_bookmark_progress),
		cmocka_unit_test(watch_selector_transitions),
		cmocka_unit_test(watch_gone),
#if STORE_MODE != 3
		cmocka_unit_test(watch_gone_edge),
#endif
		cmocka_unit_test(noop_write),
		cmocka_unit_test(empty_resource_version),
		cmocka_unit_test(update_name_mismatch),
		cmocka_unit_test(delete_foreground_finalizers),
		cmocka_unit_test(owner_uid_mismatch),
		cmocka_unit_test(watch_namespace_scope),
		cmocka_unit_test(server_owned_fields),
		cmocka_unit_test(generation_tracking),
		cmocka_unit_test(orphan_drops_empty_owner_refs),
		cmocka_unit_test(delete_precondition_rv_only),
		cmocka_unit_test(optimistic_race),
		cmocka_unit_test(task_once),
		cmocka_unit_test(task_bump_refusals),
		cmocka_unit_test(list_chunks),
#if STORE_MODE == 1
		cmocka_unit_test(transactions),
		cmocka_unit_test(dry_run_keeps_versions),
		cmocka_unit_test(watch_window_bytes),
		cmocka_unit_test(objects_layout_migration),
		cmocka_unit_test(apiserver_off_loopback),
#endif
#if STORE_MODE == 3
		cmocka_unit_test(retry_lost_patch),
		cmocka_unit_test(retry_lost_create),
		cmocka_unit_test(retry_policy),
		cmocka_unit_test(retry_deadline),
		cmocka_unit_test(retry_after_cap),
		cmocka_unit_test(watch_retry_after),
		cmocka_unit_test(watch_keeps_closing),
		cmocka_unit_test(watch_stale_events),
		cmocka_unit_test(watch_resume),
		cmocka_unit_test(watch_resume_initial),
		cmocka_unit_test(list_bad_pages),
#endif
	};

	return cmocka_run_group_tests_name(STORE_MODE == 1 ? "store-embedded" :
	    STORE_MODE == 2 ? "store-http" : "store-fake", tests, setup,
	    teardown);
}
