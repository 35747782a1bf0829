/* util: bounded buffers, encodings, HMAC, metrics rendering. */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <string.h>

#include "testutil.h"
#include "util/jscan.h"

/* A Content-Type names a media type exactly, parameters aside. */
static void
media_types(void **state)
{
	(void)state;
	assert_true(media_type_is("application/json", "application/json"));
	assert_true(media_type_is("Application/JSON", "application/json"));
	assert_true(media_type_is(" application/json; charset=utf-8",
	    "application/json"));
	assert_true(media_type_is("application/json ;charset=utf-8",
	    "application/json"));
	assert_false(media_type_is("application/jsonx", "application/json"));
	assert_false(media_type_is("application/json-patch+json",
	    "application/json"));
	assert_false(media_type_is("text/plain", "application/json"));
	assert_false(media_type_is("", "application/json"));
	assert_false(media_type_is(NULL, "application/json"));
}

static void
buf_bounds(void **state)
{
	struct buf b;

	buf_init(&b, 10);
	assert_int_equal(buf_addstr(&b, "12345"), 0);
	assert_int_equal(buf_addstr(&b, "67890"), 0);
	assert_int_equal(b.len, 10);
	/* one more byte is refused and the buffer is unchanged */
	assert_int_equal(buf_addstr(&b, "x"), -1);
	assert_int_equal(b.len, 10);
	assert_string_equal(b.data, "1234567890");
	buf_reset(&b);
	assert_int_equal(b.len, 0);
	assert_string_equal(b.data, "");
	assert_int_equal(buf_printf(&b, "%d-%s", 42, "ab"), 0);
	assert_string_equal(b.data, "42-ab");
	assert_int_equal(buf_printf(&b, "%s", "0123456789"), -1);
	buf_release(&b);
	/* formatted text longer than buf_printf's stack buffer, whole */
	{
		char longs[701];

		memset(longs, 'z', 700);
		longs[700] = '\0';
		buf_init(&b, 1000);
		assert_int_equal(buf_printf(&b, "<%s>%d", longs, 7), 0);
		assert_int_equal(b.len, 703);
		assert_int_equal(b.data[0], '<');
		assert_int_equal(b.data[700], 'z');
		assert_string_equal(b.data + 701, ">7");
		buf_reset(&b);
		assert_int_equal(buf_printf(&b, "%.*s", 255, longs), 0);
		assert_int_equal(b.len, 255);
		assert_int_equal(buf_printf(&b, "%.*s", 256, longs), 0);
		assert_int_equal(b.len, 511);
		assert_int_equal(strlen(b.data), 511);
		buf_release(&b);
	}
	/* a huge n cannot wrap the length check */
	buf_init(&b, 100);
	assert_int_equal(buf_add(&b, "x", SIZE_MAX), -1);
	buf_release(&b);
}

/*
 * Appends that fill the first allocation to the last byte still leave
 * room for the NUL (with --enable-asan a write past it is caught), and a
 * buffer released or detached is empty and takes appends again.
 */
static void
buf_reuse(void **state)
{
	char block[257], *p;
	struct buf b;
	size_t n;

	(void)state;
	memset(block, 'q', 256);
	block[256] = '\0';
	buf_init(&b, 4096);
	assert_int_equal(buf_add(&b, block, 256), 0);
	assert_int_equal(b.data[256], '\0');
	assert_int_equal(buf_add(&b, block, 255), 0);
	assert_int_equal(buf_add(&b, "r", 1), 0);
	assert_int_equal(b.len, 512);
	assert_int_equal(strlen(b.data), 512);
	assert_int_equal(b.data[511], 'r');
	buf_release(&b);
	assert_int_equal(buf_addstr(&b, "ab"), 0);
	assert_int_equal(b.len, 2);
	assert_string_equal(b.data, "ab");
	p = buf_detach(&b, &n);
	assert_int_equal(n, 2);
	assert_string_equal(p, "ab");
	free(p);
	assert_int_equal(b.len, 0);
	assert_int_equal(buf_addstr(&b, "cd"), 0);
	assert_int_equal(b.len, 2);
	assert_string_equal(b.data, "cd");
	p = buf_detach(&b, NULL);
	assert_string_equal(p, "cd");
	free(p);
	/* a maximum that is no power of two: filled to it exactly */
	buf_init(&b, 300);
	assert_int_equal(buf_add(&b, block, 256), 0);
	assert_int_equal(buf_add(&b, block, 44), 0);
	assert_int_equal(b.data[300], '\0');
	assert_int_equal(buf_add(&b, "", 0), 0);
	assert_int_equal(buf_add(&b, "x", 1), -1);
	buf_release(&b);
}

static void
base64_cases(void **state)
{
	static const struct {
		const char *raw;
		const char *std;
		const char *url_nopad;
	} cases[] = {
		{ "", "", "" },
		{ "f", "Zg==", "Zg" },
		{ "fo", "Zm8=", "Zm8" },
		{ "foo", "Zm9v", "Zm9v" },
		{ "foob", "Zm9vYg==", "Zm9vYg" },
		{ "fooba", "Zm9vYmE=", "Zm9vYmE" },
		{ "foobar", "Zm9vYmFy", "Zm9vYmFy" },
		{ "\xfb\xff\xbf", "+/+/", "-_-_" },
	};
	size_t i, n;
	unsigned char *out;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		size_t rl = strlen(cases[i].raw);
		char *e = base64_encode((const unsigned char *)cases[i].raw,
		    rl, 0, 1);

		assert_string_equal(e, cases[i].std);
		free(e);
		e = base64_encode((const unsigned char *)cases[i].raw, rl, 1,
		    0);
		assert_string_equal(e, cases[i].url_nopad);
		free(e);
		/* both alphabets, padded or not, decode */
		assert_int_equal(base64_decode(cases[i].std,
		    strlen(cases[i].std), &out, &n), 0);
		assert_int_equal(n, rl);
		assert_memory_equal(out, cases[i].raw, rl);
		/* NUL-terminated for convenience, as the header says */
		assert_int_equal(out[n], '\0');
		free(out);
		assert_int_equal(base64_decode(cases[i].url_nopad,
		    strlen(cases[i].url_nopad), &out, &n), 0);
		assert_int_equal(n, rl);
		assert_memory_equal(out, cases[i].raw, rl);
		free(out);
	}
	assert_int_equal(base64_decode("Zm9v!", 5, &out, &n), -1);
	assert_int_equal(base64_decode("Z", 1, &out, &n), -1);
	/* one character over a quantum is no length base64 has, zero bits too */
	assert_int_equal(base64_decode("A", 1, &out, &n), -1);
	assert_int_equal(base64_decode("QUJDA", 5, &out, &n), -1);
	assert_int_equal(base64_decode("Zg=", 3, &out, &n), -1);
	assert_int_equal(base64_decode("Zh==", 4, &out, &n), -1);
	/* two leftover bits after two bytes must be zero as well */
	assert_int_equal(base64_decode("Zm9=", 4, &out, &n), -1);
	assert_int_equal(base64_decode("Zm9", 3, &out, &n), -1);
	/* no third '=': that would leave one character of a quantum */
	assert_int_equal(base64_decode("Zm9vZ===", 8, &out, &n), -1);
}

/*
 * The 48 bytes whose sextets count 0 to 63 encode as the alphabet itself:
 * every character's value, both alphabets, both ways.
 */
static void
base64_alphabet(void **state)
{
	static const char std[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnop"
	    "qrstuvwxyz0123456789+/";
	static const char url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnop"
	    "qrstuvwxyz0123456789-_";
	static const char bad[] = "@[`{:*,.^~ ";
	unsigned char raw[48], *out;
	char *e;
	size_t i, n;

	(void)state;
	for (i = 0; i < 16; i++) {
		size_t v = 4 * i;

		raw[3 * i] = (unsigned char)(v << 2 | (v + 1) >> 4);
		raw[3 * i + 1] = (unsigned char)(((v + 1) & 15) << 4 |
		    (v + 2) >> 2);
		raw[3 * i + 2] = (unsigned char)(((v + 2) & 3) << 6 | (v + 3));
	}
	for (i = 0; i < 2; i++) {
		const char *alpha = i == 0 ? std : url;

		e = base64_encode(raw, sizeof(raw), (int)i, 1);
		assert_string_equal(e, alpha);
		free(e);
		assert_int_equal(base64_decode(alpha, 64, &out, &n), 0);
		assert_int_equal(n, sizeof(raw));
		assert_memory_equal(out, raw, sizeof(raw));
		free(out);
	}
	/* the characters next to each range are no base64 */
	for (i = 0; i < strlen(bad); i++) {
		char q[5] = "Zm9v";

		q[3] = bad[i];
		assert_int_equal(base64_decode(q, 4, &out, &n), -1);
	}
}

static void
hex_and_hmac(void **state)
{
	unsigned char mac[32], back[32];
	char hex[65];
	size_t n;

	/* RFC 4231 test case 2 */
	hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, mac);
	hex_encode(mac, 32, hex);
	assert_string_equal(hex, "5bdcc146bf60754e6a042426089575c75a003f0"
	    "89d2739839dec58b964ec3843");
	assert_int_equal(hex_decode(hex, 64, back, &n), 0);
	assert_int_equal(n, 32);
	assert_true(ct_equal(mac, back, 32));
	back[31] ^= 1;
	assert_false(ct_equal(mac, back, 32));
	assert_int_equal(hex_decode("abc", 3, back, &n), -1);
	assert_int_equal(hex_decode("zz", 2, back, &n), -1);
	assert_int_equal(hex_decode("AbCd", 4, back, &n), 0);
	assert_int_equal(back[0], 0xab);
	assert_int_equal(back[1], 0xcd);
	/* a bad second digit of a pair is refused too */
	assert_int_equal(hex_decode("0z", 2, back, &n), -1);
}

/* Every hex digit in either case, and the characters next to them. */
static void
hex_digits(void **state)
{
	static const char lower[] = "0123456789abcdef";
	static const char upper[] = "0123456789ABCDEF";
	static const char bad[] = "/:@G`g";
	int i;

	(void)state;
	for (i = 0; i < 16; i++) {
		assert_int_equal(hex_digit(lower[i]), i);
		assert_int_equal(hex_digit(upper[i]), i);
	}
	for (i = 0; bad[i] != '\0'; i++)
		assert_int_equal(hex_digit(bad[i]), -1);
}

/*
 * A secret of any length is wiped to its last byte, and random_bytes
 * fills all it is asked for: 16 bytes all still zero would happen once
 * in 2^128 runs.
 */
static void
wipe_and_random(void **state)
{
	static const unsigned char zero[16];
	unsigned char r[64];
	char one = 'k', key[] = "secret";

	(void)state;
	secure_wipe(&one, 1);
	assert_int_equal(one, 0);
	secure_wipe(key, sizeof(key) - 1);
	assert_memory_equal(key, "\0\0\0\0\0\0", 7);
	secure_wipe(NULL, 8);
	memset(r, 0, sizeof(r));
	assert_int_equal(random_bytes(r, sizeof(r)), 0);
	assert_memory_not_equal(r, zero, sizeof(zero));
	assert_memory_not_equal(r + sizeof(r) - sizeof(zero), zero,
	    sizeof(zero));
}

/* HMAC-SHA256 against RFC 4231 and against OpenSSL's HMAC(). */
static void *
hmac_cross(void *arg)
{
	unsigned char key[200], data[300], a[32], b[32];
	unsigned int n = 32;
	size_t kl, dl;
	int bad = 0;

	(void)arg;
	for (kl = 0; kl < sizeof(key); kl += 7) {
		for (dl = 0; dl < sizeof(data); dl += 37) {
			random_bytes(key, kl);
			random_bytes(data, dl);
			hmac_sha256(kl ? key : NULL, kl, dl ? data : NULL, dl,
			    a);
			HMAC(EVP_sha256(), key, (int)kl, data, dl, b, &n);
			bad += memcmp(a, b, 32) != 0;
		}
	}
	return (void *)(intptr_t)bad;
}

static void
hmac_vectors(void **state)
{
	unsigned char key[131], mac[32];
	char hex[65];
	pthread_t th[4];
	void *bad;
	int i;
	static const struct {
		size_t len;
		const char *mac;
	} keyed[] = {
		{ 1, "55161cf0bf72b36d26f21d883618ce2396c88c80e1e5b2c8f339c0e8"
		    "ac4cb565" },
		{ 64, "01a77989d1da4f6b333a2ef17a99eaa5aecfdb45ae24599ce801d7b"
		    "45b6cdb73" },
		{ 65, "c275511f297b427291abcdabf96970884c59d0bbe3baa3bdefcbe7a"
		    "daab03f00" },
	};
	static const char *const data7 = "This is a test using a larger than"
	    " block-size key and a larger than block-size data. The key needs"
	    " to be hashed before being used by the HMAC algorithm.";

	(void)state;
	/* RFC 4231 test case 1 */
	memset(key, 0x0b, 20);
	hmac_sha256(key, 20, "Hi There", 8, mac);
	hex_encode(mac, 32, hex);
	assert_string_equal(hex, "b0344c61d8db38535ca8afceaf0bf12b881dc200c98"
	    "33da726e9376c2e32cff7");
	/* test cases 6 and 7: a key longer than a block is hashed first */
	memset(key, 0xaa, sizeof(key));
	hmac_sha256(key, sizeof(key), "Test Using Larger Than Block-Size Key"
	    " - Hash Key First", 54, mac);
	hex_encode(mac, 32, hex);
	assert_string_equal(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc621372"
	    "8c5140546040f0ee37f54");
	hmac_sha256(key, sizeof(key), data7, strlen(data7), mac);
	hex_encode(mac, 32, hex);
	assert_string_equal(hex, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0"
	    "713938a7f51535c3a35e2");
	/*
	 * Keys of 1, 64 (a block: used as is) and 65 bytes (hashed first),
	 * bytes 1, 2, 3...; the MACs from Python's hmac module.
	 */
	for (i = 0; i < (int)sizeof(key); i++)
		key[i] = (unsigned char)(i + 1);
	for (i = 0; i < (int)ARRAY_SIZE(keyed); i++) {
		hmac_sha256(key, keyed[i].len, "Diverge", 7, mac);
		hex_encode(mac, 32, hex);
		assert_string_equal(hex, keyed[i].mac);
	}
	/* every key and data length around the block, on several threads */
	for (i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&th[i], NULL, hmac_cross, NULL),
		    0);
	for (i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(th[i], &bad), 0);
		assert_int_equal((int)(intptr_t)bad, 0);
	}
	assert_null(hmac_cross(NULL));
}

static void
metrics_text(void **state)
{
	struct buf b;

	metrics_reset();
	metrics_describe("t_requests_total", METRIC_COUNTER, "Requests.");
	metrics_describe("t_latency_seconds", METRIC_HISTOGRAM, "Latency.");
	metrics_inc("t_requests_total", "route=\"/a\",code=\"200\"", 1);
	metrics_inc("t_requests_total", "route=\"/a\",code=\"200\"", 2);
	metrics_observe("t_latency_seconds", "", 0.003);
	metrics_observe("t_latency_seconds", "", 7);
	buf_init(&b, 1 << 20);
	assert_int_equal(metrics_render(&b), 0);
	assert_non_null(strstr(b.data, "# TYPE t_requests_total counter\n"));
	assert_non_null(strstr(b.data,
	    "t_requests_total{route=\"/a\",code=\"200\"} 3\n"));
	assert_non_null(strstr(b.data,
	    "t_latency_seconds_bucket{le=\"0.005\"} 1\n"));
	assert_non_null(strstr(b.data,
	    "t_latency_seconds_bucket{le=\"+Inf\"} 2\n"));
	assert_non_null(strstr(b.data, "t_latency_seconds_count 2\n"));
	buf_release(&b);
	{
		char *e = metrics_label_escape("a\"b\\c\nd");

		assert_string_equal(e, "a\\\"b\\\\c\\nd");
		free(e);
	}
	metrics_reset();
}

static double
value_of(void *arg)
{
	return *(double *)arg;
}

/*
 * Values C would print as "nan", "-nan" or "inf" are written as the
 * format (Go's ParseFloat) spells them, in a sample and a histogram's
 * _sum; a HELP text's backslash and line break are escaped (a raw line
 * break would start a line that is no sample).
 */
static void
metrics_special_values(void **state)
{
	static double nan_v, neg_nan, inf, ninf;
	struct buf b;

	(void)state;
	nan_v = NAN;
	neg_nan = -NAN;
	inf = INFINITY;
	ninf = -INFINITY;
	metrics_reset();
	metrics_describe("t_g", METRIC_GAUGE, "Line one\nC:\\path.");
	metrics_gauge_fn("t_g", "k=\"1\"", value_of, &nan_v);
	metrics_gauge_fn("t_g", "k=\"2\"", value_of, &neg_nan);
	metrics_gauge_fn("t_g", "k=\"3\"", value_of, &inf);
	metrics_gauge_fn("t_g", "k=\"4\"", value_of, &ninf);
	metrics_describe("t_plain", METRIC_GAUGE, "Plain.");
	metrics_set("t_plain", "", INFINITY);
	metrics_describe("t_h", METRIC_HISTOGRAM, "H.");
	metrics_observe("t_h", "", INFINITY);
	metrics_observe("t_h", "a=\"b\"", -INFINITY);
	buf_init(&b, 1 << 20);
	assert_int_equal(metrics_render(&b), 0);
	assert_non_null(strstr(b.data,
	    "# HELP t_g Line one\\nC:\\\\path.\n# TYPE t_g gauge\n"));
	assert_non_null(strstr(b.data, "t_g{k=\"1\"} NaN\n"));
	assert_non_null(strstr(b.data, "t_g{k=\"2\"} NaN\n"));
	assert_non_null(strstr(b.data, "t_g{k=\"3\"} +Inf\n"));
	assert_non_null(strstr(b.data, "t_g{k=\"4\"} -Inf\n"));
	assert_non_null(strstr(b.data, "\nt_plain +Inf\n"));
	assert_non_null(strstr(b.data, "\nt_h_sum +Inf\n"));
	assert_non_null(strstr(b.data, "\nt_h_sum{a=\"b\"} -Inf\n"));
	assert_null(strstr(b.data, "nan"));
	assert_null(strstr(b.data, " inf"));
	assert_null(strstr(b.data, "\nC:"));
	buf_release(&b);
	metrics_reset();
}

/* A family's own bounds, and a histogram its owner keeps lock-free. */
static void
metrics_buckets(void **state)
{
	static const double slow[] = { 0.005, 1, 60 };
	static const double fast[] = { 0.001, 0.01 };
	static struct metrics_hist h = METRICS_HIST_INIT(fast);
	struct buf b;

	metrics_reset();
	metrics_describe_buckets("t_call_seconds", "Calls.", slow,
	    ARRAY_SIZE(slow));
	metrics_observe("t_call_seconds", "verb=\"get\"", 30);
	metrics_observe("t_call_seconds", "verb=\"get\"", 90);
	metrics_describe("t_commit_seconds", METRIC_HISTOGRAM, "Commits.");
	metrics_hist_register("t_commit_seconds", "", &h);
	metrics_hist_observe(&h, 0.0005);
	metrics_hist_observe(&h, 0.005);
	metrics_hist_observe(&h, 0.25);
	assert_int_equal(metrics_hist_count(&h), 3);
	buf_init(&b, 1 << 20);
	assert_int_equal(metrics_render(&b), 0);
	assert_non_null(strstr(b.data,
	    "t_call_seconds_bucket{verb=\"get\",le=\"1\"} 0\n"
	    "t_call_seconds_bucket{verb=\"get\",le=\"60\"} 1\n"
	    "t_call_seconds_bucket{verb=\"get\",le=\"+Inf\"} 2\n"
	    "t_call_seconds_sum{verb=\"get\"} 120\n"));
	assert_non_null(strstr(b.data, "# TYPE t_commit_seconds histogram\n"
	    "t_commit_seconds_bucket{le=\"0.001\"} 1\n"
	    "t_commit_seconds_bucket{le=\"0.01\"} 2\n"
	    "t_commit_seconds_bucket{le=\"+Inf\"} 3\n"
	    "t_commit_seconds_sum 0.2555\n"
	    "t_commit_seconds_count 3\n"));
	buf_release(&b);
	metrics_reset();
}

static double
seven_and_a_half(void *arg)
{
	(void)arg;
	return 7.5;
}

/* Where want first occurs in text: fails when it is absent. */
static const char *
found(const char *text, const char *want)
{
	const char *p = strstr(text, want);

	if (p == NULL)
		fail_msg("missing: %s\nin:\n%s", want, text);
	return p;
}

/* How many times want occurs in text. */
static int
occurrences(const char *text, const char *want)
{
	int n = 0;

	for (; (text = strstr(text, want)) != NULL; text++)
		n++;
	return n;
}

/*
 * Families: in the order of their first declaration, declared once
 * however often described, told apart when one name starts another; a
 * family never declared takes its type from its first use and has no
 * HELP. Series are told apart when one label set starts another; values
 * keep every digit; a gauge is set, not added to; metrics_zero makes
 * each label set; a gauge function is read when rendering.
 */
static void
metrics_families(void **state)
{
	static const char *const zeros[] = { "code=\"500\"", "code=\"200\"",
	    NULL };
	static atomic_uint_fast64_t hits = 41;
	struct buf b;

	(void)state;
	metrics_reset();
	metrics_describe("t_req", METRIC_GAUGE, "Short name.");
	metrics_describe("t_req_total", METRIC_COUNTER, "Requests.");
	metrics_describe("t_req", METRIC_COUNTER, "Declared again.");
	metrics_zero("t_req_total", zeros);
	metrics_inc("t_req_total", "code=\"200\"", 1234567891);
	metrics_inc("t_req_total", "code=\"200\",x=\"1\"", 1);
	metrics_set("t_req", "", 0.25);
	metrics_set("t_req", "", 12345678.5);
	metrics_set("t_req", "q=\"a\"", 0.125);
	metrics_inc("t_loose_total", "", 1);
	metrics_set("t_loose_gauge", "", 2);
	metrics_observe("t_loose_seconds", "", 1);
	metrics_gauge_fn("t_fn", "", seven_and_a_half, NULL);
	metrics_gauge_fn("t_hits_total", "", metrics_read_atomic, &hits);
	buf_init(&b, 1 << 20);
	assert_int_equal(metrics_render(&b), 0);
	assert_true(found(b.data, "# HELP t_req Short name.\n"
	    "# TYPE t_req gauge\n") < found(b.data,
	    "# HELP t_req_total Requests.\n# TYPE t_req_total counter\n"));
	assert_int_equal(occurrences(b.data, "# TYPE t_req "), 1);
	assert_int_equal(occurrences(b.data, "# HELP t_req "), 1);
	found(b.data, "\nt_req 12345678.5\n");
	found(b.data, "\nt_req{q=\"a\"} 0.125\n");
	found(b.data, "\nt_req_total{code=\"500\"} 0\n");
	found(b.data, "\nt_req_total{code=\"200\"} 1234567891\n");
	found(b.data, "\nt_req_total{code=\"200\",x=\"1\"} 1\n");
	found(b.data, "# TYPE t_loose_total counter\nt_loose_total 1\n");
	found(b.data, "# TYPE t_loose_gauge gauge\nt_loose_gauge 2\n");
	found(b.data, "# TYPE t_loose_seconds histogram\n");
	found(b.data, "# TYPE t_fn gauge\nt_fn 7.5\n");
	found(b.data, "\nt_hits_total 41\n");
	assert_null(strstr(b.data, "# HELP t_loose"));
	assert_null(strstr(b.data, "# HELP t_fn"));
	buf_release(&b);
	/* a buffer too small is an error, not a cut text */
	buf_init(&b, 64);
	assert_int_equal(metrics_render(&b), -1);
	buf_release(&b);
	metrics_reset();
}

/*
 * A sample on a bound is in that bound's bucket (le: less or equal),
 * for the registry's histograms and an owner's; the default bounds end
 * at 10 s; labelled and unlabelled sums keep every digit; a labelled
 * _count is every sample, those above the last bound too.
 */
static void
metrics_bounds(void **state)
{
	static const double slow[] = { 0.5, 1 };
	static const double fast[] = { 0.25, 0.5 };
	static struct metrics_hist h = METRICS_HIST_INIT(fast);
	struct buf b;

	(void)state;
	metrics_reset();
	metrics_describe_buckets("t_wait_seconds", "Waits.", slow,
	    ARRAY_SIZE(slow));
	metrics_observe("t_wait_seconds", "q=\"a\"", 0.5);
	metrics_observe("t_wait_seconds", "q=\"a\"", 1);
	metrics_observe("t_wait_seconds", "q=\"a\"", 1234.0625);
	metrics_describe("t_default_seconds", METRIC_HISTOGRAM, "Default.");
	metrics_observe("t_default_seconds", "", 10);
	metrics_observe("t_default_seconds", "", 1234.0625);
	metrics_describe("t_owned_seconds", METRIC_HISTOGRAM, "Owned.");
	metrics_hist_register("t_owned_seconds", "", &h);
	metrics_hist_observe(&h, 0.25);
	metrics_hist_observe(&h, 0.5);
	buf_init(&b, 1 << 20);
	assert_int_equal(metrics_render(&b), 0);
	found(b.data, "# TYPE t_wait_seconds histogram\n"
	    "t_wait_seconds_bucket{q=\"a\",le=\"0.5\"} 1\n"
	    "t_wait_seconds_bucket{q=\"a\",le=\"1\"} 2\n"
	    "t_wait_seconds_bucket{q=\"a\",le=\"+Inf\"} 3\n"
	    "t_wait_seconds_sum{q=\"a\"} 1235.5625\n"
	    "t_wait_seconds_count{q=\"a\"} 3\n");
	found(b.data, "t_default_seconds_bucket{le=\"5\"} 0\n"
	    "t_default_seconds_bucket{le=\"10\"} 1\n"
	    "t_default_seconds_bucket{le=\"+Inf\"} 2\n"
	    "t_default_seconds_sum 1244.0625\n"
	    "t_default_seconds_count 2\n");
	found(b.data, "# TYPE t_owned_seconds histogram\n"
	    "t_owned_seconds_bucket{le=\"0.25\"} 1\n"
	    "t_owned_seconds_bucket{le=\"0.5\"} 2\n"
	    "t_owned_seconds_bucket{le=\"+Inf\"} 2\n"
	    "t_owned_seconds_sum 0.75\n"
	    "t_owned_seconds_count 2\n");
	buf_release(&b);
	metrics_reset();
}

static void
time_format(void **state)
{
	char out[32];

	time_rfc3339(0, out);
	assert_string_equal(out, "1970-01-01T00:00:00Z");
	time_rfc3339(1614265330, out);
	assert_string_equal(out, "2021-02-25T15:02:10Z");
	/* four-digit years, padded, and clamped to them at both ends */
	time_rfc3339(INT64_C(-62135596800), out);
	assert_string_equal(out, "0001-01-01T00:00:00Z");
	time_rfc3339(INT64_C(253402300799), out);
	assert_string_equal(out, "9999-12-31T23:59:59Z");
	time_rfc3339(INT64_C(253402300800), out);
	assert_string_equal(out, "9999-12-31T23:59:59Z");
	time_rfc3339(INT64_MAX, out);
	assert_string_equal(out, "9999-12-31T23:59:59Z");
	time_rfc3339(INT64_C(-62167219201), out);
	assert_string_equal(out, "0000-01-01T00:00:00Z");
	time_rfc3339(INT64_MIN, out);
	assert_string_equal(out, "0000-01-01T00:00:00Z");
}

static void
time_parse(void **state)
{
	static const char *const bad[] = { "", "2021-02-25", "2021-02-25 "
	    "15:02:10Z", "2021-02-25T15:02:10", "2021-02-29T00:00:00Z",
	    "2021-13-01T00:00:00Z", "2021-04-31T00:00:00Z",
	    "2021-02-25T24:00:00Z", "2021-02-25T15:02:10.Z",
	    "2021-02-25T15:02:10+0100", "2021-02-25T15:02:10Zjunk",
	    "2021-02-25T15:02:10+01:00x", "2021-0a-25T15:02:10Z",
	    /* a century that is no leap year; a second, an offset too far */
	    "1900-02-29T00:00:00Z", "2021-02-25T15:02:61Z",
	    "2021-02-25T15:02:10+24:00", "2021-02-25T15:02:10-01:60",
	    /* day and month 00, minute 60, 31 April of a leap year */
	    "2021-02-00T00:00:00Z", "2021-00-10T00:00:00Z",
	    "2021-02-25T15:60:10Z", "2024-04-31T00:00:00Z",
	    "2021-02-25T15:02:10+01-00" };
	int64_t t;
	size_t i;

	assert_int_equal(time_parse_rfc3339("1970-01-01T00:00:00Z", &t), 0);
	assert_int_equal(t, 0);
	assert_int_equal(time_parse_rfc3339("2021-02-25T15:02:10Z", &t), 0);
	assert_int_equal(t, 1614265330);
	assert_int_equal(time_parse_rfc3339("2021-02-25t15:02:10.123456z",
	    &t), 0);
	assert_int_equal(t, 1614265330);
	assert_int_equal(time_parse_rfc3339("2021-02-25T17:02:10+02:00", &t),
	    0);
	assert_int_equal(t, 1614265330);
	assert_int_equal(time_parse_rfc3339("2021-02-25T10:32:10-04:30", &t),
	    0);
	assert_int_equal(t, 1614265330);
	assert_int_equal(time_parse_rfc3339("2024-02-29T00:00:00Z", &t), 0);
	assert_int_equal(t, 1709164800);
	assert_int_equal(time_parse_rfc3339("1969-12-31T23:59:59Z", &t), 0);
	assert_int_equal(t, -1);
	/* every 400 years a century is a leap year; a leap second is taken */
	assert_int_equal(time_parse_rfc3339("2000-02-29T00:00:00Z", &t), 0);
	assert_int_equal(t, 951782400);
	assert_int_equal(time_parse_rfc3339("2016-12-31T23:59:60Z", &t), 0);
	assert_int_equal(t, 1483228800);
	assert_int_equal(time_parse_rfc3339("2021-02-25T15:02:10+23:59", &t),
	    0);
	assert_int_equal(t, 1614265330 - 23 * 3600 - 59 * 60);
	/* the ends of four digits: year 0 is a leap year (date -u -d) */
	assert_int_equal(time_parse_rfc3339("0000-01-01T00:00:00Z", &t), 0);
	assert_int_equal(t, -62167219200);
	assert_int_equal(time_parse_rfc3339("0000-02-29T00:00:00Z", &t), 0);
	assert_int_equal(t, -62162121600);
	assert_int_equal(time_parse_rfc3339("9999-12-31T23:59:59Z", &t), 0);
	assert_int_equal(t, 253402300799);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(time_parse_rfc3339(bad[i], &t), -1);
	assert_int_equal(time_parse_rfc3339(NULL, &t), -1);
}

/* The table follows apimachinery's duration.HumanDuration. */
static void
time_ages(void **state)
{
	static const struct {
		int64_t s;
		const char *want;
	} cases[] = { { -5, "<invalid>" }, { -1, "0s" }, { 0, "0s" },
	    { 119, "119s" }, { 120, "2m" }, { 303, "5m3s" }, { 600, "10m" },
	    { 659, "10m" }, { 10799, "179m" }, { 10800, "3h" },
	    { 11100, "3h5m" }, { 28800, "8h" }, { 29100, "8h" },
	    { 172799, "47h" }, { 172800, "2d" }, { 183600, "2d3h" },
	    { 691200, "8d" }, { 694800, "8d" },
	    { 63071999, "729d" }, { 63072000, "2y" }, { 65664000, "2y30d" },
	    { 252288000, "8y" }, { 260000000, "8y" } };
	char out[32];
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		time_human_duration(cases[i].s, out);
		assert_string_equal(out, cases[i].want);
	}
}

/*
 * Backoff doubles up to its cap; equal jitter stays between d/2 and d (a
 * draw past d would be missed 64 times in a row once in 2^64 runs).
 */
static void
backoff_delays(void **state)
{
	int i;

	(void)state;
	assert_int_equal(backoff_delay_ms(1000, 30000, 0), 1000);
	assert_int_equal(backoff_delay_ms(1000, 30000, 1), 2000);
	assert_int_equal(backoff_delay_ms(1000, 30000, 4), 16000);
	assert_int_equal(backoff_delay_ms(1000, 30000, 5), 30000);
	assert_int_equal(backoff_delay_ms(1000, 30000, 1000), 30000);
	assert_int_equal(backoff_jitter_ms(0), 0);
	assert_int_equal(backoff_jitter_ms(1), 0);
	for (i = 0; i < 64; i++) {
		int64_t d = backoff_jitter_ms(1000);

		assert_in_range(d, 500, 1000);
	}
}

/*
 * jscan on an exact heap copy of text: with --enable-asan, a read past
 * the end of the input is caught, not served by the NUL after a literal.
 */
static int
jscan_copy(const char *text, size_t len, int max_depth, const char **err)
{
	struct jfield f[1] = { { .path = "a" } };
	char *copy = xmalloc(len > 0 ? len : 1);
	int r;

	memcpy(copy, text, len);
	r = jscan(copy, len, f, 1, max_depth, err);
	free(copy);
	return r;
}

/* Whether jansson reads text as one JSON value. */
static int
jansson_reads(const char *text, size_t len)
{
	json_t *j = json_loadb(text, len, JSON_DECODE_ANY, NULL);

	json_decref(j);
	return j != NULL;
}

/* Valid and invalid documents, as jansson (RFC 8259) judges them too. */
static void
jscan_validity(void **state)
{
	static const char *const good[] = {
		"{}", "[]", "0", "-0", "1.5e-3", "\"x\"", "true", "null",
		" {\"a\" : [1, 2, {\"b\": null}] } ",
		"\"\\ud83d\\ude00\"", "\"\\u00e9\\n\\t\\/\"",
		"\"caf\xc3\xa9\"", "[1e10, -2E+3, 0.5]",
		"\"\\udbff\\udfff\\ud83d\\udfff\"", "\"\\uD83D\\uDE00\"",
		"\"\\b\\f\\r\\\"\\\\\"", " \r\n{\r\n}\r\n",
	};
	static const char *const bad[] = {
		"", "{", "}", "[1,]", "{\"a\":}", "{\"a\" 1}", "{a:1}",
		"01", "-", "1.", ".5", "1e", "+1", "tru", "nul", "\"abc",
		"\"\\x\"", "\"\\ud800\"", "\"\\udc00\"",
		"\"\\ud800\\u0041\"", "\"a\tb\"", "\"\xc0\xaf\"",
		"\"\xed\xa0\x80\"", "\"\xf5\x80\x80\x80\"", "{} x",
		"[1] [2]", "{\"a\":1,}", "\"\\u12\"", "\"\\u12G4\"",
		/* lone surrogates at the range ends, pairs of the wrong kind */
		"\"\\udfff\"", "\"\\udbff\"", "\"\\ud800\\udbff\"",
		"\"\\ud800\\ndc00\"",
		/* JavaScript's \', a lone continuation byte, form feed */
		"\"\\'\"", "\"\x80\"", "\f{}", "{}\f", "[1,\f2]",
		/* numbers and literals with a wrong byte inside or after */
		"[1.,2]", "1e+-3", "1e--3", "trux", "[nulx]", "falsy",
	};
	struct jfield f[1] = { { "a", 0, NULL, 0, 0 } };
	const char *err;
	size_t i;
	struct buf deep;

	for (i = 0; i < ARRAY_SIZE(good); i++) {
		err = NULL;
		if (jscan_copy(good[i], strlen(good[i]), 64, &err) != 0)
			fprintf(stderr, "# good %zu: %s\n", i, err);
		assert_int_equal(jscan_copy(good[i], strlen(good[i]), 64,
		    &err), 0);
		assert_true(jansson_reads(good[i], strlen(good[i])));
	}
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		err = NULL;
		if (jscan_copy(bad[i], strlen(bad[i]), 64, &err) == 0)
			fprintf(stderr, "# bad %zu passed\n", i);
		assert_int_equal(jscan_copy(bad[i], strlen(bad[i]), 64, &err),
		    -1);
		assert_non_null(err);
		assert_false(jansson_reads(bad[i], strlen(bad[i])));
	}
	buf_init(&deep, 1 << 20);
	for (i = 0; i < 100; i++)
		buf_addstr(&deep, "[");
	for (i = 0; i < 100; i++)
		buf_addstr(&deep, "]");
	assert_int_equal(jscan(deep.data, deep.len, f, 1, 64, &err), -1);
	assert_int_equal(jscan(deep.data, deep.len, f, 1, 128, &err), 0);
	buf_release(&deep);
	/*
	 * the bound exactly: the outermost value is at depth 0, so
	 * max_depth + 1 nested arrays or objects pass and one more is
	 * refused, as nesting
	 */
	for (i = 9; i <= 10; i++) {
		size_t k;

		buf_init(&deep, 256);
		/* arrays and objects in turn, the innermost an empty [] */
		for (k = 0; k < i; k++)
			buf_addstr(&deep, k % 2 && k + 1 < i ? "{\"a\":" :
			    "[");
		for (k = i; k-- > 0;)
			buf_addstr(&deep, k % 2 && k + 1 < i ? "}" : "]");
		err = NULL;
		assert_int_equal(jscan(deep.data, deep.len, f, 1, 8, &err),
		    i == 9 ? 0 : -1);
		if (i == 10)
			assert_string_equal(err, "nesting too deep");
		buf_release(&deep);
	}
}

/*
 * A document cut short anywhere is refused without a read past the cut
 * (each cut is an exact heap copy, for --enable-asan). Cut inside an
 * escape or a UTF-8 sequence, the error names what was cut, whether the
 * byte after the cut is the rest of the text or nothing.
 */
static void
jscan_cuts(void **state)
{
	static const char doc[] = "{\"s\":\"a\\n\\u00e9\\ud83d\\ude00"
	    "\xc3\xa9\\\\\",\"n\":[-1.5e+3,0,true,false,null],\"o\":{}}";
	static const struct {
		const char *text;
		size_t cut;
		const char *err;
	} named[] = {
		{ "\"\\u00e9\"", 2, "unterminated string" },
		{ "\"\\\"\"", 2, "unterminated string" },
		{ "\"\\u00e9\"", 6, "invalid \\u escape" },
		{ "\"\\ud83d\\ude00\"", 12, "unpaired high surrogate" },
		{ "\"\xc3\xa9\"", 2, "invalid UTF-8 in string" },
	};
	const char *err;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(doc) - 1; i++)
		assert_int_equal(jscan_copy(doc, i, 8, &err), -1);
	assert_int_equal(jscan_copy(doc, sizeof(doc) - 1, 8, &err), 0);
	for (i = 0; i < ARRAY_SIZE(named); i++) {
		struct jfield f[1] = { { .path = "a" } };

		err = NULL;
		assert_int_equal(jscan(named[i].text, named[i].cut, f, 1, 8,
		    &err), -1);
		assert_string_equal(err, named[i].err);
		err = NULL;
		assert_int_equal(jscan_copy(named[i].text, named[i].cut, 8,
		    &err), -1);
		assert_string_equal(err, named[i].err);
	}
}

/*
 * Strings are scanned sixteen (SSE2) or eight bytes at a time: put every
 * kind of byte that ends a plain run at every offset of the first three
 * blocks, and check validation, decoding and re-escaping against what a
 * byte loop expects.
 */
static void
jscan_word_runs(void **state)
{
	static const struct {
		const char *raw;	/* in the JSON text */
		const char *dec;	/* decoded, NULL: invalid */
	} mid[] = {
		{ "\\n", "\n" }, { "\\\"", "\"" }, { "\\\\", "\\" },
		{ "\\u00e9", "\xc3\xa9" }, { "\xc3\xa9", "\xc3\xa9" },
		{ "\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80" }, { "\x7f", "\x7f" },
		{ " ", " " }, { "!", "!" }, { "#", "#" }, { "[", "[" },
		{ "]", "]" }, { "\x01", NULL }, { "\x1f", NULL },
		{ "\t", NULL }, { "\xff", NULL }, { "\xc3", NULL },
		{ "\\x", NULL },
	};
	static const char filler[] = "abcdefghijklmnopqrstuvwxyz"
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
	char doc[128], want[128], *got, *again;
	struct jfield f[1];
	const char *err;
	struct buf b;
	size_t k, i, n, m;

	for (k = 0; k < 50; k++) {
		for (i = 0; i < ARRAY_SIZE(mid); i++) {
			memset(f, 0, sizeof(f));
			f[0].path = "a";
			n = (size_t)snprintf(doc, sizeof(doc),
			    "{\"a\":\"%.*s%sxyzxyzxyz\"}", (int)k, filler,
			    mid[i].raw);
			if (mid[i].dec == NULL) {
				assert_int_equal(jscan(doc, n, f, 1, 8, &err),
				    -1);
				continue;
			}
			assert_int_equal(jscan(doc, n, f, 1, 8, &err), 0);
			snprintf(want, sizeof(want), "%.*s%sxyzxyzxyz",
			    (int)k, filler, mid[i].dec);
			assert_int_equal(jscan_string(&f[0], &got, &m), 0);
			assert_string_equal(got, want);
			buf_init(&b, 1024);
			assert_int_equal(jscan_escape(&b, got), 0);
			memset(f, 0, sizeof(f));
			f[0].path = "";
			assert_int_equal(jscan(b.data, b.len, f, 0, 8, &err),
			    0);
			assert_true(b.len >= 2);
			f[0].type = JT_STRING;
			f[0].start = b.data + 1;
			f[0].len = b.len - 2;
			assert_int_equal(jscan_string(&f[0], &again, &m), 0);
			assert_string_equal(again, want);
			free(again);
			buf_release(&b);
			free(got);
		}
	}
}

static void
jscan_fields(void **state)
{
	const char *doc = "{\"action\":\"created\",\"issue\":{\"number\":42,"
	    "\"pull_request\":{\"url\":\"u\"},\"labels\":[{\"number\":7}]},"
	    "\"comment\":{\"body\":\"hi\\n\\u00e9 \\ud83d\\ude00\\b\\f\\r\\t"
	    "\\/\\\"\\\\\\udbff\\udfff\","
	    "\"user\":{\"login\":\"octo\",\"type\":null}},"
	    "\"n\":123456789012,\"big\":99999999999999999999,\"f\":1.5,"
	    "\"t\":true,\"\\u0061\\u0062\":\"escaped key\"}";
	struct jfield f[] = {
		{ "action", 0, NULL, 0, 0 }, { "issue", 0, NULL, 0, 0 },
		{ "issue.number", 0, NULL, 0, 0 },
		{ "issue.pull_request", 0, NULL, 0, 0 },
		{ "comment.body", 0, NULL, 0, 0 },
		{ "comment.user.login", 0, NULL, 0, 0 },
		{ "comment.user.type", 0, NULL, 0, 0 },
		{ "n", 0, NULL, 0, 0 }, { "big", 0, NULL, 0, 0 },
		{ "f", 0, NULL, 0, 0 }, { "t", 0, NULL, 0, 0 },
		{ "ab", 0, NULL, 0, 0 }, { "missing.x", 0, NULL, 0, 0 },
	};
	const char *err;
	char *str;
	size_t n;
	int64_t v;

	assert_int_equal(jscan(doc, strlen(doc), f, ARRAY_SIZE(f), 16, &err),
	    0);
	assert_int_equal(f[0].type, JT_STRING);
	assert_int_equal(jscan_string(&f[0], &str, &n), 0);
	assert_string_equal(str, "created");
	free(str);
	assert_int_equal(f[1].type, JT_OBJECT);
	/* neither decoder takes a value of another type */
	assert_int_equal(jscan_string(&f[1], &str, &n), -1);
	assert_int_equal(jscan_string(&f[2], &str, &n), -1);
	assert_int_equal(jscan_int(&f[0], &v), -1);
	/* the number inside the labels array is not issue.number */
	assert_int_equal(jscan_int(&f[2], &v), 0);
	assert_int_equal(v, 42);
	assert_int_equal(f[2].count, 1);
	assert_int_equal(f[3].type, JT_OBJECT);
	assert_int_equal(jscan_string(&f[4], &str, &n), 0);
	assert_string_equal(str, "hi\n\xc3\xa9 \xf0\x9f\x98\x80\b\f\r\t/\"\\"
	    "\xf4\x8f\xbf\xbf");
	free(str);
	assert_int_equal(f[6].type, JT_NULL);
	assert_int_equal(jscan_int(&f[7], &v), 0);
	assert_int_equal(v, INT64_C(123456789012));
	assert_int_equal(jscan_int(&f[8], &v), -1);	/* overflow */
	assert_int_equal(jscan_int(&f[9], &v), -1);	/* fraction */
	assert_int_equal(f[10].type, JT_TRUE);
	assert_int_equal(f[11].type, JT_STRING);	/* escaped key */
	assert_int_equal(f[12].type, JT_ABSENT);
	/* duplicates are counted, NUL is refused when decoding */
	{
		const char *dup = "{\"a\":1,\"a\":\"x\\u0000y\"}";
		struct jfield d[1] = { { "a", 0, NULL, 0, 0 } };

		assert_int_equal(jscan(dup, strlen(dup), d, 1, 8, &err), 0);
		assert_int_equal(d[0].count, 2);
		assert_int_equal(jscan_string(&d[0], &str, &n), -1);
	}
	/*
	 * a duplicate key on the way to a field makes it a duplicate too,
	 * whether or not the second object has it (jansson keeps the last)
	 */
	{
		static const char *const docs[] = {
			"{\"c\":{\"b\":\"x\",\"u\":{\"t\":\"U\"}},\"c\":{}}",
			"{\"c\":{\"u\":{\"t\":\"Bot\"}},\"c\":{\"b\":\"x\"}}",
			"{\"c\":{\"u\":{\"t\":1},\"u\":2,\"b\":\"x\"}}",
			"{\"c\":\"s\",\"c\":{\"b\":\"x\",\"u\":{\"t\":1}}}",
		};
		size_t i;

		for (i = 0; i < ARRAY_SIZE(docs); i++) {
			struct jfield d[2] = { { .path = "c.b" },
			    { .path = "c.u.t" } };

			assert_int_equal(jscan(docs[i], strlen(docs[i]), d, 2,
			    8, &err), 0);
			assert_true(d[1].count > 1);
			/* c.b: a duplicate where its own parent repeats */
			assert_true(i == 2 ? d[0].count == 1 : d[0].count > 1);
		}
	}
	/* the same key in different objects is no duplicate */
	{
		const char *ok = "{\"c\":{\"b\":\"x\"},\"d\":{\"c\":{\"b\":1}},"
		    "\"e\":[{\"c\":1},{\"c\":2}]}";
		struct jfield d[1] = { { .path = "c.b" } };

		assert_int_equal(jscan(ok, strlen(ok), d, 1, 8, &err), 0);
		assert_int_equal(d[0].count, 1);
	}
}

/*
 * The documented bounds: 64 fields (the last one recorded, one more
 * refused), paths of 8 components, jscan_int from INT64_MIN to INT64_MAX
 * and no further, and a number too long for its buffer refused before
 * it is copied (at 32 bytes, one too many: the sanitizer builds see it).
 */
static void
jscan_bounds(void **state)
{
	static const char deep[] = "{\"a\":{\"b\":{\"c\":{\"d\":{\"e\":{\"f\":"
	    "{\"g\":{\"h\":7}}}}}}}}";
	static const struct {
		const char *text;
		int ok;
		int64_t v;
	} ints[] = {
		{ "9223372036854775807", 1, INT64_MAX },
		{ "-9223372036854775808", 1, INT64_MIN },
		{ "-0", 1, 0 },
		{ "9223372036854775808", 0, 0 },
		{ "-9223372036854775809", 0, 0 },
		{ "1E2", 0, 0 },
		{ "10000000000000000000000000000000", 0, 0 },
		{ "-1000000000000000000000000000000", 0, 0 },
	};
	struct jfield f[JSCAN_MAX_FIELDS + 1];
	char names[JSCAN_MAX_FIELDS + 1][8], text[64];
	const char *err;
	struct buf doc;
	int64_t v;
	size_t i;

	(void)state;
	buf_init(&doc, 4096);
	buf_addstr(&doc, "{");
	for (i = 0; i <= JSCAN_MAX_FIELDS; i++) {
		snprintf(names[i], sizeof(names[i]), "k%zu", i);
		f[i].path = names[i];
		buf_printf(&doc, "%s\"k%zu\":%zu", i ? "," : "", i, i);
	}
	buf_addstr(&doc, "}");
	assert_int_equal(jscan(doc.data, doc.len, f, JSCAN_MAX_FIELDS, 8,
	    &err), 0);
	assert_int_equal(jscan_int(&f[JSCAN_MAX_FIELDS - 1], &v), 0);
	assert_int_equal(v, JSCAN_MAX_FIELDS - 1);
	err = NULL;
	assert_int_equal(jscan(doc.data, doc.len, f, JSCAN_MAX_FIELDS + 1, 8,
	    &err), -1);
	assert_string_equal(err, "too many fields requested");
	buf_release(&doc);

	f[0].path = "a.b.c.d.e.f.g.h";
	assert_int_equal(jscan(deep, strlen(deep), f, 1, 8, &err), 0);
	assert_int_equal(jscan_int(&f[0], &v), 0);
	assert_int_equal(v, 7);

	f[0].path = "v";
	for (i = 0; i < ARRAY_SIZE(ints); i++) {
		snprintf(text, sizeof(text), "{\"v\":%s}", ints[i].text);
		assert_int_equal(jscan(text, strlen(text), f, 1, 8, &err), 0);
		v = -1;
		assert_int_equal(jscan_int(&f[0], &v), ints[i].ok ? 0 : -1);
		if (ints[i].ok)
			assert_true(v == ints[i].v);
	}
}

/*
 * jscan_escape copies printable ASCII and UTF-8 as they are, wherever
 * they fall in its blocks; it escapes quotes, backslashes and every C0
 * control so that jansson reads the same string back; and a part the
 * buffer refused is an error even when the closing quote still fits.
 */
static void
jscan_escape_bytes(void **state)
{
	static const char utf8[] = "\xc3\xa9\xe2\x80\xa8\x7f \xf0\x9f\x98\x80 ";
	char plain[128], ctl[40], want[160];
	struct buf b;
	json_t *j;
	size_t i, n = 0;

	(void)state;
	for (i = 0x20; i < 0x7f; i++)
		if (i != '"' && i != '\\')
			plain[n++] = (char)i;
	memcpy(plain + n, utf8, sizeof(utf8));
	for (i = 0; plain[i] != '\0'; i++) {
		buf_init(&b, 1024);
		assert_int_equal(jscan_escape(&b, plain + i), 0);
		snprintf(want, sizeof(want), "\"%s\"", plain + i);
		assert_string_equal(b.data, want);
		buf_release(&b);
	}

	for (i = 1; i < 0x20; i++)
		ctl[i - 1] = (char)i;
	memcpy(ctl + 0x1f, "\"x\\", 4);
	buf_init(&b, 1024);
	assert_int_equal(jscan_escape(&b, ctl), 0);
	for (i = 0; i < b.len; i++)
		assert_true((unsigned char)b.data[i] >= 0x20);
	j = json_loadb(b.data, b.len, JSON_DECODE_ANY, NULL);
	assert_non_null(j);
	assert_string_equal(json_string_value(j), ctl);
	json_decref(j);
	buf_release(&b);

	/*
	 * "ab\n" escaped takes 6 bytes: 5 leave out the closing quote, 4 the
	 * \n while the closing quote still fits
	 */
	for (n = 5; n >= 4; n--) {
		buf_init(&b, n);
		assert_int_equal(jscan_escape(&b, "ab\n"), -1);
		buf_release(&b);
	}
}

/* ---- json_dump_compact: jansson's bytes ---- */

static int dumped;

static void
same_dump(const json_t *v)
{
	char *want = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
	size_t n = 0;
	char *got = json_dump_compact(v, &n);

	assert_non_null(want);
	assert_non_null(got);
	if (strcmp(want, got) != 0)
		fprintf(stderr, "# want %.200s\n# got  %.200s\n", want, got);
	assert_string_equal(got, want);
	assert_int_equal(n, strlen(want));
	free(want);
	free(got);
	dumped++;
}

static void
dump_tree(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	assert_non_null(d);
	while ((e = readdir(d)) != NULL) {
		char *path;
		struct stat sb;
		json_t *v;

		if (e->d_name[0] == '.')
			continue;
		path = xasprintf("%s/%s", dir, e->d_name);
		assert_int_equal(stat(path, &sb), 0);
		if (S_ISDIR(sb.st_mode)) {
			dump_tree(path);
		} else if (strlen(e->d_name) > 5 && strcmp(e->d_name +
		    strlen(e->d_name) - 5, ".json") == 0 &&
		    (v = json_load_file(path, JSON_DECODE_ANY, NULL)) != NULL) {
			same_dump(v);
			json_decref(v);
		}
		free(path);
	}
	closedir(d);
}

/* A random value of depth at most depth (a fixed seed). */
static json_t *
rnd_value(unsigned *seed, int depth)
{
	static const char *const pieces[] = { "a", "Z", "\"", "\\", "/",
	    "\n", "\t", "\r", "\b", "\f", "\x01", "\x1f", "\x7f", " ",
	    "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x9a\x80", "<", "&" };
	unsigned r = rand_r(seed) % (depth > 0 ? 9 : 6);
	json_t *v;
	int i, n;

	switch (r) {
	case 0: return json_null();
	case 1: return json_boolean(rand_r(seed) & 1);
	case 2: return json_integer((json_int_t)rand_r(seed) *
		    (rand_r(seed) & 1 ? 1 : -1) * (json_int_t)rand_r(seed));
	case 3: return json_real((double)rand_r(seed) / 7.0 *
		    (rand_r(seed) & 1 ? 1e-9 : 1e12));
	case 4:
	case 5: {
		struct buf sb;

		buf_init(&sb, 1024);
		buf_add(&sb, "", 0);
		n = (int)(rand_r(seed) % 12);
		for (i = 0; i < n; i++)
			buf_addstr(&sb, pieces[rand_r(seed) % (sizeof(pieces) /
			    sizeof(pieces[0]))]);
		v = json_string(sb.data);
		buf_release(&sb);
		return v;
	}
	case 6:
		v = json_array();
		n = (int)(rand_r(seed) % 5);
		for (i = 0; i < n; i++)
			json_array_append_new(v, rnd_value(seed, depth - 1));
		return v;
	default:
		v = json_object();
		n = (int)(rand_r(seed) % 5);
		for (i = 0; i < n; i++) {
			char key[16];

			snprintf(key, sizeof(key), "k%u\t\"%d",
			    rand_r(seed) % 100, i);
			json_object_set_new(v, key, rnd_value(seed, depth - 1));
		}
		return v;
	}
}

static void
dump_compact(void **state)
{
	const char *top = getenv("top_srcdir");
	char *dir = xasprintf("%s/tests/data", top ? top : ".");
	unsigned seed = 7;
	json_t *v;
	int i;

	(void)state;
	/* every JSON document of the test data: webhooks, API answers... */
	dump_tree(dir);
	free(dir);
	assert_true(dumped >= 50);
	/* the edges */
	v = json_pack("{s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:[],s:{},s:s#,s:s}",
	    "max", (json_int_t)INT64_MAX, "min", (json_int_t)INT64_MIN, "zero",
	    (json_int_t)0, "neg", (json_int_t)-1, "one", 1.0, "big", 1e20,
	    "small", -0.5e-7, "pi", 3.14159, "ea", "eo", "nul", "a\0b", 3,
	    "all", "\x01\x02\x1e\x1f\x7f\"\\/\xe2\x80\xa8");
	same_dump(v);
	json_decref(v);
	/* random documents */
	for (i = 0; i < 2000; i++) {
		v = rnd_value(&seed, 5);
		same_dump(v);
		json_decref(v);
	}
}

/* n arrays, or objects {"a":...}, one in another. */
static json_t *
nested(int n, int objects)
{
	json_t *v = objects ? json_object() : json_array(), *o;

	while (--n > 0) {
		o = objects ? json_object() : json_array();
		if (objects)
			json_object_set_new(o, "a", v);
		else
			json_array_append_new(o, v);
		v = o;
	}
	return v;
}

/*
 * The edges of json_dump_compact: no value, no text; values nested
 * 2048 deep are written, one deeper is refused, in an array or an
 * object, first or after others; texts of about the first buffer's size
 * (4 KiB, its NUL included) come out whole.
 */
static void
dump_edges(void **state)
{
	json_t *v;
	char *s;
	size_t n = 7;
	int objects, len;

	(void)state;
	assert_null(json_dump_compact(NULL, &n));
	assert_int_equal(n, 7);
	for (objects = 0; objects <= 1; objects++) {
		v = nested(2049, objects);
		same_dump(v);
		json_decref(v);
		v = nested(2050, objects);
		assert_null(json_dump_compact(v, NULL));
		json_decref(v);
		v = json_pack("[i,o]", 1, nested(2049, objects));
		assert_null(json_dump_compact(v, NULL));
		json_decref(v);
		v = json_pack("{s:i,s:o}", "a", 1, "b", nested(2049, objects));
		assert_null(json_dump_compact(v, NULL));
		json_decref(v);
	}
	for (len = 4090; len <= 4100; len++) {
		s = xmalloc((size_t)len + 1);
		memset(s, 'x', (size_t)len);
		s[len] = '\0';
		v = json_string(s);
		same_dump(v);
		json_decref(v);
		free(s);
	}
}

/*
 * Put stderr back (saved) after logging into fd, and quiet the log: fd
 * to read from the start.
 */
static FILE *
log_captured(int fd, int saved)
{
	FILE *f;

	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	log_setup(LOG_ERROR, 0);
	f = fdopen(fd, "r");
	assert_non_null(f);
	rewind(f);
	return f;
}

/*
 * Log lines stay lines: a value of any size or bytes (a delivery id is
 * logged before its signature is checked) is escaped and cut, the line
 * is ended, JSON lines are valid JSON in valid UTF-8.
 */
static void
log_lines(void **state)
{
	char path[] = "/tmp/diverge-log-XXXXXX", line[300000];
	char *huge = xmalloc(20001);
	int fd = mkstemp(path), saved = dup(2), json;
	FILE *f;

	(void)state;
	assert_true(fd >= 0 && saved >= 0);
	memset(huge, 0x7f, 20000);
	huge[20000] = '\0';
	assert_int_equal(dup2(fd, 2), 2);
	for (json = 1; json >= 0; json--) {
		log_setup(LOG_INFO, json);
		log_kv(LOG_INFO, "first", "did", "\xff\xfe" "abc\xc3\xa9\xed\xa0\x80",
		    NULL);
		log_kv(LOG_INFO, "huge", "did", huge, "after", "x", NULL);
		log_kv(LOG_INFO, "next", "did", "after", NULL);
	}
	f = log_captured(fd, saved);
	for (json = 1; json >= 0; json--) {
		int i;

		for (i = 0; i < 3; i++) {
			size_t n;
			json_t *j;

			assert_non_null(fgets(line, sizeof(line), f));
			n = strlen(line);
			assert_true(n > 0 && line[n - 1] == '\n');
			assert_true(n < 20000);
			if (!json) {
				assert_non_null(strstr(line, i == 0 ? "msg=first" :
				    i == 1 ? "msg=huge" : "msg=next"));
				continue;
			}
			j = json_loads(line, 0, NULL);
			assert_non_null(j);
			if (i == 0)
				assert_string_equal(json_string_value(
				    json_object_get(j, "did")), "\xef\xbf\xbd"
				    "\xef\xbf\xbd" "abc\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd"
				    "\xef\xbf\xbd");
			if (i == 1) {
				const char *d = json_string_value(
				    json_object_get(j, "did"));

				assert_true(strlen(d) < 4096);
				assert_non_null(strstr(d, "(truncated)"));
				assert_string_equal(json_string_value(
				    json_object_get(j, "after")), "x");
			}
			if (i == 2)
				assert_string_equal(json_string_value(
				    json_object_get(j, "msg")), "next");
			json_decref(j);
		}
	}
	assert_null(fgets(line, sizeof(line), f));
	fclose(f);
	unlink(path);
	free(huge);
}

/* Send stderr to a new file made from the mkstemp template path. */
static int
log_to(char *path)
{
	int fd = mkstemp(path), saved = dup(2);

	assert_true(fd >= 0 && saved >= 0);
	assert_int_equal(dup2(fd, 2), 2);
	close(fd);
	return saved;
}

/* Put stderr back (saved), quiet the log: what went to path (removed). */
static char *
log_back(const char *path, int saved)
{
	struct buf b;
	char chunk[8192];
	size_t n;
	FILE *f;

	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	log_setup(LOG_ERROR, 0);
	f = fopen(path, "r");
	assert_non_null(f);
	buf_init(&b, 1 << 24);
	buf_add(&b, "", 0);
	while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
		assert_int_equal(buf_add(&b, chunk, n), 0);
	fclose(f);
	unlink(path);
	return buf_detach(&b, NULL);
}

/*
 * The one line log_kv writes for msg and a pair (k NULL: none) in the
 * text or JSON format, from msg on; the whole line in *all (may be NULL).
 */
static char *
log_one(int json, const char *msg, const char *k, const char *v,
    char **all)
{
	char path[] = "/tmp/diverge-log-XXXXXX";
	int saved = log_to(path);
	char *text, *from, *line;

	log_setup(LOG_INFO, json);
	log_kv(LOG_INFO, msg, k, v, NULL);
	text = log_back(path, saved);
	assert_int_equal(occurrences(text, "\n"), 1);
	from = strstr(text, json ? "\"msg\":" : " msg=");
	assert_non_null(from);
	line = xstrdup(from + (json ? 0 : 1));
	if (all != NULL)
		*all = text;
	else
		free(text);
	return line;
}

/*
 * Each byte a value may hold, as both formats write it: the JSON
 * escapes (short ones for \n \r \t), control bytes and DEL as \u00XX,
 * invalid UTF-8 as U+FFFD; a text value is quoted when it is empty or
 * holds a space, a quote, '=', a backslash or a byte from 0x7f, and so
 * is a key; NULL is "-". A value with a newline stays on its line and
 * cannot start a line of its own.
 */
static void
log_escapes(void **state)
{
	char path[] = "/tmp/diverge-log-XXXXXX";
	int saved = log_to(path), json;
	char *text, *line, *nl;

	(void)state;
	for (json = 1; json >= 0; json--) {
		log_setup(LOG_INFO, json);
		log_kv(LOG_INFO, "m", "q", "a\"b", "bs", "a\\b", "nl", "a\nb",
		    "cr", "a\rb", "tab", "a\tb", "del", "a\x7f" "b", "ctl",
		    "\x01\x1f", "empty", "", "eq", "a=b", "sp", "a b", "utf8",
		    "\xc3\xa9", "bad", "\xff", "null", NULL, "a b", "plain",
		    NULL);
	}
	text = log_back(path, saved);
	line = strstr(text, "\"msg\":");
	nl = strchr(text, '\n');
	assert_true(line != NULL && nl != NULL && line < nl);
	*nl = '\0';
	assert_string_equal(line, "\"msg\":\"m\",\"q\":\"a\\\"b\","
	    "\"bs\":\"a\\\\b\",\"nl\":\"a\\nb\",\"cr\":\"a\\rb\","
	    "\"tab\":\"a\\tb\",\"del\":\"a\\u007fb\",\"ctl\":\"\\u0001\\u001f\","
	    "\"empty\":\"\",\"eq\":\"a=b\",\"sp\":\"a b\",\"utf8\":\"\xc3\xa9\","
	    "\"bad\":\"\\ufffd\",\"null\":\"-\",\"a b\":\"plain\"}");
	line = strstr(nl + 1, " msg=");
	assert_non_null(line);
	assert_string_equal(line, " msg=m q=\"a\\\"b\" bs=\"a\\\\b\" "
	    "nl=\"a\\nb\" cr=\"a\\rb\" tab=\"a\\tb\" del=\"a\\u007fb\" "
	    "ctl=\"\\u0001\\u001f\" empty=\"\" eq=\"a=b\" sp=\"a b\" "
	    "utf8=\"\xc3\xa9\" bad=\"\\ufffd\" null=- \"a b\"=plain\n");
	free(text);
	/* a message and a value that try to forge a second line */
	for (json = 1; json >= 0; json--) {
		line = log_one(json, "x\nts=2021-01-01T00:00:00.000Z "
		    "level=error msg=forged", "did",
		    "1\" level=error msg=\"forged", NULL);
		assert_string_equal(line, json ?
		    "\"msg\":\"x\\nts=2021-01-01T00:00:00.000Z level=error "
		    "msg=forged\",\"did\":\"1\\\" level=error "
		    "msg=\\\"forged\"}\n" :
		    "msg=\"x\\nts=2021-01-01T00:00:00.000Z level=error "
		    "msg=forged\" did=\"1\\\" level=error msg=\\\"forged\"\n");
		free(line);
	}
}

/*
 * A value is cut after LOG_VALUE_MAX (2048) bytes, not before: in JSON,
 * and in text, where a plain value that long is quoted to be cut; a line
 * with more pairs than its buffer holds drops the last ones and stays
 * whole (valid JSON, one line, within LOG_LINE_MAX).
 */
static void
log_cuts(void **state)
{
	char *v = xmalloc(2050), *ctl = xmalloc(2049), *line, *want;
	char path[] = "/tmp/diverge-log-XXXXXX";
	int saved, json, n;
	json_t *j;

#define WIDE4 "k", ctl, "k", ctl, "k", ctl, "k", ctl
	(void)state;
	memset(v, 'a', 2049);
	v[2048] = '\0';
	line = log_one(1, "m", "did", v, NULL);
	want = xasprintf("\"msg\":\"m\",\"did\":\"%s\"}\n", v);
	assert_string_equal(line, want);
	free(want);
	free(line);
	line = log_one(0, "m", "did", v, NULL);
	want = xasprintf("msg=m did=%s\n", v);
	assert_string_equal(line, want);
	free(want);
	free(line);
	v[2048] = 'a';
	v[2049] = '\0';
	for (json = 1; json >= 0; json--) {
		line = log_one(json, "m", "did", v, NULL);
		v[2048] = '\0';
		want = xasprintf(json ? "\"msg\":\"m\",\"did\":\"%s"
		    "\xe2\x80\xa6(truncated)\"}\n" :
		    "msg=m did=\"%s\xe2\x80\xa6(truncated)\"\n", v);
		v[2048] = 'a';
		assert_string_equal(line, want);
		free(want);
		free(line);
	}
	/* 32 values of 2048 bytes escaped to six each: 384 KiB */
	memset(ctl, 1, 2048);
	ctl[2048] = '\0';
	saved = log_to(path);
	for (json = 1; json >= 0; json--) {
		log_setup(LOG_INFO, json);
		log_kv(LOG_INFO, "wide", WIDE4, WIDE4, WIDE4, WIDE4, WIDE4,
		    WIDE4, WIDE4, WIDE4, NULL);
	}
	line = log_back(path, saved);
	want = strchr(line, '\n');
	assert_non_null(want);
	assert_true(want - line < 256 * 1024);
	*want++ = '\0';
	j = json_loads(line, 0, NULL);
	assert_non_null(j);
	assert_int_equal(strlen(json_string_value(json_object_get(j, "k"))),
	    2048);
	n = occurrences(line, "\"k\":");
	assert_true(n > 0 && n < 32);
	json_decref(j);
	assert_int_equal(occurrences(want, "\n"), 1);
	n = occurrences(want, " k=");
	assert_true(n > 0 && n < 32);
	assert_true(strlen(want) < 256 * 1024);
	assert_string_equal(want + strlen(want) - 2, "\"\n");
	free(line);
#undef WIDE4
	free(ctl);
	free(v);
}

/* Whether a line starts with a time stamp to the millisecond. */
static int
stamped(const char *line, int json)
{
	const char *ts = line + (json ? 7 : 3);
	static const char shape[] = "dddd-dd-ddTdd:dd:dd.dddZ";
	size_t i;

	if (strncmp(line, json ? "{\"ts\":\"" : "ts=", json ? 7 : 3) != 0)
		return 0;
	for (i = 0; i < sizeof(shape) - 1; i++)
		if (shape[i] == 'd' ? ts[i] < '0' || ts[i] > '9' :
		    ts[i] != shape[i])
			return 0;
	return ts[i] == (json ? '"' : ' ');
}

/*
 * Time stamps have three digits of milliseconds, zeros too: two lines
 * are written in the first tenth of a second.
 */
static void
log_stamps(void **state)
{
	char path[] = "/tmp/diverge-log-XXXXXX";
	int64_t t0, t1;
	char *text, *second;
	int saved, tries;

	(void)state;
	for (tries = 0; tries < 10; tries++) {
		while (now_unix_ms() % 1000 >= 20)
			usleep(1000);
		saved = log_to(path);
		t0 = now_unix_ms();
		log_setup(LOG_INFO, 1);
		log_kv(LOG_INFO, "m", NULL);
		log_setup(LOG_INFO, 0);
		log_kv(LOG_INFO, "m", NULL);
		t1 = now_unix_ms();
		text = log_back(path, saved);
		second = strchr(text, '\n');
		assert_non_null(second);
		assert_true(stamped(text, 1));
		assert_true(stamped(second + 1, 0));
		free(text);
		if (t0 / 1000 == t1 / 1000 && t1 % 1000 < 100)
			break;
	}
	assert_true(tries < 10);
}

/* Level names, "warning" for warn; a line at the minimum is written. */
static void
log_levels(void **state)
{
	(void)state;
	assert_int_equal(log_level_parse("debug"), LOG_DEBUG);
	assert_int_equal(log_level_parse("info"), LOG_INFO);
	assert_int_equal(log_level_parse("warn"), LOG_WARN);
	assert_int_equal(log_level_parse("warning"), LOG_WARN);
	assert_int_equal(log_level_parse("error"), LOG_ERROR);
	assert_int_equal(log_level_parse("Error"), -1);
	assert_int_equal(log_level_parse("errors"), -1);
	assert_int_equal(log_level_parse(""), -1);
	log_setup(LOG_WARN, 0);
	assert_false(log_enabled(LOG_INFO));
	assert_true(log_enabled(LOG_WARN));
	assert_true(log_enabled(LOG_ERROR));
	log_setup(LOG_ERROR, 0);
}

/* redact(s) as a string: s itself when nothing was hidden. */
static char *
redacted(const char *s)
{
	char *r = redact(s);

	return r != NULL ? r : xstrdup(s);
}

static void
redact_is(const char *in, const char *want)
{
	char *r = redacted(in);

	assert_string_equal(r, want);
	free(r);
}

/*
 * Registered secrets are hidden wherever they occur, overlapping or not,
 * raw or JSON-escaped, and when text cut short ends in their first part;
 * short values are not registered.
 */
static void
redact_secrets(void **state)
{
	static const char pem[] = "-----BEGIN RSA PRIVATE KEY-----\n"
	    "MIIEowIBAAKCAQEAxyzLINEONEOFTHEKEY0123456789\n"
	    "ANOTHERLINEofthekey+/0123456789abcdefgh==\n"
	    "-----END RSA PRIVATE KEY-----\n";

	(void)state;
	redact_secrets_clear();
	assert_null(redact("nothing to see: the token was refused"));
	redact_secret_add("ghp_SECRETtoken123\n", 19);
	redact_secret_add("whsec-OTHER-secret", 18);
	redact_secret_add("short", 5);
	redact_secret_add("1234567", 7);
	/* a second time is the same value */
	redact_secret_add("ghp_SECRETtoken123", 18);
	redact_is("Bad credentials for ghp_SECRETtoken123 (ghp_SECRETtoken123)",
	    "Bad credentials for [redacted] ([redacted])");
	redact_is("a=ghp_SECRETtoken123whsec-OTHER-secret;",
	    "a=[redacted];");
	/* short values stay: they would shred words */
	redact_is("a short message, 1234567", "a short message, 1234567");
	/* overlapping secrets: one run */
	redact_secret_add("abcdefgh12345678", 16);
	redact_secret_add("12345678XYZXYZXY", 16);
	redact_is("[abcdefgh12345678XYZXYZXY]", "[[redacted]]");
	redact_is("xabcdefgh12345678abcdefgh12345678x", "x[redacted]x");
	/* a message cut in the middle of a secret */
	redact_is("the header was Bearer-less ghp_SECRETt",
	    "the header was Bearer-less [redacted]");
	redact_is("ends in ghp_SEC", "ends in ghp_SEC");
	/* REDACT_MIN_LEN (8) bytes of its start are enough */
	redact_is("ends in ghp_SECR", "ends in [redacted]");
	/* a secret with JSON's special characters, as a JSON body has it */
	redact_secret_add("pa\"ss\\word-1", 12);
	redact_is("{\"password\":\"pa\\\"ss\\\\word-1\"}",
	    "{\"password\":\"[redacted]\"}");
	redact_is("raw pa\"ss\\word-1 here", "raw [redacted] here");
	/* each line of a key */
	redact_secret_add(pem, sizeof(pem) - 1);
	redact_is("bad key line ANOTHERLINEofthekey+/0123456789abcdefgh==",
	    "bad key line [redacted]");
	redact_is("-----END RSA PRIVATE KEY----- is fine",
	    "-----END RSA PRIVATE KEY----- is fine");
	redact_secrets_clear();
	redact_is("ghp_SECRETtoken123", "ghp_SECRETtoken123");
}

/* Credential shapes that are not ours, without false positives. */
static void
redact_shapes(void **state)
{
	(void)state;
	redact_secrets_clear();
	redact_is("proxy said: Authorization: Bearer abc.def-ghi_1 (denied)",
	    "proxy said: Authorization: Bearer [redacted] (denied)");
	redact_is("{\"authorization\":\"token ghp_x\"}",
	    "{\"authorization\":\"token [redacted]\"}");
	redact_is("Proxy-Authorization: Basic dXNlcjpwYXNz",
	    "Proxy-Authorization: Basic [redacted]");
	redact_is("PRIVATE-TOKEN: glpat-abcdefgh1234",
	    "PRIVATE-TOKEN: [redacted]");
	redact_is("invalid bearer eyJhbGciOi.J9x-y",
	    "invalid bearer [redacted]");
	redact_is("GET /x?page=2&access_token=abc123&per_page=5 failed",
	    "GET /x?page=2&access_token=[redacted]&per_page=5 failed");
	redact_is("https://u?token=s3cr3t", "https://u?token=[redacted]");
	/* every credential parameter name, as a name's end, any case */
	redact_is("GET /l?user=a&password=hunter2 401",
	    "GET /l?user=a&password=[redacted] 401");
	redact_is("/l?PassWd=hunter2&x=1", "/l?PassWd=[redacted]&x=1");
	redact_is("/t?client_secret=abc&grant=x",
	    "/t?client_secret=[redacted]&grant=x");
	redact_is("/v?api_key=k1;x", "/v?api_key=[redacted];x");
	redact_is("/v?APIKEY=k1#top", "/v?APIKEY=[redacted]#top");
	/* a parameter that only starts like one is left alone */
	redact_is("/m?tokens_used=5&passwords_reset=2",
	    "/m?tokens_used=5&passwords_reset=2");
	redact_is("push to https://x-access-token:ghs_abc@github.com/o/r.git",
	    "push to https://[redacted]@github.com/o/r.git");
	redact_is("proxy http://bob:hunter2@10.0.0.1:3128 refused",
	    "proxy http://[redacted]@10.0.0.1:3128 refused");
	/* user:password however short: a password is never shown */
	redact_is("proxy http://al:pw@10.0.0.1:3128 refused",
	    "proxy http://[redacted]@10.0.0.1:3128 refused");
	/* ordinary text stays as it is */
	redact_is("Authorization: required for this endpoint",
	    "Authorization: required for this endpoint");
	redact_is("invalid bearer credentials", "invalid bearer credentials");
	redact_is("the bearer token is invalid", "the bearer token is invalid");
	redact_is("ssh://git@github.com/o/r.git",
	    "ssh://git@github.com/o/r.git");
	redact_is("GET /repos/o/r/pulls?state=open&page=2",
	    "GET /repos/o/r/pulls?state=open&page=2");
	redact_is("token expired, password reset, authorization failed",
	    "token expired, password reset, authorization failed");
	redact_is("", "");
	/* GitLab's webhook token header; the Bot scheme (Discord's) */
	redact_is("X-Gitlab-Token: s3cr3t-hook-token1 refused",
	    "X-Gitlab-Token: [redacted] refused");
	redact_is("Authorization: Bot MTk4NjIy.Cl2FMQ.ZnCjm1XVW7vRze4b",
	    "Authorization: Bot [redacted]");
	/* a query value ends at a quote or an angle bracket */
	redact_is("{\"u\":\"/x?token=abc\"} <a href='/x?token=def'>",
	    "{\"u\":\"/x?token=[redacted]\"} <a href='/x?token=[redacted]'>");
	/* a user name that looks like a token, with no password */
	redact_is("clone https://a1b2c3d4e5f6a7b8@git.example/o/r.git failed",
	    "clone https://[redacted]@git.example/o/r.git failed");
	/* a token's run takes %-escapes in */
	redact_is("Authorization: Bearer abc%2Fdef%3D123 (denied)",
	    "Authorization: Bearer [redacted] (denied)");
	/* a bare "bearer" takes a token of REDACT_MIN_LEN (8), not 7 */
	redact_is("invalid bearer a1b2c3d4 here", "invalid bearer [redacted] "
	    "here");
	redact_is("invalid bearer a1b2c3d here", "invalid bearer a1b2c3d here");
	/* a header's value with no scheme, after ':' or '=' */
	redact_is("Private-Token: abc123def456ghi sent",
	    "Private-Token: [redacted] sent");
	redact_is("private-token=abc123def456 sent",
	    "private-token=[redacted] sent");
	/* "bearer" that starts a name is not a scheme */
	redact_is("the bearer_token_count metric is 12345",
	    "the bearer_token_count metric is 12345");
}

/*
 * Tokens GitHub and GitLab issue, JWTs, PEM private keys and macaroons are
 * hidden wherever they are quoted, as whole tokens; the text around them,
 * and words and blocks that only look alike, stay.
 */
static void
redact_vendor_shapes(void **state)
{
	(void)state;
	redact_secrets_clear();
	redact_is("Bad credentials: ghp_R8xq2Lm0vZ7kT4nB9cW1yH6jF3sD5aP0gE2u "
	    "(401)", "Bad credentials: [redacted] (401)");
	/* a GitHub token ends at a '-' (GitLab's may hold them) */
	redact_is("ghp_R8xq2Lm0vZ7kT4nB9cW1yH6jF3sD5aP0gE2u-suffix",
	    "[redacted]-suffix");
	/* a V2 macaroon's third character runs from E to L */
	redact_is("token AgLWZGl2ZXJnZS1tZXRlcgICbG9uZy1pZGVudGlmaWVyLXRo"
	    "YXQtaXMtbG9uZwA rest", "token [redacted] rest");
	redact_is("gho_0123456789abcdefghijABCDEFGHIJ012345,"
	    "\"ghu_0123456789abcdefghijABCDEFGHIJ012345\","
	    "x-access-token:ghs_0123456789abcdefghijABCDEFGHIJ012345_x "
	    "ghr_0123456789abcdefghijABCDEFGHIJ0123456789abcdef",
	    "[redacted],\"[redacted]\",x-access-token:[redacted] [redacted]");
	redact_is("token github_pat_11ABCDEFG0123456789abc_"
	    "defghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0123"
	    " was revoked", "token [redacted] was revoked");
	redact_is("glpat-Zx81mQpL0vNw7Rk2TcYh, gloas-0123456789abcdef0123, "
	    "gldt-0123456789_abcdef-0123 glrt-t1_0123456789abcdefghij "
	    "glrtr-0123456789abcdefghij glcbt-64_0123456789abcdefghij "
	    "glptt-0123456789abcdef0123456789abcdef01234567 "
	    "glft-0123456789abcdefghij glimt-0123456789abcdefghij "
	    "glagent-0123456789abcdefghij0123456789abcdefghij "
	    "glwt-0123456789abcdefghij glsoat-0123456789abcdefghij "
	    "glffct-0123456789abcdefghij",
	    "[redacted], [redacted], [redacted] [redacted] [redacted] "
	    "[redacted] [redacted] [redacted] [redacted] [redacted] "
	    "[redacted] [redacted] [redacted]");
	/* the routable form, at the end of a sentence; an instance prefix */
	redact_is("revoked glpat-Ab3dEf6hIj9lMn2pQr5t.01.171abc2de.",
	    "revoked [redacted].");
	redact_is("SIE-glpat-0123456789abcdefghij", "SIE-[redacted]");
	/* too short, or no token at all */
	redact_is("ghp_R8xq2Lm0vZ7kT4nB9cW1yH6jF3sD5aP0gE2 ghp_ github_pat_x "
	    "glpat-tooshort gl-project glrt- gloss ghost",
	    "ghp_R8xq2Lm0vZ7kT4nB9cW1yH6jF3sD5aP0gE2 ghp_ github_pat_x "
	    "glpat-tooshort gl-project glrt- gloss ghost");
	/* JWTs, signed or not, in text and in JSON */
	redact_is("kube said eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ."
	    "eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ."
	    "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U is expired",
	    "kube said [redacted] is expired");
	redact_is("{\"id_token\":\"eyJhbGciOiJub25lIn0."
	    "eyJzdWIiOiJ4In0.\",\"n\":1}",
	    "{\"id_token\":\"[redacted]\",\"n\":1}");
	redact_is("eyJ is how JSON starts; eyJhbGciOiJub25lIn0.e30.x and "
	    "eyJhbGciOiJub25lIn0 alone",
	    "eyJ is how JSON starts; eyJhbGciOiJub25lIn0.e30.x and "
	    "eyJhbGciOiJub25lIn0 alone");
	/* a second segment that is no JSON object: no JWT */
	redact_is("eyJhbGciOiJub25lIn0.abcdefghijklmnop.x stays",
	    "eyJhbGciOiJub25lIn0.abcdefghijklmnop.x stays");
	/*
	 * Macaroons (tests/unit/test_macaroon.c has the vectors): not words
	 * that start alike, nor base64 that is too short for one
	 */
	redact_is("macaroon AgEYaHR0cHM6Ly9kaXZlcmdlZGV2LmxvY2FsAg1hZ2VudC10b2tl"
	    "bi0xAAAGIKoXMMugMzCEuv0n2XtrAIvzZdaGwRNR1H_5G3ntVfij refused",
	    "macaroon [redacted] refused");
	redact_is("Again, Agile AgEYaHR0cHM6Ly9kaXZlcmdlZGV2LmxvY2FsAg1hZ2Vu "
	    "MDN Makefile.am MDAyNmxvY2F0aW9uIGh0dHBzOi8vZGl2ZXJn "
	    "xAgEYaHR0cHM6Ly9kaXZlcmdlZGV2LmxvY2FsAg1hZ2VudC10b2tlbi0xAAAG",
	    "Again, Agile AgEYaHR0cHM6Ly9kaXZlcmdlZGV2LmxvY2FsAg1hZ2Vu "
	    "MDN Makefile.am MDAyNmxvY2F0aW9uIGh0dHBzOi8vZGl2ZXJn "
	    "xAgEYaHR0cHM6Ly9kaXZlcmdlZGV2LmxvY2FsAg1hZ2VudC10b2tlbi0xAAAG");
	/* V1 (packets in base64), and V2 in padded standard base64 */
	redact_is("token MDAyNmxvY2F0aW9uIGh0dHBzOi8vZGl2ZXJnZWRldi5sb2NhbAow"
	    "MDIzaWRlbnRpZmllciBhZ2VudC10b2tlbi0xCjAwMmZzaWduYXR1cmUgAAECAwQF"
	    "BgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8K refused",
	    "token [redacted] refused");
	redact_is("token AgEYaHR0cHM6Ly9kaXZlcmdlZGV2LmxvY2FsAg1hZ2VudC10b2tl"
	    "bi0xAAAGIGRlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+AgYKDeA==, "
	    "AgEYaHR0cHM6Ly9kaXZlcmdlZGV2LmxvY2FsAg1hZ2VudC10b2tlbi0xAAAGIGRl"
	    "ZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+AgYKDeHg= refused",
	    "token [redacted], [redacted] refused");
	/* PEM private keys: raw, JSON-escaped, cut before their end */
	redact_is("key: -----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAxyz\n"
	    "Zm9vYmFy+/0123==\n-----END RSA PRIVATE KEY-----\nnext line",
	    "key: [redacted]\nnext line");
	redact_is("{\"key\":\"-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADAN\\n"
	    "-----END PRIVATE KEY-----\\n\",\"ok\":true}",
	    "{\"key\":\"[redacted]\\n\",\"ok\":true}");
	redact_is("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIA\n-----END EC "
	    "PRIVATE KEY----- and -----BEGIN PGP PRIVATE KEY BLOCK-----\n\n"
	    "lQOYBF\n-----END PGP PRIVATE KEY BLOCK-----",
	    "[redacted] and [redacted]");
	redact_is("bad key -----BEGIN OPENSSH PRIVATE KEY-----\n"
	    "b3BlbnNzaC1rZXktdjEAAAAA", "bad key [redacted]");
	/* glued to a token: the token's run does not swallow its start */
	redact_is("x glpat-0123456789abcdefghij-----BEGIN RSA PRIVATE KEY-----"
	    "\nMIIsecretbody\n-----END RSA PRIVATE KEY----- y",
	    "x [redacted] y");
	/* certificates, public keys and a lone END line are no secret */
	redact_is("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
	    " -----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY----- "
	    "-----END RSA PRIVATE KEY----- ---- --",
	    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
	    " -----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY----- "
	    "-----END RSA PRIVATE KEY----- ---- --");
}

/* redact(s) is exactly "<before>[redacted]<after>". */
static void
redact_window(const char *before, const char *v, size_t len,
    const char *after)
{
	char *in = xasprintf("%s%.*s%s", before, (int)len, v, after);
	char *want = xasprintf("%s[redacted]%s", before, after);

	redact_is(in, want);
	free(want);
	free(in);
}

/*
 * Of a long secret, any run of 16 bytes or more is hidden wherever it
 * stands in the text (cut at the start, in the middle), at any offset;
 * shorter runs, and runs of short secrets, stay as they were.
 */
static void
redact_fragments(void **state)
{
	static const char sec[] =
	    "Zq7Lm0vZ7kT4nB9cW1yH6jF3sD5aP0gE2uR8xq2Lm0vYt5Hk3Pn8Wb6Cd1Ge9Jx";
	static const char pem[] = "-----BEGIN RSA PRIVATE KEY-----\n"
	    "MIIEowIBAAKCAQEAxyzLINEONEOFTHEKEY0123456789\n"
	    "-----END RSA PRIVATE KEY-----\n";
	const size_t len = sizeof(sec) - 1;
	char pad[16], v[40];
	size_t off, from;
	int i;

	(void)state;
	redact_secrets_clear();
	redact_secret_add(sec, len);
	/* the last 30 bytes, an upstream's window of the request */
	redact_window("401 for token ending ", sec + len - 30, 30,
	    " (expired)");
	redact_window("", sec + 3, 20, " at the start of a header");
	redact_window("a quoted window: ", sec + 20, 16, "");
	/* every run of 16 at every offset of the text, against sampling */
	for (off = 0; off < 9; off++) {
		memset(pad, '.', off);
		pad[off] = '\0';
		for (from = 0; from + 16 <= len; from++)
			redact_window(pad, sec + from, 16, " tail");
	}
	/* two runs; 15 bytes are not enough */
	redact_window("a ", sec + 30, 17, " b [redacted] c");
	redact_is("x Zq7Lm0vZ7kT4nB9 y", "x Zq7Lm0vZ7kT4nB9 y");
	/* values shorter than 24 bytes keep the rules of before */
	redact_secret_add("kube-tok-REDACTme-98765", 23);
	redact_is("a kube-tok-REDACTme-9876 b", "a kube-tok-REDACTme-9876 b");
	redact_is("a kube-tok-REDACTme-98765 b", "a [redacted] b");
	/* the lines of a key, not its armour */
	redact_secret_add(pem, sizeof(pem) - 1);
	redact_is("line: LINEONEOFTHEKEY0123 bad",
	    "line: [redacted] bad");
	redact_is("the armour: RSA PRIVATE KEY-----\n-----END RSA PRIVATE KEY",
	    "the armour: RSA PRIVATE KEY-----\n-----END RSA PRIVATE KEY");
	/* a value read from a file with its newline */
	redact_secret_add("file-tok-0123456789abcdefABCDEF\n", 32);
	redact_is("x 23456789abcdefABCDEF", "x [redacted]");
	/*
	 * and one that starts like an armour line: its newline does not make
	 * it a key, whose armour lines are left out (found by fuzz_redact)
	 */
	redact_secret_add("\n-----tok-9876543210zyxwvuABCDEF\n", 33);
	redact_is("x 76543210zyxwvuABCD y", "x [redacted] y");
	/* the index follows rotations: evicted values are no longer hidden */
	for (i = 0; i < 300; i++) {
		snprintf(v, sizeof(v), "rotated-secret-value-%07d-xyz", i);
		redact_secret_add(v, strlen(v));
	}
	redact_is("ret-value-0000299-x", "[redacted]");
	redact_is("ret-value-0000000-x", "ret-value-0000000-x");
	redact_secrets_clear();
	redact_is("a quoted window: LINEONEOFTHEKEY0123",
	    "a quoted window: LINEONEOFTHEKEY0123");
}

static void *
redact_loop(void *arg)
{
	int i;

	(void)arg;
	for (i = 0; i < 2000; i++)
		free(redact("fault: secret-value-0000100 and more text"));
	return NULL;
}

/*
 * Lines are redacted while secrets come and go (a rotation, a SIGHUP):
 * more than the registry keeps, so the oldest are dropped meanwhile.
 */
static void
redact_threads(void **state)
{
	pthread_t th[4];
	char v[32];
	int i;

	(void)state;
	redact_secrets_clear();
	for (i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&th[i], NULL, redact_loop,
		    NULL), 0);
	for (i = 0; i < 300; i++) {
		snprintf(v, sizeof(v), "secret-value-%07d", i);
		redact_secret_add(v, strlen(v));
	}
	for (i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	/* the newest 256 are kept, the first ones went */
	redact_is("secret-value-0000299", "[redacted]");
	redact_is("secret-value-0000000", "secret-value-0000000");
	redact_secrets_clear();
}

/* Both log formats hide secrets, in the message and in values. */
static void
log_redacts(void **state)
{
	char path[] = "/tmp/diverge-log-XXXXXX", line[4096];
	int fd = mkstemp(path), saved = dup(2), json;
	FILE *f;

	(void)state;
	assert_true(fd >= 0 && saved >= 0);
	redact_secrets_clear();
	redact_secret_add("tok\"en\\0123456", 14);
	assert_int_equal(dup2(fd, 2), 2);
	for (json = 1; json >= 0; json--) {
		log_setup(LOG_INFO, json);
		log_kv(LOG_INFO, "msg tok\"en\\0123456", "error",
		    "HTTP 401: 'Bad credentials tok\"en\\0123456'", "auth",
		    "Authorization: Bearer zzz-9999-yyy", NULL);
	}
	f = log_captured(fd, saved);
	for (json = 1; json >= 0; json--) {
		json_t *j;

		assert_non_null(fgets(line, sizeof(line), f));
		assert_null(strstr(line, "0123456"));
		assert_null(strstr(line, "zzz-9999"));
		if (!json) {
			assert_non_null(strstr(line, "msg=\"msg [redacted]\""));
			assert_non_null(strstr(line,
			    "error=\"HTTP 401: 'Bad credentials [redacted]'\""));
			continue;
		}
		j = json_loads(line, 0, NULL);
		assert_non_null(j);
		assert_string_equal(json_string_value(json_object_get(j,
		    "msg")), "msg [redacted]");
		assert_string_equal(json_string_value(json_object_get(j,
		    "error")), "HTTP 401: 'Bad credentials [redacted]'");
		assert_string_equal(json_string_value(json_object_get(j,
		    "auth")), "Authorization: Bearer [redacted]");
		json_decref(j);
	}
	fclose(f);
	unlink(path);
	redact_secrets_clear();
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(buf_bounds),
		cmocka_unit_test(buf_reuse),
		cmocka_unit_test(media_types),
		cmocka_unit_test(base64_cases),
		cmocka_unit_test(base64_alphabet),
		cmocka_unit_test(hex_and_hmac),
		cmocka_unit_test(hex_digits),
		cmocka_unit_test(wipe_and_random),
		cmocka_unit_test(hmac_vectors),
		cmocka_unit_test(metrics_text),
		cmocka_unit_test(metrics_special_values),
		cmocka_unit_test(metrics_buckets),
		cmocka_unit_test(metrics_families),
		cmocka_unit_test(metrics_bounds),
		cmocka_unit_test(time_format),
		cmocka_unit_test(time_parse),
		cmocka_unit_test(time_ages),
		cmocka_unit_test(backoff_delays),
		cmocka_unit_test(jscan_validity),
		cmocka_unit_test(jscan_fields),
		cmocka_unit_test(jscan_word_runs),
		cmocka_unit_test(jscan_cuts),
		cmocka_unit_test(jscan_bounds),
		cmocka_unit_test(jscan_escape_bytes),
		cmocka_unit_test(dump_compact),
		cmocka_unit_test(dump_edges),
		cmocka_unit_test(log_lines),
		cmocka_unit_test(log_escapes),
		cmocka_unit_test(log_cuts),
		cmocka_unit_test(log_stamps),
		cmocka_unit_test(log_levels),
		cmocka_unit_test(redact_secrets),
		cmocka_unit_test(redact_shapes),
		cmocka_unit_test(redact_vendor_shapes),
		cmocka_unit_test(redact_fragments),
		cmocka_unit_test(redact_threads),
		cmocka_unit_test(log_redacts),
	};

	util_json_init();
	return cmocka_run_group_tests_name("util", tests, NULL, NULL);
}
