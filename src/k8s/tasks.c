/*
 * The AgentTask operations that people start, from the command line
 * (diverge task ...) or from a pull request (/diverge ...): guidance,
 * pause, resume and budget bumps, with the amount and hint rules they
 * share. See k8s.h for the contracts.
 *
 * Every write is a conditional merge patch: the resourceVersion read goes
 * into the patch, so that the API refuses it with 409 Conflict when
 * anything (a meter charge, the reconciler, another person) wrote the
 * task in between, and the whole operation then starts again from a fresh
 * read. A merge patch rather than a PUT of the whole object, so that
 * fields this code does not know about are never written back.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <yaml.h>

#include "config/config.h"
#include "k8s/k8s.h"
#include "meter/meter.h"
#include "util/util.h"

/* Longest amount word looked at (with its commas and suffix). */
#define MAX_AMOUNT 64

/* ---- amounts ---- */

/*
 * The digits of an amount word: after an optional '+' (and '$' when usd),
 * digits grouped by commas or not, then optionally '.' and decimals, then
 * the rest (a suffix). Copies the integer digits without commas into
 * whole, the decimals into frac, and points *rest at what follows.
 */
static int
amount_split(const char *s, int usd, char *whole, char *frac,
    const char **rest, char **cause)
{
	const char *p = s, *q;
	size_t n = 0, f = 0, group = 0;
	int commas = 0;

	if (s == NULL || s[0] == '\0') {
		*cause = xstrdup("an amount is required");
		return -1;
	}
	if (strlen(s) > MAX_AMOUNT) {
		*cause = xstrdup("the amount is too long");
		return -1;
	}
	if (*p == '+')
		p++;
	if (usd && *p == '$')
		p++;
	if (*p == '-') {
		*cause = xasprintf("'%s': bumps only add, a negative amount is "
		    "not allowed", s);
		return -1;
	}
	for (q = p; (*q >= '0' && *q <= '9') || *q == ','; q++) {
		if (*q == ',') {
			/* 1 to 3 digits before the first comma, 3 after */
			if ((commas == 0 && (group == 0 || group > 3)) ||
			    (commas > 0 && group != 3))
				goto bad;
			commas++;
			group = 0;
			continue;
		}
		whole[n++] = *q;
		group++;
	}
	if (n == 0 || (commas > 0 && group != 3))
		goto bad;
	whole[n] = '\0';
	if (*q == '.') {
		for (q++; *q >= '0' && *q <= '9'; q++)
			frac[f++] = *q;
		if (f == 0)
			goto bad;
	}
	frac[f] = '\0';
	*rest = q;
	return 0;
bad:
	*cause = xasprintf("'%s' is not an amount", s);
	return -1;
}

/* Parse a USD amount into micro-USD (the slash-command rules). */
int
k8s_task_parse_usd(const char *s, int64_t max, int64_t *out, char **cause)
{
	char whole[MAX_AMOUNT + 1], frac[MAX_AMOUNT + 1], *num = NULL;
	const char *rest;
	int64_t v;
	int ret = -1;

	if (amount_split(s, 1, whole, frac, &rest, cause) < 0)
		goto out;
	if (rest[0] != '\0' && strcasecmp(rest, "usd") != 0) {
		*cause = xasprintf("'%s' is not a USD amount (write 15 or "
		    "15.00)", s);
		goto out;
	}
	if (strlen(frac) > 2) {
		*cause = xasprintf("'%s': at most 2 decimals (cents)", s);
		goto out;
	}
	num = frac[0] != '\0' ? xasprintf("%s.%s", whole, frac) :
	    xstrdup(whole);
	v = config_parse_usd(num);
	if (v < 0) {
		*cause = xasprintf("'%s': the amount is too large", s);
		goto out;
	}
	if (max > 0 && v == 0) {
		*cause = xasprintf("'%s': a bump must be more than zero", s);
		goto out;
	}
	if (max > 0 && v > max) {
		*cause = xasprintf("'%s': a bump is at most $%" PRId64
		    ".%02" PRId64, s, max / 1000000, max % 1000000 / 10000);
		goto out;
	}
	*out = v;
	ret = 0;
out:
	free(num);
	return ret;
}

/* Parse a token amount: an integer, optionally with a k or M suffix. */
int
k8s_task_parse_tokens(const char *s, int64_t max, int64_t *out,
    char **cause)
{
	char whole[MAX_AMOUNT + 1], frac[MAX_AMOUNT + 1];
	const char *rest, *p;
	int64_t v = 0, mult = 1;

	if (amount_split(s, 0, whole, frac, &rest, cause) < 0)
		return -1;
	if (frac[0] != '\0') {
		*cause = xasprintf("'%s': a token amount is a whole number",
		    s);
		return -1;
	}
	if (rest[0] == 'k' || rest[0] == 'K')
		mult = 1000;
	else if (rest[0] == 'm' || rest[0] == 'M')
		mult = 1000000;
	if (rest[0] != '\0' && (mult == 1 || rest[1] != '\0')) {
		*cause = xasprintf("'%s' is not a token amount (write "
		    "2000000, 2M or 500k)", s);
		return -1;
	}
	for (p = whole; *p != '\0'; p++) {
		if (v > (INT64_MAX - 9) / 10)
			goto toolarge;
		v = v * 10 + (*p - '0');
	}
	if (v > INT64_MAX / mult)
		goto toolarge;
	v *= mult;
	if (max > 0 && v == 0) {
		*cause = xasprintf("'%s': a bump must be more than zero", s);
		return -1;
	}
	if (max > 0 && v > max) {
		*cause = xasprintf("'%s': a bump is at most %" PRId64
		    " tokens", s, max);
		return -1;
	}
	*out = v;
	return 0;
toolarge:
	*cause = xasprintf("'%s': the amount is too large", s);
	return -1;
}

/* Format micro-USD for people and for spec.budgetUSD. */
void
k8s_task_format_usd(int64_t micro, char out[32])
{
	size_t n;

	if (micro < 0)
		micro = 0;
	if (micro % 10000 == 0) {
		snprintf(out, 32, "%" PRId64 ".%02" PRId64, micro / 1000000,
		    micro % 1000000 / 10000);
		return;
	}
	snprintf(out, 32, "%" PRId64 ".%06" PRId64, micro / 1000000,
	    micro % 1000000);
	n = strlen(out);
	while (n > 0 && out[n - 1] == '0')
		out[--n] = '\0';
}

/* ---- hints ---- */

static int
is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* The trimmed extent of s. */
static void
trim(const char *s, size_t *start, size_t *len)
{
	size_t a = 0, b = strlen(s);

	while (a < b && is_space(s[a]))
		a++;
	while (b > a && is_space(s[b - 1]))
		b--;
	*start = a;
	*len = b - a;
}

/* Check a guidance hint (the rules of /diverge guide). */
int
k8s_task_check_hint(const char *hint, char **cause)
{
	const unsigned char *p;
	size_t start, len, i, k;
	uint32_t cp;

	if (hint == NULL) {
		*cause = xstrdup("a hint is required");
		return -1;
	}
	trim(hint, &start, &len);
	if (len == 0) {
		*cause = xstrdup("the hint is empty");
		return -1;
	}
	if (len > K8S_TASK_MAX_HINT) {
		*cause = xasprintf("the hint is too long: %zu bytes, at most "
		    "%d", len, K8S_TASK_MAX_HINT);
		return -1;
	}
	p = (const unsigned char *)hint + start;
	for (i = 0; i < len; i += k) {
		k = utf8_next(p + i, len - i, &cp);
		if (k == 0) {
			*cause = xstrdup("the hint is not valid UTF-8");
			return -1;
		}
		if ((cp < 0x20 && cp != '\n' && cp != '\t') ||
		    (cp >= 0x7f && cp < 0xa0)) {
			*cause = xstrdup("the hint holds a control character");
			return -1;
		}
		/* bidi embeddings, overrides and isolates hide text */
		if ((cp >= 0x202a && cp <= 0x202e) ||
		    (cp >= 0x2066 && cp <= 0x2069)) {
			*cause = xstrdup("the hint holds a bidirectional "
			    "control character");
			return -1;
		}
	}
	return 0;
}

/* ---- names ---- */

/* A new random task name. */
void
k8s_task_name_new(char out[K8S_TASK_NAME_MAX])
{
	static const char alnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
	unsigned char rnd[32];
	size_t i, n = 0;

	memcpy(out, "task-", 5);
	while (n < 6) {
		if (random_bytes(rnd, sizeof(rnd)) < 0) {
			log_kv(LOG_ERROR, "k8s: no random bytes", NULL);
			abort();
		}
		/* 252 = 7 * 36: no bias */
		for (i = 0; i < sizeof(rnd) && n < 6; i++)
			if (rnd[i] < 252)
				out[5 + n++] = alnum[rnd[i] % 36];
	}
	out[11] = '\0';
}

/* The status of condition type of task, or NULL. */
static const char *
cond_status(const json_t *task, const char *type)
{
	const json_t *c;
	size_t i;

	json_array_foreach(json_object_get(json_object_get(task, "status"),
	    "conditions"), i, c) {
		const char *t = json_string_value(json_object_get(c, "type"));

		if (t != NULL && strcmp(t, type) == 0)
			return json_string_value(json_object_get(c, "status"));
	}
	return NULL;
}

int
k8s_task_stalled(const json_t *task)
{
	const char *s = cond_status(task, "Stalled");

	return s != NULL && strcmp(s, "True") == 0;
}

int
k8s_task_settled(const json_t *task)
{
	const json_t *meta = json_object_get(task, "metadata");
	const json_t *status = json_object_get(task, "status");
	const char *p = json_string_value(json_object_get(status, "phase"));
	const char *tok = cond_status(task, "TokenIssued");

	return p != NULL && (strcmp(p, "Completed") == 0 ||
	    strcmp(p, "Failed") == 0) &&
	    json_object_get(meta, "deletionTimestamp") == NULL &&
	    json_integer_value(json_object_get(meta, "generation")) ==
	    json_integer_value(json_object_get(status, "observedGeneration")) &&
	    (tok == NULL || strcmp(tok, "True") != 0) &&
	    !k8s_task_stalled(task);
}

/* ---- the admission queue ---- */

/* Whether the task holds a slot of controller.max_active_tasks. */
int
k8s_task_holds_slot(const json_t *task)
{
	const char *p = json_string_value(json_object_get(json_object_get(
	    task, "status"), "phase"));

	return p != NULL && (strcmp(p, "Provisioning") == 0 ||
	    strcmp(p, "Active") == 0 || strcmp(p, "Pausing") == 0);
}

/* Whether the task would take a slot as soon as one is free. */
int
k8s_task_wants_slot(const json_t *task)
{
	const json_t *meta = json_object_get(task, "metadata");
	const char *p = json_string_value(json_object_get(json_object_get(
	    task, "status"), "phase"));

	if (json_object_get(meta, "deletionTimestamp") != NULL ||
	    json_is_true(json_object_get(json_object_get(task, "spec"),
	    "suspended")))
		return 0;
	return p == NULL || *p == '\0' || strcmp(p, "Pending") == 0 ||
	    strcmp(p, "Paused") == 0;
}

/* Whether the task waits for a slot, and how many wait ahead of it. */
int
k8s_task_queued(const json_t *task, int64_t *ahead)
{
	const json_t *st = json_object_get(task, "status");
	const char *p = json_string_value(json_object_get(st, "phase"));
	const char *r = json_string_value(json_object_get(st, "reason"));
	const char *m = json_string_value(json_object_get(st, "message"));
	const char *semi;
	long long n;
	char *end;

	if (ahead != NULL)
		*ahead = -1;
	if (p == NULL || (strcmp(p, "Pending") != 0 &&
	    strcmp(p, "Paused") != 0) || r == NULL ||
	    strcmp(r, K8S_TASK_REASON_QUEUED) != 0)
		return 0;
	if (ahead == NULL || m == NULL || (semi = strrchr(m, ';')) == NULL ||
	    semi[1] != ' ' || semi[2] < '0' || semi[2] > '9')
		return 1;
	errno = 0;
	n = strtoll(semi + 2, &end, 10);
	if (errno == 0 && strcmp(end, " queued ahead") == 0)
		*ahead = n;
	return 1;
}

/* The status.message of a queued task. */
char *
k8s_task_queue_message(int64_t running, int64_t limit, int64_t ahead,
    int resume)
{
	return xasprintf(K8S_TASK_QUEUE_WAIT "%s: %" PRId64 " of %" PRId64
	    " tasks are running; %" PRId64 " queued ahead", resume ?
	    " to resume" : "", running, limit, ahead);
}

/* ---- budgets ---- */

static int64_t
spec_usd(const json_t *spec)
{
	const char *s = json_string_value(json_object_get(spec,
	    "budgetUSD"));
	int64_t v = s != NULL ? config_parse_usd(s) : 0;

	return v > 0 ? v : 0;
}

static int64_t
spec_tokens(const json_t *spec)
{
	json_t *v = json_object_get(spec, "budgetTokens");

	return json_is_integer(v) && json_integer_value(v) > 0 ?
	    json_integer_value(v) : 0;
}

/*
 * The task's capability token from its Secret "<task>-token", parsed
 * (not verified: only its caveats are read), or NULL. A token whose
 * task_id or namespace caveat names another task is not this task's.
 */
static struct macaroon *
task_token(struct k8s_api *api, const json_t *task)
{
	const char *name = k8s_meta_str(task, "name");
	const char *ns = k8s_meta_str(task, "namespace");
	const char *b64, *v;
	struct macaroon *m = NULL;
	unsigned char *raw = NULL;
	json_t *sec = NULL;
	size_t n = 0;
	char *sname = NULL;

	if (api == NULL || name == NULL)
		goto out;
	sname = xasprintf("%s-token", name);
	if (k8s_get(api, &K8S_SECRET, ns, sname, &sec, NULL) < 0)
		goto out;
	b64 = json_string_value(json_object_get(json_object_get(sec, "data"),
	    "token"));
	if (b64 == NULL || base64_decode(b64, strlen(b64), &raw, &n) < 0)
		goto out;
	if (macaroon_inspect((const char *)raw, n, &m, NULL) != 0) {
		m = NULL;
		goto out;
	}
	v = macaroon_value(m, "task_id");
	if (v == NULL || strcmp(v, name) != 0)
		goto bad;
	v = macaroon_value(m, "namespace");
	if (ns != NULL && (v == NULL || strcmp(v, ns) != 0))
		goto bad;
	goto out;
bad:
	macaroon_free(m);
	m = NULL;
out:
	if (raw != NULL) {
		secure_wipe(raw, n);
		free(raw);
	}
	json_decref(sec);
	free(sname);
	return m;
}

/* The effective budgets of a task, as the meter computes them. */
void
k8s_task_budgets(struct k8s_api *api, const json_t *task,
    int64_t default_usd_micro, int64_t default_tokens,
    struct k8s_task_budgets *out)
{
	const json_t *spec = json_object_get(task, "spec");
	struct macaroon *m = NULL;
	int64_t usd = spec_usd(spec), tokens = spec_tokens(spec), v;

	memset(out, 0, sizeof(*out));
	if (usd > 0) {
		out->usd.value = usd;
		out->usd.source = K8S_TASK_SPEC;
	}
	if (tokens > 0) {
		out->tokens.value = tokens;
		out->tokens.source = K8S_TASK_SPEC;
	}
	if (usd > 0 && tokens > 0)
		return;
	m = task_token(api, task);
	if (usd == 0) {
		if (m != NULL && macaroon_max_cost_usd(m, &v) == 0) {
			out->usd.value = v;
			out->usd.source = K8S_TASK_TOKEN;
		} else if (default_usd_micro >= 0) {
			out->usd.value = default_usd_micro;
			out->usd.source = K8S_TASK_DEFAULT;
		} else if (m != NULL) {
			/* minted when the default was 0: unlimited */
			out->usd.value = 0;
			out->usd.source = K8S_TASK_TOKEN;
		}
	}
	if (tokens == 0) {
		if (m != NULL && macaroon_max_tokens(m, &v) == 0) {
			out->tokens.value = v;
			out->tokens.source = K8S_TASK_TOKEN;
		} else if (default_tokens >= 0) {
			out->tokens.value = default_tokens;
			out->tokens.source = K8S_TASK_DEFAULT;
		} else if (m != NULL) {
			out->tokens.value = 0;
			out->tokens.source = K8S_TASK_TOKEN;
		}
	}
	macaroon_free(m);
}

/* ---- .diverge/agent.yaml ---- */

/* A child object of o, created when missing. */
static json_t *
child(json_t *o, const char *key)
{
	json_t *c = json_object_get(o, key);

	if (!json_is_object(c)) {
		c = json_object();
		json_object_set_new(o, key, c);
	}
	return c;
}

/* A parse error: "NAME:LINE: what". */
struct yerr {
	const char *file;
	char *msg;
};

static int
yfail(struct yerr *e, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int
yfail(struct yerr *e, const yaml_node_t *n, const char *fmt, ...)
{
	va_list ap;
	char *what;

	va_start(ap, fmt);
	what = xvasprintf(fmt, ap);
	va_end(ap);
	free(e->msg);
	e->msg = xasprintf("%s:%lu: %s", e->file, n != NULL ?
	    (unsigned long)n->start_mark.line + 1 : 1UL, what);
	free(what);
	return -1;
}

/* The text of a scalar node (NUL-terminated by libyaml). */
static const char *
ytext(const yaml_node_t *n)
{
	return (const char *)n->data.scalar.value;
}

/* A scalar left empty or written null: "not set". */
static int
ynull(const yaml_node_t *n)
{
	const char *s;

	if (n->type != YAML_SCALAR_NODE ||
	    n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return 0;
	s = ytext(n);
	return s[0] == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0;
}

static int
ystring(struct yerr *e, const yaml_node_t *n, const char *key, json_t *dst,
    const char *field)
{
	if (ynull(n))
		return 0;
	if (n->type != YAML_SCALAR_NODE)
		return yfail(e, n, "'%s': expected a string", key);
	json_object_set_new(dst, field, json_string(ytext(n)));
	return 0;
}

static int
yint(struct yerr *e, const yaml_node_t *n, const char *key, int64_t min,
    int64_t max, json_t *dst, const char *field)
{
	const char *s;
	char *end;
	long long v;

	if (ynull(n))
		return 0;
	if (n->type != YAML_SCALAR_NODE)
		return yfail(e, n, "'%s': expected an integer", key);
	s = ytext(n);
	errno = 0;
	v = strtoll(s, &end, 10);
	if (s[0] < '0' || s[0] > '9' || *end != '\0' || errno != 0)
		return yfail(e, n, "'%s': '%s' is not an integer", key, s);
	if (v < min || v > max)
		return yfail(e, n, "'%s': %lld is out of range (%" PRId64
		    "..%" PRId64 ")", key, v, min, max);
	json_object_set_new(dst, field, json_integer(v));
	return 0;
}

static int
ylist(struct yerr *e, yaml_document_t *doc, const yaml_node_t *n,
    const char *key, json_t *dst, const char *field)
{
	yaml_node_item_t *it;
	yaml_node_t *v;
	json_t *a;

	if (ynull(n))
		return 0;
	if (n->type != YAML_SEQUENCE_NODE)
		return yfail(e, n, "'%s': expected a list of strings", key);
	a = json_array();
	for (it = n->data.sequence.items.start;
	    it < n->data.sequence.items.top; it++) {
		v = yaml_document_get_node(doc, *it);
		if (v == NULL || v->type != YAML_SCALAR_NODE || ynull(v)) {
			json_decref(a);
			return yfail(e, v != NULL ? v : n, "'%s': expected a "
			    "list of strings", key);
		}
		json_array_append_new(a, json_string(ytext(v)));
	}
	json_object_set_new(dst, field, a);
	return 0;
}

/*
 * Walk a mapping: for each key, fn(key node, value node); unknown and
 * duplicate keys are errors. keys is NULL-terminated.
 */
typedef int (*ymap_fn)(struct yerr *e, yaml_document_t *doc,
    const char *key, const yaml_node_t *v, json_t *spec);

static int
ymap(struct yerr *e, yaml_document_t *doc, const yaml_node_t *n,
    const char *prefix, const char *const *keys, ymap_fn fn, json_t *spec)
{
	yaml_node_pair_t *p, *q;
	yaml_node_t *k, *v, *k2;
	char *full;
	size_t i;
	int rc;

	if (n->type != YAML_MAPPING_NODE)
		return yfail(e, n, "'%s': expected a mapping", prefix[0] ?
		    prefix : "(top)");
	for (p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
	    p++) {
		k = yaml_document_get_node(doc, p->key);
		v = yaml_document_get_node(doc, p->value);
		if (k == NULL || v == NULL || k->type != YAML_SCALAR_NODE)
			return yfail(e, k, "expected a string key");
		for (q = n->data.mapping.pairs.start; q < p; q++) {
			k2 = yaml_document_get_node(doc, q->key);
			if (k2 != NULL && k2->type == YAML_SCALAR_NODE &&
			    strcmp(ytext(k2), ytext(k)) == 0)
				return yfail(e, k, "duplicate key '%s%s%s'",
				    prefix, prefix[0] ? "." : "", ytext(k));
		}
		for (i = 0; keys[i] != NULL; i++)
			if (strcmp(keys[i], ytext(k)) == 0)
				break;
		full = xasprintf("%s%s%s", prefix, prefix[0] ? "." : "",
		    ytext(k));
		if (keys[i] == NULL) {
			yfail(e, k, "unknown key '%s'", full);
			free(full);
			return -1;
		}
		rc = fn(e, doc, full, v, spec);
		free(full);
		if (rc < 0)
			return -1;
	}
	return 0;
}

static int
y_sandbox(struct yerr *e, yaml_document_t *doc, const char *key,
    const yaml_node_t *v, json_t *spec)
{
	json_t *sb = child(spec, "sandbox");

	(void)doc;
	if (strcmp(key, "agent.sandbox.provider") == 0) {
		if (!ynull(v) && (v->type != YAML_SCALAR_NODE ||
		    strcmp(ytext(v), "agent-sandbox") != 0))
			return yfail(e, v, "'%s': the only provider is "
			    "agent-sandbox", key);
		return ystring(e, v, key, sb, "provider");
	}
	if (strcmp(key, "agent.sandbox.timeoutSeconds") == 0)
		return yint(e, v, key, 1, INT32_MAX, sb, "timeoutSeconds");
	if (strcmp(key, "agent.sandbox.image") == 0)
		return ystring(e, v, key, sb, "image");
	return ystring(e, v, key, sb, "runtimeClassName");
}

static int
y_agent(struct yerr *e, yaml_document_t *doc, const char *key,
    const yaml_node_t *v, json_t *spec)
{
	static const char *const sandbox_keys[] = { "provider",
		"timeoutSeconds", "image", "runtimeClassName", NULL };
	const char *k = key + strlen("agent.");
	char *cause = NULL, money_s[32];
	int64_t usd, tokens;

	if (strcmp(k, "capabilities") == 0)
		return ylist(e, doc, v, key, spec, "capabilities");
	if (strcmp(k, "allowedTools") == 0)
		return ylist(e, doc, v, key, spec, "allowedTools");
	if (strcmp(k, "maxIterations") == 0)
		return yint(e, v, key, 0, INT32_MAX, spec, "maxIterations");
	if (strcmp(k, "baseBranch") == 0)
		return ystring(e, v, key, child(spec, "repository"),
		    "baseBranch");
	if (strcmp(k, "budgetUSD") == 0) {
		if (ynull(v))
			return 0;
		if (v->type != YAML_SCALAR_NODE ||
		    (usd = config_parse_usd(ytext(v))) < 0)
			return yfail(e, v, "'%s': expected a USD amount such "
			    "as \"5.00\"", key);
		k8s_task_format_usd(usd, money_s);
		json_object_set_new(spec, "budgetUSD", json_string(money_s));
		return 0;
	}
	if (strcmp(k, "budgetTokens") == 0) {
		if (ynull(v))
			return 0;
		if (v->type != YAML_SCALAR_NODE ||
		    k8s_task_parse_tokens(ytext(v), 0, &tokens, &cause) < 0) {
			free(cause);
			return yfail(e, v, "'%s': expected a number of tokens "
			    "such as 1000000 or 1M", key);
		}
		json_object_set_new(spec, "budgetTokens", json_integer(tokens));
		return 0;
	}
	/* sandbox */
	if (ynull(v))
		return 0;
	return ymap(e, doc, v, key, sandbox_keys, y_sandbox, spec);
}

static int
y_top(struct yerr *e, yaml_document_t *doc, const char *key,
    const yaml_node_t *v, json_t *spec)
{
	static const char *const agent_keys[] = { "capabilities",
		"allowedTools", "budgetUSD", "budgetTokens", "maxIterations",
		"baseBranch", "sandbox", NULL };

	if (strcmp(key, "version") == 0) {
		if (v->type != YAML_SCALAR_NODE || strcmp(ytext(v), "1") != 0)
			return yfail(e, v, "'version': only \"1\" is "
			    "supported");
		return 0;
	}
	if (ynull(v))
		return 0;
	return ymap(e, doc, v, "agent", agent_keys, y_agent, spec);
}

/* Read a .diverge/agent.yaml into the spec fields it sets. */
int
k8s_task_agent_yaml(const char *name, const char *text, size_t len,
    json_t **out, char **cause)
{
	static const char *const top_keys[] = { "version", "agent", NULL };
	yaml_parser_t parser;
	yaml_document_t doc;
	yaml_node_t *root;
	struct yerr e = { name, NULL };
	json_t *spec = json_object();
	int ret = -1, have_parser = 0, have_doc = 0;

	if (!yaml_parser_initialize(&parser)) {
		*cause = xasprintf("%s: cannot start the YAML parser", name);
		goto out;
	}
	have_parser = 1;
	yaml_parser_set_input_string(&parser, (const unsigned char *)text,
	    len);
	if (!yaml_parser_load(&parser, &doc)) {
		*cause = xasprintf("%s:%lu: %s", name,
		    (unsigned long)parser.problem_mark.line + 1,
		    parser.problem != NULL ? parser.problem : "bad YAML");
		goto out;
	}
	have_doc = 1;
	root = yaml_document_get_root_node(&doc);
	if (root != NULL && !ynull(root) &&
	    ymap(&e, &doc, root, "", top_keys, y_top, spec) < 0) {
		*cause = e.msg;
		e.msg = NULL;
		goto out;
	}
	/* an empty file: no defaults */
	*out = spec;
	spec = NULL;
	ret = 0;
out:
	if (have_doc)
		yaml_document_delete(&doc);
	if (have_parser)
		yaml_parser_delete(&parser);
	free(e.msg);
	json_decref(spec);
	return ret;
}

/* ---- conditional writes ---- */

/*
 * An edit: given the task as read, add to patch (a merge patch, empty
 * when nothing is to change) or refuse with st. arg is the operation's.
 */
typedef int (*task_edit_fn)(struct k8s_api *api, const json_t *task,
    json_t *patch, const void *arg, struct k8s_status *st);

/* Refuse an operation: K8S_EINVALID with a message of our own. */
static int
refuse(struct k8s_status *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int
refuse(struct k8s_status *st, const char *fmt, ...)
{
	va_list ap;
	char *m;
	int ret;

	va_start(ap, fmt);
	m = xvasprintf(fmt, ap);
	va_end(ap);
	ret = k8s_status_set(st, K8S_EINVALID, m, NULL);
	free(m);
	return ret;
}

/* The next operation id of an applied-commands list, NULL at its end. */
static const char *
applied_next(const char *p, size_t *len)
{
	p += strspn(p, " ");
	if (*p == '\0')
		return NULL;
	*len = strcspn(p, " ");
	return p;
}

/* The task's applied-commands annotation ("" when it has none). */
static const char *
applied_list(const json_t *task)
{
	const char *v = json_string_value(json_object_get(json_object_get(
	    json_object_get(task, "metadata"), "annotations"),
	    K8S_TASK_ANNOTATION_APPLIED));

	return v != NULL ? v : "";
}

/* Whether the task records operation once as applied. */
static int
applied(const json_t *task, const char *once)
{
	const char *p = applied_list(task);
	size_t len, n = strlen(once);

	for (; (p = applied_next(p, &len)) != NULL; p += len)
		if (len == n && memcmp(p, once, n) == 0)
			return 1;
	return 0;
}

/*
 * Add to patch the task's applied-commands list with once at its end,
 * the oldest ids dropped to keep K8S_TASK_APPLIED_MAX (and any longer
 * than an id can be: not ours).
 */
static void
record_applied(const json_t *task, const char *once, json_t *patch)
{
	const char *list = applied_list(task), *p;
	struct buf b;
	size_t len, n = 0, skip;

	for (p = list; (p = applied_next(p, &len)) != NULL; p += len)
		n += len <= K8S_TASK_MAX_ONCE;
	skip = n >= K8S_TASK_APPLIED_MAX ? n - K8S_TASK_APPLIED_MAX + 1 : 0;
	buf_init(&b, K8S_TASK_APPLIED_MAX * (K8S_TASK_MAX_ONCE + 1));
	for (p = list; (p = applied_next(p, &len)) != NULL; p += len) {
		if (len > K8S_TASK_MAX_ONCE)
			continue;
		if (skip > 0) {
			skip--;
			continue;
		}
		buf_add(&b, p, len);
		buf_addstr(&b, " ");
	}
	buf_addstr(&b, once);
	json_object_set_new(child(child(patch, "metadata"), "annotations"),
	    K8S_TASK_ANNOTATION_APPLIED, json_stringn(b.data, b.len));
	buf_release(&b);
}

/* Whether once is an operation id the annotation can hold. */
static int
once_valid(const char *once)
{
	size_t i, n = strlen(once);

	if (n == 0 || n > K8S_TASK_MAX_ONCE)
		return 0;
	for (i = 0; i < n; i++)
		if ((unsigned char)once[i] <= ' ' ||
		    (unsigned char)once[i] >= 0x7f)
			return 0;
	return 1;
}

/*
 * Read the task, let fn compute the change, write it conditionally on
 * the resourceVersion read; again from a fresh read on a conflict, unless
 * the conflict may come from this very write: a patch whose first attempt
 * was answered 5xx and that the client sent again may have been applied
 * then, and applying the change on top of that would do it twice (a bump
 * of $5 becoming $10). An operation with an id (once) is recorded in the
 * same write, so that case reads again too: the record says whether that
 * attempt took effect, and an operation found recorded is not applied
 * again (1).
 */
static int
task_edit(struct k8s_api *api, const char *ns, const char *name,
    task_edit_fn fn, const void *arg, const char *once, json_t **out,
    struct k8s_status *st)
{
	struct k8s_status pst = { 0 };
	json_t *task = NULL, *patch = NULL, *res = NULL;
	const char *rv;
	char *msg;
	int attempt, ret = K8S_EINTERNAL;

	if (once != NULL && !once_valid(once))
		return refuse(st, "operation id \"%s\": 1 to %d printable "
		    "ASCII characters without spaces", once, K8S_TASK_MAX_ONCE);
	for (attempt = 1;; attempt++) {
		json_decref(task);
		json_decref(patch);
		task = patch = NULL;
		ret = k8s_get(api, &K8S_AGENTTASK, ns, name, &task, st);
		if (ret < 0)
			goto out;
		if (once != NULL && applied(task, once)) {
			/* an earlier attempt's write: the task as it is */
			res = task;
			task = NULL;
			ret = 1;
			goto out;
		}
		patch = json_object();
		ret = fn(api, task, patch, arg, st);
		if (ret < 0)
			goto out;
		/* recorded even when nothing else changes (a second pause) */
		if (once != NULL)
			record_applied(task, once, patch);
		if (json_object_size(patch) == 0) {
			/* nothing to change: the task as it is */
			res = task;
			task = NULL;
			ret = 0;
			goto out;
		}
		rv = k8s_meta_str(task, "resourceVersion");
		if (rv == NULL || rv[0] == '\0') {
			ret = k8s_status_set(st, K8S_EINTERNAL, "the task has "
			    "no resourceVersion", NULL);
			goto out;
		}
		json_object_set_new(child(patch, "metadata"),
		    "resourceVersion", json_string(rv));
		k8s_status_release(&pst);
		ret = k8s_patch(api, &K8S_AGENTTASK, ns, name, 0, patch, &res,
		    &pst);
		if (ret == K8S_ECONFLICT && pst.maybe_done && once == NULL) {
			msg = xasprintf("task \"%s\": the change may have been "
			    "applied already (the server failed to answer the "
			    "first attempt, and the retry found the task "
			    "changed); check the task before trying again",
			    name);
			ret = k8s_status_set(st, K8S_ECONFLICT, msg, NULL);
			if (st != NULL)
				st->maybe_done = 1;
			free(msg);
			goto out;
		}
		if (ret != K8S_ECONFLICT || attempt >= K8S_TASK_MAX_ATTEMPTS) {
			if (ret < 0 && st != NULL) {
				k8s_status_release(st);
				*st = pst;	/* now the caller's */
				memset(&pst, 0, sizeof(pst));
			}
			goto out;
		}
		/* lost a race: start again from what won it */
		json_decref(res);
		res = NULL;
	}
out:
	k8s_status_release(&pst);
	if (ret >= 0 && out != NULL)
		*out = res;
	else
		json_decref(res);
	json_decref(task);
	json_decref(patch);
	return ret;
}

static const char *
source_hint(enum k8s_task_source s)
{
	switch (s) {
	case K8S_TASK_SPEC:
		return "its spec";
	case K8S_TASK_TOKEN:
		return "its token";
	case K8S_TASK_DEFAULT:
		return "the configured default";
	default:
		return "nowhere";
	}
}

/*
 * Add the bumps to the effective budgets of task into patch.spec, or
 * refuse (nothing added) when a bumped budget is unlimited or unknown.
 */
static int
apply_bump(struct k8s_api *api, const json_t *task,
    const struct k8s_task_bump *b, json_t *patch, struct k8s_status *st)
{
	struct k8s_task_budgets eff;
	const char *name = k8s_meta_str(task, "name");
	char money[32];
	int64_t usd = 0, tokens = 0;

	if (b == NULL || (b->usd_micro <= 0 && b->tokens <= 0))
		return 0;
	if (name == NULL)
		name = "";
	k8s_task_budgets(api, task, b->default_usd_micro, b->default_tokens,
	    &eff);
	if (b->usd_micro > 0) {
		if (eff.usd.source == K8S_TASK_UNKNOWN)
			return refuse(st, "cannot bump the USD budget of task "
			    "\"%s\": it has no spec.budgetUSD and no readable "
			    "token (Secret \"%s-token\") to take the "
			    "configured default from; try again once the task "
			    "is provisioned", name, name);
		if (eff.usd.value == 0)
			return refuse(st, "the USD budget of task \"%s\" is "
			    "unlimited (0 in %s): it stays unlimited, a bump "
			    "does not apply", name,
			    source_hint(eff.usd.source));
		if (eff.usd.value > INT64_MAX - b->usd_micro)
			return refuse(st, "the USD budget of task \"%s\" would "
			    "be too large", name);
		usd = eff.usd.value + b->usd_micro;
	}
	if (b->tokens > 0) {
		if (eff.tokens.source == K8S_TASK_UNKNOWN)
			return refuse(st, "cannot bump the token budget of "
			    "task \"%s\": it has no spec.budgetTokens and no "
			    "readable token (Secret \"%s-token\") to take the "
			    "configured default from; try again once the task "
			    "is provisioned", name, name);
		if (eff.tokens.value == 0)
			return refuse(st, "the token budget of task \"%s\" is "
			    "unlimited (0 in %s): it stays unlimited, a bump "
			    "does not apply", name,
			    source_hint(eff.tokens.source));
		if (eff.tokens.value > INT64_MAX - b->tokens)
			return refuse(st, "the token budget of task \"%s\" "
			    "would be too large", name);
		tokens = eff.tokens.value + b->tokens;
	}
	if (usd > 0) {
		k8s_task_format_usd(usd, money);
		json_object_set_new(child(patch, "spec"), "budgetUSD",
		    json_string(money));
	}
	if (tokens > 0)
		json_object_set_new(child(patch, "spec"), "budgetTokens",
		    json_integer(tokens));
	return 0;
}

static int
suspended(const json_t *task)
{
	return json_is_true(json_object_get(json_object_get(task, "spec"),
	    "suspended"));
}

struct guide_arg {
	const char *hint;
	int internal;		/* from a GitLab internal note */
};

static int
edit_guide(struct k8s_api *api, const json_t *task, json_t *patch,
    const void *arg, struct k8s_status *st)
{
	const struct guide_arg *g = arg;
	const char *hint = g->hint, *cur, *mark;
	size_t start, len;
	char *cause = NULL, *text;
	int ret;

	(void)api;
	if (k8s_task_check_hint(hint, &cause) < 0) {
		ret = refuse(st, "%s", cause);
		free(cause);
		return ret;
	}
	trim(hint, &start, &len);
	text = xstrndup(hint + start, len);
	cur = json_string_value(json_object_get(json_object_get(
	    json_object_get(task, "metadata"), "annotations"),
	    K8S_TASK_ANNOTATION_GUIDANCE));
	if (cur == NULL || strcmp(cur, text) != 0)
		json_object_set_new(child(child(patch, "metadata"),
		    "annotations"), K8S_TASK_ANNOTATION_GUIDANCE,
		    json_string(text));
	free(text);
	/* the mark follows the guidance: set by an internal note, or gone */
	mark = json_string_value(json_object_get(json_object_get(
	    json_object_get(task, "metadata"), "annotations"),
	    K8S_TASK_ANNOTATION_INTERNAL_GUIDANCE));
	if (g->internal && (mark == NULL || strcmp(mark, "true") != 0))
		json_object_set_new(child(child(patch, "metadata"),
		    "annotations"), K8S_TASK_ANNOTATION_INTERNAL_GUIDANCE,
		    json_string("true"));
	else if (!g->internal && mark != NULL)
		json_object_set_new(child(child(patch, "metadata"),
		    "annotations"), K8S_TASK_ANNOTATION_INTERNAL_GUIDANCE,
		    json_null());
	return 0;
}

static int
edit_pause(struct k8s_api *api, const json_t *task, json_t *patch,
    const void *arg, struct k8s_status *st)
{
	(void)api;
	(void)arg;
	(void)st;
	if (!suspended(task))
		json_object_set_new(child(patch, "spec"), "suspended",
		    json_true());
	return 0;
}

static int
edit_resume(struct k8s_api *api, const json_t *task, json_t *patch,
    const void *arg, struct k8s_status *st)
{
	int ret = apply_bump(api, task, arg, patch, st);

	if (ret < 0)
		return ret;
	if (suspended(task))
		json_object_set_new(child(patch, "spec"), "suspended",
		    json_false());
	return 0;
}

static int
edit_budget(struct k8s_api *api, const json_t *task, json_t *patch,
    const void *arg, struct k8s_status *st)
{
	return apply_bump(api, task, arg, patch, st);
}

/* Set the task's guidance annotation. */
int
k8s_task_guide(struct k8s_api *api, const char *ns, const char *name,
    const char *hint, const char *once, json_t **out, struct k8s_status *st)
{
	return k8s_task_guide_from(api, ns, name, hint, 0, once, out, st);
}

/* The same, saying whether the guidance came from an internal note. */
int
k8s_task_guide_from(struct k8s_api *api, const char *ns, const char *name,
    const char *hint, int internal, const char *once, json_t **out,
    struct k8s_status *st)
{
	struct guide_arg g = { hint, internal };
	char *cause = NULL;
	int ret;

	/* refuse a bad hint before any request */
	if (k8s_task_check_hint(hint, &cause) < 0) {
		ret = refuse(st, "%s", cause);
		free(cause);
		return ret;
	}
	return task_edit(api, ns, name, edit_guide, &g, once, out, st);
}

/* Ask for the task to be paused. */
int
k8s_task_pause(struct k8s_api *api, const char *ns, const char *name,
    const char *once, json_t **out, struct k8s_status *st)
{
	return task_edit(api, ns, name, edit_pause, NULL, once, out, st);
}

/* Bump the budgets if asked, and ask for the task to run again. */
int
k8s_task_resume(struct k8s_api *api, const char *ns, const char *name,
    const struct k8s_task_bump *bump, const char *once, json_t **out,
    struct k8s_status *st)
{
	if (bump != NULL && (bump->usd_micro < 0 || bump->tokens < 0))
		return refuse(st, "bumps only add: a negative amount is not "
		    "allowed");
	return task_edit(api, ns, name, edit_resume, bump, once, out, st);
}

/* Add to the task's budgets. */
int
k8s_task_budget(struct k8s_api *api, const char *ns, const char *name,
    const struct k8s_task_bump *bump, const char *once, json_t **out,
    struct k8s_status *st)
{
	if (bump == NULL || bump->usd_micro < 0 || bump->tokens < 0)
		return refuse(st, "bumps only add: a negative amount is not "
		    "allowed");
	if (bump->usd_micro == 0 && bump->tokens == 0)
		return refuse(st, "a budget bump needs a USD or a token "
		    "amount");
	return task_edit(api, ns, name, edit_budget, bump, once, out, st);
}
