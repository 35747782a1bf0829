/*
 * The embedded backend: Kubernetes semantics on SQLite.
 *
 * Objects live in one table of the state database, keyed by resource,
 * namespace and name, as the JSON the API returns. A single global counter
 * gives every write its resourceVersion. One writer thread applies every
 * write: callers queue an operation and wait; the writer runs all queued
 * operations in one transaction (each in a savepoint, so one failing does
 * not undo the others), commits and syncs once, then publishes their watch
 * events and wakes the callers (group commit). Reads use a small pool of
 * reader connections (WAL: readers never block the writer).
 *
 * Watch events are kept in memory, in resourceVersion order, for a window
 * (10,000 events or one hour by default). A watcher behind the window gets
 * K8S_EGONE and relists, as with kube-apiserver.
 *
 * Metrics (process-wide: one store a daemon): each group commit, from
 * BEGIN to its synced COMMIT, in diverge_store_commit_seconds (whose
 * count is diverge_store_commits_total), the writes it committed in
 * diverge_store_committed_ops_total, the events in the watch window in
 * diverge_store_watch_window_events. The writer updates them with a few
 * relaxed atomics a commit: no lock, no allocation on its hot path.
 */
#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "k8s/k8s.h"
#include "util/util.h"

#define READERS 4

/* A commit syncs: from a tenth of a millisecond (a fast disk) up. */
static const double commit_bounds[] = {
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10
};
static struct metrics_hist commit_hist = METRICS_HIST_INIT(commit_bounds);
static atomic_uint_fast64_t committed_ops;
static atomic_uint_fast64_t window_events;

enum op_kind {
	OP_CREATE,
	OP_UPDATE,
	OP_UPDATE_STATUS,
	OP_PATCH,
	OP_PATCH_STATUS,
	OP_DELETE,
	OP_TXN
};

struct op {
	struct op *next;
	enum op_kind kind;
	const struct k8s_resource *r;
	const char *ns;
	const char *name;
	const json_t *in;
	enum k8s_propagation policy;	/* OP_DELETE */
	const char *pre_uid, *pre_rv;	/* OP_DELETE: preconditions */
	int dry;		/* checked and answered, then rolled back */
	k8s_txn_fn fn;		/* OP_TXN */
	void *arg;
	json_t *out;
	int rc;
	struct k8s_status st;
	int done;
	pthread_cond_t cv;	/* its caller waits here */
	k8s_txn_done_fn done_fn;	/* or, for an async op, this is called */
	void *done_arg;
	struct op *anext;	/* the async ops of a batch */
};

struct event {
	int64_t rv;
	int64_t at_ms;
	enum k8s_event_type type;
	const struct k8s_resource *r;
	char *ns;
	json_t *obj;		/* shared, never modified after publish */
	size_t bytes;		/* obj's size as stored */
	/*
	 * MODIFIED: the version it replaced (shared, as obj), which tells
	 * the watchers whose selection the change left or entered; else
	 * NULL. Mostly the obj of an earlier event: it costs a reference.
	 */
	json_t *prev;
};

struct reader {
	sqlite3 *db;
	int busy;
};

struct embedded {
	struct k8s_api api;	/* first: the ops pointer */
	struct k8s_api dry;	/* k8s_embedded_dry_run(): the dry-run view */
	struct k8s_embedded_config cfg;
	char *path;
	sqlite3 *wdb;
	struct reader readers[READERS];

	pthread_mutex_t mu;
	pthread_cond_t wcond;	/* writer waits for ops */
	pthread_cond_t rcond;	/* reader pool */
	pthread_cond_t econd;	/* watchers wait for events */
	struct op *ops, **ops_tail;
	int stopping;
	pthread_t writer;
	int writer_running;
	int64_t rv;		/* last committed resourceVersion */
	uint64_t writes;

	struct event *ring;	/* circular, contiguous rvs */
	size_t rhead, rlen, rcap;
	size_t rbytes;		/* the bytes of their objects */

	/* the writer's copies of committed objects (writer thread only) */
	struct ocache_ent **oc;
	size_t oc_n;
};

/*
 * The writer parses an object it reads at most once: it keeps the
 * committed version of what it stored or loaded (the very object published
 * with the commit, never changed afterwards), hands it out shared to the
 * code that only reads it (load_ref) and as a copy to the code that edits
 * it (load), and forgets everything when a write is rolled back. Bounded:
 * when full it starts over.
 */
#define OCACHE_BUCKETS 1024
#define OCACHE_MAX 1024

struct ocache_ent {
	struct ocache_ent *next;
	char *key;
	json_t *obj;
};

struct ewatch {
	struct k8s_watch w;	/* first: the api pointer */
	struct embedded *e;
	const struct k8s_resource *r;
	char *ns;
	struct k8s_selector *labels;
	struct k8s_selector *fields;
	int64_t cursor;		/* last rv looked at */
	int64_t told;		/* last rv handed out (event or bookmark) */
	json_t *initial;	/* synthetic ADDED objects, in order */
	size_t initial_next;
};

static const struct k8s_ops embedded_ops;
static struct k8s_ops embedded_dry_ops;

/* The store of api, its own or its dry-run view (then *dry = 1). */
static struct embedded *
emb(struct k8s_api *api, int *dry)
{
	int is_dry = api->ops == &embedded_dry_ops;

	if (dry != NULL)
		*dry = is_dry;
	return is_dry ? (struct embedded *)(void *)((char *)api -
	    offsetof(struct embedded, dry)) : (struct embedded *)api;
}

/* ------------------------------------------------------------ helpers */

static int
exec_sql(sqlite3 *db, const char *sql)
{
	return db_exec(db, sql, NULL);
}

static char *
okey(const char *rk, const char *ns, const char *name)
{
	return xasprintf("%s\x1f%s\x1f%s", rk, ns, name);
}

static struct ocache_ent **
oslot(struct embedded *e, const char *key)
{
	uint32_t h = 2166136261u;
	const unsigned char *p;
	struct ocache_ent **pe;

	for (p = (const unsigned char *)key; *p; p++)
		h = (h ^ *p) * 16777619u;
	for (pe = &e->oc[h % OCACHE_BUCKETS]; *pe != NULL;
	    pe = &(*pe)->next)
		if (strcmp((*pe)->key, key) == 0)
			break;
	return pe;
}

static void
ocache_clear(struct embedded *e)
{
	size_t i;

	for (i = 0; e->oc != NULL && i < OCACHE_BUCKETS; i++)
		while (e->oc[i] != NULL) {
			struct ocache_ent *n = e->oc[i]->next;

			free(e->oc[i]->key);
			json_decref(e->oc[i]->obj);
			free(e->oc[i]);
			e->oc[i] = n;
		}
	e->oc_n = 0;
}

/* Keep obj (taken) as the committed copy of key; NULL forgets it. */
static void
ocache_set(struct embedded *e, const char *key, json_t *obj)
{
	struct ocache_ent **pe;

	if (e->oc == NULL)
		e->oc = xcalloc(OCACHE_BUCKETS, sizeof(*e->oc));
	pe = oslot(e, key);
	if (*pe != NULL) {
		json_decref((*pe)->obj);
		if (obj != NULL) {
			(*pe)->obj = obj;
			return;
		}
		{
			struct ocache_ent *gone = *pe;

			*pe = gone->next;
			free(gone->key);
			free(gone);
			e->oc_n--;
		}
		return;
	}
	if (obj == NULL)
		return;
	if (e->oc_n >= OCACHE_MAX) {
		ocache_clear(e);
		pe = oslot(e, key);
	}
	*pe = xcalloc(1, sizeof(**pe));
	(*pe)->key = xstrdup(key);
	(*pe)->obj = obj;
	e->oc_n++;
}

static int
open_db(const char *path, sqlite3 **out, char **cause)
{
	return db_open(path, 0, out, cause);
}

static const char *
rkey(const struct k8s_resource *r)
{
	return k8s_qualified_plural(r);
}

static char *
new_uid(void)
{
	unsigned char b[16];
	char h[33];

	random_bytes(b, sizeof(b));
	b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
	b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
	hex_encode(b, 16, h);
	return xasprintf("%.8s-%.4s-%.4s-%.4s-%.12s", h, h + 8, h + 12,
	    h + 16, h + 20);
}

static char *
rv_string(int64_t rv)
{
	return xasprintf("%lld", (long long)rv);
}

/* Everything but metadata and status: what bumps generation. */
static int
spec_equal(const json_t *a, const json_t *b)
{
	const char *k;
	json_t *v;
	size_t na = 0, nb = 0;

	/* every top-level member but metadata and status, both ways */
	json_object_foreach((json_t *)a, k, v) {
		if (strcmp(k, "metadata") == 0 || strcmp(k, "status") == 0)
			continue;
		na++;
		if (!json_equal(v, json_object_get(b, k)))
			return 0;
	}
	json_object_foreach((json_t *)b, k, v)
		if (strcmp(k, "metadata") != 0 && strcmp(k, "status") != 0)
			nb++;
	return na == nb;
}

static json_t *
meta(json_t *obj)
{
	json_t *m = json_object_get(obj, "metadata");

	if (!json_is_object(m)) {
		m = json_object();
		json_object_set_new(obj, "metadata", m);
	}
	return m;
}

/* ------------------------------------------------------------ storage */

/*
 * The committed object, shared (the caller gets a reference and must not
 * change it): from the writer's cache, else read and parsed once.
 */
static int
load_ref(struct embedded *e, const struct k8s_resource *r, const char *ns,
    const char *name, json_t **out)
{
	sqlite3_stmt *st;
	char *key = okey(rkey(r), ns, name);
	struct ocache_ent **pe = e->oc != NULL ? oslot(e, key) : NULL;
	json_t *obj;
	int rc;

	if (pe != NULL && *pe != NULL) {
		free(key);
		*out = json_incref((*pe)->obj);
		return 0;
	}
	st = db_stmt(e->wdb, "SELECT body FROM objects WHERE rkey = ?1 AND"
	    " namespace = ?2 AND name = ?3");
	if (st == NULL) {
		free(key);
		return K8S_EINTERNAL;
	}
	sqlite3_bind_text(st, 1, rkey(r), -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, ns, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, name, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		obj = json_loadb((const char *)sqlite3_column_blob(st, 0),
		    (size_t)sqlite3_column_bytes(st, 0), 0, NULL);
		sqlite3_reset(st);
		if (obj == NULL) {
			free(key);
			return K8S_EINTERNAL;
		}
		ocache_set(e, key, json_incref(obj));
		free(key);
		*out = obj;
		return 0;
	}
	sqlite3_reset(st);
	free(key);
	return rc == SQLITE_DONE ? K8S_ENOTFOUND : K8S_EINTERNAL;
}

/* The committed object, a private copy. */
static int
load(struct embedded *e, const struct k8s_resource *r, const char *ns,
    const char *name, json_t **out)
{
	json_t *obj;
	int rc = load_ref(e, r, ns, name, &obj);

	if (rc < 0)
		return rc;
	*out = json_deep_copy(obj);
	json_decref(obj);
	return *out != NULL ? 0 : K8S_EINTERNAL;
}

/*
 * Write obj; prev is the version it replaces (NULL: a new object); *bytes
 * gets the size written.
 */
static int
store(struct embedded *e, const struct k8s_resource *r, const char *ns,
    const json_t *obj, const json_t *prev, size_t *bytes)
{
	sqlite3_stmt *st;
	const json_t *owners;
	size_t i;
	json_t *o;
	char *body = json_dump_compact(obj, bytes);
	const char *name = k8s_meta_str(obj, "name");
	const char *uid = k8s_meta_str(obj, "uid");
	int ok;

	st = db_stmt(e->wdb, "INSERT INTO objects (rkey, namespace, name, uid,"
	    " rv, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT"
	    " (rkey, namespace, name) DO UPDATE SET rv = ?5, body = ?6");
	if (st == NULL || body == NULL) {
		free(body);
		return K8S_EINTERNAL;
	}
	sqlite3_bind_text(st, 1, rkey(r), -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, ns, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, name, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 4, uid, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 5, k8s_resource_version(obj));
	sqlite3_bind_text(st, 6, body, -1, SQLITE_STATIC);
	ok = sqlite3_step(st) == SQLITE_DONE;
	sqlite3_reset(st);
	free(body);
	if (!ok)
		return K8S_EINTERNAL;
	{
		/* obj is published with the commit and never changed again */
		char *key = okey(rkey(r), ns, name);

		ocache_set(e, key, json_incref((json_t *)obj));
		free(key);
	}
	owners = json_object_get(json_object_get(obj, "metadata"),
	    "ownerReferences");
	/* the owner index: rewritten for this object when they changed */
	if (prev != NULL && json_equal((json_t *)owners,
	    json_object_get(json_object_get(prev, "metadata"),
	    "ownerReferences")))
		return 0;
	if (prev != NULL && owners == NULL && json_object_get(json_object_get(
	    prev, "metadata"), "ownerReferences") == NULL)
		return 0;
	st = db_stmt(e->wdb, "DELETE FROM owners WHERE rkey = ?1 AND"
	    " namespace = ?2 AND name = ?3");
	if (st == NULL)
		return K8S_EINTERNAL;
	sqlite3_bind_text(st, 1, rkey(r), -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, ns, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, name, -1, SQLITE_STATIC);
	ok = sqlite3_step(st) == SQLITE_DONE;
	sqlite3_reset(st);
	if (!ok)
		return K8S_EINTERNAL;
	json_array_foreach((json_t *)owners, i, o) {
		const char *ouid = json_string_value(json_object_get(o,
		    "uid"));

		if (ouid == NULL)
			continue;
		st = db_stmt(e->wdb, "INSERT OR IGNORE INTO owners (owner_uid,"
		    " rkey, namespace, name) VALUES (?1, ?2, ?3, ?4)");
		if (st == NULL)
			return K8S_EINTERNAL;
		sqlite3_bind_text(st, 1, ouid, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, rkey(r), -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, ns, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 4, name, -1, SQLITE_STATIC);
		ok = sqlite3_step(st) == SQLITE_DONE;
		sqlite3_reset(st);
		if (!ok)
			return K8S_EINTERNAL;
	}
	return 0;
}

static int
erase(struct embedded *e, const struct k8s_resource *r, const char *ns,
    const char *name)
{
	static const char *const sql[] = {
		"DELETE FROM objects WHERE rkey = ?1 AND namespace = ?2 AND"
		" name = ?3",
		"DELETE FROM owners WHERE rkey = ?1 AND namespace = ?2 AND"
		" name = ?3",
	};
	char *key = okey(rkey(r), ns, name);
	size_t i;

	ocache_set(e, key, NULL);
	free(key);
	for (i = 0; i < ARRAY_SIZE(sql); i++) {
		sqlite3_stmt *st = db_stmt(e->wdb, sql[i]);
		int ok;

		if (st == NULL)
			return K8S_EINTERNAL;
		sqlite3_bind_text(st, 1, rkey(r), -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, ns, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, name, -1, SQLITE_STATIC);
		ok = sqlite3_step(st) == SQLITE_DONE;
		sqlite3_reset(st);
		if (!ok)
			return K8S_EINTERNAL;
	}
	return 0;
}

/* ------------------------------------------------------------- writes */

/* Pending events of the running batch (published after commit). */
struct batch {
	struct event *ev;
	size_t n, cap;
	int64_t rv;		/* last rv handed out */
};

static void
event_release(struct event *ev)
{
	free(ev->ns);
	json_decref(ev->obj);
	json_decref(ev->prev);
}

/*
 * Record an event; prev: the version a MODIFIED replaces, else NULL;
 * bytes: obj's size as stored.
 */
static void
batch_event(struct batch *b, enum k8s_event_type type,
    const struct k8s_resource *r, const char *ns, json_t *obj,
    const json_t *prev, size_t bytes)
{
	if (b->n == b->cap) {
		b->cap = b->cap ? b->cap * 2 : 64;
		b->ev = xrealloc(b->ev, b->cap * sizeof(*b->ev));
	}
	b->ev[b->n].rv = k8s_resource_version(obj);
	b->ev[b->n].at_ms = now_mono_ms();
	b->ev[b->n].type = type;
	b->ev[b->n].r = r;
	b->ev[b->n].ns = xstrdup(ns);
	b->ev[b->n].obj = json_incref(obj);
	b->ev[b->n].bytes = bytes;
	b->ev[b->n].prev = json_incref((json_t *)prev);
	b->n++;
}

/* The size of obj as store() writes it, for an object it does not write. */
static size_t
stored_size(const json_t *obj)
{
	size_t n = 0;

	free(json_dump_compact(obj, &n));
	return n;
}

static void
batch_truncate(struct batch *b, size_t n)
{
	while (b->n > n)
		event_release(&b->ev[--b->n]);
}

static void
set_rv_to(json_t *obj, int64_t v)
{
	char rv[24];

	snprintf(rv, sizeof(rv), "%lld", (long long)v);
	json_object_set_new(meta(obj), "resourceVersion", json_string(rv));
}

static void
set_rv(json_t *obj, struct batch *b)
{
	set_rv_to(obj, ++b->rv);
}

static int
bad_request(struct k8s_status *st, const char *msg)
{
	return k8s_status_set(st, K8S_EBADREQUEST, msg, NULL);
}

/*
 * What one deletion reaches, each object once (by resource, namespace and
 * name): the walk below goes through it in order and adds dependents at
 * the end, so ownerReferences that form a cycle end it instead of looping.
 */
struct doomed {
	const struct k8s_resource *r;
	char *ns, *name;
	char *key;		/* okey() */
};

struct doom_list {
	struct doomed *v;
	size_t n, cap;
};

/* Whether the object of key (okey()) is in l; l may be NULL. */
static int
doom_has(const struct doom_list *l, const char *key)
{
	size_t i;

	for (i = 0; l != NULL && i < l->n; i++)
		if (strcmp(l->v[i].key, key) == 0)
			return 1;
	return 0;
}

static void
doom_add(struct doom_list *l, const struct k8s_resource *r, const char *ns,
    const char *name)
{
	char *key = okey(rkey(r), ns, name);

	if (doom_has(l, key)) {
		free(key);
		return;
	}
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 8;
		l->v = xrealloc(l->v, l->cap * sizeof(*l->v));
	}
	l->v[l->n].r = r;
	l->v[l->n].ns = xstrdup(ns);
	l->v[l->n].name = xstrdup(name);
	l->v[l->n].key = key;
	l->n++;
}

static void
doom_release(struct doom_list *l)
{
	size_t i;

	for (i = 0; i < l->n; i++) {
		free(l->v[i].ns);
		free(l->v[i].name);
		free(l->v[i].key);
	}
	free(l->v);
}

static int has_finalizers(const json_t *);
static int delete_tree(struct embedded *, struct batch *,
    const struct k8s_resource *, const char *, const char *,
    enum k8s_propagation, const json_t *, json_t **);

/*
 * Whether the owner an ownerReference of an object in ns names exists
 * (its uid, not only its name) and is not being deleted (in doomed, which
 * may be NULL): 1 or 0, or K8S_EINTERNAL. An owner of a kind this store
 * does not keep, or without a name, is not ours to judge: it lives.
 */
static int
owner_live(struct embedded *e, const char *ns, const json_t *ref,
    const struct doom_list *doomed)
{
	const char *ouid = json_string_value(json_object_get(ref, "uid"));
	const char *av = json_string_value(json_object_get(ref, "apiVersion"));
	const char *kind = json_string_value(json_object_get(ref, "kind"));
	const char *name = json_string_value(json_object_get(ref, "name"));
	const struct k8s_resource *owner_r = NULL;
	json_t *owner = NULL;
	char *key;
	int k, rc, live;

	for (k = 0; av != NULL && kind != NULL && k8s_resources[k] != NULL;
	    k++)
		if (strcmp(k8s_resources[k]->kind, kind) == 0 &&
		    strcmp(k8s_api_version(k8s_resources[k]), av) == 0)
			owner_r = k8s_resources[k];
	if (owner_r == NULL || name == NULL)
		return 1;
	if (!owner_r->namespaced)
		ns = "";
	key = okey(rkey(owner_r), ns, name);
	live = !doom_has(doomed, key);
	free(key);
	if (!live)
		return 0;
	/* the owner by its name, then its uid (a PK read, cached) */
	rc = load_ref(e, owner_r, ns, name, &owner);
	if (rc < 0 && rc != K8S_ENOTFOUND)
		return K8S_EINTERNAL;
	live = rc == 0 && ouid != NULL && k8s_meta_str(owner, "uid") != NULL &&
	    strcmp(k8s_meta_str(owner, "uid"), ouid) == 0;
	json_decref(owner);
	return live;
}

/*
 * Whether obj (in ns) has a live owner (owner_live) among its
 * ownerReferences with a uid other than skip_uid (may be NULL): 1 or 0, or
 * K8S_EINTERNAL. *named (may be NULL) gets how many were looked at.
 */
static int
has_live_owner(struct embedded *e, const char *ns, const json_t *obj,
    const char *skip_uid, const struct doom_list *doomed, size_t *named)
{
	const json_t *owners = json_object_get(json_object_get(obj,
	    "metadata"), "ownerReferences");
	size_t i, n = 0;
	json_t *o;
	int rc = 0;

	json_array_foreach((json_t *)owners, i, o) {
		const char *ouid = json_string_value(json_object_get(o,
		    "uid"));

		if (ouid == NULL || (skip_uid != NULL &&
		    strcmp(ouid, skip_uid) == 0))
			continue;
		n++;
		rc = owner_live(e, ns, o, doomed);
		if (rc != 0)
			break;
	}
	if (named != NULL)
		*named = n;
	return rc;
}

/*
 * The garbage collector's rule for dangling owners: an object whose
 * ownerReferences all name uids that no longer exist goes away (a real
 * cluster's GC does it shortly after; here it happens in the same
 * transaction). This is what keeps a reconcile that raced with the
 * deletion of its owner from leaving a child behind. 1: collected.
 */
static int
collect_orphan(struct embedded *e, struct batch *b,
    const struct k8s_resource *r, const char *ns, const json_t *obj)
{
	size_t named;
	int rc = has_live_owner(e, ns, obj, NULL, NULL, &named);

	if (rc != 0 || named == 0)
		return rc < 0 ? rc : 0;
	rc = delete_tree(e, b, r, ns, k8s_meta_str(obj, "name"),
	    K8S_PROPAGATE_BACKGROUND, NULL, NULL);
	return rc < 0 ? rc : 1;
}

/* Fill the server-owned fields of a new object. */
static int
do_create(struct embedded *e, struct op *op, struct batch *b)
{
	const struct k8s_resource *r = op->r;
	json_t *obj, *m, *cur = NULL;
	const char *name, *gen, *ons, *av, *kind;
	char ts[32];
	char *uid;
	size_t bytes = 0;
	int rc;

	if (!json_is_object(op->in))
		return bad_request(&op->st, "the body is not a JSON object");
	obj = json_deep_copy(op->in);
	m = meta(obj);
	av = json_string_value(json_object_get(obj, "apiVersion"));
	kind = json_string_value(json_object_get(obj, "kind"));
	if ((av != NULL && strcmp(av, k8s_api_version(r)) != 0) ||
	    (kind != NULL && strcmp(kind, r->kind) != 0)) {
		json_decref(obj);
		return bad_request(&op->st, "apiVersion or kind does not "
		    "match the resource of the request");
	}
	ons = json_string_value(json_object_get(m, "namespace"));
	if (ons != NULL && *ons && strcmp(ons, op->ns) != 0) {
		json_decref(obj);
		return bad_request(&op->st, "the namespace of the provided "
		    "object does not match the namespace sent on the request");
	}
	name = json_string_value(json_object_get(m, "name"));
	gen = json_string_value(json_object_get(m, "generateName"));
	if ((name == NULL || *name == '\0') && gen != NULL) {
		static const char alnum[] = "bcdfghjklmnpqrstvwxz2456789";
		unsigned char rnd[5];
		char suffix[6];
		int i;

		random_bytes(rnd, sizeof(rnd));
		for (i = 0; i < 5; i++)
			suffix[i] = alnum[rnd[i] % (sizeof(alnum) - 1)];
		suffix[5] = '\0';
		json_object_set_new(m, "name", json_sprintf("%s%s", gen,
		    suffix));
		name = json_string_value(json_object_get(m, "name"));
	}
	json_object_set_new(obj, "apiVersion",
	    json_string(k8s_api_version(r)));
	json_object_set_new(obj, "kind", json_string(r->kind));
	json_object_set_new(m, "namespace", json_string(op->ns));
	if (r->has_status)
		json_object_del(obj, "status");
	json_object_del(m, "deletionTimestamp");
	rc = k8s_validate(r, obj, &op->st);
	if (rc < 0) {
		json_decref(obj);
		return rc;
	}
	rc = load_ref(e, r, op->ns, name, &cur);
	if (rc == 0) {
		json_decref(cur);
		rc = k8s_error_exists(&op->st, r, name);
		json_decref(obj);
		return rc;
	}
	if (rc != K8S_ENOTFOUND) {
		json_decref(obj);
		return k8s_status_set(&op->st, rc, "store read failed", NULL);
	}
	uid = new_uid();
	json_object_set_new(m, "uid", json_string(uid));
	free(uid);
	time_rfc3339(now_unix(), ts);
	json_object_set_new(m, "creationTimestamp", json_string(ts));
	if (r->generation)
		json_object_set_new(m, "generation", json_integer(1));
	else
		json_object_del(m, "generation");
	set_rv(obj, b);
	rc = store(e, r, op->ns, obj, NULL, &bytes);
	if (rc < 0) {
		json_decref(obj);
		return k8s_status_set(&op->st, rc, "store write failed", NULL);
	}
	batch_event(b, K8S_ADDED, r, op->ns, obj, NULL, bytes);
	op->out = obj;
	rc = collect_orphan(e, b, r, op->ns, obj);
	if (rc < 0)
		return k8s_status_set(&op->st, rc, "store write failed", NULL);
	return 0;
}

/* obj[key] = s, leaving an equal string as it is. */
static void
set_str(json_t *obj, const char *key, const char *s)
{
	const char *cur = json_string_value(json_object_get(obj, key));

	if (cur == NULL || strcmp(cur, s) != 0)
		json_object_set_new(obj, key, json_string(s));
}

/*
 * Replace cur by next: keep the server-owned fields, bump generation when
 * the spec changed, validate, store, record the event.
 */
static int
commit_object(struct embedded *e, struct op *op, struct batch *b,
    json_t *cur, json_t *next, int status_only)
{
	const struct k8s_resource *r = op->r;
	/* cur is shared (the writer's cache): read, never changed */
	json_t *m = meta(next), *cm = json_object_get(cur, "metadata");
	static const char *const owned[] = { "uid", "creationTimestamp",
	    "generation", "namespace", "name", "deletionTimestamp",
	    "deletionGracePeriodSeconds" };
	int64_t gen = json_integer_value(json_object_get(cm, "generation"));
	size_t i, bytes = 0;
	int rc;

	rc = k8s_validate_update(r, cur, next, &op->st);
	if (rc < 0)
		return rc;
	for (i = 0; i < ARRAY_SIZE(owned); i++) {
		json_t *v = json_object_get(cm, owned[i]);

		/* next is mostly cur's values (a status write): kept as is */
		if (v != NULL && json_object_get(m, owned[i]) != v)
			json_object_set(m, owned[i], v);
		else if (v == NULL)
			json_object_del(m, owned[i]);
	}
	set_str(next, "apiVersion", k8s_api_version(r));
	set_str(next, "kind", r->kind);
	if (!r->generation)
		/* none, as on a cluster (also dropped from an older store's) */
		json_object_del(m, "generation");
	else if (!status_only && !spec_equal(cur, next))
		json_object_set_new(m, "generation", json_integer(gen + 1));
	rc = k8s_validate(r, next, &op->st);
	if (rc < 0)
		return rc;
	/* nothing changed: no write, no event (as the apiserver does) */
	json_object_set(m, "resourceVersion", json_object_get(cm,
	    "resourceVersion"));
	if (json_equal(cur, next)) {
		op->out = json_incref(next);
		return 0;
	}
	if (json_object_get(m, "deletionTimestamp") != NULL &&
	    !has_finalizers(next)) {
		/* the last finalizer is done: the deletion ends */
		rc = delete_tree(e, b, r, op->ns, op->name,
		    K8S_PROPAGATE_BACKGROUND, next, &op->out);
		if (rc < 0)
			return k8s_status_set(&op->st, rc, "store write "
			    "failed", NULL);
		return 0;
	}
	set_rv(next, b);
	rc = store(e, r, op->ns, next, cur, &bytes);
	if (rc < 0)
		return k8s_status_set(&op->st, rc, "store write failed", NULL);
	batch_event(b, K8S_MODIFIED, r, op->ns, next, cur, bytes);
	op->out = json_incref(next);
	rc = collect_orphan(e, b, r, op->ns, next);
	if (rc < 0)
		return k8s_status_set(&op->st, rc, "store write failed", NULL);
	return 0;
}

static int
check_rv(struct op *op, const json_t *cur, const json_t *in, int required)
{
	const char *want = k8s_meta_str(in, "resourceVersion");

	if (want == NULL || *want == '\0')
		return required ? k8s_error_rv_required(&op->st, op->r,
		    op->name) : 0;
	if (strcmp(want, k8s_meta_str(cur, "resourceVersion")) != 0)
		return k8s_error_conflict(&op->st, op->r, op->name);
	return 0;
}

static int
do_modify(struct embedded *e, struct op *op, struct batch *b)
{
	const struct k8s_resource *r = op->r;
	json_t *cur = NULL, *next = NULL;
	const char *pname;
	int rc, status_only = op->kind == OP_UPDATE_STATUS ||
	    op->kind == OP_PATCH_STATUS;

	if (!json_is_object(op->in))
		return bad_request(&op->st, "the body is not a JSON object");
	if (status_only && !r->has_status)
		return k8s_error_notfound(&op->st, r, op->name);
	rc = load_ref(e, r, op->ns, op->name, &cur);
	if (rc == K8S_ENOTFOUND)
		return k8s_error_notfound(&op->st, r, op->name);
	if (rc < 0)
		return k8s_status_set(&op->st, rc, "store read failed", NULL);
	/* a PUT: unconditional for built-in kinds only, as in the apiserver */
	rc = check_rv(op, cur, op->in, (op->kind == OP_UPDATE ||
	    op->kind == OP_UPDATE_STATUS) && !k8s_resource_builtin(r));
	if (rc < 0)
		goto out;
	pname = k8s_meta_str(op->in, "name");
	if ((op->kind == OP_UPDATE || op->kind == OP_UPDATE_STATUS) &&
	    pname != NULL && strcmp(pname, op->name) != 0) {
		rc = bad_request(&op->st, "the name of the object does not "
		    "match the name on the URL");
		goto out;
	}
	switch (op->kind) {
	case OP_UPDATE:
		next = json_deep_copy(op->in);
		break;
	case OP_PATCH:
	case OP_PATCH_STATUS:
		next = k8s_merge_patch(cur, op->in);
		break;
	default:	/* OP_UPDATE_STATUS */
		next = json_deep_copy(cur);
		if (json_object_get(op->in, "status") != NULL)
			json_object_set(next, "status", json_object_get(op->in,
			    "status"));
		else
			json_object_del(next, "status");
	}
	if (!json_is_object(next)) {
		rc = bad_request(&op->st, "the patch does not leave an object");
		goto out;
	}
	if (status_only) {
		/* only .status is taken; everything else stays */
		json_t *s = json_incref(json_object_get(next, "status"));

		json_decref(next);
		next = json_deep_copy(cur);
		if (s != NULL && !json_is_null(s))
			json_object_set_new(next, "status", s);
		else {
			json_decref(s);
			json_object_del(next, "status");
		}
	} else if (r->has_status) {
		/* the main resource ignores .status */
		json_t *s = json_object_get(cur, "status");

		if (s != NULL)
			json_object_set(next, "status", s);
		else
			json_object_del(next, "status");
	}
	rc = commit_object(e, op, b, cur, next, status_only);
out:
	json_decref(cur);
	json_decref(next);
	return rc;
}

/* The objects whose ownerReferences name uid, by the owner index. */
static int
dependents_of(struct embedded *e, const char *uid, struct doom_list *out)
{
	sqlite3_stmt *st;
	int rc;

	st = db_stmt(e->wdb, "SELECT rkey, namespace, name FROM owners WHERE"
	    " owner_uid = ?1");
	if (st == NULL)
		return K8S_EINTERNAL;
	sqlite3_bind_text(st, 1, uid, -1, SQLITE_TRANSIENT);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *rk = (const char *)sqlite3_column_text(st, 0);
		int k;

		for (k = 0; k8s_resources[k] != NULL; k++)
			if (strcmp(rkey(k8s_resources[k]), rk) == 0)
				break;
		if (k8s_resources[k] != NULL)
			doom_add(out, k8s_resources[k],
			    (const char *)sqlite3_column_text(st, 1),
			    (const char *)sqlite3_column_text(st, 2));
	}
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? 0 : K8S_EINTERNAL;
}

/* Rewrite dep without its ownerReferences to uid: a MODIFIED event. */
static int
drop_owner(struct embedded *e, struct batch *b, const struct doomed *d,
    const json_t *dep, const char *uid)
{
	json_t *next = json_deep_copy(dep), *m = meta(next), *refs;
	size_t i, bytes = 0;
	int rc;

	refs = json_object_get(m, "ownerReferences");
	for (i = json_array_size(refs); i-- > 0;) {
		const char *ouid = json_string_value(json_object_get(
		    json_array_get(refs, i), "uid"));

		if (ouid != NULL && strcmp(ouid, uid) == 0)
			json_array_remove(refs, i);
	}
	if (json_array_size(refs) == 0)
		json_object_del(m, "ownerReferences");
	set_rv(next, b);
	rc = store(e, d->r, d->ns, next, dep, &bytes);
	if (rc == 0)
		batch_event(b, K8S_MODIFIED, d->r, d->ns, next, dep, bytes);
	json_decref(next);
	return rc;
}

/*
 * What the garbage collector does to the dependents of a deleted owner
 * (uid): with orphan, or when a dependent has another owner that lives
 * (not in doomed), it drops its reference to the owner and stays;
 * otherwise it joins doomed, to be deleted in turn.
 */
static int
settle_dependents(struct embedded *e, struct batch *b,
    struct doom_list *doomed, const char *uid, int orphan)
{
	struct doom_list deps = { NULL, 0, 0 };
	size_t i;
	int rc;

	rc = dependents_of(e, uid, &deps);
	for (i = 0; rc == 0 && i < deps.n; i++) {
		struct doomed *d = &deps.v[i];
		json_t *dep = NULL;

		if (doom_has(doomed, d->key))
			continue;	/* a cycle: on its way already */
		rc = load_ref(e, d->r, d->ns, d->name, &dep);
		if (rc == K8S_ENOTFOUND) {
			rc = 0;
			continue;
		}
		if (rc == 0 && !orphan)
			rc = has_live_owner(e, d->ns, dep, uid, doomed, NULL);
		if (rc == 0 && !orphan)
			doom_add(doomed, d->r, d->ns, d->name);
		else if (rc >= 0)
			rc = drop_owner(e, b, d, dep, uid);
		json_decref(dep);
	}
	doom_release(&deps);
	return rc;
}

/* Whether obj has finalizers: a deletion only marks it then. */
static int
has_finalizers(const json_t *obj)
{
	return json_array_size(json_object_get(json_object_get(obj,
	    "metadata"), "finalizers")) > 0;
}

/*
 * What a deletion does to an object with finalizers, as the apiserver
 * does: it sets deletionTimestamp (once; generation goes up) and keeps the
 * object, a MODIFIED event. The update that removes the last finalizer
 * removes it (commit_object). *cur becomes the marked object.
 */
static int
mark_deleted(struct embedded *e, struct batch *b, const struct doomed *d,
    json_t **cur)
{
	json_t *next, *m;
	char ts[32];
	size_t bytes = 0;
	int rc;

	if (json_object_get(json_object_get(*cur, "metadata"),
	    "deletionTimestamp") != NULL)
		return 0;
	next = json_deep_copy(*cur);
	m = meta(next);
	time_rfc3339(now_unix(), ts);
	json_object_set_new(m, "deletionTimestamp", json_string(ts));
	json_object_set_new(m, "deletionGracePeriodSeconds", json_integer(0));
	if (json_integer_value(json_object_get(m, "generation")) > 0)
		json_object_set_new(m, "generation", json_integer(
		    json_integer_value(json_object_get(m, "generation")) + 1));
	set_rv(next, b);
	rc = store(e, d->r, d->ns, next, *cur, &bytes);
	if (rc == 0)
		batch_event(b, K8S_MODIFIED, d->r, d->ns, next, *cur,
		    bytes);
	json_decref(*cur);
	*cur = next;
	return rc;
}

/*
 * Delete one object, then settle its dependents as the apiserver and its
 * garbage collector do for policy, and so on down, breadth first: each
 * object once, one DELETED event each. Background and Foreground end in
 * the same state here, where everything happens in one transaction; they
 * differ on a cluster only in what is seen meanwhile. Orphan applies to
 * the object named, whose dependents lose their reference to it. An
 * object with finalizers is only marked (mark_deleted), and its
 * dependents wait for it to go, except with Foreground and Orphan, which
 * settle them at once. final (may be NULL) is the last state of the
 * object named, whose finalizers are done: it goes whatever the store
 * holds. *out (may be NULL) gets the object named.
 */
static int
delete_tree(struct embedded *e, struct batch *b,
    const struct k8s_resource *r, const char *ns, const char *name,
    enum k8s_propagation policy, const json_t *final, json_t **out)
{
	struct doom_list l = { NULL, 0, 0 };
	size_t i;
	int rc = 0, gone;

	doom_add(&l, r, ns, name);
	for (i = 0; rc == 0 && i < l.n; i++) {
		struct doomed *d = &l.v[i];
		json_t *cur = NULL;

		if (i == 0 && final != NULL)
			cur = json_deep_copy(final);
		else
			rc = load(e, d->r, d->ns, d->name, &cur);
		if (rc == K8S_ENOTFOUND && i > 0) {
			rc = 0;		/* a dependent already gone */
			continue;
		}
		gone = rc == 0 && ((i == 0 && final != NULL) ||
		    !has_finalizers(cur));
		if (rc == 0 && !gone)
			rc = mark_deleted(e, b, d, &cur);
		else if (rc == 0)
			rc = erase(e, d->r, d->ns, d->name);
		if (rc == 0 && gone) {
			set_rv(cur, b);
			batch_event(b, K8S_DELETED, d->r, d->ns, cur, NULL,
			    stored_size(cur));
		}
		if (rc == 0 && i == 0 && out != NULL)
			*out = json_incref(cur);
		if (rc == 0 && k8s_meta_str(cur, "uid") != NULL && (gone ||
		    (i == 0 && (policy == K8S_PROPAGATE_FOREGROUND ||
		    policy == K8S_PROPAGATE_ORPHAN))))
			rc = settle_dependents(e, b, &l, k8s_meta_str(cur,
			    "uid"), i == 0 && policy == K8S_PROPAGATE_ORPHAN);
		json_decref(cur);
	}
	doom_release(&l);
	return rc;
}

static int
do_delete(struct embedded *e, struct op *op, struct batch *b)
{
	json_t *cur;
	int rc;

	if (op->pre_uid != NULL || op->pre_rv != NULL) {
		rc = load_ref(e, op->r, op->ns, op->name, &cur);
		if (rc == K8S_ENOTFOUND)
			return k8s_error_notfound(&op->st, op->r, op->name);
		if (rc < 0)
			return k8s_status_set(&op->st, rc, "store read failed",
			    NULL);
		rc = k8s_check_preconditions(&op->st, op->r, op->name, cur,
		    op->pre_uid, op->pre_rv);
		json_decref(cur);
		if (rc < 0)
			return rc;
	}
	rc = delete_tree(e, b, op->r, op->ns, op->name, op->policy, NULL,
	    &op->out);
	if (rc == K8S_ENOTFOUND)
		return k8s_error_notfound(&op->st, op->r, op->name);
	if (rc < 0)
		return k8s_status_set(&op->st, rc, "store write failed", NULL);
	return 0;
}

struct k8s_txn {
	struct embedded *e;
	struct batch *b;
};

/* One object in a transaction, shared (see k8s.h). */
int
k8s_txn_peek(struct k8s_txn *tx, const struct k8s_resource *r,
    const char *ns, const char *name, json_t **out, struct k8s_status *st)
{
	int rc = load_ref(tx->e, r, ns ? ns : "", name, out);

	if (rc == K8S_ENOTFOUND)
		return k8s_error_notfound(st, r, name);
	if (rc < 0)
		return k8s_status_set(st, rc, "store read failed", NULL);
	return 0;
}

/* Read in a transaction: a copy of its own for the caller. */
int
k8s_txn_get(struct k8s_txn *tx, const struct k8s_resource *r,
    const char *ns, const char *name, json_t **out, struct k8s_status *st)
{
	json_t *shared;
	int rc = k8s_txn_peek(tx, r, ns, name, &shared, st);

	if (rc < 0)
		return rc;
	*out = json_deep_copy(shared);
	json_decref(shared);
	return 0;
}

/* Write a whole object in a transaction. */
int
k8s_txn_put(struct k8s_txn *tx, const struct k8s_resource *r,
    const char *ns, json_t *obj, json_t **out, struct k8s_status *st)
{
	struct op sub;
	json_t *cur = NULL, *next;
	const char *name = k8s_meta_str(obj, "name");
	int rc;

	memset(&sub, 0, sizeof(sub));
	sub.r = r;
	sub.ns = ns ? ns : "";
	sub.name = name;
	sub.in = obj;
	if (name == NULL) {
		json_decref(obj);
		return k8s_status_set(st, K8S_EBADREQUEST, "a name is required",
		    NULL);
	}
	rc = load_ref(tx->e, r, sub.ns, name, &cur);
	if (rc == K8S_ENOTFOUND) {
		sub.kind = OP_CREATE;
		rc = do_create(tx->e, &sub, tx->b);
	} else if (rc == 0) {
		sub.kind = OP_UPDATE;
		rc = check_rv(&sub, cur, obj, 0);
		if (rc == 0) {
			/* obj is ours: changed in place, then published */
			next = json_incref(obj);
			rc = commit_object(tx->e, &sub, tx->b, cur, next, 0);
			json_decref(next);
		}
	} else {
		rc = k8s_status_set(&sub.st, rc, "store read failed", NULL);
	}
	json_decref(cur);
	json_decref(obj);
	if (rc < 0) {
		if (st != NULL) {
			k8s_status_release(st);
			*st = sub.st;
		} else {
			k8s_status_release(&sub.st);
		}
		json_decref(sub.out);
		return rc;
	}
	k8s_status_release(&sub.st);
	/* sub.out is published with the commit: a copy */
	if (out != NULL)
		*out = json_deep_copy(sub.out);
	json_decref(sub.out);
	return 0;
}

static int
apply(struct embedded *e, struct op *op, struct batch *b)
{
	struct k8s_txn tx;

	switch (op->kind) {
	case OP_CREATE:
		return do_create(e, op, b);
	case OP_DELETE:
		return do_delete(e, op, b);
	case OP_TXN:
		tx.e = e;
		tx.b = b;
		return op->fn(&tx, op->arg, &op->st);
	default:
		return do_modify(e, op, b);
	}
}

static void
ring_drop_oldest(struct embedded *e)
{
	e->rbytes -= e->ring[e->rhead].bytes;
	event_release(&e->ring[e->rhead]);
	e->rhead = (e->rhead + 1) % e->rcap;
	e->rlen--;
}

/*
 * Append ev to the watch window. What falls out of it goes to *dead, for
 * the caller to free once it has let go of the lock: freeing an event
 * (its object and the version before) under the lock made watchers and
 * callers queueing ops wait for it.
 */
static void
ring_push(struct embedded *e, struct event *ev, struct batch *dead)
{
	int64_t now = now_mono_ms();

	/*
	 * drop what is outside the window: its count, its age, and the
	 * bytes of its objects, which a count alone does not bound (a task
	 * is kilobytes, the token index Secret tens of them)
	 */
	while (e->rlen > 0 && (e->rlen == e->rcap ||
	    e->rbytes + ev->bytes > e->cfg.watch_window_bytes ||
	    now - e->ring[e->rhead].at_ms > e->cfg.watch_window_s * 1000)) {
		if (dead->n == dead->cap) {
			dead->cap = dead->cap ? dead->cap * 2 : 64;
			dead->ev = xrealloc(dead->ev, dead->cap *
			    sizeof(*dead->ev));
		}
		dead->ev[dead->n++] = e->ring[e->rhead];
		e->rbytes -= e->ring[e->rhead].bytes;
		e->rhead = (e->rhead + 1) % e->rcap;
		e->rlen--;
	}
	e->ring[(e->rhead + e->rlen) % e->rcap] = *ev;
	e->rlen++;
	e->rbytes += ev->bytes;
}

/* Report an async op's outcome and free it. */
static void
async_finish(struct op *op)
{
	json_decref(op->out);
	op->done_fn(op->done_arg, op->rc, &op->st);
	k8s_status_release(&op->st);
	free(op);
}

/*
 * What a dry run answers once its writes are rolled back, as the
 * apiserver's dry-run storage does: the object as it would have been
 * written, with no resourceVersion when it would have been created,
 * else with the version it has.
 */
static void
dry_answer(struct embedded *e, struct op *op)
{
	json_t *cur = NULL;

	if (op->out == NULL)
		return;
	json_object_del(meta(op->out), "resourceVersion");
	if (op->kind != OP_CREATE && load_ref(e, op->r, op->ns, op->name,
	    &cur) == 0)
		json_object_set(meta(op->out), "resourceVersion",
		    json_object_get(json_object_get(cur, "metadata"),
		    "resourceVersion"));
	json_decref(cur);
}

static void
run_batch(struct embedded *e, struct op *ops)
{
	struct batch b, dead;
	struct op *op, *next, *async = NULL, **atail = &async;
	size_t i, mark;
	uint64_t nwrites = 0;
	int64_t t0 = now_mono_us();
	int ok = 0;

	memset(&b, 0, sizeof(b));
	b.rv = e->rv;
	if (db_step(e->wdb, "BEGIN IMMEDIATE") < 0)
		goto done;
	for (op = ops; op != NULL; op = op->next) {
		int64_t rv_mark = b.rv;

		mark = b.n;
		db_step(e->wdb, "SAVEPOINT op");
		op->rc = apply(e, op, &b);
		if (op->rc < 0 || op->dry) {
			db_step(e->wdb, "ROLLBACK TO op");
			/* what the op stored is not what is committed */
			ocache_clear(e);
			batch_truncate(&b, mark);
			b.rv = rv_mark;
			if (op->rc == 0)
				dry_answer(e, op);
			else {
				json_decref(op->out);
				op->out = NULL;
			}
		} else
			nwrites++;
		db_step(e->wdb, "RELEASE op");
	}
	if (b.rv != e->rv) {
		sqlite3_stmt *st = db_stmt(e->wdb, "UPDATE meta SET v = ?1 WHERE"
		    " k = 'rv'");

		if (st == NULL)
			goto rollback;
		sqlite3_bind_int64(st, 1, b.rv);
		if (sqlite3_step(st) != SQLITE_DONE) {
			sqlite3_reset(st);
			goto rollback;
		}
		sqlite3_reset(st);
	}
	if (db_step(e->wdb, "COMMIT") == 0) {
		ok = 1;
		goto done;
	}
rollback:
	db_step(e->wdb, "ROLLBACK");
	ocache_clear(e);
done:
	metrics_hist_observe(&commit_hist, (double)(now_mono_us() - t0) / 1e6);
	if (ok)
		atomic_fetch_add_explicit(&committed_ops, nwrites,
		    memory_order_relaxed);
	memset(&dead, 0, sizeof(dead));
	pthread_mutex_lock(&e->mu);
	if (ok) {
		e->rv = b.rv;
		for (i = 0; i < b.n; i++) {
			ring_push(e, &b.ev[i], &dead);
			e->writes++;
		}
		atomic_store_explicit(&window_events, e->rlen,
		    memory_order_relaxed);
		b.n = 0;
		pthread_cond_broadcast(&e->econd);
	}
	for (op = ops; op != NULL; op = next) {
		next = op->next;
		if (!ok) {
			json_decref(op->out);
			op->out = NULL;
			op->rc = k8s_status_set(&op->st, K8S_EINTERNAL,
			    "the store could not commit the write", NULL);
		}
		if (op->done_fn != NULL) {
			*atail = op;
			atail = &op->anext;
			continue;
		}
		op->done = 1;
		/* wake this caller only: no herd of 64 threads per commit */
		pthread_cond_signal(&op->cv);
	}
	pthread_mutex_unlock(&e->mu);
	/* nobody waits on async ops: tell them, outside the lock */
	for (op = async; op != NULL; op = next) {
		next = op->anext;
		async_finish(op);
	}
	batch_truncate(&b, 0);
	free(b.ev);
	batch_truncate(&dead, 0);
	free(dead.ev);
	if (!ok)
		log_kv(LOG_ERROR, "store commit failed", "error",
		    sqlite3_errmsg(e->wdb), NULL);
}

static void *
writer_main(void *arg)
{
	struct embedded *e = arg;

	thread_name("store-writer");
	pthread_mutex_lock(&e->mu);
	for (;;) {
		struct op *ops;

		while (e->ops == NULL && !e->stopping)
			pthread_cond_wait(&e->wcond, &e->mu);
		if (e->ops == NULL)
			break;
		ops = e->ops;
		e->ops = NULL;
		e->ops_tail = &e->ops;
		pthread_mutex_unlock(&e->mu);
		run_batch(e, ops);
		pthread_mutex_lock(&e->mu);
	}
	pthread_mutex_unlock(&e->mu);
	return NULL;
}

/* Queue op (filled in, ns not NULL) and wait for its commit. */
static int
submit_op(struct embedded *e, struct op *op, json_t **out,
    struct k8s_status *st)
{
	if (op->r != NULL && op->r->namespaced && *op->ns == '\0')
		return k8s_status_set(st, K8S_EBADREQUEST,
		    "a namespace is required for this resource", NULL);
	if (op->kind != OP_CREATE && op->kind != OP_TXN &&
	    (op->name == NULL || *op->name == '\0'))
		return k8s_status_set(st, K8S_EBADREQUEST,
		    "a name is required", NULL);
	pthread_mutex_lock(&e->mu);
	if (e->stopping) {
		pthread_mutex_unlock(&e->mu);
		return k8s_status_set(st, K8S_EUNAVAILABLE,
		    "the store is shutting down", NULL);
	}
	pthread_cond_init(&op->cv, NULL);
	*e->ops_tail = op;
	e->ops_tail = &op->next;
	pthread_cond_signal(&e->wcond);
	while (!op->done)
		pthread_cond_wait(&op->cv, &e->mu);
	pthread_mutex_unlock(&e->mu);
	pthread_cond_destroy(&op->cv);
	if (op->rc < 0) {
		if (st != NULL) {
			k8s_status_release(st);
			*st = op->st;
		} else {
			k8s_status_release(&op->st);
		}
		return op->rc;
	}
	k8s_status_release(&op->st);
	/* op->out is published (watch events, the writer's cache): a copy */
	if (out != NULL)
		*out = json_deep_copy(op->out);
	json_decref(op->out);
	return 0;
}

static void
op_init(struct op *op, enum op_kind kind, const struct k8s_resource *r,
    const char *ns, const char *name, const json_t *in)
{
	memset(op, 0, sizeof(*op));
	op->kind = kind;
	op->r = r;
	op->ns = ns ? ns : "";
	op->name = name;
	op->in = in;
}

/* Queue an operation and wait for its commit. */
static int
submit(struct k8s_api *api, enum op_kind kind, const struct k8s_resource *r,
    const char *ns, const char *name, const json_t *in, json_t **out,
    struct k8s_status *st)
{
	struct op op;
	struct embedded *e;

	op_init(&op, kind, r, ns, name, in);
	e = emb(api, &op.dry);
	return submit_op(e, &op, out, st);
}

/* Run fn in one transaction of the writer. */
int
k8s_embedded_transact(struct k8s_api *api, k8s_txn_fn fn, void *arg,
    struct k8s_status *st)
{
	struct embedded *e = (struct embedded *)api;
	struct op op;

	if (api->ops != &embedded_ops)
		return k8s_status_set(st, K8S_EUNSUPPORTED,
		    "transactions need the embedded store", NULL);
	memset(&op, 0, sizeof(op));
	op.kind = OP_TXN;
	op.fn = fn;
	op.arg = arg;
	pthread_mutex_lock(&e->mu);
	if (e->stopping) {
		pthread_mutex_unlock(&e->mu);
		return k8s_status_set(st, K8S_EUNAVAILABLE,
		    "the store is shutting down", NULL);
	}
	pthread_cond_init(&op.cv, NULL);
	*e->ops_tail = &op;
	e->ops_tail = &op.next;
	pthread_cond_signal(&e->wcond);
	while (!op.done)
		pthread_cond_wait(&op.cv, &e->mu);
	pthread_mutex_unlock(&e->mu);
	pthread_cond_destroy(&op.cv);
	json_decref(op.out);
	if (op.rc < 0) {
		if (st != NULL) {
			k8s_status_release(st);
			*st = op.st;
		} else {
			k8s_status_release(&op.st);
		}
		return op.rc;
	}
	k8s_status_release(&op.st);
	return op.rc;
}

void
k8s_embedded_transact_async(struct k8s_api *api, k8s_txn_fn fn, void *arg,
    k8s_txn_done_fn done, void *done_arg)
{
	struct embedded *e = (struct embedded *)api;
	struct op *op = xcalloc(1, sizeof(*op));

	op->kind = OP_TXN;
	op->ns = "";
	op->fn = fn;
	op->arg = arg;
	op->done_fn = done;
	op->done_arg = done_arg;
	if (api->ops != &embedded_ops) {
		op->rc = k8s_status_set(&op->st, K8S_EUNSUPPORTED,
		    "transactions need the embedded store", NULL);
		async_finish(op);
		return;
	}
	pthread_mutex_lock(&e->mu);
	if (e->stopping) {
		pthread_mutex_unlock(&e->mu);
		op->rc = k8s_status_set(&op->st, K8S_EUNAVAILABLE,
		    "the store is shutting down", NULL);
		async_finish(op);
		return;
	}
	*e->ops_tail = op;
	e->ops_tail = &op->next;
	pthread_cond_signal(&e->wcond);
	pthread_mutex_unlock(&e->mu);
}

/* Whether api is this backend. */
int
k8s_is_embedded(const struct k8s_api *api)
{
	return api != NULL && api->ops == &embedded_ops;
}

static int
e_create(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const json_t *obj, json_t **out, struct k8s_status *st)
{
	return submit(api, OP_CREATE, r, ns, NULL, obj,
	    out, st);
}

static int
e_update(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const char *name, const json_t *obj, json_t **out, struct k8s_status *st)
{
	return submit(api, OP_UPDATE, r, ns, name, obj, out,
	    st);
}

static int
e_update_status(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, const json_t *obj, json_t **out,
    struct k8s_status *st)
{
	return submit(api, OP_UPDATE_STATUS, r, ns, name,
	    obj, out, st);
}

static int
e_patch(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const char *name, int status, const json_t *patch, json_t **out,
    struct k8s_status *st)
{
	return submit(api, status ? OP_PATCH_STATUS :
	    OP_PATCH, r, ns, name, patch, out, st);
}

static int
e_delete(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const char *name, enum k8s_propagation policy, const char *uid,
    const char *rv, json_t **out, struct k8s_status *st)
{
	struct op op;

	struct embedded *e;

	op_init(&op, OP_DELETE, r, ns, name, NULL);
	op.policy = policy;
	op.pre_uid = uid;
	op.pre_rv = rv;
	e = emb(api, &op.dry);
	return submit_op(e, &op, out, st);
}

/* -------------------------------------------------------------- reads */

static struct reader *
reader_take(struct embedded *e)
{
	int i;

	pthread_mutex_lock(&e->mu);
	for (;;) {
		for (i = 0; i < READERS; i++)
			if (!e->readers[i].busy) {
				e->readers[i].busy = 1;
				pthread_mutex_unlock(&e->mu);
				return &e->readers[i];
			}
		pthread_cond_wait(&e->rcond, &e->mu);
	}
}

static void
reader_give(struct embedded *e, struct reader *rd)
{
	pthread_mutex_lock(&e->mu);
	rd->busy = 0;
	pthread_cond_signal(&e->rcond);
	pthread_mutex_unlock(&e->mu);
}

static int
e_get(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const char *name, json_t **out, struct k8s_status *st)
{
	struct embedded *e = emb(api, NULL);
	struct reader *rd = reader_take(e);
	sqlite3_stmt *s = db_stmt(rd->db, "SELECT body FROM objects WHERE"
	    " rkey = ?1 AND namespace = ?2 AND name = ?3");
	int rc;
	json_t *obj = NULL;

	if (s == NULL) {
		reader_give(e, rd);
		return k8s_status_set(st, K8S_EINTERNAL, "store read failed",
		    NULL);
	}
	sqlite3_bind_text(s, 1, rkey(r), -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, ns ? ns : "", -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 3, name ? name : "", -1, SQLITE_STATIC);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW)
		obj = json_loadb((const char *)sqlite3_column_blob(s, 0),
		    (size_t)sqlite3_column_bytes(s, 0), 0, NULL);
	sqlite3_reset(s);
	reader_give(e, rd);
	if (rc == SQLITE_DONE)
		return k8s_error_notfound(st, r, name);
	if (obj == NULL)
		return k8s_status_set(st, K8S_EINTERNAL, "store read failed",
		    NULL);
	*out = obj;
	return 0;
}

static int
parse_selectors(const struct k8s_list_opts *opts, struct k8s_selector **ls,
    struct k8s_selector **fs, struct k8s_status *st)
{
	char *cause = NULL;

	*ls = NULL;
	*fs = NULL;
	if (opts != NULL && k8s_selector_parse(opts->label_selector, ls,
	    &cause) < 0) {
		k8s_status_set(st, K8S_EBADREQUEST, cause, NULL);
		free(cause);
		return K8S_EBADREQUEST;
	}
	if (opts != NULL && k8s_fieldsel_parse(opts->field_selector, fs,
	    &cause) < 0) {
		k8s_selector_free(*ls);
		*ls = NULL;
		k8s_status_set(st, K8S_EBADREQUEST, cause, NULL);
		free(cause);
		return K8S_EBADREQUEST;
	}
	return 0;
}

/* Snapshot list: the items and the rv they are current at. */
static int
snapshot(struct embedded *e, const struct k8s_resource *r, const char *ns,
    const struct k8s_selector *ls, const struct k8s_selector *fs,
    json_t **items_out, int64_t *rv_out)
{
	struct reader *rd = reader_take(e);
	sqlite3_stmt *s, *m;
	json_t *items = json_array();
	int ok = 1;

	db_step(rd->db, "BEGIN");
	m = db_stmt(rd->db, "SELECT v FROM meta WHERE k = 'rv'");
	s = ns != NULL && *ns ? db_stmt(rd->db, "SELECT body FROM objects WHERE"
	    " rkey = ?1 AND namespace = ?2 ORDER BY name") :
	    db_stmt(rd->db, "SELECT body FROM objects WHERE rkey = ?1"
	    " ORDER BY namespace, name");
	if (m == NULL || s == NULL || sqlite3_step(m) != SQLITE_ROW) {
		ok = 0;
	} else {
		*rv_out = sqlite3_column_int64(m, 0);
		sqlite3_bind_text(s, 1, rkey(r), -1, SQLITE_STATIC);
		if (ns != NULL && *ns)
			sqlite3_bind_text(s, 2, ns, -1, SQLITE_STATIC);
		while (sqlite3_step(s) == SQLITE_ROW) {
			json_t *o = json_loadb((const char *)
			    sqlite3_column_blob(s, 0),
			    (size_t)sqlite3_column_bytes(s, 0), 0, NULL);

			if (o == NULL) {
				ok = 0;
				break;
			}
			if (k8s_selector_match(ls, o) &&
			    k8s_selector_match(fs, o))
				json_array_append_new(items, o);
			else
				json_decref(o);
		}
	}
	if (m != NULL)
		sqlite3_reset(m);
	if (s != NULL)
		sqlite3_reset(s);
	db_step(rd->db, "COMMIT");
	reader_give(e, rd);
	if (!ok) {
		json_decref(items);
		return K8S_EINTERNAL;
	}
	*items_out = items;
	return 0;
}

static int
e_list(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const struct k8s_list_opts *opts, json_t **out, struct k8s_status *st)
{
	struct embedded *e = emb(api, NULL);
	struct k8s_selector *ls, *fs;
	json_t *items;
	int64_t rv = 0;
	char *rvs, *kind;
	int rc;

	rc = parse_selectors(opts, &ls, &fs, st);
	if (rc < 0)
		return rc;
	rc = snapshot(e, r, ns, ls, fs, &items, &rv);
	k8s_selector_free(ls);
	k8s_selector_free(fs);
	if (rc < 0)
		return k8s_status_set(st, rc, "store read failed", NULL);
	rvs = rv_string(rv);
	kind = xasprintf("%sList", r->kind);
	*out = json_pack("{s:s,s:s,s:{s:s,s:s},s:o}", "kind", kind,
	    "apiVersion", k8s_api_version(r), "metadata", "resourceVersion",
	    rvs, "continue", "", "items", items);
	free(rvs);
	free(kind);
	return 0;
}

/* ------------------------------------------------------------- watch */

static int
e_watch(struct k8s_api *api, const struct k8s_resource *r, const char *ns,
    const struct k8s_list_opts *opts, struct k8s_watch **out,
    struct k8s_status *st)
{
	struct embedded *e = emb(api, NULL);
	struct ewatch *w;
	const char *rvs = opts ? opts->resource_version : NULL;
	int rc;

	w = xcalloc(1, sizeof(*w));
	w->w.api = api;
	w->e = e;
	w->r = r;
	w->ns = ns != NULL && *ns ? xstrdup(ns) : NULL;
	rc = parse_selectors(opts, &w->labels, &w->fields, st);
	if (rc < 0) {
		free(w->ns);
		free(w);
		return rc;
	}
	if (rvs == NULL || *rvs == '\0' || strcmp(rvs, "0") == 0) {
		size_t i;
		json_t *o;

		rc = snapshot(e, r, w->ns, w->labels, w->fields, &w->initial,
		    &w->cursor);
		if (rc < 0) {
			k8s_watch_free(&w->w);
			return k8s_status_set(st, rc, "store read failed",
			    NULL);
		}
		/* the ADDED events tell their own versions */
		json_array_foreach(w->initial, i, o)
			if (k8s_resource_version(o) > w->told)
				w->told = k8s_resource_version(o);
	} else {
		char *end;
		long long v = strtoll(rvs, &end, 10);

		if (*end != '\0' || v < 0) {
			k8s_watch_free(&w->w);
			return k8s_status_set(st, K8S_EBADREQUEST,
			    "invalid resourceVersion", NULL);
		}
		w->cursor = w->told = v;
	}
	*out = &w->w;
	return 0;
}

static int
selected(const struct ewatch *w, const json_t *obj)
{
	return k8s_selector_match(w->labels, obj) &&
	    k8s_selector_match(w->fields, obj);
}

/*
 * What w sees of ev, as kube-apiserver's watch cache decides it: 0 when
 * nothing, else its type. A MODIFIED whose object enters the selection
 * is ADDED for w, one that leaves it DELETED (of the version before, which
 * *prev_out gets, at the event's resourceVersion).
 */
static enum k8s_event_type
event_view(const struct ewatch *w, const struct event *ev,
    const json_t **prev_out)
{
	int now, before;

	*prev_out = NULL;
	if (ev->r != w->r || (w->ns != NULL && strcmp(ev->ns, w->ns) != 0))
		return 0;
	now = selected(w, ev->obj);
	if (ev->type != K8S_MODIFIED || ev->prev == NULL)
		return now ? ev->type : 0;
	before = selected(w, ev->prev);
	if (now)
		return before ? K8S_MODIFIED : K8S_ADDED;
	if (!before)
		return 0;
	*prev_out = ev->prev;
	return K8S_DELETED;
}

static int
e_watch_next(struct k8s_watch *kw, int timeout_ms, struct k8s_event *out,
    struct k8s_status *st)
{
	struct ewatch *w = (struct ewatch *)kw;
	struct embedded *e = w->e;
	int64_t deadline = now_mono_ms() + timeout_ms;

	if (w->initial != NULL) {
		if (w->initial_next < json_array_size(w->initial)) {
			json_t *o = json_array_get(w->initial,
			    w->initial_next++);

			out->type = K8S_ADDED;
			out->object = json_incref(o);
			out->rv = k8s_resource_version(o);
			return 1;
		}
		json_decref(w->initial);
		w->initial = NULL;
	}
	pthread_mutex_lock(&e->mu);
	for (;;) {
		int64_t oldest = e->rlen > 0 ? e->ring[e->rhead].rv :
		    e->rv + 1;
		size_t i;

		if (w->cursor < oldest - 1) {
			char *m = xasprintf("too old resource version: %lld "
			    "(%lld)", (long long)w->cursor,
			    (long long)(oldest - 1));

			pthread_mutex_unlock(&e->mu);
			k8s_status_set(st, K8S_EGONE, m, NULL);
			free(m);
			return K8S_EGONE;
		}
		/* the ring holds contiguous rvs: jump to the cursor */
		i = (size_t)(w->cursor + 1 - oldest);
		for (; i < e->rlen; i++) {
			struct event *ev = &e->ring[(e->rhead + i) % e->rcap];
			const json_t *left;
			enum k8s_event_type type = event_view(w, ev, &left);

			w->cursor = ev->rv;
			if (type != 0) {
				w->told = ev->rv;
				/*
				 * the object is never changed once published:
				 * hold it, and copy it for the caller outside
				 * the lock (the writer and the other watchers
				 * need it meanwhile)
				 */
				json_t *shared = json_incref((json_t *)(
				    left != NULL ? left : ev->obj));
				int64_t rv = ev->rv;

				pthread_mutex_unlock(&e->mu);
				out->type = type;
				out->object = json_deep_copy(shared);
				out->rv = rv;
				json_decref(shared);
				if (left != NULL)
					set_rv_to(out->object, rv);
				return 1;
			}
		}
		if (e->stopping) {
			pthread_mutex_unlock(&e->mu);
			return k8s_status_set(st, K8S_EUNAVAILABLE,
			    "the store is shutting down", NULL);
		}
		{
			int64_t left = deadline - now_mono_ms();
			struct timespec ts;

			if (left <= 0 && w->cursor > w->told) {
				/*
				 * a quiet slice after events the selection
				 * skipped: a BOOKMARK says how far it went
				 */
				w->told = w->cursor;
				pthread_mutex_unlock(&e->mu);
				out->type = K8S_BOOKMARK;
				out->object = NULL;
				out->rv = w->told;
				return 1;
			}
			if (left <= 0) {
				pthread_mutex_unlock(&e->mu);
				return 0;
			}
			time_deadline(CLOCK_REALTIME, left, &ts);
			pthread_cond_timedwait(&e->econd, &e->mu, &ts);
		}
	}
}

static void
e_watch_free(struct k8s_watch *kw)
{
	struct ewatch *w = (struct ewatch *)kw;

	json_decref(w->initial);
	k8s_selector_free(w->labels);
	k8s_selector_free(w->fields);
	free(w->ns);
	free(w);
}

/* -------------------------------------------------------------- life */

static void
e_free(struct k8s_api *api)
{
	struct embedded *e = (struct embedded *)api;
	int i;

	if (e->writer_running) {
		pthread_mutex_lock(&e->mu);
		e->stopping = 1;
		pthread_cond_broadcast(&e->wcond);
		pthread_cond_broadcast(&e->econd);
		pthread_mutex_unlock(&e->mu);
		pthread_join(e->writer, NULL);
	}
	for (i = 0; i < READERS; i++)
		db_close(e->readers[i].db);
	ocache_clear(e);
	free(e->oc);
	db_close(e->wdb);
	while (e->rlen > 0)
		ring_drop_oldest(e);
	free(e->ring);
	free(e->path);
	pthread_mutex_destroy(&e->mu);
	pthread_cond_destroy(&e->wcond);
	pthread_cond_destroy(&e->rcond);
	pthread_cond_destroy(&e->econd);
	free(e);
}

/*
 * The objects table is a rowid table with a unique key. It was a WITHOUT
 * ROWID table keyed by (rkey, namespace, name): there a row longer than
 * about 1,000 bytes (every AgentTask) spills into an overflow page, so
 * that each status write (a meter charge) wrote the leaf, a new overflow
 * page and the freelist: three pages where a rowid table, which keeps rows
 * of up to about 4,000 bytes in the leaf, writes one. The key's index
 * holds the key and the rowid only, and a status write leaves it alone.
 * Both layouts take the same statements, so an older diverged still
 * reads and writes the converted table (no schema version bump).
 */
#define OBJECTS_COLUMNS \
	" rkey TEXT NOT NULL, namespace TEXT NOT NULL," \
	" name TEXT NOT NULL, uid TEXT NOT NULL, rv INTEGER NOT NULL," \
	" body TEXT NOT NULL, UNIQUE (rkey, namespace, name)"

/* Convert a WITHOUT ROWID objects table, in one transaction. */
static int
migrate_objects(sqlite3 *db, const char *path, char **cause)
{
	char *why = NULL;
	sqlite3_stmt *st = db_stmt(db, "SELECT sql FROM sqlite_master WHERE"
	    " type = 'table' AND name = 'objects'");
	const char *sql;
	int old;

	if (st == NULL) {
		*cause = xasprintf("database '%s': %s", path,
		    sqlite3_errmsg(db));
		return -1;
	}
	if (sqlite3_step(st) != SQLITE_ROW) {
		sqlite3_reset(st);
		return 0;	/* a new database */
	}
	sql = (const char *)sqlite3_column_text(st, 0);
	old = sql != NULL && strstr(sql, "WITHOUT ROWID") != NULL;
	sqlite3_reset(st);
	if (!old)
		return 0;
	if (db_exec(db, "BEGIN IMMEDIATE;"
	    "CREATE TABLE objects_new (" OBJECTS_COLUMNS ");"
	    "INSERT INTO objects_new (rkey, namespace, name, uid, rv, body)"
	    " SELECT rkey, namespace, name, uid, rv, body FROM objects"
	    " ORDER BY rkey, namespace, name;"
	    "DROP TABLE objects;"
	    "ALTER TABLE objects_new RENAME TO objects;"
	    "COMMIT;", &why) < 0) {
		exec_sql(db, "ROLLBACK");
		*cause = xasprintf("database '%s': cannot convert the objects "
		    "table: %s", path, why);
		free(why);
		return -1;
	}
	log_kv(LOG_INFO, "store: objects table converted to a rowid table",
	    NULL);
	return 0;
}

static double
read_commits(void *arg)
{
	return (double)metrics_hist_count(arg);
}

static void
metrics_init(void)
{
	metrics_describe("diverge_store_commit_seconds", METRIC_HISTOGRAM,
	    "Duration of one group commit of the store's writer "
	    "(transaction and sync).");
	metrics_describe("diverge_store_commits_total", METRIC_COUNTER,
	    "Group commits of the store's writer.");
	metrics_describe("diverge_store_committed_ops_total", METRIC_COUNTER,
	    "Writes committed by those group commits (divided by commits: "
	    "the mean batch).");
	metrics_describe("diverge_store_watch_window_events", METRIC_GAUGE,
	    "Events kept in the store's watch window, which a watch can "
	    "resume from.");
	metrics_hist_register("diverge_store_commit_seconds", "",
	    &commit_hist);
	metrics_gauge_fn("diverge_store_commits_total", "", read_commits,
	    &commit_hist);
	metrics_gauge_fn("diverge_store_committed_ops_total", "",
	    metrics_read_atomic, &committed_ops);
	metrics_gauge_fn("diverge_store_watch_window_events", "",
	    metrics_read_atomic, &window_events);
}

/* Open the embedded store. */
int
k8s_embedded_open(struct k8s_api **out, const char *path,
    const struct k8s_embedded_config *cfg, char **cause)
{
	static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;
	struct embedded *e = xcalloc(1, sizeof(*e));
	sqlite3_stmt *st;
	int i;

	pthread_once(&metrics_once, metrics_init);
	e->api.ops = &embedded_ops;
	e->dry.ops = &embedded_dry_ops;	/* filled by k8s_embedded_dry_run */
	e->path = xstrdup(path);
	if (cfg != NULL)
		e->cfg = *cfg;
	if (e->cfg.watch_window_events == 0)
		e->cfg.watch_window_events = 10000;
	if (e->cfg.watch_window_s <= 0)
		e->cfg.watch_window_s = 3600;
	if (e->cfg.watch_window_bytes == 0)
		e->cfg.watch_window_bytes = 4 << 20;
	e->rcap = e->cfg.watch_window_events;
	e->ring = xcalloc(e->rcap, sizeof(*e->ring));
	e->ops_tail = &e->ops;
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->wcond, NULL);
	pthread_cond_init(&e->rcond, NULL);
	pthread_cond_init(&e->econd, NULL);
	if (open_db(path, &e->wdb, cause) < 0)
		goto fail;
	if (migrate_objects(e->wdb, path, cause) < 0)
		goto fail;
	if (exec_sql(e->wdb,
	    "CREATE TABLE IF NOT EXISTS objects (" OBJECTS_COLUMNS ");"
	    "CREATE TABLE IF NOT EXISTS owners ("
	    " owner_uid TEXT NOT NULL, rkey TEXT NOT NULL,"
	    " namespace TEXT NOT NULL, name TEXT NOT NULL,"
	    " PRIMARY KEY (owner_uid, rkey, namespace, name)) WITHOUT ROWID;"
	    "CREATE INDEX IF NOT EXISTS owners_child ON owners"
	    " (rkey, namespace, name);"
	    "DROP INDEX IF EXISTS objects_uid;"
	    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY,"
	    " v INTEGER NOT NULL);"
	    "INSERT OR IGNORE INTO meta (k, v) VALUES ('rv', 0);") < 0) {
		*cause = xasprintf("database '%s': %s", path,
		    sqlite3_errmsg(e->wdb));
		goto fail;
	}
	st = db_stmt(e->wdb, "SELECT v FROM meta WHERE k = 'rv'");
	if (st == NULL || sqlite3_step(st) != SQLITE_ROW) {
		*cause = xasprintf("database '%s': %s", path,
		    sqlite3_errmsg(e->wdb));
		goto fail;
	}
	e->rv = sqlite3_column_int64(st, 0);
	sqlite3_reset(st);
	for (i = 0; i < READERS; i++)
		if (open_db(path, &e->readers[i].db, cause) < 0)
			goto fail;
	if (pthread_create(&e->writer, NULL, writer_main, e) != 0) {
		*cause = xstrdup("cannot start the store writer thread");
		goto fail;
	}
	e->writer_running = 1;
	*out = &e->api;
	return 0;
fail:
	e_free(&e->api);
	return -1;
}

/* Writes committed since open. */
uint64_t
k8s_embedded_write_count(struct k8s_api *api)
{
	struct embedded *e = (struct embedded *)api;
	uint64_t n;

	pthread_mutex_lock(&e->mu);
	n = e->writes;
	pthread_mutex_unlock(&e->mu);
	return n;
}

static const struct k8s_ops embedded_ops = {
	.name = "embedded",
	.get = e_get,
	.list = e_list,
	.create = e_create,
	.update = e_update,
	.update_status = e_update_status,
	.patch = e_patch,
	.del = e_delete,
	.watch = e_watch,
	.watch_next = e_watch_next,
	.watch_free = e_watch_free,
	.free = e_free,
};

/*
 * The dry-run view's: the same functions (which tell the view by these
 * ops, emb()), and no free of its own. Filled once, from embedded_ops.
 */
static struct k8s_ops embedded_dry_ops;
static pthread_once_t embedded_dry_once = PTHREAD_ONCE_INIT;

static void
embedded_dry_init(void)
{
	embedded_dry_ops = embedded_ops;
	embedded_dry_ops.name = "embedded-dry-run";
	embedded_dry_ops.free = NULL;
}

/* See k8s.h. */
struct k8s_api *
k8s_embedded_dry_run(struct k8s_api *api)
{
	pthread_once(&embedded_dry_once, embedded_dry_init);
	return k8s_is_embedded(api) ? &((struct embedded *)api)->dry : NULL;
}
