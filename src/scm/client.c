/*
 * The HTTP transport shared by the GitHub and GitLab clients: a pool of
 * libcurl easy handles sharing DNS and TLS sessions (a CURLSH), connect
 * and total timeouts, an optional CA bundle, and the retry policy:
 *
 *   - transport errors, 5xx (502, 503, 504 and others but 501), 429 and
 *     GitHub rate-limit 403s are retried; a request that is not
 *     idempotent (creating a comment) is retried after it went out only
 *     on 429 and 503, which say the server did not act on it;
 *   - the wait is the reply's Retry-After, else the rate-limit reset
 *     (x-ratelimit-reset on GitHub when x-ratelimit-remaining is 0,
 *     RateLimit-Reset on GitLab), else 60 s for a GitHub secondary limit
 *     without Retry-After, else exponential backoff with equal jitter;
 *   - a call retries only while its time so far (attempts and waits)
 *     and the next wait add up to at most max_wait_ms
 *     (DIVERGE_SCM_MAX_WAIT_MS, default 30 s), so that it lasts at most
 *     that and one attempt's timeout: when the next wait would not fit,
 *     a rate-limited call returns SCM_ERATELIMITED at once and
 *     the caller requeues its work instead of holding a worker, for the
 *     time that wait ends (scm_ratelimit_reset_ms);
 *   - 404 is retried only when the request asks (retry_404: 1 s, 2 s);
 *   - a rate limit belongs to the credential, not to the call that met
 *     it (GitHub counts per token or App installation, GitLab per user,
 *     and asks clients to stop while limited): the transport remembers,
 *     per credential (scm_req.cred), until when it is limited, from a
 *     rate-limited reply's wait or a reply whose remaining budget is 0
 *     (until its reset), and a call with that credential before then
 *     sends nothing and returns SCM_ERATELIMITED with that time, as if
 *     it had met the limit beyond its bounded wait. Kept in a file of
 *     the state directory (scm_http_keep_holds), so that a restart does
 *     not send what the limit forbids.
 *
 * Every attempt counts in diverge_scm_requests_total{provider,op,code};
 * the remaining rate-limit budget goes to diverge_scm_ratelimit_remaining,
 * the time the latest known limit of a provider's credentials ends to
 * diverge_scm_ratelimited_until_seconds, and the calls held back by one to
 * diverge_scm_ratelimit_held_total.
 * Credentials travel in one header line that is wiped after use and never
 * logged; errors quote the API's "message" only for replies that cannot
 * carry a secret.
 */
#include "config.h"

#include <ctype.h>
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

#include "config/config.h"
#include "scm/client.h"
#include "scm/scm.h"
#include "util/util.h"

#define USER_AGENT		"diverged/" PACKAGE_VERSION
#define POOL_MAX		8
#define BACKOFF_BASE_MS		250
#define BACKOFF_MAX_MS		8000
#define MAX_ATTEMPTS		5	/* for errors other than rate limits */
#define MAX_RL_ATTEMPTS		8	/* for rate limits */
#define SECONDARY_WAIT_MS	60000
#define MAX_MESSAGE		200	/* quoted from an error reply */
#define MAX_HEADER_WAIT_S	86400	/* Retry-After, rate-limit reset */
#define MAX_HOLDS		1024	/* limited credentials remembered */

/* A credential limited until a time. */
struct hold {
	struct hold *next;
	char *cred;		/* scm_req.cred */
	int64_t until_ms;	/* unix ms */
};

struct scm_http {
	enum scm_provider provider;
	char *holds_path;	/* where the holds are kept, or NULL */
	char *base;		/* scheme://host[:port][/prefix], no final / */
	char *origin;		/* scheme://host[:port]/ for redirect checks */
	char *ca_file;
	int insecure_http;	/* the base is http:// */
	long connect_ms;
	long timeout_ms;
	int64_t max_wait_ms;

	CURLSH *share;
	pthread_mutex_t share_lock[CURL_LOCK_DATA_LAST];

	pthread_mutex_t pool_lock;
	CURL *pool[POOL_MAX];
	size_t npool;

	pthread_mutex_t hold_lock;
	struct hold *holds;	/* credentials rate limited, or were */
	size_t nholds;
	uint64_t holds_seq;	/* snapshots taken for the file */

	/*
	 * The file is written outside hold_lock, which every call takes:
	 * save_lock orders the writers, and a snapshot older than the one
	 * written last is dropped.
	 */
	pthread_mutex_t save_lock;
	uint64_t saved_seq;
};

/* Headers of one attempt. */
struct hdrs {
	int64_t retry_after_ms;	/* -1: absent */
	int64_t rl_remaining;	/* -1: absent */
	int64_t rl_reset;	/* unix seconds, -1: absent */
	char *link_next;
	int64_t next_page;	/* x-next-page, 0: empty, -1: absent */
	int64_t total;		/* x-total, -1: absent */
	int64_t date;		/* unix seconds, 0: absent */
};

struct attempt {
	struct scm_http *h;
	struct scm_resp *rp;
	struct hdrs hd;
	int overflow;
};


/*
 * When calls give up (monotonic ms, 0: never; atomic): a stop sets it, so
 * that a worker in a slow call or a retry's wait lets the process exit
 * within its shutdown timeout. Process-wide: every transport stops at once.
 */
static int64_t give_up_at;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

/* scm_ratelimit_reset_ms: per thread, like errno */
static _Thread_local int64_t ratelimit_reset_ms;

static void
curl_init(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void
metrics_init(void)
{
	metrics_describe("diverge_scm_requests_total", METRIC_COUNTER,
	    "SCM API requests by provider, operation and HTTP code");
	metrics_describe("diverge_scm_ratelimit_remaining", METRIC_GAUGE,
	    "Requests left in the SCM API rate-limit window");
	metrics_describe("diverge_scm_ratelimited_until_seconds", METRIC_GAUGE,
	    "Unix time until which a credential of the SCM provider is rate "
	    "limited (the latest known reset)");
	metrics_describe("diverge_scm_ratelimit_held_total", METRIC_COUNTER,
	    "SCM API calls not sent because their credential was rate "
	    "limited");
}

/* ---- small helpers ---- */

/* Wipe and free a secret string. */
void
scm_secret_free(char *s)
{
	if (s == NULL)
		return;
	secure_wipe(s, strlen(s));
	free(s);
}

/* Read a secret reference, naming the key (never the value) on error. */
int
scm_secret_load(const char *provider, const char *key, const char *ref,
    char **out, char **cause)
{
	char *err = NULL, *v = NULL;
	size_t len = 0;

	if (config_secret_read(ref, &v, &len, &err) < 0) {
		*cause = xasprintf("%s: '%s': %s", provider, key,
		    err != NULL ? err : "cannot read the secret");
		free(err);
		return -1;
	}
	if (len == 0 || strlen(v) != len) {
		*cause = xasprintf("%s: '%s': the secret is empty or holds a "
		    "NUL byte", provider, key);
		secure_wipe(v, len);
		free(v);
		return -1;
	}
	*out = v;
	return 0;
}

/* Percent-encode everything but RFC 3986 unreserved characters. */
static char *
escape(const char *s, int keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";
	struct buf b;
	const unsigned char *p;
	char e[3];

	buf_init(&b, (size_t)64 << 20);
	buf_add(&b, "", 0);
	for (p = (const unsigned char *)s; *p != '\0'; p++) {
		if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		    (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' ||
		    *p == '_' ||
		    *p == '~' || (keep_slash && *p == '/')) {
			buf_add(&b, p, 1);
			continue;
		}
		e[0] = '%';
		e[1] = hex[*p >> 4];
		e[2] = hex[*p & 15];
		buf_add(&b, e, 3);
	}
	return buf_detach(&b, NULL);
}

/* Percent-encode s entirely. */
char *
scm_escape(const char *s)
{
	return escape(s, 0);
}

/* Percent-encode the segments of a path. */
char *
scm_escape_path(const char *s)
{
	return escape(s, 1);
}

/* Whether a repository file path is relative and has no . or .. part. */
int
scm_path_ok(const char *path)
{
	const char *p = path, *e;
	size_t n;

	if (path == NULL || *path == '\0' || *path == '/')
		return 0;
	for (;;) {
		e = strchr(p, '/');
		n = e != NULL ? (size_t)(e - p) : strlen(p);
		if (n == 0 || (n == 1 && p[0] == '.') ||
		    (n == 2 && p[0] == '.' && p[1] == '.'))
			return 0;
		if (e == NULL)
			return 1;
		p = e + 1;
	}
}

/* A string member as a new string. */
char *
scm_json_strdup(const json_t *obj, const char *key)
{
	const char *s = json_string_value(json_object_get(obj, key));

	return s != NULL ? xstrdup(s) : NULL;
}

/* An integer member, 0 when absent. */
int64_t
scm_json_int(const json_t *obj, const char *key)
{
	const json_t *v = json_object_get(obj, key);

	return json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
}

/* Parse a reply body. */
int
scm_json_reply(const struct scm_resp *rp, int want_object, const char *what,
    json_t **out, char **cause)
{
	json_error_t jerr;
	json_t *j = NULL;

	if (rp->body.len > 0)
		j = json_loadb(rp->body.data, rp->body.len, 0, &jerr);
	if (want_object ? !json_is_object(j) : !json_is_array(j)) {
		json_decref(j);
		*cause = xasprintf("%s: the reply is not a JSON %s", what,
		    want_object ? "object" : "array");
		return SCM_EINTERNAL;
	}
	*out = j;
	return SCM_OK;
}

/* Parse a list's page, no fuller than per_page allows. */
int
scm_json_page(const struct scm_resp *rp, const char *what, json_t **out,
    char **cause)
{
	json_t *j = NULL;
	int ret = scm_json_reply(rp, 0, what, &j, cause);

	if (ret != SCM_OK)
		return ret;
	if (json_array_size(j) > SCM_PER_PAGE) {
		/* 200 such pages could keep millions of items */
		*cause = xasprintf("%s: a page holds more than %d items",
		    what, SCM_PER_PAGE);
		json_decref(j);
		return SCM_EINTERNAL;
	}
	*out = j;
	return SCM_OK;
}

/* The page= of a Link URL's query (offset pagination), 0: none. */
static int64_t
link_page(const char *url)
{
	const char *p = strchr(url, '?');
	int64_t n = 0;

	while (p != NULL) {
		p++;
		if (strncmp(p, "page=", 5) == 0) {
			for (p += 5; *p >= '0' && *p <= '9'; p++)
				if (n < INT64_MAX / 10 - 10)
					n = n * 10 + (*p - '0');
			return *p == '\0' || *p == '&' || *p == '#' ? n : 0;
		}
		p = strchr(p, '&');
	}
	return 0;
}

/* The next page of an offset-paged list: headers first, then fullness. */
int64_t
scm_next_page(const struct scm_resp *rp, int64_t page, size_t got)
{
	int64_t next;

	if (rp->next_page >= 0)
		next = rp->next_page;
	else if (rp->link_next != NULL)
		next = link_page(rp->link_next);
	else
		next = got >= SCM_PER_PAGE ? page + 1 : 0;
	return next > page ? next : 0;
}

/* Whether a list's next page goes back to one read already: logged. */
int
scm_next_page_stale(const struct scm_resp *rp, int64_t page,
    char *const *seen, size_t nseen, const char *what)
{
	char pb[24], nb[24], *shown;
	const char *link;
	int64_t next = -1;
	size_t i;
	int stale = 0;

	if (rp->next_page >= 0) {
		next = rp->next_page;
		stale = next > 0 && next <= page;
	} else if (rp->link_next != NULL) {
		next = link_page(rp->link_next);
		stale = next > 0 && next <= page;
		for (i = 0; !stale && i < nseen; i++)
			stale = strcmp(seen[i], rp->link_next) == 0;
	}
	if (!stale)
		return 0;
	/* the query may carry a token a proxy added: the path only */
	link = rp->next_page < 0 ? rp->link_next : NULL;
	shown = link != NULL ? xstrndup(link, strcspn(link, "?#")) : NULL;
	snprintf(pb, sizeof(pb), "%" PRId64, page);
	snprintf(nb, sizeof(nb), "%" PRId64, next);
	log_kv(LOG_WARN, "scm: the next page of a list goes back to one "
	    "read already: the list is not complete, the call fails",
	    "call", what, "page", pb, "next", next > 0 ? nb : "(no page=)",
	    "link", shown, NULL);
	free(shown);
	return 1;
}

/* Parse an RFC 3339 time; -1 when malformed. */
int64_t
scm_parse_time(const char *s)
{
	int64_t t;

	return time_parse_rfc3339(s, &t) < 0 ? -1 : t;
}

/* ---- the transport ---- */

static void
share_lock(CURL *c, curl_lock_data data, curl_lock_access access, void *arg)
{
	struct scm_http *h = arg;

	(void)c;
	(void)access;
	if ((int)data >= 0 && data < CURL_LOCK_DATA_LAST)
		pthread_mutex_lock(&h->share_lock[data]);
}

static void
share_unlock(CURL *c, curl_lock_data data, void *arg)
{
	struct scm_http *h = arg;

	(void)c;
	if ((int)data >= 0 && data < CURL_LOCK_DATA_LAST)
		pthread_mutex_unlock(&h->share_lock[data]);
}

/* ---- rate limits per credential ---- */

static void
holds_free(struct hold *p)
{
	struct hold *next;

	for (; p != NULL; p = next) {
		next = p->next;
		free(p->cred);
		free(p);
	}
}

static const char *
cred_of(const struct scm_req *rq)
{
	return rq->cred != NULL ? rq->cred : "token";
}

/*
 * The holds still running, as the file keeps them, with the order of the
 * snapshot in *seq (hold_lock held; h->holds_path set).
 */
static char *
holds_snapshot(struct scm_http *h, int64_t now, uint64_t *seq)
{
	json_t *doc, *list = json_array();
	struct hold *p;
	char *text;

	for (p = h->holds; p != NULL; p = p->next)
		if (p->until_ms > now)
			json_array_append_new(list, json_pack("{s:s,s:I}",
			    "credential", p->cred, "untilMs",
			    (json_int_t)p->until_ms));
	doc = json_pack("{s:s,s:o}", "api", h->base, "holds", list);
	text = doc != NULL ? json_dumps(doc, JSON_COMPACT) : NULL;
	json_decref(doc);
	*seq = ++h->holds_seq;
	return text;
}

/*
 * Write snapshot text (freed) to h->holds_path, unless a later one is
 * written already: a whole file or none (written aside, synced, renamed
 * over). Called without hold_lock, so that calls are not held up by the
 * sync. A failure is logged; the holds stay in memory.
 */
static void
holds_save(struct scm_http *h, char *text, uint64_t seq)
{
	char *tmp;
	size_t len;
	int fd, ok;

	if (text == NULL)
		return;
	pthread_mutex_lock(&h->save_lock);
	if (seq <= h->saved_seq)
		goto out;
	h->saved_seq = seq;
	len = strlen(text);
	tmp = xasprintf("%s.tmp", h->holds_path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ok = fd >= 0 && write(fd, text, len) == (ssize_t)len &&
	    fsync(fd) == 0;
	if (fd >= 0 && close(fd) < 0)
		ok = 0;
	if (ok && rename(tmp, h->holds_path) < 0)
		ok = 0;
	if (!ok) {
		log_kv(LOG_WARN, "scm: cannot keep the rate limits in a file; "
		    "a restart will forget them", "provider", scm_http_name(h),
		    "file", h->holds_path, "error", strerror(errno), NULL);
		if (fd >= 0)
			(void)unlink(tmp);
	}
	free(tmp);
out:
	pthread_mutex_unlock(&h->save_lock);
	free(text);
}

/* Until when cred is limited (unix ms), 0 when it is not. */
static int64_t
hold_until(struct scm_http *h, const char *cred)
{
	struct hold *p;
	int64_t until = 0;

	pthread_mutex_lock(&h->hold_lock);
	for (p = h->holds; p != NULL; p = p->next)
		if (strcmp(p->cred, cred) == 0) {
			until = p->until_ms;
			break;
		}
	pthread_mutex_unlock(&h->hold_lock);
	return until > now_unix_ms() ? until : 0;
}

/*
 * Remember that cred is limited until until_ms (a later limit already
 * known stands), forgetting the holds that ended, and publish the latest
 * end among the provider's credentials.
 */
static void
hold_set(struct scm_http *h, const char *cred, int64_t until_ms)
{
	struct hold **pp, *p, *found = NULL;
	int64_t now = now_unix_ms(), latest = 0;
	char labels[64], *text = NULL;
	uint64_t seq = 0;

	pthread_mutex_lock(&h->hold_lock);
	for (pp = &h->holds; (p = *pp) != NULL;) {
		if (strcmp(p->cred, cred) == 0)
			found = p;
		else if (p->until_ms <= now) {
			*pp = p->next;
			p->next = NULL;
			holds_free(p);
			h->nholds--;
			continue;
		}
		pp = &p->next;
	}
	if (found == NULL && h->nholds < MAX_HOLDS) {
		found = xcalloc(1, sizeof(*found));
		found->cred = xstrdup(cred);
		found->next = h->holds;
		h->holds = found;
		h->nholds++;
	}
	if (found != NULL && found->until_ms < until_ms) {
		found->until_ms = until_ms;
		if (h->holds_path != NULL)
			text = holds_snapshot(h, now, &seq);
	}
	for (p = h->holds; p != NULL; p = p->next)
		if (p->until_ms > latest)
			latest = p->until_ms;
	pthread_mutex_unlock(&h->hold_lock);
	holds_save(h, text, seq);
	snprintf(labels, sizeof(labels), "provider=\"%s\"", scm_http_name(h));
	metrics_set("diverge_scm_ratelimited_until_seconds", labels,
	    (double)latest / 1000.0);
}

static int64_t reset_wait_ms(int64_t reset);

/*
 * Keep h's holds in path from now on, taking up those an earlier run
 * kept there for the same API that still run (a restart must not send
 * what a limit forbids). A file that cannot be read or parsed is ignored
 * (logged): the holds then start empty, as they did before. Called once,
 * before the transport is shared (holds_save reads holds_path unlocked).
 */
void
scm_http_keep_holds(struct scm_http *h, const char *path)
{
	json_t *doc, *v;
	json_error_t err;
	const char *cred;
	char left[32], *text = NULL;
	int64_t now = now_unix_ms(), until;
	uint64_t seq = 0;
	size_t i;

	doc = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
	if (doc == NULL && access(path, F_OK) == 0)
		log_kv(LOG_WARN, "scm: ignoring the kept rate limits",
		    "provider", scm_http_name(h), "file", path, "error",
		    err.text, NULL);
	if (doc != NULL && (!json_is_string(json_object_get(doc, "api")) ||
	    strcmp(json_string_value(json_object_get(doc, "api")),
	    h->base) != 0)) {
		/* kept for another API (the URL changed): not this one's */
		json_decref(doc);
		doc = NULL;
	}
	json_array_foreach(json_object_get(doc, "holds"), i, v) {
		cred = json_string_value(json_object_get(v, "credential"));
		until = json_integer_value(json_object_get(v, "untilMs"));
		if (cred == NULL || *cred == '\0' || strlen(cred) > 256 ||
		    until <= now)
			continue;
		/* no further ahead than a reply may ask */
		if (until > now + (int64_t)MAX_HEADER_WAIT_S * 1000)
			until = now + (int64_t)MAX_HEADER_WAIT_S * 1000;
		hold_set(h, cred, until);
		snprintf(left, sizeof(left), "%" PRId64, (until - now + 999) /
		    1000);
		log_kv(LOG_INFO, "scm: a rate limit met before the restart "
		    "still holds", "provider", scm_http_name(h), "credential",
		    cred, "seconds_left", left, NULL);
	}
	json_decref(doc);
	pthread_mutex_lock(&h->hold_lock);
	free(h->holds_path);
	h->holds_path = xstrdup(path);
	/* what ended, or was not this API's, is dropped from the file */
	if (access(path, F_OK) == 0)
		text = holds_snapshot(h, now, &seq);
	pthread_mutex_unlock(&h->hold_lock);
	holds_save(h, text, seq);
}

/*
 * A reply that is not a rate limit but leaves no budget: the credential
 * is limited until the reset. (A rate-limited reply waits as the retry
 * policy says, Retry-After first.)
 */
static void
spent(struct scm_http *h, const struct scm_req *rq, const struct hdrs *hd)
{
	if (hd->rl_remaining == 0 && hd->rl_reset > 0)
		hold_set(h, cred_of(rq), now_unix_ms() +
		    reset_wait_ms(hd->rl_reset));
}

/* DIVERGE_SCM_MAX_WAIT_MS, or the default when unset or bad. */
static int64_t
max_wait_from_env(void)
{
	const char *s = getenv(SCM_MAX_WAIT_ENV);
	char *end = NULL;
	long long v;

	if (s == NULL || *s == '\0')
		return SCM_DEF_MAX_WAIT_MS;
	v = strtoll(s, &end, 10);
	if (end == s || *end != '\0' || v < 0 || v > 3600000) {
		log_kv(LOG_WARN, "scm: ignoring a bad " SCM_MAX_WAIT_ENV,
		    "value", s, NULL);
		return SCM_DEF_MAX_WAIT_MS;
	}
	return v;
}

/* Create a transport. */
int
scm_http_new(struct scm_http **out, const struct scm_http_config *cfg,
    char **cause)
{
	const char *name = cfg->provider == SCM_GITHUB ? "github" : "gitlab";
	struct scm_http *h = NULL;
	const char *url = cfg->api_url, *host, *slash;
	size_t len, i;
	int ret = -1;

	pthread_once(&curl_once, curl_init);
	pthread_once(&metrics_once, metrics_init);
	if (curl_init_rc != CURLE_OK) {
		*cause = xasprintf("%s: curl_global_init: %s", name,
		    curl_easy_strerror(curl_init_rc));
		goto out;
	}
	if (url == NULL || *url == '\0') {
		*cause = xasprintf("%s: 'api_url' is empty", name);
		goto out;
	}
	h = xcalloc(1, sizeof(*h));
	h->provider = cfg->provider;
	for (i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_init(&h->share_lock[i], NULL);
	pthread_mutex_init(&h->pool_lock, NULL);
	pthread_mutex_init(&h->hold_lock, NULL);
	pthread_mutex_init(&h->save_lock, NULL);
	if (strncasecmp(url, "https://", 8) == 0)
		host = url + 8;
	else if (strncasecmp(url, "http://", 7) == 0) {
		host = url + 7;
		h->insecure_http = 1;
	} else {
		*cause = xasprintf("%s: 'api_url' must be an https:// (or "
		    "http://) URL", name);
		goto out;
	}
	if (*host == '\0' || *host == '/' || strpbrk(url, " \t\r\n?#") !=
	    NULL) {
		*cause = xasprintf("%s: 'api_url' is not a usable URL", name);
		goto out;
	}
	len = strlen(url);
	while (len > 0 && url[len - 1] == '/')
		len--;
	h->base = xstrndup(url, len);
	slash = strchr(host, '/');
	h->origin = slash != NULL ?
	    xstrndup(url, (size_t)(slash - url) + 1) : xasprintf("%s/", url);
	if (cfg->ca_file != NULL && *cfg->ca_file != '\0') {
		/* a CA bundle the client needs must be readable now */
		if (access(cfg->ca_file, R_OK) != 0) {
			*cause = xasprintf("%s: 'ca_file': '%s' is not "
			    "readable: %s", name, cfg->ca_file,
			    strerror(errno));
			goto out;
		}
		h->ca_file = xstrdup(cfg->ca_file);
	}
	h->connect_ms = SCM_DEF_CONNECT_MS;
	h->timeout_ms = SCM_DEF_TIMEOUT_MS;
	h->max_wait_ms = max_wait_from_env();
	h->share = curl_share_init();
	if (h->share == NULL) {
		*cause = xasprintf("%s: cannot create a curl share", name);
		goto out;
	}
	curl_share_setopt(h->share, CURLSHOPT_LOCKFUNC, share_lock);
	curl_share_setopt(h->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
	curl_share_setopt(h->share, CURLSHOPT_USERDATA, h);
	curl_share_setopt(h->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
	curl_share_setopt(h->share, CURLSHOPT_SHARE,
	    CURL_LOCK_DATA_SSL_SESSION);
	if (h->insecure_http)
		log_kv(LOG_WARN, "scm: the API URL is plain http: credentials "
		    "travel unencrypted", "provider", name, "url", h->base,
		    NULL);
	if (cfg->provider == SCM_GITLAB && (len < 7 ||
	    strncmp(h->base + strlen(h->base) - 7, "/api/v4", 7) != 0))
		log_kv(LOG_WARN, "scm: 'gitlab.api_url' does not end in "
		    "/api/v4", "url", h->base, NULL);
	*out = h;
	h = NULL;	/* now the caller's */
	ret = 0;
out:
	scm_http_free(h);
	return ret;
}

/* Free a transport and its handles. */
void
scm_http_free(struct scm_http *h)
{
	size_t i;

	if (h == NULL)
		return;
	for (i = 0; i < h->npool; i++)
		curl_easy_cleanup(h->pool[i]);
	if (h->share != NULL)
		curl_share_cleanup(h->share);
	for (i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_destroy(&h->share_lock[i]);
	pthread_mutex_destroy(&h->pool_lock);
	holds_free(h->holds);
	pthread_mutex_destroy(&h->hold_lock);
	pthread_mutex_destroy(&h->save_lock);
	free(h->holds_path);
	free(h->base);
	free(h->origin);
	free(h->ca_file);
	free(h);
}

/* The provider's name. */
const char *
scm_http_name(const struct scm_http *h)
{
	return h->provider == SCM_GITHUB ? "github" : "gitlab";
}

/* The base URL. */
const char *
scm_http_base(const struct scm_http *h)
{
	return h->base;
}

static CURL *
pool_get(struct scm_http *h)
{
	CURL *c = NULL;

	pthread_mutex_lock(&h->pool_lock);
	if (h->npool > 0)
		c = h->pool[--h->npool];
	pthread_mutex_unlock(&h->pool_lock);
	if (c == NULL)
		c = curl_easy_init();
	return c;
}

static void
pool_put(struct scm_http *h, CURL *c)
{
	if (c == NULL)
		return;
	/* forget this request's options and pointers, keep the connection */
	curl_easy_reset(c);
	pthread_mutex_lock(&h->pool_lock);
	if (h->npool < POOL_MAX) {
		h->pool[h->npool++] = c;
		c = NULL;	/* now the pool's */
	}
	pthread_mutex_unlock(&h->pool_lock);
	if (c != NULL)
		curl_easy_cleanup(c);
}

/* ---- replies ---- */

/* An empty reply bounded by SCM_MAX_BODY. */
void
scm_resp_init(struct scm_resp *rp)
{
	memset(rp, 0, sizeof(*rp));
	buf_init(&rp->body, SCM_MAX_BODY);
	rp->next_page = -1;
	rp->total = -1;
}

/* Free what a reply holds; it is empty afterwards. */
void
scm_resp_release(struct scm_resp *rp)
{
	buf_release(&rp->body);
	free(rp->link_next);
	rp->link_next = NULL;
	rp->next_page = -1;
	rp->total = -1;
	rp->date = 0;
	rp->code = 0;
}

static void
hdrs_reset(struct hdrs *hd)
{
	free(hd->link_next);
	hd->link_next = NULL;
	hd->retry_after_ms = -1;
	hd->rl_remaining = -1;
	hd->rl_reset = -1;
	hd->next_page = -1;
	hd->total = -1;
	hd->date = 0;
}

static size_t
on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	struct attempt *at = arg;
	size_t n = size * nmemb;

	if (buf_add(&at->rp->body, data, n) < 0) {
		at->overflow = 1;
		return 0;
	}
	return n;
}

/* A non-negative decimal; -1 when v is not one. */
static int64_t
parse_num(const char *v)
{
	int64_t n = 0;
	int digits = 0;

	for (; *v >= '0' && *v <= '9'; v++, digits++)
		if (n < INT64_MAX / 10 - 10)
			n = n * 10 + (*v - '0');
	return digits > 0 && *v == '\0' ? n : -1;
}

/*
 * The URL of the rel="next" entry of a Link header value:
 *   <https://host/x?page=2>; rel="next", <https://host/x?page=5>; rel="last"
 */
static char *
link_next(const char *v)
{
	const char *p = v, *lt, *gt, *end, *rel;

	while ((lt = strchr(p, '<')) != NULL) {
		gt = strchr(lt, '>');
		if (gt == NULL)
			return NULL;
		end = strchr(gt, ',');
		if (end == NULL)
			end = gt + strlen(gt);
		for (rel = gt; rel + 3 < end; rel++) {
			if (strncasecmp(rel, "rel=", 4) != 0)
				continue;
			rel += 4;
			if (*rel == '"')
				rel++;
			if ((size_t)(end - rel) >= 4 &&
			    strncasecmp(rel, "next", 4) == 0 &&
			    (rel + 4 == end || rel[4] == '"' ||
			    rel[4] == ' ' || rel[4] == ';'))
				return xstrndup(lt + 1, (size_t)(gt - lt - 1));
			break;
		}
		p = end;
	}
	return NULL;
}

static size_t
on_header(char *data, size_t size, size_t nmemb, void *arg)
{
	struct attempt *at = arg;
	struct hdrs *hd = &at->hd;
	size_t n = size * nmemb, k;
	char *line, *colon, *v, *e;
	int64_t x;
	time_t t;

	if (n >= 5 && strncmp(data, "HTTP/", 5) == 0) {
		/* a new reply (after a redirect): forget the last one's */
		hdrs_reset(hd);
		return n;
	}
	if (n > 8192)
		return n;
	line = xstrndup(data, n);
	colon = strchr(line, ':');
	if (colon == NULL)
		goto out;
	*colon = '\0';
	for (v = colon + 1; *v == ' ' || *v == '\t'; v++)
		;
	k = strlen(v);
	while (k > 0 && (v[k - 1] == '\r' || v[k - 1] == '\n' ||
	    v[k - 1] == ' ' || v[k - 1] == '\t'))
		v[--k] = '\0';
	for (e = line; *e != '\0'; e++)
		*e = (char)tolower((unsigned char)*e);
	if (strcmp(line, "retry-after") == 0) {
		x = parse_num(v);
		if (x < 0) {
			t = curl_getdate(v, NULL);
			x = t > 0 ? (int64_t)t - now_unix() : -1;
			if (t > 0 && x < 0)
				x = 0;
		}
		if (x >= 0)
			hd->retry_after_ms = (x > MAX_HEADER_WAIT_S ?
			    MAX_HEADER_WAIT_S : x) * 1000;
	} else if (strcmp(line, at->h->provider == SCM_GITHUB ?
	    "x-ratelimit-remaining" : "ratelimit-remaining") == 0)
		hd->rl_remaining = parse_num(v);
	else if (strcmp(line, at->h->provider == SCM_GITHUB ?
	    "x-ratelimit-reset" : "ratelimit-reset") == 0)
		hd->rl_reset = parse_num(v);
	else if (strcmp(line, "link") == 0) {
		free(hd->link_next);
		hd->link_next = link_next(v);
	} else if (strcmp(line, "date") == 0) {
		t = curl_getdate(v, NULL);
		hd->date = t > 0 ? (int64_t)t : 0;
	} else if (strcmp(line, "x-next-page") == 0) {
		x = parse_num(v);
		hd->next_page = x > 0 ? x : 0;
	} else if (strcmp(line, "x-total") == 0)
		hd->total = parse_num(v);
out:
	free(line);
	return n;
}

static struct curl_slist *
add_header(struct curl_slist *l, const char *line)
{
	struct curl_slist *n = curl_slist_append(l, line);

	if (n == NULL) {
		fprintf(stderr, "out of memory\n");
		abort();
	}
	return n;
}

/* Free a header list, wiping the credential lines first. */
static void
free_headers(struct curl_slist *l, const char *auth)
{
	struct curl_slist *p;

	for (p = l; p != NULL; p = p->next)
		if (auth != NULL && strcmp(p->data, auth) == 0)
			secure_wipe(p->data, strlen(p->data));
	curl_slist_free_all(l);
}

/* Whether calls must give up now (a stop's deadline has passed). */
static int
giving_up(void)
{
	int64_t at = __atomic_load_n(&give_up_at, __ATOMIC_ACQUIRE);

	return at > 0 && now_mono_ms() >= at;
}

/* libcurl's progress callback, at least once a second: abort on a stop. */
static int
on_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow,
    curl_off_t ultotal, curl_off_t ulnow)
{
	(void)arg;
	(void)dltotal;
	(void)dlnow;
	(void)ultotal;
	(void)ulnow;
	return giving_up();
}

/*
 * Wait ms before a retry, or less when a stop's deadline comes first. In
 * whole sleeps, not to a clock reading: a rate limit's hold ends at the
 * wall clock's millisecond, and a wait that ended a fraction early would
 * find the credential still held.
 */
static void
retry_wait(int64_t ms)
{
	while (ms > 0 && !giving_up()) {
		int64_t step = ms < 100 ? ms : 100;

		sleep_ms(step);
		ms -= step;
	}
}

/* Calls give up at mono_ms; see scm.h. */
void
scm_give_up_at(int64_t mono_ms)
{
	__atomic_store_n(&give_up_at, mono_ms, __ATOMIC_RELEASE);
}

/* One attempt; *sent says whether any of the request went out. */
static CURLcode
attempt_once(struct scm_http *h, CURL *c, const struct scm_req *rq,
    const char *url, struct attempt *at, char *errbuf, int *sent)
{
	struct curl_slist *hl = NULL;
	long reqsize = 0;
	const char *proto = h->insecure_http ? "http,https" : "https";
	char *accept;
	CURLcode rc;

	curl_easy_reset(c);
	curl_easy_setopt(c, CURLOPT_SHARE, h->share);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, proto);
	/*
	 * GitHub asks clients to follow redirects. libcurl drops the
	 * Authorization header when a redirect leaves the host, but not
	 * GitLab's PRIVATE-TOKEN header: GitLab replies are not followed.
	 */
	if (h->provider == SCM_GITHUB) {
		curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
		curl_easy_setopt(c, CURLOPT_MAXREDIRS, 3L);
		curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, proto);
		/* a 301 or 302 keeps the method and body (GitHub uses 307) */
		curl_easy_setopt(c, CURLOPT_POSTREDIR,
		    (long)CURL_REDIR_POST_ALL);
	}
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, h->connect_ms);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, h->timeout_ms);
	curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(c, CURLOPT_USERAGENT, USER_AGENT);
	curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");
	curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
	if (h->ca_file != NULL)
		curl_easy_setopt(c, CURLOPT_CAINFO, h->ca_file);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
	errbuf[0] = '\0';
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, at);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, at);

	if (rq->accept != NULL)
		accept = xasprintf("Accept: %s", rq->accept);
	else if (h->provider == SCM_GITHUB)
		accept = xstrdup("Accept: application/vnd.github+json");
	else
		accept = xstrdup("Accept: application/json");
	hl = add_header(hl, accept);
	free(accept);
	if (h->provider == SCM_GITHUB)
		hl = add_header(hl, "X-GitHub-Api-Version: 2022-11-28");
	if (rq->auth != NULL)
		hl = add_header(hl, rq->auth);
	if (strcmp(rq->method, "GET") == 0)
		curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
	else {
		if (strcmp(rq->method, "POST") != 0)
			curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, rq->method);
		if (rq->body != NULL || strcmp(rq->method, "DELETE") != 0) {
			curl_easy_setopt(c, CURLOPT_POST, 1L);
			curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
			    (curl_off_t)rq->body_len);
			curl_easy_setopt(c, CURLOPT_POSTFIELDS,
			    rq->body != NULL ? rq->body : "");
			/* no body: no form Content-Type from libcurl */
			hl = add_header(hl, rq->body != NULL ?
			    "Content-Type: application/json" :
			    "Content-Type:");
			hl = add_header(hl, "Expect:");
		}
	}
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);

	rc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &at->rp->code);
	curl_easy_getinfo(c, CURLINFO_REQUEST_SIZE, &reqsize);
	*sent = reqsize > 0;
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, NULL);
	free_headers(hl, rq->auth);
	return rc;
}

/* Exponential backoff with equal jitter. */
static int64_t
backoff_ms(int attempt)
{
	return backoff_jitter_ms(backoff_delay_ms(BACKOFF_BASE_MS,
	    BACKOFF_MAX_MS, (unsigned)attempt));
}

/*
 * The wait until a rate-limit reset (unix seconds) and one second more,
 * clamped to [0, MAX_HEADER_WAIT_S] before it becomes milliseconds: the
 * header is the server's to choose and must not overflow the product.
 */
static int64_t
reset_wait_ms(int64_t reset)
{
	int64_t s = reset - now_unix() + 1;

	if (s < 0)
		s = 0;
	return (s > MAX_HEADER_WAIT_S ? MAX_HEADER_WAIT_S : s) * 1000;
}

/* The "message" of a JSON error reply, or NULL. */
static const char *
reply_message(const struct scm_resp *rp, json_t **keep)
{
	json_t *j;
	const char *m;

	*keep = NULL;
	if (rp->body.len == 0 || rp->body.data == NULL)
		return NULL;
	j = json_loadb(rp->body.data, rp->body.len, 0, NULL);
	m = json_string_value(json_object_get(j, "message"));
	if (m == NULL) {
		/* GitLab also answers {"error": "..."} */
		m = json_string_value(json_object_get(j, "error"));
	}
	*keep = j;
	return m;
}

/* Whether needle occurs in s, ignoring ASCII case. */
static int
contains_nocase(const char *s, const char *needle)
{
	size_t n = strlen(needle);

	for (; *s != '\0'; s++)
		if (strncasecmp(s, needle, n) == 0)
			return 1;
	return 0;
}

/* Whether a GitHub reply is a secondary rate limit (/secondary rate/i). */
static int
is_secondary(const struct scm_resp *rp)
{
	json_t *j;
	const char *m = reply_message(rp, &j);
	int ret = m != NULL && contains_nocase(m, "secondary rate");

	json_decref(j);
	return ret;
}

/* The path of url without its query, for messages and logs. */
static char *
shown_path(const struct scm_http *h, const char *url)
{
	size_t blen = strlen(h->base);
	const char *p = url, *q;

	if (strncmp(url, h->base, blen) == 0)
		p = url + blen;
	q = strchr(p, '?');
	return q != NULL ? xstrndup(p, (size_t)(q - p)) : xstrdup(p);
}

static const char *
code_text(long code)
{
	switch (code) {
	case 400:
		return "bad request";
	case 401:
		return "unauthorized";
	case 403:
		return "forbidden";
	case 404:
		return "not found";
	case 409:
		return "conflict";
	case 410:
		return "gone";
	case 422:
		return "unprocessable";
	case 429:
		return "too many requests";
	default:
		return code >= 500 ? "server error" : "error";
	}
}

/* The error for a final non-2xx HTTP status, with its cause. */
static int
http_error(struct scm_http *h, const struct scm_req *rq, const char *shown,
    const struct scm_resp *rp, int ratelimited, char **cause)
{
	char msg[MAX_MESSAGE + 1], *red;
	const char *m = NULL;
	json_t *j = NULL;
	size_t i;
	int err;

	if (ratelimited)
		err = SCM_ERATELIMITED;
	else if (rp->code == 401)
		err = SCM_EUNAUTHORIZED;
	else if (rp->code == 403)
		err = SCM_EFORBIDDEN;
	else if (rp->code == 404 || rp->code == 410)
		err = SCM_ENOTFOUND;
	else if (rp->code >= 500)
		err = SCM_EUNAVAILABLE;
	else
		err = SCM_EINVALID;
	msg[0] = '\0';
	if (!rq->secret_reply)
		m = reply_message(rp, &j);
	/*
	 * It may quote our token (a proxy echoing the header): redacted
	 * before the cut, which could otherwise keep the token's start.
	 */
	red = redact(m);
	if (red != NULL)
		m = red;
	if (m != NULL) {
		/* printable ASCII only, bounded */
		for (i = 0; i < MAX_MESSAGE && m[i] != '\0'; i++)
			msg[i] = m[i] >= 0x20 && m[i] < 0x7f ? m[i] : '?';
		msg[i] = '\0';
	}
	free(red);
	*cause = xasprintf("%s: %s %s: HTTP %ld (%s%s%s%s)%s",
	    scm_http_name(h), rq->method, shown, rp->code, code_text(rp->code),
	    msg[0] != '\0' ? ": '" : "", msg, msg[0] != '\0' ? "'" : "",
	    ratelimited ? ": rate limited beyond the wait bound" : "");
	json_decref(j);
	return err;
}

static void
count(struct scm_http *h, const char *op, long code)
{
	char labels[160];
	char c[24];

	if (code > 0)
		snprintf(c, sizeof(c), "%ld", code);
	else
		snprintf(c, sizeof(c), "error");
	snprintf(labels, sizeof(labels),
	    "provider=\"%s\",op=\"%s\",code=\"%s\"", scm_http_name(h),
	    op != NULL ? op : "other", c);
	metrics_inc("diverge_scm_requests_total", labels, 1);
}

/* Run one call with the retry policy at the top of this file. */
int
scm_http_call(struct scm_http *h, const struct scm_req *rq,
    struct scm_resp *rp, char **cause)
{
	char errbuf[CURL_ERROR_SIZE];
	char *url = NULL, *shown = NULL, what[64], ms[32], labels[64];
	struct attempt at;
	CURL *c = NULL;
	CURLcode rc = CURLE_OK;
	int64_t t0 = now_mono_ms(), wait, until, rl_until = 0;
	int tries = 0, rl_tries = 0, n404 = 0, sent, retry, rl, secondary;
	int ret = SCM_EINTERNAL;

	memset(&at, 0, sizeof(at));
	at.h = h;
	at.rp = rp;
	hdrs_reset(&at.hd);
	ratelimit_reset_ms = 0;
	if (rq->url[0] == '/')
		url = xasprintf("%s%s", h->base, rq->url);
	else if (strncmp(rq->url, h->origin, strlen(h->origin)) == 0)
		url = xstrdup(rq->url);
	else {
		/* a Link from elsewhere: do not send our credentials there */
		*cause = xasprintf("%s: refusing a URL outside '%s'",
		    scm_http_name(h), h->origin);
		goto out;
	}
	shown = shown_path(h, url);
	c = pool_get(h);
	if (c == NULL) {
		*cause = xasprintf("%s: cannot create a curl handle",
		    scm_http_name(h));
		goto out;
	}
	for (;;) {
		scm_resp_release(rp);
		scm_resp_init(rp);
		if (rq->max > 0)
			rp->body.max = rq->max;
		until = hold_until(h, cred_of(rq));
		if (until > 0) {
			/* limited: another request now would only prolong it */
			snprintf(labels, sizeof(labels), "provider=\"%s\"",
			    scm_http_name(h));
			metrics_inc("diverge_scm_ratelimit_held_total", labels,
			    1);
			*cause = xasprintf("%s: %s %s: not sent: the credential "
			    "is rate limited for %" PRId64 " ms more",
			    scm_http_name(h), rq->method, shown,
			    until - now_unix_ms());
			ratelimit_reset_ms = until;
			ret = SCM_ERATELIMITED;
			goto out;
		}
		if (giving_up()) {
			*cause = xasprintf("%s: %s %s: not sent: stopping",
			    scm_http_name(h), rq->method, shown);
			ret = SCM_EUNAVAILABLE;
			goto out;
		}
		hdrs_reset(&at.hd);
		at.overflow = 0;
		sent = 0;
		rc = attempt_once(h, c, rq, url, &at, errbuf, &sent);
		count(h, rq->op, rc == CURLE_OK ? rp->code : 0);
		rp->date = at.hd.date;
		if (rc == CURLE_OK && at.hd.rl_remaining >= 0) {
			snprintf(labels, sizeof(labels), "provider=\"%s\"",
			    scm_http_name(h));
			metrics_set("diverge_scm_ratelimit_remaining", labels,
			    (double)at.hd.rl_remaining);
		}
		if (at.overflow) {
			*cause = xasprintf("%s: %s %s: the reply is larger "
			    "than %zu bytes", scm_http_name(h), rq->method,
			    shown, rp->body.max);
			ret = SCM_EINTERNAL;
			goto out;
		}
		if (rc == CURLE_OK && rp->code >= 200 && rp->code < 300) {
			spent(h, rq, &at.hd);
			rp->link_next = at.hd.link_next;
			at.hd.link_next = NULL;	/* now the reply's */
			rp->next_page = at.hd.next_page;
			rp->total = at.hd.total;
			ret = SCM_OK;
			goto out;
		}
		rl = 0;
		/*
		 * GitHub's limits: a secondary one says so, and a 429 that
		 * comes with GitHub's headers and budget left is one too
		 * (its docs: without Retry-After or an exhausted budget,
		 * wait a minute); a bare 429 is a proxy's
		 */
		secondary = rc == CURLE_OK && h->provider == SCM_GITHUB &&
		    (((rp->code == 403 || rp->code == 429) &&
		    is_secondary(rp)) || (rp->code == 429 &&
		    at.hd.rl_remaining > 0));
		wait = -1;
		if (rc == CURLE_ABORTED_BY_CALLBACK) {
			/* a stop: the entry is requeued, its next run retries */
			retry = 0;
		} else if (rc != CURLE_OK) {
			retry = curl_transient(rc) && (!sent ||
			    (rq->idempotent &&
			    rc != CURLE_OPERATION_TIMEDOUT)) &&
			    tries + 1 < MAX_ATTEMPTS;
		} else if (rp->code == 429 || (rp->code == 403 &&
		    h->provider == SCM_GITHUB && (at.hd.rl_remaining == 0 ||
		    secondary))) {
			rl = 1;
			retry = rl_tries + 1 < MAX_RL_ATTEMPTS;
			if (at.hd.retry_after_ms >= 0)
				wait = at.hd.retry_after_ms;
			else if (at.hd.rl_reset > 0 &&
			    (at.hd.rl_remaining == 0 ||
			    h->provider == SCM_GITLAB)) {
				/*
				 * GitLab's reset is the met limit's (a minute
				 * at most); GitHub's with budget left is the
				 * primary window's, up to an hour away: a
				 * secondary limit's minute instead
				 */
				wait = reset_wait_ms(at.hd.rl_reset);
			} else if (secondary)
				wait = SECONDARY_WAIT_MS;
			else
				wait = backoff_ms(rl_tries);
		} else if (rp->code >= 500 && rp->code != 501) {
			retry = (rq->idempotent || rp->code == 503) &&
			    tries + 1 < MAX_ATTEMPTS;
			if (at.hd.retry_after_ms >= 0)
				wait = at.hd.retry_after_ms;
		} else if (rp->code == 404 && n404 < rq->retry_404) {
			retry = 1;
			wait = (int64_t)1000 << n404;
		} else
			retry = 0;
		if (retry && wait < 0)
			wait = backoff_ms(tries);
		if (retry && now_mono_ms() - t0 + wait > h->max_wait_ms) {
			/*
			 * the wait does not fit: give up now, not later. The
			 * attempts count too: a gateway answering 502 after
			 * 29 s held a worker for minutes
			 */
			retry = 0;
		}
		/* the limit is the credential's: every call of it waits */
		if (rl) {
			rl_until = now_unix_ms() + wait;
			hold_set(h, cred_of(rq), rl_until);
		} else if (rc == CURLE_OK)
			spent(h, rq, &at.hd);
		if (!retry) {
			if (rc == CURLE_ABORTED_BY_CALLBACK) {
				*cause = xasprintf("%s: %s %s: given up: "
				    "stopping", scm_http_name(h), rq->method,
				    shown);
				ret = SCM_EUNAVAILABLE;
			} else if (rc != CURLE_OK) {
				char *why = curl_why(errbuf, rc);

				*cause = xasprintf("%s: %s %s: %s",
				    scm_http_name(h), rq->method, shown, why);
				free(why);
				ret = SCM_EUNAVAILABLE;
			} else
				ret = http_error(h, rq, shown, rp, rl, cause);
			/*
			 * the wait that did not fit: the caller's to honour,
			 * the hold's end (a later one known stands), not a
			 * clock read again after the hold was kept (its file
			 * written) and later by a millisecond or more
			 */
			if (rl) {
				until = hold_until(h, cred_of(rq));
				ratelimit_reset_ms = until > rl_until ? until :
				    rl_until;
			}
			goto out;
		}
		if (rl)
			rl_tries++;
		else if (rp->code == 404)
			n404++;
		else
			tries++;
		if (rc != CURLE_OK)
			snprintf(what, sizeof(what), "%s",
			    curl_easy_strerror(rc));
		else
			snprintf(what, sizeof(what), "HTTP %ld%s", rp->code,
			    rl ? " (rate limited)" : "");
		snprintf(ms, sizeof(ms), "%" PRId64, wait);
		log_kv(rl ? LOG_WARN : LOG_INFO, "scm: retrying request",
		    "provider", scm_http_name(h), "op", rq->op, "method",
		    rq->method, "path", shown, "error", what, "wait_ms", ms,
		    NULL);
		retry_wait(wait);
	}
out:
	hdrs_reset(&at.hd);
	pool_put(h, c);
	free(url);
	free(shown);
	return ret;
}

/* ---- the public part of scm.h ---- */

/* When the limit of this thread's last rate-limited call resets. */
int64_t
scm_ratelimit_reset_ms(void)
{
	return ratelimit_reset_ms;
}

/* Free what a struct scm_pr holds. */
void
scm_pr_release(struct scm_pr *pr)
{
	if (pr == NULL)
		return;
	free(pr->state);
	free(pr->head_ref);
	free(pr->base_ref);
	free(pr->head_sha);
	free(pr->clone_url);
	free(pr->head_clone_url);
	free(pr->author);
	free(pr->html_url);
	memset(pr, 0, sizeof(*pr));
}

/* Free an array of comments. */
void
scm_comments_free(struct scm_comment *v, size_t n)
{
	size_t i;

	if (v == NULL)
		return;
	for (i = 0; i < n; i++)
		scm_comment_release(&v[i]);
	free(v);
}

void
scm_comment_release(struct scm_comment *c)
{
	free(c->author);
	free(c->body);
	free(c->created_at);
	memset(c, 0, sizeof(*c));
}

void
scm_comment_from(const json_t *e, const char *user, const char *login,
    struct scm_comment *cm)
{
	const json_t *u = json_object_get(e, user);

	memset(cm, 0, sizeof(*cm));
	cm->id = scm_json_int(e, "id");
	cm->author = scm_json_strdup(u, login);
	cm->author_id = scm_json_int(u, "id");
	cm->body = scm_json_strdup(e, "body");
	cm->created_at = scm_json_strdup(e, "created_at");
}

int
scm_comment_reply(const struct scm_resp *rp, const char *what, int64_t id,
    void (*from)(const json_t *, struct scm_comment *),
    struct scm_comment *out, char **cause)
{
	json_t *j = NULL;
	int ret;

	memset(out, 0, sizeof(*out));
	ret = scm_json_reply(rp, 1, what, &j, cause);
	if (ret == SCM_OK) {
		from(j, out);
		if (out->id != id || (out->author == NULL &&
		    out->author_id <= 0)) {
			*cause = xasprintf("%s: the reply is not comment %"
			    PRId64 ", or names no author", what, id);
			scm_comment_release(out);
			ret = SCM_EINTERNAL;
		}
	}
	json_decref(j);
	return ret;
}

/* ---- the bot's identity, one whoami for every asker ---- */

struct scm_who {
	pthread_mutex_t mu;
	pthread_cond_t answered;
	int asking;		/* a whoami under way: the others wait */
	uint64_t gen;		/* reloads so far: an older answer is not kept */
	uint64_t answers;	/* answers kept so far */
	char *login;		/* NULL: to be asked */
	int64_t id;
};

struct scm_who *
scm_who_new(void)
{
	struct scm_who *w = xcalloc(1, sizeof(*w));

	pthread_mutex_init(&w->mu, NULL);
	time_cond_init(&w->answered);
	return w;
}

static void
who_free(struct scm_who *w)
{
	if (w == NULL)
		return;
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->answered);
	free(w->login);
	free(w);
}

/* Who the bot is: kept, or asked once for every caller. */
int
scm_client_whoami(struct scm_client *c, int fresh, char **login_out,
    int64_t *id_out, char **cause)
{
	struct scm_who *w = c->who;
	char *login = NULL;
	uint64_t gen, seen;
	int64_t id = 0;
	int ret;

	if (w == NULL)
		return c->ops->whoami(c, login_out, id_out, cause);
	pthread_mutex_lock(&w->mu);
	seen = w->answers;
	while (w->asking)
		pthread_cond_wait(&w->answered, &w->mu);
	if (w->login != NULL && (!fresh || w->answers != seen)) {
		*login_out = xstrdup(w->login);
		if (id_out != NULL)
			*id_out = w->id;
		pthread_mutex_unlock(&w->mu);
		return SCM_OK;
	}
	w->asking = 1;
	gen = w->gen;
	pthread_mutex_unlock(&w->mu);
	ret = c->ops->whoami(c, &login, &id, cause);
	pthread_mutex_lock(&w->mu);
	w->asking = 0;
	if (ret == SCM_OK && gen == w->gen) {
		/* asked with the token of now: kept for the next askers */
		free(w->login);
		w->login = xstrdup(login);
		w->id = id;
		w->answers++;
	}
	pthread_cond_broadcast(&w->answered);
	pthread_mutex_unlock(&w->mu);
	if (ret != SCM_OK)
		return ret;
	*login_out = login;	/* now the caller's */
	if (id_out != NULL)
		*id_out = id;
	return SCM_OK;
}

/* Free a client of either provider. */
void
scm_client_free(struct scm_client *c)
{
	struct scm_who *w;

	if (c == NULL || c->ops == NULL || c->ops->free == NULL)
		return;
	w = c->who;
	c->ops->free(c);
	who_free(w);
}

int
scm_client_reload(struct scm_client *c, const struct config *cfg,
    char **cause)
{
	int ret;

	if (c == NULL || c->ops == NULL || c->ops->reload == NULL)
		return 0;
	ret = c->ops->reload(c, cfg, cause);
	if (ret == 0 && c->who != NULL) {
		/* perhaps another user's token now: ask again */
		pthread_mutex_lock(&c->who->mu);
		c->who->gen++;
		free(c->who->login);
		c->who->login = NULL;
		pthread_mutex_unlock(&c->who->mu);
	}
	return ret;
}

void
scm_client_keep_holds(struct scm_client *c, const char *state_dir)
{
	char *path;

	if (c == NULL || c->ops == NULL || c->ops->keep_holds == NULL)
		return;
	path = xasprintf("%s/ratelimits-%s.json", state_dir, c->ops->name);
	c->ops->keep_holds(c, path);
	free(path);
}
