/*
 * http: the libmicrohttpd server of diverged: a route table, bounded
 * request bodies, JSON replies, suspend/resume for replies produced on
 * another thread, and request metrics.
 */
#ifndef DIVERGE_HTTP_H
#define DIVERGE_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include <stdarg.h>
#include <sys/socket.h>

struct http_server;
struct http_req;

struct MHD_Connection;

/*
 * What is wrong with a libmicrohttpd request's headers, from one pass
 * over them, or NULL: such a request is refused with 400 before its body.
 * Either what RFC 9112 3.2 and 5.1 make a server refuse (a name that is
 * not a token, as "Content-Length : 5"; no Host in HTTP/1.1, or two), or,
 * with *framing set, why the length of the body is ambiguous (both
 * Content-Length and Transfer-Encoding, a Transfer-Encoding other than
 * one "chunked", Content-Lengths that differ: RFC 9112 6.1, 6.3).
 */
const char *http_request_error(struct MHD_Connection *conn,
    const char *version, int *framing);

/*
 * libmicrohttpd decodes a request's path and query in place, so a %00 in
 * them cut them short there: "/tasks/a%00b" would be served as
 * "/tasks/a". http_uri_mark, its URI log callback
 * (MHD_OPTION_URI_LOG_CALLBACK), sees the request target as sent and
 * returns HTTP_NUL_MARK for one with a %00: the request's first context
 * value, which its handler answers with 400 (and its completion callback
 * leaves alone); NULL otherwise.
 */
extern char http_nul_mark;
#define HTTP_NUL_MARK ((void *)&http_nul_mark)
void *http_uri_mark(void *cls, const char *uri, struct MHD_Connection *conn);

/*
 * Resolve "HOST:PORT", "[V6]:PORT" or ":PORT" (all addresses) into *ss;
 * -1 with *cause naming the address.
 */
int http_parse_listen(const char *listen, struct sockaddr_storage *ss,
    socklen_t *sslen, char **cause);

/*
 * A libmicrohttpd external logger writing debug lines; its closure is the
 * server's name (a static string).
 */
void http_mhd_log(void *cls, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* The MHD_USE_* flag of the best poller this libmicrohttpd has. */
unsigned int http_mhd_poll_flags(void);

/* A handler returns HTTP_DONE after replying, or HTTP_SUSPENDED. */
enum { HTTP_DONE = 0, HTTP_SUSPENDED = 1 };

/*
 * One route: exact path match. method is "GET", "POST", ... A request for
 * a known path with another method gets 405 with an Allow header.
 * name labels the route in metrics.
 */
struct http_route {
	const char *method;
	const char *path;
	const char *name;
	int (*handler)(void *arg, struct http_req *req);
	void *arg;
};

struct http_server_config {
	const char *listen;		/* host:port, [v6]:port; port 0 = any */
	int threads;			/* thread pool size */
	int max_connections;
	int max_connections_per_ip;	/* 0: no limit */
	int connection_timeout_s;	/* idle timeout */
	int request_timeout_s;		/* headers and body must arrive in
					 * this time (0: no limit) */
	size_t max_body;		/* 413 beyond */
	size_t max_header;		/* request line + headers */
};

/*
 * Start serving routes (the array must outlive the server). Returns 0, or
 * -1 with *cause.
 */
int http_server_start(struct http_server **out,
    const struct http_server_config *cfg, const struct http_route *routes,
    size_t nroutes, char **cause);
/* The port actually bound. */
int http_server_port(const struct http_server *s);
/*
 * Take no more connections: each new one is closed as it comes (in-flight
 * requests and open connections go on until http_server_stop).
 */
void http_server_quiesce(struct http_server *s);
/*
 * Wait up to timeout_ms for in-flight requests to finish, then stop
 * every thread and free the server. NULL is a no-op.
 */
void http_server_stop(struct http_server *s, int64_t timeout_ms);
/* Requests being handled right now. */
int http_server_inflight(const struct http_server *s);

/* ---- request accessors (valid during the handler) ---- */
const char *http_req_method(const struct http_req *r);
const char *http_req_path(const struct http_req *r);
/* A request header (case-insensitive); NULL when absent. */
const char *http_req_header(const struct http_req *r, const char *name);
/* A query-string argument; NULL when absent. */
const char *http_req_query(const struct http_req *r, const char *name);
/* The request body (NUL-terminated for convenience) and its length. */
const char *http_req_body(const struct http_req *r, size_t *len);
/* Context for log lines: set by handlers, e.g. the delivery id. */
void http_req_set_log_id(struct http_req *r, const char *id);

/* ---- replies: exactly one per request ---- */
/* Add a response header (before the reply is queued). */
void http_reply_header(struct http_req *r, const char *name,
    const char *value);
/* A reply with a body copied from body. */
void http_reply(struct http_req *r, int status, const char *content_type,
    const char *body, size_t len);
/* A JSON reply; takes the reference to body. */
void http_reply_json(struct http_req *r, int status, json_t *body);
/* {"error": msg} with status. */
void http_reply_error(struct http_req *r, int status, const char *msg);

/*
 * A handler that returns HTTP_SUSPENDED leaves the request waiting; some
 * other thread later calls one http_reply*, which resumes it. After that
 * call the request may already be answered and freed: do not touch it.
 */

/*
 * A pool of threads for handlers whose work blocks (a durable commit, a
 * call to an API server): the handler calls http_offload() and returns
 * HTTP_SUSPENDED; fn runs on a pool thread and must reply (http_reply*),
 * which resumes the request.
 */
struct http_pool;

int http_pool_new(struct http_pool **out, int threads, char **cause);
/* Stop taking work, finish what is queued, join the threads. */
void http_pool_free(struct http_pool *p);
void http_offload(struct http_pool *p, struct http_req *req,
    void (*fn)(void *arg, struct http_req *req), void *arg);

#endif
