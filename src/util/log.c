/*
 * One line per event, key=value text or JSON, to stderr, with credentials
 * redacted (util/redact.c).
 */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

static enum log_level log_min = LOG_INFO;
static int log_json;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *level_names[] = { "debug", "info", "warn", "error" };

/*
 * A value is cut after this many bytes (escaped, it may take six times
 * as many): values can come from unauthenticated requests (a delivery id
 * is logged before its signature is checked), and one huge value must not
 * push the end of its line, or the next line, out of the line's buffer.
 */
#define LOG_VALUE_MAX 2048
#define LOG_LINE_MAX (256 * 1024)
#define TRUNCATED "\xe2\x80\xa6(truncated)"

/* Choose level and format (SIGHUP may call this while others log). */
void
log_setup(enum log_level level, int json)
{
	__atomic_store_n(&log_min, level, __ATOMIC_RELAXED);
	__atomic_store_n(&log_json, json, __ATOMIC_RELAXED);
}

/* Map a level name to its value. */
int
log_level_parse(const char *s)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(level_names); i++)
		if (strcmp(s, level_names[i]) == 0)
			return (int)i;
	if (strcmp(s, "warning") == 0)
		return LOG_WARN;
	return -1;
}

/* Whether a line at this level would be written. */
int
log_enabled(enum log_level level)
{
	return level >= __atomic_load_n(&log_min, __ATOMIC_RELAXED);
}

/*
 * s as a JSON string: escapes, invalid UTF-8 as U+FFFD, at most
 * LOG_VALUE_MAX bytes of it (cut on a character boundary).
 */
static void
add_json_string(struct buf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t n = strlen(s), i = 0, k;

	buf_addstr(b, "\"");
	while (i < n) {
		if (i >= LOG_VALUE_MAX) {
			buf_addstr(b, TRUNCATED);
			break;
		}
		switch (p[i]) {
		case '"':
			buf_addstr(b, "\\\"");
			break;
		case '\\':
			buf_addstr(b, "\\\\");
			break;
		case '\n':
			buf_addstr(b, "\\n");
			break;
		case '\r':
			buf_addstr(b, "\\r");
			break;
		case '\t':
			buf_addstr(b, "\\t");
			break;
		default:
			if (p[i] < 0x20 || p[i] == 0x7f) {
				buf_printf(b, "\\u%04x", p[i]);
				break;
			}
			k = utf8_valid_len(p + i, n - i);
			if (k == 0) {
				buf_addstr(b, "\\ufffd");
				break;
			}
			buf_add(b, p + i, k);
			i += k;
			continue;
		}
		i++;
	}
	buf_addstr(b, "\"");
}

static void
add_text_value(struct buf *b, const char *s)
{
	const unsigned char *p;
	int quote = *s == '\0' || strlen(s) > LOG_VALUE_MAX;

	for (p = (const unsigned char *)s; *p && !quote; p++)
		if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' ||
		    *p >= 0x7f)
			quote = 1;
	if (!quote) {
		buf_addstr(b, s);
		return;
	}
	/* the JSON string escape is also an unambiguous quoting for text */
	add_json_string(b, s);
}

/* Write one event line. */
void
log_vkv(enum log_level level, const char *msg, va_list ap)
{
	struct buf b;
	char ts[32];
	int64_t ms = now_unix_ms();
	/* one format for the whole line, whatever SIGHUP does meanwhile */
	int json = __atomic_load_n(&log_json, __ATOMIC_RELAXED);
	const char *k, *v;
	char *r;

	if (!log_enabled(level))
		return;
	buf_init(&b, LOG_LINE_MAX);
	time_rfc3339(ms / 1000, ts);
	/* add milliseconds before the Z */
	ts[19] = '\0';
	if (json) {
		buf_printf(&b, "{\"ts\":\"%s.%03dZ\",\"level\":\"%s\",\"msg\":",
		    ts, (int)(ms % 1000), level_names[level]);
	} else {
		buf_printf(&b, "ts=%s.%03dZ level=%s msg=", ts,
		    (int)(ms % 1000), level_names[level]);
	}
	/*
	 * Redacted before escaping and cutting: a secret is found as it
	 * was registered, and a cut cannot leave the start of one behind.
	 */
	r = redact(msg);
	if (json)
		add_json_string(&b, r != NULL ? r : msg);
	else
		add_text_value(&b, r != NULL ? r : msg);
	free(r);
	while ((k = va_arg(ap, const char *)) != NULL) {
		v = va_arg(ap, const char *);
		if (v == NULL)
			v = "-";
		/* room for this pair and the end of the line, or stop here */
		if (b.len + 6 * (strlen(k) + LOG_VALUE_MAX) + 64 > LOG_LINE_MAX)
			break;
		r = redact(v);
		if (r != NULL)
			v = r;
		if (json) {
			buf_addstr(&b, ",");
			add_json_string(&b, k);
			buf_addstr(&b, ":");
			add_json_string(&b, v);
		} else {
			buf_addstr(&b, " ");
			add_text_value(&b, k);
			buf_addstr(&b, "=");
			add_text_value(&b, v);
		}
		free(r);
	}
	buf_addstr(&b, json ? "}\n" : "\n");
	if (b.data != NULL) {
		pthread_mutex_lock(&log_lock);
		fwrite(b.data, 1, b.len, stderr);
		fflush(stderr);
		pthread_mutex_unlock(&log_lock);
	}
	buf_release(&b);
}

/* Write one event line with NULL-terminated key/value pairs. */
void
log_kv(enum log_level level, const char *msg, ...)
{
	va_list ap;

	va_start(ap, msg);
	log_vkv(level, msg, ap);
	va_end(ap);
}
