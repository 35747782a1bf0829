/* What the bench servers share: see bench_http.h. */
#include "config.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include "bench_http.h"
#include "config/config.h"

#define SIG_PREFIX "sha256="
#define SIG_LEN (sizeof(SIG_PREFIX) - 1 + 64)

static const char unauth_body[] = "{\"error\":\"bad signature\"}\n";
static const char toobig_body[] = "{\"error\":\"body too large\"}\n";
static const char method_body[] = "{\"error\":\"method not allowed\"}\n";

int
bench_secret_load(struct bench_secret *out, const char *prog,
    const char *path)
{
	char *ref = xasprintf("file:%s", path), *data = NULL, *cause = NULL;
	size_t len = 0;

	/* diverged's own reader: a regular file, 64 KiB at most, not empty */
	if (config_secret_read(ref, &data, &len, &cause) < 0) {
		fprintf(stderr, "%s: %s\n", prog, cause);
		free(cause);
		free(ref);
		return -1;
	}
	free(ref);
	out->data = (unsigned char *)data;
	out->len = len;
	return 0;
}

void
bench_secret_release(struct bench_secret *s)
{
	if (s->data == NULL)
		return;
	secure_wipe(s->data, s->len);
	free(s->data);
	s->data = NULL;
}

int
bench_parse_number(const char *s, unsigned long max, unsigned long *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || *s == '-' || v > max)
		return -1;
	*out = v;
	return 0;
}

enum MHD_Result
bench_reply(struct MHD_Connection *conn, unsigned int status,
    const char *body, size_t len)
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

static int
signature_ok(const struct bench_secret *s, const char *header,
    const char *body, size_t len)
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

int
bench_signed_post(struct MHD_Connection *conn,
    const struct bench_secret *s, const char *method,
    const char *upload_data, size_t *upload_data_size, void **con_cls,
    const struct bench_request **out, enum MHD_Result *result)
{
	struct bench_request *req = *con_cls;

	*result = MHD_YES;
	if (strcmp(method, MHD_HTTP_METHOD_POST) != 0) {
		*result = BENCH_REPLY(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
		    method_body);
		return 0;
	}
	if (req == NULL) {
		req = xcalloc(1, sizeof(*req));
		buf_init(&req->body, BENCH_BODY_MAX);
		*con_cls = req;
		return 0;
	}
	if (*upload_data_size > 0) {
		if (!req->too_big &&
		    buf_add(&req->body, upload_data, *upload_data_size) != 0)
			req->too_big = 1;
		*upload_data_size = 0;
		return 0;
	}
	if (req->too_big)
		*result = BENCH_REPLY(conn, 413 /* content too large */,
		    toobig_body);
	else if (!signature_ok(s, MHD_lookup_connection_value(conn,
	    MHD_HEADER_KIND, "X-Hub-Signature-256"), req->body.data,
	    req->body.len))
		*result = BENCH_REPLY(conn, MHD_HTTP_UNAUTHORIZED, unauth_body);
	else {
		*out = req;
		return 1;
	}
	return 0;
}

int
bench_signals(const char *prog, sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	if (pthread_sigmask(SIG_BLOCK, set, NULL) != 0) {
		fprintf(stderr, "%s: cannot block signals\n", prog);
		return -1;
	}
	signal(SIGPIPE, SIG_IGN);
	return 0;
}

struct MHD_Daemon *
bench_listen(const char *prog, uint16_t port, unsigned int flags,
    unsigned int pool, MHD_AccessHandlerCallback handler, void *cls)
{
	struct MHD_Daemon *d;
	struct sockaddr_in sin;
	/* the pool's size, when there is one, else nothing */
	struct MHD_OptionItem pool_opt[] = {
		{ pool > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END,
		    (intptr_t)pool, NULL },
		{ MHD_OPTION_END, 0, NULL }
	};

	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons(port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	d = MHD_start_daemon(flags | MHD_USE_INTERNAL_POLLING_THREAD |
	    MHD_USE_ERROR_LOG, port, NULL, NULL, handler, cls,
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin,
	    MHD_OPTION_ARRAY, pool_opt,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)1024,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)30,
	    MHD_OPTION_NOTIFY_COMPLETED, bench_completed, NULL,
	    MHD_OPTION_END);
	if (d == NULL) {
		fprintf(stderr, "%s: cannot listen on 127.0.0.1:%u\n", prog,
		    (unsigned int)port);
		return NULL;
	}
	printf("listening\n");
	fflush(stdout);
	return d;
}

void
bench_wait(const sigset_t *set)
{
	int sig = 0;

	while (sigwait(set, &sig) != 0 || (sig != SIGTERM && sig != SIGINT))
		;
}

void
bench_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
    enum MHD_RequestTerminationCode toe)
{
	struct bench_request *req = *con_cls;

	(void)cls;
	(void)conn;
	(void)toe;
	if (req == NULL)
		return;
	buf_release(&req->body);
	free(req);
	*con_cls = NULL;
}
