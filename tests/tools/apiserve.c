/*
 * apiserve: the embedded store of DB_PATH served as a Kubernetes API on
 * LISTEN, for tests. Prints "port=N" once listening and runs until SIGTERM
 * or SIGINT. With CERT, KEY and TOKEN it serves HTTPS and wants the token.
 *
 *	apiserve DB_PATH LISTEN [CERT KEY TOKEN]
 */
#include "config.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"
#include "util/util.h"

int
main(int argc, char **argv)
{
	struct k8s_apiserver_config cfg;
	struct k8s_apiserver *srv = NULL;
	struct k8s_api *api = NULL;
	char *cause = NULL;
	sigset_t set;
	int sig, ret = 1;

	if (argc != 3 && argc != 6) {
		fprintf(stderr, "usage: apiserve DB_PATH LISTEN "
		    "[CERT KEY TOKEN]\n");
		return 2;
	}
	util_json_init();
	log_setup(getenv("APISERVE_DEBUG") != NULL ? LOG_DEBUG : LOG_WARN, 0);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (k8s_embedded_open(&api, argv[1], NULL, &cause) < 0) {
		fprintf(stderr, "apiserve: %s\n", cause);
		goto out;
	}
	memset(&cfg, 0, sizeof(cfg));
	cfg.listen = argv[2];
	if (argc == 6) {
		cfg.tls_cert = argv[3];
		cfg.tls_key = argv[4];
		cfg.token = argv[5];
	}
	if (k8s_apiserver_start(&srv, api, &cfg, &cause) < 0) {
		fprintf(stderr, "apiserve: %s\n", cause);
		goto out;
	}
	printf("port=%d\n", k8s_apiserver_port(srv));
	fflush(stdout);
	if (sigwait(&set, &sig) != 0)
		goto out;
	ret = 0;
out:
	k8s_apiserver_stop(srv);
	if (api != NULL)
		k8s_api_free(api);
	free(cause);
	return ret;
}
