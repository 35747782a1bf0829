/*
 * ceiling: the upper bound for webhook intake on this machine. A bare
 * libmicrohttpd server, set up the way diverged sets up its listener
 * (internal epoll thread pool, one thread per core), that reads the body,
 * checks X-Hub-Signature-256 and answers 202. No parsing, no storage: what
 * diverged does beyond this is the cost of being useful and durable.
 *
 *   ceiling PORT SECRET_FILE
 *
 * Listens on 127.0.0.1:PORT, prints "listening" once ready, exits on
 * SIGTERM or SIGINT.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <microhttpd.h>

#include "util/util.h"

#if MHD_VERSION < 0x00097002
#define MHD_Result int
#endif

#define BODY_MAX (5 * 1024 * 1024)
#define SECRET_MAX 4096
#define SIG_PREFIX "sha256="
#define SIG_LEN (sizeof(SIG_PREFIX) - 1 + 64)

static const char accepted_body[] = "{\"accepted\":true}\n";
static const char unauth_body[] = "{\"error\":\"bad signature\"}\n";
static const char toobig_body[] = "{\"error\":\"body too large\"}\n";
static const char method_body[] = "{\"error\":\"method not allowed\"}\n";

struct secret {
	unsigned char *data;
	size_t len;
};

struct request {
	struct buf body;
	int too_big;
};

/* Read the whole secret file, dropping one trailing newline (and CR). */
static int
secret_load(struct secret *out, const char *path)
{
	FILE *f = NULL;
	unsigned char *data = NULL;
	size_t len;
	int ret = -1;

	if ((f = fopen(path, "rb")) == NULL) {
		fprintf(stderr, "ceiling: secret '%s': %s\n", path,
		    strerror(errno));
		goto out;
	}
	data = xmalloc(SECRET_MAX + 1);
	len = fread(data, 1, SECRET_MAX + 1, f);
	if (ferror(f) || len > SECRET_MAX) {
		fprintf(stderr, "ceiling: secret '%s': unreadable or too long\n",
		    path);
		goto out;
	}
	if (len > 0 && data[len - 1] == '\n')
		len--;
	if (len > 0 && data[len - 1] == '\r')
		len--;
	if (len == 0) {
		fprintf(stderr, "ceiling: secret '%s': empty\n", path);
		goto out;
	}
	out->data = data;
	out->len = len;
	data = NULL; /* now owned by out */
	ret = 0;
out:
	if (data != NULL) {
		secure_wipe(data, SECRET_MAX + 1);
		free(data);
	}
	if (f != NULL)
		fclose(f);
	return ret;
}

/* Queue a static JSON body with the given status. */
static enum MHD_Result
reply(struct MHD_Connection *conn, unsigned int status, const char *body,
    size_t len)
{
	struct MHD_Response *resp;
	enum MHD_Result r;

	resp = MHD_create_response_from_buffer(len, (void *)body,
	    MHD_RESPMEM_PERSISTENT);
	if (resp == NULL)
		return MHD_NO;
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
	    "application/json");
	r = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	return r;
}

/* 1 when the header carries the right sha256= signature of the body. */
static int
signature_ok(const struct secret *s, const char *header, const char *body,
    size_t len)
{
	unsigned char mac[32];
	char want[SIG_LEN + 1];

	if (header == NULL || strlen(header) != SIG_LEN)
		return 0;
	hmac_sha256(s->data, s->len, body, len, mac);
	memcpy(want, SIG_PREFIX, sizeof(SIG_PREFIX) - 1);
	hex_encode(mac, sizeof(mac), want + sizeof(SIG_PREFIX) - 1);
	return ct_equal(want, header, SIG_LEN);
}

static enum MHD_Result
handle(void *cls, struct MHD_Connection *conn, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **con_cls)
{
	const struct secret *s = cls;
	struct request *req = *con_cls;
	const char *sig;

	(void)url;
	(void)version;
	if (strcmp(method, MHD_HTTP_METHOD_POST) != 0)
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, method_body,
		    sizeof(method_body) - 1);
	if (req == NULL) {
		req = xcalloc(1, sizeof(*req));
		buf_init(&req->body, BODY_MAX);
		*con_cls = req;
		return MHD_YES;
	}
	if (*upload_data_size > 0) {
		if (!req->too_big &&
		    buf_add(&req->body, upload_data, *upload_data_size) != 0)
			req->too_big = 1;
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (req->too_big)
		return reply(conn, 413 /* content too large */, toobig_body,
		    sizeof(toobig_body) - 1);
	sig = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    "X-Hub-Signature-256");
	if (!signature_ok(s, sig, req->body.data, req->body.len))
		return reply(conn, MHD_HTTP_UNAUTHORIZED, unauth_body,
		    sizeof(unauth_body) - 1);
	return reply(conn, MHD_HTTP_ACCEPTED, accepted_body,
	    sizeof(accepted_body) - 1);
}

/* Free the per-request state once MHD is done with the request. */
static void
completed(void *cls, struct MHD_Connection *conn, void **con_cls,
    enum MHD_RequestTerminationCode toe)
{
	struct request *req = *con_cls;

	(void)cls;
	(void)conn;
	(void)toe;
	if (req == NULL)
		return;
	buf_release(&req->body);
	free(req);
	*con_cls = NULL;
}

static int
parse_port(const char *s, uint16_t *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < 1 || v > 65535)
		return -1;
	*out = (uint16_t)v;
	return 0;
}

int
main(int argc, char **argv)
{
	struct MHD_Daemon *d = NULL;
	struct secret secret = { NULL, 0 };
	struct sockaddr_in sin;
	sigset_t set;
	long ncpu;
	uint16_t port;
	int sig = 0;
	int ret = 1;

	if (argc != 3 || parse_port(argv[1], &port) != 0) {
		fprintf(stderr, "usage: ceiling PORT SECRET_FILE\n");
		return 2;
	}
	if (secret_load(&secret, argv[2]) != 0)
		goto out;

	/* Block the signals before MHD starts threads so only sigwait sees them. */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) {
		fprintf(stderr, "ceiling: cannot block signals\n");
		goto out;
	}
	signal(SIGPIPE, SIG_IGN);

	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (ncpu < 1)
		ncpu = 1;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons(port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

	d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
	    MHD_USE_ERROR_LOG, port, NULL, NULL, handle, &secret,
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin,
	    MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)ncpu,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)1024,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)30,
	    MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
	    MHD_OPTION_END);
	if (d == NULL) {
		fprintf(stderr, "ceiling: cannot listen on 127.0.0.1:%u\n",
		    (unsigned int)port);
		goto out;
	}
	printf("listening\n");
	fflush(stdout);

	while (sigwait(&set, &sig) != 0 || (sig != SIGTERM && sig != SIGINT))
		;
	ret = 0;
out:
	if (d != NULL)
		MHD_stop_daemon(d);
	if (secret.data != NULL) {
		secure_wipe(secret.data, secret.len);
		free(secret.data);
	}
	return ret;
}
