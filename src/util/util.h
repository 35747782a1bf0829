/*
 * util: allocation, bounded buffers, logging, crypto helpers, metrics and
 * time. Everything here is thread-safe unless said otherwise.
 */
#ifndef DIVERGE_UTIL_H
#define DIVERGE_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* ---- allocation: out of memory aborts with a message ---- */
void *xmalloc(size_t n);
void *xcalloc(size_t nmemb, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* Copy n bytes of s and NUL-terminate. */
char *xstrndup(const char *s, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The longest prefix of s[0..len) of at most max bytes ending on a UTF-8
 * character boundary. */
size_t utf8_cut(const char *s, size_t len, size_t max);
/* Whether a and b are both set and equal. */
int streq(const char *a, const char *b);
/*
 * Whether the Content-Type ct names the media type want (case aside),
 * with or without parameters: "application/json; charset=utf-8" is
 * application/json, "application/jsonx" is not.
 */
int media_type_is(const char *ct, const char *want);
size_t utf8_next(const unsigned char *p, size_t n, uint32_t *cp);
size_t utf8_valid_len(const unsigned char *p, size_t n);
/* Write code point cp (at most U+10FFFF) as UTF-8 at o; its length, 1 to 4. */
size_t utf8_put(uint32_t cp, char *o);
char *xvasprintf(const char *fmt, va_list ap)
    __attribute__((format(printf, 1, 0)));
/* Install xmalloc/free into jansson; call once at start. */
void util_json_init(void);
/*
 * What json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) writes, byte for byte,
 * without its per-piece callbacks (util/jdump.c); NULL for a value nested
 * deeper than 2048. *len (may be NULL) gets the length.
 */
struct json_t;
char *json_dump_compact(const struct json_t *v, size_t *len);

/*
 * A growable byte buffer with a hard maximum (curl's dynbuf). data is
 * always NUL-terminated when non-NULL. Adding beyond max fails with -1 and
 * leaves the buffer as it was.
 */
struct buf {
	char *data;
	size_t len;
	size_t cap;
	size_t max;
};
void buf_init(struct buf *b, size_t max);
void buf_release(struct buf *b);
void buf_reset(struct buf *b);
int buf_add(struct buf *b, const void *p, size_t n);
int buf_addstr(struct buf *b, const char *s);
int buf_printf(struct buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Hand the data over to the caller (may be NULL when empty). */
char *buf_detach(struct buf *b, size_t *len_out);

/* ---- logging: one line per event ---- */
enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR };
/* Set the level and format (json != 0: one JSON object per line). */
void log_setup(enum log_level level, int json);
/* Parse "debug|info|warn|error"; -1 when unknown. */
int log_level_parse(const char *s);
/*
 * Log msg with key/value string pairs, terminated by NULL:
 *   log_kv(LOG_INFO, "webhook accepted", "delivery", id, NULL);
 * A NULL value prints as "-". Never pass secrets: registered ones and
 * credential shapes are redacted (redact() below), but only as a backstop.
 */
void log_kv(enum log_level level, const char *msg, ...);
void log_vkv(enum log_level level, const char *msg, va_list ap);
int log_enabled(enum log_level level);

/*
 * ---- redaction (util/redact.c) ----
 * log_vkv passes the message and every value through redact(); code that
 * copies an upstream message (an API's error, a plugin's stderr, a libcurl
 * error) into something users see (a status, a comment, a reply) calls it
 * too.
 */
#define REDACTED "[redacted]"
/* Values shorter than this are not registered: they would shred words. */
#define REDACT_MIN_LEN 8
/*
 * Of a registered value this long or longer, any run of REDACT_FRAG_LEN
 * bytes or more that a text holds is redacted too, wherever it stands.
 */
#define REDACT_FRAG_SECRET 24
#define REDACT_FRAG_LEN 16
/*
 * Register a secret value (a copy is kept, wiped when dropped): it is
 * trimmed of surrounding white space, and each line of a multi-line value
 * (a PEM key) is registered as well. Values are kept after a rotation; the
 * oldest go when 256 are held.
 */
void redact_secret_add(const char *v, size_t len);
/* Forget every registered value (tests). */
void redact_secrets_clear(void);
/*
 * A new copy of s with every registered secret (raw or JSON-escaped; cut
 * at its end, or a run of REDACT_FRAG_LEN bytes of a long one), the
 * credentials of an Authorization-like header, of "Bearer x", of a
 * ?token=/&password= query parameter and of a URL's userinfo, GitHub and
 * GitLab tokens (ghp_..., github_pat_..., glpat-...), JWTs, PEM private
 * keys (also JSON-escaped, or cut before their END line) and serialized
 * macaroons (V2 or V1, 48 base64 characters or more) replaced by
 * REDACTED; NULL when nothing in s needs hiding (or s is NULL).
 */
char *redact(const char *s);
/* Like redact() but always a new string (NULL only for NULL). */
char *redact_xstrdup(const char *s);

/* ---- crypto and encodings ---- */
/* HMAC-SHA256 of data with key; out gets 32 bytes. */
void hmac_sha256(const void *key, size_t keylen, const void *data,
    size_t len, unsigned char out[32]);
/* Constant-time equality of two buffers of the same length n. */
int ct_equal(const void *a, const void *b, size_t n);
/* Wipe memory in a way the compiler keeps. */
void secure_wipe(void *p, size_t n);
/* Lowercase hex of n bytes into out (2n+1 bytes). */
void hex_encode(const unsigned char *in, size_t n, char *out);
/* The value of one hex digit (either case), or -1. */
int hex_digit(int c);

/* A libcurl result (CURLcode) worth another try: 1, else 0. */
int curl_transient(int code);
/*
 * Why a transfer failed, for a message, to a new string: libcurl's error
 * buffer when it says something, else its code's text; redacted, since
 * libcurl may quote a URL with its userinfo (a proxy's password).
 */
char *curl_why(const char *errbuf, int code);
/* Decode exactly 2*n hex chars into n bytes; -1 on a bad digit. */
int hex_decode(const char *in, size_t inlen, unsigned char *out,
    size_t *outlen);
/*
 * Base64 encode: url != 0 selects the URL alphabet, pad != 0 adds '='.
 * Returns a new string.
 */
char *base64_encode(const unsigned char *in, size_t n, int url, int pad);
/*
 * Decode standard or URL-safe base64, padded or not (whitespace refused).
 * Returns a new buffer in *out (NUL-terminated for convenience) and its
 * length; -1 on bad input.
 */
int base64_decode(const char *in, size_t n, unsigned char **out,
    size_t *outlen);
/* Fill buf with n cryptographically random bytes; -1 on failure. */
int random_bytes(void *buf, size_t n);

/* ---- time ---- */
/* Monotonic milliseconds. */
int64_t now_mono_ms(void);
/* Monotonic microseconds. */
int64_t now_mono_us(void);
struct timespec;
void time_deadline(clockid_t clk, int64_t ms, struct timespec *ts);
/* Initialize cv to time its waits on CLOCK_MONOTONIC (time_deadline). */
void time_cond_init(pthread_cond_t *cv);
/* Wall clock seconds since the epoch (overridable in tests). */
int64_t now_unix(void);
/* Wall clock milliseconds since the epoch. */
int64_t now_unix_ms(void);
/* RFC 3339 UTC "2026-01-02T03:04:05Z" into out (at least 21 bytes). */
void time_rfc3339(int64_t unix_s, char out[32]);
/* RFC 3339 (Z or +hh:mm) into unix seconds; -1 when malformed. */
int time_parse_rfc3339(const char *s, int64_t *out);
/* An age as kubectl prints it: "45s", "5m3s", "3h", "9d", "2y30d". */
void time_human_duration(int64_t s, char out[32]);
/* Sleep for ms milliseconds. */
void sleep_ms(int64_t ms);

/* Name the calling thread (at most 15 bytes are kept). */
void thread_name(const char *name);
/*
 * Name the calling thread and lower its CPU (nice 10) and I/O (best
 * effort, lowest level) priority: for work nobody waits on.
 */
void thread_background(const char *name);
/* Exponential backoff: base doubled `doublings` times, at most max. */
int64_t backoff_delay_ms(int64_t base, int64_t max, unsigned doublings);
/* Equal jitter: a random delay between d/2 and d. */
int64_t backoff_jitter_ms(int64_t d);

/* ---- metrics (Prometheus text format) ---- */
enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };
/* Declare a metric family once (names are static strings). */
void metrics_describe(const char *name, enum metric_type type,
    const char *help);
/*
 * labels is a preformatted label set without braces, e.g.
 * route="/healthz",code="200", or "" for none. Label values must have
 * been escaped with metrics_label_escape when they come from input.
 */
void metrics_inc(const char *name, const char *labels, double v);
/* Counters (or histograms: no sample) at 0 for each label set of a
 * NULL-terminated list ("": none), so that a series exists (and rate()
 * works) before its first event. */
void metrics_zero(const char *name, const char *const *labelsets);
void metrics_set(const char *name, const char *labels, double v);
void metrics_observe(const char *name, const char *labels, double v);
/*
 * Declare a histogram family whose buckets have these upper bounds
 * (static, ascending; +Inf is implied) instead of the default ones
 * (0.5 ms to 10 s), e.g. for calls that may take a minute.
 */
void metrics_describe_buckets(const char *name, const char *help,
    const double *bounds, size_t nbounds);

/*
 * A histogram its owner keeps and the registry only reads: for a hot
 * path, an observation is a few relaxed atomic additions, with no lock
 * and no allocation. Give it static storage (it is never freed, so it
 * outlives metrics_reset) with METRICS_HIST_INIT and register it once.
 */
#define METRICS_HIST_MAX 20
struct metrics_hist {
	const double *bounds;	/* ascending, at most METRICS_HIST_MAX */
	size_t nbounds;
	/* per bucket, not cumulative; [nbounds]: above every bound */
	atomic_uint_fast64_t bucket[METRICS_HIST_MAX + 1];
	atomic_uint_fast64_t sum_bits;	/* the sum, as a double's bits */
};
#define METRICS_HIST_INIT(b) { .bounds = (b), .nbounds = ARRAY_SIZE(b) }
void metrics_hist_observe(struct metrics_hist *h, double v);
/* The number of observations so far (the histogram's _count). */
uint64_t metrics_hist_count(struct metrics_hist *h);
/* Render h as the series labels ("" for none) of the family name. */
void metrics_hist_register(const char *name, const char *labels,
    struct metrics_hist *h);
/*
 * Register a gauge whose value is read at render time (or a counter, when
 * the family was described as one).
 */
void metrics_gauge_fn(const char *name, const char *labels,
    double (*fn)(void *), void *arg);
/*
 * A fn for metrics_gauge_fn whose arg is an atomic_uint_fast64_t a hot
 * path adds to (relaxed): a counter with no lock.
 */
double metrics_read_atomic(void *arg);
/*
 * The process's series (process_cpu_seconds_total, process_*_memory_bytes,
 * process_open_fds, process_max_fds, process_start_time_seconds) and
 * diverge_sqlite_memory_bytes (util/procmetrics.c).
 */
void metrics_process_register(void);
/* Render every family into b; -1 if b's maximum is reached. */
int metrics_render(struct buf *b);
/* Escape a label value (\\, \", \n) into a new string. */
char *metrics_label_escape(const char *s);
/* Forget all series (tests). */
void metrics_reset(void);


/* ---- SQLite (util/db.c) ---- */
struct sqlite3;
struct sqlite3_stmt;
/* PRAGMA application_id of diverged's databases: "DIVG". */
#define DB_APPLICATION_ID 0x44495647
/* PRAGMA user_version: the layout of diverged's tables (db_open). */
#define DB_SCHEMA_VERSION 1
/*
 * Open (creating) the database at path in WAL mode with synchronous=FULL
 * and a busy timeout. manual_checkpoints != 0 turns automatic WAL
 * checkpoints off (the caller runs them). A database of another program,
 * or of a newer schema than DB_SCHEMA_VERSION, is refused; an older one
 * is stamped with it. -1 with *cause.
 */
int db_open(const char *path, int manual_checkpoints, struct sqlite3 **out,
    char **cause);
/* Run SQL; -1 (and *cause when not NULL) on error. */
int db_exec(struct sqlite3 *db, const char *sql, char **cause);
/*
 * "sqlite: 'FILE': what" for an error rc of db, naming its file, with
 * what to do when SQLite found the file damaged (caller frees).
 */
char *db_error(struct sqlite3 *db, int rc, const char *what);
/*
 * A prepared statement for sql, prepared once and kept with the
 * connection (found again among its statements), reset with its bindings
 * cleared; NULL on a preparation error.
 */
struct sqlite3_stmt *db_stmt(struct sqlite3 *db, const char *sql);
/*
 * Run one statement without results through db_stmt (BEGIN, COMMIT,
 * SAVEPOINT...: parsed once, not on every transaction); -1 on error.
 */
int db_step(struct sqlite3 *db, const char *sql);
/* Close a connection with its cached statements; NULL is fine. */
void db_close(struct sqlite3 *db);

#endif
