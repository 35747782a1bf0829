/*
 * The embedded store over HTTP: a small kube-apiserver for the kinds of
 * k8s_resources[] (discovery, an OpenAPI v3 document, get, list, create,
 * update, patch, delete, the status subresource and watch), so that the
 * real kubectl and client libraries can work against any struct k8s_api.
 * The wire details are in reference/k8s-api-subset.md.
 *
 * It is its own libmicrohttpd daemon with one thread per connection: a
 * watch blocks in its content reader on k8s_watch_next, in short slices so
 * that k8s_apiserver_stop ends every stream promptly.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "http/http.h"
#include "k8s/k8s.h"
#include "util/util.h"

#if MHD_VERSION < 0x00097002
#define MHD_RESULT int
#else
#define MHD_RESULT enum MHD_Result
#endif

#define API_DEFAULT_LISTEN	"127.0.0.1:8081"
#define API_MAX_BODY		(16u * 1024 * 1024)
#define API_MAX_PENDING		(64u * 1024 * 1024)
#define API_MAX_PEM		(1024 * 1024)
#define API_MAX_SEGS		12
#define API_IDLE_TIMEOUT_S	300
#define WATCH_SLICE_MS		200
#define WATCH_BOOKMARK_MS	5000
#define WATCH_DEFAULT_S		1800
#define WATCH_MAX_S		86400	/* timeoutSeconds beyond: a day */
/* A patched document may nest as deep as a parsed one (jansson's limit). */
#define PATCH_MAX_DEPTH		2048
#define PATCH_RETRIES		5

#define MT_JSON		"application/json"
#define MT_MERGE	"application/merge-patch+json"
#define MT_JSONPATCH	"application/json-patch+json"
#define MT_STRATEGIC	"application/strategic-merge-patch+json"
#define MT_APPLY	"application/apply-patch+yaml"

struct k8s_apiserver {
	struct MHD_Daemon *d;
	struct k8s_api *api;
	int port;
	int stopping;			/* read and written atomically */
	int has_token;
	unsigned char mac_key[32];	/* random, to compare tokens */
	pthread_mutex_t token_lock;	/* token_mac changes on SIGHUP */
	unsigned char token_mac[32];	/* HMAC of the configured token */
	char *cert;
	char *key;
	size_t key_len;
	json_t **schemas;		/* parsed, one per k8s_resources[] */
};

/*
 * What a reply is turned into, as the Accept header's as=, g= and v= ask:
 * the object itself, its PartialObjectMetadata(List) or a Table.
 */
enum out_kind { OUT_OBJECT = 0, OUT_PARTIAL, OUT_PARTIAL_LIST, OUT_TABLE };

struct output {
	enum out_kind kind;
	int v1beta1;		/* meta.k8s.io/v1beta1 rather than v1 */
};
enum include_mode { INCLUDE_METADATA = 0, INCLUDE_NONE, INCLUDE_OBJECT };
enum patch_kind { PATCH_MERGE = 1, PATCH_JSON, PATCH_STRATEGIC };
enum field_validation { FV_WARN = 0, FV_STRICT, FV_IGNORE };

struct watch_stream;

/* One HTTP request: its body, then the reply or a watch stream. */
struct api_req {
	struct k8s_apiserver *srv;
	struct k8s_api *api;		/* writes: srv's, or its dry run */
	struct MHD_Connection *conn;
	const char *method;		/* owned by MHD */
	char *url;
	struct buf body;
	int too_large;
	int queued;
	size_t discarded;

	int code;
	json_t *reply;
	const char *text;		/* a static text reply instead */
	const char *ctype;
	int pretty;
	char **warnings;
	size_t nwarnings;
	struct watch_stream *stream;
	struct output form;		/* of the reply, from Accept */
};

/* What a resource path names. */
struct target {
	const struct k8s_resource *r;
	const char *ns;		/* NULL: all namespaces or cluster scope */
	const char *name;	/* NULL: the collection */
	int status;		/* the status subresource */
};

/* A column of the Table output (server-side printing). */
struct column {
	const char *name;
	const char *type;	/* string, integer or date */
	const char *path;	/* ".status.phase"; NULL = count of .data */
	const char *desc;
};

struct watch_stream {
	struct k8s_apiserver *srv;
	struct k8s_watch *w;
	const struct k8s_resource *r;
	struct output form;
	enum include_mode include;
	int fd;
	int bookmarks;
	int done;
	int64_t deadline_ms;
	int64_t last_send_ms;
	int64_t rv;		/* newest resourceVersion sent, 0 unknown */
	struct buf out;
	size_t off;
};

/* Namespaces are not stored: every valid name exists (a stub). */
static const struct k8s_resource namespace_resource = {
	.group = "",
	.version = "v1",
	.plural = "namespaces",
	.singular = "namespace",
	.kind = "Namespace",
	.short_name = "ns",
	.namespaced = 0,
	.has_status = 0,
};

static const char *const object_meta_fields[] = {
	"name", "generateName", "namespace", "selfLink", "uid",
	"resourceVersion", "generation", "creationTimestamp",
	"deletionTimestamp", "deletionGracePeriodSeconds", "labels",
	"annotations", "ownerReferences", "finalizers", "managedFields",
	NULL
};

int k8s_apiserver_negotiate(const char *accept, int *kind_out,
    int *v1beta1_out);
static void reply_err(struct api_req *q, enum k8s_err err, int code,
    const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ------------------------------------------------------------ helpers */

static int
stopping(struct k8s_apiserver *s)
{
	return __atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST);
}


static int
is_loopback(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)ss;

		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 =
		    (const struct sockaddr_in6 *)ss;

		if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
			return 1;
		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
			return in6->sin6_addr.s6_addr[12] == 127;
	}
	return 0;
}

/* Read a whole (small) file into a NUL-terminated string. */
static int
read_pem(const char *path, char **out, size_t *len_out, char **cause)
{
	FILE *f = NULL;
	struct buf b;
	char chunk[4096];
	size_t n;
	int ret = -1;

	buf_init(&b, API_MAX_PEM);
	f = fopen(path, "r");
	if (f == NULL) {
		*cause = xasprintf("api: file '%s' is not readable: %s", path,
		    strerror(errno));
		goto out;
	}
	while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
		if (buf_add(&b, chunk, n) < 0) {
			*cause = xasprintf("api: file '%s' is too large", path);
			goto out;
		}
	}
	if (ferror(f) || b.len == 0) {
		*cause = xasprintf("api: file '%s' is empty or unreadable",
		    path);
		goto out;
	}
	*len_out = b.len;
	*out = buf_detach(&b, NULL);
	ret = 0;
out:
	if (f != NULL)
		fclose(f);
	secure_wipe(chunk, sizeof(chunk));
	if (b.data != NULL)
		secure_wipe(b.data, b.len);
	buf_release(&b);
	return ret;
}


static const char *
query(const struct api_req *q, const char *key)
{
	return MHD_lookup_connection_value(q->conn, MHD_GET_ARGUMENT_KIND,
	    key);
}

static const char *
header(const struct api_req *q, const char *key)
{
	return MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, key);
}

static int
query_bool(const struct api_req *q, const char *key)
{
	const char *v = query(q, key);

	return v != NULL && (strcmp(v, "true") == 0 || strcmp(v, "1") == 0);
}

/* The media type of a Content-Type, lowercased, without parameters. */
static char *
media_type(const char *ctype)
{
	const char *e;
	char *m;
	size_t i;

	if (ctype == NULL)
		return xstrdup("");
	while (*ctype == ' ' || *ctype == '\t')
		ctype++;
	e = strchr(ctype, ';');
	if (e == NULL)
		e = ctype + strlen(ctype);
	while (e > ctype && (e[-1] == ' ' || e[-1] == '\t'))
		e--;
	m = xstrndup(ctype, (size_t)(e - ctype));
	for (i = 0; m[i] != '\0'; i++)
		if (m[i] >= 'A' && m[i] <= 'Z')
			m[i] = (char)(m[i] - 'A' + 'a');
	return m;
}

static int
dns_label(const char *s)
{
	size_t i, n = strlen(s);

	if (n == 0 || n > 63)
		return 0;
	for (i = 0; i < n; i++) {
		char c = s[i];

		if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
			continue;
		if (c == '-' && i > 0 && i < n - 1)
			continue;
		return 0;
	}
	return 1;
}

/* apiVersion and kind on an object (and on every item of a list). */
static void
ensure_typed(json_t *obj, const struct k8s_resource *r)
{
	if (!json_is_object(obj))
		return;
	if (!json_is_string(json_object_get(obj, "apiVersion")))
		json_object_set_new(obj, "apiVersion",
		    json_string(k8s_api_version(r)));
	if (!json_is_string(json_object_get(obj, "kind")))
		json_object_set_new(obj, "kind", json_string(r->kind));
}

static void
ensure_typed_list(json_t *list, const struct k8s_resource *r)
{
	json_t *items, *it;
	size_t i;
	char *lk;

	if (!json_is_object(list))
		return;
	if (!json_is_string(json_object_get(list, "apiVersion")))
		json_object_set_new(list, "apiVersion",
		    json_string(k8s_api_version(r)));
	if (!json_is_string(json_object_get(list, "kind"))) {
		lk = xasprintf("%sList", r->kind);
		json_object_set_new(list, "kind", json_string(lk));
		free(lk);
	}
	if (!json_is_object(json_object_get(list, "metadata")))
		json_object_set_new(list, "metadata", json_object());
	items = json_object_get(list, "items");
	if (!json_is_array(items)) {
		items = json_array();
		json_object_set_new(list, "items", items);
	}
	json_array_foreach(items, i, it)
		ensure_typed(it, r);
}

/* Value at a simple JSONPath ".a.b.c"; NULL when absent. */
static json_t *
json_path(json_t *obj, const char *path)
{
	char key[128];
	const char *p = path, *e;
	size_t n;

	while (*p == '.' && obj != NULL) {
		p++;
		e = strchr(p, '.');
		if (e == NULL)
			e = p + strlen(p);
		n = (size_t)(e - p);
		if (n == 0 || n >= sizeof(key))
			return NULL;
		memcpy(key, p, n);
		key[n] = '\0';
		obj = json_is_object(obj) ? json_object_get(obj, key) : NULL;
		p = e;
	}
	return obj;
}

/* ------------------------------------------------------------ replies */

/* Reply with a JSON body (stolen). */
static void
reply_json(struct api_req *q, int code, json_t *body)
{
	json_decref(q->reply);
	q->code = code;
	q->reply = body;
	q->ctype = MT_JSON;
}

/* Reply with the Status of an error from the API. */
static void
reply_st(struct api_req *q, const struct k8s_status *st)
{
	int code = st->code > 0 ? st->code : k8s_err_http_code(st->err);

	reply_json(q, code, k8s_status_json(st));
}

/* An error of our own; code and reason, when given, override err's. */
static void
reply_err(struct api_req *q, enum k8s_err err, int code, const char *reason,
    const char *fmt, ...)
{
	struct k8s_status st;
	va_list ap;
	char *msg;
	json_t *j;

	memset(&st, 0, sizeof(st));
	va_start(ap, fmt);
	msg = xvasprintf(fmt, ap);
	va_end(ap);
	k8s_status_set(&st, err, msg, NULL);
	j = k8s_status_json(&st);
	if (code > 0)
		json_object_set_new(j, "code", json_integer(code));
	else
		code = st.code > 0 ? st.code : k8s_err_http_code(err);
	if (reason != NULL)
		json_object_set_new(j, "reason", json_string(reason));
	reply_json(q, code, j);
	k8s_status_release(&st);
	free(msg);
}

static void
reply_notfound(struct api_req *q)
{
	reply_err(q, K8S_ENOTFOUND, 404, "NotFound",
	    "the server could not find the requested resource");
}

static void
reply_method(struct api_req *q)
{
	reply_err(q, K8S_EUNSUPPORTED, 405, "MethodNotAllowed",
	    "the server does not allow this method on the requested "
	    "resource");
}

static void
add_warning(struct api_req *q, const char *text)
{
	struct buf b;
	const char *p;

	buf_init(&b, 4096);
	buf_addstr(&b, "299 - \"");
	for (p = text; *p != '\0'; p++) {
		if (*p == '"' || *p == '\\')
			buf_add(&b, "\\", 1);
		buf_add(&b, p, 1);
	}
	buf_addstr(&b, "\"");
	q->warnings = xrealloc(q->warnings,
	    (q->nwarnings + 1) * sizeof(*q->warnings));
	q->warnings[q->nwarnings++] = buf_detach(&b, NULL);
}

/* ---------------------------------------------------------- discovery */

static const char *const verbs_main[] = {
	"create", "delete", "deletecollection", "get", "list", "patch",
	"update", "watch", NULL
};
static const char *const verbs_status[] = { "get", "patch", "update", NULL };
static const char *const verbs_namespace[] = { "get", "list", NULL };

static json_t *
str_array(const char *const *v)
{
	json_t *a = json_array();

	for (; *v != NULL; v++)
		json_array_append_new(a, json_string(*v));
	return a;
}

static json_t *
api_resource(const struct k8s_resource *r, int sub,
    const char *const *verbs)
{
	json_t *j;
	char *name = sub ? xasprintf("%s/status", r->plural) :
	    xstrdup(r->plural);

	j = json_pack("{s:s, s:s, s:b, s:s, s:o}", "name", name,
	    "singularName", sub ? "" : r->singular, "namespaced",
	    r->namespaced, "kind", r->kind, "verbs", str_array(verbs));
	if (!sub && r->short_name != NULL)
		json_object_set_new(j, "shortNames",
		    json_pack("[s]", r->short_name));
	if (!sub && strcmp(r->group, "divergedev.com") == 0)
		json_object_set_new(j, "categories", json_pack("[s]",
		    "diverge"));
	free(name);
	return j;
}

/* APIResourceList of group/version; NULL when nothing is served there. */
static json_t *
resource_list(const char *group, const char *version)
{
	json_t *res = json_array();
	const struct k8s_resource *const *rp;
	char *gv;
	size_t n = 0;
	json_t *j;

	if (group[0] == '\0' && strcmp(version, "v1") == 0) {
		json_array_append_new(res, api_resource(&namespace_resource, 0,
		    verbs_namespace));
	}
	for (rp = k8s_resources; *rp != NULL; rp++) {
		if (strcmp((*rp)->group, group) != 0 ||
		    strcmp((*rp)->version, version) != 0)
			continue;
		json_array_append_new(res, api_resource(*rp, 0, verbs_main));
		if ((*rp)->has_status)
			json_array_append_new(res, api_resource(*rp, 1,
			    verbs_status));
		n++;
	}
	if (n == 0) {
		json_decref(res);
		return NULL;
	}
	gv = group[0] == '\0' ? xstrdup(version) :
	    xasprintf("%s/%s", group, version);
	j = json_pack("{s:s, s:s, s:s, s:o}", "kind", "APIResourceList",
	    "apiVersion", "v1", "groupVersion", gv, "resources", res);
	free(gv);
	return j;
}

/* One APIGroup (name, versions, preferredVersion); NULL if unknown. */
static json_t *
api_group(const char *group)
{
	const struct k8s_resource *const *rp, *const *sp;
	json_t *versions = json_array(), *first = NULL, *j;
	char *gv;

	for (rp = k8s_resources; *rp != NULL; rp++) {
		int seen = 0;

		if (strcmp((*rp)->group, group) != 0)
			continue;
		for (sp = k8s_resources; sp != rp; sp++)
			if (strcmp((*sp)->group, group) == 0 &&
			    strcmp((*sp)->version, (*rp)->version) == 0)
				seen = 1;
		if (seen)
			continue;
		gv = xasprintf("%s/%s", group, (*rp)->version);
		j = json_pack("{s:s, s:s}", "groupVersion", gv, "version",
		    (*rp)->version);
		free(gv);
		if (first == NULL)
			first = json_deep_copy(j);
		json_array_append_new(versions, j);
	}
	if (first == NULL) {
		json_decref(versions);
		return NULL;
	}
	return json_pack("{s:s, s:o, s:o}", "name", group, "versions",
	    versions, "preferredVersion", first);
}

static json_t *
api_group_list(void)
{
	const struct k8s_resource *const *rp, *const *sp;
	json_t *groups = json_array();

	for (rp = k8s_resources; *rp != NULL; rp++) {
		int seen = 0;

		if ((*rp)->group[0] == '\0')
			continue;
		for (sp = k8s_resources; sp != rp; sp++)
			if (strcmp((*sp)->group, (*rp)->group) == 0)
				seen = 1;
		if (!seen)
			json_array_append_new(groups, api_group((*rp)->group));
	}
	return json_pack("{s:s, s:s, s:o}", "kind", "APIGroupList",
	    "apiVersion", "v1", "groups", groups);
}

static json_t *
version_info(void)
{
	return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}",
	    "major", "1", "minor", "32", "gitVersion", "v1.32.0",
	    "gitCommit", "", "gitTreeState", "clean", "buildDate",
	    "2026-01-01T00:00:00Z", "goVersion", "go1.23", "compiler", "gc",
	    "platform", "linux/amd64");
}

/* ------------------------------------------------------------ OpenAPI */

/*
 * The schemas of the divergedev.com kinds: the openAPIV3Schema of
 * deploy/crds/divergedev.com_{agenttasks,environments}.yaml as compact
 * JSON (tests/integration/test_kubectl.py checks that they agree).
 */
static const char agenttask_schema[] =
	"{\"description\":\"An autonomous coding agent working on a reposit"
	"ory in a sandbox, within budgets.\",\"type\":\"object\",\"required"
	"\":[\"spec\"],\"properties\":{\"apiVersion\":{\"type\":\"string\"}"
	",\"kind\":{\"type\":\"string\"},\"metadata\":{\"type\":\"object\"}"
	",\"spec\":{\"description\":\"What the agent should do and the limi"
	"ts it works within.\",\"type\":\"object\",\"required\":[\"objectiv"
	"e\"],\"properties\":{\"objective\":{\"description\":\"What the age"
	"nt should achieve, in plain language.\",\"type\":\"string\",\"minL"
	"ength\":1,\"maxLength\":4000},\"draftPR\":{\"description\":\"Open "
	"the pull request as a draft.\",\"type\":\"boolean\"},\"repository"
	"\":{\"type\":\"object\",\"properties\":{\"url\":{\"type\":\"string"
	"\",\"maxLength\":2048},\"baseBranch\":{\"type\":\"string\",\"maxLe"
	"ngth\":255},\"workingBranch\":{\"type\":\"string\",\"maxLength\":2"
	"55}}},\"maxIterations\":{\"description\":\"Build-verify-fix iterat"
	"ions allowed; 0 or unset means no limit.\",\"type\":\"integer\",\""
	"format\":\"int32\",\"minimum\":0,\"maximum\":1000000},\"budgetUSD"
	"\":{\"description\":\"USD budget as a decimal string; 0 or unset u"
	"ses the token caveat.\",\"type\":\"string\",\"pattern\":\"^[0-9]+("
	"\\\\.[0-9]{1,6})?$\"},\"budgetTokens\":{\"description\":\"LLM toke"
	"n budget; 0 or unset uses the token caveat.\",\"type\":\"integer\""
	",\"format\":\"int64\",\"minimum\":0,\"maximum\":1000000000000},\"c"
	"apabilities\":{\"description\":\"Allowed models, exact names or pr"
	"efixes ending in '*'.\",\"type\":\"array\",\"maxItems\":256,\"item"
	"s\":{\"type\":\"string\"}},\"allowedTools\":{\"type\":\"array\",\""
	"maxItems\":256,\"items\":{\"type\":\"string\"}},\"suspended\":{\"d"
	"escription\":\"Pause the task (true) or resume it (false).\",\"typ"
	"e\":\"boolean\"},\"sandbox\":{\"type\":\"object\",\"properties\":{"
	"\"provider\":{\"type\":\"string\",\"enum\":[\"agent-sandbox\"]},\""
	"timeoutSeconds\":{\"type\":\"integer\",\"format\":\"int32\",\"mini"
	"mum\":1,\"maximum\":2592000},\"image\":{\"type\":\"string\",\"maxL"
	"ength\":1024},\"runtimeClassName\":{\"type\":\"string\",\"maxLengt"
	"h\":253}}}}},\"status\":{\"description\":\"What the controller obs"
	"erved.\",\"type\":\"object\",\"properties\":{\"phase\":{\"type\":"
	"\"string\",\"enum\":[\"Pending\",\"Provisioning\",\"Active\",\"Pau"
	"sing\",\"Paused\",\"Completed\",\"Failed\"]},\"reason\":{\"descrip"
	"tion\":\"BudgetExceeded, Timeout, SandboxFailed, PullRequestClosed"
	", ...\",\"type\":\"string\",\"maxLength\":256},\"message\":{\"type"
	"\":\"string\",\"maxLength\":32768},\"conditions\":{\"type\":\"arra"
	"y\",\"x-kubernetes-list-type\":\"map\",\"x-kubernetes-list-map-key"
	"s\":[\"type\"],\"items\":{\"type\":\"object\",\"required\":[\"type"
	"\",\"status\"],\"properties\":{\"type\":{\"type\":\"string\",\"max"
	"Length\":316},\"status\":{\"type\":\"string\",\"enum\":[\"True\","
	"\"False\",\"Unknown\"]},\"reason\":{\"type\":\"string\"},\"message"
	"\":{\"type\":\"string\"},\"lastTransitionTime\":{\"type\":\"string"
	"\",\"format\":\"date-time\"}}}},\"observedGeneration\":{\"type\":"
	"\"integer\",\"format\":\"int64\"},\"run\":{\"description\":\"Incre"
	"mented when a finished task is run again.\",\"type\":\"integer\","
	"\"format\":\"int32\",\"minimum\":0},\"tokensConsumed\":{\"type\":"
	"\"integer\",\"format\":\"int64\",\"minimum\":0},\"costUSD\":{\"des"
	"cription\":\"USD spent, exact decimal with 6 places.\",\"type\":\""
	"string\",\"pattern\":\"^[0-9]+(\\\\.[0-9]{1,6})?$\"},\"iteration\""
	":{\"type\":\"integer\",\"format\":\"int32\",\"minimum\":0},\"lastM"
	"eterRequestIds\":{\"description\":\"The most recent meter request "
	"ids, oldest first.\",\"type\":\"array\",\"maxItems\":32,\"items\":"
	"{\"type\":\"string\"}},\"tokenId\":{\"description\":\"Identifier o"
	"f the live capability token.\",\"type\":\"string\"},\"sandboxName"
	"\":{\"type\":\"string\"},\"previewEnvironment\":{\"type\":\"string"
	"\"},\"previewUrl\":{\"type\":\"string\"},\"activeSeconds\":{\"desc"
	"ription\":\"Wall time spent Provisioning or Active.\",\"type\":\"i"
	"nteger\",\"format\":\"int64\",\"minimum\":0},\"startedAt\":{\"type"
	"\":\"string\",\"format\":\"date-time\"},\"completedAt\":{\"type\":"
	"\"string\",\"format\":\"date-time\"},\"notifier\":{\"description\""
	":\"State of the sticky status comment.\",\"type\":\"object\",\"pro"
	"perties\":{\"commentId\":{\"x-kubernetes-int-or-string\":true},\"r"
	"eportedPhase\":{\"type\":\"string\"},\"bodyHash\":{\"type\":\"stri"
	"ng\"}}},\"result\":{\"description\":\"What the runner reported whe"
	"n it completed the task (POST /api/v1/agenttask/complete).\",\"typ"
	"e\":\"object\",\"properties\":{\"commit\":{\"description\":\"The c"
	"ommit it pushed, hex.\",\"type\":\"string\"},\"branch\":{\"descrip"
	"tion\":\"The branch it pushed to.\",\"type\":\"string\"},\"pullReq"
	"uestUrl\":{\"description\":\"The pull request it opened or updated"
	".\",\"type\":\"string\"}}}}}}}";

static const char environment_schema[] =
	"{\"description\":\"A preview environment running one branch of a s"
	"ervice.\",\"type\":\"object\",\"properties\":{\"apiVersion\":{\"ty"
	"pe\":\"string\"},\"kind\":{\"type\":\"string\"},\"metadata\":{\"ty"
	"pe\":\"object\"},\"spec\":{\"type\":\"object\",\"properties\":{\"b"
	"ranch\":{\"description\":\"The branch deployed, e.g. the agent's w"
	"orking branch.\",\"type\":\"string\",\"maxLength\":255},\"service"
	"\":{\"type\":\"string\",\"maxLength\":253},\"image\":{\"type\":\"s"
	"tring\",\"maxLength\":1024},\"port\":{\"type\":\"integer\",\"forma"
	"t\":\"int32\",\"minimum\":1,\"maximum\":65535},\"repository\":{\"d"
	"escription\":\"URL of the repository the branch belongs to.\",\"ty"
	"pe\":\"string\",\"maxLength\":2048}}},\"status\":{\"type\":\"objec"
	"t\",\"x-kubernetes-preserve-unknown-fields\":true}}}";

static const char secret_schema[] =
	"{\"description\":\"Secret holds secret data of a certain type.\","
	"\"type\":\"object\",\"properties\":{\"apiVersion\":{\"type\":"
	"\"string\"},\"kind\":{\"type\":\"string\"},\"metadata\":{\"type\":"
	"\"object\"},\"data\":{\"type\":\"object\",\"additionalProperties\":"
	"{\"type\":\"string\",\"format\":\"byte\"}},\"stringData\":{\"type\":"
	"\"object\",\"additionalProperties\":{\"type\":\"string\"}},"
	"\"type\":{\"type\":\"string\"},\"immutable\":{\"type\":"
	"\"boolean\"}}}";

/* Kinds whose schema lives elsewhere: spec and status kept as sent. */
static const char open_schema[] =
	"{\"type\":\"object\",\"properties\":{\"apiVersion\":{\"type\":"
	"\"string\"},\"kind\":{\"type\":\"string\"},\"metadata\":{\"type\":"
	"\"object\"},\"spec\":{\"type\":\"object\","
	"\"x-kubernetes-preserve-unknown-fields\":true},\"status\":{\"type\":"
	"\"object\",\"x-kubernetes-preserve-unknown-fields\":true}}}";

static json_t *
load_schema(const struct k8s_resource *r)
{
	const char *text = open_schema;

	if (strcmp(r->group, "divergedev.com") == 0 &&
	    strcmp(r->kind, "AgentTask") == 0)
		text = agenttask_schema;
	else if (strcmp(r->group, "divergedev.com") == 0 &&
	    strcmp(r->kind, "Environment") == 0)
		text = environment_schema;
	else if (r->group[0] == '\0' && strcmp(r->kind, "Secret") == 0)
		text = secret_schema;
	return json_loads(text, 0, NULL);
}

/* The schema of r (borrowed), parsed at start. */
static const json_t *
schema_of(const struct k8s_apiserver *s, const struct k8s_resource *r)
{
	size_t i;

	for (i = 0; k8s_resources[i] != NULL; i++)
		if (k8s_resources[i] == r ||
		    (strcmp(k8s_resources[i]->group, r->group) == 0 &&
		    strcmp(k8s_resources[i]->plural, r->plural) == 0))
			return s->schemas[i];
	return NULL;
}

/* "com.divergedev.v1alpha1.AgentTask", "io.k8s.api.core.v1.Secret". */
static char *
schema_name(const struct k8s_resource *r, const char *suffix)
{
	struct buf b;
	const char *g = r->group, *dot;
	size_t n;

	buf_init(&b, 1024);
	if (g[0] == '\0') {
		buf_addstr(&b, "io.k8s.api.core");
	} else if (k8s_resource_builtin(r)) {
		dot = strchr(g, '.');
		buf_addstr(&b, "io.k8s.api.");
		buf_add(&b, g, (size_t)(dot - g));
	} else {
		n = strlen(g);
		while (n > 0) {
			const char *seg = g + n;

			while (seg > g && seg[-1] != '.')
				seg--;
			if (b.len > 0)
				buf_addstr(&b, ".");
			buf_add(&b, seg, (size_t)(g + n - seg));
			n = seg > g ? (size_t)(seg - g - 1) : 0;
		}
	}
	buf_printf(&b, ".%s.%s%s", r->version, r->kind, suffix);
	return buf_detach(&b, NULL);
}

static json_t *
gvk_json(const struct k8s_resource *r, const char *kind)
{
	return json_pack("{s:s, s:s, s:s}", "group", r->group, "version",
	    r->version, "kind", kind);
}

static json_t *
query_param(const char *name, const char *type)
{
	return json_pack("{s:s, s:s, s:{s:s}, s:b}", "name", name, "in",
	    "query", "schema", "type", type, "uniqueItems", 1);
}

static json_t *
path_param(const char *name)
{
	return json_pack("{s:s, s:s, s:b, s:{s:s}, s:b}", "name", name, "in",
	    "path", "required", 1, "schema", "type", "string",
	    "uniqueItems", 1);
}

/*
 * One operation. kubectl looks for the PATCH operation of a kind (by
 * x-kubernetes-group-version-kind) and its fieldValidation parameter to
 * choose server-side validation; its requestBody lists merge patches only
 * so that apply does not send strategic merge patches.
 */
static json_t *
openapi_op(const struct k8s_resource *r, const char *action,
    const char *opid, const char *ref, int code)
{
	json_t *op, *params, *resp;
	char *id, *tag, *codes;
	const char *p;

	tag = xstrdup(r->group[0] == '\0' ? "core_v1" : r->group);
	for (p = tag; *p != '\0'; p++)
		if (*p == '.' || *p == '-')
			tag[p - tag] = '_';
	id = xasprintf("%s%s", opid, r->kind);
	params = json_array();
	if (strcmp(action, "list") == 0 || strcmp(action, "watch") == 0) {
		json_array_append_new(params, query_param("allowWatchBookmarks",
		    "boolean"));
		json_array_append_new(params, query_param("continue",
		    "string"));
		json_array_append_new(params, query_param("fieldSelector",
		    "string"));
		json_array_append_new(params, query_param("labelSelector",
		    "string"));
		json_array_append_new(params, query_param("limit", "integer"));
		json_array_append_new(params, query_param("resourceVersion",
		    "string"));
		json_array_append_new(params, query_param("timeoutSeconds",
		    "integer"));
		json_array_append_new(params, query_param("watch", "boolean"));
	} else if (strcmp(action, "get") != 0) {
		json_array_append_new(params, query_param("dryRun", "string"));
		if (strcmp(action, "delete") != 0) {
			json_array_append_new(params,
			    query_param("fieldManager", "string"));
			json_array_append_new(params,
			    query_param("fieldValidation", "string"));
		}
	}
	codes = xasprintf("%d", code);
	resp = json_pack("{s:{s:s, s:{s:{s:{s:s}}}}, s:{s:s}}", codes,
	    "description", "OK", "content", MT_JSON, "schema", "$ref", ref,
	    "401", "description", "Unauthorized");
	op = json_pack("{s:[s], s:s, s:o, s:o, s:s, s:o}", "tags", tag,
	    "operationId", id, "parameters", params, "responses", resp,
	    "x-kubernetes-action", action, "x-kubernetes-group-version-kind",
	    gvk_json(r, r->kind));
	if (strcmp(action, "patch") == 0)
		json_object_set_new(op, "requestBody", json_pack(
		    "{s:{s:{s:{s:s}}}, s:b}", "content", MT_MERGE, "schema",
		    "type", "object", "required", 1));
	else if (strcmp(action, "post") == 0 || strcmp(action, "put") == 0)
		json_object_set_new(op, "requestBody", json_pack(
		    "{s:{s:{s:{s:s}}}, s:b}", "content", MT_JSON, "schema",
		    "$ref", ref, "required", 1));
	free(codes);
	free(id);
	free(tag);
	return op;
}

static json_t *
path_params(const struct k8s_resource *r, int with_name)
{
	json_t *a = json_array();

	if (with_name)
		json_array_append_new(a, path_param("name"));
	if (r->namespaced)
		json_array_append_new(a, path_param("namespace"));
	json_array_append_new(a, query_param("pretty", "string"));
	return a;
}

static void
openapi_paths(json_t *paths, const struct k8s_resource *r)
{
	char *prefix, *coll, *obj, *st, *all, *ref, *lref, *name;
	int ns = r->namespaced;
	json_t *pi;

	prefix = r->group[0] == '\0' ? xstrdup("/api/v1") :
	    xasprintf("/apis/%s/%s", r->group, r->version);
	coll = ns ? xasprintf("%s/namespaces/{namespace}/%s", prefix,
	    r->plural) : xasprintf("%s/%s", prefix, r->plural);
	obj = xasprintf("%s/{name}", coll);
	st = xasprintf("%s/status", obj);
	all = xasprintf("%s/%s", prefix, r->plural);
	name = schema_name(r, "");
	ref = xasprintf("#/components/schemas/%s", name);
	free(name);
	name = schema_name(r, "List");
	lref = xasprintf("#/components/schemas/%s", name);
	free(name);

	pi = json_pack("{s:o, s:o, s:o, s:o}", "get", openapi_op(r, "list",
	    ns ? "listNamespaced" : "list", lref, 200), "post",
	    openapi_op(r, "post", ns ? "createNamespaced" : "create", ref,
	    201), "delete", openapi_op(r, "deletecollection",
	    ns ? "deleteCollectionNamespaced" : "deleteCollection", lref,
	    200), "parameters", path_params(r, 0));
	json_object_set_new(paths, coll, pi);
	pi = json_pack("{s:o, s:o, s:o, s:o, s:o}", "get", openapi_op(r,
	    "get", ns ? "readNamespaced" : "read", ref, 200), "put",
	    openapi_op(r, "put", ns ? "replaceNamespaced" : "replace", ref,
	    200), "patch", openapi_op(r, "patch", ns ? "patchNamespaced" :
	    "patch", ref, 200), "delete", openapi_op(r, "delete",
	    ns ? "deleteNamespaced" : "delete", ref, 200), "parameters",
	    path_params(r, 1));
	json_object_set_new(paths, obj, pi);
	if (r->has_status) {
		pi = json_pack("{s:o, s:o, s:o, s:o}", "get", openapi_op(r,
		    "get", ns ? "readNamespacedStatus" : "readStatus", ref,
		    200), "put", openapi_op(r, "put",
		    ns ? "replaceNamespacedStatus" : "replaceStatus", ref,
		    200), "patch", openapi_op(r, "patch",
		    ns ? "patchNamespacedStatus" : "patchStatus", ref, 200),
		    "parameters", path_params(r, 1));
		json_object_set_new(paths, st, pi);
	}
	if (ns) {
		pi = json_pack("{s:o, s:[o]}", "get", openapi_op(r, "list",
		    "listForAllNamespaces", lref, 200), "parameters",
		    query_param("pretty", "string"));
		json_object_set_new(paths, all, pi);
	}
	free(prefix);
	free(coll);
	free(obj);
	free(st);
	free(all);
	free(ref);
	free(lref);
}

static void
openapi_schemas(const struct k8s_apiserver *s, json_t *schemas,
    const struct k8s_resource *r)
{
	const json_t *base = schema_of(s, r);
	json_t *sch = base != NULL ? json_deep_copy(base) : json_object();
	char *name = schema_name(r, ""), *lname = schema_name(r, "List");
	char *lkind = xasprintf("%sList", r->kind);
	char *ref = xasprintf("#/components/schemas/%s", name);

	json_object_set_new(sch, "x-kubernetes-group-version-kind",
	    json_pack("[o]", gvk_json(r, r->kind)));
	json_object_set_new(schemas, name, sch);
	json_object_set_new(schemas, lname, json_pack("{s:s, s:s, s:[s], "
	    "s:{s:{s:s}, s:{s:s}, s:{s:s}, s:{s:s, s:{s:s}}}, s:[o]}",
	    "description", "A list of objects.", "type", "object", "required",
	    "items", "properties", "apiVersion", "type", "string", "kind",
	    "type", "string", "metadata", "type", "object", "items", "type",
	    "array", "items", "$ref", ref, "x-kubernetes-group-version-kind",
	    gvk_json(r, lkind)));
	free(name);
	free(lname);
	free(lkind);
	free(ref);
}

/* The OpenAPI v3 document of one group/version; NULL if none. */
static json_t *
openapi_doc(const struct k8s_apiserver *s, const char *group,
    const char *version)
{
	const struct k8s_resource *const *rp;
	json_t *paths = json_object(), *schemas = json_object();
	size_t n = 0;

	for (rp = k8s_resources; *rp != NULL; rp++) {
		if (strcmp((*rp)->group, group) != 0 ||
		    strcmp((*rp)->version, version) != 0)
			continue;
		openapi_paths(paths, *rp);
		openapi_schemas(s, schemas, *rp);
		n++;
	}
	if (n == 0) {
		json_decref(paths);
		json_decref(schemas);
		return NULL;
	}
	return json_pack("{s:s, s:{s:s, s:s}, s:o, s:{s:o}}", "openapi",
	    "3.0.0", "info", "title", "Kubernetes", "version", "v1.32.0",
	    "paths", paths, "components", "schemas", schemas);
}

/* /openapi/v3: where each group/version document is, with a hash. */
static json_t *
openapi_index(const struct k8s_apiserver *s)
{
	const struct k8s_resource *const *rp, *const *sp;
	json_t *paths = json_object(), *doc;
	unsigned char mac[32];
	char hex[65], *key, *url, *text;

	for (rp = k8s_resources; *rp != NULL; rp++) {
		int seen = 0;

		for (sp = k8s_resources; sp != rp; sp++)
			if (strcmp((*sp)->group, (*rp)->group) == 0 &&
			    strcmp((*sp)->version, (*rp)->version) == 0)
				seen = 1;
		if (seen)
			continue;
		doc = openapi_doc(s, (*rp)->group, (*rp)->version);
		text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
		hmac_sha256("openapi", 7, text, strlen(text), mac);
		hex_encode(mac, 32, hex);
		key = (*rp)->group[0] == '\0' ? xstrdup("api/v1") :
		    xasprintf("apis/%s/%s", (*rp)->group, (*rp)->version);
		url = xasprintf("/openapi/v3/%s?hash=%s", key, hex);
		json_object_set_new(paths, key, json_pack("{s:s}",
		    "serverRelativeURL", url));
		free(url);
		free(key);
		free(text);
		json_decref(doc);
	}
	return json_pack("{s:o}", "paths", paths);
}

/* ---------------------------------------------------- field validation */

static int
in_list(const char *const *list, const char *s)
{
	for (; *list != NULL; list++)
		if (strcmp(*list, s) == 0)
			return 1;
	return 0;
}

static void
add_unknown(json_t *found, const char *path, const char *key)
{
	char *p = path[0] == '\0' ? xstrdup(key) :
	    xasprintf("%s.%s", path, key);

	if (json_array_size(found) < 100)
		json_array_append_new(found, json_string(p));
	free(p);
}

/*
 * Collect the fields of v that schema does not declare, as structural
 * pruning would drop them (paths like "spec.foo" or "a.b[0].c"), and with
 * prune remove them from v. Null values are skipped: in a merge patch
 * they delete.
 */
static void
unknown_fields(json_t *v, const json_t *schema, const char *path,
    int depth, json_t *found, int prune)
{
	const json_t *props, *addl, *items, *sub;
	const char *key, *mk;
	json_t *val, *mv;
	void *tmp, *mtmp;
	char *p;
	size_t i;
	int preserve;

	if (!json_is_object(schema) || depth > 64)
		return;
	preserve = json_is_true(json_object_get(schema,
	    "x-kubernetes-preserve-unknown-fields"));
	if (json_object_get(schema, "x-kubernetes-int-or-string") != NULL)
		return;
	if (json_is_array(v)) {
		items = json_object_get(schema, "items");
		if (!json_is_object(items))
			return;
		json_array_foreach(v, i, val) {
			p = xasprintf("%s[%zu]", path, i);
			unknown_fields(val, items, p, depth + 1, found, prune);
			free(p);
		}
		return;
	}
	if (!json_is_object(v))
		return;
	props = json_object_get(schema, "properties");
	addl = json_object_get(schema, "additionalProperties");
	json_object_foreach_safe(v, tmp, key, val) {
		if (json_is_null(val))
			continue;
		if (depth == 0 && strcmp(key, "metadata") == 0) {
			if (!json_is_object(val))
				continue;
			json_object_foreach_safe(val, mtmp, mk, mv) {
				if (json_is_null(mv) ||
				    in_list(object_meta_fields, mk))
					continue;
				add_unknown(found, "metadata", mk);
				if (prune)
					json_object_del(val, mk);
			}
			continue;
		}
		sub = json_is_object(props) ? json_object_get(props, key) :
		    NULL;
		if (sub == NULL && json_is_object(addl))
			sub = addl;
		if (sub != NULL) {
			p = path[0] == '\0' ? xstrdup(key) :
			    xasprintf("%s.%s", path, key);
			unknown_fields(val, sub, p, depth + 1, found, prune);
			free(p);
			continue;
		}
		if (preserve || json_is_true(addl))
			continue;
		add_unknown(found, path, key);
		if (prune)
			json_object_del(v, key);
	}
}

static int
field_validation_mode(struct api_req *q, enum field_validation *out)
{
	const char *v = query(q, "fieldValidation");

	if (v == NULL || v[0] == '\0' || strcasecmp(v, "Warn") == 0)
		*out = FV_WARN;
	else if (strcasecmp(v, "Strict") == 0)
		*out = FV_STRICT;
	else if (strcasecmp(v, "Ignore") == 0)
		*out = FV_IGNORE;
	else
		return -1;
	return 0;
}

/*
 * Fields of obj (a whole object or a merge patch) that the schema does not
 * know: with fieldValidation=Strict an error; otherwise they are dropped,
 * as the apiserver prunes custom resources, with a warning each unless
 * the client asked to Ignore them.
 */
static int
check_fields(struct api_req *q, const struct target *t, json_t *obj,
    struct k8s_status *st)
{
	enum field_validation mode;
	const json_t *schema = schema_of(q->srv, t->r);
	json_t *found = NULL, *f;
	struct buf msg;
	size_t i;
	int ret = -1;

	buf_init(&msg, 64 * 1024);
	if (field_validation_mode(q, &mode) < 0) {
		ret = k8s_status_set(st, K8S_EBADREQUEST, "fieldValidation "
		    "must be one of Strict, Warn or Ignore", NULL);
		goto out;
	}
	if (schema == NULL) {
		ret = 0;
		goto out;
	}
	found = json_array();
	unknown_fields(obj, schema, "", 0, found, mode != FV_STRICT);
	if (json_array_size(found) == 0 || mode == FV_IGNORE) {
		ret = 0;
		goto out;
	}
	if (mode == FV_WARN) {
		json_array_foreach(found, i, f) {
			char *w = xasprintf("unknown field \"%s\"",
			    json_string_value(f));

			add_warning(q, w);
			free(w);
		}
		ret = 0;
		goto out;
	}
	buf_printf(&msg, "%s in version \"%s\" cannot be handled as a %s: "
	    "strict decoding error: ", t->r->kind, t->r->version, t->r->kind);
	json_array_foreach(found, i, f)
		buf_printf(&msg, "%sunknown field \"%s\"", i > 0 ? ", " : "",
		    json_string_value(f));
	ret = k8s_status_set(st, K8S_EBADREQUEST, msg.data, NULL);
out:
	json_decref(found);
	buf_release(&msg);
	return ret;
}

/* -------------------------------------------------------- media types */

#define ACCEPT_MAX_RANGES	64	/* more in one header are ignored */

/*
 * One media range of an Accept header, its strings in a copy of it. The
 * parameters the apiserver reads (negotiation.acceptMediaTypeOptions):
 * as, g and v ask for a conversion, stream and sv restrict; others are
 * ignored.
 */
struct media_range {
	const char *type;
	const char *subtype;
	const char *as, *g, *v, *stream, *sv;
	double q;
};

static char *
trim_blanks(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
		*--e = '\0';
	return s;
}

/* Parse one media range in place; 0, or -1 when it names no type. */
static int
media_range_parse(char *s, struct media_range *out)
{
	struct media_range m;
	char *p, *param, *eq, *key, *val, *sub;

	memset(&m, 0, sizeof(m));
	m.q = 1.0;
	p = strchr(s, ';');
	if (p != NULL)
		*p++ = '\0';
	s = trim_blanks(s);
	sub = strchr(s, '/');
	if (sub == NULL && strcmp(s, "*") == 0) {
		m.type = m.subtype = "*";
	} else if (sub != NULL && strchr(sub + 1, '/') == NULL) {
		*sub++ = '\0';
		m.type = trim_blanks(s);
		m.subtype = trim_blanks(sub);
	} else {
		return -1;
	}
	while (p != NULL) {
		param = p;
		p = strchr(p, ';');
		if (p != NULL)
			*p++ = '\0';
		eq = strchr(param, '=');
		if (eq == NULL)
			continue;
		*eq = '\0';
		key = trim_blanks(param);
		val = trim_blanks(eq + 1);
		if (strcmp(key, "q") == 0)
			m.q = strtod(val, NULL);
		else if (strcmp(key, "as") == 0)
			m.as = val;
		else if (strcmp(key, "g") == 0)
			m.g = val;
		else if (strcmp(key, "v") == 0)
			m.v = val;
		else if (strcmp(key, "stream") == 0)
			m.stream = val;
		else if (strcmp(key, "sv") == 0)
			m.sv = val;
	}
	*out = m;
	return 0;
}

/* a goes before b: a higher q, then a concrete type before a wildcard. */
static int
media_range_before(const struct media_range *a, const struct media_range *b)
{
	if (a->q != b->q)
		return a->q > b->q;
	if (strcmp(a->type, "*") != 0 && strcmp(b->type, "*") == 0)
		return 1;
	return strcmp(a->subtype, "*") != 0 && strcmp(b->subtype, "*") == 0;
}

/*
 * What the media range m makes of a reply, when this server can write it:
 * JSON (the only serializer here), plain or converted to one of the meta
 * kinds the apiserver converts to (RequestScope.AllowsMediaTypeTransform).
 */
static int
media_range_output(const struct media_range *m, struct output *out)
{
	struct output o;

	memset(&o, 0, sizeof(o));
	if (!((strcasecmp(m->type, "application") == 0 &&
	    (strcasecmp(m->subtype, "json") == 0 ||
	    strcmp(m->subtype, "*") == 0)) ||
	    (strcmp(m->type, "*") == 0 && strcmp(m->subtype, "*") == 0)))
		return -1;
	if (m->stream != NULL && m->stream[0] != '\0' &&
	    strcmp(m->stream, "watch") != 0)
		return -1;
	if (m->sv != NULL && m->sv[0] != '\0' && strcmp(m->sv, "v1") != 0)
		return -1;
	if (m->as != NULL || m->g != NULL || m->v != NULL) {
		if (m->g == NULL || strcmp(m->g, "meta.k8s.io") != 0 ||
		    m->v == NULL || m->as == NULL)
			return -1;
		if (strcmp(m->v, "v1beta1") == 0)
			o.v1beta1 = 1;
		else if (strcmp(m->v, "v1") != 0)
			return -1;
		if (strcmp(m->as, "PartialObjectMetadata") == 0)
			o.kind = OUT_PARTIAL;
		else if (strcmp(m->as, "PartialObjectMetadataList") == 0)
			o.kind = OUT_PARTIAL_LIST;
		else if (strcmp(m->as, "Table") == 0)
			o.kind = OUT_TABLE;
		else
			return -1;
	}
	*out = o;
	return 0;
}

/*
 * Negotiate the reply's form from an Accept header, as the apiserver does
 * (negotiation.NegotiateMediaTypeOptions): the media ranges by preference,
 * the first one this server can write wins; none of them: -1 (406). No
 * header means plain JSON.
 */
static int
negotiate(const char *accept, struct output *out)
{
	struct media_range *ranges = NULL, m;
	char *copy, *p, *range;
	size_t n = 0, i, j;
	int ret = -1;

	if (accept == NULL || accept[0] == '\0') {
		memset(out, 0, sizeof(*out));
		return 0;
	}
	copy = xstrdup(accept);
	for (p = copy; p != NULL && n < ACCEPT_MAX_RANGES;) {
		range = p;
		p = strchr(p, ',');
		if (p != NULL)
			*p++ = '\0';
		if (media_range_parse(range, &m) < 0)
			continue;
		ranges = xrealloc(ranges, (n + 1) * sizeof(*ranges));
		/* a stable insertion sort, as the header is short */
		for (i = n++; i > 0 && media_range_before(&m, &ranges[i - 1]);
		    i--)
			ranges[i] = ranges[i - 1];
		ranges[i] = m;
	}
	for (j = 0; j < n && ret < 0; j++)
		if (media_range_output(&ranges[j], out) == 0)
			ret = 0;
	free(ranges);
	free(copy);
	return ret;
}

/*
 * The form an Accept header asks for (*kind_out an enum out_kind,
 * *v1beta1_out for meta.k8s.io/v1beta1), or -1 when none can be served.
 * Not in the header: the fuzz target calls it.
 */
int
k8s_apiserver_negotiate(const char *accept, int *kind_out, int *v1beta1_out)
{
	struct output o;

	if (negotiate(accept, &o) < 0)
		return -1;
	*kind_out = (int)o.kind;
	*v1beta1_out = o.v1beta1;
	return 0;
}

static const char *
meta_api_version(const struct output *o)
{
	return o->v1beta1 ? "meta.k8s.io/v1beta1" : "meta.k8s.io/v1";
}

/* The PartialObjectMetadata of obj (borrowed): its kind and metadata. */
static json_t *
partial_object(const json_t *obj, const struct output *o)
{
	json_t *meta = json_object_get(obj, "metadata");

	return json_pack("{s:s, s:s, s:o}", "kind", "PartialObjectMetadata",
	    "apiVersion", meta_api_version(o), "metadata",
	    json_is_object(meta) ? json_incref(meta) : json_object());
}

/*
 * The PartialObjectMetadataList of list (borrowed): the list's metadata
 * (resourceVersion, continue), an item per item.
 */
static json_t *
partial_list(const json_t *list, const struct output *o)
{
	json_t *items = json_array(), *meta, *it;
	size_t i;

	json_array_foreach(json_object_get(list, "items"), i, it)
		json_array_append_new(items, partial_object(it, o));
	meta = json_object_get(list, "metadata");
	return json_pack("{s:s, s:s, s:o, s:o}", "kind",
	    "PartialObjectMetadataList", "apiVersion", meta_api_version(o),
	    "metadata", json_is_object(meta) ? json_incref(meta) :
	    json_object(), "items", items);
}

/* -------------------------------------------------------------- tables */

static const struct column agenttask_columns[] = {
	{ "Phase", "string", ".status.phase", "" },
	{ "Cost", "string", ".status.costUSD", "USD spent so far" },
	{ "Tokens", "integer", ".status.tokensConsumed",
	    "LLM tokens consumed so far" },
	{ "Iteration", "integer", ".status.iteration", "" },
	{ "Age", "date", ".metadata.creationTimestamp", "" },
	{ NULL, NULL, NULL, NULL }
};
static const struct column environment_columns[] = {
	{ "Branch", "string", ".spec.branch", "" },
	{ "Service", "string", ".spec.service", "" },
	{ "Age", "date", ".metadata.creationTimestamp", "" },
	{ NULL, NULL, NULL, NULL }
};
static const struct column secret_columns[] = {
	{ "Type", "string", ".type", "" },
	{ "Data", "integer", NULL, "" },
	{ "Age", "date", ".metadata.creationTimestamp", "" },
	{ NULL, NULL, NULL, NULL }
};
static const struct column namespace_columns[] = {
	{ "Status", "string", ".status.phase", "" },
	{ "Age", "date", ".metadata.creationTimestamp", "" },
	{ NULL, NULL, NULL, NULL }
};
static const struct column default_columns[] = {
	{ "Age", "date", ".metadata.creationTimestamp", "" },
	{ NULL, NULL, NULL, NULL }
};

static const struct column *
columns_of(const struct k8s_resource *r)
{
	if (strcmp(r->group, "divergedev.com") == 0 &&
	    strcmp(r->kind, "AgentTask") == 0)
		return agenttask_columns;
	if (strcmp(r->group, "divergedev.com") == 0 &&
	    strcmp(r->kind, "Environment") == 0)
		return environment_columns;
	if (r->group[0] == '\0' && strcmp(r->kind, "Secret") == 0)
		return secret_columns;
	if (r->group[0] == '\0' && strcmp(r->kind, "Namespace") == 0)
		return namespace_columns;
	return default_columns;
}

static const char *
table_ctype(const struct output *o)
{
	return o->v1beta1 ?
	    "application/json;as=Table;v=v1beta1;g=meta.k8s.io" :
	    "application/json;as=Table;v=v1;g=meta.k8s.io";
}

static json_t *
table_cell(const struct column *c, json_t *obj, int64_t now)
{
	json_t *v;
	int64_t t;
	char *s, age[32];

	if (c->path == NULL) {
		v = json_object_get(obj, "data");
		return json_integer(json_is_object(v) ?
		    (json_int_t)json_object_size(v) : 0);
	}
	v = json_path(obj, c->path);
	if (v == NULL || json_is_null(v))
		return json_null();
	if (strcmp(c->type, "date") == 0) {
		if (!json_is_string(v) ||
		    time_parse_rfc3339(json_string_value(v), &t) < 0)
			return json_string("<unknown>");
		time_human_duration(now - t, age);
		return json_string(age);
	}
	if (json_is_object(v) || json_is_array(v)) {
		s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
		v = json_string(s != NULL ? s : "");
		free(s);
		return v;
	}
	return json_incref(v);
}

/*
 * A meta.k8s.io Table of items (an array) with the kind's printer
 * columns; row objects as include asks (PartialObjectMetadata by default).
 */
static json_t *
table_json(const struct k8s_resource *r, const struct output *o,
    enum include_mode include, const json_t *items, const char *rv)
{
	const struct column *c, *cols = columns_of(r);
	json_t *defs, *rows, *it, *cells, *row;
	int64_t now = now_unix();
	size_t i;

	defs = json_array();
	json_array_append_new(defs, json_pack("{s:s, s:s, s:s, s:s, s:i}",
	    "name", "Name", "type", "string", "format", "name",
	    "description", "Name must be unique within a namespace.",
	    "priority", 0));
	for (c = cols; c->name != NULL; c++)
		json_array_append_new(defs, json_pack("{s:s, s:s, s:s, s:s, "
		    "s:i}", "name", c->name, "type", c->type, "format", "",
		    "description", c->desc, "priority", 0));
	rows = json_array();
	json_array_foreach(items, i, it) {
		const char *name = k8s_meta_str(it, "name");

		cells = json_array();
		json_array_append_new(cells, json_string(name ? name : ""));
		for (c = cols; c->name != NULL; c++)
			json_array_append_new(cells, table_cell(c, it, now));
		row = json_pack("{s:o}", "cells", cells);
		if (include == INCLUDE_OBJECT) {
			json_object_set(row, "object", it);
		} else if (include == INCLUDE_METADATA) {
			json_object_set_new(row, "object",
			    partial_object(it, o));
		}
		json_array_append_new(rows, row);
	}
	return json_pack("{s:s, s:s, s:{s:s, s:s}, s:o, s:o}", "kind",
	    "Table", "apiVersion", meta_api_version(o), "metadata",
	    "resourceVersion", rv != NULL ? rv : "", "continue", "",
	    "columnDefinitions", defs, "rows", rows);
}

static enum include_mode
include_mode(struct api_req *q)
{
	const char *v = query(q, "includeObject");

	if (v == NULL)
		return INCLUDE_METADATA;
	if (strcmp(v, "None") == 0)
		return INCLUDE_NONE;
	if (strcmp(v, "Object") == 0)
		return INCLUDE_OBJECT;
	return INCLUDE_METADATA;
}

/*
 * Negotiate the form of the reply from the Accept header into q->form: 1,
 * or 0 and a 406 sent when no media range can be served.
 */
static int
acceptable(struct api_req *q)
{
	if (negotiate(header(q, "Accept"), &q->form) == 0)
		return 1;
	reply_err(q, K8S_EUNSUPPORTED, 406, "NotAcceptable", "only the "
	    "following media types are accepted: %s", MT_JSON);
	return 0;
}

/*
 * Answer obj (stolen), one object of r or (single 0) a list of them, in
 * the negotiated form. Like the apiserver (handlers.doTransformObject),
 * a list asked for as PartialObjectMetadata, or an object as
 * PartialObjectMetadataList, is a 406.
 */
static void
reply_object(struct api_req *q, int code, const struct k8s_resource *r,
    json_t *obj, int single)
{
	const struct output *o = &q->form;
	json_t *items;

	switch (o->kind) {
	case OUT_OBJECT:
		reply_json(q, code, obj);
		return;
	case OUT_PARTIAL:
	case OUT_PARTIAL_LIST:
		if (single == (o->kind == OUT_PARTIAL))
			reply_json(q, code, single ? partial_object(obj, o) :
			    partial_list(obj, o));
		else
			reply_err(q, K8S_EUNSUPPORTED, 406, "NotAcceptable",
			    "you requested PartialObjectMetadata%s, but the "
			    "requested object is %sa list (%s%s)", single ?
			    "List" : "", single ? "not " : "", r->kind,
			    single ? "" : "List");
		break;
	case OUT_TABLE:
		items = single ? json_pack("[O]", obj) :
		    json_incref(json_object_get(obj, "items"));
		reply_json(q, code, table_json(r, o, include_mode(q), items,
		    k8s_meta_str(obj, "resourceVersion")));
		q->ctype = table_ctype(o);
		json_decref(items);
		break;
	}
	json_decref(obj);
}

/* ---------------------------------------------- JSON Patch (RFC 6902) */

/* Split a JSON pointer into unescaped tokens; -1 when malformed. */
static int
pointer_split(const char *ptr, char ***out, size_t *n_out)
{
	char **toks = NULL;
	size_t n = 0;
	const char *p = ptr, *e;

	if (ptr[0] != '\0' && ptr[0] != '/')
		return -1;
	while (*p == '/') {
		struct buf b;
		const char *c;

		p++;
		e = strchr(p, '/');
		if (e == NULL)
			e = p + strlen(p);
		buf_init(&b, 64 * 1024);
		buf_add(&b, "", 0);
		for (c = p; c < e; c++) {
			if (*c == '~' && c + 1 < e && (c[1] == '0' ||
			    c[1] == '1')) {
				buf_add(&b, c[1] == '0' ? "~" : "/", 1);
				c++;
			} else if (*c == '~') {
				buf_release(&b);
				goto bad;
			} else {
				buf_add(&b, c, 1);
			}
		}
		toks = xrealloc(toks, (n + 1) * sizeof(*toks));
		toks[n++] = buf_detach(&b, NULL);
		p = e;
	}
	*out = toks;
	*n_out = n;
	return 0;
bad:
	while (n > 0)
		free(toks[--n]);
	free(toks);
	return -1;
}

static void
pointer_free(char **toks, size_t n)
{
	while (n > 0)
		free(toks[--n]);
	free(toks);
}

/* An array index token: digits without a leading zero; -1 otherwise. */
static int
array_index(const char *tok, size_t *out)
{
	size_t i, v = 0;

	if (tok[0] == '\0' || (tok[0] == '0' && tok[1] != '\0'))
		return -1;
	for (i = 0; tok[i] != '\0'; i++) {
		if (tok[i] < '0' || tok[i] > '9' || v > 100000000)
			return -1;
		v = v * 10 + (size_t)(tok[i] - '0');
	}
	*out = v;
	return 0;
}

/* The value at tokens [0, n) (borrowed), NULL when absent. */
static json_t *
pointer_get(json_t *doc, char **toks, size_t n)
{
	size_t i, idx;

	for (i = 0; i < n && doc != NULL; i++) {
		if (json_is_object(doc))
			doc = json_object_get(doc, toks[i]);
		else if (json_is_array(doc) &&
		    array_index(toks[i], &idx) == 0)
			doc = json_array_get(doc, idx);
		else
			doc = NULL;
	}
	return doc;
}

/* add (replace = 0) or replace (1) the value at toks with v (stolen). */
static int
pointer_put(json_t **doc, char **toks, size_t n, json_t *v, int replace)
{
	json_t *parent;
	const char *last;
	size_t idx;

	if (n == 0) {
		json_decref(*doc);
		*doc = v;
		return 0;
	}
	parent = pointer_get(*doc, toks, n - 1);
	last = toks[n - 1];
	if (json_is_object(parent)) {
		if (replace && json_object_get(parent, last) == NULL)
			goto bad;
		return json_object_set_new(parent, last, v) == 0 ? 0 : -1;
	}
	if (json_is_array(parent)) {
		if (!replace && strcmp(last, "-") == 0)
			return json_array_append_new(parent, v) == 0 ? 0 : -1;
		if (array_index(last, &idx) < 0)
			goto bad;
		if (replace && idx < json_array_size(parent))
			return json_array_set_new(parent, idx, v) == 0 ? 0 : -1;
		if (!replace && idx <= json_array_size(parent))
			return json_array_insert_new(parent, idx, v) == 0 ?
			    0 : -1;
	}
bad:
	json_decref(v);
	return -1;
}

static int
pointer_remove(json_t *doc, char **toks, size_t n)
{
	json_t *parent;
	size_t idx;

	if (n == 0)
		return -1;
	parent = pointer_get(doc, toks, n - 1);
	if (json_is_object(parent))
		return json_object_del(parent, toks[n - 1]);
	if (json_is_array(parent) && array_index(toks[n - 1], &idx) == 0)
		return json_array_remove(parent, idx);
	return -1;
}

/* Whether v nests deeper than max levels (it looks no deeper than that). */
static int
too_deep(const json_t *v, int max)
{
	const char *k;
	json_t *c;
	size_t i;

	if (max < 0)
		return 1;
	if (json_is_object(v)) {
		json_object_foreach((json_t *)v, k, c)
			if (too_deep(c, max - 1))
				return 1;
	} else if (json_is_array(v)) {
		json_array_foreach((json_t *)v, i, c)
			if (too_deep(c, max - 1))
				return 1;
	}
	return 0;
}

/*
 * Apply an RFC 6902 patch to *doc in place. K8S_EBADREQUEST for a
 * malformed patch, K8S_EINVALID when an operation does not apply.
 */
static int
json_patch_apply(json_t **doc, const json_t *patch, struct k8s_status *st)
{
	const json_t *op;
	char **path = NULL, **from = NULL;
	size_t i, np = 0, nf = 0;
	int ret = -1;

	if (!json_is_array(patch))
		return k8s_status_set(st, K8S_EBADREQUEST, "json patch: the "
		    "body must be an array of operations", NULL);
	json_array_foreach(patch, i, op) {
		const char *name, *ps, *fs;
		json_t *value, *v;
		char *msg;

		name = json_string_value(json_object_get(op, "op"));
		ps = json_string_value(json_object_get(op, "path"));
		fs = json_string_value(json_object_get(op, "from"));
		value = json_object_get(op, "value");
		if (name == NULL || ps == NULL ||
		    pointer_split(ps, &path, &np) < 0) {
			ret = k8s_status_set(st, K8S_EBADREQUEST, "json patch: "
			    "operation needs an op and a valid path", NULL);
			goto out;
		}
		if ((strcmp(name, "move") == 0 || strcmp(name, "copy") == 0) &&
		    (fs == NULL || pointer_split(fs, &from, &nf) < 0)) {
			ret = k8s_status_set(st, K8S_EBADREQUEST, "json patch: "
			    "move and copy need a valid from", NULL);
			goto out;
		}
		if ((strcmp(name, "add") == 0 || strcmp(name, "replace") == 0 ||
		    strcmp(name, "test") == 0) && value == NULL) {
			ret = k8s_status_set(st, K8S_EBADREQUEST, "json patch: "
			    "add, replace and test need a value", NULL);
			goto out;
		}
		msg = NULL;
		if (strcmp(name, "add") == 0) {
			if (pointer_put(doc, path, np, json_deep_copy(value),
			    0) < 0)
				msg = xasprintf("add operation does not apply: "
				    "doc is missing path: \"%s\"", ps);
		} else if (strcmp(name, "remove") == 0) {
			if (pointer_remove(*doc, path, np) < 0)
				msg = xasprintf("remove operation does not "
				    "apply: doc is missing path: \"%s\"", ps);
		} else if (strcmp(name, "replace") == 0) {
			if (pointer_put(doc, path, np, json_deep_copy(value),
			    1) < 0)
				msg = xasprintf("replace operation does not "
				    "apply: doc is missing key: %s", ps);
		} else if (strcmp(name, "test") == 0) {
			v = pointer_get(*doc, path, np);
			if (v == NULL || !json_equal(v, value))
				msg = xasprintf("testing value %s failed", ps);
		} else if (strcmp(name, "move") == 0 ||
		    strcmp(name, "copy") == 0) {
			size_t fl = strlen(fs);
			int move = strcmp(name, "move") == 0;

			v = pointer_get(*doc, from, nf);
			if (v == NULL) {
				msg = xasprintf("%s operation does not apply: "
				    "doc is missing from path: %s", name, fs);
			} else if (move && strncmp(ps, fs, fl) == 0 &&
			    ps[fl] == '/') {
				msg = xasprintf("move operation: %s is a "
				    "child of %s", ps, fs);
			} else {
				v = json_deep_copy(v);
				if (move && pointer_remove(*doc, from,
				    nf) < 0) {
					json_decref(v);
					v = NULL;
				}
				if (v == NULL || pointer_put(doc, path, np, v,
				    0) < 0)
					msg = xasprintf("%s operation does not "
					    "apply: %s", name, ps);
			}
		} else {
			msg = xasprintf("unexpected kind: %s", name);
			ret = k8s_status_set(st, K8S_EBADREQUEST, msg, NULL);
			free(msg);
			goto out;
		}
		/*
		 * copy can double the depth at each step: past the parser's
		 * own limit, stop before anything recursive (a deep copy, an
		 * equal) runs out of stack
		 */
		if (msg == NULL && too_deep(*doc, PATCH_MAX_DEPTH))
			msg = xasprintf("the patched object nests deeper than "
			    "%d levels", PATCH_MAX_DEPTH);
		if (msg != NULL) {
			ret = k8s_status_set(st, K8S_EINVALID, msg, NULL);
			free(msg);
			goto out;
		}
		pointer_free(path, np);
		pointer_free(from, nf);
		path = from = NULL;
		np = nf = 0;
	}
	ret = 0;
out:
	pointer_free(path, np);
	pointer_free(from, nf);
	return ret;
}

/* ------------------------------------------------------------ objects */

/*
 * dryRun, in the query or in DeleteOptions (opts, may be NULL): "All"
 * sends the writes of q to the store's dry-run view (checked and
 * answered, nothing kept), as the apiserver does. 1 and a 400 sent for
 * another value, or when the store has no dry run.
 */
static int
dry_run_refused(struct api_req *q, const json_t *opts)
{
	const char *v = query(q, "dryRun");
	const json_t *dr = json_object_get(opts, "dryRun");

	if ((v == NULL || v[0] == '\0') && json_array_size(dr) > 0)
		v = json_string_value(json_array_get(dr, 0));
	if ((v == NULL || v[0] == '\0') && json_array_size(dr) == 0)
		return 0;
	if (v != NULL && strcmp(v, "All") == 0 &&
	    k8s_embedded_dry_run(q->srv->api) != NULL) {
		q->api = k8s_embedded_dry_run(q->srv->api);
		return 0;
	}
	reply_err(q, K8S_EBADREQUEST, 400, "BadRequest", "dryRun=%s is not "
	    "supported by this server", v != NULL ? v : "");
	return 1;
}

/* The request body as JSON (any type) into *out. */
static int
body_json(struct api_req *q, json_t **out, struct k8s_status *st)
{
	char *m = media_type(header(q, "Content-Type"));
	json_error_t e;
	json_t *j;
	int ret = -1;

	if (strstr(m, "protobuf") != NULL || strstr(m, "yaml") != NULL ||
	    strstr(m, "cbor") != NULL) {
		ret = k8s_status_set(st, K8S_EUNSUPPORTED, "the body of the "
		    "request was in an unknown format - accepted media types "
		    "include: application/json", NULL);
		goto out;
	}
	if (q->body.len == 0) {
		ret = k8s_status_set(st, K8S_EBADREQUEST, "the body of the "
		    "request is empty", NULL);
		goto out;
	}
	j = json_loadb(q->body.data, q->body.len, JSON_DECODE_ANY, &e);
	if (j == NULL) {
		char *msg = xasprintf("the body of the request is not valid "
		    "JSON: %s (line %d, column %d)", e.text, e.line, e.column);

		ret = k8s_status_set(st, K8S_EBADREQUEST, msg, NULL);
		free(msg);
		goto out;
	}
	*out = j;
	ret = 0;
out:
	free(m);
	return ret;
}

static int
is_secret(const struct k8s_resource *r)
{
	return r->group[0] == '\0' && strcmp(r->kind, "Secret") == 0;
}

/* ---------------------------------------------------- protobuf bodies */

/*
 * kubectl's typed clients (kubectl create secret) send built-in kinds as
 * Kubernetes protobuf: "k8s\0" then a runtime.Unknown whose raw field is
 * the object. Only v1 Secret is decoded (the built-in kind that kubectl
 * creates this way); fields are those of k8s.io/api/core/v1 and
 * apimachinery's ObjectMeta, by number.
 */
struct pb {
	const unsigned char *p;
	const unsigned char *end;
};

struct pb_field {
	uint32_t num;
	int wire;
	uint64_t v;			/* varint value */
	const unsigned char *data;	/* length-delimited bytes */
	size_t len;
};

static int
pb_varint(struct pb *b, uint64_t *out)
{
	uint64_t v = 0;
	int shift;

	for (shift = 0; shift < 64 && b->p < b->end; shift += 7) {
		unsigned char c = *b->p++;

		v |= (uint64_t)(c & 0x7f) << shift;
		if ((c & 0x80) == 0) {
			*out = v;
			return 0;
		}
	}
	return -1;
}

/* The next field: 1, 0 at the end, -1 when malformed. */
static int
pb_next(struct pb *b, struct pb_field *f)
{
	uint64_t key, n;

	if (b->p == b->end)
		return 0;
	if (pb_varint(b, &key) < 0 || (key >> 3) == 0 || (key >> 3) >
	    UINT32_MAX)
		return -1;
	f->num = (uint32_t)(key >> 3);
	f->wire = (int)(key & 7);
	f->v = 0;
	f->data = NULL;
	f->len = 0;
	switch (f->wire) {
	case 0:
		return pb_varint(b, &f->v) < 0 ? -1 : 1;
	case 1:
		n = 8;
		break;
	case 2:
		if (pb_varint(b, &n) < 0)
			return -1;
		break;
	case 5:
		n = 4;
		break;
	default:
		return -1;
	}
	if (n > (uint64_t)(b->end - b->p))
		return -1;
	f->data = b->p;
	f->len = (size_t)n;
	b->p += n;
	return 1;
}

static json_t *
pb_string(const struct pb_field *f)
{
	return json_stringn((const char *)f->data, f->len);
}

/* A map<string, bytes|string> entry into obj; bytes are base64. */
static int
pb_map_entry(json_t *obj, const struct pb_field *f, int bytes)
{
	struct pb b = { f->data, f->data + f->len };
	struct pb_field e;
	json_t *key = NULL, *val = NULL;
	char *b64;
	int rc, ret = -1;

	while ((rc = pb_next(&b, &e)) > 0) {
		if (e.wire != 2)
			continue;
		if (e.num == 1) {
			json_decref(key);
			key = pb_string(&e);
		} else if (e.num == 2) {
			json_decref(val);
			if (bytes) {
				b64 = base64_encode(e.data, e.len, 0, 1);
				val = json_string(b64);
				free(b64);
			} else {
				val = pb_string(&e);
			}
		}
	}
	if (rc < 0 || key == NULL)
		goto out;
	json_object_set_new(obj, json_string_value(key),
	    val != NULL ? json_incref(val) : json_string(""));
	ret = 0;
out:
	json_decref(key);
	json_decref(val);
	return ret;
}

static json_t *
pb_owner_reference(const struct pb_field *f)
{
	static const char *const names[] = {
		NULL, "kind", NULL, "name", "uid", "apiVersion", "controller",
		"blockOwnerDeletion"
	};
	struct pb b = { f->data, f->data + f->len };
	struct pb_field e;
	json_t *o = json_object();

	while (pb_next(&b, &e) > 0) {
		if (e.num >= ARRAY_SIZE(names) || names[e.num] == NULL)
			continue;
		if (e.wire == 2)
			json_object_set_new(o, names[e.num], pb_string(&e));
		else if (e.wire == 0)
			json_object_set_new(o, names[e.num],
			    json_boolean(e.v != 0));
	}
	return o;
}

static json_t *
pb_object_meta(const struct pb_field *f)
{
	static const char *const strs[] = {
		NULL, "name", "generateName", "namespace", "selfLink", "uid",
		"resourceVersion"
	};
	struct pb b = { f->data, f->data + f->len };
	struct pb_field e;
	json_t *m = json_object(), *sub;
	const char *map;

	while (pb_next(&b, &e) > 0) {
		if (e.num < ARRAY_SIZE(strs) && e.wire == 2) {
			if (e.len > 0)
				json_object_set_new(m, strs[e.num],
				    pb_string(&e));
		} else if (e.num == 7 && e.wire == 0) {
			json_object_set_new(m, "generation",
			    json_integer((json_int_t)e.v));
		} else if ((e.num == 11 || e.num == 12) && e.wire == 2) {
			map = e.num == 11 ? "labels" : "annotations";
			sub = json_object_get(m, map);
			if (sub == NULL) {
				sub = json_object();
				json_object_set_new(m, map, sub);
			}
			pb_map_entry(sub, &e, 0);
		} else if (e.num == 13 && e.wire == 2) {
			sub = json_object_get(m, "ownerReferences");
			if (sub == NULL) {
				sub = json_array();
				json_object_set_new(m, "ownerReferences", sub);
			}
			json_array_append_new(sub, pb_owner_reference(&e));
		} else if (e.num == 14 && e.wire == 2) {
			sub = json_object_get(m, "finalizers");
			if (sub == NULL) {
				sub = json_array();
				json_object_set_new(m, "finalizers", sub);
			}
			json_array_append_new(sub, pb_string(&e));
		}
	}
	return m;
}

static json_t *
pb_secret(const unsigned char *raw, size_t len)
{
	struct pb b = { raw, raw + len };
	struct pb_field f;
	json_t *o = json_pack("{s:s, s:s}", "apiVersion", "v1", "kind",
	    "Secret"), *sub;
	const char *map;
	int rc;

	while ((rc = pb_next(&b, &f)) > 0) {
		if (f.num == 1 && f.wire == 2) {
			json_object_set_new(o, "metadata", pb_object_meta(&f));
		} else if ((f.num == 2 || f.num == 4) && f.wire == 2) {
			map = f.num == 2 ? "data" : "stringData";
			sub = json_object_get(o, map);
			if (sub == NULL) {
				sub = json_object();
				json_object_set_new(o, map, sub);
			}
			if (pb_map_entry(sub, &f, f.num == 2) < 0)
				rc = -1;
		} else if (f.num == 3 && f.wire == 2) {
			if (f.len > 0)
				json_object_set_new(o, "type", pb_string(&f));
		} else if (f.num == 5 && f.wire == 0) {
			json_object_set_new(o, "immutable",
			    json_boolean(f.v != 0));
		}
		if (rc < 0)
			break;
	}
	if (rc < 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* A protobuf body of kind r as JSON; K8S_EUNSUPPORTED for other kinds. */
static int
body_protobuf(struct api_req *q, const struct k8s_resource *r, json_t **out,
    struct k8s_status *st)
{
	struct pb b;
	struct pb_field f, g;
	const unsigned char *raw = NULL;
	size_t raw_len = 0;
	char *av = NULL, *kind = NULL;
	json_t *obj = NULL;
	int rc, ret = -1;

	if (!is_secret(r)) {
		ret = k8s_status_set(st, K8S_EUNSUPPORTED, "the body of the "
		    "request was in an unknown format - accepted media types "
		    "include: application/json", NULL);
		goto out;
	}
	if (q->body.len < 4 || memcmp(q->body.data, "k8s\0", 4) != 0)
		goto bad;
	b.p = (const unsigned char *)q->body.data + 4;
	b.end = (const unsigned char *)q->body.data + q->body.len;
	while ((rc = pb_next(&b, &f)) > 0) {
		if (f.num == 1 && f.wire == 2) {
			struct pb tb = { f.data, f.data + f.len };

			while (pb_next(&tb, &g) > 0) {
				if (g.wire != 2)
					continue;
				if (g.num == 1) {
					free(av);
					av = xstrndup((const char *)g.data,
					    g.len);
				} else if (g.num == 2) {
					free(kind);
					kind = xstrndup((const char *)g.data,
					    g.len);
				}
			}
		} else if (f.num == 2 && f.wire == 2) {
			raw = f.data;
			raw_len = f.len;
		}
	}
	if (rc < 0 || raw == NULL || av == NULL || kind == NULL ||
	    strcmp(av, "v1") != 0 || strcmp(kind, "Secret") != 0)
		goto bad;
	obj = pb_secret(raw, raw_len);
	if (obj == NULL)
		goto bad;
	*out = obj;
	ret = 0;
	goto out;
bad:
	ret = k8s_status_set(st, K8S_EBADREQUEST, "the protobuf body of the "
	    "request is not a v1 Secret", NULL);
out:
	free(av);
	free(kind);
	return ret;
}

/* The body of a create or replace: one object of the path's kind. */
static int
body_object(struct api_req *q, const struct target *t, int update,
    json_t **out, struct k8s_status *st)
{
	json_t *obj = NULL, *meta;
	const char *av, *kind, *ns, *name;
	char *msg = NULL, *m = NULL;
	int ret;

	m = media_type(header(q, "Content-Type"));
	/*
	 * Only a body declared JSON (or protobuf) is read, as the apiserver
	 * does: text/plain, a form type or none at all is what a web page
	 * can POST cross-origin without a CORS preflight, and the loopback
	 * listener has no token.
	 */
	if (strcmp(m, "application/vnd.kubernetes.protobuf") == 0)
		ret = body_protobuf(q, t->r, &obj, st);
	else if (strcmp(m, MT_JSON) == 0)
		ret = body_json(q, &obj, st);
	else
		ret = k8s_status_set(st, K8S_EUNSUPPORTED, "the body of the "
		    "request was in an unknown format - accepted media types "
		    "include: application/json", NULL);
	if (ret < 0)
		goto out;
	if (!json_is_object(obj)) {
		ret = k8s_status_set(st, K8S_EBADREQUEST, "the body of the "
		    "request must be a JSON object", NULL);
		goto out;
	}
	av = json_string_value(json_object_get(obj, "apiVersion"));
	kind = json_string_value(json_object_get(obj, "kind"));
	if (av != NULL && strcmp(av, k8s_api_version(t->r)) != 0)
		msg = xasprintf("the API version in the data (%s) does not "
		    "match the expected API version (%s)", av,
		    k8s_api_version(t->r));
	else if (kind != NULL && strcmp(kind, t->r->kind) != 0)
		msg = xasprintf("the kind in the data (%s) does not match the "
		    "expected kind (%s)", kind, t->r->kind);
	if (msg != NULL) {
		ret = k8s_status_set(st, K8S_EBADREQUEST, msg, NULL);
		goto out;
	}
	ensure_typed(obj, t->r);
	meta = json_object_get(obj, "metadata");
	if (meta == NULL) {
		meta = json_object();
		json_object_set_new(obj, "metadata", meta);
	}
	if (!json_is_object(meta)) {
		ret = k8s_status_set(st, K8S_EBADREQUEST, "metadata must be "
		    "an object", NULL);
		goto out;
	}
	ns = json_string_value(json_object_get(meta, "namespace"));
	if (t->r->namespaced && ns != NULL && ns[0] != '\0' &&
	    t->ns != NULL && strcmp(ns, t->ns) != 0) {
		ret = k8s_status_set(st, K8S_EBADREQUEST, "the namespace of "
		    "the provided object does not match the namespace sent on "
		    "the request", NULL);
		goto out;
	}
	name = json_string_value(json_object_get(meta, "name"));
	if (update && name != NULL && name[0] != '\0' &&
	    strcmp(name, t->name) != 0) {
		msg = xasprintf("the name of the object (%s) does not match "
		    "the name on the URL (%s)", name, t->name);
		ret = k8s_status_set(st, K8S_EBADREQUEST, msg, NULL);
		goto out;
	}
	if (update && (name == NULL || name[0] == '\0'))
		json_object_set_new(meta, "name", json_string(t->name));
	*out = obj;
	obj = NULL;	/* now the caller's */
	ret = 0;
out:
	json_decref(obj);
	free(msg);
	free(m);
	return ret;
}

/* Secrets: stringData is folded into data (base64), as the API does. */
static void
secret_fold(json_t *obj)
{
	json_t *sd = json_object_get(obj, "stringData"), *data, *v;
	const char *k;
	char *b64;

	if (sd == NULL)
		return;
	if (json_is_object(sd) && json_object_size(sd) > 0) {
		data = json_object_get(obj, "data");
		if (!json_is_object(data)) {
			data = json_object();
			json_object_set_new(obj, "data", data);
		}
		json_object_foreach(sd, k, v) {
			if (!json_is_string(v))
				continue;
			b64 = base64_encode((const unsigned char *)
			    json_string_value(v), json_string_length(v), 0, 1);
			json_object_set_new(data, k, json_string(b64));
			free(b64);
		}
	}
	json_object_del(obj, "stringData");
}

static int
check_selectors(struct api_req *q, const struct target *t,
    struct k8s_list_opts *opts, char **fsel, struct k8s_status *st)
{
	const char *ls = query(q, "labelSelector");
	const char *fs = query(q, "fieldSelector");
	struct k8s_selector *sel = NULL;
	char *cause = NULL, *msg;
	int ret = -1;

	memset(opts, 0, sizeof(*opts));
	*fsel = NULL;
	if (ls != NULL && ls[0] != '\0') {
		if (k8s_selector_parse(ls, &sel, &cause) < 0)
			goto bad;
		k8s_selector_free(sel);
		sel = NULL;
		opts->label_selector = ls;
	}
	if (t->name != NULL) {
		*fsel = fs != NULL && fs[0] != '\0' ?
		    xasprintf("metadata.name=%s,%s", t->name, fs) :
		    xasprintf("metadata.name=%s", t->name);
		fs = *fsel;
	}
	if (fs != NULL && fs[0] != '\0') {
		if (k8s_fieldsel_parse(fs, &sel, &cause) < 0)
			goto bad;
		k8s_selector_free(sel);
		sel = NULL;
		opts->field_selector = fs;
	}
	return 0;
bad:
	msg = xstrdup(cause != NULL ? cause : "unable to parse selector");
	ret = k8s_status_set(st, K8S_EBADREQUEST, msg, NULL);
	free(msg);
	free(cause);
	free(*fsel);
	*fsel = NULL;
	return ret;
}

/*
 * A list's resourceVersionMatch, checked as ValidateListOptions does: 1
 * and a 422 Invalid sent when it is not allowed with resourceVersion.
 */
static int
list_match_refused(struct api_req *q, const char *rv, const char *match)
{
	if (match == NULL)
		return 0;
	if (rv == NULL)
		reply_err(q, K8S_EINVALID, 422, "Invalid", "ListOptions.meta."
		    "k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: "
		    "resourceVersionMatch is forbidden unless resourceVersion "
		    "is provided");
	else if (strcmp(match, "Exact") != 0 &&
	    strcmp(match, "NotOlderThan") != 0)
		reply_err(q, K8S_EINVALID, 422, "Invalid", "ListOptions.meta."
		    "k8s.io \"\" is invalid: resourceVersionMatch: Unsupported "
		    "value: \"%s\": supported values: \"Exact\", "
		    "\"NotOlderThan\"", match);
	else if (strcmp(match, "Exact") == 0 && strcmp(rv, "0") == 0)
		reply_err(q, K8S_EINVALID, 422, "Invalid", "ListOptions.meta."
		    "k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: "
		    "resourceVersionMatch \"exact\" is forbidden for "
		    "resourceVersion \"0\"");
	else
		return 0;
	return 1;
}

static void
do_list(struct api_req *q, const struct target *t)
{
	struct k8s_list_opts opts;
	struct k8s_status st;
	json_t *list = NULL;
	char *fsel = NULL;
	const char *rv = query(q, "resourceVersion");
	const char *match = query(q, "resourceVersionMatch");

	memset(&st, 0, sizeof(st));
	if (rv != NULL && rv[0] == '\0')
		rv = NULL;
	if (match != NULL && match[0] == '\0')
		match = NULL;
	if (list_match_refused(q, rv, match))
		goto out;
	if (check_selectors(q, t, &opts, &fsel, &st) < 0 ||
	    k8s_list(q->srv->api, t->r, t->ns, &opts, &list, &st) < 0) {
		reply_st(q, &st);
		goto out;
	}
	/*
	 * the store lists its newest state only: Exact gets that, or 410
	 * for an older version (relist), or the apiserver's 504 for one
	 * it has not reached
	 */
	if (match != NULL && strcmp(match, "Exact") == 0 &&
	    strtoll(rv, NULL, 10) != k8s_resource_version(list)) {
		if (strtoll(rv, NULL, 10) > k8s_resource_version(list))
			reply_err(q, K8S_ETIMEOUT, 504, "Timeout", "Too large "
			    "resource version: %s, current: %lld", rv,
			    (long long)k8s_resource_version(list));
		else
			reply_err(q, K8S_EGONE, 410, "Expired", "The "
			    "resourceVersion for the provided list is too "
			    "old.");
		json_decref(list);
		goto out;
	}
	ensure_typed_list(list, t->r);
	reply_object(q, 200, t->r, list, 0);
out:
	free(fsel);
	k8s_status_release(&st);
}

static void
do_get(struct api_req *q, const struct target *t)
{
	struct k8s_status st;
	json_t *obj = NULL;

	memset(&st, 0, sizeof(st));
	if (k8s_get(q->srv->api, t->r, t->ns, t->name, &obj, &st) < 0) {
		reply_st(q, &st);
	} else {
		ensure_typed(obj, t->r);
		reply_object(q, 200, t->r, obj, 1);
	}
	k8s_status_release(&st);
}

static void
do_create(struct api_req *q, const struct target *t)
{
	struct k8s_status st;
	json_t *obj = NULL, *created = NULL;

	memset(&st, 0, sizeof(st));
	if (t->r->namespaced && t->ns == NULL) {
		reply_method(q);
		goto out;
	}
	if (dry_run_refused(q, NULL))
		goto out;
	if (body_object(q, t, 0, &obj, &st) < 0)
		goto fail;
	if (is_secret(t->r)) {
		secret_fold(obj);
		if (json_string_length(json_object_get(obj, "type")) == 0)
			json_object_set_new(obj, "type", json_string("Opaque"));
	}
	if (check_fields(q, t, obj, &st) < 0 ||
	    k8s_create(q->api, t->r, t->ns, obj, &created, &st) < 0)
		goto fail;
	ensure_typed(created, t->r);
	reply_object(q, 201, t->r, created, 1);
	goto out;
fail:
	reply_st(q, &st);
out:
	json_decref(obj);
	k8s_status_release(&st);
}

static void
do_update(struct api_req *q, const struct target *t)
{
	struct k8s_status st;
	json_t *obj = NULL, *updated = NULL;
	int rc;

	memset(&st, 0, sizeof(st));
	if (dry_run_refused(q, NULL))
		goto out;
	if (body_object(q, t, 1, &obj, &st) < 0)
		goto fail;
	if (is_secret(t->r))
		secret_fold(obj);
	if (check_fields(q, t, obj, &st) < 0)
		goto fail;
	if (t->status)
		rc = k8s_update_status(q->api, t->r, t->ns, t->name, obj,
		    &updated, &st);
	else
		rc = k8s_update(q->api, t->r, t->ns, t->name, obj,
		    &updated, &st);
	if (rc < 0)
		goto fail;
	ensure_typed(updated, t->r);
	reply_object(q, 200, t->r, updated, 1);
	goto out;
fail:
	reply_st(q, &st);
out:
	json_decref(obj);
	k8s_status_release(&st);
}

/*
 * Strategic merge patches of built-in kinds are applied as merge patches:
 * ordering directives are dropped, others refused. Secrets and
 * NetworkPolicies have no list that merges by key, so the result is the
 * same for what kubectl sends them.
 */
static int
strip_directives(json_t *v, struct k8s_status *st)
{
	const char *key;
	json_t *val;
	void *tmp;
	size_t i;
	char *msg;

	if (json_is_array(v)) {
		json_array_foreach(v, i, val)
			if (strip_directives(val, st) < 0)
				return -1;
		return 0;
	}
	if (!json_is_object(v))
		return 0;
	json_object_foreach_safe(v, tmp, key, val) {
		if (key[0] == '$') {
			if (strncmp(key, "$setElementOrder/", 17) == 0 ||
			    strcmp(key, "$retainKeys") == 0) {
				json_object_del(v, key);
				continue;
			}
			msg = xasprintf("strategic merge patch directive '%s' "
			    "is not supported: use a merge patch", key);
			k8s_status_set(st, K8S_EUNSUPPORTED, msg, NULL);
			free(msg);
			return -1;
		}
		if (strip_directives(val, st) < 0)
			return -1;
	}
	return 0;
}

/*
 * Patch by reading the object, patching it here and writing it back with
 * the resourceVersion read, again on a conflict unless the patch itself
 * set the resourceVersion (a precondition of the client's).
 */
static int
patch_locally(struct api_req *q, const struct target *t,
    enum patch_kind kind, const json_t *patch, json_t **out,
    struct k8s_status *st)
{
	struct k8s_api *api = q->api;
	json_t *cur = NULL, *doc = NULL;
	const char *name, *nrv;
	char *rv = NULL, *msg;
	int attempt, rc = -1;

	for (attempt = 0; attempt <= PATCH_RETRIES; attempt++) {
		json_decref(cur);
		json_decref(doc);
		free(rv);
		cur = doc = NULL;
		rv = NULL;
		if (attempt > 0) {
			k8s_status_release(st);
			memset(st, 0, sizeof(*st));
		}
		rc = k8s_get(api, t->r, t->ns, t->name, &cur, st);
		if (rc < 0)
			goto out;
		rv = xstrdup(k8s_meta_str(cur, "resourceVersion") ?
		    k8s_meta_str(cur, "resourceVersion") : "");
		if (kind == PATCH_JSON) {
			doc = json_deep_copy(cur);
			rc = json_patch_apply(&doc, patch, st);
			if (rc < 0)
				goto out;
		} else {
			doc = k8s_merge_patch(cur, patch);
		}
		if (!json_is_object(doc) ||
		    !json_is_object(json_object_get(doc, "metadata"))) {
			rc = k8s_status_set(st, K8S_EINVALID, "the patched "
			    "object is not an object with metadata", NULL);
			goto out;
		}
		name = k8s_meta_str(doc, "name");
		if (name == NULL || strcmp(name, t->name) != 0) {
			msg = xasprintf("metadata.name: Invalid value: \"%s\": "
			    "field is immutable", name ? name : "");
			rc = k8s_status_set(st, K8S_EINVALID, msg, NULL);
			free(msg);
			goto out;
		}
		if (kind == PATCH_JSON) {
			size_t nw = q->nwarnings;

			rc = check_fields(q, t, doc, st);
			if (rc < 0)
				goto out;
			while (attempt > 0 && q->nwarnings > nw)
				free(q->warnings[--q->nwarnings]);
		}
		if (is_secret(t->r))
			secret_fold(doc);
		if (t->status)
			rc = k8s_update_status(api, t->r, t->ns, t->name, doc,
			    out, st);
		else
			rc = k8s_update(api, t->r, t->ns, t->name, doc, out,
			    st);
		if (rc != K8S_ECONFLICT)
			goto out;
		nrv = k8s_meta_str(doc, "resourceVersion");
		if (nrv == NULL || strcmp(nrv, rv) != 0)
			goto out;
	}
out:
	json_decref(cur);
	json_decref(doc);
	free(rv);
	return rc;
}

static void
do_patch(struct api_req *q, const struct target *t)
{
	struct k8s_status st;
	json_t *patch = NULL, *patched = NULL;
	char *m = media_type(header(q, "Content-Type"));
	enum patch_kind kind;
	int rc;

	memset(&st, 0, sizeof(st));
	if (strcmp(m, MT_MERGE) == 0) {
		kind = PATCH_MERGE;
	} else if (strcmp(m, MT_JSONPATCH) == 0) {
		kind = PATCH_JSON;
	} else if (strcmp(m, MT_STRATEGIC) == 0 &&
	    k8s_resource_builtin(t->r)) {
		kind = PATCH_STRATEGIC;
	} else if (strcmp(m, MT_APPLY) == 0 ||
	    strcmp(m, "application/apply-patch+cbor") == 0) {
		reply_err(q, K8S_EUNSUPPORTED, 415, "UnsupportedMediaType",
		    "server-side apply is not supported by this server: use "
		    "client-side apply (kubectl apply without --server-side)");
		goto out;
	} else {
		reply_err(q, K8S_EUNSUPPORTED, 415, "UnsupportedMediaType",
		    "the body of the request was in an unknown format - "
		    "accepted media types include: %s%s, %s, %s",
		    k8s_resource_builtin(t->r) ? MT_STRATEGIC ", " : "",
		    MT_JSONPATCH, MT_MERGE, MT_APPLY);
		goto out;
	}
	if (dry_run_refused(q, NULL))
		goto out;
	if (body_json(q, &patch, &st) < 0)
		goto fail;
	if (kind != PATCH_JSON && !json_is_object(patch)) {
		k8s_status_set(&st, K8S_EBADREQUEST, "a merge patch must be a "
		    "JSON object", NULL);
		goto fail;
	}
	if (kind == PATCH_STRATEGIC && strip_directives(patch, &st) < 0) {
		reply_err(q, K8S_EUNSUPPORTED, 415, "UnsupportedMediaType",
		    "%s", st.message ? st.message : "unsupported directive");
		goto out;
	}
	if (kind != PATCH_JSON && check_fields(q, t, patch, &st) < 0)
		goto fail;
	if (kind == PATCH_JSON || (is_secret(t->r) &&
	    json_object_get(patch, "stringData") != NULL))
		rc = patch_locally(q, t, kind, patch, &patched, &st);
	else
		rc = k8s_patch(q->api, t->r, t->ns, t->name, t->status,
		    patch, &patched, &st);
	if (rc < 0)
		goto fail;
	ensure_typed(patched, t->r);
	reply_object(q, 200, t->r, patched, 1);
	goto out;
fail:
	reply_st(q, &st);
out:
	free(m);
	json_decref(patch);
	k8s_status_release(&st);
}

/* A 422 about DeleteOptions.propagationPolicy, as the apiserver words it. */
static int
policy_invalid(struct k8s_status *st, const char *reason, const char *msg)
{
	char *full = xasprintf("DeleteOptions.meta.k8s.io \"\" is invalid: "
	    "propagationPolicy: %s", msg);
	int rc = k8s_status_set(st, K8S_EINVALID, full, json_pack("{s:s, s:s, "
	    "s:[{s:s, s:s, s:s}]}", "group", "meta.k8s.io", "kind",
	    "DeleteOptions", "causes", "reason", reason, "message", msg,
	    "field", "propagationPolicy"));

	free(full);
	return rc;
}

/*
 * The propagation policy of a DELETE, from DeleteOptions: the body's when
 * there is one (opts), else the query's, as the apiserver decodes them;
 * propagationPolicy, or the older orphanDependents (true: Orphan). 422 for
 * an unknown policy or both set, 400 for a value of the wrong type.
 */
static int
delete_policy(struct api_req *q, const json_t *opts,
    enum k8s_propagation *out, struct k8s_status *st)
{
	const json_t *pj = json_object_get(opts, "propagationPolicy");
	const json_t *oj = json_object_get(opts, "orphanDependents");
	const char *pol = json_string_value(pj), *orphan = NULL;
	char *msg;
	int rc;

	*out = K8S_PROPAGATE_DEFAULT;
	if ((pj != NULL && !json_is_null(pj) && pol == NULL) ||
	    (oj != NULL && !json_is_null(oj) && !json_is_boolean(oj)))
		return k8s_status_set(st, K8S_EBADREQUEST, "DeleteOptions: "
		    "propagationPolicy must be a string and orphanDependents "
		    "a boolean", NULL);
	if (opts == NULL) {
		pol = query(q, "propagationPolicy");
		orphan = query(q, "orphanDependents");
		if (orphan != NULL && strcmp(orphan, "true") != 0 &&
		    strcmp(orphan, "false") != 0)
			return k8s_status_set(st, K8S_EBADREQUEST, "invalid "
			    "orphanDependents: want true or false", NULL);
	} else if (json_is_boolean(oj)) {
		orphan = json_is_true(oj) ? "true" : "false";
	}
	if (pol == NULL || *pol == '\0') {
		if (orphan != NULL && strcmp(orphan, "true") == 0)
			*out = K8S_PROPAGATE_ORPHAN;
		return 0;
	}
	if (k8s_propagation_parse(pol, out) < 0) {
		msg = xasprintf("Unsupported value: \"%s\": supported values: "
		    "\"Foreground\", \"Background\", \"Orphan\", \"nil\"", pol);
		rc = policy_invalid(st, "FieldValueNotSupported", msg);
		free(msg);
		return rc;
	}
	if (orphan != NULL) {
		msg = xasprintf("Invalid value: \"%s\": orphanDependents and "
		    "deletionPropagation cannot be both set", pol);
		rc = policy_invalid(st, "FieldValueInvalid", msg);
		free(msg);
		return rc;
	}
	return 0;
}

/*
 * The DeleteOptions of a DELETE: *opts gets the body's (NULL without a
 * JSON body: other encodings carry nothing we use) and *policy the
 * propagation policy (delete_policy).
 */
static int
delete_options(struct api_req *q, json_t **opts, enum k8s_propagation *policy,
    struct k8s_status *st)
{
	char *m = media_type(header(q, "Content-Type"));
	int rc = 0;

	*opts = NULL;
	if (q->body.len > 0 && (m[0] == '\0' || strstr(m, "json") != NULL))
		rc = body_json(q, opts, st);
	free(m);
	if (rc < 0)
		return rc;
	return delete_policy(q, *opts, policy, st);
}

static void
do_delete(struct api_req *q, const struct target *t)
{
	struct k8s_status st;
	json_t *opts = NULL, *gone = NULL;
	const json_t *pre;
	enum k8s_propagation policy;

	memset(&st, 0, sizeof(st));
	if (delete_options(q, &opts, &policy, &st) < 0)
		goto fail;
	if (dry_run_refused(q, opts))
		goto out;
	pre = json_object_get(opts, "preconditions");
	if (k8s_delete_if(q->api, t->r, t->ns, t->name, policy,
	    json_string_value(json_object_get(pre, "uid")), json_string_value(
	    json_object_get(pre, "resourceVersion")), &gone, &st) < 0)
		goto fail;
	if (gone != NULL) {
		ensure_typed(gone, t->r);
		reply_object(q, 200, t->r, gone, 1);
	} else {
		reply_json(q, 200, json_pack("{s:s, s:s, s:{}, s:s, s:{s:s, "
		    "s:s, s:s}}", "kind", "Status", "apiVersion", "v1",
		    "metadata", "status", "Success", "details", "name",
		    t->name, "group", t->r->group, "kind", t->r->plural));
	}
	goto out;
fail:
	reply_st(q, &st);
out:
	json_decref(opts);
	k8s_status_release(&st);
}

static void
do_delete_collection(struct api_req *q, const struct target *t)
{
	struct k8s_list_opts opts;
	struct k8s_status st;
	json_t *list = NULL, *it, *gone, *dopts = NULL;
	enum k8s_propagation policy;
	char *fsel = NULL;
	size_t i;

	memset(&st, 0, sizeof(st));
	if (t->r->namespaced && t->ns == NULL) {
		reply_method(q);
		goto out;
	}
	if (check_selectors(q, t, &opts, &fsel, &st) < 0 ||
	    delete_options(q, &dopts, &policy, &st) < 0)
		goto fail;
	if (dry_run_refused(q, dopts))
		goto out;
	if (k8s_list(q->srv->api, t->r, t->ns, &opts, &list, &st) < 0)
		goto fail;
	ensure_typed_list(list, t->r);
	json_array_foreach(json_object_get(list, "items"), i, it) {
		const char *name = k8s_meta_str(it, "name");

		gone = NULL;
		if (name == NULL)
			continue;
		if (k8s_delete_policy(q->api, t->r, t->ns, name, policy,
		    &gone, &st) < 0 && st.err != K8S_ENOTFOUND)
			goto fail;
		k8s_status_release(&st);
		memset(&st, 0, sizeof(st));
		if (gone != NULL) {
			ensure_typed(gone, t->r);
			json_array_set_new(json_object_get(list, "items"), i,
			    gone);
		}
	}
	reply_object(q, 200, t->r, list, 0);
	list = NULL;	/* now the reply's */
	goto out;
fail:
	reply_st(q, &st);
out:
	json_decref(dopts);
	json_decref(list);
	free(fsel);
	k8s_status_release(&st);
}

/* -------------------------------------------------------------- watch */

static int
peer_gone(int fd)
{
	struct pollfd p;
	char c;
	ssize_t n;

	if (fd < 0)
		return 0;
	p.fd = fd;
	p.events = POLLIN;
	p.revents = 0;
	if (poll(&p, 1, 0) <= 0)
		return 0;
	if (p.revents & (POLLHUP | POLLERR | POLLNVAL))
		return 1;
	if (p.revents & POLLIN) {
		n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
		if (n == 0)
			return 1;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
		    errno != EINTR)
			return 1;
	}
	return 0;
}

/*
 * Queue one event line; obj is borrowed. Its object is in the negotiated
 * form, as the apiserver's watchEmbeddedEncoder has it: a Status (ERROR)
 * as it is; PartialObjectMetadata for every other event, BOOKMARKs too
 * (client-go's metadata client decodes nothing else); a Table row, but
 * not for a BOOKMARK; and, since an object is not a list, the object
 * itself for PartialObjectMetadataList (the apiserver logs the failed
 * conversion and sends the object).
 */
static void
stream_event(struct watch_stream *ws, const char *type, json_t *obj)
{
	json_t *ev, *o, *items;
	char *text;

	if (strcmp(type, "ERROR") == 0) {
		o = json_incref(obj);
	} else if (ws->form.kind == OUT_PARTIAL) {
		o = partial_object(obj, &ws->form);
	} else if (ws->form.kind == OUT_TABLE &&
	    strcmp(type, "BOOKMARK") != 0) {
		items = json_pack("[O]", obj);
		o = table_json(ws->r, &ws->form, ws->include, items,
		    k8s_meta_str(obj, "resourceVersion"));
		json_decref(items);
	} else {
		o = json_incref(obj);
	}
	ev = json_pack("{s:s, s:o}", "type", type, "object", o);
	text = json_dumps(ev, JSON_COMPACT);
	if (text == NULL || buf_add(&ws->out, text, strlen(text)) < 0 ||
	    buf_add(&ws->out, "\n", 1) < 0)
		ws->done = 1;
	free(text);
	json_decref(ev);
	ws->last_send_ms = now_mono_ms();
}

/*
 * A BOOKMARK at ws->rv; initial_end: the one that ends the initial events
 * of a watch with sendInitialEvents=true (annotated as the apiserver does).
 */
static void
stream_bookmark(struct watch_stream *ws, int initial_end)
{
	char rv[32];
	json_t *o;

	snprintf(rv, sizeof(rv), "%lld", (long long)ws->rv);
	o = json_pack("{s:s, s:s, s:{s:s}}", "kind", ws->r->kind,
	    "apiVersion", k8s_api_version(ws->r), "metadata",
	    "resourceVersion", rv);
	if (initial_end)
		json_object_set_new(json_object_get(o, "metadata"),
		    "annotations", json_pack("{s:s}",
		    "k8s.io/initial-events-end", "true"));
	stream_event(ws, "BOOKMARK", o);
	json_decref(o);
}

/* Wait a slice for the next event and queue what it gives. */
static void
watch_step(struct watch_stream *ws)
{
	struct k8s_event ev;
	struct k8s_status st;
	int64_t now = now_mono_ms(), left, rv;
	json_t *sj;
	int rc;

	if (stopping(ws->srv) || now >= ws->deadline_ms ||
	    peer_gone(ws->fd)) {
		ws->done = 1;
		return;
	}
	left = ws->deadline_ms - now;
	memset(&ev, 0, sizeof(ev));
	memset(&st, 0, sizeof(st));
	rc = k8s_watch_next(ws->w, left < WATCH_SLICE_MS ? (int)left :
	    WATCH_SLICE_MS, &ev, &st);
	if (rc > 0) {
		rv = ev.rv > 0 ? ev.rv : k8s_resource_version(ev.object);
		if (ev.type == K8S_ERROR) {
			stream_event(ws, "ERROR", ev.object);
			ws->done = 1;
		} else if (ev.type != K8S_BOOKMARK && ev.object != NULL) {
			ensure_typed(ev.object, ws->r);
			stream_event(ws, k8s_event_type_name(ev.type),
			    ev.object);
		}
		/* a store's BOOKMARK (how far it went) waits for the timer */
		if (rv > ws->rv)
			ws->rv = rv;
		json_decref(ev.object);
	}
	if (rc >= 0 && !ws->done) {
		if (ws->bookmarks && ws->rv > 0 &&
		    now_mono_ms() - ws->last_send_ms >= WATCH_BOOKMARK_MS)
			stream_bookmark(ws, 0);
	} else if (rc < 0) {
		sj = k8s_status_json(&st);
		stream_event(ws, "ERROR", sj);
		json_decref(sj);
		ws->done = 1;
	}
	k8s_status_release(&st);
}

static ssize_t
watch_read(void *cls, uint64_t pos, char *out, size_t max)
{
	struct watch_stream *ws = cls;
	size_t n;

	(void)pos;
	for (;;) {
		if (ws->off < ws->out.len) {
			n = ws->out.len - ws->off;
			if (n > max)
				n = max;
			memcpy(out, ws->out.data + ws->off, n);
			ws->off += n;
			if (ws->off == ws->out.len) {
				buf_reset(&ws->out);
				ws->off = 0;
			}
			return (ssize_t)n;
		}
		if (ws->done)
			return MHD_CONTENT_READER_END_OF_STREAM;
		watch_step(ws);
	}
}

static void
watch_free(void *cls)
{
	struct watch_stream *ws = cls;

	if (ws == NULL)
		return;
	if (ws->w != NULL)
		k8s_watch_free(ws->w);
	buf_release(&ws->out);
	free(ws);
}

/*
 * The apiserver's checks of a watch's sendInitialEvents (the streaming
 * list of client-go's WatchListClient) and resourceVersionMatch: 1 and a
 * 422 Invalid sent when they do not go together.
 */
static int
watch_list_refused(struct api_req *q)
{
	const char *sie = query(q, "sendInitialEvents");
	const char *match = query(q, "resourceVersionMatch");
	const char *field = "resourceVersionMatch", *why = NULL;

	if (sie != NULL && sie[0] == '\0')
		sie = NULL;
	if (match != NULL && match[0] == '\0')
		match = NULL;
	if (sie != NULL && (match == NULL ||
	    strcmp(match, "NotOlderThan") != 0))
		why = "sendInitialEvents requires setting "
		    "resourceVersionMatch to NotOlderThan";
	else if (sie != NULL && !query_bool(q, "allowWatchBookmarks")) {
		field = "allowWatchBookmarks";
		why = "sendInitialEvents requires setting allowWatchBookmarks "
		    "to true";
	} else if (sie == NULL && match != NULL)
		why = "resourceVersionMatch is forbidden for watch unless "
		    "sendInitialEvents is provided";
	if (why == NULL)
		return 0;
	reply_err(q, K8S_EINVALID, 422, "Invalid", "ListOptions.meta.k8s.io "
	    "\"\" is invalid: %s: Forbidden: %s", field, why);
	return 1;
}

static void
do_watch(struct api_req *q, const struct target *t)
{
	const union MHD_ConnectionInfo *ci;
	struct k8s_list_opts opts;
	struct k8s_status st;
	struct watch_stream *ws;
	struct k8s_watch *w = NULL;
	const char *v;
	char *fsel = NULL, *end;
	long long secs = 0, rv;
	unsigned int jitter = 0;
	json_t *sj, *initial = NULL;
	char list_rv[32];
	int rc;

	memset(&st, 0, sizeof(st));
	if (check_selectors(q, t, &opts, &fsel, &st) < 0) {
		reply_st(q, &st);
		goto out;
	}
	v = query(q, "resourceVersion");
	opts.resource_version = v != NULL && v[0] != '\0' ? v : NULL;
	if (watch_list_refused(q))
		goto out;
	v = query(q, "sendInitialEvents");
	if (v != NULL && v[0] != '\0' && (query_bool(q, "sendInitialEvents") ||
	    opts.resource_version == NULL)) {
		/*
		 * the state as a list, then the watch from its version: with
		 * true, the list goes out first as ADDED events; with false
		 * and no resourceVersion, the watch starts at the newest
		 */
		if (k8s_list(q->srv->api, t->r, t->ns, &opts, &initial,
		    &st) < 0) {
			reply_st(q, &st);
			goto out;
		}
		snprintf(list_rv, sizeof(list_rv), "%s", k8s_meta_str(initial,
		    "resourceVersion") != NULL ? k8s_meta_str(initial,
		    "resourceVersion") : "");
		opts.resource_version = list_rv[0] != '\0' ? list_rv : NULL;
		if (!query_bool(q, "sendInitialEvents")) {
			json_decref(initial);
			initial = NULL;
		}
	}
	v = query(q, "timeoutSeconds");
	if (v != NULL && v[0] != '\0') {
		errno = 0;
		secs = strtoll(v, &end, 10);
		if (errno != 0 || *end != '\0' || secs < 0) {
			reply_err(q, K8S_EBADREQUEST, 400, "BadRequest",
			    "timeoutSeconds: invalid value '%s'", v);
			goto out;
		}
	}
	rc = k8s_watch(q->srv->api, t->r, t->ns, &opts, &w, &st);
	if (rc < 0 && rc != K8S_EGONE) {
		reply_st(q, &st);
		goto out;
	}
	ws = xcalloc(1, sizeof(*ws));
	ws->srv = q->srv;
	ws->w = rc < 0 ? NULL : w;
	ws->r = t->r;
	ws->form = q->form;
	ws->include = include_mode(q);
	ws->bookmarks = query_bool(q, "allowWatchBookmarks");
	ws->last_send_ms = now_mono_ms();
	buf_init(&ws->out, API_MAX_PENDING);
	ci = MHD_get_connection_info(q->conn,
	    MHD_CONNECTION_INFO_CONNECTION_FD);
	ws->fd = ci != NULL ? (int)ci->connect_fd : -1;
	if (secs == 0) {
		/* like the apiserver: spread reconnects over time */
		if (random_bytes(&jitter, sizeof(jitter)) < 0)
			jitter = 0;
		secs = WATCH_DEFAULT_S + jitter % (WATCH_DEFAULT_S / 10);
	}
	if (secs > WATCH_MAX_S)
		secs = WATCH_MAX_S;
	ws->deadline_ms = now_mono_ms() + secs * 1000;
	if (opts.resource_version != NULL) {
		rv = strtoll(opts.resource_version, &end, 10);
		if (*end == '\0' && rv > 0)
			ws->rv = rv;
	}
	if (rc == K8S_EGONE) {
		/* the apiserver's way: 200, one ERROR event, the end */
		sj = k8s_status_json(&st);
		stream_event(ws, "ERROR", sj);
		json_decref(sj);
		ws->done = 1;
	} else if (initial != NULL) {
		json_t *it;
		size_t i;

		json_array_foreach(json_object_get(initial, "items"), i, it) {
			ensure_typed(it, t->r);
			stream_event(ws, "ADDED", it);
		}
		stream_bookmark(ws, 1);
	}
	q->stream = ws;
	q->code = 200;
	q->ctype = ws->form.kind == OUT_TABLE ? table_ctype(&ws->form) :
	    MT_JSON;
	/* a quiet watch is not an idle connection */
	MHD_set_connection_option(q->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
out:
	json_decref(initial);
	free(fsel);
	k8s_status_release(&st);
}

/* --------------------------------------------------------- namespaces */

static json_t *
namespace_stub(const char *name)
{
	return json_pack("{s:s, s:s, s:{s:s}, s:{s:[s]}, s:{s:s}}",
	    "apiVersion", "v1", "kind", "Namespace", "metadata", "name", name,
	    "spec", "finalizers", "kubernetes", "status", "phase", "Active");
}

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Every namespace that holds an object, and default. */
static void
do_namespace_list(struct api_req *q)
{
	const struct k8s_resource *const *rp;
	struct k8s_list_opts opts;
	struct k8s_status st;
	json_t *set = json_object(), *list = NULL, *items, *it, *v;
	const char **names = NULL, *key;
	size_t i, n = 0;

	memset(&opts, 0, sizeof(opts));
	memset(&st, 0, sizeof(st));
	json_object_set_new(set, "default", json_true());
	for (rp = k8s_resources; *rp != NULL; rp++) {
		if (!(*rp)->namespaced)
			continue;
		if (k8s_list(q->srv->api, *rp, NULL, &opts, &list, &st) < 0) {
			reply_st(q, &st);
			goto out;
		}
		json_array_foreach(json_object_get(list, "items"), i, it) {
			const char *ns = k8s_meta_str(it, "namespace");

			if (ns != NULL)
				json_object_set_new(set, ns, json_true());
		}
		json_decref(list);
		list = NULL;
	}
	names = xcalloc(json_object_size(set), sizeof(*names));
	json_object_foreach(set, key, v)
		names[n++] = key;
	qsort(names, n, sizeof(*names), cmp_str);
	items = json_array();
	for (i = 0; i < n; i++)
		json_array_append_new(items, namespace_stub(names[i]));
	reply_object(q, 200, &namespace_resource, json_pack("{s:s, s:s, "
	    "s:{s:s}, s:o}", "kind", "NamespaceList", "apiVersion", "v1",
	    "metadata", "resourceVersion", "", "items", items), 0);
out:
	free(names);
	json_decref(list);
	json_decref(set);
	k8s_status_release(&st);
}

static void
do_namespace(struct api_req *q, const char *name)
{
	if (strcmp(q->method, "GET") != 0) {
		reply_method(q);
		return;
	}
	if (!acceptable(q))
		return;
	if (!dns_label(name)) {
		reply_err(q, K8S_ENOTFOUND, 404, "NotFound",
		    "namespaces \"%s\" not found", name);
		return;
	}
	reply_object(q, 200, &namespace_resource, namespace_stub(name), 1);
}

/* ------------------------------------------------------------ routing */

static void
route_objects(struct api_req *q, const char *group, const char *version,
    char **seg, size_t n)
{
	void (*verb)(struct api_req *, const struct target *) = NULL;
	struct target t;
	const char *m = q->method;
	size_t i = 0;

	memset(&t, 0, sizeof(t));
	if (group[0] == '\0' && n == 1 && strcmp(seg[0], "namespaces") == 0) {
		if (strcmp(m, "GET") != 0)
			reply_method(q);
		else if (acceptable(q))
			do_namespace_list(q);
		return;
	}
	if (group[0] == '\0' && n == 2 && strcmp(seg[0], "namespaces") == 0) {
		do_namespace(q, seg[1]);
		return;
	}
	if (n >= 3 && strcmp(seg[0], "namespaces") == 0) {
		t.ns = seg[1];
		i = 2;
	}
	if (n - i < 1 || n - i > 3) {
		reply_notfound(q);
		return;
	}
	t.r = k8s_resource_find(group, version, seg[i]);
	if (t.r == NULL || (t.ns != NULL && !t.r->namespaced) ||
	    (t.ns == NULL && t.r->namespaced && n - i > 1)) {
		reply_notfound(q);
		return;
	}
	if (n - i >= 2)
		t.name = seg[i + 1];
	if (n - i == 3) {
		if (strcmp(seg[i + 2], "status") != 0 || !t.r->has_status) {
			reply_notfound(q);
			return;
		}
		t.status = 1;
	}
	if (t.ns != NULL && !dns_label(t.ns)) {
		reply_err(q, K8S_ENOTFOUND, 404, "NotFound",
		    "namespaces \"%s\" not found", t.ns);
		return;
	}
	if (t.name == NULL) {
		if (strcmp(m, "GET") == 0 && query_bool(q, "watch"))
			verb = do_watch;
		else if (strcmp(m, "GET") == 0)
			verb = do_list;
		else if (strcmp(m, "POST") == 0)
			verb = do_create;
		else if (strcmp(m, "DELETE") == 0)
			verb = do_delete_collection;
	} else if (strcmp(m, "GET") == 0) {
		verb = !t.status && query_bool(q, "watch") ? do_watch : do_get;
	} else if (strcmp(m, "PUT") == 0) {
		verb = do_update;
	} else if (strcmp(m, "PATCH") == 0) {
		verb = do_patch;
	} else if (strcmp(m, "DELETE") == 0 && !t.status) {
		verb = do_delete;
	}
	/* the apiserver negotiates before it reads or writes anything */
	if (verb == NULL)
		reply_method(q);
	else if (acceptable(q))
		verb(q, &t);
}

static json_t *
root_paths(void)
{
	const struct k8s_resource *const *rp;
	json_t *paths = json_array(), *seen = json_object();
	char *p;

	json_array_append_new(paths, json_string("/api"));
	json_array_append_new(paths, json_string("/api/v1"));
	json_array_append_new(paths, json_string("/apis"));
	for (rp = k8s_resources; *rp != NULL; rp++) {
		if ((*rp)->group[0] == '\0')
			continue;
		p = xasprintf("/apis/%s", (*rp)->group);
		if (json_object_get(seen, p) == NULL)
			json_array_append_new(paths, json_string(p));
		json_object_set_new(seen, p, json_true());
		free(p);
		p = xasprintf("/apis/%s/%s", (*rp)->group, (*rp)->version);
		if (json_object_get(seen, p) == NULL)
			json_array_append_new(paths, json_string(p));
		json_object_set_new(seen, p, json_true());
		free(p);
	}
	json_array_append_new(paths, json_string("/healthz"));
	json_array_append_new(paths, json_string("/openapi/v3"));
	json_array_append_new(paths, json_string("/version"));
	json_decref(seen);
	return json_pack("{s:o}", "paths", paths);
}

/* Read-only documents: discovery, OpenAPI, version, health. */
static int
route_docs(struct api_req *q, char **seg, size_t n)
{
	json_t *j = NULL;

	if (n == 1 && (strcmp(seg[0], "healthz") == 0 ||
	    strcmp(seg[0], "livez") == 0 || strcmp(seg[0], "readyz") == 0)) {
		q->code = 200;
		q->text = "ok";
		q->ctype = "text/plain; charset=utf-8";
	} else if (n == 0) {
		j = root_paths();
	} else if (n == 1 && strcmp(seg[0], "version") == 0) {
		j = version_info();
	} else if (n == 1 && strcmp(seg[0], "api") == 0) {
		j = json_pack("{s:s, s:[s]}", "kind", "APIVersions",
		    "versions", "v1");
	} else if (n == 2 && strcmp(seg[0], "api") == 0 &&
	    strcmp(seg[1], "v1") == 0) {
		j = resource_list("", "v1");
	} else if (n == 1 && strcmp(seg[0], "apis") == 0) {
		j = api_group_list();
	} else if (n == 2 && strcmp(seg[0], "apis") == 0) {
		j = api_group(seg[1]);
		if (j != NULL) {
			json_object_set_new(j, "kind", json_string("APIGroup"));
			json_object_set_new(j, "apiVersion", json_string("v1"));
		}
	} else if (n == 3 && strcmp(seg[0], "apis") == 0) {
		j = resource_list(seg[1], seg[2]);
	} else if (n >= 1 && strcmp(seg[0], "openapi") == 0) {
		if (n == 2 && strcmp(seg[1], "v3") == 0)
			j = openapi_index(q->srv);
		else if (n == 4 && strcmp(seg[1], "v3") == 0 &&
		    strcmp(seg[2], "api") == 0 && strcmp(seg[3], "v1") == 0)
			j = openapi_doc(q->srv, "", "v1");
		else if (n == 5 && strcmp(seg[1], "v3") == 0 &&
		    strcmp(seg[2], "apis") == 0)
			j = openapi_doc(q->srv, seg[3], seg[4]);
	} else {
		return 0;
	}
	if (strcmp(q->method, "GET") != 0) {
		json_decref(j);
		q->text = NULL;
		reply_method(q);
	} else if (j != NULL) {
		reply_json(q, 200, j);
	} else if (q->text == NULL) {
		reply_notfound(q);
	}
	return 1;
}

static void
handle(struct api_req *q)
{
	char *segs[API_MAX_SEGS + 1], *path, *save = NULL, *tok;
	size_t n = 0;

	q->pretty = query_bool(q, "pretty");
	path = xstrdup(q->url);
	for (tok = strtok_r(path, "/", &save); tok != NULL;
	    tok = strtok_r(NULL, "/", &save)) {
		if (n == API_MAX_SEGS) {
			reply_notfound(q);
			goto out;
		}
		segs[n++] = tok;
	}
	if (route_docs(q, segs, n))
		goto out;
	if (n >= 3 && strcmp(segs[0], "api") == 0 &&
	    strcmp(segs[1], "v1") == 0)
		route_objects(q, "", "v1", segs + 2, n - 2);
	else if (n >= 4 && strcmp(segs[0], "apis") == 0)
		route_objects(q, segs[1], segs[2], segs + 3, n - 3);
	else
		reply_notfound(q);
out:
	free(path);
}

/* ----------------------------------------------------------------- MHD */

static int
authorized(const struct k8s_apiserver *s, struct MHD_Connection *conn)
{
	unsigned char mac[32];
	const char *h, *tok;
	int ok;

	if (!s->has_token)
		return 1;
	h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    MHD_HTTP_HEADER_AUTHORIZATION);
	if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0)
		return 0;
	for (tok = h + 7; *tok == ' '; tok++)
		;
	if (*tok == '\0')
		return 0;
	/* equal-length digests: the comparison leaks nothing */
	hmac_sha256(s->mac_key, sizeof(s->mac_key), tok, strlen(tok), mac);
	pthread_mutex_lock((pthread_mutex_t *)&s->token_lock);
	ok = ct_equal(mac, s->token_mac, sizeof(mac));
	pthread_mutex_unlock((pthread_mutex_t *)&s->token_lock);
	secure_wipe(mac, sizeof(mac));
	return ok;
}

/*
 * Whether a request with this Host may be served without a token:
 * localhost or a loopback address, with a port or none, as kubectl
 * proxy's default --accept-hosts. A web page on a name of its own that
 * it then resolves to 127.0.0.1 (DNS rebinding) is same-origin with
 * the listener, reads its replies and writes with any Content-Type; its
 * requests carry that name. No Host (HTTP/1.0) is no browser's.
 */
static int
host_allowed(const char *h)
{
	struct sockaddr_storage ss;
	const char *e, *p;
	char name[64];
	int v6 = h != NULL && h[0] == '[';
	size_t n;

	if (h == NULL)
		return 1;
	if (v6) {
		h++;
		if ((e = strchr(h, ']')) == NULL)
			return 0;
		p = e + 1;
	} else {
		e = h + strcspn(h, ":");
		p = e;
	}
	if (*p == ':')
		p++;
	else if (*p != '\0')
		return 0;
	if (strspn(p, "0123456789") != strlen(p) || strlen(p) > 5)
		return 0;
	n = (size_t)(e - h);
	if (n == 0 || n >= sizeof(name))
		return 0;
	memcpy(name, h, n);
	name[n] = '\0';
	if (!v6 && strcasecmp(name, "localhost") == 0)
		return 1;
	memset(&ss, 0, sizeof(ss));
	ss.ss_family = v6 ? AF_INET6 : AF_INET;
	if (inet_pton(ss.ss_family, name, v6 ?
	    (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr :
	    (void *)&((struct sockaddr_in *)&ss)->sin_addr) != 1)
		return 0;
	return is_loopback(&ss);
}

/*
 * Replace the bearer token (SIGHUP): requests from then on must carry the
 * new one. Only a server started with a token has one to replace.
 */
int
k8s_apiserver_set_token(struct k8s_apiserver *s, const char *token,
    char **cause)
{
	unsigned char mac[32];

	if (s == NULL)
		return 0;
	if (!s->has_token || token == NULL || *token == '\0') {
		*cause = xstrdup("api.token: adding or removing the token "
		    "needs a restart");
		return -1;
	}
	hmac_sha256(s->mac_key, sizeof(s->mac_key), token, strlen(token),
	    mac);
	pthread_mutex_lock(&s->token_lock);
	memcpy(s->token_mac, mac, sizeof(mac));
	pthread_mutex_unlock(&s->token_lock);
	secure_wipe(mac, sizeof(mac));
	return 0;
}

static MHD_RESULT
send_reply(struct api_req *q)
{
	struct MHD_Response *resp;
	MHD_RESULT ret;
	char *text = NULL, code[16];
	size_t i;

	if (q->stream != NULL) {
		resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN,
		    16 * 1024, watch_read, q->stream, watch_free);
		if (resp == NULL)
			return MHD_NO;
		q->stream = NULL;	/* now owned by the response */
	} else if (q->text != NULL) {
		resp = MHD_create_response_from_buffer(strlen(q->text),
		    (void *)(uintptr_t)q->text, MHD_RESPMEM_PERSISTENT);
	} else {
		if (q->reply == NULL)
			reply_err(q, K8S_EINTERNAL, 500, "InternalError",
			    "no reply");
		text = json_dumps(q->reply, q->pretty ? JSON_INDENT(2) :
		    JSON_COMPACT);
		if (text == NULL)
			return MHD_NO;
		resp = MHD_create_response_from_buffer(strlen(text), text,
		    MHD_RESPMEM_MUST_COPY);
	}
	if (resp == NULL) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
	    q->ctype != NULL ? q->ctype : MT_JSON);
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
	    "no-cache, private");
	for (i = 0; i < q->nwarnings; i++)
		MHD_add_response_header(resp, "Warning", q->warnings[i]);
	if (q->code == 0)
		q->code = 500;
	ret = MHD_queue_response(q->conn, (unsigned int)q->code, resp);
	MHD_destroy_response(resp);
	q->queued = 1;
	if (log_enabled(LOG_DEBUG)) {
		snprintf(code, sizeof(code), "%d", q->code);
		log_kv(LOG_DEBUG, "api request", "method", q->method, "path",
		    q->url, "code", code, NULL);
	}
	free(text);
	return ret;
}

static MHD_RESULT
access_cb(void *cls, struct MHD_Connection *conn, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **con_cls)
{
	struct k8s_apiserver *s = cls;
	struct api_req *q = *con_cls;
	const char *cl, *why, *host;

	if (q == NULL || q == HTTP_NUL_MARK) {
		int nul = q != NULL, framing;

		q = xcalloc(1, sizeof(*q));
		q->srv = s;
		q->api = s->api;
		q->conn = conn;
		q->method = method;
		q->url = xstrdup(url);
		buf_init(&q->body, API_MAX_BODY);
		*con_cls = q;
		if (!authorized(s, conn)) {
			reply_err(q, K8S_EUNAUTHORIZED, 401, "Unauthorized",
			    "Unauthorized");
			return send_reply(q);
		}
		if (nul) {
			/* no name or selector holds one */
			reply_err(q, K8S_EBADREQUEST, 400, "BadRequest",
			    "the request target holds a NUL byte (%%00)");
			return send_reply(q);
		}
		if ((why = http_request_error(conn, version, &framing)) !=
		    NULL) {
			if (framing)
				reply_err(q, K8S_EBADREQUEST, 400, "BadRequest",
				    "the length of the request body is "
				    "ambiguous: %s", why);
			else
				reply_err(q, K8S_EBADREQUEST, 400, "BadRequest",
				    "%s", why);
			return send_reply(q);
		}
		host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
		    MHD_HTTP_HEADER_HOST);
		if (!s->has_token && !host_allowed(host)) {
			reply_err(q, K8S_EFORBIDDEN, 403, "Forbidden", "host "
			    "'%.64s' is not served: without api.token only "
			    "localhost and loopback addresses are", host);
			return send_reply(q);
		}
		cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
		    MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (cl != NULL) {
			char *e;
			unsigned long long n;

			errno = 0;
			n = strtoull(cl, &e, 10);
			if (errno != 0 || e == cl || *e != '\0' ||
			    n > API_MAX_BODY) {
				reply_err(q, K8S_EBADREQUEST, 413,
				    "RequestEntityTooLarge", "the request "
				    "body is larger than %u bytes",
				    API_MAX_BODY);
				return send_reply(q);
			}
		}
		return MHD_YES;
	}
	if (*upload_data_size > 0) {
		if (q->queued || q->too_large) {
			/* bounded discard, then give up on the connection */
			q->discarded += *upload_data_size;
			*upload_data_size = 0;
			return q->discarded > API_MAX_BODY ? MHD_NO : MHD_YES;
		}
		if (buf_add(&q->body, upload_data, *upload_data_size) < 0) {
			q->too_large = 1;
			buf_release(&q->body);
			q->discarded += *upload_data_size;
		}
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (q->queued)
		return MHD_YES;
	if (q->too_large)
		reply_err(q, K8S_EBADREQUEST, 413, "RequestEntityTooLarge",
		    "the request body is larger than %u bytes", API_MAX_BODY);
	else
		handle(q);
	return send_reply(q);
}

static void
completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
    enum MHD_RequestTerminationCode toe)
{
	struct api_req *q = *con_cls;
	size_t i;

	(void)cls;
	(void)conn;
	(void)toe;
	*con_cls = NULL;
	if (q == NULL || q == HTTP_NUL_MARK)
		return;
	watch_free(q->stream);
	json_decref(q->reply);
	for (i = 0; i < q->nwarnings; i++)
		free(q->warnings[i]);
	free(q->warnings);
	buf_release(&q->body);
	free(q->url);
	free(q);
}

static void
server_free(struct k8s_apiserver *s)
{
	size_t i;

	if (s == NULL)
		return;
	if (s->schemas != NULL) {
		for (i = 0; k8s_resources[i] != NULL; i++)
			json_decref(s->schemas[i]);
		free(s->schemas);
	}
	if (s->key != NULL)
		secure_wipe(s->key, s->key_len);
	free(s->key);
	free(s->cert);
	secure_wipe(s->mac_key, sizeof(s->mac_key));
	pthread_mutex_destroy(&s->token_lock);
	free(s);
}

/* Start serving api on cfg->listen. */
int
k8s_apiserver_start(struct k8s_apiserver **out, struct k8s_api *api,
    const struct k8s_apiserver_config *cfg, char **cause)
{
	struct k8s_apiserver *s = NULL;
	struct sockaddr_storage ss, b;
	socklen_t sslen = 0, bl = sizeof(b);
	struct MHD_OptionItem tls_opts[3];
	const union MHD_DaemonInfo *info;
	const char *listen = cfg->listen != NULL && cfg->listen[0] != '\0' ?
	    cfg->listen : API_DEFAULT_LISTEN;
	int tls, token, ret = -1;
	unsigned int flags = MHD_USE_THREAD_PER_CONNECTION |
	    MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
	size_t i, n, cert_len = 0;
	char port[16];

	tls = cfg->tls_cert != NULL && cfg->tls_cert[0] != '\0';
	token = cfg->token != NULL && cfg->token[0] != '\0';
	if (http_parse_listen(listen, &ss, &sslen, cause) < 0)
		goto out;
	if (tls != (cfg->tls_key != NULL && cfg->tls_key[0] != '\0')) {
		*cause = xstrdup("api: tls_cert and tls_key go together");
		goto out;
	}
	if (!is_loopback(&ss) && (!tls || !token)) {
		*cause = xasprintf("api listen address '%s' is not loopback: "
		    "it needs tls_cert, tls_key and token", listen);
		goto out;
	}
	if (tls && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
		*cause = xstrdup("api: TLS is configured but libmicrohttpd "
		    "was built without TLS support");
		goto out;
	}
	s = xcalloc(1, sizeof(*s));
	s->api = api;
	pthread_mutex_init(&s->token_lock, NULL);
	if (tls) {
		if (read_pem(cfg->tls_cert, &s->cert, &cert_len, cause) < 0 ||
		    read_pem(cfg->tls_key, &s->key, &s->key_len, cause) < 0)
			goto out;
		flags |= MHD_USE_TLS;
	}
	if (token) {
		if (random_bytes(s->mac_key, sizeof(s->mac_key)) < 0) {
			*cause = xstrdup("api: no random bytes for the token");
			goto out;
		}
		hmac_sha256(s->mac_key, sizeof(s->mac_key), cfg->token,
		    strlen(cfg->token), s->token_mac);
		s->has_token = 1;
	}
	for (n = 0; k8s_resources[n] != NULL; n++)
		;
	s->schemas = xcalloc(n + 1, sizeof(*s->schemas));
	for (i = 0; i < n; i++)
		s->schemas[i] = load_schema(k8s_resources[i]);
	if (ss.ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	/* poll, not select: no FD_SETSIZE limit (epoll does not go with
	 * a thread per connection) */
	if (MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES)
		flags |= MHD_USE_POLL;
	memset(tls_opts, 0, sizeof(tls_opts));
	tls_opts[0].option = MHD_OPTION_END;
	tls_opts[1].option = MHD_OPTION_END;
	tls_opts[2].option = MHD_OPTION_END;
	if (tls) {
		tls_opts[0].option = MHD_OPTION_HTTPS_MEM_KEY;
		tls_opts[0].ptr_value = s->key;
		tls_opts[1].option = MHD_OPTION_HTTPS_MEM_CERT;
		tls_opts[1].ptr_value = s->cert;
	}
	errno = 0;
	s->d = MHD_start_daemon(flags, 0, NULL, NULL, access_cb, s,
	    /* first: libmicrohttpd logs what it finds in the options after */
	    MHD_OPTION_EXTERNAL_LOGGER, http_mhd_log, "api server",
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)
	    (cfg->max_connections > 0 ? cfg->max_connections : 256),
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)API_IDLE_TIMEOUT_S,
	    MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
	    MHD_OPTION_NOTIFY_COMPLETED, completed_cb, s,
	    MHD_OPTION_URI_LOG_CALLBACK, http_uri_mark, NULL,
	    MHD_OPTION_ARRAY, tls_opts,
	    MHD_OPTION_END);
	if (s->d == NULL) {
		*cause = xasprintf("api: cannot listen on '%s': %s", listen,
		    errno != 0 ? strerror(errno) : "libmicrohttpd refused "
		    "(a bad certificate or key?)");
		goto out;
	}
	info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_LISTEN_FD);
	if (info != NULL && getsockname(info->listen_fd,
	    (struct sockaddr *)&b, &bl) == 0) {
		if (b.ss_family == AF_INET6)
			s->port = ntohs(((struct sockaddr_in6 *)&b)->sin6_port);
		else
			s->port = ntohs(((struct sockaddr_in *)&b)->sin_port);
	}
	snprintf(port, sizeof(port), "%d", s->port);
	log_kv(LOG_INFO, "api server started", "listen", listen, "port", port,
	    "tls", tls ? "on" : "off", "auth", token ? "bearer" : "none",
	    NULL);
	*out = s;
	s = NULL;	/* now the caller's */
	ret = 0;
out:
	server_free(s);
	return ret;
}

/* The bound port. */
int
k8s_apiserver_port(const struct k8s_apiserver *s)
{
	return s->port;
}

/* End every stream, stop the daemon and free the server. */
void
k8s_apiserver_stop(struct k8s_apiserver *s)
{
	if (s == NULL)
		return;
	__atomic_store_n(&s->stopping, 1, __ATOMIC_SEQ_CST);
	MHD_stop_daemon(s->d);
	server_free(s);
}
