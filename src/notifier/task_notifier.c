/*
 * task_notifier: keeps one sticky status comment per PR/MR in line with
 * its AgentTask (DESIGN.md section 9).
 *
 * One thread lists and watches AgentTasks in every namespace and queues
 * the PR/MR each task belongs to; worker threads take one PR/MR key at a
 * time (the queue never hands a key to two workers), read its tasks
 * afresh and bring the comment in line. What was reported is written back
 * to status.notifier with a conditional merge patch, so the work is
 * level-based: a restart, a lost event or a failed call is repaired by the
 * next pass (requeues with backoff, and a periodic relist).
 */
#include <config.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/config.h"
#include "controller/controller.h"
#include "k8s/k8s.h"
#include "notifier/notifier.h"
#include "scm/scm.h"
#include "util/util.h"

#define DEFAULT_WORKERS 3
#define DEFAULT_THROTTLE_MS 30000
#define DEFAULT_RESYNC_MS (5 * 60 * 1000)
#define BACKOFF_BASE_MS 1000
#define BACKOFF_MAX_MS (5 * 60 * 1000)
#define RATELIMIT_FLOOR_MS 1000	/* least wait after a rate limit */
#define RATELIMIT_MAX_MS (60 * 60 * 1000)	/* a reset further away: look again */
#define MAX_CONFLICTS 20
#define DEFAULT_REFUSED_MS (10 * 60 * 1000)
#define WATCH_BACKOFF_BASE_MS 500
#define WATCH_BACKOFF_MAX_MS 30000
/* a watch that ran this long before it ended was a healthy one */
#define WATCH_HEALTHY_MS 60000

/* One known task: which PR/MR it reports to, and its throttle clock. */
struct entry {
	char *tkey;		/* "namespace/name" */
	char *pkey;		/* "github|owner/repo|42|0" */
	int64_t last_sent_ms;	/* monotonic, 0: never */
	unsigned failures;
	/*
	 * After a failure: no update before this time (unix ms), whoever
	 * queues the task: a rate limit's reset, the backoff, or the wait
	 * of a PR/MR that refuses the bot's writes. A busy task changes its
	 * status many times a minute; each change must not be a new call.
	 */
	int64_t retry_at;
	int refused;	/* the provider refuses the bot's writes (logged) */
	uint64_t listed;	/* the last list (n->lists) that showed it */
	struct entry *next;
};

struct notifier {
	struct notifier_config c;
	pthread_mutex_t mu;	/* entries, identity, counters, stopping */
	struct entry *entries;
	char *gh_login;
	char *gl_user;
	int64_t gl_id;
	/* ask whoami again (a reload: the token may be another user's) */
	int gh_stale;
	int gl_stale;
	/*
	 * "provider:project:id" of the comments seen to be the bot's own
	 * (still_mine), emptied when the bot's identity changes
	 */
	json_t *own;
	int stopping;
	pthread_cond_t stop_cv;	/* with mu: the watcher's waits end at a stop */
	uint64_t updates;
	uint64_t failures;
	uint64_t lists;	/* lists of the tasks so far (the watcher's) */
	struct controller_queue *q;
	pthread_t watcher;
	int watcher_running;
	pthread_t *workers;
	int nworkers;
};

/* Where a task reports: its provider, repository and PR/MR. */
struct target {
	enum scm_provider provider;
	const char *project;
	int64_t project_id;
	int64_t number;
};

static const char *
ann(const json_t *task, const char *key)
{
	const json_t *v = json_object_get(json_object_get(json_object_get(task,
	    "metadata"), "annotations"), key);

	return json_is_string(v) ? json_string_value(v) : NULL;
}

static int64_t
num(const char *s)
{
	char *end;
	long long v;

	if (s == NULL || *s == '\0')
		return 0;
	v = strtoll(s, &end, 10);
	return *end == '\0' && v > 0 ? (int64_t)v : 0;
}

/* The PR/MR of task from its annotations; -1 when it has none. */
static int
task_target(const json_t *task, struct target *t)
{
	const char *p = ann(task, "divergedev.com/provider");

	memset(t, 0, sizeof(*t));
	if (p == NULL)
		return -1;
	t->project = ann(task, "divergedev.com/project");
	if (strcmp(p, "github") == 0) {
		t->provider = SCM_GITHUB;
		t->number = num(ann(task, "divergedev.com/pr-number"));
	} else if (strcmp(p, "gitlab") == 0) {
		t->provider = SCM_GITLAB;
		t->number = num(ann(task, "divergedev.com/mr-iid"));
		t->project_id = num(ann(task, "divergedev.com/project-id"));
	} else
		return -1;
	if (t->project == NULL || *t->project == '\0' || t->number <= 0)
		return -1;
	return 0;
}

static char *
target_key(const struct target *t)
{
	return xasprintf("%s|%s|%" PRId64 "|%" PRId64,
	    scm_provider_name(t->provider), t->project, t->number,
	    t->project_id);
}

static char *
task_key(const json_t *task)
{
	const char *ns = k8s_meta_str(task, "namespace");
	const char *name = k8s_meta_str(task, "name");

	if (ns == NULL || name == NULL)
		return NULL;
	return xasprintf("%s/%s", ns, name);
}

static int
is_stopping(struct notifier *n)
{
	int s;

	pthread_mutex_lock(&n->mu);
	s = n->stopping;
	pthread_mutex_unlock(&n->mu);
	return s;
}

/* Caller holds mu. */
static struct entry *
find_entry(struct notifier *n, const char *tkey)
{
	struct entry *e;

	for (e = n->entries; e != NULL; e = e->next)
		if (strcmp(e->tkey, tkey) == 0)
			return e;
	return NULL;
}

static void
entry_free(struct entry *e)
{
	free(e->tkey);
	free(e->pkey);
	free(e);
}

static void
untrack(struct notifier *n, const char *tkey)
{
	struct entry **pp, *e;

	pthread_mutex_lock(&n->mu);
	for (pp = &n->entries; (e = *pp) != NULL; pp = &e->next) {
		if (strcmp(e->tkey, tkey) == 0) {
			*pp = e->next;
			entry_free(e);
			break;
		}
	}
	pthread_mutex_unlock(&n->mu);
}

/* Remember task's PR/MR and queue that PR/MR. */
static void
track(struct notifier *n, const json_t *task)
{
	struct target t;
	struct entry *e;
	char *tkey, *pkey;

	if (task_target(task, &t) < 0 || (tkey = task_key(task)) == NULL)
		return;
	pkey = target_key(&t);
	pthread_mutex_lock(&n->mu);
	e = find_entry(n, tkey);
	if (e == NULL) {
		e = xcalloc(1, sizeof(*e));
		e->tkey = tkey;
		tkey = NULL;	/* now owned by the entry */
		e->next = n->entries;
		n->entries = e;
	}
	if (e->pkey == NULL || strcmp(e->pkey, pkey) != 0) {
		free(e->pkey);
		e->pkey = xstrdup(pkey);
	}
	e->listed = n->lists;
	pthread_mutex_unlock(&n->mu);
	controller_queue_add(n->q, pkey);
	free(tkey);
	free(pkey);
}

/* ------------------------------------------------------------ scm side */

/*
 * The bot's own identity for provider p, asked when unknown, when a
 * reload made it stale, or when force (a write refused: the token may be
 * another user's now), through scm_client_whoami: after a reload the
 * daemon's own asking and this one share one request. 1 when known (a
 * stale one kept when whoami fails), 0 when not, or when force and
 * whoami fails.
 */
static int
self_known(struct notifier *n, struct scm_client *cl, enum scm_provider p,
    int force)
{
	char *login = NULL, *cause = NULL, *old = NULL;
	int64_t id = 0;
	int known, stale, changed;

	pthread_mutex_lock(&n->mu);
	known = p == SCM_GITHUB ? n->gh_login != NULL :
	    (n->gl_user != NULL || n->gl_id > 0);
	stale = p == SCM_GITHUB ? n->gh_stale : n->gl_stale;
	pthread_mutex_unlock(&n->mu);
	if (known && !stale && !force)
		return 1;
	if (scm_client_whoami(cl, force, &login, &id, &cause) != SCM_OK) {
		log_kv(LOG_WARN, "notifier: bot identity unknown", "provider",
		    scm_provider_name(p), "error", cause, NULL);
		free(cause);
		return known && !force;
	}
	pthread_mutex_lock(&n->mu);
	if (p == SCM_GITHUB) {
		changed = n->gh_login == NULL ||
		    strcasecmp(n->gh_login, login) != 0;
		old = n->gh_login;
		n->gh_login = login;
		n->gh_stale = 0;
	} else {
		changed = n->gl_user == NULL ||
		    strcasecmp(n->gl_user, login) != 0 || n->gl_id != id;
		old = n->gl_user;
		n->gl_user = login;
		n->gl_id = id;
		n->gl_stale = 0;
	}
	if (changed)
		json_object_clear(n->own);
	pthread_mutex_unlock(&n->mu);
	if (changed && known)
		log_kv(LOG_INFO, "notifier: bot identity changed", "provider",
		    scm_provider_name(p), "from", old, "to", login, NULL);
	free(old);
	/* login is now owned by the notifier */
	return 1;
}

/* Whether the bot wrote comment c (the identity as now known). */
static int
is_mine(struct notifier *n, enum scm_provider p, const struct scm_comment *c)
{
	int mine;

	pthread_mutex_lock(&n->mu);
	if (p == SCM_GITHUB)
		mine = n->gh_login != NULL && c->author != NULL &&
		    strcasecmp(c->author, n->gh_login) == 0;
	else if (n->gl_id > 0)
		mine = c->author_id == n->gl_id;
	else
		mine = n->gl_user != NULL && c->author != NULL &&
		    strcasecmp(c->author, n->gl_user) == 0;
	pthread_mutex_unlock(&n->mu);
	return mine;
}

/* At most this many comments known to be the bot's (then: forgotten). */
#define OWN_MAX 4096

/* The key of comment id in n->own. */
static char *
own_key(const struct target *t, int64_t id)
{
	return xasprintf("%d:%s:%" PRId64, (int)t->provider, t->project, id);
}

/* Comment id is the bot's own: made, found or checked as such. */
static void
own_add(struct notifier *n, const struct target *t, int64_t id)
{
	char *key = own_key(t, id);

	pthread_mutex_lock(&n->mu);
	if (json_object_size(n->own) >= OWN_MAX)
		json_object_clear(n->own);
	json_object_set_new(n->own, key, json_true());
	pthread_mutex_unlock(&n->mu);
	free(key);
}

/*
 * Whether comment id, about to be edited in place, is still the bot's
 * own. An edit that goes through does not tell: GitHub lets anyone with
 * write access edit anyone's comment, GitLab a Maintainer or an
 * administrator, so after a token of another user (or an App in place of
 * a user) the old user's comment would be edited for good. Asked once
 * per comment while the bot's identity stays the same. 1 when it is (or
 * cannot be told: no identity, a provider without get_comment), 0 when
 * it is another user's, else an SCM_E* (SCM_ENOTFOUND: it is gone).
 */
static int
still_mine(struct notifier *n, struct scm_client *cl, const struct target *t,
    const struct scm_repo *repo, int64_t id, char **cause)
{
	struct scm_comment c;
	char *key;
	int rc, seen;

	/* first: a reload's new identity empties what was known as own */
	if (cl->ops->get_comment == NULL || !self_known(n, cl, t->provider, 0))
		return 1;
	key = own_key(t, id);
	pthread_mutex_lock(&n->mu);
	seen = json_object_get(n->own, key) != NULL;
	pthread_mutex_unlock(&n->mu);
	free(key);
	if (seen)
		return 1;
	rc = cl->ops->get_comment(cl, repo, t->number, id, &c, cause);
	if (rc == SCM_OK) {
		rc = is_mine(n, t->provider, &c);
		scm_comment_release(&c);
	}
	if (rc == 1)
		own_add(n, t, id);
	return rc;
}

/*
 * Whether comment c is the bot's own sticky comment: the bot's, and
 * opened by the marker (render puts it first). Anywhere else it may be a
 * reply of the bot's that quotes text with the marker in it.
 */
static int
is_sticky(struct notifier *n, enum scm_provider p,
    const struct scm_comment *c)
{
	if (c->body == NULL || strncmp(c->body, NOTIFIER_MARKER,
	    strlen(NOTIFIER_MARKER)) != 0 || c->system)
		return 0;
	return is_mine(n, p, c);
}

/*
 * Make the sticky comment carry body: update comment id when known, else
 * (or when a person deleted it) find the bot's comment with the marker
 * through every page, keep the oldest, delete the duplicates, and update
 * it or create one. *out gets the comment id.
 */
static int
ensure_comment(struct notifier *n, struct scm_client *cl,
    const struct target *t, int64_t id, const char *body, int64_t *out,
    char **cause)
{
	struct scm_repo repo = { t->project, t->project_id, 0 };
	struct scm_comment *v = NULL;
	size_t nv = 0, i;
	int64_t keep = 0;
	const char *keep_body = NULL;
	char *refusal = NULL;
	int rc;

	if (id > 0 && (rc = still_mine(n, cl, t, &repo, id, cause)) != 1) {
		if (rc == 0) {
			char idb[24];

			snprintf(idb, sizeof(idb), "%" PRId64, id);
			log_kv(LOG_INFO, "notifier: the comment is another "
			    "user's now (a token of another user?): making the "
			    "bot's own", "repo", t->project, "comment", idb,
			    NULL);
		} else if (rc != SCM_ENOTFOUND) {
			goto out;
		}
		/* another user's, or deleted: find or create the bot's own */
		free(*cause);
		*cause = NULL;
	} else if (id > 0) {
		rc = cl->ops->update_comment(cl, &repo, t->number, id, body,
		    cause);
		if (rc == SCM_OK) {
			*out = id;
			goto out;
		}
		if (rc == SCM_EFORBIDDEN) {
			/*
			 * Perhaps no longer ours to edit: GitLab answers 403
			 * to an edit of another user's note, and a reloaded
			 * token may be another user's. Who is the bot now?
			 * Its own comment refused: the refusal stands (a
			 * locked discussion); another user's: a new one.
			 */
			if (!self_known(n, cl, t->provider, 1))
				goto out;
			refusal = *cause;
			*cause = NULL;
		} else if (rc != SCM_ENOTFOUND)
			goto out;
		else {
			/* a person deleted it: find or create it again */
			free(*cause);
			*cause = NULL;
		}
	}
	if (refusal == NULL && !self_known(n, cl, t->provider, 0)) {
		*cause = xstrdup("the bot's identity is unknown");
		rc = SCM_EUNAVAILABLE;
		goto out;
	}
	rc = cl->ops->list_comments(cl, &repo, t->number, &v, &nv, cause);
	if (rc != SCM_OK)
		goto out;
	for (i = 0; refusal != NULL && i < nv; i++) {
		if (v[i].id == id && is_mine(n, t->provider, &v[i])) {
			rc = SCM_EFORBIDDEN;
			*cause = refusal;
			refusal = NULL;	/* now the caller's */
			goto out;
		}
	}
	if (refusal != NULL) {
		char idb[24];

		snprintf(idb, sizeof(idb), "%" PRId64, id);
		log_kv(LOG_INFO, "notifier: the comment is another user's now "
		    "(a token of another user?): making the bot's own",
		    "repo", t->project, "comment", idb, NULL);
	}
	for (i = 0; i < nv; i++) {
		if (v[i].id == id || !is_sticky(n, t->provider, &v[i]))
			continue;
		if (keep == 0 || v[i].id < keep) {
			keep = v[i].id;
			keep_body = v[i].body;
		}
	}
	for (i = 0; i < nv; i++) {
		char *c = NULL;

		if (v[i].id == id || v[i].id == keep ||
		    !is_sticky(n, t->provider, &v[i]))
			continue;
		/* a duplicate from a race: only the oldest stays */
		rc = cl->ops->delete_comment(cl, &repo, t->number, v[i].id,
		    &c);
		if (rc != SCM_OK && rc != SCM_ENOTFOUND)
			log_kv(LOG_WARN, "notifier: cannot delete a duplicate "
			    "comment", "repo", t->project, "error", c, NULL);
		free(c);
	}
	rc = SCM_ENOTFOUND;
	if (keep > 0) {
		if (keep_body != NULL && strcmp(keep_body, body) == 0)
			rc = SCM_OK;
		else
			rc = cl->ops->update_comment(cl, &repo, t->number,
			    keep, body, cause);
		if (rc == SCM_OK)
			*out = keep;
		else if (rc == SCM_ENOTFOUND) {
			free(*cause);
			*cause = NULL;
		}
	}
	if (rc == SCM_ENOTFOUND)
		rc = cl->ops->create_comment(cl, &repo, t->number, body, out,
		    cause);
	if (rc == SCM_OK)
		own_add(n, t, *out);
out:
	free(refusal);
	scm_comments_free(v, nv);
	return rc;
}

/* ------------------------------------------------------------ status */

/*
 * Merge notifier into status.notifier with the task's resourceVersion,
 * re-reading the task on 409. A negative enum k8s_err on failure
 * (K8S_ENOTFOUND: the task is gone).
 */
/*
 * Whether fields, worked out from task, no longer fit fresh (the task as
 * read again after a 409): another task under the name (uid), someone
 * else changed what the notifier last reported (a re-run drops it), or
 * the phase to record as reported is not the task's phase any more.
 * Writing them then would mark a run reported that was not.
 */
static int
stale(const json_t *task, const json_t *fresh, const json_t *fields)
{
	const char *u0 = k8s_meta_str(task, "uid"), *u1 = k8s_meta_str(fresh,
	    "uid");
	const json_t *s0 = json_object_get(task, "status");
	const json_t *s1 = json_object_get(fresh, "status");
	const char *r0 = json_string_value(json_object_get(json_object_get(s0,
	    "notifier"), "reportedPhase"));
	const char *r1 = json_string_value(json_object_get(json_object_get(s1,
	    "notifier"), "reportedPhase"));
	const char *want = json_string_value(json_object_get(fields,
	    "reportedPhase"));
	const char *phase = json_string_value(json_object_get(s1, "phase"));

	if ((u0 != NULL) != (u1 != NULL) ||
	    (u0 != NULL && strcmp(u0, u1) != 0))
		return 1;
	if ((r0 != NULL) != (r1 != NULL) ||
	    (r0 != NULL && strcmp(r0, r1) != 0))
		return 1;
	return want != NULL && (phase == NULL || strcmp(want, phase) != 0);
}

static int
write_notifier(struct notifier *n, const char *ns, const char *name,
    json_t *task, json_t *fields, char **cause)
{
	struct k8s_status st = { 0 };
	json_t *cur = json_incref(task), *patch;
	int rc = K8S_ECONFLICT, tries;

	for (tries = 0; tries < MAX_CONFLICTS && rc == K8S_ECONFLICT;
	    tries++) {
		if (tries > 0) {
			json_decref(cur);
			cur = NULL;
			k8s_status_release(&st);
			rc = k8s_get(n->c.store, &K8S_AGENTTASK, ns, name,
			    &cur, &st);
			if (rc < 0)
				break;
			if (stale(task, cur, fields)) {
				/* the next pass starts from the task as it is */
				rc = k8s_status_set(&st, K8S_ECONFLICT, "the task "
				    "changed meanwhile; it is looked at again",
				    NULL);
				break;
			}
		}
		patch = json_pack("{s:{s:s},s:{s:O}}", "metadata",
		    "resourceVersion", k8s_meta_str(cur, "resourceVersion") ?
		    k8s_meta_str(cur, "resourceVersion") : "", "status",
		    "notifier", fields);
		k8s_status_release(&st);
		rc = k8s_patch(n->c.store, &K8S_AGENTTASK, ns, name, 1, patch,
		    NULL, &st);
		json_decref(patch);
	}
	if (rc < 0 && cause != NULL)
		*cause = xasprintf("status.notifier: %s", st.message ?
		    st.message : k8s_err_reason((enum k8s_err)rc));
	k8s_status_release(&st);
	json_decref(cur);
	return rc;
}

/* ------------------------------------------------------------ work */

static const char *
status_str(const json_t *task, const char *a, const char *b)
{
	const json_t *s = json_object_get(task, "status");
	const json_t *v = b ? json_object_get(json_object_get(s, a), b) :
	    json_object_get(s, a);

	return json_is_string(v) ? json_string_value(v) : NULL;
}

static int
terminal(const char *phase)
{
	return strcmp(phase, "Completed") == 0 || strcmp(phase, "Failed") == 0;
}

static int
scm_retryable(int rc)
{
	return rc == SCM_ERATELIMITED ? 2 : 1;
}

/*
 * After a failed call: 0, or for a rate limit the time it resets (unix
 * ms), read right after the call as scm_ratelimit_reset_ms() requires.
 */
static int64_t
ratelimit_until(int rc)
{
	int64_t at;

	if (scm_retryable(rc) != 2)
		return 0;
	at = scm_ratelimit_reset_ms();
	return at > 0 ? at : now_unix_ms() + BACKOFF_MAX_MS;
}

/*
 * Whether rc says the provider refuses the bot's writes on the PR/MR, so
 * that trying again soon would fail the same way: 403 (an archived
 * repository, a locked conversation or discussion, a permission taken
 * away), 401, or 404/410 (no access any more, the PR/MR or repository
 * gone; a comment deleted by a person is not one: ensure_comment makes
 * it again).
 */
static int
refused_write(int rc)
{
	return rc == SCM_EFORBIDDEN || rc == SCM_EUNAUTHORIZED ||
	    rc == SCM_ENOTFOUND;
}

/* The provider took a write for task tkey again: say so, once. */
static void
accepted(struct notifier *n, const char *tkey)
{
	struct entry *e;
	int was = 0;

	pthread_mutex_lock(&n->mu);
	e = find_entry(n, tkey);
	if (e != NULL) {
		was = e->refused;
		e->refused = 0;
	}
	pthread_mutex_unlock(&n->mu);
	if (was)
		log_kv(LOG_INFO, "notifier: the provider accepts writes again",
		    "task", tkey, NULL);
}

/*
 * Post the short comment that says task's run ended, mentioning who
 * started it; followed: the sticky comment shows this task. An SCM_*
 * code.
 */
static int
post_final(struct scm_client *cl, const struct target *t,
    const json_t *task, int followed, char **cause)
{
	struct scm_repo repo = { t->project, t->project_id, 0 };
	int64_t fid = 0;
	char *fin;
	int rc;

	fin = notifier_render_final(task, ann(task,
	    "divergedev.com/requested-by"), followed);
	rc = cl->ops->create_comment(cl, &repo, t->number, fin, &fid, cause);
	free(fin);
	if (rc == SCM_OK)
		metrics_inc("diverge_notifier_notifications_total", "", 1);
	return rc;
}

/*
 * Bring task tkey's comment in line; primary 0: the comment follows
 * another task of the PR/MR, and this one only gets its finished-run
 * notification. 0 when done (*delay_ms > 0: look again after that long),
 * a negative value on failure, with *cause; after a rate limit,
 * *rl_until is when the provider said it resets (unix ms); *refused is
 * set when the provider refuses the bot's writes.
 */
static int
process(struct notifier *n, const char *tkey, int primary,
    int64_t *delay_ms, int64_t *rl_until, int *refused, char **cause)
{
	struct k8s_status st = { 0 };
	struct notifier_render_opts ro;
	struct k8s_task_budgets bu;
	struct target t;
	struct scm_client *cl;
	json_t *task = NULL, *fields = NULL;
	char *ns = NULL, *body = NULL, *content = NULL;
	const char *name, *phase, *reported, *hash_old, *cid_s;
	char hash[65], idbuf[32];
	int64_t cid, newcid = 0, now_ms, wait_ms;
	struct entry *e;
	size_t clen = 0;
	int ret = -1, rc;

	ns = xstrdup(tkey);
	name = strchr(ns, '/');
	if (name == NULL) {
		ret = 0;
		goto out;
	}
	ns[name - ns] = '\0';
	name++;
	rc = k8s_get(n->c.store, &K8S_AGENTTASK, ns, name, &task, &st);
	if (rc == K8S_ENOTFOUND) {
		untrack(n, tkey);
		ret = 0;
		goto out;
	}
	if (rc < 0) {
		*cause = xasprintf("read: %s", st.message ? st.message :
		    k8s_err_reason((enum k8s_err)rc));
		goto out;
	}
	if (task_target(task, &t) < 0) {
		ret = 0;
		goto out;
	}
	cl = t.provider == SCM_GITHUB ? n->c.github : n->c.gitlab;
	if (cl == NULL) {
		ret = 0;
		goto out;
	}
	pthread_mutex_lock(&n->mu);
	e = find_entry(n, tkey);
	wait_ms = e != NULL ? e->retry_at - now_unix_ms() : 0;
	pthread_mutex_unlock(&n->mu);
	if (wait_ms > 0) {
		/*
		 * failed before (rate limited until its reset, refused, or
		 * backing off): a watch event queued it again, but the
		 * update waits all the same
		 */
		*delay_ms = wait_ms;
		ret = 0;
		goto out;
	}
	phase = status_str(task, "phase", NULL);
	if (phase == NULL) {
		/* not reconciled yet (or no reconciler): nothing to report */
		ret = 0;
		goto out;
	}
	reported = status_str(task, "notifier", "reportedPhase");
	hash_old = status_str(task, "notifier", "bodyHash");
	cid_s = status_str(task, "notifier", "commentId");
	cid = num(cid_s);
	if (!primary) {
		/*
		 * Notified like the followed task: once per finished run,
		 * recorded in reportedPhase after the post. bodyHash is
		 * emptied because the comment does not show this task: should
		 * it be followed again, the comment is repainted.
		 */
		if (terminal(phase) && (reported == NULL ||
		    strcmp(reported, phase) != 0)) {
			rc = post_final(cl, &t, task, 0, cause);
			if (rc != SCM_OK) {
				*rl_until = ratelimit_until(rc);
				*refused = refused_write(rc);
				goto out;
			}
			accepted(n, tkey);
			fields = json_pack("{s:s,s:s}", "reportedPhase", phase,
			    "bodyHash", "");
			if (write_notifier(n, ns, name, task, fields,
			    cause) < 0)
				goto out;
			log_kv(LOG_INFO, "notifier: finished run notified, the "
			    "comment follows another task", "task", tkey,
			    "phase", phase, NULL);
		}
		ret = 0;
		goto out;
	}

	k8s_task_budgets(n->c.store, task, n->c.cfg ?
	    n->c.cfg->defaults.budget_usd_micro : -1, n->c.cfg ?
	    n->c.cfg->defaults.budget_tokens : -1, &bu);
	memset(&ro, 0, sizeof(ro));
	ro.now = -1;
	ro.budget_usd_micro = bu.usd.source == K8S_TASK_UNKNOWN ? -1 :
	    bu.usd.value;
	ro.budget_tokens = bu.tokens.source == K8S_TASK_UNKNOWN ? -1 :
	    bu.tokens.value;
	/* the hash covers the content, not the time of the update */
	content = notifier_render(task, &ro, &clen);
	notifier_hash(content, clen, hash);

	if (reported == NULL || strcmp(reported, phase) != 0 ||
	    hash_old == NULL || strcmp(hash_old, hash) != 0 || cid <= 0) {
		int64_t last;

		now_ms = now_mono_ms();
		pthread_mutex_lock(&n->mu);
		e = find_entry(n, tkey);
		last = e != NULL ? e->last_sent_ms : 0;
		pthread_mutex_unlock(&n->mu);
		if (reported != NULL && strcmp(reported, phase) == 0 &&
		    cid > 0 && last > 0 && now_ms - last < n->c.throttle_ms) {
			/* only the numbers moved: one update a period */
			*delay_ms = n->c.throttle_ms - (now_ms - last);
			ret = 0;
			goto out;
		}
		ro.now = now_unix();
		body = notifier_render(task, &ro, NULL);
		rc = ensure_comment(n, cl, &t, cid, body, &newcid, cause);
		if (rc != SCM_OK) {
			*rl_until = ratelimit_until(rc);
			*refused = refused_write(rc);
			goto out;
		}
		accepted(n, tkey);
		pthread_mutex_lock(&n->mu);
		n->updates++;
		e = find_entry(n, tkey);
		if (e != NULL)
			e->last_sent_ms = now_mono_ms();
		pthread_mutex_unlock(&n->mu);
		snprintf(idbuf, sizeof(idbuf), "%" PRId64, newcid);
		/*
		 * A finished run mentions who started it (editing a comment
		 * notifies nobody), before reportedPhase records the phase:
		 * a crash in between posts it again rather than never.
		 */
		if (terminal(phase) && (reported == NULL ||
		    strcmp(reported, phase) != 0)) {
			char *c2 = NULL;

			rc = post_final(cl, &t, task, 1, cause);
			if (rc != SCM_OK) {
				*rl_until = ratelimit_until(rc);
				*refused = refused_write(rc);
				/* keep the comment id: the retry updates it */
				fields = json_pack("{s:s}", "commentId", idbuf);
				write_notifier(n, ns, name, task, fields, &c2);
				free(c2);
				goto out;
			}
		}
		fields = json_pack("{s:s,s:s,s:s}", "commentId", idbuf,
		    "reportedPhase", phase, "bodyHash", hash);
		rc = write_notifier(n, ns, name, task, fields, cause);
		if (rc < 0)
			goto out;
		metrics_inc("diverge_notifier_updates_total",
		    "result=\"updated\"", 1);
		log_kv(LOG_INFO, "notifier: comment updated", "task", tkey,
		    "phase", phase, NULL);
	}
	ret = 0;
out:
	k8s_status_release(&st);
	json_decref(task);
	json_decref(fields);
	free(ns);
	free(body);
	free(content);
	return ret;
}

/*
 * The wait before the next try. After a rate limit, the provider's reset
 * decides (Retry-After, x-ratelimit-reset): asking before it only prolongs
 * a secondary limit, and a fixed wait either comes too early or idles past
 * a reset seconds away.
 */
static int64_t
backoff_ms(unsigned failures, int64_t rl_until)
{
	int64_t d;

	if (rl_until > 0) {
		d = rl_until - now_unix_ms();
		if (d < RATELIMIT_FLOOR_MS)
			d = RATELIMIT_FLOOR_MS;
		return d > RATELIMIT_MAX_MS ? RATELIMIT_MAX_MS : d;
	}
	return backoff_delay_ms(BACKOFF_BASE_MS, BACKOFF_MAX_MS,
	    failures > 1 ? failures - 1 : 0);
}

/* The tasks of PR/MR key pkey (a new NULL-terminated array). */
static char **
tasks_of(struct notifier *n, const char *pkey)
{
	struct entry *e;
	size_t k = 0, cnt = 0;
	char **v;

	pthread_mutex_lock(&n->mu);
	for (e = n->entries; e != NULL; e = e->next)
		if (strcmp(e->pkey, pkey) == 0)
			cnt++;
	v = xcalloc(cnt + 1, sizeof(*v));
	for (e = n->entries; e != NULL; e = e->next)
		if (strcmp(e->pkey, pkey) == 0)
			v[k++] = xstrdup(e->tkey);
	pthread_mutex_unlock(&n->mu);
	return v;
}

/* 1 when task is live (Pending to Paused), 0 when finished or unreconciled. */
static int
task_live(const json_t *task)
{
	const char *ph = status_str(task, "phase", NULL);

	return ph != NULL && !terminal(ph);
}

/*
 * Which of two tasks the comment of their PR/MR follows. The order must
 * not depend on the order of the task list: creationTimestamp has a
 * resolution of one second, so two tasks made in the same second are told
 * apart by their "namespace/name", which is unique.
 */
int
notifier_task_cmp(const json_t *a, const json_t *b)
{
	const char *ta = k8s_meta_str(a, "creationTimestamp");
	const char *tb = k8s_meta_str(b, "creationTimestamp");
	const char *na, *nb;
	int c;

	c = task_live(b) - task_live(a);
	if (c != 0)
		return c;
	if ((ta != NULL) != (tb != NULL))
		return ta != NULL ? -1 : 1;
	if (ta != NULL && (c = strcmp(tb, ta)) != 0)
		return c;	/* the newer first */
	na = k8s_meta_str(a, "namespace");
	nb = k8s_meta_str(b, "namespace");
	c = strcmp(na ? na : "", nb ? nb : "");
	if (c != 0)
		return c;
	na = k8s_meta_str(a, "name");
	nb = k8s_meta_str(b, "name");
	return strcmp(na ? na : "", nb ? nb : "");
}

/*
 * When several tasks report to one PR/MR (a task made by hand with the
 * same annotations), the comment follows one, chosen by
 * notifier_task_cmp: it is moved to the front of tasks (a NULL-terminated
 * array of "namespace/name" keys). The others still get their
 * finished-run notification (process with primary 0).
 */
static void
keep_primary(struct notifier *n, char **tasks)
{
	json_t *best = NULL, *t;
	size_t i, pick = 0;
	char *tmp;

	if (tasks[0] == NULL || tasks[1] == NULL)
		return;
	for (i = 0; tasks[i] != NULL; i++) {
		char *ns = xstrdup(tasks[i]), *name = strchr(ns, '/');

		t = NULL;
		if (name != NULL) {
			*name++ = '\0';
			k8s_get(n->c.store, &K8S_AGENTTASK, ns, name, &t, NULL);
		}
		free(ns);
		if (t == NULL)
			continue;
		if (best == NULL || notifier_task_cmp(t, best) < 0) {
			json_decref(best);
			best = t;
			pick = i;
		} else
			json_decref(t);
	}
	json_decref(best);
	tmp = tasks[0];
	tasks[0] = tasks[pick];
	tasks[pick] = tmp;
}

static void *
worker_main(void *arg)
{
	struct notifier *n = arg;
	char *key, **tasks;
	size_t i;

	thread_name("notifier");
	for (;;) {
		int64_t delay = -1, fdelay = -1;

		key = controller_queue_get(n->q, 1000);
		if (key == NULL) {
			if (is_stopping(n))
				break;
			continue;
		}
		metrics_set("diverge_workqueue_depth", "queue=\"notifier\"",
		    (double)controller_queue_len(n->q));
		tasks = tasks_of(n, key);
		keep_primary(n, tasks);
		for (i = 0; tasks[i] != NULL; i++) {
			int64_t d = -1, rl = 0;
			char in[32];
			char *cause = NULL;
			struct entry *e;
			unsigned f = 0;
			int refused = 0, first = 0;

			/* keep_primary put the followed task first */
			if (process(n, tasks[i], i == 0, &d, &rl, &refused,
			    &cause) < 0) {
				metrics_inc("diverge_notifier_updates_total",
				    rl > 0 ? "result=\"rate_limited\"" :
				    refused ? "result=\"refused\"" :
				    "result=\"error\"", 1);
				pthread_mutex_lock(&n->mu);
				n->failures++;
				e = find_entry(n, tasks[i]);
				if (e != NULL)
					f = ++e->failures;
				pthread_mutex_unlock(&n->mu);
				d = refused && rl == 0 ? n->c.refused_ms :
				    backoff_ms(f ? f : 1, rl);
				pthread_mutex_lock(&n->mu);
				e = find_entry(n, tasks[i]);
				if (e != NULL) {
					e->retry_at = now_unix_ms() + d;
					first = refused && !e->refused;
					if (refused)
						e->refused = 1;
				}
				pthread_mutex_unlock(&n->mu);
				snprintf(in, sizeof(in), "%" PRId64 "ms", d);
				/*
				 * A refusal lasts (a locked PR stays locked):
				 * one line when it starts, then quiet tries
				 */
				log_kv(!refused ? LOG_WARN : first ? LOG_WARN :
				    LOG_DEBUG, refused ? "notifier: the provider "
				    "refuses the bot's writes, will try again" :
				    "notifier: update failed, will retry",
				    "task", tasks[i], "retry_in", in, "error",
				    cause ? cause : "unknown", NULL);
				if (fdelay < 0 || d < fdelay)
					fdelay = d;
			} else {
				pthread_mutex_lock(&n->mu);
				e = find_entry(n, tasks[i]);
				if (e != NULL)
					e->failures = 0;
				pthread_mutex_unlock(&n->mu);
				if (d > 0 && (delay < 0 || d < delay))
					delay = d;
			}
			free(cause);
			free(tasks[i]);
		}
		free(tasks);
		if (fdelay > 0 && (delay < 0 || fdelay < delay))
			delay = fdelay;
		if (delay > 0)
			controller_queue_add_after(n->q, key, delay);
		controller_queue_done(n->q, key);
		free(key);
	}
	return NULL;
}

/* ------------------------------------------------------------ watch */

/*
 * Forget the tasks the last list did not show. A task deleted while the
 * watch was down (410 Gone, a broken stream) sends no DELETED event, and
 * a worker finds it gone only when its PR/MR is queued again, which may
 * never happen: like an informer's cache after a relist, what the list
 * does not show is gone. Only the watcher tracks, so no task tracked
 * since the list is dropped here.
 */
static void
drop_unlisted(struct notifier *n)
{
	struct entry **pp, *e;

	pthread_mutex_lock(&n->mu);
	for (pp = &n->entries; (e = *pp) != NULL;) {
		if (e->listed == n->lists) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		entry_free(e);
	}
	pthread_mutex_unlock(&n->mu);
}

/* List every task, queue their PRs/MRs; *rv gets the list's version. */
static int
relist(struct notifier *n, char **rv)
{
	struct k8s_status st = { 0 };
	json_t *list = NULL, *item;
	size_t i;
	int rc;

	rc = k8s_list(n->c.store, &K8S_AGENTTASK, NULL, NULL, &list, &st);
	if (rc < 0) {
		log_kv(LOG_WARN, "notifier: cannot list agenttasks", "error",
		    st.message ? st.message : "unknown", NULL);
		k8s_status_release(&st);
		return rc;
	}
	pthread_mutex_lock(&n->mu);
	n->lists++;
	pthread_mutex_unlock(&n->mu);
	json_array_foreach(json_object_get(list, "items"), i, item)
		track(n, item);
	drop_unlisted(n);
	free(*rv);
	*rv = k8s_meta_str(list, "resourceVersion") ?
	    xstrdup(k8s_meta_str(list, "resourceVersion")) : NULL;
	json_decref(list);
	return 0;
}

/*
 * The watcher's wait after its n-th failure in a row (a list, a watch
 * refused, a stream broken): 500 ms doubling up to 30 s, with jitter, as
 * client-go's reflector backs off; it ends early at a stop.
 */
static void
watcher_backoff(struct notifier *n, unsigned failures)
{
	struct timespec ts;
	int64_t d = backoff_jitter_ms(backoff_delay_ms(WATCH_BACKOFF_BASE_MS,
	    WATCH_BACKOFF_MAX_MS, failures > 1 ? failures - 1 : 0));

	time_deadline(CLOCK_MONOTONIC, d, &ts);
	pthread_mutex_lock(&n->mu);
	while (!n->stopping && pthread_cond_timedwait(&n->stop_cv, &n->mu,
	    &ts) == 0)
		;
	pthread_mutex_unlock(&n->mu);
}

static void *
watcher_main(void *arg)
{
	struct notifier *n = arg;
	struct k8s_list_opts lo;
	struct k8s_watch *w = NULL;
	struct k8s_status st = { 0 };
	struct k8s_event ev;
	char *rv = NULL, *tkey;
	int64_t listed = 0;
	unsigned failures = 0;
	int rc;

	thread_name("notifier-watch");
	while (!is_stopping(n)) {
		if (w == NULL) {
			if (relist(n, &rv) < 0) {
				watcher_backoff(n, ++failures);
				continue;
			}
			listed = now_mono_ms();
			memset(&lo, 0, sizeof(lo));
			lo.resource_version = rv;
			rc = k8s_watch(n->c.store, &K8S_AGENTTASK, NULL, &lo,
			    &w, &st);
			k8s_status_release(&st);
			if (rc < 0) {
				w = NULL;
				watcher_backoff(n, ++failures);
				continue;
			}
		}
		memset(&ev, 0, sizeof(ev));
		rc = k8s_watch_next(w, 1000, &ev, &st);
		k8s_status_release(&st);
		if (rc < 0 || now_mono_ms() - listed > n->c.resync_ms) {
			/* 410 Gone, a broken stream, or time to resync */
			k8s_watch_free(w);
			w = NULL;
			/* a stream that ran a while was a success */
			if (now_mono_ms() - listed >= WATCH_HEALTHY_MS)
				failures = 0;
			if (rc < 0 && rc != K8S_EGONE)
				watcher_backoff(n, ++failures);
			json_decref(ev.object);
			continue;
		}
		if (rc == 0)
			continue;
		failures = 0;
		if (ev.type == K8S_ADDED || ev.type == K8S_MODIFIED)
			track(n, ev.object);
		else if (ev.type == K8S_DELETED &&
		    (tkey = task_key(ev.object)) != NULL) {
			untrack(n, tkey);
			free(tkey);
		}
		json_decref(ev.object);
	}
	if (w != NULL)
		k8s_watch_free(w);
	free(rv);
	return NULL;
}

/* ------------------------------------------------------------ lifecycle */

static void
notifier_free(struct notifier *n)
{
	struct entry *e;

	if (n == NULL)
		return;
	while ((e = n->entries) != NULL) {
		n->entries = e->next;
		entry_free(e);
	}
	if (n->q != NULL)
		controller_queue_free(n->q);
	free(n->workers);
	free(n->gh_login);
	free(n->gl_user);
	json_decref(n->own);
	pthread_cond_destroy(&n->stop_cv);
	pthread_mutex_destroy(&n->mu);
	free(n);
}

/* SIGHUP: ask who the bot is again before its comments are looked for. */
void
notifier_reload(struct notifier *n)
{
	if (n == NULL)
		return;
	pthread_mutex_lock(&n->mu);
	n->gh_stale = n->c.github != NULL;
	n->gl_stale = n->c.gitlab != NULL;
	pthread_mutex_unlock(&n->mu);
}

/* Start the watch and the workers of the sticky comments. */
int
notifier_start(struct notifier **out, const struct notifier_config *cfg,
    char **cause)
{
	struct notifier *n;
	int i, ret = -1;

	n = xcalloc(1, sizeof(*n));
	pthread_mutex_init(&n->mu, NULL);
	time_cond_init(&n->stop_cv);
	n->own = json_object();
	n->c = *cfg;
	if (n->c.store == NULL) {
		*cause = xstrdup("notifier: no resource store");
		goto out;
	}
	if (n->c.workers <= 0)
		n->c.workers = DEFAULT_WORKERS;
	if (n->c.throttle_ms <= 0)
		n->c.throttle_ms = DEFAULT_THROTTLE_MS;
	if (n->c.resync_ms <= 0)
		n->c.resync_ms = DEFAULT_RESYNC_MS;
	if (n->c.refused_ms <= 0)
		n->c.refused_ms = DEFAULT_REFUSED_MS;
	if (cfg->github_login != NULL)
		n->gh_login = xstrdup(cfg->github_login);
	if (cfg->gitlab_username != NULL)
		n->gl_user = xstrdup(cfg->gitlab_username);
	n->gl_id = cfg->gitlab_user_id;
	n->c.github_login = NULL;	/* copied above */
	n->c.gitlab_username = NULL;
	metrics_describe("diverge_notifier_updates_total", METRIC_COUNTER,
	    "Status comment syncs, by result (updated, rate_limited, "
	    "refused, error).");
	metrics_describe("diverge_notifier_notifications_total",
	    METRIC_COUNTER, "Finished-run notification comments posted.");
	{
		static const char *const results[] = { "result=\"updated\"",
		    "result=\"rate_limited\"", "result=\"refused\"",
		    "result=\"error\"", NULL };
		static const char *const none[] = { "", NULL };

		metrics_zero("diverge_notifier_updates_total", results);
		metrics_zero("diverge_notifier_notifications_total", none);
	}
	n->q = controller_queue_new();
	n->workers = xcalloc((size_t)n->c.workers, sizeof(*n->workers));
	for (i = 0; i < n->c.workers; i++) {
		if (pthread_create(&n->workers[i], NULL, worker_main, n) != 0) {
			*cause = xstrdup("notifier: cannot start a worker");
			goto out;
		}
		n->nworkers++;
	}
	if (pthread_create(&n->watcher, NULL, watcher_main, n) != 0) {
		*cause = xstrdup("notifier: cannot start the watch");
		goto out;
	}
	n->watcher_running = 1;
	{
		char w[16];

		snprintf(w, sizeof(w), "%d", n->c.workers);
		log_kv(LOG_INFO, "notifier started", "workers", w, NULL);
	}
	*out = n;
	n = NULL;	/* now owned by the caller */
	ret = 0;
out:
	if (n != NULL)
		notifier_stop(n);
	return ret;
}

/* Stop the threads and free the notifier. */
void
notifier_stop(struct notifier *n)
{
	int i;

	if (n == NULL)
		return;
	pthread_mutex_lock(&n->mu);
	n->stopping = 1;
	pthread_cond_broadcast(&n->stop_cv);
	pthread_mutex_unlock(&n->mu);
	if (n->q != NULL)
		controller_queue_shutdown(n->q);
	if (n->watcher_running)
		pthread_join(n->watcher, NULL);
	for (i = 0; i < n->nworkers; i++)
		pthread_join(n->workers[i], NULL);
	notifier_free(n);
}

/* Updates done so far and failures. */
uint64_t
notifier_updates(struct notifier *n, uint64_t *failures)
{
	uint64_t u;

	pthread_mutex_lock(&n->mu);
	u = n->updates;
	if (failures != NULL)
		*failures = n->failures;
	pthread_mutex_unlock(&n->mu);
	return u;
}

/* How many tasks are tracked. */
size_t
notifier_tracked(struct notifier *n)
{
	struct entry *e;
	size_t count = 0;

	pthread_mutex_lock(&n->mu);
	for (e = n->entries; e != NULL; e = e->next)
		count++;
	pthread_mutex_unlock(&n->mu);
	return count;
}
