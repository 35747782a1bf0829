/*
 * Running the commands: the inbox handler behind the webhooks. A comment
 * on a PR/MR is parsed (commands.c), its author authorized (DESIGN section
 * 8), and its commands act on the PR's AgentTask through the resource
 * API; a closed or merged PR/MR ends its live tasks.
 *
 * Effects are idempotent so that at-least-once delivery is harmless: the
 * task name is deterministic, reactions are idempotent on both providers,
 * and a comment delivered twice (an App and a repository hook, or GitLab's
 * retries) is claimed by its first delivery in a table of the state
 * database, so the second one does nothing. The same row records how many
 * of the comment's commands have run, with the reply and verdict they
 * built: a comment retried because its reaction or reply could not be
 * posted (or taken over from an abandoned claim) does not run a command
 * twice, so a budget bump is added once. That row is written after the
 * command took effect, so a crash in between (or a failed write) loses
 * it: a command that changes the task therefore also records itself in
 * the task, in the write that applies it, and is not applied again when
 * the task shows it (do_steer). A re-run of a finished task is a status
 * write, which cannot carry that record: the run it will create is
 * recorded in the row before it (do_fix), and a retry that finds the task
 * at that run does not re-run it again. Outbound calls that hit a rate
 * limit ask the inbox to retry when the limit resets instead of holding a
 * worker.
 */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <sqlite3.h>

#include "config/config.h"
#include "k8s/k8s.h"
#include "scm/scm.h"
#include "util/util.h"

#define AUTHZ_TTL_S 300
#define AUTHZ_MAX 10000
#define CLAIM_STALE_MS (10 * 60 * 1000)
#define UNFINISHED_KEEP_MS (30 * 86400 * 1000LL)	/* claims never finished */
#define AGENT_FILE ".diverge/agent.yaml"

/*
 * What the provider said of an author, for AUTHZ_TTL_S: an enum
 * scm_permission under "<provider>|<repo>|<login>|<id>", whether the
 * account is a bot (0 or 1) under "bot|<provider>|<id>".
 */
struct authz_entry {
	struct authz_entry *next;
	char *key;
	int value;
	int64_t expires;
};

struct actions {
	struct actions_config ac;
	sqlite3 *db;
	pthread_mutex_t db_mu;
	pthread_mutex_t authz_mu;
	struct authz_entry *authz;
	size_t nauthz;
	int64_t last_prune_ms;	/* under db_mu */
};

/* --------------------------------------------------------- comment claims */

/* What earlier attempts at a comment did: its first done commands ran. */
struct progress {
	int done;
	int refused;
	char *reply;		/* the reply they built, NULL when none */
	int rerun_cmd;		/* the command that re-runs a task, or -1 */
	int64_t rerun_run;	/* ... to this status.run */
};

/*
 * Forget comments finished longer than inbox.retention ago (claims never
 * finished: after 30 days at least), at most once a minute (db_mu held):
 * the inbox forgets their deliveries then too, and without this the table
 * grew by a row per comment forever.
 * The claim table keeps a comment from running twice when it comes again
 * under another delivery id; past the retention its deliveries are gone
 * from the inbox as well, so a resend would run either way.
 */
static void
prune_comments_locked(struct actions *a)
{
	sqlite3_stmt *st;
	int64_t now = now_unix_ms(), keep_ms;

	if (a->last_prune_ms != 0 && now - a->last_prune_ms < 60000)
		return;
	a->last_prune_ms = now;
	keep_ms = a->ac.cfg != NULL ? a->ac.cfg->inbox.retention_s * 1000 :
	    7 * 86400 * 1000LL;
	/* a claim still in progress is kept longer: its retries need it */
	st = db_stmt(a->db, "DELETE FROM scm_comments WHERE (state = 1 AND"
	    " at < ?1) OR at < ?2");
	if (st == NULL)
		return;
	sqlite3_bind_int64(st, 1, now - keep_ms);
	sqlite3_bind_int64(st, 2, now - (keep_ms > UNFINISHED_KEEP_MS ?
	    keep_ms : UNFINISHED_KEEP_MS));
	if (sqlite3_step(st) != SQLITE_DONE)
		log_kv(LOG_WARN, "comment claims not pruned", "error",
		    sqlite3_errmsg(a->db), NULL);
	else if (sqlite3_changes(a->db) > 0) {
		char num[32];

		snprintf(num, sizeof(num), "%d", sqlite3_changes(a->db));
		log_kv(LOG_INFO, "comment claims pruned", "count", num, NULL);
	}
	sqlite3_reset(st);
}

/*
 * Claim the comment key for delivery: 1 when it is ours to handle (*pg
 * then says what earlier attempts did), 0 when it is done or another
 * delivery's, -1 on error.
 */
static int
claim_comment(struct actions *a, const char *key, const char *delivery,
    struct progress *pg)
{
	sqlite3_stmt *st;
	int rc = 1;	/* 1: ours to handle, 0: someone else's, -1: error */

	memset(pg, 0, sizeof(*pg));
	pg->rerun_cmd = -1;
	pthread_mutex_lock(&a->db_mu);
	prune_comments_locked(a);
	st = db_stmt(a->db, "INSERT OR IGNORE INTO scm_comments (key,"
	    " delivery, state, at) VALUES (?1, ?2, 0, ?3)");
	if (st == NULL) {
		rc = -1;
		goto out;
	}
	sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, delivery, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, now_unix_ms());
	if (sqlite3_step(st) != SQLITE_DONE) {
		rc = -1;
		goto out;
	}
	if (sqlite3_changes(a->db) == 1)
		goto out;
	/* claimed before: by us (a retry), done, or another delivery */
	st = db_stmt(a->db, "SELECT delivery, state, at, progress, refused,"
	    " reply, rerun_cmd, rerun_run FROM scm_comments WHERE key = ?1");
	if (st == NULL || (sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC),
	    sqlite3_step(st)) != SQLITE_ROW) {
		rc = -1;
		goto out;
	}
	if (sqlite3_column_int(st, 1) != 0)
		rc = 0;		/* done already */
	else if (strcmp((const char *)sqlite3_column_text(st, 0),
	    delivery) == 0)
		rc = 1;		/* our own retry */
	else if (now_unix_ms() - sqlite3_column_int64(st, 2) >
	    CLAIM_STALE_MS)
		rc = 2;		/* an abandoned claim: take it over */
	else
		rc = 0;
	if (rc > 0) {
		pg->done = sqlite3_column_int(st, 3);
		pg->refused = sqlite3_column_int(st, 4);
		if (sqlite3_column_text(st, 5) != NULL)
			pg->reply = xstrdup((const char *)sqlite3_column_text(
			    st, 5));
		pg->rerun_cmd = sqlite3_column_int(st, 6);
		pg->rerun_run = sqlite3_column_int64(st, 7);
	}
	sqlite3_reset(st);
	if (rc == 2) {
		st = db_stmt(a->db, "UPDATE scm_comments SET delivery = ?2,"
		    " at = ?3 WHERE key = ?1");
		if (st != NULL) {
			sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
			sqlite3_bind_text(st, 2, delivery, -1, SQLITE_STATIC);
			sqlite3_bind_int64(st, 3, now_unix_ms());
			sqlite3_step(st);
			sqlite3_reset(st);
		}
		rc = 1;
	}
out:
	pthread_mutex_unlock(&a->db_mu);
	return rc;
}

/*
 * Record that the first done commands of comment key ran, with the reply
 * and verdict so far, before anything else can fail: a retry starts after
 * them. A failed write is logged, not retried: the effects are in place,
 * and running them again is what this avoids.
 */
static void
save_progress(struct actions *a, const char *key, int done,
    const struct buf *reply, int refused)
{
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR;

	pthread_mutex_lock(&a->db_mu);
	st = db_stmt(a->db, "UPDATE scm_comments SET progress = ?2,"
	    " refused = ?3, reply = ?4 WHERE key = ?1");
	if (st != NULL) {
		sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
		sqlite3_bind_int(st, 2, done);
		sqlite3_bind_int(st, 3, refused);
		if (reply->len > 0)
			sqlite3_bind_text(st, 4, reply->data, (int)reply->len,
			    SQLITE_STATIC);
		else
			sqlite3_bind_null(st, 4);
		rc = sqlite3_step(st);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&a->db_mu);
	if (rc != SQLITE_DONE)
		log_kv(LOG_WARN, "comment progress not recorded: a retry may "
		    "run its commands again", "comment", key, NULL);
}

/*
 * Record that command cmd of comment key is about to re-run a finished
 * task as its run number run, before the status write that does it: a
 * retry of the comment, whose progress may not have been recorded after
 * that write, finds the task at that run and does not re-run it again.
 * Unlike the progress, a failed write stops the command (-1): without
 * the record a retry could not tell.
 */
static int
save_rerun(struct actions *a, const char *key, int cmd, int64_t run)
{
	sqlite3_stmt *st;
	int rc = SQLITE_ERROR;

	pthread_mutex_lock(&a->db_mu);
	st = db_stmt(a->db, "UPDATE scm_comments SET rerun_cmd = ?2,"
	    " rerun_run = ?3 WHERE key = ?1");
	if (st != NULL) {
		sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
		sqlite3_bind_int(st, 2, cmd);
		sqlite3_bind_int64(st, 3, run);
		rc = sqlite3_step(st);
		if (rc == SQLITE_DONE && sqlite3_changes(a->db) != 1)
			rc = SQLITE_ERROR;
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&a->db_mu);
	return rc == SQLITE_DONE ? 0 : -1;
}

static void
finish_comment(struct actions *a, const char *key)
{
	sqlite3_stmt *st;

	pthread_mutex_lock(&a->db_mu);
	st = db_stmt(a->db, "UPDATE scm_comments SET state = 1, at = ?2"
	    " WHERE key = ?1");
	if (st != NULL) {
		sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 2, now_unix_ms());
		sqlite3_step(st);
		sqlite3_reset(st);
	}
	pthread_mutex_unlock(&a->db_mu);
}

/* ------------------------------------------------------- authorization */

static int
authz_lookup(struct actions *a, const char *key, int *out)
{
	struct authz_entry *e;
	int64_t now = now_unix();
	int found = 0;

	pthread_mutex_lock(&a->authz_mu);
	for (e = a->authz; e != NULL; e = e->next)
		if (strcmp(e->key, key) == 0 && e->expires > now) {
			*out = e->value;
			found = 1;
			break;
		}
	pthread_mutex_unlock(&a->authz_mu);
	return found;
}

static void
authz_store(struct actions *a, const char *key, int value)
{
	struct authz_entry *e, **pe;
	int64_t now = now_unix();

	pthread_mutex_lock(&a->authz_mu);
	/* drop expired entries (and everything when full) */
	for (pe = &a->authz; *pe != NULL;) {
		e = *pe;
		if (e->expires <= now || a->nauthz >= AUTHZ_MAX ||
		    strcmp(e->key, key) == 0) {
			*pe = e->next;
			free(e->key);
			free(e);
			a->nauthz--;
			continue;
		}
		pe = &e->next;
	}
	e = xcalloc(1, sizeof(*e));
	e->key = xstrdup(key);
	e->value = value;
	e->expires = now + AUTHZ_TTL_S;
	e->next = a->authz;
	a->authz = e;
	a->nauthz++;
	pthread_mutex_unlock(&a->authz_mu);
}

static const char *
perm_name(enum scm_permission p)
{
	switch (p) {
	case SCM_PERM_MAINTAIN:
		return "maintainer";
	case SCM_PERM_WRITE:
		return "write";
	case SCM_PERM_READ:
		return "read";
	default:
		return "no";
	}
}

/* ---------------------------------------------------------- the event */

/* Everything one comment needs while it is handled. */
struct run {
	struct actions *a;
	const struct scm_event *ev;
	struct scm_client *client;
	struct scm_repo repo;
	const char *provider;		/* "github" / "gitlab" */
	char *host;			/* github.com, gitlab.example.com */
	char *ns;			/* the namespace of the PR's tasks */
	char *repo_hash;		/* label value: repository identity */
	const char *claim;		/* the comment's key in scm_comments */
	const char *comment;		/* its id on the PR ("review:" ...) */
	const struct progress *pg;	/* what earlier attempts did */
	struct buf reply;		/* the one reply, if any */
	int refused;
	int64_t retry_at_ms;		/* a rate limit's reset, for a retry */
	int transient;			/* a retry for a service's outage */
};

static char *
repo_hash(const char *provider, const char *host, const char *repo)
{
	char *id = xasprintf("%s/%s/%s", provider, host, repo);
	unsigned char mac[32];
	char hex[65];

	hmac_sha256("diverge-repo", 12, id, strlen(id), mac);
	hex_encode(mac, 32, hex);
	free(id);
	hex[16] = '\0';
	return xstrdup(hex);
}

/*
 * The namespace of the first repos rule whose glob matches HOST/path
 * (ignoring case, scm_repo_match): a rule "MyOrg/..." is the rule of
 * myorg/checkout too, not the default namespace, silently.
 */
static char *
namespace_for(const struct config *cfg, const char *host, const char *repo)
{
	size_t i;

	for (i = 0; i < cfg->nrepos; i++)
		if (scm_repo_match(cfg->repos[i].match, host, repo))
			return xstrdup(cfg->repos[i].namespace);
	return xstrdup(cfg->namespace);
}

/*
 * Reply text quoted so that no line can start a command: every line of
 * untrusted text is indented by two spaces inside a quote.
 */
static void
reply_line(struct run *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
reply_line(struct run *r, const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	s = xvasprintf(fmt, ap);
	va_end(ap);
	if (r->reply.len > 0)
		buf_addstr(&r->reply, "\n");
	buf_addstr(&r->reply, s);
	free(s);
}

/*
 * Untrusted text (an error echoing the comment) as an inert quote. A line
 * ends at CR, LF or CRLF, as it does for Markdown: a lone CR (a YAML
 * "\r" in agent.yaml) would otherwise end the quote, and what follows
 * it would render, mentions and all.
 */
static void
reply_quote(struct run *r, const char *text)
{
	const char *p = text;
	size_t n;

	while (*p) {
		n = strcspn(p, "\r\n");
		buf_addstr(&r->reply, "\n>     ");
		buf_add(&r->reply, p, n);
		p += n;
		if (*p == '\0')
			break;
		p += p[0] == '\r' && p[1] == '\n' ? 2 : 1;
	}
}

/* Whether rc is a rate limit; its reset is kept for the retry. */
static int
rate_limited(struct run *r, int rc)
{
	if (rc != SCM_ERATELIMITED)
		return 0;
	r->retry_at_ms = scm_ratelimit_reset_ms();
	return 1;
}

/*
 * Whether a client error is retried: a rate limit (at its reset), or the
 * service unavailable (5xx, transport) beyond the client's own retries,
 * an outage the inbox waits out (transient) rather than dead-letters.
 */
static int
scm_retry(struct run *r, int rc)
{
	if (rc == SCM_EUNAVAILABLE) {
		r->transient = 1;
		return 1;
	}
	return rate_limited(r, rc);
}

/* Whether a store error is an outage (a retry then waits it out). */
static void
store_retry(struct run *r, int rc)
{
	if (rc == K8S_EUNAVAILABLE || rc == K8S_ETIMEOUT ||
	    rc == K8S_EINTERNAL || rc == K8S_ECONFLICT)
		r->transient = 1;
}

/* Map a client error to the inbox's verdict. */
static int
scm_verdict(struct run *r, int rc)
{
	return scm_retry(r, rc) ? INBOX_RETRY : INBOX_FAIL;
}

/* AUTH_IGNORED: the author is a bot; nothing is run, posted or reacted */
enum { AUTH_OK = 0, AUTH_REFUSED, AUTH_RETRY, AUTH_IGNORED };

/*
 * A check of the author that failed for another reason than a rate limit
 * or an outage refuses the comment (fail closed): what names the check
 * ("the permissions of").
 */
static int
refuse_unchecked(struct run *r, const char *what, char **cause)
{
	const struct scm_event *ev = r->ev;

	log_kv(LOG_WARN, "author check failed: refusing", "delivery",
	    ev->delivery, "author", ev->author_login, "check", what, "error",
	    *cause, NULL);
	free(*cause);
	*cause = NULL;
	reply_line(r, "**diverge** could not check %s @%s, so nothing was "
	    "run. Try again later.", what, ev->author_login);
	r->refused = 1;
	return AUTH_REFUSED;
}

/*
 * Comments by bots are ignored (DESIGN section 8). GitHub's webhook says
 * who is one (user.type), and intake ignored them; GitLab's does not, and
 * intake only knows GitLab's reserved names, so the provider is asked
 * (once per author for AUTHZ_TTL_S). AUTH_OK, AUTH_IGNORED, AUTH_REFUSED
 * (the check failed: the reply says so) or AUTH_RETRY (a rate limit or
 * an outage: checked again when the API is back).
 */
static int
screen_bots(struct run *r, char **cause)
{
	const struct scm_event *ev = r->ev;
	char *key;
	int bot = 0, rc;

	if (r->client->ops->is_bot == NULL)
		return AUTH_OK;
	key = xasprintf("bot|%s|%lld", r->provider, (long long)ev->author_id);
	if (!authz_lookup(r->a, key, &bot)) {
		rc = r->client->ops->is_bot(r->client, ev->author_login,
		    ev->author_id, &bot, cause);
		if (rc < 0) {
			free(key);
			if (scm_retry(r, rc))
				return AUTH_RETRY;
			return refuse_unchecked(r, "the account of", cause);
		}
		authz_store(r->a, key, bot);
	}
	free(key);
	return bot ? AUTH_IGNORED : AUTH_OK;
}

/* AUTH_OK, AUTH_REFUSED (the reply says why) or AUTH_RETRY. */
static int
authorize(struct run *r, const struct cmd_result *res, char **cause)
{
	const struct scm_event *ev = r->ev;
	enum scm_permission perm = SCM_PERM_NONE;
	enum cmd_role need = CMD_ROLE_ANYONE;
	char *key;
	size_t i;
	int rc, cached;

	for (i = 0; i < res->ncmds; i++)
		if (commands_required_role(&res->cmds[i]) > need)
			need = commands_required_role(&res->cmds[i]);
	if (need == CMD_ROLE_ANYONE)
		return AUTH_OK;
	key = xasprintf("%s|%s|%s|%lld", r->provider, ev->repo,
	    ev->author_login, (long long)ev->author_id);
	if (authz_lookup(r->a, key, &cached)) {
		perm = (enum scm_permission)cached;
	} else {
		rc = r->client->ops->permission(r->client, &r->repo,
		    ev->author_login, ev->author_id, &perm, cause);
		/*
		 * a rate limit or an outage: nothing runs now, and the check
		 * is made again when the API is back (still closed: nothing
		 * runs unchecked); any other failure refuses the comment
		 */
		if (rc < 0) {
			free(key);
			if (scm_retry(r, rc))
				return AUTH_RETRY;
			return refuse_unchecked(r, "the permissions of", cause);
		}
		authz_store(r->a, key, (int)perm);
	}
	free(key);
	if ((need == CMD_ROLE_WRITE && perm >= SCM_PERM_WRITE) ||
	    (need == CMD_ROLE_MAINTAIN && perm >= SCM_PERM_MAINTAIN))
		return AUTH_OK;
	for (i = 0; i < res->ncmds; i++) {
		enum cmd_role want = commands_required_role(&res->cmds[i]);

		if ((want == CMD_ROLE_WRITE && perm < SCM_PERM_WRITE) ||
		    (want == CMD_ROLE_MAINTAIN && perm < SCM_PERM_MAINTAIN)) {
			reply_line(r, "**diverge**: `%s` needs %s access; "
			    "@%s has %s access to this repository, so nothing "
			    "was run.", commands_kind_name(res->cmds[i].kind),
			    commands_role_name(want), ev->author_login,
			    perm_name(perm));
			break;
		}
	}
	r->refused = 1;
	return AUTH_REFUSED;
}

/* ------------------------------------------------------------- tasks */

static int
task_finished(const json_t *task)
{
	const char *p = json_string_value(json_object_get(json_object_get(
	    task, "status"), "phase"));

	return p != NULL && (strcmp(p, "Completed") == 0 ||
	    strcmp(p, "Failed") == 0);
}

/* The PR's tasks (by labels: names may have been disambiguated). */
static int
pr_tasks(struct run *r, json_t **items, struct k8s_status *st)
{
	char *sel = xasprintf("divergedev.com/repo=%s,divergedev.com/pr=%lld",
	    r->repo_hash, (long long)r->ev->number);
	struct k8s_list_opts o = { sel, NULL, NULL };
	json_t *l = NULL;
	int rc;

	rc = k8s_list(r->a->ac.store, &K8S_AGENTTASK, r->ns, &o, &l, st);
	free(sel);
	if (rc < 0)
		return rc;
	*items = json_incref(json_object_get(l, "items"));
	json_decref(l);
	return 0;
}

/* The PR's live task, else its newest one; NULL when it has none. */
static json_t *
pr_task(struct run *r)
{
	struct k8s_status st = { 0 };
	json_t *items = NULL, *t, *pick = NULL;
	size_t i;

	if (pr_tasks(r, &items, &st) < 0) {
		k8s_status_release(&st);
		return NULL;
	}
	json_array_foreach(items, i, t) {
		if (pick == NULL || (task_finished(pick) && !task_finished(t)))
			pick = t;
	}
	if (pick != NULL)
		json_incref(pick);
	json_decref(items);
	return pick;
}

static json_t *
task_spec(struct run *r, const struct cmd *c, const struct scm_pr *pr,
    const json_t *agent)
{
	const struct config *cfg = r->a->ac.cfg;
	json_t *spec = json_object(), *caps = json_array(), *v;
	char money[32];
	const char *k;
	size_t i;

	for (i = 0; i < cfg->defaults.capabilities.n; i++)
		json_array_append_new(caps, json_string(
		    cfg->defaults.capabilities.v[i]));
	json_object_set_new(spec, "capabilities", caps);
	if (cfg->defaults.budget_usd_micro > 0) {
		k8s_task_format_usd(cfg->defaults.budget_usd_micro, money);
		json_object_set_new(spec, "budgetUSD", json_string(money));
	}
	if (cfg->defaults.budget_tokens > 0)
		json_object_set_new(spec, "budgetTokens",
		    json_integer(cfg->defaults.budget_tokens));
	json_object_set_new(spec, "maxIterations",
	    json_integer(cfg->defaults.max_iterations));
	json_object_set_new(spec, "sandbox", json_pack("{s:s,s:i}",
	    "provider", "agent-sandbox", "timeoutSeconds",
	    cfg->defaults.timeout_seconds));
	/* the repository's .diverge/agent.yaml (from the default branch) */
	json_object_foreach((json_t *)agent, k, v) {
		if (json_is_object(v) && json_is_object(json_object_get(spec,
		    k)))
			json_object_update(json_object_get(spec, k), v);
		else
			json_object_set(spec, k, v);
	}
	/* the PR decides the branches and the repository */
	json_object_set_new(spec, "repository", json_pack("{s:s,s:s,s:s}",
	    "url", pr->clone_url ? pr->clone_url : "", "baseBranch",
	    pr->base_ref ? pr->base_ref : "", "workingBranch",
	    pr->head_ref ? pr->head_ref : ""));
	json_object_set_new(spec, "objective", json_string(c->text));
	return spec;
}

static json_t *
task_object(struct run *r, const char *name, json_t *spec)
{
	const struct scm_event *ev = r->ev;
	char num[32], pid[32];
	json_t *ann, *labels;

	snprintf(num, sizeof(num), "%lld", (long long)ev->number);
	snprintf(pid, sizeof(pid), "%lld", (long long)ev->project_id);
	ann = json_pack("{s:s,s:s,s:s}", "divergedev.com/provider",
	    r->provider, "divergedev.com/project", ev->repo,
	    "divergedev.com/requested-by", ev->author_login ?
	    ev->author_login : "");
	if (ev->provider == SCM_GITLAB) {
		json_object_set_new(ann, "divergedev.com/project-id",
		    json_string(pid));
		json_object_set_new(ann, "divergedev.com/mr-iid",
		    json_string(num));
	} else {
		json_object_set_new(ann, "divergedev.com/pr-number",
		    json_string(num));
	}
	if (ev->internal)
		json_object_set_new(ann, K8S_TASK_ANNOTATION_INTERNAL,
		    json_string("true"));
	labels = json_pack("{s:s,s:s,s:s}", "divergedev.com/provider",
	    r->provider, "divergedev.com/repo", r->repo_hash,
	    "divergedev.com/pr", num);
	return json_pack("{s:s,s:s,s:{s:s,s:o,s:o},s:o}", "apiVersion",
	    "divergedev.com/v1alpha1", "kind", "AgentTask", "metadata", "name",
	    name, "labels", labels, "annotations", ann, "spec", spec);
}

/* The task's status.run (0 when it has none). */
static int64_t
task_run(const json_t *task)
{
	return json_integer_value(json_object_get(json_object_get(task,
	    "status"), "run"));
}

/*
 * status.run set to run and the counters reset: a finished task runs
 * again, unless it is at that run already (a write of ours whose answer
 * was lost, or a re-run by someone else meanwhile).
 */
static int
rerun(struct run *r, const char *name, int64_t run, struct k8s_status *st)
{
	json_t *t = NULL, *s;
	int tries, rc = K8S_ECONFLICT;

	for (tries = 0; tries < 16 && rc == K8S_ECONFLICT; tries++) {
		k8s_status_release(st);
		rc = k8s_get(r->a->ac.store, &K8S_AGENTTASK, r->ns, name, &t,
		    st);
		if (rc < 0)
			break;
		if (task_run(t) >= run) {
			json_decref(t);
			t = NULL;
			break;
		}
		s = json_object_get(t, "status");
		if (!json_is_object(s)) {
			s = json_object();
			json_object_set_new(t, "status", s);
		}
		json_object_set_new(s, "run", json_integer(run));
		json_object_set_new(s, "phase", json_string("Pending"));
		json_object_set_new(s, "tokensConsumed", json_integer(0));
		json_object_set_new(s, "costUSD", json_string("0.000000"));
		json_object_set_new(s, "iteration", json_integer(0));
		json_object_set_new(s, "lastMeterRequestIds", json_array());
		json_object_set_new(s, "activeSeconds", json_integer(0));
		json_object_del(s, "reason");
		json_object_del(s, "message");
		json_object_del(s, "completedAt");
		/*
		 * The notifier reports this run's end again, even when it
		 * never sees the phases in between (its reportedPhase would
		 * still say the last run's Completed); its comment stays.
		 */
		if (json_is_object(json_object_get(s, "notifier")))
			json_object_del(json_object_get(s, "notifier"),
			    "reportedPhase");
		rc = k8s_update_status(r->a->ac.store, &K8S_AGENTTASK, r->ns,
		    name, t, NULL, st);
		json_decref(t);
		t = NULL;
	}
	return rc;
}

/*
 * fix: create the PR's task, or give it the new objective; a finished
 * task runs again, once for command i of the comment however often the
 * comment is retried (the run it creates is recorded before: save_rerun).
 */
static int
do_fix(struct run *r, const struct cmd *c, size_t i, char **cause)
{
	const struct scm_event *ev = r->ev;
	const struct config *cfg = r->a->ac.cfg;
	struct k8s_status st = { 0 };
	struct scm_pr pr;
	json_t *agent = NULL, *spec = NULL, *obj = NULL, *cur = NULL;
	char *name = NULL, *file = NULL;
	size_t flen = 0;
	int rc, ret = INBOX_DONE, allow_forks;

	memset(&pr, 0, sizeof(pr));
	rc = r->client->ops->get_pr(r->client, &r->repo, ev->number, &pr,
	    cause);
	if (rc < 0) {
		ret = scm_verdict(r, rc);
		goto out;
	}
	/*
	 * Only an open PR/MR gets an agent: its close (or merge) already
	 * ended its tasks, and no later event would end a new one, which
	 * would spend on a change nobody merges (GitHub "open", GitLab
	 * "opened"; GitLab's "locked" is a merge under way).
	 */
	if (pr.merged || (strcmp(pr.state, "open") != 0 &&
	    strcmp(pr.state, "opened") != 0)) {
		reply_line(r, "**diverge** does not start agents on a %s "
		    "%s: reopen it first.", pr.merged ? "merged" : "closed",
		    ev->provider == SCM_GITLAB ? "merge request" :
		    "pull request");
		r->refused = 1;
		goto out;
	}
	allow_forks = ev->provider == SCM_GITHUB ? cfg->github.allow_forks :
	    cfg->gitlab.allow_forks;
	if (pr.fork && !allow_forks) {
		reply_line(r, "**diverge** does not run agents on pull "
		    "requests from forks here: the agent would push to a "
		    "repository it does not control and run code from outside "
		    "the project. A maintainer can open the change from a "
		    "branch of this repository instead.");
		r->refused = 1;
		goto out;
	}
	/*
	 * agent.yaml from the repository's default branch (no ref): the PR
	 * author controls the head, and picks the base too (anyone with
	 * write access can push a branch and target the PR at it), so
	 * neither may choose the task's budgets, models or iterations.
	 */
	rc = r->client->ops->read_file(r->client, &r->repo, NULL, AGENT_FILE,
	    &file, &flen, cause);
	if (rc == SCM_ENOTFOUND) {
		free(*cause);
		*cause = NULL;
	} else if (rc < 0) {
		ret = scm_verdict(r, rc);
		goto out;
	} else if (k8s_task_agent_yaml(AGENT_FILE, file, flen, &agent,
	    cause) < 0) {
		reply_line(r, "**diverge** could not read `%s` on the default "
		    "branch, so no task was created:", AGENT_FILE);
		reply_quote(r, *cause);
		free(*cause);
		*cause = NULL;
		r->refused = 1;
		goto out;
	}
	spec = task_spec(r, c, &pr, agent);
	name = xasprintf("fix-%s-%lld", ev->provider == SCM_GITLAB ? "mr" :
	    "pr", (long long)ev->number);
	rc = k8s_get(r->a->ac.store, &K8S_AGENTTASK, r->ns, name, &cur, &st);
	if (rc == 0 && strcmp(k8s_meta_str(cur, "name"), name) == 0 &&
	    json_string_value(json_object_get(json_object_get(json_object_get(
	    cur, "metadata"), "labels"), "divergedev.com/repo")) != NULL &&
	    strcmp(json_string_value(json_object_get(json_object_get(
	    json_object_get(cur, "metadata"), "labels"),
	    "divergedev.com/repo")), r->repo_hash) != 0) {
		/* another repository's task: never touched */
		char *alt = xasprintf("%s-%.6s", name, r->repo_hash);

		log_kv(LOG_INFO, "task name taken by another repository",
		    "delivery", ev->delivery, "task", name, "using", alt,
		    NULL);
		free(name);
		name = alt;
		json_decref(cur);
		cur = NULL;
		k8s_status_release(&st);
		rc = k8s_get(r->a->ac.store, &K8S_AGENTTASK, r->ns, name, &cur,
		    &st);
	}
	if (r->a->ac.dry_run) {
		char *text;

		obj = task_object(r, name, json_incref(spec));
		text = json_dumps(obj, JSON_COMPACT | JSON_SORT_KEYS);
		log_kv(LOG_INFO, "dry run: would write", "delivery",
		    ev->delivery, "namespace", r->ns, "object", text, NULL);
		free(text);
		reply_line(r, "**diverge** (dry run) would %s the task `%s` "
		    "in namespace `%s`.", rc == 0 ? "update" : "create", name,
		    r->ns);
		goto out;
	}
	if (rc == K8S_ENOTFOUND) {
		k8s_status_release(&st);
		obj = task_object(r, name, json_incref(spec));
		rc = k8s_create(r->a->ac.store, &K8S_AGENTTASK, r->ns, obj,
		    NULL, &st);
		if (rc == K8S_EEXISTS)	/* a racing delivery: fine */
			rc = 0;
		if (rc == 0)
			log_kv(LOG_INFO, "task created", "delivery",
			    ev->delivery, "task", name, "namespace", r->ns,
			    NULL);
	} else if (rc == 0) {
		/*
		 * A live task gets the new objective; a finished one reruns.
		 * The objective's mark follows the comment it came from: an
		 * internal note's hides it from the public status comment,
		 * a public comment's may be shown (null removes the mark).
		 */
		json_t *patch = json_pack("{s:{s:s},s:{s:{s:o}}}", "spec",
		    "objective", c->text, "metadata", "annotations",
		    K8S_TASK_ANNOTATION_INTERNAL, ev->internal ?
		    json_string("true") : json_null());
		int64_t run = 0;
		int again = task_finished(cur);

		if (again && r->pg != NULL && r->pg->rerun_cmd == (int)i &&
		    task_run(cur) >= r->pg->rerun_run) {
			/* an earlier attempt re-ran it: the task ran since */
			char num[32];

			snprintf(num, sizeof(num), "%lld",
			    (long long)r->pg->rerun_run);
			log_kv(LOG_INFO, "task re-run already: not again",
			    "delivery", ev->delivery, "task", name, "run", num,
			    NULL);
			again = 0;
		} else if (again) {
			run = r->pg != NULL && r->pg->rerun_cmd == (int)i ?
			    r->pg->rerun_run : task_run(cur) + 1;
			if (save_rerun(r->a, r->claim, (int)i, run) < 0) {
				*cause = xasprintf("task '%s/%s': the re-run "
				    "could not be recorded in the state "
				    "database", r->ns, name);
				r->transient = 1;
				ret = INBOX_RETRY;
				json_decref(patch);
				goto out;
			}
		}
		k8s_status_release(&st);
		rc = k8s_patch(r->a->ac.store, &K8S_AGENTTASK, r->ns, name, 0,
		    patch, NULL, &st);
		json_decref(patch);
		if (rc == 0 && again)
			rc = rerun(r, name, run, &st);
		if (rc == 0)
			log_kv(LOG_INFO, again ? "task re-run" :
			    "task objective updated", "delivery", ev->delivery,
			    "task", name, NULL);
	}
	if (rc < 0) {
		*cause = xasprintf("task '%s/%s': %s", r->ns, name,
		    st.message ? st.message : "write failed");
		ret = rc == K8S_EINVALID ? INBOX_FAIL : INBOX_RETRY;
		store_retry(r, rc);
		if (rc == K8S_EINVALID) {
			reply_line(r, "**diverge** could not create the task:");
			reply_quote(r, st.message ? st.message : "invalid");
			r->refused = 1;
			free(*cause);
			*cause = NULL;
			ret = INBOX_DONE;
		}
	}
out:
	k8s_status_release(&st);
	scm_pr_release(&pr);
	json_decref(agent);
	json_decref(spec);
	json_decref(obj);
	json_decref(cur);
	free(name);
	if (file != NULL)
		free(file);
	return ret;
}

/*
 * guide, pause, resume, budget: the shared task operations. The write
 * that applies command i of the comment records it in the task
 * (K8S_TASK_ANNOTATION_APPLIED), and a command recorded there is not
 * applied again: a retry after the write, whose progress the state
 * database may have missed (a crash, a failed write, a lost answer from
 * the store), does not add a budget bump twice.
 */
static int
do_steer(struct run *r, const struct cmd *c, size_t i, char **cause)
{
	const struct config *cfg = r->a->ac.cfg;
	struct k8s_status st = { 0 };
	struct k8s_task_bump bump;
	json_t *task = pr_task(r);
	const char *name;
	char *once;
	int rc = 0;

	if (task == NULL) {
		reply_line(r, "**diverge**: this pull request has no task yet; "
		    "start one with `/diverge fix <objective>`.");
		r->refused = 1;
		return INBOX_DONE;
	}
	name = k8s_meta_str(task, "name");
	memset(&bump, 0, sizeof(bump));
	bump.usd_micro = c->usd_micro;
	bump.tokens = c->tokens;
	bump.default_usd_micro = cfg->defaults.budget_usd_micro;
	bump.default_tokens = cfg->defaults.budget_tokens;
	if (r->a->ac.dry_run) {
		log_kv(LOG_INFO, "dry run: would steer", "delivery",
		    r->ev->delivery, "task", name, "command",
		    commands_kind_name(c->kind), NULL);
		reply_line(r, "**diverge** (dry run) would `%s` the task `%s`.",
		    commands_kind_name(c->kind), name);
		json_decref(task);
		return INBOX_DONE;
	}
	once = xasprintf("%s#%zu", r->comment, i);
	switch (c->kind) {
	case CMD_GUIDE:
		rc = k8s_task_guide_from(r->a->ac.store, r->ns, name, c->text,
		    r->ev->internal, once, NULL, &st);
		break;
	case CMD_PAUSE:
		rc = k8s_task_pause(r->a->ac.store, r->ns, name, once, NULL,
		    &st);
		break;
	case CMD_RESUME:
		rc = k8s_task_resume(r->a->ac.store, r->ns, name, &bump, once,
		    NULL, &st);
		break;
	default:	/* CMD_BUDGET */
		rc = k8s_task_budget(r->a->ac.store, r->ns, name, &bump, once,
		    NULL, &st);
	}
	if (rc > 0) {
		log_kv(LOG_INFO, "command applied already: not again",
		    "delivery", r->ev->delivery, "task", name, "command",
		    commands_kind_name(c->kind), "applied", once, NULL);
		rc = 0;
	} else if (rc == K8S_EINVALID) {
		/* refused with an explanation (an unlimited budget, ...) */
		reply_line(r, "**diverge**: `%s` was not applied:",
		    commands_kind_name(c->kind));
		reply_quote(r, st.message ? st.message : "refused");
		r->refused = 1;
		rc = 0;
	} else if (rc < 0) {
		*cause = xasprintf("task '%s/%s': %s", r->ns, name,
		    st.message ? st.message : "write failed");
		store_retry(r, rc);
	} else {
		log_kv(LOG_INFO, "task steered", "delivery", r->ev->delivery,
		    "task", name, "command", commands_kind_name(c->kind), NULL);
	}
	k8s_status_release(&st);
	json_decref(task);
	free(once);
	return rc < 0 ? INBOX_RETRY : INBOX_DONE;
}

static void
do_status(struct run *r)
{
	const struct config *cfg = r->a->ac.cfg;
	struct k8s_status st = { 0 };
	json_t *items = NULL, *t;
	size_t i, queued = 0;
	int limit;

	if (pr_tasks(r, &items, &st) < 0 || json_array_size(items) == 0) {
		reply_line(r, "**diverge**: no task for this pull request yet. "
		    "Start one with `/diverge fix <objective>`.");
		k8s_status_release(&st);
		json_decref(items);
		return;
	}
	reply_line(r, "**diverge** tasks of this pull request:\n");
	reply_line(r, "| task | phase | spend | tokens | iteration | "
	    "preview |");
	reply_line(r, "| --- | --- | --- | --- | --- | --- |");
	json_array_foreach(items, i, t) {
		const json_t *s = json_object_get(t, "status");
		struct k8s_task_budgets b;
		char spent[32], budget[32], tb[48], ph[64];
		int64_t cost = 0, ahead;
		const char *phase = json_string_value(json_object_get(s,
		    "phase"));
		const char *preview = json_string_value(json_object_get(s,
		    "previewUrl"));

		k8s_task_budgets(r->a->ac.store, t,
		    cfg->defaults.budget_usd_micro,
		    cfg->defaults.budget_tokens, &b);
		if (json_string_value(json_object_get(s, "costUSD")) != NULL)
			cost = config_parse_usd(json_string_value(
			    json_object_get(s, "costUSD")));
		k8s_task_format_usd(cost < 0 ? 0 : cost, spent);
		if (b.usd.source == K8S_TASK_UNKNOWN)
			snprintf(budget, sizeof(budget), "?");
		else if (b.usd.value == 0)
			snprintf(budget, sizeof(budget), "unlimited");
		else
			k8s_task_format_usd(b.usd.value, budget);
		if (b.tokens.source != K8S_TASK_UNKNOWN && b.tokens.value > 0)
			snprintf(tb, sizeof(tb), "%lld / %lld", (long long)
			    json_integer_value(json_object_get(s,
			    "tokensConsumed")), (long long)b.tokens.value);
		else
			snprintf(tb, sizeof(tb), "%lld", (long long)
			    json_integer_value(json_object_get(s,
			    "tokensConsumed")));
		if (phase == NULL)
			phase = "Pending";
		if (k8s_task_queued(t, &ahead)) {
			/* Pending or Paused: a literal, no markdown */
			if (ahead >= 0)
				snprintf(ph, sizeof(ph), "%s, queued (%lld "
				    "ahead)", phase, (long long)ahead);
			else
				snprintf(ph, sizeof(ph), "%s, queued", phase);
			phase = ph;
			queued++;
		}
		reply_line(r, "| `%s` | %s | $%s / $%s | %s | %lld / %lld | %s |",
		    k8s_meta_str(t, "name"), phase, spent,
		    budget, tb, (long long)json_integer_value(json_object_get(s,
		    "iteration")), (long long)json_integer_value(
		    json_object_get(json_object_get(t, "spec"),
		    "maxIterations")), preview ? "[preview](" : "none");
		if (preview != NULL) {
			/* the URL is ours (a template of the config) */
			buf_addstr(&r->reply, preview);
			buf_addstr(&r->reply, ")");
		}
	}
	/* a SIGHUP may change it (reload_limit) */
	limit = __atomic_load_n(&cfg->controller.max_active_tasks,
	    __ATOMIC_RELAXED);
	if (queued > 0 && limit > 0)
		reply_line(r, "\nA queued task waits for a free slot (limit: "
		    "%d running at once): it starts when a running task "
		    "finishes or is paused.", limit);
	else if (queued > 0)
		reply_line(r, "\nA queued task waits for a free slot: it "
		    "starts when a running task finishes or is paused.");
	json_decref(items);
}

/* Run the commands of res from the first one not yet done. */
static int
run_commands(struct run *r, const struct cmd_result *res, size_t from,
    char **cause)
{
	size_t i;
	int ret = INBOX_DONE;

	for (i = from; i < res->ncmds && ret == INBOX_DONE; i++) {
		const struct cmd *c = &res->cmds[i];

		switch (c->kind) {
		case CMD_FIX:
			ret = do_fix(r, c, i, cause);
			break;
		case CMD_STATUS:
			do_status(r);
			break;
		case CMD_HELP: {
			char *help = commands_help_markdown();

			reply_line(r, "%s", help);
			free(help);
			break;
		}
		default:
			ret = do_steer(r, c, i, cause);
		}
		if (ret == INBOX_DONE)
			save_progress(r->a, r->claim, (int)i + 1, &r->reply,
			    r->refused);
	}
	return ret;
}

/* A comment on a PR/MR. */
static int
on_comment(struct run *r, char **cause)
{
	const struct scm_event *ev = r->ev;
	struct cmd_limits lim;
	struct cmd_result res;
	struct progress pg;
	char *claim, *comment;
	int rc, ret = INBOX_DONE, claimed;

	memset(&res, 0, sizeof(res));
	lim.max_commands = r->a->ac.cfg->commands.max_per_comment;
	/* the configuration's 0 turns a kind of raise off (not a default) */
	lim.max_bump_usd_micro = r->a->ac.cfg->commands.max_bump_usd_micro > 0 ?
	    r->a->ac.cfg->commands.max_bump_usd_micro : -1;
	lim.max_bump_tokens = r->a->ac.cfg->commands.max_bump_tokens > 0 ?
	    r->a->ac.cfg->commands.max_bump_tokens : -1;
	if (ev->comment_body == NULL || commands_parse(ev->comment_body,
	    strlen(ev->comment_body), &lim, &res) < 0) {
		log_kv(LOG_WARN, "comment not parsed: ignored", "delivery",
		    ev->delivery, NULL);
		return INBOX_DONE;
	}
	if (res.error == NULL && res.ncmds == 0) {
		/* the prefilter matched, the grammar did not (code, quotes) */
		commands_result_release(&res);
		return INBOX_DONE;
	}
	/*
	 * One handling per comment, whichever delivery brought it. GitHub
	 * numbers review comments (on the diff) apart from issue comments
	 * (the conversation), so theirs are marked: the two never share a
	 * key. An issue comment's key is what it always was, so the rows
	 * stored before the marker still match their comments.
	 */
	comment = xasprintf("%s%lld", ev->review_comment ? "review:" : "",
	    (long long)ev->comment_id);
	claim = xasprintf("%s|%s|%lld|%s", r->provider, ev->repo,
	    (long long)ev->project_id, comment);
	claimed = claim_comment(r->a, claim, ev->delivery, &pg);
	r->claim = claim;
	r->comment = comment;
	r->pg = &pg;
	if (claimed <= 0) {
		if (claimed < 0) {
			/* the state database, busy or failing for now */
			r->transient = 1;
			ret = INBOX_RETRY;
		}
		else
			log_kv(LOG_INFO, "comment already handled", "delivery",
			    ev->delivery, "comment", claim, NULL);
		goto out;
	}
	/*
	 * a bot's comment is ignored whatever it asks, even help (one whose
	 * commands began to run in an earlier attempt was screened then)
	 */
	rc = pg.done > 0 ? AUTH_OK : screen_bots(r, cause);
	if (rc == AUTH_RETRY) {
		ret = INBOX_RETRY;
		goto out;
	}
	if (rc == AUTH_IGNORED) {
		log_kv(LOG_INFO, "comment by a bot: ignored", "delivery",
		    ev->delivery, "author", ev->author_login, NULL);
		finish_comment(r->a, claim);
		goto out;
	}
	if (rc == AUTH_REFUSED) {
		/* the check failed: its reply says so, nothing runs */
	} else if (res.error != NULL) {
		reply_line(r, res.help ? "**diverge** did not understand "
		    "that. What it can do:\n" : "**diverge** could not run "
		    "this comment:");
		if (!res.help)
			reply_quote(r, res.error);
		else {
			char *help = commands_help_markdown();

			reply_line(r, "%s", help);
			free(help);
		}
		r->refused = 1;
	} else {
		/* what an earlier attempt ran stays run; its reply is kept */
		if (pg.reply != NULL)
			buf_addstr(&r->reply, pg.reply);
		r->refused = pg.refused;
		if ((size_t)pg.done < res.ncmds) {
			rc = authorize(r, &res, cause);
			if (rc == AUTH_RETRY) {
				ret = INBOX_RETRY;
				goto out;
			}
			if (rc == AUTH_OK)
				ret = run_commands(r, &res, (size_t)pg.done,
				    cause);
		}
	}
	if (ret != INBOX_DONE)
		goto out;
	/* acknowledge: one reaction, one reply at most */
	rc = r->client->ops->react(r->client, &r->repo, ev->number,
	    ev->comment_id, ev->review_comment, r->refused ? "confused" :
	    "eyes", cause);
	if (scm_retry(r, rc)) {
		ret = INBOX_RETRY;
		goto out;
	}
	if (rc < 0) {
		log_kv(LOG_WARN, "reaction failed", "delivery", ev->delivery,
		    "error", *cause, NULL);
		free(*cause);
		*cause = NULL;
	}
	if (r->reply.len > 0 && ev->internal &&
	    r->client->ops->create_internal_comment == NULL) {
		/* a reply to an internal note is never public */
		log_kv(LOG_WARN, "reply to an internal note not posted",
		    "delivery", ev->delivery, NULL);
	} else if (r->reply.len > 0) {
		int64_t id = 0;
		/* replies quote errors, which may quote a credential */
		char *body = redact_xstrdup(r->reply.data);

		/* an internal note's reply: as internal as the note */
		rc = (ev->internal ? r->client->ops->create_internal_comment :
		    r->client->ops->create_comment)(r->client, &r->repo,
		    ev->number, body, &id, cause);
		free(body);
		if (scm_retry(r, rc)) {
			ret = INBOX_RETRY;
			goto out;
		}
		if (rc < 0) {
			log_kv(LOG_WARN, "reply failed", "delivery",
			    ev->delivery, "error", *cause, NULL);
			free(*cause);
			*cause = NULL;
		}
	}
	finish_comment(r->a, claim);
out:
	r->pg = NULL;
	free(pg.reply);
	free(claim);
	free(comment);
	commands_result_release(&res);
	return ret;
}

/* A PR/MR closed or merged: its live tasks end. */
static int
on_closed(struct run *r, char **cause)
{
	struct k8s_status st = { 0 };
	json_t *items = NULL, *t;
	size_t i;
	int ret = INBOX_DONE, rc;

	if ((rc = pr_tasks(r, &items, &st)) < 0) {
		*cause = xasprintf("listing the tasks: %s", st.message ?
		    st.message : "failed");
		k8s_status_release(&st);
		store_retry(r, rc);
		return INBOX_RETRY;
	}
	json_array_foreach(items, i, t) {
		const char *name = k8s_meta_str(t, "name");
		json_t *patch;

		if (task_finished(t))
			continue;
		if (r->a->ac.dry_run) {
			log_kv(LOG_INFO, "dry run: would end the task",
			    "delivery", r->ev->delivery, "task", name, NULL);
			continue;
		}
		patch = json_pack("{s:{s:s,s:s,s:s}}", "status", "phase",
		    "Failed", "reason", "PullRequestClosed", "message",
		    r->ev->kind == SCM_EV_MERGED ? "the pull request was "
		    "merged" : "the pull request was closed");
		rc = k8s_patch(r->a->ac.store, &K8S_AGENTTASK, r->ns, name, 1,
		    patch, NULL, &st);
		json_decref(patch);
		if (rc < 0 && rc != K8S_ENOTFOUND) {
			*cause = xasprintf("ending task '%s': %s", name,
			    st.message ? st.message : "failed");
			store_retry(r, rc);
			ret = INBOX_RETRY;
		} else {
			log_kv(LOG_INFO, "task ended: pull request closed",
			    "delivery", r->ev->delivery, "task", name, NULL);
		}
		k8s_status_release(&st);
	}
	json_decref(items);
	return ret;
}

/*
 * Whether the event's repository is allowed now: repo_allowlist may have
 * been narrowed (SIGHUP, or a restart) since the door let it in.
 */
static int
repo_allowed(const struct run *r)
{
	const struct actions_config *ac = &r->a->ac;

	return ac->repo_allowed == NULL || ac->repo_allowed(
	    ac->repo_allowed_arg, r->ev->provider, r->host, r->ev->repo);
}

/* The inbox handler. */
static int
actions_handle(void *arg, struct inbox_item *item, char **cause)
{
	struct actions *a = arg;
	const struct scm_event *ev = item->event;
	const struct config *cfg = a->ac.cfg;
	struct run r;
	int ret = INBOX_DONE;

	memset(&r, 0, sizeof(r));
	r.a = a;
	r.ev = ev;
	r.provider = scm_provider_name(ev->provider);
	r.client = ev->provider == SCM_GITLAB ? a->ac.gitlab : a->ac.github;
	r.host = scm_repo_host(ev->provider == SCM_GITLAB ?
	    cfg->gitlab.api_url : cfg->github.api_url,
	    ev->provider == SCM_GITLAB ? "gitlab.com" : "github.com");
	buf_init(&r.reply, 60000);
	if (!repo_allowed(&r)) {
		/* no reaction, reply or task, not even the audit record */
		log_kv(LOG_WARN, "event dropped: repository not allowed "
		    "(repo_allowlist)", "delivery", ev->delivery, "provider",
		    r.provider, "repo", ev->repo, NULL);
		goto out;
	}
	/* every handled event goes to the audit trail (handled_events) */
	item->effect = inbox_record_effect;
	item->effect_arg = NULL;
	if (r.client == NULL) {
		/* no API credentials for this provider: intake only */
		log_kv(LOG_INFO, "event recorded, not run: no API token for "
		    "this provider", "delivery", ev->delivery, "provider",
		    r.provider, NULL);
		goto out;
	}
	if (ev->repo == NULL) {
		*cause = xstrdup("the event names no repository");
		ret = INBOX_FAIL;
		goto out;
	}
	r.repo.full_name = ev->repo;
	r.repo.project_id = ev->project_id;
	r.repo.installation_id = ev->installation_id;
	r.ns = namespace_for(cfg, r.host, ev->repo);
	r.repo_hash = repo_hash(r.provider, r.host, ev->repo);
	if (ev->kind == SCM_EV_COMMENT)
		ret = on_comment(&r, cause);
	else if (ev->kind == SCM_EV_CLOSED || ev->kind == SCM_EV_MERGED)
		ret = on_closed(&r, cause);
	/* a rate limit is retried when it resets (DESIGN 11) */
	if (ret == INBOX_RETRY) {
		item->retry_at_ms = r.retry_at_ms;
		item->transient = r.transient;
	}
out:
	buf_release(&r.reply);
	free(r.host);
	free(r.ns);
	free(r.repo_hash);
	return ret;
}

/* Whether scm_comments has column col. */
static int
has_column(sqlite3 *db, const char *col)
{
	sqlite3_stmt *st = NULL;
	char *sql = xasprintf("SELECT %s FROM scm_comments", col);
	int have = sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK;

	sqlite3_finalize(st);
	free(sql);
	return have;
}

/* A table from before the progress (or re-run) columns gets them. */
static int
add_progress_columns(sqlite3 *db, char **cause)
{
	if (!has_column(db, "progress") && db_exec(db, "ALTER TABLE"
	    " scm_comments ADD COLUMN progress INTEGER NOT NULL DEFAULT 0;"
	    " ALTER TABLE scm_comments ADD COLUMN refused INTEGER NOT NULL"
	    " DEFAULT 0; ALTER TABLE scm_comments ADD COLUMN reply TEXT;",
	    cause) < 0)
		return -1;
	if (!has_column(db, "rerun_cmd") && db_exec(db, "ALTER TABLE"
	    " scm_comments ADD COLUMN rerun_cmd INTEGER NOT NULL DEFAULT -1;"
	    " ALTER TABLE scm_comments ADD COLUMN rerun_run INTEGER NOT NULL"
	    " DEFAULT 0;", cause) < 0)
		return -1;
	return 0;
}

/* Start the command handler. */
int
actions_new(struct actions **out, const struct actions_config *ac,
    char **cause)
{
	struct actions *a = xcalloc(1, sizeof(*a));

	a->ac = *ac;
	pthread_mutex_init(&a->db_mu, NULL);
	pthread_mutex_init(&a->authz_mu, NULL);
	if (db_open(ac->db_path, 0, &a->db, cause) < 0 ||
	    db_exec(a->db, "CREATE TABLE IF NOT EXISTS scm_comments ("
	    " key TEXT PRIMARY KEY, delivery TEXT NOT NULL,"
	    " state INTEGER NOT NULL, at INTEGER NOT NULL,"
	    " progress INTEGER NOT NULL DEFAULT 0,"
	    " refused INTEGER NOT NULL DEFAULT 0, reply TEXT,"
	    " rerun_cmd INTEGER NOT NULL DEFAULT -1,"
	    " rerun_run INTEGER NOT NULL DEFAULT 0);", cause) < 0 ||
	    add_progress_columns(a->db, cause) < 0) {
		actions_free(a);
		return -1;
	}
	*out = a;
	return 0;
}

/* The handler to give the inbox. */
struct inbox_handler
actions_handler(struct actions *a)
{
	struct inbox_handler h = { actions_handle, a };

	return h;
}

/* Free. */
void
actions_free(struct actions *a)
{
	struct authz_entry *e;

	if (a == NULL)
		return;
	db_close(a->db);
	while ((e = a->authz) != NULL) {
		a->authz = e->next;
		free(e->key);
		free(e);
	}
	pthread_mutex_destroy(&a->db_mu);
	pthread_mutex_destroy(&a->authz_mu);
	free(a);
}
