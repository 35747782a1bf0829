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
set_str(json_t *o, const char *k, const char *v)
{
	if (v != NULL)
		json_object_set_new(o, k, json_string(v));
}

static void
set_int(json_t *o, const char *k, int64_t v)
{
	if (v != 0)
		json_object_set_new(o, k, json_integer(v));
}

/* The inbox's stored form of an event. */
json_t *
scm_event_to_json(const struct scm_event *ev)
{
	json_t *o = json_object();

	set_str(o, "provider", scm_provider_name(ev->provider));
	set_str(o, "kind", scm_event_kind_name(ev->kind));
	set_str(o, "delivery", ev->delivery);
	set_str(o, "event", ev->event_name);
	set_str(o, "repo", ev->repo);
	set_int(o, "projectId", ev->project_id);
	set_int(o, "repoId", ev->repo_id);
	set_int(o, "number", ev->number);
	set_int(o, "commentId", ev->comment_id);
	set_str(o, "body", ev->comment_body);
	if (ev->review_comment)
		json_object_set_new(o, "reviewComment", json_true());
	set_str(o, "author", ev->author_login);
	set_int(o, "authorId", ev->author_id);
	set_str(o, "authorType", ev->author_type);
	set_str(o, "authorHint", ev->author_hint);
	set_str(o, "headRef", ev->head_ref);
	set_str(o, "baseRef", ev->base_ref);
	set_str(o, "cloneUrl", ev->clone_url);
	set_str(o, "headCloneUrl", ev->head_clone_url);
	if (ev->fork >= 0)
		json_object_set_new(o, "fork", json_boolean(ev->fork));
	set_int(o, "installationId", ev->installation_id);
	set_str(o, "htmlUrl", ev->html_url);
	return o;
}

static char *
dup_str(const json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));

	return s != NULL ? xstrdup(s) : NULL;
}

/* Parse the stored form back; -1 if it is not one. */
int
scm_event_from_json(struct scm_event *out, const json_t *j)
{
	struct scm_event ev;
	const char *p, *k;
	size_t i;
	static const enum scm_event_kind kinds[] = {
		SCM_EV_COMMENT, SCM_EV_CLOSED, SCM_EV_MERGED, SCM_EV_PING
	};

	if (!json_is_object(j))
		return -1;
	memset(&ev, 0, sizeof(ev));
	p = json_string_value(json_object_get(j, "provider"));
	k = json_string_value(json_object_get(j, "kind"));
	if (p == NULL || k == NULL)
		return -1;
	if (strcmp(p, "github") == 0)
		ev.provider = SCM_GITHUB;
	else if (strcmp(p, "gitlab") == 0)
		ev.provider = SCM_GITLAB;
	else
		return -1;
	for (i = 0; i < ARRAY_SIZE(kinds); i++)
		if (strcmp(k, scm_event_kind_name(kinds[i])) == 0)
			ev.kind = kinds[i];
	if (ev.kind == SCM_EV_NONE)
		return -1;
	ev.delivery = dup_str(j, "delivery");
	ev.event_name = dup_str(j, "event");
	ev.repo = dup_str(j, "repo");
	ev.project_id = json_integer_value(json_object_get(j, "projectId"));
	ev.repo_id = json_integer_value(json_object_get(j, "repoId"));
	ev.number = json_integer_value(json_object_get(j, "number"));
	ev.comment_id = json_integer_value(json_object_get(j, "commentId"));
	ev.comment_body = dup_str(j, "body");
	ev.review_comment = json_is_true(json_object_get(j, "reviewComment"));
	ev.author_login = dup_str(j, "author");
	ev.author_id = json_integer_value(json_object_get(j, "authorId"));
	ev.author_type = dup_str(j, "authorType");
	ev.author_hint = dup_str(j, "authorHint");
	ev.head_ref = dup_str(j, "headRef");
	ev.base_ref = dup_str(j, "baseRef");
	ev.clone_url = dup_str(j, "cloneUrl");
	ev.head_clone_url = dup_str(j, "headCloneUrl");
	ev.fork = json_object_get(j, "fork") == NULL ? -1 :
	    json_is_true(json_object_get(j, "fork"));
	ev.installation_id =
	    json_integer_value(json_object_get(j, "installationId"));
	ev.html_url = dup_str(j, "htmlUrl");
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
	if (base64_decode(token, strlen(token), out, outlen) < 0 ||
	    *outlen == 0)
		return -1;
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
	if (ts < now - 300 || ts > now + 300) {
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
 * A shape error: the payload is valid JSON but not what the provider
 * sends. Field paths are static strings.
 */
struct shape {
	const char *reason;
};

static const json_t *
path_get(const json_t *root, const char *path)
{
	char key[64];
	const char *p = path, *dot;
	const json_t *cur = root;

	while (cur != NULL && *p) {
		size_t n;

		dot = strchr(p, '.');
		n = dot ? (size_t)(dot - p) : strlen(p);
		if (n >= sizeof(key))
			return NULL;
		memcpy(key, p, n);
		key[n] = '\0';
		cur = json_is_object(cur) ? json_object_get(cur, key) : NULL;
		p += n + (dot ? 1 : 0);
	}
	return cur;
}

/*
 * Typed accessors: a missing or null field is "absent" (returns NULL/0,
 * and when required records the reason); a field of the wrong type always
 * records the reason.
 */
static const char *
get_str(const json_t *root, const char *path, int required, struct shape *sh,
    const char *why)
{
	const json_t *v = path_get(root, path);

	if (v == NULL || json_is_null(v)) {
		if (required && sh->reason == NULL)
			sh->reason = why;
		return NULL;
	}
	if (!json_is_string(v)) {
		if (sh->reason == NULL)
			sh->reason = why;
		return NULL;
	}
	return json_string_value(v);
}

static int64_t
get_int(const json_t *root, const char *path, int required, struct shape *sh,
    const char *why)
{
	const json_t *v = path_get(root, path);

	if (v == NULL || json_is_null(v)) {
		if (required && sh->reason == NULL)
			sh->reason = why;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < 0) {
		if (sh->reason == NULL)
			sh->reason = why;
		return 0;
	}
	return json_integer_value(v);
}

static int
get_bool(const json_t *root, const char *path, struct shape *sh,
    const char *why)
{
	const json_t *v = path_get(root, path);

	if (v == NULL || json_is_null(v))
		return 0;
	if (!json_is_boolean(v)) {
		if (sh->reason == NULL)
			sh->reason = why;
		return 0;
	}
	return json_is_true(v);
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
github_comment(const json_t *root, int review, const struct webhook_identity *self,
    struct scm_event *ev, struct shape *sh, const char **reason)
{
	const char *action, *body, *login, *type;

	action = get_str(root, "action", 1, sh, "missing or invalid 'action'");
	if (sh->reason != NULL)
		return WH_BAD_REQUEST;
	if (strcmp(action, "created") != 0) {
		*reason = "comment not newly created";
		return WH_IGNORE;
	}
	if (!review && path_get(root, "issue") != NULL &&
	    !json_is_object(path_get(root, "issue"))) {
		sh->reason = "invalid 'issue'";
		return WH_BAD_REQUEST;
	}
	if (!review && (path_get(root, "issue.pull_request") == NULL ||
	    json_is_null(path_get(root, "issue.pull_request")))) {
		*reason = "comment on an issue, not a pull request";
		return WH_IGNORE;
	}
	body = get_str(root, "comment.body", 1, sh,
	    "missing or invalid 'comment.body'");
	login = get_str(root, "comment.user.login", 1, sh,
	    "missing or invalid 'comment.user.login'");
	type = get_str(root, "comment.user.type", 0, sh,
	    "invalid 'comment.user.type'");
	ev->repo = opt_dup(get_str(root, "repository.full_name", 1, sh,
	    "missing or invalid 'repository.full_name'"));
	ev->repo_id = get_int(root, "repository.id", 0, sh,
	    "invalid 'repository.id'");
	ev->comment_id = get_int(root, "comment.id", 1, sh,
	    "missing or invalid 'comment.id'");
	ev->author_id = get_int(root, "comment.user.id", 0, sh,
	    "invalid 'comment.user.id'");
	ev->author_hint = opt_dup(get_str(root, "comment.author_association",
	    0, sh, "invalid 'comment.author_association'"));
	ev->html_url = opt_dup(get_str(root, "comment.html_url", 0, sh,
	    "invalid 'comment.html_url'"));
	ev->installation_id = get_int(root, "installation.id", 0, sh,
	    "invalid 'installation.id'");
	if (review) {
		ev->review_comment = 1;
		ev->number = get_int(root, "pull_request.number", 1, sh,
		    "missing or invalid 'pull_request.number'");
		ev->head_ref = opt_dup(get_str(root, "pull_request.head.ref",
		    0, sh, "invalid 'pull_request.head.ref'"));
		ev->base_ref = opt_dup(get_str(root, "pull_request.base.ref",
		    0, sh, "invalid 'pull_request.base.ref'"));
		ev->head_clone_url = opt_dup(get_str(root,
		    "pull_request.head.repo.clone_url", 0, sh,
		    "invalid 'pull_request.head.repo.clone_url'"));
		ev->clone_url = opt_dup(get_str(root,
		    "pull_request.base.repo.clone_url", 0, sh,
		    "invalid 'pull_request.base.repo.clone_url'"));
	} else {
		ev->number = get_int(root, "issue.number", 1, sh,
		    "missing or invalid 'issue.number'");
		ev->clone_url = opt_dup(get_str(root, "repository.clone_url",
		    0, sh, "invalid 'repository.clone_url'"));
	}
	if (sh->reason != NULL)
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
github_pull_request(const json_t *root, struct scm_event *ev,
    struct shape *sh, const char **reason)
{
	const char *action;
	int merged;

	action = get_str(root, "action", 1, sh, "missing or invalid 'action'");
	if (sh->reason != NULL)
		return WH_BAD_REQUEST;
	if (strcmp(action, "closed") != 0) {
		*reason = "pull request event other than closed";
		return WH_IGNORE;
	}
	ev->number = get_int(root, "number", 0, sh, "invalid 'number'");
	if (ev->number == 0)
		ev->number = get_int(root, "pull_request.number", 1, sh,
		    "missing or invalid 'number'");
	merged = get_bool(root, "pull_request.merged", sh,
	    "invalid 'pull_request.merged'");
	ev->repo = opt_dup(get_str(root, "repository.full_name", 1, sh,
	    "missing or invalid 'repository.full_name'"));
	ev->repo_id = get_int(root, "repository.id", 0, sh,
	    "invalid 'repository.id'");
	ev->author_login = opt_dup(get_str(root, "sender.login", 0, sh,
	    "invalid 'sender.login'"));
	ev->head_ref = opt_dup(get_str(root, "pull_request.head.ref", 0, sh,
	    "invalid 'pull_request.head.ref'"));
	ev->base_ref = opt_dup(get_str(root, "pull_request.base.ref", 0, sh,
	    "invalid 'pull_request.base.ref'"));
	ev->html_url = opt_dup(get_str(root, "pull_request.html_url", 0, sh,
	    "invalid 'pull_request.html_url'"));
	ev->installation_id = get_int(root, "installation.id", 0, sh,
	    "invalid 'installation.id'");
	if (sh->reason != NULL)
		return WH_BAD_REQUEST;
	ev->kind = merged ? SCM_EV_MERGED : SCM_EV_CLOSED;
	return WH_ACCEPT;
}

static enum webhook_verdict
github_normalize(const char *event, const json_t *root,
    const struct webhook_identity *self, struct scm_event *ev,
    struct shape *sh, const char **reason)
{
	if (strcmp(event, "ping") == 0) {
		*reason = "ping";
		ev->kind = SCM_EV_PING;
		return WH_IGNORE;
	}
	if (strcmp(event, "issue_comment") == 0)
		return github_comment(root, 0, self, ev, sh, reason);
	if (strcmp(event, "pull_request_review_comment") == 0)
		return github_comment(root, 1, self, ev, sh, reason);
	if (strcmp(event, "pull_request") == 0)
		return github_pull_request(root, ev, sh, reason);
	*reason = "event not handled";
	return WH_IGNORE;
}

/*
 * GitLab project access token and group access token users are bots
 * named project_<id>_bot_<hex> / group_<id>_bot_<hex>.
 */
static int
gitlab_bot_username(const char *u)
{
	const char *p;

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
	return strncmp(p, "_bot", 4) == 0;
}

/* GitLab: Note Hook / Confidential Note Hook on a merge request. */
static enum webhook_verdict
gitlab_note(const json_t *root, const struct webhook_identity *self,
    struct scm_event *ev, struct shape *sh, const char **reason)
{
	const char *type, *action, *body, *user;
	int64_t src, dst;

	type = get_str(root, "object_attributes.noteable_type", 1, sh,
	    "missing or invalid 'object_attributes.noteable_type'");
	action = get_str(root, "object_attributes.action", 0, sh,
	    "invalid 'object_attributes.action'");
	if (sh->reason != NULL)
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
	if (get_bool(root, "object_attributes.system", sh,
	    "invalid 'object_attributes.system'")) {
		*reason = "system note";
		return WH_IGNORE;
	}
	body = get_str(root, "object_attributes.note", 1, sh,
	    "missing or invalid 'object_attributes.note'");
	user = get_str(root, "user.username", 1, sh,
	    "missing or invalid 'user.username'");
	ev->author_id = get_int(root, "user.id", 0, sh, "invalid 'user.id'");
	ev->comment_id = get_int(root, "object_attributes.id", 1, sh,
	    "missing or invalid 'object_attributes.id'");
	ev->project_id = get_int(root, "project_id", 0, sh,
	    "invalid 'project_id'");
	if (ev->project_id == 0)
		ev->project_id = get_int(root, "project.id", 1, sh,
		    "missing or invalid 'project_id'");
	ev->repo = opt_dup(get_str(root, "project.path_with_namespace", 1, sh,
	    "missing or invalid 'project.path_with_namespace'"));
	ev->number = get_int(root, "merge_request.iid", 1, sh,
	    "missing or invalid 'merge_request.iid'");
	ev->head_ref = opt_dup(get_str(root, "merge_request.source_branch", 0,
	    sh, "invalid 'merge_request.source_branch'"));
	ev->base_ref = opt_dup(get_str(root, "merge_request.target_branch", 0,
	    sh, "invalid 'merge_request.target_branch'"));
	ev->head_clone_url = opt_dup(get_str(root,
	    "merge_request.source.git_http_url", 0, sh,
	    "invalid 'merge_request.source.git_http_url'"));
	ev->clone_url = opt_dup(get_str(root, "project.git_http_url", 0, sh,
	    "invalid 'project.git_http_url'"));
	ev->html_url = opt_dup(get_str(root, "object_attributes.url", 0, sh,
	    "invalid 'object_attributes.url'"));
	src = get_int(root, "merge_request.source_project_id", 0, sh,
	    "invalid 'merge_request.source_project_id'");
	dst = get_int(root, "merge_request.target_project_id", 0, sh,
	    "invalid 'merge_request.target_project_id'");
	if (sh->reason != NULL)
		return WH_BAD_REQUEST;
	ev->fork = (src != 0 && dst != 0) ? src != dst : -1;
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
gitlab_merge_request(const json_t *root, struct scm_event *ev,
    struct shape *sh, const char **reason)
{
	const char *action;

	action = get_str(root, "object_attributes.action", 0, sh,
	    "invalid 'object_attributes.action'");
	if (sh->reason != NULL)
		return WH_BAD_REQUEST;
	if (action == NULL ||
	    (strcmp(action, "close") != 0 && strcmp(action, "merge") != 0)) {
		*reason = "merge request event other than close or merge";
		return WH_IGNORE;
	}
	ev->number = get_int(root, "object_attributes.iid", 1, sh,
	    "missing or invalid 'object_attributes.iid'");
	ev->project_id = get_int(root, "project.id", 0, sh,
	    "invalid 'project.id'");
	if (ev->project_id == 0)
		ev->project_id = get_int(root, "object_attributes.target_project_id",
		    1, sh, "missing or invalid 'project.id'");
	ev->repo = opt_dup(get_str(root, "project.path_with_namespace", 1, sh,
	    "missing or invalid 'project.path_with_namespace'"));
	ev->author_login = opt_dup(get_str(root, "user.username", 0, sh,
	    "invalid 'user.username'"));
	ev->head_ref = opt_dup(get_str(root, "object_attributes.source_branch",
	    0, sh, "invalid 'object_attributes.source_branch'"));
	ev->base_ref = opt_dup(get_str(root, "object_attributes.target_branch",
	    0, sh, "invalid 'object_attributes.target_branch'"));
	ev->html_url = opt_dup(get_str(root, "object_attributes.url", 0, sh,
	    "invalid 'object_attributes.url'"));
	if (sh->reason != NULL)
		return WH_BAD_REQUEST;
	ev->kind = strcmp(action, "merge") == 0 ? SCM_EV_MERGED : SCM_EV_CLOSED;
	return WH_ACCEPT;
}

static enum webhook_verdict
gitlab_normalize(const char *event, const json_t *root,
    const struct webhook_identity *self, struct scm_event *ev,
    struct shape *sh, const char **reason)
{
	if (strcmp(event, "Note Hook") == 0 ||
	    strcmp(event, "Confidential Note Hook") == 0)
		return gitlab_note(root, self, ev, sh, reason);
	if (strcmp(event, "Merge Request Hook") == 0)
		return gitlab_merge_request(root, ev, sh, reason);
	*reason = "event not handled";
	return WH_IGNORE;
}

/* Classify an authenticated payload. */
enum webhook_verdict
webhook_normalize(enum scm_provider provider, const char *event,
    const char *delivery, const char *jsontext, size_t len,
    const struct webhook_identity *self, struct scm_event *out,
    const char **reason)
{
	struct scm_event ev;
	struct shape sh = { NULL };
	json_error_t err;
	json_t *root;
	enum webhook_verdict v;

	memset(&ev, 0, sizeof(ev));
	ev.fork = -1;
	root = json_loadb(jsontext, len, JSON_REJECT_DUPLICATES, &err);
	if (root == NULL) {
		*reason = "body is not valid JSON";
		return WH_BAD_REQUEST;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		*reason = "body is not a JSON object";
		return WH_BAD_REQUEST;
	}
	ev.provider = provider;
	ev.delivery = xstrdup(delivery);
	ev.event_name = xstrdup(event);
	if (provider == SCM_GITHUB)
		v = github_normalize(event, root, self, &ev, &sh, reason);
	else
		v = gitlab_normalize(event, root, self, &ev, &sh, reason);
	json_decref(root);
	if (v == WH_BAD_REQUEST) {
		*reason = sh.reason;
		scm_event_release(&ev);
		return v;
	}
	if (v == WH_ACCEPT)
		*reason = NULL;
	*out = ev;
	return v;
}

/* Decode application/x-www-form-urlencoded "payload=<json>". */
static int
form_payload(const char *body, size_t len, char **out, size_t *outlen)
{
	struct buf b;
	size_t i, start = 0, end = len;
	int found = 0;

	/* find the payload field among &-separated fields */
	for (i = 0; i <= len; i++) {
		if (i == len || body[i] == '&') {
			if (i - start >= 8 &&
			    memcmp(body + start, "payload=", 8) == 0) {
				if (found)
					return -1;
				found = 1;
				end = i;
				break;
			}
			start = i + 1;
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

static int
media_type_is(const char *ct, const char *want)
{
	size_t n = strlen(want);

	if (ct == NULL)
		return 0;
	while (*ct == ' ')
		ct++;
	return strncasecmp(ct, want, n) == 0 &&
	    (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
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
	const char *event, *delivery;
	char hex[65];

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
	delivery = header(arg, "Idempotency-Key");
	if (delivery == NULL || *delivery == '\0')
		delivery = header(arg, "X-Gitlab-Event-UUID");
	if (delivery == NULL || *delivery == '\0') {
		/*
		 * GitLab before 14.8 sends no delivery id: the body's digest
		 * keys it, so an identical resend is still a duplicate.
		 */
		unsigned char h[32];

		hmac_sha256("diverge-delivery", 16, body, len, h);
		hex_encode(h, 32, hex);
		delivery = hex;
	}
	if (!delivery_ok(delivery)) {
		*reason = "invalid delivery id";
		return WH_BAD_REQUEST;
	}
	return webhook_normalize(SCM_GITLAB, event, delivery, body, len, self,
	    out, reason);
}

/* Authenticate and classify one delivery. */
enum webhook_verdict
webhook_handle(enum scm_provider provider, const struct webhook_keys *keys,
    const struct webhook_identity *self, webhook_header_fn header,
    void *header_arg, const char *body, size_t len, int64_t now,
    struct scm_event *out, const char **reason)
{
	if (provider == SCM_GITHUB)
		return handle_github(keys, self, header, header_arg, body, len,
		    out, reason);
	return handle_gitlab(keys, self, header, header_arg, body, len, now,
	    out, reason);
}
