/*
 * controller: the embedded AgentTask reconciler (DESIGN.md sections 4, 5).
 *
 * It watches AgentTasks and the children they own (token Secret, Sandbox
 * or SandboxClaim, Environment) through the resource API, feeds a work
 * queue keyed by "namespace/name" (de-duplicated, one worker per key at a
 * time, exponential backoff with jitter from 5 ms to 5 min on errors,
 * periodic resync) and runs a level-based, idempotent reconcile on N
 * worker threads.
 *
 * Reconcile is split in two: a pure part computes, from the task and the
 * observed children, the desired children and the desired status; the
 * apply part creates or updates only what differs (so an unchanged state
 * writes nothing), refuses objects that this task does not own (never
 * adopts: the conflict is reported in the Ready condition and
 * status.message), and writes the task with its resourceVersion, starting
 * again from a fresh read on 409.
 *
 * Names (one per task T): Secret "T-token" (data.token = the macaroon,
 * annotation divergedev.com/token-id), Sandbox "T" (agents.x-k8s.io
 * v1beta1; its workspace PVC is "workspace-T"; the same annotation names
 * the token its pod was started with, and another live token restarts
 * it, unless the Secret records that token as extended by the live one),
 * or in warm-pool mode a SandboxClaim "T" (extensions.agents.x-k8s.io
 * v1beta1, pool CONTROLLER_WARM_POOL; its env carries the token, which
 * its controller applies only when it makes the Sandbox, so the live one
 * is also written into the container env of the Sandbox it bound, with
 * the same annotation, and the same restart while a pod may hold
 * another); Environment "agent-preview-T"; and
 * per namespace the NetworkPolicy "diverge-sandbox-isolation" (shared by
 * the tasks of the namespace, so it carries no owner reference; it is
 * labelled app.kubernetes.io/managed-by=diverged and never taken over
 * otherwise).
 *
 * With controller.max_active_tasks (N > 0) at most N tasks hold a slot
 * (Provisioning, Active, Pausing): a task leaves Pending, or Paused when
 * it resumes, only when it is among the first of the waiting tasks (by
 * creationTimestamp, then namespace/name) that fit the free slots, else
 * it stays, with status.reason Queued and its place in status.message.
 * The workers decide one admission at a time, on a cache of the tasks
 * that hold or want a slot (slots.h: fed by the task watch and by each
 * pass's own read of its task, never a list of every task), and a task
 * admitted counts as running until that cache shows it in its slot or
 * no longer waiting for one (so also when the pass fails after the
 * decision). After a restart, a task whose own Sandbox already runs for
 * its current run is admitted again whatever the queue. When the cache
 * shows a task leave a slot or stop waiting for one (queued or not yet),
 * the queued tasks are reconciled again. A decision waits for the task
 * watch to have delivered the task as its pass read it; a watch far
 * behind is no failure of the task (no back-off): its pass decides
 * nothing and the task is reconciled again as soon as the watch gets
 * there (slots.h).
 *
 * status.activeSeconds holds the seconds of the closed Provisioning/Active
 * periods; the open one started at the lastTransitionTime of the
 * TokenIssued condition (True exactly while the task is live), so the
 * timeout check needs no extra field and no periodic status writes.
 */
#ifndef DIVERGE_CONTROLLER_H
#define DIVERGE_CONTROLLER_H

#include <stdint.h>

#include <jansson.h>

struct config;
struct k8s_api;
struct meter;

#define CONTROLLER_LABEL_TASK "divergedev.com/task"
#define CONTROLLER_LABEL_MANAGED "app.kubernetes.io/managed-by"
#define CONTROLLER_ANN_TOKEN_ID "divergedev.com/token-id"
/*
 * On the token Secret: the id of the live token that the one it holds
 * extends (a later expiry for a raised timeout, written in place: the
 * pod reads the new one from its Secret volume, neither is revoked and
 * the Sandbox is not restarted).
 */
#define CONTROLLER_ANN_TOKEN_EXTENDS "divergedev.com/token-extends"
#define CONTROLLER_NETPOL "diverge-sandbox-isolation"
#define CONTROLLER_WARM_POOL "diverge-agent-pool"
/*
 * The longest task name: every child carries it as the value of
 * CONTROLLER_LABEL_TASK, and a label value holds at most 63 characters.
 */
#define CONTROLLER_NAME_MAX 63
/*
 * A ReconcilerError of the Sandbox lasting this long fails the task, and
 * so does a task stalled this long: every pass refused by the API server
 * for good (400, 403, 404, 415, 422: RBAC, a quota, an admission webhook,
 * a missing namespace or CRD), condition Stalled, reason ReconcileError.
 */
#define CONTROLLER_ERROR_GRACE_S 300
#define CONTROLLER_REASON_STALLED "ReconcileError"
/*
 * Added to the task timeout for the token's expires caveat. A live token
 * with less than half of it left after the time the task would time out
 * (its timeout was raised) is extended to that time plus all of it.
 */
#define CONTROLLER_TOKEN_SLACK_S 3600
/* The periodic resync, when controller_config.resync_ms is 0. */
#define CONTROLLER_RESYNC_MS (10 * 60 * 1000)

struct controller_config {
	struct k8s_api *store;		/* borrowed */
	struct meter *meter;		/* borrowed: mints and revokes */
	const struct config *cfg;	/* borrowed: sandbox.*, preview.*,
					 * meter.public_url, defaults.*,
					 * controller.workers and
					 * max_active_tasks */
	const char *namespace;		/* watch one namespace; NULL: all */
	int workers;			/* 0: cfg->controller.workers */
	int64_t resync_ms;		/* 0: CONTROLLER_RESYNC_MS */
	/*
	 * Tests only: how long an admission waits, in its pass, for the task
	 * watch to reach the task (controller_slots_admit); 0: 3 s.
	 */
	int64_t sync_wait_ms;
	/* tests only: SIGKILL the process after this many child writes */
	int crash_after_writes;
	/*
	 * Tests only: called at named points, "status" before a task status
	 * write, "delete" before a finished task's deletion, "watch"
	 * before each wait for a watch event, "deleted" when the task
	 * watcher sees a task go, and "refused" after a pass whose status
	 * write was refused for good, before the worker counts it.
	 */
	void (*test_hook)(void *arg, const char *point);
	void *test_arg;
};

struct controller;

/*
 * Start the watches and the workers. cfg and what it points to must
 * outlive the controller. 0, or -1 with a new message in *cause.
 */
int controller_start(struct controller **out,
    const struct controller_config *cfg, char **cause);
/*
 * Stop the watches, let the workers finish the keys they hold (keys still
 * queued are dropped: the next start relists them), free. NULL is fine.
 */
void controller_stop(struct controller *c);
/*
 * controller.max_active_tasks changed (SIGHUP; both limits above 0, the
 * new one already in the configuration): the queued tasks look again.
 */
void controller_limit_changed(struct controller *c);
/* Queue a task for reconcile (e.g. after a slash command). */
void controller_enqueue(struct controller *c, const char *ns,
    const char *name);
/* Reconciles run so far, and those that ended in an error. */
uint64_t controller_reconciles(struct controller *c, uint64_t *errors);
/* Watches started again from scratch after 410 Gone (relists). */
uint64_t controller_relists(struct controller *c);

/*
 * One reconcile of task ns/name, synchronously, on the calling thread
 * (the workers call this; tests and benchmarks call it directly). A
 * missing task is fine (0). On success *requeue_ms (may be NULL) gets the
 * delay after which the task wants another look (a timeout or a grace
 * period running, an admission that waits for the task watch), or -1
 * for none. A negative enum k8s_err, with a new
 * message in *cause (may be NULL), when a read or write failed: retry
 * with backoff, or after *requeue_ms when that is not -1 and sooner (the
 * end of a stalled task's grace). *status (may be NULL) gets what the
 * pass learnt of the task's status subresource: 1 when its last write
 * went through (or the stored status was already as wanted, or the task
 * is gone: nothing is left to write), -1 when the
 * API server refused it for good (RBAC without agenttasks/status, an
 * admission webhook: no Stalled condition can then be written, so the
 * caller tells; *cause quotes the refusal), 0 when no write was tried or
 * it failed for now.
 */
int controller_reconcile(const struct controller_config *cfg,
    const char *ns, const char *name, int64_t *requeue_ms, int *status,
    char **cause);

/*
 * Whether the finished task's controller.ttl_after_finished ends before
 * the next resync from now (unix seconds): its pass asked for no look
 * that far ahead, so the resync queues it.
 */
int controller_ttl_due(const struct controller_config *cfg,
    const json_t *task, int64_t now);

/*
 * Revoke the live token of a task that was deleted (the object as the
 * DELETED event carried it). The watch calls this.
 */
void controller_task_deleted(const struct controller_config *cfg,
    const json_t *task);

/* ---- the work queue (exposed for tests) ---- */

struct controller_queue;

struct controller_queue *controller_queue_new(void);
void controller_queue_free(struct controller_queue *q);
/* Add key now; a key already waiting is not added twice. */
void controller_queue_add(struct controller_queue *q, const char *key);
/* Add key after delay_ms (a sooner pending add wins). */
void controller_queue_add_after(struct controller_queue *q, const char *key,
    int64_t delay_ms);
/* Add key after its backoff; every call doubles the next one. */
void controller_queue_add_rate_limited(struct controller_queue *q,
    const char *key);
/* Reset key's backoff. */
void controller_queue_forget(struct controller_queue *q, const char *key);
/*
 * The next key (a new string), waiting up to timeout_ms; NULL on timeout
 * or shutdown. The key is then processing: a second add of it waits until
 * controller_queue_done(), so one worker has a key at a time.
 */
char *controller_queue_get(struct controller_queue *q, int64_t timeout_ms);
void controller_queue_done(struct controller_queue *q, const char *key);
/* Keys waiting now (not delayed, not processing). */
size_t controller_queue_len(struct controller_queue *q);
/* Refuse new keys and make every get() return NULL. */
void controller_queue_shutdown(struct controller_queue *q);

/*
 * The backoff after the n-th consecutive failure (n >= 1): 5 ms doubled
 * n - 1 times, at most 5 minutes, then scaled by a jitter factor between
 * 0.5 and 1 taken from rnd.
 */
int64_t controller_backoff_ms(unsigned n, uint32_t rnd);

#endif
