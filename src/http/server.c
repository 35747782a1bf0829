/*
 * The HTTP server: libmicrohttpd with an internal thread pool (epoll),
 * connection limit, idle timeout and a request deadline, bodies read into
 * bounded buffers, replies that may be produced later on another thread
 * (suspend/resume).
 */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "http/http.h"
#include "util/util.h"

#if MHD_VERSION < 0x00097002
#define MHD_RESULT int
#else
#define MHD_RESULT enum MHD_Result
#endif

/*
 * A connection, for the request deadline. libmicrohttpd's timeout is an
 * idle timeout: a client sending a byte every few seconds keeps its
 * connection forever, and a thousand such clients hold every connection
 * the server allows. So each connection has request_timeout to deliver a
 * whole request (headers and body), counted from its accept or from the
 * end of its previous request; the reaper shuts down the socket of one
 * that is late (shutdown(), not close(): libmicrohttpd still owns the
 * descriptor, sees the end of the stream and closes it as usual).
 */
struct http_conn {
	struct http_conn *prev, *next;
	MHD_socket fd;
	int64_t since_ms;	/* accepted, or its last request ended */
	int handled;		/* its request is with a handler: no deadline
				 * (these two: atomic; the rest under mu) */
	int cut;		/* shut down by the reaper */
};

struct http_server {
	struct MHD_Daemon *d;
	const struct http_route *routes;
	size_t nroutes;
	size_t max_body;
	size_t max_header;
	int port;
	pthread_mutex_t mu;
	pthread_cond_t idle;
	int inflight;
	struct http_req *susp;	/* suspended requests, to resume at stop */

	/* the request deadline (under mu) */
	struct http_conn *conns;
	int64_t request_timeout_ms;
	pthread_t reaper;
	int reaper_running;
	int stopping;
	pthread_cond_t rcond;
	int quiesced;		/* new connections closed (atomic) */
	int closing;		/* no more suspensions: the stop's last
				 * sweep (under mu) */
};

struct reply_header {
	char *name;
	char *value;
};

struct http_req {
	struct http_server *srv;
	struct MHD_Connection *conn;
	const struct http_route *route;
	char *method;
	char *path;
	struct buf body;
	int64_t start_ms;
	int too_large;
	size_t discarded;
	char *log_id;

	/* the reply */
	int status;
	char *ctype;
	char *rbody;
	size_t rlen;
	struct reply_header *hdrs;
	size_t nhdrs;
	int replied;
	int queued;
	int suspended;
	/*
	 * Who holds the request: libmicrohttpd until the connection is done
	 * (closed set), and the handler that will reply (replier set) from
	 * the moment it is called until its http_reply. The last one out
	 * frees it, so a reply that comes after the server gave up on the
	 * connection (a stop past its timeout) finds memory, not garbage.
	 */
	int owners;
	int replier;
	int closed;
	/* in srv->susp (under srv->mu; locked after mu, never before) */
	struct http_req *snext, *sprev;
	int listed;
	pthread_mutex_t mu;
};

/* ------------------------------------------------------------ helpers */

/* Resolve a listen address; see http.h. */
int
http_parse_listen(const char *listen, struct sockaddr_storage *ss,
    socklen_t *sslen, char **cause)
{
	char host[256];
	const char *colon, *port, *h = listen;
	size_t hl;
	struct addrinfo hints, *res = NULL;
	int rc;

	if (listen[0] == '[') {
		const char *end = strchr(listen, ']');

		if (end == NULL || end[1] != ':') {
			*cause = xasprintf("listen address '%s': expected "
			    "[ADDRESS]:PORT", listen);
			return -1;
		}
		h = listen + 1;
		hl = (size_t)(end - h);
		port = end + 2;
	} else {
		colon = strrchr(listen, ':');
		if (colon == NULL) {
			*cause = xasprintf("listen address '%s': expected "
			    "HOST:PORT", listen);
			return -1;
		}
		hl = (size_t)(colon - listen);
		port = colon + 1;
	}
	if (hl >= sizeof(host)) {
		*cause = xasprintf("listen address '%s': host too long", listen);
		return -1;
	}
	memcpy(host, h, hl);
	host[hl] = '\0';
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	rc = getaddrinfo(hl > 0 ? host : NULL, port, &hints, &res);
	if (rc != 0 || res == NULL) {
		*cause = xasprintf("listen address '%s': %s", listen,
		    gai_strerror(rc));
		return -1;
	}
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*sslen = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

/* libmicrohttpd's messages, at debug level; cls names the server. */
void
http_mhd_log(void *cls, const char *fmt, va_list ap)
{
	char *msg = xvasprintf(fmt, ap);
	size_t n = strlen(msg);

	while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '.'))
		msg[--n] = '\0';
	log_kv(LOG_DEBUG, cls != NULL ? cls : "http server", "detail", msg,
	    NULL);
	free(msg);
}

static const struct http_route *
find_route(const struct http_server *s, const char *method, const char *path,
    int *path_known, struct buf *allow)
{
	/* HEAD is GET without the body (RFC 9110 9.3.2; libmicrohttpd drops it) */
	const char *want = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0 ?
	    MHD_HTTP_METHOD_GET : method;
	size_t i;

	*path_known = 0;
	for (i = 0; i < s->nroutes; i++) {
		if (strcmp(s->routes[i].path, path) != 0)
			continue;
		*path_known = 1;
		if (allow->len > 0)
			buf_addstr(allow, ", ");
		buf_addstr(allow, s->routes[i].method);
		if (strcmp(s->routes[i].method, MHD_HTTP_METHOD_GET) == 0)
			buf_addstr(allow, ", " MHD_HTTP_METHOD_HEAD);
		if (strcmp(s->routes[i].method, want) == 0)
			return &s->routes[i];
	}
	return NULL;
}

static void
req_free(struct http_req *r)
{
	size_t i;

	if (r == NULL)
		return;
	buf_release(&r->body);
	free(r->method);
	free(r->path);
	free(r->log_id);
	free(r->ctype);
	free(r->rbody);
	for (i = 0; i < r->nhdrs; i++) {
		free(r->hdrs[i].name);
		free(r->hdrs[i].value);
	}
	free(r->hdrs);
	pthread_mutex_destroy(&r->mu);
	free(r);
}

/* Take r off the server's suspended list; r->mu and srv->mu held. */
static void
unlist(struct http_req *r)
{
	struct http_server *s = r->srv;

	if (!r->listed)
		return;
	if (r->sprev != NULL)
		r->sprev->snext = r->snext;
	else
		s->susp = r->snext;
	if (r->snext != NULL)
		r->snext->sprev = r->sprev;
	r->snext = r->sprev = NULL;
	r->listed = 0;
}

/* Add a reply header (r->mu held). */
static void
add_header(struct http_req *r, const char *name, const char *value)
{
	r->hdrs = xrealloc(r->hdrs, (r->nhdrs + 1) * sizeof(*r->hdrs));
	r->hdrs[r->nhdrs].name = xstrdup(name);
	r->hdrs[r->nhdrs].value = xstrdup(value);
	r->nhdrs++;
}

/* Record the reply (r->mu held); the first one wins. */
static void
set_reply(struct http_req *r, int status, const char *content_type,
    const char *body, size_t len)
{
	if (r->replied)
		return;
	r->status = status;
	r->ctype = content_type ? xstrdup(content_type) : NULL;
	r->rbody = xmalloc(len + 1);
	memcpy(r->rbody, body, len);
	r->rbody[len] = '\0';
	r->rlen = len;
	r->replied = 1;
}

/* Answer 503 to a request the stop leaves no time for (r->mu held). */
static void
reply_shutting_down(struct http_req *r)
{
	if (r->replied)
		return;
	set_reply(r, 503, "application/json",
	    "{\"error\":\"shutting down\"}", 25);
	add_header(r, "Retry-After", "5");
}

/* Resume a suspended request (r->mu held) so that its reply goes out. */
static void
resume(struct http_req *r)
{
	if (r->listed) {
		pthread_mutex_lock(&r->srv->mu);
		unlist(r);
		pthread_mutex_unlock(&r->srv->mu);
	}
	if (r->suspended && !r->closed) {
		r->suspended = 0;
		MHD_resume_connection(r->conn);
	}
}

static MHD_RESULT
queue_reply(struct http_req *r)
{
	struct MHD_Response *resp;
	MHD_RESULT ret;
	size_t i;

	resp = MHD_create_response_from_buffer(r->rlen, r->rbody,
	    MHD_RESPMEM_MUST_COPY);
	if (resp == NULL)
		return MHD_NO;
	if (r->ctype != NULL)
		MHD_add_response_header(resp, "Content-Type", r->ctype);
	for (i = 0; i < r->nhdrs; i++)
		MHD_add_response_header(resp, r->hdrs[i].name,
		    r->hdrs[i].value);
	/*
	 * Once stopping, a kept-alive connection gets its last reply: else
	 * a client that keeps sending holds the drain to its timeout.
	 */
	if (__atomic_load_n(&r->srv->quiesced, __ATOMIC_ACQUIRE))
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION,
		    "close");
	ret = MHD_queue_response(r->conn, (unsigned int)r->status, resp);
	MHD_destroy_response(resp);
	r->queued = 1;
	return ret;
}

/* -------------------------------------------------------------- MHD */

/*
 * What the request line and headers say, from one pass over the headers:
 * their size as sent, and how long the body is.
 */
struct hscan {
	size_t n;		/* bytes of the request line and headers */
	const char *cl;		/* the first Content-Length */
	int cl_differ;		/* another one says something else */
	int te;			/* Transfer-Encoding headers */
	int te_chunked;		/* the last one says just "chunked" */
	int hosts;		/* Host headers */
	int bad_name;		/* a name that is not a token */
};

/* Whether s[0..n) is an RFC 9110 token (what a header's name must be). */
static int
is_token(const char *s, size_t n)
{
	static const char extra[] = "!#$%&'*+-.^_`|~";
	size_t i;

	for (i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && (s[i] == '\0' ||
		    strchr(extra, s[i]) == NULL))
			return 0;
	return n > 0;
}

static MHD_RESULT
scan_header(void *cls, enum MHD_ValueKind kind, const char *key,
    size_t key_size, const char *value, size_t value_size)
{
	struct hscan *h = cls;

	(void)kind;
	h->n += key_size + value_size + 4;	/* ": " and CRLF */
	if (key == NULL || value == NULL)
		return MHD_YES;
	if (!is_token(key, key_size))
		h->bad_name = 1;
	else if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0)
		h->hosts++;
	if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
		if (h->cl == NULL)
			h->cl = value;
		else if (strcmp(h->cl, value) != 0)
			h->cl_differ = 1;
	} else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
		h->te++;
		h->te_chunked = strcasecmp(value, "chunked") == 0;
	}
	return MHD_YES;
}

static void
scan_headers(struct MHD_Connection *conn, const char *method,
    const char *url, const char *version, struct hscan *h)
{
	memset(h, 0, sizeof(*h));
	h->n = strlen(method) + strlen(url) + strlen(version) + 4;
	MHD_get_connection_values_n(conn, MHD_HEADER_KIND, scan_header, h);
}

/*
 * Why the length of the body is ambiguous (RFC 9112 6.1, 6.3), or NULL.
 * libmicrohttpd reads a body by the first Content-Length, or as chunked
 * when the first Transfer-Encoding is exactly that; a request that a
 * proxy in front could frame otherwise (smuggling), or that
 * libmicrohttpd would read to the end of the stream and never answer, is
 * refused before its body.
 */
static const char *
framing_error(const struct hscan *h)
{
	if (h->te > 0 && h->cl != NULL)
		return "both content-length and transfer-encoding";
	if (h->te > 1 || (h->te == 1 && !h->te_chunked))
		return "unsupported transfer-encoding";
	if (h->cl_differ)
		return "conflicting content-length";
	return NULL;
}

char http_nul_mark;

void *
http_uri_mark(void *cls, const char *uri, struct MHD_Connection *conn)
{
	const char *p;

	(void)cls;
	(void)conn;
	for (p = uri; p != NULL && (p = strchr(p, '%')) != NULL; p++)
		if (p[1] == '0' && p[2] == '0')
			return HTTP_NUL_MARK;
	return NULL;
}

/*
 * What RFC 9112 makes a server refuse with 400 in the headers (3.2, 5.1),
 * or NULL. libmicrohttpd takes "Content-Length : 5" as another header,
 * so a body a proxy in front read by it would be our next request.
 */
static const char *
header_error(const struct hscan *h, const char *version)
{
	if (h->bad_name)
		return "malformed header field name";
	if (h->hosts > 1)
		return "more than one host header";
	if (h->hosts == 0 && strcmp(version, MHD_HTTP_VERSION_1_1) == 0)
		return "missing host header";
	return NULL;
}

const char *
http_request_error(struct MHD_Connection *conn, const char *version,
    int *framing)
{
	struct hscan h;
	const char *why;

	scan_headers(conn, "", "", "", &h);
	*framing = 0;
	if ((why = header_error(&h, version)) != NULL)
		return why;
	*framing = (why = framing_error(&h)) != NULL;
	return why;
}

/* Whether conn's request is with a handler (no deadline) or not. */
static void
conn_handled(struct MHD_Connection *conn, int handled)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn,
	    MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct http_conn *c = ci != NULL ? ci->socket_context : NULL;

	if (c == NULL)
		return;
	/* twice a request: atomics, not the server lock (the reaper reads) */
	if (!handled)
		__atomic_store_n(&c->since_ms, now_mono_ms(), __ATOMIC_RELAXED);
	__atomic_store_n(&c->handled, handled, __ATOMIC_RELEASE);
}

static void
notify_conn(void *cls, struct MHD_Connection *conn, void **socket_context,
    enum MHD_ConnectionNotificationCode toe)
{
	struct http_server *s = cls;
	struct http_conn *c = *socket_context;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
		    conn, MHD_CONNECTION_INFO_CONNECTION_FD);

		c = xcalloc(1, sizeof(*c));
		c->fd = ci != NULL ? ci->connect_fd : MHD_INVALID_SOCKET;
		c->since_ms = now_mono_ms();
		pthread_mutex_lock(&s->mu);
		c->next = s->conns;
		if (s->conns != NULL)
			s->conns->prev = c;
		s->conns = c;
		pthread_mutex_unlock(&s->mu);
		*socket_context = c;
		return;
	}
	if (c == NULL)
		return;
	/* closed: before libmicrohttpd closes the descriptor */
	pthread_mutex_lock(&s->mu);
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&s->mu);
	free(c);
	*socket_context = NULL;
}

/* Once a second: cut the connections past their request deadline. */
static void *
reaper_main(void *arg)
{
	struct http_server *s = arg;

	thread_name("http-reaper");
	pthread_mutex_lock(&s->mu);
	while (!s->stopping) {
		struct http_conn *c;
		struct timespec ts;
		int64_t now = now_mono_ms();
		int cut = 0;

		for (c = s->conns; c != NULL; c = c->next) {
			if (__atomic_load_n(&c->handled, __ATOMIC_ACQUIRE) ||
			    c->cut || c->fd == MHD_INVALID_SOCKET || now -
			    __atomic_load_n(&c->since_ms, __ATOMIC_RELAXED) <=
			    s->request_timeout_ms)
				continue;
			shutdown(c->fd, SHUT_RDWR);
			c->cut = 1;
			cut++;
		}
		if (cut > 0) {
			char n[16];

			pthread_mutex_unlock(&s->mu);
			metrics_inc("diverge_http_connections_timed_out_total",
			    "", (double)cut);
			snprintf(n, sizeof(n), "%d", cut);
			log_kv(LOG_INFO, "http: disconnected clients too slow "
			    "to send a request", "connections", n, NULL);
			pthread_mutex_lock(&s->mu);
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&s->rcond, &s->mu, &ts);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static MHD_RESULT
access_cb(void *cls, struct MHD_Connection *conn, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **con_cls)
{
	struct http_server *s = cls;
	struct http_req *r = *con_cls;
	int rc;

	if (r == NULL || r == HTTP_NUL_MARK) {
		struct buf allow;
		struct hscan hs;
		int known, nul = r != NULL;
		const char *cl, *why;

		r = xcalloc(1, sizeof(*r));
		pthread_mutex_init(&r->mu, NULL);
		r->owners = 1;
		r->srv = s;
		r->conn = conn;
		r->method = xstrdup(method);
		r->path = xstrdup(url);
		r->start_ms = now_mono_ms();
		buf_init(&r->body, s->max_body);
		*con_cls = r;
		pthread_mutex_lock(&s->mu);
		s->inflight++;
		pthread_mutex_unlock(&s->mu);

		buf_init(&allow, 256);
		r->route = nul ? NULL : find_route(s, method, url, &known,
		    &allow);
		if (nul) {
			http_reply_error(r, 400, "the request target holds a "
			    "NUL byte (%00)");
		} else if (r->route == NULL && !known) {
			http_reply_error(r, 404, "not found");
		} else if (r->route == NULL) {
			http_reply_header(r, "Allow", allow.data);
			http_reply_error(r, 405, "method not allowed");
		}
		buf_release(&allow);
		scan_headers(conn, method, url, version, &hs);
		if (!r->replied && hs.n > s->max_header)
			http_reply_error(r, 431,
			    "request header fields too large");
		if (!r->replied && ((why = header_error(&hs, version)) != NULL
		    || (why = framing_error(&hs)) != NULL))
			http_reply_error(r, 400, why);
		cl = hs.cl;
		if (!r->replied && cl != NULL) {
			char *e;
			unsigned long long n;

			errno = 0;
			n = strtoull(cl, &e, 10);
			if (errno != 0 || e == cl || *e != '\0' ||
			    n > s->max_body) {
				r->too_large = 1;
				http_reply_error(r, 413,
				    "request body too large");
			}
		}
		if (r->replied)
			return queue_reply(r);
		return MHD_YES;
	}

	if (*upload_data_size > 0) {
		if (r->replied || r->too_large) {
			/*
			 * Read to the end and answer 413 then: a reply sent
			 * while the client is still sending is lost to the
			 * reset that closing on unread data causes. The
			 * request deadline bounds how long; without one, the
			 * old bound (as much again as the limit) holds.
			 */
			r->discarded += *upload_data_size;
			*upload_data_size = 0;
			return s->request_timeout_ms == 0 && r->discarded >
			    s->max_body ? MHD_NO : MHD_YES;
		}
		if (buf_add(&r->body, upload_data, *upload_data_size) < 0) {
			r->too_large = 1;
			buf_release(&r->body);
			r->discarded += *upload_data_size;
		}
		*upload_data_size = 0;
		return MHD_YES;
	}

	/* the whole request is here */
	pthread_mutex_lock(&r->mu);
	if (r->replied) {
		MHD_RESULT ret = r->queued ? MHD_YES : queue_reply(r);

		pthread_mutex_unlock(&r->mu);
		return ret;
	}
	pthread_mutex_unlock(&r->mu);
	if (r->too_large) {
		http_reply_error(r, 413, "request body too large");
		return queue_reply(r);
	}
	if (r->body.data == NULL)
		buf_add(&r->body, "", 0);
	conn_handled(conn, 1);
	pthread_mutex_lock(&r->mu);
	r->owners++;
	r->replier = 1;
	pthread_mutex_unlock(&r->mu);
	rc = r->route->handler(r->route->arg, r);
	if (rc == HTTP_SUSPENDED) {
		pthread_mutex_lock(&r->mu);
		if (r->replied) {
			/* replied before we could suspend: answer now */
			MHD_RESULT ret = queue_reply(r);

			r->suspended = 0;
			pthread_mutex_unlock(&r->mu);
			return ret;
		}
		pthread_mutex_lock(&s->mu);
		if (s->closing) {
			/*
			 * The stop has answered every suspended request and
			 * is about to stop libmicrohttpd, which aborts on a
			 * suspended connection: this one is answered now,
			 * like those (its handler's reply is dropped).
			 */
			MHD_RESULT ret;

			pthread_mutex_unlock(&s->mu);
			reply_shutting_down(r);
			ret = queue_reply(r);
			pthread_mutex_unlock(&r->mu);
			return ret;
		}
		r->suspended = 1;
		r->sprev = NULL;
		r->snext = s->susp;
		if (s->susp != NULL)
			s->susp->sprev = r;
		s->susp = r;
		r->listed = 1;
		pthread_mutex_unlock(&s->mu);
		MHD_suspend_connection(conn);
		pthread_mutex_unlock(&r->mu);
		return MHD_YES;
	}
	if (!r->replied)
		http_reply_error(r, 500, "internal error");
	return queue_reply(r);
}

static void
completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
    enum MHD_RequestTerminationCode toe)
{
	struct http_server *s = cls;
	struct http_req *r = *con_cls;
	char labels[256];
	const char *route;
	int last, queued, status;
	int64_t start_ms;

	conn_handled(conn, 0);
	if (r == NULL || r == HTTP_NUL_MARK) {
		*con_cls = NULL;
		return;
	}
	route = r->route != NULL ? r->route->name : "unmatched";
	/* once unlocked, r may belong to a replier still to come */
	pthread_mutex_lock(&r->mu);
	if (r->listed) {
		pthread_mutex_lock(&s->mu);
		unlist(r);
		pthread_mutex_unlock(&s->mu);
	}
	r->closed = 1;
	last = --r->owners == 0;
	queued = r->queued;
	status = r->status;
	start_ms = r->start_ms;
	pthread_mutex_unlock(&r->mu);
	if (queued) {
		snprintf(labels, sizeof(labels), "route=\"%s\",code=\"%d\"",
		    route, status);
		metrics_inc("diverge_http_requests_total", labels, 1);
		snprintf(labels, sizeof(labels), "route=\"%s\"", route);
		metrics_observe("diverge_http_request_duration_seconds",
		    labels, (double)(now_mono_ms() - start_ms) / 1000.0);
	} else {
		snprintf(labels, sizeof(labels), "route=\"%s\"", route);
		metrics_inc("diverge_http_requests_aborted_total", labels, 1);
	}
	/* a replier still to come frees it */
	if (last)
		req_free(r);
	*con_cls = NULL;
	pthread_mutex_lock(&s->mu);
	s->inflight--;
	if (s->inflight == 0)
		pthread_cond_broadcast(&s->idle);
	pthread_mutex_unlock(&s->mu);
}

/*
 * epoll where libmicrohttpd has it, else poll (MHD_USE_EPOLL and
 * MHD_USE_POLL are enum values, not macros: ask at run time). Without
 * either, each thread runs select(), whose cost grows with the
 * connections it watches and which cannot watch a descriptor above
 * FD_SETSIZE.
 */
unsigned int
http_mhd_poll_flags(void)
{
	if (MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES)
		return MHD_USE_EPOLL;
	if (MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES)
		return MHD_USE_POLL;
	return 0;
}

/* New connections are taken until http_server_quiesce. */
static MHD_RESULT
accept_cb(void *cls, const struct sockaddr *addr, socklen_t len)
{
	struct http_server *s = cls;

	(void)addr;
	(void)len;
	return __atomic_load_n(&s->quiesced, __ATOMIC_ACQUIRE) ? MHD_NO :
	    MHD_YES;
}

/* Start the server. */
int
http_server_start(struct http_server **out,
    const struct http_server_config *cfg, const struct http_route *routes,
    size_t nroutes, char **cause)
{
	struct http_server *s;
	struct sockaddr_storage ss;
	socklen_t sslen = 0;
	const union MHD_DaemonInfo *info;
	unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD |
	    MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;

	if (http_parse_listen(cfg->listen, &ss, &sslen, cause) < 0)
		return -1;
	if (ss.ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	flags |= http_mhd_poll_flags();
	s = xcalloc(1, sizeof(*s));
	s->routes = routes;
	s->nroutes = nroutes;
	s->max_body = cfg->max_body;
	s->max_header = cfg->max_header;
	s->request_timeout_ms = (int64_t)cfg->request_timeout_s * 1000;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->idle, NULL);
	pthread_cond_init(&s->rcond, NULL);
	metrics_describe("diverge_http_requests_total", METRIC_COUNTER,
	    "HTTP requests answered, by route and status code.");
	metrics_describe("diverge_http_request_duration_seconds",
	    METRIC_HISTOGRAM, "HTTP request latency, by route.");
	metrics_describe("diverge_http_requests_aborted_total", METRIC_COUNTER,
	    "HTTP requests that ended before a reply (client gone).");
	metrics_describe("diverge_http_connections_timed_out_total",
	    METRIC_COUNTER, "Connections cut because their request did not "
	    "arrive within http.request_timeout.");
	{
		static const char *const none[] = { "", NULL };

		metrics_zero("diverge_http_connections_timed_out_total", none);
	}
	s->d = MHD_start_daemon(flags, 0, accept_cb, s, access_cb, s,
	    /* first: libmicrohttpd logs what it finds in the options after */
	    MHD_OPTION_EXTERNAL_LOGGER, http_mhd_log, "http server",
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
	    MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)(cfg->threads > 0 ?
	    cfg->threads : 1),
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)cfg->max_connections,
	    MHD_OPTION_PER_IP_CONNECTION_LIMIT,
	    (unsigned int)(cfg->max_connections_per_ip > 0 ?
	    cfg->max_connections_per_ip : 0),
	    MHD_OPTION_CONNECTION_TIMEOUT,
	    (unsigned int)cfg->connection_timeout_s,
	    /*
	     * room for twice the header limit, so that a block just over it
	     * is read and refused with our JSON 431 (past that, libmicrohttpd
	     * answers 431 itself)
	     */
	    MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(2 * cfg->max_header +
	    16384),
	    MHD_OPTION_NOTIFY_COMPLETED, completed_cb, s,
	    MHD_OPTION_URI_LOG_CALLBACK, http_uri_mark, NULL,
	    MHD_OPTION_NOTIFY_CONNECTION, notify_conn, s,
	    /*
	     * not MHD_OPTION_LISTENING_ADDRESS_REUSE: it sets SO_REUSEPORT,
	     * and a second diverged on the same address then started and
	     * took half the connections; the default (SO_REUSEADDR) still
	     * lets a restart bind at once
	     */
	    MHD_OPTION_END);
	if (s->d == NULL) {
		*cause = xasprintf("cannot listen on '%s': %s", cfg->listen,
		    errno ? strerror(errno) : "libmicrohttpd refused");
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->idle);
		pthread_cond_destroy(&s->rcond);
		free(s);
		return -1;
	}
	if (s->request_timeout_ms > 0 &&
	    pthread_create(&s->reaper, NULL, reaper_main, s) == 0)
		s->reaper_running = 1;
	info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_LISTEN_FD);
	if (info != NULL) {
		struct sockaddr_storage b;
		socklen_t bl = sizeof(b);

		if (getsockname(info->listen_fd, (struct sockaddr *)&b,
		    &bl) == 0) {
			if (b.ss_family == AF_INET6)
				s->port = ntohs(((struct sockaddr_in6 *)&b)->
				    sin6_port);
			else
				s->port = ntohs(((struct sockaddr_in *)&b)->
				    sin_port);
		}
	}
	*out = s;
	return 0;
}

/* The bound port. */
int
http_server_port(const struct http_server *s)
{
	return s->port;
}

/* Requests in flight. */
int
http_server_inflight(const struct http_server *s)
{
	int n;

	pthread_mutex_lock((pthread_mutex_t *)&s->mu);
	n = s->inflight;
	pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
	return n;
}

/* Stop accepting. */
void
http_server_quiesce(struct http_server *s)
{
	if (s == NULL)
		return;
	/*
	 * Not MHD_quiesce_daemon(): on an epoll daemon with worker threads
	 * (ours) it races the workers' own removal of the listen socket
	 * from their epoll sets, and one that loses calls MHD_PANIC, which
	 * aborts the process (libmicrohttpd 0.9.75; quiesce_under_load in
	 * tests/unit/test_http.c reproduces it). The accept policy closes
	 * each new connection instead; the listen socket closes with
	 * http_server_stop.
	 */
	__atomic_store_n(&s->quiesced, 1, __ATOMIC_RELEASE);
}

/* Drain and free. */
void
http_server_stop(struct http_server *s, int64_t timeout_ms)
{
	int64_t deadline;

	if (s == NULL)
		return;
	deadline = now_mono_ms() + timeout_ms;
	pthread_mutex_lock(&s->mu);
	while (s->inflight > 0 && now_mono_ms() < deadline) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50 * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&s->idle, &s->mu, &ts);
	}
	pthread_mutex_unlock(&s->mu);
	/*
	 * libmicrohttpd aborts when stopped with suspended connections:
	 * whatever still waits for its reply is answered 503 now (its own
	 * reply, when it comes, finds the request answered and is dropped).
	 * The request lock comes first elsewhere, hence the trylock. From
	 * now on no request is suspended (access_cb answers it at once), so
	 * the list only shrinks and is empty at MHD_stop_daemon.
	 */
	pthread_mutex_lock(&s->mu);
	s->closing = 1;
	pthread_mutex_unlock(&s->mu);
	for (;;) {
		struct http_req *r;

		pthread_mutex_lock(&s->mu);
		r = s->susp;
		if (r == NULL) {
			pthread_mutex_unlock(&s->mu);
			break;
		}
		if (pthread_mutex_trylock(&r->mu) != 0) {
			pthread_mutex_unlock(&s->mu);
			sleep_ms(1);
			continue;
		}
		unlist(r);
		pthread_mutex_unlock(&s->mu);
		reply_shutting_down(r);
		resume(r);
		pthread_mutex_unlock(&r->mu);
	}
	if (s->reaper_running) {
		pthread_mutex_lock(&s->mu);
		s->stopping = 1;
		pthread_cond_signal(&s->rcond);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->reaper, NULL);
	}
	MHD_stop_daemon(s->d);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->idle);
	pthread_cond_destroy(&s->rcond);
	free(s);
}

/* ---------------------------------------------------------- requests */

const char *
http_req_method(const struct http_req *r)
{
	return r->method;
}

const char *
http_req_path(const struct http_req *r)
{
	return r->path;
}

const char *
http_req_header(const struct http_req *r, const char *name)
{
	return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *
http_req_query(const struct http_req *r, const char *name)
{
	return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND,
	    name);
}

const char *
http_req_body(const struct http_req *r, size_t *len)
{
	*len = r->body.len;
	return r->body.data ? r->body.data : "";
}

void
http_req_set_log_id(struct http_req *r, const char *id)
{
	free(r->log_id);
	r->log_id = id ? xstrdup(id) : NULL;
}

/* ----------------------------------------------------------- replies */

void
http_reply_header(struct http_req *r, const char *name, const char *value)
{
	pthread_mutex_lock(&r->mu);
	/* once answered (by a stop, say) the reply is no longer ours */
	if (!r->replied)
		add_header(r, name, value);
	pthread_mutex_unlock(&r->mu);
}

void
http_reply(struct http_req *r, int status, const char *content_type,
    const char *body, size_t len)
{
	int last = 0;

	pthread_mutex_lock(&r->mu);
	if (!r->replied) {
		set_reply(r, status, content_type, body, len);
		/*
		 * A suspended request is resumed in the same critical
		 * section: once the lock is released the request may be
		 * answered and freed, so nobody may touch it after a reply.
		 */
		resume(r);
	}
	if (r->replier) {
		r->replier = 0;
		last = --r->owners == 0;
	}
	pthread_mutex_unlock(&r->mu);
	/* the connection went away first: nobody else holds it */
	if (last)
		req_free(r);
}

void
http_reply_json(struct http_req *r, int status, json_t *body)
{
	char *s = json_dump_compact(body, NULL);

	if (s == NULL) {
		json_decref(body);
		http_reply(r, 500, "application/json",
		    "{\"error\":\"internal error\"}", 26);
		return;
	}
	http_reply(r, status, "application/json", s, strlen(s));
	free(s);
	json_decref(body);
}

void
http_reply_error(struct http_req *r, int status, const char *msg)
{
	http_reply_json(r, status, json_pack("{s:s}", "error", msg));
}

/* ------------------------------------------------------------- pool */

struct job {
	struct job *next;
	struct http_req *req;
	void (*fn)(void *arg, struct http_req *req);
	void *arg;
};

struct http_pool {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct job *head, **tail;
	int stopping;
	pthread_t *threads;
	int n;
};

static void *
pool_main(void *arg)
{
	struct http_pool *p = arg;

	thread_name("http-pool");
	pthread_mutex_lock(&p->mu);
	for (;;) {
		struct job *j;

		while (p->head == NULL && !p->stopping)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->head == NULL)
			break;
		j = p->head;
		p->head = j->next;
		if (p->head == NULL)
			p->tail = &p->head;
		pthread_mutex_unlock(&p->mu);
		/* fn replies; the request must not be touched after that */
		j->fn(j->arg, j->req);
		free(j);
		pthread_mutex_lock(&p->mu);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

/* Start a pool. */
int
http_pool_new(struct http_pool **out, int threads, char **cause)
{
	struct http_pool *p = xcalloc(1, sizeof(*p));
	int i;

	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->tail = &p->head;
	p->threads = xcalloc((size_t)threads, sizeof(pthread_t));
	for (i = 0; i < threads; i++) {
		if (pthread_create(&p->threads[i], NULL, pool_main, p) != 0) {
			*cause = xstrdup("cannot start the worker pool");
			http_pool_free(p);
			return -1;
		}
		p->n++;
	}
	*out = p;
	return 0;
}

/* Drain and stop. */
void
http_pool_free(struct http_pool *p)
{
	int i;

	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	p->stopping = 1;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (i = 0; i < p->n; i++)
		pthread_join(p->threads[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p->threads);
	free(p);
}

/* Queue fn for a pool thread; the request must then be suspended. */
void
http_offload(struct http_pool *p, struct http_req *req,
    void (*fn)(void *arg, struct http_req *req), void *arg)
{
	struct job *j = xcalloc(1, sizeof(*j));

	j->req = req;
	j->fn = fn;
	j->arg = arg;
	pthread_mutex_lock(&p->mu);
	*p->tail = j;
	p->tail = &j->next;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
}
