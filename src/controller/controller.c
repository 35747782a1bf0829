/*
 * The reconciler's machinery: watches that feed a de-duplicating work
 * queue, and the worker threads that drain it (client-go's workqueue
 * semantics: a key is in the queue once, and with one worker at a time).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "controller/controller.h"
#include "controller/slots.h"
#include "k8s/k8s.h"
#include "util/util.h"

#define BACKOFF_BASE_MS 5
#define BACKOFF_MAX_MS (5 * 60 * 1000)
#define WATCH_POLL_MS 250
/* a watch stream that ran this long before it broke was a healthy one */
#define WATCH_HEALTHY_MS 60000
#define MAX_WORKERS 64

/* ------------------------------------------------------------- queue */

struct qdelay {
	char *key;
	int64_t due;		/* monotonic ms */
};

struct controller_queue {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	json_t *dirty;		/* keys waiting (set) */
	json_t *processing;	/* keys a worker holds (set) */
	json_t *failures;	/* key -> consecutive failures */
	char **fifo;
	size_t head, len, cap;
	struct qdelay *delayed;
	size_t ndelayed;
	int shutdown;
};

/* Backoff for the n-th failure, with jitter. */
int64_t
controller_backoff_ms(unsigned n, uint32_t rnd)
{
	int64_t d = backoff_delay_ms(BACKOFF_BASE_MS, BACKOFF_MAX_MS,
	    n > 1 ? n - 1 : 0);

	/* between d/2 and d */
	return d / 2 + (int64_t)((uint64_t)(d - d / 2) * (rnd % 1025) /
	    1024);
}

/* Create a queue. */
struct controller_queue *
controller_queue_new(void)
{
	struct controller_queue *q = xcalloc(1, sizeof(*q));

	metrics_describe("diverge_workqueue_depth", METRIC_GAUGE,
	    "Keys waiting in a work queue (reconciler, notifier), as its "
	    "workers last saw it.");
	pthread_mutex_init(&q->mu, NULL);
	time_cond_init(&q->cv);
	q->dirty = json_object();
	q->processing = json_object();
	q->failures = json_object();
	return q;
}

/* Free a queue (no thread may use it any more). */
void
controller_queue_free(struct controller_queue *q)
{
	size_t i;

	if (q == NULL)
		return;
	for (i = 0; i < q->len; i++)
		free(q->fifo[(q->head + i) % q->cap]);
	free(q->fifo);
	for (i = 0; i < q->ndelayed; i++)
		free(q->delayed[i].key);
	free(q->delayed);
	json_decref(q->dirty);
	json_decref(q->processing);
	json_decref(q->failures);
	pthread_cond_destroy(&q->cv);
	pthread_mutex_destroy(&q->mu);
	free(q);
}

static void
push_locked(struct controller_queue *q, const char *key)
{
	if (q->len == q->cap) {
		size_t ncap = q->cap ? q->cap * 2 : 64, i;
		char **n = xcalloc(ncap, sizeof(*n));

		for (i = 0; i < q->len; i++)
			n[i] = q->fifo[(q->head + i) % q->cap];
		free(q->fifo);
		q->fifo = n;
		q->cap = ncap;
		q->head = 0;
	}
	q->fifo[(q->head + q->len) % q->cap] = xstrdup(key);
	q->len++;
	pthread_cond_signal(&q->cv);
}

static void
add_locked(struct controller_queue *q, const char *key)
{
	if (q->shutdown || json_object_get(q->dirty, key) != NULL)
		return;
	json_object_set_new(q->dirty, key, json_true());
	if (json_object_get(q->processing, key) != NULL)
		return;		/* done() queues it again */
	push_locked(q, key);
}

/* Add a key. */
void
controller_queue_add(struct controller_queue *q, const char *key)
{
	pthread_mutex_lock(&q->mu);
	add_locked(q, key);
	pthread_mutex_unlock(&q->mu);
}

/* Add a key later. */
void
controller_queue_add_after(struct controller_queue *q, const char *key,
    int64_t delay_ms)
{
	int64_t due = now_mono_ms() + delay_ms;
	size_t i;

	if (delay_ms <= 0) {
		controller_queue_add(q, key);
		return;
	}
	pthread_mutex_lock(&q->mu);
	for (i = 0; i < q->ndelayed; i++) {
		if (strcmp(q->delayed[i].key, key) != 0)
			continue;
		if (due < q->delayed[i].due)
			q->delayed[i].due = due;
		goto out;
	}
	q->delayed = xrealloc(q->delayed, (q->ndelayed + 1) *
	    sizeof(*q->delayed));
	q->delayed[q->ndelayed].key = xstrdup(key);
	q->delayed[q->ndelayed].due = due;
	q->ndelayed++;
	pthread_cond_broadcast(&q->cv);
out:
	pthread_mutex_unlock(&q->mu);
}

/* Add a key after its backoff. */
void
controller_queue_add_rate_limited(struct controller_queue *q,
    const char *key)
{
	uint32_t rnd = 0;
	unsigned n;

	pthread_mutex_lock(&q->mu);
	n = (unsigned)json_integer_value(json_object_get(q->failures, key)) +
	    1;
	json_object_set_new(q->failures, key, json_integer(n));
	pthread_mutex_unlock(&q->mu);
	random_bytes(&rnd, sizeof(rnd));
	controller_queue_add_after(q, key, controller_backoff_ms(n, rnd));
}

/* Reset a key's backoff. */
void
controller_queue_forget(struct controller_queue *q, const char *key)
{
	pthread_mutex_lock(&q->mu);
	json_object_del(q->failures, key);
	pthread_mutex_unlock(&q->mu);
}

/* Move due delayed keys; the next due time (or -1) into *next. */
static void
promote_locked(struct controller_queue *q, int64_t now, int64_t *next)
{
	size_t i = 0;

	*next = -1;
	while (i < q->ndelayed) {
		if (q->delayed[i].due <= now) {
			add_locked(q, q->delayed[i].key);
			free(q->delayed[i].key);
			q->delayed[i] = q->delayed[--q->ndelayed];
			continue;
		}
		if (*next < 0 || q->delayed[i].due < *next)
			*next = q->delayed[i].due;
		i++;
	}
}

/* Take the next key. */
char *
controller_queue_get(struct controller_queue *q, int64_t timeout_ms)
{
	int64_t end = now_mono_ms() + timeout_ms, now, next, until;
	char *key = NULL;

	pthread_mutex_lock(&q->mu);
	for (;;) {
		struct timespec ts;

		if (q->shutdown)
			break;	/* queued keys are relisted on the next start */
		now = now_mono_ms();
		promote_locked(q, now, &next);
		if (q->len > 0) {
			key = q->fifo[q->head];
			q->head = (q->head + 1) % q->cap;
			q->len--;
			json_object_del(q->dirty, key);
			json_object_set_new(q->processing, key, json_true());
			break;
		}
		if (now >= end)
			break;
		until = next >= 0 && next < end ? next : end;
		ts.tv_sec = until / 1000;
		ts.tv_nsec = (until % 1000) * 1000000;
		pthread_cond_timedwait(&q->cv, &q->mu, &ts);
	}
	pthread_mutex_unlock(&q->mu);
	return key;
}

/* Release a key a worker held. */
void
controller_queue_done(struct controller_queue *q, const char *key)
{
	pthread_mutex_lock(&q->mu);
	json_object_del(q->processing, key);
	if (json_object_get(q->dirty, key) != NULL && !q->shutdown)
		push_locked(q, key);
	pthread_mutex_unlock(&q->mu);
}

/* Keys waiting. */
size_t
controller_queue_len(struct controller_queue *q)
{
	size_t n;

	pthread_mutex_lock(&q->mu);
	n = q->len;
	pthread_mutex_unlock(&q->mu);
	return n;
}

/* Wake every waiter; get() then returns NULL. */
void
controller_queue_shutdown(struct controller_queue *q)
{
	pthread_mutex_lock(&q->mu);
	q->shutdown = 1;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

/* -------------------------------------------------------- controller */

struct watcher {
	struct controller *c;
	const struct k8s_resource *r;
	int is_task;
	pthread_t thread;
};

struct controller {
	struct controller_config cfg;
	struct controller_queue *q;
	struct watcher watchers[5];
	size_t nwatchers;
	pthread_t *workers;
	int nworkers;
	pthread_mutex_t mu;
	pthread_cond_t stop_cv;	/* broadcast when stop is set */
	int stop;
	uint64_t reconciles, errors, relists;
	/*
	 * The tasks that hold a slot or wait for one (the store's cache,
	 * which the admission decides on): the task watch feeds it
	 */
	struct controller_slots *slots;
	/*
	 * "ns/name" -> STALL_* bits of the tasks stalled: the condition
	 * Stalled (the task watcher's) or a status the API server refuses
	 * (the workers'), under mu
	 */
	json_t *stalled;
	/* the gauges of the slots as last set (the task watcher's) */
	int64_t holds_set, queued_set;
};

static int
stopping(struct controller *c)
{
	int s;

	pthread_mutex_lock(&c->mu);
	s = c->stop;
	pthread_mutex_unlock(&c->mu);
	return s;
}

/*
 * Wait ms, or less if the controller is stopped meanwhile: a watcher
 * backing off from an unreachable API server (up to minutes) must not
 * hold up a stop.
 */
static void
pause_unless_stopped(struct controller *c, int64_t ms)
{
	struct timespec ts;

	time_deadline(CLOCK_MONOTONIC, ms, &ts);
	pthread_mutex_lock(&c->mu);
	while (!c->stop && pthread_cond_timedwait(&c->stop_cv, &c->mu,
	    &ts) == 0)
		;
	pthread_mutex_unlock(&c->mu);
}

static void
enqueue_key(struct controller *c, const char *ns, const char *name)
{
	char *key;

	if (ns == NULL || name == NULL)
		return;
	key = xasprintf("%s/%s", ns, name);
	controller_queue_add(c->q, key);
	free(key);
}

/* Queue a task. */
void
controller_enqueue(struct controller *c, const char *ns, const char *name)
{
	enqueue_key(c, ns, name);
}

/*
 * After what the task watch (or a pass) showed of the slots: the gauges
 * of the tasks running and queued, and when a task took or left a slot,
 * or stopped waiting for one (queued or not yet: deleted, suspended), a
 * look again for the queued tasks at once: one may take a slot that
 * freed or move up, and the numbers their messages give moved.
 */
static void
slots_changed(struct controller *c)
{
	int64_t holds, queued;
	json_t *keys, *k;
	size_t i;
	int look;

	controller_slots_changes(c->slots, &look, &holds, &queued, &keys);
	if (holds != c->holds_set)
		metrics_set("diverge_tasks_active", "", (double)holds);
	if (queued != c->queued_set)
		metrics_set("diverge_tasks_queued", "", (double)queued);
	c->holds_set = holds;
	c->queued_set = queued;
	json_array_foreach(keys, i, k)
		controller_queue_add(c->q, json_string_value(k));
	json_decref(keys);
}

void
controller_limit_changed(struct controller *c)
{
	if (c != NULL)
		controller_slots_look(c->slots);
}

/* Why a task counts in diverge_tasks_stalled (bits of c->stalled). */
#define STALL_CONDITION 1	/* its condition Stalled is True */
#define STALL_STATUS 2		/* its status write is refused for good */

/*
 * Set or clear bit of key in the stalled set, with c->mu held; whether
 * the bit changed.
 */
static int
stall_bit_locked(struct controller *c, const char *key, int bit, int on)
{
	int was = (int)json_integer_value(json_object_get(c->stalled, key));
	int now = on ? was | bit : was & ~bit;

	if (now == was)
		return 0;
	if (now == 0)
		json_object_del(c->stalled, key);
	else
		json_object_set_new(c->stalled, key, json_integer(now));
	return 1;
}

static void
stalled_gauge_locked(struct controller *c)
{
	metrics_set("diverge_tasks_stalled", "",
	    (double)json_object_size(c->stalled));
}

/*
 * Record whether the task (NULL: deleted) is Stalled, for the gauge
 * diverge_tasks_stalled, which an operator alerts on: a stalled task
 * waits for someone to fix RBAC, a quota or a webhook. A task that goes
 * away leaves the set whatever the reason it was in. Called for every
 * task event (a meter charge's included): it does nothing while no task
 * is stalled and this one is not.
 */
static void
mark_stalled(struct controller *c, const char *ns, const char *name,
    const json_t *task)
{
	int stalled = task != NULL && k8s_task_stalled(task);
	char *key;

	if (ns == NULL || name == NULL)
		return;
	pthread_mutex_lock(&c->mu);
	if (stalled || json_object_size(c->stalled) > 0) {
		key = xasprintf("%s/%s", ns, name);
		if (task == NULL) {
			if (json_object_get(c->stalled, key) != NULL) {
				json_object_del(c->stalled, key);
				stalled_gauge_locked(c);
			}
		} else if (stall_bit_locked(c, key, STALL_CONDITION,
		    stalled)) {
			stalled_gauge_locked(c);
		}
		free(key);
	}
	pthread_mutex_unlock(&c->mu);
}

/* Whether the store says the task ns/name is not there (a 404). */
static int
task_gone(struct controller *c, const char *ns, const char *name)
{
	struct k8s_status st = { 0 };
	json_t *task = NULL;
	int rc;

	rc = k8s_get(c->cfg.store, &K8S_AGENTTASK, ns, name, &task, &st);
	json_decref(task);
	k8s_status_release(&st);
	return rc == K8S_ENOTFOUND;
}

/*
 * After a pass of the task key ("ns/name") that learnt its status write
 * went through (status 1) or was refused for good (-1, cause quoting the
 * API server): no Stalled condition can tell the second, so the task
 * counts in diverge_tasks_stalled until a write goes through or the
 * task goes away, and the change is logged once, not at every back-off
 * pass.
 */
static void
mark_status(struct controller *c, const char *ns, const char *name,
    int status, const char *cause)
{
	char *key;
	int changed;

	if (status == 0)
		return;
	key = xasprintf("%s/%s", ns, name);
	pthread_mutex_lock(&c->mu);
	changed = stall_bit_locked(c, key, STALL_STATUS, status < 0);
	if (changed)
		stalled_gauge_locked(c);
	pthread_mutex_unlock(&c->mu);
	/*
	 * The task may have been deleted since the pass read it, and the
	 * watcher, seeing it go, may have taken it out of the set before the
	 * bit above put it back. So a bit just set is checked against the
	 * store: a task gone now takes it out again, and one still there is
	 * taken out by its deletion's event, which comes after this read.
	 */
	if (changed && status < 0 && task_gone(c, ns, name)) {
		pthread_mutex_lock(&c->mu);
		if (json_object_get(c->stalled, key) != NULL) {
			json_object_del(c->stalled, key);
			stalled_gauge_locked(c);
		}
		pthread_mutex_unlock(&c->mu);
		changed = 0;
	}
	free(key);
	if (changed && status < 0)
		/* error, not warn: the task's own status cannot say it */
		log_kv(LOG_ERROR, "task status refused", "task", name,
		    "namespace", ns, "error", cause, NULL);
	else if (changed)
		log_kv(LOG_INFO, "task status no longer refused", "task", name,
		    "namespace", ns, NULL);
}

/*
 * The slot cache from a list of the tasks (a watch from scratch, a
 * resync), and every task queued when enqueue, but for the finished ones
 * that are settled (k8s_task_settled): a pass over one writes nothing,
 * its events and its children's bring it when something changes, and on
 * a cluster each costs five reads, for every finished task at every
 * resync. A list that fails is logged (-1): the watch's events still
 * feed the cache, but until a list replaced it admissions wait
 * (controller_slots_feed), so the caller tries again soon.
 */
static int
relist(struct controller *c, int enqueue)
{
	struct k8s_status st = { 0 };
	json_t *list = NULL, *it, *was;
	size_t i;

	if (k8s_list(c->cfg.store, &K8S_AGENTTASK, c->cfg.namespace, NULL,
	    &list, &st) < 0) {
		log_kv(LOG_WARN, "controller resync failed", "error",
		    st.message, NULL);
		k8s_status_release(&st);
		return -1;
	}
	if (enqueue)
		json_array_foreach(json_object_get(list, "items"), i, it)
			if (!k8s_task_settled(it) ||
			    controller_ttl_due(&c->cfg, it, now_unix()))
				enqueue_key(c, k8s_meta_str(it, "namespace"),
				    k8s_meta_str(it, "name"));
	/*
	 * the set afresh: a task not listed went away; one listed keeps
	 * the refusal of its status a pass saw
	 */
	pthread_mutex_lock(&c->mu);
	was = c->stalled;
	c->stalled = json_object();
	json_array_foreach(json_object_get(list, "items"), i, it) {
		char *key = xasprintf("%s/%s", k8s_meta_str(it, "namespace"),
		    k8s_meta_str(it, "name"));
		int bits = (int)json_integer_value(json_object_get(was, key)) &
		    STALL_STATUS;

		if (k8s_task_stalled(it))
			bits |= STALL_CONDITION;
		if (bits != 0)
			json_object_set_new(c->stalled, key,
			    json_integer(bits));
		free(key);
	}
	stalled_gauge_locked(c);
	pthread_mutex_unlock(&c->mu);
	json_decref(was);
	controller_slots_relist(c->slots, list);
	slots_changed(c);
	json_decref(list);
	return 0;
}

static void
handle_event(struct watcher *w, struct k8s_event *ev)
{
	const json_t *o = ev->object;
	const char *ns = k8s_meta_str(o, "namespace");

	if (ev->type == K8S_BOOKMARK || ev->type == K8S_ERROR)
		return;
	if (w->is_task) {
		(void)controller_slots_observe(w->c->slots, o,
		    ev->type == K8S_DELETED);
		slots_changed(w->c);
		mark_stalled(w->c, ns, k8s_meta_str(o, "name"),
		    ev->type == K8S_DELETED ? NULL : o);
		if (ev->type == K8S_DELETED) {
			if (w->c->cfg.test_hook != NULL)
				w->c->cfg.test_hook(w->c->cfg.test_arg,
				    "deleted");
			controller_task_deleted(&w->c->cfg, o);
			return;
		}
		enqueue_key(w->c, ns, k8s_meta_str(o, "name"));
		return;
	}
	enqueue_key(w->c, ns, json_string_value(json_object_get(
	    json_object_get(json_object_get(o, "metadata"), "labels"),
	    CONTROLLER_LABEL_TASK)));
}

/*
 * The watcher's wait after n failures in a row (a watch refused or
 * broken, or its list from scratch): 160 to 320 ms, doubling up to 5
 * minutes (the upper end), with jitter.
 */
static int64_t
watch_backoff_ms(unsigned n)
{
	uint32_t rnd = 0;

	random_bytes(&rnd, sizeof(rnd));
	return controller_backoff_ms(n < 12 ? n + 6 : 18, rnd);
}

/* When to try again a list from scratch that failed n times. */
static int64_t
list_retry_at(unsigned n)
{
	return now_mono_ms() + watch_backoff_ms(n);
}

/*
 * One resource: watch from the last resourceVersion seen; after a broken
 * stream resume from there, after 410 Gone watch from scratch (the
 * synthetic ADDED events relist everything, so no work is lost).
 */
static void *
watch_main(void *arg)
{
	struct watcher *w = arg;
	struct controller *c = w->c;
	int64_t last_resync = now_mono_ms(), resync_ms = c->cfg.resync_ms;
	int64_t next_list = 0;	/* > 0: the list from scratch is owed */
	unsigned failures = 0, list_failures = 0;
	int64_t rv = 0;		/* where the watch goes on from (0: scratch) */
	char rvs[32];

	thread_name("ctrl-watch");
	while (!stopping(c)) {
		struct k8s_list_opts lo;
		struct k8s_status st = { 0 };
		struct k8s_watch *wt = NULL;
		int64_t opened;
		int rc, broke = 0;

		memset(&lo, 0, sizeof(lo));
		if (!w->is_task)
			lo.label_selector = CONTROLLER_LABEL_TASK;
		snprintf(rvs, sizeof(rvs), "%lld", (long long)rv);
		lo.resource_version = rv > 0 ? rvs : NULL;
		rc = k8s_watch(c->cfg.store, w->r, c->cfg.namespace, &lo, &wt,
		    &st);
		if (rc < 0) {
			if (rc == K8S_EGONE) {
				rv = 0;
				pthread_mutex_lock(&c->mu);
				c->relists++;
				pthread_mutex_unlock(&c->mu);
			}
			k8s_status_release(&st);
			pause_unless_stopped(c, watch_backoff_ms(++failures));
			continue;
		}
		opened = now_mono_ms();
		/*
		 * from scratch (at start, after 410 Gone): the ADDED events
		 * tell every task's slot again, but a task deleted while the
		 * watch was behind has none to tell, and they come one by
		 * one: the slot cache is made again at once from a list taken
		 * now (the events then bring nothing older)
		 */
		if (w->is_task && rv == 0) {
			list_failures = 0;
			next_list = relist(c, 0) < 0 ? list_retry_at(
			    ++list_failures) : 0;
		}
		for (;;) {
			struct k8s_event ev;

			memset(&ev, 0, sizeof(ev));
			if (c->cfg.test_hook != NULL)
				c->cfg.test_hook(c->cfg.test_arg, "watch");
			rc = k8s_watch_next(wt, WATCH_POLL_MS, &ev, &st);
			if (rc < 0 || stopping(c)) {
				/* an event that came with the stop is dropped */
				json_decref(ev.object);
				break;
			}
			if (w->is_task && now_mono_ms() - last_resync >=
			    resync_ms) {
				last_resync = now_mono_ms();
				if (relist(c, 1) == 0)
					next_list = 0;
			} else if (w->is_task && next_list > 0 &&
			    now_mono_ms() >= next_list) {
				/* not at the next resync: admissions wait */
				next_list = relist(c, 0) < 0 ? list_retry_at(
				    ++list_failures) : 0;
			}
			if (w->is_task)
				slots_changed(c);	/* a pass's too */
			if (rc == 0)
				continue;
			failures = 0;
			/*
			 * the resume point only moves forward: the ADDED
			 * events of a watch from scratch come in the order
			 * of the names, and show the state as of the newest
			 * of them, not as of the last
			 */
			if (ev.rv > rv)
				rv = ev.rv;
			handle_event(w, &ev);
			json_decref(ev.object);
			/* bookmarks too: every change up to it was seen */
			if (w->is_task && ev.rv > 0)
				controller_slots_synced(c->slots, ev.rv);
		}
		if (rc == K8S_EGONE) {
			log_kv(LOG_INFO, "controller watch expired, relisting",
			    "resource", w->r->plural, NULL);
			rv = 0;
			pthread_mutex_lock(&c->mu);
			c->relists++;
			pthread_mutex_unlock(&c->mu);
		} else if (rc < 0 && !stopping(c)) {
			log_kv(LOG_WARN, "controller watch broke", "resource",
			    w->r->plural, "error", st.message, NULL);
			broke = 1;
		}
		k8s_status_release(&st);
		k8s_watch_free(wt);
		/*
		 * A broken stream (an ERROR event, or the client's own
		 * retries spent) is watched again after a back-off, as
		 * client-go's reflector does: one that breaks the moment it
		 * opens would otherwise be a loop of watches and lists. A
		 * stream that ran a while counts as a success.
		 */
		if (broke) {
			if (now_mono_ms() - opened >= WATCH_HEALTHY_MS)
				failures = 0;
			pause_unless_stopped(c, watch_backoff_ms(++failures));
		}
	}
	return NULL;
}

static void *
worker_main(void *arg)
{
	struct controller *c = arg;
	char *key;

	thread_name("ctrl-worker");
	for (;;) {
		char *slash, *cause = NULL;
		int64_t requeue = -1, t0;
		int rc, status = 0;

		key = controller_queue_get(c->q, 1000);
		if (key == NULL) {
			if (stopping(c))
				break;
			continue;
		}
		metrics_set("diverge_workqueue_depth", "queue=\"reconciler\"",
		    (double)controller_queue_len(c->q));
		slash = strchr(key, '/');
		if (slash == NULL) {
			controller_queue_done(c->q, key);
			free(key);
			continue;
		}
		*slash = '\0';
		t0 = now_mono_ms();
		rc = controller_reconcile(&c->cfg, key, slash + 1, &requeue,
		    &status, &cause);
		if (status < 0 && c->cfg.test_hook != NULL)
			c->cfg.test_hook(c->cfg.test_arg, "refused");
		mark_status(c, key, slash + 1, status, cause);
		metrics_observe("diverge_reconcile_duration_seconds", "",
		    (double)(now_mono_ms() - t0) / 1000.0);
		metrics_inc("diverge_reconciles_total", rc < 0 ?
		    "result=\"error\"" : requeue >= 0 ?
		    "result=\"requeue\"" : "result=\"success\"", 1);
		*slash = '/';
		pthread_mutex_lock(&c->mu);
		c->reconciles++;
		if (rc < 0)
			c->errors++;
		pthread_mutex_unlock(&c->mu);
		if (rc < 0) {
			log_kv(LOG_WARN, "reconcile failed", "task", key,
			    "error", cause, NULL);
			controller_queue_add_rate_limited(c->q, key);
			if (requeue >= 0)	/* the earlier of the two */
				controller_queue_add_after(c->q, key, requeue);
		} else {
			controller_queue_forget(c->q, key);
			if (requeue >= 0)
				controller_queue_add_after(c->q, key, requeue);
		}
		free(cause);
		controller_queue_done(c->q, key);
		free(key);
	}
	return NULL;
}

/* Start the controller. */
int
controller_start(struct controller **out,
    const struct controller_config *cfg, char **cause)
{
	static const struct k8s_resource *const kinds[] = {
		&K8S_AGENTTASK, &K8S_SECRET, &K8S_SANDBOX, &K8S_SANDBOXCLAIM,
		&K8S_ENVIRONMENT
	};
	struct controller *c;
	size_t i;
	int n;

	if (cfg->store == NULL || cfg->meter == NULL || cfg->cfg == NULL) {
		*cause = xstrdup("controller: store, meter and config are "
		    "required");
		return -1;
	}
	n = cfg->workers > 0 ? cfg->workers : cfg->cfg->controller.workers;
	if (n < 1)
		n = 1;
	if (n > MAX_WORKERS)
		n = MAX_WORKERS;
	metrics_describe("diverge_reconciles_total", METRIC_COUNTER,
	    "AgentTask reconciles, by result (success, requeue: success with "
	    "a later look asked for, error: retried with back-off).");
	metrics_describe("diverge_reconcile_duration_seconds",
	    METRIC_HISTOGRAM, "Duration of one AgentTask reconcile.");
	metrics_describe("diverge_agenttask_phase_transitions_total",
	    METRIC_COUNTER, "AgentTask phase changes made by the reconciler, "
	    "by the phase entered.");
	metrics_describe("diverge_tasks_active", METRIC_GAUGE, "AgentTasks "
	    "that hold a slot of controller.max_active_tasks (Provisioning, "
	    "Active, Pausing).");
	metrics_describe("diverge_tasks_queued", METRIC_GAUGE, "AgentTasks "
	    "waiting for a slot of controller.max_active_tasks (Pending, or "
	    "Paused to resume, with reason Queued).");
	metrics_describe("diverge_agenttasks_expired_total", METRIC_COUNTER,
	    "Finished AgentTasks deleted by controller.ttl_after_finished.");
	metrics_describe("diverge_tasks_stalled", METRIC_GAUGE, "AgentTasks "
	    "whose reconcile the API server refuses for good (condition "
	    "Stalled: RBAC, a quota, an admission webhook); each fails after "
	    "5 minutes, unless it is suspended or already finished. Also "
	    "those whose status it refuses, which no condition can tell "
	    "(logged once: 'task status refused').");
	metrics_set("diverge_tasks_active", "", 0);
	metrics_set("diverge_tasks_queued", "", 0);
	metrics_set("diverge_tasks_stalled", "", 0);
	metrics_inc("diverge_agenttasks_expired_total", "", 0);
	{
		static const char *const results[] = { "result=\"success\"",
		    "result=\"requeue\"", "result=\"error\"", NULL };

		metrics_zero("diverge_reconciles_total", results);
	}
	c = xcalloc(1, sizeof(*c));
	c->cfg = *cfg;
	if (c->cfg.resync_ms <= 0)
		c->cfg.resync_ms = CONTROLLER_RESYNC_MS;
	pthread_mutex_init(&c->mu, NULL);
	time_cond_init(&c->stop_cv);
	c->q = controller_queue_new();
	c->slots = controller_slots_of(cfg->store);
	c->stalled = json_object();
	controller_slots_feed(c->slots, 1);
	c->workers = xcalloc((size_t)n, sizeof(*c->workers));
	for (i = 0; i < ARRAY_SIZE(kinds); i++) {
		struct watcher *w = &c->watchers[c->nwatchers];

		if (kinds[i] == &K8S_SANDBOXCLAIM &&
		    !cfg->cfg->sandbox.warm_pool)
			continue;
		if (kinds[i] == &K8S_SANDBOX && cfg->cfg->sandbox.warm_pool)
			continue;
		w->c = c;
		w->r = kinds[i];
		w->is_task = kinds[i] == &K8S_AGENTTASK;
		if (pthread_create(&w->thread, NULL, watch_main, w) != 0)
			goto fail;
		c->nwatchers++;
	}
	for (; c->nworkers < n; c->nworkers++)
		if (pthread_create(&c->workers[c->nworkers], NULL, worker_main,
		    c) != 0)
			goto fail;
	*out = c;
	return 0;
fail:
	*cause = xstrdup("controller: cannot start a thread");
	controller_stop(c);
	return -1;
}

/* Stop the controller. */
void
controller_stop(struct controller *c)
{
	size_t i;
	int k;

	if (c == NULL)
		return;
	pthread_mutex_lock(&c->mu);
	c->stop = 1;
	pthread_cond_broadcast(&c->stop_cv);
	pthread_mutex_unlock(&c->mu);
	for (i = 0; i < c->nwatchers; i++)
		pthread_join(c->watchers[i].thread, NULL);
	/* passes no longer wait for the watch (the store keeps the cache) */
	controller_slots_feed(c->slots, 0);
	controller_queue_shutdown(c->q);
	for (k = 0; k < c->nworkers; k++)
		pthread_join(c->workers[k], NULL);
	controller_queue_free(c->q);
	json_decref(c->stalled);
	free(c->workers);
	pthread_cond_destroy(&c->stop_cv);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/* Counters. */
uint64_t
controller_reconciles(struct controller *c, uint64_t *errors)
{
	uint64_t n;

	pthread_mutex_lock(&c->mu);
	n = c->reconciles;
	if (errors != NULL)
		*errors = c->errors;
	pthread_mutex_unlock(&c->mu);
	return n;
}

/* Relists. */
uint64_t
controller_relists(struct controller *c)
{
	uint64_t n;

	pthread_mutex_lock(&c->mu);
	n = c->relists;
	pthread_mutex_unlock(&c->mu);
	return n;
}
