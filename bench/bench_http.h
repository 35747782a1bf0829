/*
 * What the bench servers (bench/ceiling.c, bench/durable.c) share: the
 * webhook secret, the request body, the signature check and the replies.
 */
#ifndef DIVERGE_BENCH_HTTP_H
#define DIVERGE_BENCH_HTTP_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "util/util.h"

#if MHD_VERSION < 0x00097002
#define MHD_Result int
#endif

#define BENCH_BODY_MAX (5 * 1024 * 1024)

struct bench_secret {
	unsigned char *data;
	size_t len;
};

/* One request's body, read whole (up to BENCH_BODY_MAX). */
struct bench_request {
	struct buf body;
	int too_big;
};

/*
 * Read the secret file as diverged reads a file: secret, dropping a
 * trailing newline: 0, or -1 (said on stderr).
 */
int bench_secret_load(struct bench_secret *out, const char *prog,
    const char *path);
void bench_secret_release(struct bench_secret *s);

/* A decimal number in [0, max] and nothing else: 0, or -1. */
int bench_parse_number(const char *s, unsigned long max, unsigned long *out);

/*
 * The start every bench handler shares: a POST, its body read whole, its
 * X-Hub-Signature-256 right. 1 with *req set when the body is whole and
 * signed; 0 with *result to return otherwise (more body to come, or the
 * 405, 413 or 401 queued).
 */
int bench_signed_post(struct MHD_Connection *conn,
    const struct bench_secret *s, const char *method,
    const char *upload_data, size_t *upload_data_size, void **con_cls,
    const struct bench_request **req, enum MHD_Result *result);

/* Queue a static JSON body with status. */
enum MHD_Result bench_reply(struct MHD_Connection *conn, unsigned int status,
    const char *body, size_t len);
#define BENCH_REPLY(conn, status, body) \
	bench_reply(conn, status, body, sizeof(body) - 1)

/*
 * Block SIGTERM and SIGINT into *set (call it before any thread starts,
 * so that only bench_wait sees them) and ignore SIGPIPE: 0, or -1 (said).
 */
int bench_signals(const char *prog, sigset_t *set);

/*
 * libmicrohttpd on 127.0.0.1:port with flags (a pool of pool threads when
 * pool > 1), requests to handler; prints "listening" once it is. NULL
 * (said) when it cannot.
 */
struct MHD_Daemon *bench_listen(const char *prog, uint16_t port,
    unsigned int flags, unsigned int pool, MHD_AccessHandlerCallback handler,
    void *cls);

/* Wait for SIGTERM or SIGINT. */
void bench_wait(const sigset_t *set);

/* MHD_OPTION_NOTIFY_COMPLETED: free the request. */
void bench_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
    enum MHD_RequestTerminationCode toe);

#endif
