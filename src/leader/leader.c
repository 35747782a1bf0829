/*
 * Lease-based leader election (leader.h): one thread per process that
 * tries to acquire, then renews, a coordination.k8s.io/v1 Lease.
 */
#include "config.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "k8s/k8s.h"
#include "leader/leader.h"
#include "util/util.h"

struct leader {
	struct leader_config c;		/* strings owned */
	char *where;			/* "namespace/name", for the logs */
	pthread_t thread;
	pthread_t deadline;		/* the renew_deadline's own thread */
	pthread_mutex_t mu;
	pthread_cond_t cv;		/* broadcast: both threads wait */
	int stopping;			/* under mu */
	int leading;			/* under mu: acquired, not lost */
	int lost;			/* under mu: said once, by either */
	int64_t last_ok_ms;		/* under mu: the last renewal */
	int state;			/* enum leader_state, atomic */
	/* the election thread's own */
	struct leader_observed obs;
	char *last_error;		/* said once until it changes; under mu */
	char *last_holder;		/* the standby's "held by" line */
};

/* ------------------------------------------------------ record logic */

void
leader_observed_release(struct leader_observed *o)
{
	free(o->record);
	memset(o, 0, sizeof(*o));
}

/* A MicroTime: RFC 3339 with 6 fractional digits, UTC. */
void
leader_micro_time(int64_t unix_us, char out[40])
{
	char s[32];
	size_t n;

	time_rfc3339(unix_us / 1000000, s);
	n = strlen(s) - 1;		/* before the Z, put back below */
	if (n > 24)
		n = 24;
	memcpy(out, s, n);
	snprintf(out + n, 40 - n, ".%06" PRId64 "Z",
	    unix_us % 1000000);
}

static int64_t
wall_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static const char *
spec_str(const json_t *spec, const char *key)
{
	const char *s = json_string_value(json_object_get(spec, key));

	return s != NULL ? s : "";
}

/*
 * The record with our identity, for a Lease that had spec old. A spec
 * that names us already is ours, leading or not (a write whose answer
 * was lost, as client-go's IsLeader): no transition.
 */
static json_t *
our_spec(const json_t *old, const char *identity, int64_t lease_duration_ms,
    int64_t now_us)
{
	char now[40];
	json_int_t transitions;
	const char *acquire;
	int same = strcmp(spec_str(old, "holderIdentity"), identity) == 0;

	leader_micro_time(now_us, now);
	transitions = json_integer_value(json_object_get(old,
	    "leaseTransitions"));
	acquire = now;
	if (same && *spec_str(old, "acquireTime") != '\0')
		acquire = spec_str(old, "acquireTime");
	if (old != NULL && !same)
		transitions++;		/* the holder changes */
	return json_pack("{s:s,s:I,s:s,s:s,s:I}", "holderIdentity", identity,
	    "leaseDurationSeconds",
	    (json_int_t)((lease_duration_ms + 999) / 1000),
	    "acquireTime", acquire, "renewTime", now, "leaseTransitions",
	    transitions);
}

/* Decide one try on the Lease as read. */
enum leader_decision
leader_decide(struct leader_observed *obs, const json_t *cur,
    const char *namespace, const char *name, const char *identity,
    int leading, int64_t lease_duration_ms, int64_t now_ms, int64_t now_us,
    json_t **out, const char **holder)
{
	const json_t *spec = cur != NULL ? json_object_get(cur, "spec") : NULL;
	const char *who = spec_str(spec, "holderIdentity");
	json_int_t secs;
	json_t *obj;
	char *rec;

	if (holder != NULL)
		*holder = who;
	if (cur == NULL) {
		obj = json_pack("{s:s,s:s,s:{s:s,s:s}}", "apiVersion",
		    "coordination.k8s.io/v1", "kind", "Lease", "metadata",
		    "name", name, "namespace", namespace);
		json_object_set_new(obj, "spec", our_spec(NULL, identity,
		    lease_duration_ms, now_us));
		*out = obj;
		return LEADER_WRITE;
	}
	rec = json_dumps(spec != NULL ? spec : json_null(),
	    JSON_SORT_KEYS | JSON_COMPACT | JSON_ENCODE_ANY);
	if (obs->record == NULL || strcmp(obs->record, rec) != 0) {
		free(obs->record);
		obs->record = rec;
		obs->at_ms = now_ms;
	} else {
		free(rec);
	}
	if (*who != '\0' && strcmp(who, identity) != 0) {
		if (leading)
			return LEADER_TAKEN;
		secs = json_integer_value(json_object_get(spec,
		    "leaseDurationSeconds"));
		if (now_ms - obs->at_ms < (secs > 0 ? (int64_t)secs * 1000 :
		    lease_duration_ms))
			return LEADER_NOT_OURS;
	}
	obj = json_deep_copy(cur);
	json_object_set_new(obj, "spec", our_spec(spec, identity,
	    lease_duration_ms, now_us));
	*out = obj;
	return LEADER_WRITE;
}

/* The object that gives the Lease up, as client-go's release does. */
json_t *
leader_release_object(const json_t *cur, int64_t now_us)
{
	json_t *obj = json_deep_copy(cur);
	const json_t *spec = json_object_get(cur, "spec");
	char now[40];

	leader_micro_time(now_us, now);
	json_object_set_new(obj, "spec", json_pack("{s:s,s:i,s:s,s:s,s:I}",
	    "holderIdentity", "", "leaseDurationSeconds", 1, "acquireTime",
	    now, "renewTime", now, "leaseTransitions", json_integer_value(
	    json_object_get(spec, "leaseTransitions"))));
	return obj;
}

/* A new identity: the host name, "_", 16 random hex digits. */
char *
leader_identity_new(void)
{
	unsigned char rnd[8];
	char host[256], hex[17];

	if (gethostname(host, sizeof(host)) != 0 || host[0] == '\0')
		snprintf(host, sizeof(host), "diverged");
	host[sizeof(host) - 1] = '\0';
	if (random_bytes(rnd, sizeof(rnd)) < 0)
		memset(rnd, 0, sizeof(rnd));
	hex_encode(rnd, sizeof(rnd), hex);
	return xasprintf("%s_%s", host, hex);
}

/* -------------------------------------------------------- the thread */

enum try_result {
	TRY_OURS = 0,		/* acquired or renewed */
	TRY_NOT_OURS,		/* held by another, or lost a race */
	TRY_TAKEN,		/* we led and another holds it now */
	TRY_ERROR		/* the API refused or failed */
};

/* An API error, said once (until another one, or a success). */
static void
say_error(struct leader *l, const char *what, const struct k8s_status *st)
{
	char *msg = xasprintf("%s: %s", what, st->message != NULL ?
	    st->message : k8s_err_reason(st->err));

	if (l->last_error == NULL || strcmp(l->last_error, msg) != 0) {
		log_kv(LOG_WARN, "leader election: cannot acquire or renew the "
		    "lease", "lease", l->where, "identity", l->c.identity,
		    "error", msg, NULL);
		pthread_mutex_lock(&l->mu);
		free(l->last_error);
		l->last_error = msg;
		pthread_mutex_unlock(&l->mu);
	} else {
		free(msg);
	}
}

static void
say_holder(struct leader *l, const char *holder)
{
	if (l->last_holder != NULL && strcmp(l->last_holder, holder) == 0)
		return;
	free(l->last_holder);
	l->last_holder = xstrdup(holder);
	log_kv(LOG_INFO, "leader election: standby", "lease", l->where,
	    "identity", l->c.identity, "holder", *holder ? holder : "(none)",
	    NULL);
}

static enum try_result
try_once(struct leader *l, int leading)
{
	struct k8s_status st = { 0 };
	enum leader_decision d;
	enum try_result ret = TRY_ERROR;
	json_t *cur = NULL, *next = NULL, *done = NULL;
	const char *holder = "";
	int rc;

	rc = k8s_get(l->c.api, &K8S_LEASE, l->c.namespace, l->c.name, &cur,
	    &st);
	if (rc != 0 && rc != K8S_ENOTFOUND) {
		say_error(l, "get", &st);
		goto out;
	}
	k8s_status_release(&st);
	d = leader_decide(&l->obs, cur, l->c.namespace, l->c.name,
	    l->c.identity, leading, l->c.lease_duration_ms, now_mono_ms(),
	    wall_us(), &next, &holder);
	if (d == LEADER_TAKEN) {
		free(l->last_holder);
		l->last_holder = xstrdup(holder);
		ret = TRY_TAKEN;
		goto out;
	}
	if (d == LEADER_NOT_OURS) {
		say_holder(l, holder);
		ret = TRY_NOT_OURS;
		goto out;
	}
	if (cur == NULL)
		rc = k8s_create(l->c.api, &K8S_LEASE, l->c.namespace, next,
		    &done, &st);
	else
		rc = k8s_update(l->c.api, &K8S_LEASE, l->c.namespace,
		    l->c.name, next, &done, &st);
	if (rc == K8S_EEXISTS || rc == K8S_ECONFLICT) {
		ret = TRY_NOT_OURS;	/* another process won this round */
		goto out;
	}
	if (rc != 0) {
		say_error(l, cur == NULL ? "create" : "update", &st);
		goto out;
	}
	/* what we wrote is what we observed, now */
	free(l->obs.record);
	l->obs.record = json_dumps(json_object_get(done, "spec"),
	    JSON_SORT_KEYS | JSON_COMPACT | JSON_ENCODE_ANY);
	l->obs.at_ms = now_mono_ms();
	pthread_mutex_lock(&l->mu);
	free(l->last_error);
	l->last_error = NULL;
	pthread_mutex_unlock(&l->mu);
	ret = TRY_OURS;
out:
	json_decref(cur);
	json_decref(next);
	json_decref(done);
	k8s_status_release(&st);
	return ret;
}

/* Wait ms or until stopped; 1 when stopping. */
static int
pause_ms(struct leader *l, int64_t ms)
{
	struct timespec ts;
	int stop;

	time_deadline(CLOCK_MONOTONIC, ms, &ts);
	pthread_mutex_lock(&l->mu);
	while (!l->stopping && pthread_cond_timedwait(&l->cv, &l->mu,
	    &ts) == 0)
		;
	stop = l->stopping;
	pthread_mutex_unlock(&l->mu);
	return stop;
}

static void
set_state(struct leader *l, enum leader_state s)
{
	__atomic_store_n(&l->state, (int)s, __ATOMIC_RELEASE);
	if (l->c.changed != NULL)
		l->c.changed(l->c.arg, s);
}

/* A standby's wait: retry_period and up to 1.2 times more (client-go). */
static int64_t
standby_wait(const struct leader *l)
{
	uint32_t r = 0;

	random_bytes(&r, sizeof(r));
	return l->c.retry_period_ms + (int64_t)((double)l->c.retry_period_ms *
	    1.2 * (double)r / 4294967296.0);
}

/*
 * The Lease is lost: said once (by the election thread when another
 * holds it, or by the deadline's thread), with the last API error if
 * any, then LEADER_LOST.
 */
static void
say_lost(struct leader *l, const char *holder)
{
	char age[32], *error;
	int64_t ago;

	pthread_mutex_lock(&l->mu);
	if (l->lost) {
		pthread_mutex_unlock(&l->mu);
		return;
	}
	l->lost = 1;
	l->leading = 0;
	ago = now_mono_ms() - l->last_ok_ms;
	error = l->last_error != NULL ? xstrdup(l->last_error) : NULL;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	snprintf(age, sizeof(age), "%" PRId64 "ms", ago);
	log_kv(LOG_ERROR, "leader election: lost", "lease", l->where,
	    "identity", l->c.identity, "holder", holder != NULL ? holder : "",
	    "last_renewal_ago", age, "error", error != NULL ? error :
	    holder != NULL && *holder != '\0' ? "another process holds it" :
	    "no renewal within renew_deadline (a call still in flight)",
	    NULL);
	free(error);
	set_state(l, LEADER_LOST);
}

static void *
leader_main(void *arg)
{
	struct leader *l = arg;
	enum try_result r;
	int64_t t_ok;

	thread_name("leader");
	/* standby: try until ours */
	for (;;) {
		if (try_once(l, 0) == TRY_OURS)
			break;
		if (pause_ms(l, standby_wait(l)))
			return NULL;
	}
	t_ok = now_mono_ms();
	log_kv(LOG_INFO, "leader election: acquired", "lease", l->where,
	    "identity", l->c.identity, NULL);
	/* leading said first: a loss, said later, is never overwritten */
	set_state(l, LEADER_LEADING);
	pthread_mutex_lock(&l->mu);
	l->last_ok_ms = t_ok;
	l->leading = 1;
	pthread_cond_broadcast(&l->cv);		/* the deadline's thread */
	pthread_mutex_unlock(&l->mu);
	/* leader: renew until stopped or lost */
	while (!pause_ms(l, l->c.retry_period_ms)) {
		r = try_once(l, 1);
		pthread_mutex_lock(&l->mu);
		if (l->lost) {
			/* the deadline passed while the try was in flight */
			pthread_mutex_unlock(&l->mu);
			return NULL;
		}
		if (r == TRY_OURS) {
			l->last_ok_ms = now_mono_ms();
			pthread_cond_broadcast(&l->cv);
			pthread_mutex_unlock(&l->mu);
			continue;
		}
		pthread_mutex_unlock(&l->mu);
		if (r == TRY_TAKEN) {
			say_lost(l, l->last_holder);
			return NULL;
		}
		/* a failed try: the deadline's thread says when it is lost */
	}
	return NULL;
}

/*
 * The renew_deadline, on a thread of its own: a renewal whose call hangs
 * (an API server that accepts the connection and says nothing) holds the
 * election thread for as long as the call's own timeout, and a process
 * that went on leading meanwhile could overlap with the one that took
 * the Lease over once lease_duration had passed. As client-go's renew
 * context does, the deadline ends the leadership on time, wherever the
 * try is: no renewal for renew_deadline is a loss.
 */
static void *
deadline_main(void *arg)
{
	struct leader *l = arg;
	struct timespec ts;
	int64_t left;

	thread_name("leader-deadline");
	pthread_mutex_lock(&l->mu);
	while (!l->stopping && !l->lost) {
		if (!l->leading) {
			pthread_cond_wait(&l->cv, &l->mu);
			continue;
		}
		left = l->last_ok_ms + l->c.renew_deadline_ms - now_mono_ms();
		if (left > 0) {
			time_deadline(CLOCK_MONOTONIC, left, &ts);
			(void)pthread_cond_timedwait(&l->cv, &l->mu, &ts);
			continue;
		}
		pthread_mutex_unlock(&l->mu);
		say_lost(l, NULL);
		return NULL;
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

/* ---------------------------------------------------------- public */

/* Free l (its thread not running). */
static void
leader_free(struct leader *l)
{
	leader_observed_release(&l->obs);
	free(l->last_error);
	free(l->last_holder);
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->mu);
	free((char *)l->c.namespace);
	free((char *)l->c.name);
	free((char *)l->c.identity);
	free(l->where);
	free(l);
}

/* Start the election thread. */
int
leader_start(struct leader **out, const struct leader_config *cfg,
    char **cause)
{
	struct leader *l = xcalloc(1, sizeof(*l));

	l->c = *cfg;
	l->c.namespace = xstrdup(cfg->namespace);
	l->c.name = xstrdup(cfg->name);
	l->c.identity = xstrdup(cfg->identity);
	l->where = xasprintf("%s/%s", cfg->namespace, cfg->name);
	pthread_mutex_init(&l->mu, NULL);
	time_cond_init(&l->cv);
	if (pthread_create(&l->deadline, NULL, deadline_main, l) != 0) {
		*cause = xstrdup("leader election: cannot start its thread");
		leader_free(l);
		return -1;
	}
	if (pthread_create(&l->thread, NULL, leader_main, l) != 0) {
		*cause = xstrdup("leader election: cannot start its thread");
		pthread_mutex_lock(&l->mu);
		l->stopping = 1;
		pthread_cond_broadcast(&l->cv);
		pthread_mutex_unlock(&l->mu);
		pthread_join(l->deadline, NULL);
		leader_free(l);
		return -1;
	}
	log_kv(LOG_INFO, "leader election: started", "lease", l->where,
	    "identity", l->c.identity, NULL);
	*out = l;
	return 0;
}

enum leader_state
leader_state(struct leader *l)
{
	return (enum leader_state)__atomic_load_n(&l->state,
	    __ATOMIC_ACQUIRE);
}

/* Give the Lease up, if it is still ours. */
static void
release(struct leader *l)
{
	struct k8s_status st = { 0 };
	json_t *cur = NULL, *next = NULL;
	const char *holder;

	if (k8s_get(l->c.api, &K8S_LEASE, l->c.namespace, l->c.name, &cur,
	    &st) != 0) {
		log_kv(LOG_WARN, "leader election: cannot release the lease",
		    "lease", l->where, "identity", l->c.identity, "error",
		    st.message, NULL);
		goto out;
	}
	holder = spec_str(json_object_get(cur, "spec"), "holderIdentity");
	if (strcmp(holder, l->c.identity) != 0)
		goto out;		/* not ours anymore: nothing to give */
	next = leader_release_object(cur, wall_us());
	if (k8s_update(l->c.api, &K8S_LEASE, l->c.namespace, l->c.name, next,
	    NULL, &st) != 0) {
		log_kv(LOG_WARN, "leader election: cannot release the lease",
		    "lease", l->where, "identity", l->c.identity, "error",
		    st.message, NULL);
		goto out;
	}
	log_kv(LOG_INFO, "leader election: released", "lease", l->where,
	    "identity", l->c.identity, NULL);
out:
	json_decref(cur);
	json_decref(next);
	k8s_status_release(&st);
}

/* Stop the thread, release a Lease held, free. */
void
leader_stop(struct leader *l)
{
	if (l == NULL)
		return;
	pthread_mutex_lock(&l->mu);
	l->stopping = 1;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	pthread_join(l->thread, NULL);
	pthread_join(l->deadline, NULL);
	if (leader_state(l) == LEADER_LEADING)
		release(l);
	leader_free(l);
}
