/* The durable inbox: group commit, duplicates, capacity, retries, restart. */
#include "config.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "scm/scm.h"
#include "testutil.h"

struct counter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int calls;
	int entered;		/* calls begun, held or not */
	int fail_first;		/* fail this many calls with RETRY */
	int always;		/* INBOX_DONE/RETRY/FAIL forced */
	int block;		/* hold every call until cleared */
	int record;		/* use the record effect */
	int64_t retry_in_ms;	/* a RETRY names its time: now + this */
	int transient;		/* a RETRY is for an outage */
	int64_t received_ms;	/* the last call's item->received_ms */
	/* the handling's effect, when set */
	int (*effect)(struct sqlite3 *, const struct inbox_item *, void *);
};

static int
count_handle(void *arg, struct inbox_item *item, char **cause)
{
	struct counter *c = arg;
	int n, r = INBOX_DONE;

	pthread_mutex_lock(&c->mu);
	c->entered++;
	pthread_cond_broadcast(&c->cv);
	while (c->block)
		pthread_cond_wait(&c->cv, &c->mu);
	n = ++c->calls;
	c->received_ms = item->received_ms;
	if (c->always)
		r = c->always;
	else if (n <= c->fail_first)
		r = INBOX_RETRY;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (r == INBOX_RETRY && c->retry_in_ms > 0)
		item->retry_at_ms = now_unix_ms() + c->retry_in_ms;
	if (r == INBOX_RETRY)
		item->transient = c->transient;
	if (c->effect != NULL)
		item->effect = c->effect;
	if (r != INBOX_DONE)
		*cause = xasprintf("planned failure %d", n);
	else if (c->record)
		return inbox_record_handler.handle(NULL, item, cause);
	return r;
}

static void
counter_init(struct counter *c)
{
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
}

/* Hold every handling of c from now on (block 1), or let them go (0). */
static void
counter_hold(struct counter *c, int block)
{
	pthread_mutex_lock(&c->mu);
	c->block = block;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

/* Wait until *v, one of c's counts, is n (or ms passed): what it is. */
static int
wait_count(struct counter *c, const int *v, int n, int ms)
{
	int64_t end = now_mono_ms() + ms;
	int got;

	for (;;) {
		pthread_mutex_lock(&c->mu);
		got = *v;
		pthread_mutex_unlock(&c->mu);
		if (got >= n || now_mono_ms() > end)
			return got;
		sleep_ms(5);
	}
}

static int
wait_calls(struct counter *c, int n, int ms)
{
	return wait_count(c, &c->calls, n, ms);
}

static char *
tmpdb(void)
{
	char *d = test_tmpdir("inbox"), *p = xasprintf("%s/diverge.db", d);

	free(d);
	return p;
}

static int64_t
query_shard(const char *path, const char *sql, int *found)
{
	sqlite3 *db;
	sqlite3_stmt *st;
	int64_t v = 0;

	*found = 0;
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL),
	    SQLITE_OK);
	if (sqlite3_step(st) == SQLITE_ROW &&
	    sqlite3_column_type(st, 0) != SQLITE_NULL) {
		v = sqlite3_column_int64(st, 0);
		*found = 1;
	}
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

/*
 * Run sql on every shard: COUNT and SUM add up, MAX takes the largest,
 * anything else is the value of the one shard that has a row (-1: none).
 */
static int64_t
query_int(const char *path, const char *sql)
{
	int64_t v = -1, total = 0;
	int i, found, any = 0;

	for (i = 0; i < INBOX_SHARDS; i++) {
		char *sp = inbox_shard_path(path, i);
		int64_t x = query_shard(sp, sql, &found);

		free(sp);
		if (!found)
			continue;
		if (strncmp(sql, "SELECT COUNT", 12) == 0 ||
		    strncmp(sql, "SELECT SUM", 10) == 0)
			total += x;
		else if (strncmp(sql, "SELECT MAX", 10) == 0)
			total = !any || x > total ? x : total;
		else
			v = x;
		any = 1;
	}
	if (strncmp(sql, "SELECT COUNT", 12) == 0 ||
	    strncmp(sql, "SELECT SUM", 10) == 0 ||
	    strncmp(sql, "SELECT MAX", 10) == 0)
		return total;
	return v;
}

/* Run sql on every shard (the inbox closed). */
static void
exec_shards(const char *path, const char *sql)
{
	int i;

	for (i = 0; i < INBOX_SHARDS; i++) {
		char *sp = inbox_shard_path(path, i);
		sqlite3 *db;

		assert_int_equal(sqlite3_open(sp, &db), SQLITE_OK);
		assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL),
		    SQLITE_OK);
		sqlite3_close(db);
		free(sp);
	}
}

static struct inbox_config
test_config(int64_t capacity, int max_attempts, int64_t retention)
{
	struct inbox_config cfg = {
		.capacity = capacity,
		.workers = 2,
		.max_attempts = max_attempts,
		.retention_s = retention,
		.backoff_base_ms = 10,
		.backoff_max_ms = 40,
	};

	return cfg;
}

/* An inbox started with cfg and handle(c). */
static struct inbox *
open_cfg(const char *path, const struct inbox_config *cfg,
    int (*handle)(void *, struct inbox_item *, char **), struct counter *c)
{
	struct inbox_handler h = { handle, c };
	struct inbox *ib = NULL;
	char *cause = NULL;

	assert_int_equal(inbox_open(&ib, path, cfg, &cause), 0);
	assert_int_equal(inbox_start(ib, &h, &cause), 0);
	return ib;
}

static struct inbox *
open_started(const char *path, struct counter *c, int64_t capacity,
    int max_attempts, int64_t retention)
{
	struct inbox_config cfg = test_config(capacity, max_attempts,
	    retention);

	return open_cfg(path, &cfg, count_handle, c);
}

static const char *EV = "{\"provider\":\"github\",\"kind\":\"comment\","
    "\"repo\":\"o/r\",\"number\":7,\"commentId\":9,\"body\":\"/diverge x\"}";

static void
put_dup_and_record(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;

	counter_init(&c);
	c.record = 1;
	ib = open_started(path, &c, 100, 3, 3600);
	assert_int_equal(inbox_put(ib, "github:a", "github", EV), INBOX_STORED);
	assert_int_equal(inbox_put(ib, "github:a", "github", EV),
	    INBOX_DUPLICATE);
	assert_int_equal(inbox_put(ib, "gitlab:a", "gitlab", EV), INBOX_STORED);
	assert_int_equal(wait_calls(&c, 2, 5000), 2);
	inbox_free(ib);
	assert_int_equal(c.calls, 2);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox"), 2);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE state = 1"), 2);
	assert_int_equal(query_int(path,
	    "SELECT SUM(count) FROM handled_events"), 2);
	assert_int_equal(query_int(path,
	    "SELECT number FROM handled_events WHERE key = 'github:a'"), 7);
	/* the event is in inbox_body; the row that changes state is small */
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox_body"),
	    2);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox i JOIN inbox_body b ON b.id = i.id"
	    " WHERE i.event = '' AND b.event LIKE '%/diverge x%'"), 2);
	free(path);
}

/* What a handler was given, call by call. */
struct seen {
	pthread_mutex_t mu;
	int calls;
	char *key[2], *provider[2], *body[2];
	int attempts[2];
	int64_t received_ms[2], number[2];
};

/* Note what the entry looks like; the first call retries. */
static int
seen_handle(void *arg, struct inbox_item *item, char **cause)
{
	struct seen *s = arg;
	int n;

	pthread_mutex_lock(&s->mu);
	n = s->calls++;
	if (n < 2) {
		s->key[n] = xstrdup(item->key);
		s->provider[n] = xstrdup(item->provider);
		s->body[n] = xstrdup(item->event->comment_body);
		s->attempts[n] = item->attempts;
		s->received_ms[n] = item->received_ms;
		s->number[n] = item->event->number;
	}
	pthread_mutex_unlock(&s->mu);
	if (n == 0) {
		*cause = xstrdup("planned failure");
		return INBOX_RETRY;
	}
	return INBOX_DONE;
}

/*
 * The first attempt of an entry just stored is handed over from memory,
 * a retry reads it back from its row: the handler sees the same entry
 * either way (key, provider, event, receipt time), and the attempts
 * counted.
 */
static void
first_attempt_as_stored(void **state)
{
	char *path = tmpdb(), *cause = NULL;
	struct inbox_config cfg = test_config(100, 5, 3600);
	struct inbox_handler h;
	struct seen s;
	struct inbox *ib = NULL;
	int64_t end = now_mono_ms() + 5000;
	int i, calls = 0;

	memset(&s, 0, sizeof(s));
	pthread_mutex_init(&s.mu, NULL);
	h.handle = seen_handle;
	h.arg = &s;
	assert_int_equal(inbox_open(&ib, path, &cfg, &cause), 0);
	assert_int_equal(inbox_start(ib, &h, &cause), 0);
	assert_int_equal(inbox_put(ib, "github:f", "github", EV),
	    INBOX_STORED);
	while (calls < 2 && now_mono_ms() < end) {
		sleep_ms(5);
		pthread_mutex_lock(&s.mu);
		calls = s.calls;
		pthread_mutex_unlock(&s.mu);
	}
	inbox_free(ib);
	assert_int_equal(calls, 2);
	for (i = 0; i < 2; i++) {
		assert_string_equal(s.key[i], "github:f");
		assert_string_equal(s.provider[i], "github");
		assert_string_equal(s.body[i], "/diverge x");
		assert_int_equal(s.number[i], 7);
		assert_int_equal(s.attempts[i], i);
		assert_int_equal(s.received_ms[i], query_int(path,
		    "SELECT received_at FROM inbox WHERE key = 'github:f'"));
		free(s.key[i]);
		free(s.provider[i]);
		free(s.body[i]);
	}
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:f'"), 1);
	pthread_mutex_destroy(&s.mu);
	free(path);
}

/* An entry stored before inbox_body existed (event in the inbox row). */
static void
legacy_row(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	sqlite3 *db;
	char *sql;

	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	sql = xasprintf("CREATE TABLE inbox (id INTEGER PRIMARY KEY,"
	    " key TEXT NOT NULL UNIQUE, provider TEXT NOT NULL,"
	    " event TEXT NOT NULL, state INTEGER NOT NULL DEFAULT 0,"
	    " attempts INTEGER NOT NULL DEFAULT 0,"
	    " next_at INTEGER NOT NULL DEFAULT 0, last_error TEXT,"
	    " received_at INTEGER NOT NULL, finished_at INTEGER);"
	    "INSERT INTO inbox (key, provider, event, received_at)"
	    " VALUES ('github:old', 'github', '%s', 1);", EV);
	assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
	free(sql);
	sqlite3_close(db);
	counter_init(&c);
	c.record = 1;
	ib = open_started(path, &c, 100, 3, 3600);
	/* the workers may have taken it already: their call is the proof */
	assert_in_range(inbox_depth(ib), 0, 1);
	assert_int_equal(wait_calls(&c, 1, 5000), 1);
	assert_int_equal(inbox_put(ib, "github:new", "github", EV),
	    INBOX_STORED);
	assert_int_equal(wait_calls(&c, 2, 5000), 2);
	inbox_free(ib);
	assert_int_equal(query_int(path,
	    "SELECT number FROM handled_events WHERE key = 'github:old'"), 7);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM handled_events"), 2);
	free(path);
}

/* The audit trail keeps the first KiB of a comment, cut between chars. */
static void
audit_body_capped(void **state)
{
	struct buf ev;
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	int i;

	buf_init(&ev, 1 << 20);
	buf_addstr(&ev, "{\"provider\":\"github\",\"kind\":\"comment\","
	    "\"repo\":\"o/r\",\"number\":7,\"commentId\":9,"
	    "\"body\":\"/diverge x ");
	for (i = 0; i < 1500; i++)
		buf_addstr(&ev, "\u00e9");
	buf_addstr(&ev, "\"}");
	counter_init(&c);
	c.record = 1;
	ib = open_started(path, &c, 100, 3, 3600);
	assert_int_equal(inbox_put(ib, "github:long", "github", ev.data),
	    INBOX_STORED);
	assert_int_equal(wait_calls(&c, 1, 5000), 1);
	inbox_free(ib);
	/* 11 ASCII bytes, then 2-byte characters: 1024 would split one */
	assert_int_equal(query_int(path, "SELECT length(CAST(body AS BLOB))"
	    " FROM handled_events"), 1023);
	assert_int_equal(query_int(path, "SELECT length(CAST(event AS BLOB)) FROM"
	    " inbox_body") > 3000, 1);
	buf_release(&ev);
	free(path);
}

static void
capacity_refuses(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	char key[32];
	int i;

	counter_init(&c);
	c.block = 1;
	ib = open_started(path, &c, 3, 3, 3600);
	for (i = 0; i < 3; i++) {
		snprintf(key, sizeof(key), "github:%d", i);
		assert_int_equal(inbox_put(ib, key, "github", EV),
		    INBOX_STORED);
		/* a duplicate takes no room: the next one still fits */
		assert_int_equal(inbox_put(ib, key, "github", EV),
		    INBOX_DUPLICATE);
	}
	assert_int_equal(inbox_depth(ib), 3);
	assert_int_equal(inbox_put(ib, "github:x", "github", EV), INBOX_FULL);
	/* a redelivery of a stored entry is a duplicate, full or not */
	assert_int_equal(inbox_put(ib, "github:1", "github", EV),
	    INBOX_DUPLICATE);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox"), 3);
	/* release the handler: room again */
	counter_hold(&c, 0);
	assert_int_equal(wait_calls(&c, 3, 5000), 3);
	for (i = 0; i < 200 && inbox_depth(ib) > 0; i++)
		sleep_ms(10);
	assert_int_equal(inbox_depth(ib), 0);
	assert_int_equal(inbox_put(ib, "github:x", "github", EV), INBOX_STORED);
	inbox_free(ib);
	free(path);
}

struct settled {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int n;
	int by[INBOX_REQUEUED + 1];
};

static void
settled_init(struct settled *s)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
}

static void
settled_cb(void *arg, enum inbox_put_result r)
{
	struct settled *s = arg;

	pthread_mutex_lock(&s->mu);
	s->by[r]++;
	s->n++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/*
 * The shards commit in parallel, so the room left is shared between
 * them: here every shard's writer takes its first puts while the inbox
 * is empty (the test holds all their write locks meanwhile), and the
 * four commits together must still store no more than the capacity.
 */
static void
capacity_across_shards(void **state)
{
	char *path = tmpdb();
	struct inbox_config cfg = test_config(3, 3, 3600);
	struct counter c;
	struct inbox *ib;
	struct settled s;
	sqlite3 *lock[INBOX_SHARDS];
	char key[32];
	int i;

	(void)state;
	counter_init(&c);
	settled_init(&s);
	cfg.hold = 1;
	ib = open_cfg(path, &cfg, count_handle, &c);
	for (i = 0; i < INBOX_SHARDS; i++) {
		char *sp = inbox_shard_path(path, i);

		assert_int_equal(sqlite3_open(sp, &lock[i]), SQLITE_OK);
		assert_int_equal(sqlite3_exec(lock[i], "BEGIN IMMEDIATE", NULL,
		    NULL, NULL), SQLITE_OK);
		free(sp);
	}
	/* 40 keys: every shard gets some (FNV-1a spreads them) */
	for (i = 0; i < 40; i++) {
		snprintf(key, sizeof(key), "github:cap-%d", i);
		inbox_put_async(ib, key, "github", EV, settled_cb, &s);
	}
	sleep_ms(200);		/* the writers wait on the locks */
	for (i = 0; i < INBOX_SHARDS; i++) {
		assert_int_equal(sqlite3_exec(lock[i], "COMMIT", NULL, NULL,
		    NULL), SQLITE_OK);
		sqlite3_close(lock[i]);
	}
	pthread_mutex_lock(&s.mu);
	while (s.n < 40)
		pthread_cond_wait(&s.cv, &s.mu);
	pthread_mutex_unlock(&s.mu);
	assert_int_equal(s.by[INBOX_STORED], 3);
	assert_int_equal(s.by[INBOX_FULL], 37);
	assert_int_equal(inbox_depth(ib), 3);
	inbox_free(ib);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox"), 3);
	free(path);
}

static int full_effect_calls;

/*
 * An effect that finds the disk full the first time (SQLite then rolls
 * back the whole transaction, not only the effect's savepoint), and
 * records the event after that.
 */
static int
full_effect(struct sqlite3 *db, const struct inbox_item *item, void *arg)
{
	sqlite3_stmt *st;
	int rc;

	if (__atomic_fetch_add(&full_effect_calls, 1, __ATOMIC_SEQ_CST) > 0)
		return inbox_record_effect(db, item, arg);
	assert_int_equal(sqlite3_exec(db, "PRAGMA max_page_count = 1", NULL,
	    NULL, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, "INSERT INTO handled_events"
	    " (key, provider, kind, body, count, handled_at) VALUES"
	    " ('full', 'github', 'comment', zeroblob(100000), 1, 1)", -1,
	    &st, NULL), SQLITE_OK);
	rc = sqlite3_step(st);
	sqlite3_finalize(st);
	assert_int_equal(rc, SQLITE_FULL);
	/* room again for whatever comes next */
	assert_int_equal(sqlite3_exec(db, "PRAGMA max_page_count = 1000000",
	    NULL, NULL, NULL), SQLITE_OK);
	return -1;
}

/*
 * An effect that fails on a full disk takes the whole transaction with
 * it: the completions after it in the batch must not be written one by
 * one outside any transaction while the inbox counts them as retried
 * (their entries were then done on disk and pending forever in the
 * inbox's depth), and a put in the batch is refused and gives back the
 * room it took. Six completions of one shard are held back behind a
 * commit the test blocks, so that they share the next one with an 8th
 * put.
 */
static void
effect_disk_full(void **state)
{
	char *path = tmpdb(), *sp, key[8][32], room[32];
	struct counter c;
	struct inbox_config cfg = test_config(8, 3, 3600);
	struct inbox *ib;
	struct settled s;
	sqlite3 *lock;
	int i, n = 0, shard = inbox_key_shard("github:full-0");

	(void)state;
	counter_init(&c);
	c.block = 1;
	c.effect = full_effect;
	settled_init(&s);
	ib = open_cfg(path, &cfg, count_handle, &c);
	/* eight keys of one shard, six stored; the workers wait */
	for (i = 0; n < 8; i++) {
		snprintf(key[n], sizeof(key[n]), "github:full-%d", i);
		if (inbox_key_shard(key[n]) != shard)
			continue;
		if (n < 6)
			assert_int_equal(inbox_put(ib, key[n], "github", EV),
			    INBOX_STORED);
		n++;
	}
	/* the shard's writer takes a 7th put and waits for the lock */
	sp = inbox_shard_path(path, shard);
	assert_int_equal(sqlite3_open(sp, &lock), SQLITE_OK);
	assert_int_equal(sqlite3_exec(lock, "BEGIN IMMEDIATE", NULL, NULL,
	    NULL), SQLITE_OK);
	inbox_put_async(ib, key[6], "github", EV, settled_cb, &s);
	sleep_ms(100);
	/* the six are handled; their completions queue behind it */
	counter_hold(&c, 0);
	assert_int_equal(wait_calls(&c, 6, 5000), 6);
	sleep_ms(100);
	/* and so does the 8th put: it shares their commit */
	inbox_put_async(ib, key[7], "github", EV, settled_cb, &s);
	assert_int_equal(sqlite3_exec(lock, "COMMIT", NULL, NULL, NULL),
	    SQLITE_OK);
	sqlite3_close(lock);
	pthread_mutex_lock(&s.mu);
	while (s.n < 2)
		pthread_cond_wait(&s.cv, &s.mu);
	pthread_mutex_unlock(&s.mu);
	assert_int_equal(s.by[INBOX_STORED], 1);
	assert_int_equal(s.by[INBOX_ERROR], 1);
	/* the failed batch is retried a second later: all done, once */
	for (i = 0; i < 1000 && inbox_depth(ib) > 0; i++)
		sleep_ms(10);
	assert_int_equal(inbox_depth(ib), 0);
	/* the refused put's room is free again: the capacity, all of it */
	counter_hold(&c, 1);
	for (i = 0; i < 8; i++) {
		snprintf(room, sizeof(room), "github:room-%d", i);
		assert_int_equal(inbox_put(ib, room, "github", EV),
		    INBOX_STORED);
	}
	counter_hold(&c, 0);
	for (i = 0; i < 1000 && inbox_depth(ib) > 0; i++)
		sleep_ms(10);
	inbox_free(ib);
	assert_true(full_effect_calls > 1);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE state = 1"), 15);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM handled_events"), 15);
	assert_int_equal(query_int(path,
	    "SELECT MAX(count) FROM handled_events"), 1);
	free(sp);
	free(path);
}

static void
retry_then_dead(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;

	counter_init(&c);
	c.always = INBOX_RETRY;
	ib = open_started(path, &c, 100, 3, 3600);
	assert_int_equal(inbox_put(ib, "github:r", "github", EV), INBOX_STORED);
	assert_int_equal(wait_calls(&c, 3, 5000), 3);
	/* no fourth attempt */
	sleep_ms(300);
	inbox_free(ib);
	assert_int_equal(c.calls, 3);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:r'"), 2);
	assert_int_equal(query_int(path,
	    "SELECT attempts FROM inbox WHERE key = 'github:r'"), 3);
	free(path);
}

/*
 * A retry waits the backoff of its attempts: after the first, between
 * half the first step and the whole of it (equal jitter), neither two
 * steps nor the 15 s an outage waits. Four entries: each retry time is
 * random, and a wrong one could fall inside the bounds by chance.
 */
static void
retry_backoff(void **state)
{
	char *path = tmpdb(), *sql, key[32];
	struct inbox_config cfg = test_config(100, 5, 3600);
	struct counter c;
	struct inbox *ib;
	int64_t t0, t1;
	int i;

	(void)state;
	counter_init(&c);
	c.always = INBOX_RETRY;
	cfg.backoff_base_ms = 10000;
	cfg.backoff_max_ms = 600000;
	ib = open_cfg(path, &cfg, count_handle, &c);
	t0 = now_unix_ms();
	for (i = 0; i < 4; i++) {
		snprintf(key, sizeof(key), "github:b%d", i);
		assert_int_equal(inbox_put(ib, key, "github", EV),
		    INBOX_STORED);
	}
	/* the retries written, seconds before the first of them is due */
	for (i = 0; i < 500 && query_int(path, "SELECT COUNT(*) FROM inbox"
	    " WHERE attempts = 1") < 4; i++)
		sleep_ms(10);
	t1 = now_unix_ms();
	inbox_free(ib);
	sql = xasprintf("SELECT COUNT(*) FROM inbox WHERE attempts = 1 AND"
	    " next_at BETWEEN %lld AND %lld", (long long)t0 + 5000,
	    (long long)t1 + 10000);
	assert_int_equal(query_int(path, sql), 4);
	free(sql);
	free(path);
}

/*
 * A retry for an outage (a service unavailable) is not dead-lettered when
 * the attempts run out: it goes on at the longest backoff until the
 * service is back, for up to a day from its receipt; after that it is.
 */
/* An inbox (max_attempts 2) whose handler retries for an outage. */
static struct inbox *
open_outage(const char *path, struct counter *c)
{
	counter_init(c);
	c->always = INBOX_RETRY;
	c->transient = 1;
	return open_started(path, c, 100, 2, 3600);
}

static void
transient_waits_out_outage(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;

	(void)state;
	ib = open_outage(path, &c);
	assert_int_equal(inbox_put(ib, "github:o", "github", EV),
	    INBOX_STORED);
	assert_int_equal(wait_calls(&c, 6, 5000), 6);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:o'"), 0);
	assert_true(query_int(path,
	    "SELECT attempts FROM inbox WHERE key = 'github:o'") <= 1);
	/* the service is back */
	pthread_mutex_lock(&c.mu);
	c.always = INBOX_DONE;
	pthread_mutex_unlock(&c.mu);
	assert_true(wait_calls(&c, 7, 5000) >= 7);
	sleep_ms(200);
	inbox_free(ib);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:o'"), 1);

	/* received two days ago: the outage is a failure now */
	ib = open_outage(path, &c);
	assert_int_equal(inbox_put(ib, "github:old", "github", EV),
	    INBOX_STORED);
	assert_true(wait_calls(&c, 1, 5000) >= 1);
	inbox_free(ib);
	exec_shards(path, "UPDATE inbox SET received_at = received_at -"
	    " 2 * 86400000, next_at = 0 WHERE key = 'github:old'");
	ib = open_outage(path, &c);
	assert_true(wait_calls(&c, 1, 5000) >= 1);
	sleep_ms(300);
	inbox_free(ib);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:old'"), 2);
	free(path);
}

/* Retries at many different times: each entry's own, none lost. */
#define SPREAD_N 300

struct spread {
	pthread_mutex_t mu;
	int calls[SPREAD_N];
	int64_t due[SPREAD_N];	/* wall ms the retry asked for */
	int64_t early;		/* the most a retry came before its time */
	int64_t late;		/* the most one came after it */
	int done;
};

static int
spread_handle(void *arg, struct inbox_item *item, char **cause)
{
	struct spread *sp = arg;
	int k = (int)strtol(strchr(item->key, ':') + 1, NULL, 10);
	int r = INBOX_DONE;
	int64_t now = now_unix_ms();

	pthread_mutex_lock(&sp->mu);
	if (sp->calls[k]++ == 0) {
		/* a spread of times, not in the order of the puts */
		sp->due[k] = now + 20 + (k * 7919) % 3000;
		item->retry_at_ms = sp->due[k];
		*cause = xstrdup("later");
		r = INBOX_RETRY;
	} else {
		if (sp->due[k] - now > sp->early)
			sp->early = sp->due[k] - now;
		if (now - sp->due[k] > sp->late)
			sp->late = now - sp->due[k];
		sp->done++;
	}
	pthread_mutex_unlock(&sp->mu);
	return r;
}

static void
retries_spread(void **state)
{
	char *path = tmpdb();
	struct inbox_config cfg = test_config(1000, 5, 3600);
	struct inbox_handler h;
	struct inbox *ib = NULL;
	struct spread *sp = xcalloc(1, sizeof(*sp));
	char *cause = NULL, key[32];
	int i, done = 0;

	(void)state;
	pthread_mutex_init(&sp->mu, NULL);
	h.handle = spread_handle;
	h.arg = sp;
	assert_int_equal(inbox_open(&ib, path, &cfg, &cause), 0);
	assert_int_equal(inbox_start(ib, &h, &cause), 0);
	for (i = 0; i < SPREAD_N; i++) {
		snprintf(key, sizeof(key), "github:%d", i);
		assert_int_equal(inbox_put(ib, key, "github", EV),
		    INBOX_STORED);
	}
	for (i = 0; i < 1500 && done < SPREAD_N; i++) {
		sleep_ms(10);
		pthread_mutex_lock(&sp->mu);
		done = sp->done;
		pthread_mutex_unlock(&sp->mu);
	}
	inbox_free(ib);
	print_message("# %d of %d retried; earliest %lld ms before its time,"
	    " latest %lld ms after\n", done, SPREAD_N, (long long)sp->early,
	    (long long)sp->late);
	assert_int_equal(done, SPREAD_N);
	for (i = 0; i < SPREAD_N; i++)
		assert_int_equal(sp->calls[i], 2);
	/*
	 * none before its time (the clock's milliseconds aside), none long
	 * after it (the times spread over 3 s: an entry stuck behind a later
	 * one would wait seconds)
	 */
	assert_true(sp->early <= 2);
	assert_true(sp->late < 1000);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE state = 1"), SPREAD_N);
	pthread_mutex_destroy(&sp->mu);
	free(sp);
	free(path);
}

/*
 * An entry waiting out an outage is tried again 15 s later at the
 * soonest, however few attempts inbox.max_attempts allows.
 */
static void
outage_not_hammered(void **state)
{
	char *path = tmpdb();
	struct inbox_config cfg = test_config(100, 1, 3600);
	struct counter c;
	struct inbox *ib;
	int64_t t0 = now_unix_ms();

	(void)state;
	counter_init(&c);
	c.always = INBOX_RETRY;
	c.transient = 1;
	cfg.backoff_max_ms = 60000;
	ib = open_cfg(path, &cfg, count_handle, &c);
	assert_int_equal(inbox_put(ib, "github:h", "github", EV),
	    INBOX_STORED);
	assert_int_equal(wait_calls(&c, 1, 5000), 1);
	sleep_ms(300);
	inbox_free(ib);
	assert_int_equal(c.calls, 1);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:h'"), 0);
	assert_true(query_int(path, "SELECT next_at FROM inbox WHERE"
	    " key = 'github:h'") >= t0 + INBOX_OUTAGE_RETRY_MIN_MS);
	free(path);
}

/*
 * Run an inbox (max_attempts 2) whose handler always retries at now +
 * retry_in_ms, with key put into it (NULL: what it holds), until the
 * handler ran calls times and 200 ms more; the number of runs. *t0: the
 * time of the put.
 */
static int
run_limited(const char *path, const char *key, int64_t retry_in_ms,
    int calls, int64_t *t0)
{
	struct counter c;
	struct inbox *ib;

	counter_init(&c);
	c.always = INBOX_RETRY;
	c.retry_in_ms = retry_in_ms;
	ib = open_started(path, &c, 100, 2, 3600);
	*t0 = now_unix_ms();
	if (key != NULL)
		assert_int_equal(inbox_put(ib, key, "github", EV),
		    INBOX_STORED);
	assert_true(wait_calls(&c, calls, 10000) >= calls);
	sleep_ms(200);
	inbox_free(ib);
	return c.calls;
}

/*
 * A retry at a time the handler names (a rate limit's reset): the next
 * attempt waits for it, bounded by an hour, and such attempts are not
 * failures, so they never dead-letter an entry before the reset (here
 * max_attempts is 2 and the entry is retried more often than that).
 */
static void
retry_at_reset(void **state)
{
	char *path = tmpdb();
	int64_t t0;

	assert_int_equal(run_limited(path, "github:far", 600000, 1, &t0), 1);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:far'"), 0);
	assert_int_equal(query_int(path,
	    "SELECT attempts FROM inbox WHERE key = 'github:far'"), 0);
	assert_in_range(query_int(path, "SELECT next_at FROM inbox"
	    " WHERE key = 'github:far'") - t0, 599000, 605000);
	/*
	 * a reset ten hours away: the next attempt within the hour; the
	 * restart leaves github:far waiting for its reset
	 */
	assert_int_equal(run_limited(path, "github:later", 36000000, 1, &t0),
	    1);
	assert_in_range(query_int(path, "SELECT next_at FROM inbox"
	    " WHERE key = 'github:later'") - t0, 3599000, 3605000);
	/* near resets, many times over max_attempts: still pending */
	assert_true(run_limited(path, "github:near", 20, 6, &t0) >= 6);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:near'"), 0);
	free(path);
}

/*
 * A reset the handler names sooner than the first backoff step is not
 * taken at its word: the entry waits the step (here 2 s), so a handler
 * that keeps naming "now" cannot spin the worker.
 */
static void
retry_at_floor(void **state)
{
	struct inbox_config cfg = test_config(100, 2, 3600);
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	int64_t t0;

	(void)state;
	cfg.backoff_base_ms = 2000;
	cfg.backoff_max_ms = 4000;
	counter_init(&c);
	c.always = INBOX_RETRY;
	c.retry_in_ms = 20;
	ib = open_cfg(path, &cfg, count_handle, &c);
	t0 = now_unix_ms();
	assert_int_equal(inbox_put(ib, "github:soon", "github", EV),
	    INBOX_STORED);
	assert_true(wait_calls(&c, 1, 10000) >= 1);
	sleep_ms(300);
	inbox_free(ib);
	assert_int_equal(c.calls, 1);
	assert_true(query_int(path, "SELECT next_at FROM inbox WHERE"
	    " key = 'github:soon'") - t0 >= 1990);
	free(path);
}

/*
 * A rate limit that lasts beyond a day is no longer waited out for free:
 * an entry received that long ago counts its attempts again and dies.
 */
static void
retry_at_old_entry(void **state)
{
	char *path = tmpdb();
	sqlite3 *db;
	char *sql;
	int64_t t0;

	/* the tables, then an entry stored two days ago */
	run_limited(path, NULL, 20, 0, &t0);
	sql = xasprintf("INSERT INTO inbox (key, provider, event,"
	    " received_at) VALUES ('github:old', 'github', '%s', %lld);", EV,
	    (long long)(now_unix_ms() - 2 * 86400 * 1000));
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
	free(sql);
	sqlite3_close(db);
	assert_int_equal(run_limited(path, NULL, 20, 2, &t0), 2);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:old'"), 2);
	free(path);
}

static void
retry_then_success(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;

	counter_init(&c);
	c.fail_first = 2;
	c.record = 1;
	ib = open_started(path, &c, 100, 5, 3600);
	assert_int_equal(inbox_put(ib, "github:s", "github", EV), INBOX_STORED);
	assert_int_equal(wait_calls(&c, 3, 5000), 3);
	sleep_ms(100);
	inbox_free(ib);
	assert_int_equal(c.calls, 3);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:s'"), 1);
	assert_int_equal(query_int(path,
	    "SELECT count FROM handled_events WHERE key = 'github:s'"), 1);
	free(path);
}

static void
permanent_failure(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;

	counter_init(&c);
	c.always = INBOX_FAIL;
	ib = open_started(path, &c, 100, 5, 3600);
	assert_int_equal(inbox_put(ib, "github:f", "github", EV), INBOX_STORED);
	assert_int_equal(wait_calls(&c, 1, 5000), 1);
	sleep_ms(200);
	inbox_free(ib);
	assert_int_equal(c.calls, 1);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'github:f'"), 2);
	free(path);
}

/* The redelivery's event: another number than EV's, to tell them apart. */
static const char *EV2 = "{\"provider\":\"github\",\"kind\":\"comment\","
    "\"repo\":\"o/r\",\"number\":8,\"commentId\":9,\"body\":\"/diverge x\"}";

/* Poll inbox_dead_letters until it is want (the completions linger). */
static int64_t
wait_dead(struct inbox *ib, int64_t want)
{
	int i;

	for (i = 0; i < 500 && inbox_dead_letters(ib) != want; i++)
		sleep_ms(10);
	return inbox_dead_letters(ib);
}

static int failing_effect_calls;

/*
 * An effect that writes a row, then fails with its transaction intact
 * (as a constraint would) the first time; records the event after that.
 */
static int
failing_effect(struct sqlite3 *db, const struct inbox_item *item, void *arg)
{
	if (__atomic_fetch_add(&failing_effect_calls, 1, __ATOMIC_SEQ_CST) > 0)
		return inbox_record_effect(db, item, arg);
	assert_int_equal(sqlite3_exec(db, "INSERT INTO handled_events"
	    " (key, provider, kind, body, count, handled_at) VALUES"
	    " ('half', 'github', 'comment', 'x', 1, 1)", NULL, NULL, NULL),
	    SQLITE_OK);
	return -1;
}

/*
 * A handling whose effect fails is not finished: the effect's writes are
 * undone with its savepoint and the entry is handled again, done once
 * its effect is written.
 */
static void
effect_failed(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox_config cfg = test_config(100, 3, 3600);
	struct inbox *ib;
	int i;

	(void)state;
	counter_init(&c);
	c.effect = failing_effect;
	ib = open_cfg(path, &cfg, count_handle, &c);
	assert_int_equal(inbox_put(ib, "github:eff", "github", EV),
	    INBOX_STORED);
	assert_int_equal(wait_calls(&c, 2, 10000), 2);
	for (i = 0; i < 1000 && inbox_depth(ib) > 0; i++)
		sleep_ms(10);
	assert_int_equal(inbox_depth(ib), 0);
	inbox_free(ib);
	assert_int_equal(c.calls, 2);
	assert_int_equal(query_int(path, "SELECT state FROM inbox WHERE"
	    " key = 'github:eff'"), 1);
	assert_int_equal(query_int(path, "SELECT attempts FROM inbox WHERE"
	    " key = 'github:eff'"), 2);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM handled_events"
	    " WHERE key = 'github:eff'"), 1);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM handled_events"
	    " WHERE key = 'half'"), 0);
	free(path);
}

/*
 * An outcome the inbox does not know (a handler's bug) is a failure for
 * good, not a retry forever; an event that cannot be decoded is
 * dead-lettered without reaching the handler.
 */
static void
odd_outcome_and_event(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;

	(void)state;
	counter_init(&c);
	c.always = 42;
	ib = open_started(path, &c, 100, 3, 3600);
	assert_int_equal(inbox_put(ib, "github:odd", "github", EV),
	    INBOX_STORED);
	assert_int_equal(wait_dead(ib, 1), 1);
	assert_int_equal(inbox_put(ib, "github:garbled", "github",
	    "{\"provider\":"), INBOX_STORED);
	assert_int_equal(wait_dead(ib, 2), 2);
	inbox_free(ib);
	assert_int_equal(c.calls, 1);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox WHERE"
	    " key = 'github:odd' AND state = 2 AND attempts = 1"), 1);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox WHERE"
	    " key = 'github:garbled' AND state = 2 AND last_error ="
	    " 'stored event cannot be decoded'"), 1);
	free(path);
}

/* An inbox whose handler records, with github:d dead-lettered in it. */
static struct inbox *
open_dead(const char *path, struct counter *c)
{
	struct inbox *ib;

	counter_init(c);
	c->record = 1;
	c->always = INBOX_FAIL;
	ib = open_started(path, c, 100, 3, 3600);
	assert_int_equal(inbox_put(ib, "github:d", "github", EV),
	    INBOX_STORED);
	assert_int_equal(wait_calls(c, 1, 5000), 1);
	assert_int_equal(wait_dead(ib, 1), 1);
	/* the cause is fixed */
	pthread_mutex_lock(&c->mu);
	c->always = 0;
	pthread_mutex_unlock(&c->mu);
	return ib;
}

/*
 * A dead letter's redelivery (the same key) requeues it: pending again,
 * attempts from zero, handled now with the redelivery's event; after
 * that, and for entries pending or done, a redelivery is a duplicate.
 */
static void
requeue_dead_letter(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	int64_t first;
	int i;

	(void)state;
	ib = open_dead(path, &c);
	assert_int_equal(inbox_depth(ib), 0);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox WHERE"
	    " key = 'github:d' AND state = 2 AND last_error ="
	    " 'planned failure 1'"), 1);
	first = query_int(path, "SELECT received_at FROM inbox WHERE"
	    " key = 'github:d'");
	assert_int_equal(inbox_put(ib, "github:d", "github", EV2),
	    INBOX_REQUEUED);
	/* received anew: the day of patience counts from the redelivery */
	assert_true(query_int(path, "SELECT received_at FROM inbox WHERE"
	    " key = 'github:d'") > first);
	assert_int_equal(inbox_dead_letters(ib), 0);
	assert_int_equal(wait_calls(&c, 2, 5000), 2);
	/* its handler is told so (from memory, as the row says) */
	assert_int_equal(c.received_ms, query_int(path, "SELECT received_at"
	    " FROM inbox WHERE key = 'github:d'"));
	for (i = 0; i < 500 && inbox_depth(ib) > 0; i++)
		sleep_ms(10);
	assert_int_equal(inbox_depth(ib), 0);
	assert_int_equal(inbox_put(ib, "github:d", "github", EV),
	    INBOX_DUPLICATE);
	inbox_free(ib);
	assert_int_equal(c.calls, 2);
	assert_int_equal(query_int(path, "SELECT state FROM inbox WHERE"
	    " key = 'github:d'"), 1);
	/* one attempt since the requeue, which counted from zero */
	assert_int_equal(query_int(path, "SELECT attempts FROM inbox WHERE"
	    " key = 'github:d'"), 1);
	assert_int_equal(query_int(path, "SELECT number FROM handled_events"
	    " WHERE key = 'github:d'"), 8);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox_body"),
	    1);
	free(path);
}

/* Two redeliveries of a dead letter at once: one requeues it, once. */
static void
requeue_once(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct settled s;
	struct inbox *ib;

	(void)state;
	ib = open_dead(path, &c);
	settled_init(&s);
	inbox_put_async(ib, "github:d", "github", EV2, settled_cb, &s);
	inbox_put_async(ib, "github:d", "github", EV2, settled_cb, &s);
	pthread_mutex_lock(&s.mu);
	while (s.n < 2)
		pthread_cond_wait(&s.cv, &s.mu);
	pthread_mutex_unlock(&s.mu);
	assert_int_equal(s.by[INBOX_REQUEUED], 1);
	assert_int_equal(s.by[INBOX_DUPLICATE], 1);
	assert_int_equal(wait_calls(&c, 2, 5000), 2);
	sleep_ms(200);
	inbox_free(ib);
	assert_int_equal(c.calls, 2);
	assert_int_equal(query_int(path, "SELECT count FROM handled_events"
	    " WHERE key = 'github:d'"), 1);
	free(path);
}

/*
 * The dead letters are counted from the database at start; a requeue
 * takes room like a new entry (a full inbox refuses it, and it stays
 * dead), and is on disk when it is answered: a stop before any worker
 * took it (none runs here) leaves it pending for the next run.
 */
static void
requeue_durable(void **state)
{
	char *path = tmpdb();
	struct inbox_config cfg = test_config(1, 3, 3600);
	struct counter c;
	struct inbox *ib;
	int i;

	(void)state;
	ib = open_dead(path, &c);
	inbox_free(ib);
	cfg.hold = 1;
	ib = open_cfg(path, &cfg, count_handle, &c);
	assert_int_equal(inbox_dead_letters(ib), 1);
	assert_int_equal(inbox_put(ib, "github:e", "github", EV),
	    INBOX_STORED);
	assert_int_equal(inbox_put(ib, "github:d", "github", EV2),
	    INBOX_FULL);
	assert_int_equal(inbox_dead_letters(ib), 1);
	inbox_free(ib);
	cfg.capacity = 100;
	ib = open_cfg(path, &cfg, count_handle, &c);
	assert_int_equal(inbox_put(ib, "github:d", "github", EV2),
	    INBOX_REQUEUED);
	assert_int_equal(inbox_depth(ib), 2);
	assert_int_equal(inbox_dead_letters(ib), 0);
	inbox_free(ib);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox WHERE"
	    " key = 'github:d' AND state = 0 AND attempts = 0 AND"
	    " finished_at IS NULL"), 1);
	ib = open_started(path, &c, 100, 3, 3600);
	assert_int_equal(inbox_dead_letters(ib), 0);
	for (i = 0; i < 500 && inbox_depth(ib) > 0; i++)
		sleep_ms(10);
	inbox_free(ib);
	assert_int_equal(query_int(path, "SELECT state FROM inbox WHERE"
	    " key = 'github:d'"), 1);
	assert_int_equal(query_int(path, "SELECT number FROM handled_events"
	    " WHERE key = 'github:d'"), 8);
	free(path);
}

static void
restart_resumes(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	char key[32];
	int i;

	counter_init(&c);
	c.block = 1;
	ib = open_started(path, &c, 1000, 3, 3600);
	for (i = 0; i < 20; i++) {
		snprintf(key, sizeof(key), "github:%d", i);
		assert_int_equal(inbox_put(ib, key, "github", EV),
		    INBOX_STORED);
	}
	/* let at most the two held items finish after the stop begins */
	pthread_mutex_lock(&c.mu);
	c.block = 0;
	c.always = INBOX_RETRY;	/* whatever was taken is not done */
	pthread_cond_broadcast(&c.cv);
	pthread_mutex_unlock(&c.mu);
	inbox_free(ib);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE state = 0"), 20);

	counter_init(&c);
	c.record = 1;
	ib = open_started(path, &c, 1000, 3, 3600);
	assert_int_equal(wait_calls(&c, 20, 10000), 20);
	sleep_ms(100);
	inbox_free(ib);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM handled_events"), 20);
	assert_int_equal(query_int(path,
	    "SELECT MAX(count) FROM handled_events"), 1);
	free(path);
}

/* A handler that kills the process on the poison entry, like a crash. */
static int
crash_handle(void *arg, struct inbox_item *item, char **cause)
{
	(void)arg;
	(void)cause;
	if (strcmp(item->key, "github:poison") == 0)
		_exit(3);
	return inbox_record_handler.handle(NULL, item, cause);
}

/*
 * One run of a daemon in a child process. store: with the workers held,
 * store the poison entry and a good one, and stop. Else start the inbox,
 * wait for every entry to end, stop. The exit status: 0 when it ended
 * cleanly, 3 when the handler "crashed".
 */
static int
crash_run(const char *path, int store, int max_attempts)
{
	pid_t pid = fork();
	int status;

	assert_true(pid >= 0);
	if (pid == 0) {
		struct inbox_config cfg = test_config(100, max_attempts,
		    3600);
		struct inbox *ib;
		int64_t depth;
		int i;

		cfg.hold = store;
		ib = open_cfg(path, &cfg, crash_handle, NULL);
		if (store) {
			if (inbox_put(ib, "github:poison", "github", EV) !=
			    INBOX_STORED || inbox_put(ib, "github:good",
			    "github", EV) != INBOX_STORED)
				_exit(1);
			inbox_free(ib);
			_exit(0);
		}
		for (i = 0; i < 500 && inbox_depth(ib) > 0; i++)
			sleep_ms(10);
		depth = inbox_depth(ib);
		inbox_free(ib);
		_exit(depth == 0 ? 0 : 2);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status);
}

/*
 * An entry whose handling kills the daemon is not handled for ever: each
 * restart after an unfinished run counts the attempt before handling it,
 * and past inbox.max_attempts it is dead-lettered without being handled,
 * while the other entries are handled as usual. A clean stop counts
 * nothing.
 */
static void
crash_loop_dead_letters(void **state)
{
	char *path = tmpdb();
	int crashes = 0, rc;

	(void)state;
	assert_int_equal(crash_run(path, 1, 3), 0);
	do {
		rc = crash_run(path, 0, 3);
		crashes += rc == 3;
	} while (rc == 3 && crashes < 10);
	/*
	 * the first attempt (after a clean stop: not counted), then three
	 * counted ones: four crashes, and the next run dead-letters it
	 */
	assert_int_equal(rc, 0);
	assert_int_equal(crashes, 4);
	assert_int_equal(query_int(path, "SELECT state FROM inbox WHERE"
	    " key = 'github:poison'"), 2);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox WHERE"
	    " key = 'github:poison' AND last_error LIKE '%cut short%'"), 1);
	assert_int_equal(query_int(path, "SELECT state FROM inbox WHERE"
	    " key = 'github:good'"), 1);
	assert_int_equal(query_int(path, "SELECT count FROM handled_events"
	    " WHERE key = 'github:good'"), 1);
	/*
	 * entries left by a crash are handled one at a time: the good one
	 * was never in flight beside the poison after the first crash
	 */
	assert_int_equal(query_int(path, "SELECT attempts FROM inbox WHERE"
	    " key = 'github:good'"), 1);
	/* a clean run leaves the shards marked clean: nothing recounted */
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox_meta"
	    " WHERE k = 'clean' AND v = 1"), INBOX_SHARDS);
	free(path);
}

/*
 * After a clean stop nothing is counted ahead or handled one at a time:
 * the entries left pending are handled side by side, as usual.
 */
static void
clean_stop_counts_nothing(void **state)
{
	char *path = tmpdb();
	struct inbox_config cfg = test_config(100, 5, 3600);
	struct counter c;
	struct inbox *ib;
	int entered;

	(void)state;
	counter_init(&c);
	cfg.hold = 1;
	ib = open_cfg(path, &cfg, count_handle, &c);
	assert_int_equal(inbox_put(ib, "github:a", "github", EV),
	    INBOX_STORED);
	assert_int_equal(inbox_put(ib, "github:b", "github", EV),
	    INBOX_STORED);
	inbox_free(ib);
	c.block = 1;
	ib = open_started(path, &c, 100, 5, 3600);
	entered = wait_count(&c, &c.entered, 2, 5000);
	counter_hold(&c, 0);
	assert_int_equal(entered, 2);
	assert_int_equal(wait_calls(&c, 2, 5000), 2);
	inbox_free(ib);
	assert_int_equal(query_int(path, "SELECT SUM(attempts) FROM inbox"),
	    2);
	free(path);
}

/*
 * Entries are taken in the order they were stored, also when the queue
 * of those waiting grows while its head has moved on (it is a ring):
 * one worker holds the first entry while 1,100 more are queued behind
 * it, then the audit trail, in the order of the handlings, must list
 * each shard's keys in the order they were put.
 */
static void
queue_grows_in_order(void **state)
{
	char *path = tmpdb();
	struct inbox_config cfg = test_config(10000, 3, 3600);
	struct counter c;
	struct settled s;
	struct inbox *ib;
	char key[32];
	int i;

	(void)state;
	counter_init(&c);
	settled_init(&s);
	c.record = 1;
	c.block = 1;
	cfg.workers = 1;
	ib = open_cfg(path, &cfg, count_handle, &c);
	assert_int_equal(inbox_put(ib, "github:q-0000", "github", EV),
	    INBOX_STORED);
	assert_int_equal(wait_count(&c, &c.entered, 1, 5000), 1);
	for (i = 1; i <= 1100; i++) {
		snprintf(key, sizeof(key), "github:q-%04d", i);
		inbox_put_async(ib, key, "github", EV, settled_cb, &s);
	}
	pthread_mutex_lock(&s.mu);
	while (s.n < 1100)
		pthread_cond_wait(&s.cv, &s.mu);
	pthread_mutex_unlock(&s.mu);
	assert_int_equal(s.by[INBOX_STORED], 1100);
	counter_hold(&c, 0);
	assert_int_equal(wait_calls(&c, 1101, 20000), 1101);
	for (i = 0; i < 1000 && inbox_depth(ib) > 0; i++)
		sleep_ms(10);
	inbox_free(ib);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM handled_events"), 1101);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM handled_events"
	    " a JOIN handled_events b ON a.rowid < b.rowid WHERE"
	    " a.key > b.key"), 0);
	free(path);
}

struct putter {
	struct inbox *ib;
	int base;
	int stored;
};

static void *
put_many(void *arg)
{
	struct putter *p = arg;
	char key[32];
	int i;

	for (i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "github:%d-%d", p->base, i);
		if (inbox_put(p->ib, key, "github", EV) == INBOX_STORED)
			p->stored++;
		/* every tenth is sent twice */
		if (i % 10 == 0 && inbox_put(p->ib, key, "github", EV) !=
		    INBOX_DUPLICATE)
			p->stored = -100000;
	}
	return NULL;
}

static void
concurrent_group_commit(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	pthread_t t[8];
	struct putter p[8];
	int i, total = 0;

	counter_init(&c);
	c.record = 1;
	ib = open_started(path, &c, 100000, 3, 3600);
	for (i = 0; i < 8; i++) {
		p[i].ib = ib;
		p[i].base = i;
		p[i].stored = 0;
		pthread_create(&t[i], NULL, put_many, &p[i]);
	}
	for (i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		total += p[i].stored;
	}
	assert_int_equal(total, 1600);
	assert_int_equal(wait_calls(&c, 1600, 20000), 1600);
	sleep_ms(100);
	inbox_free(ib);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM handled_events"), 1600);
	assert_int_equal(query_int(path,
	    "SELECT MAX(count) FROM handled_events"), 1);
	free(path);
}

struct filler {
	struct inbox *ib;
	int base;
	int stop;
	int64_t bytes;
};

static void *
fill(void *arg)
{
	static const char head[] = "{\"provider\":\"github\",\"kind\":"
	    "\"comment\",\"repo\":\"o/r\",\"number\":7,\"commentId\":9,"
	    "\"body\":\"";
	struct filler *f = arg;
	size_t hl = strlen(head);
	char key[48], *ev = xmalloc(hl + 12000 + 3);
	int i;

	/* 12 KB bodies, like real comment deliveries */
	memcpy(ev, head, hl);
	memset(ev + hl, 'x', 12000);
	memcpy(ev + hl + 12000, "\"}", 3);
	for (i = 0; !__atomic_load_n(&f->stop, __ATOMIC_RELAXED); i++) {
		snprintf(key, sizeof(key), "github:w%d-%d", f->base, i);
		if (inbox_put(f->ib, key, "github", ev) == INBOX_STORED)
			__atomic_add_fetch(&f->bytes, (int64_t)strlen(ev),
			    __ATOMIC_RELAXED);
	}
	free(ev);
	return NULL;
}

static int64_t
file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? (int64_t)st.st_size : 0;
}

/*
 * Under writes that never pause, PASSIVE checkpoints never rewind a WAL:
 * the inbox must (here after 64 frames), or each WAL file grows with
 * everything ever written to it.
 */
static void
wal_stays_bounded(void **state)
{
	char *path = tmpdb(), *wal[INBOX_SHARDS];
	struct inbox_config cfg = {
		.capacity = 1000000, .workers = 2, .max_attempts = 3,
		.retention_s = 3600, .backoff_base_ms = 10,
		.backoff_max_ms = 40, .wal_restart_frames = 64,
	};
	struct counter c;
	struct inbox_handler h = { count_handle, &c };
	struct inbox *ib = NULL;
	struct filler f[4];
	pthread_t t[4];
	char *cause = NULL;
	int64_t total = 0, biggest = 0, end;
	int i;

	counter_init(&c);
	for (i = 0; i < INBOX_SHARDS; i++) {
		char *db = inbox_shard_path(path, i);

		wal[i] = xasprintf("%s-wal", db);
		free(db);
	}
	assert_int_equal(inbox_open(&ib, path, &cfg, &cause), 0);
	assert_int_equal(inbox_start(ib, &h, &cause), 0);
	for (i = 0; i < 4; i++) {
		f[i].ib = ib;
		f[i].base = i;
		f[i].stop = 0;
		f[i].bytes = 0;
		pthread_create(&t[i], NULL, fill, &f[i]);
	}
	/*
	 * Until 64 MiB are stored, however long that takes on a loaded
	 * machine (a fixed 4 s stored less than 32 MiB beside another test
	 * suite), within two minutes.
	 */
	end = now_mono_ms() + 120000;
	while (now_mono_ms() < end) {
		for (i = 0; i < INBOX_SHARDS; i++)
			if (file_size(wal[i]) > biggest)
				biggest = file_size(wal[i]);
		for (i = 0, total = 0; i < 4; i++)
			total += __atomic_load_n(&f[i].bytes, __ATOMIC_RELAXED);
		if (total >= 64 * 1024 * 1024)
			break;
		sleep_ms(20);
	}
	total = 0;
	for (i = 0; i < 4; i++) {
		__atomic_store_n(&f[i].stop, 1, __ATOMIC_RELAXED);
		pthread_join(t[i], NULL);
		total += f[i].bytes;
	}
	inbox_free(ib);
	fprintf(stderr, "# %lld bytes stored, largest WAL %lld bytes\n",
	    (long long)total, (long long)biggest);
	/*
	 * Enough written for an unbounded WAL to show: each delivery is
	 * written in full at least once to its shard's WAL, so without the
	 * rewinds the WAL files add up to more than everything stored, and
	 * the largest holds at least a quarter of it. Measured here, of 64
	 * MiB stored: a largest WAL of 11 to 15 MiB with rewinds, 44 MiB
	 * without.
	 */
	assert_true(total > 32 * 1024 * 1024);
	assert_true(biggest < total / 2);
	for (i = 0; i < INBOX_SHARDS; i++)
		free(wal[i]);
	free(path);
}

/*
 * A reader that keeps an old snapshot of a shard (a backup, a replicator,
 * someone's sqlite3 shell) keeps its WAL from being rewound; the
 * checkpointer must then give up on the rewind, not hold the shard's
 * writer back while it waits for the reader (each put to the shard
 * waited up to 10 s for every try).
 */
static void
reader_holds_wal(void **state)
{
	char *path = tmpdb(), *sp, key[32];
	struct inbox_config cfg = test_config(1000000, 3, 3600);
	struct counter c;
	struct inbox *ib;
	sqlite3 *rd;
	sqlite3_stmt *st;
	int64_t worst = 0;
	int i, n = 0, slow = 0, shard = inbox_key_shard("github:rd-0");

	(void)state;
	counter_init(&c);
	cfg.wal_restart_frames = 16;
	ib = open_cfg(path, &cfg, count_handle, &c);
	sp = inbox_shard_path(path, shard);
	assert_int_equal(sqlite3_open(sp, &rd), SQLITE_OK);
	/* the reader's snapshot: at the head of the WAL */
	assert_int_equal(sqlite3_exec(rd, "BEGIN", NULL, NULL, NULL),
	    SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(rd, "SELECT COUNT(*) FROM inbox",
	    -1, &st, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_step(st), SQLITE_ROW);
	sqlite3_finalize(st);
	/* puts to the reader's shard, the WAL long, for three seconds */
	for (i = 0; n < 60; i++) {
		int64_t t0;

		snprintf(key, sizeof(key), "github:rd-%d", i);
		if (inbox_key_shard(key) != shard)
			continue;
		t0 = now_mono_ms();
		assert_int_equal(inbox_put(ib, key, "github", EV),
		    INBOX_STORED);
		if (now_mono_ms() - t0 > worst)
			worst = now_mono_ms() - t0;
		if (now_mono_ms() - t0 >= 50)
			slow++;
		n++;
		sleep_ms(50);
	}
	assert_int_equal(sqlite3_exec(rd, "COMMIT", NULL, NULL, NULL),
	    SQLITE_OK);
	sqlite3_close(rd);
	inbox_free(ib);
	fprintf(stderr, "# slowest put %lld ms, %d of %d over 50 ms\n",
	    (long long)worst, slow, n);
	/* a put is a commit, in milliseconds; seconds mean a wait */
	assert_true(worst < 2000);
	free(sp);
	free(path);
}

/*
 * A stop folds the WALs in before it returns; readers that keep old
 * snapshots of the shards (as above) must not hold it back for long: a
 * SIGTERM has to end within a bounded time, well under the grace period
 * a supervisor gives (it waited 10 s for each shard).
 */
static void
stop_beside_readers(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	sqlite3 *rd[INBOX_SHARDS];
	char key[32];
	int64_t t0;
	int i;

	(void)state;
	counter_init(&c);
	ib = open_started(path, &c, 1000, 3, 3600);
	for (i = 0; i < INBOX_SHARDS; i++) {
		char *sp = inbox_shard_path(path, i);

		assert_int_equal(sqlite3_open(sp, &rd[i]), SQLITE_OK);
		assert_int_equal(sqlite3_exec(rd[i], "BEGIN; SELECT COUNT(*)"
		    " FROM inbox", NULL, NULL, NULL), SQLITE_OK);
		free(sp);
	}
	for (i = 0; i < 40; i++) {
		snprintf(key, sizeof(key), "github:stop-%d", i);
		assert_int_equal(inbox_put(ib, key, "github", EV),
		    INBOX_STORED);
	}
	assert_int_equal(wait_calls(&c, 40, 5000), 40);
	t0 = now_mono_ms();
	inbox_free(ib);
	t0 = now_mono_ms() - t0;
	fprintf(stderr, "# stop took %lld ms\n", (long long)t0);
	for (i = 0; i < INBOX_SHARDS; i++) {
		sqlite3_exec(rd[i], "COMMIT", NULL, NULL, NULL);
		sqlite3_close(rd[i]);
	}
	assert_true(t0 < 5000);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE state = 1"), 40);
	free(path);
}

/* Move the finish of the entries matching where ms into the past. */
static void
backdate(const char *path, const char *where, long long ms)
{
	char *sql = xasprintf("UPDATE inbox SET finished_at = finished_at -"
	    " %lld WHERE %s", ms, where);

	exec_shards(path, sql);
	free(sql);
}

static void
prune_finished(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	int i;

	counter_init(&c);
	ib = open_started(path, &c, 100, 3, 0);
	assert_int_equal(inbox_put(ib, "github:p", "github", EV), INBOX_STORED);
	assert_int_equal(wait_calls(&c, 1, 5000), 1);
	inbox_free(ib);
	/* past the replay window too (see replay_kept_past_retention) */
	backdate(path, "1", INBOX_REPLAY_KEEP_S * 1000LL + 1000);
	counter_init(&c);
	ib = open_started(path, &c, 100, 3, 0);
	for (i = 0; i < 300; i++) {
		if (query_int(path, "SELECT COUNT(*) FROM inbox") == 0)
			break;
		sleep_ms(10);
	}
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox"), 0);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox_body"),
	    0);
	inbox_free(ib);
	free(path);
}

/* Put the deliveries a and b, let c handle both, and close the inbox. */
static void
handle_two(const char *path, struct counter *c, const char *a,
    const char *b, int64_t retention)
{
	struct inbox *ib = open_started(path, c, 100, 3, retention);

	assert_int_equal(inbox_put(ib, a, "github", EV), INBOX_STORED);
	assert_int_equal(inbox_put(ib, b, "github", EV), INBOX_STORED);
	assert_int_equal(wait_calls(c, 2, 5000), 2);
	inbox_free(ib);
}

/* Open the inbox again, until its first prune leaves one entry. */
static struct inbox *
reopen_pruned(const char *path, struct counter *c, int64_t retention)
{
	struct inbox *ib;
	int i;

	counter_init(c);
	ib = open_started(path, c, 100, 3, retention);
	for (i = 0; i < 300 && query_int(path,
	    "SELECT COUNT(*) FROM inbox") > 1; i++)
		sleep_ms(10);
	return ib;
}

/*
 * A finished entry outlives a retention shorter than the replay window:
 * a signed GitLab delivery replayed while its webhook-timestamp is still
 * accepted is a duplicate, not stored and handled again. Its audit row
 * is pruned after the retention all the same.
 */
static void
replay_kept_past_retention(void **state)
{
	char *path = tmpdb();
	char old[32];
	struct counter c;
	struct inbox *ib;
	int i;

	(void)state;
	/* a witness of the prune, in the same shard as the replayed key */
	for (i = 0;; i++) {
		snprintf(old, sizeof(old), "gitlab:old-%d", i);
		if (inbox_key_shard(old) == inbox_key_shard("gitlab:replay"))
			break;
	}
	counter_init(&c);
	c.record = 1;
	handle_two(path, &c, "gitlab:replay", old, 0);
	/*
	 * gitlab:replay finished a minute ago: past the retention (0),
	 * within the window; the witness past the window
	 */
	backdate(path, "key = 'gitlab:replay'", 60000);
	backdate(path, "key LIKE 'gitlab:old-%'",
	    INBOX_REPLAY_KEEP_S * 1000LL + 1000);
	ib = reopen_pruned(path, &c, 0);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE key LIKE 'gitlab:old-%'"), 0);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM handled_events"), 0);
	assert_int_equal(inbox_put(ib, "gitlab:replay", "gitlab", EV),
	    INBOX_DUPLICATE);
	inbox_free(ib);
	assert_int_equal(c.calls, 0);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE key = 'gitlab:replay'"), 1);
	assert_int_equal(query_int(path,
	    "SELECT state FROM inbox WHERE key = 'gitlab:replay'"), 1);
	free(path);
}

/*
 * Two dead letters, github:d1 that died d1_days ago and github:d2
 * d2_days ago; an inbox with the retention (seconds) prunes d1 alone,
 * and counts it gone. d1 has no body (like an entry stored before
 * inbox_body existed): its row, not a body, makes it a dead letter.
 */
static void
dead_letters_pruned(int64_t retention, int d1_days, int d2_days)
{
	char *path = tmpdb(), *sql;
	struct counter c;
	struct inbox *ib;

	counter_init(&c);
	c.always = INBOX_FAIL;
	handle_two(path, &c, "github:d1", "github:d2", retention);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE state = 2"), 2);
	sql = xasprintf("UPDATE inbox SET finished_at = finished_at -"
	    " %d * 86400000 WHERE key = 'github:d1'; UPDATE inbox SET"
	    " finished_at = finished_at - %d * 86400000 WHERE key ="
	    " 'github:d2'; DELETE FROM inbox_body WHERE id IN (SELECT id"
	    " FROM inbox WHERE key = 'github:d1')", d1_days, d2_days);
	exec_shards(path, sql);
	free(sql);
	ib = reopen_pruned(path, &c, retention);
	/* the gauge counted two at the start, the prune took one */
	assert_int_equal(wait_dead(ib, 1), 1);
	inbox_free(ib);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE key = 'github:d1'"), 0);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE key = 'github:d2'"), 1);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox_body"),
	    1);
	free(path);
}

/*
 * Dead letters are kept for inspection, but not for ever: 30 days (or
 * the retention, when longer) after they died, they are pruned too.
 */
static void
prune_dead_letters(void **state)
{
	(void)state;
	dead_letters_pruned(0, 31, 29);
	/* a retention of 40 days keeps them 40 days, not 30 */
	dead_letters_pruned(40 * 86400, 41, 31);
}

/*
 * The audit trail (handled_events) goes with the entries it records,
 * after the retention: a daemon that runs for months must not keep a row
 * (and a KiB of comment) for every delivery it ever handled.
 */
static void
prune_audit_trail(void **state)
{
	char *path = tmpdb();
	struct counter c;

	(void)state;
	counter_init(&c);
	c.record = 1;
	handle_two(path, &c, "github:old", "github:new", 3600);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM handled_events"), 2);
	/* github:old was handled two hours ago, past the retention */
	exec_shards(path, "UPDATE inbox SET finished_at = finished_at -"
	    " 7200000 WHERE key = 'github:old'; UPDATE handled_events SET"
	    " handled_at = handled_at - 7200000 WHERE key = 'github:old'");
	inbox_free(reopen_pruned(path, &c, 3600));
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM inbox WHERE key = 'github:old'"), 0);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM handled_events WHERE key = 'github:old'"),
	    0);
	assert_int_equal(query_int(path,
	    "SELECT COUNT(*) FROM handled_events WHERE key = 'github:new'"),
	    1);
	free(path);
}

/* n old finished entries in shard 0, with their bodies. */
static void
old_finished(const char *path, int n)
{
	struct counter c;
	struct inbox *ib;
	sqlite3 *db;
	int i;

	counter_init(&c);
	/* create the tables */
	ib = open_started(path, &c, 100, 3, 3600);
	inbox_free(ib);
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, "BEGIN", NULL, NULL, NULL),
	    SQLITE_OK);
	for (i = 0; i < n; i++) {
		char *sql = xasprintf("INSERT INTO inbox (id, key, provider,"
		    " event, state, received_at, finished_at) VALUES (%d,"
		    " 'github:old-%d', 'github', '', 1, 1, %d);"
		    "INSERT INTO inbox_body (id, event) VALUES (%d, 'x');",
		    i + 1, i, i + 1, i + 1);

		assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL),
		    SQLITE_OK);
		free(sql);
	}
	assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL),
	    SQLITE_OK);
	sqlite3_close(db);
}

/*
 * A prune takes at most 10,000 entries at a time, and takes their bodies
 * with them: what is left keeps its body.
 */
static void
prune_keeps_bodies(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	int i;

	(void)state;
	counter_init(&c);
	old_finished(path, 10050);
	/* retention 0: the writer prunes as it starts */
	ib = open_started(path, &c, 100, 3, 0);
	for (i = 0; i < 300; i++) {
		if (query_int(path, "SELECT COUNT(*) FROM inbox") <= 50)
			break;
		sleep_ms(10);
	}
	inbox_free(ib);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox"), 50);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox_body"),
	    50);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox i JOIN"
	    " inbox_body b ON b.id = i.id"), 50);
	free(path);
}

/*
 * A full batch is followed by the next one a second later, not a minute:
 * entries finishing faster than a batch a minute are not left to pile up.
 */
static void
prune_catches_up(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;
	int i;

	(void)state;
	old_finished(path, 20050);
	counter_init(&c);
	ib = open_started(path, &c, 100, 3, 0);
	for (i = 0; i < 500; i++) {
		if (query_int(path, "SELECT COUNT(*) FROM inbox") == 0)
			break;
		sleep_ms(10);
	}
	inbox_free(ib);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox"), 0);
	assert_int_equal(query_int(path, "SELECT COUNT(*) FROM inbox_body"),
	    0);
	free(path);
}

static void
put_after_stop(void **state)
{
	char *path = tmpdb();
	struct counter c;
	struct inbox *ib;

	counter_init(&c);
	ib = open_started(path, &c, 100, 3, 3600);
	inbox_stop(ib);
	assert_int_equal(inbox_put(ib, "github:late", "github", EV),
	    INBOX_ERROR);
	inbox_free(ib);
	free(path);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(put_dup_and_record),
		cmocka_unit_test(first_attempt_as_stored),
		cmocka_unit_test(legacy_row),
		cmocka_unit_test(audit_body_capped),
		cmocka_unit_test(capacity_refuses),
		cmocka_unit_test(capacity_across_shards),
		cmocka_unit_test(effect_disk_full),
		cmocka_unit_test(retry_then_dead),
		cmocka_unit_test(retry_backoff),
		cmocka_unit_test(transient_waits_out_outage),
		cmocka_unit_test(outage_not_hammered),
		cmocka_unit_test(retries_spread),
		cmocka_unit_test(retry_at_reset),
		cmocka_unit_test(retry_at_floor),
		cmocka_unit_test(retry_at_old_entry),
		cmocka_unit_test(retry_then_success),
		cmocka_unit_test(permanent_failure),
		cmocka_unit_test(effect_failed),
		cmocka_unit_test(odd_outcome_and_event),
		cmocka_unit_test(requeue_dead_letter),
		cmocka_unit_test(requeue_once),
		cmocka_unit_test(requeue_durable),
		cmocka_unit_test(restart_resumes),
		cmocka_unit_test(crash_loop_dead_letters),
		cmocka_unit_test(clean_stop_counts_nothing),
		cmocka_unit_test(concurrent_group_commit),
		cmocka_unit_test(queue_grows_in_order),
		cmocka_unit_test(prune_finished),
		cmocka_unit_test(prune_keeps_bodies),
		cmocka_unit_test(prune_catches_up),
		cmocka_unit_test(replay_kept_past_retention),
		cmocka_unit_test(prune_dead_letters),
		cmocka_unit_test(prune_audit_trail),
		cmocka_unit_test(wal_stays_bounded),
		cmocka_unit_test(reader_holds_wal),
		cmocka_unit_test(stop_beside_readers),
		cmocka_unit_test(put_after_stop),
	};

	util_json_init();
	log_setup(LOG_ERROR, 0);
	return cmocka_run_group_tests_name("inbox", tests, NULL, NULL);
}
