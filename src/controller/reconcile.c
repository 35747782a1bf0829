/*
 * The reconcile of one AgentTask: observe (read the task and its
 * children), plan (pure: desired phase, children and status), apply
 * (write only what differs, owner checks, resourceVersion on the task).
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "controller/controller.h"
#include "controller/slots.h"
#include "k8s/k8s.h"
#include "meter/meter.h"
#include "util/util.h"

#define TASK_API "divergedev.com/v1alpha1"
#define ANN_PREFIX "divergedev.com/"
#define MAX_TASK_RETRIES 10
/* warm-pool mode: the agent's token, in its environment */
#define TOKEN_ENV "DIVERGE_MACAROON_TOKEN"

/* What we observed of one child. */
struct child {
	json_t *obj;		/* NULL when absent or not ours */
	int conflict;		/* exists and is not this task's */
};

struct obs {
	json_t *task;
	struct child secret, sandbox, claim, env, netpol;
	json_t *bound;		/* claim mode: the claim's Sandbox */
	json_t *index;		/* the token index Secret, or NULL */
	int index_read;
};

/* The Sandbox as seen: the facts the phase machine needs. */
struct sbview {
	int present;
	int ready;		/* Ready True for the current generation */
	const char *reason;	/* of Ready, or NULL */
	const char *message;
	int pod_failed;
	int64_t error_since;	/* ReconcilerError since, or 0 */
	int stopped;		/* no longer running (or absent) */
	const char *pod_ip;
};

struct rctx {
	const struct controller_config *cc;
	const struct config *cfg;
	const char *ns, *name, *uid;
	int64_t now;
	int writes;
	int64_t requeue_ms;
	char *cause;
	int stale;		/* the slot cache knows a later task */
	int admitted;		/* this pass took a slot */
	int again;		/* pass once more: it held a Sandbox back */
	int64_t running;	/* when admitted: the tasks in slots, with it */
	/*
	 * the last status write's outcome (controller_reconcile's *status)
	 * and, when refused for good, what the API server said
	 */
	int status;
	char *status_cause;
};

/* ------------------------------------------------------------ helpers */

static const char *
jstr(const json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

static const char *
jpath(const json_t *o, const char *a, const char *b)
{
	return json_string_value(json_object_get(json_object_get(o, a), b));
}

/* Seconds since the epoch of an RFC 3339 time; 0 when absent or bad. */
static int64_t
parse_time(const char *s)
{
	int64_t t;

	return time_parse_rfc3339(s, &t) < 0 ? 0 : t;
}

static const json_t *
find_cond(const json_t *obj, const char *type)
{
	const json_t *conds = json_object_get(json_object_get(obj, "status"),
	    "conditions");
	size_t i;
	json_t *c;

	json_array_foreach((json_t *)conds, i, c)
		if (streq(jstr(c, "type"), type))
			return c;
	return NULL;
}

/*
 * desired is a subset of observed: every key of desired is in observed
 * with a value that is a subset in turn (extra keys a server added as
 * defaults do not count), arrays of the same length; a null in desired
 * means "absent".
 */
static int
subset(const json_t *d, const json_t *o)
{
	const char *k;
	json_t *v;
	size_t i;

	if (json_is_null(d))
		return o == NULL || json_is_null(o);
	/*
	 * An empty list or map we ask for is absent when a Kubernetes API
	 * server reads it back (Go's omitempty: a NetworkPolicy's
	 * "ingress": [] comes back without "ingress"); asking again would
	 * rewrite the object on every pass.
	 */
	if (o == NULL)
		return (json_is_array(d) && json_array_size(d) == 0) ||
		    (json_is_object(d) && json_object_size(d) == 0);
	if (json_is_object(d)) {
		if (!json_is_object(o))
			return 0;
		json_object_foreach((json_t *)d, k, v)
			if (!subset(v, json_object_get(o, k)))
				return 0;
		return 1;
	}
	if (json_is_array(d)) {
		if (!json_is_array(o) || json_array_size(d) !=
		    json_array_size(o))
			return 0;
		json_array_foreach((json_t *)d, i, v)
			if (!subset(v, json_array_get(o, i)))
				return 0;
		return 1;
	}
	return json_equal((json_t *)d, (json_t *)o);
}

/* Drop null members (what a create must not carry). */
static void
strip_nulls(json_t *o)
{
	const char *k;
	json_t *v;
	void *tmp;
	size_t i;

	if (json_is_object(o)) {
		json_object_foreach_safe(o, tmp, k, v) {
			if (json_is_null(v))
				json_object_del(o, k);
			else
				strip_nulls(v);
		}
	} else if (json_is_array(o)) {
		json_array_foreach(o, i, v)
			strip_nulls(v);
	}
}

/*
 * Whether obj belongs to the task: its controller owner reference is the
 * task's uid. The task label is no proof: anyone who may create the
 * object may set it, and every child is made with the reference.
 */
static int
owned_by(const json_t *obj, const char *uid)
{
	const json_t *refs = json_object_get(json_object_get(obj, "metadata"),
	    "ownerReferences");
	size_t i;
	json_t *r;

	json_array_foreach((json_t *)refs, i, r) {
		if (!json_is_true(json_object_get(r, "controller")))
			continue;
		return streq(jstr(r, "kind"), "AgentTask") &&
		    streq(jstr(r, "uid"), uid);
	}
	return 0;
}

/* Whether obj's controller owner reference has this uid. */
static int
controlled_by(const json_t *obj, const char *uid)
{
	const json_t *refs = json_object_get(json_object_get(obj, "metadata"),
	    "ownerReferences");
	size_t i;
	json_t *r;

	json_array_foreach((json_t *)refs, i, r)
		if (json_is_true(json_object_get(r, "controller")))
			return streq(jstr(r, "uid"), uid);
	return 0;
}

static int
managed_netpol(const json_t *obj)
{
	return streq(jpath(json_object_get(obj, "metadata"), "labels",
	    CONTROLLER_LABEL_MANAGED), "diverged");
}

/* Whether the API server refused a pass for good (see note_stall). */
static int
refused_for_good(int rc)
{
	return rc == K8S_EFORBIDDEN || rc == K8S_EINVALID ||
	    rc == K8S_EBADREQUEST || rc == K8S_ENOTFOUND ||
	    rc == K8S_EUNSUPPORTED;
}

/*
 * The error a pass returns for a write of the token index (the meter's
 * answer rc): the API's own when it refused the write for good, so that
 * the task stalls as for any child; K8S_EUNAVAILABLE for anything else,
 * retried with the back-off as before (an index conflict that outlasted
 * the meter's retries is not a change of the task to read again).
 */
static int
index_error(int rc)
{
	return refused_for_good(rc) ? rc : K8S_EUNAVAILABLE;
}

static void
note_cause(struct rctx *x, const char *what, const struct k8s_status *st)
{
	if (x->cause != NULL)
		return;
	x->cause = xasprintf("%s: %s", what, st != NULL && st->message ?
	    st->message : "failed");
}

static void
count_write(struct rctx *x)
{
	x->writes++;
	if (x->cc->crash_after_writes > 0 &&
	    x->writes == x->cc->crash_after_writes)
		raise(SIGKILL);
}

static void
want_requeue(struct rctx *x, int64_t ms)
{
	if (ms < 0)
		ms = 0;
	if (x->requeue_ms < 0 || ms < x->requeue_ms)
		x->requeue_ms = ms;
}

/* ------------------------------------------------------------ observe */

static int
observe_child(struct rctx *x, const struct k8s_resource *r,
    const char *name, int netpol, struct child *c)
{
	struct k8s_status st = { 0 };
	json_t *o = NULL;
	int rc;

	memset(c, 0, sizeof(*c));
	rc = k8s_get(x->cc->store, r, x->ns, name, &o, &st);
	if (rc == K8S_ENOTFOUND) {
		k8s_status_release(&st);
		return 0;
	}
	if (rc < 0) {
		note_cause(x, r->singular, &st);
		k8s_status_release(&st);
		return rc;
	}
	if (netpol ? managed_netpol(o) : owned_by(o, x->uid)) {
		c->obj = o;
	} else {
		c->conflict = 1;
		json_decref(o);
	}
	return 0;
}

static void
obs_release(struct obs *o)
{
	json_decref(o->task);
	json_decref(o->secret.obj);
	json_decref(o->sandbox.obj);
	json_decref(o->claim.obj);
	json_decref(o->env.obj);
	json_decref(o->netpol.obj);
	json_decref(o->bound);
	json_decref(o->index);
	memset(o, 0, sizeof(*o));
}

static char *
token_secret_name(const char *task)
{
	return xasprintf("%s-token", task);
}

static char *
env_name(const char *task)
{
	return xasprintf("agent-preview-%s", task);
}

static int
observe(struct rctx *x, struct obs *o)
{
	struct k8s_status st = { 0 };
	char *sec = token_secret_name(x->name), *env = env_name(x->name);
	int rc;

	rc = observe_child(x, &K8S_SECRET, sec, 0, &o->secret);
	if (rc == 0 && !x->cfg->sandbox.warm_pool)
		rc = observe_child(x, &K8S_SANDBOX, x->name, 0, &o->sandbox);
	if (rc == 0 && x->cfg->sandbox.warm_pool)
		rc = observe_child(x, &K8S_SANDBOXCLAIM, x->name, 0,
		    &o->claim);
	if (rc == 0)
		rc = observe_child(x, &K8S_ENVIRONMENT, env, 0, &o->env);
	if (rc == 0 && x->cfg->sandbox.network_policy)
		rc = observe_child(x, &K8S_NETWORKPOLICY, CONTROLLER_NETPOL,
		    1, &o->netpol);
	if (rc == 0 && o->claim.obj != NULL) {
		const char *b = json_string_value(json_object_get(
		    json_object_get(json_object_get(o->claim.obj, "status"),
		    "sandbox"), "name"));

		/*
		 * a claim with env is cold-started: its Sandbox is named as
		 * the claim, and may exist before the claim's status says so
		 */
		if (b == NULL)
			b = x->name;
		if (k8s_get(x->cc->store, &K8S_SANDBOX, x->ns, b, &o->bound,
		    &st) < 0)
			o->bound = NULL;
		k8s_status_release(&st);
		/* only the Sandbox our claim controls, never another's */
		if (o->bound != NULL && !controlled_by(o->bound,
		    k8s_meta_str(o->claim.obj, "uid"))) {
			json_decref(o->bound);
			o->bound = NULL;
		}
	}
	free(sec);
	free(env);
	return rc;
}

/*
 * Read the namespace's token index, only when in doubt: it is one Secret
 * for every task of the namespace, so it is large.
 */
static int
load_index(struct rctx *x, struct obs *o)
{
	struct k8s_status st = { 0 };
	int rc;

	if (o->index_read)
		return 0;
	rc = k8s_get(x->cc->store, &K8S_SECRET, x->ns, METER_INDEX_SECRET,
	    &o->index, &st);
	if (rc == K8S_ENOTFOUND)
		rc = 0;
	else if (rc < 0)
		note_cause(x, "token index", &st);
	k8s_status_release(&st);
	o->index_read = rc == 0;
	return rc;
}

/* Whether token id is active for the task in the index. */
static int
index_active(const json_t *index, const char *id, const char *task)
{
	const char *v = jpath(index, "data", id);
	unsigned char *raw = NULL;
	size_t n;
	json_t *e;
	int ok;

	if (id == NULL || v == NULL || base64_decode(v, strlen(v), &raw,
	    &n) < 0)
		return 0;
	e = json_loadb((const char *)raw, n, 0, NULL);
	free(raw);
	ok = streq(jstr(e, "state"), "active") && streq(jstr(e, "task"),
	    task);
	json_decref(e);
	return ok;
}

/*
 * The token id a Sandbox's pod was started with (the Sandbox's
 * annotation); none recorded: dflt.
 */
static const char *
sandbox_token(const json_t *sb, const char *dflt)
{
	const char *id = jpath(json_object_get(sb, "metadata"),
	    "annotations", CONTROLLER_ANN_TOKEN_ID);

	return id != NULL ? id : dflt;
}

/*
 * A condition that counts: on a Sandbox only one reported for its current
 * generation (a re-run's Sandbox still shows the last run's PodFailed); a
 * claim's own, when there is no Sandbox, all (their observedGeneration is
 * not reliable, agent-sandbox issue #1316).
 */
static const json_t *
current_cond(const json_t *sb, const json_t *claim, const char *type)
{
	const json_t *c = find_cond(sb != NULL ? sb : claim, type);

	if (c != NULL && sb != NULL && json_integer_value(json_object_get(c,
	    "observedGeneration")) != k8s_meta_int(sb, "generation"))
		return NULL;
	return c;
}

/*
 * The most of a Sandbox's condition message status.message quotes: the
 * Sandbox CRD allows 32768 characters, as many as the AgentTask's whole
 * status.message may hold (k8s/validate.c), with our words around it.
 */
#define QUOTE_MAX 4096

/* printf's precision for quoting s: at most QUOTE_MAX bytes, whole chars. */
static int
quote_len(const char *s)
{
	return (int)utf8_cut(s, strlen(s), QUOTE_MAX);
}

static void
view_sandbox(const json_t *sb, const json_t *claim, struct sbview *v)
{
	const json_t *ready, *susp, *fin, *ips;
	const json_t *src = sb != NULL ? sb : claim;

	memset(v, 0, sizeof(*v));
	v->stopped = 1;
	if (src == NULL)
		return;
	v->present = 1;
	ready = current_cond(sb, claim, "Ready");
	if (ready != NULL) {
		v->reason = jstr(ready, "reason");
		v->message = jstr(ready, "message");
		v->ready = streq(jstr(ready, "status"), "True");
		if (streq(v->reason, "ReconcilerError") &&
		    !streq(jstr(ready, "status"), "True"))
			v->error_since = parse_time(jstr(ready,
			    "lastTransitionTime"));
		if (streq(v->reason, "PodFailed"))
			v->pod_failed = 1;
	}
	fin = current_cond(sb, claim, "Finished");
	if (fin != NULL && streq(jstr(fin, "reason"), "PodFailed"))
		v->pod_failed = 1;
	ips = json_object_get(json_object_get(sb != NULL ? sb : claim,
	    "status"), "podIPs");
	if (sb == NULL)
		ips = json_object_get(json_object_get(json_object_get(claim,
		    "status"), "sandbox"), "podIPs");
	if (json_array_size(ips) > 0) {
		const json_t *ip = json_array_get(ips, 0);

		v->pod_ip = json_is_string(ip) ? json_string_value(ip) :
		    jstr(ip, "ip");
	}
	susp = current_cond(sb, claim, "Suspended");
	v->stopped = sb != NULL && streq(jpath(sb, "spec", "operatingMode"),
	    "Suspended") && !v->ready && streq(v->reason,
	    "SandboxSuspended") && ((susp != NULL && streq(jstr(susp,
	    "status"), "True")) || v->pod_ip == NULL);
}

/* --------------------------------------------------------- desired */

static json_t *
owner_meta(struct rctx *x, const char *name)
{
	return json_pack("{s:s,s:s,s:{s:s,s:s},s:[{s:s,s:s,s:s,s:s,s:b,"
	    "s:b}]}", "name", name, "namespace", x->ns, "labels",
	    CONTROLLER_LABEL_TASK, x->name, CONTROLLER_LABEL_MANAGED,
	    "diverged", "ownerReferences", "apiVersion", TASK_API, "kind",
	    "AgentTask", "name", x->name, "uid", x->uid, "controller", 1,
	    "blockOwnerDeletion", 1);
}

static int
preview_wanted(const json_t *task)
{
	const char *url = jpath(json_object_get(task, "spec"), "repository",
	    "url");

	return url != NULL && *url != '\0' && !streq(jpath(json_object_get(
	    task, "metadata"), "annotations", ANN_PREFIX "preview-enabled"),
	    "false");
}

/* The preview URL: the template with {env} replaced. */
static char *
preview_url(const struct config *cfg, const char *env)
{
	const char *t = cfg->preview.url_template, *p;
	struct buf b;

	if (t == NULL || *t == '\0')
		return NULL;
	buf_init(&b, 8192);
	while ((p = strstr(t, "{env}")) != NULL) {
		buf_add(&b, t, (size_t)(p - t));
		buf_addstr(&b, env);
		t = p + 5;
	}
	buf_addstr(&b, t);
	return buf_detach(&b, NULL);
}

static int64_t
task_timeout(const struct rctx *x, const json_t *task)
{
	json_int_t t = json_integer_value(json_object_get(json_object_get(
	    json_object_get(task, "spec"), "sandbox"), "timeoutSeconds"));

	return t > 0 ? t : x->cfg->defaults.timeout_seconds;
}

static void
add_env(json_t *env, const char *name, const char *value)
{
	json_array_append_new(env, json_pack("{s:s,s:s}", "name", name,
	    "value", value != NULL ? value : ""));
}

/* The DIVERGE_* environment of the agent. */
static json_t *
agent_env(struct rctx *x, const json_t *task, const char *purl,
    const char *token)
{
	const json_t *spec = json_object_get(task, "spec");
	const json_t *repo = json_object_get(spec, "repository");
	json_t *env = json_array();
	char num[32], *murl, *ename = env_name(x->name);
	const char *base = x->cfg->meter.public_url;
	size_t bl = base != NULL ? strlen(base) : 0;

	while (bl > 0 && base[bl - 1] == '/')
		bl--;
	murl = xasprintf("%.*s/api/v1/agenttask/meter", (int)bl,
	    base != NULL ? base : "");
	snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(
	    json_object_get(spec, "maxIterations")));
	add_env(env, "DIVERGE_TASK_NAME", x->name);
	add_env(env, "DIVERGE_OBJECTIVE", jstr(spec, "objective"));
	add_env(env, "DIVERGE_REPO_URL", jstr(repo, "url"));
	add_env(env, "DIVERGE_BASE_BRANCH", jstr(repo, "baseBranch"));
	add_env(env, "DIVERGE_WORKING_BRANCH", jstr(repo, "workingBranch"));
	add_env(env, "DIVERGE_MAX_ITERATIONS", num);
	add_env(env, "DIVERGE_METER_URL", murl);
	if (token != NULL)
		add_env(env, TOKEN_ENV, token);
	else
		add_env(env, "DIVERGE_TOKEN_FILE", "/etc/diverge/token/token");
	if (purl != NULL) {
		add_env(env, "DIVERGE_PREVIEW_URL", purl);
		add_env(env, "DIVERGE_PREVIEW_HEADER_KEY", "x-diverge-env");
		add_env(env, "DIVERGE_PREVIEW_HEADER_VALUE", ename);
	}
	free(murl);
	free(ename);
	return env;
}

static json_t *
security_pod(int64_t uid)
{
	return json_pack("{s:b,s:I,s:I,s:I,s:{s:s}}", "runAsNonRoot", 1,
	    "runAsUser", (json_int_t)uid, "runAsGroup", (json_int_t)uid,
	    "fsGroup", (json_int_t)uid, "seccompProfile", "type",
	    "RuntimeDefault");
}

static json_t *
security_container(int64_t uid)
{
	return json_pack("{s:b,s:I,s:I,s:b,s:b,s:{s:[s]},s:{s:s}}",
	    "runAsNonRoot", 1, "runAsUser", (json_int_t)uid, "runAsGroup",
	    (json_int_t)uid, "readOnlyRootFilesystem", 1,
	    "allowPrivilegeEscalation", 0, "capabilities", "drop", "ALL",
	    "seccompProfile", "type", "RuntimeDefault");
}

/*
 * The Sandbox of the task, whole (DESIGN.md section 4). token_id, when
 * not NULL, is recorded as the token its next or running pod mounts.
 */
static json_t *
desired_sandbox(struct rctx *x, const json_t *task, const char *purl,
    const char *mode, const char *shutdown, const char *token_id)
{
	const json_t *spec = json_object_get(task, "spec");
	const char *image = jpath(spec, "sandbox", "image");
	const char *rtc = jpath(spec, "sandbox", "runtimeClassName");
	int64_t uid = x->cfg->sandbox.uid;
	char *sec = token_secret_name(x->name);
	json_t *container, *pod, *sb;

	if (image == NULL || *image == '\0')
		image = x->cfg->sandbox.image;
	if (rtc == NULL || *rtc == '\0')
		rtc = x->cfg->sandbox.runtime_class;
	container = json_pack("{s:s,s:s,s:o,s:o,s:{s:{s:s,s:s}},s:["
	    "{s:s,s:s,s:b},{s:s,s:s},{s:s,s:s}]}", "name", "agent", "image",
	    image, "env", agent_env(x, task, purl, NULL), "securityContext",
	    security_container(uid), "resources", "requests", "cpu", "500m",
	    "memory", "1Gi", "volumeMounts", "name", "token", "mountPath",
	    "/etc/diverge/token", "readOnly", 1, "name", "tmp", "mountPath",
	    "/tmp", "name", "workspace", "mountPath", "/workspace");
	pod = json_pack("{s:b,s:s,s:o,s:[o],s:[{s:s,s:{s:s,s:i}},"
	    "{s:s,s:{}}]}", "automountServiceAccountToken", 0,
	    "restartPolicy", "Never", "securityContext", security_pod(uid),
	    "containers", container, "volumes", "name", "token", "secret",
	    "secretName", sec, "defaultMode", 0440, "name", "tmp", "emptyDir");
	json_object_set_new(pod, "runtimeClassName", rtc != NULL &&
	    *rtc != '\0' ? json_string(rtc) : json_null());
	sb = json_pack("{s:s,s:s,s:o,s:{s:s,s:o,s:{s:{s:{s:s,s:s}},s:o},"
	    "s:[{s:{s:s},s:{s:[s],s:{s:{s:s}}}}]}}", "apiVersion",
	    "agents.x-k8s.io/v1beta1", "kind", "Sandbox", "metadata",
	    owner_meta(x, x->name), "spec", "operatingMode", mode,
	    "shutdownTime", shutdown != NULL ? json_string(shutdown) :
	    json_null(), "podTemplate", "metadata", "labels",
	    CONTROLLER_LABEL_TASK, x->name, "app.kubernetes.io/name",
	    "diverge-agent", "spec", pod, "volumeClaimTemplates", "metadata",
	    "name", "workspace", "spec", "accessModes", "ReadWriteOnce",
	    "resources", "requests", "storage",
	    x->cfg->sandbox.workspace_size);
	if (token_id != NULL)
		json_object_set_new(json_object_get(sb, "metadata"),
		    "annotations", json_pack("{s:s}", CONTROLLER_ANN_TOKEN_ID,
		    token_id));
	free(sec);
	return sb;
}

/*
 * Warm-pool mode: a SandboxClaim. Claims cannot mount a per-task Secret,
 * so the token travels in the environment (DIVERGE_MACAROON_TOKEN).
 */
static json_t *
desired_claim(struct rctx *x, const json_t *task, const char *purl,
    const char *token, const char *shutdown)
{
	json_t *env = agent_env(x, task, purl, token);

	return json_pack("{s:s,s:s,s:o,s:{s:{s:s},s:o,s:{s:s,s:o}}}",
	    "apiVersion", "extensions.agents.x-k8s.io/v1beta1", "kind",
	    "SandboxClaim", "metadata", owner_meta(x, x->name), "spec",
	    "warmPoolRef", "name", CONTROLLER_WARM_POOL, "env", env,
	    "lifecycle", "shutdownPolicy", "Delete", "shutdownTime",
	    shutdown != NULL ? json_string(shutdown) : json_null());
}

static json_t *
desired_env(struct rctx *x, const json_t *task, int hibernated,
    const char *ip)
{
	const json_t *spec = json_object_get(task, "spec");
	const json_t *ann = json_object_get(json_object_get(task, "metadata"),
	    "annotations");
	char *name = env_name(x->name);
	json_t *env, *es, *meta;
	const char *v;

	meta = owner_meta(x, name);
	json_object_set_new(meta, "annotations", json_pack("{s:o,s:o}",
	    ANN_PREFIX "hibernated", hibernated ? json_string("true") :
	    json_null(), ANN_PREFIX "sandbox-ip", ip != NULL ?
	    json_string(ip) : json_null()));
	es = json_object();
	v = jpath(spec, "repository", "workingBranch");
	if (v != NULL)
		json_object_set_new(es, "branch", json_string(v));
	v = jpath(spec, "repository", "url");
	if (v != NULL)
		json_object_set_new(es, "repository", json_string(v));
	v = jstr(ann, ANN_PREFIX "preview-service");
	if (v != NULL && *v != '\0')
		json_object_set_new(es, "service", json_string(v));
	v = jstr(ann, ANN_PREFIX "preview-image");
	if (v != NULL && *v != '\0')
		json_object_set_new(es, "image", json_string(v));
	v = jstr(ann, ANN_PREFIX "preview-port");
	if (v != NULL) {
		char *end;
		long p = strtol(v, &end, 10);

		if (*v != '\0' && *end == '\0' && p >= 1 && p <= 65535)
			json_object_set_new(es, "port", json_integer(p));
	}
	env = json_pack("{s:s,s:s,s:o,s:o}", "apiVersion", TASK_API, "kind",
	    "Environment", "metadata", meta, "spec", es);
	free(name);
	return env;
}

/* The meter's port when it is not 443 (the sandbox must reach it). */
static int
meter_port(const struct config *cfg)
{
	const char *u = cfg->meter.public_url, *h, *c;

	if (u == NULL || (h = strstr(u, "://")) == NULL)
		return 0;
	h += 3;
	if (*h == '[')
		h = strchr(h, ']') != NULL ? strchr(h, ']') : h;
	c = strchr(h, ':');
	if (c != NULL && (strchr(h, '/') == NULL || c < strchr(h, '/')))
		return (int)strtol(c + 1, NULL, 10);
	return strncmp(u, "http://", 7) == 0 ? 80 : 443;
}

/*
 * The namespace's isolation policy: no ingress; egress only DNS, and 443
 * and 22 (and the meter's port) to everything but the cloud metadata
 * range and the API server.
 */
static json_t *
desired_netpol(struct rctx *x)
{
	const char *api = getenv("KUBERNETES_SERVICE_HOST");
	json_t *except, *ports, *np;
	int mp = meter_port(x->cfg);

	except = json_pack("[s]", "169.254.0.0/16");
	if (api != NULL && *api != '\0' && strchr(api, ':') == NULL)
		json_array_append_new(except, json_sprintf("%s/32", api));
	ports = json_pack("[{s:s,s:i},{s:s,s:i}]", "protocol", "TCP", "port",
	    443, "protocol", "TCP", "port", 22);
	if (mp > 0 && mp != 443 && mp != 22)
		json_array_append_new(ports, json_pack("{s:s,s:i}",
		    "protocol", "TCP", "port", mp));
	np = json_pack("{s:s,s:s,s:{s:s,s:s,s:{s:s}},s:{s:{s:[{s:s,s:s}]},"
	    "s:[s,s],s:[],s:[{s:[{s:s,s:i},{s:s,s:i}]},{s:[{s:{s:s,s:o}}],"
	    "s:o}]}}", "apiVersion", "networking.k8s.io/v1", "kind",
	    "NetworkPolicy", "metadata", "name", CONTROLLER_NETPOL,
	    "namespace", x->ns, "labels", CONTROLLER_LABEL_MANAGED,
	    "diverged", "spec", "podSelector", "matchExpressions", "key",
	    CONTROLLER_LABEL_TASK, "operator", "Exists", "policyTypes",
	    "Ingress", "Egress", "ingress", "egress", "ports", "protocol",
	    "UDP", "port", 53, "protocol", "TCP", "port", 53, "to", "ipBlock",
	    "cidr", "0.0.0.0/0", "except", except, "ports", ports);
	return np;
}

/* ------------------------------------------------------------ apply */

/*
 * Make the child look like desired (steals desired): create it when
 * absent, else update it when desired is not already a subset of it,
 * with its resourceVersion, from a fresh read on 409. An object that
 * appears meanwhile and is not ours is a conflict (1).
 */
static int
apply_child(struct rctx *x, const struct k8s_resource *r, json_t *cur,
    json_t *desired, int netpol, json_t **out)
{
	struct k8s_status st = { 0 };
	const char *name;
	json_t *obs = json_incref(cur), *merged = NULL, *res = NULL;
	int tries, rc = 0;

	if (desired == NULL) {
		/* a required value (image, size, ...) was missing */
		json_decref(obs);
		if (x->cause == NULL)
			x->cause = xasprintf("%s: cannot build the object",
			    r->singular);
		return K8S_EINVALID;
	}
	name = k8s_meta_str(desired, "name");

	for (tries = 0; tries < MAX_TASK_RETRIES; tries++) {
		if (obs == NULL) {
			json_t *c = json_deep_copy(desired);

			strip_nulls(c);
			rc = k8s_create(x->cc->store, r, x->ns, c, &res, &st);
			json_decref(c);
			if (rc == 0) {
				count_write(x);
				break;
			}
			if (rc != K8S_EEXISTS)
				break;
		} else {
			/* volumeClaimTemplates are immutable: keep them */
			if (json_object_get(json_object_get(obs, "spec"),
			    "volumeClaimTemplates") != NULL)
				json_object_del(json_object_get(desired,
				    "spec"), "volumeClaimTemplates");
			if (subset(desired, obs)) {
				res = json_incref(obs);
				break;
			}
			merged = k8s_merge_patch(obs, desired);
			rc = k8s_update(x->cc->store, r, x->ns, name, merged,
			    &res, &st);
			json_decref(merged);
			if (rc == 0) {
				count_write(x);
				break;
			}
			if (rc != K8S_ECONFLICT)
				break;
		}
		/* AlreadyExists or Conflict: read again */
		k8s_status_release(&st);
		json_decref(obs);
		obs = NULL;
		rc = k8s_get(x->cc->store, r, x->ns, name, &obs, &st);
		if (rc == K8S_ENOTFOUND) {
			k8s_status_release(&st);
			continue;
		}
		if (rc < 0)
			break;
		if (!(netpol ? managed_netpol(obs) : owned_by(obs, x->uid))) {
			rc = 1;
			break;
		}
	}
	if (rc < 0)
		note_cause(x, r->singular, &st);
	k8s_status_release(&st);
	json_decref(obs);
	json_decref(desired);
	if (out != NULL)
		*out = res;
	else
		json_decref(res);
	return rc;
}

/* The containers of a Sandbox's pod template. */
static json_t *
pod_containers(const json_t *sb)
{
	return json_object_get(json_object_get(json_object_get(
	    json_object_get(sb, "spec"), "podTemplate"), "spec"), "containers");
}

/*
 * The index of the container of a claim's Sandbox that carries the
 * agent's token in its environment (the claim's env goes to the first
 * container when it names none), and the token (NULL when none does);
 * -1 when the Sandbox has no container.
 */
static long
bound_container(const json_t *sb, const char **token)
{
	const json_t *cs = pod_containers(sb);
	json_t *c, *e;
	size_t i, k;

	*token = NULL;
	json_array_foreach((json_t *)cs, i, c)
		json_array_foreach(json_object_get(c, "env"), k, e)
			if (streq(jstr(e, "name"), TOKEN_ENV)) {
				*token = jstr(e, "value");
				return (long)i;
			}
	return json_array_size(cs) > 0 ? 0 : -1;
}

/* Whether the pod template of a claim's Sandbox carries token. */
static int
bound_has_token(const json_t *sb, const char *token)
{
	const char *t;

	bound_container(sb, &t);
	return streq(t, token);
}

/*
 * Make the Sandbox a claim bound run in mode and, when token is not NULL,
 * start its next pod with token (id tid, recorded in its annotation):
 * one merge patch, so that no pod starts from a half-written Sandbox. The
 * claim controller applies the claim's env only when it makes the
 * Sandbox, so the token is written into the pod template here; the patch
 * carries the whole containers array (a merge patch replaces arrays),
 * with the resourceVersion it was read at (K8S_ECONFLICT: start again),
 * and never the template's metadata, which the claim controller keeps.
 * *out gets the Sandbox as written, or as it was when nothing differed.
 */
static int
apply_bound(struct rctx *x, const json_t *sb, const char *mode,
    const char *token, const char *tid, json_t **out)
{
	struct k8s_status st = { 0 };
	json_t *p, *spec, *cs, *c, *e = NULL, *env;
	const char *had;
	size_t i;
	long ci;
	int rc;

	*out = NULL;
	p = json_object();
	spec = json_object();
	if (!streq(jpath(sb, "spec", "operatingMode"), mode))
		json_object_set_new(spec, "operatingMode", json_string(mode));
	if (token != NULL && !bound_has_token(sb, token) &&
	    (ci = bound_container(sb, &had)) >= 0) {
		cs = json_deep_copy(pod_containers(sb));
		c = json_array_get(cs, (size_t)ci);
		if (!json_is_array(json_object_get(c, "env")))
			json_object_set_new(c, "env", json_array());
		env = json_object_get(c, "env");
		json_array_foreach(env, i, e)
			if (streq(jstr(e, "name"), TOKEN_ENV))
				break;
		if (i < json_array_size(env))
			json_object_set_new(e, "value", json_string(token));
		else
			add_env(env, TOKEN_ENV, token);
		json_object_set_new(spec, "podTemplate", json_pack("{s:{s:o}}",
		    "spec", "containers", cs));
		json_object_set_new(p, "metadata", json_pack("{s:s}",
		    "resourceVersion", k8s_meta_str(sb, "resourceVersion")));
	}
	if (tid != NULL && !streq(tid, jpath(json_object_get(sb, "metadata"),
	    "annotations", CONTROLLER_ANN_TOKEN_ID))) {
		if (json_object_get(p, "metadata") == NULL)
			json_object_set_new(p, "metadata", json_object());
		json_object_set_new(json_object_get(p, "metadata"),
		    "annotations", json_pack("{s:s}", CONTROLLER_ANN_TOKEN_ID,
		    tid));
	}
	if (json_object_size(spec) > 0)
		json_object_set(p, "spec", spec);
	json_decref(spec);
	if (json_object_size(p) == 0) {
		json_decref(p);
		*out = json_incref((json_t *)sb);
		return 0;
	}
	rc = k8s_patch(x->cc->store, &K8S_SANDBOX, x->ns, k8s_meta_str(sb,
	    "name"), 0, p, out, &st);
	json_decref(p);
	if (rc == 0)
		count_write(x);
	else if (rc != K8S_ECONFLICT)
		note_cause(x, "sandbox", &st);
	k8s_status_release(&st);
	return rc;
}

/* ---------------------------------------------------------- the phase */

static int
phase_live(const char *p)
{
	return streq(p, "Provisioning") || streq(p, "Active");
}

static int
phase_terminal(const char *p)
{
	return streq(p, "Completed") || streq(p, "Failed");
}

struct plan {
	const char *phase, *reason;
	char *message;
	int transition;
	int queued;		/* waits for a slot: phase stays */
	int restate;		/* reason and message change, the phase not */
};

/* Whether p leaves phase cur, and why (a default reason). */
static void
plan_transition(struct plan *p, const char *cur)
{
	p->transition = !streq(p->phase, cur);
	if (p->transition && p->reason == NULL) {
		if (streq(p->phase, "Paused"))
			p->reason = "Suspended";
		else if (streq(p->phase, "Pausing"))
			p->reason = "Suspending";
		else if (streq(p->phase, "Active"))
			p->reason = "SandboxReady";
		else if (streq(p->phase, "Provisioning"))
			p->reason = "Provisioning";
		else
			p->reason = "Created";
	}
}

/*
 * Paused by the meter (over budget or iterations) with no change of the
 * spec since the reconciler last looked. On a cluster the meter writes
 * the pause in two steps, the status (Paused, BudgetExceeded) and then
 * spec.suspended: true, since the status subresource cannot change the
 * spec: a pass between the two, or after a second write that failed,
 * must not take suspended: false for a resume and mint a new token. A
 * resume changes the spec (suspended true to false, a budget raised),
 * which moves metadata.generation past status.observedGeneration.
 */
static int
meter_paused(const json_t *task)
{
	const json_t *st = json_object_get(task, "status");
	const json_t *og = json_object_get(st, "observedGeneration");

	return streq(json_string_value(json_object_get(st, "reason")),
	    "BudgetExceeded") && json_is_integer(og) &&
	    k8s_meta_int(task, "generation") <= json_integer_value(og);
}

/*
 * The phase machine of DESIGN.md section 5 (level-based: from the current
 * phase, the spec and what the Sandbox shows). active is the live time
 * including the open period.
 */
static void
plan_phase(struct rctx *x, const json_t *task, const struct sbview *v,
    int64_t active, struct plan *p)
{
	const char *cur = jpath(task, "status", "phase");
	int susp = json_is_true(json_object_get(json_object_get(task, "spec"),
	    "suspended"));
	int64_t timeout = task_timeout(x, task);

	/*
	 * p->phase is always a literal, never cur: the plan outlives the
	 * task object cur points into (the annotation write replaces it)
	 */
	memset(p, 0, sizeof(*p));
	if (phase_terminal(cur)) {
		p->phase = streq(cur, "Completed") ? "Completed" : "Failed";
		return;
	} else if (strlen(x->name) > CONTROLLER_NAME_MAX) {
		/* not valid: no child of it would be accepted */
		p->phase = "Failed";
		p->reason = "InvalidName";
		p->message = xasprintf("the task name has %zu characters, at "
		    "most %d fit the %s label of its children",
		    strlen(x->name), CONTROLLER_NAME_MAX,
		    CONTROLLER_LABEL_TASK);
	} else if (cur == NULL || *cur == '\0') {
		p->phase = "Pending";
	} else if (streq(cur, "Pending")) {
		p->phase = susp ? "Paused" : "Provisioning";
	} else if (susp) {
		p->phase = streq(cur, "Paused") || v->stopped ? "Paused" :
		    "Pausing";
	} else if (streq(cur, "Paused") && meter_paused(task)) {
		/* the meter's pause stands until the spec changes after it */
		p->phase = "Paused";
	} else if (streq(cur, "Paused") || streq(cur, "Pausing")) {
		p->phase = "Provisioning";
	} else if (v->pod_failed) {
		p->phase = "Failed";
		p->reason = "SandboxFailed";
		p->message = xstrdup("the sandbox pod failed");
	} else if (v->error_since > 0 && x->now - v->error_since >
	    CONTROLLER_ERROR_GRACE_S) {
		const char *m = v->message != NULL ? v->message :
		    "ReconcilerError";

		p->phase = "Failed";
		p->reason = "SandboxFailed";
		p->message = xasprintf("the sandbox reports errors since %lld "
		    "s: %.*s", (long long)(x->now - v->error_since),
		    quote_len(m), m);
	} else {
		if (v->error_since > 0)
			want_requeue(x, (v->error_since +
			    CONTROLLER_ERROR_GRACE_S + 1 - x->now) * 1000);
		p->phase = v->ready ? "Active" : "Provisioning";
	}
	if ((phase_live(p->phase) || streq(p->phase, "Pausing")) &&
	    timeout > 0) {
		if (active > timeout) {
			free(p->message);
			p->phase = "Failed";
			p->reason = "Timeout";
			p->message = xasprintf("the task ran longer than %lld "
			    "s", (long long)timeout);
		} else if (phase_live(p->phase)) {
			want_requeue(x, (timeout - active + 1) * 1000);
		}
	}
	plan_transition(p, cur);
}

/* ---------------------------------------------------------- admission */

/*
 * controller.max_active_tasks, decided on the store's slot cache
 * (slots.h): a pass records its own fresh read of its task there first,
 * and a decision counts the cached tasks that hold a slot or were
 * admitted and the waiting ones ahead, under the cache's lock, without
 * reading the store. A task admitted is assumed to run until the cache
 * itself shows it in its slot or no longer waiting for one (the task
 * watch, or a later pass, sees its status write), so a decision taken
 * meanwhile sees one or the other and two workers never take the same
 * last slot. A pass that fails after its decision (a status write that
 * keeps losing to other writers, an API server error) keeps the record:
 * it may have minted the task's token (its Sandbox starts only once the
 * status is live), so the task keeps its slot and its next pass takes it
 * up again; given back, an earlier task resuming or re-run meanwhile
 * would take it and the two would run over the limit.
 *
 * The record is in memory: a restart between an admitted pass's token
 * and its Provisioning status write loses it, and the task is then
 * Pending (or Paused, on a resume) with a live token but no Sandbox
 * running (a Sandbox starts only once the status is live, see
 * reconcile_once): it waits in the queue again and, queued, its token
 * is revoked. A Sandbox running for the current run (not Suspended, no
 * shutdownTime: a finished run's has one) beside a status not yet live
 * (one an older diverged started before that write, or one the meter's
 * pause has not stopped yet) stands for the record: its next pass is
 * admitted whatever the queue, as a pass whose record stands. What
 * remains is the time from the restart to that pass (the start relists
 * and queues every task): a decision of another task meanwhile does not
 * count it, and may admit, say, an earlier task resuming; both then run,
 * one over the limit, until one leaves its slot.
 */

/*
 * Whether the task's own Sandbox runs for the current run (see above);
 * warm-pool mode: the Sandbox its claim bound, the claim not ended.
 */
static int
own_sandbox_runs(const struct obs *o)
{
	const json_t *sb = o->claim.obj != NULL ? o->bound : o->sandbox.obj;

	if (sb == NULL || streq(jpath(sb, "spec", "operatingMode"),
	    "Suspended") || jpath(sb, "spec", "shutdownTime") != NULL)
		return 0;
	return o->claim.obj == NULL || json_string_value(json_object_get(
	    json_object_get(json_object_get(o->claim.obj, "spec"),
	    "lifecycle"), "shutdownTime")) == NULL;
}

/* controller.max_active_tasks, which a SIGHUP may change (> 0 to > 0). */
static int64_t
max_active(const struct rctx *x)
{
	return __atomic_load_n(&x->cfg->controller.max_active_tasks,
	    __ATOMIC_RELAXED);
}

/*
 * May the task leave Pending or Paused for Provisioning? With no limit,
 * yes (1). Else admitted (1), queued (0, *msg gets the status message)
 * or not decided (CONTROLLER_SLOTS_BEHIND: the task watch is behind this
 * pass's read) as controller_slots_admit answers. K8S_ECONFLICT when the
 * cache knows a later version of the task than this pass read (read
 * again).
 */
static int
admit(struct rctx *x, const struct obs *o, int resume, char **msg)
{
	int64_t limit = max_active(x);
	int64_t running = 0, ahead = 0;
	int rc;

	if (limit <= 0)
		return 1;
	if (x->stale)
		return K8S_ECONFLICT;
	rc = controller_slots_admit(controller_slots_of(x->cc->store),
	    o->task, limit, own_sandbox_runs(o), x->cc->sync_wait_ms, &running,
	    &ahead);
	if (rc == CONTROLLER_SLOTS_BEHIND)
		return rc;
	if (rc == 1) {
		x->admitted = 1;
		x->running = running;
		return 1;
	}
	*msg = k8s_task_queue_message(running, limit, ahead, resume);
	return 0;
}

/*
 * A task that would leave Pending or Paused for Provisioning takes a
 * slot, or stays where it is, queued. 0, CONTROLLER_SLOTS_BEHIND (no
 * decision yet) or a negative enum k8s_err.
 */
static int
plan_admission(struct rctx *x, const struct obs *o, struct plan *p)
{
	const json_t *task = o->task;
	const char *cur = jpath(task, "status", "phase");
	int resume = streq(cur, "Paused"), rc;
	char *msg = NULL;

	if (!p->transition || !streq(p->phase, "Provisioning") ||
	    !(resume || streq(cur, "Pending"))) {
		/* no longer waiting (paused again): say what it does now */
		if (!p->transition && streq(jpath(task, "status", "reason"),
		    K8S_TASK_REASON_QUEUED) && streq(p->phase, "Paused")) {
			p->reason = "Suspended";
			p->restate = 1;
		}
		return 0;
	}
	rc = admit(x, o, resume, &msg);
	if (rc != 0)
		return rc == 1 ? 0 : rc;
	free(p->message);
	p->phase = resume ? "Paused" : "Pending";
	p->reason = K8S_TASK_REASON_QUEUED;
	p->message = msg;
	p->transition = 0;
	p->queued = p->restate = 1;
	return 0;
}

/*
 * A status message as a JSON string, credentials redacted: messages quote
 * upstream errors (the API server's, a sandbox's), and a task's status is
 * read by everyone who may read the task, and copied to the PR.
 */
static json_t *
status_message(const char *m)
{
	char *r = redact(m);
	json_t *j = json_string(r != NULL ? r : m);

	free(r);
	return j;
}

/* Set a condition in conds; lastTransitionTime moves with status only. */
static void
set_cond(json_t *conds, const json_t *old, const char *type, int ok,
    const char *reason, const char *message, int64_t now)
{
	const json_t *o = find_cond(old, type);
	const char *status = ok ? "True" : "False";
	char ts[32];
	json_t *c;

	if (o != NULL && streq(jstr(o, "status"), status) &&
	    jstr(o, "lastTransitionTime") != NULL) {
		c = json_pack("{s:s,s:s,s:s,s:o,s:s}", "type", type, "status",
		    status, "reason", reason, "message", status_message(
		    message != NULL ? message : ""), "lastTransitionTime",
		    jstr(o, "lastTransitionTime"));
	} else {
		time_rfc3339(now, ts);
		c = json_pack("{s:s,s:s,s:s,s:o,s:s}", "type", type, "status",
		    status, "reason", reason, "message", status_message(
		    message != NULL ? message : ""), "lastTransitionTime", ts);
	}
	json_array_append_new(conds, c);
}

/* ------------------------------------------------------ status writes */

/*
 * Write the changed members of status with the task's resourceVersion
 * (a merge patch of the status subresource). 0, K8S_ECONFLICT (start
 * again from a fresh read) or another error.
 */
static int
write_status(struct rctx *x, json_t *task, const json_t *want)
{
	const json_t *old = json_object_get(task, "status");
	struct k8s_status st = { 0 };
	json_t *patch, *s;
	const char *k;
	json_t *v;
	int rc;

	s = json_object();
	json_object_foreach((json_t *)want, k, v) {
		if (json_is_null(v) ? json_object_get(old, k) != NULL :
		    !json_equal(v, json_object_get(old, k)))
			json_object_set(s, k, v);
	}
	if (json_object_size(s) == 0) {
		json_decref(s);
		x->status = 1;	/* the stored status is what we want */
		return 0;
	}
	if (x->cc->test_hook != NULL)
		x->cc->test_hook(x->cc->test_arg, "status");
	patch = json_pack("{s:{s:s},s:o}", "metadata", "resourceVersion",
	    k8s_meta_str(task, "resourceVersion"), "status", s);
	if (log_enabled(LOG_DEBUG)) {
		char *d = json_dumps(json_object_get(patch, "status"),
		    JSON_COMPACT);

		log_kv(LOG_DEBUG, "task status write", "task", x->name,
		    "namespace", x->ns, "status", d, NULL);
		free(d);
	}
	rc = k8s_patch(x->cc->store, &K8S_AGENTTASK, x->ns, x->name, 1,
	    patch, NULL, &st);
	json_decref(patch);
	if (rc == 0)
		x->writes++;
	else if (rc != K8S_ECONFLICT)
		note_cause(x, "task status", &st);
	if (rc == 0) {
		x->status = 1;
	} else if (refused_for_good(rc)) {
		/*
		 * no condition can say so: the controller tells (a 404: the
		 * task deleted meanwhile, which note_stall's read tells, or
		 * a CRD with no status subresource)
		 */
		x->status = -1;
		free(x->status_cause);
		x->status_cause = xasprintf("task status: %s", st.message ?
		    st.message : "failed");
	}
	k8s_status_release(&st);
	return rc;
}

/* The preview annotations on the task (metadata, not status). */
static int
write_annotations(struct rctx *x, json_t **task, const char *env,
    const char *url)
{
	const json_t *ann = json_object_get(json_object_get(*task,
	    "metadata"), "annotations");
	struct k8s_status st = { 0 };
	json_t *patch, *out = NULL;
	int rc;

	if ((env == NULL ? jstr(ann, ANN_PREFIX "preview-environment") ==
	    NULL : streq(jstr(ann, ANN_PREFIX "preview-environment"), env)) &&
	    (url == NULL ? jstr(ann, ANN_PREFIX "preview-url") == NULL :
	    streq(jstr(ann, ANN_PREFIX "preview-url"), url)))
		return 0;
	patch = json_pack("{s:{s:s,s:{s:o,s:o}}}", "metadata",
	    "resourceVersion", k8s_meta_str(*task, "resourceVersion"),
	    "annotations", ANN_PREFIX "preview-environment", env != NULL ?
	    json_string(env) : json_null(), ANN_PREFIX "preview-url",
	    url != NULL ? json_string(url) : json_null());
	rc = k8s_patch(x->cc->store, &K8S_AGENTTASK, x->ns, x->name, 0,
	    patch, &out, &st);
	json_decref(patch);
	if (rc == 0) {
		x->writes++;
		json_decref(*task);
		*task = out;
	} else if (rc != K8S_ECONFLICT) {
		note_cause(x, "task annotations", &st);
	}
	k8s_status_release(&st);
	return rc;
}

/* The result of a revocation: 0, or index_error() keeping its cause. */
static int
revoked(struct rctx *x, int rc, char *cause)
{
	if (rc == 0)
		return 0;
	if (x->cause == NULL)
		x->cause = cause;
	else
		free(cause);
	return index_error(rc);
}

/* Revoke id (idempotent: the meter writes nothing when it is not live). */
static int
revoke(struct rctx *x, const char *id)
{
	char *cause = NULL;
	int rc;

	if (id == NULL)
		return 0;
	rc = meter_revoke_token(x->cc->meter, x->ns, id, &cause);
	return revoked(x, rc, cause);
}

/*
 * Revoke every token of the task but keep (NULL: all): besides the one
 * status.tokenId names, those it extended may still be active.
 */
static int
revoke_all(struct rctx *x, const char *keep)
{
	char *cause = NULL;
	int rc;

	rc = meter_revoke_task_tokens(x->cc->meter, x->ns, x->name, keep,
	    &cause);
	return revoked(x, rc, cause);
}

/*
 * Mint a token for the task expiring at exp and write it into the task's
 * Secret: created, or updated in place (a running pod sees the new one
 * in its Secret volume). extends is the live token it extends, recorded
 * on the Secret, or NULL for a token that replaces any other. 0, 1 when
 * the Secret is not ours (the new token is then revoked), or an error;
 * *token and *tid get the token and its id (new strings) but on an error.
 */
static int
issue_token(struct rctx *x, struct obs *o, int64_t exp, const char *extends,
    char **token, char **tid)
{
	char *cause = NULL, *sname, *b64;
	json_t *sec;
	int rc;

	rc = meter_issue_token(x->cc->meter, o->task, exp, token, tid, &cause);
	if (rc < 0) {
		if (x->cause == NULL)
			x->cause = xasprintf("token: %s", cause ? cause : "?");
		free(cause);
		return index_error(rc);
	}
	count_write(x);
	sname = token_secret_name(x->name);
	b64 = base64_encode((const unsigned char *)*token, strlen(*token), 0,
	    1);
	sec = json_pack("{s:s,s:s,s:o,s:s,s:{s:s}}", "apiVersion", "v1",
	    "kind", "Secret", "metadata", owner_meta(x, sname), "type",
	    "Opaque", "data", "token", b64);
	json_object_set_new(json_object_get(sec, "metadata"), "annotations",
	    json_pack("{s:s,s:o}", CONTROLLER_ANN_TOKEN_ID, *tid,
	    CONTROLLER_ANN_TOKEN_EXTENDS, extends != NULL ?
	    json_string(extends) : json_null()));
	secure_wipe(b64, strlen(b64));
	free(b64);
	free(sname);
	rc = apply_child(x, &K8S_SECRET, o->secret.obj, sec, 0, NULL);
	if (rc == 1) {
		o->secret.conflict = 1;
		revoke(x, *tid);
	} else if (rc < 0) {
		/*
		 * refused for good, the Secret does not hold the token: no
		 * one can, and it would stay active in the index until it
		 * expires, one more at every refused pass
		 */
		if (refused_for_good(rc))
			(void)revoke(x, *tid);
		secure_wipe(*token, strlen(*token));
		free(*token);
		free(*tid);
		*token = *tid = NULL;
	}
	return rc;
}

/* The token the task's Secret holds (a new string), or NULL. */
static char *
secret_token(const json_t *sec)
{
	const char *t64 = jpath(sec, "data", "token");
	unsigned char *raw = NULL;
	size_t n;

	if (t64 == NULL || base64_decode(t64, strlen(t64), &raw, &n) < 0)
		return NULL;
	return (char *)raw;
}

/* Wipe and free a token. */
static void
token_free(char *token)
{
	if (token == NULL)
		return;
	secure_wipe(token, strlen(token));
	free(token);
}

/*
 * The expiry of the token in the task's Secret, read from the token
 * itself (no HMAC, no store call); 0 when it has none or does not parse.
 */
static int64_t
secret_expires(const json_t *sec)
{
	char *t = secret_token(sec);
	struct macaroon *m = NULL;
	int64_t exp = 0;

	if (t != NULL && macaroon_inspect(t, strlen(t), &m, NULL) == 0 &&
	    macaroon_expires(m, &exp) < 0)
		exp = 0;
	macaroon_free(m);
	token_free(t);
	return exp;
}

/* The log line of a task that joins the queue or leaves it for a slot. */
static void
log_admission(struct rctx *x, const json_t *old, const struct plan *p)
{
	char running[24], limit[24];

	if (p->queued && !streq(jstr(old, "reason"), K8S_TASK_REASON_QUEUED))
		log_kv(LOG_INFO, "task queued", "task", x->name, "namespace",
		    x->ns, "phase", p->phase, "message", p->message, NULL);
	if (!x->admitted)
		return;
	snprintf(running, sizeof(running), "%" PRId64, x->running);
	snprintf(limit, sizeof(limit), "%" PRId64, max_active(x));
	log_kv(LOG_INFO, "task admitted", "task", x->name, "namespace", x->ns,
	    "running", running, "limit", limit, NULL);
}

static int64_t
resync_ms(const struct controller_config *cc)
{
	return cc->resync_ms > 0 ? cc->resync_ms : CONTROLLER_RESYNC_MS;
}

/*
 * Whether the finished task's ttl_after_finished ends before the next
 * resync (now + resync_ms): the resync's list queues it, since its pass
 * asked for no look that far ahead.
 */
int
controller_ttl_due(const struct controller_config *cc, const json_t *task,
    int64_t now)
{
	int64_t ttl = cc->cfg->controller.ttl_after_finished_s;
	int64_t end = parse_time(jpath(task, "status", "completedAt"));

	return ttl > 0 && end > 0 && (end + ttl - now) * 1000 <=
	    resync_ms(cc);
}

/* Whether the finished task's ttl_after_finished has ended by now. */
static int
ttl_due_now(const struct rctx *x, const json_t *task)
{
	int64_t ttl = x->cfg->controller.ttl_after_finished_s;
	int64_t end = parse_time(jpath(task, "status", "completedAt"));

	return ttl > 0 && end > 0 && x->now >= end + ttl;
}

/*
 * controller.ttl_after_finished: a finished task is deleted that long
 * after its completedAt, as a Job is after ttlSecondsAfterFinished; its
 * children go with it by their owner references (the Sandbox's
 * shutdownTime, at the end of the audit window, has passed: the TTL is
 * never shorter). Only a settled task, one whose pass wrote nothing: its
 * tokens are revoked and its status final. The deletion carries the uid
 * and resourceVersion this pass read, so a task changed meanwhile (a
 * re-run: Pending again) is not deleted: 409, and the caller's next pass
 * sees it as it is. A task due before the next resync asks for a look
 * when it is; a later one is left to the resync that comes before it
 * (controller_ttl_due), so that the work queue does not hold a timer for
 * every finished task of the last ttl_after_finished.
 */
static int
expire_finished(struct rctx *x, const json_t *task, int wrote)
{
	int64_t ttl = x->cfg->controller.ttl_after_finished_s;
	int64_t end = parse_time(jpath(task, "status", "completedAt"));
	struct k8s_status st = { 0 };
	char ttls[24];
	int rc;

	if (ttl <= 0)
		return 0;
	if (end <= 0)
		end = x->now;	/* this pass wrote it */
	if (wrote || x->now < end + ttl) {
		if ((end + ttl - x->now) * 1000 <= resync_ms(x->cc))
			want_requeue(x, (end + ttl - x->now) * 1000);
		return 0;
	}
	if (x->cc->test_hook != NULL)
		x->cc->test_hook(x->cc->test_arg, "delete");
	rc = k8s_delete_if(x->cc->store, &K8S_AGENTTASK, x->ns, x->name,
	    K8S_PROPAGATE_BACKGROUND, k8s_meta_str(task, "uid"),
	    k8s_meta_str(task, "resourceVersion"), NULL, &st);
	if (rc == 0) {
		snprintf(ttls, sizeof(ttls), "%" PRId64, ttl);
		log_kv(LOG_INFO, "task deleted", "task", x->name, "namespace",
		    x->ns, "reason", "ttl_after_finished", "completed_at",
		    jpath(task, "status", "completedAt"), "ttl_s", ttls, NULL);
		metrics_inc("diverge_agenttasks_expired_total", "", 1);
	} else if (rc == K8S_ENOTFOUND) {
		rc = 0;
	} else if (rc != K8S_ECONFLICT) {
		note_cause(x, "task delete", &st);
	}
	k8s_status_release(&st);
	return rc;
}

/* ---------------------------------------------------------- reconcile */

/*
 * One pass over a fresh read. K8S_ECONFLICT means the task changed under
 * us: the caller starts again.
 */
static int
reconcile_once(struct rctx *x)
{
	struct obs o;
	struct sbview v;
	struct plan p;
	json_t *status = NULL, *conds, *sbres = NULL;
	const json_t *old;
	char *ename = NULL, *purl = NULL, *conflict = NULL, *token = NULL;
	char *tid = NULL, *kept = NULL, shutdown[32], ts[32];
	const char *sec_id, *mode, *tok_live_id = NULL, *tok_extends = NULL;
	const char *ctok = NULL, *sb_tok;
	const json_t *sb_cur;
	int rc, live, children, paused, asleep, preview, has_shutdown = 0;
	int env_exists = 0, tok_issued, sb_write, roll, hold, defer;
	int writes = x->writes;
	int64_t active, open_since = 0, end, timeout, deadline;
	const json_t *tc;
	struct k8s_status st = { 0 };

	memset(&o, 0, sizeof(o));
	memset(&p, 0, sizeof(p));
	rc = k8s_get(x->cc->store, &K8S_AGENTTASK, x->ns, x->name, &o.task,
	    &st);
	if (rc == K8S_ENOTFOUND) {
		/* what the task watch's DELETED event also says */
		controller_slots_not_found(controller_slots_of(x->cc->store),
		    x->ns, x->name);
		/* a pass refused before it went has nothing left to tell */
		x->status = 1;
		k8s_status_release(&st);
		return 0;
	}
	if (rc < 0) {
		note_cause(x, "task", &st);
		k8s_status_release(&st);
		return rc;
	}
	/* the slot cache never has less than the pass decides on */
	x->stale = controller_slots_observe(controller_slots_of(
	    x->cc->store), o.task, 0) < 0;
	if (json_object_get(json_object_get(o.task, "metadata"),
	    "deletionTimestamp") != NULL) {
		controller_task_deleted(x->cc, o.task);
		goto out;
	}
	x->uid = k8s_meta_str(o.task, "uid");
	if (x->uid == NULL) {
		x->cause = xstrdup("task: no metadata.uid");
		rc = K8S_EINVALID;
		goto out;
	}
	rc = observe(x, &o);
	if (rc < 0)
		goto out;
	old = json_object_get(o.task, "status");

	/* the Sandbox as observed, the live time, the phase */
	view_sandbox(o.claim.obj != NULL ? o.bound : o.sandbox.obj,
	    o.claim.obj, &v);
	if (o.claim.obj != NULL && o.bound == NULL)
		v.stopped = 1;
	active = json_integer_value(json_object_get(old, "activeSeconds"));
	tc = find_cond(o.task, "TokenIssued");
	if (tc != NULL && streq(jstr(tc, "status"), "True"))
		open_since = parse_time(jstr(tc, "lastTransitionTime"));
	if (open_since > 0 && x->now > open_since)
		active += x->now - open_since;
	plan_phase(x, o.task, &v, active, &p);
	if ((rc = plan_admission(x, &o, &p)) == CONTROLLER_SLOTS_BEHIND) {
		/*
		 * not a failure of the task: no back-off; the slot cache
		 * queues it again when the watch gets there
		 */
		want_requeue(x, CONTROLLER_SLOTS_RECHECK_MS);
		rc = 0;
		goto out;
	}
	if (rc < 0)
		goto out;
	/*
	 * a queued task that is not paused leaves its children as they are
	 * (a re-run's Sandbox keeps its shutdownTime) until it is admitted
	 */
	hold = p.queued && streq(p.phase, "Pending");
	live = phase_live(p.phase);
	children = live || streq(p.phase, "Pausing");
	paused = streq(p.phase, "Pausing") || streq(p.phase, "Paused");
	preview = preview_wanted(o.task);
	ename = env_name(x->name);
	if (preview)
		purl = preview_url(x->cfg, ename);

	/* the token: live phases hold an active one, others none */
	sec_id = o.secret.obj != NULL ? jpath(json_object_get(o.secret.obj,
	    "metadata"), "annotations", CONTROLLER_ANN_TOKEN_ID) : NULL;
	tok_issued = tc != NULL && streq(jstr(tc, "status"), "True");
	if (live && sec_id != NULL && phase_live(jstr(old, "phase")) &&
	    tok_issued && streq(sec_id, jstr(old, "tokenId"))) {
		/* live before and after, as recorded: nothing revoked it */
		tok_live_id = sec_id;
	} else if (live && sec_id != NULL && (rc = load_index(x, &o)) == 0 &&
	    index_active(o.index, sec_id, x->name)) {
		/* e.g. a restart between the Secret and the status write */
		tok_live_id = sec_id;
	} else if (rc < 0) {
		goto out;
	} else if (live && !o.secret.conflict) {
		rc = issue_token(x, &o, x->now + task_timeout(x, o.task) +
		    CONTROLLER_TOKEN_SLACK_S, NULL, &token, &tid);
		if (rc < 0)
			goto out;
		if (rc == 0)
			tok_live_id = tid;
	}
	if (tok_live_id != NULL && tok_live_id == sec_id)
		tok_extends = jpath(json_object_get(o.secret.obj, "metadata"),
		    "annotations", CONTROLLER_ANN_TOKEN_EXTENDS);
	/*
	 * A live token that would expire before the task can time out (its
	 * timeout was raised) is extended: a new token with a later expiry,
	 * written into the Secret in place; the pod reads it from its Secret
	 * volume, so it is not restarted, and the old one stays active until
	 * it expires (the agent may hold either). The Secret records the
	 * token extended, which status.tokenId and the Sandbox still name
	 * until this pass writes them: a restart at any step finds that
	 * record, so only a settled token (the Secret's is status.tokenId)
	 * is extended. Not in warm-pool mode: the claim's pod has its token
	 * in its environment for good.
	 */
	timeout = task_timeout(x, o.task);
	deadline = x->now + (active < timeout ? timeout - active : 0);
	if (tok_live_id != NULL && tok_live_id == sec_id &&
	    streq(sec_id, jstr(old, "tokenId")) &&
	    !x->cfg->sandbox.warm_pool && secret_expires(o.secret.obj) <
	    deadline + CONTROLLER_TOKEN_SLACK_S / 2) {
		rc = issue_token(x, &o, deadline + CONTROLLER_TOKEN_SLACK_S,
		    sec_id, &token, &tid);
		if (rc < 0)
			goto out;
		if (rc == 0) {
			log_kv(LOG_INFO, "token extended", "task", x->name,
			    "namespace", x->ns, "token", tid, "extends",
			    sec_id, NULL);
			tok_extends = sec_id;
			tok_live_id = tid;
		}
	}
	/*
	 * a token replaced by another (its Secret was lost): revoke the old
	 * ones; one extended stays active
	 */
	if (tok_live_id != NULL && jstr(old, "tokenId") != NULL &&
	    !streq(tok_live_id, jstr(old, "tokenId")) && !streq(tok_extends,
	    jstr(old, "tokenId")) && (rc = revoke_all(x, tok_live_id)) < 0)
		goto out;
	if (!live && (tok_issued || (sec_id != NULL && !streq(sec_id,
	    jstr(old, "tokenId"))))) {
		/* pause, completion, failure: revoke what may be live */
		if ((rc = revoke_all(x, NULL)) < 0)
			goto out;
	}

	/* the end of the task: shut the sandbox down after the audit */
	if (phase_terminal(p.phase)) {
		end = parse_time(jstr(old, "completedAt"));
		if (end == 0)
			end = x->now;
		time_rfc3339(end + x->cfg->sandbox.audit_window_s, shutdown);
		has_shutdown = 1;
	}
	/*
	 * a finished task wakes nothing: a Sandbox suspended before the end
	 * stays so until its shutdownTime, its Environment stays hibernated
	 */
	asleep = paused || (phase_terminal(p.phase) && streq(jpath(
	    o.claim.obj != NULL ? o.bound : o.sandbox.obj, "spec",
	    "operatingMode"), "Suspended"));
	/*
	 * A token replaced while the Sandbox's pod may still run (its Secret
	 * was lost, a resume before the pod stopped, a re-run) is not the
	 * one that pod holds: that one is revoked, so every meter call of
	 * the agent would be a 401 (the reference runner reads its token
	 * once, at start; agent-sandbox never restarts a running pod). The
	 * Sandbox records the token its pod was started with; until that is
	 * the live one it is rolled: Suspended until its pod is gone, then
	 * Running, and the new pod mounts the new token. A Sandbox that
	 * records none (made by an older diverged) is taken as current, and
	 * so is one that records the token the live one extends (nothing
	 * revoked it): it records the live one from now on.
	 */
	roll = live && tok_live_id != NULL && !v.stopped &&
	    o.sandbox.obj != NULL && !streq(tok_live_id, sandbox_token(
	    o.sandbox.obj, tok_live_id)) && !streq(tok_extends,
	    sandbox_token(o.sandbox.obj, tok_live_id));
	/*
	 * Warm-pool mode: the token travels in the environment, which the
	 * claim controller sets only when it makes the Sandbox, so this pass
	 * writes it into the Sandbox's pod template (apply_bound), and the
	 * template tells what a pod started from it holds. One that may
	 * still run with another token is rolled in the same way.
	 */
	if (x->cfg->sandbox.warm_pool) {
		/* the token the claim carries: the live one, else kept */
		ctok = token != NULL ? token : (kept = secret_token(
		    o.secret.obj));
		roll = live && tok_live_id != NULL && !v.stopped &&
		    o.bound != NULL && ctok != NULL &&
		    bound_container(o.bound, &sb_tok) >= 0 &&
		    !streq(sb_tok, ctok);
	}
	if (roll && !streq(jpath(o.claim.obj != NULL ? o.bound :
	    o.sandbox.obj, "spec", "operatingMode"), "Suspended"))
		log_kv(LOG_INFO, "sandbox restart", "task", x->name,
		    "namespace", x->ns, "reason", "token replaced", NULL);
	mode = asleep || roll ? "Suspended" : "Running";
	/*
	 * The agent calls the meter as soon as its pod starts, and the meter
	 * takes a call only while the task's stored status is live and its
	 * token active (DESIGN.md sections 6 and 7): a pod started before
	 * the status says so gets 401 "task not live", on which an agent may
	 * well give up. So only a pass that read a live status tells a
	 * Sandbox to run (makes it, or takes it out of Suspended). One that
	 * would from another phase (a start, a resume; the token is active
	 * by now) leaves the Sandbox as it is, writes the live status and
	 * passes again (controller_reconcile): that pass reads the status
	 * back and starts the Sandbox, and so does any later one when its
	 * write fails. A Sandbox already running is not held back.
	 */
	sb_cur = x->cfg->sandbox.warm_pool ? o.bound : o.sandbox.obj;
	defer = live && streq(mode, "Running") && !phase_live(jstr(old,
	    "phase")) && (sb_cur == NULL || streq(jpath(sb_cur, "spec",
	    "operatingMode"), "Suspended"));
	if (defer)
		mode = "Suspended";

	/* the Environment */
	if (hold) {
		env_exists = preview && o.env.obj != NULL;
	} else if (preview && (children || o.env.obj != NULL) &&
	    !o.env.conflict) {
		rc = apply_child(x, &K8S_ENVIRONMENT, o.env.obj,
		    desired_env(x, o.task, asleep, asleep ? NULL : v.pod_ip),
		    0, NULL);
		if (rc < 0)
			goto out;
		if (rc == 1)
			o.env.conflict = 1;
		else
			env_exists = 1;
	}
	/*
	 * someone else's Environment of the name is not the task's preview:
	 * the agent is not sent to it (its requests, with the preview
	 * header, would reach whatever that Environment runs)
	 */
	if (o.env.conflict) {
		free(purl);
		purl = NULL;
	}

	/*
	 * the Sandbox or SandboxClaim; the Sandbox mounts <task>-token by
	 * name, so while that Secret is not ours (a conflict, reported) the
	 * Sandbox is not created, and an existing one only suspended or ended
	 */
	sb_write = !hold && !(defer && o.sandbox.obj == NULL) &&
	    (!o.secret.conflict || (o.sandbox.obj != NULL && (asleep ||
	    phase_terminal(p.phase))));
	if (!x->cfg->sandbox.warm_pool && !o.sandbox.conflict && sb_write &&
	    (children || o.sandbox.obj != NULL)) {
		rc = apply_child(x, &K8S_SANDBOX, o.sandbox.obj,
		    desired_sandbox(x, o.task, purl, mode, has_shutdown ?
		    shutdown : NULL, asleep || roll || defer ? NULL :
		    tok_live_id), 0, &sbres);
		if (rc < 0)
			goto out;
		if (rc == 1)
			o.sandbox.conflict = 1;
		else if (o.sandbox.obj == NULL && sbres != NULL &&
		    jpath(o.task, "status", "sandboxName") != NULL &&
		    phase_live(jpath(o.task, "status", "phase")))
			/* someone deleted it: the agent's run starts over */
			log_kv(LOG_WARN, "sandbox missing, made again", "task",
			    x->name, "namespace", x->ns, "phase",
			    jpath(o.task, "status", "phase"), NULL);
	} else if (x->cfg->sandbox.warm_pool && !o.claim.conflict && !hold &&
	    !(defer && o.claim.obj == NULL) && ((children && (tok_live_id !=
	    NULL || paused)) || o.claim.obj != NULL)) {
		/* the claim carries the live token, else the one it had */
		rc = apply_child(x, &K8S_SANDBOXCLAIM, o.claim.obj,
		    desired_claim(x, o.task, purl, ctok, has_shutdown ?
		    shutdown : NULL), 0, NULL);
		if (rc < 0)
			goto out;
		if (rc == 1)
			o.claim.conflict = 1;
		if (o.bound != NULL && !phase_terminal(p.phase)) {
			int cur = live && tok_live_id != NULL && !roll;

			rc = apply_bound(x, o.bound, mode, cur ? ctok : NULL,
			    cur ? tok_live_id : NULL, &sbres);
			if (rc < 0)
				goto out;
		}
	}

	/*
	 * conditions and messages describe the Sandbox as now written; a
	 * Ready seen before this pass replaced its generation is not Active,
	 * nor is a pod that holds a revoked token
	 */
	if (sbres != NULL)
		view_sandbox(sbres, o.claim.obj, &v);
	if (streq(p.phase, "Active") && (!v.ready || roll || defer)) {
		p.phase = "Provisioning";
		p.reason = NULL;
		plan_transition(&p, jstr(old, "phase"));
	}

	/* the namespace's NetworkPolicy */
	if (children && x->cfg->sandbox.network_policy && !o.netpol.conflict) {
		rc = apply_child(x, &K8S_NETWORKPOLICY, o.netpol.obj,
		    desired_netpol(x), 1, NULL);
		if (rc < 0)
			goto out;
		if (rc == 1)
			o.netpol.conflict = 1;
	}

	if (o.secret.conflict || o.sandbox.conflict || o.claim.conflict ||
	    o.env.conflict || o.netpol.conflict) {
		char *sname = token_secret_name(x->name);

		conflict = xasprintf("%s '%s' exists and is not owned by this "
		    "task", o.secret.conflict ? "secret" : o.sandbox.conflict ?
		    "sandbox" : o.claim.conflict ? "sandboxclaim" :
		    o.env.conflict ? "environment" : "networkpolicy",
		    o.secret.conflict ? sname : o.env.conflict ? ename :
		    o.sandbox.conflict || o.claim.conflict ? x->name :
		    CONTROLLER_NETPOL);
		free(sname);
	}

	/* the task's preview annotations */
	if (env_exists)
		rc = write_annotations(x, &o.task, ename, purl);
	else
		rc = write_annotations(x, &o.task, NULL, NULL);
	if (rc < 0)
		goto out;
	/* both pointed into the task object the write may have replaced */
	old = json_object_get(o.task, "status");
	x->uid = k8s_meta_str(o.task, "uid");

	/* the status */
	status = json_object();
	json_object_set_new(status, "phase", json_string(p.phase));
	if (p.transition || p.restate) {
		json_object_set_new(status, "reason", json_string(p.reason));
		if (p.message != NULL)
			json_object_set_new(status, "message",
			    status_message(p.message));
	}
	if (conflict != NULL && !phase_terminal(p.phase))
		json_object_set_new(status, "message",
		    status_message(conflict));
	else if (!phase_terminal(p.phase) && !streq(p.phase, "Paused") &&
	    p.message == NULL) {
		char *m;

		if (streq(p.phase, "Active"))
			m = xstrdup("the agent is running");
		else if (streq(p.phase, "Pausing"))
			m = xstrdup("waiting for the sandbox to stop");
		else if (streq(p.phase, "Pending"))
			m = xstrdup("waiting to provision");
		else if (roll)
			m = xstrdup("restarting the sandbox with the new "
			    "token");
		else if (defer)
			m = xstrdup("starting the sandbox");
		else if (v.message != NULL)
			m = xasprintf("waiting for the sandbox: %.*s",
			    quote_len(v.message), v.message);
		else
			m = xstrdup("waiting for the sandbox: not ready");
		json_object_set_new(status, "message", status_message(m));
		free(m);
	} else if ((p.transition || p.restate) && streq(p.phase, "Paused") &&
	    p.message == NULL) {
		json_object_set_new(status, "message",
		    json_string("the task is paused"));
	}
	json_object_set_new(status, "observedGeneration", json_integer(
	    k8s_meta_int(o.task, "generation")));
	if (!live && open_since > 0) {
		/* a live period closes: count it */
		json_object_set_new(status, "activeSeconds",
		    json_integer(active));
	}
	if (tok_live_id != NULL)
		json_object_set_new(status, "tokenId",
		    json_string(tok_live_id));
	if (!x->cfg->sandbox.warm_pool && (o.sandbox.obj != NULL ||
	    sbres != NULL))
		json_object_set_new(status, "sandboxName",
		    json_string(x->name));
	else if (o.bound != NULL)
		json_object_set_new(status, "sandboxName",
		    json_string(k8s_meta_str(o.bound, "name")));
	json_object_set_new(status, "previewEnvironment", env_exists ?
	    json_string(ename) : json_null());
	json_object_set_new(status, "previewUrl", env_exists && purl != NULL ?
	    json_string(purl) : json_null());
	if (live && jstr(old, "startedAt") == NULL) {
		time_rfc3339(x->now, ts);
		json_object_set_new(status, "startedAt", json_string(ts));
	}
	if (phase_terminal(p.phase) && jstr(old, "completedAt") == NULL) {
		time_rfc3339(x->now, ts);
		json_object_set_new(status, "completedAt", json_string(ts));
	}

	/* conditions: Ready, TokenIssued, SandboxReady, PreviewReady */
	conds = json_array();
	if (conflict != NULL)
		set_cond(conds, o.task, "Ready", 0, "ChildConflict", conflict,
		    x->now);
	else
		set_cond(conds, o.task, "Ready", streq(p.phase, "Active"),
		    streq(p.phase, "Active") ? "Active" : p.queued ?
		    K8S_TASK_REASON_QUEUED : p.phase,
		    streq(p.phase, "Active") ? "the agent is running" :
		    p.message != NULL ? p.message : NULL, x->now);
	if (tok_live_id != NULL)
		set_cond(conds, o.task, "TokenIssued", 1, "Issued", NULL,
		    x->now);
	else
		set_cond(conds, o.task, "TokenIssued", 0, o.secret.conflict ?
		    "ChildConflict" : jstr(old, "tokenId") != NULL ?
		    "Revoked" : "NotIssued", NULL, x->now);
	if (o.sandbox.conflict || o.claim.conflict)
		set_cond(conds, o.task, "SandboxReady", 0, "ChildConflict",
		    conflict, x->now);
	else if (v.present)
		set_cond(conds, o.task, "SandboxReady", v.ready, v.reason ?
		    v.reason : "SandboxNotReady", v.message, x->now);
	else
		set_cond(conds, o.task, "SandboxReady", 0, "SandboxMissing",
		    NULL, x->now);
	if (!preview)
		set_cond(conds, o.task, "PreviewReady", 0, "PreviewDisabled",
		    NULL, x->now);
	else if (o.env.conflict)
		set_cond(conds, o.task, "PreviewReady", 0, "ChildConflict",
		    conflict, x->now);
	else if (asleep)
		set_cond(conds, o.task, "PreviewReady", 0, "Hibernated", NULL,
		    x->now);
	else if (env_exists)
		set_cond(conds, o.task, "PreviewReady", 1, "EnvironmentReady",
		    NULL, x->now);
	else
		set_cond(conds, o.task, "PreviewReady", 0, "NotCreated", NULL,
		    x->now);
	/*
	 * a finished task due for deletion keeps its Stalled: the deletion
	 * comes after this write, and only from a pass that wrote nothing,
	 * so a pass dropping it would let a refused deletion write the
	 * condition and take it away again at every pass
	 */
	if (phase_terminal(p.phase) && ttl_due_now(x, o.task) &&
	    k8s_task_stalled(o.task))
		json_array_append(conds, (json_t *)find_cond(o.task,
		    "Stalled"));
	json_object_set_new(status, "conditions", conds);
	rc = write_status(x, o.task, status);
	if (rc == 0 && p.transition) {
		char labels[64];

		log_kv(LOG_INFO, "task phase", "task", x->name, "namespace",
		    x->ns, "phase", p.phase, "reason", p.reason, NULL);
		/* p.phase is one of ours: Pending, Provisioning, Active... */
		snprintf(labels, sizeof(labels), "phase=\"%s\"", p.phase);
		metrics_inc("diverge_agenttask_phase_transitions_total",
		    labels, 1);
	}
	if (rc == 0 && p.transition && streq(p.phase, "Pending"))
		want_requeue(x, 0);
	if (rc == 0 && defer) {
		/* now live: the next pass starts the Sandbox held back */
		x->again = 1;
		want_requeue(x, 0);
	}
	if (rc == 0)
		log_admission(x, old, &p);
	if (rc == 0 && phase_terminal(p.phase))
		rc = expire_finished(x, o.task, x->writes != writes);
out:
	x->admitted = 0;
	json_decref(status);
	json_decref(sbres);
	token_free(token);
	free(tid);
	token_free(kept);
	free(ename);
	free(purl);
	free(conflict);
	free(p.message);
	obs_release(&o);
	return rc;
}

/*
 * A pass the API server refused for good (refused_for_good: RBAC, a
 * quota, an admission webhook, a missing namespace or CRD) fails the same
 * way at every retry until someone acts, and without this a task would
 * wait, Pending or Provisioning, for ever, holding its slot of
 * controller.max_active_tasks. The task says so in the condition Stalled
 * (True, reason ReconcileError, the cause; kstatus's meaning), whose
 * lastTransitionTime is the first of these failures; any pass that
 * succeeds writes the conditions without it. A task stalled for longer
 * than CONTROLLER_ERROR_GRACE_S fails (reason ReconcileError), unless it
 * is suspended: failing would not stop what a pause could not, or
 * already finished. Its next pass then revokes its token and frees its
 * slot. The cause, which may
 * name service accounts and namespaces, stays in the condition and the
 * log; status.message, which the pull request's comment shows, only
 * points at it. *requeue_ms gets the time the grace ends, while it is
 * ahead.
 */
static void
note_stall(struct rctx *x, int64_t *requeue_ms)
{
	struct k8s_status st = { 0 };
	const json_t *old, *c, *it;
	json_t *task = NULL, *status, *conds;
	const char *cause = x->cause != NULL ? x->cause : "reconcile failed";
	int64_t since = x->now;
	char *msg = NULL, *red;
	size_t i;
	int fail, done, rc;

	if ((rc = k8s_get(x->cc->store, &K8S_AGENTTASK, x->ns, x->name,
	    &task, &st)) < 0) {
		/* deleted since: its refusals no longer matter */
		if (rc == K8S_ENOTFOUND)
			x->status = 1;
		k8s_status_release(&st);
		return;
	}
	/*
	 * a finished task stalls too (its token's revocation or its deletion
	 * refused) but does not fail again: its phase stays
	 */
	done = phase_terminal(jpath(task, "status", "phase"));
	old = json_object_get(task, "status");
	c = find_cond(task, "Stalled");
	if (c != NULL && streq(jstr(c, "status"), "True") &&
	    parse_time(jstr(c, "lastTransitionTime")) > 0)
		since = parse_time(jstr(c, "lastTransitionTime"));
	fail = !done && x->now - since > CONTROLLER_ERROR_GRACE_S &&
	    !json_is_true(json_object_get(json_object_get(task, "spec"),
	    "suspended"));
	status = json_object();
	conds = json_array();
	json_array_foreach(json_object_get(old, "conditions"), i, it)
		if (!streq(jstr(it, "type"), "Stalled"))
			json_array_append(conds, (json_t *)it);
	/* redacted before the cut, which could keep a secret's start */
	red = redact_xstrdup(cause);
	msg = xasprintf("%.*s", quote_len(red), red);
	free(red);
	set_cond(conds, task, "Stalled", 1, CONTROLLER_REASON_STALLED, msg,
	    x->now);
	json_object_set_new(status, "conditions", conds);
	if (fail) {
		char ts[32];

		/* here, not by a later pass, which may be refused too */
		time_rfc3339(x->now, ts);
		json_object_set_new(status, "phase", json_string("Failed"));
		json_object_set_new(status, "completedAt", json_string(ts));
		json_object_set_new(status, "reason",
		    json_string(CONTROLLER_REASON_STALLED));
		json_object_set_new(status, "message", json_sprintf("the "
		    "controller could not reconcile the task for %lld s (its "
		    "Stalled condition says why)", (long long)(x->now -
		    since)));
	}
	if (write_status(x, task, status) == 0) {
		if (fail) {
			log_kv(LOG_WARN, "task phase", "task", x->name,
			    "namespace", x->ns, "phase", "Failed", "reason",
			    CONTROLLER_REASON_STALLED, "error", cause, NULL);
			metrics_inc("diverge_agenttask_phase_transitions_total",
			    "phase=\"Failed\"", 1);
		} else if (since == x->now) {
			log_kv(LOG_WARN, "task stalled", "task", x->name,
			    "namespace", x->ns, "error", cause, NULL);
		}
	}
	/*
	 * a suspended task past the grace does not fail, nor a finished
	 * one: their passes keep the error backoff (a hint in the past
	 * would queue each at once)
	 */
	if (!fail && !done && requeue_ms != NULL &&
	    since + CONTROLLER_ERROR_GRACE_S + 1 > x->now)
		*requeue_ms = (since + CONTROLLER_ERROR_GRACE_S + 1 - x->now) *
		    1000;
	free(msg);
	json_decref(status);
	json_decref(task);
}

/* Reconcile one task. */
int
controller_reconcile(const struct controller_config *cfg, const char *ns,
    const char *name, int64_t *requeue_ms, int *status, char **cause)
{
	struct rctx x;
	int tries, rc = 0;

	memset(&x, 0, sizeof(x));
	x.cc = cfg;
	x.cfg = cfg->cfg;
	x.ns = ns;
	x.name = name;
	for (tries = 0; tries < MAX_TASK_RETRIES; tries++) {
		x.now = now_unix();
		x.requeue_ms = -1;
		x.again = 0;
		/* the cause is the last try's: a stall names what refused */
		free(x.cause);
		x.cause = NULL;
		rc = reconcile_once(&x);
		/* a Sandbox held back until the status said live: start it */
		if (rc != K8S_ECONFLICT && !(rc == 0 && x.again))
			break;
	}
	if (rc == K8S_ECONFLICT && x.cause == NULL)
		x.cause = xstrdup("task: too many conflicting writers");
	if (requeue_ms != NULL)
		*requeue_ms = rc == 0 ? x.requeue_ms : -1;
	if (rc < 0 && refused_for_good(rc))
		note_stall(&x, requeue_ms);
	if (status != NULL)
		*status = x.status;
	/* a child refused, and the condition that would say so too */
	if (x.status < 0 && x.cause != NULL && strcmp(x.cause,
	    x.status_cause) != 0) {
		char *both = xasprintf("%s; %s", x.cause, x.status_cause);

		free(x.cause);
		x.cause = both;
	}
	free(x.status_cause);
	if (rc < 0 && cause != NULL)
		*cause = x.cause != NULL ? x.cause : xstrdup("reconcile "
		    "failed");
	else
		free(x.cause);
	return rc;
}

/* Revoke a deleted task's token. */
void
controller_task_deleted(const struct controller_config *cfg,
    const json_t *task)
{
	const char *ns = k8s_meta_str(task, "namespace");
	const char *id = jpath(task, "status", "tokenId");
	char *cause = NULL;

	if (ns == NULL || id == NULL || cfg->meter == NULL)
		return;
	if (meter_revoke_token(cfg->meter, ns, id, &cause) < 0)
		log_kv(LOG_WARN, "token revocation failed", "task",
		    k8s_meta_str(task, "name"), "namespace", ns, "error",
		    cause, NULL);
	free(cause);
}
