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

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench_http.h"

static const char accepted_body[] = "{\"accepted\":true}\n";

static enum MHD_Result
handle(void *cls, struct MHD_Connection *conn, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **con_cls)
{
	const struct bench_secret *s = cls;
	const struct bench_request *req;
	enum MHD_Result r;

	(void)url;
	(void)version;
	if (!bench_signed_post(conn, s, method, upload_data,
	    upload_data_size, con_cls, &req, &r))
		return r;
	return BENCH_REPLY(conn, MHD_HTTP_ACCEPTED, accepted_body);
}

int
main(int argc, char **argv)
{
	struct MHD_Daemon *d = NULL;
	struct bench_secret secret = { NULL, 0 };
	sigset_t set;
	long ncpu;
	unsigned long port;
	int ret = 1;

	if (argc != 3 || bench_parse_number(argv[1], 65535, &port) != 0 ||
	    port == 0) {
		fprintf(stderr, "usage: ceiling PORT SECRET_FILE\n");
		return 2;
	}
	if (bench_secret_load(&secret, "ceiling", argv[2]) != 0 ||
	    bench_signals("ceiling", &set) != 0)
		goto out;
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (ncpu < 1)
		ncpu = 1;
	d = bench_listen("ceiling", (uint16_t)port, MHD_USE_EPOLL, (unsigned int)ncpu,
	    handle, &secret);
	if (d == NULL)
		goto out;
	bench_wait(&set);
	ret = 0;
out:
	if (d != NULL)
		MHD_stop_daemon(d);
	bench_secret_release(&secret);
	return ret;
}
