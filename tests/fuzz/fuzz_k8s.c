/*
 * Fuzz target of the REST backend's parsers. The input goes, whole, to
 * the kubeconfig parser (current context, then a context named "dev"),
 * and line by line, as a watch stream, to the watch event parser and, as
 * an Accept header, to the API server's content negotiation. Any input
 * must give either a result that frees whole or an error with a one-line
 * message; never a crash or a leak.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"
#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Not in the header: exported by kubeconfig.c and rest.c for this. */
int k8s_kubeconfig_parse_mem(struct k8s_cluster *out, const char *name,
    const char *text, size_t len, const char *context, char **cause);
int k8s_rest_watch_parse_line(const char *line, size_t len,
    struct k8s_event *out, struct k8s_status *st);
int k8s_apiserver_negotiate(const char *accept, int *kind_out,
    int *v1beta1_out);

static void
kubeconfig(const char *text, size_t size, const char *context)
{
	struct k8s_cluster c;
	char *cause = NULL;

	memset(&c, 0, sizeof(c));
	if (k8s_kubeconfig_parse_mem(&c, "/fuzz/config", text, size, context,
	    &cause) == 0) {
		if (c.server == NULL || c.namespace == NULL || cause != NULL)
			abort();
		if (strncmp(c.server, "https://", 8) != 0 &&
		    strncmp(c.server, "http://", 7) != 0)
			abort();
		if (c.insecure && (c.ca_file != NULL || c.ca_data != NULL))
			abort();
		k8s_cluster_release(&c);
	} else {
		if (cause == NULL || strchr(cause, '\n') != NULL)
			abort();
		free(cause);
	}
}

static void
watch_line(const char *line, size_t len)
{
	struct k8s_event ev;
	struct k8s_status st;
	int r;

	memset(&st, 0, sizeof(st));
	memset(&ev, 0, sizeof(ev));
	r = k8s_rest_watch_parse_line(line, len, &ev, &st);
	if (r == 1) {
		if (!json_is_object(ev.object) || ev.type < K8S_ADDED ||
		    ev.type >= K8S_ERROR || ev.rv < 0)
			abort();
		json_decref(ev.object);
	} else if (r < 0) {
		if (st.err != r || st.message == NULL)
			abort();
		k8s_status_release(&st);
	} else if (r != 0)
		abort();
}

/* An Accept header: a known form (0 to 3, see apiserver.c) or -1. */
static void
accept_line(const char *line, size_t len)
{
	char *h = xstrndup(line, len);
	int kind = -1, beta = -1;

	if (k8s_apiserver_negotiate(h, &kind, &beta) == 0) {
		if (kind < 0 || kind > 3 || (beta != 0 && beta != 1))
			abort();
	} else if (kind != -1 || beta != -1) {
		abort();
	}
	free(h);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *text = (const char *)data, *nl;
	size_t off = 0;

	util_json_init();
	log_setup(LOG_ERROR, 0);
	kubeconfig(text, size, NULL);
	kubeconfig(text, size, "dev");

	while (off < size) {
		nl = memchr(text + off, '\n', size - off);
		if (nl == NULL) {
			watch_line(text + off, size - off);
			accept_line(text + off, size - off);
			break;
		}
		watch_line(text + off, (size_t)(nl - (text + off)));
		accept_line(text + off, (size_t)(nl - (text + off)));
		off = (size_t)(nl - text) + 1;
	}
	return 0;
}
