/*
 * Fuzz target for macaroon tokens. The input is tried twice: as token text
 * as it came (the base64 layer, format sniffing, V1 and V2), and, base64url
 * encoded, as the binary itself (so that mutations reach the V2 and V1
 * parsers directly). Each parse is shown, verified with a fixed key, and
 * serialized back. Besides crashes, leaks and sanitizer reports it checks
 * the contract:
 *
 *  - a refusal is one of the parse results, with a cause that starts with
 *    its text, and no macaroon;
 *  - a parsed macaroon is within the limits, serializes, and its
 *    serialization parses to the same fields and serializes to the same
 *    text again (the V2 form is canonical);
 *  - verification gives a reason from the fixed set;
 *  - re-signed with the fixed key (when its caveats are first-party and
 *    without NUL bytes) it never fails on the signature, and verifies
 *    exactly when the library's own accessors say the caveats hold.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meter/meter.h"
#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x) do { if (!(x)) abort(); } while (0)

/* "diverge-fuzz-macaroon-root-key-1", the key of the seed tokens */
static const unsigned char KEY[32] = "diverge-fuzz-macaroon-root-key-1";

static const struct macaroon_context CTXS[] = {
	{ "t1", "ns1", "claude-3-7-sonnet", 1767225600 },
	{ "t1", "ns1", NULL, 1767225600 },
	{ "t1", "ns1", "", 4102444800 },
};

static int
known_reason(const char *r)
{
	static const char *const fixed[] = { "ok", "malformed token",
	    "bad signature", "expired", "unknown caveat", "token too large",
	    "too many caveats" };
	static const char *const keys[] = { "task_id", "namespace", "repo",
	    "branch", "tools", "models", "max_cost_usd", "max_tokens",
	    "expires" };
	size_t i;

	for (i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		if (strcmp(r, fixed[i]) == 0)
			return 1;
	if (strncmp(r, "caveat not met: ", 16) != 0)
		return 0;
	for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strcmp(r + 16, keys[i]) == 0)
			return 1;
	return 0;
}

static void
same_fields(const struct macaroon *a, const struct macaroon *b)
{
	size_t la, lb, i;
	const char *sa, *sb;

	sa = macaroon_identifier(a, &la);
	sb = macaroon_identifier(b, &lb);
	CHECK(la == lb && memcmp(sa, sb, la) == 0);
	sa = macaroon_location(a, &la);
	sb = macaroon_location(b, &lb);
	CHECK(la == lb && memcmp(sa, sb, la) == 0);
	CHECK(memcmp(macaroon_signature(a), macaroon_signature(b),
	    MACAROON_SIG_LEN) == 0);
	CHECK(macaroon_caveat_count(a) == macaroon_caveat_count(b));
	for (i = 0; i < macaroon_caveat_count(a); i++) {
		sa = macaroon_caveat(a, i, &la);
		sb = macaroon_caveat(b, i, &lb);
		CHECK(la == lb && memcmp(sa, sb, la) == 0);
		CHECK(macaroon_caveat_third_party(a, i) ==
		    macaroon_caveat_third_party(b, i));
	}
}

/* What verification must say of a correctly signed m under ctx. */
static int
expect_ok(const struct macaroon *m, const struct macaroon_context *ctx)
{
	const char *task = macaroon_value(m, "task_id");
	const char *ns = macaroon_value(m, "namespace");
	int64_t exp;

	if (task == NULL || strcmp(task, ctx->task_id) != 0)
		return 0;
	if (ns == NULL || strcmp(ns, ctx->namespace) != 0)
		return 0;
	if (macaroon_expires(m, &exp) == 0 &&
	    ctx->now >= exp + MACAROON_EXPIRES_LEEWAY)
		return 0;
	if (ctx->model != NULL && !macaroon_allows_model(m, ctx->model))
		return 0;
	return 1;
}

/* Mint m's identifier and caveats under KEY and verify the result. */
static void
resign(const struct macaroon *m)
{
	const char *cavs[MACAROON_MAX_CAVEATS];
	size_t n = macaroon_caveat_count(m), i, len;
	const char *id = macaroon_identifier(m, &len);
	struct macaroon *again = NULL;
	char *token = NULL;
	size_t k;

	if (strlen(id) != len || len == 0)
		return;
	for (i = 0; i < n; i++) {
		cavs[i] = macaroon_caveat(m, i, &len);
		if (macaroon_caveat_third_party(m, i) ||
		    strlen(cavs[i]) != len || len == 0)
			return;
	}
	if (macaroon_mint(KEY, sizeof(KEY), id, macaroon_location(m, NULL),
	    cavs, n, &token, NULL) != 0)
		abort();	/* within the limits: minting cannot fail */
	CHECK(macaroon_deserialize(token, strlen(token), &again, NULL) == 0);
	for (k = 0; k < sizeof(CTXS) / sizeof(CTXS[0]); k++) {
		const char *reason = NULL;
		int rc = macaroon_verify(KEY, sizeof(KEY), again, &CTXS[k],
		    &reason);

		CHECK(rc != MACAROON_EBADSIG);
		CHECK(known_reason(reason));
		CHECK((rc == 0) == (strcmp(reason, "ok") == 0));
		if (rc == 0)
			CHECK(expect_ok(again, &CTXS[k]));
		else if (rc == MACAROON_EMODEL || rc == MACAROON_EEXPIRED)
			CHECK(!expect_ok(again, &CTXS[k]));
	}
	macaroon_free(again);
	free(token);
}

static void
one(const char *text, size_t len)
{
	struct macaroon *m = NULL, *back = NULL;
	char *cause = NULL, *token = NULL, *token2 = NULL;
	const char *reason = NULL;
	struct buf b;
	size_t k, i;
	int rc;

	rc = macaroon_deserialize(text, len, &m, &cause);
	if (rc != 0) {
		const char *want = macaroon_strerror(rc);

		CHECK(rc == MACAROON_EMALFORMED || rc == MACAROON_ETOOLARGE ||
		    rc == MACAROON_ETOOMANY);
		CHECK(m == NULL && cause != NULL);
		CHECK(strncmp(cause, want, strlen(want)) == 0);
		free(cause);
		return;
	}
	CHECK(m != NULL);
	CHECK(macaroon_version(m) == 1 || macaroon_version(m) == 2);
	CHECK(macaroon_caveat_count(m) <= MACAROON_MAX_CAVEATS);
	macaroon_identifier(m, &i);
	CHECK(i <= MACAROON_MAX_IDENTIFIER);
	macaroon_location(m, &i);
	CHECK(i <= MACAROON_MAX_LOCATION);
	for (i = 0; i < macaroon_caveat_count(m); i++) {
		size_t cl;

		CHECK(macaroon_caveat(m, i, &cl) != NULL);
		CHECK(cl <= MACAROON_MAX_CAVEAT);
	}
	CHECK(macaroon_caveat(m, i, NULL) == NULL);

	buf_init(&b, 1u << 20);
	CHECK(macaroon_format(m, &b) == 0);
	CHECK(b.len == strlen(b.data));
	buf_release(&b);

	for (k = 0; k < sizeof(CTXS) / sizeof(CTXS[0]); k++) {
		rc = macaroon_verify(KEY, sizeof(KEY), m, &CTXS[k], &reason);
		CHECK(reason != NULL && known_reason(reason));
		CHECK((rc == 0) == (strcmp(reason, "ok") == 0));
	}

	CHECK(macaroon_serialize_v2(m, &token) == 0);
	CHECK(strlen(token) <= MACAROON_MAX_TOKEN);
	CHECK(macaroon_deserialize(token, strlen(token), &back, NULL) == 0);
	same_fields(m, back);
	CHECK(macaroon_serialize_v2(back, &token2) == 0);
	CHECK(strcmp(token, token2) == 0);

	resign(m);
	macaroon_free(back);
	macaroon_free(m);
	free(token);
	free(token2);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text;

	one((const char *)data, size);
	if (size <= MACAROON_MAX_TOKEN / 4 * 3) {
		text = base64_encode(data, size, 1, 0);
		one(text, strlen(text));
		free(text);
	}
	return 0;
}
