/*
 * Macaroon tokens: the shared vectors both ways, tampering, our caveats
 * (expiry, task, namespace, models, numbers, syntax), limits, the
 * human-readable form and root key files.
 *
 * Tokens for the edge cases are built here by hand (build_v2 and chain
 * below follow reference/macaroons.md, independently of macaroon.c), so
 * that malformed or over-limit tokens can be made at all.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "meter/meter.h"
#include "util/util.h"
#include "testutil.h"

/* 2026-01-01T00:00:00Z */
#define NOW 1767225600
#define KEYGEN "macaroons-key-generator"

static const unsigned char K[32] = {
	0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17,
	0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
	0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27,
	0x28, 0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f,
};

/* TV-1 in V1 form (reference/macaroons.md section 3: libmacaroons, go). */
static const char TV1_V1[] =
    "MDAyNmxvY2F0aW9uIGh0dHBzOi8vZGl2ZXJnZWRldi5sb2NhbAowMDFkaWRlbnRpZmll"
    "ciBhZ2VudC10b2tlbi0xCjAwMTVjaWQgdGFza19pZCA9IHQxCjAwMjdjaWQgZXhwaXJl"
    "cyA9IDIwMjYtMTItMDFUMDA6MDA6MDBaCjAwMmZzaWduYXR1cmUgxDjShmCW8ena6C20"
    "nYq1scu1BsLhgBrlEkRMOahCUjIK";

static const struct macaroon_context CTX = { "t1", "ns1", "claude-3-7-sonnet",
	NOW };

/* ---- independent helpers ---- */

static void
chain(const void *key, size_t keylen, const char *id,
    const char *const *cavs, size_t n, unsigned char sig[32])
{
	unsigned char derived[32], next[32];
	size_t i;

	hmac_sha256(KEYGEN, strlen(KEYGEN), key, keylen, derived);
	hmac_sha256(derived, 32, id, strlen(id), sig);
	for (i = 0; i < n; i++) {
		hmac_sha256(sig, 32, cavs[i], strlen(cavs[i]), next);
		memcpy(sig, next, 32);
	}
}

static void
put_field(struct buf *b, unsigned char type, const void *d, size_t n)
{
	unsigned char v[10];
	size_t k = 0, len = n;

	buf_add(b, &type, 1);
	while (len >= 0x80) {
		v[k++] = (unsigned char)(len & 0x7f) | 0x80;
		len >>= 7;
	}
	v[k++] = (unsigned char)len;
	buf_add(b, v, k);
	buf_add(b, d, n);
}

/* The V2 binary of a macaroon with first-party caveats, into b. */
static void
build_bin(struct buf *b, const char *loc, const char *id,
    const char *const *cavs, size_t n, const unsigned char sig[32])
{
	static const unsigned char z = 0, two = 2;
	size_t i;

	buf_init(b, 64u << 20);
	buf_add(b, &two, 1);
	if (loc != NULL && *loc != '\0')
		put_field(b, 1, loc, strlen(loc));
	put_field(b, 2, id, strlen(id));
	buf_add(b, &z, 1);
	for (i = 0; i < n; i++) {
		put_field(b, 2, cavs[i], strlen(cavs[i]));
		buf_add(b, &z, 1);
	}
	buf_add(b, &z, 1);
	put_field(b, 6, sig, 32);
}

static char *
b64(const struct buf *b)
{
	return base64_encode((const unsigned char *)b->data, b->len, 1, 0);
}

/*
 * The V2 binary of a token (its signature not checked here) with one
 * third-party caveat whose vid is n bytes, into b.
 */
static void
third_party_bin(struct buf *b, size_t n)
{
	static const unsigned char z = 0, two = 2;
	unsigned char sig[32];
	char *vid = xmalloc(n);

	memset(vid, 'v', n);
	memset(sig, 'S', sizeof(sig));
	buf_init(b, 1 << 16);
	buf_add(b, &two, 1);
	put_field(b, 2, "i", 1);
	buf_add(b, &z, 1);
	put_field(b, 2, "c", 1);
	put_field(b, 4, vid, n);
	buf_add(b, &z, 1);
	buf_add(b, &z, 1);
	put_field(b, 6, sig, sizeof(sig));
	free(vid);
}

/* A correctly signed token under K. */
static char *
build_v2(const char *id, const char *const *cavs, size_t n)
{
	unsigned char sig[32];
	struct buf b;
	char *t;

	chain(K, 32, id, cavs, n, sig);
	build_bin(&b, "https://diverge.test", id, cavs, n, sig);
	t = b64(&b);
	buf_release(&b);
	return t;
}

/* Deserialize and verify token under K; the reason goes to *reason. */
static int
verify_token(const char *token, const struct macaroon_context *ctx,
    const char **reason)
{
	struct macaroon *m = NULL;
	char *cause = NULL;
	int rc;

	rc = macaroon_deserialize(token, strlen(token), &m, &cause);
	if (rc != 0) {
		*reason = macaroon_strerror(rc);
		free(cause);
		return rc;
	}
	rc = macaroon_verify(K, 32, m, ctx, reason);
	macaroon_free(m);
	return rc;
}

/* Mint with K, then verify with ctx: returns the reason. */
static const char *
check(const char *const *cavs, size_t n, const struct macaroon_context *ctx)
{
	char *token = NULL, *cause = NULL;
	const char *reason = NULL;

	assert_int_equal(macaroon_mint(K, 32, "id-1", "https://diverge.test",
	    cavs, n, &token, &cause), 0);
	verify_token(token, ctx, &reason);
	free(token);
	return reason;
}

/* check() with task_id = t1, namespace = ns1 and one more caveat. */
static const char *
check1(const char *extra, const struct macaroon_context *ctx)
{
	const char *cavs[] = { "task_id = t1", "namespace = ns1", extra };

	return check(cavs, extra != NULL ? 3 : 2, ctx);
}

static struct macaroon *
parse_ok(const char *token)
{
	struct macaroon *m = NULL;
	char *cause = NULL;

	if (macaroon_deserialize(token, strlen(token), &m, &cause) != 0) {
		fprintf(stderr, "# %s\n", cause);
		free(cause);
		fail();
	}
	return m;
}

/* Expect deserialization to fail with code; the cause starts with it. */
static void
parse_fails(const char *token, size_t len, int code)
{
	struct macaroon *m = NULL;
	char *cause = NULL;
	const char *want = macaroon_strerror(code);

	assert_int_equal(macaroon_deserialize(token, len, &m, &cause), code);
	assert_null(m);
	assert_non_null(cause);
	assert_memory_equal(cause, want, strlen(want));
	free(cause);
}

/* Parse the binary (base64url-encoded here), which must succeed. */
static struct macaroon *
parse_ok_bin(const char *bin)
{
	char *t = base64_encode((const unsigned char *)bin, strlen(bin), 1, 0);
	struct macaroon *m = parse_ok(t);

	free(t);
	return m;
}

/*
 * Expect the binary (base64url-encoded here) to fail with code and
 * exactly the cause "<code's text>: detail": each malformed input must be
 * refused by the check meant for it, not by a later one that happens to
 * catch it too.
 */
static void
parse_bin_fails_why(const char *name, const void *bin, size_t n, int code,
    const char *detail)
{
	char *t = base64_encode(bin, n, 1, 0), *cause = NULL, *want;
	struct macaroon *m = NULL;
	int rc;

	want = xasprintf("%s: %s", macaroon_strerror(code), detail);
	rc = macaroon_deserialize(t, strlen(t), &m, &cause);
	if (rc != code || cause == NULL || strcmp(cause, want) != 0)
		fail_msg("%s: %d '%s', expected %d '%s'", name, rc,
		    cause != NULL ? cause : "(none)", code, want);
	assert_null(m);
	free(want);
	free(cause);
	free(t);
}

static void
parse_bin_fails(const void *bin, size_t n, int code)
{
	char *t = base64_encode(bin, n, 1, 0);

	parse_fails(t, strlen(t), code);
	free(t);
}

static json_t *
load_vectors(void)
{
	size_t len;
	char *text = test_read_file("tests/data/vectors/macaroons.json",
	    &len);
	json_t *root = json_loadb(text, len, 0, NULL);

	free(text);
	assert_non_null(root);
	assert_int_equal(json_array_size(json_object_get(root, "vectors")),
	    4);
	return root;
}

/* The root key of a vector: ASCII or hex. */
static size_t
vector_key(json_t *v, unsigned char *key)
{
	const char *s = json_string_value(json_object_get(v, "root_key"));
	size_t n = 0;

	if (s != NULL) {
		memcpy(key, s, strlen(s));
		return strlen(s);
	}
	s = json_string_value(json_object_get(v, "root_key_hex"));
	assert_non_null(s);
	assert_int_equal(hex_decode(s, strlen(s), key, &n), 0);
	return n;
}

static double
elapsed_ms(const struct timespec *a)
{
	struct timespec b;

	clock_gettime(CLOCK_MONOTONIC, &b);
	return (double)(b.tv_sec - a->tv_sec) * 1e3 +
	    (double)(b.tv_nsec - a->tv_nsec) / 1e6;
}

/* ---- vectors ---- */

static void
vectors_mint(void **state)
{
	json_t *root = load_vectors(), *v, *c;
	size_t i, j;

	json_array_foreach(json_object_get(root, "vectors"), i, v) {
		unsigned char key[128];
		size_t keylen = vector_key(v, key);
		const char *cavs[8];
		size_t n = 0;
		char *token = NULL, *cause = NULL;

		json_array_foreach(json_object_get(v, "caveats"), j, c)
			cavs[n++] = json_string_value(c);
		assert_int_equal(macaroon_mint(key, keylen,
		    json_string_value(json_object_get(v, "identifier")),
		    json_string_value(json_object_get(v, "location")), cavs,
		    n, &token, &cause), 0);
		assert_string_equal(token, json_string_value(json_object_get(v,
		    "v2_base64url")));
		free(token);
	}
	json_decref(root);
}

static void
vectors_parse(void **state)
{
	json_t *root = load_vectors(), *v, *c;
	size_t i, j;

	json_array_foreach(json_object_get(root, "vectors"), i, v) {
		const char *tok = json_string_value(json_object_get(v,
		    "v2_base64url"));
		struct macaroon *m = parse_ok(tok);
		char hex[65], *again = NULL;
		size_t len;

		assert_int_equal(macaroon_version(m), 2);
		assert_string_equal(macaroon_identifier(m, &len),
		    json_string_value(json_object_get(v, "identifier")));
		assert_string_equal(macaroon_location(m, NULL),
		    json_string_value(json_object_get(v, "location")));
		assert_int_equal(macaroon_caveat_count(m), json_array_size(
		    json_object_get(v, "caveats")));
		json_array_foreach(json_object_get(v, "caveats"), j, c) {
			assert_string_equal(macaroon_caveat(m, j, NULL),
			    json_string_value(c));
			assert_false(macaroon_caveat_third_party(m, j));
		}
		assert_null(macaroon_caveat(m, j, NULL));
		hex_encode(macaroon_signature(m), 32, hex);
		assert_string_equal(hex, json_string_value(json_object_get(v,
		    "signature")));
		assert_int_equal(macaroon_serialize_v2(m, &again), 0);
		assert_string_equal(again, tok);
		free(again);
		macaroon_free(m);
	}
	json_decref(root);
}

static void
vectors_verify(void **state)
{
	/* what our verifier says of each vector: the signature holds */
	static const char *const want[] = { "unknown caveat",
	    "caveat not met: namespace", "unknown caveat",
	    "caveat not met: task_id" };
	struct macaroon_context ctx = { "t1", "ns1", NULL, NOW };
	json_t *root = load_vectors(), *v;
	size_t i;

	json_array_foreach(json_object_get(root, "vectors"), i, v) {
		unsigned char key[128];
		size_t keylen = vector_key(v, key);
		const char *tok = json_string_value(json_object_get(v,
		    "v2_base64url"));
		struct macaroon *m = parse_ok(tok);
		const char *reason = NULL;

		macaroon_verify(key, keylen, m, &ctx, &reason);
		assert_string_equal(reason, want[i]);
		key[0] ^= 1;
		assert_int_equal(macaroon_verify(key, keylen, m, &ctx,
		    &reason), MACAROON_EBADSIG);
		assert_string_equal(reason, "bad signature");
		macaroon_free(m);
	}
	json_decref(root);
}

static void
vector_empty_location(void **state)
{
	json_t *root = load_vectors(), *v;
	struct macaroon *m, *canon;
	char *again = NULL;
	size_t len = 99;

	v = json_array_get(json_object_get(root, "vectors"), 2);
	m = parse_ok(json_string_value(json_object_get(v,
	    "v2_base64url_with_empty_location")));
	canon = parse_ok(json_string_value(json_object_get(v,
	    "v2_base64url")));
	assert_string_equal(macaroon_location(m, &len), "");
	assert_int_equal(len, 0);
	assert_memory_equal(macaroon_signature(m), macaroon_signature(canon),
	    32);
	/* written back without the empty field */
	assert_int_equal(macaroon_serialize_v2(m, &again), 0);
	assert_string_equal(again, json_string_value(json_object_get(v,
	    "v2_base64url")));
	free(again);
	macaroon_free(m);
	macaroon_free(canon);
	json_decref(root);
}

static void
vector_v1(void **state)
{
	json_t *root = load_vectors(), *v;
	struct macaroon *m = parse_ok(TV1_V1);
	struct macaroon_context ctx = { "t1", "ns1", NULL, NOW };
	const char *reason = NULL;
	char hex[65], *again = NULL;

	v = json_array_get(json_object_get(root, "vectors"), 1);
	assert_int_equal(macaroon_version(m), 1);
	assert_string_equal(macaroon_identifier(m, NULL), "agent-token-1");
	assert_string_equal(macaroon_location(m, NULL),
	    "https://divergedev.local");
	assert_int_equal(macaroon_caveat_count(m), 2);
	assert_string_equal(macaroon_caveat(m, 1, NULL),
	    "expires = 2026-12-01T00:00:00Z");
	hex_encode(macaroon_signature(m), 32, hex);
	assert_string_equal(hex, json_string_value(json_object_get(v,
	    "signature")));
	/* V1 in, V2 out */
	assert_int_equal(macaroon_serialize_v2(m, &again), 0);
	assert_string_equal(again, json_string_value(json_object_get(v,
	    "v2_base64url")));
	/* it verifies (up to its missing namespace) */
	macaroon_verify((const unsigned char *)
	    "divergedev-macaroon-test-key-001", 32, m, &ctx, &reason);
	assert_string_equal(reason, "caveat not met: namespace");
	free(again);
	macaroon_free(m);
	json_decref(root);
}

/* "refused tok, retry" redacted is "refused [redacted], retry". */
static void
redacted_in_text(const char *tok)
{
	char *line = xasprintf("refused %s, retry", tok), *r = redact(line);

	assert_non_null(r);
	assert_string_equal(r, "refused [redacted], retry");
	free(r);
	free(line);
}

/* redacted_in_text() of tok, and of tok in base64's standard alphabet. */
static void
redacted_both_alphabets(const char *tok)
{
	unsigned char *raw = NULL;
	size_t rawlen = 0;
	char *std;

	redacted_in_text(tok);
	assert_int_equal(base64_decode(tok, strlen(tok), &raw, &rawlen), 0);
	std = base64_encode(raw, rawlen, 0, 1);
	redacted_in_text(std);
	free(std);
	free(raw);
}

/*
 * Tokens are not registered secrets (one per task), yet quoted anywhere
 * they are redacted by their shape: the vectors in both alphabets, padded
 * or not, V1, and what macaroon_mint() writes, down to the smallest.
 */
static void
redact_shape(void **state)
{
	json_t *root = load_vectors(), *v;
	const char *cavs[] = { "task_id = t1", "namespace = ns1" };
	size_t i;
	char *tok = NULL;

	(void)state;
	redact_secrets_clear();
	json_array_foreach(json_object_get(root, "vectors"), i, v) {
		const char *t = json_string_value(json_object_get(v,
		    "v2_base64url_with_empty_location"));

		redacted_both_alphabets(json_string_value(json_object_get(v,
		    "v2_base64url")));
		if (t != NULL)
			redacted_in_text(t);
	}
	redacted_both_alphabets(TV1_V1);
	assert_int_equal(macaroon_mint(K, 32, "i", NULL, NULL, 0, &tok, NULL),
	    0);
	redacted_in_text(tok);
	free(tok);
	assert_int_equal(macaroon_mint(K, 32, "agent-token-1",
	    "https://diverge.test", cavs, 2, &tok, NULL), 0);
	redacted_in_text(tok);
	free(tok);
	json_decref(root);
}

static void
base64_variants(void **state)
{
	json_t *root = load_vectors(), *v;
	size_t i;

	json_array_foreach(json_object_get(root, "vectors"), i, v) {
		const char *tok = json_string_value(json_object_get(v,
		    "v2_base64url"));
		unsigned char *raw = NULL;
		size_t rawlen = 0, k;
		char *variants[5];
		struct macaroon *ref = parse_ok(tok);

		assert_int_equal(base64_decode(tok, strlen(tok), &raw,
		    &rawlen), 0);
		variants[0] = base64_encode(raw, rawlen, 0, 1);
		variants[1] = base64_encode(raw, rawlen, 0, 0);
		variants[2] = base64_encode(raw, rawlen, 1, 1);
		variants[3] = xasprintf("  %s\r\n", tok);
		variants[4] = xasprintf("%s\n", variants[0]);
		for (k = 0; k < ARRAY_SIZE(variants); k++) {
			struct macaroon *m = parse_ok(variants[k]);

			assert_memory_equal(macaroon_signature(m),
			    macaroon_signature(ref), 32);
			assert_int_equal(macaroon_caveat_count(m),
			    macaroon_caveat_count(ref));
			macaroon_free(m);
			free(variants[k]);
		}
		macaroon_free(ref);
		free(raw);
	}
	json_decref(root);
}

/* ---- our tokens ---- */

static void
mint_and_read_back(void **state)
{
	const char *cavs[] = { "task_id = t1", "namespace = ns1",
	    "repo = acme/shop", "branch = diverge/t1",
	    "tools = bash, git,edit", "models = claude-*,gpt-4o",
	    "max_cost_usd = 5.00", "max_tokens = 200000",
	    "expires = 2026-01-01T01:00:00Z" };
	const char *const *list;
	struct macaroon *m;
	const char *reason = NULL;
	char *token = NULL;
	int64_t v = 0;

	assert_int_equal(macaroon_mint(K, 32, "id-1", NULL, cavs,
	    ARRAY_SIZE(cavs), &token, NULL), 0);
	m = parse_ok(token);
	assert_int_equal(macaroon_verify(K, 32, m, &CTX, &reason), 0);
	assert_string_equal(reason, "ok");
	assert_string_equal(macaroon_location(m, NULL), "");
	assert_string_equal(macaroon_value(m, "task_id"), "t1");
	assert_string_equal(macaroon_value(m, "repo"), "acme/shop");
	assert_string_equal(macaroon_value(m, "branch"), "diverge/t1");
	assert_null(macaroon_value(m, "colour"));
	assert_int_equal(macaroon_max_cost_usd(m, &v), 0);
	assert_int_equal(v, 5000000);
	assert_int_equal(macaroon_max_tokens(m, &v), 0);
	assert_int_equal(v, 200000);
	assert_int_equal(macaroon_expires(m, &v), 0);
	assert_int_equal(v, NOW + 3600);
	list = macaroon_tools(m);
	assert_non_null(list);
	assert_string_equal(list[0], "bash");
	assert_string_equal(list[1], "git");
	assert_string_equal(list[2], "edit");
	assert_null(list[3]);
	list = macaroon_models(m);
	assert_string_equal(list[0], "claude-*");
	assert_string_equal(list[1], "gpt-4o");
	assert_null(list[2]);
	assert_true(macaroon_allows_model(m, "gpt-4o"));
	assert_false(macaroon_allows_model(m, "gpt-4o-mini"));
	macaroon_free(m);
	free(token);

	/* absent caveats: accessors say so and leave out alone */
	assert_int_equal(macaroon_mint(K, 32, "id-2", "", cavs, 2, &token,
	    NULL), 0);
	m = parse_ok(token);
	v = 42;
	assert_int_equal(macaroon_max_cost_usd(m, &v), -1);
	assert_int_equal(macaroon_max_tokens(m, &v), -1);
	assert_int_equal(macaroon_expires(m, &v), -1);
	assert_int_equal(v, 42);
	assert_null(macaroon_models(m));
	assert_null(macaroon_tools(m));
	assert_true(macaroon_allows_model(m, "anything"));
	assert_false(macaroon_allows_model(m, ""));
	macaroon_free(m);
	free(token);
}

static void
mint_matches_hand_built(void **state)
{
	const char *cavs[] = { "task_id = t1", "namespace = ns1" };
	char *mine = build_v2("id-1", cavs, 2), *token = NULL;

	assert_int_equal(macaroon_mint(K, 32, "id-1", "https://diverge.test",
	    cavs, 2, &token, NULL), 0);
	assert_string_equal(token, mine);
	free(mine);
	free(token);
}

/* Every single-bit flip of the binary fails, never verifies. */
static void
tamper_binary_bits(void **state)
{
	const char *cavs[] = { "task_id = t1", "namespace = ns1",
	    "models = claude-*" };
	unsigned char sig[32];
	unsigned char *raw;
	size_t rawlen, i;
	int bit, sigfail = 0;
	struct buf b;

	/* no location: it is the one field the signature does not cover */
	chain(K, 32, "id-1", cavs, 3, sig);
	build_bin(&b, NULL, "id-1", cavs, 3, sig);
	raw = (unsigned char *)b.data;
	rawlen = b.len;
	for (i = 0; i < rawlen; i++) {
		for (bit = 0; bit < 8; bit++) {
			const char *reason = NULL;
			char *t;
			int rc;

			raw[i] ^= (unsigned char)(1 << bit);
			t = base64_encode(raw, rawlen, 1, 0);
			rc = verify_token(t, &CTX, &reason);
			assert_int_not_equal(rc, 0);
			if (rc == MACAROON_EBADSIG)
				sigfail++;
			raw[i] ^= (unsigned char)(1 << bit);
			free(t);
		}
	}
	/* the content bytes (id, caveats, signature) give bad signature */
	assert_true(sigfail >= (int)(8 * (4 + 12 + 15 + 17 + 32)));
	assert_string_equal(check(cavs, 3, &CTX), "ok");
	buf_release(&b);
}

/* Every character substitution in the base64 text fails. */
static void
tamper_base64_chars(void **state)
{
	static const char alpha[] = "Aa0_-+/=Zz9";
	const char *cavs[] = { "task_id = t1", "namespace = ns1" };
	unsigned char sig[32];
	struct buf b;
	char *token;
	size_t i, len, k;

	chain(K, 32, "id-1", cavs, 2, sig);
	build_bin(&b, NULL, "id-1", cavs, 2, sig);
	token = b64(&b);
	buf_release(&b);
	len = strlen(token);

	for (i = 0; i < len; i++) {
		char saved = token[i];

		for (k = 0; k < sizeof(alpha) - 1; k++) {
			const char *reason = NULL;
			int rc;

			if (alpha[k] == saved || (saved == '-' &&
			    alpha[k] == '+') || (saved == '_' &&
			    alpha[k] == '/'))
				continue;	/* the same bits */
			token[i] = alpha[k];
			rc = verify_token(token, &CTX, &reason);
			if (rc == 0) {
				/* only the unused low bits of the last char */
				assert_int_equal(i, len - 1);
			}
			token[i] = saved;
		}
	}
	free(token);
}

static void
tamper_fields(void **state)
{
	const char *cavs[] = { "task_id = t1", "namespace = ns1" };
	const char *other[] = { "task_id = t2", "namespace = ns1" };
	const char *fewer[] = { "namespace = ns1" };
	const char *more[] = { "task_id = t1", "namespace = ns1",
	    "max_tokens = 5" };
	unsigned char sig[32];
	const char *reason = NULL;
	struct buf b;
	char *t;

	chain(K, 32, "id-1", cavs, 2, sig);
	/* another caveat, identifier, location-free copy, dropped caveat */
	build_bin(&b, NULL, "id-1", other, 2, sig);
	t = b64(&b);
	assert_int_equal(verify_token(t, &CTX, &reason), MACAROON_EBADSIG);
	free(t);
	buf_release(&b);
	build_bin(&b, NULL, "id-2", cavs, 2, sig);
	t = b64(&b);
	assert_int_equal(verify_token(t, &CTX, &reason), MACAROON_EBADSIG);
	free(t);
	buf_release(&b);
	build_bin(&b, NULL, "id-1", fewer, 1, sig);
	t = b64(&b);
	assert_int_equal(verify_token(t, &CTX, &reason), MACAROON_EBADSIG);
	free(t);
	buf_release(&b);
	/* a caveat added without chaining the signature */
	build_bin(&b, NULL, "id-1", more, 3, sig);
	t = b64(&b);
	assert_int_equal(verify_token(t, &CTX, &reason), MACAROON_EBADSIG);
	free(t);
	buf_release(&b);
	/* the location is not signed: a different one still verifies */
	build_bin(&b, "https://elsewhere", "id-1", cavs, 2, sig);
	t = b64(&b);
	assert_int_equal(verify_token(t, &CTX, &reason), 0);
	free(t);
	buf_release(&b);
}

/* A holder may add caveats (chaining the signature): they all hold. */
static void
attenuation(void **state)
{
	const char *cavs[] = { "task_id = t1", "namespace = ns1",
	    "models = gpt-4o" };
	struct macaroon_context ctx = CTX;
	const char *reason = NULL;
	unsigned char sig[32];
	struct buf b;
	char *t;

	chain(K, 32, "id-1", cavs, 3, sig);
	build_bin(&b, NULL, "id-1", cavs, 3, sig);
	t = b64(&b);
	assert_int_equal(verify_token(t, &ctx, &reason), MACAROON_EMODEL);
	ctx.model = "gpt-4o";
	assert_int_equal(verify_token(t, &ctx, &reason), 0);
	free(t);
	buf_release(&b);
}

static void
truncated(void **state)
{
	const char *cavs[] = { "task_id = t1", "namespace = ns1" };
	char *token = build_v2("id-1", cavs, 2);
	unsigned char *raw = NULL;
	size_t rawlen = 0, i;

	assert_int_equal(base64_decode(token, strlen(token), &raw, &rawlen),
	    0);
	for (i = 0; i < rawlen; i++)
		parse_bin_fails(raw, i, MACAROON_EMALFORMED);
	free(raw);
	free(token);
}

/* ---- expiry ---- */

static void
expired(void **state)
{
	struct macaroon_context ctx = CTX;

	assert_string_equal(check1("expires = 2025-12-31T23:58:20Z", &ctx),
	    "expired");
	assert_string_equal(check1("expires = 2030-01-01T00:00:00Z", &ctx),
	    "ok");
	/* an expired token is refused even when its task is wrong */
	ctx.task_id = "t2";
	assert_string_equal(check1("expires = 2020-01-01T00:00:00Z", &ctx),
	    "expired");
}

static void
expiry_leeway(void **state)
{
	struct macaroon_context ctx = CTX;
	const char *e = "expires = 2026-01-01T00:00:00Z";	/* = NOW */

	ctx.now = NOW - 1;
	assert_string_equal(check1(e, &ctx), "ok");
	ctx.now = NOW;
	assert_string_equal(check1(e, &ctx), "ok");
	ctx.now = NOW + MACAROON_EXPIRES_LEEWAY - 1;
	assert_string_equal(check1(e, &ctx), "ok");
	ctx.now = NOW + MACAROON_EXPIRES_LEEWAY;
	assert_string_equal(check1(e, &ctx), "expired");
	ctx.now = NOW + 3600;
	assert_string_equal(check1(e, &ctx), "expired");
}

static void
expiry_formats(void **state)
{
	static const struct {
		const char *caveat;
		int ok;
		int64_t when;
	} rows[] = {
		{ "expires = 2026-01-01T00:00:10Z", 1, NOW + 10 },
		{ "expires = 2026-01-01T00:00:10.999Z", 1, NOW + 10 },
		{ "expires = 2026-01-01t00:00:10z", 1, NOW + 10 },
		{ "expires = 2028-02-29T00:00:00Z", 1, 1835395200 },
		{ "expires = 2000-02-29T23:59:60Z", 1, 951868800 },
		{ "expires = 1970-01-01T00:00:00Z", 1, 0 },
		{ "expires = 2026-01-01T00:00:10+00:00", 0, 0 },
		{ "expires = 2026-01-01 00:00:10Z", 0, 0 },
		{ "expires = 2026-01-01T00:00:10", 0, 0 },
		{ "expires = 2027-02-29T00:00:00Z", 0, 0 },
		{ "expires = 2100-02-29T00:00:00Z", 0, 0 },
		{ "expires = 2026-13-01T00:00:00Z", 0, 0 },
		{ "expires = 2026-00-01T00:00:00Z", 0, 0 },
		{ "expires = 2026-04-31T00:00:00Z", 0, 0 },
		{ "expires = 2026-01-01T24:00:00Z", 0, 0 },
		{ "expires = 2026-01-01T00:60:00Z", 0, 0 },
		{ "expires = 2026-01-01T00:00:10.Z", 0, 0 },
		{ "expires = 2026-1-01T00:00:10Z", 0, 0 },
		{ "expires = 1767225610", 0, 0 },
		{ "expires = tomorrow", 0, 0 },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(rows); i++) {
		const char *cavs[] = { "task_id = t1", "namespace = ns1",
		    rows[i].caveat };
		const char *reason = NULL;
		char *token = NULL;
		struct macaroon *m;
		int64_t v = -7;

		assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 3,
		    &token, NULL), 0);
		m = parse_ok(token);
		if (rows[i].ok) {
			assert_int_equal(macaroon_expires(m, &v), 0);
			assert_int_equal(v, rows[i].when);
		} else {
			if (macaroon_expires(m, &v) != -1)
				fail_msg("%s parsed", rows[i].caveat);
			assert_int_equal(v, -7);
			assert_int_equal(macaroon_verify(K, 32, m, &CTX,
			    &reason), MACAROON_ENOTMET);
			assert_string_equal(reason,
			    "caveat not met: expires");
		}
		macaroon_free(m);
		free(token);
	}
}

/* ---- task and namespace ---- */

static void
wrong_task(void **state)
{
	struct macaroon_context ctx = CTX;

	ctx.task_id = "t2";
	assert_string_equal(check1(NULL, &ctx), "caveat not met: task_id");
	ctx.task_id = "t";
	assert_string_equal(check1(NULL, &ctx), "caveat not met: task_id");
	ctx.task_id = "t11";
	assert_string_equal(check1(NULL, &ctx), "caveat not met: task_id");
	ctx.task_id = NULL;
	assert_string_equal(check1(NULL, &ctx), "caveat not met: task_id");
	ctx.task_id = "";
	assert_string_equal(check1(NULL, &ctx), "caveat not met: task_id");
}

static void
wrong_namespace(void **state)
{
	struct macaroon_context ctx = CTX;

	ctx.namespace = "default";
	assert_string_equal(check1(NULL, &ctx),
	    "caveat not met: namespace");
	ctx.namespace = NULL;
	assert_string_equal(check1(NULL, &ctx),
	    "caveat not met: namespace");
}

static void
task_and_namespace_required(void **state)
{
	const char *only_ns[] = { "namespace = ns1" };
	const char *only_task[] = { "task_id = t1" };
	const char *reason = NULL;
	struct macaroon *m;
	char *token = NULL;

	assert_string_equal(check(only_ns, 1, &CTX),
	    "caveat not met: task_id");
	assert_string_equal(check(only_task, 1, &CTX),
	    "caveat not met: namespace");
	assert_string_equal(check(NULL, 0, &CTX), "caveat not met: task_id");
	/* a NULL context refuses everything */
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, only_task, 1,
	    &token, NULL), 0);
	m = parse_ok(token);
	assert_int_equal(macaroon_verify(K, 32, m, NULL, &reason),
	    MACAROON_ENOTMET);
	assert_int_equal(macaroon_verify(K, 32, NULL, &CTX, &reason),
	    MACAROON_EMALFORMED);
	assert_string_equal(reason, "malformed token");
	/* a short key never verifies */
	assert_int_equal(macaroon_verify(K, 8, m, &CTX, &reason),
	    MACAROON_EBADSIG);
	macaroon_free(m);
	free(token);
	/* not even one signed with that short key */
	{
		const char *both[] = { "task_id = t1", "namespace = ns1" };
		unsigned char sig[32];
		struct buf b;

		chain(K, 8, "id", both, 2, sig);
		build_bin(&b, NULL, "id", both, 2, sig);
		token = b64(&b);
		buf_release(&b);
		m = parse_ok(token);
		assert_int_equal(macaroon_verify(K, 8, m, &CTX, &reason),
		    MACAROON_EBADSIG);
		assert_int_equal(macaroon_verify(K, MACAROON_MIN_KEY_LEN - 1,
		    m, &CTX, &reason), MACAROON_EBADSIG);
		macaroon_free(m);
		free(token);
		/* at the minimum length, the same construction verifies */
		chain(K, MACAROON_MIN_KEY_LEN, "id", both, 2, sig);
		build_bin(&b, NULL, "id", both, 2, sig);
		token = b64(&b);
		buf_release(&b);
		m = parse_ok(token);
		assert_int_equal(macaroon_verify(K, MACAROON_MIN_KEY_LEN, m,
		    &CTX, &reason), 0);
		macaroon_free(m);
		free(token);
	}
}

/* ---- models ---- */

static void
models_exact(void **state)
{
	struct macaroon_context ctx = CTX;

	ctx.model = "gpt-4o";
	assert_string_equal(check1("models = gpt-4o", &ctx), "ok");
	ctx.model = "gpt-4o-mini";
	assert_string_equal(check1("models = gpt-4o", &ctx),
	    "caveat not met: models");
	ctx.model = "GPT-4o";
	assert_string_equal(check1("models = gpt-4o", &ctx),
	    "caveat not met: models");
}

static void
models_prefix(void **state)
{
	struct macaroon_context ctx = CTX;

	ctx.model = "claude-3-7-sonnet";
	assert_string_equal(check1("models = claude-*", &ctx), "ok");
	ctx.model = "claude-";
	assert_string_equal(check1("models = claude-*", &ctx), "ok");
	ctx.model = "claude";
	assert_string_equal(check1("models = claude-*", &ctx),
	    "caveat not met: models");
	ctx.model = "Claude-3";
	assert_string_equal(check1("models = claude-*", &ctx),
	    "caveat not met: models");
	ctx.model = "xclaude-3";
	assert_string_equal(check1("models = claude-*", &ctx),
	    "caveat not met: models");
}

static void
models_list(void **state)
{
	const char *m = "models = gpt-4o, claude-3-*,o3";
	struct macaroon_context ctx = CTX;

	ctx.model = "gpt-4o";
	assert_string_equal(check1(m, &ctx), "ok");
	ctx.model = "claude-3-5-haiku";
	assert_string_equal(check1(m, &ctx), "ok");
	ctx.model = "o3";
	assert_string_equal(check1(m, &ctx), "ok");
	ctx.model = "claude-4";
	assert_string_equal(check1(m, &ctx), "caveat not met: models");
	/* several models caveats: the model must satisfy each */
	{
		const char *cavs[] = { "task_id = t1", "namespace = ns1",
		    "models = claude-*", "models = claude-*",
		    "models = gpt-4o, claude-4" };
		struct macaroon *mac;
		char *token = NULL;

		ctx.model = "claude-4";
		assert_string_equal(check(cavs, 4, &ctx), "ok");
		assert_string_equal(check(cavs, 5, &ctx), "ok");
		ctx.model = "claude-3";
		assert_string_equal(check(cavs, 4, &ctx), "ok");
		assert_string_equal(check(cavs, 5, &ctx),
		    "caveat not met: models");
		ctx.model = "gpt-4o";
		assert_string_equal(check(cavs, 5, &ctx),
		    "caveat not met: models");
		assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 5,
		    &token, NULL), 0);
		mac = parse_ok(token);
		assert_null(macaroon_models(mac));
		assert_true(macaroon_allows_model(mac, "claude-4"));
		assert_false(macaroon_allows_model(mac, "claude-3"));
		macaroon_free(mac);
		free(token);
	}
}

static void
models_missing_or_empty(void **state)
{
	struct macaroon_context ctx = CTX;
	struct macaroon *m;
	char *token = NULL;
	const char *cavs[] = { "task_id = t1", "namespace = ns1",
	    "models = , ," };

	/* "" never matches; NULL means the request has no model */
	ctx.model = "";
	assert_string_equal(check1("models = claude-*", &ctx),
	    "caveat not met: models");
	assert_string_equal(check1("models = *", &ctx),
	    "caveat not met: models");
	ctx.model = NULL;
	assert_string_equal(check1("models = claude-*", &ctx), "ok");
	/* no models caveat: any model */
	ctx.model = "whatever-1";
	assert_string_equal(check1(NULL, &ctx), "ok");
	/* an empty list allows nothing */
	ctx.model = "claude-3";
	assert_string_equal(check(cavs, 3, &ctx), "caveat not met: models");
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 3, &token,
	    NULL), 0);
	m = parse_ok(token);
	assert_non_null(macaroon_models(m));
	assert_null(macaroon_models(m)[0]);
	assert_false(macaroon_allows_model(m, "claude-3"));
	macaroon_free(m);
	free(token);
	/* "models = " (no value) is not even a caveat of ours */
	assert_string_equal(check1("models = ", &ctx), "unknown caveat");
}

static void
models_star(void **state)
{
	struct macaroon_context ctx = CTX;

	ctx.model = "anything-at-all";
	assert_string_equal(check1("models = *", &ctx), "ok");
	/* '*' only at the end of an entry: otherwise the caveat is bad */
	assert_string_equal(check1("models = claude-*-sonnet", &ctx),
	    "caveat not met: models");
	assert_string_equal(check1("models = *-sonnet", &ctx),
	    "caveat not met: models");
	ctx.model = "claude-*-sonnet";
	assert_string_equal(check1("models = claude-**", &ctx),
	    "caveat not met: models");
	/* asked directly, such a token allows no model either */
	{
		const char *cavs[] = { "task_id = t1", "models = claude-*-x" };
		struct macaroon *m;
		char *token = NULL;

		assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 2,
		    &token, NULL), 0);
		m = parse_ok(token);
		assert_false(macaroon_allows_model(m, "claude-3"));
		assert_false(macaroon_allows_model(m, "claude-*-x"));
		macaroon_free(m);
		free(token);
	}
	assert_int_equal(macaroon_model_match("*", "x"), 1);
	assert_int_equal(macaroon_model_match("*", ""), 0);
	assert_int_equal(macaroon_model_match("*", NULL), 0);
	assert_int_equal(macaroon_model_match("", "x"), 0);
	assert_int_equal(macaroon_model_match(NULL, "x"), 0);
	assert_int_equal(macaroon_model_match("claude-*", "claude-3"), 1);
	assert_int_equal(macaroon_model_match("claude-3", "claude-3"), 1);
	assert_int_equal(macaroon_model_match("claude-3", "claude-3x"), 0);
}

/* A bad models caveat is a token problem, not a model refusal. */
static void
models_precedence(void **state)
{
	struct macaroon_context ctx = CTX;

	ctx.model = "gpt-4o";
	ctx.task_id = "t9";
	/* task first, then the model */
	assert_string_equal(check1("models = claude-*", &ctx),
	    "caveat not met: task_id");
	ctx.task_id = "t1";
	ctx.now = NOW + 86400 * 400;
	{
		const char *cavs[] = { "task_id = t1", "namespace = ns1",
		    "models = claude-*", "expires = 2026-06-01T00:00:00Z" };

		assert_string_equal(check(cavs, 4, &ctx), "expired");
	}
}

/* ---- caveat syntax ---- */

static void
unknown_caveats(void **state)
{
	static const char *const bad[] = {
		"colour = red",
		"time < 2030-01-01T00:00",
		"task_id=t1",
		"task_id =t1",
		"task_id= t1",
		"task_id  = t1",
		"task_id =  t1",
		"task_id = t1 ",
		" task_id = t1",
		"task_id = ",
		"Task_id = t1",
		"TASK_ID = t1",
		"task-id = t1",
		"task_id = t1\n",
		"task_id = t\tb",
		"task_id = t\x7f",
		"= t1",
		"9key = 1",
		/* the start of a known key is not that key */
		"task = t1",
		"task_i = t1",
		"namespac = ns1",
		"max_cost = 1",
		"model = claude-3-7-sonnet",
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		const char *r = check1(bad[i], &CTX);

		if (strcmp(r, "unknown caveat") != 0)
			fail_msg("%s: %s", bad[i], r);
	}
	/* a value may contain " = " and UTF-8 */
	assert_string_equal(check1("repo = a = b", &CTX), "ok");
	assert_string_equal(check1("branch = caf\xc3\xa9", &CTX), "ok");
}

/* Several caveats with one key: all hold; extracted values agree. */
static void
duplicate_keys(void **state)
{
	const char *same[] = { "task_id = t1", "namespace = ns1",
	    "task_id = t1", "max_tokens = 10", "max_tokens = 10" };
	const char *diff_task[] = { "task_id = t1", "namespace = ns1",
	    "task_id = t2" };
	const char *diff_ns[] = { "task_id = t1", "namespace = ns2",
	    "namespace = ns1" };
	const char *diff_tokens[] = { "task_id = t1", "namespace = ns1",
	    "max_tokens = 10", "max_tokens = 5" };
	const char *diff_cost[] = { "task_id = t1", "namespace = ns1",
	    "max_cost_usd = 1", "max_cost_usd = 1.00" };
	const char *diff_repo[] = { "task_id = t1", "namespace = ns1",
	    "repo = a/b", "repo = a/c" };
	const char *two_expires[] = { "task_id = t1", "namespace = ns1",
	    "expires = 2030-01-01T00:00:00Z",
	    "expires = 2026-01-01T00:10:00Z" };
	const char *bad_second[] = { "task_id = t1", "namespace = ns1",
	    "expires = 2030-01-01T00:00:00Z", "expires = soon" };
	struct macaroon_context ctx = CTX;
	char *token = NULL;
	struct macaroon *m;
	int64_t v = 0;

	assert_string_equal(check(same, 5, &CTX), "ok");
	assert_string_equal(check(diff_task, 3, &CTX),
	    "caveat not met: task_id");
	ctx.task_id = "t2";
	assert_string_equal(check(diff_task, 3, &ctx),
	    "caveat not met: task_id");
	assert_string_equal(check(diff_ns, 3, &CTX),
	    "caveat not met: namespace");
	assert_string_equal(check(diff_tokens, 4, &CTX),
	    "caveat not met: max_tokens");
	/* the text is compared: equal amounts written apart still conflict */
	assert_string_equal(check(diff_cost, 4, &CTX),
	    "caveat not met: max_cost_usd");
	assert_string_equal(check(diff_repo, 4, &CTX),
	    "caveat not met: repo");
	assert_string_equal(check(bad_second, 4, &CTX),
	    "caveat not met: expires");
	/* the earliest expiry counts */
	assert_string_equal(check(two_expires, 4, &CTX), "ok");
	ctx = CTX;
	ctx.now = NOW + 600 + MACAROON_EXPIRES_LEEWAY;
	assert_string_equal(check(two_expires, 4, &ctx), "expired");
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, two_expires, 4,
	    &token, NULL), 0);
	m = parse_ok(token);
	assert_int_equal(macaroon_expires(m, &v), 0);
	assert_int_equal(v, NOW + 600);
	assert_null(macaroon_value(m, "expires"));
	macaroon_free(m);
	free(token);
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, diff_tokens, 4,
	    &token, NULL), 0);
	m = parse_ok(token);
	assert_null(macaroon_value(m, "max_tokens"));
	assert_int_equal(macaroon_max_tokens(m, &v), -1);
	assert_string_equal(macaroon_value(m, "task_id"), "t1");
	macaroon_free(m);
	free(token);
}

static void
cost_values(void **state)
{
	static const struct {
		const char *v;
		int64_t micro;	/* -1: invalid */
	} rows[] = {
		{ "5.00", 5000000 }, { "5", 5000000 }, { "0", 0 },
		{ "0.000001", 1 }, { "12.5", 12500000 },
		{ "1.234567", 1234567 }, { "007.10", 7100000 },
		{ "9223372036854.775807", INT64_MAX },
		{ "9223372036854.775808", -1 }, { "9223372036855", -1 },
		{ "99999999999999999999", -1 },
		{ "9223372036853.999999", 9223372036853999999 },
		{ "1.2345678", -1 }, { "-1", -1 }, { "+1", -1 },
		{ "1e3", -1 }, { ".5", -1 }, { "5.", -1 }, { "5,00", -1 },
		{ "$5", -1 }, { "5 USD", -1 }, { "0x10", -1 },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(rows); i++) {
		char *c = xasprintf("max_cost_usd = %s", rows[i].v);
		const char *cavs[] = { "task_id = t1", "namespace = ns1", c };
		char *token = NULL;
		struct macaroon *m;
		const char *reason = NULL;
		int64_t v = -5;

		assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 3,
		    &token, NULL), 0);
		m = parse_ok(token);
		macaroon_verify(K, 32, m, &CTX, &reason);
		if (rows[i].micro >= 0) {
			assert_int_equal(macaroon_max_cost_usd(m, &v), 0);
			assert_int_equal(v, rows[i].micro);
			assert_string_equal(reason, "ok");
		} else {
			if (macaroon_max_cost_usd(m, &v) != -1)
				fail_msg("%s parsed as %lld", rows[i].v,
				    (long long)v);
			assert_string_equal(reason,
			    "caveat not met: max_cost_usd");
		}
		macaroon_free(m);
		free(token);
		free(c);
	}
}

static void
token_values(void **state)
{
	int64_t v = 0;
	struct macaroon *m;
	char *token = NULL;
	const char *cavs[] = { "task_id = t1", "namespace = ns1",
	    "max_tokens = 9223372036854775807" };

	assert_string_equal(check1("max_tokens = 200000", &CTX), "ok");
	assert_string_equal(check1("max_tokens = 0", &CTX), "ok");
	assert_string_equal(check1("max_tokens = 9223372036854775808", &CTX),
	    "caveat not met: max_tokens");
	assert_string_equal(check1("max_tokens = 1.5", &CTX),
	    "caveat not met: max_tokens");
	assert_string_equal(check1("max_tokens = -3", &CTX),
	    "caveat not met: max_tokens");
	assert_string_equal(check1("max_tokens = lots", &CTX),
	    "caveat not met: max_tokens");
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 3, &token,
	    NULL), 0);
	m = parse_ok(token);
	assert_int_equal(macaroon_max_tokens(m, &v), 0);
	assert_int_equal(v, INT64_MAX);
	macaroon_free(m);
	free(token);
}

static void
tools_values(void **state)
{
	const char *cavs[] = { "task_id = t1", "namespace = ns1",
	    "tools = ,bash,,  git  ,*" };
	const char *const *list;
	struct macaroon *m;
	char *token = NULL;

	assert_string_equal(check(cavs, 3, &CTX), "ok");
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 3, &token,
	    NULL), 0);
	m = parse_ok(token);
	list = macaroon_tools(m);
	assert_string_equal(list[0], "bash");
	assert_string_equal(list[1], "git");
	assert_string_equal(list[2], "*");
	assert_null(list[3]);
	macaroon_free(m);
	free(token);
}

/* Third-party caveats parse and show but never verify. */
static void
third_party(void **state)
{
	static const unsigned char z = 0, two = 2;
	const char *cavs[] = { "task_id = t1", "namespace = ns1" };
	unsigned char sig[32], h[64], next[32], vid[72];
	const char *cid = "3p-caveat-id-1", *reason = NULL;
	struct macaroon *m;
	struct buf b, text;
	char *t, *again = NULL;

	memset(vid, 0xab, sizeof(vid));
	chain(K, 32, "id-1", cavs, 2, sig);
	hmac_sha256(sig, 32, vid, sizeof(vid), h);
	hmac_sha256(sig, 32, cid, strlen(cid), h + 32);
	hmac_sha256(sig, 32, h, 64, next);
	buf_init(&b, 1 << 20);
	buf_add(&b, &two, 1);
	put_field(&b, 2, "id-1", 4);
	buf_add(&b, &z, 1);
	put_field(&b, 2, cavs[0], strlen(cavs[0]));
	buf_add(&b, &z, 1);
	put_field(&b, 2, cavs[1], strlen(cavs[1]));
	buf_add(&b, &z, 1);
	put_field(&b, 1, "https://auth.test", 17);
	put_field(&b, 2, cid, strlen(cid));
	put_field(&b, 4, vid, sizeof(vid));
	buf_add(&b, &z, 1);
	buf_add(&b, &z, 1);
	put_field(&b, 6, next, 32);
	t = b64(&b);
	m = parse_ok(t);
	assert_int_equal(macaroon_caveat_count(m), 3);
	assert_true(macaroon_caveat_third_party(m, 2));
	assert_false(macaroon_caveat_third_party(m, 1));
	assert_false(macaroon_caveat_third_party(m, 3));
	/* the signature is right: the refusal is about the caveat */
	assert_int_equal(macaroon_verify(K, 32, m, &CTX, &reason),
	    MACAROON_EUNKNOWN);
	assert_string_equal(reason, "unknown caveat");
	assert_int_equal(macaroon_serialize_v2(m, &again), 0);
	assert_string_equal(again, t);
	buf_init(&text, 4096);
	assert_int_equal(macaroon_format(m, &text), 0);
	assert_non_null(strstr(text.data, "third-party caveat: 3p-caveat-id-1"
	    " (location https://auth.test)\n"));
	buf_release(&text);
	macaroon_free(m);
	free(again);
	free(t);
	buf_release(&b);
}

/* ---- limits ---- */

static void
limit_huge_garbage(void **state)
{
	size_t n = 1 << 20, i;
	char *junk = xmalloc(n);
	struct macaroon *m = NULL;
	struct timespec t0;
	char *cause = NULL;
	double ms;

	for (i = 0; i < n; i++)
		junk[i] = "Ag-_xyz019"[i % 10];
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < 100; i++) {
		assert_int_equal(macaroon_deserialize(junk, n, &m, &cause),
		    MACAROON_ETOOLARGE);
		free(cause);
		cause = NULL;
	}
	ms = elapsed_ms(&t0);
	assert_true(ms < 50);
	assert_null(m);
	/* just over and at the limit */
	parse_fails(junk, MACAROON_MAX_TOKEN + 1, MACAROON_ETOOLARGE);
	parse_fails(junk, MACAROON_MAX_TOKEN, MACAROON_EMALFORMED);
	free(junk);
}

static void
limit_10000_caveats(void **state)
{
	const char **cavs = xcalloc(10000, sizeof(*cavs));
	unsigned char sig[32] = { 0 };
	struct macaroon *m = NULL;
	struct timespec t0;
	char *t, *cause = NULL;
	struct buf b;
	size_t i;

	for (i = 0; i < 10000; i++)
		cavs[i] = "a = b";
	build_bin(&b, NULL, "id", cavs, 10000, sig);
	t = b64(&b);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(macaroon_deserialize(t, strlen(t), &m, &cause),
	    MACAROON_ETOOLARGE);
	assert_true(elapsed_ms(&t0) < 50);
	free(cause);
	free(t);
	/* the same binary cut down under the size limit: too many caveats */
	t = base64_encode((const unsigned char *)b.data, 12000, 1, 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	parse_fails(t, strlen(t), MACAROON_ETOOMANY);
	assert_true(elapsed_ms(&t0) < 50);
	free(t);
	buf_release(&b);
	/* mint refuses too */
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 10000, &t,
	    &cause), MACAROON_ETOOMANY);
	assert_string_equal(cause, "too many caveats");
	free(cause);
	free(cavs);
}

static void
limit_64_caveats(void **state)
{
	const char *cavs[65];
	const char *reason = NULL;
	char *t = NULL, *cause = NULL, *hand;
	struct macaroon *m;
	size_t i;

	cavs[0] = "task_id = t1";
	cavs[1] = "namespace = ns1";
	for (i = 2; i < 65; i++)
		cavs[i] = "repo = acme/shop";
	/* 64: fine */
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 64, &t,
	    NULL), 0);
	m = parse_ok(t);
	assert_int_equal(macaroon_caveat_count(m), 64);
	assert_int_equal(macaroon_verify(K, 32, m, &CTX, &reason), 0);
	macaroon_free(m);
	free(t);
	/* 65: refused both ways */
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 65, &t,
	    &cause), MACAROON_ETOOMANY);
	free(cause);
	hand = build_v2("id", cavs, 65);
	parse_fails(hand, strlen(hand), MACAROON_ETOOMANY);
	free(hand);
}

static void
limit_fields(void **state)
{
	char id[300], loc[300], cav[1100];
	const char *cavs[1];
	char *t = NULL, *cause = NULL;
	unsigned char sig[32] = { 0 };
	struct macaroon *m;
	struct buf b;

	memset(id, 'i', sizeof(id));
	memset(loc, 'l', sizeof(loc));
	memcpy(cav, "repo = ", 7);
	memset(cav + 7, 'c', sizeof(cav) - 7);
	/* at the limits */
	id[MACAROON_MAX_IDENTIFIER] = '\0';
	loc[MACAROON_MAX_LOCATION] = '\0';
	cav[MACAROON_MAX_CAVEAT] = '\0';
	cavs[0] = cav;
	assert_int_equal(macaroon_mint(K, 32, id, loc, cavs, 1, &t, NULL), 0);
	m = parse_ok(t);
	macaroon_free(m);
	free(t);
	/* one over, each */
	id[MACAROON_MAX_IDENTIFIER] = 'i';
	id[MACAROON_MAX_IDENTIFIER + 1] = '\0';
	assert_int_equal(macaroon_mint(K, 32, id, loc, cavs, 1, &t, &cause),
	    MACAROON_ETOOLARGE);
	free(cause);
	build_bin(&b, NULL, id, cavs, 1, sig);
	parse_bin_fails(b.data, b.len, MACAROON_ETOOLARGE);
	buf_release(&b);
	id[MACAROON_MAX_IDENTIFIER] = '\0';
	loc[MACAROON_MAX_LOCATION] = 'l';
	loc[MACAROON_MAX_LOCATION + 1] = '\0';
	assert_int_equal(macaroon_mint(K, 32, id, loc, cavs, 1, &t, &cause),
	    MACAROON_ETOOLARGE);
	free(cause);
	build_bin(&b, loc, id, cavs, 1, sig);
	parse_bin_fails(b.data, b.len, MACAROON_ETOOLARGE);
	buf_release(&b);
	cav[MACAROON_MAX_CAVEAT] = 'c';
	cav[MACAROON_MAX_CAVEAT + 1] = '\0';
	assert_int_equal(macaroon_mint(K, 32, id, NULL, cavs, 1, &t, &cause),
	    MACAROON_ETOOLARGE);
	free(cause);
	build_bin(&b, NULL, id, cavs, 1, sig);
	parse_bin_fails(b.data, b.len, MACAROON_ETOOLARGE);
	buf_release(&b);
}

static void
limit_token_size(void **state)
{
	char cav[1001];
	const char *cavs[20];
	char *t = NULL, *cause = NULL;
	size_t i;

	memcpy(cav, "repo = ", 7);
	memset(cav + 7, 'x', sizeof(cav) - 8);
	cav[1000] = '\0';
	for (i = 0; i < 20; i++)
		cavs[i] = cav;
	/* 12 KB of caveats: 16 KB of base64 */
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 12, &t,
	    NULL), 0);
	assert_true(strlen(t) <= MACAROON_MAX_TOKEN);
	free(t);
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 13, &t,
	    &cause), MACAROON_ETOOLARGE);
	assert_string_equal(cause, "token too large");
	free(cause);
}

/* ---- malformed input ---- */

static void
malformed_v2(void **state)
{
/* a signature field: type 6, 32 bytes */
#define SIG32 "\x06\x20" "SSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSS"
	static const struct {
		const char *name;
		const char *bin;
		size_t len;
		const char *detail;
	} rows[] = {
#define R(n, s, d) { n, s, sizeof(s) - 1, d }
		R("version only", "\x02", "truncated"),
		R("version 3", "\x03\x02\x01x\x00\x00\x06\x20",
		    "unknown format"),
		R("no identifier", "\x02\x01\x01l\x00\x00\x00",
		    "no identifier"),
		R("header out of order", "\x02\x02\x01i\x01\x01l\x00\x00",
		    "fields out of order"),
		R("identifier twice", "\x02\x02\x01i\x02\x01j\x00\x00" SIG32,
		    "fields out of order"),
		R("vid in header", "\x02\x02\x01i\x04\x01v\x00\x00" SIG32,
		    "unexpected field in the header"),
		R("unknown field", "\x02\x02\x01i\x03\x01v\x00\x00" SIG32,
		    "unexpected field in the header"),
		R("length past the end", "\x02\x02\x7fi\x00\x00",
		    "truncated"),
		/* 2^64 - 1: added to the offset, it would wrap around */
		R("length 2^64-1", "\x02\x02\xff\xff\xff\xff\xff\xff\xff"
		    "\xff\xff\x01i\x00\x00" SIG32, "truncated"),
		R("endless varint", "\x02\x02\xff\xff\xff\xff\xff\xff\xff"
		    "\xff\xff\xff\xff", "truncated"),
		R("caveat without id", "\x02\x02\x01i\x00\x04\x01v\x00",
		    "caveat without identifier"),
		R("location in first party", "\x02\x02\x01i\x00\x01\x01l"
		    "\x02\x01" "c\x00\x00" SIG32,
		    "location in a first-party caveat"),
		R("unknown field in a caveat", "\x02\x02\x01i\x00\x02\x01"
		    "c\x03\x01x\x00\x00" SIG32, "unexpected field in a caveat"),
		R("no signature", "\x02\x02\x01i\x00\x00", "no signature"),
		R("wrong signature type", "\x02\x02\x01i\x00\x00\x05\x01x",
		    "no signature"),
		R("short signature", "\x02\x02\x01i\x00\x00\x06\x01x",
		    "signature is not 32 bytes"),
		R("long signature", "\x02\x02\x01i\x00\x00\x06\x21"
		    "SSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSS",
		    "signature is not 32 bytes"),
#undef R
	};
	unsigned char good[40];
	size_t i;

	parse_fails("", 0, MACAROON_EMALFORMED);
	for (i = 0; i < ARRAY_SIZE(rows); i++)
		parse_bin_fails_why(rows[i].name, rows[i].bin, rows[i].len,
		    MACAROON_EMALFORMED, rows[i].detail);
	/* trailing data after a good signature */
	memcpy(good, "\x02\x02\x01i\x00\x00\x06\x20", 8);
	memset(good + 8, 7, 32);
	{
		struct macaroon *m;
		char *t = base64_encode(good, 40, 1, 0);

		m = parse_ok(t);
		macaroon_free(m);
		free(t);
	}
	{
		unsigned char more[41];

		memcpy(more, good, 40);
		more[40] = 0;
		parse_bin_fails_why("trailing data", more, 41,
		    MACAROON_EMALFORMED, "trailing data after the signature");
	}
	/* a third-party caveat's vid is bounded as a caveat is */
	{
		struct buf b;
		struct macaroon *m;
		char *t;

		third_party_bin(&b, MACAROON_MAX_CAVEAT + 1);
		parse_bin_fails_why("long vid", b.data, b.len,
		    MACAROON_ETOOLARGE, "caveat vid is too long");
		buf_release(&b);
		/* at the bound, read (a third-party caveat, unknown here) */
		third_party_bin(&b, MACAROON_MAX_CAVEAT);
		t = b64(&b);
		m = parse_ok(t);
		assert_true(macaroon_caveat_third_party(m, 0));
		macaroon_free(m);
		free(t);
		buf_release(&b);
	}
#undef SIG32
}

static void
malformed_text(void **state)
{
	parse_fails("", 0, MACAROON_EMALFORMED);
	parse_fails("   \n", 4, MACAROON_EMALFORMED);
	{
		char *cause = NULL;
		struct macaroon *m = NULL;

		assert_int_equal(macaroon_deserialize("{\"v\":2}", 7, &m,
		    &cause), MACAROON_EMALFORMED);
		assert_string_equal(cause, "malformed token: the JSON format "
		    "is not supported");
		free(cause);
	}
	parse_fails("AgEY*aHR0", 9, MACAROON_EMALFORMED);
	parse_fails("AgE Y", 5, MACAROON_EMALFORMED);
	parse_fails("A", 1, MACAROON_EMALFORMED);
	parse_fails("Ag===", 5, MACAROON_EMALFORMED);
	parse_fails("bm9wZQ", 6, MACAROON_EMALFORMED);	/* "nope" */
	parse_fails("AgEYaHR0\0AAAA", 13, MACAROON_EMALFORMED);
	{
		struct macaroon *m = (struct macaroon *)&m;

		assert_int_equal(macaroon_deserialize(NULL, 0, &m, NULL),
		    MACAROON_EMALFORMED);
		assert_ptr_equal(m, (struct macaroon *)&m);
	}
}

static void
malformed_v1(void **state)
{
/* a V1 signature packet: 0x2f = 4 + "signature " + 32 + newline */
#define V1SIG "002fsignature SSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSS\n"
#define V1HEAD "000flocation x\n0011identifier i\n"
	static const struct {
		const char *text;
		const char *detail;
	} bad[] = {
		{ "0011identifier x\n", "no location packet" },
		{ "000flocation x\n0010identifierx\n", "packet without key" },
		{ "000flocation x\n0011identifier x\n", "truncated packet" },
		{ V1HEAD "002esignature 0123456789012345678901234567890\n",
		    "signature is not 32 bytes" },
		{ V1HEAD "000avid v\n" V1SIG, "misplaced vid packet" },
		{ V1HEAD "000acid c\n000avid v\n000avid w\n" V1SIG,
		    "misplaced vid packet" },
		{ V1HEAD "0009cl l\n" V1SIG, "misplaced cl packet" },
		{ V1HEAD "000acid c\n0009cl l\n" V1SIG, "misplaced cl packet" },
		{ V1HEAD "000boops o\n", "unknown packet" },
		{ V1HEAD "0zzzcid c\n", "bad packet header" },
		{ V1HEAD "0003", "bad packet length" },
		{ V1HEAD "0006", "bad packet length" },
		{ "000flocation x\n0011identifier iX" V1SIG,
		    "packet without newline" },
		{ V1HEAD "000acid c\nX", "truncated packet" },
		{ V1HEAD "000acid c\n" V1SIG "X",
		    "trailing data after the signature" },
	};
	size_t i;

	/* the same, well formed, parses */
	macaroon_free(parse_ok_bin(V1HEAD "000acid c\n000avid v\n0009cl l\n"
	    V1SIG));
	for (i = 0; i < ARRAY_SIZE(bad); i++)
		parse_bin_fails_why(bad[i].text, bad[i].text,
		    strlen(bad[i].text), MACAROON_EMALFORMED, bad[i].detail);
#undef V1HEAD
#undef V1SIG
}

static void
v1_third_party_and_limits(void **state)
{
	struct buf b;
	unsigned char sig[32];
	struct macaroon *m;
	char *t;
	size_t i;

	memset(sig, 1, sizeof(sig));
	buf_init(&b, 1 << 20);
	buf_addstr(&b, "000flocation l\n0011identifier i\n000acid c\n"
	    "000avid v\n000bcl loc\n");
	buf_printf(&b, "%04xsignature ", 4 + 10 + 32 + 1);
	buf_add(&b, sig, 32);
	buf_addstr(&b, "\n");
	t = base64_encode((const unsigned char *)b.data, b.len, 0, 1);
	m = parse_ok(t);
	assert_int_equal(macaroon_version(m), 1);
	assert_true(macaroon_caveat_third_party(m, 0));
	macaroon_free(m);
	free(t);
	buf_release(&b);

	/* 65 cids */
	buf_init(&b, 1 << 20);
	buf_addstr(&b, "000flocation l\n0011identifier i\n");
	for (i = 0; i < 65; i++)
		buf_addstr(&b, "000acid c\n");
	buf_printf(&b, "%04xsignature ", 4 + 10 + 32 + 1);
	buf_add(&b, sig, 32);
	buf_addstr(&b, "\n");
	parse_bin_fails(b.data, b.len, MACAROON_ETOOMANY);
	buf_release(&b);
}

static void
mint_bad_arguments(void **state)
{
	const char *cavs[] = { "task_id = t1", "" };
	char *t = (char *)"untouched", *cause = NULL;

	assert_int_equal(macaroon_mint(K, 15, "id", NULL, cavs, 1, &t,
	    &cause), MACAROON_EINVAL);
	assert_string_equal(cause, "invalid argument: root key is too short");
	free(cause);
	assert_int_equal(macaroon_mint(K, 32, NULL, NULL, cavs, 1, &t,
	    NULL), MACAROON_EINVAL);
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, cavs, 2, &t,
	    &cause), MACAROON_EINVAL);
	free(cause);
	assert_int_equal(macaroon_mint(K, 32, "id", NULL, NULL, 1, &t,
	    NULL), MACAROON_EINVAL);
	assert_string_equal(t, "untouched");
	/* the minimum key length works */
	assert_int_equal(macaroon_mint(K, MACAROON_MIN_KEY_LEN, "id", NULL,
	    cavs, 1, &t, NULL), 0);
	free(t);
}

/* ---- text ---- */

static void
format_text(void **state)
{
	json_t *root = load_vectors(), *v;
	struct macaroon *m;
	struct buf b;
	const char *cavs[] = { "repo = a\\b\x01\x1b[31m",
	    "branch = caf\xc3\xa9", "tools = \xc3\x28" };
	char *t = NULL;

	v = json_array_get(json_object_get(root, "vectors"), 1);
	assert_int_equal(macaroon_inspect(json_string_value(json_object_get(v,
	    "v2_base64url")), strlen(json_string_value(json_object_get(v,
	    "v2_base64url"))), &m, NULL), 0);
	buf_init(&b, 4096);
	assert_int_equal(macaroon_format(m, &b), 0);
	assert_string_equal(b.data, "version: 2\n"
	    "identifier: agent-token-1\n"
	    "location: https://divergedev.local\n"
	    "caveat: task_id = t1\n"
	    "caveat: expires = 2026-12-01T00:00:00Z\n");
	buf_release(&b);
	/* the buffer's maximum is honoured */
	buf_init(&b, 20);
	assert_int_equal(macaroon_format(m, &b), -1);
	buf_release(&b);
	macaroon_free(m);

	/* escapes; no location */
	assert_int_equal(macaroon_mint(K, 32, "id\xff", NULL, cavs, 3, &t,
	    NULL), 0);
	assert_int_equal(macaroon_inspect(t, strlen(t), &m, NULL), 0);
	buf_init(&b, 4096);
	assert_int_equal(macaroon_format(m, &b), 0);
	assert_string_equal(b.data, "version: 2\n"
	    "identifier: id\\xff\n"
	    "location: (none)\n"
	    "caveat: repo = a\\x5cb\\x01\\x1b[31m\n"
	    "caveat: branch = caf\xc3\xa9\n"
	    "caveat: tools = \\xc3(\n");
	buf_release(&b);
	macaroon_free(m);
	free(t);
	json_decref(root);
}

static void
strerror_texts(void **state)
{
	assert_string_equal(macaroon_strerror(MACAROON_OK), "ok");
	assert_string_equal(macaroon_strerror(MACAROON_EMALFORMED),
	    "malformed token");
	assert_string_equal(macaroon_strerror(MACAROON_ETOOLARGE),
	    "token too large");
	assert_string_equal(macaroon_strerror(MACAROON_ETOOMANY),
	    "too many caveats");
	assert_string_equal(macaroon_strerror(MACAROON_EBADSIG),
	    "bad signature");
	assert_string_equal(macaroon_strerror(MACAROON_EEXPIRED), "expired");
	assert_string_equal(macaroon_strerror(MACAROON_EUNKNOWN),
	    "unknown caveat");
	assert_string_equal(macaroon_strerror(MACAROON_EMODEL),
	    "caveat not met: models");
	assert_string_equal(macaroon_strerror(-100), "unknown error");
}

/* ---- root keys ---- */

#define HEX64 "000102030405060708090a0b0c0d0e0f" \
	"101112131415161718191a1b1c1d1e1f"

static char *
tmpdir(void)
{
	return test_tmpdir("macaroon");
}

static char *
write_key(const char *dir, const char *name, const char *text, mode_t mode)
{
	char *path = xasprintf("%s/%s", dir, name);
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
	return path;
}

static void
root_key_parse(void **state)
{
	unsigned char key[32], want[32];
	char *cause = NULL;
	size_t i;

	for (i = 0; i < 32; i++)
		want[i] = (unsigned char)i;
	assert_int_equal(meter_root_key_parse(HEX64, 64, key, NULL), 0);
	assert_memory_equal(key, want, 32);
	memset(key, 0, 32);
	assert_int_equal(meter_root_key_parse(HEX64 "\n", 65, key, NULL), 0);
	assert_memory_equal(key, want, 32);
	assert_int_equal(meter_root_key_parse("000102030405060708090A0B0C0D0E0F"
	    "101112131415161718191A1B1C1D1E1F", 64, key, NULL), 0);
	assert_memory_equal(key, want, 32);

	memset(key, 0x55, 32);
	assert_int_equal(meter_root_key_parse(HEX64 "\n\n", 66, key, &cause),
	    -1);
	assert_string_equal(cause, "macaroon root key: expected 64 hex "
	    "characters, found 65 bytes");
	free(cause);
	assert_int_equal(meter_root_key_parse(HEX64 "\r\n", 66, key, &cause),
	    -1);
	free(cause);
	assert_int_equal(meter_root_key_parse(HEX64, 62, key, &cause), -1);
	free(cause);
	assert_int_equal(meter_root_key_parse(" " HEX64, 65, key, &cause),
	    -1);
	free(cause);
	assert_int_equal(meter_root_key_parse("zz0102030405060708090a0b0c0d0e0f"
	    "101112131415161718191a1b1c1d1e1f", 64, key, &cause), -1);
	assert_string_equal(cause, "macaroon root key: not 64 hex characters");
	free(cause);
	assert_int_equal(meter_root_key_parse("00000000000000000000000000000000"
	    "00000000000000000000000000000000", 64, key, &cause), -1);
	assert_string_equal(cause, "macaroon root key: the key is all zeros");
	free(cause);
	assert_int_equal(meter_root_key_parse(NULL, 0, key, NULL), -1);
	/* untouched by failures */
	for (i = 0; i < 32; i++)
		assert_int_equal(key[i], 0x55);
}

static void
root_key_file_create(void **state)
{
	char *dir = tmpdir(), *path = xasprintf("%s/macaroon-root-key", dir);
	unsigned char k1[32], k2[32], k3[32];
	char *text, *cause = NULL;
	struct stat st;
	FILE *f;
	char line[100];
	size_t n;

	assert_int_equal(meter_root_key_ensure_file(path, k1, &cause), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(st.st_size, 65);
	f = fopen(path, "r");
	n = fread(line, 1, sizeof(line), f);
	fclose(f);
	assert_int_equal(n, 65);
	assert_int_equal(line[64], '\n');
	assert_int_equal(meter_root_key_parse(line, n, k3, NULL), 0);
	assert_memory_equal(k1, k3, 32);
	/* a second start loads the same key */
	assert_int_equal(meter_root_key_ensure_file(path, k2, NULL), 0);
	assert_memory_equal(k1, k2, 32);
	assert_int_equal(meter_root_key_load_file(path, k2, NULL), 0);
	assert_memory_equal(k1, k2, 32);
	/* no temporary file is left behind */
	text = xasprintf("ls %s | wc -l | grep -qx 1", dir);
	assert_int_equal(system(text), 0);
	free(text);
	unlink(path);
	/* a directory that does not exist */
	free(path);
	path = xasprintf("%s/nope/macaroon-root-key", dir);
	assert_int_equal(meter_root_key_ensure_file(path, k1, &cause), -1);
	assert_non_null(strstr(cause, "cannot"));
	assert_non_null(strstr(cause, path));
	free(cause);
	free(path);
	rmdir(dir);
	free(dir);
}

static void
root_key_file_refused(void **state)
{
	char *dir = tmpdir(), *p, *cause = NULL, *want;
	unsigned char key[32];

	p = write_key(dir, "open", HEX64 "\n", 0644);
	assert_int_equal(meter_root_key_load_file(p, key, &cause), -1);
	want = xasprintf("macaroon root key '%s': permissions 0644 are too "
	    "open, expected 0600", p);
	assert_string_equal(cause, want);
	free(want);
	free(cause);
	/* ensure does not rewrite an existing file */
	assert_int_equal(meter_root_key_ensure_file(p, key, &cause), -1);
	assert_non_null(strstr(cause, "permissions 0644"));
	free(cause);
	assert_int_equal(chmod(p, 0640), 0);
	assert_int_equal(meter_root_key_load_file(p, key, &cause), -1);
	assert_non_null(strstr(cause, "permissions 0640 are too open"));
	free(cause);
	assert_int_equal(chmod(p, 0400), 0);
	assert_int_equal(meter_root_key_load_file(p, key, NULL), 0);
	unlink(p);
	free(p);

	p = write_key(dir, "badhex", "000102030405060708090a0b0c0d0e0f"
	    "101112131415161718191a1b1c1d1e1g\n", 0600);
	assert_int_equal(meter_root_key_load_file(p, key, &cause), -1);
	assert_non_null(strstr(cause, "not 64 hex characters"));
	assert_non_null(strstr(cause, p));
	free(cause);
	unlink(p);
	free(p);

	p = write_key(dir, "short", "abcdef\n", 0600);
	assert_int_equal(meter_root_key_load_file(p, key, &cause), -1);
	assert_non_null(strstr(cause, "expected 64 hex characters, found 6 "
	    "bytes"));
	free(cause);
	unlink(p);
	free(p);

	p = write_key(dir, "long", HEX64 HEX64 HEX64, 0600);
	assert_int_equal(meter_root_key_load_file(p, key, &cause), -1);
	assert_non_null(strstr(cause, "expected 64 hex characters"));
	free(cause);
	unlink(p);
	free(p);

	p = write_key(dir, "nonl", HEX64, 0600);
	assert_int_equal(meter_root_key_load_file(p, key, NULL), 0);
	assert_int_equal(key[31], 0x1f);
	unlink(p);
	free(p);

	p = xasprintf("%s/missing", dir);
	assert_int_equal(meter_root_key_load_file(p, key, &cause), -1);
	assert_non_null(strstr(cause, "cannot open: No such file"));
	free(cause);
	free(p);

	assert_int_equal(meter_root_key_load_file(dir, key, &cause), -1);
	assert_non_null(strstr(cause, "not a regular file"));
	free(cause);

	/* a FIFO in its place: refused at once, not read (nor waited on) */
	p = xasprintf("%s/fifo", dir);
	assert_int_equal(mkfifo(p, 0600), 0);
	assert_int_equal(meter_root_key_load_file(p, key, &cause), -1);
	assert_non_null(strstr(cause, "not a regular file"));
	free(cause);
	unlink(p);
	free(p);

	/*
	 * A key file someone else owns, even 0600: they could rewrite it.
	 * Only root can make one (CI runs as root); others skip it.
	 */
	if (geteuid() == 0) {
		p = write_key(dir, "theirs", HEX64 "\n", 0600);
		assert_int_equal(chown(p, 65534, 65534), 0);
		assert_int_equal(meter_root_key_load_file(p, key, &cause), -1);
		assert_non_null(strstr(cause, "owned by uid 65534, not by the "
		    "user diverged runs as (uid 0)"));
		free(cause);
		unlink(p);
		free(p);
	} else {
		fprintf(stderr, "# not root: the foreign-owner case is "
		    "skipped\n");
	}
	rmdir(dir);
	free(dir);
}

/* A verified round trip with the key from a file, as the daemon does. */
static void
root_key_file_mint_verify(void **state)
{
	char *dir = tmpdir(), *p = xasprintf("%s/k", dir), *t = NULL;
	const char *cavs[] = { "task_id = t1", "namespace = ns1" };
	unsigned char key[32];
	struct macaroon *m;
	const char *reason = NULL;

	assert_int_equal(meter_root_key_ensure_file(p, key, NULL), 0);
	assert_int_equal(macaroon_mint(key, 32, "id", NULL, cavs, 2, &t,
	    NULL), 0);
	m = parse_ok(t);
	memset(key, 0, 32);
	assert_int_equal(meter_root_key_load_file(p, key, NULL), 0);
	assert_int_equal(macaroon_verify(key, 32, m, &CTX, &reason), 0);
	secure_wipe(key, sizeof(key));
	macaroon_free(m);
	free(t);
	unlink(p);
	free(p);
	rmdir(dir);
	free(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(vectors_mint),
		cmocka_unit_test(vectors_parse),
		cmocka_unit_test(vectors_verify),
		cmocka_unit_test(vector_empty_location),
		cmocka_unit_test(vector_v1),
		cmocka_unit_test(base64_variants),
		cmocka_unit_test(redact_shape),
		cmocka_unit_test(mint_and_read_back),
		cmocka_unit_test(mint_matches_hand_built),
		cmocka_unit_test(tamper_binary_bits),
		cmocka_unit_test(tamper_base64_chars),
		cmocka_unit_test(tamper_fields),
		cmocka_unit_test(attenuation),
		cmocka_unit_test(truncated),
		cmocka_unit_test(expired),
		cmocka_unit_test(expiry_leeway),
		cmocka_unit_test(expiry_formats),
		cmocka_unit_test(wrong_task),
		cmocka_unit_test(wrong_namespace),
		cmocka_unit_test(task_and_namespace_required),
		cmocka_unit_test(models_exact),
		cmocka_unit_test(models_prefix),
		cmocka_unit_test(models_list),
		cmocka_unit_test(models_missing_or_empty),
		cmocka_unit_test(models_star),
		cmocka_unit_test(models_precedence),
		cmocka_unit_test(unknown_caveats),
		cmocka_unit_test(duplicate_keys),
		cmocka_unit_test(cost_values),
		cmocka_unit_test(token_values),
		cmocka_unit_test(tools_values),
		cmocka_unit_test(third_party),
		cmocka_unit_test(limit_huge_garbage),
		cmocka_unit_test(limit_10000_caveats),
		cmocka_unit_test(limit_64_caveats),
		cmocka_unit_test(limit_fields),
		cmocka_unit_test(limit_token_size),
		cmocka_unit_test(malformed_v2),
		cmocka_unit_test(malformed_text),
		cmocka_unit_test(malformed_v1),
		cmocka_unit_test(v1_third_party_and_limits),
		cmocka_unit_test(mint_bad_arguments),
		cmocka_unit_test(format_text),
		cmocka_unit_test(strerror_texts),
		cmocka_unit_test(root_key_parse),
		cmocka_unit_test(root_key_file_create),
		cmocka_unit_test(root_key_file_refused),
		cmocka_unit_test(root_key_file_mint_verify),
	};

	util_json_init();
	return cmocka_run_group_tests_name("macaroon", tests, NULL, NULL);
}
