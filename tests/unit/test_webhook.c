/* Webhook signatures (the shared vectors) and normalization (fixtures). */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>

#include <cmocka.h>

#include "scm/scm.h"
#include "testutil.h"

/* ---- header tables for webhook_handle ---- */
struct hdrs {
	const char *k[12];
	const char *v[12];
};

static const char *
hget(void *arg, const char *name)
{
	struct hdrs *h = arg;
	int i;

	for (i = 0; i < 12 && h->k[i] != NULL; i++)
		if (strcasecmp(h->k[i], name) == 0)
			return h->v[i];
	return NULL;
}

static void
one_key(struct webhook_keys *k, const char **s, size_t *l, const char *secret)
{
	s[0] = secret;
	l[0] = strlen(secret);
	memset(k, 0, sizeof(*k));
	k->secrets = s;
	k->secret_lens = l;
	k->nsecrets = 1;
}

static char *
sign_github(const char *secret, const char *body, size_t len)
{
	unsigned char mac[32];
	char hex[65];

	hmac_sha256(secret, strlen(secret), body, len, mac);
	hex_encode(mac, 32, hex);
	return xasprintf("sha256=%s", hex);
}

/* ---- signatures ---- */

static void
github_vectors(void **state)
{
	size_t len, i;
	char *text = test_read_file("tests/data/vectors/webhooks.json", &len);
	json_t *root = json_loads(text, 0, NULL), *arr;
	json_t *v;

	assert_non_null(root);
	arr = json_object_get(root, "github");
	assert_true(json_array_size(arr) >= 2);
	json_array_foreach(arr, i, v) {
		const char *secret = json_string_value(json_object_get(v,
		    "secret"));
		const char *payload = json_string_value(json_object_get(v,
		    "payload"));
		const char *value = json_string_value(json_object_get(v,
		    "value"));
		struct webhook_keys k;
		const char *s[1];
		size_t l[1];
		char *mine;

		one_key(&k, s, l, secret);
		assert_int_equal(webhook_github_verify(&k, value, payload,
		    strlen(payload)), 0);
		/* and our own signer produces the same bytes */
		mine = sign_github(secret, payload, strlen(payload));
		assert_string_equal(mine, value);
		free(mine);
	}
	json_decref(root);
	free(text);
}

static void
github_bad_signatures(void **state)
{
	const char *body = "Hello, World!";
	const char *good = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d"
	    "7586c22c46f4379c8b043e17";
	struct webhook_keys k;
	const char *s[2];
	size_t l[2];
	char *upper, *trunc;
	size_t i;

	one_key(&k, s, l, "It's a Secret to Everybody");
	assert_int_equal(webhook_github_verify(&k, good, body, 13), 0);
	/* wrong body, wrong secret, missing header */
	assert_int_equal(webhook_github_verify(&k, good, body, 12), -1);
	assert_int_equal(webhook_github_verify(&k, NULL, body, 13), -1);
	one_key(&k, s, l, "It's a Secret to everybody");
	assert_int_equal(webhook_github_verify(&k, good, body, 13), -1);
	one_key(&k, s, l, "It's a Secret to Everybody");
	/* truncated */
	trunc = xstrndup(good, strlen(good) - 2);
	assert_int_equal(webhook_github_verify(&k, trunc, body, 13), -1);
	free(trunc);
	/* upper-cased hex or prefix */
	upper = xstrdup(good);
	for (i = 7; upper[i]; i++)
		if (upper[i] >= 'a' && upper[i] <= 'f')
			upper[i] = (char)(upper[i] - 32);
	assert_int_equal(webhook_github_verify(&k, upper, body, 13), -1);
	upper[0] = 'S';
	assert_int_equal(webhook_github_verify(&k, upper, body, 13), -1);
	free(upper);
	/*
	 * one letter upper-cased alone, at each place, the last one too (this
	 * body's MAC ends in 'f')
	 */
	upper = sign_github(s[0], "Hello, World?", 13);
	assert_int_equal(upper[7 + 63], 'f');
	for (i = 7; upper[i]; i++) {
		if (upper[i] < 'a')
			continue;
		upper[i] = (char)(upper[i] - 32);
		assert_int_equal(webhook_github_verify(&k, upper,
		    "Hello, World?", 13), -1);
		upper[i] = (char)(upper[i] + 32);
	}
	assert_int_equal(webhook_github_verify(&k, upper, "Hello, World?", 13),
	    0);
	free(upper);
	/* the right MAC with anything after it, or another separator */
	trunc = xasprintf("%s0", good);
	assert_int_equal(webhook_github_verify(&k, trunc, body, 13), -1);
	trunc[strlen(good)] = ' ';
	assert_int_equal(webhook_github_verify(&k, trunc, body, 13), -1);
	trunc[strlen(good)] = '\0';
	trunc[6] = ':';
	assert_int_equal(webhook_github_verify(&k, trunc, body, 13), -1);
	free(trunc);
	/*
	 * one hex digit changed, at each of the 64 places: refused (the
	 * whole MAC is compared, not a prefix of it)
	 */
	trunc = xstrdup(good);
	for (i = 7; trunc[i]; i++) {
		char was = trunc[i];

		trunc[i] = was == '0' ? '1' : '0';
		assert_int_equal(webhook_github_verify(&k, trunc, body, 13),
		    -1);
		trunc[i] = was;
	}
	assert_int_equal(webhook_github_verify(&k, trunc, body, 13), 0);
	free(trunc);
	/* sha1-only (the legacy X-Hub-Signature value) */
	assert_int_equal(webhook_github_verify(&k,
	    "sha1=dc5e7a0ee4e3f2e8d1e0c8b1f2e3a4b5c6d7e8f9", body, 13), -1);
	/* empty and garbage */
	assert_int_equal(webhook_github_verify(&k, "", body, 13), -1);
	assert_int_equal(webhook_github_verify(&k, "sha256=", body, 13), -1);
	/* rotation: the second secret matches */
	s[0] = "old-secret";
	l[0] = strlen(s[0]);
	s[1] = "It's a Secret to Everybody";
	l[1] = strlen(s[1]);
	k.nsecrets = 2;
	assert_int_equal(webhook_github_verify(&k, good, body, 13), 0);
	/* or the first, the second not */
	s[0] = s[1];
	l[0] = l[1];
	s[1] = "new-secret";
	l[1] = strlen(s[1]);
	assert_int_equal(webhook_github_verify(&k, good, body, 13), 0);
	/* no secret at all never verifies */
	k.nsecrets = 0;
	assert_int_equal(webhook_github_verify(&k, good, body, 13), -1);
}

/*
 * Only a v1 signature of the whole MAC is taken: the right MAC cut short,
 * with a byte more, or under another version tag is refused.
 */
static void
standard_mac_forms(const unsigned char *key, size_t klen, const char *id,
    const char *ts, const char *sig, const char *payload, int64_t t)
{
	static const size_t cuts[] = { 16, 31 };
	static const char *const tags[] = { "v1a,", "v2,", "V1,", "" };
	unsigned char *raw = NULL, longer[33];
	const char *reason = NULL;
	char *b64, *bad;
	size_t rlen = 0, i;

	assert_int_equal(base64_decode(sig + 3, strlen(sig + 3), &raw,
	    &rlen), 0);
	assert_int_equal(rlen, 32);
	for (i = 0; i < ARRAY_SIZE(cuts); i++) {
		b64 = base64_encode(raw, cuts[i], 0, 1);
		bad = xasprintf("v1,%s", b64);
		assert_int_equal(webhook_standard_verify(key, klen, id, ts, bad,
		    payload, strlen(payload), t, &reason), -1);
		free(bad);
		free(b64);
	}
	memcpy(longer, raw, 32);
	longer[32] = 0;
	b64 = base64_encode(longer, sizeof(longer), 0, 1);
	bad = xasprintf("v1,%s", b64);
	assert_int_equal(webhook_standard_verify(key, klen, id, ts, bad,
	    payload, strlen(payload), t, &reason), -1);
	free(bad);
	free(b64);
	for (i = 0; i < ARRAY_SIZE(tags); i++) {
		bad = xasprintf("%s%s", tags[i], sig + 3);
		assert_int_equal(webhook_standard_verify(key, klen, id, ts, bad,
		    payload, strlen(payload), t, &reason), -1);
		assert_string_equal(reason, "bad webhook-signature");
		free(bad);
	}
	free(raw);
}

static void
standard_webhooks_vector(void **state)
{
	size_t len, klen;
	char *text = test_read_file("tests/data/vectors/webhooks.json", &len);
	json_t *root = json_loads(text, 0, NULL);
	json_t *v = json_array_get(json_object_get(root,
	    "gitlab_standard_webhooks"), 0);
	const char *secret = json_string_value(json_object_get(v, "secret"));
	const char *id = json_string_value(json_object_get(v, "webhook-id"));
	const char *ts = json_string_value(json_object_get(v,
	    "webhook-timestamp"));
	const char *payload = json_string_value(json_object_get(v, "payload"));
	const char *sig = json_string_value(json_object_get(v,
	    "webhook-signature"));
	unsigned char *key = NULL;
	const char *reason = NULL;
	int64_t t = strtoll(ts, NULL, 10);
	char *multi;

	assert_int_equal(webhook_signing_key_decode(secret, &key, &klen), 0);
	assert_int_equal(klen, 24);
	assert_int_equal(webhook_standard_verify(key, klen, id, ts, sig,
	    payload, strlen(payload), t, &reason), 0);
	/* within the window on both sides, its ends included */
	assert_int_equal(webhook_standard_verify(key, klen, id, ts, sig,
	    payload, strlen(payload), t + 299, &reason), 0);
	assert_int_equal(webhook_standard_verify(key, klen, id, ts, sig,
	    payload, strlen(payload), t + WEBHOOK_TIMESTAMP_WINDOW_S, &reason),
	    0);
	assert_int_equal(webhook_standard_verify(key, klen, id, ts, sig,
	    payload, strlen(payload), t - WEBHOOK_TIMESTAMP_WINDOW_S, &reason),
	    0);
	/* outside it refused */
	assert_int_equal(webhook_standard_verify(key, klen, id, ts, sig,
	    payload, strlen(payload), t + 301, &reason), -1);
	assert_int_equal(webhook_standard_verify(key, klen, id, ts, sig,
	    payload, strlen(payload), t - 301, &reason), -1);
	/* tampered body and id */
	assert_int_equal(webhook_standard_verify(key, klen, id, ts, sig,
	    "{\"test\": 2432232315}", strlen(payload), t, &reason), -1);
	assert_int_equal(webhook_standard_verify(key, klen, "msg_x", ts, sig,
	    payload, strlen(payload), t, &reason), -1);
	/* one byte of the MAC changed, at each of the 32 places: refused */
	{
		unsigned char *raw = NULL;
		size_t rlen = 0, i;

		assert_int_equal(strncmp(sig, "v1,", 3), 0);
		assert_int_equal(base64_decode(sig + 3, strlen(sig + 3), &raw,
		    &rlen), 0);
		assert_int_equal(rlen, 32);
		for (i = 0; i < rlen; i++) {
			char *b64, *bad;

			raw[i] ^= 0x01;
			b64 = base64_encode(raw, rlen, 0, 1);
			bad = xasprintf("v1,%s", b64);
			assert_int_equal(webhook_standard_verify(key, klen, id,
			    ts, bad, payload, strlen(payload), t, &reason), -1);
			assert_string_equal(reason, "bad webhook-signature");
			free(bad);
			free(b64);
			raw[i] ^= 0x01;
		}
		free(raw);
	}
	/* several signatures, one good */
	multi = xasprintf("v1,AAAA v2,xyz %s", sig);
	assert_int_equal(webhook_standard_verify(key, klen, id, ts, multi,
	    payload, strlen(payload), t, &reason), 0);
	free(multi);
	assert_int_equal(webhook_standard_verify(key, klen, id, ts,
	    "v1,!!!notbase64", payload, strlen(payload), t, &reason), -1);
	assert_int_equal(webhook_standard_verify(key, klen, id, NULL, sig,
	    payload, strlen(payload), t, &reason), -1);
	assert_int_equal(webhook_standard_verify(key, klen, id, "12ab", sig,
	    payload, strlen(payload), t, &reason), -1);
	assert_string_equal(reason, "bad webhook-timestamp");
	/*
	 * the right time followed by anything, nothing (not read as 0), or a
	 * number no int64 holds is not a timestamp
	 */
	{
		char *junk = xasprintf("%sx", ts);
		const char *const bad[] = { junk, "", "99999999999999999999",
		    "-99999999999999999999" };
		size_t i;

		for (i = 0; i < ARRAY_SIZE(bad); i++) {
			assert_int_equal(webhook_standard_verify(key, klen, id,
			    bad[i], sig, payload, strlen(payload), t, &reason),
			    -1);
			assert_string_equal(reason, "bad webhook-timestamp");
		}
		free(junk);
	}
	standard_mac_forms(key, klen, id, ts, sig, payload, t);
	free(key);
	json_decref(root);
	free(text);
}

/* The signing key: whsec_ and base64, never empty. */
static void
gitlab_signing_key(void **state)
{
	unsigned char *key = NULL;
	size_t klen = 0;

	(void)state;
	assert_int_equal(webhook_signing_key_decode("whsec_AAEC", &key,
	    &klen), 0);
	assert_int_equal(klen, 3);
	assert_memory_equal(key, "\x00\x01\x02", 3);
	free(key);
	key = NULL;
	assert_int_equal(webhook_signing_key_decode("AAEC", &key, &klen), 0);
	assert_int_equal(klen, 3);
	free(key);
	key = NULL;
	/* no key at all would sign with an empty HMAC key */
	assert_int_equal(webhook_signing_key_decode("whsec_", &key, &klen),
	    -1);
	assert_int_equal(webhook_signing_key_decode("", &key, &klen), -1);
	assert_int_equal(webhook_signing_key_decode("whsec_!!", &key, &klen),
	    -1);
}

static void
gitlab_tokens(void **state)
{
	struct webhook_keys k;
	const char *s[2] = { "token-one", "token-two" };
	size_t l[2] = { 9, 9 };

	memset(&k, 0, sizeof(k));
	k.secrets = s;
	k.secret_lens = l;
	k.nsecrets = 2;
	assert_int_equal(webhook_gitlab_verify_token(&k, "token-two"), 0);
	assert_int_equal(webhook_gitlab_verify_token(&k, "token-one"), 0);
	assert_int_equal(webhook_gitlab_verify_token(&k, "token-on"), -1);
	assert_int_equal(webhook_gitlab_verify_token(&k, "token-one "), -1);
	assert_int_equal(webhook_gitlab_verify_token(&k, ""), -1);
	assert_int_equal(webhook_gitlab_verify_token(&k, NULL), -1);
	/*
	 * Near misses: one character replaced at each place, by each
	 * printable character, and the token with a suffix: 900-odd tokens,
	 * none accepted. A check that compared a part of the digests only
	 * would let some through.
	 */
	{
		char tok[32];
		size_t pos;
		int c, n = 0;

		for (pos = 0; pos < 9; pos++)
			for (c = 0x21; c < 0x7f; c++) {
				memcpy(tok, "token-one", 10);
				if (tok[pos] == c)
					continue;
				tok[pos] = (char)c;
				assert_int_equal(webhook_gitlab_verify_token(&k,
				    tok), -1);
				n++;
			}
		for (c = 0; c < 100; c++) {
			snprintf(tok, sizeof(tok), "token-two%d", c);
			assert_int_equal(webhook_gitlab_verify_token(&k, tok),
			    -1);
			n++;
		}
		assert_true(n > 900);
	}
}

/* ---- prefilter ---- */

static void
prefilter(void **state)
{
	static const struct {
		const char *text;
		int want;
	} cases[] = {
		{ "/diverge fix it", 1 },
		{ "/diverge", 1 },
		{ "/DIVERGE status", 1 },
		{ "   /diverge pause", 1 },
		{ "    /diverge pause", 0 },	/* 4 spaces: code block */
		{ "hello\n/diverge help\n", 1 },
		{ "hello\r\n/diverge help\r\n", 1 },
		{ "hello /diverge help", 0 },
		{ "/divergent idea", 0 },
		{ "/diverge-x", 0 },
		{ "/diverge\tfix", 1 },
		{ "/diverge\r\nhelp", 1 },
		{ "/diverge\rhelp", 1 },
		{ "", 0 },
		{ "/diverg", 0 },
		{ "text\n\n/diverge", 1 },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++)
		assert_int_equal(webhook_has_command_line(cases[i].text,
		    strlen(cases[i].text)), cases[i].want);
}

/* ---- fixtures as they are ---- */

struct fixture_case {
	enum scm_provider provider;
	const char *event;
	const char *file;
	enum webhook_verdict verdict;
	const char *reason;	/* substring of the reason */
};

static const struct fixture_case fixtures[] = {
	{ SCM_GITHUB, "issue_comment", "github/go-playground--issue-comment.json", WH_IGNORE, "not a pull request" },
	{ SCM_GITHUB, "ping", "github/go-playground--ping.json", WH_IGNORE, "ping" },
	{ SCM_GITHUB, "issue_comment", "github/go-playground--pull-request-issue-comment.json", WH_IGNORE, "no /diverge command" },
	{ SCM_GITHUB, "pull_request_review_comment", "github/go-playground--pull-request-review-comment.json", WH_IGNORE, "no /diverge command" },
	{ SCM_GITHUB, "pull_request", "github/go-playground--pull-request.json", WH_IGNORE, "other than closed" },
	{ SCM_GITHUB, "issue_comment", "github/octokit-webhooks--issue_comment.created.with-installation.payload.json", WH_IGNORE, "not a pull request" },
	{ SCM_GITHUB, "issue_comment", "github/octokit-webhooks--issue_comment.edited.payload.json", WH_IGNORE, "not newly created" },
	{ SCM_GITHUB, "ping", "github/octokit-webhooks--ping.payload.json", WH_IGNORE, "ping" },
	{ SCM_GITHUB, "pull_request", "github/octokit-webhooks--pull_request.closed.payload.json", WH_ACCEPT, NULL },
	{ SCM_GITHUB, "pull_request", "github/octokit-webhooks--pull_request.opened.payload.json", WH_IGNORE, "other than closed" },
	{ SCM_GITHUB, "pull_request_review_comment", "github/octokit-webhooks--pull_request_review_comment.created.payload.json", WH_IGNORE, "no /diverge command" },
	{ SCM_GITLAB, "Note Hook", "gitlab/gitlab-docs--comment-on-a-code-snippet.json", WH_IGNORE, "not on a merge request" },
	{ SCM_GITLAB, "Note Hook", "gitlab/gitlab-docs--comment-on-a-commit.json", WH_IGNORE, "not on a merge request" },
	{ SCM_GITLAB, "Note Hook", "gitlab/gitlab-docs--comment-on-a-merge-request.json", WH_IGNORE, "no /diverge command" },
	{ SCM_GITLAB, "Note Hook", "gitlab/gitlab-docs--comment-on-an-issue.json", WH_IGNORE, "not on a merge request" },
	{ SCM_GITLAB, "Merge Request Hook", "gitlab/gitlab-docs--merge-request-events.json", WH_IGNORE, "other than close or merge" },
	{ SCM_GITLAB, "Merge Request Hook", "gitlab/go-gitlab--merge_request.json", WH_IGNORE, "other than close or merge" },
	{ SCM_GITLAB, "Note Hook", "gitlab/go-gitlab--note_commit.json", WH_IGNORE, "not on a merge request" },
	{ SCM_GITLAB, "Note Hook", "gitlab/go-gitlab--note_issue.json", WH_IGNORE, "not on a merge request" },
	{ SCM_GITLAB, "Note Hook", "gitlab/go-gitlab--note_merge_request.json", WH_IGNORE, "no /diverge command" },
	{ SCM_GITLAB, "Note Hook", "gitlab/go-gitlab--note_snippet.json", WH_IGNORE, "not on a merge request" },
	{ SCM_GITLAB, "Push Hook", "gitlab/go-gitlab--push.json", WH_IGNORE, "event not handled" },
	{ SCM_GITLAB, "Note Hook", "gitlab/go-playground--comment-commit-event.json", WH_IGNORE, "not on a merge request" },
	{ SCM_GITLAB, "Note Hook", "gitlab/go-playground--comment-issue-event.json", WH_IGNORE, "not on a merge request" },
	{ SCM_GITLAB, "Note Hook", "gitlab/go-playground--comment-merge-request-event.json", WH_IGNORE, "no /diverge command" },
	{ SCM_GITLAB, "Note Hook", "gitlab/go-playground--comment-snippet-event.json", WH_IGNORE, "not on a merge request" },
	{ SCM_GITLAB, "Confidential Note Hook", "gitlab/go-playground--confidential-comment-event.json", WH_IGNORE, "not on a merge request" },
	{ SCM_GITLAB, "Merge Request Hook", "gitlab/go-playground--merge-request-event.json", WH_IGNORE, "other than close or merge" },
	{ SCM_GITLAB, "Push Hook", "gitlab/go-playground--push-event.json", WH_IGNORE, "event not handled" },
};

static char *
fixture(const char *file, size_t *len)
{
	char *rel = xasprintf("tests/data/webhooks/%s", file);
	char *t = test_read_file(rel, len);

	free(rel);
	return t;
}

static void
fixtures_as_is(void **state)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(fixtures); i++) {
		const struct fixture_case *c = &fixtures[i];
		struct scm_event ev;
		const char *reason = NULL;
		size_t len;
		char *body = fixture(c->file, &len);
		enum webhook_verdict v;

		memset(&ev, 0, sizeof(ev));
		v = webhook_normalize(c->provider, c->event, "d-1", body, len,
		    NULL, &ev, &reason);
		if (v != c->verdict)
			fprintf(stderr, "# %s: verdict %d reason %s\n",
			    c->file, v, reason ? reason : "-");
		assert_int_equal(v, c->verdict);
		if (c->reason != NULL) {
			assert_non_null(reason);
			assert_non_null(strstr(reason, c->reason));
		}
		scm_event_release(&ev);
		free(body);
	}
}

/* A fixture as a JSON document; the caller releases it. */
static json_t *
fixture_doc(const char *file)
{
	size_t len;
	char *text = fixture(file, &len);
	json_t *root = json_loadb(text, len, 0, NULL);

	assert_non_null(root);
	free(text);
	return root;
}

/* A fixture with its comment (GitHub) or note (GitLab) body replaced. */
static json_t *
doc_with_body(enum scm_provider p, const char *file, const char *newbody)
{
	json_t *root = fixture_doc(file);

	if (p == SCM_GITHUB)
		json_object_set_new(json_object_get(root, "comment"), "body",
		    json_string(newbody));
	else
		json_object_set_new(json_object_get(root,
		    "object_attributes"), "note", json_string(newbody));
	return root;
}

/* Normalize a document, compact, as the delivery "d-2". */
static enum webhook_verdict
normalize_doc(enum scm_provider p, const char *event, const json_t *root,
    const struct webhook_identity *self, struct scm_event *ev,
    const char **reason)
{
	char *out = json_dumps(root, JSON_COMPACT);
	enum webhook_verdict v;

	memset(ev, 0, sizeof(*ev));
	v = webhook_normalize(p, event, "d-2", out, strlen(out), self, ev,
	    reason);
	free(out);
	return v;
}

/*
 * Replace the comment body of a fixture (and, with gl_user, a GitLab
 * note's author username) and normalize it.
 */
static enum webhook_verdict
with_body_by(enum scm_provider p, const char *event, const char *file,
    const char *newbody, const char *gl_user,
    const struct webhook_identity *self, struct scm_event *ev,
    const char **reason)
{
	json_t *root = doc_with_body(p, file, newbody);
	enum webhook_verdict v;

	if (gl_user != NULL)
		json_object_set_new(json_object_get(root, "user"), "username",
		    json_string(gl_user));
	v = normalize_doc(p, event, root, self, ev, reason);
	json_decref(root);
	return v;
}

/* Replace the comment body of a fixture and normalize it. */
static enum webhook_verdict
with_body(enum scm_provider p, const char *event, const char *file,
    const char *newbody, const struct webhook_identity *self,
    struct scm_event *ev, const char **reason)
{
	return with_body_by(p, event, file, newbody, NULL, self, ev, reason);
}

static void
fixtures_with_command(void **state)
{
	struct scm_event ev;
	const char *reason;
	struct webhook_identity self = { "diverge-bot[bot]", "diverge-bot",
	    4242 };
	/* the fixture's merge request is from project 5 to project 5 */
	static const struct {
		json_int_t src, dst;	/* 0: removed */
		int fork;
	} forks[] = {
		{ 5, 5, 0 }, { 6, 5, 1 }, { 0, 5, -1 }, { 6, 0, -1 },
	};
	json_t *root;
	size_t i;

	/* GitHub: issue_comment on a PR */
	assert_int_equal(with_body(SCM_GITHUB, "issue_comment",
	    "github/go-playground--pull-request-issue-comment.json",
	    "please\n/diverge fix the N+1 query", &self, &ev, &reason),
	    WH_ACCEPT);
	assert_int_equal(ev.kind, SCM_EV_COMMENT);
	assert_string_equal(ev.repo, "chhsia0/knative-route-demo");
	assert_int_equal(ev.number, 3);
	assert_int_equal(ev.comment_id, 546616131);
	assert_string_equal(ev.author_login, "chhsia0");
	assert_string_equal(ev.author_type, "User");
	assert_string_equal(ev.author_hint, "OWNER");
	assert_string_equal(ev.comment_body,
	    "please\n/diverge fix the N+1 query");
	assert_string_equal(ev.delivery, "d-2");
	assert_null(ev.head_ref);	/* issue_comment carries no refs */
	scm_event_release(&ev);

	/* the same comment on a plain issue stays ignored */
	assert_int_equal(with_body(SCM_GITHUB, "issue_comment",
	    "github/go-playground--issue-comment.json", "/diverge fix x",
	    &self, &ev, &reason), WH_IGNORE);
	scm_event_release(&ev);
	/* and so does one whose issue has "pull_request": null */
	root = doc_with_body(SCM_GITHUB,
	    "github/go-playground--pull-request-issue-comment.json",
	    "/diverge fix x");
	json_object_set_new(json_object_get(root, "issue"), "pull_request",
	    json_null());
	assert_int_equal(normalize_doc(SCM_GITHUB, "issue_comment", root,
	    &self, &ev, &reason), WH_IGNORE);
	assert_string_equal(reason, "comment on an issue, not a pull request");
	scm_event_release(&ev);
	json_decref(root);
	/* an edit with a command stays ignored */
	assert_int_equal(with_body(SCM_GITHUB, "issue_comment",
	    "github/octokit-webhooks--issue_comment.edited.payload.json",
	    "/diverge fix x", &self, &ev, &reason), WH_IGNORE);
	scm_event_release(&ev);

	/* review comment: refs and installation come with it */
	assert_int_equal(with_body(SCM_GITHUB, "pull_request_review_comment",
	    "github/octokit-webhooks--pull_request_review_comment.created."
	    "payload.json", "/diverge status", &self, &ev, &reason),
	    WH_ACCEPT);
	assert_string_equal(ev.repo, "Codertocat/Hello-World");
	assert_int_equal(ev.number, 2);
	assert_int_equal(ev.comment_id, 284312630);
	assert_string_equal(ev.head_ref, "changes");
	assert_string_equal(ev.base_ref, "master");
	assert_int_equal(ev.installation_id, 1);
	assert_int_equal(ev.review_comment, 1);
	assert_int_equal(ev.fork, 0);
	scm_event_release(&ev);

	/* GitLab: note on an MR */
	assert_int_equal(with_body(SCM_GITLAB, "Note Hook",
	    "gitlab/gitlab-docs--comment-on-a-merge-request.json",
	    "/diverge fix make it fast", &self, &ev, &reason), WH_ACCEPT);
	assert_string_equal(ev.repo, "gitlab-org/gitlab-test");
	assert_int_equal(ev.project_id, 5);
	assert_int_equal(ev.number, 1);
	assert_int_equal(ev.comment_id, 1244);
	assert_string_equal(ev.author_login, "root");
	assert_string_equal(ev.head_ref, "master");
	assert_string_equal(ev.base_ref, "markdown");
	assert_int_equal(ev.fork, 0);
	scm_event_release(&ev);
	/*
	 * a fork when the source project is another; unknown when either
	 * project id is missing
	 */
	for (i = 0; i < ARRAY_SIZE(forks); i++) {
		json_t *mr;

		root = doc_with_body(SCM_GITLAB,
		    "gitlab/gitlab-docs--comment-on-a-merge-request.json",
		    "/diverge fix x");
		mr = json_object_get(root, "merge_request");
		if (forks[i].src == 0)
			json_object_del(mr, "source_project_id");
		else
			json_object_set_new(mr, "source_project_id",
			    json_integer(forks[i].src));
		if (forks[i].dst == 0)
			json_object_del(mr, "target_project_id");
		assert_int_equal(normalize_doc(SCM_GITLAB, "Note Hook", root,
		    &self, &ev, &reason), WH_ACCEPT);
		assert_int_equal(ev.fork, forks[i].fork);
		scm_event_release(&ev);
		json_decref(root);
	}
	/* the older shape without action is a creation */
	assert_int_equal(with_body(SCM_GITLAB, "Note Hook",
	    "gitlab/go-playground--comment-merge-request-event.json",
	    "/diverge help", &self, &ev, &reason), WH_ACCEPT);
	scm_event_release(&ev);
	/* notes on issues never count */
	assert_int_equal(with_body(SCM_GITLAB, "Note Hook",
	    "gitlab/go-gitlab--note_issue.json", "/diverge fix x", &self,
	    &ev, &reason), WH_IGNORE);
	scm_event_release(&ev);
}

/*
 * Project and group access token bots (project_<id>_bot, a counter on
 * older GitLab, "_<hex>" on newer) and service accounts' default names
 * are ignored; look-alikes a person may pick are not.
 */
static const struct {
	const char *username;
	enum webhook_verdict verdict;
} gitlab_names[] = {
	{ "project_278964_bot_3d6a0b2c", WH_IGNORE },
	{ "project_5_bot_e9b7c2a4d1f06c83a5b2e7d9f1c04a6b1", WH_IGNORE },
	{ "project_5_bot", WH_IGNORE },
	{ "project_5_bot2", WH_IGNORE },
	{ "group_9970_bot_5f1e8c2d7a3b4c6e9d0f1a2b3c4d5e6f", WH_IGNORE },
	{ "group_109_bot", WH_IGNORE },
	{ "service_account_3f9a1c6e2b7d4f80a1c3e5b7d9f1a2c4", WH_IGNORE },
	{ "service_account_group_9970_4b2d6f8a1c3e5b7d", WH_IGNORE },
	{ "service_account_project_5_a1b2c3", WH_IGNORE },
	{ "project_5_botany", WH_ACCEPT },
	{ "project_bot", WH_ACCEPT },
	{ "group_lead", WH_ACCEPT },
	{ "service_accountant", WH_ACCEPT },
	{ "projectbot_5", WH_ACCEPT },
	{ "raymond_smith", WH_ACCEPT },
};

static void
bots_and_self(void **state)
{
	struct scm_event ev;
	const char *reason;
	/* the authors' names, as configured: the case does not matter */
	const struct webhook_identity selves[] = {
		{ "chhsia0", "root", 0 }, { "CHHSIA0", "Root", 0 },
	};
	struct webhook_identity self = { NULL, "diverge-bot", 1 };
	size_t i;
	json_t *root;

	/* our own comment */
	for (i = 0; i < ARRAY_SIZE(selves); i++) {
		assert_int_equal(with_body(SCM_GITHUB, "issue_comment",
		    "github/go-playground--pull-request-issue-comment.json",
		    "/diverge fix x", &selves[i], &ev, &reason), WH_IGNORE);
		assert_string_equal(reason, "comment by diverge itself");
		scm_event_release(&ev);
		assert_int_equal(with_body(SCM_GITLAB, "Note Hook",
		    "gitlab/gitlab-docs--comment-on-a-merge-request.json",
		    "/diverge fix x", &selves[i], &ev, &reason), WH_IGNORE);
		assert_string_equal(reason, "comment by diverge itself");
		scm_event_release(&ev);
	}
	/* on GitLab, our user id under another username (the note's is 1) */
	assert_int_equal(with_body(SCM_GITLAB, "Note Hook",
	    "gitlab/gitlab-docs--comment-on-a-merge-request.json",
	    "/diverge fix x", &self, &ev, &reason), WH_IGNORE);
	assert_string_equal(reason, "comment by diverge itself");
	scm_event_release(&ev);
	/* our id unknown (0) and a note without user.id: not ours */
	self.gitlab_user_id = 0;
	root = doc_with_body(SCM_GITLAB,
	    "gitlab/gitlab-docs--comment-on-a-merge-request.json",
	    "/diverge fix x");
	json_object_del(json_object_get(root, "user"), "id");
	assert_int_equal(normalize_doc(SCM_GITLAB, "Note Hook", root, &self,
	    &ev, &reason), WH_ACCEPT);
	assert_int_equal(ev.author_id, 0);
	scm_event_release(&ev);
	json_decref(root);

	/* another bot (GitHub user.type Bot) */
	root = doc_with_body(SCM_GITHUB,
	    "github/go-playground--pull-request-issue-comment.json",
	    "/diverge fix x");
	json_object_set_new(json_object_get(json_object_get(root, "comment"),
	    "user"), "type", json_string("Bot"));
	assert_int_equal(normalize_doc(SCM_GITHUB, "issue_comment", root, NULL,
	    &ev, &reason), WH_IGNORE);
	assert_string_equal(reason, "comment by a bot");
	scm_event_release(&ev);
	json_decref(root);

	/* GitLab's machine users, by the names GitLab gives them */
	for (i = 0; i < ARRAY_SIZE(gitlab_names); i++) {
		assert_int_equal(with_body_by(SCM_GITLAB, "Note Hook",
		    "gitlab/gitlab-docs--comment-on-a-merge-request.json",
		    "/diverge fix x", gitlab_names[i].username, NULL, &ev,
		    &reason), gitlab_names[i].verdict);
		if (gitlab_names[i].verdict == WH_IGNORE)
			assert_string_equal(reason, "comment by a bot");
		scm_event_release(&ev);
	}
}

static void
closed_and_merged(void **state)
{
	static const char *const others[] = { "open", "reopen", "update",
	    "approved", "unapproved", "approval", "unapproval" };
	struct scm_event ev;
	const char *reason;
	size_t len, i;
	char *text = fixture(
	    "github/octokit-webhooks--pull_request.closed.payload.json", &len);
	json_t *root = json_loads(text, 0, NULL);
	char *out;

	assert_int_equal(webhook_normalize(SCM_GITHUB, "pull_request", "d",
	    text, len, NULL, &ev, &reason), WH_ACCEPT);
	assert_int_equal(ev.kind, SCM_EV_CLOSED);
	assert_int_equal(ev.number, 2);
	assert_string_equal(ev.repo, "Codertocat/Hello-World");
	scm_event_release(&ev);
	json_object_set_new(json_object_get(root, "pull_request"), "merged",
	    json_true());
	out = json_dumps(root, JSON_COMPACT);
	assert_int_equal(webhook_normalize(SCM_GITHUB, "pull_request", "d",
	    out, strlen(out), NULL, &ev, &reason), WH_ACCEPT);
	assert_int_equal(ev.kind, SCM_EV_MERGED);
	scm_event_release(&ev);
	free(out);
	/* without the top-level number, the pull request's */
	json_object_del(root, "number");
	assert_int_equal(normalize_doc(SCM_GITHUB, "pull_request", root, NULL,
	    &ev, &reason), WH_ACCEPT);
	assert_int_equal(ev.number, 2);
	scm_event_release(&ev);
	json_decref(root);
	free(text);

	/* GitLab merge and close */
	text = fixture("gitlab/go-gitlab--merge_request.json", &len);
	root = json_loads(text, 0, NULL);
	json_object_set_new(json_object_get(root, "object_attributes"),
	    "action", json_string("merge"));
	out = json_dumps(root, JSON_COMPACT);
	assert_int_equal(webhook_normalize(SCM_GITLAB, "Merge Request Hook",
	    "d", out, strlen(out), NULL, &ev, &reason), WH_ACCEPT);
	assert_int_equal(ev.kind, SCM_EV_MERGED);
	assert_int_equal(ev.number, 1);
	assert_string_equal(ev.repo, "gitlabhq/gitlab-test");
	scm_event_release(&ev);
	free(out);
	json_object_set_new(json_object_get(root, "object_attributes"),
	    "action", json_string("close"));
	out = json_dumps(root, JSON_COMPACT);
	assert_int_equal(webhook_normalize(SCM_GITLAB, "Merge Request Hook",
	    "d", out, strlen(out), NULL, &ev, &reason), WH_ACCEPT);
	assert_int_equal(ev.kind, SCM_EV_CLOSED);
	scm_event_release(&ev);
	free(out);
	/* GitLab's other merge request actions are neither */
	for (i = 0; i < ARRAY_SIZE(others); i++) {
		json_object_set_new(json_object_get(root, "object_attributes"),
		    "action", json_string(others[i]));
		assert_int_equal(normalize_doc(SCM_GITLAB, "Merge Request Hook",
		    root, NULL, &ev, &reason), WH_IGNORE);
		assert_string_equal(reason,
		    "merge request event other than close or merge");
		scm_event_release(&ev);
	}
	json_decref(root);
	free(text);
}

static void
bad_shapes(void **state)
{
	static const struct {
		const char *event;
		const char *json;
	} cases[] = {
		{ "issue_comment", "{" },
		{ "issue_comment", "[]" },
		{ "issue_comment", "\"x\"" },
		{ "issue_comment", "{\"action\":5}" },
		{ "issue_comment", "{}" },
		{ "issue_comment", "{\"action\":\"created\",\"issue\":{\"number\":1,\"pull_request\":{}},\"comment\":{\"id\":1,\"user\":{\"login\":\"a\"}},\"repository\":{\"full_name\":\"o/r\"}}" },
		{ "issue_comment", "{\"action\":\"created\",\"issue\":{\"number\":1,\"pull_request\":{}},\"comment\":{\"id\":\"1\",\"body\":\"/diverge x\",\"user\":{\"login\":\"a\"}},\"repository\":{\"full_name\":\"o/r\"}}" },
		{ "issue_comment", "{\"action\":\"created\",\"issue\":{\"number\":1e400,\"pull_request\":{}}}" },
		{ "issue_comment", "{\"action\":\"created\",\"issue\":{\"number\":99999999999999999999999,\"pull_request\":{}}}" },
		{ "issue_comment", "{\"action\":\"created\",\"issue\":{\"number\":-4,\"pull_request\":{}},\"comment\":{\"id\":1,\"body\":\"/diverge x\",\"user\":{\"login\":\"a\"}},\"repository\":{\"full_name\":\"o/r\"}}" },
		{ "issue_comment", "{\"action\":\"created\",\"issue\":7}" },
		{ "issue_comment", "{\"a\":1,\"a\":2}" },
		{ "pull_request", "{\"action\":\"closed\"}" },
		{ "pull_request", "{\"action\":\"closed\",\"number\":2,\"pull_request\":{\"merged\":\"yes\"},\"repository\":{\"full_name\":\"o/r\"}}" },
	};
	struct scm_event ev;
	const char *reason;
	size_t i;
	struct buf deep;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		memset(&ev, 0, sizeof(ev));
		reason = NULL;
		assert_int_equal(webhook_normalize(SCM_GITHUB, cases[i].event,
		    "d", cases[i].json, strlen(cases[i].json), NULL, &ev,
		    &reason), WH_BAD_REQUEST);
		assert_non_null(reason);
	}
	/* 10,000-deep nesting */
	buf_init(&deep, 1 << 20);
	for (i = 0; i < 10000; i++)
		buf_addstr(&deep, "{\"a\":");
	buf_addstr(&deep, "1");
	for (i = 0; i < 10000; i++)
		buf_addstr(&deep, "}");
	assert_int_equal(webhook_normalize(SCM_GITHUB, "issue_comment", "d",
	    deep.data, deep.len, NULL, &ev, &reason), WH_BAD_REQUEST);
	buf_reset(&deep);
	for (i = 0; i < 10000; i++)
		buf_addstr(&deep, "[");
	assert_int_equal(webhook_normalize(SCM_GITLAB, "Note Hook", "d",
	    deep.data, deep.len, NULL, &ev, &reason), WH_BAD_REQUEST);
	buf_release(&deep);
	/* GitLab: wrong types */
	assert_int_equal(webhook_normalize(SCM_GITLAB, "Note Hook", "d",
	    "{\"object_attributes\":{\"noteable_type\":3}}", 42, NULL, &ev,
	    &reason), WH_BAD_REQUEST);
	assert_int_equal(webhook_normalize(SCM_GITLAB, "Merge Request Hook",
	    "d", "{\"object_attributes\":{\"action\":\"merge\"}}", 40, NULL,
	    &ev, &reason), WH_BAD_REQUEST);
	/* JSON's whitespace before the object is no shape error */
	assert_int_equal(webhook_normalize(SCM_GITHUB, "ping", "d",
	    " \t\r\n{\"zen\":\"z\"}", 15, NULL, &ev, &reason), WH_IGNORE);
	assert_string_equal(reason, "ping");
	scm_event_release(&ev);
}

/* A GitLab fixture with one object_attributes field replaced, compact. */
static char *
gitlab_edited(const char *file, const char *field, const char *value)
{
	size_t len;
	char *text = fixture(file, &len);
	json_t *root = json_loads(text, 0, NULL);
	char *out;

	assert_non_null(root);
	json_object_set_new(json_object_get(root, "object_attributes"), field,
	    json_string(value));
	out = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	free(text);
	return out;
}

/*
 * The headers of a GitLab Note Hook with the token "sekrit"; g->k[3] on
 * are free for more.
 */
static void
gitlab_note_headers(struct hdrs *g)
{
	memset(g, 0, sizeof(*g));
	g->k[0] = "Content-Type";
	g->v[0] = "application/json";
	g->k[1] = "X-Gitlab-Token";
	g->v[1] = "sekrit";
	g->k[2] = "X-Gitlab-Event";
	g->v[2] = "Note Hook";
}

/* A GitHub ping's body. */
static const char ping_body[] = "{\"zen\":\"Keep it logically awesome.\","
    "\"hook_id\":1}";

static void
handle_requests(void **state)
{
	const char *body = ping_body;
	struct webhook_keys k;
	const char *s[1];
	size_t l[1];
	struct scm_event ev;
	const char *reason;
	char *sig = sign_github("sekrit", body, strlen(body));
	char *form, *esc, *fsig;
	struct hdrs h = { { "Content-Type", "X-Hub-Signature-256",
	    "X-GitHub-Event", "X-GitHub-Delivery" }, { "application/json",
	    sig, "ping", "abc-1" } };
	struct hdrs g;
	char *gl2, *digest;

	one_key(&k, s, l, "sekrit");
	memset(&ev, 0, sizeof(ev));
	assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h, body,
	    strlen(body), 0, &ev, &reason), WH_IGNORE);
	assert_string_equal(reason, "ping");
	scm_event_release(&ev);
	/* charset parameter is fine */
	h.v[0] = "application/json; charset=utf-8";
	assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h, body,
	    strlen(body), 0, &ev, &reason), WH_IGNORE);
	scm_event_release(&ev);
	/* wrong content type, before anything else */
	h.v[0] = "text/plain";
	assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h, body,
	    strlen(body), 0, &ev, &reason), WH_UNSUPPORTED);
	h.v[0] = "application/json";
	/* bad signature */
	h.v[1] = "sha256=00";
	assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h, body,
	    strlen(body), 0, &ev, &reason), WH_UNAUTHORIZED);
	h.v[1] = sig;
	/* missing event / delivery headers */
	h.k[2] = "X-Other";
	assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h, body,
	    strlen(body), 0, &ev, &reason), WH_BAD_REQUEST);
	h.k[2] = "X-GitHub-Event";
	h.v[2] = "";
	assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h, body,
	    strlen(body), 0, &ev, &reason), WH_BAD_REQUEST);
	assert_string_equal(reason, "missing X-GitHub-Event");
	h.v[2] = "ping";
	/* a delivery id is printable ASCII, 200 characters at most */
	{
		static const char *const bad[] = { "has space", "del\x7f",
		    "caf\xc3\xa9" };
		char id[202];
		size_t i;

		for (i = 0; i < ARRAY_SIZE(bad); i++) {
			h.v[3] = bad[i];
			assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL,
			    hget, &h, body, strlen(body), 0, &ev, &reason),
			    WH_BAD_REQUEST);
			assert_string_equal(reason,
			    "missing or invalid X-GitHub-Delivery");
		}
		memset(id, 'a', 201);
		id[201] = '\0';
		h.v[3] = id;
		assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h,
		    body, strlen(body), 0, &ev, &reason), WH_BAD_REQUEST);
		id[200] = '\0';
		assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h,
		    body, strlen(body), 0, &ev, &reason), WH_IGNORE);
		assert_string_equal(ev.delivery, id);
		scm_event_release(&ev);
	}
	h.v[3] = "abc-1";

	/* form-encoded: the signature covers the raw form body */
	esc = xstrdup("payload=%7B%22zen%22%3A%22a+b%22%2C%22hook_id%22%3A1%7D");
	fsig = sign_github("sekrit", esc, strlen(esc));
	h.v[0] = "application/x-www-form-urlencoded";
	h.v[1] = fsig;
	assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h, esc,
	    strlen(esc), 0, &ev, &reason), WH_IGNORE);
	assert_string_equal(reason, "ping");
	scm_event_release(&ev);
	form = xstrdup("other=1");
	free(fsig);
	fsig = sign_github("sekrit", form, strlen(form));
	h.v[1] = fsig;
	assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h, form,
	    strlen(form), 0, &ev, &reason), WH_BAD_REQUEST);
	free(form);
	/*
	 * the payload field among others is read; given twice (an empty
	 * one too), or with a broken %-escape, the body is refused (signed,
	 * so a 400, not 401)
	 */
	{
		static const struct {
			const char *form;
			enum webhook_verdict want;
		} forms[] = {
			{ "a=1&payload=%7B%22zen%22%3A%22z%22%2C%22hook_id%22"
			    "%3A1%7D&b=2", WH_IGNORE },
			{ "payload=%7B%22zen%22%3A%22z%22%2C%22hook_id%22%3A1"
			    "%7D&payload=%7B%7D", WH_BAD_REQUEST },
			{ "payload=%7B%7D&payload=%7B%22zen%22%3A%22z%22%2C%22"
			    "hook_id%22%3A1%7D", WH_BAD_REQUEST },
			{ "payload=&payload=%7B%22zen%22%3A%22z%22%2C%22hook_id"
			    "%22%3A1%7D", WH_BAD_REQUEST },
			{ "payload=%7B%22zen%22%3A%22z%22%2C%22hook_id%22%3A1"
			    "%7D&payload=", WH_BAD_REQUEST },
			{ "payload=%7B%22zen%22%3A%22z%22%7D%7", WH_BAD_REQUEST },
			{ "payload=%7B%22zen%22%3A%22z%22%7D%", WH_BAD_REQUEST },
			{ "payload=%7B%22zen%22%3A%22z%22%7D%zz",
			    WH_BAD_REQUEST },
			{ "xpayload=%7B%7D", WH_BAD_REQUEST },
		};
		size_t fi;

		for (fi = 0; fi < ARRAY_SIZE(forms); fi++) {
			enum webhook_verdict got;

			free(fsig);
			fsig = sign_github("sekrit", forms[fi].form,
			    strlen(forms[fi].form));
			h.v[1] = fsig;
			got = webhook_handle(SCM_GITHUB, &k, NULL, hget, &h,
			    forms[fi].form, strlen(forms[fi].form), 0, &ev,
			    &reason);
			if (got != forms[fi].want)
				fprintf(stderr, "# form %zu: verdict %d, %s\n",
				    fi, (int)got, reason ? reason : "");
			assert_int_equal(got, forms[fi].want);
			scm_event_release(&ev);
		}
		/*
		 * an escape cut by the end of the body is not completed from
		 * the byte after it (here a 'D' that would make "%7D", and
		 * the payload valid JSON)
		 */
		form = xstrdup("payload=%7B%22zen%22%3A%22z%22%2C%22hook_id"
		    "%22%3A1%7D");
		free(fsig);
		fsig = sign_github("sekrit", form, strlen(form) - 1);
		h.v[1] = fsig;
		assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h,
		    form, strlen(form) - 1, 0, &ev, &reason), WH_BAD_REQUEST);
		free(form);
	}
	free(fsig);
	free(esc);
	free(sig);

	/* GitLab without any delivery id: keyed by the body's digest */
	gl2 = gitlab_edited(
	    "gitlab/gitlab-docs--comment-on-a-merge-request.json", "note",
	    "/diverge status");
	gitlab_note_headers(&g);
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, gl2,
	    strlen(gl2), 0, &ev, &reason), WH_ACCEPT);
	assert_int_equal(strlen(ev.delivery), 64);
	digest = ev.delivery;
	ev.delivery = NULL;	/* now ours */
	scm_event_release(&ev);
	/* an empty Idempotency-Key is none */
	g.k[3] = "Idempotency-Key";
	g.v[3] = "";
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, gl2,
	    strlen(gl2), 0, &ev, &reason), WH_ACCEPT);
	assert_string_equal(ev.delivery, digest);
	scm_event_release(&ev);
	free(digest);
	g.k[3] = "X-Gitlab-Event-UUID";
	g.v[3] = "uuid-1";
	g.k[4] = "Idempotency-Key";
	g.v[4] = "idem-1";
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, gl2,
	    strlen(gl2), 0, &ev, &reason), WH_ACCEPT);
	assert_string_equal(ev.delivery, "idem-1");
	scm_event_release(&ev);
	/* GitLab sends JSON only: another content type, before anything */
	g.v[0] = "application/x-www-form-urlencoded";
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, gl2,
	    strlen(gl2), 0, &ev, &reason), WH_UNSUPPORTED);
	assert_string_equal(reason, "content type must be application/json");
	g.v[0] = "application/json";
	g.v[1] = "wrong";
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, gl2,
	    strlen(gl2), 0, &ev, &reason), WH_UNAUTHORIZED);
	g.k[1] = "X-Nothing";
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, gl2,
	    strlen(gl2), 0, &ev, &reason), WH_UNAUTHORIZED);
	/*
	 * no token and no signing key (the configuration refuses that;
	 * webhook_handle does too, for any other caller): nothing verifies
	 */
	g.k[1] = "X-Gitlab-Token";
	k.nsecrets = 0;
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, gl2,
	    strlen(gl2), 0, &ev, &reason), WH_UNAUTHORIZED);
	assert_string_equal(reason, "no gitlab token configured");
	free(gl2);
}

/*
 * repo_allowlist at the door: the glob matches HOST/path whatever the
 * case, an accepted event of a repository no glob matches is ignored as
 * "repository not allowed" (with the event, for the log), authentication
 * still comes first, and pings and other ignored events keep their reason.
 */
static void
allowlist_at_the_door(void **state)
{
	const char *const mine[] = { "gitlab.example.com/other/*",
	    "gitlab.example.com/GitLab-Org/*" };
	const char *const other[] = { "gitlab.example.com/other/*",
	    "gitlab.com/gitlab-org/*" };
	const char *ping = ping_body;
	struct webhook_keys k;
	const char *s[1];
	size_t l[1];
	struct scm_event ev;
	const char *reason;
	struct hdrs g, h;
	char *note, *sig;

	assert_true(scm_repo_match("github.com/myorg/*", "github.com",
	    "MyOrg/Checkout"));
	assert_true(scm_repo_match("GitHub.com/MyOrg/*", "github.com",
	    "myorg/checkout"));
	assert_true(scm_repo_match("gitlab.com/group/*", "gitlab.com",
	    "group/sub/project"));
	assert_false(scm_repo_match("github.com/myorg/*", "github.com",
	    "myorg2/checkout"));
	assert_false(scm_repo_match("github.com/myorg/*", "ghe.example.com",
	    "myorg/checkout"));
	assert_true(scm_repo_allowed(NULL, 0, NULL, NULL));
	assert_true(scm_repo_allowed(mine, 2, "gitlab.example.com",
	    "gitlab-org/gitlab-test"));
	assert_false(scm_repo_allowed(other, 2, "gitlab.example.com",
	    "gitlab-org/gitlab-test"));
	assert_false(scm_repo_allowed(mine, 2, "gitlab.example.com", NULL));

	note = gitlab_edited(
	    "gitlab/gitlab-docs--comment-on-a-merge-request.json", "note",
	    "/diverge fix it");
	gitlab_note_headers(&g);
	g.k[3] = "Idempotency-Key";
	g.v[3] = "idem-allow";
	one_key(&k, s, l, "sekrit");
	k.host = "gitlab.example.com";
	/* an empty list: every repository, as before */
	memset(&ev, 0, sizeof(ev));
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, note,
	    strlen(note), 0, &ev, &reason), WH_ACCEPT);
	scm_event_release(&ev);
	k.allow = mine;
	k.nallow = 2;
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, note,
	    strlen(note), 0, &ev, &reason), WH_ACCEPT);
	assert_string_equal(ev.repo, "gitlab-org/gitlab-test");
	scm_event_release(&ev);
	k.allow = other;
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, note,
	    strlen(note), 0, &ev, &reason), WH_IGNORE);
	assert_string_equal(reason, "repository not allowed");
	assert_string_equal(reason, WEBHOOK_NOT_ALLOWED);
	assert_string_equal(ev.delivery, "idem-allow");
	assert_string_equal(ev.repo, "gitlab-org/gitlab-test");
	scm_event_release(&ev);
	g.v[1] = "wrong";
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, note,
	    strlen(note), 0, &ev, &reason), WH_UNAUTHORIZED);
	free(note);
	/* without a command: its own reason, not the list's */
	note = gitlab_edited(
	    "gitlab/gitlab-docs--comment-on-a-merge-request.json", "note",
	    "LGTM");
	g.v[1] = "sekrit";
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, note,
	    strlen(note), 0, &ev, &reason), WH_IGNORE);
	assert_string_equal(reason, "no /diverge command");
	scm_event_release(&ev);
	free(note);
	/* a ping is answered as before */
	sig = sign_github("sekrit", ping, strlen(ping));
	memset(&h, 0, sizeof(h));
	h.k[0] = "Content-Type";
	h.v[0] = "application/json";
	h.k[1] = "X-Hub-Signature-256";
	h.v[1] = sig;
	h.k[2] = "X-GitHub-Event";
	h.v[2] = "ping";
	h.k[3] = "X-GitHub-Delivery";
	h.v[3] = "ping-1";
	k.host = "github.com";
	assert_int_equal(webhook_handle(SCM_GITHUB, &k, NULL, hget, &h, ping,
	    strlen(ping), 0, &ev, &reason), WH_IGNORE);
	assert_string_equal(reason, "ping");
	scm_event_release(&ev);
	free(sig);
}

/* The key webhook_handle gives a GitLab delivery (it must accept it). */
static char *
gitlab_key(const struct webhook_keys *k, struct hdrs *g, const char *body,
    int64_t now)
{
	struct scm_event ev;
	const char *reason;
	char *key;

	memset(&ev, 0, sizeof(ev));
	assert_int_equal(webhook_handle(SCM_GITLAB, k, NULL, hget, g, body,
	    strlen(body), now, &ev, &reason), WH_ACCEPT);
	key = ev.delivery;
	ev.delivery = NULL;	/* now ours */
	scm_event_release(&ev);
	return key;
}

/* Assert the key webhook_handle gives a GitLab delivery. */
static void
assert_gitlab_key(const struct webhook_keys *k, struct hdrs *g,
    const char *body, int64_t now, const char *want)
{
	char *got = gitlab_key(k, g, body, now);

	assert_string_equal(got, want);
	free(got);
}

/*
 * GitLab 14.8 to 17.3 sends X-Gitlab-Event-UUID and no Idempotency-Key.
 * That UUID is the originating request's: every event the request triggers
 * carries it (a note with a /close quick action brings a Note Hook and a
 * Merge Request Hook), so it must not be the whole key.
 */
static void
gitlab_event_uuid(void **state)
{
	struct webhook_keys k;
	const char *s[1];
	size_t l[1];
	char *note = gitlab_edited(
	    "gitlab/gitlab-docs--comment-on-a-merge-request.json", "note",
	    "/diverge status\n/close");
	char *closed = gitlab_edited("gitlab/go-gitlab--merge_request.json",
	    "action", "close");
	struct hdrs g = { { "Content-Type", "X-Gitlab-Token",
	    "X-Gitlab-Event", "X-Gitlab-Event-UUID" }, { "application/json",
	    "sekrit", "Note Hook", "3b4c1f0e-8d2a-4e3b-9f61-0c5d7a2e9b14" } };
	char *a, *b;

	one_key(&k, s, l, "sekrit");
	a = gitlab_key(&k, &g, note, 0);
	/* the same event again (a retry, a second hook): a duplicate */
	assert_gitlab_key(&k, &g, note, 0, a);
	/* another event of the same request: not a duplicate */
	g.v[2] = "Merge Request Hook";
	b = gitlab_key(&k, &g, closed, 0);
	assert_string_not_equal(a, b);
	free(b);
	/* the same body from another request is another delivery too */
	g.v[2] = "Note Hook";
	g.v[3] = "0f8e2d6c-1a4b-4c7d-8e9f-a1b2c3d4e5f6";
	b = gitlab_key(&k, &g, note, 0);
	assert_string_not_equal(a, b);
	free(b);
	free(a);
	/*
	 * "<UUID>.<digest>" is 200 characters at most (a UUID of 135): one
	 * longer is refused, not cut to fit
	 */
	{
		char uuid[137];
		struct scm_event ev;
		const char *reason;

		memset(uuid, 'u', 136);
		uuid[135] = '\0';
		g.v[3] = uuid;
		a = gitlab_key(&k, &g, note, 0);
		assert_int_equal(strlen(a), 200);
		assert_int_equal(strncmp(a, uuid, 135), 0);
		free(a);
		uuid[135] = 'u';
		uuid[136] = '\0';
		memset(&ev, 0, sizeof(ev));
		assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g,
		    note, strlen(note), 0, &ev, &reason), WH_BAD_REQUEST);
		assert_string_equal(reason, "invalid delivery id");
	}
	free(closed);
	free(note);
}

/* A Standard Webhooks signature header for one delivery. */
static char *
sign_standard(const unsigned char *key, size_t klen, const char *id,
    const char *ts, const char *body)
{
	unsigned char mac[32];
	char *msg = xasprintf("%s.%s.%s", id, ts, body);
	char *b64, *sig;

	hmac_sha256(key, klen, msg, strlen(msg), mac);
	b64 = base64_encode(mac, 32, 0, 1);
	sig = xasprintf("v1,%s", b64);
	free(b64);
	free(msg);
	return sig;
}

/* Put the shared vector's signing key in k; the caller frees it. */
static unsigned char *
vector_signing_key(struct webhook_keys *k, size_t *klen)
{
	unsigned char *key = NULL;

	assert_int_equal(webhook_signing_key_decode(
	    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", &key, klen), 0);
	k->signing_key = key;
	k->signing_key_len = *klen;
	return key;
}

/*
 * With a signing token the delivery is keyed by the signed webhook-id, never
 * by Idempotency-Key, which the signature does not cover: a captured
 * delivery replayed in its 5 minutes under a new Idempotency-Key is a
 * duplicate, not a second delivery.
 */
static void
gitlab_signed_key(void **state)
{
	struct webhook_keys k;
	const char *s[1];
	size_t l[1];
	unsigned char *key = NULL;
	size_t klen;
	char *note = gitlab_edited(
	    "gitlab/gitlab-docs--comment-on-a-merge-request.json", "note",
	    "/diverge status");
	const char *id = "5b2a8f4e-7c1d-4e9a-b3f6-2d8c0a1e4f7b";
	struct scm_event ev;
	const char *reason;
	char *sig;
	struct hdrs g = { { "Content-Type", "X-Gitlab-Token",
	    "X-Gitlab-Event", "webhook-id", "webhook-timestamp",
	    "webhook-signature", "Idempotency-Key" }, { "application/json",
	    "sekrit", "Note Hook", id, "1614265330", NULL, id } };

	one_key(&k, s, l, "sekrit");
	key = vector_signing_key(&k, &klen);
	sig = sign_standard(key, klen, id, "1614265330", note);
	g.v[5] = sig;
	assert_gitlab_key(&k, &g, note, 1614265330, id);
	/* replayed under another Idempotency-Key: the same key */
	g.v[6] = "9d0e3c7a-2b4f-4a1e-8c6d-5f7e9a0b1c2d";
	assert_gitlab_key(&k, &g, note, 1614265330, id);
	/* or under none */
	g.k[6] = "X-Gitlab-Event-UUID";
	assert_gitlab_key(&k, &g, note, 1614265330, id);
	/* without a signing token, Idempotency-Key as before */
	k.signing_key = NULL;
	g.k[6] = "Idempotency-Key";
	assert_gitlab_key(&k, &g, note, 1614265330,
	    "9d0e3c7a-2b4f-4a1e-8c6d-5f7e9a0b1c2d");
	/* the right token does not stand in for the signature */
	k.signing_key = key;
	free(sig);
	sig = sign_standard(key, klen, id, "1614265330", "{}");
	g.v[5] = sig;
	memset(&ev, 0, sizeof(ev));
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, note,
	    strlen(note), 1614265330, &ev, &reason), WH_UNAUTHORIZED);
	/* an empty webhook-id, signed: refused, not keyed by unsigned ones */
	free(sig);
	sig = sign_standard(key, klen, "", "1614265330", note);
	g.v[3] = "";
	g.v[5] = sig;
	memset(&ev, 0, sizeof(ev));
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, note,
	    strlen(note), 1614265330, &ev, &reason), WH_BAD_REQUEST);
	free(sig);
	free(key);
	free(note);
}

/*
 * X-Gitlab-Event is not signed: a captured delivery of another kind (an
 * issue closed, answered 200 ignored and never stored) replayed in its 5
 * minutes as a Merge Request Hook must not become a merge request closed.
 * The body's object_kind, which the signature covers, has to agree.
 */
static void
gitlab_event_header_unsigned(void **state)
{
	static const char issue[] = "{\"object_kind\":\"issue\","
	    "\"event_type\":\"issue\",\"user\":{\"id\":1,\"username\":"
	    "\"root\"},\"project\":{\"id\":5,\"path_with_namespace\":"
	    "\"gitlab-org/gitlab-test\"},\"object_attributes\":{\"id\":301,"
	    "\"iid\":1,\"action\":\"close\",\"state\":\"closed\"}}";
	const char *id = "7e1c2a9b-4d3f-4b8e-a5c6-1f0d2e3b4a59";
	struct webhook_keys k;
	unsigned char *key = NULL;
	size_t klen;
	struct scm_event ev;
	const char *reason;
	char *sig, *note;
	struct hdrs g = { { "Content-Type", "X-Gitlab-Event", "webhook-id",
	    "webhook-timestamp", "webhook-signature" }, { "application/json",
	    "Issue Hook", id, "1614265330", NULL } };

	memset(&k, 0, sizeof(k));
	key = vector_signing_key(&k, &klen);
	sig = sign_standard(key, klen, id, "1614265330", issue);
	g.v[4] = sig;
	memset(&ev, 0, sizeof(ev));
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, issue,
	    strlen(issue), 1614265330, &ev, &reason), WH_IGNORE);
	scm_event_release(&ev);
	/* the same signed delivery, the header changed */
	g.v[1] = "Merge Request Hook";
	memset(&ev, 0, sizeof(ev));
	assert_int_equal(webhook_handle(SCM_GITLAB, &k, NULL, hget, &g, issue,
	    strlen(issue), 1614265330, &ev, &reason), WH_IGNORE);
	assert_int_equal(ev.kind, SCM_EV_NONE);
	scm_event_release(&ev);
	free(sig);
	/* a merge request closed, named a note: not taken for one either */
	note = gitlab_edited("gitlab/go-gitlab--merge_request.json", "action",
	    "close");
	memset(&ev, 0, sizeof(ev));
	assert_int_not_equal(webhook_normalize(SCM_GITLAB, "Note Hook", "d",
	    note, strlen(note), NULL, &ev, &reason), WH_ACCEPT);
	scm_event_release(&ev);
	free(note);
	free(key);
}

/*
 * An internal note (the older name: confidential; or delivered as a
 * Confidential Note Hook) is marked internal, in the stored form too:
 * nothing taken from it may become public.
 */
static void
gitlab_internal_notes(void **state)
{
	static const struct {
		const char *event;
		const char *flag;	/* object_attributes' field set true */
		int internal;
	} cases[] = {
		{ "Note Hook", NULL, 0 },
		{ "Note Hook", "internal", 1 },
		{ "Note Hook", "confidential", 1 },
		{ "Confidential Note Hook", NULL, 1 },
	};
	struct scm_event ev, back;
	const char *reason;
	json_t *root;
	char *enc;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		root = doc_with_body(SCM_GITLAB,
		    "gitlab/gitlab-docs--comment-on-a-merge-request.json",
		    "/diverge fix x");
		if (cases[i].flag != NULL)
			json_object_set_new(json_object_get(root,
			    "object_attributes"), cases[i].flag, json_true());
		assert_int_equal(normalize_doc(SCM_GITLAB, cases[i].event,
		    root, NULL, &ev, &reason), WH_ACCEPT);
		assert_int_equal(ev.internal, cases[i].internal);
		enc = scm_event_encode(&ev);
		assert_int_equal(scm_event_decode(&back, enc, strlen(enc)), 0);
		assert_int_equal(back.internal, cases[i].internal);
		scm_event_release(&back);
		scm_event_release(&ev);
		free(enc);
		json_decref(root);
	}
}

static void
event_roundtrip(void **state)
{
	struct scm_event ev, back;
	const char *reason;
	char *enc;

	assert_int_equal(with_body(SCM_GITLAB, "Note Hook",
	    "gitlab/gitlab-docs--comment-on-a-merge-request.json",
	    "/diverge fix \"quoted\" \\ and\ncontrol \x01 caf\xc3\xa9", NULL,
	    &ev, &reason), WH_ACCEPT);
	enc = scm_event_encode(&ev);
	/* the stored form is JSON that jansson reads the same way */
	{
		json_t *j = json_loads(enc, 0, NULL);

		assert_non_null(j);
		assert_string_equal(json_string_value(json_object_get(j,
		    "body")), ev.comment_body);
		json_decref(j);
	}
	assert_int_equal(scm_event_decode(&back, enc, strlen(enc)), 0);
	assert_int_equal(back.provider, SCM_GITLAB);
	assert_int_equal(back.kind, SCM_EV_COMMENT);
	assert_string_equal(back.repo, ev.repo);
	assert_int_equal(back.project_id, 5);
	assert_int_equal(back.number, 1);
	assert_int_equal(back.comment_id, 1244);
	assert_string_equal(back.comment_body, ev.comment_body);
	assert_string_equal(back.head_ref, "master");
	assert_int_equal(back.fork, 0);
	assert_null(back.author_hint);
	scm_event_release(&back);
	scm_event_release(&ev);
	free(enc);
	assert_int_equal(scm_event_decode(&back,
	    "{\"provider\":\"svn\",\"kind\":\"comment\"}", 36), -1);
	assert_int_equal(scm_event_decode(&back,
	    "{\"provider\":\"github\",\"kind\":\"x\"}", 34), -1);
	assert_int_equal(scm_event_decode(&back, "{\"provider\":", 12), -1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(github_vectors),
		cmocka_unit_test(github_bad_signatures),
		cmocka_unit_test(standard_webhooks_vector),
		cmocka_unit_test(gitlab_tokens),
		cmocka_unit_test(gitlab_signing_key),
		cmocka_unit_test(prefilter),
		cmocka_unit_test(fixtures_as_is),
		cmocka_unit_test(fixtures_with_command),
		cmocka_unit_test(bots_and_self),
		cmocka_unit_test(closed_and_merged),
		cmocka_unit_test(bad_shapes),
		cmocka_unit_test(handle_requests),
		cmocka_unit_test(allowlist_at_the_door),
		cmocka_unit_test(gitlab_event_uuid),
		cmocka_unit_test(gitlab_signed_key),
		cmocka_unit_test(gitlab_event_header_unsigned),
		cmocka_unit_test(gitlab_internal_notes),
		cmocka_unit_test(event_roundtrip),
	};

	util_json_init();
	return cmocka_run_group_tests_name("webhook", tests, NULL, NULL);
}
