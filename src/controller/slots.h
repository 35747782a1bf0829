/*
 * The admission's view of the tasks (controller.max_active_tasks), kept
 * inside the controller module (the watch in controller.c feeds it, the
 * reconcile in reconcile.c decides on it).
 *
 * A cache of only the tasks that hold a slot or want one, keyed by
 * "ns/name": uid, slot, creationTimestamp and resourceVersion, as the
 * task watch and its relists (controller.c) and each pass's own read of
 * its task (reconcile.c) show them, the way controller-runtime reads from
 * its informer's cache. An observation older than the one cached is
 * ignored (resourceVersions compared as integers when both are, as on
 * the embedded store and an etcd-backed cluster; otherwise accepted), and
 * a task that left, deleted or no longer wanting a slot, leaves a marker
 * with its uid and resourceVersion so that a stale observation does not
 * bring it back (a deleted uid never comes back at all); a relist drops
 * the markers it makes useless, and an observation no newer than the
 * latest list of a task that list left out is stale too.
 *
 * An admission is decided under the cache's lock from its entries (cost:
 * the tasks holding or wanting a slot, never every task ever made) and is
 * assumed (kube-scheduler's assume, Kueue's): the task counts as running
 * until the cache itself observes it, the same uid, in a slot, or no
 * longer wanting one (suspended, finished, deleted, made again under its
 * name), not when its status write returns, which the cache may not have
 * seen yet. A pass that fails after its decision so keeps its record.
 *
 * While the task watch feeds the cache, a decision waits for it to have
 * delivered the task as its pass read it (an informer's consistent read:
 * a later task never overtakes an earlier one the watch has not shown
 * yet). A watch far behind (a slow API server, a burst of events) is not
 * a failure of the task: the pass makes no decision and asks to be
 * looked at again, which the cache does as soon as the watch reaches the
 * version it waited for (controller_slots_changes), whether by an event,
 * a bookmark or a list, so a free slot does not wait for a back-off; the
 * log says once that decisions wait, and once that the watch caught up.
 *
 * The cache belongs to the store (k8s_api_attachment): unit tests and
 * benchmarks that call controller_reconcile without a controller use it
 * too, fed by the passes alone.
 */
#ifndef DIVERGE_CONTROLLER_SLOTS_H
#define DIVERGE_CONTROLLER_SLOTS_H

#include <stdint.h>

#include <jansson.h>

struct k8s_api;
struct controller_slots;

/*
 * controller_slots_admit's answer when the watch has not reached the
 * task: no decision; the pass asks for another look after
 * CONTROLLER_SLOTS_RECHECK_MS at the latest, a safety net, since the
 * cache asks for it as soon as the watch gets there.
 */
#define CONTROLLER_SLOTS_BEHIND 2
#define CONTROLLER_SLOTS_RECHECK_MS (10 * 1000)

/* What a task does with the slots (controller_slot_of). */
#define CONTROLLER_SLOT_HOLDS 1		/* Provisioning, Active, Pausing */
#define CONTROLLER_SLOT_QUEUED 2	/* waits, status.reason Queued */
#define CONTROLLER_SLOT_WANTS 3		/* waits, not (yet) said queued */

/* The slot task holds or waits for: CONTROLLER_SLOT_* or 0 (NULL: 0). */
int controller_slot_of(const json_t *task);

/* The cache of store, made on first use and freed with the store. */
struct controller_slots *controller_slots_of(struct k8s_api *store);

/*
 * Record task as read or as a watch event carried it (deleted: the
 * object of a DELETED event). 1 when it was taken, 0 when the cache had
 * that very version already, -1 when the cache knows a later one (the
 * observation is ignored).
 */
int controller_slots_observe(struct controller_slots *s, const json_t *task,
    int deleted);
/*
 * A fresh read found no task ns/name: what the cache has of it is gone,
 * up to the version it had (not its uid for good, as a DELETED event
 * does: the read may be older than a task made again under the name).
 */
void controller_slots_not_found(struct controller_slots *s, const char *ns,
    const char *name);
/*
 * Replace what the cache has with list (a task list, as k8s_list makes
 * it), keeping what it observed after the list was taken, and drop the
 * markers older than the list.
 */
void controller_slots_relist(struct controller_slots *s, const json_t *list);
/*
 * The task watch saw every change up to resourceVersion rv; taken only
 * once a list replaced the cache (controller_slots_feed).
 */
void controller_slots_synced(struct controller_slots *s, int64_t rv);
/*
 * A task watch starts (on 1) or stops (on 0) feeding the cache. While
 * one does, a decision first waits for the watch to reach the version
 * of the task it decides on (see controller_slots_admit); the first one
 * to start is taken to have reached nothing until a list replaced the
 * cache (controller_slots_relist), whatever its events say: the caller
 * lists again when that list fails.
 */
void controller_slots_feed(struct controller_slots *s, int on);

/*
 * Make the queued tasks look again at the next controller_slots_changes
 * (the limit changed).
 */
void controller_slots_look(struct controller_slots *s);

/*
 * Whether a change since the last call should make the queued tasks look
 * again (a task took or left a slot, or stopped waiting for one) into
 * *look, the tasks holding a slot and those queued into *holds and
 * *queued, and into *keys (a new array, or NULL when none) the tasks to
 * look at again: the queued ones when *look, and those whose decision
 * waited for the watch to reach a version it has now reached.
 */
void controller_slots_changes(struct controller_slots *s, int *look,
    int64_t *holds, int64_t *queued, json_t **keys);

/*
 * Decide whether task (just observed, and not stale) may
 * take a slot of limit (> 0): admitted (1) when its own record stands
 * (an earlier pass was admitted and failed) or force (its own Sandbox
 * runs for the current run), or when the tasks holding a slot or
 * admitted and those wanting one ahead of it in the queue
 * (creationTimestamp, namespace, name) are fewer than limit; the record
 * is then made. Queued (0) otherwise. *running gets the tasks running
 * (with it when admitted), *ahead those waiting ahead. While a watch
 * feeds the cache, the decision first waits up to wait_ms (0: 3 s) for
 * it to reach the task's resourceVersion; CONTROLLER_SLOTS_BEHIND when
 * it does not (the task is then handed to controller_slots_changes once
 * it has, and a decision on the same version meanwhile does not wait
 * again).
 */
int controller_slots_admit(struct controller_slots *s, const json_t *task,
    int64_t limit, int force, int64_t wait_ms, int64_t *running,
    int64_t *ahead);

#endif
