/* A validating, allocation-free JSON scanner; see jscan.h. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "util/jscan.h"
#include "util/util.h"

struct field_path {
	const char *comp[JSCAN_MAX_PATH];
	size_t clen[JSCAN_MAX_PATH];
	int ncomp;
};

struct scanner {
	const char *p;
	const char *end;
	struct jfield *fields;
	size_t n;
	int max_depth;
	const char *err;
	struct field_path paths[JSCAN_MAX_FIELDS];	/* last: see jscan() */
};

static void
ws(struct scanner *s)
{
	while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' ||
	    *s->p == '\r' || *s->p == '\t'))
		s->p++;
}

static int
fail(struct scanner *s, const char *err)
{
	if (s->err == NULL)
		s->err = err;
	return -1;
}

static int
hex4(const char *p, unsigned *out)
{
	unsigned v = 0;
	int i;

	for (i = 0; i < 4; i++) {
		int d = hex_digit(p[i]);

		if (d < 0)
			return -1;
		v = v << 4 | (unsigned)d;
	}
	*out = v;
	return 0;
}

/* Scan a string; s->p is at the opening quote. */
/* A byte that ends a plain run: a quote, a backslash, a control. */
static int
special(unsigned char c, int ascii)
{
	return c < 0x20 || c == '"' || c == '\\' || (ascii && c >= 0x80);
}

/*
 * The length of the run at p of bytes that need no care: not special(),
 * and with ascii set, below 0x80. Eight bytes at a time: a word with no
 * byte equal to '"' or '\\', none below 0x20 (and none with the high bit)
 * is skipped whole; the usual zero-byte tests have no false negatives,
 * and a false positive only sends that word through the byte loop. Where
 * the compiler targets SSE2 (every x86-64), sixteen bytes at a time
 * first, each byte tested exactly: the scan of a delivery spends most of
 * its time here, in the long strings (a comment, its escaped copy).
 */
static size_t
plain_run(const char *p, const char *end, int ascii)
{
	static const uint64_t ones = 0x0101010101010101ULL;
	static const uint64_t highs = 0x8080808080808080ULL;
	const char *q = p;
	int i;

#ifdef __SSE2__
	const __m128i quote = _mm_set1_epi8('"');
	const __m128i bslash = _mm_set1_epi8('\\');
	const __m128i ctl = _mm_set1_epi8(0x1f);

	while (end - q >= 16) {
		__m128i v = _mm_loadu_si128((const __m128i *)(const void *)q);
		/* a byte at most 0x1f is its own unsigned minimum with it */
		__m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote),
		    _mm_cmpeq_epi8(v, bslash)),
		    _mm_cmpeq_epi8(_mm_min_epu8(v, ctl), v));
		unsigned bits = (unsigned)_mm_movemask_epi8(m);

		if (ascii)	/* the high bits: bytes from 0x80 */
			bits |= (unsigned)_mm_movemask_epi8(v);
		if (bits != 0)
			return (size_t)(q - p) + (size_t)__builtin_ctz(bits);
		q += 16;
	}
#endif
	while (end - q >= 8) {
		uint64_t v, a, b, t;

		memcpy(&v, q, 8);
		a = v ^ (ones * '"');
		b = v ^ (ones * '\\');
		t = ((a - ones) & ~a) | ((b - ones) & ~b) |
		    ((v - ones * 0x20) & ~v) | (ascii ? v : 0);
		if (t & highs)
			for (i = 0; i < 8; i++)
				if (special((unsigned char)q[i], ascii))
					return (size_t)(q + i - p);
		q += 8;
	}
	while (q < end && !special((unsigned char)*q, ascii))
		q++;
	return (size_t)(q - p);
}

static int
string(struct scanner *s, const char **start, size_t *len)
{
	const char *p = s->p + 1;

	*start = p;
	while (p < s->end) {
		unsigned char c;

		p += plain_run(p, s->end, 1);
		if (p >= s->end)
			break;
		c = (unsigned char)*p;

		if (c == '"') {
			*len = (size_t)(p - *start);
			s->p = p + 1;
			return 0;
		}
		if (c == '\\') {
			unsigned u, lo;

			if (p + 1 >= s->end)
				break;
			switch (p[1]) {
			case '"': case '\\': case '/': case 'b': case 'f':
			case 'n': case 'r': case 't':
				p += 2;
				continue;
			case 'u':
				if (s->end - p < 6 || hex4(p + 2, &u) < 0)
					return fail(s, "invalid \\u escape");
				p += 6;
				if (u >= 0xdc00 && u <= 0xdfff)
					return fail(s, "lone low surrogate");
				if (u >= 0xd800 && u <= 0xdbff) {
					if (s->end - p < 6 || p[0] != '\\' ||
					    p[1] != 'u' || hex4(p + 2, &lo) < 0 ||
					    lo < 0xdc00 || lo > 0xdfff)
						return fail(s,
						    "unpaired high surrogate");
					p += 6;
				}
				continue;
			default:
				return fail(s, "invalid escape in string");
			}
		}
		if (c < 0x20)
			return fail(s, "control character in string");
		if (c < 0x80) {
			p++;
		} else {
			size_t n = utf8_valid_len((const unsigned char *)p,
			    (size_t)(s->end - p));

			if (n == 0)
				return fail(s, "invalid UTF-8 in string");
			p += n;
		}
	}
	return fail(s, "unterminated string");
}

static int
number(struct scanner *s)
{
	const char *p = s->p;

	if (p < s->end && *p == '-')
		p++;
	if (p >= s->end)
		return fail(s, "invalid number");
	if (*p == '0') {
		p++;
	} else if (*p >= '1' && *p <= '9') {
		while (p < s->end && *p >= '0' && *p <= '9')
			p++;
	} else {
		return fail(s, "invalid number");
	}
	if (p < s->end && *p == '.') {
		p++;
		if (p >= s->end || *p < '0' || *p > '9')
			return fail(s, "invalid number");
		while (p < s->end && *p >= '0' && *p <= '9')
			p++;
	}
	if (p < s->end && (*p == 'e' || *p == 'E')) {
		p++;
		if (p < s->end && (*p == '+' || *p == '-'))
			p++;
		if (p >= s->end || *p < '0' || *p > '9')
			return fail(s, "invalid number");
		while (p < s->end && *p >= '0' && *p <= '9')
			p++;
	}
	s->p = p;
	return 0;
}

static int
literal(struct scanner *s, const char *word, size_t n)
{
	if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
		return fail(s, "invalid literal");
	s->p += n;
	return 0;
}

/* Decode a key (rarely escaped) for comparison into buf. */
static size_t
key_text(const char *k, size_t klen, char *buf, size_t bufsz,
    const char **out)
{
	struct jfield f;
	char *dec = NULL;
	size_t n = 0;

	if (memchr(k, '\\', klen) == NULL) {
		*out = k;
		return klen;
	}
	f.type = JT_STRING;
	f.start = k;
	f.len = klen;
	if (jscan_string(&f, &dec, &n) < 0 || n >= bufsz) {
		free(dec);
		*out = "";
		return (size_t)-1;	/* matches nothing */
	}
	memcpy(buf, dec, n);
	free(dec);
	*out = buf;
	return n;
}

static int value(struct scanner *s, int depth, uint64_t mask);

static void
record(struct scanner *s, size_t i, enum jtype t, const char *start,
    size_t len)
{
	s->fields[i].type = t;
	s->fields[i].start = start;
	s->fields[i].len = len;
	s->fields[i].count++;
}

static enum jtype
type_of(char c)
{
	switch (c) {
	case '"':
		return JT_STRING;
	case '{':
		return JT_OBJECT;
	case '[':
		return JT_ARRAY;
	case 't':
		return JT_TRUE;
	case 'f':
		return JT_FALSE;
	case 'n':
		return JT_NULL;
	default:
		return JT_NUMBER;
	}
}

static int
object(struct scanner *s, int depth, uint64_t mask)
{
	/* the fields whose path went through a key of this object */
	uint64_t seen = 0;

	s->p++;	/* { */
	ws(s);
	if (s->p < s->end && *s->p == '}') {
		s->p++;
		return 0;
	}
	for (;;) {
		const char *k, *kt;
		size_t klen, ktlen, i;
		uint64_t sub = 0, ends = 0;
		const char *vs;
		char kbuf[128];

		ws(s);
		if (s->p >= s->end || *s->p != '"')
			return fail(s, "expected a string key");
		if (string(s, &k, &klen) < 0)
			return -1;
		ws(s);
		if (s->p >= s->end || *s->p != ':')
			return fail(s, "expected ':'");
		s->p++;
		ws(s);
		if (mask != 0) {
			uint64_t m;

			ktlen = key_text(k, klen, kbuf, sizeof(kbuf), &kt);
			/*
			 * only the fields whose path leads here: a large
			 * object (a repository has some 90 keys) on the way
			 * to one or two of them would otherwise test every
			 * field at every key
			 */
			for (m = mask; m != 0; m &= m - 1) {
				const struct field_path *fp;

				i = (size_t)__builtin_ctzll(m);
				fp = &s->paths[i];
				if (fp->clen[depth] != ktlen ||
				    memcmp(fp->comp[depth], kt, ktlen) != 0)
					continue;
				if (fp->ncomp == depth + 1)
					ends |= UINT64_C(1) << i;
				else
					sub |= UINT64_C(1) << i;
			}
		}
		/*
		 * A key on the way to a field, met again: a parser keeping
		 * the last (jansson) and this scan would disagree about
		 * everything below, so those fields count as duplicates.
		 */
		for (i = 0; (sub & seen) != 0 && i < s->n; i++)
			if ((sub & seen & (UINT64_C(1) << i)) &&
			    s->fields[i].count < 2)
				s->fields[i].count = 2;
		seen |= sub;
		vs = s->p;
		if (value(s, depth + 1, sub) < 0)
			return -1;
		for (i = 0; ends != 0 && i < s->n; i++) {
			if (!(ends & (UINT64_C(1) << i)))
				continue;
			if (*vs == '"')
				record(s, i, JT_STRING, vs + 1,
				    (size_t)(s->p - vs) - 2);
			else
				record(s, i, type_of(*vs), vs,
				    (size_t)(s->p - vs));
		}
		ws(s);
		if (s->p >= s->end)
			return fail(s, "unterminated object");
		if (*s->p == ',') {
			s->p++;
			continue;
		}
		if (*s->p == '}') {
			s->p++;
			return 0;
		}
		return fail(s, "expected ',' or '}'");
	}
}

static int
array(struct scanner *s, int depth)
{
	s->p++;	/* [ */
	ws(s);
	if (s->p < s->end && *s->p == ']') {
		s->p++;
		return 0;
	}
	for (;;) {
		ws(s);
		if (value(s, depth + 1, 0) < 0)
			return -1;
		ws(s);
		if (s->p >= s->end)
			return fail(s, "unterminated array");
		if (*s->p == ',') {
			s->p++;
			continue;
		}
		if (*s->p == ']') {
			s->p++;
			return 0;
		}
		return fail(s, "expected ',' or ']'");
	}
}

static int
value(struct scanner *s, int depth, uint64_t mask)
{
	const char *st;
	size_t sl;

	if (depth > s->max_depth)
		return fail(s, "nesting too deep");
	ws(s);
	if (s->p >= s->end)
		return fail(s, "unexpected end of input");
	switch (*s->p) {
	case '{':
		return object(s, depth, mask);
	case '[':
		return array(s, depth);
	case '"':
		return string(s, &st, &sl);
	case 't':
		return literal(s, "true", 4);
	case 'f':
		return literal(s, "false", 5);
	case 'n':
		return literal(s, "null", 4);
	default:
		return number(s);
	}
}

/* Scan one document. */
int
jscan(const char *text, size_t len, struct jfield *fields, size_t n,
    int max_depth, const char **err)
{
	struct scanner s;
	size_t i;
	uint64_t mask = 0;

	if (n > JSCAN_MAX_FIELDS) {
		*err = "too many fields requested";
		return -1;
	}
	/* the paths of the n fields only: all of them are 8 KiB to clear */
	memset(&s, 0, offsetof(struct scanner, paths));
	memset(s.paths, 0, n * sizeof(s.paths[0]));
	s.p = text;
	s.end = text + len;
	s.fields = fields;
	s.n = n;
	s.max_depth = max_depth;
	for (i = 0; i < n; i++) {
		const char *p = fields[i].path, *dot;
		struct field_path *fp = &s.paths[i];

		fields[i].type = JT_ABSENT;
		fields[i].start = NULL;
		fields[i].len = 0;
		fields[i].count = 0;
		while (fp->ncomp < JSCAN_MAX_PATH) {
			dot = strchr(p, '.');
			fp->comp[fp->ncomp] = p;
			fp->clen[fp->ncomp] = dot ? (size_t)(dot - p) :
			    strlen(p);
			fp->ncomp++;
			if (dot == NULL)
				break;
			p = dot + 1;
		}
		mask |= UINT64_C(1) << i;
	}
	if (value(&s, 0, mask) < 0) {
		*err = s.err;
		return -1;
	}
	ws(&s);
	if (s.p != s.end) {
		*err = "trailing data after the JSON value";
		return -1;
	}
	return 0;
}

/* Find a field by path. */
const struct jfield *
jscan_get(const struct jfield *fields, size_t n, const char *path)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (strcmp(fields[i].path, path) == 0)
			return &fields[i];
	return NULL;
}

/* Decode a scanned (already validated) string. */
int
jscan_string(const struct jfield *f, char **out, size_t *outlen)
{
	const char *p = f->start, *end = f->start + f->len;
	char *o;
	size_t k = 0;

	if (f->type != JT_STRING)
		return -1;
	o = xmalloc(f->len + 1);
	while (p < end) {
		unsigned u, lo;
		size_t n = plain_run(p, end, 0);

		memcpy(o + k, p, n);
		k += n;
		p += n;
		if (p >= end)
			break;
		if (*p != '\\') {
			if (*p == '\0')
				goto bad;
			o[k++] = *p++;
			continue;
		}
		switch (p[1]) {
		case 'b':
			o[k++] = '\b';
			break;
		case 'f':
			o[k++] = '\f';
			break;
		case 'n':
			o[k++] = '\n';
			break;
		case 'r':
			o[k++] = '\r';
			break;
		case 't':
			o[k++] = '\t';
			break;
		case 'u':
			if (end - p < 6 || hex4(p + 2, &u) < 0)
				goto bad;
			p += 6;
			if (u >= 0xd800 && u <= 0xdbff) {
				if (end - p < 6 || hex4(p + 2, &lo) < 0)
					goto bad;
				u = 0x10000 + ((u - 0xd800) << 10) +
				    (lo - 0xdc00);
				p += 6;
			}
			if (u == 0)
				goto bad;
			k += utf8_put(u, o + k);
			continue;
		default:	/* " \ / */
			o[k++] = p[1];
		}
		p += 2;
	}
	o[k] = '\0';
	*out = o;
	*outlen = k;
	return 0;
bad:
	free(o);
	return -1;
}

/* An int64 value. */
int
jscan_int(const struct jfield *f, int64_t *out)
{
	char buf[32];
	char *e;
	long long v;
	size_t i;

	if (f->type != JT_NUMBER || f->len == 0 || f->len >= sizeof(buf))
		return -1;
	for (i = 0; i < f->len; i++)
		if (f->start[i] == '.' || f->start[i] == 'e' ||
		    f->start[i] == 'E')
			return -1;
	memcpy(buf, f->start, f->len);
	buf[f->len] = '\0';
	errno = 0;
	v = strtoll(buf, &e, 10);
	if (errno != 0 || *e != '\0')
		return -1;
	*out = v;
	return 0;
}

/* Append a JSON string literal. */
int
jscan_escape(struct buf *b, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	const char *run = s, *end = s + strlen(s);
	int r = buf_add(b, "\"", 1);

	for (; s < end; s++) {
		unsigned char c;
		char esc[7];
		size_t n = 0;

		s += plain_run(s, end, 0);
		if (s >= end)
			break;
		c = (unsigned char)*s;
		r |= buf_add(b, run, (size_t)(s - run));
		esc[n++] = '\\';
		switch (c) {
		case '"':
			esc[n++] = '"';
			break;
		case '\\':
			esc[n++] = '\\';
			break;
		case '\n':
			esc[n++] = 'n';
			break;
		case '\r':
			esc[n++] = 'r';
			break;
		case '\t':
			esc[n++] = 't';
			break;
		default:
			esc[n++] = 'u';
			esc[n++] = '0';
			esc[n++] = '0';
			esc[n++] = hex[c >> 4];
			esc[n++] = hex[c & 15];
		}
		r |= buf_add(b, esc, n);
		run = s + 1;
	}
	r |= buf_add(b, run, (size_t)(s - run));
	r |= buf_add(b, "\"", 1);
	return r;
}
