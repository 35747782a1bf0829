/*
 * The GitLab REST v4 client (gitlab.com or a self-hosted instance, with
 * or without a sub-path: the base is gitlab.api_url as written, e.g.
 * https://HOST/gitlab/api/v4). The configured token always travels in a
 * PRIVATE-TOKEN header: personal, project and group access tokens all
 * accept it, and the daemon has no OAuth flow that would need Bearer.
 * Projects are addressed by their numeric id, merge requests by iid.
 */
#include "config.h"

#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "config/config.h"
#include "scm/client.h"
#include "scm/scm.h"
#include "util/util.h"

#define GL_MAX_RELISTS	3	/* a note list changing while it is read */

struct gitlab {
	struct scm_client c;	/* first: the ops */
	struct scm_http *http;
	pthread_rwlock_t cred;	/* auth changes on SIGHUP */
	char *auth;		/* "PRIVATE-TOKEN: ..." */
};

static struct gitlab *
gl_of(struct scm_client *c)
{
	return (struct gitlab *)c;
}

/* One HTTP call with the token as it is now (a copy: SIGHUP may swap it). */
static int
gl_http(struct gitlab *g, struct scm_req *rq, struct scm_resp *rp,
    char **cause)
{
	char *auth;
	int ret;

	pthread_rwlock_rdlock(&g->cred);
	auth = xstrdup(g->auth);
	pthread_rwlock_unlock(&g->cred);
	rq->auth = auth;
	rq->cred = "token";	/* GitLab limits per user: the token's */
	ret = scm_http_call(g->http, rq, rp, cause);
	rq->auth = NULL;
	scm_secret_free(auth);
	return ret;
}

/* The token of gitlab.token as a header line. */
static int
gl_load_auth(const struct config *cfg, char **auth, char **cause)
{
	char *tok = NULL;

	if (cfg->gitlab.token == NULL) {
		*cause = xstrdup("gitlab: 'gitlab.token' is not configured");
		return -1;
	}
	if (scm_secret_load("gitlab", "gitlab.token", cfg->gitlab.token, &tok,
	    cause) < 0)
		return -1;
	if (strpbrk(tok, "\r\n") != NULL) {
		*cause = xstrdup("gitlab: 'gitlab.token' holds a line break");
		scm_secret_free(tok);
		return -1;
	}
	*auth = xasprintf("PRIVATE-TOKEN: %s", tok);
	scm_secret_free(tok);
	return 0;
}

/* SIGHUP: the token again, from its file or variable. */
static int
gl_reload(struct scm_client *c, const struct config *cfg, char **cause)
{
	struct gitlab *g = gl_of(c);
	char *auth = NULL, *old;

	if (gl_load_auth(cfg, &auth, cause) < 0)
		return -1;
	pthread_rwlock_wrlock(&g->cred);
	old = g->auth;
	g->auth = auth;
	pthread_rwlock_unlock(&g->cred);
	scm_secret_free(old);
	return 0;
}

/* One call with the token; body_key/body make a {"key": body} JSON. */
static int
gl_call(struct gitlab *g, const char *op, const char *method,
    const char *url, const char *body_key, const char *body,
    int idempotent, struct scm_resp *rp, char **cause)
{
	struct scm_req rq = { 0 };
	char *json = NULL;
	json_t *j;
	int ret;

	if (body_key != NULL) {
		j = json_pack("{s:s}", body_key, body != NULL ? body : "");
		json = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
		json_decref(j);
		if (json == NULL) {
			*cause = xasprintf("gitlab: the %s is not valid "
			    "UTF-8", body_key);
			return SCM_EINVALID;
		}
	}
	rq.op = op;
	rq.method = method;
	rq.url = url;
	rq.body = json;
	rq.body_len = json != NULL ? strlen(json) : 0;
	rq.idempotent = idempotent;
	ret = gl_http(g, &rq, rp, cause);
	free(json);
	return ret;
}

static int
check_project(const struct scm_repo *repo, char **cause)
{
	if (repo == NULL || repo->project_id <= 0) {
		*cause = xstrdup("gitlab: no numeric project id");
		return SCM_EINVALID;
	}
	return SCM_OK;
}

/* GET /projects/:id: its http_url_to_repo. */
static int
project_clone_url(struct gitlab *g, int64_t id, char **out, char **cause)
{
	struct scm_resp rp;
	char url[64];
	json_t *j = NULL;
	int ret;

	scm_resp_init(&rp);
	snprintf(url, sizeof(url), "/projects/%" PRId64, id);
	ret = gl_call(g, "get_project", "GET", url, NULL, NULL, 1, &rp, cause);
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "gitlab: get project", &j, cause);
	if (ret != SCM_OK)
		goto out;
	*out = scm_json_strdup(j, "http_url_to_repo");
	if (*out == NULL) {
		*cause = xstrdup("gitlab: get project: the reply has no "
		    "http_url_to_repo");
		ret = SCM_EINTERNAL;
	}
out:
	json_decref(j);
	scm_resp_release(&rp);
	return ret;
}

static int
gl_get_pr(struct scm_client *c, const struct scm_repo *repo, int64_t number,
    struct scm_pr *out, char **cause)
{
	struct gitlab *g = gl_of(c);
	struct scm_req rq = { 0 };
	struct scm_resp rp;
	struct scm_pr pr;
	char url[96];
	int64_t src, dst;
	json_t *j = NULL;
	int ret;

	memset(&pr, 0, sizeof(pr));
	scm_resp_init(&rp);
	ret = check_project(repo, cause);
	if (ret != SCM_OK)
		goto out;
	snprintf(url, sizeof(url), "/projects/%" PRId64 "/merge_requests/%"
	    PRId64, repo->project_id, number);
	rq.op = "get_pr";
	rq.method = "GET";
	rq.url = url;
	rq.idempotent = 1;
	rq.retry_404 = 2;	/* an MR just commented on exists */
	ret = gl_http(g, &rq, &rp, cause);
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "gitlab: get merge request", &j, cause);
	if (ret != SCM_OK)
		goto out;
	pr.state = scm_json_strdup(j, "state");
	pr.merged = pr.state != NULL && strcmp(pr.state, "merged") == 0;
	pr.head_ref = scm_json_strdup(j, "source_branch");
	pr.base_ref = scm_json_strdup(j, "target_branch");
	pr.head_sha = scm_json_strdup(j, "sha");
	pr.author = scm_json_strdup(json_object_get(j, "author"), "username");
	pr.html_url = scm_json_strdup(j, "web_url");
	src = scm_json_int(j, "source_project_id");
	dst = scm_json_int(j, "target_project_id");
	if (dst <= 0)
		dst = repo->project_id;
	if (src <= 0)
		src = dst;
	pr.fork = src != dst;
	if (pr.state == NULL || pr.head_ref == NULL || pr.base_ref == NULL ||
	    pr.head_sha == NULL) {
		*cause = xstrdup("gitlab: get merge request: the reply lacks "
		    "state, branches or sha");
		ret = SCM_EINTERNAL;
		goto out;
	}
	/* the MR does not carry clone URLs: ask the projects */
	ret = project_clone_url(g, dst, &pr.clone_url, cause);
	if (ret != SCM_OK)
		goto out;
	if (pr.fork)
		ret = project_clone_url(g, src, &pr.head_clone_url, cause);
	else
		pr.head_clone_url = xstrdup(pr.clone_url);
	if (ret != SCM_OK)
		goto out;
	*out = pr;
	memset(&pr, 0, sizeof(pr));	/* now the caller's */
out:
	scm_pr_release(&pr);
	json_decref(j);
	scm_resp_release(&rp);
	return ret;
}

/* A note as the API shows it (a list's item, or one note). */
static void
note_from(const json_t *e, struct scm_comment *cm)
{
	scm_comment_from(e, "author", "username", cm);
	cm->system = json_is_true(json_object_get(e, "system"));
}

static int
gl_list_comments(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, struct scm_comment **out, size_t *n, char **cause)
{
	struct gitlab *g = gl_of(c);
	struct scm_resp rp;
	struct scm_comment *v = NULL;
	size_t nv = 0, cap = 0, i, got;
	int64_t page = 1, total = -1;
	char url[160];
	json_t *j = NULL, *e;
	int ret, pages = 0, relists = 0;

	scm_resp_init(&rp);
	ret = check_project(repo, cause);
	if (ret != SCM_OK)
		goto out;
	while (page > 0) {
		if (++pages > SCM_MAX_PAGES) {
			*cause = xasprintf("gitlab: list notes: more than %d "
			    "pages", SCM_MAX_PAGES);
			ret = SCM_EINTERNAL;
			goto out;
		}
		snprintf(url, sizeof(url), "/projects/%" PRId64
		    "/merge_requests/%" PRId64 "/notes?per_page=%d&sort=asc"
		    "&order_by=created_at&page=%" PRId64, repo->project_id,
		    number, SCM_PER_PAGE, page);
		ret = gl_call(g, "list_comments", "GET", url, NULL, NULL, 1,
		    &rp, cause);
		if (ret != SCM_OK)
			goto out;
		ret = scm_json_page(&rp, "gitlab: list notes", &j, cause);
		if (ret != SCM_OK)
			goto out;
		/*
		 * Pages are offsets: a note deleted before this page since
		 * the first one moved a note of this page onto the last,
		 * unseen (the sticky comment, found missing, would be posted
		 * twice). x-total tells that the notes changed: list them
		 * again, a few times at most, then take what was seen.
		 */
		if (page == 1)
			total = rp.total;
		else if (total >= 0 && rp.total >= 0 && rp.total != total &&
		    relists < GL_MAX_RELISTS) {
			relists++;
			scm_comments_free(v, nv);
			v = NULL;
			nv = cap = 0;
			json_decref(j);
			j = NULL;
			page = 1;
			pages = 0;
			continue;
		}
		got = json_array_size(j);
		json_array_foreach(j, i, e) {
			if (!json_is_object(e))
				continue;
			if (nv == cap) {
				cap = cap ? cap * 2 : 32;
				v = xrealloc(v, cap * sizeof(*v));
			}
			note_from(e, &v[nv++]);
		}
		json_decref(j);
		j = NULL;
		/*
		 * X-Total and X-Total-Pages are not needed: GitLab.com leaves
		 * them out beyond 10,000 records
		 */
		if (scm_next_page_stale(&rp, page, NULL, 0,
		    "gitlab: list notes")) {
			*cause = xstrdup("gitlab: list notes: the next page "
			    "goes back to a page read already");
			ret = SCM_EINTERNAL;
			goto out;
		}
		page = scm_next_page(&rp, page, got);
	}
	*out = v;
	*n = nv;
	v = NULL;	/* now the caller's */
	ret = SCM_OK;
out:
	scm_comments_free(v, nv);
	json_decref(j);
	scm_resp_release(&rp);
	return ret;
}

/*
 * POST a note; internal: {"body", "internal": true}, a note only project
 * members see (the older parameter name, confidential, is deprecated).
 */
static int
create_note(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, const char *body, int internal, int64_t *id_out,
    char **cause)
{
	struct scm_resp rp;
	struct scm_req rq = { 0 };
	char url[96];
	char *text = NULL;
	json_t *j = NULL;
	int64_t id;
	int ret;

	scm_resp_init(&rp);
	ret = check_project(repo, cause);
	if (ret != SCM_OK)
		goto out;
	snprintf(url, sizeof(url), "/projects/%" PRId64 "/merge_requests/%"
	    PRId64 "/notes", repo->project_id, number);
	if (!internal) {
		ret = gl_call(gl_of(c), "create_comment", "POST", url, "body",
		    body, 0, &rp, cause);
	} else {
		j = json_pack("{s:s,s:b}", "body", body != NULL ? body : "",
		    "internal", 1);
		text = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
		json_decref(j);
		j = NULL;
		if (text == NULL) {
			*cause = xstrdup("gitlab: the body is not valid UTF-8");
			ret = SCM_EINVALID;
			goto out;
		}
		rq.op = "create_comment";
		rq.method = "POST";
		rq.url = url;
		rq.body = text;
		rq.body_len = strlen(text);
		ret = gl_http(gl_of(c), &rq, &rp, cause);
	}
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "gitlab: create note", &j, cause);
	if (ret != SCM_OK)
		goto out;
	id = scm_json_int(j, "id");
	if (id <= 0) {
		*cause = xstrdup("gitlab: create note: the reply has no id");
		ret = SCM_EINTERNAL;
		goto out;
	}
	if (id_out != NULL)
		*id_out = id;
out:
	free(text);
	json_decref(j);
	scm_resp_release(&rp);
	return ret;
}

static int
gl_create_comment(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, const char *body, int64_t *id_out, char **cause)
{
	return create_note(c, repo, number, body, 0, id_out, cause);
}

static int
gl_create_internal_comment(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, const char *body, int64_t *id_out, char **cause)
{
	return create_note(c, repo, number, body, 1, id_out, cause);
}

/* A call on note id of MR number; body: a {"body": ...} to send. */
static int
note_call(struct scm_client *c, const struct scm_repo *repo, int64_t number,
    int64_t id, const char *op, const char *method, const char *body,
    struct scm_resp *rp, char **cause)
{
	char url[128];
	int ret;

	ret = check_project(repo, cause);
	if (ret != SCM_OK)
		return ret;
	snprintf(url, sizeof(url), "/projects/%" PRId64 "/merge_requests/%"
	    PRId64 "/notes/%" PRId64, repo->project_id, number, id);
	return gl_call(gl_of(c), op, method, url, body != NULL ? "body" : NULL,
	    body, 1, rp, cause);
}

static int
gl_get_comment(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, int64_t id, struct scm_comment *out, char **cause)
{
	struct scm_resp rp;
	int ret;

	memset(out, 0, sizeof(*out));
	scm_resp_init(&rp);
	ret = note_call(c, repo, number, id, "get_comment", "GET", NULL, &rp,
	    cause);
	if (ret == SCM_OK)
		ret = scm_comment_reply(&rp, "gitlab: get note", id, note_from,
		    out, cause);
	scm_resp_release(&rp);
	return ret;
}

static int
gl_update_comment(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, int64_t id, const char *body, char **cause)
{
	struct scm_resp rp;
	int ret;

	scm_resp_init(&rp);
	ret = note_call(c, repo, number, id, "update_comment", "PUT", body,
	    &rp, cause);
	scm_resp_release(&rp);
	return ret;
}

static int
gl_delete_comment(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, int64_t id, char **cause)
{
	struct scm_resp rp;
	int ret;

	scm_resp_init(&rp);
	ret = note_call(c, repo, number, id, "delete_comment", "DELETE", NULL,
	    &rp, cause);
	scm_resp_release(&rp);
	return ret;
}

static int
gl_react(struct scm_client *c, const struct scm_repo *repo, int64_t number,
    int64_t comment_id, int review, const char *reaction, char **cause)
{
	struct scm_resp rp;
	char url[160];
	int ret;

	(void)review;	/* GitLab diff notes are notes too */
	scm_resp_init(&rp);
	ret = check_project(repo, cause);
	if (ret != SCM_OK)
		goto out;
	snprintf(url, sizeof(url), "/projects/%" PRId64 "/merge_requests/%"
	    PRId64 "/notes/%" PRId64 "/award_emoji", repo->project_id, number,
	    comment_id);
	ret = gl_call(gl_of(c), "react", "POST", url, "name", reaction, 1, &rp,
	    cause);
	/*
	 * A duplicate award: GitLab answers 404 ("Award Emoji ...", the
	 * award was not persisted), some versions 409. Both mean the emoji
	 * is there already (scm-wire.md section 8).
	 */
	if (ret != SCM_OK && (rp.code == 404 || rp.code == 409)) {
		free(*cause);
		*cause = NULL;
		ret = SCM_OK;
	}
out:
	scm_resp_release(&rp);
	return ret;
}

/*
 * Whether a membership's expires_at ("YYYY-MM-DD", older versions a full
 * time) has come: GitLab counts a membership expired from the start of
 * that day (UTC), but removes expired members only when its daily worker
 * runs, so members/all may still list one. A value that is not a date
 * counts as expired: fail closed.
 */
static int
membership_expired(const json_t *v)
{
	const char *s;
	char today[16];
	struct tm tm;
	time_t now = time(NULL);
	size_t i;

	if (v == NULL || json_is_null(v))
		return 0;
	s = json_string_value(v);
	if (s == NULL || strlen(s) < 10)
		return 1;
	for (i = 0; i < 10; i++) {
		if (i == 4 || i == 7 ? s[i] != '-' :
		    !isdigit((unsigned char)s[i]))
			return 1;
	}
	gmtime_r(&now, &tm);
	strftime(today, sizeof(today), "%Y-%m-%d", &tm);
	return strncmp(s, today, 10) <= 0;
}

static int
gl_permission(struct scm_client *c, const struct scm_repo *repo,
    const char *login, int64_t user_id, enum scm_permission *out,
    char **cause)
{
	struct scm_resp rp;
	char url[96];
	const char *state, *mstate;
	json_t *j = NULL;
	int64_t level;
	int ret;

	(void)login;
	scm_resp_init(&rp);
	ret = check_project(repo, cause);
	if (ret != SCM_OK)
		goto out;
	if (user_id <= 0) {
		*cause = xstrdup("gitlab: permission: no user id");
		ret = SCM_EINVALID;
		goto out;
	}
	snprintf(url, sizeof(url), "/projects/%" PRId64 "/members/all/%"
	    PRId64, repo->project_id, user_id);
	ret = gl_call(gl_of(c), "permission", "GET", url, NULL, NULL, 1, &rp,
	    cause);
	if (ret == SCM_ENOTFOUND) {
		/* not a member */
		free(*cause);
		*cause = NULL;
		*out = SCM_PERM_NONE;
		ret = SCM_OK;
		goto out;
	}
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "gitlab: permission", &j, cause);
	if (ret != SCM_OK)
		goto out;
	if (!json_is_integer(json_object_get(j, "access_level"))) {
		*cause = xstrdup("gitlab: permission: the reply has no "
		    "access_level");
		ret = SCM_EINTERNAL;
		goto out;
	}
	level = scm_json_int(j, "access_level");
	state = json_string_value(json_object_get(j, "state"));
	mstate = json_string_value(json_object_get(j, "membership_state"));
	/*
	 * the account blocked, the membership awaiting an owner's approval
	 * (a user cap) or expired: no access
	 */
	if ((state != NULL && strcmp(state, "active") != 0) ||
	    (mstate != NULL && strcmp(mstate, "active") != 0) ||
	    membership_expired(json_object_get(j, "expires_at")))
		*out = SCM_PERM_NONE;
	else if (level >= 40)
		*out = SCM_PERM_MAINTAIN;
	else if (level >= 30)
		*out = SCM_PERM_WRITE;
	else if (level > 0)
		*out = SCM_PERM_READ;
	else
		*out = SCM_PERM_NONE;
out:
	json_decref(j);
	scm_resp_release(&rp);
	return ret;
}

/* GET /users/:id: its "bot" field, whatever the username. */
static int
gl_is_bot(struct scm_client *c, const char *login, int64_t user_id,
    int *out, char **cause)
{
	struct scm_resp rp;
	char url[48];
	json_t *j = NULL, *bot;
	int ret;

	(void)login;
	scm_resp_init(&rp);
	if (user_id <= 0) {
		*cause = xstrdup("gitlab: user: no user id");
		ret = SCM_EINVALID;
		goto out;
	}
	snprintf(url, sizeof(url), "/users/%" PRId64, user_id);
	ret = gl_call(gl_of(c), "user", "GET", url, NULL, NULL, 1, &rp, cause);
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "gitlab: user", &j, cause);
	if (ret != SCM_OK)
		goto out;
	/* absent only before GitLab exposed it: cannot tell, fail closed */
	bot = json_object_get(j, "bot");
	if (!json_is_boolean(bot)) {
		*cause = xstrdup("gitlab: user: the reply has no bot field");
		ret = SCM_EINTERNAL;
		goto out;
	}
	*out = json_is_true(bot);
out:
	json_decref(j);
	scm_resp_release(&rp);
	return ret;
}

static int
gl_whoami(struct scm_client *c, char **login_out, int64_t *id_out,
    char **cause)
{
	struct scm_resp rp;
	json_t *j = NULL;
	const char *name;
	int ret;

	scm_resp_init(&rp);
	ret = gl_call(gl_of(c), "whoami", "GET", "/user", NULL, NULL, 1, &rp,
	    cause);
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "gitlab: whoami", &j, cause);
	if (ret != SCM_OK)
		goto out;
	name = json_string_value(json_object_get(j, "username"));
	if (name == NULL || *name == '\0') {
		*cause = xstrdup("gitlab: whoami: the reply has no username");
		ret = SCM_EINTERNAL;
		goto out;
	}
	*login_out = xstrdup(name);
	if (id_out != NULL)
		*id_out = scm_json_int(j, "id");
out:
	json_decref(j);
	scm_resp_release(&rp);
	return ret;
}

static int
gl_read_file(struct scm_client *c, const struct scm_repo *repo,
    const char *ref, const char *path, char **data, size_t *len,
    char **cause)
{
	struct gitlab *g = gl_of(c);
	struct scm_req rq = { 0 };
	struct scm_resp rp;
	char *url = NULL, *epath = NULL, *eref = NULL;
	int ret;

	scm_resp_init(&rp);
	ret = check_project(repo, cause);
	if (ret != SCM_OK)
		goto out;
	if (!scm_path_ok(path)) {
		*cause = xasprintf("gitlab: read file: '%s' is not a relative "
		    "path without . or .. parts", path != NULL ? path : "");
		ret = SCM_EINVALID;
		goto out;
	}
	epath = scm_escape(path);	/* one segment: '/' is %2F */
	if (ref != NULL && *ref != '\0') {
		eref = scm_escape(ref);
		url = xasprintf("/projects/%" PRId64 "/repository/files/%s/raw"
		    "?ref=%s", repo->project_id, epath, eref);
	} else
		url = xasprintf("/projects/%" PRId64 "/repository/files/%s/raw",
		    repo->project_id, epath);
	rq.op = "read_file";
	rq.method = "GET";
	rq.url = url;
	rq.accept = "*/*";
	rq.idempotent = 1;
	rq.max = SCM_MAX_FILE;
	ret = gl_http(g, &rq, &rp, cause);
	if (ret != SCM_OK)
		goto out;
	*len = rp.body.len;
	*data = buf_detach(&rp.body, NULL);
	if (*data == NULL)
		*data = xstrdup("");
out:
	scm_resp_release(&rp);
	free(url);
	free(epath);
	free(eref);
	return ret;
}

static void
gl_free(struct scm_client *c)
{
	struct gitlab *g = gl_of(c);

	if (g == NULL)
		return;
	scm_http_free(g->http);
	scm_secret_free(g->auth);
	pthread_rwlock_destroy(&g->cred);
	free(g);
}

static void
gl_keep_holds(struct scm_client *c, const char *path)
{
	scm_http_keep_holds(gl_of(c)->http, path);
}

static const struct scm_ops gitlab_ops = {
	.name = "gitlab",
	.get_pr = gl_get_pr,
	.list_comments = gl_list_comments,
	.create_comment = gl_create_comment,
	.create_internal_comment = gl_create_internal_comment,
	.get_comment = gl_get_comment,
	.update_comment = gl_update_comment,
	.delete_comment = gl_delete_comment,
	.react = gl_react,
	.permission = gl_permission,
	.is_bot = gl_is_bot,
	.whoami = gl_whoami,
	.read_file = gl_read_file,
	.reload = gl_reload,
	.keep_holds = gl_keep_holds,
	.free = gl_free,
};

/* The GitLab client of cfg, NULL when GitLab is disabled. */
int
scm_gitlab_new(struct scm_client **out, const struct config *cfg,
    char **cause)
{
	struct scm_http_config hc = { 0 };
	struct gitlab *g = NULL;
	int ret = -1;

	if (!cfg->gitlab.enabled) {
		*out = NULL;
		return 0;
	}
	g = xcalloc(1, sizeof(*g));
	g->c.ops = &gitlab_ops;
	pthread_rwlock_init(&g->cred, NULL);
	hc.provider = SCM_GITLAB;
	hc.api_url = cfg->gitlab.api_url != NULL ? cfg->gitlab.api_url :
	    "https://gitlab.com/api/v4";
	hc.ca_file = cfg->gitlab.ca_file;
	if (scm_http_new(&g->http, &hc, cause) < 0)
		goto out;
	if (gl_load_auth(cfg, &g->auth, cause) < 0)
		goto out;
	g->c.who = scm_who_new();
	*out = &g->c;
	g = NULL;	/* now the caller's */
	ret = 0;
out:
	if (g != NULL)
		gl_free(&g->c);
	return ret;
}
