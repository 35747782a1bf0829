/*
 * durable: the upper bound for webhook intake that stores every delivery
 * before its 202, as diverged must. It does the ceiling's work (read the
 * body, check X-Hub-Signature-256) and one thing more: the delivery id and
 * the first STORE_BYTES of the body go into a SQLite database (WAL,
 * synchronous=FULL) before the answer. A writer thread commits whatever is
 * queued in one transaction and one sync (group commit); a checkpointer
 * thread copies the WAL back beside it. A delivery id seen before gets 200
 * {"duplicate":true}.
 *
 * No parsing, no normalization, no processing of what is stored: what
 * diverged spends beyond this is the price of its features, not of its
 * durability.
 *
 * Each connection has its own thread (libmicrohttpd's thread-per-
 * connection mode), which waits for its delivery's commit. Of the designs
 * bench/README.md lists, that one was the fastest on the 2-core machine
 * they were measured on.
 *
 *   durable PORT SECRET_FILE DB_PATH [STORE_BYTES]
 *
 * STORE_BYTES: 0 stores the whole body (the default, 4096, is about what
 * diverged keeps of the benchmark's delivery: its normalized event).
 * Listens on 127.0.0.1:PORT, prints "listening" once ready, exits on
 * SIGTERM or SIGINT.
 */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "bench_http.h"

#define DELIVERY_MAX 256
#define CHECKPOINT_MS 100

static const char accepted_body[] = "{\"accepted\":true}\n";
static const char duplicate_body[] = "{\"duplicate\":true}\n";
static const char nokey_body[] = "{\"error\":\"no X-GitHub-Delivery\"}\n";
static const char failed_body[] = "{\"error\":\"not stored\"}\n";

enum put_result { PUT_WAITING, PUT_STORED, PUT_DUPLICATE, PUT_FAILED };

/* One delivery waiting for its commit, on its request thread's stack. */
struct put {
	struct put *next;
	const char *key;
	const char *data;
	size_t len;
	enum put_result result;	/* set under the lock, after the commit */
	int fresh;		/* the writer's: the insert added a row */
	pthread_cond_t cv;
};

struct store {
	const char *path;
	size_t store_bytes;
	sqlite3 *db;
	sqlite3_stmt *ins;
	pthread_mutex_t mu;
	pthread_cond_t wcv;	/* the writer: puts queued, or stop */
	pthread_cond_t ccv;	/* the checkpointer: stop */
	struct put *head, **tail;
	int stopping;
};

struct ctx {
	struct bench_secret secret;
	struct store *store;
};

/* Commit every queued put in one transaction; the caller holds mu. */
static void
commit_queued(struct store *s)
{
	struct put *batch = s->head, *p, *next;
	int ok;

	s->head = NULL;
	s->tail = &s->head;
	pthread_mutex_unlock(&s->mu);
	ok = sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) ==
	    SQLITE_OK;
	for (p = batch; ok && p != NULL; p = p->next) {
		sqlite3_reset(s->ins);
		sqlite3_bind_text(s->ins, 1, p->key, -1, SQLITE_STATIC);
		sqlite3_bind_blob(s->ins, 2, p->data, (int)p->len,
		    SQLITE_STATIC);
		ok = sqlite3_step(s->ins) == SQLITE_DONE;
		p->fresh = sqlite3_changes(s->db) == 1;
	}
	sqlite3_reset(s->ins);
	if (ok)
		ok = sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) ==
		    SQLITE_OK;
	if (!ok) {
		fprintf(stderr, "durable: commit failed: %s\n",
		    sqlite3_errmsg(s->db));
		sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
	}
	pthread_mutex_lock(&s->mu);
	for (p = batch; p != NULL; p = next) {
		next = p->next;
		p->result = !ok ? PUT_FAILED : p->fresh ? PUT_STORED :
		    PUT_DUPLICATE;
		pthread_cond_signal(&p->cv);
	}
}

static void *
writer_main(void *arg)
{
	struct store *s = arg;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (s->head == NULL && !s->stopping)
			pthread_cond_wait(&s->wcv, &s->mu);
		if (s->head == NULL)
			break;
		commit_queued(s);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* PASSIVE checkpoints on a connection of its own, beside the writer. */
static void *
checkpointer_main(void *arg)
{
	struct store *s = arg;
	sqlite3 *db = NULL;

	if (sqlite3_open_v2(s->path, &db, SQLITE_OPEN_READWRITE, NULL) !=
	    SQLITE_OK) {
		fprintf(stderr, "durable: checkpointer: %s\n",
		    db != NULL ? sqlite3_errmsg(db) : "out of memory");
		sqlite3_close(db);
		return NULL;
	}
	sqlite3_busy_timeout(db, 1000);
	pthread_mutex_lock(&s->mu);
	while (!s->stopping) {
		struct timespec ts;

		time_deadline(CLOCK_REALTIME, CHECKPOINT_MS, &ts);
		pthread_cond_timedwait(&s->ccv, &s->mu, &ts);
		if (s->stopping)
			break;
		pthread_mutex_unlock(&s->mu);
		sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE,
		    NULL, NULL);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	sqlite3_close(db);
	return NULL;
}

static int
store_open(struct store *s)
{
	static const char setup[] =
	    "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
	    " PRAGMA wal_autocheckpoint=0;"
	    " CREATE TABLE IF NOT EXISTS deliveries ("
	    " id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE,"
	    " body BLOB NOT NULL)";

	if (sqlite3_open_v2(s->path, &s->db, SQLITE_OPEN_READWRITE |
	    SQLITE_OPEN_CREATE, NULL) != SQLITE_OK ||
	    sqlite3_exec(s->db, setup, NULL, NULL, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(s->db, "INSERT INTO deliveries (key, body)"
	    " VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING", -1, &s->ins,
	    NULL) != SQLITE_OK) {
		fprintf(stderr, "durable: database '%s': %s\n", s->path,
		    s->db != NULL ? sqlite3_errmsg(s->db) : "out of memory");
		return -1;
	}
	sqlite3_busy_timeout(s->db, 10000);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->wcv, NULL);
	pthread_cond_init(&s->ccv, NULL);
	s->tail = &s->head;
	return 0;
}

/* Queue one delivery and wait for the commit that takes it. */
static enum put_result
store_put(struct store *s, const char *key, const char *data, size_t len)
{
	struct put p;

	memset(&p, 0, sizeof(p));
	p.key = key;
	p.data = data;
	p.len = s->store_bytes > 0 && len > s->store_bytes ? s->store_bytes :
	    len;
	p.result = PUT_WAITING;
	pthread_cond_init(&p.cv, NULL);
	pthread_mutex_lock(&s->mu);
	*s->tail = &p;
	s->tail = &p.next;
	pthread_cond_signal(&s->wcv);
	while (p.result == PUT_WAITING)
		pthread_cond_wait(&p.cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	pthread_cond_destroy(&p.cv);
	return p.result;
}

static enum MHD_Result
handle(void *cls, struct MHD_Connection *conn, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **con_cls)
{
	const struct ctx *c = cls;
	const struct bench_request *req;
	enum MHD_Result r;
	const char *key;

	(void)url;
	(void)version;
	if (!bench_signed_post(conn, &c->secret, method, upload_data,
	    upload_data_size, con_cls, &req, &r))
		return r;
	key = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    "X-GitHub-Delivery");
	if (key == NULL || *key == '\0' || strlen(key) > DELIVERY_MAX)
		return BENCH_REPLY(conn, MHD_HTTP_BAD_REQUEST, nokey_body);
	switch (store_put(c->store, key, req->body.data, req->body.len)) {
	case PUT_STORED:
		return BENCH_REPLY(conn, MHD_HTTP_ACCEPTED, accepted_body);
	case PUT_DUPLICATE:
		return BENCH_REPLY(conn, MHD_HTTP_OK, duplicate_body);
	default:
		return BENCH_REPLY(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
		    failed_body);
	}
}

int
main(int argc, char **argv)
{
	struct MHD_Daemon *d = NULL;
	struct store store;
	struct ctx ctx;
	pthread_t writer, checkpointer;
	sigset_t set;
	unsigned long port, bytes = 4096;
	int ret = 1, threads = 0;

	memset(&store, 0, sizeof(store));
	memset(&ctx, 0, sizeof(ctx));
	if ((argc != 4 && argc != 5) ||
	    bench_parse_number(argv[1], 65535, &port) != 0 || port == 0 ||
	    (argc == 5 && bench_parse_number(argv[4], BENCH_BODY_MAX,
	    &bytes) != 0)) {
		fprintf(stderr, "usage: durable PORT SECRET_FILE DB_PATH "
		    "[STORE_BYTES]\n");
		return 2;
	}
	if (bench_secret_load(&ctx.secret, "durable", argv[2]) != 0)
		return 1;
	store.path = argv[3];
	store.store_bytes = bytes;
	ctx.store = &store;
	if (store_open(&store) != 0)
		goto out;

	if (bench_signals("durable", &set) != 0)
		goto out;
	if (pthread_create(&writer, NULL, writer_main, &store) != 0)
		goto out;
	threads = 1;
	if (pthread_create(&checkpointer, NULL, checkpointer_main,
	    &store) != 0)
		goto out;
	threads = 2;

	d = bench_listen("durable", (uint16_t)port,
	    MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL, 0, handle, &ctx);
	if (d == NULL)
		goto out;
	bench_wait(&set);
	ret = 0;
out:
	/* the request threads end first: they may wait on the writer */
	if (d != NULL)
		MHD_stop_daemon(d);
	if (threads > 0) {
		pthread_mutex_lock(&store.mu);
		store.stopping = 1;
		pthread_cond_broadcast(&store.wcv);
		pthread_cond_broadcast(&store.ccv);
		pthread_mutex_unlock(&store.mu);
		pthread_join(writer, NULL);
		if (threads > 1)
			pthread_join(checkpointer, NULL);
	}
	sqlite3_finalize(store.ins);
	sqlite3_close(store.db);
	bench_secret_release(&ctx.secret);
	return ret;
}
