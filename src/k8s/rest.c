/*
 * The REST backend: the k8s ops against a Kubernetes API server (or the
 * embedded store served by apiserver.c) with libcurl.
 *
 * Connections: a small mutex-protected pool of easy handles, each keeping
 * its own connection alive between calls, all sharing one CURLSH for DNS
 * and TLS sessions (libcurl does not support sharing the connection cache
 * between threads that run transfers concurrently, so each handle keeps
 * its own). TLS verification is on unless the cluster says
 * insecure-skip-tls-verify; credentials are only sent over https, as
 * kubectl does. A tokenFile is re-read whenever its inode, size or mtime
 * changes, so projected service account tokens rotate without a restart.
 * A cluster's proxy-url carries every connection, as client-go's
 * rest.Config.Proxy does (socks5 as socks5h: the proxy resolves the
 * name), whatever https_proxy and no_proxy say; without one, libcurl
 * follows those as client-go's ProxyFromEnvironment would.
 * An exec credential plugin (execcred.c) is run for a token, again
 * shortly before the token expires or when the server answers 401.
 *
 * Retries (k8s_rest_config.max_retries, exponential backoff from 200 ms
 * with jitter capped at max_retry_wait_ms, or the server's Retry-After in
 * seconds, in full: never sooner than the server asked), all within
 * deadline_ms for the whole call: each attempt gets at most what is left
 * of it, a wait that would not leave MIN_ATTEMPT_MS for another attempt,
 * or a Retry-After longer than what is left, ends the call with the last
 * error (the caller requeues rather than holding a worker). Retried, as
 * client-go's, only where the request
 * cannot have taken effect, or taking effect twice is harmless:
 *   - 429 answers: every method (the server refused to look at it);
 *   - other 5xx answers (but 501): GET; any other method only when the
 *     answer carries Retry-After (the server asks for the retry). A write
 *     answered 500 or 504 without it may have been done (a commit whose
 *     answer timed out): sending it again could do it twice;
 *   - transport errors before anything was sent (DNS, connect): every
 *     method; after (TLS handshake, a lost answer): GET only, and never a
 *     timeout once sent (that already took timeout_ms);
 *   - other 4xx answers, TLS verification failures: never.
 * A write that fails after an attempt answered 5xx (or lost its answer)
 * reports k8s_status.maybe_done: that attempt may have taken effect, so a
 * retried create's AlreadyExists or a retried update's Conflict may be
 * its own doing, and the caller must not simply do it again.
 *
 * Lists are read in chunks of LIST_CHUNK (500) items, as client-go's pager
 * does: limit on every list, then each page's continue token until one
 * comes empty, the items appended to the first page's. The pages are one
 * snapshot at the first page's resourceVersion (what callers watch from),
 * each bounded by MAX_LIST_BODY, so a list of any length fits. A token
 * the server no longer has (410 Expired: it keeps them about five
 * minutes) starts the list again from scratch, up to LIST_RESTARTS times.
 * Pages that cannot be one snapshot fail the list: a continue token given
 * before (A, B, A, ...: it would never end), an item (uid) an earlier page
 * had (the continue parameter lost on the way: the first page again), and
 * so does a list of more than LIST_MAX_PAGES pages.
 *
 * Watches: one thread per watch drives a curl multi handle (so that
 * watch_free can wake it at once with curl_multi_wakeup), splits the
 * stream into lines, parses each line as one event and appends it to a
 * bounded queue (QUEUE_MAX events or QUEUE_MAX_BYTES). When the queue is
 * full the write callback blocks, curl stops reading and TCP flow control
 * pushes back on the server; if that lasts long enough for the low-speed
 * guard to fire, the stream is simply re-opened from the newest delivered
 * resourceVersion. When the server ends the stream (timeoutSeconds, a
 * proxy idle timeout, a reset) it is re-opened the same way, transparently:
 * at once when it ran a second or moved the resourceVersion on, else after
 * a growing wait, max_retries times in a row at most (events it had
 * already, sent again, are not progress); only an ERROR event, a 410 or
 * repeated failures end the watch. A refused
 * (re)connection is retried as a call is, but after the whole of its
 * Retry-After (up to WATCH_RETRY_AFTER_MAX_MS).
 *
 * Metrics, as client-go's rest_client_* ones but by Kubernetes verb and
 * resource: every attempt, retries included, counts in
 * diverge_kube_requests_total{verb,resource,code} (code "error": no
 * complete answer) and its time in diverge_kube_request_duration_seconds{verb}
 * (a watch: until its answer's headers; a log stream is not timed). A
 * watch started again counts in diverge_kube_watch_restarts_total
 * {resource,reason}: here after the stream ended (closed: cleanly, e.g.
 * timeoutSeconds; timeout: the low-speed guard; error: a reset) or its
 * reconnection was refused and retried (throttled: 429; error: another
 * status or no answer), and gone when it ends with 410 Expired (its
 * caller relists and watches from scratch). Labels never carry names,
 * namespaces or URLs: resource is the plural, with /status for the
 * subresource. The exec credential plugin's runs count in
 * diverge_kube_exec_plugin_runs_total{result} (execcred.c). Series whose
 * labels are known before their first event start at 0: the duration of
 * each verb, the restarts of a resource once it is watched, the plugin's
 * runs when the kubeconfig has one (not a request's code: only its
 * answer tells).
 */
#include "config.h"

#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "k8s/k8s.h"
#include "util/util.h"

#define MIB			(1024 * 1024)
#define MAX_BODY		(16 * MIB)	/* one object */
#define MAX_LIST_BODY		(64 * MIB)	/* a page of a list */
#define LIST_CHUNK		500		/* items a page, as client-go */
#define LIST_RESTARTS		3		/* after an expired continue */
#define LIST_MAX_PAGES		1000		/* 500,000 items */
#define MAX_ERR_BODY		(1 * MIB)	/* a watch's error reply */
#define MAX_LINE		(16 * MIB)	/* one watch event */
#define MAX_TOKEN		(64 * 1024)
#define MAX_PATH		(64 * 1024)
#define POOL_MAX		8		/* idle easy handles kept */
#define EXEC_TIMEOUT_MS		(30 * 1000)	/* an exec plugin's run */
#define EXEC_EARLY_S		10	/* its token renewed this early */
#define EXEC_RETRY_MS		(5 * 1000)	/* after it failed */
#define QUEUE_MAX		1024		/* watch events queued */
#define QUEUE_MAX_BYTES		((size_t)64 * MIB)
#define BACKOFF_BASE_MS		200
#define BACKOFF_MAX_MS		10000
#define WATCH_TIMEOUT_S		300		/* + up to 300 s of jitter */
#define WATCH_QUIET_S		60		/* low-speed guard on top */
#define WATCH_RETRY_AFTER_MAX_MS (300 * 1000)	/* a watch waits that long */
#define USER_AGENT		PACKAGE_NAME "/" PACKAGE_VERSION

#define DEF_CONNECT_MS		5000
#define DEF_TIMEOUT_MS		30000
#define DEF_RETRIES		4
#define DEF_RETRY_WAIT_MS	10000
#define DEF_DEADLINE_MS		60000
#define MIN_ATTEMPT_MS		1000	/* worth starting an attempt */

/* A proxy-url taken apart: what libcurl is given, and what messages show. */
struct proxy {
	char *curl;		/* scheme://host:port; socks5h for socks5 */
	char *shown;		/* scheme://host:port, without credentials */
	char *user, *pass;	/* URL-decoded, or NULL */
};

struct rest {
	struct k8s_api api;		/* first: the ops */
	struct k8s_cluster c;		/* our copy */
	struct k8s_rest_config cfg;
	char *base;		/* scheme://host:port[/prefix] for URLs */
	char *shown;		/* scheme://host:port[/prefix] for messages */
	struct curl_slist *connect_to;	/* tls-server-name redirection */
	char *host_hdr;		/* "Host: ..." in that case */
	int creds;		/* send credentials (https only) */
	struct curl_blob ca_blob, cert_blob, key_blob;
	struct proxy proxy;	/* the cluster's proxy-url, or all NULL */

	CURLSH *share;
	pthread_mutex_t share_lock[CURL_LOCK_DATA_LAST];

	pthread_mutex_t pool_lock;
	CURL *pool[POOL_MAX];
	size_t npool;

	pthread_mutex_t token_lock;
	char *token;		/* last read from c.token_file */
	struct stat token_st;
	int token_warned;
	/* c.exec_argv's token (under token_lock) */
	char *exec_token;
	int64_t exec_expiry;	/* unix s; 0: none said */
	int exec_stale;		/* answered 401: run the plugin again */
	/*
	 * bumped with each token the plugin gives: a 401 to a request
	 * that went out with an older token says nothing of this one
	 */
	uint64_t exec_gen;
	int64_t exec_retry_ms;	/* after a failure, not before (monotonic) */
	int64_t exec_logged_ms;	/* the last failure logged (monotonic) */
};

/* One request. */
struct req {
	const char *verb;	/* the Kubernetes verb, for the metrics */
	const struct k8s_resource *r;
	int status;		/* to the status subresource */
	const char *method;
	char *path;		/* from the prefix on, with the query */
	const char *ctype;	/* of the body, or NULL */
	char *body;
	size_t body_len;
	size_t max;		/* response bound */
	int keep_status;	/* a 2xx Status body is an answer (delete) */
};

/* One response. */
struct resp {
	long code;
	struct buf body;
	int overflow;
	int64_t retry_after_ms;	/* -1: no Retry-After */
	uint64_t auth_gen;	/* the credentials it went with */
};

/* A queued watch event. */
struct wev {
	struct wev *next;
	struct k8s_event ev;
	size_t size;
};

struct rest_watch {
	struct k8s_watch w;	/* first: the api */
	struct rest *rs;
	const struct k8s_resource *r;
	char *query;		/* path and query, without resourceVersion */
	char *rv;		/* resume point: last resourceVersion seen */
	pthread_t thread;
	int thread_started;
	pthread_mutex_t lock;
	pthread_cond_t cond;	/* to the consumer: event, start or end */
	pthread_cond_t space;	/* to the reader: room, or stop */
	struct wev *head, *tail;
	size_t count, bytes;
	int stop;		/* watch_free is waiting for the thread */
	int started;		/* a 200 answer arrived */
	int done;		/* the reader ended; err says why */
	int err;
	struct k8s_status est;
	int est_set;
	CURLM *multi;

	/* reader thread only: the current connection */
	CURL *h;
	struct buf line;
	struct buf errbody;
	long code;
	uint64_t auth_gen;	/* the credentials it went with */
	int64_t retry_after_ms;
	int timed;		/* this connection's answer was timed */
	int timeout_s;
	int fatal;		/* the stream itself ended the watch */
	int fatal_err;
	struct k8s_status fatal_st;
	size_t nforward;	/* events that moved rv on */
};

int k8s_rest_watch_parse_line(const char *line, size_t len,
    struct k8s_event *out, struct k8s_status *st);

static const struct k8s_ops rest_ops;

/* ---- metrics ---- */

/* Up to the call's deadline: an API server may hold a request a minute. */
static const double request_bounds[] = {
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60
};

/* Every verb a request is counted under. */
static const char *const verb_labels[] = {
	"verb=\"get\"", "verb=\"list\"", "verb=\"watch\"",
	"verb=\"create\"", "verb=\"update\"", "verb=\"patch\"",
	"verb=\"delete\"", NULL
};

static void
metrics_init(void)
{
	metrics_describe("diverge_kube_requests_total", METRIC_COUNTER,
	    "Kubernetes API requests by verb, resource and HTTP code "
	    "(error: no complete answer); every attempt of a retried call "
	    "counts");
	metrics_describe_buckets("diverge_kube_request_duration_seconds",
	    "Duration of one Kubernetes API request, by verb (a watch: until "
	    "its answer's headers)", request_bounds,
	    ARRAY_SIZE(request_bounds));
	metrics_describe("diverge_kube_watch_restarts_total", METRIC_COUNTER,
	    "Kubernetes watches started again, by resource and reason "
	    "(closed, timeout, error, throttled, gone)");
	metrics_describe("diverge_kube_exec_plugin_runs_total",
	    METRIC_COUNTER, "Runs of the kubeconfig's exec credential "
	    "plugin, by result (ok, error, timeout)");
	/*
	 * The series whose labels are known before their first event, at
	 * 0 (rate() and absent() then work from the start): the verbs'
	 * durations here, a watched resource's restarts when its first
	 * watch starts, the plugin's runs when the kubeconfig has one. A
	 * request's code is only known from its answer.
	 */
	metrics_zero("diverge_kube_request_duration_seconds", verb_labels);
}

/* The restarts of r's watches at 0, before the first one. */
static void
zero_restarts(const struct k8s_resource *r)
{
	static const char *const reasons[] = {
		"closed", "timeout", "error", "throttled", "gone"
	};
	char labels[ARRAY_SIZE(reasons)][160];
	const char *sets[ARRAY_SIZE(reasons) + 1];
	size_t i;

	for (i = 0; i < ARRAY_SIZE(reasons); i++) {
		snprintf(labels[i], sizeof(labels[i]),
		    "resource=\"%s\",reason=\"%s\"", r->plural, reasons[i]);
		sets[i] = labels[i];
	}
	sets[i] = NULL;
	metrics_zero("diverge_kube_watch_restarts_total", sets);
}

/*
 * One attempt: its count and, unless seconds < 0, its duration. code 0:
 * no (complete) answer. sub is "" or a subresource ("/status").
 */
static void
count_request(const char *verb, const char *plural, const char *sub,
    long code, double seconds)
{
	char labels[192], c[24];

	if (code > 0)
		snprintf(c, sizeof(c), "%ld", code);
	else
		snprintf(c, sizeof(c), "error");
	snprintf(labels, sizeof(labels),
	    "verb=\"%s\",resource=\"%s%s\",code=\"%s\"", verb, plural, sub,
	    c);
	metrics_inc("diverge_kube_requests_total", labels, 1);
	if (seconds < 0)
		return;
	snprintf(labels, sizeof(labels), "verb=\"%s\"", verb);
	metrics_observe("diverge_kube_request_duration_seconds", labels,
	    seconds);
}

/* A watch of r started again, for reason. */
static void
count_restart(const struct k8s_resource *r, const char *reason)
{
	char labels[160];

	snprintf(labels, sizeof(labels), "resource=\"%s\",reason=\"%s\"",
	    r->plural, reason);
	metrics_inc("diverge_kube_watch_restarts_total", labels, 1);
}

/* A curl time (microseconds) in seconds. */
static double
curl_seconds(CURL *h, CURLINFO what)
{
	curl_off_t us = 0;

	if (curl_easy_getinfo(h, what, &us) != CURLE_OK || us < 0)
		return 0;
	return (double)us / 1e6;
}

/* ---- small helpers ---- */

static void
free_secret(char *s)
{
	if (s != NULL) {
		secure_wipe(s, strlen(s));
		free(s);
	}
}

static char *
dup_or_null(const char *s)
{
	return s != NULL ? xstrdup(s) : NULL;
}

/* ---- proxy-url ---- */

static void
proxy_release(struct proxy *p)
{
	free(p->curl);
	free(p->shown);
	free_secret(p->user);
	free_secret(p->pass);
	memset(p, 0, sizeof(*p));
}

/* Whether s[0..n) looks like a URL scheme, so that it may be quoted. */
static int
scheme_like(const char *s, size_t n)
{
	size_t i;

	if (n == 0 || n > 16 || !((s[0] >= 'a' && s[0] <= 'z') ||
	    (s[0] >= 'A' && s[0] <= 'Z')))
		return 0;
	for (i = 1; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') ||
		    (s[i] >= 'A' && s[i] <= 'Z') ||
		    (s[i] >= '0' && s[i] <= '9') || s[i] == '+' ||
		    s[i] == '-' || s[i] == '.'))
			return 0;
	return 1;
}

/*
 * Take proxy-url url apart into *out (NULL: only check it), as client-go
 * takes it (clientcmd's parseProxyURL, then http.ProxyURL): the scheme is
 * http, https or socks5 in any case, a missing port is the scheme's (80,
 * 443, 1080), any path is ignored. socks5 becomes socks5h for libcurl:
 * the proxy resolves the server's name, as Go's SOCKS5 dialer has it do.
 * 0, or -1 with *why, which never quotes the URL (it may carry a
 * password).
 */
static int
proxy_parse(const char *url, struct proxy *out, char **why)
{
	static const struct {
		const char *scheme, *curl, *port;
	} schemes[] = {
		{ "http", "http", "80" },
		{ "https", "https", "443" },
		{ "socks5", "socks5h", "1080" },
	};
	const char *sep = strstr(url, "://");
	char *host = NULL, *port = NULL, *user = NULL, *pass = NULL;
	CURLU *u = NULL;
	CURLUcode uc;
	size_t i, n;
	int ret = -1;

	if (sep == NULL) {
		*why = xstrdup("has no scheme: http://, https:// or "
		    "socks5:// is required");
		return -1;
	}
	n = (size_t)(sep - url);
	for (i = 0; i < ARRAY_SIZE(schemes); i++)
		if (strlen(schemes[i].scheme) == n &&
		    strncasecmp(url, schemes[i].scheme, n) == 0)
			break;
	if (i == ARRAY_SIZE(schemes)) {
		*why = scheme_like(url, n) ? xasprintf("scheme '%.*s' is not "
		    "http, https or socks5", (int)n, url) : xstrdup("scheme "
		    "is not http, https or socks5");
		return -1;
	}
	u = curl_url();
	if (u == NULL)
		abort();	/* out of memory */
	uc = curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME);
	if (uc == CURLUE_OK)
		uc = curl_url_get(u, CURLUPART_HOST, &host, 0);
	/* libcurl reads "http:///x" as host x: there is none */
	if (uc == CURLUE_NO_HOST || (uc == CURLUE_OK && (host[0] == '\0' ||
	    sep[3] == '/'))) {
		*why = xstrdup("has no host");
		goto out;
	}
	if (uc != CURLUE_OK) {
		*why = xstrdup("is not a valid URL");
		goto out;
	}
	if (out != NULL) {
		if (curl_url_get(u, CURLUPART_PORT, &port, 0) != CURLUE_OK)
			port = NULL;
		if (curl_url_get(u, CURLUPART_USER, &user, CURLU_URLDECODE) ==
		    CURLUE_OK && user[0] != '\0')
			out->user = xstrdup(user);
		if (curl_url_get(u, CURLUPART_PASSWORD, &pass,
		    CURLU_URLDECODE) == CURLUE_OK)
			out->pass = xstrdup(pass);
		out->curl = xasprintf("%s://%s:%s", schemes[i].curl, host,
		    port != NULL ? port : schemes[i].port);
		out->shown = xasprintf("%s://%s:%s", schemes[i].scheme, host,
		    port != NULL ? port : schemes[i].port);
	}
	ret = 0;
out:
	curl_free(host);
	curl_free(port);
	if (user != NULL) {
		secure_wipe(user, strlen(user));
		curl_free(user);
	}
	if (pass != NULL) {
		secure_wipe(pass, strlen(pass));
		curl_free(pass);
	}
	curl_url_cleanup(u);
	return ret;
}

/* Check a proxy-url (kubeconfig.c, before anything is sent). */
int
k8s_proxy_url_check(const char *url, char **why)
{
	return proxy_parse(url, NULL, why);
}

/*
 * The reason a transfer failed, for a message: libcurl's, and the proxy
 * it went through (its address, never its credentials), to a new string.
 */
static char *
transport_why(const struct rest *rs, const char *errbuf, CURLcode rc)
{
	char *why = curl_why(errbuf, rc), *s;

	if (rs->proxy.shown == NULL)
		return why;
	s = xasprintf("%s (through the proxy %s)", why, rs->proxy.shown);
	free(why);
	return s;
}

/* Percent-encode everything but RFC 3986 unreserved characters. */
static int
add_escaped(struct buf *b, const char *s)
{
	static const char hex[] = "0123456789ABCDEF";
	const unsigned char *p;
	char enc[3];

	for (p = (const unsigned char *)s; *p != '\0'; p++) {
		if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
		    (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' ||
		    *p == '_' || *p == '~') {
			if (buf_add(b, p, 1) < 0)
				return -1;
			continue;
		}
		enc[0] = '%';
		enc[1] = hex[*p >> 4];
		enc[2] = hex[*p & 15];
		if (buf_add(b, enc, 3) < 0)
			return -1;
	}
	return 0;
}

/* A path segment from the caller: not empty, not a dot segment. */
static int
bad_segment(const char *s)
{
	return s == NULL || s[0] == '\0' || strcmp(s, ".") == 0 ||
	    strcmp(s, "..") == 0;
}

/*
 * The path of a collection (name NULL) or an object, optionally its
 * status subresource. NULL when too long.
 */
static char *
res_path(const struct k8s_resource *r, const char *ns, const char *name,
    int status)
{
	struct buf b;
	int bad = 0;

	buf_init(&b, MAX_PATH);
	if (r->group[0] == '\0')
		bad |= buf_printf(&b, "/api/%s", r->version);
	else
		bad |= buf_printf(&b, "/apis/%s/%s", r->group, r->version);
	if (r->namespaced && ns != NULL) {
		bad |= buf_addstr(&b, "/namespaces/");
		bad |= add_escaped(&b, ns);
	}
	bad |= buf_printf(&b, "/%s", r->plural);
	if (name != NULL) {
		bad |= buf_addstr(&b, "/");
		bad |= add_escaped(&b, name);
	}
	if (status)
		bad |= buf_addstr(&b, "/status");
	if (bad) {
		buf_release(&b);
		return NULL;
	}
	return buf_detach(&b, NULL);
}

/* Append ?key=value or &key=value; nothing when value is NULL or "". */
static int
add_query(struct buf *b, const char *key, const char *value)
{
	if (value == NULL || value[0] == '\0')
		return 0;
	if (buf_printf(b, "%c%s=", strchr(b->data, '?') ? '&' : '?',
	    key) < 0)
		return -1;
	return add_escaped(b, value);
}

/* Milliseconds of backoff before retry number attempt (0-based). */
static int64_t
backoff_ms(const struct rest *rs, int attempt, int64_t retry_after_ms)
{
	int64_t wait;

	/* the server's ask in full: never sooner (the caller checks time) */
	if (retry_after_ms >= 0)
		return retry_after_ms;
	wait = backoff_jitter_ms(backoff_delay_ms(BACKOFF_BASE_MS,
	    BACKOFF_MAX_MS, (unsigned)attempt));
	if (wait > rs->cfg.max_retry_wait_ms)
		wait = rs->cfg.max_retry_wait_ms;
	return wait < 0 ? 0 : wait;
}

/* ---- status and errors ---- */

/*
 * Fill st (when not NULL) from a Status object j and return the error it
 * stands for; code is the HTTP code, or the Status's own for watch events.
 */
static int
status_from_obj(struct k8s_status *st, int code, const json_t *j)
{
	struct k8s_status tmp;
	int err;

	memset(&tmp, 0, sizeof(tmp));
	err = k8s_status_from_json(&tmp, code, j);
	if (err >= 0)
		err = tmp.err < 0 ? (int)tmp.err :
		    (int)k8s_err_from_http(code, tmp.reason);
	if (code == 410)
		err = K8S_EGONE;
	if (err >= 0)
		err = K8S_EINTERNAL;
	tmp.err = err;
	if (tmp.code == 0)
		tmp.code = code;
	if (st != NULL) {
		k8s_status_release(st);
		*st = tmp;
	} else
		k8s_status_release(&tmp);
	return err;
}

/*
 * The error of a non-2xx answer: its Status body when it is one, else
 * one synthesized from the HTTP code.
 */
static int
http_error(struct k8s_status *st, const char *method, const char *path,
    long code, const char *body, size_t len)
{
	json_t *j = NULL;
	const char *kind;
	char *msg;
	int err;

	if (body != NULL && len > 0)
		j = json_loadb(body, len, 0, NULL);
	kind = json_string_value(json_object_get(j, "kind"));
	if (json_is_object(j) && kind != NULL && strcmp(kind, "Status") == 0) {
		err = status_from_obj(st, (int)code, j);
		json_decref(j);
		return err;
	}
	json_decref(j);
	err = k8s_err_from_http((int)code, NULL);
	if (code == 410)
		err = K8S_EGONE;
	if (err >= 0)
		err = K8S_EINTERNAL;
	msg = xasprintf("k8s: %s %s: the server answered HTTP %ld", method,
	    path, code);
	k8s_status_set(st, err, msg, NULL);
	free(msg);
	if (st != NULL)
		st->code = (int)code;
	return err;
}

/* ---- credentials ---- */

/* Read a token file: trimmed, bounded; NULL when unreadable or empty. */
static char *
read_token(const char *path)
{
	struct buf b;
	char chunk[4096];
	ssize_t n;
	int fd, ok = 1;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	buf_init(&b, MAX_TOKEN);
	for (;;) {
		n = read(fd, chunk, sizeof(chunk));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ok = n == 0;
			break;
		}
		if (buf_add(&b, chunk, (size_t)n) < 0) {
			ok = 0;
			break;
		}
	}
	close(fd);
	secure_wipe(chunk, sizeof(chunk));
	while (ok && b.len > 0 && (b.data[b.len - 1] == '\n' ||
	    b.data[b.len - 1] == '\r' || b.data[b.len - 1] == ' ' ||
	    b.data[b.len - 1] == '\t'))
		b.data[--b.len] = '\0';
	if (!ok || b.len == 0 || strlen(b.data) != b.len ||
	    strpbrk(b.data, "\r\n") != NULL) {
		if (b.data != NULL)
			secure_wipe(b.data, b.len);
		buf_release(&b);
		return NULL;
	}
	/* a rotated token is hidden from logs like the first one */
	redact_secret_add(b.data, b.len);
	return buf_detach(&b, NULL);
}

/*
 * The exec plugin's token as a header: run again when there is none yet,
 * when it expires within EXEC_EARLY_S, or after a 401; under token_lock,
 * so concurrent requests wait for one run. A failure is logged (once a
 * minute at most) and retried after EXEC_RETRY_MS; meanwhile requests go
 * without a token, and their 401 says so.
 */
static char *
exec_bearer(struct rest *rs, uint64_t *gen)
{
	char *tok = NULL, *cause = NULL, *hdr = NULL;
	int64_t exp = 0, now = now_mono_ms();

	pthread_mutex_lock(&rs->token_lock);
	if ((rs->exec_token == NULL || rs->exec_stale ||
	    (rs->exec_expiry > 0 && now_unix() >= rs->exec_expiry -
	    EXEC_EARLY_S)) && now >= rs->exec_retry_ms) {
		free_secret(rs->exec_token);
		rs->exec_token = NULL;
		if (k8s_exec_credential(&rs->c, EXEC_TIMEOUT_MS, &tok, &exp,
		    &cause) == 0) {
			if (rs->exec_logged_ms != 0)
				log_kv(LOG_INFO, "k8s: the exec credential "
				    "plugin gave a token again", NULL);
			rs->exec_token = tok;
			rs->exec_expiry = exp;
			rs->exec_stale = 0;
			rs->exec_gen++;
			rs->exec_logged_ms = 0;
		} else {
			if (rs->exec_logged_ms == 0 ||
			    now - rs->exec_logged_ms >= 60 * 1000) {
				log_kv(LOG_ERROR, "k8s: the exec credential "
				    "plugin failed; requests go without a "
				    "token", "error", cause, NULL);
				rs->exec_logged_ms = now;
			}
			rs->exec_retry_ms = now + EXEC_RETRY_MS;
			free(cause);
		}
	}
	if (rs->exec_token != NULL)
		hdr = xasprintf("Authorization: Bearer %s", rs->exec_token);
	*gen = rs->exec_gen;
	pthread_mutex_unlock(&rs->token_lock);
	return hdr;
}

/*
 * The API server refused the credentials of a request that went with
 * those of generation gen: the exec plugin is run again, unless it has
 * given a newer token since (the 401 of a request that was in flight
 * while another's 401 had it run again says nothing of the new token).
 */
static void
credentials_refused(struct rest *rs, uint64_t gen)
{
	if (rs->c.exec_argv == NULL)
		return;
	pthread_mutex_lock(&rs->token_lock);
	if (gen == rs->exec_gen)
		rs->exec_stale = 1;
	pthread_mutex_unlock(&rs->token_lock);
}

/*
 * "Authorization: Bearer ..." for the next request (a new string the
 * caller wipes), or NULL when there is no token.
 */
static char *
bearer_header(struct rest *rs, uint64_t *gen)
{
	const char *tok;
	struct stat sb;
	char *hdr = NULL, *t;

	*gen = 0;
	if (!rs->creds)
		return NULL;
	if (rs->c.exec_argv != NULL)
		return exec_bearer(rs, gen);
	if (rs->c.token_file == NULL)
		return rs->c.token != NULL ?
		    xasprintf("Authorization: Bearer %s", rs->c.token) : NULL;
	pthread_mutex_lock(&rs->token_lock);
	if (stat(rs->c.token_file, &sb) == 0) {
		if (rs->token == NULL || sb.st_ino != rs->token_st.st_ino ||
		    sb.st_dev != rs->token_st.st_dev ||
		    sb.st_size != rs->token_st.st_size ||
		    sb.st_mtim.tv_sec != rs->token_st.st_mtim.tv_sec ||
		    sb.st_mtim.tv_nsec != rs->token_st.st_mtim.tv_nsec) {
			t = read_token(rs->c.token_file);
			if (t != NULL) {
				free_secret(rs->token);
				rs->token = t;
				rs->token_st = sb;
				rs->token_warned = 0;
			} else if (!rs->token_warned) {
				rs->token_warned = 1;
				log_kv(LOG_WARN, "k8s: token file is empty or "
				    "unreadable", "path", rs->c.token_file,
				    NULL);
			}
		}
	} else if (!rs->token_warned) {
		rs->token_warned = 1;
		log_kv(LOG_WARN, "k8s: token file is unreadable", "path",
		    rs->c.token_file, "error", strerror(errno), NULL);
	}
	tok = rs->token != NULL ? rs->token : rs->c.token;
	if (tok != NULL)
		hdr = xasprintf("Authorization: Bearer %s", tok);
	pthread_mutex_unlock(&rs->token_lock);
	return hdr;
}

/* Free a header list, wiping the credentials in it first. */
static void
free_headers(struct curl_slist *l)
{
	struct curl_slist *p;

	for (p = l; p != NULL; p = p->next)
		if (strncasecmp(p->data, "Authorization:", 14) == 0)
			secure_wipe(p->data, strlen(p->data));
	curl_slist_free_all(l);
}

static struct curl_slist *
add_header(struct curl_slist *l, const char *h)
{
	struct curl_slist *n = curl_slist_append(l, h);

	if (n == NULL) {
		log_kv(LOG_ERROR, "k8s: out of memory", NULL);
		abort();
	}
	return n;
}

/*
 * Options every transfer has: TLS, client certificate, credentials,
 * timeouts. Returns the header list to pass as CURLOPT_HTTPHEADER.
 */
/* The options and headers of every call; accept is the Accept header. */
static struct curl_slist *
setup_common(struct rest *rs, CURL *h, const char *accept, uint64_t *gen)
{
	struct curl_slist *hdrs = NULL;
	char *auth;

	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
	    (long)CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
	    (long)rs->cfg.connect_timeout_ms);
	curl_easy_setopt(h, CURLOPT_USERAGENT, USER_AGENT);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 30L);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 10L);
	curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "");

	curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, rs->c.insecure ? 0L : 1L);
	curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, rs->c.insecure ? 0L : 2L);
	if (rs->c.ca_data != NULL) {
		/* only the cluster's CA, as client-go does */
		curl_easy_setopt(h, CURLOPT_CAINFO, NULL);
		curl_easy_setopt(h, CURLOPT_CAPATH, NULL);
		curl_easy_setopt(h, CURLOPT_CAINFO_BLOB, &rs->ca_blob);
	} else if (rs->c.ca_file != NULL) {
		curl_easy_setopt(h, CURLOPT_CAPATH, NULL);
		curl_easy_setopt(h, CURLOPT_CAINFO, rs->c.ca_file);
	}
	if (rs->c.cert_data != NULL) {
		curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
		curl_easy_setopt(h, CURLOPT_SSLCERT_BLOB, &rs->cert_blob);
	} else if (rs->c.cert_file != NULL) {
		curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
		curl_easy_setopt(h, CURLOPT_SSLCERT, rs->c.cert_file);
	}
	if (rs->c.key_data != NULL) {
		curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
		curl_easy_setopt(h, CURLOPT_SSLKEY_BLOB, &rs->key_blob);
	} else if (rs->c.key_file != NULL) {
		curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
		curl_easy_setopt(h, CURLOPT_SSLKEY, rs->c.key_file);
	}
	if (rs->connect_to != NULL) {
		curl_easy_setopt(h, CURLOPT_CONNECT_TO, rs->connect_to);
		hdrs = add_header(hdrs, rs->host_hdr);
	}
	if (rs->proxy.curl != NULL) {
		/*
		 * The cluster's proxy-url for every request, as client-go's
		 * http.ProxyURL: the environment's no_proxy must not send
		 * one around it. An https proxy's certificate is verified
		 * against the system's CAs (libcurl's default CA bundle; the
		 * cluster's CA and insecure-skip-tls-verify are for the API
		 * server only), always.
		 */
		curl_easy_setopt(h, CURLOPT_PROXY, rs->proxy.curl);
		curl_easy_setopt(h, CURLOPT_NOPROXY, "");
		curl_easy_setopt(h, CURLOPT_PROXY_SSL_VERIFYPEER, 1L);
		curl_easy_setopt(h, CURLOPT_PROXY_SSL_VERIFYHOST, 2L);
		if (rs->proxy.user != NULL) {
			curl_easy_setopt(h, CURLOPT_PROXYUSERNAME,
			    rs->proxy.user);
			curl_easy_setopt(h, CURLOPT_PROXYPASSWORD,
			    rs->proxy.pass != NULL ? rs->proxy.pass : "");
		}
	}
	/* else libcurl follows https_proxy, no_proxy, ... as client-go */

	hdrs = add_header(hdrs, accept);
	auth = bearer_header(rs, gen);
	if (auth != NULL) {
		hdrs = add_header(hdrs, auth);
		free_secret(auth);
	} else if (rs->creds && rs->c.username != NULL) {
		curl_easy_setopt(h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
		curl_easy_setopt(h, CURLOPT_USERNAME, rs->c.username);
		curl_easy_setopt(h, CURLOPT_PASSWORD,
		    rs->c.password != NULL ? rs->c.password : "");
	}
	return hdrs;
}

/* ---- the handle pool ---- */

static void
share_lock(CURL *h, curl_lock_data data, curl_lock_access access,
    void *arg)
{
	struct rest *rs = arg;

	(void)h;
	(void)access;
	if ((int)data >= 0 && data < CURL_LOCK_DATA_LAST)
		pthread_mutex_lock(&rs->share_lock[data]);
}

static void
share_unlock(CURL *h, curl_lock_data data, void *arg)
{
	struct rest *rs = arg;

	(void)h;
	if ((int)data >= 0 && data < CURL_LOCK_DATA_LAST)
		pthread_mutex_unlock(&rs->share_lock[data]);
}

static CURL *
handle_new(struct rest *rs)
{
	CURL *h = curl_easy_init();

	/* the share stays through curl_easy_reset */
	if (h != NULL)
		curl_easy_setopt(h, CURLOPT_SHARE, rs->share);
	return h;
}

static CURL *
pool_get(struct rest *rs)
{
	CURL *h = NULL;

	pthread_mutex_lock(&rs->pool_lock);
	if (rs->npool > 0)
		h = rs->pool[--rs->npool];
	pthread_mutex_unlock(&rs->pool_lock);
	if (h == NULL)
		h = handle_new(rs);
	return h;
}

static void
pool_put(struct rest *rs, CURL *h)
{
	if (h == NULL)
		return;
	/* forget this request's options (and pointers), keep the connection */
	curl_easy_reset(h);
	pthread_mutex_lock(&rs->pool_lock);
	if (rs->npool < POOL_MAX) {
		rs->pool[rs->npool++] = h;
		h = NULL;	/* now owned by the pool */
	}
	pthread_mutex_unlock(&rs->pool_lock);
	if (h != NULL)
		curl_easy_cleanup(h);
}

/* ---- requests ---- */

static size_t
resp_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct resp *rp = arg;
	size_t n = size * nmemb;

	if (buf_add(&rp->body, data, n) < 0) {
		rp->overflow = 1;
		return 0;
	}
	return n;
}

/* Seconds from a Retry-After header line, -1 when absent or a date. */
static int64_t
retry_after(const char *line, size_t n)
{
	static const char name[] = "retry-after:";
	int64_t s = 0;
	size_t i;
	int digits = 0;

	if (n < sizeof(name) - 1 ||
	    strncasecmp(line, name, sizeof(name) - 1) != 0)
		return -1;
	for (i = sizeof(name) - 1; i < n && (line[i] == ' ' ||
	    line[i] == '\t'); i++)
		;
	for (; i < n && line[i] >= '0' && line[i] <= '9'; i++) {
		if (s < 1000000)
			s = s * 10 + (line[i] - '0');
		digits++;
	}
	for (; i < n; i++)
		if (line[i] != ' ' && line[i] != '\r' && line[i] != '\n')
			return -1;
	return digits > 0 ? s : -1;
}

static size_t
resp_header(char *data, size_t size, size_t nmemb, void *arg)
{
	struct resp *rp = arg;
	size_t n = size * nmemb;
	int64_t s = retry_after(data, n);

	if (s >= 0)
		rp->retry_after_ms = s * 1000;
	return n;
}

static void
resp_init(struct resp *rp, size_t max)
{
	rp->code = 0;
	buf_init(&rp->body, max);
	rp->overflow = 0;
	rp->retry_after_ms = -1;
}

/*
 * One attempt of at most timeout_ms; *sent says whether any of the
 * request went out.
 */
static CURLcode
do_once(struct rest *rs, CURL *h, const struct req *rq, int64_t timeout_ms,
    struct resp *rp, char *errbuf, int *sent)
{
	struct curl_slist *hdrs;
	char *url = xasprintf("%s%s", rs->base, rq->path);
	long reqsize = 0;
	CURLcode rc;

	curl_easy_reset(h);
	hdrs = setup_common(rs, h, "Accept: application/json", &rp->auth_gen);
	errbuf[0] = '\0';
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
	if (timeout_ms < rs->cfg.connect_timeout_ms)
		curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
		    (long)timeout_ms);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, resp_write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, rp);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, resp_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, rp);
	if (strcmp(rq->method, "GET") == 0)
		curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
	else {
		/*
		 * libcurl sends a request again by itself when a reused
		 * connection closes before any byte of the answer ("connection
		 * died, retrying a fresh connect"), whatever the method: a
		 * write the server did but could not answer would be done
		 * twice. A write therefore gets a connection of its own (the
		 * TLS session is still resumed through the share); reads keep
		 * reusing theirs.
		 */
		curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
		if (strcmp(rq->method, "POST") != 0)
			curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, rq->method);
		curl_easy_setopt(h, CURLOPT_POST, 1L);
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
		    (curl_off_t)rq->body_len);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS,
		    rq->body != NULL ? rq->body : "");
		hdrs = add_header(hdrs, "Expect:");
	}
	if (rq->ctype != NULL) {
		char *ct = xasprintf("Content-Type: %s", rq->ctype);

		hdrs = add_header(hdrs, ct);
		free(ct);
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);

	rc = curl_easy_perform(h);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &rp->code);
	curl_easy_getinfo(h, CURLINFO_REQUEST_SIZE, &reqsize);
	*sent = reqsize > 0;
	count_request(rq->verb, rq->r->plural, rq->status ? "/status" : "",
	    rc == CURLE_OK ? rp->code : 0,
	    curl_seconds(h, CURLINFO_TOTAL_TIME_T));
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
	free_headers(hdrs);
	free(url);
	return rc;
}

/* The path without its query, for messages. */
static char *
path_shown(const char *path)
{
	const char *q = strchr(path, '?');

	return q ? xstrndup(path, (size_t)(q - path)) : xstrdup(path);
}

/*
 * Parse a 2xx body into *out (NULL when out is NULL, the body is empty,
 * or it is a Status and the request does not want it).
 */
static int
parse_ok(const struct req *rq, struct resp *rp, const char *shown,
    json_t **out, struct k8s_status *st)
{
	json_error_t jerr;
	const char *kind;
	json_t *j;
	char *msg;
	int ret;

	if (rp->body.len == 0) {
		if (out != NULL)
			*out = NULL;
		return 0;
	}
	j = json_loadb(rp->body.data, rp->body.len, 0, &jerr);
	if (!json_is_object(j)) {
		msg = xasprintf("k8s: %s %s: the answer is not a JSON object "
		    "(line %d column %d)", rq->method, shown, jerr.line,
		    jerr.column);
		ret = k8s_status_set(st, K8S_EINTERNAL, msg, NULL);
		free(msg);
		json_decref(j);
		return ret;
	}
	kind = json_string_value(json_object_get(j, "kind"));
	if (rq->keep_status && kind != NULL && strcmp(kind, "Status") == 0) {
		json_decref(j);
		j = NULL;
	}
	if (out != NULL)
		*out = j;
	else
		json_decref(j);
	return 0;
}

/* Whether the outcome of one attempt calls for another (see the top). */
static int
worth_retry(const struct req *rq, CURLcode rc, const struct resp *rp,
    int sent)
{
	int get = strcmp(rq->method, "GET") == 0;

	/* nothing sent (no connection): any method; else GET, untimed */
	if (rc != CURLE_OK)
		return curl_transient(rc) && (!sent ||
		    (get && rc != CURLE_OPERATION_TIMEDOUT));
	if (rp->code == 429)
		return 1;
	if (rp->code >= 500 && rp->code != 501)
		return get || rp->retry_after_ms >= 0;
	return 0;
}

/* Run a request with the retry policy described at the top. */
static int
rest_call(struct rest *rs, const struct req *rq, json_t **out,
    struct k8s_status *st)
{
	char errbuf[CURL_ERROR_SIZE];
	char *shown = path_shown(rq->path), *msg, *why;
	struct resp rp;
	CURL *h = NULL;
	CURLcode rc;
	int attempt, retry, sent = 0, write, maybe_done = 0;
	int ret = K8S_EINTERNAL;
	int64_t wait, left, deadline = now_mono_ms() + rs->cfg.deadline_ms;

	resp_init(&rp, rq->max);
	write = strcmp(rq->method, "GET") != 0;
	h = pool_get(rs);
	if (h == NULL) {
		ret = k8s_status_set(st, K8S_EINTERNAL,
		    "k8s: cannot create a curl handle", NULL);
		goto out;
	}
	for (attempt = 0;; attempt++) {
		buf_release(&rp.body);
		resp_init(&rp, rq->max);
		left = deadline - now_mono_ms();
		rc = do_once(rs, h, rq, left < rs->cfg.timeout_ms ?
		    (left > 1 ? left : 1) : rs->cfg.timeout_ms, &rp, errbuf,
		    &sent);
		if (rc == CURLE_OK && rp.code >= 200 && rp.code < 300) {
			ret = parse_ok(rq, &rp, shown, out, st);
			goto out;
		}
		if (rc == CURLE_OK && rp.code == 401)
			credentials_refused(rs, rp.auth_gen);
		if (rp.overflow) {
			msg = xasprintf("k8s: %s %s: the answer is larger "
			    "than %zu MiB", rq->method, shown,
			    rq->max / MIB);
			ret = k8s_status_set(st, K8S_EINTERNAL, msg, NULL);
			free(msg);
			goto out;
		}
		/* a write answered 5xx, or sent and not answered: done? */
		if (write && ((rc == CURLE_OK && rp.code >= 500) ||
		    (rc != CURLE_OK && sent)))
			maybe_done = 1;
		retry = worth_retry(rq, rc, &rp, sent);
		if (!retry || attempt >= rs->cfg.max_retries)
			break;
		wait = backoff_ms(rs, attempt, rp.retry_after_ms);
		left = deadline - now_mono_ms();
		/*
		 * a Retry-After is waited in full, as client-go does, when
		 * the call has time left for it and another attempt; ended
		 * instead, the caller's requeue (its backoff starts at a few
		 * milliseconds) would come sooner than the server asked
		 */
		if (wait + MIN_ATTEMPT_MS > left) {
			/* no time for another try: the caller requeues */
			if (log_enabled(LOG_INFO)) {
				char ms[32];

				snprintf(ms, sizeof(ms), "%" PRId64, wait);
				log_kv(LOG_INFO, "k8s: no time left to retry",
				    "method", rq->method, "path", shown,
				    "wait_ms", ms, NULL);
			}
			break;
		}
		if (log_enabled(LOG_INFO)) {
			char what[64], ms[32];

			if (rc != CURLE_OK)
				snprintf(what, sizeof(what), "%s",
				    curl_easy_strerror(rc));
			else
				snprintf(what, sizeof(what), "HTTP %ld",
				    rp.code);
			snprintf(ms, sizeof(ms), "%" PRId64, wait);
			log_kv(LOG_INFO, "k8s: retrying request", "method",
			    rq->method, "path", shown, "error", what,
			    "wait_ms", ms, NULL);
		}
		sleep_ms(wait);
	}
	if (rc != CURLE_OK) {
		why = transport_why(rs, errbuf, rc);
		msg = xasprintf("k8s: %s %s%s: %s", rq->method, rs->shown,
		    shown, why);
		free(why);
		ret = k8s_status_set(st, rc == CURLE_OPERATION_TIMEDOUT ?
		    K8S_ETIMEOUT : K8S_EUNAVAILABLE, msg, NULL);
		if (st != NULL)
			st->code = rc == CURLE_OPERATION_TIMEDOUT ? 504 : 503;
		free(msg);
	} else
		ret = http_error(st, rq->method, shown, rp.code,
		    rp.body.data, rp.body.len);
	if (st != NULL)
		st->maybe_done = maybe_done;
out:
	buf_release(&rp.body);
	pool_put(rs, h);
	free(shown);
	return ret;
}

/* ---- a raw stream (pods/log) ---- */

struct stream {
	CURL *h;
	long code;
	k8s_stream_fn fn;
	void *arg;
	struct buf err;		/* an error answer's body, bounded */
};

static size_t
stream_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct stream *sm = arg;
	size_t n = size * nmemb;

	if (sm->code == 0)
		curl_easy_getinfo(sm->h, CURLINFO_RESPONSE_CODE, &sm->code);
	if (sm->code >= 200 && sm->code < 300)
		return sm->fn(sm->arg, data, n) == 0 ? n : 0;
	(void)buf_add(&sm->err, data, n);	/* a bounded excerpt */
	return n;
}

int
k8s_rest_stream(struct k8s_api *api, const char *path, int64_t timeout_ms,
    k8s_stream_fn fn, void *arg, struct k8s_status *st)
{
	struct rest *rs = (struct rest *)api;
	char errbuf[CURL_ERROR_SIZE], *url, *shown, *msg, *why;
	struct curl_slist *hdrs;
	struct stream sm;
	CURLcode rc;
	uint64_t gen = 0;
	int ret = 0;

	if (api->ops != &rest_ops)
		return k8s_status_set(st, K8S_EUNSUPPORTED,
		    "k8s: streams need a cluster's API", NULL);
	memset(&sm, 0, sizeof(sm));
	sm.fn = fn;
	sm.arg = arg;
	buf_init(&sm.err, 64 * 1024);
	sm.h = pool_get(rs);
	if (sm.h == NULL)
		return k8s_status_set(st, K8S_EINTERNAL,
		    "k8s: cannot create a curl handle", NULL);
	url = xasprintf("%s%s", rs->base, path);
	shown = path_shown(path);
	curl_easy_reset(sm.h);
	/* the same TLS, credentials and timeouts as every other call */
	hdrs = setup_common(rs, sm.h, "Accept: */*", &gen);
	errbuf[0] = '\0';
	curl_easy_setopt(sm.h, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(sm.h, CURLOPT_URL, url);
	curl_easy_setopt(sm.h, CURLOPT_HTTPGET, 1L);
	curl_easy_setopt(sm.h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
	curl_easy_setopt(sm.h, CURLOPT_WRITEFUNCTION, stream_write);
	curl_easy_setopt(sm.h, CURLOPT_WRITEDATA, &sm);
	curl_easy_setopt(sm.h, CURLOPT_HTTPHEADER, hdrs);
	rc = curl_easy_perform(sm.h);
	if (sm.code == 0)
		curl_easy_getinfo(sm.h, CURLINFO_RESPONSE_CODE, &sm.code);
	/* its one use (k8s.h); a followed log lasts: counted, not timed */
	count_request("get", "pods", "/log", sm.code >= 200 &&
	    (rc == CURLE_OK || rc == CURLE_WRITE_ERROR) ? sm.code : 0, -1);
	curl_easy_setopt(sm.h, CURLOPT_HTTPHEADER, NULL);
	free_headers(hdrs);
	if (rc != CURLE_OK && !(sm.code >= 300 && rc == CURLE_WRITE_ERROR)) {
		why = transport_why(rs, errbuf, rc);
		msg = xasprintf("k8s: GET %s%s: %s", rs->shown, shown, why);
		free(why);
		ret = k8s_status_set(st, rc == CURLE_OPERATION_TIMEDOUT ?
		    K8S_ETIMEOUT : K8S_EUNAVAILABLE, msg, NULL);
		free(msg);
	} else if (sm.code < 200 || sm.code >= 300) {
		if (sm.code == 401)
			credentials_refused(rs, gen);
		ret = http_error(st, "GET", shown, sm.code, sm.err.data,
		    sm.err.len);
	}
	pool_put(rs, sm.h);
	buf_release(&sm.err);
	free(shown);
	free(url);
	return ret;
}

/* ---- the ops ---- */

static struct rest *
rest_of(struct k8s_api *api)
{
	return (struct rest *)api;
}

static int
bad_request(struct k8s_status *st, const char *what)
{
	char *msg = xasprintf("k8s: %s", what);
	int ret = k8s_status_set(st, K8S_EBADREQUEST, msg, NULL);

	free(msg);
	return ret;
}

/* The namespace of a single-object call: the context's by default. */
static const char *
object_ns(struct rest *rs, const struct k8s_resource *r, const char *ns)
{
	if (!r->namespaced)
		return NULL;
	return ns != NULL && ns[0] != '\0' ? ns : rs->c.namespace;
}

/* Build req->path for an object; an error when names are unusable. */
static int
object_req(struct rest *rs, struct req *rq, const struct k8s_resource *r,
    const char *ns, const char *name, int status, struct k8s_status *st)
{
	ns = object_ns(rs, r, ns);
	if (r->namespaced && bad_segment(ns))
		return bad_request(st, "a namespace is required");
	if (name != NULL && bad_segment(name))
		return bad_request(st, "a valid name is required");
	rq->path = res_path(r, ns, name, status);
	if (rq->path == NULL)
		return bad_request(st, "the request path is too long");
	return 0;
}

/*
 * The body of a create or update: obj with apiVersion and kind filled
 * in when missing and metadata.namespace set to the request's.
 */
static char *
object_body(const struct k8s_resource *r, const char *ns, const json_t *obj,
    size_t *len)
{
	json_t *copy = json_deep_copy(obj), *meta;
	char *s;

	if (json_is_object(copy)) {
		if (json_object_get(copy, "apiVersion") == NULL)
			json_object_set_new(copy, "apiVersion",
			    json_string(k8s_api_version(r)));
		if (json_object_get(copy, "kind") == NULL)
			json_object_set_new(copy, "kind",
			    json_string(r->kind));
		meta = json_object_get(copy, "metadata");
		if (ns != NULL && json_is_object(meta))
			json_object_set_new(meta, "namespace",
			    json_string(ns));
	}
	s = json_dumps(copy != NULL ? copy : json_null(),
	    JSON_COMPACT | JSON_ENCODE_ANY);
	json_decref(copy);
	if (s == NULL)
		s = xstrdup("null");
	*len = strlen(s);
	return s;
}

static void
req_release(struct req *rq)
{
	free(rq->path);
	free(rq->body);
}

static int
rest_get(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, json_t **out, struct k8s_status *st)
{
	struct rest *rs = rest_of(api);
	struct req rq = { .verb = "get", .r = r, .method = "GET",
	    .max = MAX_BODY };
	int ret;

	if (name == NULL)
		return bad_request(st, "a name is required");
	ret = object_req(rs, &rq, r, ns, name, 0, st);
	if (ret == 0)
		ret = rest_call(rs, &rq, out, st);
	req_release(&rq);
	return ret;
}

/*
 * Collection path and query of a list page or a watch; NULL when too
 * long. A list page asks for LIST_CHUNK items, and one after the first
 * (cont, the previous page's continue token) carries no resourceVersion:
 * the API server refuses both together, the token pins the version.
 */
static char *
collection_query(const struct k8s_resource *r, const char *ns,
    const struct k8s_list_opts *opts, int watch, int timeout_s,
    const char *cont)
{
	struct buf b;
	char *path = res_path(r, ns, NULL, 0);
	int bad = 0;

	if (path == NULL)
		return NULL;
	buf_init(&b, MAX_PATH);
	bad |= buf_addstr(&b, path);
	free(path);
	if (watch) {
		bad |= buf_printf(&b, "?watch=true&allowWatchBookmarks=true"
		    "&timeoutSeconds=%d", timeout_s);
	} else
		bad |= buf_printf(&b, "?limit=%d", LIST_CHUNK);
	if (opts != NULL) {
		bad |= add_query(&b, "labelSelector", opts->label_selector);
		bad |= add_query(&b, "fieldSelector", opts->field_selector);
		if (!watch && cont == NULL)
			bad |= add_query(&b, "resourceVersion",
			    opts->resource_version);
	}
	if (!watch)
		bad |= add_query(&b, "continue", cont);
	if (bad) {
		buf_release(&b);
		return NULL;
	}
	return buf_detach(&b, NULL);
}

/* One page of a list: *out the answer, an object. */
static int
list_page(struct rest *rs, const struct k8s_resource *r, const char *ns,
    const struct k8s_list_opts *opts, const char *cont, json_t **out,
    struct k8s_status *st)
{
	struct req rq = { .verb = "list", .r = r, .method = "GET",
	    .max = MAX_LIST_BODY };
	json_t *page = NULL;
	int ret;

	rq.path = collection_query(r, ns, opts, 0, 0, cont);
	if (rq.path == NULL)
		return bad_request(st, cont == NULL ?
		    "the request path is too long" :
		    "the continue token makes the request path too long");
	ret = rest_call(rs, &rq, &page, st);
	if (ret == 0 && !json_is_object(page))
		ret = k8s_status_set(st, K8S_EINTERNAL,
		    "k8s: the list answer is not an object", NULL);
	if (ret == 0) {
		*out = page;
		page = NULL;	/* now the caller's */
	}
	json_decref(page);
	req_release(&rq);
	return ret;
}

/* The items array of a list answer, made when missing. */
static json_t *
list_items(json_t *list)
{
	json_t *items = json_object_get(list, "items");

	if (!json_is_array(items)) {
		items = json_array();
		json_object_set_new(list, "items", items);
	}
	return items;
}

/*
 * Note the uids of page's items in seen; 1 when one was there already (a
 * snapshot has each object once).
 */
static int
page_repeats(json_t *seen, json_t *page)
{
	json_t *it;
	const char *uid;
	size_t i;
	int dup = 0;

	json_array_foreach(list_items(page), i, it) {
		uid = k8s_meta_str(it, "uid");
		if (uid == NULL || uid[0] == '\0')
			continue;
		if (json_object_get(seen, uid) != NULL)
			dup = 1;
		else
			json_object_set_new(seen, uid, json_true());
	}
	return dup;
}

/*
 * Every page of one list, as client-go's pager reads them: *out the first
 * page (its metadata, resourceVersion included: the pages are a snapshot
 * at that version) with the items of the others appended, and metadata
 * as of a whole list (continue empty, no remainingItemCount). *expired
 * is set when the error is a continue token the server no longer has.
 */
static int
list_pages(struct rest *rs, const struct k8s_resource *r, const char *ns,
    const struct k8s_list_opts *opts, json_t **out, int *expired,
    struct k8s_status *st)
{
	json_t *list = NULL, *page = NULL, *meta, *cur;
	json_t *tokens = json_object(), *uids = json_object();
	const char *next;
	char *cont = NULL, *msg;
	int ret, pages = 1;

	ret = list_page(rs, r, ns, opts, NULL, &list, st);
	if (ret == 0)
		(void)page_repeats(uids, list);
	for (cur = list; ret == 0; cur = page) {
		next = json_string_value(json_object_get(json_object_get(cur,
		    "metadata"), "continue"));
		if (next == NULL || next[0] == '\0')
			break;
		if (json_object_get(tokens, next) != NULL) {
			ret = k8s_status_set(st, K8S_EINTERNAL, "k8s: the "
			    "list answer gives a continue token it gave before",
			    NULL);
			break;
		}
		if (pages == LIST_MAX_PAGES) {
			msg = xasprintf("k8s: the list has more than %d pages",
			    LIST_MAX_PAGES);
			ret = k8s_status_set(st, K8S_EINTERNAL, msg, NULL);
			free(msg);
			break;
		}
		json_object_set_new(tokens, next, json_true());
		free(cont);
		cont = xstrdup(next);
		json_decref(page);
		page = NULL;
		ret = list_page(rs, r, ns, opts, cont, &page, st);
		pages++;
		if (ret == K8S_EGONE)
			*expired = 1;
		else if (ret == 0 && page_repeats(uids, page))
			ret = k8s_status_set(st, K8S_EINTERNAL, "k8s: a page "
			    "of the list repeats items of an earlier page: "
			    "the server did not continue where it left off",
			    NULL);
		else if (ret == 0)
			json_array_extend(list_items(list),
			    list_items(page));
	}
	if (ret < 0)
		goto out;
	if (!json_is_object(json_object_get(list, "metadata")))
		json_object_set_new(list, "metadata", json_object());
	meta = json_object_get(list, "metadata");
	if (json_object_get(meta, "continue") != NULL)
		json_object_set_new(meta, "continue", json_string(""));
	json_object_del(meta, "remainingItemCount");
	*out = list;
	list = NULL;	/* now the caller's */
out:
	json_decref(page);
	json_decref(list);
	json_decref(tokens);
	json_decref(uids);
	free(cont);
	return ret;
}

/*
 * A list, read in chunks of LIST_CHUNK items (list_pages). A continue
 * token that expires meanwhile (410: the server keeps them about five
 * minutes, until its storage compacts that version) starts the list
 * again from scratch, up to LIST_RESTARTS times.
 */
static int
rest_list(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const struct k8s_list_opts *opts, json_t **out,
    struct k8s_status *st)
{
	struct rest *rs = rest_of(api);
	json_t *list = NULL, *it;
	char *path = NULL, *msg;
	size_t i;
	int ret, restarts, expired;

	if (ns != NULL && ns[0] == '\0')
		ns = NULL;
	if (ns != NULL && bad_segment(ns))
		return bad_request(st, "a valid namespace is required");
	for (restarts = 0;; restarts++) {
		expired = 0;
		ret = list_pages(rs, r, ns, opts, &list, &expired, st);
		if (!expired)
			break;
		free(path);
		path = res_path(r, ns, NULL, 0);
		if (restarts == LIST_RESTARTS) {
			/* keep the server's Status, say what it means here */
			if (st != NULL) {
				msg = xasprintf("k8s: GET %s: the list's "
				    "continue token expired before its last "
				    "page %d times in a row, listed from the "
				    "start each time: %s", path ? path : "?",
				    restarts + 1, st->message != NULL ?
				    st->message : "410 Gone");
				free(st->message);
				st->message = msg;
			}
			break;
		}
		log_kv(LOG_INFO, "k8s: list continue token expired, listing "
		    "again from the start", "path", path ? path : "?", NULL);
		k8s_status_release(st);
	}
	if (ret < 0)
		goto out;
	/*
	 * Built-in kinds (Secrets) come without apiVersion and kind in
	 * their items; make the list look the same whatever the kind.
	 */
	msg = xasprintf("%sList", r->kind);
	if (json_object_get(list, "kind") == NULL)
		json_object_set_new(list, "kind", json_string(msg));
	free(msg);
	if (json_object_get(list, "apiVersion") == NULL)
		json_object_set_new(list, "apiVersion",
		    json_string(k8s_api_version(r)));
	json_array_foreach(list_items(list), i, it) {
		if (!json_is_object(it))
			continue;
		if (json_object_get(it, "apiVersion") == NULL)
			json_object_set_new(it, "apiVersion",
			    json_string(k8s_api_version(r)));
		if (json_object_get(it, "kind") == NULL)
			json_object_set_new(it, "kind", json_string(r->kind));
	}
	if (out != NULL) {
		*out = list;
		list = NULL;	/* now the caller's */
	}
out:
	json_decref(list);
	free(path);
	return ret;
}

static int
rest_create(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const json_t *obj, json_t **out, struct k8s_status *st)
{
	struct rest *rs = rest_of(api);
	struct req rq = { .verb = "create", .r = r, .method = "POST",
	    .max = MAX_BODY, .ctype = "application/json" };
	int ret;

	if (!json_is_object(obj))
		return bad_request(st, "the object is not a JSON object");
	if ((ns == NULL || ns[0] == '\0') && r->namespaced)
		ns = k8s_meta_str(obj, "namespace");
	ns = object_ns(rs, r, ns);
	ret = object_req(rs, &rq, r, ns, NULL, 0, st);
	if (ret == 0) {
		rq.body = object_body(r, ns, obj, &rq.body_len);
		ret = rest_call(rs, &rq, out, st);
	}
	req_release(&rq);
	return ret;
}

static int
put_object(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, const json_t *obj, int status,
    json_t **out, struct k8s_status *st)
{
	struct rest *rs = rest_of(api);
	struct req rq = { .verb = "update", .r = r, .status = status,
	    .method = "PUT", .max = MAX_BODY, .ctype = "application/json" };
	int ret;

	if (!json_is_object(obj))
		return bad_request(st, "the object is not a JSON object");
	if (name == NULL)
		name = k8s_meta_str(obj, "name");
	if (name == NULL)
		return bad_request(st, "a name is required");
	ns = object_ns(rs, r, ns);
	ret = object_req(rs, &rq, r, ns, name, status, st);
	if (ret == 0) {
		rq.body = object_body(r, ns, obj, &rq.body_len);
		ret = rest_call(rs, &rq, out, st);
	}
	req_release(&rq);
	return ret;
}

static int
rest_update(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, const json_t *obj, json_t **out,
    struct k8s_status *st)
{
	return put_object(api, r, ns, name, obj, 0, out, st);
}

static int
rest_update_status(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, const json_t *obj, json_t **out,
    struct k8s_status *st)
{
	return put_object(api, r, ns, name, obj, 1, out, st);
}

static int
rest_patch(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, int status, const json_t *patch,
    json_t **out, struct k8s_status *st)
{
	struct rest *rs = rest_of(api);
	struct req rq = { .verb = "patch", .r = r, .status = status,
	    .method = "PATCH", .max = MAX_BODY,
	    .ctype = "application/merge-patch+json" };
	int ret;

	if (name == NULL)
		return bad_request(st, "a name is required");
	if (!json_is_object(patch))
		return bad_request(st, "the patch is not a JSON object");
	ret = object_req(rs, &rq, r, ns, name, status, st);
	if (ret == 0) {
		rq.body = json_dumps(patch, JSON_COMPACT);
		if (rq.body == NULL)
			rq.body = xstrdup("{}");
		rq.body_len = strlen(rq.body);
		ret = rest_call(rs, &rq, out, st);
	}
	req_release(&rq);
	return ret;
}

static int
rest_del(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, enum k8s_propagation policy,
    const char *uid, const char *rv, json_t **out, struct k8s_status *st)
{
	struct rest *rs = rest_of(api);
	struct req rq = { .verb = "delete", .r = r, .method = "DELETE",
	    .max = MAX_BODY, .ctype = "application/json", .keep_status = 1 };
	json_t *opts, *pre;
	int ret;

	if (name == NULL)
		return bad_request(st, "a name is required");
	ret = object_req(rs, &rq, r, ns, name, 0, st);
	if (ret == 0) {
		opts = json_pack("{s:s}", "propagationPolicy",
		    k8s_propagation_name(policy));
		if (uid != NULL || rv != NULL) {
			pre = json_object();
			if (uid != NULL)
				json_object_set_new(pre, "uid",
				    json_string(uid));
			if (rv != NULL)
				json_object_set_new(pre, "resourceVersion",
				    json_string(rv));
			json_object_set_new(opts, "preconditions", pre);
		}
		rq.body = json_dumps(opts, JSON_COMPACT);	/* never NULL */
		json_decref(opts);
		rq.body_len = strlen(rq.body);
		ret = rest_call(rs, &rq, out, st);
	}
	req_release(&rq);
	return ret;
}

/* ---- watch: the line parser ---- */

static int
parse_fail(struct k8s_status *st, const char *msg)
{
	return k8s_status_set(st, K8S_EINTERNAL, msg, NULL);
}

/*
 * Parse one line of a watch stream: 1 with *out filled (the object is a
 * new reference), 0 for a blank line, or a negative error with st filled:
 * the Status of an ERROR event (K8S_EGONE for 410), K8S_EINTERNAL for a
 * malformed line. Not in the header: the fuzz target calls it.
 */
int
k8s_rest_watch_parse_line(const char *line, size_t len,
    struct k8s_event *out, struct k8s_status *st)
{
	static const struct {
		const char *name;
		enum k8s_event_type type;
	} types[] = {
		{ "ADDED", K8S_ADDED },
		{ "MODIFIED", K8S_MODIFIED },
		{ "DELETED", K8S_DELETED },
		{ "BOOKMARK", K8S_BOOKMARK },
		{ "ERROR", K8S_ERROR },
	};
	json_error_t jerr;
	json_t *j = NULL, *obj;
	const char *type;
	size_t i;
	int ret, code;

	while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' ' ||
	    line[len - 1] == '\t' || line[len - 1] == '\n'))
		len--;
	if (len == 0)
		return 0;
	j = json_loadb(line, len, 0, &jerr);
	if (j == NULL) {
		/* jerr.text may quote the input, which may be a Secret */
		char *msg = xasprintf("k8s: watch: an event is not valid "
		    "JSON (column %d)", jerr.column);

		ret = parse_fail(st, msg);
		free(msg);
		goto out;
	}
	type = json_string_value(json_object_get(j, "type"));
	obj = json_object_get(j, "object");
	if (!json_is_object(j) || type == NULL || !json_is_object(obj)) {
		ret = parse_fail(st, "k8s: watch: an event has no type or "
		    "object");
		goto out;
	}
	for (i = 0; i < ARRAY_SIZE(types); i++)
		if (strcmp(type, types[i].name) == 0)
			break;
	if (i == ARRAY_SIZE(types)) {
		ret = parse_fail(st, "k8s: watch: an event has an unknown "
		    "type");
		goto out;
	}
	if (types[i].type == K8S_ERROR) {
		code = (int)json_integer_value(json_object_get(obj, "code"));
		if (code < 400 || code > 599)
			code = 500;
		ret = status_from_obj(st, code, obj);
		goto out;
	}
	out->type = types[i].type;
	out->object = json_incref(obj);
	out->rv = k8s_resource_version(obj);
	ret = 1;
out:
	json_decref(j);
	return ret;
}

/* ---- watch: the reader thread ---- */

static void
deadline_in(struct timespec *ts, int64_t ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += (time_t)(ms / 1000);
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static int
watch_stopping(struct rest_watch *w)
{
	int stop;

	pthread_mutex_lock(&w->lock);
	stop = w->stop;
	pthread_mutex_unlock(&w->lock);
	return stop;
}

/* Sleep ms unless the watch is stopped first; 1 when stopping. */
static int
watch_sleep(struct rest_watch *w, int64_t ms)
{
	struct timespec ts;
	int stop;

	deadline_in(&ts, ms);
	pthread_mutex_lock(&w->lock);
	while (!w->stop)
		if (pthread_cond_timedwait(&w->space, &w->lock, &ts) ==
		    ETIMEDOUT)
			break;
	stop = w->stop;
	pthread_mutex_unlock(&w->lock);
	return stop;
}

/*
 * Append an event to the queue, waiting while it is full (backpressure:
 * curl stops reading meanwhile). -1 when the watch is being freed.
 */
static int
watch_push(struct rest_watch *w, const struct k8s_event *ev, size_t size)
{
	struct wev *e;

	pthread_mutex_lock(&w->lock);
	while (!w->stop &&
	    (w->count >= QUEUE_MAX || w->bytes >= QUEUE_MAX_BYTES))
		pthread_cond_wait(&w->space, &w->lock);
	if (w->stop) {
		pthread_mutex_unlock(&w->lock);
		return -1;
	}
	e = xcalloc(1, sizeof(*e));
	e->ev = *ev;
	e->size = size;
	if (w->tail != NULL)
		w->tail->next = e;
	else
		w->head = e;
	w->tail = e;
	w->count++;
	w->bytes += size;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* The stream itself ends the watch (ERROR event, bad line). */
static void
watch_fatal(struct rest_watch *w, int err, struct k8s_status *st)
{
	if (w->fatal) {
		k8s_status_release(st);
		return;
	}
	w->fatal = 1;
	w->fatal_err = err;
	w->fatal_st = *st;
	memset(st, 0, sizeof(*st));	/* now owned by w */
}

/*
 * Whether resourceVersion a is past b (NULL: none yet). Versions are
 * opaque, but kube-apiserver's are etcd revisions, decimal: those compare
 * as numbers; any other is taken as newer.
 */
static int
rv_past(const char *a, const char *b)
{
	size_t la, lb;

	if (b == NULL)
		return 1;
	while (*a == '0' && a[1] != '\0')
		a++;
	while (*b == '0' && b[1] != '\0')
		b++;
	la = strspn(a, "0123456789");
	lb = strspn(b, "0123456789");
	if (la == 0 || lb == 0 || a[la] != '\0' || b[lb] != '\0')
		return 1;
	if (la != lb)
		return la > lb;
	return strcmp(a, b) > 0;
}

/* One complete line of the stream; -1 ends the transfer. */
static int
watch_line(struct rest_watch *w, const char *s, size_t len)
{
	struct k8s_event ev;
	struct k8s_status st;
	const char *rv;
	char *rvcopy;
	int r;

	memset(&st, 0, sizeof(st));
	memset(&ev, 0, sizeof(ev));
	r = k8s_rest_watch_parse_line(s, len, &ev, &st);
	if (r == 0)
		return 0;
	if (r < 0) {
		watch_fatal(w, r, &st);
		return -1;
	}
	/*
	 * The resume point only moves forward: the synthetic ADDED events
	 * of a watch without a resourceVersion come in name order, and
	 * show the state as of the newest of them, not as of the last.
	 */
	rv = k8s_meta_str(ev.object, "resourceVersion");
	rvcopy = rv != NULL && rv[0] != '\0' && rv_past(rv, w->rv) ?
	    xstrdup(rv) : NULL;
	if (watch_push(w, &ev, len) < 0) {
		json_decref(ev.object);
		free(rvcopy);
		return -1;
	}
	/* ev.object is now owned by the queue */
	if (rvcopy != NULL) {
		free(w->rv);
		w->rv = rvcopy;
		w->nforward++;
	}
	return 0;
}

static size_t
watch_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct rest_watch *w = arg;
	struct k8s_status st;
	size_t n = size * nmemb, off = 0, seg, room;
	const char *nl;
	int r;

	if (w->code != 200) {
		/* an error answer: keep what fits for its Status */
		room = w->errbody.max - w->errbody.len;
		buf_add(&w->errbody, data, n < room ? n : room);
		return n;
	}
	while (off < n) {
		nl = memchr(data + off, '\n', n - off);
		if (nl == NULL) {
			if (buf_add(&w->line, data + off, n - off) < 0)
				goto toolong;
			break;
		}
		seg = (size_t)(nl - (data + off));
		if (w->line.len > 0) {
			if (buf_add(&w->line, data + off, seg) < 0)
				goto toolong;
			r = watch_line(w, w->line.data, w->line.len);
			if (w->line.cap > MIB)
				buf_release(&w->line);
			else
				buf_reset(&w->line);
		} else
			r = watch_line(w, data + off, seg);
		if (r < 0)
			return 0;
		off += seg + 1;
	}
	return n;
toolong:
	memset(&st, 0, sizeof(st));
	k8s_status_set(&st, K8S_EINTERNAL, "k8s: watch: an event is larger "
	    "than 16 MiB", NULL);
	watch_fatal(w, K8S_EINTERNAL, &st);
	return 0;
}

static size_t
watch_header(char *data, size_t size, size_t nmemb, void *arg)
{
	struct rest_watch *w = arg;
	size_t n = size * nmemb;
	long code = 0;
	int64_t s;

	s = retry_after(data, n);
	if (s >= 0)
		w->retry_after_ms = s * 1000;
	if (n > 0 && n <= 2 && (data[0] == '\r' || data[0] == '\n')) {
		/* end of the headers of a response */
		curl_easy_getinfo(w->h, CURLINFO_RESPONSE_CODE, &code);
		if (code >= 200) {
			w->code = code;
			/* a watch's time is the wait for its answer */
			w->timed = 1;
			count_request("watch", w->r->plural, "", code,
			    curl_seconds(w->h, CURLINFO_STARTTRANSFER_TIME_T));
			if (code == 200) {
				pthread_mutex_lock(&w->lock);
				w->started = 1;
				pthread_cond_broadcast(&w->cond);
				pthread_mutex_unlock(&w->lock);
			}
		}
	}
	return n;
}

/* One connection of the watch, until it ends; the curl result. */
static CURLcode
watch_connect(struct rest_watch *w, char *errbuf)
{
	struct rest *rs = w->rs;
	struct curl_slist *hdrs;
	struct buf url;
	CURLMsg *msg;
	CURLcode rc = CURLE_OK;
	int running = 1, left;

	w->code = 0;
	w->timed = 0;
	w->nforward = 0;
	w->retry_after_ms = -1;
	buf_reset(&w->line);
	buf_reset(&w->errbody);
	buf_init(&url, 2 * MAX_PATH);
	buf_printf(&url, "%s%s", rs->base, w->query);
	if (w->rv != NULL) {
		buf_addstr(&url, "&resourceVersion=");
		add_escaped(&url, w->rv);
	}

	curl_easy_reset(w->h);
	hdrs = setup_common(rs, w->h, "Accept: application/json",
	    &w->auth_gen);
	errbuf[0] = '\0';
	curl_easy_setopt(w->h, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(w->h, CURLOPT_URL, url.data);
	curl_easy_setopt(w->h, CURLOPT_HTTPGET, 1L);
	curl_easy_setopt(w->h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(w->h, CURLOPT_WRITEFUNCTION, watch_write);
	curl_easy_setopt(w->h, CURLOPT_WRITEDATA, w);
	curl_easy_setopt(w->h, CURLOPT_HEADERFUNCTION, watch_header);
	curl_easy_setopt(w->h, CURLOPT_HEADERDATA, w);
	/* no total timeout: a quiet stream longer than this is dead */
	curl_easy_setopt(w->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(w->h, CURLOPT_LOW_SPEED_TIME,
	    (long)(w->timeout_s + WATCH_QUIET_S));

	if (curl_multi_add_handle(w->multi, w->h) != CURLM_OK) {
		rc = CURLE_FAILED_INIT;
		goto out;
	}
	while (running) {
		if (curl_multi_perform(w->multi, &running) != CURLM_OK) {
			rc = CURLE_FAILED_INIT;
			break;
		}
		if (!running)
			break;
		if (watch_stopping(w)) {
			rc = CURLE_ABORTED_BY_CALLBACK;
			break;
		}
		if (curl_multi_poll(w->multi, NULL, 0, 1000, NULL) !=
		    CURLM_OK) {
			rc = CURLE_FAILED_INIT;
			break;
		}
	}
	while ((msg = curl_multi_info_read(w->multi, &left)) != NULL)
		if (msg->msg == CURLMSG_DONE)
			rc = msg->data.result;
	/* no answer, and not because watch_free stopped it: an error */
	if (!w->timed && rc != CURLE_ABORTED_BY_CALLBACK)
		count_request("watch", w->r->plural, "", 0,
		    curl_seconds(w->h, CURLINFO_TOTAL_TIME_T));
	curl_multi_remove_handle(w->multi, w->h);
out:
	curl_easy_setopt(w->h, CURLOPT_HTTPHEADER, NULL);
	free_headers(hdrs);
	buf_release(&url);
	return rc;
}

static int
watch_transport_error(struct rest_watch *w, struct k8s_status *st,
    CURLcode rc, const char *errbuf)
{
	char *path = path_shown(w->query), *msg;
	char *why = transport_why(w->rs, errbuf, rc);
	int err = rc == CURLE_OPERATION_TIMEDOUT ? K8S_ETIMEOUT :
	    K8S_EUNAVAILABLE;

	msg = xasprintf("k8s: watch %s%s: %s", w->rs->shown, path, why);
	free(why);
	k8s_status_set(st, err, msg, NULL);
	st->code = err == K8S_ETIMEOUT ? 504 : 503;
	free(msg);
	free(path);
	return err;
}

static void *
watch_main(void *arg)
{
	struct rest_watch *w = arg;
	struct rest *rs = w->rs;
	char errbuf[CURL_ERROR_SIZE];
	struct k8s_status st;
	char *path;
	CURLcode rc;
	int64_t t0, wait;
	int failures = 0, err = 0, retry;

	thread_name("kube-watch");
	memset(&st, 0, sizeof(st));
	for (;;) {
		if (watch_stopping(w))
			break;
		t0 = now_mono_ms();
		rc = watch_connect(w, errbuf);
		if (watch_stopping(w))
			break;
		if (w->fatal) {
			err = w->fatal_err;
			st = w->fatal_st;
			memset(&w->fatal_st, 0, sizeof(w->fatal_st));
			break;
		}
		if (w->code == 200) {
			/*
			 * The stream ran and ended (timeoutSeconds, a reset
			 * or the low-speed guard): go on from the last
			 * resourceVersion, at once unless it keeps ending
			 * before anything new arrives (events older than the
			 * resume point, sent again, are no progress).
			 */
			if (w->nforward > 0 || now_mono_ms() - t0 >= 1000)
				failures = 0;
			else if (++failures > rs->cfg.max_retries) {
				err = rc != CURLE_OK ?
				    watch_transport_error(w, &st, rc, errbuf) :
				    k8s_status_set(&st, K8S_EUNAVAILABLE,
				    "k8s: watch: the server keeps closing the "
				    "stream", NULL);
				break;
			}
			log_kv(LOG_DEBUG, "k8s: watch reconnecting",
			    "resource_version", w->rv, "error",
			    rc != CURLE_OK ? curl_easy_strerror(rc) : NULL,
			    NULL);
			if (failures > 0 && watch_sleep(w,
			    backoff_ms(rs, failures - 1, -1)))
				break;
			count_restart(w->r, rc == CURLE_OK ? "closed" :
			    rc == CURLE_OPERATION_TIMEDOUT ? "timeout" :
			    "error");
			continue;
		}
		if (w->code == 401)
			credentials_refused(rs, w->auth_gen);
		if (w->code != 0)
			retry = w->code == 429 ||
			    (w->code >= 500 && w->code != 501);
		else
			retry = curl_transient(rc);
		if (retry)
			failures++;
		if (!retry || failures > rs->cfg.max_retries) {
			if (w->code != 0) {
				path = path_shown(w->query);
				err = http_error(&st, "GET", path, w->code,
				    w->errbody.data, w->errbody.len);
				free(path);
			} else
				err = watch_transport_error(w, &st, rc,
				    errbuf);
			break;
		}
		/*
		 * the server's Retry-After in full, not cut to the cap of a
		 * call's waits: this thread holds no worker, watch_free wakes
		 * it, and ending the watch would have it opened again sooner
		 */
		if (w->retry_after_ms >= 0)
			wait = w->retry_after_ms < WATCH_RETRY_AFTER_MAX_MS ?
			    w->retry_after_ms : WATCH_RETRY_AFTER_MAX_MS;
		else
			wait = backoff_ms(rs, failures - 1, -1);
		if (watch_sleep(w, wait))
			break;
		count_restart(w->r, w->code == 429 ? "throttled" : "error");
	}
	/* the caller lists and watches again from scratch */
	if (err == K8S_EGONE)
		count_restart(w->r, "gone");
	pthread_mutex_lock(&w->lock);
	w->done = 1;
	w->err = err;
	w->est = st;
	w->est_set = err < 0;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* ---- watch: the ops ---- */

static void
rest_watch_free(struct k8s_watch *kw)
{
	struct rest_watch *w = (struct rest_watch *)kw;
	struct wev *e, *next;

	if (w == NULL)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = 1;
	pthread_cond_broadcast(&w->space);
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	if (w->multi != NULL)
		curl_multi_wakeup(w->multi);
	if (w->thread_started)
		pthread_join(w->thread, NULL);
	for (e = w->head; e != NULL; e = next) {
		next = e->next;
		json_decref(e->ev.object);
		free(e);
	}
	if (w->est_set)
		k8s_status_release(&w->est);
	k8s_status_release(&w->fatal_st);
	buf_release(&w->line);
	buf_release(&w->errbody);
	if (w->h != NULL)
		curl_easy_cleanup(w->h);
	if (w->multi != NULL)
		curl_multi_cleanup(w->multi);
	pthread_cond_destroy(&w->cond);
	pthread_cond_destroy(&w->space);
	pthread_mutex_destroy(&w->lock);
	free(w->query);
	free(w->rv);
	free(w);
}

static int
rest_watch_next(struct k8s_watch *kw, int timeout_ms, struct k8s_event *ev,
    struct k8s_status *st)
{
	struct rest_watch *w = (struct rest_watch *)kw;
	struct timespec ts;
	struct wev *e;
	int ret;

	if (timeout_ms > 0)
		deadline_in(&ts, timeout_ms);
	pthread_mutex_lock(&w->lock);
	while (w->head == NULL && !w->done && timeout_ms != 0) {
		if (timeout_ms < 0)
			pthread_cond_wait(&w->cond, &w->lock);
		else if (pthread_cond_timedwait(&w->cond, &w->lock, &ts) ==
		    ETIMEDOUT)
			break;
	}
	if (w->head != NULL) {
		e = w->head;
		w->head = e->next;
		if (w->head == NULL)
			w->tail = NULL;
		w->count--;
		w->bytes -= e->size;
		pthread_cond_signal(&w->space);
		pthread_mutex_unlock(&w->lock);
		*ev = e->ev;	/* the object is now the caller's */
		free(e);
		return 1;
	}
	if (!w->done) {
		pthread_mutex_unlock(&w->lock);
		return 0;
	}
	ret = w->err < 0 ? w->err : K8S_EUNAVAILABLE;
	if (st != NULL && w->est_set) {
		k8s_status_release(st);
		*st = w->est;
		memset(&w->est, 0, sizeof(w->est));
		w->est_set = 0;		/* now the caller's */
	} else
		k8s_status_set(st, ret, "k8s: the watch has ended", NULL);
	pthread_mutex_unlock(&w->lock);
	return ret;
}

static int
rest_watch(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const struct k8s_list_opts *opts,
    struct k8s_watch **out, struct k8s_status *st)
{
	struct rest *rs = rest_of(api);
	struct rest_watch *w = NULL;
	struct timespec ts;
	uint32_t rnd = 0;
	int ret = K8S_EINTERNAL, sync = 0;

	if (ns != NULL && ns[0] == '\0')
		ns = NULL;
	if (ns != NULL && bad_segment(ns))
		return bad_request(st, "a valid namespace is required");
	zero_restarts(r);
	w = xcalloc(1, sizeof(*w));
	w->w.api = api;
	w->rs = rs;
	w->r = r;
	pthread_mutex_init(&w->lock, NULL);
	time_cond_init(&w->cond);
	time_cond_init(&w->space);
	buf_init(&w->line, MAX_LINE);
	buf_init(&w->errbody, MAX_ERR_BODY);
	(void)random_bytes(&rnd, sizeof(rnd));
	/* spread reconnects, as client-go's reflector does */
	w->timeout_s = WATCH_TIMEOUT_S + (int)(rnd % WATCH_TIMEOUT_S);
	w->query = collection_query(r, ns, opts, 1, w->timeout_s, NULL);
	if (w->query == NULL) {
		ret = bad_request(st, "the request path is too long");
		goto out;
	}
	if (opts != NULL && opts->resource_version != NULL &&
	    opts->resource_version[0] != '\0')
		w->rv = xstrdup(opts->resource_version);
	w->multi = curl_multi_init();
	w->h = handle_new(rs);
	if (w->multi == NULL || w->h == NULL) {
		ret = k8s_status_set(st, K8S_EINTERNAL,
		    "k8s: cannot create a curl handle", NULL);
		goto out;
	}
	if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
		ret = k8s_status_set(st, K8S_EINTERNAL,
		    "k8s: cannot start a watch thread", NULL);
		goto out;
	}
	w->thread_started = 1;

	/*
	 * Wait for the answer so that a refused watch (401, 403, a bad
	 * selector, no server) fails here; a 410 is reported by next().
	 */
	deadline_in(&ts, (int64_t)rs->cfg.connect_timeout_ms +
	    rs->cfg.timeout_ms);
	pthread_mutex_lock(&w->lock);
	while (!w->started && !w->done)
		if (pthread_cond_timedwait(&w->cond, &w->lock, &ts) ==
		    ETIMEDOUT)
			break;
	if (w->done && w->head == NULL && w->err != K8S_EGONE) {
		sync = 1;
		ret = w->err < 0 ? w->err : K8S_EUNAVAILABLE;
		if (st != NULL && w->est_set) {
			k8s_status_release(st);
			*st = w->est;
			memset(&w->est, 0, sizeof(w->est));
			w->est_set = 0;	/* now the caller's */
		} else
			k8s_status_set(st, ret, "k8s: the watch has ended",
			    NULL);
	}
	pthread_mutex_unlock(&w->lock);
	if (sync)
		goto out;
	*out = &w->w;
	w = NULL;	/* now the caller's */
	ret = 0;
out:
	rest_watch_free(w ? &w->w : NULL);
	return ret;
}

/* ---- open and free ---- */

static void
rest_free(struct k8s_api *api)
{
	struct rest *rs = rest_of(api);
	size_t i;

	if (rs == NULL)
		return;
	for (i = 0; i < rs->npool; i++)
		curl_easy_cleanup(rs->pool[i]);
	if (rs->share != NULL)
		curl_share_cleanup(rs->share);
	for (i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_destroy(&rs->share_lock[i]);
	pthread_mutex_destroy(&rs->pool_lock);
	pthread_mutex_destroy(&rs->token_lock);
	k8s_cluster_release(&rs->c);
	proxy_release(&rs->proxy);
	free_secret(rs->token);
	free_secret(rs->exec_token);
	free(rs->base);
	free(rs->shown);
	free(rs->host_hdr);
	curl_slist_free_all(rs->connect_to);
	free(rs);
}

static const struct k8s_ops rest_ops = {
	.name = "rest",
	.get = rest_get,
	.list = rest_list,
	.create = rest_create,
	.update = rest_update,
	.update_status = rest_update_status,
	.patch = rest_patch,
	.del = rest_del,
	.watch = rest_watch,
	.watch_next = rest_watch_next,
	.watch_free = rest_watch_free,
	.free = rest_free,
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void
curl_init(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* A file the client needs must be readable now, not at the first call. */
static int
check_file(const char *what, const char *path, char **cause)
{
	if (path == NULL || access(path, R_OK) == 0)
		return 0;
	*cause = xasprintf("k8s: %s '%s': %s", what, path, strerror(errno));
	return -1;
}

static void
copy_cluster(struct k8s_cluster *d, const struct k8s_cluster *s)
{
	d->server = dup_or_null(s->server);
	d->namespace = xstrdup(s->namespace != NULL && s->namespace[0] ?
	    s->namespace : "default");
	d->ca_file = dup_or_null(s->ca_file);
	d->ca_data = dup_or_null(s->ca_data);
	d->insecure = s->insecure;
	d->tls_server_name = s->tls_server_name != NULL &&
	    s->tls_server_name[0] != '\0' ? xstrdup(s->tls_server_name) : NULL;
	d->proxy_url = s->proxy_url != NULL && s->proxy_url[0] != '\0' ?
	    xstrdup(s->proxy_url) : NULL;
	d->cert_file = dup_or_null(s->cert_file);
	d->key_file = dup_or_null(s->key_file);
	d->cert_data = dup_or_null(s->cert_data);
	d->key_data = dup_or_null(s->key_data);
	d->token = s->token != NULL && s->token[0] != '\0' ?
	    xstrdup(s->token) : NULL;
	d->token_file = dup_or_null(s->token_file);
	d->username = dup_or_null(s->username);
	d->password = dup_or_null(s->password);
	d->exec_argv = k8s_strv_dup(s->exec_argv);
	d->exec_env = k8s_strv_dup(s->exec_env);
	d->exec_api_version = dup_or_null(s->exec_api_version);
	d->exec_hint = dup_or_null(s->exec_hint);
	d->exec_cluster_info = s->exec_cluster_info;
}

static void
set_blob(struct curl_blob *b, const char *data)
{
	b->data = (void *)(uintptr_t)data;
	b->len = data != NULL ? strlen(data) : 0;
	/* the data lives as long as the client and its handles */
	b->flags = CURL_BLOB_NOCOPY;
}

/* Open a REST client for the API server of cluster c. */
int
k8s_rest_open(struct k8s_api **out, const struct k8s_cluster *c,
    const struct k8s_rest_config *cfg, char **cause)
{
	struct rest *rs = NULL;
	CURLU *u = NULL;
	char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL;
	char *user = NULL, *query = NULL, *ct, *why = NULL;
	size_t i, plen;
	int ret = -1, https;

	pthread_once(&curl_once, curl_init);
	pthread_once(&metrics_once, metrics_init);
	if (curl_init_rc != CURLE_OK) {
		*cause = xasprintf("k8s: curl_global_init: %s",
		    curl_easy_strerror(curl_init_rc));
		goto out;
	}
	if (c == NULL || c->server == NULL || c->server[0] == '\0') {
		*cause = xstrdup("k8s: no API server given");
		goto out;
	}
	u = curl_url();
	if (u == NULL || curl_url_set(u, CURLUPART_URL, c->server, 0) !=
	    CURLUE_OK ||
	    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) !=
	    CURLUE_OK ||
	    curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK) {
		/* not echoed: it might carry a password */
		*cause = xstrdup("k8s: the API server URL is not valid");
		goto out;
	}
	if (curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK) {
		*cause = xstrdup("k8s: the API server URL must not carry "
		    "credentials");
		goto out;
	}
	if (curl_url_get(u, CURLUPART_QUERY, &query, 0) == CURLUE_OK) {
		*cause = xstrdup("k8s: the API server URL must not have a "
		    "query");
		goto out;
	}
	https = strcmp(scheme, "https") == 0;
	if (!https && strcmp(scheme, "http") != 0) {
		*cause = xasprintf("k8s: API server scheme '%s' is not http "
		    "or https", scheme);
		goto out;
	}

	rs = xcalloc(1, sizeof(*rs));
	rs->api.ops = &rest_ops;
	for (i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_init(&rs->share_lock[i], NULL);
	pthread_mutex_init(&rs->pool_lock, NULL);
	pthread_mutex_init(&rs->token_lock, NULL);
	copy_cluster(&rs->c, c);

	rs->cfg.connect_timeout_ms = DEF_CONNECT_MS;
	rs->cfg.timeout_ms = DEF_TIMEOUT_MS;
	rs->cfg.max_retries = DEF_RETRIES;
	rs->cfg.max_retry_wait_ms = DEF_RETRY_WAIT_MS;
	rs->cfg.deadline_ms = DEF_DEADLINE_MS;
	if (cfg != NULL) {
		if (cfg->connect_timeout_ms > 0)
			rs->cfg.connect_timeout_ms = cfg->connect_timeout_ms;
		if (cfg->timeout_ms > 0)
			rs->cfg.timeout_ms = cfg->timeout_ms;
		/* 0 = the default, negative = no retries */
		if (cfg->max_retries != 0)
			rs->cfg.max_retries = cfg->max_retries > 0 ?
			    cfg->max_retries : 0;
		if (cfg->max_retry_wait_ms > 0)
			rs->cfg.max_retry_wait_ms = cfg->max_retry_wait_ms;
		if (cfg->deadline_ms > 0)
			rs->cfg.deadline_ms = cfg->deadline_ms;
	}

	plen = strlen(path);
	while (plen > 0 && path[plen - 1] == '/')
		path[--plen] = '\0';
	rs->shown = xasprintf("%s://%s:%s%s", scheme, host, port, path);
	if (rs->c.tls_server_name != NULL &&
	    !k8s_host_name_ok(rs->c.tls_server_name)) {
		/* it goes into the URL: "h:1/" or "u@h" would change where */
		*cause = xasprintf("k8s: tls-server-name '%s' is not a host "
		    "name", rs->c.tls_server_name);
		goto out;
	}
	if (https && rs->c.tls_server_name != NULL) {
		/*
		 * Verify (and send SNI for) tls-server-name while connecting
		 * to the server's own address, as client-go's ServerName:
		 * the URL names tls-server-name, and every connection, for
		 * any host and port, goes to the server's host and port.
		 */
		rs->base = xasprintf("https://%s:%s%s",
		    rs->c.tls_server_name, port, path);
		ct = xasprintf("::%s:%s", host, port);
		rs->connect_to = add_header(NULL, ct);
		free(ct);
		rs->host_hdr = xasprintf("Host: %s:%s", host, port);
	} else
		rs->base = xstrdup(rs->shown);

	if (rs->c.insecure && (rs->c.ca_file != NULL ||
	    rs->c.ca_data != NULL)) {
		/* as the kubeconfig loader and client-go: which one is meant? */
		*cause = xstrdup("k8s: specifying a root certificates file "
		    "with the insecure flag is not allowed");
		goto out;
	}
	if (rs->c.proxy_url != NULL &&
	    proxy_parse(rs->c.proxy_url, &rs->proxy, &why) < 0) {
		*cause = xasprintf("k8s: proxy-url %s", why);
		free(why);
		goto out;
	}
	/* hidden from logs: an upstream error may quote them */
	if (rs->c.token != NULL)
		redact_secret_add(rs->c.token, strlen(rs->c.token));
	if (rs->c.password != NULL)
		redact_secret_add(rs->c.password, strlen(rs->c.password));
	if (rs->proxy.pass != NULL)
		redact_secret_add(rs->proxy.pass, strlen(rs->proxy.pass));
	if (rs->proxy.shown != NULL)
		log_kv(LOG_INFO, "k8s: the API server through a proxy",
		    "server", rs->shown, "proxy", rs->proxy.shown, NULL);
	rs->creds = https;
	if (!https && (rs->c.token != NULL || rs->c.token_file != NULL ||
	    rs->c.username != NULL || rs->c.cert_file != NULL ||
	    rs->c.cert_data != NULL || rs->c.exec_argv != NULL))
		log_kv(LOG_WARN, "k8s: plain http: credentials are not sent",
		    "server", rs->shown, NULL);
	if (rs->c.exec_argv != NULL)
		metrics_zero("diverge_kube_exec_plugin_runs_total",
		    (const char *const[]){ "result=\"ok\"",
		    "result=\"error\"", "result=\"timeout\"", NULL });
	if (check_file("certificate-authority", rs->c.ca_file, cause) < 0 ||
	    check_file("client-certificate", rs->c.cert_file, cause) < 0 ||
	    check_file("client-key", rs->c.key_file, cause) < 0)
		goto out;
	if (rs->c.token == NULL &&
	    check_file("tokenFile", rs->c.token_file, cause) < 0)
		goto out;
	set_blob(&rs->ca_blob, rs->c.ca_data);
	set_blob(&rs->cert_blob, rs->c.cert_data);
	set_blob(&rs->key_blob, rs->c.key_data);

	rs->share = curl_share_init();
	if (rs->share == NULL) {
		*cause = xstrdup("k8s: cannot create a curl share");
		goto out;
	}
	curl_share_setopt(rs->share, CURLSHOPT_LOCKFUNC, share_lock);
	curl_share_setopt(rs->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
	curl_share_setopt(rs->share, CURLSHOPT_USERDATA, rs);
	curl_share_setopt(rs->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
	curl_share_setopt(rs->share, CURLSHOPT_SHARE,
	    CURL_LOCK_DATA_SSL_SESSION);

	*out = &rs->api;
	rs = NULL;	/* now the caller's */
	ret = 0;
out:
	rest_free(rs ? &rs->api : NULL);
	curl_free(scheme);
	curl_free(host);
	curl_free(port);
	curl_free(path);
	curl_free(user);
	curl_free(query);
	curl_url_cleanup(u);
	return ret;
}
