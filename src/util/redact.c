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

struct secret {
	char *v;
	size_t len;
};

/* A ring: secrets[next] is the oldest once it is full. */
static struct secret secrets[REDACT_KEEP];
static size_t nsecrets, next_slot;
static pthread_rwlock_t secrets_lock = PTHREAD_RWLOCK_INITIALIZER;

/* Keep one value (the caller holds the write lock). */
static void
keep(const char *v, size_t len)
{
	struct secret *s;
	size_t i;

	if (len < REDACT_MIN_LEN)
		return;
	for (i = 0; i < nsecrets; i++)
		if (secrets[i].len == len && memcmp(secrets[i].v, v, len) == 0)
			return;
	s = &secrets[next_slot];
	if (s->v != NULL) {
		secure_wipe(s->v, s->len);
		free(s->v);
	}
	s->v = xstrndup(v, len);
	s->len = len;
	next_slot = (next_slot + 1) % REDACT_KEEP;
	/* read without the lock by ours() to skip the lock when empty */
	if (nsecrets < REDACT_KEEP)
		__atomic_store_n(&nsecrets, nsecrets + 1, __ATOMIC_RELAXED);
}

/* Keep v and, when it differs, v as it reads inside a JSON string. */
static void
keep_forms(const char *v, size_t len)
{
	struct buf b;
	size_t i;

	while (len > 0 && isspace((unsigned char)*v)) {
		v++;
		len--;
	}
	while (len > 0 && isspace((unsigned char)v[len - 1]))
		len--;
	if (len < REDACT_MIN_LEN)
		return;
	keep(v, len);
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
		keep(b.data, b.len);
	secure_wipe(b.data, b.len);
	buf_release(&b);
}

/* Register a secret value (the registry keeps a copy). */
void
redact_secret_add(const char *v, size_t len)
{
	const char *p, *nl, *end = v + len;

	if (v == NULL)
		return;
	pthread_rwlock_wrlock(&secrets_lock);
	keep_forms(v, len);
	/*
	 * Each line of a multi-line secret too (a PEM key): an error may
	 * quote one line. The armour lines are no secret.
	 */
	if (memchr(v, '\n', len) != NULL) {
		for (p = v; p < end; p = nl + 1) {
			nl = memchr(p, '\n', (size_t)(end - p));
			if (nl == NULL)
				nl = end;
			if (strncmp(p, "-----", 5) != 0)
				keep_forms(p, (size_t)(nl - p));
		}
	}
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
	}
	__atomic_store_n(&nsecrets, 0, __ATOMIC_RELAXED);
	next_slot = 0;
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
static const struct {
	const char *prefix;
	size_t min;	/* bytes after the prefix */
	int gitlab;	/* '-' and '.' in the body too */
} vendor_tokens[] = {
	{ "ghp_", 36, 0 }, { "gho_", 36, 0 }, { "ghu_", 36, 0 },
	{ "ghs_", 36, 0 }, { "ghr_", 36, 0 }, { "github_pat_", 22, 0 },
	{ "glpat-", 20, 1 }, { "gloas-", 20, 1 }, { "gldt-", 20, 1 },
	{ "glrt-", 20, 1 }, { "glrtr-", 20, 1 }, { "glcbt-", 20, 1 },
	{ "glptt-", 20, 1 }, { "glft-", 20, 1 }, { "glimt-", 20, 1 },
	{ "glagent-", 20, 1 }, { "glwt-", 20, 1 }, { "glsoat-", 20, 1 },
	{ "glffct-", 20, 1 },
};

/* A GitHub or GitLab token at s[i] ('g'): its end, or 0. */
static size_t
vendor_token(const char *s, size_t n, size_t i)
{
	size_t k, pl, j;
	int gl;

	/* a word start ("SIE-glpat-": an instance prefix is kept) */
	if (n - i < 5 || (s[i + 1] != 'h' && s[i + 1] != 'l' &&
	    s[i + 1] != 'i') || (i > 0 && isalnum((unsigned char)s[i - 1])))
		return 0;
	for (k = 0; k < ARRAY_SIZE(vendor_tokens); k++) {
		pl = strlen(vendor_tokens[k].prefix);
		if (n - i < pl || memcmp(s + i, vendor_tokens[k].prefix, pl))
			continue;
		gl = vendor_tokens[k].gitlab;
		for (j = i + pl; j < n && (isalnum((unsigned char)s[j]) ||
		    s[j] == '_' || (gl && (s[j] == '-' || s[j] == '.'))); j++)
			;
		while (j > i + pl && s[j - 1] == '.')	/* a full stop */
			j--;
		return j - i - pl >= vendor_tokens[k].min ? j : 0;
	}
	return 0;
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
 * A PEM private key (RFC 7468) at s[i] ('-'), its lines split by
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
	pthread_rwlock_unlock(&secrets_lock);
}

/* A copy of s with what needs hiding as "[redacted]", or NULL if none. */
char *
redact(const char *s)
{
	struct buf b;
	char *mask = NULL, *ret;
	size_t n, i, end;

	if (s == NULL)
		return NULL;
	n = strlen(s);
	ours(s, n, &mask);
	for (i = 0; i < n; i++) {
		end = 0;
		switch (s[i]) {
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
		case '-':
			if (n - i > 5 && s[i + 1] == '-')
				end = pem_key(s, n, i);
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
