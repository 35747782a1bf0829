/*
 * The admission's cache of the tasks that hold or want a slot, and the
 * admissions assumed until it shows them (see slots.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "controller/controller.h"
#include "controller/slots.h"
#include "k8s/k8s.h"
#include "util/util.h"

/* How long a decision waits for the task watch to reach its task. */
#define SYNC_WAIT_MS 3000

struct controller_slots {
	pthread_mutex_t mu;
	pthread_cond_t cv;	/* broadcast when the watch moves on */
	/*
	 * "ns/name" -> {"uid", "ns", "name", "slot" (CONTROLLER_SLOT_*),
	 * "wants" (would take a free slot), "ts" (creationTimestamp, unix
	 * s), "rv"}: the tasks that hold or want a slot
	 */
	json_t *live;
	/* "ns/name" -> {"uid", "rv", "deleted"}: left, as last observed */
	json_t *gone;
	json_t *assumed;	/* "ns/name" -> uid: admitted, not yet seen */
	int feeders;		/* task watches feeding the cache */
	int64_t synced;		/* the resourceVersion they reached */
	/*
	 * a list replaced the cache since the first of them started: until
	 * then their events do not move synced, since what they delivered
	 * so far is not everything up to it (a watch from scratch sends its
	 * ADDED events in the order of the names, not of their versions)
	 */
	int listed;
	int changed;		/* a slot changed since the last changes() */
	int look;		/* ... so that the queued should look again */
	int64_t holds, queued;	/* as the last changes() counted them */
	/*
	 * "ns/name" -> the resourceVersion its decision waited for, which
	 * the watch had not reached: changes() hands it out once it has
	 */
	json_t *waiting;
	int64_t behind_since;	/* monotonic ms: decisions wait; 0: not */
	int64_t behind_passes;	/* the passes that waited since then */
	/*
	 * the resourceVersion of the latest list (-1: none, or not an
	 * integer): it shows every task as it was then, so an observation
	 * no newer of a task it left out (deleted, or not wanting a slot,
	 * and its marker since dropped) is stale
	 */
	int64_t list_rv;
};

static const char *
jstr(const json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

static int
rv_num(const char *s, int64_t *out)
{
	long long v;
	char *end;

	if (s == NULL || *s < '0' || *s > '9')
		return 0;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return 0;
	*out = v;
	return 1;
}

/*
 * Whether resourceVersion a is older than b (-1), the same (0), or newer
 * or not comparable (1: accepted).
 */
static int
rv_cmp(const char *a, const char *b)
{
	int64_t x, y;

	if (streq(a, b))
		return 0;
	if (!rv_num(a, &x) || !rv_num(b, &y))
		return 1;
	return x < y ? -1 : x > y;
}

/* Whether a is known to be newer than b (both integers). */
static int
rv_after(const char *a, int64_t b)
{
	int64_t x;

	return rv_num(a, &x) && x > b;
}

/* The slot a task holds or waits for. */
int
controller_slot_of(const json_t *task)
{
	if (task == NULL)
		return 0;
	if (k8s_task_holds_slot(task))
		return CONTROLLER_SLOT_HOLDS;
	if (k8s_task_queued(task, NULL))
		return CONTROLLER_SLOT_QUEUED;
	return k8s_task_wants_slot(task) ? CONTROLLER_SLOT_WANTS : 0;
}

/* Whether a task would take a slot as soon as one is free. */
static int
wants(const json_t *t)
{
	const char *name = k8s_meta_str(t, "name");

	return name != NULL && strlen(name) <= CONTROLLER_NAME_MAX &&
	    k8s_task_wants_slot(t);
}

static int64_t
created(const json_t *t)
{
	int64_t ts;

	return time_parse_rfc3339(k8s_meta_str(t, "creationTimestamp"),
	    &ts) < 0 ? 0 : ts;
}

static json_t *
entry_new(const json_t *t, int slot)
{
	const char *rv = k8s_meta_str(t, "resourceVersion");

	return json_pack("{s:s,s:s,s:s,s:i,s:b,s:I,s:s}", "uid",
	    k8s_meta_str(t, "uid"), "ns", k8s_meta_str(t, "namespace"),
	    "name", k8s_meta_str(t, "name"), "slot", slot, "wants", wants(t),
	    "ts", (json_int_t)created(t), "rv", rv != NULL ? rv : "");
}

static json_t *
marker_new(const char *uid, const char *rv, int deleted)
{
	return json_pack("{s:s,s:s,s:b}", "uid", uid != NULL ? uid : "",
	    "rv", rv != NULL ? rv : "", "deleted", deleted);
}

static int
slot_of_entry(const json_t *e)
{
	return (int)json_integer_value(json_object_get(e, "slot"));
}

/* A change of slot from was to now; see controller_slots_changes. */
static void
moved(struct controller_slots *s, int was, int now)
{
	if (was == now)
		return;
	s->changed = 1;
	/* one more in the queue changes no place */
	if (was == CONTROLLER_SLOT_HOLDS || (now != CONTROLLER_SLOT_QUEUED &&
	    now != CONTROLLER_SLOT_WANTS))
		s->look = 1;
}

/* Drop the records whose task the cache no longer shows waiting. */
static void
prune_assumed(struct controller_slots *s)
{
	const char *k;
	json_t *uid, *e;
	void *tmp;

	json_object_foreach_safe(s->assumed, tmp, k, uid) {
		e = json_object_get(s->live, k);
		if (e == NULL || !streq(jstr(e, "uid"), json_string_value(uid))
		    || slot_of_entry(e) == CONTROLLER_SLOT_HOLDS ||
		    !json_is_true(json_object_get(e, "wants")))
			json_object_del(s->assumed, k);
	}
}

static void *
slots_new(void)
{
	struct controller_slots *s = xcalloc(1, sizeof(*s));

	pthread_mutex_init(&s->mu, NULL);
	time_cond_init(&s->cv);
	s->live = json_object();
	s->gone = json_object();
	s->assumed = json_object();
	s->waiting = json_object();
	s->list_rv = -1;
	return s;
}

static void
slots_free(void *arg)
{
	struct controller_slots *s = arg;

	if (s == NULL)
		return;
	json_decref(s->live);
	json_decref(s->gone);
	json_decref(s->assumed);
	json_decref(s->waiting);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

/* The store's cache. */
struct controller_slots *
controller_slots_of(struct k8s_api *store)
{
	return k8s_api_attachment(store, slots_new, slots_free);
}

/* Record a task as read or as a watch event carried it. */
int
controller_slots_observe(struct controller_slots *s, const json_t *task,
    int deleted)
{
	const char *ns = k8s_meta_str(task, "namespace");
	const char *name = k8s_meta_str(task, "name");
	const char *uid = k8s_meta_str(task, "uid");
	const char *rv = k8s_meta_str(task, "resourceVersion");
	const char *a;
	json_t *l, *g;
	int c = 1, was, now;
	int64_t at;
	char *key;

	if (ns == NULL || name == NULL || uid == NULL)
		return 1;
	key = xasprintf("%s/%s", ns, name);
	pthread_mutex_lock(&s->mu);
	l = json_object_get(s->live, key);
	g = json_object_get(s->gone, key);
	/* a deleted task never comes back: a later one has another uid */
	if (g != NULL && json_is_true(json_object_get(g, "deleted")) &&
	    streq(uid, jstr(g, "uid")) && !deleted)
		c = -1;
	else if (g != NULL)
		c = rv_cmp(rv, jstr(g, "rv"));
	if (c > 0 && l != NULL)
		c = rv_cmp(rv, jstr(l, "rv"));
	if (c > 0 && l == NULL && g == NULL && s->list_rv >= 0 &&
	    rv_num(rv, &at) && at <= s->list_rv)
		c = -1;		/* older than the list, which left it out */
	if (c <= 0)
		goto out;
	was = l != NULL ? slot_of_entry(l) : 0;
	now = deleted ? 0 : controller_slot_of(task);
	if (now != 0) {
		json_object_set_new(s->live, key, entry_new(task, now));
		json_object_del(s->gone, key);
	} else {
		/* a marker only for what the cache had: it stays small */
		if (l != NULL || g != NULL || deleted)
			json_object_set_new(s->gone, key, marker_new(uid, rv,
			    deleted));
		json_object_del(s->live, key);
	}
	a = jstr(s->assumed, key);
	if (a != NULL && (deleted ? streq(a, uid) : (!streq(a, uid) ||
	    now == CONTROLLER_SLOT_HOLDS || !wants(task))))
		json_object_del(s->assumed, key);
	moved(s, was, now);
out:
	pthread_mutex_unlock(&s->mu);
	free(key);
	return c;
}

/* A fresh read found no such task. */
void
controller_slots_not_found(struct controller_slots *s, const char *ns,
    const char *name)
{
	char *key = xasprintf("%s/%s", ns, name);
	json_t *l;

	pthread_mutex_lock(&s->mu);
	l = json_object_get(s->live, key);
	if (l != NULL) {
		/*
		 * not "deleted" (that uid for good): the read that found
		 * nothing may be older than a task made again under the name
		 * since, which the cache may hold now; only what is not newer
		 * than what it has stays out
		 */
		json_object_set_new(s->gone, key, marker_new(jstr(l, "uid"),
		    jstr(l, "rv"), 0));
		moved(s, slot_of_entry(l), 0);
		json_object_del(s->live, key);
	}
	json_object_del(s->assumed, key);
	pthread_mutex_unlock(&s->mu);
	free(key);
}

/* Replace the cache's content with a list. */
void
controller_slots_relist(struct controller_slots *s, const json_t *list)
{
	const char *lrv = k8s_meta_str(list, "resourceVersion");
	json_t *fresh = json_object(), *seen = json_object();
	json_t *dead = json_object(), *it, *l, *g;
	int64_t at = -1;
	const char *k;
	void *tmp;
	size_t i;
	int slot;

	if (!rv_num(lrv, &at))
		at = -1;
	pthread_mutex_lock(&s->mu);
	json_array_foreach(json_object_get(list, "items"), i, it) {
		const char *rv = k8s_meta_str(it, "resourceVersion");
		char *key;

		if (k8s_meta_str(it, "namespace") == NULL ||
		    k8s_meta_str(it, "name") == NULL)
			continue;
		key = xasprintf("%s/%s", k8s_meta_str(it, "namespace"),
		    k8s_meta_str(it, "name"));
		json_object_set_new(seen, key, json_true());
		l = json_object_get(s->live, key);
		g = json_object_get(s->gone, key);
		if (l != NULL && rv_cmp(rv, jstr(l, "rv")) < 0) {
			/* observed after the list was taken */
			json_object_set(fresh, key, l);
		} else if (g != NULL && (rv_cmp(rv, jstr(g, "rv")) < 0 ||
		    (json_is_true(json_object_get(g, "deleted")) &&
		    streq(k8s_meta_str(it, "uid"), jstr(g, "uid"))))) {
			;	/* left after the list was taken */
		} else if ((slot = controller_slot_of(it)) != 0) {
			json_object_set_new(fresh, key, entry_new(it, slot));
		}
		free(key);
	}
	json_object_foreach(s->live, k, l) {
		if (json_object_get(seen, k) != NULL)
			continue;
		if (rv_after(jstr(l, "rv"), at))
			json_object_set(fresh, k, l);	/* made since */
		else if (at >= 0)
			json_object_set_new(dead, k, marker_new(jstr(l, "uid"),
			    lrv, 1));
	}
	/* the markers the list makes useless go */
	json_object_foreach_safe(s->gone, tmp, k, g)
		if (at >= 0 && !rv_after(jstr(g, "rv"), at))
			json_object_del(s->gone, k);
	json_object_update(s->gone, dead);
	json_decref(s->live);
	s->live = fresh;
	prune_assumed(s);
	if (at > s->synced)
		s->synced = at;
	if (at > s->list_rv)
		s->list_rv = at;
	s->listed = 1;
	s->changed = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	json_decref(seen);
	json_decref(dead);
}

/* The watch reached rv. */
void
controller_slots_synced(struct controller_slots *s, int64_t rv)
{
	pthread_mutex_lock(&s->mu);
	if (s->listed && rv > s->synced) {
		s->synced = rv;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
}

/* A watch feeds the cache, or no longer. */
void
controller_slots_feed(struct controller_slots *s, int on)
{
	pthread_mutex_lock(&s->mu);
	/* a new watch: what the cache missed meanwhile comes with its list */
	if (on && s->feeders++ == 0)
		s->synced = s->listed = 0;
	else if (!on && --s->feeders == 0) {
		/* no decision waits now; a new watch's start looks at all */
		json_object_clear(s->waiting);
		s->behind_since = 0;
	}
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void
controller_slots_look(struct controller_slots *s)
{
	pthread_mutex_lock(&s->mu);
	s->look = 1;
	pthread_mutex_unlock(&s->mu);
}

/*
 * Hand the tasks whose decision waited for a version the watch has now
 * reached to *keys; when none waits any more, how long decisions waited
 * into *behind_ms (else -1).
 */
static void
reached(struct controller_slots *s, json_t **keys, int64_t *behind_ms)
{
	const char *k;
	json_t *v;
	void *tmp;

	*behind_ms = -1;
	json_object_foreach_safe(s->waiting, tmp, k, v) {
		if (json_integer_value(v) > s->synced)
			continue;
		if (*keys == NULL)
			*keys = json_array();
		json_array_append_new(*keys, json_string(k));
		json_object_del(s->waiting, k);
	}
	if (s->behind_since > 0 && json_object_size(s->waiting) == 0) {
		*behind_ms = now_mono_ms() - s->behind_since;
		s->behind_since = 0;
	}
}

/* What changed since the last call. */
void
controller_slots_changes(struct controller_slots *s, int *look,
    int64_t *holds, int64_t *queued, json_t **keys)
{
	char ms[24], n[24];
	int64_t behind_ms;
	const char *k;
	json_t *e;

	*keys = NULL;
	pthread_mutex_lock(&s->mu);
	*look = s->look;
	if (*look)
		*keys = json_array();
	/*
	 * else nothing moved: the last counts stand (the watch calls this
	 * for every event, a meter charge's included)
	 */
	if (s->changed || s->look) {
		s->holds = s->queued = 0;
		json_object_foreach(s->live, k, e) {
			if (slot_of_entry(e) == CONTROLLER_SLOT_HOLDS)
				s->holds++;
			else if (slot_of_entry(e) == CONTROLLER_SLOT_QUEUED) {
				s->queued++;
				if (*look)
					json_array_append_new(*keys,
					    json_string(k));
			}
		}
		s->look = s->changed = 0;
	}
	*holds = s->holds;
	*queued = s->queued;
	reached(s, keys, &behind_ms);
	snprintf(n, sizeof(n), "%" PRId64, s->behind_passes);
	pthread_mutex_unlock(&s->mu);
	if (behind_ms < 0)
		return;
	snprintf(ms, sizeof(ms), "%" PRId64, behind_ms);
	log_kv(LOG_INFO, "task watch caught up, admissions decide again",
	    "waited_ms", ms, "passes", n, NULL);
}

static int
strcmp_null(const char *a, const char *b)
{
	return strcmp(a != NULL ? a : "", b != NULL ? b : "");
}

/* The queue's order of entry e and task t: time, namespace, name. */
static int
queue_cmp(const json_t *e, const json_t *t)
{
	int64_t te = json_integer_value(json_object_get(e, "ts"));
	int64_t tt = created(t);
	int c;

	if (te != tt)
		return te < tt ? -1 : 1;
	c = strcmp_null(jstr(e, "ns"), k8s_meta_str(t, "namespace"));
	return c != 0 ? c : strcmp_null(jstr(e, "name"),
	    k8s_meta_str(t, "name"));
}

/* Decide an admission. */
int
controller_slots_admit(struct controller_slots *s, const json_t *task,
    int64_t limit, int force, int64_t wait_ms, int64_t *running,
    int64_t *ahead)
{
	const char *uid = k8s_meta_str(task, "uid");
	int64_t own = 0, run = 0, before = 0, at = -1, waits;
	char watch_rv[24], task_rv[24];
	struct timespec ts;
	const char *k;
	char *key;
	json_t *e;
	int rc, mine, numeric;

	key = xasprintf("%s/%s", k8s_meta_str(task, "namespace"),
	    k8s_meta_str(task, "name"));
	numeric = rv_num(k8s_meta_str(task, "resourceVersion"), &own);
	time_deadline(CLOCK_MONOTONIC, wait_ms > 0 ? wait_ms : SYNC_WAIT_MS,
	    &ts);
	pthread_mutex_lock(&s->mu);
	/*
	 * what the watch has not delivered yet may be an earlier task: wait
	 * until it reached what this pass read (an informer's consistent
	 * read); the event that woke the pass has mostly been seen already.
	 * A task that waits for it already holds no worker again.
	 */
	waits = json_integer_value(json_object_get(s->waiting, key));
	while (numeric && s->feeders > 0 && s->synced < own && waits < own &&
	    pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0)
		;
	if (numeric && s->feeders > 0 && s->synced < own) {
		if (json_integer_value(json_object_get(s->waiting, key)) < own)
			json_object_set_new(s->waiting, key,
			    json_integer(own));
		s->behind_passes++;
		if (s->behind_since == 0) {
			s->behind_since = now_mono_ms();
			s->behind_passes = 1;
			at = s->synced;
		}
		rc = CONTROLLER_SLOTS_BEHIND;
		goto out;
	}
	json_object_del(s->waiting, key);	/* decided */
	mine = force || streq(jstr(s->assumed, key), uid);
	json_object_foreach(s->live, k, e) {
		if (strcmp(k, key) == 0)
			continue;	/* itself */
		if (slot_of_entry(e) == CONTROLLER_SLOT_HOLDS ||
		    json_object_get(s->assumed, k) != NULL)
			run++;
		else if (json_is_true(json_object_get(e, "wants")) &&
		    queue_cmp(e, task) < 0)
			before++;
	}
	*ahead = before;
	if (mine || run + before < limit) {
		json_object_set_new(s->assumed, key, json_string(uid));
		*running = run + 1;
		rc = 1;
	} else {
		*running = run;
		rc = 0;
	}
out:
	pthread_mutex_unlock(&s->mu);
	if (at >= 0) {
		snprintf(watch_rv, sizeof(watch_rv), "%" PRId64, at);
		snprintf(task_rv, sizeof(task_rv), "%" PRId64, own);
		log_kv(LOG_WARN, "task watch behind, admissions wait for it",
		    "task", k8s_meta_str(task, "name"), "namespace",
		    k8s_meta_str(task, "namespace"), "watch_rv", watch_rv,
		    "task_rv", task_rv, NULL);
	}
	free(key);
	return rc;
}
