/*
 * The durable inbox: accepted deliveries go into SQLite (WAL,
 * synchronous=FULL) before they are acknowledged, and worker threads hand
 * them to a handler at least once.
 *
 * The inbox is split into INBOX_SHARDS databases by a hash of the delivery
 * key (so duplicates always meet in the same shard): shard 0 is the state
 * database itself, shard N the file inbox-N.db beside it. Each shard has
 * one writer thread that owns its writes. Request threads queue puts;
 * worker threads queue completions; a writer takes everything queued for
 * its shard, writes it in one transaction and syncs once (group commit),
 * then settles each put and feeds the ids it stored to the workers.
 * Shards sync in parallel: on the disks we run on, one thread syncing in a
 * loop gets a fraction of the syncs per second that four threads get
 * together (measured: 212 vs 2,203 commits/s, bench/README.md), and a put
 * is only answered once it is synced.
 *
 * Workers read entries through their own connections (WAL readers never
 * block a writer). The in-memory work queue holds ids only (shard in the
 * low bits), so memory stays flat however deep the inbox.
 *
 * An entry that fails for good is dead-lettered: kept, with its last
 * error, for an operator. Once the cause is fixed the provider's
 * redelivery (the same delivery key) brings it back: the writer that
 * finds the key dead makes it pending again in the put's transaction and
 * feeds it to the workers, as it does a new entry.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "scm/scm.h"
#include "util/util.h"

enum { ST_PENDING = 0, ST_DONE = 1, ST_DEAD = 2 };

/* Completions linger this long (or until this many) for a shared commit. */
#define DONE_LINGER_MS 20
#define DONE_BATCH 256

/*
 * By default a WAL longer than this many frames (about 16 MiB) is
 * restarted after its checkpoint.
 */
#define INBOX_WAL_RESTART_FRAMES 4096

/* handled_events keeps at most this many bytes of a comment. */
#define INBOX_AUDIT_BODY_MAX 1024
#define DEAD_KEEP_MS (30 * 86400 * 1000LL)	/* dead letters: at least */
/* entries pruned in one transaction, at most (a short hold of the writer) */
#define PRUNE_BATCH 10000
#define PRUNE_BATCH_S "10000"

/*
 * The events of entries just stored that their first worker takes from
 * memory, at most this many bytes of them (beyond, it reads them back).
 */
#define INBOX_HELD_MAX (4u << 20)

/* Queue ids carry their shard in the low bits. */
#define ID_MAKE(rowid, shard) ((rowid) * INBOX_SHARDS + (shard))
#define ID_SHARD(id) ((int)((id) % INBOX_SHARDS))
#define ID_ROW(id) ((id) / INBOX_SHARDS)

struct put_req {
	struct put_req *next;
	char *key;
	char *provider;
	char *event;
	size_t event_len;
	inbox_put_cb cb;
	void *arg;
	enum inbox_put_result result;
	int64_t id;
	int64_t received_ms;	/* INBOX_STORED, INBOX_REQUEUED: as stored */
	struct fresh *fresh;	/* for its first worker, when none took it */
	int dead_attempts;	/* INBOX_REQUEUED: what the dead letter had */
	char *dead_error;
};

struct done_req {
	struct done_req *next;
	int64_t id;
	int outcome;		/* INBOX_DONE / INBOX_RETRY / INBOX_FAIL */
	int attempts;		/* attempts including this one */
	int64_t received_ms;
	int64_t retry_at_ms;	/* wall clock, for INBOX_RETRY */
	char *key;
	char *provider;
	char *cause;
	int (*effect)(struct sqlite3 *, const struct inbox_item *, void *);
	void *effect_arg;
	int shard;
	struct inbox_item item;	/* for the effect; event owned below */
	struct scm_event ev;
	int have_ev;
	int recovered;		/* left by an unfinished run (recovered_busy) */
};

struct delayed {
	int64_t id;
	int64_t at_ms;
};

/*
 * An entry just stored (or requeued), as its put gave it: its first
 * worker takes it from here instead of reading back the row it was
 * written to a moment before (a read transaction, the pages from the WAL,
 * the event copied out). Its row says the same: pending, no attempt yet,
 * received when the put was committed.
 */
struct fresh {
	char *key;
	char *provider;
	char *event;
	size_t len;
	int64_t received_ms;
};

/* In the ready queue: an entry's id and, for a fresh one, what it is. */
struct ready_ent {
	int64_t id;
	struct fresh *fresh;
};

struct shard {
	struct inbox *ib;
	int idx;
	char *path;
	sqlite3 *wdb;
	pthread_t writer;
	int running;
	pthread_cond_t wcond;	/* the writer waits here */
	struct put_req *puts, **puts_tail;
	struct done_req *dones, **dones_tail;
	size_t ndones;
	int64_t dones_since_ms;
	int64_t last_prune_ms;
	int ckpt_hold;		/* the checkpointer rewinds the WAL: wait */
	/*
	 * After a stop that did not finish (a crash, kill -9): the rows
	 * pending at start, ascending; each one's first take counts as an
	 * attempt before its handling (under ib->mu)
	 */
	int64_t *recovered;
	unsigned char *recovered_taken;
	size_t nrecovered;
};

struct inbox {
	struct inbox_config cfg;
	struct inbox_handler h;
	struct shard shards[INBOX_SHARDS];

	pthread_mutex_t mu;
	pthread_cond_t qcond;	/* workers wait here */
	pthread_cond_t pcond;	/* inbox_put waiters */

	struct ready_ent *ready;	/* ring of ids */
	size_t rhead, rlen, rcap;
	size_t held;		/* bytes of the fresh events in it */
	struct delayed *delayed;
	size_t ndelayed, cdelayed;

	int64_t pending;	/* entries stored and not finished */
	int64_t reserved;	/* room taken by puts not yet committed */
	int64_t dead;		/* dead letters stored */
	/*
	 * An entry left by an unfinished run is being handled and its
	 * outcome not yet written: the next such entry waits for it, so
	 * that a crash is counted against the entry that caused it alone
	 */
	int recovered_busy;
	int accepting;
	int stopping;
	int workers_done;
	int started;

	pthread_t *workers;
	pthread_t checkpointer;
	int checkpointer_running;
	pthread_cond_t ccond;
	int nworkers;
};

/* ------------------------------------------------------------ helpers */

/*
 * Inbox connections take no automatic checkpoints: they would run inside
 * a writer's commit and stall every request waiting on it; the
 * checkpointer thread runs them beside the writers instead.
 */
/*
 * Waiting on a lock (a RESTART checkpoint holds writers back for a few
 * milliseconds) in steps of 250 us, up to 10 s: SQLite's own handler
 * sleeps 1, 2, 5, 10... ms and would add most of that to the requests
 * queued behind the commit.
 */
static int
busy_wait(void *arg, int tries)
{
	struct timespec ts = { 0, 250000 };

	(void)arg;
	if (tries >= 40000)
		return 0;
	nanosleep(&ts, NULL);
	return 1;
}

static int
open_db(const char *path, sqlite3 **out, char **cause)
{
	if (db_open(path, 1, out, cause) < 0)
		return -1;
	sqlite3_busy_handler(*out, busy_wait, NULL);
	return 0;
}

static void
fresh_free(struct fresh *f)
{
	if (f == NULL)
		return;
	free(f->key);
	free(f->provider);
	free(f->event);
	free(f);
}

/* Queue entry id; fresh (or NULL) is now the queue's (ib->mu held). */
static void
ready_push(struct inbox *ib, int64_t id, struct fresh *fresh)
{
	if (ib->rlen == ib->rcap) {
		size_t ncap = ib->rcap ? ib->rcap * 2 : 1024, i;
		struct ready_ent *n = xmalloc(ncap * sizeof(*n));

		for (i = 0; i < ib->rlen; i++)
			n[i] = ib->ready[(ib->rhead + i) % ib->rcap];
		free(ib->ready);
		ib->ready = n;
		ib->rcap = ncap;
		ib->rhead = 0;
	}
	ib->ready[(ib->rhead + ib->rlen) % ib->rcap].id = id;
	ib->ready[(ib->rhead + ib->rlen) % ib->rcap].fresh = fresh;
	if (fresh != NULL)
		ib->held += fresh->len;
	ib->rlen++;
}

/* Take the next entry; its fresh (or NULL) is the caller's. */
static struct ready_ent
ready_pop(struct inbox *ib)
{
	struct ready_ent e = ib->ready[ib->rhead];

	ib->rhead = (ib->rhead + 1) % ib->rcap;
	ib->rlen--;
	if (e.fresh != NULL)
		ib->held -= e.fresh->len;
	return e;
}

/* Empty the ready queue (ib->mu held, or no thread left). */
static void
ready_clear(struct inbox *ib)
{
	while (ib->rlen > 0)
		fresh_free(ready_pop(ib).fresh);
}

/*
 * The retries waiting for their time: a binary heap on at_ms, so that a
 * worker's look at them costs O(log n) per entry due instead of a scan
 * of them all (under the inbox lock, for every entry taken: a backlog of
 * retries, during an outage, slowed every take and put).
 */
static void
delayed_push(struct inbox *ib, int64_t id, int64_t at_ms)
{
	struct delayed *h;
	size_t i, up;

	if (ib->ndelayed == ib->cdelayed) {
		ib->cdelayed = ib->cdelayed ? ib->cdelayed * 2 : 64;
		ib->delayed = xrealloc(ib->delayed,
		    ib->cdelayed * sizeof(*ib->delayed));
	}
	h = ib->delayed;
	for (i = ib->ndelayed++; i > 0; i = up) {
		up = (i - 1) / 2;
		if (h[up].at_ms <= at_ms)
			break;
		h[i] = h[up];
	}
	h[i].id = id;
	h[i].at_ms = at_ms;
}

/* Take the earliest retry off the heap (it has one). */
static struct delayed
delayed_pop(struct inbox *ib)
{
	struct delayed *h = ib->delayed, top = h[0], last;
	size_t i = 0, c, n = --ib->ndelayed;

	last = h[n];
	for (;;) {
		c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && h[c + 1].at_ms < h[c].at_ms)
			c++;
		if (last.at_ms <= h[c].at_ms)
			break;
		h[i] = h[c];
		i = c;
	}
	if (n > 0)
		h[i] = last;
	return top;
}

/* Move due retries to the ready queue; returns ms until the next one. */
static int64_t
delayed_release(struct inbox *ib, int64_t now)
{
	while (ib->ndelayed > 0 && ib->delayed[0].at_ms <= now)
		ready_push(ib, delayed_pop(ib).id, NULL);
	if (ib->ndelayed > 0 && ib->delayed[0].at_ms - now < 1000)
		return ib->delayed[0].at_ms - now;
	return 1000;
}

static void
timed_wait(pthread_cond_t *c, pthread_mutex_t *m, int64_t ms)
{
	struct timespec ts;

	time_deadline(CLOCK_REALTIME, ms, &ts);
	pthread_cond_timedwait(c, m, &ts);
}

static double
depth_gauge(void *arg)
{
	return (double)inbox_depth(arg);
}

static double
dead_gauge(void *arg)
{
	return (double)inbox_dead_letters(arg);
}

/* --------------------------------------------------------------- open */

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS inbox ("
    " id INTEGER PRIMARY KEY,"
    " key TEXT NOT NULL UNIQUE,"
    " provider TEXT NOT NULL,"
    " event TEXT NOT NULL,"
    " state INTEGER NOT NULL DEFAULT 0,"
    " attempts INTEGER NOT NULL DEFAULT 0,"
    " next_at INTEGER NOT NULL DEFAULT 0,"
    " last_error TEXT,"
    " received_at INTEGER NOT NULL,"
    " finished_at INTEGER);"
    "CREATE INDEX IF NOT EXISTS inbox_pending ON inbox(id)"
    " WHERE state = 0;"
    "CREATE INDEX IF NOT EXISTS inbox_finished ON inbox(finished_at)"
    " WHERE state = 1;"
    "CREATE INDEX IF NOT EXISTS inbox_dead ON inbox(finished_at)"
    " WHERE state = 2;"
    "CREATE TABLE IF NOT EXISTS inbox_body ("
    " id INTEGER PRIMARY KEY,"
    " event TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS handled_events ("
    " key TEXT PRIMARY KEY,"
    " provider TEXT NOT NULL,"
    " kind TEXT NOT NULL,"
    " repo TEXT,"
    " number INTEGER,"
    " comment_id INTEGER,"
    " body TEXT,"
    " count INTEGER NOT NULL,"
    " handled_at INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS handled_events_at"
    " ON handled_events(handled_at);"
    "CREATE TABLE IF NOT EXISTS inbox_meta ("
    " k TEXT PRIMARY KEY,"
    " v INTEGER NOT NULL);";

/* The file of shard i: the state database itself, or inbox-i.db beside. */
char *
inbox_shard_path(const char *path, int i)
{
	const char *slash = strrchr(path, '/');

	if (i == 0)
		return xstrdup(path);
	if (slash == NULL)
		return xasprintf("inbox-%d.db", i);
	return xasprintf("%.*s/inbox-%d.db", (int)(slash - path), path, i);
}

/*
 * Add the shard's entries in state to *n. The state is written in the
 * statement, not bound: the partial index of each state then counts them
 * instead of a scan of the table.
 */
static int
count_state(struct shard *sh, int state, int64_t *n, char **cause)
{
	sqlite3_stmt *st = NULL;
	char *sql = xasprintf("SELECT COUNT(*) FROM inbox WHERE state = %d",
	    state);
	int ret = -1;

	if (sqlite3_prepare_v2(sh->wdb, sql, -1, &st, NULL) != SQLITE_OK ||
	    sqlite3_step(st) != SQLITE_ROW) {
		*cause = db_error(sh->wdb, sqlite3_errcode(sh->wdb),
		    sqlite3_errmsg(sh->wdb));
		goto out;
	}
	*n += sqlite3_column_int64(st, 0);
	ret = 0;
out:
	sqlite3_finalize(st);
	free(sql);
	return ret;
}

static int
shard_open(struct inbox *ib, int i, const char *path, char **cause)
{
	struct shard *sh = &ib->shards[i];

	sh->ib = ib;
	sh->idx = i;
	sh->path = inbox_shard_path(path, i);
	sh->puts_tail = &sh->puts;
	sh->dones_tail = &sh->dones;
	pthread_cond_init(&sh->wcond, NULL);
	if (open_db(sh->path, &sh->wdb, cause) < 0 ||
	    db_exec(sh->wdb, schema, cause) < 0 ||
	    count_state(sh, ST_PENDING, &ib->pending, cause) < 0 ||
	    count_state(sh, ST_DEAD, &ib->dead, cause) < 0)
		return -1;
	return 0;
}

/* Open or create the inbox tables in every shard. */
int
inbox_open(struct inbox **out, const char *path,
    const struct inbox_config *cfg, char **cause)
{
	struct inbox *ib = NULL;
	int i;

	ib = xcalloc(1, sizeof(*ib));
	ib->cfg = *cfg;
	if (ib->cfg.workers <= 0)
		ib->cfg.workers = 1;
	if (ib->cfg.max_attempts <= 0)
		ib->cfg.max_attempts = 8;
	if (ib->cfg.backoff_base_ms <= 0)
		ib->cfg.backoff_base_ms = 1000;
	if (ib->cfg.backoff_max_ms <= 0)
		ib->cfg.backoff_max_ms = 300000;
	if (ib->cfg.wal_restart_frames <= 0)
		ib->cfg.wal_restart_frames = INBOX_WAL_RESTART_FRAMES;
	if (ib->cfg.capacity <= 0)
		ib->cfg.capacity = 1000000;
	pthread_mutex_init(&ib->mu, NULL);
	pthread_cond_init(&ib->qcond, NULL);
	pthread_cond_init(&ib->pcond, NULL);
	pthread_cond_init(&ib->ccond, NULL);
	for (i = 0; i < INBOX_SHARDS; i++) {
		if (shard_open(ib, i, path, cause) < 0) {
			inbox_free(ib);
			return -1;
		}
	}
	*out = ib;
	return 0;
}

static int64_t
read_locked(struct inbox *ib, const int64_t *v)
{
	int64_t n;

	pthread_mutex_lock(&ib->mu);
	n = *v;
	pthread_mutex_unlock(&ib->mu);
	return n;
}

/* Pending + in-progress entries. */
int64_t
inbox_depth(struct inbox *ib)
{
	return read_locked(ib, &ib->pending);
}

/* Dead letters stored, across the shards. */
int64_t
inbox_dead_letters(struct inbox *ib)
{
	return read_locked(ib, &ib->dead);
}

/* Whether the threads run and accept work. */
int
inbox_running(struct inbox *ib)
{
	int r;

	pthread_mutex_lock(&ib->mu);
	r = ib->started && ib->accepting;
	pthread_mutex_unlock(&ib->mu);
	return r;
}

/* ---------------------------------------------------------------- put */

/* FNV-1a: the same key always lands in the same shard. */
int
inbox_key_shard(const char *key)
{
	uint32_t h = 2166136261u;

	for (; *key; key++) {
		h ^= (unsigned char)*key;
		h *= 16777619u;
	}
	return (int)(h % INBOX_SHARDS);
}

/* Queue a delivery for the next group commit of its shard. */
void
inbox_put_async(struct inbox *ib, const char *key, const char *provider,
    const char *event_json, inbox_put_cb cb, void *arg)
{
	struct put_req *p;
	struct shard *sh;

	pthread_mutex_lock(&ib->mu);
	if (!ib->accepting) {
		pthread_mutex_unlock(&ib->mu);
		cb(arg, INBOX_ERROR);
		return;
	}
	/*
	 * No capacity check here: a full inbox still answers a redelivery
	 * of a stored entry as a duplicate, which only the writer can tell.
	 */
	p = xcalloc(1, sizeof(*p));
	p->key = xstrdup(key);
	p->provider = xstrdup(provider);
	p->event_len = strlen(event_json);
	p->event = xmalloc(p->event_len + 1);
	memcpy(p->event, event_json, p->event_len + 1);
	p->cb = cb;
	p->arg = arg;
	sh = &ib->shards[inbox_key_shard(key)];
	*sh->puts_tail = p;
	sh->puts_tail = &p->next;
	pthread_cond_signal(&sh->wcond);
	pthread_mutex_unlock(&ib->mu);
}

struct put_wait {
	struct inbox *ib;
	int done;
	enum inbox_put_result r;
};

static void
put_wait_cb(void *arg, enum inbox_put_result r)
{
	struct put_wait *w = arg;

	pthread_mutex_lock(&w->ib->mu);
	w->r = r;
	w->done = 1;
	pthread_cond_broadcast(&w->ib->pcond);
	pthread_mutex_unlock(&w->ib->mu);
}

/* Queue a delivery and wait until it is settled. */
enum inbox_put_result
inbox_put(struct inbox *ib, const char *key, const char *provider,
    const char *event_json)
{
	struct put_wait w = { ib, 0, INBOX_ERROR };

	inbox_put_async(ib, key, provider, event_json, put_wait_cb, &w);
	pthread_mutex_lock(&ib->mu);
	while (!w.done)
		pthread_cond_wait(&ib->pcond, &ib->mu);
	pthread_mutex_unlock(&ib->mu);
	return w.r;
}

/* ------------------------------------------------------------- writer */

static int64_t
backoff_ms(const struct inbox *ib, int attempts)
{
	return backoff_jitter_ms(backoff_delay_ms(ib->cfg.backoff_base_ms,
	    ib->cfg.backoff_max_ms, attempts > 1 ? (unsigned)attempts - 1 :
	    0));
}

/*
 * When a retried entry runs again: at the time its handler named (a rate
 * limit's reset), kept between the first backoff step and an hour from
 * now; else after the backoff of its attempts.
 */
static int64_t
next_attempt_ms(const struct inbox *ib, const struct done_req *d,
    int64_t now)
{
	int64_t at = d->item.retry_at_ms;

	if (at <= 0)
		return now + backoff_ms(ib, d->attempts);
	if (at < now + ib->cfg.backoff_base_ms)
		return now + ib->cfg.backoff_base_ms;
	return at > now + INBOX_RETRY_AT_MAX_MS ? now + INBOX_RETRY_AT_MAX_MS :
	    at;
}

/*
 * The capacity is shared by the shards, whose writers commit in parallel:
 * a put takes its room before its insert and holds it until its commit
 * turns it into a pending entry (or gives it back), so that the shards
 * together never store more than the capacity.
 */
static int
room_take(struct inbox *ib)
{
	int ok;

	pthread_mutex_lock(&ib->mu);
	ok = ib->pending + ib->reserved < ib->cfg.capacity;
	if (ok)
		ib->reserved++;
	pthread_mutex_unlock(&ib->mu);
	return ok;
}

static void
room_give(struct inbox *ib, int64_t n)
{
	pthread_mutex_lock(&ib->mu);
	ib->reserved -= n;
	pthread_mutex_unlock(&ib->mu);
}

static void
free_done(struct done_req *d)
{
	free(d->key);
	free(d->provider);
	free(d->cause);
	if (d->have_ev)
		scm_event_release(&d->ev);
	free(d);
}

/* What a batch changed, for the counts kept in memory. */
struct batch_counts {
	int64_t stored;		/* entries pending now: new, or requeued */
	int64_t finished;	/* entries done or dead now */
	int64_t dead;		/* dead letters: made, less those requeued */
};

/* Write the event of entry row (a new one's, or a requeued one's anew). */
static int
put_body(sqlite3_stmt *body, int64_t row, const struct put_req *p)
{
	sqlite3_reset(body);
	sqlite3_bind_int64(body, 1, row);
	sqlite3_bind_text(body, 2, p->event, (int)p->event_len,
	    SQLITE_STATIC);
	return sqlite3_step(body) == SQLITE_DONE ? 0 : -1;
}

/*
 * Settle put p whose key is stored already (find: its row), or that has
 * no room (room 0) for a new entry: a redelivery. That of a dead letter,
 * once the operator has fixed its cause, makes it pending again (room
 * allowing: a requeue takes room like a new entry), with the event of
 * the redelivery, just authenticated and normalized by this daemon; that
 * of an entry pending or done is a duplicate, which takes no room
 * (DESIGN 6). Returns 0, or -1 when a statement failed.
 */
static int
put_stored(struct shard *sh, sqlite3_stmt *find, sqlite3_stmt *requeue,
    sqlite3_stmt *body, struct put_req *p, int room, int64_t now)
{
	const unsigned char *err;
	int64_t row;
	int rc;

	sqlite3_reset(find);
	sqlite3_bind_text(find, 1, p->key, -1, SQLITE_STATIC);
	rc = sqlite3_step(find);
	if (rc != SQLITE_ROW && (rc != SQLITE_DONE || room))
		return -1;
	if (rc == SQLITE_ROW && sqlite3_column_int(find, 1) != ST_DEAD) {
		p->result = INBOX_DUPLICATE;
		return 0;
	}
	if (!room) {
		p->result = INBOX_FULL;
		return 0;
	}
	row = sqlite3_column_int64(find, 0);
	p->dead_attempts = sqlite3_column_int(find, 2);
	err = sqlite3_column_text(find, 3);
	p->dead_error = err != NULL ? xstrdup((const char *)err) : NULL;
	sqlite3_reset(find);
	/*
	 * Received anew: the first day's patience with rate limits and
	 * outages counts from now (its last error stays until the next
	 * attempt writes its own)
	 */
	sqlite3_reset(requeue);
	sqlite3_bind_int64(requeue, 1, row);
	sqlite3_bind_int64(requeue, 2, now);
	if (sqlite3_step(requeue) != SQLITE_DONE ||
	    sqlite3_changes(sh->wdb) != 1 || put_body(body, row, p) < 0)
		return -1;
	p->result = INBOX_REQUEUED;
	p->received_ms = now;
	p->id = ID_MAKE(row, sh->idx);
	return 0;
}

/*
 * Write one batch in one transaction. Puts get their result; dones are
 * applied; on failure everything is rolled back and reported.
 */
static void
commit_batch(struct shard *sh, struct put_req *puts, struct done_req *dones,
    struct batch_counts *n)
{
	struct inbox *ib = sh->ib;
	sqlite3_stmt *ins = NULL, *body = NULL, *upd = NULL, *find = NULL;
	sqlite3_stmt *requeue = NULL;
	struct put_req *p;
	struct done_req *d;
	int64_t now = now_unix_ms();
	int64_t outage_min = ib->cfg.backoff_max_ms < INBOX_OUTAGE_RETRY_MIN_MS ?
	    ib->cfg.backoff_max_ms : INBOX_OUTAGE_RETRY_MIN_MS;
	int ok = 0;

	memset(n, 0, sizeof(*n));
	if (db_step(sh->wdb, "BEGIN IMMEDIATE") < 0)
		goto out;
	ins = db_stmt(sh->wdb,
	    "INSERT INTO inbox (key, provider, event, received_at)"
	    " VALUES (?1, ?2, '', ?3) ON CONFLICT(key) DO NOTHING");
	/* the body in its own table, rewritten by a requeue alone */
	body = db_stmt(sh->wdb,
	    "INSERT INTO inbox_body (id, event) VALUES (?1, ?2)"
	    " ON CONFLICT(id) DO UPDATE SET event = excluded.event");
	upd = db_stmt(sh->wdb,
	    "UPDATE inbox SET state = ?2, attempts = ?3, next_at = ?4,"
	    " last_error = ?5, finished_at = ?6 WHERE id = ?1");
	find = db_stmt(sh->wdb, "SELECT id, state, attempts, last_error"
	    " FROM inbox WHERE key = ?1");
	requeue = db_stmt(sh->wdb, "UPDATE inbox SET state = 0, attempts = 0,"
	    " next_at = 0, received_at = ?2, finished_at = NULL"
	    " WHERE id = ?1 AND state = 2");
	if (ins == NULL || body == NULL || upd == NULL || find == NULL ||
	    requeue == NULL)
		goto rollback;
	for (p = puts; p != NULL; p = p->next) {
		int room = room_take(ib);

		if (room) {
			sqlite3_reset(ins);
			sqlite3_bind_text(ins, 1, p->key, -1, SQLITE_STATIC);
			sqlite3_bind_text(ins, 2, p->provider, -1,
			    SQLITE_STATIC);
			sqlite3_bind_int64(ins, 3, now);
			if (sqlite3_step(ins) != SQLITE_DONE) {
				room_give(ib, 1);
				goto rollback;
			}
		}
		if (room && sqlite3_changes(sh->wdb) == 1) {
			int64_t row = sqlite3_last_insert_rowid(sh->wdb);

			if (put_body(body, row, p) < 0) {
				room_give(ib, 1);
				goto rollback;
			}
			p->result = INBOX_STORED;
			p->received_ms = now;
			p->id = ID_MAKE(row, sh->idx);
			n->stored++;
			continue;
		}
		if (put_stored(sh, find, requeue, body, p, room, now) < 0) {
			if (room)
				room_give(ib, 1);
			goto rollback;
		}
		if (p->result == INBOX_REQUEUED) {
			n->stored++;
			n->dead--;
		} else if (room) {
			room_give(ib, 1);
		}
	}
	for (d = dones; d != NULL; d = d->next) {
		int state = ST_PENDING, outage;
		int64_t next_at = 0;

		if (d->outcome == INBOX_DONE && d->effect != NULL) {
			if (db_step(sh->wdb, "SAVEPOINT effect") < 0)
				goto rollback;
			if (d->effect(sh->wdb, &d->item, d->effect_arg) < 0) {
				/*
				 * Some errors (a full disk, I/O) roll the
				 * whole transaction back, not only the
				 * savepoint: what follows would then be
				 * written outside it, statement by statement.
				 */
				if (sqlite3_get_autocommit(sh->wdb)) {
					log_kv(LOG_ERROR, "inbox effect ended "
					    "the transaction", "delivery",
					    d->key, NULL);
					goto rollback;
				}
				db_step(sh->wdb, "ROLLBACK TO effect");
				d->outcome = INBOX_RETRY;
				if (d->cause == NULL)
					d->cause = xstrdup("effect failed");
			}
			if (db_step(sh->wdb, "RELEASE effect") < 0)
				goto rollback;
		}
		/* waiting out a rate limit is no failure, for a day */
		if (d->outcome == INBOX_RETRY && d->item.retry_at_ms > 0 &&
		    now - d->received_ms < INBOX_RETRY_AT_MAX_AGE_MS)
			d->attempts--;
		outage = 0;
		if (d->outcome == INBOX_RETRY &&
		    d->attempts >= ib->cfg.max_attempts) {
			/* an outage is waited out, at the longest backoff */
			outage = d->item.transient &&
			    now - d->received_ms < INBOX_RETRY_AT_MAX_AGE_MS;
			if (outage)
				d->attempts = ib->cfg.max_attempts - 1;
			else
				d->outcome = INBOX_FAIL;
		}
		if (d->outcome == INBOX_DONE)
			state = ST_DONE;
		else if (d->outcome == INBOX_FAIL)
			state = ST_DEAD;
		else
			next_at = next_attempt_ms(ib, d, now);
		/*
		 * however few the attempts, an outage is not hammered: 15 s
		 * at least (or the longest backoff, when shorter)
		 */
		if (outage && next_at < now + outage_min)
			next_at = now + outage_min;
		sqlite3_reset(upd);
		sqlite3_bind_int64(upd, 1, ID_ROW(d->id));
		sqlite3_bind_int(upd, 2, state);
		sqlite3_bind_int(upd, 3, d->attempts);
		sqlite3_bind_int64(upd, 4, next_at);
		if (d->cause != NULL)
			sqlite3_bind_text(upd, 5, d->cause, -1, SQLITE_STATIC);
		else
			sqlite3_bind_null(upd, 5);
		if (state == ST_PENDING)
			sqlite3_bind_null(upd, 6);
		else
			sqlite3_bind_int64(upd, 6, now);
		if (sqlite3_step(upd) != SQLITE_DONE)
			goto rollback;
		if (state != ST_PENDING)
			n->finished++;
		if (state == ST_DEAD)
			n->dead++;
		d->retry_at_ms = next_at;
	}
	if (db_step(sh->wdb, "COMMIT") < 0)
		goto rollback;
	ok = 1;
	goto out;
rollback:
	log_kv(LOG_ERROR, "inbox write failed", "error",
	    sqlite3_errmsg(sh->wdb), NULL);
	db_step(sh->wdb, "ROLLBACK");
out:
	if (ins != NULL)
		sqlite3_reset(ins);
	if (body != NULL)
		sqlite3_reset(body);
	if (upd != NULL)
		sqlite3_reset(upd);
	if (find != NULL)
		sqlite3_reset(find);
	if (requeue != NULL)
		sqlite3_reset(requeue);
	if (!ok) {
		for (p = puts; p != NULL; p = p->next)
			p->result = INBOX_ERROR;
		room_give(ib, n->stored);
		memset(n, 0, sizeof(*n));
		/* completions are retried from the queue a second later */
		for (d = dones; d != NULL; d = d->next) {
			d->outcome = INBOX_RETRY;
			d->retry_at_ms = now + 1000;
		}
	}
}

/* Returns 1 when a batch was full: there is more to prune, soon. */
static int
prune(struct shard *sh)
{
	static const char *const sql[] = {
		/*
		 * The bodies first: in one transaction, with the inbox
		 * table unchanged between the two, the same ids (the oldest
		 * by finished_at, its index's order) are selected twice.
		 */
		"DELETE FROM inbox_body WHERE id IN (SELECT id FROM inbox"
		" WHERE state = 1 AND finished_at < ?1 LIMIT " PRUNE_BATCH_S ")",
		"DELETE FROM inbox WHERE id IN (SELECT id FROM inbox"
		" WHERE state = 1 AND finished_at < ?1 LIMIT " PRUNE_BATCH_S ")",
		/* dead letters: kept for inspection, 30 days at least */
		"DELETE FROM inbox_body WHERE id IN (SELECT id FROM inbox"
		" WHERE state = 2 AND finished_at < ?1 LIMIT " PRUNE_BATCH_S ")",
		"DELETE FROM inbox WHERE id IN (SELECT id FROM inbox"
		" WHERE state = 2 AND finished_at < ?1 LIMIT " PRUNE_BATCH_S ")",
		/* the audit trail of handled events: as the entries done */
		"DELETE FROM handled_events WHERE rowid IN (SELECT rowid FROM"
		" handled_events WHERE handled_at < ?1 LIMIT " PRUNE_BATCH_S
		")",
	};
	struct inbox *ib = sh->ib;
	int64_t keep = ib->cfg.retention_s * 1000, now = now_unix_ms();
	int64_t keep_done = keep, cutoff[ARRAY_SIZE(sql)];
	int n = 0, ndead = 0, full = 0;
	size_t i;

	/*
	 * A finished entry's key answers a replay of its signed delivery as
	 * a duplicate: pruned while the signature still verifies, the
	 * replay would be stored and acted on again. A shorter retention
	 * applies to the audit rows alone.
	 */
	if (keep_done < INBOX_REPLAY_KEEP_S * 1000LL)
		keep_done = INBOX_REPLAY_KEEP_S * 1000LL;
	cutoff[0] = cutoff[1] = now - keep_done;
	cutoff[4] = now - keep;
	cutoff[2] = cutoff[3] = now - (keep > DEAD_KEEP_MS ? keep :
	    DEAD_KEEP_MS);
	if (db_step(sh->wdb, "BEGIN IMMEDIATE") < 0)
		return 0;
	for (i = 0; i < ARRAY_SIZE(sql); i++) {
		sqlite3_stmt *st = db_stmt(sh->wdb, sql[i]);

		if (st == NULL)
			goto fail;
		sqlite3_bind_int64(st, 1, cutoff[i]);
		if (sqlite3_step(st) != SQLITE_DONE) {
			sqlite3_reset(st);
			goto fail;
		}
		sqlite3_reset(st);
		/* the entries, not their bodies or audit rows, are counted */
		if (i == 1 || i == 3)
			n += sqlite3_changes(sh->wdb);
		full |= sqlite3_changes(sh->wdb) >= PRUNE_BATCH;
		if (i == 3)
			ndead = sqlite3_changes(sh->wdb);
	}
	if (db_step(sh->wdb, "COMMIT") < 0)
		goto fail;
	pthread_mutex_lock(&ib->mu);
	ib->dead -= ndead;
	pthread_mutex_unlock(&ib->mu);
	if (n > 0) {
		char num[32];

		snprintf(num, sizeof(num), "%d", n);
		log_kv(LOG_INFO, "inbox pruned finished entries and old dead "
		    "letters", "count", num, NULL);
	}
	return full;
fail:
	log_kv(LOG_ERROR, "inbox prune failed", "error",
	    sqlite3_errmsg(sh->wdb), NULL);
	db_step(sh->wdb, "ROLLBACK");
	return 0;
}

static const char *
outcome_name(int o)
{
	return o == INBOX_DONE ? "done" : o == INBOX_RETRY ? "retry" : "dead";
}

static void *
writer_main(void *arg)
{
	struct shard *sh = arg;
	struct inbox *ib = sh->ib;

	thread_name("inbox-writer");
	pthread_mutex_lock(&ib->mu);
	for (;;) {
		struct put_req *puts, *p, *pn;
		struct done_req *dones, *d, *dn;
		struct batch_counts n;
		int64_t now, wall;

		/*
		 * Puts are committed at once: a client waits for each.
		 * Completions wait up to DONE_LINGER_MS to share a commit
		 * with each other (and the puts then); nobody waits for them,
		 * and a crash before their commit only means a second
		 * attempt. Taken with every commit of puts, they came a few
		 * at a time, and each few wrote again the pages they share
		 * (the handled_events leaf and indexes, the inbox indexes).
		 */
		for (;;) {
			int64_t t = now_mono_ms(), wait = 1000;

			if (sh->ckpt_hold && !ib->workers_done) {
				pthread_cond_wait(&sh->wcond, &ib->mu);
				continue;
			}
			if (sh->puts != NULL || ib->workers_done ||
			    t - sh->last_prune_ms >= 60000)
				break;
			if (sh->dones != NULL) {
				wait = sh->dones_since_ms + DONE_LINGER_MS - t;
				if (wait <= 0 || sh->ndones >= DONE_BATCH)
					break;
			}
			timed_wait(&sh->wcond, &ib->mu, wait);
		}
		if (sh->puts == NULL && sh->dones == NULL && ib->workers_done)
			break;
		puts = sh->puts;
		sh->puts = NULL;
		sh->puts_tail = &sh->puts;
		dones = NULL;
		if (sh->dones != NULL && (ib->workers_done ||
		    sh->ndones >= DONE_BATCH || now_mono_ms() -
		    sh->dones_since_ms >= DONE_LINGER_MS)) {
			dones = sh->dones;
			sh->dones = NULL;
			sh->dones_tail = &sh->dones;
			sh->ndones = 0;
		}
		pthread_mutex_unlock(&ib->mu);

		if (puts != NULL || dones != NULL) {
			int64_t t0 = now_mono_ms();
			size_t nentries = 0;

			for (p = puts; p != NULL; p = p->next)
				nentries++;
			for (d = dones; d != NULL; d = d->next)
				nentries++;
			commit_batch(sh, puts, dones, &n);
			metrics_observe("diverge_inbox_commit_seconds", "",
			    (double)(now_mono_ms() - t0) / 1000.0);
			metrics_inc("diverge_inbox_commits_total", "", 1);
			metrics_inc("diverge_inbox_committed_entries_total", "",
			    (double)nentries);
		} else {
			memset(&n, 0, sizeof(n));
		}
		for (p = puts; p != NULL; p = p->next) {
			struct fresh *f;

			if (p->result != INBOX_STORED &&
			    p->result != INBOX_REQUEUED)
				continue;
			f = xmalloc(sizeof(*f));
			f->key = xstrdup(p->key);
			f->provider = xstrdup(p->provider);
			f->event = p->event;	/* now the fresh entry's */
			p->event = NULL;
			f->len = p->event_len;
			f->received_ms = p->received_ms;
			p->fresh = f;
		}
		pthread_mutex_lock(&ib->mu);
		/*
		 * A retry's wall-clock time becomes a monotonic one: the wall
		 * clock read first, so that time passing between the two
		 * reads makes the retry later, never earlier, than asked
		 */
		wall = now_unix_ms();
		now = now_mono_ms();
		/* the room the stored puts held is theirs now */
		ib->reserved -= n.stored;
		ib->pending += n.stored - n.finished;
		ib->dead += n.dead;
		/* a requeued dead letter is in no queue: it joins as new */
		for (p = puts; p != NULL; p = p->next) {
			struct fresh *f = p->fresh;

			if (p->result != INBOX_STORED &&
			    p->result != INBOX_REQUEUED)
				continue;
			/* past the bound, the worker reads it back */
			if (ib->held + f->len <= INBOX_HELD_MAX)
				p->fresh = NULL;	/* now the queue's */
			else
				f = NULL;
			ready_push(ib, p->id, f);
		}
		for (d = dones; d != NULL; d = d->next) {
			if (d->outcome == INBOX_RETRY && !ib->stopping)
				delayed_push(ib, d->id, now +
				    (d->retry_at_ms - wall));
			if (d->recovered)
				ib->recovered_busy = 0;
		}
		if (n.stored > 0 || dones != NULL)
			pthread_cond_broadcast(&ib->qcond);
		if (now - sh->last_prune_ms >= 60000) {
			int more;

			sh->last_prune_ms = now;
			pthread_mutex_unlock(&ib->mu);
			more = prune(sh);
			pthread_mutex_lock(&ib->mu);
			/* a full batch: the next one in a second, not a minute */
			if (more)
				sh->last_prune_ms = now - 59000;
		}
		pthread_mutex_unlock(&ib->mu);

		for (p = puts; p != NULL; p = pn) {
			pn = p->next;
			if (p->result == INBOX_REQUEUED) {
				char att[16];

				snprintf(att, sizeof(att), "%d",
				    p->dead_attempts);
				log_kv(LOG_INFO, "inbox dead letter requeued: "
				    "redelivered", "delivery", p->key,
				    "provider", p->provider, "attempts", att,
				    "error", p->dead_error, NULL);
			}
			p->cb(p->arg, p->result);
			free(p->key);
			free(p->provider);
			free(p->event);
			free(p->dead_error);
			fresh_free(p->fresh);
			free(p);
		}
		for (d = dones; d != NULL; d = dn) {
			dn = d->next;
			metrics_inc("diverge_inbox_processed_total",
			    d->outcome == INBOX_DONE ? "outcome=\"done\"" :
			    d->outcome == INBOX_RETRY ? "outcome=\"retry\"" :
			    "outcome=\"dead\"", 1);
			if (d->outcome == INBOX_DONE)
				metrics_observe("diverge_inbox_processing_seconds",
				    "", (double)(now_unix_ms() -
				    d->received_ms) / 1000.0);
			if (d->outcome != INBOX_DONE) {
				char att[16];

				snprintf(att, sizeof(att), "%d", d->attempts);
				log_kv(d->outcome == INBOX_FAIL ? LOG_ERROR :
				    LOG_WARN, d->outcome == INBOX_FAIL ?
				    "inbox entry dead-lettered" :
				    "inbox entry will be retried",
				    "delivery", d->key, "provider", d->provider,
				    "attempts", att,
				    "outcome", outcome_name(d->outcome),
				    "error", d->cause, NULL);
			}
			free_done(d);
		}
		pthread_mutex_lock(&ib->mu);
	}
	pthread_mutex_unlock(&ib->mu);
	return NULL;
}

/* ------------------------------------------------------------ workers */

struct worker {
	struct inbox *ib;
	sqlite3 *db[INBOX_SHARDS];
	sqlite3_stmt *get[INBOX_SHARDS];
};

static void
worker_free(struct worker *w)
{
	int i;

	for (i = 0; i < INBOX_SHARDS; i++) {
		sqlite3_finalize(w->get[i]);
		if (w->db[i] != NULL)
			db_close(w->db[i]);
	}
	free(w);
}

/* The shard's "clean" mark: 1 when its last run stopped with all done. */
static int
clean_get(struct shard *sh)
{
	sqlite3_stmt *st = NULL;
	int v = 0;

	if (sqlite3_prepare_v2(sh->wdb, "SELECT v FROM inbox_meta WHERE"
	    " k = 'clean'", -1, &st, NULL) == SQLITE_OK &&
	    sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	return v;
}

static int
clean_set(struct shard *sh, int v, char **cause)
{
	return db_exec(sh->wdb, v ? "INSERT INTO inbox_meta (k, v) VALUES"
	    " ('clean', 1) ON CONFLICT (k) DO UPDATE SET v = 1" :
	    "INSERT INTO inbox_meta (k, v) VALUES ('clean', 0) ON CONFLICT"
	    " (k) DO UPDATE SET v = 0", cause);
}

/*
 * Where row is among those left pending by an unfinished run and not yet
 * taken in this one, else -1 (ib->mu held). Such an entry's attempt is
 * counted before it is handled, so that one whose handling kills the
 * daemon is dead-lettered after inbox.max_attempts restarts instead of
 * crashing every one of them.
 */
static ssize_t
recovered_find(const struct shard *sh, int64_t row)
{
	size_t lo = 0, hi = sh->nrecovered, mid;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (sh->recovered[mid] < row)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < sh->nrecovered && sh->recovered[lo] == row &&
	    !sh->recovered_taken[lo])
		return (ssize_t)lo;
	return -1;
}

/* Count an attempt of row before its handling (synchronous, durable). */
static int
count_attempt(sqlite3 *db, int64_t row)
{
	sqlite3_stmt *st = NULL;
	int ok;

	ok = sqlite3_prepare_v2(db, "UPDATE inbox SET attempts = attempts + 1"
	    " WHERE id = ?1 AND state = 0", -1, &st, NULL) == SQLITE_OK;
	if (ok) {
		sqlite3_bind_int64(st, 1, row);
		ok = sqlite3_step(st) == SQLITE_DONE;
	}
	sqlite3_finalize(st);
	return ok ? 0 : -1;
}

/* The recovered entry rec (index + 1) is no longer being handled. */
static void
recovered_release(struct inbox *ib, struct shard *sh, size_t rec,
    int untake)
{
	pthread_mutex_lock(&ib->mu);
	if (untake)
		sh->recovered_taken[rec - 1] = 0;
	ib->recovered_busy = 0;
	pthread_cond_broadcast(&ib->qcond);
	pthread_mutex_unlock(&ib->mu);
}

/*
 * The entry of id as stored, for its handling, into a new done_req (NULL
 * when there is none to handle, or it cannot be read now); rec: its index
 * + 1 among the recovered, else 0.
 */
static struct done_req *
entry_read(struct worker *w, int64_t id, size_t rec)
{
	struct inbox *ib = w->ib;
	struct shard *sh = &ib->shards[ID_SHARD(id)];
	sqlite3_stmt *get = w->get[ID_SHARD(id)];
	struct done_req *d;
	const char *ev;
	int rc, counted = rec > 0;

	if (counted && count_attempt(w->db[ID_SHARD(id)], ID_ROW(id)) < 0) {
		log_kv(LOG_ERROR, "inbox write failed", "error",
		    sqlite3_errmsg(w->db[ID_SHARD(id)]), NULL);
		/* the next try counts it */
		recovered_release(ib, sh, rec, 1);
		pthread_mutex_lock(&ib->mu);
		delayed_push(ib, id, now_mono_ms() + 1000);
		pthread_mutex_unlock(&ib->mu);
		return NULL;
	}
	sqlite3_reset(get);
	sqlite3_bind_int64(get, 1, ID_ROW(id));
	rc = sqlite3_step(get);
	if (rc != SQLITE_ROW) {
		/* already finished (e.g. a duplicate completion): nothing */
		if (rc != SQLITE_DONE) {
			log_kv(LOG_ERROR, "inbox read failed", "error",
			    sqlite3_errmsg(w->db[ID_SHARD(id)]), NULL);
			pthread_mutex_lock(&ib->mu);
			delayed_push(ib, id, now_mono_ms() + 1000);
			pthread_mutex_unlock(&ib->mu);
		}
		sqlite3_reset(get);
		if (counted)
			recovered_release(ib, sh, rec, 0);
		return NULL;
	}
	d = xcalloc(1, sizeof(*d));
	d->recovered = counted;
	d->key = xstrdup((const char *)sqlite3_column_text(get, 0));
	d->provider = xstrdup((const char *)sqlite3_column_text(get, 1));
	d->attempts = sqlite3_column_int(get, 3) + (counted ? 0 : 1);
	d->received_ms = sqlite3_column_int64(get, 4);
	ev = (const char *)sqlite3_column_text(get, 2);
	d->have_ev = ev != NULL && scm_event_decode(&d->ev, ev,
	    (size_t)sqlite3_column_bytes(get, 2)) == 0;
	sqlite3_reset(get);
	return d;
}

/*
 * Handle entry id; rec: its index + 1 among the recovered, else 0; fresh:
 * the entry as its put stored it, or NULL (freed here).
 */
static void
process(struct worker *w, int64_t id, size_t rec, struct fresh *fresh)
{
	struct inbox *ib = w->ib;
	struct shard *sh = &ib->shards[ID_SHARD(id)];
	struct done_req *d;
	int counted = rec > 0;

	if (fresh != NULL && !counted) {
		/* its first attempt: what the row holds, without a read */
		d = xcalloc(1, sizeof(*d));
		d->key = fresh->key;	/* now d's */
		d->provider = fresh->provider;
		d->attempts = 1;
		d->received_ms = fresh->received_ms;
		d->have_ev = scm_event_decode(&d->ev, fresh->event,
		    fresh->len) == 0;
		free(fresh->event);
		free(fresh);
	} else {
		fresh_free(fresh);
		d = entry_read(w, id, rec);
		if (d == NULL)
			return;
	}
	d->id = id;
	d->shard = sh->idx;
	d->item.id = id;
	d->item.key = d->key;
	d->item.provider = d->have_ev ? scm_provider_name(d->ev.provider) :
	    NULL;
	d->item.event = d->have_ev ? &d->ev : NULL;
	d->item.attempts = d->attempts - 1;
	d->item.received_ms = d->received_ms;
	if (counted && d->attempts > ib->cfg.max_attempts) {
		/* its earlier attempts never finished: the daemon died */
		d->outcome = INBOX_FAIL;
		d->cause = xasprintf("not handled again after %d attempts, "
		    "the last ones cut short: the daemon stopped (crashed?) "
		    "while handling it", d->attempts - 1);
		log_kv(LOG_ERROR, "inbox entry dead-lettered: its handling "
		    "never finished", "delivery", d->key, NULL);
	} else if (!d->have_ev) {
		d->outcome = INBOX_FAIL;
		d->cause = xstrdup("stored event cannot be decoded");
	} else {
		d->outcome = ib->h.handle(ib->h.arg, &d->item, &d->cause);
		if (d->outcome != INBOX_DONE && d->outcome != INBOX_RETRY)
			d->outcome = INBOX_FAIL;
	}
	d->effect = d->item.effect;
	d->effect_arg = d->item.effect_arg;

	pthread_mutex_lock(&ib->mu);
	/* the first completion starts the linger clock, a full batch ends it */
	if (sh->dones == NULL) {
		sh->dones_since_ms = now_mono_ms();
		pthread_cond_signal(&sh->wcond);
	}
	*sh->dones_tail = d;
	sh->dones_tail = &d->next;
	if (++sh->ndones >= DONE_BATCH)
		pthread_cond_signal(&sh->wcond);
	pthread_mutex_unlock(&ib->mu);
}

static void *
worker_main(void *arg)
{
	struct worker *w = arg;
	struct inbox *ib = w->ib;

	thread_name("inbox-worker");
	pthread_mutex_lock(&ib->mu);
	for (;;) {
		int64_t wait = delayed_release(ib, now_mono_ms());

		if (ib->rlen > 0) {
			int64_t id = ib->ready[ib->rhead].id;
			struct shard *sh = &ib->shards[ID_SHARD(id)];
			struct fresh *fresh;
			ssize_t at = sh->nrecovered > 0 ?
			    recovered_find(sh, ID_ROW(id)) : -1;

			/* entries left by a crash: one at a time */
			if (at >= 0 && ib->recovered_busy) {
				timed_wait(&ib->qcond, &ib->mu, 100);
				continue;
			}
			fresh = ready_pop(ib).fresh;
			if (at >= 0) {
				sh->recovered_taken[at] = 1;
				ib->recovered_busy = 1;
			}
			pthread_mutex_unlock(&ib->mu);
			process(w, id, at >= 0 ? (size_t)at + 1 : 0, fresh);
			pthread_mutex_lock(&ib->mu);
			continue;
		}
		if (ib->stopping)
			break;
		timed_wait(&ib->qcond, &ib->mu, wait > 0 ? wait : 1);
	}
	pthread_mutex_unlock(&ib->mu);
	worker_free(w);
	return NULL;
}

/*
 * Checkpoint every shard's WAL into its database twice a second, from
 * connections of its own, so commits never pay for a checkpoint. PASSIVE
 * never blocks a writer, but under steady load it never catches up with
 * one either: frames are appended while it copies, the WAL is never
 * entirely checkpointed, so it is never rewound and grows without bound
 * (each new block costs the kernel a zeroing on top). So once a WAL is
 * long, a RESTART follows: it holds the shard's writer back while it
 * copies what was appended since the last pass and syncs, and the next
 * commit starts again at the head of the file. To keep that hold short,
 * PASSIVE passes run back to back until one of them finds little to copy
 * (a pass of at most CKPT_CAUGHT_UP_MS); after CKPT_MAX_PASSES passes the
 * RESTART runs anyway, so the WAL stays bounded under any load.
 */
#define CKPT_CAUGHT_UP_MS 3
#define CKPT_MAX_PASSES 16

/*
 * A RESTART holds the shard's write lock while it waits for the readers
 * still on the old WAL. A worker reads for well under a millisecond; a
 * reader that keeps an old snapshot for longer (a backup, a replicator, a
 * sqlite3 shell left in a transaction) is not waited for beyond this,
 * and the rewind is tried again after a back-off (1 s, doubling up to a
 * minute), instead of every put to the shard waiting out the 10 s of the
 * writers' own busy handler at each pass.
 */
#define CKPT_RESTART_WAIT_MS 100
#define CKPT_RESTART_BACKOFF_MS 1000
#define CKPT_RESTART_BACKOFF_MAX_MS 60000

struct ckpt_conn {
	sqlite3 *db;
	int64_t deadline;	/* mono ms: the busy handler gives up */
	int64_t restart_at;	/* mono ms: no RESTART before */
	int failed;		/* RESTARTs refused in a row */
};

static int
ckpt_busy(void *arg, int tries)
{
	struct ckpt_conn *c = arg;

	if (now_mono_ms() >= c->deadline)
		return 0;
	return busy_wait(NULL, tries);
}

static void
checkpoint_shard(struct inbox *ib, struct shard *sh, struct ckpt_conn *c)
{
	sqlite3 *db = c->db;
	int pass, rc;

	for (pass = 0; pass < CKPT_MAX_PASSES; pass++) {
		int nlog = 0, nckpt = 0;
		int64_t t0 = now_mono_ms();

		if (sqlite3_wal_checkpoint_v2(db, NULL,
		    SQLITE_CHECKPOINT_PASSIVE, &nlog, &nckpt) != SQLITE_OK ||
		    nlog <= ib->cfg.wal_restart_frames)
			return;
		if (now_mono_ms() - t0 <= CKPT_CAUGHT_UP_MS)
			break;
	}
	if (now_mono_ms() < c->restart_at)
		return;
	/*
	 * The shard's own writer stands aside meanwhile, so that the wait is
	 * for the readers, not a race with it for the write lock.
	 */
	pthread_mutex_lock(&ib->mu);
	sh->ckpt_hold = 1;
	pthread_mutex_unlock(&ib->mu);
	c->deadline = now_mono_ms() + CKPT_RESTART_WAIT_MS;
	rc = sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_RESTART,
	    NULL, NULL);
	pthread_mutex_lock(&ib->mu);
	sh->ckpt_hold = 0;
	pthread_cond_signal(&sh->wcond);
	pthread_mutex_unlock(&ib->mu);
	if (rc == SQLITE_BUSY) {
		c->restart_at = now_mono_ms() + backoff_delay_ms(
		    CKPT_RESTART_BACKOFF_MS, CKPT_RESTART_BACKOFF_MAX_MS,
		    (unsigned)c->failed++);
	} else {
		c->failed = 0;
	}
}

static void *
checkpointer_main(void *arg)
{
	struct inbox *ib = arg;
	struct ckpt_conn c[INBOX_SHARDS];
	char *cause = NULL;
	int i;

	/*
	 * Normal priority, not background: a checkpointer starved by a
	 * saturated CPU lets the WAL grow (measured: the largest WAL went
	 * from about 1/6 to 2/5 of the bytes stored at nice 10).
	 */
	thread_name("inbox-ckpt");
	memset(c, 0, sizeof(c));
	for (i = 0; i < INBOX_SHARDS; i++) {
		if (open_db(ib->shards[i].path, &c[i].db, &cause) < 0) {
			log_kv(LOG_ERROR, "inbox checkpointer", "error", cause,
			    NULL);
			free(cause);
			cause = NULL;
			continue;
		}
		sqlite3_busy_handler(c[i].db, ckpt_busy, &c[i]);
	}
	pthread_mutex_lock(&ib->mu);
	while (!ib->workers_done) {
		timed_wait(&ib->ccond, &ib->mu, 500);
		pthread_mutex_unlock(&ib->mu);
		for (i = 0; i < INBOX_SHARDS; i++)
			if (c[i].db != NULL)
				checkpoint_shard(ib, &ib->shards[i], &c[i]);
		pthread_mutex_lock(&ib->mu);
	}
	pthread_mutex_unlock(&ib->mu);
	for (i = 0; i < INBOX_SHARDS; i++)
		if (c[i].db != NULL)
			db_close(c[i].db);
	return NULL;
}

static int
load_pending(struct shard *sh, int64_t now, int64_t now_wall, char **cause)
{
	struct inbox *ib = sh->ib;
	sqlite3_stmt *st = NULL;
	int clean = clean_get(sh);
	size_t cap = 0;

	if (sqlite3_prepare_v2(sh->wdb,
	    "SELECT id, next_at FROM inbox WHERE state = 0 ORDER BY id", -1,
	    &st, NULL) != SQLITE_OK) {
		*cause = db_error(sh->wdb, sqlite3_errcode(sh->wdb),
		    sqlite3_errmsg(sh->wdb));
		return -1;
	}
	pthread_mutex_lock(&ib->mu);
	while (sqlite3_step(st) == SQLITE_ROW) {
		int64_t id = ID_MAKE(sqlite3_column_int64(st, 0), sh->idx);
		int64_t at = sqlite3_column_int64(st, 1);

		if (at > now_wall)
			delayed_push(ib, id, now + (at - now_wall));
		else
			ready_push(ib, id, NULL);
		if (clean)
			continue;
		if (sh->nrecovered == cap) {
			cap = cap ? cap * 2 : 64;
			sh->recovered = xrealloc(sh->recovered, cap *
			    sizeof(*sh->recovered));
		}
		sh->recovered[sh->nrecovered++] = ID_ROW(id);
	}
	if (sh->nrecovered > 0)
		sh->recovered_taken = xcalloc(sh->nrecovered, 1);
	/* the first prune runs a second after start, then every minute */
	sh->last_prune_ms = now - 59000 + sh->idx * 250;
	pthread_mutex_unlock(&ib->mu);
	sqlite3_finalize(st);
	/* until inbox_stop says otherwise, this run has not finished */
	return clean_set(sh, 0, cause);
}

static struct worker *
worker_new(struct inbox *ib, char **cause)
{
	struct worker *w = xcalloc(1, sizeof(*w));
	int i;

	w->ib = ib;
	for (i = 0; i < INBOX_SHARDS; i++) {
		if (open_db(ib->shards[i].path, &w->db[i], cause) < 0)
			goto fail;
		if (sqlite3_prepare_v2(w->db[i],
		    "SELECT i.key, i.provider, COALESCE(b.event, i.event),"
		    " i.attempts, i.received_at FROM inbox i LEFT JOIN"
		    " inbox_body b ON b.id = i.id WHERE i.id = ?1 AND"
		    " i.state = 0", -1, &w->get[i],
		    NULL) != SQLITE_OK) {
			*cause = db_error(w->db[i],
			    sqlite3_errcode(w->db[i]),
			    sqlite3_errmsg(w->db[i]));
			goto fail;
		}
	}
	return w;
fail:
	worker_free(w);
	return NULL;
}

/* Load unfinished entries, then start the writers and the workers. */
int
inbox_start(struct inbox *ib, const struct inbox_handler *h, char **cause)
{
	int64_t now_wall = now_unix_ms(), now = now_mono_ms();
	int i;

	ib->h = *h;
	for (i = 0; i < INBOX_SHARDS; i++)
		if (load_pending(&ib->shards[i], now, now_wall, cause) < 0)
			return -1;
	pthread_mutex_lock(&ib->mu);
	if (ib->rlen + ib->ndelayed > 0) {
		char n[32];

		snprintf(n, sizeof(n), "%zu", ib->rlen + ib->ndelayed);
		log_kv(LOG_INFO, "inbox resuming unfinished entries", "count",
		    n, NULL);
	}
	ib->accepting = 1;
	pthread_mutex_unlock(&ib->mu);

	metrics_describe("diverge_inbox_depth", METRIC_GAUGE,
	    "Inbox entries stored and not yet finished.");
	metrics_describe("diverge_inbox_processed_total", METRIC_COUNTER,
	    "Inbox entries handled, by outcome (done, retry, dead).");
	metrics_describe("diverge_inbox_processing_seconds", METRIC_HISTOGRAM,
	    "Time from receipt of a delivery to the end of its handling.");
	metrics_describe("diverge_inbox_commit_seconds", METRIC_HISTOGRAM,
	    "Duration of one group commit (transaction and sync).");
	metrics_describe("diverge_inbox_commits_total", METRIC_COUNTER,
	    "Group commits of the inbox writers.");
	metrics_describe("diverge_inbox_committed_entries_total",
	    METRIC_COUNTER, "Puts and completions written by group commits "
	    "(divided by commits: the mean batch size).");
	metrics_describe("diverge_inbox_dead_letters", METRIC_GAUGE,
	    "Inbox entries dead-lettered and kept (state 2), until a "
	    "redelivery requeues them or they are pruned.");
	metrics_gauge_fn("diverge_inbox_depth", "", depth_gauge, ib);
	metrics_gauge_fn("diverge_inbox_dead_letters", "", dead_gauge, ib);
	{
		static const char *const outcomes[] = { "outcome=\"done\"",
		    "outcome=\"retry\"", "outcome=\"dead\"", NULL };
		static const char *const none[] = { "", NULL };

		metrics_zero("diverge_inbox_processed_total", outcomes);
		metrics_zero("diverge_inbox_commits_total", none);
		metrics_zero("diverge_inbox_committed_entries_total", none);
	}

	ib->started = 1;
	for (i = 0; i < INBOX_SHARDS; i++) {
		if (pthread_create(&ib->shards[i].writer, NULL, writer_main,
		    &ib->shards[i]) != 0) {
			*cause = xstrdup("cannot start an inbox writer thread");
			inbox_stop(ib);
			return -1;
		}
		ib->shards[i].running = 1;
	}
	if (pthread_create(&ib->checkpointer, NULL, checkpointer_main,
	    ib) == 0)
		ib->checkpointer_running = 1;
	ib->workers = xcalloc((size_t)ib->cfg.workers, sizeof(pthread_t));
	if (ib->cfg.hold) {
		log_kv(LOG_WARN, "inbox workers held: deliveries are stored "
		    "but not processed", NULL);
		return 0;
	}
	for (i = 0; i < ib->cfg.workers; i++) {
		struct worker *w = worker_new(ib, cause);

		if (w == NULL)
			break;
		if (pthread_create(&ib->workers[i], NULL, worker_main, w) != 0) {
			worker_free(w);
			break;
		}
		ib->nworkers++;
	}
	if (ib->nworkers < ib->cfg.workers) {
		if (*cause == NULL)
			*cause = xstrdup("cannot start the inbox workers");
		inbox_stop(ib);
		return -1;
	}
	return 0;
}

/* Drain and stop the threads. */
void
inbox_stop(struct inbox *ib)
{
	int i;

	pthread_mutex_lock(&ib->mu);
	if (!ib->started || ib->stopping) {
		pthread_mutex_unlock(&ib->mu);
		return;
	}
	ib->accepting = 0;
	ib->stopping = 1;
	/* entries not yet taken stay pending in the database */
	ready_clear(ib);
	ib->ndelayed = 0;
	pthread_cond_broadcast(&ib->qcond);
	pthread_mutex_unlock(&ib->mu);
	for (i = 0; i < ib->nworkers; i++)
		pthread_join(ib->workers[i], NULL);
	pthread_mutex_lock(&ib->mu);
	ib->workers_done = 1;
	for (i = 0; i < INBOX_SHARDS; i++)
		pthread_cond_signal(&ib->shards[i].wcond);
	pthread_cond_signal(&ib->ccond);
	pthread_mutex_unlock(&ib->mu);
	for (i = 0; i < INBOX_SHARDS; i++)
		if (ib->shards[i].running)
			pthread_join(ib->shards[i].writer, NULL);
	if (ib->checkpointer_running)
		pthread_join(ib->checkpointer, NULL);
	/* every handling this run began has finished and been written */
	for (i = 0; i < INBOX_SHARDS; i++) {
		char *cause = NULL;

		if (clean_set(&ib->shards[i], 1, &cause) < 0) {
			log_kv(LOG_WARN, "inbox: cannot record the clean stop",
			    "error", cause, NULL);
			free(cause);
		}
	}
	/*
	 * Leave small files behind: fold the WALs in, but wait for a reader
	 * of an old snapshot no longer than the checkpointer does (the 10 s
	 * of the writers' busy handler, for each shard, held a SIGTERM up);
	 * a WAL left behind is checkpointed after the next start.
	 */
	for (i = 0; i < INBOX_SHARDS; i++) {
		struct ckpt_conn c;

		memset(&c, 0, sizeof(c));
		c.db = ib->shards[i].wdb;
		c.deadline = now_mono_ms() + CKPT_RESTART_WAIT_MS;
		sqlite3_busy_handler(c.db, ckpt_busy, &c);
		sqlite3_wal_checkpoint_v2(c.db, NULL,
		    SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
		sqlite3_busy_handler(c.db, busy_wait, NULL);
	}
}

/* Free the inbox (stopping it first). */
void
inbox_free(struct inbox *ib)
{
	int i;

	if (ib == NULL)
		return;
	inbox_stop(ib);
	for (i = 0; i < INBOX_SHARDS; i++) {
		struct shard *sh = &ib->shards[i];

		if (sh->wdb != NULL)
			db_close(sh->wdb);
		if (sh->path != NULL)
			pthread_cond_destroy(&sh->wcond);
		free(sh->path);
		free(sh->recovered);
		free(sh->recovered_taken);
	}
	pthread_mutex_destroy(&ib->mu);
	pthread_cond_destroy(&ib->qcond);
	pthread_cond_destroy(&ib->pcond);
	pthread_cond_destroy(&ib->ccond);
	ready_clear(ib);
	free(ib->ready);
	free(ib->delayed);
	free(ib->workers);
	free(ib);
}

/* ------------------------------------------------------ record handler */

/* Record the event in handled_events (see scm.h). */
int
inbox_record_effect(struct sqlite3 *db, const struct inbox_item *item,
    void *arg)
{
	sqlite3_stmt *st;
	const struct scm_event *ev = item->event;

	st = db_stmt(db,
	    "INSERT INTO handled_events (key, provider, kind, repo, number,"
	    " comment_id, body, count, handled_at)"
	    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, ?8)"
	    " ON CONFLICT(key) DO UPDATE SET count = count + 1");
	if (st == NULL)
		return -1;
	sqlite3_bind_text(st, 1, item->key, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, item->provider, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, scm_event_kind_name(ev->kind), -1,
	    SQLITE_STATIC);
	sqlite3_bind_text(st, 4, ev->repo, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 5, ev->number);
	sqlite3_bind_int64(st, 6, ev->comment_id);
	/* the start of the comment: the whole of it is the inbox entry's */
	if (ev->comment_body != NULL)
		sqlite3_bind_text(st, 7, ev->comment_body, (int)utf8_cut(
		    ev->comment_body, strlen(ev->comment_body),
		    INBOX_AUDIT_BODY_MAX), SQLITE_STATIC);
	sqlite3_bind_int64(st, 8, now_unix_ms());
	return sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
}

static int
record_handle(void *arg, struct inbox_item *item, char **cause)
{
	if (log_enabled(LOG_DEBUG)) {
		char num[32];

		snprintf(num, sizeof(num), "%lld",
		    (long long)item->event->number);
		log_kv(LOG_DEBUG, "event recorded", "delivery", item->key,
		    "kind", scm_event_kind_name(item->event->kind), "repo",
		    item->event->repo, "number", num, NULL);
	}
	item->effect = inbox_record_effect;
	item->effect_arg = NULL;
	return INBOX_DONE;
}

const struct inbox_handler inbox_record_handler = {
	.handle = record_handle,
	.arg = NULL,
};
