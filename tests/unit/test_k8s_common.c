/* k8s common parts: selectors, RFC 7386, Status mapping, validation. */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "k8s/k8s.h"
#include "testutil.h"

static json_t *
labeled(const char *json_labels)
{
	json_t *labels = json_loads(json_labels, 0, NULL);

	return json_pack("{s:{s:s,s:s,s:o}}", "metadata", "name", "n1",
	    "namespace", "ns1", "labels", labels);
}

static int
matches(const char *sel, const char *labels)
{
	struct k8s_selector *s = NULL;
	char *cause = NULL;
	json_t *o = labeled(labels);
	int m;

	if (k8s_selector_parse(sel, &s, &cause) < 0) {
		free(cause);
		json_decref(o);
		return -1;
	}
	m = k8s_selector_match(s, o);
	k8s_selector_free(s);
	json_decref(o);
	return m;
}

static void
label_selectors(void **state)
{
	static const struct {
		const char *sel, *labels;
		int want;
	} cases[] = {
		{ "", "{}", 1 },
		{ "a=b", "{\"a\":\"b\"}", 1 },
		{ "a=b", "{\"a\":\"c\"}", 0 },
		{ "a==b", "{\"a\":\"b\"}", 1 },
		{ "a!=b", "{\"a\":\"b\"}", 0 },
		{ "a!=b", "{}", 1 },
		{ "a in (b, c)", "{\"a\":\"c\"}", 1 },
		{ "a in (b,c)", "{\"a\":\"d\"}", 0 },
		{ "a notin (b)", "{}", 1 },
		{ "a notin (b)", "{\"a\":\"b\"}", 0 },
		{ "a", "{\"a\":\"\"}", 1 },
		{ "a", "{}", 0 },
		{ "!a", "{}", 1 },
		{ "!a", "{\"a\":\"x\"}", 0 },
		{ "a=b,c!=d", "{\"a\":\"b\",\"c\":\"e\"}", 1 },
		{ "a=b,c!=d", "{\"a\":\"b\",\"c\":\"d\"}", 0 },
		{ "app.kubernetes.io/name=x", "{\"app.kubernetes.io/name\":\"x\"}", 1 },
		{ "a=", "{\"a\":\"\"}", 1 },
		{ "a in (b", "{}", -1 },
		{ "a=b,", "{}", -1 },
		{ "a<b", "{}", -1 },
		{ "=b", "{}", -1 },
		{ "a in b", "{}", -1 },
	};
	size_t i;
	char sel[512], labels[600], v63[64], v64[65], k253[254], n63[64];

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		int got = matches(cases[i].sel, cases[i].labels);

		if (got != cases[i].want)
			fprintf(stderr, "# selector '%s' on %s: %d\n",
			    cases[i].sel, cases[i].labels, got);
		assert_int_equal(got, cases[i].want);
	}
	/* a label value: 63 characters at most, alphanumeric at both ends */
	memset(v63, 'v', 63);
	v63[63] = '\0';
	memset(v64, 'v', 64);
	v64[64] = '\0';
	snprintf(sel, sizeof(sel), "a=%s", v63);
	snprintf(labels, sizeof(labels), "{\"a\":\"%s\"}", v63);
	assert_int_equal(matches(sel, labels), 1);
	snprintf(sel, sizeof(sel), "a!=%s", v63);
	assert_int_equal(matches(sel, labels), 0);
	snprintf(sel, sizeof(sel), "a in (b,%s)", v63);
	assert_int_equal(matches(sel, labels), 1);
	snprintf(sel, sizeof(sel), "a=%s", v64);
	assert_int_equal(matches(sel, "{}"), -1);
	snprintf(sel, sizeof(sel), "a==%s", v64);
	assert_int_equal(matches(sel, "{}"), -1);
	snprintf(sel, sizeof(sel), "a!=%s", v64);
	assert_int_equal(matches(sel, "{}"), -1);
	snprintf(sel, sizeof(sel), "a notin (%s)", v64);
	assert_int_equal(matches(sel, "{}"), -1);
	assert_int_equal(matches("a=-b", "{}"), -1);
	assert_int_equal(matches("a!=b.", "{}"), -1);
	assert_int_equal(matches("a in (b,_c)", "{}"), -1);
	assert_int_equal(matches("a=b-c.d_e", "{\"a\":\"b-c.d_e\"}"), 1);
	/* the longest key: a 253-character prefix, '/', a 63-character name */
	memset(k253, 'k', 253);
	k253[253] = '\0';
	memset(n63, 'n', 63);
	n63[63] = '\0';
	snprintf(sel, sizeof(sel), "%s/%s=x", k253, n63);
	snprintf(labels, sizeof(labels), "{\"%s/%s\":\"x\"}", k253, n63);
	assert_int_equal(matches(sel, labels), 1);
	snprintf(sel, sizeof(sel), "%s/%sn=x", k253, n63);
	assert_int_equal(matches(sel, "{}"), -1);
}

static void
field_selectors(void **state)
{
	struct k8s_selector *s = NULL;
	char *cause = NULL;
	json_t *o = labeled("{}");

	assert_int_equal(k8s_fieldsel_parse("metadata.name=n1", &s, &cause),
	    0);
	assert_true(k8s_selector_match(s, o));
	k8s_selector_free(s);
	assert_int_equal(k8s_fieldsel_parse("metadata.namespace!=ns1", &s,
	    &cause), 0);
	assert_false(k8s_selector_match(s, o));
	k8s_selector_free(s);
	/* a field value is a name: 253 characters, '-' or '.' anywhere */
	{
		char sel[300], name[255];

		memset(name, 'n', 253);
		name[253] = '\0';
		snprintf(sel, sizeof(sel), "metadata.name!=%s", name);
		assert_int_equal(k8s_fieldsel_parse(sel, &s, &cause), 0);
		assert_true(k8s_selector_match(s, o));
		k8s_selector_free(s);
		snprintf(sel, sizeof(sel), "metadata.name!=%sn", name);
		assert_int_equal(k8s_fieldsel_parse(sel, &s, &cause), -1);
		free(cause);
		assert_int_equal(k8s_fieldsel_parse("metadata.name!=-n1.",
		    &s, &cause), 0);
		assert_true(k8s_selector_match(s, o));
		k8s_selector_free(s);
	}
	assert_int_equal(k8s_fieldsel_parse("spec.x=1", &s, &cause), -1);
	assert_non_null(strstr(cause, "not supported"));
	free(cause);
	json_decref(o);
}

static void
merge_patch_rfc7386(void **state)
{
	/* the examples of RFC 7386 appendix A */
	static const char *const cases[][3] = {
		{ "{\"a\":\"b\"}", "{\"a\":\"c\"}", "{\"a\":\"c\"}" },
		{ "{\"a\":\"b\"}", "{\"b\":\"c\"}", "{\"a\":\"b\",\"b\":\"c\"}" },
		{ "{\"a\":\"b\"}", "{\"a\":null}", "{}" },
		{ "{\"a\":\"b\",\"b\":\"c\"}", "{\"a\":null}", "{\"b\":\"c\"}" },
		{ "{\"a\":[\"b\"]}", "{\"a\":\"c\"}", "{\"a\":\"c\"}" },
		{ "{\"a\":\"c\"}", "{\"a\":[\"b\"]}", "{\"a\":[\"b\"]}" },
		{ "{\"a\":{\"b\":\"c\"}}", "{\"a\":{\"b\":\"d\",\"c\":null}}",
		    "{\"a\":{\"b\":\"d\"}}" },
		{ "{\"a\":[{\"b\":\"c\"}]}", "{\"a\":[1]}", "{\"a\":[1]}" },
		{ "[\"a\",\"b\"]", "[\"c\",\"d\"]", "[\"c\",\"d\"]" },
		{ "{\"a\":\"b\"}", "[\"c\"]", "[\"c\"]" },
		{ "{\"a\":\"foo\"}", "null", "null" },
		{ "{\"a\":\"foo\"}", "\"bar\"", "\"bar\"" },
		{ "{\"e\":null}", "{\"a\":1}", "{\"e\":null,\"a\":1}" },
		{ "[1,2]", "{\"a\":\"b\",\"c\":null}", "{\"a\":\"b\"}" },
		{ "{}", "{\"a\":{\"bb\":{\"ccc\":null}}}",
		    "{\"a\":{\"bb\":{}}}" },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		json_t *t = json_loads(cases[i][0], JSON_DECODE_ANY, NULL);
		json_t *p = json_loads(cases[i][1], JSON_DECODE_ANY, NULL);
		json_t *w = json_loads(cases[i][2], JSON_DECODE_ANY, NULL);
		json_t *before = json_deep_copy(t);
		json_t *r = k8s_merge_patch(t, p);

		if (!json_equal(r, w)) {
			char *got = json_dumps(r, JSON_ENCODE_ANY);

			fprintf(stderr, "# case %zu: %s\n", i, got);
			free(got);
		}
		assert_true(json_equal(r, w));
		/* the target is not modified */
		assert_true(json_equal(t, before));
		json_decref(before);
		json_decref(t);
		json_decref(p);
		json_decref(w);
		json_decref(r);
	}
}

static void
status_mapping(void **state)
{
	struct k8s_status st = { 0 };
	json_t *j;

	assert_int_equal(k8s_err_from_http(409, "AlreadyExists"), K8S_EEXISTS);
	assert_int_equal(k8s_err_from_http(409, "Conflict"), K8S_ECONFLICT);
	assert_int_equal(k8s_err_from_http(410, "Expired"), K8S_EGONE);
	assert_int_equal(k8s_err_from_http(422, NULL), K8S_EINVALID);
	assert_int_equal(k8s_err_from_http(429, NULL), K8S_EUNAVAILABLE);
	assert_int_equal(k8s_err_from_http(504, NULL), K8S_ETIMEOUT);
	assert_int_equal(k8s_err_from_http(403, NULL), K8S_EFORBIDDEN);
	assert_int_equal(k8s_err_from_http(401, NULL), K8S_EUNAUTHORIZED);
	assert_int_equal(k8s_err_from_http(200, NULL), K8S_OK);
	assert_int_equal(k8s_error_notfound(&st, &K8S_AGENTTASK, "t9"),
	    K8S_ENOTFOUND);
	j = k8s_status_json(&st);
	assert_string_equal(json_string_value(json_object_get(j, "kind")),
	    "Status");
	assert_string_equal(json_string_value(json_object_get(j, "status")),
	    "Failure");
	assert_string_equal(json_string_value(json_object_get(j, "message")),
	    "agenttasks.divergedev.com \"t9\" not found");
	assert_int_equal(json_integer_value(json_object_get(j, "code")), 404);
	assert_string_equal(json_string_value(json_object_get(json_object_get(
	    j, "details"), "kind")), "agenttasks");
	k8s_status_release(&st);
	/* and back */
	assert_int_equal(k8s_status_from_json(&st, 404, j), K8S_ENOTFOUND);
	assert_string_equal(st.reason, "NotFound");
	json_decref(j);
	k8s_status_release(&st);
	assert_int_equal(k8s_error_conflict(&st, &K8S_SECRET, "s"),
	    K8S_ECONFLICT);
	assert_string_equal(st.message, "Operation cannot be fulfilled on "
	    "secrets \"s\": the object has been modified; please apply your "
	    "changes to the latest version and try again");
	k8s_status_release(&st);
	assert_ptr_equal(k8s_resource_find("divergedev.com", "v1alpha1",
	    "agenttasks"), &K8S_AGENTTASK);
	assert_ptr_equal(k8s_resource_find("", "v1", "secrets"), &K8S_SECRET);
	assert_null(k8s_resource_find("divergedev.com", "v1", "agenttasks"));
	assert_string_equal(k8s_api_version(&K8S_SECRET), "v1");
	assert_string_equal(k8s_api_version(&K8S_SANDBOX),
	    "agents.x-k8s.io/v1beta1");
}

static int
validate_text(const struct k8s_resource *r, const char *text,
    const char *want_field)
{
	struct k8s_status st = { 0 };
	json_t *o = json_loads(text, 0, NULL);
	int rc;

	assert_non_null(o);
	rc = k8s_validate(r, o, &st);
	if (want_field != NULL) {
		if (rc != K8S_EINVALID || strstr(st.message, want_field) ==
		    NULL)
			fprintf(stderr, "# %s -> %d %s\n", text, rc,
			    st.message ? st.message : "-");
		assert_int_equal(rc, K8S_EINVALID);
		assert_non_null(strstr(st.message, want_field));
		assert_string_equal(json_string_value(json_object_get(
		    json_array_get(json_object_get(st.details, "causes"), 0),
		    "field")), want_field);
	} else {
		if (rc != 0)
			fprintf(stderr, "# %s -> %s\n", text, st.message);
		assert_int_equal(rc, 0);
	}
	k8s_status_release(&st);
	json_decref(o);
	return rc;
}

#define T(spec) "{\"metadata\":{\"name\":\"t1\"},\"spec\":" spec "}"

static void
validation_rules(void **state)
{
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\"}"), NULL);
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\",\"draftPR\":"
	    "true,\"repository\":{\"url\":\"https://x\",\"baseBranch\":"
	    "\"main\"},\"maxIterations\":8,\"budgetUSD\":\"5.00\","
	    "\"budgetTokens\":200000,\"capabilities\":[\"claude-*\"],"
	    "\"allowedTools\":[],\"suspended\":false,\"sandbox\":{"
	    "\"provider\":\"agent-sandbox\",\"timeoutSeconds\":1800}}"), NULL);
	validate_text(&K8S_AGENTTASK, T("{}"), "spec.objective");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"\"}"),
	    "spec.objective");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":7}"),
	    "spec.objective");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"maxIterations\":-1}"), "spec.maxIterations");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"maxIterations\":\"3\"}"), "spec.maxIterations");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"budgetUSD\":\"5.1234567\"}"), "spec.budgetUSD");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"budgetUSD\":5}"), "spec.budgetUSD");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"capabilities\":[1]}"), "spec.capabilities[0]");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"sandbox\":{\"provider\":\"docker\"}}"), "spec.sandbox.provider");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"sandbox\":{\"timeoutSeconds\":0}}"),
	    "spec.sandbox.timeoutSeconds");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\",\"bogus\":1}"),
	    "spec.bogus");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"repository\":{\"branch\":\"x\"}}"), "spec.repository.branch");
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"t1\"},"
	    "\"spec\":{\"objective\":\"x\"},\"status\":{\"phase\":\"Running\"}}",
	    "status.phase");
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"t1\"},"
	    "\"spec\":{\"objective\":\"x\"},\"status\":{\"lastMeterRequestIds\":"
	    "[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\","
	    "\"12\",\"13\",\"14\",\"15\",\"16\",\"17\",\"18\",\"19\",\"20\","
	    "\"21\",\"22\",\"23\",\"24\",\"25\",\"26\",\"27\",\"28\",\"29\","
	    "\"30\",\"31\",\"32\",\"33\"]}}", "status.lastMeterRequestIds");
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"Bad_Name\"},"
	    "\"spec\":{\"objective\":\"x\"}}", "metadata.name");
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"t\","
	    "\"labels\":{\"a\":1}},\"spec\":{\"objective\":\"x\"}}",
	    "metadata.labels[a]");
	validate_text(&K8S_ENVIRONMENT, "{\"metadata\":{\"name\":\"e\"},"
	    "\"spec\":{\"port\":70000}}", "spec.port");
	validate_text(&K8S_ENVIRONMENT, "{\"metadata\":{\"name\":\"e\"},"
	    "\"spec\":{\"branch\":\"b\",\"port\":8080}}", NULL);
	validate_text(&K8S_SECRET, "{\"metadata\":{\"name\":\"s\"},"
	    "\"data\":{\"k\":\"not base64!\"}}", "data[k]");
	validate_text(&K8S_SECRET, "{\"metadata\":{\"name\":\"s\"},"
	    "\"data\":{\"k\":\"dmFsdWU=\"}}", NULL);
	/* objective: 4000 characters fit, 4001 do not (multi-byte counts 1) */
	{
		struct buf b;
		int i;

		buf_init(&b, 1 << 20);
		buf_addstr(&b, "{\"metadata\":{\"name\":\"t\"},\"spec\":"
		    "{\"objective\":\"");
		for (i = 0; i < 4000; i++)
			buf_addstr(&b, "\xc3\xa9");
		buf_addstr(&b, "\"}}");
		validate_text(&K8S_AGENTTASK, b.data, NULL);
		buf_reset(&b);
		buf_addstr(&b, "{\"metadata\":{\"name\":\"t\"},\"spec\":"
		    "{\"objective\":\"");
		for (i = 0; i < 4001; i++)
			buf_addstr(&b, "x");
		buf_addstr(&b, "\"}}");
		validate_text(&K8S_AGENTTASK, b.data, "spec.objective");
		buf_release(&b);
	}
}

/*
 * Names, label keys and values, and the typed fields, each just inside
 * and just outside what a cluster takes; and the first error found is
 * the one reported.
 */
static void
validation_syntax(void **state)
{
	static const struct {
		const char *name;
		int ok;
	} names[] = {
		{ "a", 1 }, { "a-b.c-d", 1 }, { "a--b", 1 }, { "1.2", 1 },
		{ "-a", 0 }, { "a-", 0 }, { ".a", 0 }, { "a.", 0 },
		{ "a..b", 0 }, { "a.-b", 0 }, { "a-.b", 0 }, { "A", 0 },
		{ "a_b", 0 },
	};
	static const struct {
		const char *labels;
		int ok;
	} labels[] = {
		{ "{\"k\":\"\"}", 1 },
		{ "{\"divergedev.com/repo\":\"v_1.x-y\"}", 1 },
		{ "{\"k\":\"-v\"}", 0 }, { "{\"k\":\"v-\"}", 0 },
		{ "{\"k\":\"a b\"}", 0 }, { "{\"k!\":\"v\"}", 0 },
		{ "{\"-k\":\"v\"}", 0 }, { "{\"Bad_Prefix/k\":\"v\"}", 0 },
		{ "{\"a..b/k\":\"v\"}", 0 }, { "{\"x.io/\":\"v\"}", 0 },
	};
	char *doc;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(names); i++) {
		doc = xasprintf("{\"metadata\":{\"name\":\"%s\"},\"spec\":"
		    "{\"objective\":\"x\"}}", names[i].name);
		validate_text(&K8S_AGENTTASK, doc, names[i].ok ? NULL :
		    "metadata.name");
		free(doc);
	}
	for (i = 0; i < ARRAY_SIZE(labels); i++) {
		doc = xasprintf("{\"metadata\":{\"name\":\"t\",\"labels\":%s},"
		    "\"spec\":{\"objective\":\"x\"}}", labels[i].labels);
		validate_text(&K8S_AGENTTASK, doc, labels[i].ok ? NULL :
		    "metadata.labels");
		free(doc);
	}
	/* annotation keys as label keys; their values are free */
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"t\","
	    "\"annotations\":{\"x.io/k\":\" any value -\"}},\"spec\":"
	    "{\"objective\":\"x\"}}", NULL);
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"t\","
	    "\"annotations\":{\"Bad_Prefix/k\":\"v\"}},\"spec\":"
	    "{\"objective\":\"x\"}}", "metadata.annotations");
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"t\","
	    "\"ownerReferences\":{}},\"spec\":{\"objective\":\"x\"}}",
	    "metadata.ownerReferences");
	/* USD's digit bounds are in validation_bounds; nothing may follow */
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"budgetUSD\":\"5.00 \"}"), "spec.budgetUSD");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"draftPR\":\"yes\"}"), "spec.draftPR");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"suspended\":1}"), "spec.suspended");
	/* two errors: the first found (spec.objective) is the one named */
	validate_text(&K8S_AGENTTASK, T("{\"maxIterations\":-1,"
	    "\"draftPR\":\"yes\"}"), "spec.objective");
}

/* n copies of c (a new string). */
static char *
rep(char c, size_t n)
{
	char *s = xmalloc(n + 1);

	memset(s, c, n);
	s[n] = '\0';
	return s;
}

/*
 * Each bound of the AgentTask checks, from both sides: the value at the
 * bound is taken, the next one refused with its field named. Moving any
 * bound by one fails here.
 */
static void
validation_bounds(void **state)
{
	/* each: a document around a string, the longest string it takes */
	static const struct {
		const char *pre, *post, *field;
		size_t max;
	} lens[] = {
		{ "{\"metadata\":{\"name\":\"", "\"},\"spec\":{\"objective\":"
		  "\"x\"}}", "metadata.name", 253 },
		{ "{\"metadata\":{\"name\":\"t\",\"labels\":{\"k\":\"",
		  "\"}},\"spec\":{\"objective\":\"x\"}}", "metadata.labels",
		  63 },
		/* the URL is 2048 long with its "https://" */
		{ "{\"metadata\":{\"name\":\"t1\"},\"spec\":{\"objective\":"
		  "\"x\",\"repository\":{\"url\":\"https://", "\"}}}",
		  "spec.repository.url", 2048 - 8 },
		{ "{\"metadata\":{\"name\":\"t1\"},\"spec\":{\"objective\":"
		  "\"x\",\"repository\":{\"baseBranch\":\"", "\"}}}",
		  "spec.repository.baseBranch", 255 },
		{ "{\"metadata\":{\"name\":\"t\"},\"spec\":{\"objective\":"
		  "\"x\"},\"status\":{\"message\":\"", "\"}}", "status.message",
		  32768 },
	};
	struct buf caps;
	char *doc, *v;
	size_t k;
	int i;

	(void)state;
	/*
	 * budgets in USD: at most 12 whole digits (its micro-USD fit an
	 * int64), and 1 to 6 decimals
	 */
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"budgetUSD\":\"999999999999.999999\"}"), NULL);
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"budgetUSD\":\"1000000000000\"}"), "spec.budgetUSD");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"budgetUSD\":\"5.\"}"), "spec.budgetUSD");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"budgetUSD\":\".5\"}"), "spec.budgetUSD");
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"t\"},"
	    "\"spec\":{\"objective\":\"x\"},\"status\":{\"costUSD\":"
	    "\"0.000001\"}}", NULL);
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"t\"},"
	    "\"spec\":{\"objective\":\"x\"},\"status\":{\"costUSD\":"
	    "\"1e3\"}}", "status.costUSD");
	/* integers */
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"budgetTokens\":1000000000000,\"maxIterations\":1000000,"
	    "\"sandbox\":{\"timeoutSeconds\":2592000}}"), NULL);
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"budgetTokens\":1000000000001}"), "spec.budgetTokens");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"maxIterations\":1000001}"), "spec.maxIterations");
	validate_text(&K8S_AGENTTASK, T("{\"objective\":\"x\","
	    "\"sandbox\":{\"timeoutSeconds\":2592001}}"),
	    "spec.sandbox.timeoutSeconds");
	/*
	 * string lengths (names and labels as the API server has them): the
	 * longest taken, one more refused
	 */
	for (k = 0; k < ARRAY_SIZE(lens); k++)
		for (i = 0; i < 2; i++) {
			v = rep('a', lens[k].max + (size_t)i);
			doc = xasprintf("%s%s%s", lens[k].pre, v,
			    lens[k].post);
			validate_text(&K8S_AGENTTASK, doc, i ? lens[k].field :
			    NULL);
			free(doc);
			free(v);
		}
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"a-b.c\"},"
	    "\"spec\":{\"objective\":\"x\"}}", NULL);
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"ab-\"},"
	    "\"spec\":{\"objective\":\"x\"}}", "metadata.name");
	validate_text(&K8S_AGENTTASK, "{\"metadata\":{\"name\":\"ab.\"},"
	    "\"spec\":{\"objective\":\"x\"}}", "metadata.name");
	/* 256 capabilities, then 257 */
	buf_init(&caps, 1 << 16);
	for (i = 0; i < 257; i++) {
		buf_printf(&caps, "%s\"m%d\"", i ? "," : "", i);
		if (i < 255)
			continue;
		doc = xasprintf(T("{\"objective\":\"x\",\"capabilities\":"
		    "[%s]}"), caps.data);
		validate_text(&K8S_AGENTTASK, doc, i == 256 ?
		    "spec.capabilities" : NULL);
		free(doc);
	}
	buf_release(&caps);
}

/* ---- tasks: amounts, hints, the admission queue ---- */

/*
 * s parses as USD (tokens: as a token amount) with max into want, or,
 * with why set, is refused with a message holding why and *out untouched.
 */
static void
amount_is(int usd, const char *s, int64_t max, int64_t want,
    const char *why)
{
	int64_t v = -7;
	char *cause = NULL;
	int rc = usd ? k8s_task_parse_usd(s, max, &v, &cause) :
	    k8s_task_parse_tokens(s, max, &v, &cause);

	if (why == NULL && (rc != 0 || v != want))
		fail_msg("'%s': rc %d, %lld, '%s'; wanted %lld", s ? s : "NULL",
		    rc, (long long)v, cause ? cause : "", (long long)want);
	if (why != NULL && (rc != -1 || v != -7 || cause == NULL ||
	    strstr(cause, why) == NULL))
		fail_msg("'%s': rc %d, %lld, '%s'; wanted the error '%s'",
		    s ? s : "NULL", rc, (long long)v, cause ? cause : "(none)",
		    why);
	free(cause);
}

#define USD_MAX K8S_TASK_MAX_BUMP_USD_MICRO
#define TOK_MAX K8S_TASK_MAX_BUMP_TOKENS

static void
task_usd_amounts(void **state)
{
	char *s;

	(void)state;
	amount_is(1, "5", USD_MAX, 5000000, NULL);
	amount_is(1, "+$5.25", USD_MAX, 5250000, NULL);
	amount_is(1, "$0.5", USD_MAX, 500000, NULL);
	amount_is(1, "15usd", USD_MAX, 15000000, NULL);
	amount_is(1, "15USD", USD_MAX, 15000000, NULL);
	amount_is(1, "15 dollars", USD_MAX, 0, "is not a USD amount");
	/* commas between groups of three, and only there */
	amount_is(1, "1,000", USD_MAX, USD_MAX, NULL);
	amount_is(1, "12,345.67", 0, 12345670000, NULL);
	amount_is(1, "1234,567", 0, 0, "is not an amount");
	amount_is(1, "1,23,456", 0, 0, "is not an amount");
	amount_is(1, "1,23", 0, 0, "is not an amount");
	amount_is(1, "1,2345", 0, 0, "is not an amount");
	amount_is(1, ",123", 0, 0, "is not an amount");
	amount_is(1, "5.", 0, 0, "is not an amount");
	amount_is(1, ".5", 0, 0, "is not an amount");
	amount_is(1, "1.234", 0, 0, "at most 2 decimals");
	amount_is(1, "-5", 0, 0, "a negative amount is not allowed");
	amount_is(1, "+-5", 0, 0, "a negative amount is not allowed");
	amount_is(1, "", 0, 0, "an amount is required");
	amount_is(1, NULL, 0, 0, "an amount is required");
	/* zero: no bump; the bound, and a cent over it */
	amount_is(1, "0", USD_MAX, 0, "a bump must be more than zero");
	amount_is(1, "0", 0, 0, NULL);
	amount_is(1, "1000.00", USD_MAX, USD_MAX, NULL);
	amount_is(1, "1,000.01", USD_MAX, 0, "a bump is at most $1000.00");
	/* 64 characters are read (and too large), 65 are not even read */
	s = xcalloc(1, 66);
	memset(s, '9', 64);
	amount_is(1, s, 0, 0, "the amount is too large");
	s[64] = '9';
	amount_is(1, s, 0, 0, "the amount is too long");
	memset(s, ',', 65);
	amount_is(1, s, 0, 0, "the amount is too long");
	free(s);
}

static void
task_token_amounts(void **state)
{
	(void)state;
	amount_is(0, "2000000", TOK_MAX, 2000000, NULL);
	amount_is(0, "2M", TOK_MAX, 2000000, NULL);
	amount_is(0, "500k", TOK_MAX, 500000, NULL);
	amount_is(0, "500K", TOK_MAX, 500000, NULL);
	amount_is(0, "+1,000", TOK_MAX, 1000, NULL);
	amount_is(0, "500kk", TOK_MAX, 0, "is not a token amount");
	amount_is(0, "5x", TOK_MAX, 0, "is not a token amount");
	amount_is(0, "$5", TOK_MAX, 0, "is not an amount");
	amount_is(0, "1.5M", TOK_MAX, 0, "a token amount is a whole number");
	amount_is(0, "0", TOK_MAX, 0, "a bump must be more than zero");
	amount_is(0, "100M", TOK_MAX, TOK_MAX, NULL);
	amount_is(0, "100,000,001", TOK_MAX, 0,
	    "a bump is at most 100000000 tokens");
	/* large, and past int64 by digits or by the suffix */
	amount_is(0, "1000000000000", 0, 1000000000000, NULL);
	amount_is(0, "99999999999999999999", 0, 0, "the amount is too large");
	amount_is(0, "9223372036854775k", 0, 9223372036854775000, NULL);
	amount_is(0, "9223372036854776k", 0, 0, "the amount is too large");
	amount_is(0, "9223372036855M", 0, 0, "the amount is too large");
}

static void
task_usd_format(void **state)
{
	static const struct {
		int64_t micro;
		const char *text;
	} rows[] = {
		{ 5000000, "5.00" }, { 1500000, "1.50" }, { 22500, "0.0225" },
		{ 1000001, "1.000001" }, { 10000, "0.01" }, { 1, "0.000001" },
		{ 120000, "0.12" }, { 0, "0.00" }, { -1, "0.00" },
		{ 1000000000, "1000.00" },
	};
	char out[32];
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(rows); i++) {
		k8s_task_format_usd(rows[i].micro, out);
		assert_string_equal(out, rows[i].text);
	}
}

/* hint passes, or is refused with a message holding why. */
static void
hint_is(const char *hint, const char *why)
{
	char *cause = NULL;
	int rc = k8s_task_check_hint(hint, &cause);

	if (why == NULL && rc != 0)
		fail_msg("'%s': %s", hint, cause);
	if (why != NULL && (rc != -1 || cause == NULL ||
	    strstr(cause, why) == NULL))
		fail_msg("'%s': rc %d, '%s'; wanted '%s'", hint ? hint :
		    "NULL", rc, cause ? cause : "(none)", why);
	free(cause);
}

static void
task_hints(void **state)
{
	char *s;

	(void)state;
	hint_is("  keep the API stable \n", NULL);
	hint_is("line one\n\tindented", NULL);
	hint_is("caf\xc3\xa9 \xf0\x9f\x99\x82", NULL);
	hint_is(NULL, "a hint is required");
	hint_is("", "the hint is empty");
	hint_is(" \t\r\n ", "the hint is empty");
	hint_is("colour \x1b[31mred", "control character");
	hint_is("a\rb", "control character");
	hint_is("del \x7f", "control character");
	hint_is("c1 \xc2\x85 next line", "control character");
	hint_is("c1 \xc2\x9f", "control character");
	hint_is("nbsp \xc2\xa0 is fine", NULL);
	hint_is("rlo \xe2\x80\xae", "bidirectional");
	hint_is("lre \xe2\x80\xaa", "bidirectional");
	hint_is("lri \xe2\x81\xa6", "bidirectional");
	hint_is("pdi \xe2\x81\xa9", "bidirectional");
	hint_is("lrm \xe2\x80\x8e is a mark, not an override", NULL);
	hint_is("bad \xff", "not valid UTF-8");
	hint_is("overlong \xc0\xaf", "not valid UTF-8");
	/* the bound, counted after trimming */
	s = xcalloc(1, K8S_TASK_MAX_HINT + 8);
	memset(s, 'a', K8S_TASK_MAX_HINT);
	hint_is(s, NULL);
	memmove(s + 2, s, K8S_TASK_MAX_HINT);
	s[0] = ' ';
	s[1] = '\n';
	hint_is(s, NULL);
	s[K8S_TASK_MAX_HINT + 2] = 'a';
	hint_is(s, "the hint is too long: 2001 bytes, at most 2000");
	free(s);
}

static json_t *
task_in(const char *text)
{
	json_t *j = json_loads(text, 0, NULL);

	assert_non_null(j);
	return j;
}

static void
task_slots(void **state)
{
	static const struct {
		const char *phase;
		int holds, wants;
	} rows[] = {
		{ "Provisioning", 1, 0 }, { "Active", 1, 0 },
		{ "Pausing", 1, 0 }, { "Pending", 0, 1 }, { "Paused", 0, 1 },
		{ "", 0, 1 }, { "Completed", 0, 0 }, { "Failed", 0, 0 },
	};
	json_t *t;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(rows); i++) {
		char *doc = xasprintf("{\"spec\":{},\"status\":"
		    "{\"phase\":\"%s\"}}", rows[i].phase);

		t = task_in(doc);
		if (k8s_task_holds_slot(t) != rows[i].holds ||
		    k8s_task_wants_slot(t) != rows[i].wants)
			fail_msg("%s: holds %d wants %d", rows[i].phase,
			    k8s_task_holds_slot(t), k8s_task_wants_slot(t));
		json_decref(t);
		free(doc);
	}
	t = task_in("{\"spec\":{}}");
	assert_true(k8s_task_wants_slot(t));
	assert_false(k8s_task_holds_slot(t));
	json_decref(t);
	/* paused by someone, or going away: wants none */
	t = task_in("{\"spec\":{\"suspended\":true},\"status\":"
	    "{\"phase\":\"Paused\"}}");
	assert_false(k8s_task_wants_slot(t));
	json_decref(t);
	t = task_in("{\"metadata\":{\"deletionTimestamp\":"
	    "\"2026-01-01T00:00:00Z\"},\"spec\":{},\"status\":"
	    "{\"phase\":\"Pending\"}}");
	assert_false(k8s_task_wants_slot(t));
	json_decref(t);
}

static void
task_queue(void **state)
{
	char *msg, *doc;
	int64_t ahead = 0;
	json_t *t;

	(void)state;
	msg = k8s_task_queue_message(3, 3, 2, 0);
	assert_string_equal(msg, "waiting for a free slot: 3 of 3 tasks are "
	    "running; 2 queued ahead");
	doc = xasprintf("{\"status\":{\"phase\":\"Pending\",\"reason\":"
	    "\"Queued\",\"message\":\"%s\"}}", msg);
	t = task_in(doc);
	assert_true(k8s_task_queued(t, &ahead));
	assert_int_equal(ahead, 2);
	assert_true(k8s_task_queued(t, NULL));
	json_decref(t);
	free(doc);
	free(msg);
	msg = k8s_task_queue_message(1, 1, 0, 1);
	assert_string_equal(msg, "waiting for a free slot to resume: 1 of 1 "
	    "tasks are running; 0 queued ahead");
	free(msg);
	/* another reason, another phase: not queued */
	t = task_in("{\"status\":{\"phase\":\"Pending\",\"reason\":"
	    "\"Created\",\"message\":\"x; 5 queued ahead\"}}");
	assert_false(k8s_task_queued(t, &ahead));
	assert_int_equal(ahead, -1);
	json_decref(t);
	t = task_in("{\"status\":{\"phase\":\"Active\",\"reason\":"
	    "\"Queued\",\"message\":\"x; 5 queued ahead\"}}");
	assert_false(k8s_task_queued(t, &ahead));
	json_decref(t);
	/* queued, its place unreadable: -1, not a number from elsewhere */
	t = task_in("{\"status\":{\"phase\":\"Paused\",\"reason\":"
	    "\"Queued\",\"message\":\"limit changed; 5 running\"}}");
	ahead = 0;
	assert_true(k8s_task_queued(t, &ahead));
	assert_int_equal(ahead, -1);
	json_decref(t);
	t = task_in("{\"status\":{\"phase\":\"Paused\",\"reason\":"
	    "\"Queued\",\"message\":\"waiting; 99999999999999999999 queued "
	    "ahead\"}}");
	assert_true(k8s_task_queued(t, &ahead));
	assert_int_equal(ahead, -1);
	json_decref(t);
}

static void
task_settled(void **state)
{
	static const struct {
		const char *del, *phase;
		int observed;
		const char *token, *stalled;
		int settled;
	} rows[] = {
		{ "", "Completed", 2, "False", "False", 1 },
		{ "", "Failed", 2, "False", "False", 1 },
		{ "", "Paused", 2, "False", "False", 0 },
		{ "", "Completed", 1, "False", "False", 0 },
		{ "", "Completed", 2, "True", "False", 0 },
		{ "", "Completed", 2, "False", "True", 0 },
		{ ",\"deletionTimestamp\":\"2026-01-01T00:00:00Z\"",
		    "Completed", 2, "False", "False", 0 },
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(rows); i++) {
		char *doc = xasprintf("{\"metadata\":{\"generation\":2%s},"
		    "\"status\":{\"phase\":\"%s\",\"observedGeneration\":%d,"
		    "\"conditions\":[{\"type\":\"TokenIssued\",\"status\":"
		    "\"%s\"},{\"type\":\"Stalled\",\"status\":\"%s\"}]}}",
		    rows[i].del, rows[i].phase,
		    rows[i].observed, rows[i].token, rows[i].stalled);
		json_t *t = task_in(doc);

		if (k8s_task_settled(t) != rows[i].settled)
			fail_msg("row %zu: settled %d", i, k8s_task_settled(t));
		json_decref(t);
		free(doc);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(label_selectors),
		cmocka_unit_test(field_selectors),
		cmocka_unit_test(merge_patch_rfc7386),
		cmocka_unit_test(status_mapping),
		cmocka_unit_test(validation_rules),
		cmocka_unit_test(validation_bounds),
		cmocka_unit_test(validation_syntax),
		cmocka_unit_test(task_usd_amounts),
		cmocka_unit_test(task_token_amounts),
		cmocka_unit_test(task_usd_format),
		cmocka_unit_test(task_hints),
		cmocka_unit_test(task_slots),
		cmocka_unit_test(task_queue),
		cmocka_unit_test(task_settled),
	};

	util_json_init();
	return cmocka_run_group_tests_name("k8s-common", tests, NULL, NULL);
}
