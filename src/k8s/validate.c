/*
 * Validation of stored objects, as the CRD schemas of deploy/crds say:
 * metadata for every kind, and for the divergedev.com kinds the types,
 * ranges, enums and required fields of spec and status. The first error
 * found is reported, as a 422 Invalid Status naming the field path.
 */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"
#include "util/util.h"

struct vctx {
	const struct k8s_resource *r;
	const char *name;
	char path[256];
	const char *reason;	/* FieldValueRequired, FieldValueInvalid... */
	char *detail;		/* "Required value", "Invalid value: ..." */
};

static int
fail(struct vctx *v, const char *path, const char *reason, const char *fmt,
    ...) __attribute__((format(printf, 4, 5)));

static int
fail(struct vctx *v, const char *path, const char *reason, const char *fmt,
    ...)
{
	va_list ap;

	if (v->detail != NULL)
		return -1;
	snprintf(v->path, sizeof(v->path), "%s", path);
	v->reason = reason;
	va_start(ap, fmt);
	v->detail = xvasprintf(fmt, ap);
	va_end(ap);
	return -1;
}

static size_t
utf8_chars(const char *s)
{
	size_t n = 0;

	for (; *s; s++)
		if (((unsigned char)*s & 0xc0) != 0x80)
			n++;
	return n;
}

/*
 * DNS-1123 subdomain: labels of lowercase alnum and '-' joined by '.',
 * each with alnum at both ends (a..b, a.-b and a-.b are not).
 */
static int
dns_subdomain(const char *s)
{
	size_t n = strlen(s), i;

	if (n == 0 || n > 253)
		return 0;
	for (i = 0; i < n; i++) {
		if (islower((unsigned char)s[i]) ||
		    isdigit((unsigned char)s[i]))
			continue;
		if (s[i] != '-' && s[i] != '.')
			return 0;
		/* '-' and '.' only between alnums, or '-' next to '-' */
		if (i == 0 || i == n - 1 || s[i - 1] == '.' ||
		    (s[i] == '.' && s[i - 1] == '-') ||
		    (s[i] == '-' && s[i + 1] == '.'))
			return 0;
	}
	return 1;
}

static int
decimal_usd(const char *s)
{
	const char *p = s;
	int digits = 0, dec = 0;

	while (isdigit((unsigned char)*p)) {
		p++;
		digits++;
	}
	if (digits == 0 || digits > 12)
		return 0;
	if (*p == '.') {
		p++;
		while (isdigit((unsigned char)*p)) {
			p++;
			dec++;
		}
		if (dec == 0 || dec > 6)
			return 0;
	}
	return *p == '\0';
}

/* ---- typed field checks: absent fields pass unless required ---- */

static const json_t *
field(struct vctx *v, const json_t *o, const char *base, const char *k,
    int required, char *path, size_t pathlen)
{
	const json_t *f = json_object_get(o, k);
	size_t b = strlen(base), n = strlen(k);

	/* every write validates every field: no printf for the common case */
	if (b + n + 2 <= pathlen) {
		memcpy(path, base, b);
		path[b] = '.';
		memcpy(path + b + 1, k, n + 1);
	} else {
		snprintf(path, pathlen, "%s.%s", base, k);
	}
	if ((f == NULL || json_is_null(f)) && required) {
		fail(v, path, "FieldValueRequired", "Required value");
		return NULL;
	}
	return json_is_null(f) ? NULL : f;
}

static int
want_string(struct vctx *v, const json_t *o, const char *base, const char *k,
    int required, size_t minlen, size_t maxlen)
{
	char path[256];
	const json_t *f = field(v, o, base, k, required, path, sizeof(path));
	size_t n;

	if (f == NULL)
		return v->detail ? -1 : 0;
	if (!json_is_string(f))
		return fail(v, path, "FieldValueTypeInvalid",
		    "Invalid value: must be of type string");
	n = utf8_chars(json_string_value(f));
	if (n < minlen)
		return fail(v, path, "FieldValueInvalid", "Invalid value: "
		    "should be at least %zu chars long", minlen);
	if (maxlen && n > maxlen)
		return fail(v, path, "FieldValueTooLong", "Too long: may not "
		    "be longer than %zu", maxlen);
	return 0;
}

static int
want_bool(struct vctx *v, const json_t *o, const char *base, const char *k)
{
	char path[256];
	const json_t *f = field(v, o, base, k, 0, path, sizeof(path));

	if (f != NULL && !json_is_boolean(f))
		return fail(v, path, "FieldValueTypeInvalid",
		    "Invalid value: must be of type boolean");
	return 0;
}

static int
want_int(struct vctx *v, const json_t *o, const char *base, const char *k,
    int required, int64_t min, int64_t max)
{
	char path[256];
	const json_t *f = field(v, o, base, k, required, path, sizeof(path));
	int64_t n;

	if (f == NULL)
		return v->detail ? -1 : 0;
	if (!json_is_integer(f))
		return fail(v, path, "FieldValueTypeInvalid",
		    "Invalid value: must be of type integer");
	n = json_integer_value(f);
	if (n < min)
		return fail(v, path, "FieldValueInvalid", "Invalid value: %lld: "
		    "should be greater than or equal to %lld", (long long)n,
		    (long long)min);
	if (n > max)
		return fail(v, path, "FieldValueInvalid", "Invalid value: %lld: "
		    "should be less than or equal to %lld", (long long)n,
		    (long long)max);
	return 0;
}

static int
want_enum(struct vctx *v, const json_t *o, const char *base, const char *k,
    int required, const char *const *vals)
{
	char path[256];
	const json_t *f = field(v, o, base, k, required, path, sizeof(path));
	size_t i;

	if (f == NULL)
		return v->detail ? -1 : 0;
	if (!json_is_string(f))
		return fail(v, path, "FieldValueTypeInvalid",
		    "Invalid value: must be of type string");
	for (i = 0; vals[i] != NULL; i++)
		if (strcmp(json_string_value(f), vals[i]) == 0)
			return 0;
	return fail(v, path, "FieldValueNotSupported", "Unsupported value: "
	    "\"%s\"", json_string_value(f));
}

static int
want_string_list(struct vctx *v, const json_t *o, const char *base,
    const char *k, size_t maxitems)
{
	char path[256], ipath[300];
	const json_t *f = field(v, o, base, k, 0, path, sizeof(path));
	size_t i;
	json_t *e;

	if (f == NULL)
		return 0;
	if (!json_is_array(f))
		return fail(v, path, "FieldValueTypeInvalid",
		    "Invalid value: must be of type array");
	if (maxitems && json_array_size(f) > maxitems)
		return fail(v, path, "FieldValueTooMany", "Too many: %zu: must "
		    "have at most %zu items", json_array_size(f), maxitems);
	json_array_foreach((json_t *)f, i, e) {
		if (!json_is_string(e)) {
			snprintf(ipath, sizeof(ipath), "%s[%zu]", path, i);
			return fail(v, ipath, "FieldValueTypeInvalid",
			    "Invalid value: must be of type string");
		}
	}
	return 0;
}

static const json_t *
want_object(struct vctx *v, const json_t *o, const char *base, const char *k,
    int required)
{
	char path[256];
	const json_t *f = field(v, o, base, k, required, path, sizeof(path));

	if (f == NULL)
		return NULL;
	if (!json_is_object(f)) {
		fail(v, path, "FieldValueTypeInvalid",
		    "Invalid value: must be of type object");
		return NULL;
	}
	return f;
}

static int
only_keys(struct vctx *v, const json_t *o, const char *base,
    const char *const *keys)
{
	const char *k;
	json_t *val;
	char path[256];
	size_t i;

	json_object_foreach((json_t *)o, k, val) {
		int known = 0;

		for (i = 0; keys[i] != NULL; i++)
			if (strcmp(k, keys[i]) == 0)
				known = 1;
		if (!known) {
			snprintf(path, sizeof(path), "%s.%s", base, k);
			return fail(v, path, "FieldValueNotSupported",
			    "Unsupported field");
		}
	}
	return 0;
}

/*
 * A label value, or the name part of a qualified name (allow_empty 0):
 * at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends.
 */
static int
label_part(const char *s, size_t n, int allow_empty)
{
	size_t i;

	if (n == 0)
		return allow_empty;
	if (n > 63 || !isalnum((unsigned char)s[0]) ||
	    !isalnum((unsigned char)s[n - 1]))
		return 0;
	for (i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '-' &&
		    s[i] != '_' && s[i] != '.')
			return 0;
	return 1;
}

/* A label or annotation key: [DNS-1123 subdomain "/"] name part. */
static int
qualified_name(const char *k)
{
	const char *slash = strchr(k, '/');
	char *prefix;
	int ok;

	if (slash == NULL)
		return label_part(k, strlen(k), 0);
	prefix = xstrndup(k, (size_t)(slash - k));
	ok = dns_subdomain(prefix) && label_part(slash + 1,
	    strlen(slash + 1), 0);
	free(prefix);
	return ok;
}

static int
string_map(struct vctx *v, const json_t *meta, const char *k)
{
	char path[256];
	const json_t *m = field(v, meta, "metadata", k, 0, path, sizeof(path));
	const char *key;
	json_t *val;

	if (m == NULL)
		return 0;
	if (!json_is_object(m))
		return fail(v, path, "FieldValueTypeInvalid",
		    "Invalid value: must be of type object");
	json_object_foreach((json_t *)m, key, val) {
		if (!json_is_string(val)) {
			char p2[512];

			snprintf(p2, sizeof(p2), "%s[%s]", path, key);
			return fail(v, p2, "FieldValueTypeInvalid",
			    "Invalid value: must be of type string");
		}
		/* the apiserver's ObjectMeta validation, in its words */
		if (!qualified_name(key))
			return fail(v, path, "FieldValueInvalid",
			    "Invalid value: \"%.100s\": name part must consist "
			    "of alphanumeric characters, '-', '_' or '.', and "
			    "must start and end with an alphanumeric character "
			    "(e.g. 'MyName',  or 'my.name',  or '123-abc', "
			    "regex used for validation is "
			    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')", key);
		if (strcmp(k, "labels") == 0 && !label_part(
		    json_string_value(val), json_string_length(val), 1))
			return fail(v, path, "FieldValueInvalid",
			    "Invalid value: \"%.100s\": a valid label must be "
			    "an empty string or consist of alphanumeric "
			    "characters, '-', '_' or '.', and must start and end "
			    "with an alphanumeric character (e.g. 'MyValue',  or "
			    "'my_value',  or '12345', regex used for validation "
			    "is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
			    json_string_value(val));
	}
	return 0;
}

static int
check_metadata(struct vctx *v, const json_t *obj)
{
	const json_t *meta = json_object_get(obj, "metadata");
	const char *name;

	if (meta == NULL || !json_is_object(meta))
		return fail(v, "metadata", "FieldValueRequired",
		    "Required value");
	name = json_string_value(json_object_get(meta, "name"));
	if (name == NULL)
		return fail(v, "metadata.name", "FieldValueRequired",
		    "Required value: name or generateName is required");
	if (!dns_subdomain(name))
		return fail(v, "metadata.name", "FieldValueInvalid",
		    "Invalid value: \"%.64s\": a lowercase RFC 1123 subdomain "
		    "must consist of lower case alphanumeric characters, '-' "
		    "or '.', and must start and end with an alphanumeric "
		    "character", name);
	if (string_map(v, meta, "labels") < 0 ||
	    string_map(v, meta, "annotations") < 0)
		return -1;
	if (json_object_get(meta, "ownerReferences") != NULL &&
	    !json_is_array(json_object_get(meta, "ownerReferences")))
		return fail(v, "metadata.ownerReferences",
		    "FieldValueTypeInvalid",
		    "Invalid value: must be of type array");
	return 0;
}

static const char *const phases[] = {
	"Pending", "Provisioning", "Active", "Pausing", "Paused", "Completed",
	"Failed", NULL
};

static int
check_agenttask(struct vctx *v, const json_t *obj)
{
	static const char *const spec_keys[] = { "objective", "draftPR",
	    "repository", "maxIterations", "budgetUSD", "budgetTokens",
	    "capabilities", "allowedTools", "suspended", "sandbox", NULL };
	static const char *const repo_keys[] = { "url", "baseBranch",
	    "workingBranch", NULL };
	static const char *const sandbox_keys[] = { "provider",
	    "timeoutSeconds", "image", "runtimeClassName", NULL };
	static const char *const providers[] = { "agent-sandbox", NULL };
	const json_t *spec, *repo, *sb, *status, *bu;

	spec = want_object(v, obj, "", "spec", 1);
	if (spec == NULL) {
		if (v->detail != NULL)
			memmove(v->path, v->path + 1, strlen(v->path));
		return -1;
	}
	if (only_keys(v, spec, "spec", spec_keys) < 0 ||
	    want_string(v, spec, "spec", "objective", 1, 1, 4000) < 0 ||
	    want_bool(v, spec, "spec", "draftPR") < 0 ||
	    want_int(v, spec, "spec", "maxIterations", 0, 0, 1000000) < 0 ||
	    want_int(v, spec, "spec", "budgetTokens", 0, 0,
	    INT64_C(1000000000000)) < 0 ||
	    want_string_list(v, spec, "spec", "capabilities", 256) < 0 ||
	    want_string_list(v, spec, "spec", "allowedTools", 256) < 0 ||
	    want_bool(v, spec, "spec", "suspended") < 0)
		return -1;
	bu = json_object_get(spec, "budgetUSD");
	if (bu != NULL && !json_is_null(bu) && (!json_is_string(bu) ||
	    !decimal_usd(json_string_value(bu))))
		return fail(v, "spec.budgetUSD", "FieldValueInvalid",
		    "Invalid value: must be a decimal string with at most 6 "
		    "decimals, like \"5.00\"");
	repo = want_object(v, spec, "spec", "repository", 0);
	if (v->detail != NULL)
		return -1;
	if (repo != NULL && (only_keys(v, repo, "spec.repository",
	    repo_keys) < 0 ||
	    want_string(v, repo, "spec.repository", "url", 0, 0, 2048) < 0 ||
	    want_string(v, repo, "spec.repository", "baseBranch", 0, 0,
	    255) < 0 ||
	    want_string(v, repo, "spec.repository", "workingBranch", 0, 0,
	    255) < 0))
		return -1;
	sb = want_object(v, spec, "spec", "sandbox", 0);
	if (v->detail != NULL)
		return -1;
	if (sb != NULL && (only_keys(v, sb, "spec.sandbox", sandbox_keys) < 0 ||
	    want_enum(v, sb, "spec.sandbox", "provider", 0, providers) < 0 ||
	    want_int(v, sb, "spec.sandbox", "timeoutSeconds", 0, 1,
	    86400 * 30) < 0 ||
	    want_string(v, sb, "spec.sandbox", "image", 0, 0, 1024) < 0 ||
	    want_string(v, sb, "spec.sandbox", "runtimeClassName", 0, 0,
	    253) < 0))
		return -1;
	status = want_object(v, obj, "", "status", 0);
	if (v->detail != NULL) {
		memmove(v->path, v->path + 1, strlen(v->path));
		return -1;
	}
	if (status != NULL) {
		const json_t *c = json_object_get(status, "costUSD");

		if (want_enum(v, status, "status", "phase", 0, phases) < 0 ||
		    want_string(v, status, "status", "reason", 0, 0, 256) < 0 ||
		    want_string(v, status, "status", "message", 0, 0,
		    32768) < 0 ||
		    want_int(v, status, "status", "observedGeneration", 0, 0,
		    INT64_MAX) < 0 ||
		    want_int(v, status, "status", "run", 0, 0, INT64_MAX) < 0 ||
		    want_int(v, status, "status", "tokensConsumed", 0, 0,
		    INT64_MAX) < 0 ||
		    want_int(v, status, "status", "iteration", 0, 0,
		    INT64_MAX) < 0 ||
		    want_int(v, status, "status", "activeSeconds", 0, 0,
		    INT64_MAX) < 0 ||
		    want_string_list(v, status, "status",
		    "lastMeterRequestIds", 32) < 0)
			return -1;
		if (c != NULL && !json_is_null(c) && (!json_is_string(c) ||
		    !decimal_usd(json_string_value(c))))
			return fail(v, "status.costUSD", "FieldValueInvalid",
			    "Invalid value: must be a decimal string");
		if (json_object_get(status, "conditions") != NULL) {
			const json_t *conds = json_object_get(status,
			    "conditions");
			size_t i;
			json_t *e;

			if (!json_is_array(conds))
				return fail(v, "status.conditions",
				    "FieldValueTypeInvalid",
				    "Invalid value: must be of type array");
			json_array_foreach((json_t *)conds, i, e) {
				char base[64];

				snprintf(base, sizeof(base),
				    "status.conditions[%zu]", i);
				if (!json_is_object(e))
					return fail(v, base,
					    "FieldValueTypeInvalid",
					    "Invalid value: must be of type "
					    "object");
				if (want_string(v, e, base, "type", 1, 1,
				    316) < 0 ||
				    want_string(v, e, base, "status", 1, 1,
				    16) < 0)
					return -1;
			}
		}
	}
	return 0;
}

static int
check_environment(struct vctx *v, const json_t *obj)
{
	static const char *const keys[] = { "branch", "service", "image",
	    "port", "repository", NULL };
	const json_t *spec = want_object(v, obj, "", "spec", 0);

	if (v->detail != NULL) {
		memmove(v->path, v->path + 1, strlen(v->path));
		return -1;
	}
	if (spec == NULL)
		return 0;
	if (only_keys(v, spec, "spec", keys) < 0 ||
	    want_string(v, spec, "spec", "branch", 0, 0, 255) < 0 ||
	    want_string(v, spec, "spec", "service", 0, 0, 253) < 0 ||
	    want_string(v, spec, "spec", "image", 0, 0, 1024) < 0 ||
	    want_int(v, spec, "spec", "port", 0, 1, 65535) < 0 ||
	    want_string(v, spec, "spec", "repository", 0, 0, 2048) < 0)
		return -1;
	return 0;
}

static int
check_secret(struct vctx *v, const json_t *obj)
{
	const json_t *data = json_object_get(obj, "data");
	const char *k;
	json_t *val;

	if (data == NULL || json_is_null(data))
		return 0;
	if (!json_is_object(data))
		return fail(v, "data", "FieldValueTypeInvalid",
		    "Invalid value: must be of type object");
	json_object_foreach((json_t *)data, k, val) {
		unsigned char *raw = NULL;
		size_t n;
		char path[300];

		snprintf(path, sizeof(path), "data[%s]", k);
		if (!json_is_string(val) || base64_decode(json_string_value(
		    val), json_string_length(val), &raw, &n) < 0)
			return fail(v, path, "FieldValueInvalid",
			    "Invalid value: must be base64 encoded");
		free(raw);
	}
	return 0;
}

/* Validate obj as the CRD schema of its kind would. */
/* The 422 of v's first error, as the apiserver words it. */
static int
invalid(struct vctx *v, struct k8s_status *st)
{
	const struct k8s_resource *r = v->r;
	char *msg = xasprintf("%s.%s \"%s\" is invalid: %s: %s", r->kind,
	    r->group[0] ? r->group : "core", v->name ? v->name : "", v->path,
	    v->detail);
	json_t *details = json_pack("{s:s,s:s,s:s,s:[{s:s,s:s,s:s}]}",
	    "name", v->name ? v->name : "", "group", r->group, "kind",
	    r->kind, "causes", "reason", v->reason, "message", v->detail,
	    "field", v->path);
	int rc = k8s_status_set(st, K8S_EINVALID, msg, details);

	free(msg);
	free(v->detail);
	return rc;
}

int
k8s_validate(const struct k8s_resource *r, const json_t *obj,
    struct k8s_status *st)
{
	struct vctx v;
	int rc;

	memset(&v, 0, sizeof(v));
	v.r = r;
	if (!json_is_object(obj))
		return k8s_status_set(st, K8S_EBADREQUEST,
		    "the object is not a JSON object", NULL);
	v.name = k8s_meta_str(obj, "name");
	rc = check_metadata(&v, obj);
	if (rc == 0 && r == &K8S_AGENTTASK)
		rc = check_agenttask(&v, obj);
	else if (rc == 0 && r == &K8S_ENVIRONMENT)
		rc = check_environment(&v, obj);
	else if (rc == 0 && r == &K8S_SECRET)
		rc = check_secret(&v, obj);
	return rc == 0 ? 0 : invalid(&v, st);
}

/* Whether the string array a holds s. */
static int
has_string(const json_t *a, const char *s)
{
	size_t i;
	json_t *e;

	json_array_foreach((json_t *)a, i, e)
		if (json_is_string(e) && strcmp(json_string_value(e), s) == 0)
			return 1;
	return 0;
}

int
k8s_validate_update(const struct k8s_resource *r, const json_t *old,
    const json_t *obj, struct k8s_status *st)
{
	const json_t *om = json_object_get(old, "metadata");
	const json_t *nm = json_object_get(obj, "metadata");
	const char *ouid = json_string_value(json_object_get(om, "uid"));
	const char *nuid = json_string_value(json_object_get(nm, "uid"));
	const json_t *fins = json_object_get(nm, "finalizers"), *f;
	struct vctx v;
	size_t i;

	memset(&v, 0, sizeof(v));
	v.r = r;
	v.name = k8s_meta_str(old, "name");
	if (nuid != NULL && nuid[0] != '\0' && ouid != NULL &&
	    strcmp(nuid, ouid) != 0)
		fail(&v, "metadata.uid", "FieldValueInvalid", "Invalid value: "
		    "\"%.64s\": field is immutable", nuid);
	else if (json_object_get(om, "deletionTimestamp") != NULL)
		json_array_foreach((json_t *)fins, i, f)
			if (json_is_string(f) && !has_string(json_object_get(
			    om, "finalizers"), json_string_value(f))) {
				fail(&v, "metadata.finalizers",
				    "FieldValueForbidden", "Forbidden: no new "
				    "finalizers can be added if the object is "
				    "being deleted, found new finalizers "
				    "[]string{\"%.200s\"}", json_string_value(f));
				break;
			}
	return v.detail == NULL ? 0 : invalid(&v, st);
}
