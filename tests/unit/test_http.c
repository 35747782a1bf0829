/*
 * The HTTP server's suspended requests: a reply from another thread
 * resumes the connection; a stop past its timeout answers what is still
 * suspended (libmicrohttpd aborts the process when stopped with suspended
 * connections), and the reply that comes after that is dropped without
 * touching freed memory (ASan checks that in CI).
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "http/http.h"
#include "util/util.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct http_req *held;

static int
h_hold(void *arg, struct http_req *req)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	held = req;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	return HTTP_SUSPENDED;
}

static int
h_post(void *arg, struct http_req *req)
{
	(void)arg;
	http_reply(req, 200, "application/json", "{}", 2);
	return 0;
}

static const struct http_route routes[] = {
	{ "GET", "/hold", "/hold", h_hold, NULL },
	{ "POST", "/post", "/post", h_post, NULL },
};

static int request_timeout_s;

static struct http_server *
start(void)
{
	struct http_server_config c;
	struct http_server *s = NULL;
	char *cause = NULL;

	memset(&c, 0, sizeof(c));
	c.listen = "127.0.0.1:0";
	c.threads = 2;
	c.max_connections = 16;
	c.connection_timeout_s = 10;
	c.max_body = 1 << 20;
	c.max_header = 8192;
	c.request_timeout_s = request_timeout_s;
	assert_int_equal(http_server_start(&s, &c, routes, ARRAY_SIZE(routes),
	    &cause), 0);
	return s;
}

/* A connection to the server; reads time out after 5 s. */
static int
dial(int port)
{
	struct sockaddr_in a;
	struct timeval tv = { 5, 0 };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static void
send_all(int fd, const char *data, size_t len)
{
	assert_int_equal(send(fd, data, len, MSG_NOSIGNAL), (ssize_t)len);
}

static void
send_str(int fd, const char *str)
{
	send_all(fd, str, strlen(str));
}

/* Connect, send a GET for path; the socket. */
static int
send_get(int port, const char *path)
{
	char req[128];
	int fd = dial(port);

	snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
	send_all(fd, req, strlen(req));
	return fd;
}

/* Read until the peer closes or buf is full; what was read. */
static size_t
read_all(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	ssize_t k;

	while (n + 1 < cap && (k = read(fd, buf + n, cap - 1 - n)) > 0)
		n += (size_t)k;
	buf[n] = '\0';
	return n;
}

static struct http_req *
wait_held(void)
{
	struct http_req *r;

	pthread_mutex_lock(&mu);
	while (held == NULL)
		pthread_cond_wait(&cv, &mu);
	r = held;
	held = NULL;
	pthread_mutex_unlock(&mu);
	return r;
}

static void *
reply_later(void *arg)
{
	sleep_ms(50);
	http_reply(arg, 202, "application/json", "{\"later\":true}", 14);
	return NULL;
}

static void
reply_from_another_thread(void **state)
{
	struct http_server *s = start();
	int fd = send_get(http_server_port(s), "/hold");
	pthread_t t;
	char buf[512];
	ssize_t n;

	(void)state;
	pthread_create(&t, NULL, reply_later, wait_held());
	n = read(fd, buf, sizeof(buf) - 1);
	pthread_join(t, NULL);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_non_null(strstr(buf, "HTTP/1.1 202"));
	close(fd);
	http_server_stop(s, 1000);
}

static void
reply_after_stop(void **state)
{
	struct http_server *s = start();
	int fd = send_get(http_server_port(s), "/hold");
	struct http_req *r;
	char buf[512];
	ssize_t n;

	(void)state;
	r = wait_held();
	/*
	 * The stop gives up waiting: the request is answered 503 (if the
	 * answer makes it out before the connection closes) and the server
	 * stops (libmicrohttpd would abort with it still suspended).
	 */
	http_server_stop(s, 100);
	n = read(fd, buf, sizeof(buf) - 1);
	if (n > 0) {
		buf[n] = '\0';
		assert_non_null(strstr(buf, "HTTP/1.1 503"));
	}
	close(fd);
	/* the reply that comes too late frees what is left, nothing more */
	http_reply_header(r, "Retry-After", "1");
	http_reply(r, 503, "application/json", "{}", 2);
}

/*
 * A client trickling its headers a byte at a time never goes idle, so
 * only the request deadline stops it: it is disconnected once
 * request_timeout has passed, while other clients are served meanwhile.
 */
static void
slow_client_cut(void **state)
{
	static const char req[] = "GET /hold HTTP/1.1\r\nHost: x\r\n"
	    "X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
	struct http_server *s;
	int64_t t0;
	size_t i;
	int fd, closed = 0;
	char buf[256];

	(void)state;
	request_timeout_s = 1;
	s = start();
	fd = dial(http_server_port(s));
	t0 = now_mono_ms();
	for (i = 0; i < sizeof(req) - 1 && now_mono_ms() - t0 < 6000; i++) {
		if (send(fd, req + i, 1, MSG_NOSIGNAL) != 1) {
			closed = 1;
			break;
		}
		sleep_ms(100);
		/* a well-behaved client is answered meanwhile */
		if (i == 5) {
			int g = dial(http_server_port(s));

			send_str(g, "POST /post HTTP/1.1\r\nHost: x\r\n"
			    "Content-Length: 0\r\nConnection: close\r\n\r\n");
			assert_true(read_all(g, buf, sizeof(buf)) > 0);
			assert_non_null(strstr(buf, "HTTP/1.1 200"));
			close(g);
		}
	}
	if (!closed) {
		ssize_t n = read(fd, buf, sizeof(buf));

		/* the end of the stream or a reset; not the 5 s read timeout */
		closed = n == 0 || (n < 0 && errno != EAGAIN &&
		    errno != EWOULDBLOCK);
	}
	assert_true(closed);
	/* cut within the deadline and the reaper's second, not at the end */
	assert_true(now_mono_ms() - t0 < 3500);
	assert_true(i < sizeof(req) - 1);
	close(fd);
	http_server_stop(s, 1000);
	request_timeout_s = 0;
}

/* A request that is with its handler has no deadline. */
static void
handled_request_kept(void **state)
{
	struct http_server *s;
	struct http_req *r;
	char buf[512];
	int fd;

	(void)state;
	request_timeout_s = 1;
	s = start();
	fd = send_get(http_server_port(s), "/hold");
	r = wait_held();
	sleep_ms(2500);
	http_reply(r, 202, "application/json", "{}", 2);
	assert_true(read(fd, buf, sizeof(buf) - 1) > 0);
	assert_non_null(strstr(buf, "HTTP/1.1 202"));
	close(fd);
	http_server_stop(s, 1000);
	request_timeout_s = 0;
}

/*
 * A chunked body past the limit (3 MiB against 1 MiB) is read to its end
 * and answered 413; with a request deadline, past twice the limit too.
 */
static void
chunked_too_large(void **state)
{
	static char chunk[7 + 65536 + 2];
	struct http_server *s;
	char buf[1024];
	size_t sent = 0;
	int fd;

	(void)state;
	request_timeout_s = 30;
	s = start();
	fd = dial(http_server_port(s));
	send_str(fd, "POST /post HTTP/1.1\r\nHost: x\r\n"
	    "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
	memcpy(chunk, "10000\r\n", 7);
	memset(chunk + 7, 'a', 65536);
	memcpy(chunk + 7 + 65536, "\r\n", 2);
	for (sent = 0; sent < (size_t)3 << 20; sent += 65536)
		send_all(fd, chunk, sizeof(chunk));
	send_str(fd, "0\r\n\r\n");
	assert_true(read_all(fd, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "HTTP/1.1 413"));
	assert_non_null(strstr(buf, "\"error\":\"request body too large\""));
	close(fd);
	http_server_stop(s, 1000);
	request_timeout_s = 0;
}

/* Headers past max_header (8 KiB here): a JSON 431. */
static void
headers_too_large(void **state)
{
	struct http_server *s = start();
	char big[12000], buf[1024];
	int fd;

	(void)state;
	fd = dial(http_server_port(s));
	memset(big, 'b', sizeof(big));
	send_str(fd, "GET /hold HTTP/1.1\r\nHost: x\r\nX-Big: ");
	send_all(fd, big, 10000);
	send_str(fd, "\r\nConnection: close\r\n\r\n");
	assert_true(read_all(fd, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "HTTP/1.1 431"));
	assert_non_null(strstr(buf, "application/json"));
	close(fd);
	/* just under the limit: served */
	fd = dial(http_server_port(s));
	send_str(fd, "POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
	    "Connection: close\r\nX-Big: ");
	send_all(fd, big, 7000);
	send_str(fd, "\r\n\r\n");
	assert_true(read_all(fd, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "HTTP/1.1 200"));
	close(fd);
	http_server_stop(s, 1000);
}

/*
 * The header limit counts the request line and each field as sent
 * ("Name: value" and its CRLF): a block of exactly max_header bytes is
 * served, one byte more gets the 431.
 */
static void
headers_at_limit(void **state)
{
	static const char pre[] = "POST /post HTTP/1.1\r\nHost: x\r\n"
	    "Content-Length: 0\r\nConnection: close\r\nX-Big: ";
	struct http_server *s = start();
	char big[8192], buf[1024];
	size_t k = 8192 - (sizeof(pre) - 1) - 2, extra;
	int fd;

	(void)state;
	memset(big, 'b', sizeof(big));
	for (extra = 0; extra <= 1; extra++) {
		fd = dial(http_server_port(s));
		send_str(fd, pre);
		send_all(fd, big, k + extra);
		send_str(fd, "\r\n\r\n");
		assert_true(read_all(fd, buf, sizeof(buf)) > 0);
		if (strncmp(buf, extra ? "HTTP/1.1 431" : "HTTP/1.1 200",
		    12) != 0)
			fail_msg("%zu bytes of headers: %.40s", 8192 + extra,
			    buf);
		close(fd);
	}
	http_server_stop(s, 1000);
}

/*
 * One request on a new connection, then the reply (what came within the
 * 5 s read timeout, to the close).
 */
static void
exchange(int port, const char *req, char *buf, size_t cap)
{
	int fd = dial(port);

	send_str(fd, req);
	read_all(fd, buf, cap);
	close(fd);
}

/*
 * Only %00 in the target is a NUL (%0a, a newline, routes as any byte);
 * two Host fields are two whatever their case; a Content-Length that is
 * not a number is refused before any body.
 */
static void
request_edges(void **state)
{
	struct http_server *s = start();
	int port = http_server_port(s);
	char buf[2048];

	(void)state;
	exchange(port, "GET /nothing%0a HTTP/1.1\r\nHost: x\r\n"
	    "Connection: close\r\n\r\n", buf, sizeof(buf));
	if (strncmp(buf, "HTTP/1.1 404", 12) != 0)
		fail_msg("/nothing%%0a: %.80s", buf);
	exchange(port, "GET /nothing%00 HTTP/1.1\r\nHost: x\r\n"
	    "Connection: close\r\n\r\n", buf, sizeof(buf));
	assert_int_equal(strncmp(buf, "HTTP/1.1 400", 12), 0);
	exchange(port, "GET /hold HTTP/1.1\r\nHost: a\r\nhost: b\r\n"
	    "Connection: close\r\n\r\n", buf, sizeof(buf));
	assert_int_equal(strncmp(buf, "HTTP/1.1 400", 12), 0);
	assert_non_null(strstr(buf, "more than one host header"));
	exchange(port, "POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 5x\r\n"
	    "Connection: close\r\n\r\nhello", buf, sizeof(buf));
	if (strncmp(buf, "HTTP/1.1 4", 10) != 0)
		fail_msg("Content-Length: 5x: %.80s", buf);
	http_server_stop(s, 1000);
}

/*
 * A body whose length the request does not say unambiguously (RFC 9112
 * 6.1 and 6.3) is refused with a JSON 400 before it is read, not taken
 * one way by us and maybe another by a proxy in front: a transfer coding
 * other than chunked (libmicrohttpd waited for the end of the stream and
 * answered nothing), Transfer-Encoding with Content-Length, and two
 * different Content-Length values (libmicrohttpd took the first).
 */
static void
ambiguous_framing(void **state)
{
	static const char *const bad[] = {
		"POST /post HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity"
		"\r\n\r\n{}",
		"POST /post HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, "
		"chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"POST /post HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
		"\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
		"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
		"Content-Length: 0\r\n\r\n{}",
	};
	struct http_server *s = start();
	int port = http_server_port(s);
	char buf[1024];
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		exchange(port, bad[i], buf, sizeof(buf));
		print_message("request %zu: %.60s\n", i, buf);
		assert_non_null(strstr(buf, "HTTP/1.1 400"));
		assert_non_null(strstr(buf, "application/json"));
		assert_non_null(strstr(buf, "\"error\":"));
		/* answered before the body: the connection is not reused */
		assert_non_null(strstr(buf, "Connection: close"));
	}
	/* still served: chunked alone, a repeated equal Content-Length */
	exchange(port, "POST /post HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
	    "Chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n", buf,
	    sizeof(buf));
	assert_non_null(strstr(buf, "HTTP/1.1 200"));
	exchange(port, "POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
	    "Content-Length: 2\r\nConnection: close\r\n\r\n{}", buf,
	    sizeof(buf));
	assert_non_null(strstr(buf, "HTTP/1.1 200"));
	http_server_stop(s, 1000);
}

/* Clients of quiesce_under_load: requests until told to stop. */
static atomic_int hammer_stop;	/* set by the test, read by hammers */

static void *
hammer(void *arg)
{
	struct sockaddr_in a;
	int port = *(int *)arg, fd;
	char buf[256];
	static const char req[] = "POST /post HTTP/1.1\r\nHost: x\r\n"
	    "Content-Length: 0\r\n\r\n";

	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	while (!hammer_stop) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0)
			continue;
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
		    send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) > 0)
			(void)read(fd, buf, sizeof(buf));
		close(fd);
	}
	return NULL;
}

/*
 * A stop (quiesce, drain, stop) while clients connect and send without
 * pause, over and over: the process must live through every one.
 * libmicrohttpd's own MHD_quiesce_daemon() on an epoll daemon with
 * worker threads races the workers' removal of the listen socket from
 * their epoll sets and can abort the process ("Failed to remove listen
 * FD from epoll set"): diverged's SIGTERM exited with SIGABRT now and
 * then.
 */
static void
quiesce_under_load(void **state)
{
	pthread_t th[4];
	struct http_server *s;
	int port, i, round;

	(void)state;
	for (round = 0; round < 300; round++) {
		s = start();
		port = http_server_port(s);
		hammer_stop = 0;
		for (i = 0; i < 4; i++)
			assert_int_equal(pthread_create(&th[i], NULL, hammer,
			    &port), 0);
		usleep(2000);
		http_server_quiesce(s);
		http_server_stop(s, 1000);
		hammer_stop = 1;
		for (i = 0; i < 4; i++)
			pthread_join(th[i], NULL);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(reply_from_another_thread),
		cmocka_unit_test(reply_after_stop),
		cmocka_unit_test(slow_client_cut),
		cmocka_unit_test(handled_request_kept),
		cmocka_unit_test(chunked_too_large),
		cmocka_unit_test(headers_too_large),
		cmocka_unit_test(headers_at_limit),
		cmocka_unit_test(request_edges),
		cmocka_unit_test(ambiguous_framing),
		cmocka_unit_test(quiesce_under_load),
	};

	log_setup(LOG_ERROR, 0);
	return cmocka_run_group_tests_name("http", tests, NULL, NULL);
}
