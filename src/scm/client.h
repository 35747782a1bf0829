/*
 * scm/client.h: internals shared by the SCM API clients (client.c, the
 * transport; github.c and gitlab.c, the providers). Not a public header:
 * the contract is the "SCM API clients" section of scm.h.
 */
#ifndef DIVERGE_SCM_CLIENT_H
#define DIVERGE_SCM_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "scm/scm.h"
#include "util/util.h"

/*
 * Tuning knob: the environment variable DIVERGE_SCM_MAX_WAIT_MS, read when
 * a client is created, bounds the time one call may spend before its last
 * attempt: its attempts so far and the waits between them (rate limits,
 * Retry-After, backoff); default 30000. A call whose next wait would end
 * later returns SCM_ERATELIMITED (or the error of its last attempt) at
 * once, so that the caller requeues its work.
 */
#define SCM_MAX_WAIT_ENV	"DIVERGE_SCM_MAX_WAIT_MS"
#define SCM_DEF_MAX_WAIT_MS	30000
#define SCM_DEF_CONNECT_MS	5000
#define SCM_DEF_TIMEOUT_MS	30000

#define SCM_MAX_BODY		((size_t)8 << 20)	/* one JSON reply */
#define SCM_MAX_FILE		((size_t)4 << 20)	/* read_file */
#define SCM_MAX_PAGES		200			/* list_comments */
#define SCM_PER_PAGE		100			/* the most both give */

/* The transport of one provider: base URL, TLS, handle pool, retries. */
struct scm_http;

struct scm_http_config {
	enum scm_provider provider;	/* SCM_GITHUB or SCM_GITLAB */
	const char *api_url;	/* base, e.g. https://HOST/api/v3 */
	const char *ca_file;	/* NULL: the system's bundle */
};

/*
 * A transport for cfg (the strings are copied). An http:// base is
 * accepted with a warning; other schemes are refused. -1 with *cause.
 */
int scm_http_new(struct scm_http **out, const struct scm_http_config *cfg,
    char **cause);
void scm_http_free(struct scm_http *h);
/*
 * Keep the rate limits met by h's credentials in the file path (JSON,
 * replaced whole), taking up those an earlier run kept there for the
 * same API URL: a restart then waits them out instead of sending.
 * Call it once, before h is used by several threads.
 */
void scm_http_keep_holds(struct scm_http *h, const char *path);
/* The provider's name, "github" or "gitlab". */
const char *scm_http_name(const struct scm_http *h);
/* The base URL without a trailing slash. */
const char *scm_http_base(const struct scm_http *h);

/* One call. */
struct scm_req {
	const char *op;		/* metrics label, e.g. "get_pr" */
	const char *method;	/* GET POST PUT PATCH DELETE */
	const char *url;	/* "/path?query" under the base, or absolute */
	/*
	 * A header line carrying the credential ("Authorization: Bearer
	 * x", "PRIVATE-TOKEN: x"), or NULL. Never logged, wiped after use.
	 */
	const char *auth;
	/*
	 * Whose rate limits the call spends: the credential in auth, by
	 * name ("token", "installation:8", "app"; NULL: "token"). A limit
	 * met by one call holds every call of that credential on this
	 * transport until it resets (see scm_http_call).
	 */
	const char *cred;
	const char *body;	/* JSON, or NULL */
	size_t body_len;
	const char *accept;	/* NULL: the provider's default */
	size_t max;		/* reply bound; 0: SCM_MAX_BODY */
	int idempotent;		/* 0: no retry once the request went out
				 * (except 429 and 503) */
	int retry_404;		/* 404s retried with 1 s, 2 s, ... waits */
	int secret_reply;	/* the reply holds a secret: never quote it */
};

/* One reply. */
struct scm_resp {
	long code;		/* the last attempt's HTTP status, 0: none */
	struct buf body;
	char *link_next;	/* GitHub Link rel="next" (absolute URL) */
	int64_t next_page;	/* GitLab x-next-page, 0: empty (the last
				 * page), -1: absent */
	int64_t total;		/* GitLab x-total, -1: absent */
	int64_t date;		/* the Date header (unix seconds), 0: none */
};

void scm_resp_init(struct scm_resp *rp);
void scm_resp_release(struct scm_resp *rp);

/*
 * Run rq with the retry policy (client.c) and fill rp (released first).
 * Returns SCM_OK for a 2xx, or an enum scm_err with *cause (no secret in
 * it, no reply body of a secret_reply request); rp->code then holds the
 * last HTTP status so that callers can tell a 404 from a 409. While
 * rq->cred is rate limited (a limit an earlier call of any thread met,
 * or a reply that left none of its budget), nothing is sent: the call
 * returns SCM_ERATELIMITED at once, rp->code 0, with the reset in
 * scm_ratelimit_reset_ms().
 */
int scm_http_call(struct scm_http *h, const struct scm_req *rq,
    struct scm_resp *rp, char **cause);

/* ---- helpers ---- */

/* Percent-encode s entirely ("/" too). */
char *scm_escape(const char *s);
/* Percent-encode each segment of a path, keeping the "/" separators. */
char *scm_escape_path(const char *s);
/*
 * Whether path is usable as a file in a repository: relative, no empty,
 * "." or ".." segment (so that it cannot climb out of the endpoint).
 */
int scm_path_ok(const char *path);
/* A JSON object's string member as a new string, NULL when absent. */
char *scm_json_strdup(const json_t *obj, const char *key);
/* A JSON object's integer member, 0 when absent. */
int64_t scm_json_int(const json_t *obj, const char *key);
/*
 * Parse rp's body as JSON (object when want_object, else array) into
 * *out; SCM_EINTERNAL with *cause otherwise. what names the call.
 */
int scm_json_reply(const struct scm_resp *rp, int want_object,
    const char *what, json_t **out, char **cause);
/*
 * Parse rp's body as one page of a list into *out: a JSON array of at
 * most SCM_PER_PAGE items (the most per_page gives on either API);
 * SCM_EINTERNAL with *cause otherwise. what names the call.
 */
int scm_json_page(const struct scm_resp *rp, const char *what, json_t **out,
    char **cause);
/*
 * A comment as a provider's API shows it, into *cm: its id, body and
 * created_at, and its author's id and login, as fields user.login
 * (GitHub: "user", "login"; GitLab: "author", "username").
 */
void scm_comment_from(const json_t *e, const char *user, const char *login,
    struct scm_comment *cm);
/*
 * The one comment of a get_comment reply, read by from (the provider's
 * shape) into *out: SCM_EINTERNAL (*out empty) when it is not comment id
 * or names no author. what names the call in messages.
 */
int scm_comment_reply(const struct scm_resp *rp, const char *what,
    int64_t id, void (*from)(const json_t *, struct scm_comment *),
    struct scm_comment *out, char **cause);
/*
 * The page after page of a list paged by offset (page=1, 2, ... of
 * SCM_PER_PAGE each), whose reply rp held got items: the page its
 * X-Next-Page names (empty on the last page), else the page= of its
 * Link rel="next"; when a proxy stripped both, the next page as long as
 * this one came back full. 0: no more (also for a page that would not
 * move on: scm_next_page_stale() below tells that one apart).
 */
int64_t scm_next_page(const struct scm_resp *rp, int64_t page, size_t got);
/*
 * Whether the next page that list reply rp names does not move on from
 * page, the one just read: an X-Next-Page, or else a Link rel="next"
 * page=, not after it, or a Link rel="next" equal to one of the nseen
 * URLs in seen (the ones read already). A server or proxy answering so
 * would have the list read the same pages again until SCM_MAX_PAGES.
 * When it does not, the list cannot be known complete (the caller fails
 * rather than taking it as the whole list: a sticky comment on a page
 * never read would be posted twice); logged at warn here, once per call,
 * with what naming the call and the Link without its query.
 */
int scm_next_page_stale(const struct scm_resp *rp, int64_t page,
    char *const *seen, size_t nseen, const char *what);
/* A client's kept identity (scm_client_whoami), freed with the client. */
struct scm_who *scm_who_new(void);
/* Wipe and free a secret string (NULL is fine). */
void scm_secret_free(char *s);
/* Read a secret reference into a new string: -1 with *cause. */
int scm_secret_load(const char *provider, const char *key, const char *ref,
    char **out, char **cause);
/* Parse RFC 3339 "2016-07-11T22:14:10Z" into unix seconds, -1 if bad. */
int64_t scm_parse_time(const char *s);

/*
 * A GitHub App JWT (RS256) for app id or client id iss, issued at now:
 * iat = now - 30, exp = iat + 600; iss is written as a JSON number when
 * it is all digits. pem is the app's private key. Returns 0 with a new
 * string in *out, or -1 with *cause.
 */
int scm_github_jwt(const char *pem, size_t pem_len, const char *iss,
    int64_t now, char **out, char **cause);

#endif
