/*
 * diverged: the daemon. Reads the configuration, opens the state
 * directory, starts the durable inbox and the HTTP front door, and turns
 * signals into a reload (SIGHUP) or a graceful stop (SIGTERM, SIGINT).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "config/config.h"
#include "controller/controller.h"
#include "http/http.h"
#include "k8s/k8s.h"
#include "leader/leader.h"
#include "meter/meter.h"
#include "notifier/notifier.h"
#include "scm/scm.h"
#include "util/util.h"

/* Secrets resolved from the configuration; swapped whole on SIGHUP. */
struct provider_keys {
	char **vals;
	size_t *lens;
	size_t n;
	unsigned char *signing;
	size_t signing_len;
};

struct provider {
	enum scm_provider id;
	int enabled;
	pthread_rwlock_t lock;
	struct provider_keys keys;
	/* repo_allowlist, a copy swapped with the keys on SIGHUP */
	struct config_strlist allow;
	char *host;		/* of its repositories; set before threads */
	/* under lock: a reloaded token, the identity to ask again */
	int relearn;
};

struct daemon {
	struct config cfg;
	struct inbox *inbox;
	struct http_server *http;
	struct k8s_api *store;
	/*
	 * Leader election (kubernetes.leader_election): its own client,
	 * whose calls give up within renew_deadline, and the election.
	 * The controller and the notifier start, on the main thread, only
	 * once it says LEADER_LEADING; leader_work says they did.
	 */
	struct k8s_api *lease_api;
	struct leader *leader;
	int leader_work;
	pthread_t main_thread;
	int leader_work_stopped;	/* atomic: for the lost watchdog */
	struct k8s_apiserver *apiserver;
	struct meter *meter;
	struct controller *controller;
	struct notifier *notifier;
	struct scm_client *github_client;
	struct scm_client *gitlab_client;
	struct actions *actions;
	char *self_gitlab;
	int dry_run;
	struct http_pool *pool;
	pthread_t pruner;
	int pruner_running;
	pthread_mutex_t prune_mu;
	pthread_cond_t prune_cv;
	int prune_wake;		/* under prune_mu: look again now */
	struct provider github;
	struct provider gitlab;
	struct webhook_identity self;
	char *self_github;
	int stopping;		/* atomic */
	/* SIGTERM or SIGINT during the start (see start_watch_main) */
	pthread_t start_watch;
	int start_watching;
	int start_done;		/* atomic */
	int early_signal;	/* atomic */
	char *db_path;
	/* the command line's overrides, applied on reload too */
	const char *ov_listen, *ov_api_listen, *ov_state_dir;
};

static struct daemon D;

/* ------------------------------------------------------------ secrets */

static void
keys_release(struct provider_keys *k)
{
	size_t i;

	for (i = 0; i < k->n; i++) {
		secure_wipe(k->vals[i], k->lens[i]);
		free(k->vals[i]);
	}
	free(k->vals);
	free(k->lens);
	if (k->signing != NULL) {
		secure_wipe(k->signing, k->signing_len);
		free(k->signing);
	}
	memset(k, 0, sizeof(*k));
}

/*
 * Read a secret used as a C string (a token, a key in PEM): one with a
 * NUL byte is refused, not cut short at it ("\0..." would be no token).
 */
static int
text_secret_read(const char *ref, char **out, size_t *outlen, char **cause)
{
	char *v = NULL;
	size_t len = 0;

	if (config_secret_read(ref, &v, &len, cause) < 0)
		return -1;
	if (strlen(v) != len) {
		secure_wipe(v, len);
		free(v);
		*cause = xstrdup("the secret holds a NUL byte");
		return -1;
	}
	*out = v;
	*outlen = len;
	return 0;
}

/*
 * The error of a secret-valued key, "FILE:LINE: 'KEY': what" like the
 * parser's when the configuration file says where the key was written.
 */
static char *
secret_error(const struct config *cfg, const char *key, const char *what)
{
	int line = config_key_line(cfg, key);

	if (cfg->file != NULL && line > 0)
		return xasprintf("%s:%d: '%s': %s", cfg->file, line, key,
		    what);
	if (cfg->file != NULL)
		return xasprintf("%s: '%s': %s", cfg->file, key, what);
	return xasprintf("'%s': %s", key, what);
}

static int
keys_load(struct provider_keys *out, const struct config *cfg,
    const char *what, const struct config_strlist *refs,
    const char *signing_ref, char **cause)
{
	struct provider_keys k;
	size_t i;
	char *c = NULL, *key;

	memset(&k, 0, sizeof(k));
	k.vals = xcalloc(refs->n + 1, sizeof(char *));
	k.lens = xcalloc(refs->n + 1, sizeof(size_t));
	for (i = 0; i < refs->n; i++) {
		if (config_secret_read(refs->v[i], &k.vals[i], &k.lens[i],
		    &c) < 0) {
			key = xasprintf("%s[%zu]", what, i);
			*cause = secret_error(cfg, key, c);
			free(key);
			free(c);
			keys_release(&k);
			return -1;
		}
		k.n++;
	}
	if (signing_ref != NULL && *signing_ref) {
		char *tok = NULL;
		size_t tlen = 0;
		int r;

		if (text_secret_read(signing_ref, &tok, &tlen, &c) < 0) {
			*cause = secret_error(cfg, "gitlab.signing_token", c);
			free(c);
			keys_release(&k);
			return -1;
		}
		r = webhook_signing_key_decode(tok, &k.signing,
		    &k.signing_len);
		secure_wipe(tok, tlen);
		free(tok);
		if (r < 0) {
			*cause = secret_error(cfg, "gitlab.signing_token",
			    "not a whsec_<base64> signing token");
			keys_release(&k);
			return -1;
		}
	}
	*out = k;
	return 0;
}

/*
 * Put a provider's new keys (now owned by pv) and a copy of cfg's
 * repo_allowlist in force, under its lock: the webhook handlers and the
 * inbox workers read them under the same lock.
 */
static void
provider_swap(struct provider *pv, struct provider_keys *keys,
    const struct config *cfg, int enabled)
{
	struct config_strlist allow;

	config_strlist_copy(&allow, &cfg->repo_allowlist);
	pthread_rwlock_wrlock(&pv->lock);
	keys_release(&pv->keys);
	pv->keys = *keys;
	config_strlist_release(&pv->allow);
	pv->allow = allow;
	pv->enabled = enabled;
	pthread_rwlock_unlock(&pv->lock);
}

/*
 * Resolve every webhook secret of cfg; swap them in, with cfg's
 * repo_allowlist, only if all load.
 */
static int
secrets_reload(const struct config *cfg, char **cause)
{
	struct provider_keys gh, gl;

	memset(&gh, 0, sizeof(gh));
	memset(&gl, 0, sizeof(gl));
	if (cfg->github.enabled && keys_load(&gh, cfg,
	    "github.webhook_secrets", &cfg->github.webhook_secrets, NULL,
	    cause) < 0)
		return -1;
	if (cfg->gitlab.enabled && keys_load(&gl, cfg,
	    "gitlab.webhook_tokens", &cfg->gitlab.webhook_tokens,
	    cfg->gitlab.signing_token, cause) < 0) {
		keys_release(&gh);
		return -1;
	}
	provider_swap(&D.github, &gh, cfg, cfg->github.enabled);
	provider_swap(&D.gitlab, &gl, cfg, cfg->gitlab.enabled);
	return 0;
}

/*
 * The inbox workers' check of repo_allowlist (actions_config), against
 * the list in force when the event is handled.
 */
static int
repo_allowed_now(void *arg, enum scm_provider id, const char *host,
    const char *repo)
{
	struct provider *pv = id == SCM_GITLAB ? &D.gitlab : &D.github;
	int ok;

	pthread_rwlock_rdlock(&pv->lock);
	ok = scm_repo_allowed((const char *const *)pv->allow.v, pv->allow.n,
	    host, repo);
	pthread_rwlock_unlock(&pv->lock);
	return ok;
}

/*
 * A pattern whose first segment, written without a glob character, is
 * not the host of an enabled provider can match no repository: patterns
 * match HOST/owner/name, and "myorg/..." (the owner first) is the likely
 * slip. Said, not refused: the file is valid, and a host may be added.
 */
static void
warn_hostless(const struct config *cfg, const char *key, size_t i,
    const char *glob)
{
	size_t n = strcspn(glob, "/");
	char *seg, *where, *hosts;

	if (glob[n] == '\0' || strcspn(glob, "*?[") < n)
		return;
	seg = xstrndup(glob, n);
	if ((cfg->github.enabled && strcasecmp(seg, D.github.host) == 0) ||
	    (cfg->gitlab.enabled && strcasecmp(seg, D.gitlab.host) == 0)) {
		free(seg);
		return;
	}
	where = xasprintf("%s[%zu]", key, i);
	hosts = xasprintf("%s%s%s", cfg->github.enabled ? D.github.host : "",
	    cfg->github.enabled && cfg->gitlab.enabled ? ", " : "",
	    cfg->gitlab.enabled ? D.gitlab.host : "");
	log_kv(LOG_WARN, "a repository pattern names a host no enabled "
	    "provider serves, so it matches nothing: patterns match "
	    "HOST/owner/name (e.g. github.com/myorg/*)", "key", where,
	    "pattern", glob, "host", seg, "provider_hosts", hosts, NULL);
	free(hosts);
	free(where);
	free(seg);
}

/*
 * The risk of an empty repo_allowlist, and patterns that can match
 * nothing, said at start and on SIGHUP.
 */
static void
warn_allowlist(const struct config *cfg)
{
	size_t i;

	if (!cfg->github.enabled && !cfg->gitlab.enabled)
		return;
	if (cfg->repo_allowlist.n == 0)
		log_kv(LOG_WARN, "repo_allowlist is empty: any repository "
		    "that sends a correctly signed delivery can run agents; "
		    "set repo_allowlist", NULL);
	for (i = 0; i < cfg->repo_allowlist.n; i++)
		warn_hostless(cfg, "repo_allowlist", i,
		    cfg->repo_allowlist.v[i]);
	for (i = 0; i < cfg->nrepos; i++)
		warn_hostless(cfg, "repos", i, cfg->repos[i].match);
}

/*
 * Every other secret the configuration names can be read (the clients
 * and the API server read them again when they start): a missing or
 * unreadable one is a configuration error, reported before anything
 * starts, by --check-config too.
 */
static int
secrets_check(const struct config *cfg, char **cause)
{
	const struct {
		const char *key;
		const char *ref;
		int used;
	} refs[] = {
		{ "api.token", cfg->api.token, cfg->kubernetes.mode ==
		    KUBE_EMBEDDED && cfg->api.listen != NULL },
		{ "github.token", cfg->github.token, cfg->github.enabled },
		{ "github.app.private_key", cfg->github.app.private_key,
		    cfg->github.enabled },
		{ "gitlab.token", cfg->gitlab.token, cfg->gitlab.enabled },
	};
	size_t i, len;

	for (i = 0; i < ARRAY_SIZE(refs); i++) {
		char *v = NULL, *c = NULL;

		if (!refs[i].used || refs[i].ref == NULL || *refs[i].ref == '\0')
			continue;
		if (text_secret_read(refs[i].ref, &v, &len, &c) < 0) {
			*cause = secret_error(cfg, refs[i].key, c);
			free(c);
			return -1;
		}
		secure_wipe(v, len);
		free(v);
	}
	return 0;
}

/* ----------------------------------------------------------- handlers */

static int
h_healthz(void *arg, struct http_req *req)
{
	http_reply_json(req, 200, json_pack("{s:s}", "status", "ok"));
	return HTTP_DONE;
}

static int
store_reachable(void)
{
	sqlite3 *db = NULL;
	struct k8s_status st = { 0 };
	json_t *obj = NULL;
	int ok, rc;

	ok = sqlite3_open_v2(D.db_path, &db, SQLITE_OPEN_READONLY, NULL) ==
	    SQLITE_OK && sqlite3_exec(db, "SELECT 1 FROM inbox LIMIT 1",
	    NULL, NULL, NULL) == SQLITE_OK;
	sqlite3_close(db);
	if (!ok)
		return 0;
	/* the resource store answers (NotFound is an answer) */
	rc = k8s_get(D.store, &K8S_AGENTTASK, D.cfg.namespace,
	    "diverge-readiness-probe", &obj, &st);
	json_decref(obj);
	k8s_status_release(&st);
	return rc == 0 || rc == K8S_ENOTFOUND;
}

static int
h_readyz(void *arg, struct http_req *req)
{
	const char *why = NULL;

	if (__atomic_load_n(&D.stopping, __ATOMIC_RELAXED))
		why = "shutting down";
	else if (!inbox_running(D.inbox))
		why = "inbox workers not running";
	else if (!store_reachable())
		why = "state database not reachable";
	if (why != NULL) {
		http_reply_json(req, 503, json_pack("{s:b,s:s}", "ready", 0,
		    "error", why));
		return HTTP_DONE;
	}
	http_reply_json(req, 200, json_pack("{s:b}", "ready", 1));
	return HTTP_DONE;
}

static int
h_metrics(void *arg, struct http_req *req)
{
	struct buf b;

	buf_init(&b, 16u << 20);
	if (metrics_render(&b) < 0) {
		buf_release(&b);
		http_reply_error(req, 500, "metrics too large");
		return HTTP_DONE;
	}
	http_reply(req, 200, "text/plain; version=0.0.4; charset=utf-8",
	    b.data ? b.data : "", b.len);
	buf_release(&b);
	return HTTP_DONE;
}

static const char *
req_header(void *arg, const char *name)
{
	return http_req_header(arg, name);
}

struct pending_put {
	struct http_req *req;
	char *delivery;
	char *provider;
	int64_t start_ms;
};

static void
count_webhook(const char *provider, const char *outcome, const char *reason)
{
	char labels[256];

	snprintf(labels, sizeof(labels),
	    "provider=\"%s\",outcome=\"%s\",reason=\"%s\"", provider, outcome,
	    reason);
	metrics_inc("diverge_webhook_deliveries_total", labels, 1);
}

static void
put_done(void *arg, enum inbox_put_result r)
{
	struct pending_put *p = arg;
	const char *outcome = "accepted";

	switch (r) {
	case INBOX_STORED:
		http_reply_json(p->req, 202, json_pack("{s:b,s:s}", "accepted",
		    1, "delivery", p->delivery));
		log_kv(LOG_INFO, "webhook accepted", "delivery", p->delivery,
		    "provider", p->provider, NULL);
		break;
	case INBOX_REQUEUED:
		/*
		 * a dead letter's redelivery: its id is stored, so it is a
		 * duplicate (DESIGN's answer), whose entry is now pending
		 * again on disk
		 */
		outcome = "requeued";
		http_reply_json(p->req, 200, json_pack("{s:b,s:s,s:b}",
		    "duplicate", 1, "delivery", p->delivery, "requeued", 1));
		log_kv(LOG_INFO, "webhook duplicate: dead letter requeued",
		    "delivery", p->delivery, "provider", p->provider, NULL);
		break;
	case INBOX_DUPLICATE:
		outcome = "duplicate";
		http_reply_json(p->req, 200, json_pack("{s:b,s:s}",
		    "duplicate", 1, "delivery", p->delivery));
		log_kv(LOG_INFO, "webhook duplicate", "delivery", p->delivery,
		    "provider", p->provider, NULL);
		break;
	case INBOX_FULL:
		outcome = "inbox_full";
		http_reply_header(p->req, "Retry-After", "30");
		http_reply_error(p->req, 503, "inbox full, retry later");
		log_kv(LOG_WARN, "webhook refused: inbox full", "delivery",
		    p->delivery, "provider", p->provider, NULL);
		break;
	default:
		outcome = "store_error";
		http_reply_header(p->req, "Retry-After", "5");
		http_reply_error(p->req, 503, "cannot store the delivery");
		log_kv(LOG_ERROR, "webhook not stored", "delivery",
		    p->delivery, "provider", p->provider, NULL);
	}
	count_webhook(p->provider, outcome, outcome);
	/* the reply above resumed the request: p->req is not ours anymore */
	free(p->delivery);
	free(p->provider);
	free(p);
}

static int
h_webhook(void *arg, struct http_req *req)
{
	struct provider *pv = arg;
	const char *pname = scm_provider_name(pv->id);
	const char *reason = NULL, *did;
	struct webhook_keys keys;
	struct scm_event ev;
	enum webhook_verdict v;
	const char *body;
	size_t len;

	memset(&ev, 0, sizeof(ev));
	did = pv->id == SCM_GITHUB ?
	    http_req_header(req, "X-GitHub-Delivery") :
	    (http_req_header(req, "Idempotency-Key") ?
	    http_req_header(req, "Idempotency-Key") :
	    http_req_header(req, "X-Gitlab-Event-UUID"));
	pthread_rwlock_rdlock(&pv->lock);
	if (!pv->enabled) {
		pthread_rwlock_unlock(&pv->lock);
		count_webhook(pname, "rejected", "provider disabled");
		http_reply_error(req, 404, pv->id == SCM_GITHUB ?
		    "github webhooks are not enabled" :
		    "gitlab webhooks are not enabled");
		return HTTP_DONE;
	}
	keys.secrets = (const char **)pv->keys.vals;
	keys.secret_lens = pv->keys.lens;
	keys.nsecrets = pv->keys.n;
	keys.signing_key = pv->keys.signing;
	keys.signing_key_len = pv->keys.signing_len;
	keys.allow = (const char *const *)pv->allow.v;
	keys.nallow = pv->allow.n;
	keys.host = pv->host;
	body = http_req_body(req, &len);
	v = webhook_handle(pv->id, &keys, &D.self, req_header, req, body, len,
	    now_unix(), &ev, &reason);
	pthread_rwlock_unlock(&pv->lock);

	switch (v) {
	case WH_UNAUTHORIZED:
		count_webhook(pname, "rejected", reason);
		log_kv(LOG_WARN, "webhook rejected", "delivery", did,
		    "provider", pname, "status", "401", "reason", reason, NULL);
		http_reply_error(req, 401, reason);
		return HTTP_DONE;
	case WH_UNSUPPORTED:
		count_webhook(pname, "rejected", "unsupported media type");
		log_kv(LOG_WARN, "webhook rejected", "delivery", did,
		    "provider", pname, "status", "415", "reason", reason, NULL);
		http_reply_error(req, 415, reason);
		return HTTP_DONE;
	case WH_BAD_REQUEST:
		count_webhook(pname, "rejected", "malformed");
		log_kv(LOG_WARN, "webhook rejected", "delivery", did,
		    "provider", pname, "status", "400", "reason", reason, NULL);
		http_reply_json(req, 400, json_pack("{s:s,s:s}", "error",
		    "malformed payload", "detail", reason));
		return HTTP_DONE;
	case WH_IGNORE:
		count_webhook(pname, "ignored", reason);
		log_kv(LOG_INFO, "webhook ignored", "delivery", ev.delivery,
		    "provider", pname, "event", ev.event_name, "repo", ev.repo,
		    "reason", reason, NULL);
		http_reply_json(req, 200, json_pack("{s:s}", "ignored",
		    reason));
		scm_event_release(&ev);
		return HTTP_DONE;
	case WH_ACCEPT:
		break;
	}
	{
		struct pending_put *p = xcalloc(1, sizeof(*p));
		char *js = scm_event_encode(&ev);
		char *key = xasprintf("%s:%s", pname, ev.delivery);

		p->req = req;
		p->delivery = xstrdup(ev.delivery);
		p->provider = xstrdup(pname);
		http_req_set_log_id(req, ev.delivery);
		/* p is now owned by put_done */
		inbox_put_async(D.inbox, key, pname, js, put_done, p);
		free(key);
		free(js);
	}
	scm_event_release(&ev);
	return HTTP_SUSPENDED;
}

/* Send a meter reply (from a pool thread, or the store's writer). */
static void
meter_done(void *arg, struct meter_reply *r)
{
	struct http_req *req = arg;

	if (r->status == 401)
		http_reply_header(req, "WWW-Authenticate",
		    "Bearer realm=\"diverge\"");
	else if (r->status == 503)	/* the store failed: nothing charged */
		http_reply_header(req, "Retry-After", "5");
	/* this resumes the request: req is not ours anymore */
	http_reply(req, r->status, "application/json", r->body,
	    strlen(r->body));
}

/* A meter call for a pool thread, with what it needs of the headers. */
struct meter_job {
	int complete;
	char *authorization;
};

static void
meter_work(void *arg, struct http_req *req)
{
	struct meter_job *j = arg;
	struct meter_reply r;
	const char *body;
	size_t len;

	/* the body is the request's; headers are the connection's, gone
	 * if it closes meanwhile: taken on the server thread */
	body = http_req_body(req, &len);
	if (j->complete)
		meter_complete(D.meter, j->authorization, body, len, &r);
	else
		meter_charge(D.meter, j->authorization, body, len, &r);
	meter_done(req, &r);
	meter_reply_release(&r);
	free(j->authorization);
	free(j);
}

static int
h_meter(void *arg, struct http_req *req)
{
	const char *ct = http_req_header(req, "Content-Type");
	const char *body;
	size_t len;

	if (!media_type_is(ct, "application/json")) {
		http_reply_error(req, 415, "content type must be "
		    "application/json");
		return HTTP_DONE;
	}
	if (arg == NULL && meter_is_async(D.meter)) {
		/*
		 * The embedded store: checks here, the charge in the store's
		 * group commit, the reply from its callback; no thread waits
		 */
		body = http_req_body(req, &len);
		meter_charge_async(D.meter, http_req_header(req,
		    "Authorization"), body, len, meter_done, req);
		return HTTP_SUSPENDED;
	}
	/* the charge waits for a durable commit: off the server threads */
	{
		struct meter_job *j = xcalloc(1, sizeof(*j));
		const char *auth = http_req_header(req, "Authorization");

		j->complete = arg != NULL;
		j->authorization = auth != NULL ? xstrdup(auth) : NULL;
		http_offload(D.pool, req, meter_work, j);
	}
	return HTTP_SUSPENDED;
}

static const struct http_route routes[] = {
	{ "GET", "/healthz", "/healthz", h_healthz, NULL },
	{ "GET", "/readyz", "/readyz", h_readyz, NULL },
	{ "GET", "/metrics", "/metrics", h_metrics, NULL },
	{ "POST", "/webhooks/github", "/webhooks/github", h_webhook,
	    &D.github },
	{ "POST", "/webhooks/gitlab", "/webhooks/gitlab", h_webhook,
	    &D.gitlab },
	{ "POST", "/api/v1/agenttask/meter", "/api/v1/agenttask/meter",
	    h_meter, NULL },
	{ "POST", "/api/v1/agenttask/complete", "/api/v1/agenttask/complete",
	    h_meter, (void *)1 },
};

/* -------------------------------------------------------------- main */

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: diverged [--config FILE] [--check-config] [--dry-run]\n"
	    "                [--listen ADDR]\n"
	    "                [--api-listen ADDR] [--state-dir DIR] [--version]\n"
	    "                [--help]\n"
	    "\n"
	    "  -c, --config FILE   YAML configuration (default: none, the\n"
	    "                      embedded mode with webhooks disabled)\n"
	    "      --check-config  validate the configuration and its secrets,\n"
	    "                      then exit (0 valid, 2 invalid)\n"
	    "      --dry-run       verify, parse and authorize commands, then\n"
	    "                      log and reply what would be written; write\n"
	    "                      nothing\n"
	    "  -l, --listen ADDR   override 'listen' (HOST:PORT)\n"
	    "  -a, --api-listen ADDR\n"
	    "                      override 'api.listen', the Kubernetes API of\n"
	    "                      the embedded store ('off' disables it)\n"
	    "  -s, --state-dir DIR override 'state_dir'\n"
	    "  -V, --version       print the version and exit\n"
	    "  -h, --help          print this help and exit\n"
	    "\n"
	    "Signals: SIGHUP re-reads the configuration's secrets,\n"
	    "repo_allowlist and log settings (level, format); SIGTERM and\n"
	    "SIGINT stop gracefully.\n");
}

static int
mkdir_p(const char *path, char **cause)
{
	char *p = xstrdup(path), *s;
	int ret = 0;

	for (s = p + 1; ; s++) {
		if (*s == '/' || *s == '\0') {
			char c = *s;

			*s = '\0';
			if (mkdir(p, 0700) < 0 && errno != EEXIST) {
				*cause = xasprintf("state_dir '%s': %s", p,
				    strerror(errno));
				ret = -1;
				break;
			}
			*s = c;
			if (c == '\0')
				break;
		}
	}
	free(p);
	return ret;
}

/*
 * The state directory holds the databases and, in embedded mode, the
 * root key: one anybody may write to lets anybody replace them (and forge
 * tokens). World-writable is refused; group-writable is allowed, as a
 * Kubernetes volume with an fsGroup is.
 */
static int
state_dir_safe(char **cause)
{
	struct stat st;

	if (stat(D.cfg.state_dir, &st) < 0) {
		*cause = xasprintf("state_dir '%s': %s", D.cfg.state_dir,
		    strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		*cause = xasprintf("state_dir '%s': not a directory",
		    D.cfg.state_dir);
		return -1;
	}
	if (st.st_mode & S_IWOTH) {
		*cause = xasprintf("state_dir '%s': permissions %04o let any "
		    "user write to it (chmod o-w)", D.cfg.state_dir,
		    (unsigned int)(st.st_mode & 07777));
		return -1;
	}
	return 0;
}

/*
 * One daemon per state directory: a second one on the same databases
 * would handle the same inbox entries and, in embedded mode, write the
 * store behind the first one's back (its writer caches what it committed
 * and numbers the resourceVersions), so it is refused. The lock is an
 * fcntl lock on STATE_DIR/diverged.lock, held while the process lives
 * (the kernel drops it however the process ends, kill -9 included); the
 * file names the holder's pid for the message.
 */
static int
state_dir_lock(char **cause)
{
	struct flock fl;
	char *path = xasprintf("%s/diverged.lock", D.cfg.state_dir);
	char pid[32] = "";
	ssize_t n;
	int fd;

	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		*cause = xasprintf("state_dir: cannot open '%s': %s", path,
		    strerror(errno));
		free(path);
		return -1;
	}
	memset(&fl, 0, sizeof(fl));
	fl.l_type = F_WRLCK;
	fl.l_whence = SEEK_SET;
	if (fcntl(fd, F_SETLK, &fl) < 0) {
		int e = errno;

		n = pread(fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? strcspn(pid, "\n") : 0] = '\0';
		if (e == EACCES || e == EAGAIN)
			*cause = xasprintf("state_dir '%s' is in use by another "
			    "diverged%s%s%s (one daemon per state directory)",
			    D.cfg.state_dir, *pid ? " (pid " : "", pid,
			    *pid ? ")" : "");
		else
			*cause = xasprintf("state_dir: cannot lock '%s': %s",
			    path, strerror(e));
		close(fd);
		free(path);
		return -1;
	}
	snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
	if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, strlen(pid), 0) < 0)
		log_kv(LOG_WARN, "state_dir: cannot write the lock file",
		    "file", path, "error", strerror(errno), NULL);
	free(path);
	/* kept open, so locked, until the process ends */
	return 0;
}

/* The resource store: embedded in the state database, or a cluster. */
static int
open_store(char **cause)
{
	struct k8s_cluster c;
	int rc;

	if (D.cfg.kubernetes.mode == KUBE_EMBEDDED)
		return k8s_embedded_open(&D.store, D.db_path, NULL, cause);
	memset(&c, 0, sizeof(c));
	if (D.cfg.kubernetes.mode == KUBE_IN_CLUSTER)
		rc = k8s_incluster_load(&c, NULL, cause);
	else
		rc = k8s_kubeconfig_load(&c, D.cfg.kubernetes.kubeconfig,
		    D.cfg.kubernetes.context, cause);
	if (rc == 0)
		rc = k8s_rest_open(&D.store, &c, NULL, cause);
	if (rc == 0 && D.cfg.kubernetes.leader_election.enabled) {
		struct k8s_rest_config rc_lease;
		int64_t renew = D.cfg.kubernetes.leader_election.
		    renew_deadline_ms;

		/* a renewal, its retries included, within renew_deadline */
		memset(&rc_lease, 0, sizeof(rc_lease));
		rc_lease.timeout_ms = (int)renew;
		rc_lease.connect_timeout_ms = (int)(renew < 5000 ? renew :
		    5000);
		rc_lease.deadline_ms = renew;
		rc = k8s_rest_open(&D.lease_api, &c, &rc_lease, cause);
	}
	if (rc == 0)
		log_kv(LOG_INFO, "using a kubernetes cluster", "server",
		    c.server, "namespace", c.namespace, NULL);
	k8s_cluster_release(&c);
	return rc;
}

/*
 * The macaroon root key: a 0600 file in the state directory (created on
 * first start) in embedded mode; the Secret diverge-macaroon-root-key
 * (key root-key) of the controller namespace on a cluster.
 */
static int
load_root_key(unsigned char key[MACAROON_KEY_LEN], char **cause)
{
	struct k8s_status st = { 0 };
	const char *ns = D.cfg.controller.namespace;
	json_t *sec = NULL;
	int tries, rc = -1;

	if (D.cfg.kubernetes.mode == KUBE_EMBEDDED) {
		char *path = xasprintf("%s/macaroon-root-key",
		    D.cfg.state_dir);

		rc = meter_root_key_ensure_file(path, key, cause);
		free(path);
		return rc;
	}
	for (tries = 0; tries < 3 && rc < 0; tries++) {
		const char *b64;
		unsigned char *raw = NULL;
		size_t n = 0;

		if (k8s_get(D.store, &K8S_SECRET, ns,
		    "diverge-macaroon-root-key", &sec, &st) == K8S_ENOTFOUND) {
			unsigned char fresh[MACAROON_KEY_LEN];
			char hex[2 * MACAROON_KEY_LEN + 1], *enc;
			json_t *obj;

			k8s_status_release(&st);
			random_bytes(fresh, sizeof(fresh));
			hex_encode(fresh, sizeof(fresh), hex);
			secure_wipe(fresh, sizeof(fresh));
			enc = base64_encode((unsigned char *)hex, strlen(hex),
			    0, 1);
			secure_wipe(hex, sizeof(hex));
			obj = json_pack("{s:s,s:s,s:{s:s},s:s,s:{s:s}}",
			    "apiVersion", "v1", "kind", "Secret", "metadata",
			    "name", "diverge-macaroon-root-key", "type",
			    "Opaque", "data", "root-key", enc);
			secure_wipe(enc, strlen(enc));
			free(enc);
			/* AlreadyExists: another replica won; read theirs */
			k8s_create(D.store, &K8S_SECRET, ns, obj, NULL, &st);
			json_decref(obj);
			k8s_status_release(&st);
			continue;
		}
		if (sec == NULL) {
			*cause = xasprintf("secret '%s/diverge-macaroon-root-key'"
			    ": %s", ns, st.message ? st.message : "unreadable");
			break;
		}
		b64 = json_string_value(json_object_get(json_object_get(sec,
		    "data"), "root-key"));
		if (b64 == NULL || base64_decode(b64, strlen(b64), &raw,
		    &n) < 0) {
			*cause = xasprintf("secret '%s/diverge-macaroon-root-key'"
			    ": no base64 'root-key' field", ns);
			break;
		}
		rc = meter_root_key_parse((char *)raw, n, key, cause);
		secure_wipe(raw, n);
		free(raw);
		json_decref(sec);
		sec = NULL;
	}
	json_decref(sec);
	k8s_status_release(&st);
	return rc;
}

/*
 * The client to ask provider pv who the bot is, when it has one and the
 * identity (*login) is unknown or to be asked again (a reloaded token);
 * else NULL. Read under pv's lock.
 */
static struct scm_client *
unknown_on(struct provider *pv, struct scm_client *const *cl,
    const char *const *login)
{
	struct scm_client *c;

	pthread_rwlock_rdlock(&pv->lock);
	c = *login == NULL || pv->relearn ? *cl : NULL;
	pthread_rwlock_unlock(&pv->lock);
	return c;
}

static int
identity_unknown(void)
{
	return unknown_on(&D.github, &D.github_client,
	    &D.self.github_login) != NULL || unknown_on(&D.gitlab,
	    &D.gitlab_client, &D.self.gitlab_username) != NULL;
}

/*
 * Ask provider pv who the bot is, when not known yet or its token was
 * reloaded: *own (the string kept), *login (what the webhook handlers
 * read) and *id, if given, are set under pv's lock; the identity known
 * before stays until whoami answers. The client's answer serves the
 * notifier too (scm_client_whoami): one request per reload. 1 when it is
 * still to be asked.
 */
static int
learn_one(struct provider *pv, struct scm_client *const *clp, char **own,
    const char **login, int64_t *id)
{
	struct scm_client *cl = unknown_on(pv, clp, login);
	const char *name = scm_provider_name(pv->id);
	char *got = NULL, *c = NULL, msg[64];
	int64_t gid = 0;

	if (cl == NULL)
		return 0;
	if (scm_client_whoami(cl, 0, &got, &gid, &c) != SCM_OK) {
		snprintf(msg, sizeof(msg), "%s identity unknown, tried again in "
		    "a minute", name);
		log_kv(LOG_WARN, msg, "error", c, NULL);
		free(c);
		return 1;
	}
	pthread_rwlock_wrlock(&pv->lock);
	free(*own);
	*own = got;
	*login = got;
	if (id != NULL)
		*id = gid;
	pv->relearn = 0;
	pthread_rwlock_unlock(&pv->lock);
	snprintf(msg, sizeof(msg), "%s identity", name);
	log_kv(LOG_INFO, msg, pv->id == SCM_GITHUB ? "login" : "username", got,
	    NULL);
	return 0;
}

/*
 * Wake the pruner: to look again now (wake, as after a SIGHUP), or only
 * to wait anew, as long as the identity's state says (or to see a stop).
 */
static void
pruner_poke(int wake)
{
	pthread_mutex_lock(&D.prune_mu);
	if (wake)
		D.prune_wake = 1;
	pthread_cond_signal(&D.prune_cv);
	pthread_mutex_unlock(&D.prune_mu);
}

/*
 * Learn the bot's own identity (so that its comments are ignored) where
 * it is not known yet: at start, and after a failure (an API outage at
 * start) on SIGHUP and every minute, from the pruner, until it is. The
 * webhook handlers read it under their provider's lock.
 */
static void
learn_identity(void)
{
	int failed;

	failed = learn_one(&D.github, &D.github_client, &D.self_github,
	    &D.self.github_login, NULL);
	failed |= learn_one(&D.gitlab, &D.gitlab_client, &D.self_gitlab,
	    &D.self.gitlab_username, &D.self.gitlab_user_id);
	/* the pruner may be waiting out its ten minutes: a minute */
	if (failed)
		pruner_poke(0);
}

/*
 * Every 10 minutes: drop index entries of deleted tasks, expired tokens;
 * every minute while the bot's identity is unknown: learn it.
 */
static void *
pruner_main(void *arg)
{
	struct timespec ts;
	int64_t last_prune = now_mono_ms();

	thread_background("pruner");
	pthread_mutex_lock(&D.prune_mu);
	while (!__atomic_load_n(&D.stopping, __ATOMIC_RELAXED)) {
		char *cause = NULL;
		int unknown;

		pthread_mutex_unlock(&D.prune_mu);
		unknown = identity_unknown();
		pthread_mutex_lock(&D.prune_mu);
		/*
		 * A stop or a SIGHUP signalled while the mutex was not held
		 * (just above, or while learning and pruning below) is not
		 * waited out: prune_wake, set under the mutex, says so.
		 */
		if (!__atomic_load_n(&D.stopping, __ATOMIC_RELAXED) &&
		    !D.prune_wake) {
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += unknown ? 60 : 600;
			pthread_cond_timedwait(&D.prune_cv, &D.prune_mu, &ts);
		}
		D.prune_wake = 0;
		if (__atomic_load_n(&D.stopping, __ATOMIC_RELAXED))
			break;
		pthread_mutex_unlock(&D.prune_mu);
		learn_identity();
		if (now_mono_ms() - last_prune >= 600 * 1000) {
			last_prune = now_mono_ms();
			if (meter_prune_all(D.meter, &cause) < 0) {
				log_kv(LOG_WARN, "token index pruning failed",
				    "error", cause, NULL);
				free(cause);
			}
		}
		pthread_mutex_lock(&D.prune_mu);
	}
	pthread_mutex_unlock(&D.prune_mu);
	return NULL;
}

static int
start_meter(char **cause)
{
	unsigned char key[MACAROON_KEY_LEN];
	struct meter_config mc;
	int rc;

	if (load_root_key(key, cause) < 0)
		return -1;
	memset(&mc, 0, sizeof(mc));
	mc.store = D.store;
	mc.root_key = key;
	mc.location = D.cfg.meter.public_url;
	mc.default_budget_usd_micro = D.cfg.defaults.budget_usd_micro;
	mc.default_budget_tokens = D.cfg.defaults.budget_tokens;
	rc = meter_new(&D.meter, &mc, cause);
	secure_wipe(key, sizeof(key));
	if (rc == 0)
		rc = http_pool_new(&D.pool, 64, cause);
	if (rc == 0 && pthread_create(&D.pruner, NULL, pruner_main, NULL) == 0)
		D.pruner_running = 1;
	return rc;
}

/*
 * The SCM clients of the enabled providers that have API credentials, the
 * bot's own identity (so that its comments are ignored), and the command
 * handler. A provider without credentials only records its events.
 */
static int
start_scm(char **cause)
{
	struct actions_config ac;

	if (D.cfg.github.enabled && (D.cfg.github.token != NULL ||
	    D.cfg.github.app.id != NULL)) {
		struct scm_client *cl;

		if (scm_github_new(&cl, &D.cfg, cause) < 0)
			return -1;
		scm_client_keep_holds(cl, D.cfg.state_dir);
		/* the pruner reads it (learn_identity) */
		pthread_rwlock_wrlock(&D.github.lock);
		D.github_client = cl;
		pthread_rwlock_unlock(&D.github.lock);
	} else if (D.cfg.github.enabled) {
		log_kv(LOG_WARN, "github: no API token (github.token or "
		    "github.app): its events are recorded, not run", NULL);
	}
	if (D.cfg.gitlab.enabled && D.cfg.gitlab.token != NULL) {
		struct scm_client *cl;

		if (scm_gitlab_new(&cl, &D.cfg, cause) < 0)
			return -1;
		scm_client_keep_holds(cl, D.cfg.state_dir);
		pthread_rwlock_wrlock(&D.gitlab.lock);
		D.gitlab_client = cl;
		pthread_rwlock_unlock(&D.gitlab.lock);
	} else if (D.cfg.gitlab.enabled) {
		log_kv(LOG_WARN, "gitlab: no API token (gitlab.token): "
		    "its events are recorded, not run", NULL);
	}
	learn_identity();
	memset(&ac, 0, sizeof(ac));
	ac.cfg = &D.cfg;
	ac.store = D.store;
	ac.github = D.github_client;
	ac.gitlab = D.gitlab_client;
	ac.db_path = D.db_path;
	ac.dry_run = D.dry_run;
	ac.repo_allowed = repo_allowed_now;
	return actions_new(&D.actions, &ac, cause);
}

/* The AgentTask reconciler, over every namespace. */
static int
start_controller(char **cause)
{
	struct controller_config cc;

	if (!D.cfg.controller.enabled) {
		log_kv(LOG_INFO, "reconciler disabled (controller.enabled: "
		    "false)", NULL);
		return 0;
	}
	memset(&cc, 0, sizeof(cc));
	cc.store = D.store;
	cc.meter = D.meter;
	cc.cfg = &D.cfg;
	cc.namespace = NULL;
	return controller_start(&D.controller, &cc, cause);
}

/*
 * The sticky status comments on PRs/MRs (DESIGN.md section 9), after the
 * reconciler and the SCM clients; a provider without an API client has
 * none.
 */
static int
start_notifier(char **cause)
{
	struct notifier_config nc;
	char *gh_login = NULL, *gl_user = NULL;
	const char *env;
	int rc;

	if (D.github_client == NULL && D.gitlab_client == NULL)
		return 0;
	memset(&nc, 0, sizeof(nc));
	nc.store = D.store;
	nc.github = D.github_client;
	nc.gitlab = D.gitlab_client;
	nc.cfg = &D.cfg;
	/*
	 * Copies taken under the providers' locks: the pruner, woken by a
	 * failed learn_identity at the start, may be writing them now.
	 */
	pthread_rwlock_rdlock(&D.github.lock);
	if (D.self.github_login != NULL)
		gh_login = xstrdup(D.self.github_login);
	pthread_rwlock_unlock(&D.github.lock);
	pthread_rwlock_rdlock(&D.gitlab.lock);
	if (D.self.gitlab_username != NULL)
		gl_user = xstrdup(D.self.gitlab_username);
	nc.gitlab_user_id = D.self.gitlab_user_id;
	pthread_rwlock_unlock(&D.gitlab.lock);
	nc.github_login = gh_login;
	nc.gitlab_username = gl_user;
	/* a test hook: a shorter throttle of the content-only updates */
	if ((env = getenv("DIVERGE_TEST_NOTIFIER_THROTTLE_MS")) != NULL)
		nc.throttle_ms = strtoll(env, NULL, 10);
	/* and a shorter wait after the provider refused a write */
	if ((env = getenv("DIVERGE_TEST_NOTIFIER_REFUSED_MS")) != NULL)
		nc.refused_ms = strtoll(env, NULL, 10);
	rc = notifier_start(&D.notifier, &nc, cause);
	free(gh_login);	/* notifier_start copied them */
	free(gl_user);
	return rc;
}

/* Serve the embedded store's Kubernetes API on api.listen. */
static int
start_apiserver(char **cause)
{
	struct k8s_apiserver_config ac;
	char *token = NULL;
	size_t tlen = 0;
	int rc;

	if (D.cfg.kubernetes.mode != KUBE_EMBEDDED || D.cfg.api.listen == NULL)
		return 0;
	memset(&ac, 0, sizeof(ac));
	ac.listen = D.cfg.api.listen;
	ac.tls_cert = D.cfg.api.tls_cert;
	ac.tls_key = D.cfg.api.tls_key;
	ac.max_connections = 256;
	if (D.cfg.api.token != NULL && *D.cfg.api.token) {
		char *c = NULL;

		if (text_secret_read(D.cfg.api.token, &token, &tlen,
		    &c) < 0) {
			*cause = xasprintf("'api.token': %s", c);
			free(c);
			return -1;
		}
		ac.token = token;
	}
	rc = k8s_apiserver_start(&D.apiserver, D.store, &ac, cause);
	if (token != NULL) {
		secure_wipe(token, tlen);
		free(token);
	}
	return rc;
}

/* SIGHUP: api.token again, for the embedded store's API server. */
static int
reload_api_token(const struct config *nc, char **cause)
{
	char *token = NULL, *c = NULL;
	size_t len = 0;
	int rc;

	if (D.apiserver == NULL)
		return 0;
	if (nc->api.token == NULL || *nc->api.token == '\0') {
		/* removed: said (a restart does it), the running one stays */
		if (D.cfg.api.token == NULL || *D.cfg.api.token == '\0')
			return 0;
		return k8s_apiserver_set_token(D.apiserver, NULL, cause);
	}
	if (text_secret_read(nc->api.token, &token, &len, &c) < 0) {
		*cause = xasprintf("'api.token': %s", c);
		free(c);
		return -1;
	}
	rc = k8s_apiserver_set_token(D.apiserver, token, cause);
	secure_wipe(token, len);
	free(token);
	return rc;
}

/*
 * controller.max_active_tasks from the file read again: applied when it
 * stays a limit (above 0 before and after; to or from 0 the slot cache
 * and the queue's messages would have to start or stop, so that waits
 * for a restart). A higher one admits the queued tasks it makes room
 * for at once; a lower one stops nothing that runs, and admits no more
 * until the running ones are fewer.
 */
static void
reload_limit(const struct config *nc)
{
	int old = D.cfg.controller.max_active_tasks;
	int now = nc->controller.max_active_tasks;
	char a[16], b[16];

	if (old == now || old <= 0 || now <= 0)
		return;
	/* a standby's controller starts later, with the new limit */
	__atomic_store_n(&D.cfg.controller.max_active_tasks, now,
	    __ATOMIC_RELAXED);
	if (D.controller != NULL)
		controller_limit_changed(D.controller);
	snprintf(a, sizeof(a), "%d", old);
	snprintf(b, sizeof(b), "%d", now);
	log_kv(LOG_INFO, "reload: controller.max_active_tasks changed", "from",
	    a, "to", b, NULL);
}

/*
 * The lost watchdog: a leader that lost the Lease must stop its
 * reconciler and notifier before another process may take the Lease
 * over (lease_duration after the last renewal, renew_deadline of which
 * have passed when the loss is seen). The main thread stops them first
 * thing; if that takes longer, the process exits at once (exit 1, as
 * controller-runtime does), its inbox safe on disk as after a kill.
 *
 * The watchdog is detached and may outlive the main thread's release of
 * the configuration: it reads only its deadline, set before it starts.
 */
static int64_t lost_deadline_ms;

static void *
lost_watchdog_main(void *arg)
{
	int64_t end = lost_deadline_ms;

	(void)arg;
	thread_name("lost-watchdog");
	while (now_mono_ms() < end) {
		if (__atomic_load_n(&D.leader_work_stopped, __ATOMIC_ACQUIRE))
			return NULL;
		sleep_ms(20);
	}
	if (__atomic_load_n(&D.leader_work_stopped, __ATOMIC_ACQUIRE))
		return NULL;
	log_kv(LOG_ERROR, "leader election lost: the reconciler and the "
	    "notifier did not stop before the lease could be taken over, "
	    "exiting now", NULL);
	_exit(1);
}

/* The election's news, on its threads: the gauge, and the main thread. */
static void
leader_changed(void *arg, enum leader_state state)
{
	const struct config *cfg = &D.cfg;
	pthread_t w;

	(void)arg;
	metrics_set("diverge_leader", "", state == LEADER_LEADING ? 1 : 0);
	if (state == LEADER_LOST) {
		/* the election is lost once: the only write */
		lost_deadline_ms = now_mono_ms() +
		    cfg->kubernetes.leader_election.lease_duration_ms -
		    cfg->kubernetes.leader_election.renew_deadline_ms;
		if (pthread_create(&w, NULL, lost_watchdog_main, NULL) == 0)
			pthread_detach(w);
	}
	pthread_kill(D.main_thread, SIGUSR2);
}

/*
 * kubernetes.leader_election: the election thread, started once the
 * daemon serves (a standby serves webhooks and the meter too).
 */
static int
start_leader(char **cause)
{
	struct leader_config lc;
	char *id;
	int rc;

	if (!D.cfg.kubernetes.leader_election.enabled)
		return 0;
	id = leader_identity_new();
	memset(&lc, 0, sizeof(lc));
	lc.api = D.lease_api;
	lc.namespace = D.cfg.kubernetes.leader_election.namespace != NULL ?
	    D.cfg.kubernetes.leader_election.namespace :
	    D.cfg.controller.namespace;
	lc.name = D.cfg.kubernetes.leader_election.lease_name;
	lc.identity = id;
	lc.lease_duration_ms = D.cfg.kubernetes.leader_election.
	    lease_duration_ms;
	lc.renew_deadline_ms = D.cfg.kubernetes.leader_election.
	    renew_deadline_ms;
	lc.retry_period_ms = D.cfg.kubernetes.leader_election.retry_period_ms;
	lc.changed = leader_changed;
	rc = leader_start(&D.leader, &lc, cause);
	free(id);
	return rc;
}

/*
 * SIGUSR2 from the election: start the reconciler and the notifier once
 * leading. -1 (stop, exit 1) when the Lease was lost or they could not
 * start.
 */
static int
leader_news(void)
{
	char *cause = NULL;

	if (D.leader == NULL)
		return 0;
	switch (leader_state(D.leader)) {
	case LEADER_STANDBY:
		return 0;
	case LEADER_LEADING:
		if (D.leader_work)
			return 0;
		D.leader_work = 1;
		if (start_controller(&cause) < 0 || start_notifier(&cause) < 0) {
			log_kv(LOG_ERROR, "leader election: cannot start the "
			    "reconciler and the notifier", "error", cause,
			    NULL);
			free(cause);
			return -1;
		}
		return 0;
	case LEADER_LOST:
		break;
	}
	/* first of all, before another process takes the Lease over */
	notifier_stop(D.notifier);
	D.notifier = NULL;
	controller_stop(D.controller);
	D.controller = NULL;
	__atomic_store_n(&D.leader_work_stopped, 1, __ATOMIC_RELEASE);
	log_kv(LOG_ERROR, "leader election lost: stopped the reconciler and "
	    "the notifier; exiting", NULL);
	return -1;
}

/* A secret that could not be replaced on SIGHUP: log *cause, free it. */
static void
secret_kept(char **cause)
{
	log_kv(LOG_ERROR, "reload: a secret could not be replaced, keeping "
	    "the running one", "error", *cause, NULL);
	free(*cause);
	*cause = NULL;
}

/* The identity of pv to be asked again (learn_identity). */
static void
relearn(struct provider *pv)
{
	pthread_rwlock_wrlock(&pv->lock);
	pv->relearn = 1;
	pthread_rwlock_unlock(&pv->lock);
}

static void
reload(void)
{
	struct config nc;
	char *cause = NULL, *restart, n[24];
	int hooks;

	if (D.cfg.file == NULL) {
		log_kv(LOG_INFO, "reload: no configuration file, nothing to do",
		    NULL);
		return;
	}
	if (config_reload_file(&nc, D.cfg.file, &cause) < 0) {
		log_kv(LOG_ERROR, "reload failed, keeping the running "
		    "configuration", "error", cause, NULL);
		free(cause);
		return;
	}
	if (config_override(&nc, D.ov_listen, D.ov_api_listen,
	    D.ov_state_dir, &cause) < 0) {	/* checked at start: no error */
		free(cause);
		cause = NULL;
	}
	reload_limit(&nc);
	restart = config_restart_keys(&D.cfg, &nc);
	if (restart != NULL) {
		/* the running values stay until a restart: say which */
		log_kv(LOG_WARN, "reload: changed keys take effect only at a "
		    "restart; running with their old values", "keys", restart,
		    NULL);
		free(restart);
	}
	nc.github.enabled = D.cfg.github.enabled;
	nc.gitlab.enabled = D.cfg.gitlab.enabled;
	/*
	 * The webhook secrets (with repo_allowlist, swapped with them), the
	 * clients' tokens and keys, the API's bearer token: each on its
	 * own, so that one failing does not keep another in force (rotated
	 * because it was revoked).
	 */
	hooks = secrets_reload(&nc, &cause);
	if (hooks < 0) {
		log_kv(LOG_ERROR, "reload failed, keeping the running webhook "
		    "secrets and repo_allowlist", "error", cause, NULL);
		free(cause);
		cause = NULL;
	}
	/*
	 * A token may now be another user's: who the bot is gets asked
	 * again (an App's name stays what github.app.slug says).
	 */
	if (scm_client_reload(D.github_client, &nc, &cause) < 0)
		secret_kept(&cause);
	else if (D.github_client != NULL && D.cfg.github.token != NULL)
		relearn(&D.github);
	if (scm_client_reload(D.gitlab_client, &nc, &cause) < 0)
		secret_kept(&cause);
	else if (D.gitlab_client != NULL)
		relearn(&D.gitlab);
	notifier_reload(D.notifier);
	if (reload_api_token(&nc, &cause) < 0)
		secret_kept(&cause);
	log_setup((enum log_level)nc.log.level, nc.log.json);
	if (hooks < 0) {
		log_kv(LOG_INFO, "reloaded secrets but the webhook ones, and "
		    "log settings", NULL);
	} else {
		snprintf(n, sizeof(n), "%zu", nc.repo_allowlist.n);
		log_kv(LOG_INFO, "reloaded secrets, repo_allowlist and log "
		    "settings", "repo_allowlist_entries", n, NULL);
		warn_allowlist(&nc);
	}
	config_release(&nc);
	/*
	 * A rotated token, or an API back: who the bot is now. The
	 * pruner asks, not this thread: a slow API would keep it from
	 * taking signals, a SIGTERM among them, for as long as the call and
	 * its retries last.
	 */
	if (D.pruner_running)
		pruner_poke(1);
	else
		learn_identity();
}

/*
 * The start's signals. main() takes SIGTERM and SIGINT once the daemon
 * runs; during the start it is busy, at times in an API call (the bot's
 * identity: minutes, retried, when the API is slow) that would hold a
 * stop up until it ends. This thread takes them meanwhile: the start's
 * API calls give up at once, and the daemon stops as soon as it runs.
 */
static void *
start_watch_main(void *arg)
{
	sigset_t stop;
	struct timespec tick = { 0, 100 * 1000000 };
	int sig;

	(void)arg;
	thread_name("start-watch");
	sigemptyset(&stop);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	while (!__atomic_load_n(&D.start_done, __ATOMIC_ACQUIRE)) {
		sig = sigtimedwait(&stop, NULL, &tick);
		if (sig == SIGTERM || sig == SIGINT) {
			__atomic_store_n(&D.early_signal, sig,
			    __ATOMIC_RELEASE);
			scm_give_up_at(now_mono_ms());
			break;
		}
	}
	return NULL;
}

/*
 * SIGTERM or SIGINT before anything is open (the configuration is being
 * read): nothing to finish or flush, so a clean stop is an exit 0 now.
 * Still a way out of a start stuck reading its configuration from a pipe.
 */
static void
early_stop(int sig)
{
	(void)sig;
	_exit(0);
}

/* The start is over: the signal it took, or 0. */
static int
start_watch_end(void)
{
	__atomic_store_n(&D.start_done, 1, __ATOMIC_RELEASE);
	if (D.start_watching)
		pthread_join(D.start_watch, NULL);
	D.start_watching = 0;
	return __atomic_load_n(&D.early_signal, __ATOMIC_ACQUIRE);
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check-config", no_argument, NULL, 'C' },
		{ "dry-run", no_argument, NULL, 'D' },
		{ "listen", required_argument, NULL, 'l' },
		{ "api-listen", required_argument, NULL, 'a' },
		{ "state-dir", required_argument, NULL, 's' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	const char *config_file = NULL, *listen = NULL, *state_dir = NULL;
	const char *api_listen = NULL;
	int check = 0, ch, sig, ret = 1;
	char *cause = NULL;
	struct http_server_config hc;
	struct inbox_config ic;
	sigset_t set;

	/*
	 * A reload asked for while the start reads the configuration is
	 * taken once started (the signal stays pending): it no longer kills
	 * the process, which SIGHUP's default action did until the mask
	 * below was set.
	 */
	sigemptyset(&set);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	while ((ch = getopt_long(argc, argv, "c:l:a:s:Vh", opts, NULL)) != -1) {
		switch (ch) {
		case 'c':
			config_file = optarg;
			break;
		case 'C':
			check = 1;
			break;
		case 'D':
			D.dry_run = 1;
			break;
		case 'l':
			listen = optarg;
			break;
		case 'a':
			api_listen = optarg;
			break;
		case 's':
			state_dir = optarg;
			break;
		case 'V':
			printf("diverged %s\n", PACKAGE_VERSION);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "diverged: unexpected argument '%s'\n",
		    argv[optind]);
		usage(stderr);
		return 2;
	}

	/* --check-config must not say "ok" (exit 0) when it was stopped */
	if (!check) {
		signal(SIGTERM, early_stop);
		signal(SIGINT, early_stop);
	}
	util_json_init();
	pthread_rwlock_init(&D.github.lock, NULL);
	pthread_mutex_init(&D.prune_mu, NULL);
	pthread_cond_init(&D.prune_cv, NULL);
	pthread_rwlock_init(&D.gitlab.lock, NULL);
	D.github.id = SCM_GITHUB;
	D.gitlab.id = SCM_GITLAB;

	if (config_file != NULL) {
		if (config_load(&D.cfg, config_file, &cause) < 0) {
			fprintf(stderr, "config: %s\n", cause);
			free(cause);
			return 2;
		}
	} else {
		config_defaults(&D.cfg);
	}
	D.ov_listen = listen;
	D.ov_api_listen = api_listen;
	D.ov_state_dir = state_dir;
	/* checked like the keys they replace, by --check-config too */
	if (config_override(&D.cfg, listen, api_listen, state_dir,
	    &cause) < 0) {
		fprintf(stderr, "diverged: %s\n", cause);
		free(cause);
		config_release(&D.cfg);
		return 2;
	}
	log_setup((enum log_level)D.cfg.log.level, D.cfg.log.json);
	D.github.host = scm_repo_host(D.cfg.github.api_url, "github.com");
	D.gitlab.host = scm_repo_host(D.cfg.gitlab.api_url, "gitlab.com");
	if (secrets_reload(&D.cfg, &cause) < 0 ||
	    secrets_check(&D.cfg, &cause) < 0) {
		fprintf(stderr, "config: %s\n", cause);
		free(cause);
		config_release(&D.cfg);
		return 2;
	}
	if (check) {
		/* the kubeconfig is read, not the cluster reached */
		if (D.cfg.kubernetes.mode == KUBE_KUBECONFIG) {
			struct k8s_cluster kc;

			memset(&kc, 0, sizeof(kc));
			if (k8s_kubeconfig_load(&kc, D.cfg.kubernetes.kubeconfig,
			    D.cfg.kubernetes.context, &cause) < 0) {
				fprintf(stderr, "config: %s\n", cause);
				free(cause);
				config_release(&D.cfg);
				return 2;
			}
			k8s_cluster_release(&kc);
		}
		printf("configuration ok\n");
		ret = 0;
		goto out;
	}
	/* with a token too, the token's user posts: whoami tells it */
	if (D.cfg.github.app.slug != NULL && D.cfg.github.token == NULL) {
		D.self_github = xasprintf("%s[bot]", D.cfg.github.app.slug);
		D.self.github_login = D.self_github;
	}

	/* every thread inherits this mask; main() takes the signals */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	/* the election's news (leader_changed), for the main thread */
	sigaddset(&set, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	D.main_thread = pthread_self();
	/* from here they are taken by sigwait(), on the start's terms */
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	signal(SIGPIPE, SIG_IGN);
	if (pthread_create(&D.start_watch, NULL, start_watch_main, NULL) == 0)
		D.start_watching = 1;

	if (mkdir_p(D.cfg.state_dir, &cause) < 0 || state_dir_safe(&cause) < 0 ||
	    state_dir_lock(&cause) < 0)
		goto fail;
	D.db_path = xasprintf("%s/diverge.db", D.cfg.state_dir);
	/* every field not set here takes the inbox's default */
	memset(&ic, 0, sizeof(ic));
	ic.capacity = D.cfg.inbox.capacity;
	ic.workers = D.cfg.inbox.workers;
	ic.max_attempts = D.cfg.inbox.max_attempts;
	ic.retention_s = D.cfg.inbox.retention_s;
	ic.backoff_base_ms = 0;
	ic.backoff_max_ms = 0;
	/* a test hook: keep entries pending (back-pressure, crash tests) */
	ic.hold = getenv("DIVERGE_TEST_HOLD_INBOX") != NULL;
	/* with leader election, the controller and notifier: leader_news */
	if (open_store(&cause) < 0 || start_meter(&cause) < 0 ||
	    (!D.cfg.kubernetes.leader_election.enabled &&
	    start_controller(&cause) < 0) || start_scm(&cause) < 0 ||
	    (!D.cfg.kubernetes.leader_election.enabled &&
	    start_notifier(&cause) < 0))
		goto fail;
	{
		struct inbox_handler h = actions_handler(D.actions);

		if (inbox_open(&D.inbox, D.db_path, &ic, &cause) < 0 ||
		    inbox_start(D.inbox, &h, &cause) < 0)
			goto fail;
	}

	metrics_describe("diverge_webhook_deliveries_total", METRIC_COUNTER,
	    "Webhook deliveries by provider, outcome and reason.");
	metrics_describe("diverge_leader", METRIC_GAUGE, "1 when this process "
	    "runs the reconciler and the notifier: it holds the leader "
	    "election's Lease, or leader election is off; 0 on a standby.");
	metrics_set("diverge_leader", "",
	    D.cfg.kubernetes.leader_election.enabled ? 0 : 1);
	metrics_process_register();
	memset(&hc, 0, sizeof(hc));
	hc.listen = D.cfg.listen;
	hc.threads = D.cfg.http.threads;
	hc.max_connections = D.cfg.http.max_connections;
	hc.max_connections_per_ip = D.cfg.http.max_connections_per_ip;
	hc.connection_timeout_s = D.cfg.http.connection_timeout_s;
	hc.request_timeout_s = D.cfg.http.request_timeout_s;
	hc.max_body = (size_t)D.cfg.http.max_body_bytes;
	hc.max_header = (size_t)D.cfg.http.max_header_bytes;
	if (http_server_start(&D.http, &hc, routes, ARRAY_SIZE(routes),
	    &cause) < 0)
		goto fail;
	if (start_apiserver(&cause) < 0 || start_leader(&cause) < 0)
		goto fail;
	{
		char port[16], aport[16];

		snprintf(port, sizeof(port), "%d", http_server_port(D.http));
		snprintf(aport, sizeof(aport), "%d", D.apiserver ?
		    k8s_apiserver_port(D.apiserver) : 0);
		log_kv(LOG_INFO, "diverged started", "version",
		    PACKAGE_VERSION, "listen", D.cfg.listen, "port", port,
		    "api_listen", D.apiserver ? D.cfg.api.listen : "off",
		    "api_port", aport, "state_dir", D.cfg.state_dir, "store",
		    D.cfg.kubernetes.mode == KUBE_EMBEDDED ? "embedded" :
		    "kubernetes", "config", D.cfg.file ? D.cfg.file : "none",
		    NULL);
	}
	if (!D.cfg.github.enabled && !D.cfg.gitlab.enabled)
		log_kv(LOG_INFO, "webhook providers disabled: set "
		    "github.enabled or gitlab.enabled with their secrets in a "
		    "configuration file and start with --config FILE", NULL);
	warn_allowlist(&D.cfg);

	sig = start_watch_end();
	while (sig == 0) {
		if (sigwait(&set, &sig) != 0) {
			sig = 0;
		} else if (sig == SIGHUP) {
			reload();
			sig = 0;
		} else if (sig == SIGUSR2) {
			sig = leader_news() < 0 ? SIGUSR2 : 0;
		}
	}
	log_kv(LOG_INFO, "stopping", "signal", sig == SIGINT ? "SIGINT" :
	    sig == SIGUSR2 ? "none (leader election)" : "SIGTERM", NULL);
	__atomic_store_n(&D.stopping, 1, __ATOMIC_RELAXED);
	/*
	 * One shutdown_timeout for the requests and the workers: past it,
	 * a worker's SCM call (a slow or failing API, retried with waits)
	 * gives up and its entry stays pending for the next start.
	 */
	scm_give_up_at(now_mono_ms() + (int64_t)D.cfg.shutdown_timeout_s *
	    1000);
	http_server_quiesce(D.http);
	http_server_stop(D.http, (int64_t)D.cfg.shutdown_timeout_s * 1000);
	D.http = NULL;
	k8s_apiserver_stop(D.apiserver);
	D.apiserver = NULL;
	http_pool_free(D.pool);
	D.pool = NULL;
	inbox_stop(D.inbox);
	notifier_stop(D.notifier);
	D.notifier = NULL;
	controller_stop(D.controller);
	D.controller = NULL;
	__atomic_store_n(&D.leader_work_stopped, 1, __ATOMIC_RELEASE);
	/* a leader releases the Lease: a standby takes over at once */
	leader_stop(D.leader);
	D.leader = NULL;
	pruner_poke(0);
	if (D.pruner_running)
		pthread_join(D.pruner, NULL);
	D.pruner_running = 0;
	ret = sig == SIGUSR2 ? 1 : 0;
	log_kv(LOG_INFO, "stopped", NULL);
	goto out;
fail:
	start_watch_end();
	log_kv(LOG_ERROR, "cannot start", "error", cause, NULL);
	free(cause);
	ret = 1;
out:
	http_server_stop(D.http, 0);
	if (D.apiserver != NULL)
		k8s_apiserver_stop(D.apiserver);
	if (D.pruner_running) {
		__atomic_store_n(&D.stopping, 1, __ATOMIC_RELAXED);
		pruner_poke(0);
		pthread_join(D.pruner, NULL);
	}
	http_pool_free(D.pool);
	inbox_free(D.inbox);
	actions_free(D.actions);
	notifier_stop(D.notifier);
	scm_client_free(D.github_client);
	scm_client_free(D.gitlab_client);
	free(D.self_gitlab);
	controller_stop(D.controller);
	leader_stop(D.leader);
	/*
	 * The store first: its writer runs what is still queued before it
	 * ends, charges among them (a request answered 503 by the stop),
	 * and a charge uses the meter
	 */
	k8s_api_free(D.store);
	k8s_api_free(D.lease_api);
	meter_free(D.meter);
	pthread_rwlock_wrlock(&D.github.lock);
	keys_release(&D.github.keys);
	config_strlist_release(&D.github.allow);
	pthread_rwlock_unlock(&D.github.lock);
	pthread_rwlock_wrlock(&D.gitlab.lock);
	keys_release(&D.gitlab.keys);
	config_strlist_release(&D.gitlab.allow);
	pthread_rwlock_unlock(&D.gitlab.lock);
	free(D.github.host);
	free(D.gitlab.host);
	free(D.self_github);
	free(D.db_path);
	config_release(&D.cfg);
	return ret;
}
