/*
 * The parts of the resource API shared by every backend: the resource
 * table, Kubernetes Status errors, label and field selectors, RFC 7386
 * merge patch, and the dispatch through the ops table.
 */
#include "config.h"

#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"
#include "util/util.h"

/* ---------------------------------------------------------- resources */

const struct k8s_resource K8S_AGENTTASK = {
	"divergedev.com", "v1alpha1", "agenttasks", "agenttask", "AgentTask",
	"at", 1, 1, 1
};
const struct k8s_resource K8S_ENVIRONMENT = {
	"divergedev.com", "v1alpha1", "environments", "environment",
	"Environment", "env", 1, 1, 1
};
const struct k8s_resource K8S_SECRET = {
	"", "v1", "secrets", "secret", "Secret", NULL, 1, 0, 0
};
const struct k8s_resource K8S_SANDBOX = {
	"agents.x-k8s.io", "v1beta1", "sandboxes", "sandbox", "Sandbox",
	"sandbox", 1, 1, 1
};
const struct k8s_resource K8S_SANDBOXCLAIM = {
	"extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims",
	"sandboxclaim", "SandboxClaim", NULL, 1, 1, 1
};
const struct k8s_resource K8S_NETWORKPOLICY = {
	"networking.k8s.io", "v1", "networkpolicies", "networkpolicy",
	"NetworkPolicy", "netpol", 1, 0, 1
};

/* Used on a cluster only (leader election); the embedded store has none. */
const struct k8s_resource K8S_LEASE = {
	"coordination.k8s.io", "v1", "leases", "lease", "Lease", NULL, 1, 0, 0
};

const struct k8s_resource *const k8s_resources[] = {
	&K8S_AGENTTASK, &K8S_ENVIRONMENT, &K8S_SECRET, &K8S_SANDBOX,
	&K8S_SANDBOXCLAIM, &K8S_NETWORKPOLICY, NULL
};

/* Every resource known, the served ones first. */
static const struct k8s_resource *const known[] = {
	&K8S_AGENTTASK, &K8S_ENVIRONMENT, &K8S_SECRET, &K8S_SANDBOX,
	&K8S_SANDBOXCLAIM, &K8S_NETWORKPOLICY, &K8S_LEASE, NULL
};

/* Precomputed names, index-aligned with known. */
static const char *const api_versions[] = {
	"divergedev.com/v1alpha1", "divergedev.com/v1alpha1", "v1",
	"agents.x-k8s.io/v1beta1", "extensions.agents.x-k8s.io/v1beta1",
	"networking.k8s.io/v1", "coordination.k8s.io/v1"
};
static const char *const qualified[] = {
	"agenttasks.divergedev.com", "environments.divergedev.com",
	"secrets", "sandboxes.agents.x-k8s.io",
	"sandboxclaims.extensions.agents.x-k8s.io",
	"networkpolicies.networking.k8s.io", "leases.coordination.k8s.io"
};

static int
resource_index(const struct k8s_resource *r)
{
	int i;

	for (i = 0; known[i] != NULL; i++)
		if (known[i] == r || (strcmp(known[i]->group, r->group) == 0 &&
		    strcmp(known[i]->plural, r->plural) == 0))
			return i;
	return -1;
}

/* Find a served resource. */
const struct k8s_resource *
k8s_resource_find(const char *group, const char *version, const char *plural)
{
	int i;

	for (i = 0; k8s_resources[i] != NULL; i++)
		if (strcmp(k8s_resources[i]->group, group ? group : "") == 0 &&
		    strcmp(k8s_resources[i]->version, version) == 0 &&
		    strcmp(k8s_resources[i]->plural, plural) == 0)
			return k8s_resources[i];
	return NULL;
}

/* "group/version", or the version alone for the core group. */
const char *
k8s_api_version(const struct k8s_resource *r)
{
	int i = resource_index(r);

	return i >= 0 ? api_versions[i] : r->version;
}

/* "plural.group" as the apiserver names resources in messages. */
const char *
k8s_qualified_plural(const struct k8s_resource *r)
{
	int i = resource_index(r);

	return i >= 0 ? qualified[i] : r->plural;
}

/* Whether r is a built-in kind rather than a custom resource. */
int
k8s_resource_builtin(const struct k8s_resource *r)
{
	size_t n = strlen(r->group), m = strlen(".k8s.io");

	if (r->group[0] == '\0')
		return 1;
	return n > m && strcmp(r->group + n - m, ".k8s.io") == 0 &&
	    strstr(r->group, "x-k8s.io") == NULL;
}

/* ------------------------------------------------------------- errors */

static const struct {
	enum k8s_err err;
	int code;
	const char *reason;
} err_table[] = {
	{ K8S_ENOTFOUND, 404, "NotFound" },
	{ K8S_EEXISTS, 409, "AlreadyExists" },
	{ K8S_ECONFLICT, 409, "Conflict" },
	{ K8S_EINVALID, 422, "Invalid" },
	{ K8S_EGONE, 410, "Expired" },
	{ K8S_EUNAUTHORIZED, 401, "Unauthorized" },
	{ K8S_EFORBIDDEN, 403, "Forbidden" },
	{ K8S_ETIMEOUT, 504, "Timeout" },
	{ K8S_EBADREQUEST, 400, "BadRequest" },
	{ K8S_EUNAVAILABLE, 503, "ServiceUnavailable" },
	{ K8S_EINTERNAL, 500, "InternalError" },
	{ K8S_EUNSUPPORTED, 415, "UnsupportedMediaType" },
};

/* The HTTP code of an error. */
int
k8s_err_http_code(enum k8s_err err)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(err_table); i++)
		if (err_table[i].err == err)
			return err_table[i].code;
	return err == K8S_OK ? 200 : 500;
}

/* The Status reason of an error. */
const char *
k8s_err_reason(enum k8s_err err)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(err_table); i++)
		if (err_table[i].err == err)
			return err_table[i].reason;
	return "InternalError";
}

/* Map an HTTP answer to the enum; the reason disambiguates 409 and 410. */
enum k8s_err
k8s_err_from_http(int code, const char *reason)
{
	switch (code) {
	case 400:
		return K8S_EBADREQUEST;
	case 401:
		return K8S_EUNAUTHORIZED;
	case 403:
		return K8S_EFORBIDDEN;
	case 404:
		return K8S_ENOTFOUND;
	case 405:
	case 406:
	case 415:
		return K8S_EUNSUPPORTED;
	case 409:
		return reason != NULL && strcmp(reason, "AlreadyExists") == 0 ?
		    K8S_EEXISTS : K8S_ECONFLICT;
	case 410:
		return K8S_EGONE;
	case 422:
		return K8S_EINVALID;
	case 429:
	case 502:
	case 503:
		return K8S_EUNAVAILABLE;
	case 504:
		return K8S_ETIMEOUT;
	default:
		return code >= 200 && code < 300 ? K8S_OK : K8S_EINTERNAL;
	}
}

/* Free a status' contents. */
void
k8s_status_release(struct k8s_status *st)
{
	if (st == NULL)
		return;
	free(st->reason);
	free(st->message);
	json_decref(st->details);
	memset(st, 0, sizeof(*st));
}

/* Fill a status; details is stolen. */
int
k8s_status_set(struct k8s_status *st, enum k8s_err err, const char *message,
    json_t *details)
{
	if (st == NULL) {
		json_decref(details);
		return err;
	}
	k8s_status_release(st);
	st->err = err;
	st->code = k8s_err_http_code(err);
	st->reason = xstrdup(k8s_err_reason(err));
	st->message = xstrdup(message ? message : "");
	st->details = details;
	return err;
}

static json_t *
name_details(const struct k8s_resource *r, const char *name)
{
	return json_pack("{s:s,s:s,s:s}", "name", name ? name : "", "group",
	    r->group, "kind", r->plural);
}

/* 404 for a named object. */
int
k8s_error_notfound(struct k8s_status *st, const struct k8s_resource *r,
    const char *name)
{
	char *m = xasprintf("%s \"%s\" not found", k8s_qualified_plural(r),
	    name ? name : "");
	int ret = k8s_status_set(st, K8S_ENOTFOUND, m, name_details(r, name));

	free(m);
	return ret;
}

/* 409 AlreadyExists. */
int
k8s_error_exists(struct k8s_status *st, const struct k8s_resource *r,
    const char *name)
{
	char *m = xasprintf("%s \"%s\" already exists", k8s_qualified_plural(r),
	    name ? name : "");
	int ret = k8s_status_set(st, K8S_EEXISTS, m, name_details(r, name));

	free(m);
	return ret;
}

/* 409 Conflict with the apiserver's optimistic-lock message. */
int
k8s_error_conflict(struct k8s_status *st, const struct k8s_resource *r,
    const char *name)
{
	char *m = xasprintf("Operation cannot be fulfilled on %s \"%s\": the "
	    "object has been modified; please apply your changes to the latest "
	    "version and try again", k8s_qualified_plural(r),
	    name ? name : "");
	int ret = k8s_status_set(st, K8S_ECONFLICT, m, name_details(r, name));

	free(m);
	return ret;
}

int
k8s_check_preconditions(struct k8s_status *st, const struct k8s_resource *r,
    const char *name, const json_t *cur, const char *uid, const char *rv)
{
	const char *have = k8s_meta_str(cur, "uid");
	char *m = NULL;
	int ret;

	if (uid != NULL && (have == NULL || strcmp(uid, have) != 0))
		m = xasprintf("Precondition failed: UID in precondition: %s, "
		    "UID in object meta: %s", uid, have ? have : "");
	have = k8s_meta_str(cur, "resourceVersion");
	if (m == NULL && rv != NULL && (have == NULL || strcmp(rv,
	    have) != 0))
		m = xasprintf("Precondition failed: ResourceVersion in "
		    "precondition: %s, ResourceVersion in object meta: %s", rv,
		    have ? have : "");
	if (m == NULL)
		return 0;
	ret = k8s_status_set(st, K8S_ECONFLICT, m, name_details(r, name));
	free(m);
	return ret;
}

/* 422 for an update of a custom resource without a resourceVersion. */
int
k8s_error_rv_required(struct k8s_status *st, const struct k8s_resource *r,
    const char *name)
{
	static const char what[] = "Invalid value: 0x0: must be specified for "
	    "an update";
	json_t *d = name_details(r, name);
	char *m = xasprintf("%s \"%s\" is invalid: metadata.resourceVersion: "
	    "%s", k8s_qualified_plural(r), name ? name : "", what);
	int ret;

	json_object_set_new(d, "causes", json_pack("[{s:s,s:s,s:s}]",
	    "reason", "FieldValueInvalid", "message", what, "field",
	    "metadata.resourceVersion"));
	ret = k8s_status_set(st, K8S_EINVALID, m, d);
	free(m);
	return ret;
}

/* The Status object. */
json_t *
k8s_status_json(const struct k8s_status *st)
{
	json_t *j = json_pack("{s:s,s:s,s:{},s:s,s:s,s:s,s:i}", "kind",
	    "Status", "apiVersion", "v1", "metadata", "status", "Failure",
	    "message", st->message ? st->message : "", "reason",
	    st->reason ? st->reason : k8s_err_reason(st->err), "code",
	    st->code ? st->code : k8s_err_http_code(st->err));

	if (st->details != NULL)
		json_object_set(j, "details", st->details);
	return j;
}

/* Parse a Status reply. */
int
k8s_status_from_json(struct k8s_status *st, int code, const json_t *j)
{
	const char *reason = json_string_value(json_object_get(j, "reason"));
	const char *msg = json_string_value(json_object_get(j, "message"));
	json_t *det = json_object_get(j, "details");
	enum k8s_err err = k8s_err_from_http(code, reason);
	char *m;

	/*
	 * The server's (or a proxy's) message may quote our token; it goes
	 * to logs, task conditions and replies from here.
	 */
	if (msg == NULL)
		m = xasprintf("the server answered %d", code);
	else
		m = redact_xstrdup(msg);
	k8s_status_set(st, err, m, det ? json_incref(det) : NULL);
	if (st != NULL) {
		st->code = code;
		if (reason != NULL) {
			free(st->reason);
			st->reason = xstrdup(reason);
		}
	}
	free(m);
	return err;
}

/* ---------------------------------------------------------- selectors */

enum sel_op { SEL_EQ, SEL_NE, SEL_IN, SEL_NOTIN, SEL_EXISTS, SEL_NOTEXISTS };

struct sel_req {
	char *key;
	enum sel_op op;
	char **vals;
	size_t nvals;
};

struct k8s_selector {
	struct sel_req *reqs;
	size_t n;
	int fields;		/* a field selector */
};

/* Free a selector. */
void
k8s_selector_free(struct k8s_selector *sel)
{
	size_t i, j;

	if (sel == NULL)
		return;
	for (i = 0; i < sel->n; i++) {
		free(sel->reqs[i].key);
		for (j = 0; j < sel->reqs[i].nvals; j++)
			free(sel->reqs[i].vals[j]);
		free(sel->reqs[i].vals);
	}
	free(sel->reqs);
	free(sel);
}

static int
key_char(char c)
{
	return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.' ||
	    c == '/';
}

static int
val_char(char c)
{
	return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

/*
 * A label value as labels.NewRequirement takes it: empty, or at most 63
 * characters that begin and end with a letter or digit (the characters
 * between are val_char's).
 */
static int
label_value_ok(const char *v)
{
	size_t n = strlen(v);

	return n == 0 || (n <= 63 && isalnum((unsigned char)v[0]) &&
	    isalnum((unsigned char)v[n - 1]));
}

static const char *
skip_ws(const char *p)
{
	while (*p == ' ')
		p++;
	return p;
}

static char *
take(const char **pp, int (*ok)(char), size_t max)
{
	const char *p = *pp, *s = p;

	while (*p && ok(*p))
		p++;
	if ((size_t)(p - s) > max)
		return NULL;
	*pp = p;
	return xstrndup(s, (size_t)(p - s));
}

static void
req_add_val(struct sel_req *r, char *v)
{
	r->vals = xrealloc(r->vals, (r->nvals + 1) * sizeof(char *));
	r->vals[r->nvals++] = v;
}

/* Parse "k=v,k!=v,k in (a,b),k notin (a),k,!k". */
static int
parse_selector(const char *s, int fields, struct k8s_selector **out,
    char **cause)
{
	struct k8s_selector *sel = xcalloc(1, sizeof(*sel));
	const char *p = s ? s : "";

	sel->fields = fields;
	p = skip_ws(p);
	while (*p) {
		struct sel_req r;
		int neg = 0;

		memset(&r, 0, sizeof(r));
		if (*p == '!') {
			neg = 1;
			p = skip_ws(p + 1);
		}
		/* a DNS subdomain prefix, '/', a name of 63 */
		r.key = take(&p, key_char, 253 + 1 + 63);
		if (r.key == NULL || r.key[0] == '\0')
			goto bad;
		p = skip_ws(p);
		if (neg) {
			if (fields)
				goto bad;
			r.op = SEL_NOTEXISTS;
		} else if (p[0] == '=' && p[1] == '=') {
			r.op = SEL_EQ;
			p += 2;
		} else if (p[0] == '=') {
			r.op = SEL_EQ;
			p += 1;
		} else if (p[0] == '!' && p[1] == '=') {
			r.op = SEL_NE;
			p += 2;
		} else if (!fields && strncmp(p, "in", 2) == 0 &&
		    (p[2] == ' ' || p[2] == '(')) {
			r.op = SEL_IN;
			p += 2;
		} else if (!fields && strncmp(p, "notin", 5) == 0 &&
		    (p[5] == ' ' || p[5] == '(')) {
			r.op = SEL_NOTIN;
			p += 5;
		} else if (!fields && (*p == ',' || *p == '\0')) {
			r.op = SEL_EXISTS;
		} else {
			goto bad;
		}
		p = skip_ws(p);
		if (r.op == SEL_EQ || r.op == SEL_NE) {
			char *v = take(&p, fields ? key_char : val_char, 253);

			/* a field value is a name (253), a label's is 63 */
			if (v != NULL && !fields && !label_value_ok(v)) {
				free(v);
				v = NULL;
			}
			if (v == NULL)
				goto bad;
			req_add_val(&r, v);
		} else if (r.op == SEL_IN || r.op == SEL_NOTIN) {
			if (*p != '(')
				goto bad;
			p = skip_ws(p + 1);
			for (;;) {
				char *v = take(&p, val_char, 63);

				if (v != NULL && !label_value_ok(v)) {
					free(v);
					v = NULL;
				}
				if (v == NULL)
					goto bad;
				req_add_val(&r, v);
				p = skip_ws(p);
				if (*p == ',') {
					p = skip_ws(p + 1);
					continue;
				}
				if (*p == ')') {
					p++;
					break;
				}
				goto bad;
			}
		}
		sel->reqs = xrealloc(sel->reqs, (sel->n + 1) * sizeof(r));
		sel->reqs[sel->n++] = r;
		p = skip_ws(p);
		if (*p == ',') {
			p = skip_ws(p + 1);
			if (*p == '\0')
				goto bad_sel;
			continue;
		}
		if (*p != '\0')
			goto bad_sel;
		continue;
bad:
		{
			size_t j;

			free(r.key);
			for (j = 0; j < r.nvals; j++)
				free(r.vals[j]);
			free(r.vals);
		}
bad_sel:
		*cause = xasprintf("unable to parse requirement: invalid %s "
		    "selector '%s'", fields ? "field" : "label", s);
		k8s_selector_free(sel);
		return -1;
	}
	if (fields) {
		size_t i;

		for (i = 0; i < sel->n; i++)
			if (strcmp(sel->reqs[i].key, "metadata.name") != 0 &&
			    strcmp(sel->reqs[i].key,
			    "metadata.namespace") != 0) {
				*cause = xasprintf("field label not supported: "
				    "%s", sel->reqs[i].key);
				k8s_selector_free(sel);
				return -1;
			}
	}
	*out = sel;
	return 0;
}

/* Parse a label selector. */
int
k8s_selector_parse(const char *s, struct k8s_selector **out, char **cause)
{
	return parse_selector(s, 0, out, cause);
}

/* Parse a field selector. */
int
k8s_fieldsel_parse(const char *s, struct k8s_selector **out, char **cause)
{
	return parse_selector(s, 1, out, cause);
}

/* Whether obj satisfies every requirement. */
int
k8s_selector_match(const struct k8s_selector *sel, const json_t *obj)
{
	const json_t *meta = json_object_get(obj, "metadata");
	const json_t *labels = json_object_get(meta, "labels");
	size_t i, j;

	if (sel == NULL)
		return 1;
	for (i = 0; i < sel->n; i++) {
		const struct sel_req *r = &sel->reqs[i];
		const char *v;
		int in = 0;

		if (sel->fields)
			v = json_string_value(json_object_get(meta,
			    r->key + 9));
		else
			v = json_string_value(json_object_get(labels, r->key));
		for (j = 0; v != NULL && j < r->nvals; j++)
			if (strcmp(v, r->vals[j]) == 0)
				in = 1;
		switch (r->op) {
		case SEL_EQ:
		case SEL_IN:
			if (!in)
				return 0;
			break;
		case SEL_NE:
		case SEL_NOTIN:
			if (in)
				return 0;
			break;
		case SEL_EXISTS:
			if (v == NULL)
				return 0;
			break;
		case SEL_NOTEXISTS:
			if (v != NULL)
				return 0;
			break;
		}
	}
	return 1;
}

/* ------------------------------------------------------- JSON helpers */

/* RFC 7386. */
json_t *
k8s_merge_patch(const json_t *target, const json_t *patch)
{
	json_t *result;
	const char *k;
	json_t *v;

	if (!json_is_object(patch))
		return json_deep_copy(patch);
	result = json_is_object(target) ? json_deep_copy(target) :
	    json_object();
	json_object_foreach((json_t *)patch, k, v) {
		if (json_is_null(v)) {
			json_object_del(result, k);
		} else {
			json_t *merged = k8s_merge_patch(json_object_get(
			    result, k), v);

			json_object_set_new(result, k, merged);
		}
	}
	return result;
}

/* metadata.<field> as a string. */
const char *
k8s_meta_str(const json_t *obj, const char *field)
{
	return json_string_value(json_object_get(json_object_get(obj,
	    "metadata"), field));
}

/* metadata.<field> as an integer. */
int64_t
k8s_meta_int(const json_t *obj, const char *field)
{
	return json_integer_value(json_object_get(json_object_get(obj,
	    "metadata"), field));
}

/* metadata.resourceVersion parsed. */
int64_t
k8s_resource_version(const json_t *obj)
{
	const char *rv = k8s_meta_str(obj, "resourceVersion");
	char *end;
	long long v;

	if (rv == NULL || *rv == '\0')
		return 0;
	v = strtoll(rv, &end, 10);
	if (*end != '\0' || v < 0)
		return 0;
	return v;
}

/* ------------------------------------------------------------ events */

/* "ADDED" etc. */
const char *
k8s_event_type_name(enum k8s_event_type t)
{
	switch (t) {
	case K8S_ADDED:
		return "ADDED";
	case K8S_MODIFIED:
		return "MODIFIED";
	case K8S_DELETED:
		return "DELETED";
	case K8S_BOOKMARK:
		return "BOOKMARK";
	default:
		return "ERROR";
	}
}

/* ----------------------------------------------------------- dispatch */

int
k8s_get(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const char *name, json_t **out, struct k8s_status *st)
{
	return api->ops->get(api, r, ns, name, out, st);
}

int
k8s_list(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const struct k8s_list_opts *opts, json_t **out, struct k8s_status *st)
{
	return api->ops->list(api, r, ns, opts, out, st);
}

int
k8s_create(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const json_t *obj, json_t **out, struct k8s_status *st)
{
	return api->ops->create(api, r, ns, obj, out, st);
}

int
k8s_update(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const char *name, const json_t *obj, json_t **out, struct k8s_status *st)
{
	return api->ops->update(api, r, ns, name, obj, out, st);
}

int
k8s_update_status(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, const json_t *obj, json_t **out,
    struct k8s_status *st)
{
	return api->ops->update_status(api, r, ns, name, obj, out, st);
}

int
k8s_patch(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const char *name, int status, const json_t *patch, json_t **out,
    struct k8s_status *st)
{
	return api->ops->patch(api, r, ns, name, status, patch, out, st);
}

int
k8s_delete(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const char *name, json_t **out, struct k8s_status *st)
{
	return api->ops->del(api, r, ns, name, K8S_PROPAGATE_DEFAULT, NULL,
	    NULL, out, st);
}

int
k8s_delete_if(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, enum k8s_propagation policy,
    const char *uid, const char *rv, json_t **out, struct k8s_status *st)
{
	return api->ops->del(api, r, ns, name, policy, uid, rv, out, st);
}

int
k8s_delete_policy(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, enum k8s_propagation policy,
    json_t **out, struct k8s_status *st)
{
	return api->ops->del(api, r, ns, name, policy, NULL, NULL, out, st);
}

static const char *const propagation_names[] = {
	[K8S_PROPAGATE_DEFAULT] = "Background",
	[K8S_PROPAGATE_BACKGROUND] = "Background",
	[K8S_PROPAGATE_FOREGROUND] = "Foreground",
	[K8S_PROPAGATE_ORPHAN] = "Orphan",
};

/* The API's name of a propagation policy. */
const char *
k8s_propagation_name(enum k8s_propagation p)
{
	if ((size_t)p >= ARRAY_SIZE(propagation_names))
		p = K8S_PROPAGATE_DEFAULT;
	return propagation_names[p];
}

/* A propagation policy from its API name. */
int
k8s_propagation_parse(const char *s, enum k8s_propagation *out)
{
	size_t i;

	for (i = K8S_PROPAGATE_BACKGROUND; s != NULL &&
	    i < ARRAY_SIZE(propagation_names); i++)
		if (strcmp(s, propagation_names[i]) == 0) {
			*out = (enum k8s_propagation)i;
			return 0;
		}
	return -1;
}

int
k8s_watch(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const struct k8s_list_opts *opts, struct k8s_watch **out,
    struct k8s_status *st)
{
	return api->ops->watch(api, r, ns, opts, out, st);
}

int
k8s_watch_next(struct k8s_watch *w, int timeout_ms, struct k8s_event *ev,
    struct k8s_status *st)
{
	return w->api->ops->watch_next(w, timeout_ms, ev, st);
}

void
k8s_watch_free(struct k8s_watch *w)
{
	if (w != NULL)
		w->api->ops->watch_free(w);
}

void
k8s_api_free(struct k8s_api *api)
{
	if (api == NULL)
		return;
	if (api->attached_free != NULL)
		api->attached_free(api->attached);
	api->ops->free(api);
}

static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;

/* The attachment of api, made on first use. */
void *
k8s_api_attachment(struct k8s_api *api, void *(*make)(void),
    void (*free_fn)(void *))
{
	void *a;

	pthread_mutex_lock(&attach_mu);
	if (api->attached == NULL) {
		api->attached = make();
		api->attached_free = free_fn;
	}
	a = api->attached;
	pthread_mutex_unlock(&attach_mu);
	return a;
}
