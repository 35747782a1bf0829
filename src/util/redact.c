/*
 * Redaction of credentials from text that leaves the process: log lines,
 * and upstream messages copied into a status, a comment or a reply.
 *
 * Two kinds of thing are hidden. Our own secrets, registered as they are
 * read (config secrets at start and on SIGHUP, Kubernetes tokens, exec
 * credentials, the macaroon root key): every occurrence, raw or as JSON
 * escapes it. And credential shapes that need not be ours, since an
 * upstream error may quote what a proxy or a client sent: the value of an
 * Authorization-like header, "Bearer <token>", a ?token=/&password=
 * query parameter and the userinfo of a URL; and, wherever they stand,
 * the tokens GitHub and GitLab issue (by their documented prefixes), JWTs
 * and PEM private keys (an agent's message or a kubeconfig may hold one),
 * and our own macaroons: there is one per task, too many to register.
 *
 * Values shorter than REDACT_MIN_LEN are not registered: a 3-byte secret
 * would shred ordinary words, and is no secret worth the name anyway.
 * Of a value of REDACT_FRAG_SECRET bytes or more, a fragment is hidden
 * too, wherever it stands (see fragments() below).
 * Registered values are kept (up to REDACT_KEEP, the oldest then goes):
 * after a rotation the old value may still be valid, and may still be
 * quoted by a reply to a request that went out before it.
 */
#include "config.h"

#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/util.h"

#define REDACT_KEEP	256
/* The bytes of a fragment's index key, and the step of the text's samples. */
#define FRAG_KEY	8
#define FRAG_STEP	(REDACT_FRAG_LEN - FRAG_KEY + 1)

struct secret {
	char *v;
	size_t len;
	int frags;	/* its fragments are in the index */
};

/* A ring: secrets[next] is the oldest once it is full. */
static struct secret secrets[REDACT_KEEP];
static size_t nsecrets, next_slot;
static pthread_rwlock_t secrets_lock = PTHREAD_RWLOCK_INITIALIZER;

/*
 * The index of fragments: every FRAG_KEY bytes of each value with frags
 * set, at every offset, in an open-addressing table (linear probing, at
 * most half full); NULL when no value has them. Rebuilt under the write
 * lock when the values change.
 */
struct frag {
	uint64_t key;		/* the bytes as they load */
	uint32_t secret;	/* 1 + the index in secrets; 0: a free slot */
	uint32_t off;		/* where the bytes start in it */
};
static struct frag *frags;
static size_t frags_mask, frags_size;
static int frags_stale;

static uint64_t
load_key(const char *p)
{
	uint64_t k;

	memcpy(&k, p, sizeof(k));
	return k;
}

static size_t
frag_slot(uint64_t key)
{
	key *= 0x9e3779b97f4a7c15ULL;
	return (size_t)(key ^ (key >> 29)) & frags_mask;
}

/* Rebuild the index of fragments (the caller holds the write lock). */
static void
frags_rebuild(void)
{
	size_t i, off, h, count = 0;

	if (frags != NULL) {
		secure_wipe(frags, frags_size * sizeof(*frags));
		free(frags);
		frags = NULL;
	}
	frags_stale = 0;
	for (i = 0; i < nsecrets; i++)
		if (secrets[i].frags)
			count += secrets[i].len - FRAG_KEY + 1;
	if (count == 0)
		return;
	for (frags_size = 16; frags_size < 2 * count; frags_size *= 2)
		;
	frags_mask = frags_size - 1;
	frags = xcalloc(frags_size, sizeof(*frags));
	for (i = 0; i < nsecrets; i++) {
		if (!secrets[i].frags)
			continue;
		for (off = 0; off + FRAG_KEY <= secrets[i].len; off++) {
			uint64_t key = load_key(secrets[i].v + off);

			for (h = frag_slot(key); frags[h].secret != 0;
			    h = (h + 1) & frags_mask)
				;
			frags[h].key = key;
			frags[h].secret = (uint32_t)i + 1;
			frags[h].off = (uint32_t)off;
		}
	}
}

/*
 * Keep one value, its fragments too when frags is set and it is long
 * enough (the caller holds the write lock, and calls frags_rebuild()
 * after when frags_stale is set).
 */
static void
keep(const char *v, size_t len, int frag)
{
	struct secret *s;
	size_t i;

	if (len < REDACT_MIN_LEN)
		return;
	frag = frag && len >= REDACT_FRAG_SECRET;
	for (i = 0; i < nsecrets; i++)
		if (secrets[i].len == len &&
		    memcmp(secrets[i].v, v, len) == 0) {
			if (frag && !secrets[i].frags)
				secrets[i].frags = frags_stale = 1;
			return;
		}
	s = &secrets[next_slot];
	if (s->v != NULL) {
		frags_stale |= s->frags;
		secure_wipe(s->v, s->len);
		free(s->v);
	}
	s->v = xstrndup(v, len);
	s->len = len;
	s->frags = frag;
	frags_stale |= frag;
	next_slot = (next_slot + 1) % REDACT_KEEP;
	/* read without the lock by ours() to skip the lock when empty */
	if (nsecrets < REDACT_KEEP)
		__atomic_store_n(&nsecrets, nsecrets + 1, __ATOMIC_RELAXED);
}

/* *v and *len without the white space around them. */
static void
trim(const char **v, size_t *len)
{
	while (*len > 0 && isspace((unsigned char)**v)) {
		(*v)++;
		(*len)--;
	}
	while (*len > 0 && isspace((unsigned char)(*v)[*len - 1]))
		(*len)--;
}

/* Keep v and, when it differs, v as it reads inside a JSON string. */
static void
keep_forms(const char *v, size_t len, int frag)
{
	struct buf b;
	size_t i;

	trim(&v, &len);
	if (len < REDACT_MIN_LEN)
		return;
	keep(v, len, frag);
	buf_init(&b, 6 * len + 1);
	for (i = 0; i < len; i++) {
		if (v[i] == '"' || v[i] == '\\')
			buf_printf(&b, "\\%c", v[i]);
		else if (v[i] == '\n')
			buf_addstr(&b, "\\n");
		else if ((unsigned char)v[i] < 0x20)
			buf_printf(&b, "\\u%04x", (unsigned char)v[i]);
		else
			buf_add(&b, v + i, 1);
	}
	if (b.len != len)
		keep(b.data, b.len, frag);
	secure_wipe(b.data, b.len);
	buf_release(&b);
}

/* Register a secret value (the registry keeps a copy). */
void
redact_secret_add(const char *v, size_t len)
{
	const char *p, *nl, *end;
	int lines;

	if (v == NULL)
		return;
	/*
	 * A value read from a file ends with a newline (one written by hand
	 * may start with one too): that does not make it a multi-line value,
	 * whose fragments would be left out.
	 */
	trim(&v, &len);
	end = v + len;
	lines = memchr(v, '\n', len) != NULL;
	pthread_rwlock_wrlock(&secrets_lock);
	/*
	 * The fragments of a multi-line value are those of its lines: the
	 * whole would bring its armour lines, no secret, into the index.
	 */
	keep_forms(v, len, !lines);
	/*
	 * Each line of a multi-line secret too (a PEM key): an error may
	 * quote one line. The armour lines are no secret.
	 */
	if (lines) {
		for (p = v; p < end; p = nl + 1) {
			nl = memchr(p, '\n', (size_t)(end - p));
			if (nl == NULL)
				nl = end;
			if (strncmp(p, "-----", 5) != 0)
				keep_forms(p, (size_t)(nl - p), 1);
		}
	}
	if (frags_stale)
		frags_rebuild();
	pthread_rwlock_unlock(&secrets_lock);
}

/* Forget every registered value. */
void
redact_secrets_clear(void)
{
	size_t i;

	pthread_rwlock_wrlock(&secrets_lock);
	for (i = 0; i < REDACT_KEEP; i++) {
		if (secrets[i].v != NULL) {
			secure_wipe(secrets[i].v, secrets[i].len);
			free(secrets[i].v);
		}
		secrets[i].v = NULL;
		secrets[i].len = 0;
		secrets[i].frags = 0;
	}
	__atomic_store_n(&nsecrets, 0, __ATOMIC_RELAXED);
	next_slot = 0;
	frags_rebuild();
	pthread_rwlock_unlock(&secrets_lock);
}

/* Mark [from, to) in the mask, allocated on the first mark. */
static void
mark(char **mask, size_t n, size_t from, size_t to)
{
	if (from >= to)
		return;
	if (*mask == NULL)
		*mask = xcalloc(n, 1);
	memset(*mask + from, 1, to - from);
}

/* A byte of a token: RFC 7235's token68 with '%' (escaped ones). */
static int
cred_char(unsigned char c)
{
	return isalnum(c) || (c != '\0' && strchr("-._~+/=%", c) != NULL);
}

static size_t
cred_run(const char *s, size_t n, size_t i)
{
	size_t j = i;

	while (j < n && cred_char((unsigned char)s[j]))
		j++;
	return j - i;
}

/*
 * Whether s[i..i+len) looks like a token, not a word: long enough and
 * with something other than letters ("invalid bearer credentials" is
 * English, "ghp_x1", "eyJ..." and "glpat-..." are not).
 */
static int
token_shaped(const char *s, size_t i, size_t len)
{
	size_t k;

	if (len < REDACT_MIN_LEN)
		return 0;
	for (k = i; k < i + len; k++)
		if (!isalpha((unsigned char)s[k]))
			return 1;
	return 0;
}

/* Whether s[i..) starts the word w (ASCII case aside) at a word start. */
static int
word_at(const char *s, size_t n, size_t i, const char *w)
{
	size_t len = strlen(w);

	if (i > 0 && (isalnum((unsigned char)s[i - 1]) || s[i - 1] == '-' ||
	    s[i - 1] == '_'))
		return 0;
	return n - i >= len && strncasecmp(s + i, w, len) == 0;
}

static const char *const headers[] = {
	"proxy-authorization", "authorization", "private-token",
	"job-token", "x-gitlab-token",
};
static const char *const schemes[] = {
	"bearer", "basic", "token", "bot", "negotiate",
};

/*
 * "Authorization: Bearer x", "authorization=token x", JSON's
 * "Authorization": "Basic x": the credential after a known scheme, or a
 * token-shaped value with no scheme.
 */
static void
header_value(const char *s, size_t n, size_t i, char **mask)
{
	size_t k, j, w, run;

	for (k = 0; k < ARRAY_SIZE(headers); k++)
		if (word_at(s, n, i, headers[k]))
			break;
	if (k == ARRAY_SIZE(headers))
		return;
	j = i + strlen(headers[k]);
	if (j < n && (s[j] == '"' || s[j] == '\''))
		j++;
	while (j < n && s[j] == ' ')
		j++;
	if (j >= n || (s[j] != ':' && s[j] != '='))
		return;
	j++;
	while (j < n && (s[j] == ' ' || s[j] == '"' || s[j] == '\''))
		j++;
	for (w = 0; w < ARRAY_SIZE(schemes); w++) {
		size_t sl = strlen(schemes[w]);

		if (n - j > sl && strncasecmp(s + j, schemes[w], sl) == 0 &&
		    s[j + sl] == ' ') {
			j += sl;
			while (j < n && s[j] == ' ')
				j++;
			mark(mask, n, j, j + cred_run(s, n, j));
			return;
		}
	}
	run = cred_run(s, n, j);
	if (token_shaped(s, j, run))
		mark(mask, n, j, j + run);
}

/* "Bearer x" anywhere, when x looks like a token. */
static void
bearer(const char *s, size_t n, size_t i, char **mask)
{
	size_t j, run;

	if (!word_at(s, n, i, "bearer") || n - i <= 6 || s[i + 6] != ' ')
		return;
	for (j = i + 6; j < n && s[j] == ' '; j++)
		;
	run = cred_run(s, n, j);
	if (token_shaped(s, j, run))
		mark(mask, n, j, j + run);
}

/* Whether the name [from, to) of a query parameter names a credential. */
static int
secret_param(const char *s, size_t from, size_t to)
{
	static const char *const ends[] = {
		"token", "secret", "password", "passwd", "api_key", "apikey",
	};
	size_t k, len;

	for (k = 0; k < ARRAY_SIZE(ends); k++) {
		len = strlen(ends[k]);
		if (to - from >= len &&
		    strncasecmp(s + to - len, ends[k], len) == 0)
			return 1;
	}
	return 0;
}

/* "?access_token=x", "&password=x": the value. */
static void
query_param(const char *s, size_t n, size_t i, char **mask)
{
	size_t j = i + 1, k;

	while (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_' ||
	    s[j] == '-' || s[j] == '.'))
		j++;
	if (j == i + 1 || j >= n || s[j] != '=' ||
	    !secret_param(s, i + 1, j))
		return;
	for (k = ++j; k < n && strchr("&#;\"'<> \t\r\n", s[k]) == NULL; k++)
		;
	mark(mask, n, j, k);
}

/*
 * "scheme://user:pass@host": the whole userinfo (a token often stands as
 * the user name); "scheme://user@host" only when user looks like a token.
 */
static void
userinfo(const char *s, size_t n, size_t i, char **mask)
{
	size_t j = i + 3;
	int colon = 0;

	while (j < n && (isalnum((unsigned char)s[j]) ||
	    strchr("-._~%!$&*+,;=:", s[j]) != NULL)) {
		if (s[j] == ':')
			colon = 1;
		j++;
	}
	if (j >= n || s[j] != '@' || j == i + 3)
		return;
	if (colon || token_shaped(s, i + 3, j - i - 3))
		mark(mask, n, i + 3, j);
}

/* The first v of len in [p, p + n), or NULL (memmem is a GNU extension). */
static const char *
find(const char *p, size_t n, const char *v, size_t len)
{
	const char *end = p + n, *q;

	while ((size_t)(end - p) >= len) {
		q = memchr(p, v[0], (size_t)(end - p) - len + 1);
		if (q == NULL)
			return NULL;
		if (memcmp(q, v, len) == 0)
			return q;
		p = q + 1;
	}
	return NULL;
}

/* A byte of base64url (RFC 4648 section 5). */
static int
b64url_char(unsigned char c)
{
	return isalnum(c) || c == '-' || c == '_';
}

/* The end of the run of base64url bytes from i. */
static size_t
b64url_run(const char *s, size_t n, size_t i)
{
	while (i < n && b64url_char((unsigned char)s[i]))
		i++;
	return i;
}

/*
 * The tokens GitHub and GitLab issue start with a prefix of their type,
 * which secret scanners look for. GitHub (changelog, 2021-03-31): ghp_
 * personal, gho_ OAuth, ghu_ user-to-server, ghs_ server-to-server, ghr_
 * refresh, then 36 of [A-Za-z0-9_] (up to 255 announced); github_pat_
 * fine-grained, 22 + '_' + 59. GitLab (its token overview): glpat-
 * personal, project, group and impersonation, gloas- OAuth application
 * secret, gldt- deploy, glrt-/glrtr- runner, glcbt- CI/CD job, glptt-
 * trigger, glft- feed, glimt- incoming mail, glagent- agent for
 * Kubernetes, glwt- workspace, glsoat- SCIM, glffct- feature flags client;
 * 20 or more of [A-Za-z0-9_-], with '.' in the routable form.
 */
#define GITHUB_MIN 36
#define GITHUB_PAT_MIN 22
#define GITLAB_MIN 20
static const char *const gitlab_prefixes[] = {
	"glpat-", "gloas-", "gldt-", "glrt-", "glrtr-", "glcbt-", "glptt-",
	"glft-", "glimt-", "glagent-", "glwt-", "glsoat-", "glffct-",
};

/* The length of a GitLab prefix at s[i] ("gl", letters, '-'), or 0. */
static size_t
gitlab_prefix(const char *s, size_t n, size_t i)
{
	size_t j, k, pl;

	for (j = i + 2; j < n && j < i + 8 && islower((unsigned char)s[j]);
	    j++)
		;
	if (j >= n || s[j] != '-')
		return 0;
	pl = j + 1 - i;
	for (k = 0; k < ARRAY_SIZE(gitlab_prefixes); k++)
		if (strlen(gitlab_prefixes[k]) == pl &&
		    memcmp(s + i, gitlab_prefixes[k], pl) == 0)
			return pl;
	return 0;
}

/*
 * A GitHub or GitLab token at s[i] ('g' at a word start, after a '-' too:
 * GitLab's instance prefix, "SIE-glpat-", stays): its end, or 0.
 */
static size_t
vendor_token(const char *s, size_t n, size_t i)
{
	size_t pl, min, j;
	int gl = 0;

	if (n - i < 5)
		return 0;
	if (s[i + 1] == 'h' && strchr("pousr", s[i + 2]) != NULL &&
	    s[i + 3] == '_') {
		pl = 4;
		min = GITHUB_MIN;
	} else if (s[i + 1] == 'i' && n - i > 11 &&
	    memcmp(s + i, "github_pat_", 11) == 0) {
		pl = 11;
		min = GITHUB_PAT_MIN;
	} else if (s[i + 1] == 'l' && (pl = gitlab_prefix(s, n, i)) != 0) {
		min = GITLAB_MIN;
		gl = 1;
	} else {
		return 0;
	}
	for (j = i + pl; j < n && (isalnum((unsigned char)s[j]) ||
	    s[j] == '_' || (gl && (s[j] == '-' || s[j] == '.'))); j++)
		;
	while (j > i + pl && s[j - 1] == '.')	/* a full stop */
		j--;
	return j - i - pl >= min ? j : 0;
}

/*
 * The shortest base64 taken for a macaroon: the smallest V2 one (an empty
 * identifier, no caveat, the 32-byte signature) is 39 bytes, 52
 * characters; no word is this long without a space.
 */
#define MACAROON_MIN_B64 48

/*
 * A serialized macaroon at s[i] ('A' or 'M'), in the forms
 * meter/macaroon.c writes and reads: base64 (either alphabet, padded or
 * not) of V2 binary, 0x02 (the version) then 0x01 or 0x02 (the type of the
 * first field: location, identifier) then the first byte of its length,
 * so "Ag" and one of E to L; or of V1 packets, "HHHHlocation ..." with HHHH
 * the packet's length in hex (below 0x4000), so 'M', five characters
 * that vary, then "xvY2F0aW9u" ("location" from its second byte). Its
 * end, or 0.
 */
static size_t
macaroon(const char *s, size_t n, size_t i)
{
	size_t j;

	if (n - i < MACAROON_MIN_B64 ||
	    (i > 0 && (b64url_char((unsigned char)s[i - 1]) ||
	    s[i - 1] == '+' || s[i - 1] == '/')))
		return 0;
	if (!(s[i] == 'A' && s[i + 1] == 'g' && s[i + 2] >= 'E' &&
	    s[i + 2] <= 'L') &&
	    !(s[i] == 'M' && memcmp(s + i + 6, "xvY2F0aW9u", 10) == 0))
		return 0;
	for (j = i; j < n && (b64url_char((unsigned char)s[j]) ||
	    s[j] == '+' || s[j] == '/'); j++)
		;
	if (j - i < MACAROON_MIN_B64)
		return 0;
	if (j < n && s[j] == '=')
		j += j + 1 < n && s[j + 1] == '=' ? 2 : 1;
	return j;
}

/* The shortest first or second segment taken for a JWT. */
#define JWT_MIN_SEGMENT 10

/*
 * A JWT (RFC 7519, JWS compact form) at s[i] ('e'): three base64url
 * segments joined by '.', the first two JSON objects, so starting "eyJ"
 * ('{"'); the third (the signature) is empty for alg "none". Its end, or
 * 0.
 */
static size_t
jwt(const char *s, size_t n, size_t i)
{
	size_t j, k;

	if (n - i < 3 || s[i + 1] != 'y' || s[i + 2] != 'J' ||
	    (i > 0 && (b64url_char((unsigned char)s[i - 1]) ||
	    s[i - 1] == '.')))
		return 0;
	j = b64url_run(s, n, i);
	if (j - i < JWT_MIN_SEGMENT || j >= n || s[j] != '.')
		return 0;
	k = j + 1;
	if (n - k < 3 || memcmp(s + k, "eyJ", 3) != 0)
		return 0;
	j = b64url_run(s, n, k);
	if (j - k < JWT_MIN_SEGMENT || j >= n || s[j] != '.')
		return 0;
	return b64url_run(s, n, j + 1);
}

/*
 * The armour line "-----<what><label>-----" at s[i], its label of
 * [A-Z0-9 ] naming a private key ("RSA PRIVATE KEY", "PRIVATE KEY",
 * "ENCRYPTED PRIVATE KEY", "OPENSSH PRIVATE KEY", PGP's "PGP PRIVATE KEY
 * BLOCK"): its end, or 0.
 */
static size_t
pem_armour(const char *s, size_t n, size_t i, const char *what)
{
	size_t wl = strlen(what), from = i + 5 + wl, j;

	if (n - i < 5 + wl || memcmp(s + i, "-----", 5) != 0 ||
	    memcmp(s + i + 5, what, wl) != 0)
		return 0;
	for (j = from; j < n && (isupper((unsigned char)s[j]) ||
	    isdigit((unsigned char)s[j]) || s[j] == ' '); j++)
		;
	if (n - j < 5 || memcmp(s + j, "-----", 5) != 0 ||
	    find(s + from, j - from, "PRIVATE KEY", 11) == NULL)
		return 0;
	return j + 5;
}

/*
 * A PEM private key (RFC 7468) at s[i], its lines split by
 * newlines or by JSON's "\n": from its BEGIN line through its END line,
 * or through the end of the text when it was cut before its END line.
 * Its end, or 0.
 */
static size_t
pem_key(const char *s, size_t n, size_t i)
{
	const char *e;
	size_t j, end;

	j = pem_armour(s, n, i, "BEGIN ");
	if (j == 0)
		return 0;
	for (e = s + j; (e = find(e, (size_t)(s + n - e), "-----END ", 9));
	    e++)
		if ((end = pem_armour(s, n, (size_t)(e - s), "END ")) != 0)
			return end;
	return n;
}

/*
 * Mark the PEM private keys of s. A pass of its own: the BEGIN line may
 * follow a token without a space ("...-----BEGIN"), which the token's
 * run would take in, leaving the key after it to the loop in redact().
 */
static void
pem_keys(const char *s, size_t n, char **mask)
{
	const char *b = s;
	size_t end;

	while ((b = find(b, (size_t)(s + n - b), "-----BEGIN ", 11))) {
		end = pem_key(s, n, (size_t)(b - s));
		if (end == 0) {
			b++;
			continue;
		}
		mark(mask, n, (size_t)(b - s), end);
		b = s + end;
	}
}

/*
 * Mark the fragments of registered values in s (the caller holds the
 * lock). An upstream may quote a window of what it was sent (a request
 * line, a header cut to its last bytes, a body from an offset), so a long
 * secret can show up neither whole nor cut at its end. The rule: a run of
 * REDACT_FRAG_LEN (16) bytes or more of s that also occurs in a value of
 * REDACT_FRAG_SECRET (24) bytes or more is hidden, all of it, wherever it
 * stands. 16 bytes of a random token are 64 bits (hex) to 95 (base62):
 * ordinary text does not hold them by chance, so words are not shredded,
 * and a shorter run leaves 9 bytes or more of the value unsaid. Shorter
 * values keep the rules above (whole, or cut at the end of s).
 *
 * The cost is bounded without a scan per value: the index holds every
 * FRAG_KEY (8) bytes of each value, and s is looked up only every
 * FRAG_STEP (9) bytes. A run of 16 holds 9 consecutive starts of 8 bytes,
 * one of them a sample, which is then extended both ways along the value.
 */
static void
fragments(const char *s, size_t n, char **mask)
{
	const struct secret *sc;
	size_t p, h, a, b, o;
	uint64_t key;

	for (p = 0; p + FRAG_KEY <= n; p += FRAG_STEP) {
		key = load_key(s + p);
		for (h = frag_slot(key); frags[h].secret != 0;
		    h = (h + 1) & frags_mask) {
			if (frags[h].key != key)
				continue;
			sc = &secrets[frags[h].secret - 1];
			o = frags[h].off;
			for (a = 0; a < p && a < o &&
			    s[p - a - 1] == sc->v[o - a - 1]; a++)
				;
			for (b = FRAG_KEY; p + b < n && o + b < sc->len &&
			    s[p + b] == sc->v[o + b]; b++)
				;
			if (a + b >= REDACT_FRAG_LEN)
				mark(mask, n, p - a, p + b);
		}
	}
}

/* Mark every occurrence of the registered values. */
static void
ours(const char *s, size_t n, char **mask)
{
	const struct secret *sc;
	const char *p, *hit;
	size_t i, k;

	if (__atomic_load_n(&nsecrets, __ATOMIC_RELAXED) == 0)
		return;
	pthread_rwlock_rdlock(&secrets_lock);
	for (i = 0; i < nsecrets; i++) {
		sc = &secrets[i];
		for (p = s; (size_t)(s + n - p) >= sc->len; p = hit + 1) {
			hit = find(p, (size_t)(s + n - p), sc->v, sc->len);
			if (hit == NULL)
				break;
			mark(mask, n, (size_t)(hit - s),
			    (size_t)(hit - s) + sc->len);
		}
		/*
		 * Text cut short (a bounded stderr, a quoted message) can
		 * end in the first part of a secret: hide that part too.
		 */
		k = n > sc->len ? n - sc->len + 1 : 0;
		for (; k + REDACT_MIN_LEN <= n; k++)
			if (s[k] == sc->v[0] &&
			    memcmp(s + k, sc->v, n - k) == 0) {
				mark(mask, n, k, n);
				break;
			}
	}
	if (frags != NULL && n >= REDACT_FRAG_LEN)
		fragments(s, n, mask);
	pthread_rwlock_unlock(&secrets_lock);
}

/*
 * The bytes where a shape can start: a letter only at a word start (every
 * shape above wants one), punctuation anywhere. Most bytes of a text are
 * neither and are passed over with one load, without the switch below.
 */
#define AT_WORD 1
#define ANYWHERE 2
static const unsigned char starts[256] = {
	['a'] = AT_WORD, ['A'] = AT_WORD, ['p'] = AT_WORD, ['P'] = AT_WORD,
	['j'] = AT_WORD, ['J'] = AT_WORD, ['x'] = AT_WORD, ['X'] = AT_WORD,
	['b'] = AT_WORD, ['B'] = AT_WORD, ['M'] = AT_WORD, ['e'] = AT_WORD,
	['g'] = AT_WORD,
	['?'] = ANYWHERE, ['&'] = ANYWHERE, [':'] = ANYWHERE,
};

/* A copy of s with what needs hiding as "[redacted]", or NULL if none. */
char *
redact(const char *s)
{
	struct buf b;
	char *mask = NULL, *ret;
	size_t n, i, end;
	unsigned char c;

	if (s == NULL)
		return NULL;
	n = strlen(s);
	ours(s, n, &mask);
	pem_keys(s, n, &mask);
	for (i = 0; i < n; i++) {
		c = (unsigned char)s[i];
		if (starts[c] == 0 || (starts[c] == AT_WORD && i > 0 &&
		    isalnum((unsigned char)s[i - 1])))
			continue;
		end = 0;
		switch (c) {
		case 'a': case 'p': case 'P': case 'j': case 'J': case 'x':
		case 'X':
			header_value(s, n, i, &mask);
			break;
		case 'A':
			header_value(s, n, i, &mask);
			end = macaroon(s, n, i);
			break;
		case 'M':
			end = macaroon(s, n, i);
			break;
		case 'e':
			end = jwt(s, n, i);
			break;
		case 'g':
			end = vendor_token(s, n, i);
			break;
		case 'b': case 'B':
			bearer(s, n, i, &mask);
			break;
		case '?': case '&':
			query_param(s, n, i, &mask);
			break;
		case ':':
			if (n - i > 3 && s[i + 1] == '/' && s[i + 2] == '/')
				userinfo(s, n, i, &mask);
			break;
		}
		/* a whole token: nothing in it starts another */
		if (end > i) {
			mark(&mask, n, i, end);
			i = end - 1;
		}
	}
	if (mask == NULL)
		return NULL;
	/* every byte hidden on its own is the most it can grow */
	buf_init(&b, n * (sizeof(REDACTED) - 1) + 1);
	for (i = 0; i < n; i++) {
		if (!mask[i]) {
			buf_add(&b, s + i, 1);
			continue;
		}
		buf_addstr(&b, REDACTED);
		while (i + 1 < n && mask[i + 1])
			i++;
	}
	free(mask);
	ret = buf_detach(&b, NULL);
	return ret != NULL ? ret : xstrdup("");
}

/* A copy of s with what needs hiding as "[redacted]"; NULL for NULL. */
char *
redact_xstrdup(const char *s)
{
	char *r;

	if (s == NULL)
		return NULL;
	r = redact(s);
	return r != NULL ? r : xstrdup(s);
}
