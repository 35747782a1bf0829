/*
 * The YAML configuration of diverged (DESIGN.md section 12).
 *
 * The text is read twice with libyaml's event API. The first pass checks
 * the shape only (syntax, one document, no aliases, and the bounds on
 * nesting, sequence length and scalar size) so that the second pass, a
 * recursive descent driven by the key tables below, can assume a small,
 * well-formed tree. Values go into a temporary struct config built over
 * the defaults, which is handed to the caller only when everything,
 * including the cross-key rules, is valid.
 */

/*
 * Angle brackets on purpose: "config.h" from this directory would be the
 * module header, the autoconf one is found through -I. (the build dir).
 */
#include <config.h>

#include <sys/types.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <yaml.h>

#include "config/config.h"
#include "util/util.h"

#define MAX_FILE	(1024 * 1024)	/* bytes of YAML */
#define MAX_DEPTH	16		/* nested collections */
#define MAX_ITEMS	1024		/* sequence items, mapping keys */
#define MAX_SCALAR	(64 * 1024)	/* bytes of one scalar */
#define MAX_SECRET	(64 * 1024)	/* bytes of a resolved secret */
#define SHOW_MAX	64		/* bytes of a value in a message */

#define KIB		INT64_C(1024)
#define MIB		(KIB * 1024)
#define GIB		(MIB * 1024)
#define USD		INT64_C(1000000)	/* micro-USD per USD */
#define DAY		INT64_C(86400)

/* Keys whose line the cross-key rules report. */
enum slot {
	S_NONE = 0,
	S_API_LISTEN,
	S_API_CERT,
	S_API_KEY,
	S_GH_ENABLED,
	S_GL_ENABLED,
	S_APP_ID,
	S_APP_KEY,
	S_TASK_TTL,
	S_AUDIT_WINDOW,
	S_LE_ENABLED,
	S_LE_DURATION,
	S_LE_RENEW,
	S_LE_RETRY,
	S_MAX
};

struct ctx;
struct field;

/*
 * One key of a mapping. parse() is called with the value's first event
 * current, leaves the value's last event current and stores into
 * base + off (size bytes for integers), checking min..max.
 */
struct field {
	const char	*key;
	int		(*parse)(struct ctx *, const struct field *, void *);
	size_t		 off;
	size_t		 size;
	int64_t		 min;
	int64_t		 max;
	const void	*arg;		/* sub-table of a mapping */
	enum slot	 slot;
};

struct ctx {
	const char	*name;
	const char	*text;
	size_t		 len;
	yaml_parser_t	 parser;
	yaml_event_t	 ev;
	int		 have_ev;
	char		*err;
	char		 path[256];	/* key of the current value */
	size_t		 plen;
	size_t		 lines[S_MAX];
	struct config	*cfg;
	char		 shown[SHOW_MAX * 2 + 8];
};

/* ---- errors ---- */

static void ctx_fail(struct ctx *, size_t, const char *, ...)
    __attribute__((format(printf, 3, 4)));
static void ctx_fail_key(struct ctx *, size_t, const char *, ...)
    __attribute__((format(printf, 3, 4)));

/* Record the first error as "NAME:LINE: what". */
static void
ctx_fail(struct ctx *c, size_t line, const char *fmt, ...)
{
	va_list ap;
	char *msg;

	if (c->err != NULL)
		return;
	va_start(ap, fmt);
	msg = xvasprintf(fmt, ap);
	va_end(ap);
	c->err = xasprintf("%s:%zu: %s", c->name, line ? line : 1, msg);
	free(msg);
}

/* Same, prefixed with the quoted key of the current value. */
static void
ctx_fail_key(struct ctx *c, size_t line, const char *fmt, ...)
{
	va_list ap;
	char *msg;

	va_start(ap, fmt);
	msg = xvasprintf(fmt, ap);
	va_end(ap);
	ctx_fail(c, line, "'%s': %s", c->path, msg);
	free(msg);
}

/* The 1-based line holding byte offset off of the text. */
static size_t
line_at(const struct ctx *c, size_t off)
{
	size_t i, line = 1;

	if (off > c->len)
		off = c->len;
	for (i = 0; i < off; i++)
		if (c->text[i] == '\n')
			line++;
	return line;
}

/*
 * Copy at most SHOW_MAX bytes of s into c->shown for an error message,
 * in single quotes when quote is set, control characters replaced by '?',
 * "..." when cut.
 */
static const char *
show(struct ctx *c, const char *s, size_t len, int quote)
{
	size_t i, n = len, o = 0;

	if (n > SHOW_MAX) {
		n = SHOW_MAX;
		/* do not cut a UTF-8 sequence in two */
		while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
			n--;
	}
	if (quote)
		c->shown[o++] = '\'';
	for (i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];

		c->shown[o++] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
	}
	if (n < len) {
		memcpy(c->shown + o, "...", 3);
		o += 3;
	}
	if (quote)
		c->shown[o++] = '\'';
	c->shown[o] = '\0';
	return c->shown;
}

static size_t
ev_line(const struct ctx *c)
{
	return c->ev.start_mark.line + 1;
}

static const char *
sval(const struct ctx *c)
{
	return (const char *)c->ev.data.scalar.value;
}

static size_t
slen(const struct ctx *c)
{
	return c->ev.data.scalar.length;
}

/*
 * Describe the current event for "got ...": the quoted scalar, or its kind
 * when hide is set (secret-valued keys never have their value echoed).
 */
static const char *
what(struct ctx *c, int hide)
{
	switch (c->ev.type) {
	case YAML_MAPPING_START_EVENT:
		return "a mapping";
	case YAML_SEQUENCE_START_EVENT:
		return "a sequence";
	case YAML_SCALAR_EVENT:
		if (hide)
			return "a scalar";
		return show(c, sval(c), slen(c), 1);
	default:
		return "something else";
	}
}

/* ---- events ---- */

static void
syntax_error(struct ctx *c)
{
	yaml_parser_t *p = &c->parser;
	const char *problem = p->problem ? p->problem : "unknown error";
	size_t line;

	switch (p->error) {
	case YAML_MEMORY_ERROR:
		ctx_fail(c, p->mark.line + 1, "out of memory");
		return;
	case YAML_READER_ERROR:
		line = line_at(c, p->problem_offset);
		break;
	default:
		line = p->problem_mark.line + 1;
		break;
	}
	if (p->context != NULL)
		ctx_fail(c, line, "syntax error: %s %s", problem, p->context);
	else
		ctx_fail(c, line, "syntax error: %s", problem);
}

/* Make the next event current; -1 on a syntax error. */
static int
next(struct ctx *c)
{
	if (c->have_ev) {
		yaml_event_delete(&c->ev);
		c->have_ev = 0;
	}
	if (!yaml_parser_parse(&c->parser, &c->ev)) {
		syntax_error(c);
		return -1;
	}
	c->have_ev = 1;
	return 0;
}

/* A plain empty, "~" or "null" scalar: the key keeps its default. */
static int
is_null(const struct ctx *c)
{
	const char *s;

	if (c->ev.type != YAML_SCALAR_EVENT ||
	    c->ev.data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return 0;
	s = sval(c);
	return *s == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
	    strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

static size_t
path_push(struct ctx *c, const char *key)
{
	size_t saved = c->plen;
	int n;

	n = snprintf(c->path + c->plen, sizeof(c->path) - c->plen, "%s%s",
	    c->plen ? "." : "", key);
	if (n > 0)
		c->plen += (size_t)n;
	if (c->plen >= sizeof(c->path))
		c->plen = sizeof(c->path) - 1;
	return saved;
}

static size_t
path_push_index(struct ctx *c, size_t i)
{
	size_t saved = c->plen;
	int n;

	n = snprintf(c->path + c->plen, sizeof(c->path) - c->plen, "[%zu]",
	    i);
	if (n > 0)
		c->plen += (size_t)n;
	if (c->plen >= sizeof(c->path))
		c->plen = sizeof(c->path) - 1;
	return saved;
}

static void
path_pop(struct ctx *c, size_t saved)
{
	c->plen = saved;
	c->path[saved] = '\0';
}

/* ---- first pass: shape and bounds ---- */

static int
shape_count(struct ctx *c, const int *map, size_t *n, size_t depth)
{
	if (depth == 0)
		return 0;
	n[depth - 1]++;
	if (map[depth - 1] && n[depth - 1] > 2 * MAX_ITEMS) {
		ctx_fail(c, ev_line(c), "mapping with more than %d keys",
		    MAX_ITEMS);
		return -1;
	}
	if (!map[depth - 1] && n[depth - 1] > MAX_ITEMS) {
		ctx_fail(c, ev_line(c), "sequence longer than %d items",
		    MAX_ITEMS);
		return -1;
	}
	return 0;
}

static int
pass_shape(struct ctx *c)
{
	int map[MAX_DEPTH];
	size_t n[MAX_DEPTH];
	size_t depth = 0, docs = 0;

	for (;;) {
		if (next(c) < 0)
			return -1;
		switch (c->ev.type) {
		case YAML_STREAM_END_EVENT:
			return 0;
		case YAML_DOCUMENT_START_EVENT:
			if (++docs > 1) {
				ctx_fail(c, ev_line(c),
				    "multiple documents are not supported");
				return -1;
			}
			break;
		case YAML_ALIAS_EVENT:
			ctx_fail(c, ev_line(c), "aliases are not supported");
			return -1;
		case YAML_SCALAR_EVENT:
			if (shape_count(c, map, n, depth) < 0)
				return -1;
			if (slen(c) > MAX_SCALAR) {
				ctx_fail(c, ev_line(c),
				    "scalar longer than 64 KiB");
				return -1;
			}
			if (memchr(sval(c), '\0', slen(c)) != NULL) {
				ctx_fail(c, ev_line(c), "NUL byte in a scalar");
				return -1;
			}
			break;
		case YAML_SEQUENCE_START_EVENT:
		case YAML_MAPPING_START_EVENT:
			if (shape_count(c, map, n, depth) < 0)
				return -1;
			if (depth == MAX_DEPTH) {
				ctx_fail(c, ev_line(c),
				    "nesting deeper than %d levels",
				    MAX_DEPTH);
				return -1;
			}
			map[depth] = c->ev.type == YAML_MAPPING_START_EVENT;
			n[depth] = 0;
			depth++;
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			if (depth > 0)
				depth--;
			break;
		default:
			break;
		}
	}
}

/* ---- value checks ---- */

/* Decimal digits only into *out; -1 when empty, other text or overflow. */
static int
parse_u64(const char *s, int64_t *out)
{
	int64_t v = 0;

	if (*s == '\0')
		return -1;
	for (; *s != '\0'; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		if (v > (INT64_MAX - (*s - '0')) / 10)
			return -1;
		v = v * 10 + (*s - '0');
	}
	*out = v;
	return 0;
}

static int
parse_bool(const char *s)
{
	static const char *const yes[] = { "true", "yes", "on" };
	static const char *const no[] = { "false", "no", "off" };
	size_t i;

	for (i = 0; i < ARRAY_SIZE(yes); i++) {
		if (strcasecmp(s, yes[i]) == 0)
			return 1;
		if (strcasecmp(s, no[i]) == 0)
			return 0;
	}
	return -1;
}

/* "5MiB", "512KiB", "1GiB", "4096": bytes, -1 if bad. */
static int64_t
parse_size(const char *s)
{
	static const struct {
		const char	*suffix;
		int64_t		 mult;
	} units[] = {
		{ "", 1 }, { "B", 1 },
		{ "KiB", KIB }, { "Ki", KIB },
		{ "MiB", MIB }, { "Mi", MIB },
		{ "GiB", GIB }, { "Gi", GIB },
	};
	int64_t v = 0;
	size_t i;

	if (*s < '0' || *s > '9')
		return -1;
	for (; *s >= '0' && *s <= '9'; s++) {
		if (v > (INT64_MAX - (*s - '0')) / 10)
			return -1;
		v = v * 10 + (*s - '0');
	}
	for (i = 0; i < ARRAY_SIZE(units); i++) {
		if (strcmp(s, units[i].suffix) != 0)
			continue;
		if (v > INT64_MAX / units[i].mult)
			return -1;
		return v * units[i].mult;
	}
	return -1;
}

static void
fmt_duration(int64_t s, char *out, size_t size)
{
	static const struct {
		char	 unit;
		int64_t	 secs;
	} units[] = { { 'd', DAY }, { 'h', 3600 }, { 'm', 60 }, { 's', 1 } };
	size_t i, o = 0;
	int n;

	out[0] = '\0';
	if (s == 0) {
		snprintf(out, size, "0s");
		return;
	}
	for (i = 0; i < ARRAY_SIZE(units); i++) {
		if (s < units[i].secs)
			continue;
		n = snprintf(out + o, size - o, "%" PRId64 "%c",
		    s / units[i].secs, units[i].unit);
		if (n < 0 || (size_t)n >= size - o)
			return;
		o += (size_t)n;
		s %= units[i].secs;
	}
}

/* A duration in milliseconds: "15s", "1s500ms", "250ms". */
static void
fmt_duration_ms(int64_t ms, char *out, size_t size)
{
	size_t n;

	if (ms % 1000 == 0 || ms < 1000) {
		if (ms % 1000 == 0)
			fmt_duration(ms / 1000, out, size);
		else
			snprintf(out, size, "%" PRId64 "ms", ms);
		return;
	}
	fmt_duration(ms / 1000, out, size);
	n = strlen(out);
	snprintf(out + n, size - n, "%" PRId64 "ms", ms % 1000);
}

static void
fmt_size(int64_t v, char *out, size_t size)
{
	if (v != 0 && v % GIB == 0)
		snprintf(out, size, "%" PRId64 "GiB", v / GIB);
	else if (v != 0 && v % MIB == 0)
		snprintf(out, size, "%" PRId64 "MiB", v / MIB);
	else if (v != 0 && v % KIB == 0)
		snprintf(out, size, "%" PRId64 "KiB", v / KIB);
	else
		snprintf(out, size, "%" PRId64, v);
}

static int
is_ctrl_or_space(unsigned char ch)
{
	return ch <= 0x20 || ch == 0x7f;
}

static int
has_ctrl_or_space(const char *s)
{
	for (; *s != '\0'; s++)
		if (is_ctrl_or_space((unsigned char)*s))
			return 1;
	return 0;
}

/*
 * "host:port" or "[v6]:port", port 0..65535 (0: the system chooses).
 * *loopback tells whether the host is a loopback address or "localhost".
 */
static int
parse_listen(const char *s, int *loopback)
{
	const char *colon, *p;
	char host[256];
	size_t hlen;
	int64_t port;
	int digits_only = 1;
	struct in_addr a4;
	struct in6_addr a6;

	*loopback = 0;
	if (s[0] == '[') {
		p = strchr(s, ']');
		if (p == NULL || p[1] != ':')
			return -1;
		hlen = (size_t)(p - s - 1);
		if (hlen == 0 || hlen >= sizeof(host))
			return -1;
		memcpy(host, s + 1, hlen);
		host[hlen] = '\0';
		if (inet_pton(AF_INET6, host, &a6) != 1)
			return -1;
		*loopback = IN6_IS_ADDR_LOOPBACK(&a6) ||
		    (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
		colon = p + 1;
	} else {
		colon = strrchr(s, ':');
		if (colon == NULL)
			return -1;
		hlen = (size_t)(colon - s);
		if (hlen == 0 || hlen >= sizeof(host))
			return -1;
		memcpy(host, s, hlen);
		host[hlen] = '\0';
		if (host[0] == '-' || host[0] == '.')
			return -1;
		for (p = host; *p != '\0'; p++) {
			if (!isalnum((unsigned char)*p) && *p != '-' &&
			    *p != '.')
				return -1;
			if (isalpha((unsigned char)*p) || *p == '-')
				digits_only = 0;
		}
		if (inet_pton(AF_INET, host, &a4) == 1)
			*loopback = (ntohl(a4.s_addr) >> 24) == 127;
		else if (digits_only)
			return -1;	/* looks like a bad IPv4 address */
		else
			*loopback = strcasecmp(host, "localhost") == 0;
	}
	if (strlen(colon + 1) > 5 || parse_u64(colon + 1, &port) < 0 ||
	    port > 65535)
		return -1;
	return 0;
}

static int
is_loopback(const char *listen)
{
	int loopback;

	return parse_listen(listen, &loopback) == 0 && loopback;
}

static int
is_http_url(const char *s)
{
	const char *rest;

	if (strncmp(s, "http://", 7) == 0)
		rest = s + 7;
	else if (strncmp(s, "https://", 8) == 0)
		rest = s + 8;
	else
		return 0;
	return *rest != '\0' && *rest != '/' && !has_ctrl_or_space(s);
}

/* A DNS-1123 label, what Kubernetes accepts as a namespace name. */
static int
is_dns_label(const char *s)
{
	size_t i, n = strlen(s);

	if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-')
		return 0;
	for (i = 0; i < n; i++)
		if (!(s[i] >= 'a' && s[i] <= 'z') &&
		    !(s[i] >= '0' && s[i] <= '9') && s[i] != '-')
			return 0;
	return 1;
}

/* A Kubernetes quantity: digits, optional fraction, optional suffix. */
static int
is_quantity(const char *s)
{
	static const char *const suffixes[] = {
		"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
		"k", "M", "G", "T", "P", "E"
	};
	size_t i;

	if (!isdigit((unsigned char)*s))
		return 0;
	while (isdigit((unsigned char)*s))
		s++;
	if (*s == '.') {
		s++;
		if (!isdigit((unsigned char)*s))
			return 0;
		while (isdigit((unsigned char)*s))
			s++;
	}
	for (i = 0; i < ARRAY_SIZE(suffixes); i++)
		if (strcmp(s, suffixes[i]) == 0)
			return 1;
	return 0;
}

static int
is_env_name(const char *s)
{
	if (!isalpha((unsigned char)*s) && *s != '_')
		return 0;
	for (; *s != '\0'; s++)
		if (!isalnum((unsigned char)*s) && *s != '_')
			return 0;
	return 1;
}

/* A model name or a prefix pattern "claude-*" ('*' last only). */
static int
is_capability(const char *s)
{
	const char *star = strchr(s, '*');

	return *s != '\0' && !has_ctrl_or_space(s) &&
	    (star == NULL || star[1] == '\0');
}

/* ---- value parsers ---- */

static void *
dst(void *base, const struct field *f)
{
	return (char *)base + f->off;
}

static void
set_str(void *p, const char *s)
{
	char **sp = p;

	free(*sp);
	*sp = s != NULL ? xstrdup(s) : NULL;
}

static void
set_int(void *p, size_t size, int64_t v)
{
	int i = (int)v;

	if (size == sizeof(int64_t))
		memcpy(p, &v, sizeof(v));
	else
		memcpy(p, &i, sizeof(i));
}

static void
list_add(struct config_strlist *l, const char *s)
{
	l->v = xrealloc(l->v, (l->n + 1) * sizeof(*l->v));
	l->v[l->n++] = xstrdup(s);
}

/*
 * Most parsers start the same way: a null leaves the default (returns 1),
 * anything but a scalar is an error (-1), a scalar goes on (0).
 */
static int
scalar_start(struct ctx *c, int hide)
{
	if (is_null(c))
		return 1;
	if (c->ev.type == YAML_SCALAR_EVENT)
		return 0;
	ctx_fail_key(c, ev_line(c), "expected a scalar, got %s",
	    what(c, hide));
	return -1;
}

/* Any text, empty included. */
static int
p_string(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);

	if (r == 0)
		set_str(dst(base, f), sval(c));
	return r < 0 ? -1 : 0;
}

/* Non-empty text. */
static int
p_name(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (*sval(c) == '\0') {
		ctx_fail_key(c, ev_line(c), "must not be empty");
		return -1;
	}
	set_str(dst(base, f), sval(c));
	return 0;
}

/* A file path; "" unsets it. */
static int
p_path(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);

	if (r == 0)
		set_str(dst(base, f), *sval(c) ? sval(c) : NULL);
	return r < 0 ? -1 : 0;
}

static int
p_listen(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0), loopback;

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (parse_listen(sval(c), &loopback) < 0) {
		ctx_fail_key(c, ev_line(c),
		    "expected host:port or [v6]:port, got %s", what(c, 0));
		return -1;
	}
	set_str(dst(base, f), sval(c));
	return 0;
}

static int
p_url(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (!is_http_url(sval(c))) {
		ctx_fail_key(c, ev_line(c),
		    "expected an http:// or https:// URL, got %s", what(c, 0));
		return -1;
	}
	set_str(dst(base, f), sval(c));
	return 0;
}

/* preview.url_template: an http(s) URL containing {env}; "" unsets. */
static int
p_template(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (*sval(c) == '\0') {
		set_str(dst(base, f), NULL);
		return 0;
	}
	if (!is_http_url(sval(c))) {
		ctx_fail_key(c, ev_line(c),
		    "expected an http:// or https:// URL, got %s", what(c, 0));
		return -1;
	}
	if (strstr(sval(c), "{env}") == NULL) {
		ctx_fail_key(c, ev_line(c), "must contain {env}, got %s",
		    what(c, 0));
		return -1;
	}
	set_str(dst(base, f), sval(c));
	return 0;
}

static int
p_namespace(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (!is_dns_label(sval(c))) {
		ctx_fail_key(c, ev_line(c), "expected a namespace name "
		    "(lowercase letters, digits and '-', at most 63), got %s",
		    what(c, 0));
		return -1;
	}
	set_str(dst(base, f), sval(c));
	return 0;
}

/*
 * An object name (a DNS-1123 subdomain: lowercase letters, digits, '-'
 * and '.', at most 253), as a Lease's.
 */
static int
p_object_name(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);
	const char *s;
	size_t n;
	int ok;

	if (r != 0)
		return r < 0 ? -1 : 0;
	s = sval(c);
	n = strlen(s);
	ok = n > 0 && n <= 253 && s[0] != '.' && s[n - 1] != '.' &&
	    s[0] != '-' && s[n - 1] != '-' &&
	    strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-.") == n &&
	    strstr(s, "..") == NULL && strstr(s, ".-") == NULL &&
	    strstr(s, "-.") == NULL;
	if (!ok) {
		ctx_fail_key(c, ev_line(c), "expected an object name "
		    "(lowercase letters, digits, '-' and '.', at most 253), "
		    "got %s", what(c, 0));
		return -1;
	}
	set_str(dst(base, f), s);
	return 0;
}

/* The current scalar is a glob on "host/owner/name" (not a null). */
static int
check_glob(struct ctx *c)
{
	if (is_null(c) || *sval(c) == '\0' || has_ctrl_or_space(sval(c))) {
		ctx_fail_key(c, ev_line(c),
		    "expected a pattern like github.com/org/*, got %s",
		    what(c, 0));
		return -1;
	}
	return 0;
}

static int
p_glob(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (check_glob(c) < 0)
		return -1;
	set_str(dst(base, f), sval(c));
	return 0;
}

static int
p_quantity(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (!is_quantity(sval(c))) {
		ctx_fail_key(c, ev_line(c),
		    "expected a Kubernetes quantity like 5Gi, got %s",
		    what(c, 0));
		return -1;
	}
	set_str(dst(base, f), sval(c));
	return 0;
}

/* Check a secret reference without ever quoting it. */
static int
check_secret(struct ctx *c, const char *s)
{
	if (strncmp(s, "file:", 5) == 0) {
		if (s[5] != '\0')
			return 0;
		ctx_fail_key(c, ev_line(c), "file: needs a path");
		return -1;
	}
	if (strncmp(s, "env:", 4) == 0) {
		if (is_env_name(s + 4))
			return 0;
		ctx_fail_key(c, ev_line(c), "env: needs a variable name "
		    "(letters, digits and _)");
		return -1;
	}
	ctx_fail_key(c, ev_line(c), "secrets must be written as file:/path "
	    "or env:NAME, not inline");
	return -1;
}

/* Remember the line of the secret reference at the current key. */
static void
secret_line(struct ctx *c)
{
	struct config *g = c->cfg;
	struct config_keyline *kl;

	g->secret_lines = xrealloc(g->secret_lines,
	    (g->nsecret_lines + 1) * sizeof(*g->secret_lines));
	kl = &g->secret_lines[g->nsecret_lines++];
	kl->key = xstrdup(c->path);
	kl->line = (int)ev_line(c);
}

/* A secret reference; "" unsets it. */
static int
p_secret(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 1);

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (*sval(c) == '\0') {
		set_str(dst(base, f), NULL);
		return 0;
	}
	if (check_secret(c, sval(c)) < 0)
		return -1;
	set_str(dst(base, f), sval(c));
	secret_line(c);
	return 0;
}

/*
 * Walk a sequence, calling item() with each item current and the path
 * set to KEY[i]. A null is an empty sequence.
 */
static int
walk_seq(struct ctx *c, int hide,
    int (*item)(struct ctx *, const struct field *, void *, size_t),
    const struct field *f, void *base)
{
	size_t i, saved;

	if (is_null(c))
		return 0;
	if (c->ev.type != YAML_SEQUENCE_START_EVENT) {
		ctx_fail_key(c, ev_line(c), "expected a sequence, got %s",
		    what(c, hide));
		return -1;
	}
	for (i = 0;; i++) {
		if (next(c) < 0)
			return -1;
		if (c->ev.type == YAML_SEQUENCE_END_EVENT)
			return 0;
		saved = path_push_index(c, i);
		if (item(c, f, base, i) < 0)
			return -1;
		path_pop(c, saved);
	}
}

static int
secret_item(struct ctx *c, const struct field *f, void *base, size_t i)
{
	if (c->ev.type != YAML_SCALAR_EVENT) {
		ctx_fail_key(c, ev_line(c), "expected a scalar, got %s",
		    what(c, 1));
		return -1;
	}
	if (is_null(c) || *sval(c) == '\0') {
		ctx_fail_key(c, ev_line(c), "empty secret reference");
		return -1;
	}
	if (check_secret(c, sval(c)) < 0)
		return -1;
	list_add(dst(base, f), sval(c));
	secret_line(c);
	return 0;
}

static int
p_secrets(struct ctx *c, const struct field *f, void *base)
{
	return walk_seq(c, 1, secret_item, f, base);
}

/* A sequence item must be a scalar; -1 and the error if it is not. */
static int
scalar_item(struct ctx *c)
{
	if (c->ev.type == YAML_SCALAR_EVENT)
		return 0;
	ctx_fail_key(c, ev_line(c), "expected a scalar, got %s", what(c, 0));
	return -1;
}

static int
cap_item(struct ctx *c, const struct field *f, void *base, size_t i)
{
	if (scalar_item(c) < 0)
		return -1;
	if (!is_capability(sval(c))) {
		ctx_fail_key(c, ev_line(c),
		    "expected a model name or a prefix* pattern, got %s",
		    what(c, 0));
		return -1;
	}
	list_add(dst(base, f), sval(c));
	return 0;
}

static int
p_capabilities(struct ctx *c, const struct field *f, void *base)
{
	return walk_seq(c, 0, cap_item, f, base);
}

/* An item of repo_allowlist: a glob like repos[].match, never a null. */
static int
glob_item(struct ctx *c, const struct field *f, void *base, size_t i)
{
	if (scalar_item(c) < 0 || check_glob(c) < 0)
		return -1;
	list_add(dst(base, f), sval(c));
	return 0;
}

static int
p_globs(struct ctx *c, const struct field *f, void *base)
{
	return walk_seq(c, 0, glob_item, f, base);
}

static int
p_bool(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0), v;

	if (r != 0)
		return r < 0 ? -1 : 0;
	v = parse_bool(sval(c));
	if (v < 0) {
		ctx_fail_key(c, ev_line(c), "expected true or false, got %s",
		    what(c, 0));
		return -1;
	}
	set_int(dst(base, f), f->size, v);
	return 0;
}

static int
p_int(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);
	int64_t v;

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (parse_u64(sval(c), &v) == 0 && v >= f->min && v <= f->max) {
		set_int(dst(base, f), f->size, v);
		return 0;
	}
	ctx_fail_key(c, ev_line(c), "expected an integer from %" PRId64
	    " to %" PRId64 ", got %s", f->min, f->max, what(c, 0));
	return -1;
}

/*
 * A duration, stored in seconds, or with ms in milliseconds ("250ms"
 * allowed then); f's range is in the same unit.
 */
static int
duration_field(struct ctx *c, const struct field *f, void *base, int ms)
{
	int r = scalar_start(c, 0);
	char lo[32], hi[32];
	int64_t v;

	if (r != 0)
		return r < 0 ? -1 : 0;
	v = ms ? config_parse_duration_ms(sval(c)) :
	    config_parse_duration(sval(c));
	if (v < 0) {
		ctx_fail_key(c, ev_line(c), ms ? "expected a duration like "
		    "15s, 1s500ms or 250ms, got %s" : "expected a duration "
		    "like 30s, 15m, 24h, 7d or 1h30m, got %s", what(c, 0));
		return -1;
	}
	if (v < f->min || v > f->max) {
		(ms ? fmt_duration_ms : fmt_duration)(f->min, lo, sizeof(lo));
		(ms ? fmt_duration_ms : fmt_duration)(f->max, hi, sizeof(hi));
		ctx_fail_key(c, ev_line(c),
		    "expected a duration from %s to %s, got %s", lo, hi,
		    what(c, 0));
		return -1;
	}
	set_int(dst(base, f), f->size, v);
	return 0;
}

static int
p_duration(struct ctx *c, const struct field *f, void *base)
{
	return duration_field(c, f, base, 0);
}

static int
p_duration_ms(struct ctx *c, const struct field *f, void *base)
{
	return duration_field(c, f, base, 1);
}

static int
p_size(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);
	char lo[32], hi[32];
	int64_t v;

	if (r != 0)
		return r < 0 ? -1 : 0;
	v = parse_size(sval(c));
	if (v < 0) {
		ctx_fail_key(c, ev_line(c),
		    "expected a size like 512KiB or 5MiB, got %s", what(c, 0));
		return -1;
	}
	if (v < f->min || v > f->max) {
		fmt_size(f->min, lo, sizeof(lo));
		fmt_size(f->max, hi, sizeof(hi));
		ctx_fail_key(c, ev_line(c),
		    "expected a size from %s to %s, got %s", lo, hi,
		    what(c, 0));
		return -1;
	}
	set_int(dst(base, f), f->size, v);
	return 0;
}

static int
p_usd(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);
	int64_t v;

	if (r != 0)
		return r < 0 ? -1 : 0;
	v = config_parse_usd(sval(c));
	if (v < 0) {
		ctx_fail_key(c, ev_line(c), "expected a USD amount like 5.00 "
		    "(at most 6 decimals), got %s", what(c, 0));
		return -1;
	}
	if (v < f->min || v > f->max) {
		ctx_fail_key(c, ev_line(c), "expected a USD amount from %"
		    PRId64 " to %" PRId64 ", got %s", f->min / USD,
		    f->max / USD, what(c, 0));
		return -1;
	}
	set_int(dst(base, f), f->size, v);
	return 0;
}

static int
p_log_level(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0), v;

	if (r != 0)
		return r < 0 ? -1 : 0;
	v = log_level_parse(sval(c));
	if (v < 0) {
		ctx_fail_key(c, ev_line(c),
		    "expected debug, info, warn or error, got %s", what(c, 0));
		return -1;
	}
	set_int(dst(base, f), f->size, v);
	return 0;
}

static int
p_log_format(struct ctx *c, const struct field *f, void *base)
{
	int r = scalar_start(c, 0);

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (strcmp(sval(c), "text") != 0 && strcmp(sval(c), "json") != 0) {
		ctx_fail_key(c, ev_line(c), "expected text or json, got %s",
		    what(c, 0));
		return -1;
	}
	set_int(dst(base, f), f->size, strcmp(sval(c), "json") == 0);
	return 0;
}

static int
p_kube_mode(struct ctx *c, const struct field *f, void *base)
{
	struct config *cfg = base;
	int r = scalar_start(c, 0);

	if (r != 0)
		return r < 0 ? -1 : 0;
	if (strcmp(sval(c), "embedded") == 0)
		cfg->kubernetes.mode = KUBE_EMBEDDED;
	else if (strcmp(sval(c), "kubeconfig") == 0)
		cfg->kubernetes.mode = KUBE_KUBECONFIG;
	else if (strcmp(sval(c), "in-cluster") == 0)
		cfg->kubernetes.mode = KUBE_IN_CLUSTER;
	else {
		ctx_fail_key(c, ev_line(c), "expected embedded, kubeconfig "
		    "or in-cluster, got %s", what(c, 0));
		return -1;
	}
	return 0;
}

/* ---- mappings and the key tables ---- */

static int
parse_mapping(struct ctx *c, const struct field *fields, void *base)
{
	const struct field *f;
	uint64_t seen = 0;
	size_t i, keyline, saved;

	for (;;) {
		if (next(c) < 0)
			return -1;
		if (c->ev.type == YAML_MAPPING_END_EVENT)
			return 0;
		keyline = ev_line(c);
		if (c->ev.type != YAML_SCALAR_EVENT) {
			if (c->plen > 0)
				ctx_fail_key(c, keyline, "expected a scalar "
				    "key, got %s", what(c, 0));
			else
				ctx_fail(c, keyline, "expected a scalar key, "
				    "got %s", what(c, 0));
			return -1;
		}
		for (i = 0; fields[i].key != NULL; i++)
			if (strcmp(fields[i].key, sval(c)) == 0)
				break;
		if (fields[i].key == NULL || (seen & (UINT64_C(1) << i))) {
			ctx_fail(c, keyline, "%s key '%s%s%s'",
			    fields[i].key == NULL ? "unknown" : "duplicate",
			    c->path, c->plen ? "." : "",
			    show(c, sval(c), slen(c), 0));
			return -1;
		}
		seen |= UINT64_C(1) << i;
		f = &fields[i];
		saved = path_push(c, f->key);
		if (next(c) < 0 || f->parse(c, f, base) < 0)
			return -1;
		path_pop(c, saved);
		if (f->slot != S_NONE)
			c->lines[f->slot] = keyline;
	}
}

static int
p_map(struct ctx *c, const struct field *f, void *base)
{
	if (is_null(c))
		return 0;
	if (c->ev.type != YAML_MAPPING_START_EVENT) {
		ctx_fail_key(c, ev_line(c), "expected a mapping, got %s",
		    what(c, 0));
		return -1;
	}
	return parse_mapping(c, f->arg, base);
}

#define FIELD(t, k, fn, m, lo, hi, s) \
	{ k, fn, offsetof(t, m), sizeof(((t *)0)->m), lo, hi, NULL, s }
#define F(k, fn, m)		FIELD(struct config, k, fn, m, 0, 0, S_NONE)
#define FS(k, fn, m, s)		FIELD(struct config, k, fn, m, 0, 0, s)
#define FR(k, fn, m, lo, hi) \
	FIELD(struct config, k, fn, m, lo, hi, S_NONE)
#define MAP(k, sub)		{ k, p_map, 0, 0, 0, 0, sub, S_NONE }
#define END			{ NULL, NULL, 0, 0, 0, 0, NULL, S_NONE }

static const struct field api_fields[] = {
	FS("listen", p_listen, api.listen, S_API_LISTEN),
	FS("tls_cert", p_path, api.tls_cert, S_API_CERT),
	FS("tls_key", p_path, api.tls_key, S_API_KEY),
	F("token", p_secret, api.token),
	END
};

static const struct field log_fields[] = {
	F("level", p_log_level, log.level),
	F("format", p_log_format, log.json),
	END
};

static const struct field leader_election_fields[] = {
	FS("enabled", p_bool, kubernetes.leader_election.enabled,
	    S_LE_ENABLED),
	F("lease_name", p_object_name, kubernetes.leader_election.lease_name),
	F("namespace", p_namespace, kubernetes.leader_election.namespace),
	FIELD(struct config, "lease_duration", p_duration_ms,
	    kubernetes.leader_election.lease_duration_ms, 1000, 3600 * 1000,
	    S_LE_DURATION),
	FIELD(struct config, "renew_deadline", p_duration_ms,
	    kubernetes.leader_election.renew_deadline_ms, 100, 3600 * 1000,
	    S_LE_RENEW),
	FIELD(struct config, "retry_period", p_duration_ms,
	    kubernetes.leader_election.retry_period_ms, 100, 3600 * 1000,
	    S_LE_RETRY),
	END
};

static const struct field kubernetes_fields[] = {
	F("mode", p_kube_mode, kubernetes.mode),
	F("kubeconfig", p_string, kubernetes.kubeconfig),
	F("context", p_string, kubernetes.context),
	MAP("leader_election", leader_election_fields),
	END
};

static const struct field controller_fields[] = {
	F("namespace", p_namespace, controller.namespace),
	FR("workers", p_int, controller.workers, 1, 64),
	F("enabled", p_bool, controller.enabled),
	FR("max_active_tasks", p_int, controller.max_active_tasks, 0, 100000),
	FIELD(struct config, "ttl_after_finished", p_duration,
	    controller.ttl_after_finished_s, 0, 3650 * DAY, S_TASK_TTL),
	END
};

static const struct field meter_fields[] = {
	F("public_url", p_url, meter.public_url),
	END
};

static const struct field github_app_fields[] = {
	FS("id", p_name, github.app.id, S_APP_ID),
	FS("private_key", p_secret, github.app.private_key, S_APP_KEY),
	F("slug", p_name, github.app.slug),
	END
};

static const struct field github_fields[] = {
	FS("enabled", p_bool, github.enabled, S_GH_ENABLED),
	F("api_url", p_url, github.api_url),
	F("webhook_secrets", p_secrets, github.webhook_secrets),
	F("token", p_secret, github.token),
	MAP("app", github_app_fields),
	F("allow_forks", p_bool, github.allow_forks),
	F("ca_file", p_path, github.ca_file),
	END
};

static const struct field gitlab_fields[] = {
	FS("enabled", p_bool, gitlab.enabled, S_GL_ENABLED),
	F("api_url", p_url, gitlab.api_url),
	F("webhook_tokens", p_secrets, gitlab.webhook_tokens),
	F("signing_token", p_secret, gitlab.signing_token),
	F("token", p_secret, gitlab.token),
	F("allow_forks", p_bool, gitlab.allow_forks),
	F("ca_file", p_path, gitlab.ca_file),
	END
};

static const struct field repo_fields[] = {
	FIELD(struct config_repo_rule, "match", p_glob, match, 0, 0, S_NONE),
	FIELD(struct config_repo_rule, "namespace", p_namespace, namespace,
	    0, 0, S_NONE),
	END
};

static const struct field defaults_fields[] = {
	F("capabilities", p_capabilities, defaults.capabilities),
	FR("budgetUSD", p_usd, defaults.budget_usd_micro, 0, 1000000 * USD),
	FR("budgetTokens", p_int, defaults.budget_tokens, 0,
	    INT64_C(1000000000000)),
	FR("maxIterations", p_int, defaults.max_iterations, 1, 1000),
	FR("timeoutSeconds", p_int, defaults.timeout_seconds, 1, 7 * DAY),
	END
};

static const struct field sandbox_fields[] = {
	F("image", p_name, sandbox.image),
	F("runtime_class", p_string, sandbox.runtime_class),
	FR("uid", p_int, sandbox.uid, 1, INT64_C(4294967294)),
	F("workspace_size", p_quantity, sandbox.workspace_size),
	F("network_policy", p_bool, sandbox.network_policy),
	FIELD(struct config, "audit_window", p_duration, sandbox.audit_window_s,
	    0, 365 * DAY, S_AUDIT_WINDOW),
	FR("warm_pool", p_int, sandbox.warm_pool, 0, 1024),
	END
};

static const struct field preview_fields[] = {
	F("url_template", p_template, preview.url_template),
	END
};

static const struct field http_fields[] = {
	FR("max_body_bytes", p_size, http.max_body_bytes, KIB, GIB),
	FR("max_connections", p_int, http.max_connections, 1, 65536),
	FR("max_connections_per_ip", p_int, http.max_connections_per_ip, 0,
	    65536),
	FR("connection_timeout", p_duration, http.connection_timeout_s, 1,
	    3600),
	FR("request_timeout", p_duration, http.request_timeout_s, 1, 3600),
	FR("threads", p_int, http.threads, 1, 256),
	FR("max_header_bytes", p_size, http.max_header_bytes, KIB, MIB),
	END
};

static const struct field inbox_fields[] = {
	FR("capacity", p_int, inbox.capacity, 1, 1000000000),
	FR("workers", p_int, inbox.workers, 1, 64),
	FR("max_attempts", p_int, inbox.max_attempts, 1, 1000),
	FR("retention", p_duration, inbox.retention_s, 0, 365 * DAY),
	END
};

static const struct field commands_fields[] = {
	FR("max_per_comment", p_int, commands.max_per_comment, 1, 100),
	FR("max_bump_usd", p_usd, commands.max_bump_usd_micro, 0,
	    1000000 * USD),
	FR("max_bump_tokens", p_int, commands.max_bump_tokens, 0,
	    INT64_C(1000000000000)),
	END
};

static int p_repos(struct ctx *, const struct field *, void *);

static const struct field root_fields[] = {
	F("listen", p_listen, listen),
	F("state_dir", p_name, state_dir),
	MAP("api", api_fields),
	MAP("log", log_fields),
	MAP("kubernetes", kubernetes_fields),
	F("namespace", p_namespace, namespace),
	MAP("controller", controller_fields),
	MAP("meter", meter_fields),
	MAP("github", github_fields),
	MAP("gitlab", gitlab_fields),
	F("repos", p_repos, repos),
	F("repo_allowlist", p_globs, repo_allowlist),
	MAP("defaults", defaults_fields),
	MAP("sandbox", sandbox_fields),
	MAP("preview", preview_fields),
	MAP("http", http_fields),
	MAP("inbox", inbox_fields),
	MAP("commands", commands_fields),
	FR("shutdown_timeout", p_duration, shutdown_timeout_s, 0, 3600),
	END
};

static int
repo_item(struct ctx *c, const struct field *f, void *base, size_t i)
{
	struct config *cfg = base;
	struct config_repo_rule *r;

	if (c->ev.type != YAML_MAPPING_START_EVENT) {
		ctx_fail_key(c, ev_line(c), "expected a mapping, got %s",
		    what(c, 0));
		return -1;
	}
	/* added before parsing so that an error frees what was set */
	cfg->repos = xrealloc(cfg->repos, (i + 1) * sizeof(*cfg->repos));
	r = &cfg->repos[i];
	memset(r, 0, sizeof(*r));
	r->line = (int)ev_line(c);
	cfg->nrepos = i + 1;
	if (parse_mapping(c, repo_fields, r) < 0)
		return -1;
	if (r->match == NULL || r->namespace == NULL) {
		ctx_fail_key(c, (size_t)r->line, "missing '%s'",
		    r->match == NULL ? "match" : "namespace");
		return -1;
	}
	return 0;
}

static int
p_repos(struct ctx *c, const struct field *f, void *base)
{
	return walk_seq(c, 0, repo_item, f, base);
}

/* ------------------------------------------------ changes on reload */

static int
str_differ(const char *a, const char *b)
{
	return strcmp(a != NULL ? a : "", b != NULL ? b : "") != 0;
}

static int
strlist_differ(const struct config_strlist *a, const struct config_strlist *b)
{
	size_t i;

	if (a->n != b->n)
		return 1;
	for (i = 0; i < a->n; i++)
		if (str_differ(a->v[i], b->v[i]))
			return 1;
	return 0;
}

static int
repos_differ(const struct config *a, const struct config *b)
{
	size_t i;

	if (a->nrepos != b->nrepos)
		return 1;
	for (i = 0; i < a->nrepos; i++)
		if (str_differ(a->repos[i].match, b->repos[i].match) ||
		    str_differ(a->repos[i].namespace, b->repos[i].namespace))
			return 1;
	return 0;
}

/*
 * Whether field f differs between the structs at a and b. Every parse
 * function of the tables is one of these kinds; test_config's
 * restart_keys case changes a key of each.
 */
static int
field_differs(const struct field *f, const char *a, const char *b)
{
	int (*p)(struct ctx *, const struct field *, void *) = f->parse;

	if (p == p_string || p == p_name || p == p_path || p == p_listen ||
	    p == p_url || p == p_template || p == p_namespace ||
	    p == p_quantity || p == p_secret || p == p_object_name)
		return str_differ(*(char *const *)(a + f->off),
		    *(char *const *)(b + f->off));
	if (p == p_secrets || p == p_capabilities || p == p_globs)
		return strlist_differ(
		    (const struct config_strlist *)(a + f->off),
		    (const struct config_strlist *)(b + f->off));
	if (p == p_repos)
		return repos_differ((const struct config *)a,
		    (const struct config *)b);
	/* integers, booleans, durations, sizes, amounts, enums */
	return memcmp(a + f->off, b + f->off, f->size) != 0;
}

/* What SIGHUP applies: secrets, repo_allowlist, log settings. */
static int
reloadable(const struct field *f, const char *key)
{
	return f->parse == p_secret || f->parse == p_secrets ||
	    strcmp(key, "repo_allowlist") == 0 ||
	    strncmp(key, "log.", 4) == 0;
}

static void
changed_keys(const struct field *t, const char *prefix, const char *a,
    const char *b, struct buf *out)
{
	char *key;

	for (; t->key != NULL; t++) {
		key = xasprintf("%s%s", prefix, t->key);
		if (t->parse == p_map) {
			char *sub = xasprintf("%s.", key);

			changed_keys(t->arg, sub, a, b, out);
			free(sub);
		} else if (!reloadable(t, key) && field_differs(t, a, b)) {
			if (out->len > 0)
				buf_addstr(out, ",");
			buf_addstr(out, key);
		}
		free(key);
	}
}

char *
config_restart_keys(const struct config *running, const struct config *next)
{
	struct buf b;

	buf_init(&b, 8192);	/* every key: about 2 KB */
	changed_keys(root_fields, "", (const char *)running,
	    (const char *)next, &b);
	if (b.len == 0) {
		buf_release(&b);
		return NULL;
	}
	return buf_detach(&b, NULL);
}

static int
pass_values(struct ctx *c)
{
	if (next(c) < 0 || next(c) < 0)		/* stream, document */
		return -1;
	if (c->ev.type == YAML_STREAM_END_EVENT)
		return 0;			/* no document at all */
	if (next(c) < 0)
		return -1;
	if (is_null(c))
		return 0;
	if (c->ev.type != YAML_MAPPING_START_EVENT) {
		ctx_fail(c, ev_line(c),
		    "expected a mapping at the top level, got %s", what(c, 0));
		return -1;
	}
	return parse_mapping(c, root_fields, c->cfg);
}

/* Run one pass over the text with a fresh parser. */
static int
run_pass(struct ctx *c, int (*pass)(struct ctx *))
{
	int ret;

	if (!yaml_parser_initialize(&c->parser)) {
		ctx_fail(c, 1, "out of memory");
		return -1;
	}
	yaml_parser_set_input_string(&c->parser,
	    (const unsigned char *)c->text, c->len);
	ret = pass(c);
	if (c->have_ev) {
		yaml_event_delete(&c->ev);
		c->have_ev = 0;
	}
	yaml_parser_delete(&c->parser);
	return ret;
}

/* ---- cross-key rules ---- */

/*
 * kubernetes.leader_election: for a cluster only, and durations in
 * client-go's order (a renewal is tried several times before the lease
 * runs out; the jitter of the retries, up to 1.2 times retry_period, fits
 * in renew_deadline).
 */
static int
check_leader_election(struct ctx *c)
{
	const struct config *g = c->cfg;
	int64_t dur = g->kubernetes.leader_election.lease_duration_ms;
	int64_t renew = g->kubernetes.leader_election.renew_deadline_ms;
	int64_t retry = g->kubernetes.leader_election.retry_period_ms;
	char a[32], b[32];

	if (g->kubernetes.leader_election.enabled &&
	    g->kubernetes.mode == KUBE_EMBEDDED) {
		ctx_fail(c, c->lines[S_LE_ENABLED], "'kubernetes.leader_election"
		    ".enabled' is true but 'kubernetes.mode' is embedded: the "
		    "embedded store has one daemon by construction (its state "
		    "directory is locked by the one process that serves it), so "
		    "there is nothing to elect; set kubernetes.mode to "
		    "kubeconfig or in-cluster, or leader_election.enabled to "
		    "false");
		return -1;
	}
	if (dur <= renew) {
		fmt_duration_ms(dur, a, sizeof(a));
		fmt_duration_ms(renew, b, sizeof(b));
		ctx_fail(c, c->lines[S_LE_RENEW] ? c->lines[S_LE_RENEW] :
		    c->lines[S_LE_DURATION], "'kubernetes.leader_election."
		    "lease_duration' (%s) must be longer than 'kubernetes."
		    "leader_election.renew_deadline' (%s): a leader gives up "
		    "before its lease runs out", a, b);
		return -1;
	}
	if (renew * 10 <= retry * 12) {
		fmt_duration_ms(renew, a, sizeof(a));
		fmt_duration_ms(retry, b, sizeof(b));
		ctx_fail(c, c->lines[S_LE_RETRY] ? c->lines[S_LE_RETRY] :
		    c->lines[S_LE_RENEW], "'kubernetes.leader_election."
		    "renew_deadline' (%s) must be longer than 1.2 times "
		    "'kubernetes.leader_election.retry_period' (%s): a renewal "
		    "is tried again within the deadline", a, b);
		return -1;
	}
	return 0;
}

static int
check_rules(struct ctx *c)
{
	const struct config *g = c->cfg;
	const char *missing = NULL;

	if ((g->api.tls_cert == NULL) != (g->api.tls_key == NULL)) {
		if (g->api.tls_cert != NULL)
			ctx_fail(c, c->lines[S_API_CERT], "'api.tls_cert' is "
			    "set but 'api.tls_key' is not");
		else
			ctx_fail(c, c->lines[S_API_KEY], "'api.tls_key' is "
			    "set but 'api.tls_cert' is not");
		return -1;
	}
	if (!is_loopback(g->api.listen)) {
		if (g->api.tls_cert == NULL)
			missing = "api.tls_cert";
		else if (g->api.token == NULL)
			missing = "api.token";
		if (missing != NULL) {
			ctx_fail(c, c->lines[S_API_LISTEN], "'api.listen' is "
			    "not a loopback address but '%s' is not set",
			    missing);
			return -1;
		}
	}
	if ((g->github.app.id == NULL) != (g->github.app.private_key == NULL)) {
		if (g->github.app.id != NULL)
			ctx_fail(c, c->lines[S_APP_ID], "'github.app.id' is "
			    "set but 'github.app.private_key' is not");
		else
			ctx_fail(c, c->lines[S_APP_KEY], "'github.app."
			    "private_key' is set but 'github.app.id' is not");
		return -1;
	}
	if (g->controller.ttl_after_finished_s > 0 &&
	    g->controller.ttl_after_finished_s < 3600) {
		ctx_fail(c, c->lines[S_TASK_TTL], "'controller."
		    "ttl_after_finished' is 0s (keep) or at least 1h: the pull "
		    "request's comment reports the end of a task after it, and "
		    "a task deleted first leaves it at its last phase");
		return -1;
	}
	if (g->controller.ttl_after_finished_s > 0 &&
	    g->controller.ttl_after_finished_s < g->sandbox.audit_window_s) {
		char ttl[32], audit[32];

		fmt_duration(g->controller.ttl_after_finished_s, ttl,
		    sizeof(ttl));
		fmt_duration(g->sandbox.audit_window_s, audit, sizeof(audit));
		ctx_fail(c, c->lines[S_TASK_TTL] != 0 ? c->lines[S_TASK_TTL] :
		    c->lines[S_AUDIT_WINDOW], "'controller.ttl_after_finished' "
		    "(%s) is shorter than 'sandbox.audit_window' (%s): deleting "
		    "a finished task deletes its Sandbox, which the audit "
		    "window keeps", ttl, audit);
		return -1;
	}
	if (check_leader_election(c) < 0)
		return -1;
	if (g->github.enabled && g->github.webhook_secrets.n == 0) {
		ctx_fail(c, c->lines[S_GH_ENABLED], "'github.enabled' is true "
		    "but 'github.webhook_secrets' is empty");
		return -1;
	}
	if (g->gitlab.enabled && g->gitlab.webhook_tokens.n == 0 &&
	    g->gitlab.signing_token == NULL) {
		ctx_fail(c, c->lines[S_GL_ENABLED], "'gitlab.enabled' is true "
		    "but 'gitlab.webhook_tokens' and 'gitlab.signing_token' "
		    "are empty");
		return -1;
	}
	return 0;
}

/* ---- public functions ---- */

/* Fill c with the defaults: embedded mode, no provider enabled. */
void
config_defaults(struct config *c)
{
	memset(c, 0, sizeof(*c));
	c->listen = xstrdup("127.0.0.1:8080");
	c->state_dir = xstrdup("./diverge-state");
	c->api.listen = xstrdup("127.0.0.1:8081");
	c->log.level = LOG_INFO;
	c->log.json = 0;
	c->kubernetes.mode = KUBE_EMBEDDED;
	c->kubernetes.kubeconfig = xstrdup("");
	c->kubernetes.context = xstrdup("");
	c->kubernetes.leader_election.enabled = 0;
	c->kubernetes.leader_election.lease_name = xstrdup("diverged");
	c->kubernetes.leader_election.lease_duration_ms = 15000;
	c->kubernetes.leader_election.renew_deadline_ms = 10000;
	c->kubernetes.leader_election.retry_period_ms = 2000;
	c->namespace = xstrdup("default");
	c->controller.namespace = xstrdup("diverge-system");
	c->controller.workers = 4;
	c->controller.enabled = 1;
	c->meter.public_url = xstrdup("http://127.0.0.1:8080");
	c->github.api_url = xstrdup("https://api.github.com");
	c->gitlab.api_url = xstrdup("https://gitlab.com/api/v4");
	c->defaults.budget_usd_micro = 5 * USD;
	c->defaults.budget_tokens = 1000000;
	c->defaults.max_iterations = 5;
	c->defaults.timeout_seconds = 3600;
	c->sandbox.image = xstrdup("ghcr.io/divergedev/agent-runner:latest");
	c->sandbox.runtime_class = xstrdup("");
	c->sandbox.uid = 64000;
	c->sandbox.workspace_size = xstrdup("5Gi");
	c->sandbox.network_policy = 1;
	c->sandbox.audit_window_s = DAY;
	c->sandbox.warm_pool = 0;
	c->http.max_body_bytes = 5 * MIB;
	c->http.max_connections = 1024;
	c->http.connection_timeout_s = 30;
	c->http.request_timeout_s = 30;
	c->http.threads = 4;
	c->http.max_header_bytes = 32 * KIB;
	c->inbox.capacity = 1000000;
	c->inbox.workers = 2;
	c->inbox.max_attempts = 8;
	c->inbox.retention_s = 7 * DAY;
	c->commands.max_per_comment = 5;
	c->commands.max_bump_usd_micro = 1000 * USD;
	c->commands.max_bump_tokens = 100000000;
	c->shutdown_timeout_s = 30;
}

/* Parse YAML text over the defaults into *out, untouched on error. */
int
config_parse(struct config *out, const char *name, const char *text,
    size_t len, char **cause)
{
	struct config tmp;
	struct ctx c;
	int ret = -1;

	memset(&c, 0, sizeof(c));
	config_defaults(&tmp);
	c.name = name != NULL ? name : "<config>";
	c.text = text != NULL ? text : "";
	c.len = text != NULL ? len : 0;
	c.cfg = &tmp;
	tmp.file = xstrdup(c.name);

	if (c.len > MAX_FILE) {
		ctx_fail(&c, line_at(&c, MAX_FILE), "file larger than 1 MiB");
		goto out;
	}
	if (run_pass(&c, pass_shape) < 0 || run_pass(&c, pass_values) < 0)
		goto out;
	if (check_rules(&c) < 0)
		goto out;
	*out = tmp;
	memset(&tmp, 0, sizeof(tmp));	/* now owned by *out */
	ret = 0;
out:
	if (ret != 0) {
		config_release(&tmp);
		if (c.err == NULL)
			c.err = xasprintf("%s:1: invalid configuration",
			    c.name);
		if (cause != NULL) {
			*cause = c.err;
			c.err = NULL;
		}
	}
	free(c.err);
	return ret;
}

/* Read and parse f, opened from path (closed here); see config_parse. */
static int
load_stream(struct config *out, const char *path, FILE *f, char **cause)
{
	char *data = NULL;
	size_t n;
	int ret = -1;

	/* one byte more than allowed, so that config_parse sees too much */
	data = xmalloc(MAX_FILE + 1);
	n = fread(data, 1, MAX_FILE + 1, f);
	if (ferror(f)) {
		if (cause != NULL)
			*cause = xasprintf("%s: %s", path, strerror(errno));
		goto out;
	}
	ret = config_parse(out, path, data, n, cause);
out:
	fclose(f);
	free(data);
	return ret;
}

/* Read and parse the file at path; see config_parse. */
int
config_load(struct config *out, const char *path, char **cause)
{
	FILE *f = fopen(path, "rb");

	if (f == NULL) {
		if (cause != NULL)
			*cause = xasprintf("%s: %s", path, strerror(errno));
		return -1;
	}
	return load_stream(out, path, f, cause);
}

/*
 * config_load for a SIGHUP: a regular file only, opened without
 * blocking. The start reads a pipe too (--config <(make-config)), but a
 * pipe is read once: opened again it has no writer, or a new one, and
 * the thread that takes signals would wait there, deaf to SIGTERM.
 */
int
config_reload_file(struct config *out, const char *path, char **cause)
{
	struct stat sb;
	FILE *f;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);

	if (fd < 0) {
		*cause = xasprintf("%s: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		*cause = xasprintf("%s: not a regular file (a pipe is read "
		    "once, at the start)", path);
		close(fd);
		return -1;
	}
	if ((f = fdopen(fd, "rb")) == NULL) {
		*cause = xasprintf("%s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	return load_stream(out, path, f, cause);
}

/* Free what l holds; l is then empty. */
void
config_strlist_release(struct config_strlist *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* A deep copy of l into *out. */
void
config_strlist_copy(struct config_strlist *out, const struct config_strlist *l)
{
	size_t i;

	memset(out, 0, sizeof(*out));
	for (i = 0; i < l->n; i++)
		list_add(out, l->v[i]);
}

/* Free everything c owns. */
void
config_release(struct config *c)
{
	size_t i;

	free(c->file);
	free(c->listen);
	free(c->state_dir);
	free(c->api.listen);
	free(c->api.tls_cert);
	free(c->api.tls_key);
	free(c->api.token);
	free(c->kubernetes.kubeconfig);
	free(c->kubernetes.context);
	free(c->kubernetes.leader_election.lease_name);
	free(c->kubernetes.leader_election.namespace);
	free(c->namespace);
	free(c->controller.namespace);
	free(c->meter.public_url);
	free(c->github.api_url);
	config_strlist_release(&c->github.webhook_secrets);
	free(c->github.token);
	free(c->github.app.id);
	free(c->github.app.private_key);
	free(c->github.app.slug);
	free(c->github.ca_file);
	free(c->gitlab.api_url);
	config_strlist_release(&c->gitlab.webhook_tokens);
	free(c->gitlab.signing_token);
	free(c->gitlab.token);
	free(c->gitlab.ca_file);
	for (i = 0; i < c->nrepos; i++) {
		free(c->repos[i].match);
		free(c->repos[i].namespace);
	}
	free(c->repos);
	config_strlist_release(&c->repo_allowlist);
	config_strlist_release(&c->defaults.capabilities);
	free(c->sandbox.image);
	free(c->sandbox.runtime_class);
	free(c->sandbox.workspace_size);
	free(c->preview.url_template);
	for (i = 0; i < c->nsecret_lines; i++)
		free(c->secret_lines[i].key);
	free(c->secret_lines);
	memset(c, 0, sizeof(*c));
}

int
config_key_line(const struct config *c, const char *key)
{
	size_t i;

	for (i = 0; i < c->nsecret_lines; i++)
		if (strcmp(c->secret_lines[i].key, key) == 0)
			return c->secret_lines[i].line;
	return 0;
}

int
config_override(struct config *c, const char *listen, const char *api_listen,
    const char *state_dir, char **cause)
{
	const char *api = c->api.listen;
	int loopback;

	if (listen != NULL && parse_listen(listen, &loopback) < 0) {
		*cause = xasprintf("--listen '%s': expected host:port or "
		    "[v6]:port", listen);
		return -1;
	}
	if (api_listen != NULL) {
		api = strcmp(api_listen, "off") == 0 ? NULL : api_listen;
		if (api != NULL && parse_listen(api, &loopback) < 0) {
			*cause = xasprintf("--api-listen '%s': expected "
			    "host:port, [v6]:port or off", api_listen);
			return -1;
		}
		/* the rule check_rules applies to api.listen in a file */
		if (api != NULL && !loopback && (c->api.tls_cert == NULL ||
		    c->api.token == NULL)) {
			*cause = xasprintf("--api-listen '%s': not a loopback "
			    "address but '%s' is not set", api_listen,
			    c->api.tls_cert == NULL ? "api.tls_cert" :
			    "api.token");
			return -1;
		}
	}
	if (state_dir != NULL && *state_dir == '\0') {
		*cause = xstrdup("--state-dir '': must not be empty");
		return -1;
	}
	if (listen != NULL) {
		free(c->listen);
		c->listen = xstrdup(listen);
	}
	if (api_listen != NULL) {
		free(c->api.listen);
		c->api.listen = api != NULL ? xstrdup(api) : NULL;
	}
	if (state_dir != NULL) {
		free(c->state_dir);
		c->state_dir = xstrdup(state_dir);
	}
	return 0;
}

/* Read a whole secret file, at most MAX_SECRET bytes. */
static int
secret_file(const char *path, char **out, size_t *outlen, char **cause)
{
	char *data = NULL;
	size_t len = 0, got = 0;
	ssize_t n;
	int fd = -1, ret = -1;

	if (*path == '\0') {
		*cause = xstrdup("secret reference 'file:' has no path");
		goto out;
	}
	/*
	 * Non-blocking, and a regular file only: SIGHUP re-reads secrets on
	 * the thread that handles signals, and a FIFO or a device there
	 * would hang it (SIGTERM included).
	 */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		*cause = xasprintf("secret file '%s': %s", path,
		    strerror(errno));
		goto out;
	}
	{
		struct stat sb;

		if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
			*cause = xasprintf("secret file '%s': not a regular "
			    "file", path);
			goto out;
		}
	}
	/*
	 * Room for the limit, a "\r\n" to drop, and one byte to tell that
	 * the file is longer still.
	 */
	data = xmalloc(MAX_SECRET + 3);
	while (len < MAX_SECRET + 3) {
		n = read(fd, data + len, MAX_SECRET + 3 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			*cause = xasprintf("secret file '%s': %s", path,
			    strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	got = len;
	if (len > 0 && data[len - 1] == '\n') {
		len--;
		if (len > 0 && data[len - 1] == '\r')
			len--;
	}
	if (len > MAX_SECRET) {
		*cause = xasprintf("secret file '%s' is larger than 64 KiB",
		    path);
		goto out;
	}
	if (len == 0) {
		*cause = xasprintf("secret file '%s' is empty", path);
		goto out;
	}
	*out = xmalloc(len + 1);
	memcpy(*out, data, len);
	(*out)[len] = '\0';
	*outlen = len;
	ret = 0;
out:
	if (fd >= 0)
		close(fd);
	if (data != NULL) {
		secure_wipe(data, got > len ? got : len);
		free(data);
	}
	return ret;
}

/* Resolve a "file:/path" or "env:NAME" reference into a new buffer. */
int
config_secret_read(const char *ref, char **out, size_t *outlen,
    char **cause)
{
	char *err = NULL, *value = NULL;
	const char *env;
	size_t len = 0;
	int ret = -1;

	if (ref != NULL && strncmp(ref, "file:", 5) == 0) {
		if (secret_file(ref + 5, &value, &len, &err) < 0)
			goto out;
	} else if (ref != NULL && strncmp(ref, "env:", 4) == 0) {
		if (!is_env_name(ref + 4)) {
			err = xstrdup("secret reference 'env:' has no valid "
			    "variable name");
			goto out;
		}
		env = getenv(ref + 4);
		if (env == NULL || *env == '\0') {
			err = xasprintf("environment variable '%s' is %s",
			    ref + 4, env == NULL ? "not set" : "empty");
			goto out;
		}
		len = strlen(env);
		if (len > MAX_SECRET) {
			err = xasprintf("environment variable '%s' is larger "
			    "than 64 KiB", ref + 4);
			goto out;
		}
		value = xstrndup(env, len);
	} else {
		err = xstrdup("secret reference must be file:/path or "
		    "env:NAME");
		goto out;
	}
	/* every secret read, at start or on SIGHUP, is hidden from logs */
	redact_secret_add(value, len);
	*out = value;
	if (outlen != NULL)
		*outlen = len;
	ret = 0;
out:
	if (ret != 0 && cause != NULL)
		*cause = err;
	else
		free(err);
	return ret;
}

/* Parse "1h30m"-style durations (d, h, m, s in that order) or seconds. */
int64_t
config_parse_duration(const char *s)
{
	static const char units[] = "dhms";
	static const int64_t secs[] = { DAY, 3600, 60, 1 };
	const char *u;
	int64_t total = 0, v;
	size_t last = 0;

	if (s == NULL || *s == '\0')
		return -1;
	if (parse_u64(s, &v) == 0)
		return v;
	while (*s != '\0') {
		if (*s < '0' || *s > '9')
			return -1;
		for (v = 0; *s >= '0' && *s <= '9'; s++) {
			if (v > (INT64_MAX - (*s - '0')) / 10)
				return -1;
			v = v * 10 + (*s - '0');
		}
		if (*s == '\0')
			return -1;		/* "1h30": unit missing */
		u = strchr(units, *s);
		if (u == NULL || (size_t)(u - units) < last)
			return -1;		/* unknown or out of order */
		last = (size_t)(u - units) + 1;
		if (v > (INT64_MAX - total) / secs[u - units])
			return -1;
		total += v * secs[u - units];
		s++;
	}
	return total;
}

/* The same with a last "ms" unit ("1s500ms", "250ms"), in milliseconds. */
int64_t
config_parse_duration_ms(const char *s)
{
	static const char *const units[] = { "d", "h", "m", "s", "ms" };
	static const int64_t mult[] = { DAY * 1000, 3600000, 60000, 1000, 1 };
	int64_t total = 0, v;
	size_t i, last = 0, n;

	if (s == NULL || *s == '\0')
		return -1;
	if (parse_u64(s, &v) == 0)
		return v <= INT64_MAX / 1000 ? v * 1000 : -1;
	while (*s != '\0') {
		if (*s < '0' || *s > '9')
			return -1;
		for (v = 0; *s >= '0' && *s <= '9'; s++) {
			if (v > (INT64_MAX - (*s - '0')) / 10)
				return -1;
			v = v * 10 + (*s - '0');
		}
		n = strcspn(s, "0123456789");
		for (i = last; i < ARRAY_SIZE(units); i++)
			if (strlen(units[i]) == n && strncmp(s, units[i], n) == 0)
				break;
		if (n == 0 || i == ARRAY_SIZE(units))
			return -1;		/* missing, unknown, out of order */
		last = i + 1;
		if (v > (INT64_MAX - total) / mult[i])
			return -1;
		total += v * mult[i];
		s += n;
	}
	return total;
}

/* Parse a decimal USD amount into micro-USD. */
int64_t
config_parse_usd(const char *s)
{
	int64_t whole = 0, frac = 0;
	int decimals = 0;

	if (s == NULL || *s < '0' || *s > '9')
		return -1;
	for (; *s >= '0' && *s <= '9'; s++) {
		if (whole > (INT64_MAX / USD) / 10)
			return -1;
		whole = whole * 10 + (*s - '0');
	}
	if (*s == '.') {
		s++;
		if (*s < '0' || *s > '9')
			return -1;
		for (; *s >= '0' && *s <= '9'; s++) {
			if (++decimals > 6)
				return -1;
			frac = frac * 10 + (*s - '0');
		}
	}
	if (*s != '\0')
		return -1;
	for (; decimals < 6; decimals++)
		frac *= 10;
	if (whole > (INT64_MAX - frac) / USD)
		return -1;
	return whole * USD + frac;
}
