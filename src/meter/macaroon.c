/*
 * Macaroon capability tokens: mint, parse (V2 binary and V1 packets),
 * verify with our first-party caveats, show; and the root key. The
 * formats are described in ../shared/reference/macaroons.md (from
 * libmacaroons doc/format.txt and go-macaroon).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meter/meter.h"
#include "util/util.h"

/* The HMAC key of the root-key derivation (libmacaroons' constant). */
#define KEYGEN "macaroons-key-generator"

/* V2 field types. */
#define F_EOS 0
#define F_LOCATION 1
#define F_IDENTIFIER 2
#define F_VID 4
#define F_SIGNATURE 6

/* The caveat keys we know, in the order of DESIGN.md section 7. */
enum ckey {
	K_TASK_ID = 0,
	K_NAMESPACE,
	K_REPO,
	K_BRANCH,
	K_TOOLS,
	K_MODELS,
	K_MAX_COST_USD,
	K_MAX_TOKENS,
	K_EXPIRES,
	K_COUNT
};

static const char *const key_names[K_COUNT] = {
	"task_id", "namespace", "repo", "branch", "tools", "models",
	"max_cost_usd", "max_tokens", "expires",
};

static const char *const not_met[K_COUNT] = {
	"caveat not met: task_id",
	"caveat not met: namespace",
	"caveat not met: repo",
	"caveat not met: branch",
	"caveat not met: tools",
	"caveat not met: models",
	"caveat not met: max_cost_usd",
	"caveat not met: max_tokens",
	"caveat not met: expires",
};

struct caveat {
	char *id;		/* the predicate, NUL-terminated */
	size_t id_len;
	char *vid;		/* NULL for a first-party caveat */
	size_t vid_len;
	char *location;		/* third-party location, "" when none */
	size_t location_len;
	/* a "key = value" caveat of ours: */
	int key;		/* enum ckey, -1 for anything else */
	const char *value;	/* points into id */
	int valid;		/* the value parses */
	int64_t num;		/* max_cost_usd (micro), max_tokens, expires */
	char **list;		/* tools, models: NULL-terminated */
};

/* What the caveats say about one key, all its caveats together. */
struct claim {
	int present;
	int conflict;		/* two different values */
	int valid;		/* every value parses */
	const struct caveat *first;
	int64_t num;		/* the first's; for expires the earliest */
};

struct macaroon {
	int version;
	char *location;
	size_t location_len;
	char *identifier;
	size_t identifier_len;
	struct caveat *caveats;
	size_t ncaveats;
	size_t cap;		/* of caveats (parsed tokens) */
	unsigned char sig[MACAROON_SIG_LEN];
	int unknown;		/* some caveat is not one of ours */
	struct claim claims[K_COUNT];
};

/* ---- small helpers ---- */

/*
 * The slot for caveat m->ncaveats of a token being parsed (zeroed), the
 * array grown by doubling: a token has a handful of caveats, and zeroing
 * room for MACAROON_MAX_CAVEATS on every meter call cost 4 KiB of memset.
 */
static struct caveat *
caveat_slot(struct macaroon *m)
{
	if (m->ncaveats == m->cap) {
		size_t cap = m->cap ? m->cap * 2 : 8;

		if (cap > MACAROON_MAX_CAVEATS)
			cap = MACAROON_MAX_CAVEATS;
		m->caveats = xrealloc(m->caveats, cap * sizeof(*m->caveats));
		memset(m->caveats + m->cap, 0, (cap - m->cap) *
		    sizeof(*m->caveats));
		m->cap = cap;
	}
	return &m->caveats[m->ncaveats];
}

static void
set_cause(char **cause, int code, const char *detail)
{
	if (cause == NULL)
		return;
	if (detail != NULL)
		*cause = xasprintf("%s: %s", macaroon_strerror(code), detail);
	else
		*cause = xstrdup(macaroon_strerror(code));
}

static char *
dup_bytes(const void *p, size_t n)
{
	char *s = xmalloc(n + 1);

	if (n > 0)
		memcpy(s, p, n);
	s[n] = '\0';
	return s;
}

static void
free_list(char **list)
{
	size_t i;

	if (list == NULL)
		return;
	for (i = 0; list[i] != NULL; i++)
		free(list[i]);
	free(list);
}

/* Text of a result code. */
const char *
macaroon_strerror(int result)
{
	switch (result) {
	case MACAROON_OK:
		return "ok";
	case MACAROON_EMALFORMED:
		return "malformed token";
	case MACAROON_ETOOLARGE:
		return "token too large";
	case MACAROON_ETOOMANY:
		return "too many caveats";
	case MACAROON_EBADSIG:
		return "bad signature";
	case MACAROON_EEXPIRED:
		return "expired";
	case MACAROON_EUNKNOWN:
		return "unknown caveat";
	case MACAROON_ENOTMET:
		return "caveat not met";
	case MACAROON_EMODEL:
		return not_met[K_MODELS];
	case MACAROON_EINVAL:
		return "invalid argument";
	default:
		return "unknown error";
	}
}

/* Free a macaroon. */
void
macaroon_free(struct macaroon *m)
{
	size_t i;

	if (m == NULL)
		return;
	for (i = 0; i < m->ncaveats; i++) {
		free(m->caveats[i].id);
		free(m->caveats[i].vid);
		free(m->caveats[i].location);
		free_list(m->caveats[i].list);
	}
	free(m->caveats);
	free(m->location);
	free(m->identifier);
	secure_wipe(m->sig, sizeof(m->sig));
	free(m);
}

/* ---- caveat syntax and values ---- */

static int
is_digit(int c)
{
	return c >= '0' && c <= '9';
}

/*
 * Split "key = value": key [a-z][a-z0-9_]*, value non-empty, neither end
 * a space, no control character. Returns the key index, or -1.
 */
static int
split_caveat(const char *id, size_t len, const char **value)
{
	const char *eq;
	size_t klen, i;
	int k;

	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char)id[i];

		if (c < 0x20 || c == 0x7f)
			return -1;
	}
	for (eq = NULL, i = 0; eq == NULL && i + 3 <= len; i++)
		if (memcmp(id + i, " = ", 3) == 0)
			eq = id + i;
	if (eq == NULL)
		return -1;
	klen = (size_t)(eq - id);
	if (klen == 0 || id[0] < 'a' || id[0] > 'z')
		return -1;
	for (i = 1; i < klen; i++)
		if (!((id[i] >= 'a' && id[i] <= 'z') || is_digit(id[i]) ||
		    id[i] == '_'))
			return -1;
	if (klen + 3 == len || id[klen + 3] == ' ' || id[len - 1] == ' ')
		return -1;
	for (k = 0; k < K_COUNT; k++) {
		if (strlen(key_names[k]) == klen &&
		    memcmp(key_names[k], id, klen) == 0) {
			*value = id + klen + 3;
			return k;
		}
	}
	return -1;
}

/* Decimal USD with up to 6 decimals into micro-USD. */
static int
parse_usd(const char *s, int64_t *out)
{
	int64_t whole = 0, frac = 0;
	int n = 0;

	if (!is_digit(*s))
		return -1;
	for (; is_digit(*s); s++) {
		if (whole > (INT64_MAX / 1000000 - (*s - '0')) / 10)
			return -1;
		whole = whole * 10 + (*s - '0');
	}
	if (*s == '.') {
		for (s++; is_digit(*s) && n < 6; s++, n++)
			frac = frac * 10 + (*s - '0');
		if (n == 0)
			return -1;
	}
	if (*s != '\0')
		return -1;
	for (; n < 6; n++)
		frac *= 10;
	if (whole > (INT64_MAX - frac) / 1000000)
		return -1;
	*out = whole * 1000000 + frac;
	return 0;
}

/* A non-negative decimal integer. */
static int
parse_count(const char *s, int64_t *out)
{
	int64_t v = 0;

	if (!is_digit(*s))
		return -1;
	for (; is_digit(*s); s++) {
		if (v > (INT64_MAX - (*s - '0')) / 10)
			return -1;
		v = v * 10 + (*s - '0');
	}
	if (*s != '\0')
		return -1;
	*out = v;
	return 0;
}

/* RFC 3339 in UTC only ("...Z"): caveats carry no offsets. */
static int
parse_rfc3339(const char *s, int64_t *out)
{
	size_t n = strlen(s);

	if (n < 20 || (s[n - 1] != 'Z' && s[n - 1] != 'z'))
		return -1;
	return time_parse_rfc3339(s, out);
}

/*
 * A comma list: entries trimmed of spaces, empty ones dropped. For models
 * a '*' is only allowed as the last character of an entry.
 */
static int
parse_list(const char *s, int models, char ***out)
{
	char **list = xcalloc(1, sizeof(*list));
	size_t n = 0;
	const char *p = s, *end, *a, *b;

	for (;;) {
		end = strchr(p, ',');
		if (end == NULL)
			end = p + strlen(p);
		for (a = p; a < end && *a == ' '; a++)
			;
		for (b = end; b > a && b[-1] == ' '; b--)
			;
		if (b > a) {
			if (models) {
				const char *star = memchr(a, '*',
				    (size_t)(b - a));

				if (star != NULL && star != b - 1) {
					free_list(list);
					return -1;
				}
			}
			list = xrealloc(list, (n + 2) * sizeof(*list));
			list[n++] = dup_bytes(a, (size_t)(b - a));
			list[n] = NULL;
		}
		if (*end == '\0')
			break;
		p = end + 1;
	}
	*out = list;
	return 0;
}

static int
parse_value(struct caveat *c)
{
	switch (c->key) {
	case K_TOOLS:
		return parse_list(c->value, 0, &c->list);
	case K_MODELS:
		return parse_list(c->value, 1, &c->list);
	case K_MAX_COST_USD:
		return parse_usd(c->value, &c->num);
	case K_MAX_TOKENS:
		return parse_count(c->value, &c->num);
	case K_EXPIRES:
		return parse_rfc3339(c->value, &c->num);
	default:
		return 0;
	}
}

/*
 * Read what the caveats say (after parsing, before any verification).
 * Several caveats with one key all hold (AND): several expires mean the
 * earliest, several models caveats must each allow the model. For the
 * keys whose value is extracted, conflicting values are flagged.
 */
static void
analyze_caveats(struct macaroon *m)
{
	size_t i;

	for (i = 0; i < m->ncaveats; i++) {
		struct caveat *c = &m->caveats[i];
		struct claim *cl;

		c->key = -1;
		if (c->vid != NULL) {
			m->unknown = 1;
			continue;
		}
		c->key = split_caveat(c->id, c->id_len, &c->value);
		if (c->key < 0) {
			m->unknown = 1;
			continue;
		}
		c->valid = parse_value(c) == 0;
		cl = &m->claims[c->key];
		if (!cl->present) {
			cl->present = 1;
			cl->valid = c->valid;
			cl->first = c;
			cl->num = c->num;
			continue;
		}
		if (strcmp(cl->first->value, c->value) != 0)
			cl->conflict = 1;
		if (!c->valid)
			cl->valid = 0;
		if (c->key == K_EXPIRES && c->num < cl->num)
			cl->num = c->num;
	}
}

/* ---- V2 binary ---- */

struct reader {
	const unsigned char *p;
	size_t len;
	size_t off;
};

/* A parse failure: the result code and a static detail. */
struct perr {
	int code;
	const char *detail;
};

static int
fail(struct perr *e, int code, const char *detail)
{
	e->code = code;
	e->detail = detail;
	return -1;
}

static int
read_varint(struct reader *r, uint64_t *out)
{
	uint64_t v = 0;
	int shift;

	for (shift = 0; shift < 64; shift += 7) {
		unsigned char b;

		if (r->off >= r->len)
			return -1;
		b = r->p[r->off++];
		v |= (uint64_t)(b & 0x7f) << shift;
		if ((b & 0x80) == 0) {
			*out = v;
			return 0;
		}
	}
	return -1;
}

struct field {
	uint64_t type;
	const unsigned char *data;
	size_t len;
};

/*
 * One section: up to max fields of strictly ascending types, then EOS.
 * Field lengths are checked against the remaining input before use.
 */
static int
read_section(struct reader *r, struct field *f, size_t max, size_t *n,
    struct perr *e)
{
	size_t count = 0;
	uint64_t type, len;

	for (;;) {
		if (read_varint(r, &type) < 0)
			return fail(e, MACAROON_EMALFORMED, "truncated");
		if (type == F_EOS)
			break;
		if (count == max)
			return fail(e, MACAROON_EMALFORMED,
			    "too many fields in a section");
		if (count > 0 && type <= f[count - 1].type)
			return fail(e, MACAROON_EMALFORMED,
			    "fields out of order");
		if (read_varint(r, &len) < 0 || len > r->len - r->off)
			return fail(e, MACAROON_EMALFORMED, "truncated");
		f[count].type = type;
		f[count].data = r->p + r->off;
		f[count].len = (size_t)len;
		r->off += (size_t)len;
		count++;
	}
	*n = count;
	return 0;
}

static int
parse_v2(const unsigned char *p, size_t len, struct macaroon *m,
    struct perr *e)
{
	struct reader r = { p, len, 1 };
	struct field f[3];
	size_t n, i;
	uint64_t type, slen;

	/* header: [location] identifier EOS */
	if (read_section(&r, f, 2, &n, e) < 0)
		return -1;
	i = 0;
	if (i < n && f[i].type == F_LOCATION) {
		if (f[i].len > MACAROON_MAX_LOCATION)
			return fail(e, MACAROON_ETOOLARGE,
			    "location is too long");
		m->location = dup_bytes(f[i].data, f[i].len);
		m->location_len = f[i].len;
		i++;
	}
	if (i >= n || f[i].type != F_IDENTIFIER)
		return fail(e, MACAROON_EMALFORMED, "no identifier");
	if (f[i].len > MACAROON_MAX_IDENTIFIER)
		return fail(e, MACAROON_ETOOLARGE, "identifier is too long");
	m->identifier = dup_bytes(f[i].data, f[i].len);
	m->identifier_len = f[i].len;
	if (++i != n)
		return fail(e, MACAROON_EMALFORMED,
		    "unexpected field in the header");

	/* caveats: [location] identifier [vid] EOS, until an empty section */
	for (;;) {
		struct caveat *c;

		if (r.off < r.len && r.p[r.off] == F_EOS) {
			r.off++;
			break;
		}
		if (m->ncaveats == MACAROON_MAX_CAVEATS)
			return fail(e, MACAROON_ETOOMANY, NULL);
		if (read_section(&r, f, 3, &n, e) < 0)
			return -1;
		i = 0;
		c = caveat_slot(m);
		if (i < n && f[i].type == F_LOCATION) {
			if (f[i].len > MACAROON_MAX_LOCATION)
				return fail(e, MACAROON_ETOOLARGE,
				    "caveat location is too long");
			c->location = dup_bytes(f[i].data, f[i].len);
			c->location_len = f[i].len;
			i++;
		}
		if (i >= n || f[i].type != F_IDENTIFIER) {
			free(c->location);
			c->location = NULL;
			return fail(e, MACAROON_EMALFORMED,
			    "caveat without identifier");
		}
		m->ncaveats++;
		if (c->location == NULL)
			c->location = dup_bytes("", 0);
		if (f[i].len > MACAROON_MAX_CAVEAT)
			return fail(e, MACAROON_ETOOLARGE,
			    "caveat is too long");
		c->id = dup_bytes(f[i].data, f[i].len);
		c->id_len = f[i].len;
		i++;
		if (i < n && f[i].type == F_VID) {
			if (f[i].len > MACAROON_MAX_CAVEAT)
				return fail(e, MACAROON_ETOOLARGE,
				    "caveat vid is too long");
			c->vid = dup_bytes(f[i].data, f[i].len);
			c->vid_len = f[i].len;
			i++;
		}
		if (i != n)
			return fail(e, MACAROON_EMALFORMED,
			    "unexpected field in a caveat");
		if (c->vid == NULL && c->location_len > 0)
			return fail(e, MACAROON_EMALFORMED,
			    "location in a first-party caveat");
	}

	/* signature */
	if (read_varint(&r, &type) < 0 || type != F_SIGNATURE)
		return fail(e, MACAROON_EMALFORMED, "no signature");
	if (read_varint(&r, &slen) < 0 || slen > r.len - r.off)
		return fail(e, MACAROON_EMALFORMED, "truncated");
	if (slen != MACAROON_SIG_LEN)
		return fail(e, MACAROON_EMALFORMED,
		    "signature is not 32 bytes");
	memcpy(m->sig, r.p + r.off, MACAROON_SIG_LEN);
	r.off += MACAROON_SIG_LEN;
	if (r.off != r.len)
		return fail(e, MACAROON_EMALFORMED,
		    "trailing data after the signature");
	m->version = 2;
	return 0;
}

/* ---- V1 packets: "HHHH<key> <value>\n", HHHH the whole length ---- */

static int
read_packet(struct reader *r, const char **key, size_t *klen,
    const unsigned char **val, size_t *vlen, struct perr *e)
{
	const unsigned char *p, *sp;
	size_t n = 0, i;

	if (r->len - r->off < 4)
		return fail(e, MACAROON_EMALFORMED, "truncated packet");
	p = r->p + r->off;
	for (i = 0; i < 4; i++) {
		int d = hex_digit(p[i]);

		if (d < 0)
			return fail(e, MACAROON_EMALFORMED,
			    "bad packet header");
		n = n << 4 | (size_t)d;
	}
	if (n < 7 || n > r->len - r->off)
		return fail(e, MACAROON_EMALFORMED, "bad packet length");
	if (p[n - 1] != '\n')
		return fail(e, MACAROON_EMALFORMED, "packet without newline");
	sp = memchr(p + 4, ' ', n - 5);
	if (sp == NULL)
		return fail(e, MACAROON_EMALFORMED, "packet without key");
	*key = (const char *)p + 4;
	*klen = (size_t)(sp - (p + 4));
	*val = sp + 1;
	*vlen = (size_t)(p + n - 1 - (sp + 1));
	r->off += n;
	return 0;
}

static int
key_is(const char *key, size_t klen, const char *want)
{
	return strlen(want) == klen && memcmp(key, want, klen) == 0;
}

static int
parse_v1(const unsigned char *p, size_t len, struct macaroon *m,
    struct perr *e)
{
	struct reader r = { p, len, 0 };
	const char *key;
	const unsigned char *val;
	size_t klen, vlen;
	struct caveat *c = NULL;
	int state = 0;	/* in the last caveat: 0 cid, 1 vid, 2 cl */

	if (read_packet(&r, &key, &klen, &val, &vlen, e) < 0)
		return -1;
	if (!key_is(key, klen, "location"))
		return fail(e, MACAROON_EMALFORMED, "no location packet");
	if (vlen > MACAROON_MAX_LOCATION)
		return fail(e, MACAROON_ETOOLARGE, "location is too long");
	m->location = dup_bytes(val, vlen);
	m->location_len = vlen;
	if (read_packet(&r, &key, &klen, &val, &vlen, e) < 0)
		return -1;
	if (!key_is(key, klen, "identifier"))
		return fail(e, MACAROON_EMALFORMED, "no identifier packet");
	if (vlen > MACAROON_MAX_IDENTIFIER)
		return fail(e, MACAROON_ETOOLARGE, "identifier is too long");
	m->identifier = dup_bytes(val, vlen);
	m->identifier_len = vlen;
	for (;;) {
		if (read_packet(&r, &key, &klen, &val, &vlen, e) < 0)
			return -1;
		if (key_is(key, klen, "signature"))
			break;
		if (key_is(key, klen, "cid")) {
			if (m->ncaveats == MACAROON_MAX_CAVEATS)
				return fail(e, MACAROON_ETOOMANY, NULL);
			if (vlen > MACAROON_MAX_CAVEAT)
				return fail(e, MACAROON_ETOOLARGE,
				    "caveat is too long");
			c = caveat_slot(m);
			m->ncaveats++;
			c->id = dup_bytes(val, vlen);
			c->id_len = vlen;
			c->location = dup_bytes("", 0);
			state = 0;
		} else if (key_is(key, klen, "vid")) {
			if (c == NULL || state != 0)
				return fail(e, MACAROON_EMALFORMED,
				    "misplaced vid packet");
			if (vlen > MACAROON_MAX_CAVEAT)
				return fail(e, MACAROON_ETOOLARGE,
				    "caveat vid is too long");
			c->vid = dup_bytes(val, vlen);
			c->vid_len = vlen;
			state = 1;
		} else if (key_is(key, klen, "cl")) {
			if (c == NULL || state != 1)
				return fail(e, MACAROON_EMALFORMED,
				    "misplaced cl packet");
			if (vlen > MACAROON_MAX_LOCATION)
				return fail(e, MACAROON_ETOOLARGE,
				    "caveat location is too long");
			free(c->location);
			c->location = dup_bytes(val, vlen);
			c->location_len = vlen;
			state = 2;
		} else {
			return fail(e, MACAROON_EMALFORMED,
			    "unknown packet");
		}
	}
	if (vlen != MACAROON_SIG_LEN)
		return fail(e, MACAROON_EMALFORMED,
		    "signature is not 32 bytes");
	memcpy(m->sig, val, MACAROON_SIG_LEN);
	if (r.off != r.len)
		return fail(e, MACAROON_EMALFORMED,
		    "trailing data after the signature");
	m->version = 1;
	return 0;
}

static int
is_space(int c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Parse a token (any base64 of V2 binary or V1 packets). */
int
macaroon_deserialize(const char *token, size_t len, struct macaroon **out,
    char **cause)
{
	struct macaroon *m = NULL;
	unsigned char *raw = NULL;
	size_t rawlen = 0;
	struct perr e = { MACAROON_EMALFORMED, NULL };
	int ret = MACAROON_EMALFORMED;

	if (token == NULL) {
		e.detail = "no token";
		goto out;
	}
	/* the size limit comes first: nothing below runs on a huge input */
	if (len > MACAROON_MAX_TOKEN) {
		e.code = MACAROON_ETOOLARGE;
		goto out;
	}
	while (len > 0 && is_space(token[0])) {
		token++;
		len--;
	}
	while (len > 0 && is_space(token[len - 1]))
		len--;
	if (len == 0) {
		e.detail = "empty";
		goto out;
	}
	if (token[0] == '{') {
		e.detail = "the JSON format is not supported";
		goto out;
	}
	if (base64_decode(token, len, &raw, &rawlen) < 0) {
		e.detail = "not base64";
		goto out;
	}
	m = xcalloc(1, sizeof(*m));
	if (rawlen > 0 && raw[0] == 2) {
		if (parse_v2(raw, rawlen, m, &e) < 0)
			goto out;
	} else if (rawlen > 0 && hex_digit(raw[0]) >= 0) {
		if (parse_v1(raw, rawlen, m, &e) < 0)
			goto out;
	} else {
		e.detail = "unknown format";
		goto out;
	}
	if (m->location == NULL) {
		m->location = dup_bytes("", 0);
		m->location_len = 0;
	}
	analyze_caveats(m);
	*out = m;
	m = NULL;	/* now the caller's */
	ret = 0;
out:
	if (ret != 0) {
		ret = e.code;
		set_cause(cause, ret, e.detail);
	}
	macaroon_free(m);
	if (raw != NULL) {
		secure_wipe(raw, rawlen);
		free(raw);
	}
	return ret;
}

/* Parse a token to show it (never verifies). */
int
macaroon_inspect(const char *token, size_t len, struct macaroon **out,
    char **cause)
{
	return macaroon_deserialize(token, len, out, cause);
}

/* ---- serialization ---- */

static int
put_varint(struct buf *b, uint64_t v)
{
	unsigned char tmp[10];
	size_t n = 0;

	while (v >= 0x80) {
		tmp[n++] = (unsigned char)(v & 0x7f) | 0x80;
		v >>= 7;
	}
	tmp[n++] = (unsigned char)v;
	return buf_add(b, tmp, n);
}

static int
put_field(struct buf *b, int type, const void *data, size_t len)
{
	unsigned char t = (unsigned char)type;

	if (buf_add(b, &t, 1) < 0 || put_varint(b, len) < 0 ||
	    buf_add(b, data, len) < 0)
		return -1;
	return 0;
}

/* Serialize as V2 binary, base64url without padding. */
int
macaroon_serialize_v2(const struct macaroon *m, char **token_out)
{
	static const unsigned char eos = F_EOS, version = 2;
	struct buf b;
	char *token = NULL;
	size_t i;
	int ret = MACAROON_ETOOLARGE;

	/* the binary is 3/4 of its base64 */
	buf_init(&b, MACAROON_MAX_TOKEN / 4 * 3);
	if (buf_add(&b, &version, 1) < 0)
		goto out;
	if (m->location_len > 0 && put_field(&b, F_LOCATION, m->location,
	    m->location_len) < 0)
		goto out;
	if (put_field(&b, F_IDENTIFIER, m->identifier,
	    m->identifier_len) < 0 || buf_add(&b, &eos, 1) < 0)
		goto out;
	for (i = 0; i < m->ncaveats; i++) {
		const struct caveat *c = &m->caveats[i];

		if (c->vid != NULL && c->location_len > 0 &&
		    put_field(&b, F_LOCATION, c->location,
		    c->location_len) < 0)
			goto out;
		if (put_field(&b, F_IDENTIFIER, c->id, c->id_len) < 0)
			goto out;
		if (c->vid != NULL && put_field(&b, F_VID, c->vid,
		    c->vid_len) < 0)
			goto out;
		if (buf_add(&b, &eos, 1) < 0)
			goto out;
	}
	if (buf_add(&b, &eos, 1) < 0 ||
	    put_field(&b, F_SIGNATURE, m->sig, MACAROON_SIG_LEN) < 0)
		goto out;
	token = base64_encode((const unsigned char *)b.data, b.len, 1, 0);
	if (strlen(token) > MACAROON_MAX_TOKEN)
		goto out;
	*token_out = token;
	token = NULL;
	ret = 0;
out:
	free(token);
	if (b.data != NULL)
		secure_wipe(b.data, b.len);
	buf_release(&b);
	return ret;
}

/* ---- signatures ---- */

/*
 * The signature chain of m under the root key: derivation, identifier,
 * then each caveat (third-party ones as libmacaroons' hash2).
 */
static void
compute_signature(const unsigned char *key, size_t keylen,
    const struct macaroon *m, unsigned char out[MACAROON_SIG_LEN])
{
	unsigned char derived[32], sig[32], next[32], pair[64];
	size_t i;

	hmac_sha256(KEYGEN, strlen(KEYGEN), key, keylen, derived);
	hmac_sha256(derived, sizeof(derived), m->identifier,
	    m->identifier_len, sig);
	for (i = 0; i < m->ncaveats; i++) {
		const struct caveat *c = &m->caveats[i];

		if (c->vid == NULL) {
			hmac_sha256(sig, sizeof(sig), c->id, c->id_len,
			    next);
		} else {
			hmac_sha256(sig, sizeof(sig), c->vid, c->vid_len,
			    pair);
			hmac_sha256(sig, sizeof(sig), c->id, c->id_len,
			    pair + 32);
			hmac_sha256(sig, sizeof(sig), pair, sizeof(pair),
			    next);
		}
		memcpy(sig, next, sizeof(sig));
	}
	memcpy(out, sig, MACAROON_SIG_LEN);
	secure_wipe(derived, sizeof(derived));
	secure_wipe(sig, sizeof(sig));
	secure_wipe(next, sizeof(next));
	secure_wipe(pair, sizeof(pair));
}

/* Mint a token with first-party caveats. */
int
macaroon_mint(const unsigned char *key, size_t keylen,
    const char *identifier, const char *location,
    const char *const *caveats, size_t ncaveats, char **token_out,
    char **cause)
{
	struct macaroon *m = NULL;
	const char *detail = NULL;
	size_t i;
	int ret = MACAROON_EINVAL;

	if (key == NULL || keylen < MACAROON_MIN_KEY_LEN) {
		detail = "root key is too short";
		goto out;
	}
	if (identifier == NULL || (ncaveats > 0 && caveats == NULL) ||
	    token_out == NULL) {
		detail = "missing argument";
		goto out;
	}
	if (location == NULL)
		location = "";
	ret = MACAROON_ETOOLARGE;
	if (strlen(identifier) > MACAROON_MAX_IDENTIFIER) {
		detail = "identifier is too long";
		goto out;
	}
	if (strlen(location) > MACAROON_MAX_LOCATION) {
		detail = "location is too long";
		goto out;
	}
	if (ncaveats > MACAROON_MAX_CAVEATS) {
		ret = MACAROON_ETOOMANY;
		goto out;
	}
	m = xcalloc(1, sizeof(*m));
	m->version = 2;
	m->identifier = xstrdup(identifier);
	m->identifier_len = strlen(identifier);
	m->location = xstrdup(location);
	m->location_len = strlen(location);
	m->caveats = xcalloc(ncaveats + 1, sizeof(*m->caveats));
	for (i = 0; i < ncaveats; i++) {
		struct caveat *c = &m->caveats[i];

		if (caveats[i] == NULL || caveats[i][0] == '\0') {
			ret = MACAROON_EINVAL;
			detail = "empty caveat";
			goto out;
		}
		if (strlen(caveats[i]) > MACAROON_MAX_CAVEAT) {
			detail = "caveat is too long";
			goto out;
		}
		c->id = xstrdup(caveats[i]);
		c->id_len = strlen(caveats[i]);
		c->location = xstrdup("");
		m->ncaveats++;
	}
	compute_signature(key, keylen, m, m->sig);
	ret = macaroon_serialize_v2(m, token_out);
out:
	if (ret != 0)
		set_cause(cause, ret, detail);
	macaroon_free(m);
	return ret;
}

/* ---- verification ---- */

/* One model against one pattern (exact or prefix wildcard). */
int
macaroon_model_match(const char *pattern, const char *model)
{
	size_t plen;

	if (pattern == NULL || model == NULL || *model == '\0' ||
	    *pattern == '\0')
		return 0;
	plen = strlen(pattern);
	if (pattern[plen - 1] == '*')
		return strncmp(pattern, model, plen - 1) == 0;
	return strcmp(pattern, model) == 0;
}

static int
list_allows(char *const *list, const char *model)
{
	size_t i;

	for (i = 0; list[i] != NULL; i++)
		if (macaroon_model_match(list[i], model))
			return 1;
	return 0;
}

/* Whether every models caveat of m allows model. */
int
macaroon_allows_model(const struct macaroon *m, const char *model)
{
	size_t i;

	if (model == NULL || *model == '\0')
		return 0;
	if (m->claims[K_MODELS].present && !m->claims[K_MODELS].valid)
		return 0;
	for (i = 0; i < m->ncaveats; i++)
		if (m->caveats[i].key == K_MODELS &&
		    !list_allows(m->caveats[i].list, model))
			return 0;
	return 1;
}

/* Every caveat for k (there is at least one) says exactly want. */
static int
claim_equals(const struct claim *c, const char *want)
{
	return c->present && !c->conflict && want != NULL &&
	    *want != '\0' && strcmp(c->first->value, want) == 0;
}

/* Verify a macaroon against the root key and the request context. */
int
macaroon_verify(const unsigned char *key, size_t keylen,
    const struct macaroon *m, const struct macaroon_context *ctx,
    const char **reason)
{
	/* the keys whose value the caller extracts: one value only */
	static const int extracted[] = { K_REPO, K_BRANCH, K_TOOLS,
	    K_MAX_COST_USD, K_MAX_TOKENS };
	unsigned char computed[MACAROON_SIG_LEN];
	const char *why = NULL;
	int ret = MACAROON_EBADSIG, k, good;
	size_t i;

	memset(computed, 0, sizeof(computed));
	if (m == NULL) {
		ret = MACAROON_EMALFORMED;
		goto out;
	}
	if (key == NULL || keylen < MACAROON_MIN_KEY_LEN)
		goto out;
	compute_signature(key, keylen, m, computed);
	good = ct_equal(computed, m->sig, MACAROON_SIG_LEN);
	if (!good)
		goto out;
	ret = MACAROON_EUNKNOWN;
	if (m->unknown)
		goto out;
	ret = MACAROON_ENOTMET;
	for (k = 0; k < K_COUNT; k++) {
		if (m->claims[k].present && !m->claims[k].valid) {
			why = not_met[k];
			goto out;
		}
	}
	for (i = 0; i < ARRAY_SIZE(extracted); i++) {
		if (m->claims[extracted[i]].conflict) {
			why = not_met[extracted[i]];
			goto out;
		}
	}
	if (ctx == NULL) {
		why = not_met[K_TASK_ID];
		goto out;
	}
	if (m->claims[K_EXPIRES].present &&
	    ctx->now >= m->claims[K_EXPIRES].num + MACAROON_EXPIRES_LEEWAY) {
		ret = MACAROON_EEXPIRED;
		goto out;
	}
	if (!claim_equals(&m->claims[K_TASK_ID], ctx->task_id)) {
		why = not_met[K_TASK_ID];
		goto out;
	}
	if (!claim_equals(&m->claims[K_NAMESPACE], ctx->namespace)) {
		why = not_met[K_NAMESPACE];
		goto out;
	}
	if (ctx->model != NULL && !macaroon_allows_model(m, ctx->model)) {
		ret = MACAROON_EMODEL;
		goto out;
	}
	ret = 0;
out:
	secure_wipe(computed, sizeof(computed));
	if (reason != NULL)
		*reason = why != NULL ? why : macaroon_strerror(ret);
	return ret;
}

/* ---- accessors ---- */

/* The serialization version m was read from. */
int
macaroon_version(const struct macaroon *m)
{
	return m->version;
}

/* The identifier. */
const char *
macaroon_identifier(const struct macaroon *m, size_t *len)
{
	if (len != NULL)
		*len = m->identifier_len;
	return m->identifier;
}

/* The location, "" when none. */
const char *
macaroon_location(const struct macaroon *m, size_t *len)
{
	if (len != NULL)
		*len = m->location_len;
	return m->location;
}

/* The 32 raw signature bytes. */
const unsigned char *
macaroon_signature(const struct macaroon *m)
{
	return m->sig;
}

/* Number of caveats. */
size_t
macaroon_caveat_count(const struct macaroon *m)
{
	return m->ncaveats;
}

/* Caveat i's identifier. */
const char *
macaroon_caveat(const struct macaroon *m, size_t i, size_t *len)
{
	if (i >= m->ncaveats)
		return NULL;
	if (len != NULL)
		*len = m->caveats[i].id_len;
	return m->caveats[i].id;
}

/* Whether caveat i is third-party. */
int
macaroon_caveat_third_party(const struct macaroon *m, size_t i)
{
	return i < m->ncaveats && m->caveats[i].vid != NULL;
}

/* The claim for k when its caveats agree on one valid value. */
static const struct claim *
good_claim(const struct macaroon *m, int k)
{
	const struct claim *c = &m->claims[k];

	return c->present && !c->conflict && c->valid ? c : NULL;
}

/* The value of a known caveat key. */
const char *
macaroon_value(const struct macaroon *m, const char *key)
{
	int k;

	if (key == NULL)
		return NULL;
	for (k = 0; k < K_COUNT; k++) {
		if (strcmp(key, key_names[k]) == 0) {
			const struct claim *c = good_claim(m, k);

			return c != NULL ? c->first->value : NULL;
		}
	}
	return NULL;
}

static int
claim_num(const struct macaroon *m, int k, int64_t *out)
{
	const struct claim *c = good_claim(m, k);

	if (c == NULL)
		return -1;
	*out = c->num;
	return 0;
}

/* max_cost_usd in micro-USD. */
int
macaroon_max_cost_usd(const struct macaroon *m, int64_t *out)
{
	return claim_num(m, K_MAX_COST_USD, out);
}

/* max_tokens. */
int
macaroon_max_tokens(const struct macaroon *m, int64_t *out)
{
	return claim_num(m, K_MAX_TOKENS, out);
}

/* expires in unix seconds: the earliest of them. */
int
macaroon_expires(const struct macaroon *m, int64_t *out)
{
	const struct claim *c = &m->claims[K_EXPIRES];

	if (!c->present || !c->valid)
		return -1;
	*out = c->num;
	return 0;
}

/* The models list. */
const char *const *
macaroon_models(const struct macaroon *m)
{
	const struct claim *c = good_claim(m, K_MODELS);

	return c != NULL ? (const char *const *)c->first->list : NULL;
}

/* The tools list. */
const char *const *
macaroon_tools(const struct macaroon *m)
{
	const struct claim *c = good_claim(m, K_TOOLS);

	return c != NULL ? (const char *const *)c->first->list : NULL;
}

/* ---- human-readable form ---- */

/* Length of a valid UTF-8 sequence at p (at most n bytes), else 0. */
static size_t
utf8_len(const unsigned char *p, size_t n)
{
	size_t len, i;
	uint32_t cp;

	if (p[0] < 0xc2 || p[0] > 0xf4)
		return 0;
	len = p[0] < 0xe0 ? 2 : p[0] < 0xf0 ? 3 : 4;
	if (len > n)
		return 0;
	cp = p[0] & (0x7f >> len);
	for (i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
	    (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
		return 0;
	return len;
}

static int
add_escaped(struct buf *b, const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, u;

	while (i < n) {
		if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\') {
			if (buf_add(b, p + i, 1) < 0)
				return -1;
			i++;
		} else if (p[i] >= 0x80 && (u = utf8_len(p + i, n - i)) > 0 &&
		    !(p[i] == 0xc2 && p[i + 1] <= 0x9f)) {
			/* (U+0080..U+009F, the C1 controls, are escaped) */
			if (buf_add(b, p + i, u) < 0)
				return -1;
			i += u;
		} else {
			if (buf_printf(b, "\\x%02x", p[i]) < 0)
				return -1;
			i++;
		}
	}
	return 0;
}

/* Write m for humans. */
int
macaroon_format(const struct macaroon *m, struct buf *b)
{
	size_t i;

	if (buf_printf(b, "version: %d\nidentifier: ", m->version) < 0 ||
	    add_escaped(b, m->identifier, m->identifier_len) < 0 ||
	    buf_addstr(b, "\nlocation: ") < 0)
		return -1;
	if (m->location_len == 0) {
		if (buf_addstr(b, "(none)") < 0)
			return -1;
	} else if (add_escaped(b, m->location, m->location_len) < 0) {
		return -1;
	}
	if (buf_addstr(b, "\n") < 0)
		return -1;
	for (i = 0; i < m->ncaveats; i++) {
		const struct caveat *c = &m->caveats[i];

		if (buf_addstr(b, c->vid != NULL ? "third-party caveat: " :
		    "caveat: ") < 0 || add_escaped(b, c->id, c->id_len) < 0)
			return -1;
		if (c->vid != NULL && c->location_len > 0 &&
		    (buf_addstr(b, " (location ") < 0 ||
		    add_escaped(b, c->location, c->location_len) < 0 ||
		    buf_addstr(b, ")") < 0))
			return -1;
		if (buf_addstr(b, "\n") < 0)
			return -1;
	}
	return 0;
}

/* ---- root keys ---- */

/* Check and decode the key text; a static-or-new message in *why. */
static int
parse_key(const char *text, size_t len, unsigned char key[MACAROON_KEY_LEN],
    char **why)
{
	unsigned char tmp[MACAROON_KEY_LEN];
	unsigned char any = 0;
	size_t n = 0, i;
	int ret = -1;

	if (len > 0 && text[len - 1] == '\n')
		len--;
	if (len != 2 * MACAROON_KEY_LEN) {
		*why = xasprintf("expected 64 hex characters, found %zu bytes",
		    len);
		goto out;
	}
	if (hex_decode(text, len, tmp, &n) < 0 || n != MACAROON_KEY_LEN) {
		*why = xstrdup("not 64 hex characters");
		goto out;
	}
	for (i = 0; i < n; i++)
		any |= tmp[i];
	if (any == 0) {
		*why = xstrdup("the key is all zeros");
		goto out;
	}
	/* the hex text is the key: hidden from logs wherever it shows */
	redact_secret_add(text, len);
	memcpy(key, tmp, MACAROON_KEY_LEN);
	ret = 0;
out:
	secure_wipe(tmp, sizeof(tmp));
	return ret;
}

/* Parse a root key from text (a Kubernetes Secret's value). */
int
meter_root_key_parse(const char *text, size_t len,
    unsigned char key[MACAROON_KEY_LEN], char **cause)
{
	char *why = NULL;
	int ret = -1;

	if (text == NULL) {
		why = xstrdup("missing");
		goto out;
	}
	if (parse_key(text, len, key, &why) < 0)
		goto out;
	ret = 0;
out:
	if (ret != 0 && cause != NULL)
		*cause = xasprintf("macaroon root key: %s", why);
	free(why);
	return ret;
}

/* Load a root key file, refusing loose permissions. */
int
meter_root_key_load_file(const char *path,
    unsigned char key[MACAROON_KEY_LEN], char **cause)
{
	char text[2 * MACAROON_KEY_LEN + 8];
	char *why = NULL;
	struct stat st;
	size_t len = 0;
	ssize_t got;
	int fd = -1, ret = -1;

	/*
	 * O_NONBLOCK: a FIFO in its place must not hang the start;
	 * O_NOFOLLOW: the key is this file, not one a link points to
	 */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK |
	    O_NOFOLLOW);
	if (fd < 0) {
		why = errno == ELOOP ? xstrdup("is a symbolic link") :
		    xasprintf("cannot open: %s", strerror(errno));
		goto out;
	}
	if (fstat(fd, &st) < 0) {
		why = xasprintf("cannot stat: %s", strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		why = xstrdup("not a regular file");
		goto out;
	}
	if ((st.st_mode & 077) != 0) {
		why = xasprintf("permissions %04o are too open, expected 0600",
		    (unsigned int)(st.st_mode & 07777));
		goto out;
	}
	/* whoever owns it can change it, and forge every token */
	if (st.st_uid != geteuid()) {
		why = xasprintf("owned by uid %u, not by the user diverged runs "
		    "as (uid %u)", (unsigned int)st.st_uid,
		    (unsigned int)geteuid());
		goto out;
	}
	while (len < sizeof(text)) {
		got = read(fd, text + len, sizeof(text) - len);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			why = xasprintf("cannot read: %s", strerror(errno));
			goto out;
		}
		if (got == 0)
			break;
		len += (size_t)got;
	}
	if (parse_key(text, len, key, &why) < 0)
		goto out;
	ret = 0;
out:
	if (ret != 0 && cause != NULL)
		*cause = xasprintf("macaroon root key '%s': %s", path, why);
	free(why);
	secure_wipe(text, sizeof(text));
	if (fd >= 0)
		close(fd);
	return ret;
}

static int
write_all(int fd, const char *p, size_t n)
{
	ssize_t w;

	while (n > 0) {
		w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* fsync the directory holding path, so a new entry survives a crash. */
static int
sync_parent(const char *path)
{
	const char *slash = strrchr(path, '/');
	char *dir;
	int fd, ret = -1;

	if (slash == NULL)
		dir = xstrdup(".");
	else if (slash == path)
		dir = xstrdup("/");
	else
		dir = xstrndup(path, (size_t)(slash - path));
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		ret = fsync(fd);
		close(fd);
	}
	free(dir);
	return ret;
}

/* Load the root key file, creating it on first start. */
int
meter_root_key_ensure_file(const char *path,
    unsigned char key[MACAROON_KEY_LEN], char **cause)
{
	unsigned char raw[MACAROON_KEY_LEN];
	char text[2 * MACAROON_KEY_LEN + 2];
	char *tmp = NULL, *why = NULL;
	struct stat st;
	int fd = -1, ret = -1, exists = 0;

	if (lstat(path, &st) == 0 || errno != ENOENT) {
		exists = 1;
		goto out;
	}
	/* mkstemp: O_CREAT|O_EXCL, mode 0600, in the same directory */
	tmp = xasprintf("%s.XXXXXX", path);
	fd = mkstemp(tmp);
	if (fd < 0) {
		free(tmp);
		tmp = NULL;
		why = xasprintf("cannot create: %s", strerror(errno));
		goto out;
	}
	(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
	if (random_bytes(raw, sizeof(raw)) < 0) {
		why = xstrdup("no random bytes");
		goto out;
	}
	hex_encode(raw, sizeof(raw), text);
	text[2 * MACAROON_KEY_LEN] = '\n';
	if (fchmod(fd, 0600) < 0 ||
	    write_all(fd, text, 2 * MACAROON_KEY_LEN + 1) < 0 ||
	    fsync(fd) < 0) {
		why = xasprintf("cannot write: %s", strerror(errno));
		goto out;
	}
	/* link() never replaces: when someone was faster, load their key */
	if (link(tmp, path) < 0) {
		if (errno == EEXIST)
			exists = 1;
		else
			why = xasprintf("cannot create: %s", strerror(errno));
		goto out;
	}
	/* the file is complete either way; this makes the name durable */
	if (sync_parent(path) < 0) {
		why = xasprintf("cannot sync its directory: %s",
		    strerror(errno));
		goto out;
	}
	redact_secret_add(text, 2 * MACAROON_KEY_LEN);
	memcpy(key, raw, MACAROON_KEY_LEN);
	ret = 0;
out:
	if (fd >= 0)
		close(fd);
	if (tmp != NULL) {
		unlink(tmp);
		free(tmp);
	}
	if (exists)
		ret = meter_root_key_load_file(path, key, cause);
	else if (ret != 0 && cause != NULL)
		*cause = xasprintf("macaroon root key '%s': %s", path, why);
	free(why);
	secure_wipe(raw, sizeof(raw));
	secure_wipe(text, sizeof(text));
	return ret;
}
