/*
 * Webhook authentication and normalization for GitHub and GitLab.
 * Everything here works on untrusted bytes: lengths are explicit, JSON is
 * parsed with jansson's depth limit, and every field is type-checked.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "scm/scm.h"
#include "util/jscan.h"
#include "util/util.h"

#define MAX_DELIVERY_KEY 200

/* Free what an event owns. */
void
scm_event_release(struct scm_event *ev)
{
	free(ev->delivery);
	free(ev->event_name);
	free(ev->repo);
	free(ev->comment_body);
	free(ev->author_login);
	free(ev->author_type);
	free(ev->author_hint);
	free(ev->head_ref);
	free(ev->base_ref);
	free(ev->clone_url);
	free(ev->head_clone_url);
	free(ev->html_url);
	memset(ev, 0, sizeof(*ev));
}

/* "github" or "gitlab". */
const char *
scm_provider_name(enum scm_provider p)
{
	return p == SCM_GITLAB ? "gitlab" : "github";
}

/* The stored name of an event kind. */
const char *
scm_event_kind_name(enum scm_event_kind k)
{
	switch (k) {
	case SCM_EV_COMMENT:
		return "comment";
	case SCM_EV_CLOSED:
		return "closed";
	case SCM_EV_MERGED:
		return "merged";
	case SCM_EV_PING:
		return "ping";
	default:
		return "none";
	}
}

static void
enc_str(struct buf *b, int *first, const char *k, const char *v)
{
	if (v == NULL)
		return;
	buf_printf(b, "%s\"%s\":", *first ? "" : ",", k);
	jscan_escape(b, v);
	*first = 0;
}

static void
enc_int(struct buf *b, int *first, const char *k, int64_t v)
{
	if (v == 0)
		return;
	buf_printf(b, "%s\"%s\":%lld", *first ? "" : ",", k, (long long)v);
	*first = 0;
}

/* The inbox's stored form of an event: compact JSON. */
char *
scm_event_encode(const struct scm_event *ev)
{
	struct buf b;
	int first = 1;

	buf_init(&b, 1u << 26);
	buf_add(&b, "{", 1);
	enc_str(&b, &first, "provider", scm_provider_name(ev->provider));
	enc_str(&b, &first, "kind", scm_event_kind_name(ev->kind));
	enc_str(&b, &first, "delivery", ev->delivery);
	enc_str(&b, &first, "event", ev->event_name);
	enc_str(&b, &first, "repo", ev->repo);
	enc_int(&b, &first, "projectId", ev->project_id);
	enc_int(&b, &first, "repoId", ev->repo_id);
	enc_int(&b, &first, "number", ev->number);
	enc_int(&b, &first, "commentId", ev->comment_id);
	enc_str(&b, &first, "body", ev->comment_body);
	enc_int(&b, &first, "reviewComment", ev->review_comment);
	enc_str(&b, &first, "author", ev->author_login);
	enc_int(&b, &first, "authorId", ev->author_id);
	enc_str(&b, &first, "authorType", ev->author_type);
	enc_str(&b, &first, "authorHint", ev->author_hint);
	enc_str(&b, &first, "headRef", ev->head_ref);
	enc_str(&b, &first, "baseRef", ev->base_ref);
	enc_str(&b, &first, "cloneUrl", ev->clone_url);
	enc_str(&b, &first, "headCloneUrl", ev->head_clone_url);
	/* fork: -1 unknown (absent), 0 or 1 stored as 1 and 2 */
	enc_int(&b, &first, "fork", ev->fork + 1);
	enc_int(&b, &first, "installationId", ev->installation_id);
	enc_str(&b, &first, "htmlUrl", ev->html_url);
	enc_int(&b, &first, "internal", ev->internal);
	buf_add(&b, "}", 1);
	return buf_detach(&b, NULL);
}

static const char *const event_paths[] = {
	"provider", "kind", "delivery", "event", "repo", "projectId", "repoId",
	"number", "commentId", "body", "reviewComment", "author", "authorId",
	"authorType", "authorHint", "headRef", "baseRef", "cloneUrl",
	"headCloneUrl", "fork", "installationId", "htmlUrl", "internal", NULL
};

static char *
dec_str(const struct jfield *f, size_t n, const char *k, int *bad)
{
	const struct jfield *x = jscan_get(f, n, k);
	char *s = NULL;
	size_t len;

	if (x == NULL || x->type == JT_ABSENT)
		return NULL;
	if (jscan_string(x, &s, &len) < 0) {
		*bad = 1;
		return NULL;
	}
	return s;
}

static int64_t
dec_int(const struct jfield *f, size_t n, const char *k, int *bad)
{
	const struct jfield *x = jscan_get(f, n, k);
	int64_t v = 0;

	if (x == NULL || x->type == JT_ABSENT)
		return 0;
	if (jscan_int(x, &v) < 0)
		*bad = 1;
	return v;
}

/* Parse the stored form back; -1 if it is not one. */
int
scm_event_decode(struct scm_event *out, const char *text, size_t len)
{
	struct jfield f[ARRAY_SIZE(event_paths)];
	struct scm_event ev;
	const char *err;
	char *p = NULL, *k = NULL;
	size_t i, n;
	int bad = 0;
	static const enum scm_event_kind kinds[] = {
		SCM_EV_COMMENT, SCM_EV_CLOSED, SCM_EV_MERGED, SCM_EV_PING
	};

	for (n = 0; event_paths[n] != NULL; n++)
		f[n].path = event_paths[n];
	if (jscan(text, len, f, n, 4, &err) < 0)
		return -1;
	memset(&ev, 0, sizeof(ev));
	p = dec_str(f, n, "provider", &bad);
	k = dec_str(f, n, "kind", &bad);
	if (p != NULL && strcmp(p, "github") == 0)
		ev.provider = SCM_GITHUB;
	else if (p != NULL && strcmp(p, "gitlab") == 0)
		ev.provider = SCM_GITLAB;
	for (i = 0; k != NULL && i < ARRAY_SIZE(kinds); i++)
		if (strcmp(k, scm_event_kind_name(kinds[i])) == 0)
			ev.kind = kinds[i];
	free(p);
	free(k);
	ev.delivery = dec_str(f, n, "delivery", &bad);
	ev.event_name = dec_str(f, n, "event", &bad);
	ev.repo = dec_str(f, n, "repo", &bad);
	ev.project_id = dec_int(f, n, "projectId", &bad);
	ev.repo_id = dec_int(f, n, "repoId", &bad);
	ev.number = dec_int(f, n, "number", &bad);
	ev.comment_id = dec_int(f, n, "commentId", &bad);
	ev.comment_body = dec_str(f, n, "body", &bad);
	ev.review_comment = (int)dec_int(f, n, "reviewComment", &bad);
	ev.author_login = dec_str(f, n, "author", &bad);
	ev.author_id = dec_int(f, n, "authorId", &bad);
	ev.author_type = dec_str(f, n, "authorType", &bad);
	ev.author_hint = dec_str(f, n, "authorHint", &bad);
	ev.head_ref = dec_str(f, n, "headRef", &bad);
	ev.base_ref = dec_str(f, n, "baseRef", &bad);
	ev.clone_url = dec_str(f, n, "cloneUrl", &bad);
	ev.head_clone_url = dec_str(f, n, "headCloneUrl", &bad);
	ev.fork = (int)dec_int(f, n, "fork", &bad) - 1;
	ev.installation_id = dec_int(f, n, "installationId", &bad);
	ev.html_url = dec_str(f, n, "htmlUrl", &bad);
	ev.internal = dec_int(f, n, "internal", &bad) != 0;
	if (bad || ev.provider == 0 || ev.kind == SCM_EV_NONE ||
	    ev.fork < -1 || ev.fork > 1) {
		scm_event_release(&ev);
		return -1;
	}
	*out = ev;
	return 0;
}

/* ---------------------------------------------------------------- auth */

/* Verify X-Hub-Signature-256 against every configured secret. */
int
webhook_github_verify(const struct webhook_keys *keys, const char *header,
    const char *body, size_t len)
{
	unsigned char want[32], got[32];
	size_t i, n;
	int ok = 0;

	if (header == NULL || strlen(header) != 7 + 64 ||
	    strncmp(header, "sha256=", 7) != 0)
		return -1;
	/* GitHub sends lowercase hex; anything else is not its signature */
	for (i = 7; i < 7 + 64; i++)
		if (!((header[i] >= '0' && header[i] <= '9') ||
		    (header[i] >= 'a' && header[i] <= 'f')))
			return -1;
	if (hex_decode(header + 7, 64, got, &n) < 0)
		return -1;
	for (i = 0; i < keys->nsecrets; i++) {
		hmac_sha256(keys->secrets[i], keys->secret_lens[i], body, len,
		    want);
		/* no early exit: every secret is tried */
		ok |= ct_equal(want, got, 32);
	}
	secure_wipe(want, sizeof(want));
	return ok ? 0 : -1;
}

/* Compare X-Gitlab-Token against every configured token. */
int
webhook_gitlab_verify_token(const struct webhook_keys *keys,
    const char *token)
{
	unsigned char a[32], b[32];
	size_t i, tlen;
	int ok = 0;

	if (token == NULL)
		return -1;
	tlen = strlen(token);
	/*
	 * Compare digests, not the strings, so that the time taken does not
	 * depend on where the first difference is nor on the lengths.
	 */
	hmac_sha256("diverge-token-compare", 21, token, tlen, a);
	for (i = 0; i < keys->nsecrets; i++) {
		hmac_sha256("diverge-token-compare", 21, keys->secrets[i],
		    keys->secret_lens[i], b);
		ok |= ct_equal(a, b, 32);
	}
	secure_wipe(a, sizeof(a));
	secure_wipe(b, sizeof(b));
	return ok ? 0 : -1;
}

/* Decode whsec_<base64> into the HMAC key. */
int
webhook_signing_key_decode(const char *token, unsigned char **out,
    size_t *outlen)
{
	if (strncmp(token, "whsec_", 6) == 0)
		token += 6;
	if (base64_decode(token, strlen(token), out, outlen) < 0)
		return -1;
	if (*outlen == 0) {	/* no key: refused, and nothing kept */
		free(*out);
		*out = NULL;
		return -1;
	}
	return 0;
}

/* Verify a Standard Webhooks signature header. */
int
webhook_standard_verify(const unsigned char *key, size_t keylen,
    const char *id, const char *timestamp, const char *signature,
    const char *body, size_t len, int64_t now, const char **reason)
{
	unsigned char mac[32];
	struct buf msg;
	const char *p, *end;
	char *e;
	long long ts;
	int ok = 0;

	if (id == NULL || timestamp == NULL || signature == NULL) {
		*reason = "missing webhook-id, webhook-timestamp or "
		    "webhook-signature";
		return -1;
	}
	errno = 0;
	ts = strtoll(timestamp, &e, 10);
	if (e == timestamp || *e != '\0' || errno != 0) {
		*reason = "bad webhook-timestamp";
		return -1;
	}
	if (ts < now - WEBHOOK_TIMESTAMP_WINDOW_S ||
	    ts > now + WEBHOOK_TIMESTAMP_WINDOW_S) {
		*reason = "webhook-timestamp outside the 5 minute window";
		return -1;
	}
	buf_init(&msg, len + strlen(id) + strlen(timestamp) + 2);
	if (buf_addstr(&msg, id) < 0 || buf_add(&msg, ".", 1) < 0 ||
	    buf_addstr(&msg, timestamp) < 0 || buf_add(&msg, ".", 1) < 0 ||
	    buf_add(&msg, body, len) < 0) {
		buf_release(&msg);
		*reason = "signature input too large";
		return -1;
	}
	hmac_sha256(key, keylen, msg.data, msg.len, mac);
	buf_release(&msg);
	/* space-separated list of "version,base64" */
	for (p = signature; *p; p = end) {
		unsigned char *sig = NULL;
		size_t siglen = 0;

		while (*p == ' ')
			p++;
		end = p;
		while (*end && *end != ' ')
			end++;
		if (end - p > 3 && strncmp(p, "v1,", 3) == 0 &&
		    base64_decode(p + 3, (size_t)(end - p - 3), &sig,
		    &siglen) == 0) {
			if (siglen == 32)
				ok |= ct_equal(sig, mac, 32);
			free(sig);
		}
	}
	secure_wipe(mac, sizeof(mac));
	if (!ok) {
		*reason = "bad webhook-signature";
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------- prefilter */

/* Whether some line is a /diverge command line (cheap scan). */
int
webhook_has_command_line(const char *text, size_t len)
{
	size_t i = 0;

	while (i < len) {
		size_t j = i, sp = 0;

		while (j < len && text[j] == ' ' && sp < 3) {
			j++;
			sp++;
		}
		if (len - j >= 8 && strncasecmp(text + j, "/diverge", 8) == 0) {
			size_t k = j + 8;

			if (k == len || text[k] == ' ' || text[k] == '\t' ||
			    text[k] == '\n' || text[k] == '\r')
				return 1;
		}
		/* next line */
		while (i < len && text[i] != '\n' && text[i] != '\r')
			i++;
		while (i < len && (text[i] == '\n' || text[i] == '\r'))
			i++;
	}
	return 0;
}

/* ------------------------------------------------------- normalization */

/*
 * The fields the normalizers read, found in one validating pass of the
 * payload (util/jscan.h): a full JSON tree of a 10-25 KB delivery costs ten
 * times more, and intake reads only these.
 */
static const char *const github_paths[] = {
	"action", "number", "issue", "issue.number", "issue.pull_request",
	"comment.body", "comment.id", "comment.user.login", "comment.user.type",
	"comment.user.id", "comment.author_association", "comment.html_url",
	"repository.full_name", "repository.id", "repository.clone_url",
	"installation.id", "pull_request.number", "pull_request.head.ref",
	"pull_request.base.ref", "pull_request.head.repo.clone_url",
	"pull_request.base.repo.clone_url", "pull_request.merged",
	"pull_request.html_url", "sender.login", NULL
};

static const char *const gitlab_paths[] = {
	"object_kind", "object_attributes.noteable_type",
	"object_attributes.action", "object_attributes.system",
	"object_attributes.note", "object_attributes.internal",
	"object_attributes.confidential",
	"object_attributes.id", "object_attributes.url",
	"object_attributes.iid", "object_attributes.target_project_id",
	"object_attributes.source_branch", "object_attributes.target_branch",
	"user.username", "user.id", "project_id", "project.id",
	"project.path_with_namespace", "project.git_http_url",
	"merge_request.iid", "merge_request.source_branch",
	"merge_request.target_branch", "merge_request.source.git_http_url",
	"merge_request.source_project_id", "merge_request.target_project_id",
	NULL
};

#define MAX_STRINGS 32

/*
 * A scanned payload. A shape error (valid JSON, but not what the
 * provider sends) is recorded once in reason; strings decoded for the
 * normalizer live until scan_release.
 */
struct scan {
	struct jfield f[JSCAN_MAX_FIELDS];
	size_t n;
	char *strings[MAX_STRINGS];
	size_t nstrings;
	const char *reason;
};

static void
scan_release(struct scan *sc)
{
	size_t i;

	for (i = 0; i < sc->nstrings; i++)
		free(sc->strings[i]);
	sc->nstrings = 0;
}

static const struct jfield *
field(const struct scan *sc, const char *path)
{
	return jscan_get(sc->f, sc->n, path);
}

static enum jtype
ftype(const struct scan *sc, const char *path)
{
	const struct jfield *f = field(sc, path);

	return f != NULL ? f->type : JT_ABSENT;
}

static void
shape(struct scan *sc, const char *why)
{
	if (sc->reason == NULL)
		sc->reason = why;
}

/*
 * Typed accessors: a missing or null field is "absent" (returns NULL/0,
 * and when required records the reason); a field of the wrong type always
 * records the reason.
 */
static const char *
get_str(struct scan *sc, const char *path, int required, const char *why)
{
	const struct jfield *f = field(sc, path);
	char *out = NULL;
	size_t n;

	if (f == NULL || f->type == JT_ABSENT || f->type == JT_NULL) {
		if (required)
			shape(sc, why);
		return NULL;
	}
	if (f->type != JT_STRING || sc->nstrings == MAX_STRINGS ||
	    jscan_string(f, &out, &n) < 0) {
		shape(sc, why);
		return NULL;
	}
	sc->strings[sc->nstrings++] = out;
	return out;
}

static int64_t
get_int(struct scan *sc, const char *path, int required, const char *why)
{
	const struct jfield *f = field(sc, path);
	int64_t v;

	if (f == NULL || f->type == JT_ABSENT || f->type == JT_NULL) {
		if (required)
			shape(sc, why);
		return 0;
	}
	if (jscan_int(f, &v) < 0 || v < 0) {
		shape(sc, why);
		return 0;
	}
	return v;
}

static int
get_bool(struct scan *sc, const char *path, const char *why)
{
	enum jtype t = ftype(sc, path);

	if (t == JT_ABSENT || t == JT_NULL)
		return 0;
	if (t != JT_TRUE && t != JT_FALSE) {
		shape(sc, why);
		return 0;
	}
	return t == JT_TRUE;
}

static char *
opt_dup(const char *s)
{
	return s != NULL ? xstrdup(s) : NULL;
}

static int
same_login(const char *a, const char *b)
{
	return a != NULL && b != NULL && *b && strcasecmp(a, b) == 0;
}

/* GitHub: issue_comment and pull_request_review_comment. */
static enum webhook_verdict
github_comment(struct scan *sc, int review, const struct webhook_identity *self,
    struct scm_event *ev, const char **reason)
{
	const char *action, *body, *login, *type;

	action = get_str(sc, "action", 1, "missing or invalid 'action'");
	if (sc->reason != NULL)
		return WH_BAD_REQUEST;
	if (strcmp(action, "created") != 0) {
		*reason = "comment not newly created";
		return WH_IGNORE;
	}
	if (!review && ftype(sc, "issue") != JT_ABSENT &&
	    ftype(sc, "issue") != JT_OBJECT) {
		sc->reason = "invalid 'issue'";
		return WH_BAD_REQUEST;
	}
	if (!review && (ftype(sc, "issue.pull_request") == JT_ABSENT ||
	    ftype(sc, "issue.pull_request") == JT_NULL)) {
		*reason = "comment on an issue, not a pull request";
		return WH_IGNORE;
	}
	body = get_str(sc, "comment.body", 1,
	    "missing or invalid 'comment.body'");
	login = get_str(sc, "comment.user.login", 1,
	    "missing or invalid 'comment.user.login'");
	type = get_str(sc, "comment.user.type", 0,
	    "invalid 'comment.user.type'");
	ev->repo = opt_dup(get_str(sc, "repository.full_name", 1,
	    "missing or invalid 'repository.full_name'"));
	ev->repo_id = get_int(sc, "repository.id", 0,
	    "invalid 'repository.id'");
	ev->comment_id = get_int(sc, "comment.id", 1,
	    "missing or invalid 'comment.id'");
	ev->author_id = get_int(sc, "comment.user.id", 0,
	    "invalid 'comment.user.id'");
	ev->author_hint = opt_dup(get_str(sc, "comment.author_association",
	    0, "invalid 'comment.author_association'"));
	ev->html_url = opt_dup(get_str(sc, "comment.html_url", 0,
	    "invalid 'comment.html_url'"));
	ev->installation_id = get_int(sc, "installation.id", 0,
	    "invalid 'installation.id'");
	if (review) {
		ev->review_comment = 1;
		ev->number = get_int(sc, "pull_request.number", 1,
		    "missing or invalid 'pull_request.number'");
		ev->head_ref = opt_dup(get_str(sc, "pull_request.head.ref",
		    0, "invalid 'pull_request.head.ref'"));
		ev->base_ref = opt_dup(get_str(sc, "pull_request.base.ref",
		    0, "invalid 'pull_request.base.ref'"));
		ev->head_clone_url = opt_dup(get_str(sc,
		    "pull_request.head.repo.clone_url", 0,
		    "invalid 'pull_request.head.repo.clone_url'"));
		ev->clone_url = opt_dup(get_str(sc,
		    "pull_request.base.repo.clone_url", 0,
		    "invalid 'pull_request.base.repo.clone_url'"));
	} else {
		ev->number = get_int(sc, "issue.number", 1,
		    "missing or invalid 'issue.number'");
		ev->clone_url = opt_dup(get_str(sc, "repository.clone_url",
		    0, "invalid 'repository.clone_url'"));
	}
	if (sc->reason != NULL)
		return WH_BAD_REQUEST;
	ev->comment_body = xstrdup(body);
	ev->author_login = xstrdup(login);
	ev->author_type = opt_dup(type);
	if (ev->head_clone_url != NULL && ev->clone_url != NULL)
		ev->fork = strcmp(ev->head_clone_url, ev->clone_url) != 0;
	if (type != NULL && strcmp(type, "Bot") == 0) {
		*reason = "comment by a bot";
		return WH_IGNORE;
	}
	if (self != NULL && same_login(login, self->github_login)) {
		*reason = "comment by diverge itself";
		return WH_IGNORE;
	}
	if (!webhook_has_command_line(body, strlen(body))) {
		*reason = "no /diverge command";
		return WH_IGNORE;
	}
	ev->kind = SCM_EV_COMMENT;
	return WH_ACCEPT;
}

/* GitHub: pull_request. */
static enum webhook_verdict
github_pull_request(struct scan *sc, struct scm_event *ev,
    const char **reason)
{
	const char *action;
	int merged;

	action = get_str(sc, "action", 1, "missing or invalid 'action'");
	if (sc->reason != NULL)
		return WH_BAD_REQUEST;
	if (strcmp(action, "closed") != 0) {
		*reason = "pull request event other than closed";
		return WH_IGNORE;
	}
	ev->number = get_int(sc, "number", 0, "invalid 'number'");
	if (ev->number == 0)
		ev->number = get_int(sc, "pull_request.number", 1,
		    "missing or invalid 'number'");
	merged = get_bool(sc, "pull_request.merged",
	    "invalid 'pull_request.merged'");
	ev->repo = opt_dup(get_str(sc, "repository.full_name", 1,
	    "missing or invalid 'repository.full_name'"));
	ev->repo_id = get_int(sc, "repository.id", 0,
	    "invalid 'repository.id'");
	ev->author_login = opt_dup(get_str(sc, "sender.login", 0,
	    "invalid 'sender.login'"));
	ev->head_ref = opt_dup(get_str(sc, "pull_request.head.ref", 0,
	    "invalid 'pull_request.head.ref'"));
	ev->base_ref = opt_dup(get_str(sc, "pull_request.base.ref", 0,
	    "invalid 'pull_request.base.ref'"));
	ev->html_url = opt_dup(get_str(sc, "pull_request.html_url", 0,
	    "invalid 'pull_request.html_url'"));
	ev->installation_id = get_int(sc, "installation.id", 0,
	    "invalid 'installation.id'");
	if (sc->reason != NULL)
		return WH_BAD_REQUEST;
	ev->kind = merged ? SCM_EV_MERGED : SCM_EV_CLOSED;
	return WH_ACCEPT;
}

static enum webhook_verdict
github_normalize(const char *event, struct scan *sc,
    const struct webhook_identity *self, struct scm_event *ev,
    const char **reason)
{
	if (strcmp(event, "ping") == 0) {
		*reason = "ping";
		ev->kind = SCM_EV_PING;
		return WH_IGNORE;
	}
	if (strcmp(event, "issue_comment") == 0)
		return github_comment(sc, 0, self, ev, reason);
	if (strcmp(event, "pull_request_review_comment") == 0)
		return github_comment(sc, 1, self, ev, reason);
	if (strcmp(event, "pull_request") == 0)
		return github_pull_request(sc, ev, reason);
	*reason = "event not handled";
	return WH_IGNORE;
}

/*
 * Whether a GitLab username is one GitLab gives its machine users: the
 * bot of a project or group access token is project_<id>_bot or
 * group_<id>_bot, then a counter (older GitLab: project_5_bot2) or "_"
 * and a random part (project_5_bot_<hex>); a service account is
 * service_account_<...> (instance: service_account_<hex>, group or
 * project: service_account_group_<id>_<hex>) unless its creator chose
 * another name. The webhook's user has no bot flag; authorization asks
 * the Users API for the names this cannot tell (actions.c).
 */
static int
gitlab_bot_username(const char *u)
{
	const char *p;

	if (strncmp(u, "service_account_", 16) == 0)
		return 1;
	if (strncmp(u, "project_", 8) == 0)
		p = u + 8;
	else if (strncmp(u, "group_", 6) == 0)
		p = u + 6;
	else
		return 0;
	if (!isdigit((unsigned char)*p))
		return 0;
	while (isdigit((unsigned char)*p))
		p++;
	if (strncmp(p, "_bot", 4) != 0)
		return 0;
	p += 4;
	if (*p == '_')
		return 1;
	while (isdigit((unsigned char)*p))
		p++;
	return *p == '\0';	/* not project_5_botany */
}

/* GitLab: Note Hook / Confidential Note Hook on a merge request. */
static enum webhook_verdict
gitlab_note(const char *event, struct scan *sc,
    const struct webhook_identity *self, struct scm_event *ev,
    const char **reason)
{
	const char *type, *action, *body, *user;
	int64_t src, dst;
	int internal, confidential;

	type = get_str(sc, "object_attributes.noteable_type", 1,
	    "missing or invalid 'object_attributes.noteable_type'");
	action = get_str(sc, "object_attributes.action", 0,
	    "invalid 'object_attributes.action'");
	if (sc->reason != NULL)
		return WH_BAD_REQUEST;
	if (strcmp(type, "MergeRequest") != 0) {
		*reason = "comment not on a merge request";
		return WH_IGNORE;
	}
	/* before GitLab 16.11 there is no action and only creations fire */
	if (action != NULL && strcmp(action, "create") != 0) {
		*reason = "comment not newly created";
		return WH_IGNORE;
	}
	if (get_bool(sc, "object_attributes.system",
	    "invalid 'object_attributes.system'")) {
		*reason = "system note";
		return WH_IGNORE;
	}
	body = get_str(sc, "object_attributes.note", 1,
	    "missing or invalid 'object_attributes.note'");
	user = get_str(sc, "user.username", 1,
	    "missing or invalid 'user.username'");
	ev->author_id = get_int(sc, "user.id", 0, "invalid 'user.id'");
	ev->comment_id = get_int(sc, "object_attributes.id", 1,
	    "missing or invalid 'object_attributes.id'");
	ev->project_id = get_int(sc, "project_id", 0,
	    "invalid 'project_id'");
	if (ev->project_id == 0)
		ev->project_id = get_int(sc, "project.id", 1,
		    "missing or invalid 'project_id'");
	ev->repo = opt_dup(get_str(sc, "project.path_with_namespace", 1,
	    "missing or invalid 'project.path_with_namespace'"));
	ev->number = get_int(sc, "merge_request.iid", 1,
	    "missing or invalid 'merge_request.iid'");
	ev->head_ref = opt_dup(get_str(sc, "merge_request.source_branch", 0, "invalid 'merge_request.source_branch'"));
	ev->base_ref = opt_dup(get_str(sc, "merge_request.target_branch", 0, "invalid 'merge_request.target_branch'"));
	ev->head_clone_url = opt_dup(get_str(sc,
	    "merge_request.source.git_http_url", 0,
	    "invalid 'merge_request.source.git_http_url'"));
	ev->clone_url = opt_dup(get_str(sc, "project.git_http_url", 0,
	    "invalid 'project.git_http_url'"));
	ev->html_url = opt_dup(get_str(sc, "object_attributes.url", 0,
	    "invalid 'object_attributes.url'"));
	src = get_int(sc, "merge_request.source_project_id", 0,
	    "invalid 'merge_request.source_project_id'");
	dst = get_int(sc, "merge_request.target_project_id", 0,
	    "invalid 'merge_request.target_project_id'");
	internal = get_bool(sc, "object_attributes.internal",
	    "invalid 'object_attributes.internal'");
	confidential = get_bool(sc, "object_attributes.confidential",
	    "invalid 'object_attributes.confidential'");
	if (sc->reason != NULL)
		return WH_BAD_REQUEST;
	ev->fork = (src != 0 && dst != 0) ? src != dst : -1;
	/*
	 * An internal note (the older name: confidential) is seen by project
	 * members only: nothing taken from it may become public.
	 */
	ev->internal = internal || confidential ||
	    strcmp(event, "Confidential Note Hook") == 0;
	ev->comment_body = xstrdup(body);
	ev->author_login = xstrdup(user);
	if (self != NULL && (same_login(user, self->gitlab_username) ||
	    (self->gitlab_user_id != 0 &&
	    ev->author_id == self->gitlab_user_id))) {
		*reason = "comment by diverge itself";
		return WH_IGNORE;
	}
	if (gitlab_bot_username(user)) {
		*reason = "comment by a bot";
		return WH_IGNORE;
	}
	if (!webhook_has_command_line(body, strlen(body))) {
		*reason = "no /diverge command";
		return WH_IGNORE;
	}
	ev->kind = SCM_EV_COMMENT;
	return WH_ACCEPT;
}

/* GitLab: Merge Request Hook. */
static enum webhook_verdict
gitlab_merge_request(struct scan *sc, struct scm_event *ev,
    const char **reason)
{
	const char *action;

	action = get_str(sc, "object_attributes.action", 0,
	    "invalid 'object_attributes.action'");
	if (sc->reason != NULL)
		return WH_BAD_REQUEST;
	if (action == NULL ||
	    (strcmp(action, "close") != 0 && strcmp(action, "merge") != 0)) {
		*reason = "merge request event other than close or merge";
		return WH_IGNORE;
	}
	ev->number = get_int(sc, "object_attributes.iid", 1,
	    "missing or invalid 'object_attributes.iid'");
	ev->project_id = get_int(sc, "project.id", 0,
	    "invalid 'project.id'");
	if (ev->project_id == 0)
		ev->project_id = get_int(sc, "object_attributes.target_project_id",
		    1, "missing or invalid 'project.id'");
	ev->repo = opt_dup(get_str(sc, "project.path_with_namespace", 1,
	    "missing or invalid 'project.path_with_namespace'"));
	ev->author_login = opt_dup(get_str(sc, "user.username", 0,
	    "invalid 'user.username'"));
	ev->head_ref = opt_dup(get_str(sc, "object_attributes.source_branch",
	    0, "invalid 'object_attributes.source_branch'"));
	ev->base_ref = opt_dup(get_str(sc, "object_attributes.target_branch",
	    0, "invalid 'object_attributes.target_branch'"));
	ev->html_url = opt_dup(get_str(sc, "object_attributes.url", 0,
	    "invalid 'object_attributes.url'"));
	if (sc->reason != NULL)
		return WH_BAD_REQUEST;
	ev->kind = strcmp(action, "merge") == 0 ? SCM_EV_MERGED : SCM_EV_CLOSED;
	return WH_ACCEPT;
}

static enum webhook_verdict
gitlab_normalize(const char *event, struct scan *sc,
    const struct webhook_identity *self, struct scm_event *ev,
    const char **reason)
{
	const char *kind, *want = NULL;
	int note;

	note = strcmp(event, "Note Hook") == 0 ||
	    strcmp(event, "Confidential Note Hook") == 0;
	if (note)
		want = "note";
	else if (strcmp(event, "Merge Request Hook") == 0)
		want = "merge_request";
	if (want == NULL) {
		*reason = "event not handled";
		return WH_IGNORE;
	}
	/*
	 * X-Gitlab-Event is not signed, the body is: a signed delivery of
	 * another kind (an issue closed) replayed under this header must not
	 * be read as one. GitLab sends object_kind in both hooks.
	 */
	kind = get_str(sc, "object_kind", 0, "invalid 'object_kind'");
	if (sc->reason != NULL)
		return WH_BAD_REQUEST;
	if (kind != NULL && strcmp(kind, want) != 0) {
		*reason = "object_kind does not match X-Gitlab-Event";
		return WH_IGNORE;
	}
	if (note)
		return gitlab_note(event, sc, self, ev, reason);
	return gitlab_merge_request(sc, ev, reason);
}

/* Classify an authenticated payload. */
enum webhook_verdict
webhook_normalize(enum scm_provider provider, const char *event,
    const char *delivery, const char *jsontext, size_t len,
    const struct webhook_identity *self, struct scm_event *out,
    const char **reason)
{
	static struct scan empty;
	struct scm_event ev;
	struct scan *sc;
	const char *const *paths = provider == SCM_GITHUB ? github_paths :
	    gitlab_paths;
	const char *err = NULL;
	enum webhook_verdict v;
	size_t i, k = 0;

	while (k < len && (jsontext[k] == ' ' || jsontext[k] == '\n' ||
	    jsontext[k] == '\r' || jsontext[k] == '\t'))
		k++;
	sc = xmalloc(sizeof(*sc));
	*sc = empty;
	for (i = 0; paths[i] != NULL; i++)
		sc->f[i].path = paths[i];
	sc->n = i;
	if (jscan(jsontext, len, sc->f, sc->n, 512, &err) < 0) {
		free(sc);
		*reason = "body is not valid JSON";
		return WH_BAD_REQUEST;
	}
	if (k == len || jsontext[k] != '{') {
		free(sc);
		*reason = "body is not a JSON object";
		return WH_BAD_REQUEST;
	}
	for (i = 0; i < sc->n; i++)
		if (sc->f[i].count > 1) {
			free(sc);
			*reason = "duplicate key in the payload";
			return WH_BAD_REQUEST;
		}
	memset(&ev, 0, sizeof(ev));
	ev.fork = -1;
	ev.provider = provider;
	ev.delivery = xstrdup(delivery);
	ev.event_name = xstrdup(event);
	if (provider == SCM_GITHUB)
		v = github_normalize(event, sc, self, &ev, reason);
	else
		v = gitlab_normalize(event, sc, self, &ev, reason);
	if (v == WH_BAD_REQUEST) {
		*reason = sc->reason;
		scm_event_release(&ev);
	} else {
		if (v == WH_ACCEPT)
			*reason = NULL;
		*out = ev;
	}
	scan_release(sc);
	free(sc);
	return v;
}

/* Decode application/x-www-form-urlencoded "payload=<json>". */
static int
form_payload(const char *body, size_t len, char **out, size_t *outlen)
{
	struct buf b;
	size_t i, f = 0, start = 0, end = len;
	int found = 0;

	/*
	 * find the payload field among &-separated fields: exactly one (two
	 * would leave the choice to whichever parser reads the body)
	 */
	for (i = 0; i <= len; i++) {
		if (i == len || body[i] == '&') {
			if (i - f >= 8 && memcmp(body + f, "payload=", 8) == 0) {
				if (found)
					return -1;
				found = 1;
				start = f;
				end = i;
			}
			f = i + 1;
		}
	}
	if (!found)
		return -1;
	buf_init(&b, len);
	for (i = start + 8; i < end; i++) {
		char c = body[i];

		if (c == '+') {
			c = ' ';
		} else if (c == '%') {
			unsigned char v;
			size_t n;

			if (i + 2 >= end) {
				buf_release(&b);
				return -1;
			}
			if (hex_decode(body + i + 1, 2, &v, &n) < 0) {
				buf_release(&b);
				return -1;
			}
			c = (char)v;
			i += 2;
		}
		buf_add(&b, &c, 1);
	}
	if (b.data == NULL)
		buf_add(&b, "", 0);
	*out = buf_detach(&b, outlen);
	return 0;
}

static int
delivery_ok(const char *d)
{
	size_t n = strlen(d), i;

	if (n == 0 || n > MAX_DELIVERY_KEY)
		return 0;
	for (i = 0; i < n; i++)
		if ((unsigned char)d[i] <= ' ' || (unsigned char)d[i] >= 0x7f)
			return 0;
	return 1;
}

static enum webhook_verdict
handle_github(const struct webhook_keys *keys,
    const struct webhook_identity *self, webhook_header_fn header, void *arg,
    const char *body, size_t len, struct scm_event *out, const char **reason)
{
	const char *ct = header(arg, "Content-Type");
	const char *event, *delivery;
	char *json = NULL;
	size_t jlen = 0;
	enum webhook_verdict v;

	if (!media_type_is(ct, "application/json") &&
	    !media_type_is(ct, "application/x-www-form-urlencoded")) {
		*reason = "content type must be application/json or "
		    "application/x-www-form-urlencoded";
		return WH_UNSUPPORTED;
	}
	if (webhook_github_verify(keys, header(arg, "X-Hub-Signature-256"),
	    body, len) < 0) {
		*reason = header(arg, "X-Hub-Signature-256") == NULL ?
		    "missing X-Hub-Signature-256" : "bad signature";
		return WH_UNAUTHORIZED;
	}
	event = header(arg, "X-GitHub-Event");
	delivery = header(arg, "X-GitHub-Delivery");
	if (event == NULL || *event == '\0') {
		*reason = "missing X-GitHub-Event";
		return WH_BAD_REQUEST;
	}
	if (delivery == NULL || !delivery_ok(delivery)) {
		*reason = "missing or invalid X-GitHub-Delivery";
		return WH_BAD_REQUEST;
	}
	if (media_type_is(ct, "application/x-www-form-urlencoded")) {
		if (form_payload(body, len, &json, &jlen) < 0) {
			*reason = "form body without a valid payload field";
			return WH_BAD_REQUEST;
		}
		v = webhook_normalize(SCM_GITHUB, event, delivery, json, jlen,
		    self, out, reason);
		free(json);
		return v;
	}
	return webhook_normalize(SCM_GITHUB, event, delivery, body, len, self,
	    out, reason);
}

static enum webhook_verdict
handle_gitlab(const struct webhook_keys *keys,
    const struct webhook_identity *self, webhook_header_fn header, void *arg,
    const char *body, size_t len, int64_t now, struct scm_event *out,
    const char **reason)
{
	const char *event, *delivery, *uuid;
	char hex[65], key[MAX_DELIVERY_KEY + 2];

	if (!media_type_is(header(arg, "Content-Type"), "application/json")) {
		*reason = "content type must be application/json";
		return WH_UNSUPPORTED;
	}
	if (keys->nsecrets > 0 && webhook_gitlab_verify_token(keys,
	    header(arg, "X-Gitlab-Token")) < 0) {
		*reason = header(arg, "X-Gitlab-Token") == NULL ?
		    "missing X-Gitlab-Token" : "bad X-Gitlab-Token";
		return WH_UNAUTHORIZED;
	}
	if (keys->signing_key != NULL && webhook_standard_verify(
	    keys->signing_key, keys->signing_key_len,
	    header(arg, "webhook-id"), header(arg, "webhook-timestamp"),
	    header(arg, "webhook-signature"), body, len, now, reason) < 0)
		return WH_UNAUTHORIZED;
	if (keys->nsecrets == 0 && keys->signing_key == NULL) {
		*reason = "no gitlab token configured";
		return WH_UNAUTHORIZED;
	}
	event = header(arg, "X-Gitlab-Event");
	if (event == NULL || *event == '\0') {
		*reason = "missing X-Gitlab-Event";
		return WH_BAD_REQUEST;
	}
	/*
	 * With a signing token the signed webhook-id (GitLab sends its
	 * Idempotency-Key there) keys the delivery: the Idempotency-Key header
	 * is not signed, and a delivery captured and replayed within its 5
	 * minutes under a new one would be stored again. An empty one is
	 * refused below.
	 */
	delivery = header(arg, keys->signing_key != NULL ? "webhook-id" :
	    "Idempotency-Key");
	if (keys->signing_key == NULL &&
	    (delivery == NULL || *delivery == '\0')) {
		/*
		 * GitLab before 17.4 sends no Idempotency-Key: the body's
		 * digest keys the delivery, so an identical resend is still a
		 * duplicate. From 14.8 X-Gitlab-Event-UUID goes before it, but
		 * not alone: when a webhook's call to GitLab triggered the
		 * events, every event of that call and of the chain after it
		 * carries its UUID (a note with a /close quick action brings a
		 * Note Hook and a Merge Request Hook), and the second would be
		 * answered "duplicate" and lost.
		 */
		unsigned char h[32];

		hmac_sha256("diverge-delivery", 16, body, len, h);
		hex_encode(h, 32, hex);
		delivery = hex;
		uuid = header(arg, "X-Gitlab-Event-UUID");
		if (uuid != NULL && *uuid != '\0') {
			/* one too long is cut, then refused as too long */
			snprintf(key, sizeof(key), "%s.%s", uuid, hex);
			delivery = key;
		}
	}
	if (!delivery_ok(delivery)) {
		*reason = "invalid delivery id";
		return WH_BAD_REQUEST;
	}
	return webhook_normalize(SCM_GITLAB, event, delivery, body, len, self,
	    out, reason);
}

/*
 * Authenticate and classify one delivery, then hold back a relevant one
 * whose repository repo_allowlist does not allow: it is answered 200
 * ignored and never stored, so a repository the operator did not list
 * cannot make the cluster run agents with a correctly signed delivery
 * (one GitHub App secret signs every installation's).
 */
enum webhook_verdict
webhook_handle(enum scm_provider provider, const struct webhook_keys *keys,
    const struct webhook_identity *self, webhook_header_fn header,
    void *header_arg, const char *body, size_t len, int64_t now,
    struct scm_event *out, const char **reason)
{
	enum webhook_verdict v;

	if (provider == SCM_GITHUB)
		v = handle_github(keys, self, header, header_arg, body, len,
		    out, reason);
	else
		v = handle_gitlab(keys, self, header, header_arg, body, len,
		    now, out, reason);
	if (v == WH_ACCEPT && !scm_repo_allowed(keys->allow, keys->nallow,
	    keys->host, out->repo)) {
		*reason = WEBHOOK_NOT_ALLOWED;
		v = WH_IGNORE;
	}
	return v;
}
