/* util: bounded buffers, encodings, HMAC, metrics rendering. */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "testutil.h"

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
	assert_int_equal(buf_printf(&b, "%d-%s", 42, "ab"), 0);
	assert_string_equal(b.data, "42-ab");
	assert_int_equal(buf_printf(&b, "%s", "0123456789"), -1);
	buf_release(&b);
	/* a huge n cannot wrap the length check */
	buf_init(&b, 100);
	assert_int_equal(buf_add(&b, "x", SIZE_MAX), -1);
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
		free(out);
		assert_int_equal(base64_decode(cases[i].url_nopad,
		    strlen(cases[i].url_nopad), &out, &n), 0);
		assert_int_equal(n, rl);
		assert_memory_equal(out, cases[i].raw, rl);
		free(out);
	}
	assert_int_equal(base64_decode("Zm9v!", 5, &out, &n), -1);
	assert_int_equal(base64_decode("Z", 1, &out, &n), -1);
	assert_int_equal(base64_decode("Zg=", 3, &out, &n), -1);
	assert_int_equal(base64_decode("Zh==", 4, &out, &n), -1);
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

static void
time_format(void **state)
{
	char out[32];

	time_rfc3339(0, out);
	assert_string_equal(out, "1970-01-01T00:00:00Z");
	time_rfc3339(1614265330, out);
	assert_string_equal(out, "2021-02-25T15:02:10Z");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(buf_bounds),
		cmocka_unit_test(base64_cases),
		cmocka_unit_test(hex_and_hmac),
		cmocka_unit_test(metrics_text),
		cmocka_unit_test(time_format),
	};

	util_json_init();
	return cmocka_run_group_tests_name("util", tests, NULL, NULL);
}
