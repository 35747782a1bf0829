/*
 * The HTTP server's suspended requests: a reply from another thread
 * resumes the connection; a stop past its timeout answers what is still
 * suspended (libmicrohttpd aborts the process when stopped with suspended
 * connections), and the reply that comes after that is dropped without
 * touching freed memory (ASan checks that in CI).
 */
#include "config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
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

static const struct http_route routes[] = {
	{ "GET", "/hold", "/hold", h_hold, NULL },
};

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
	assert_int_equal(http_server_start(&s, &c, routes, 1, &cause), 0);
	return s;
}

/* Connect, send a GET for path; the socket, reads time out after 5 s. */
static int
send_get(int port, const char *path)
{
	struct sockaddr_in a;
	struct timeval tv = { 5, 0 };
	char req[128];
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
	assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	return fd;
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(reply_from_another_thread),
		cmocka_unit_test(reply_after_stop),
	};

	log_setup(LOG_ERROR, 0);
	return cmocka_run_group_tests_name("http", tests, NULL, NULL);
}
