/* What the libcurl clients (Kubernetes, GitHub, GitLab) share. */
#include "config.h"

#include <curl/curl.h>

#include "util/util.h"

/*
 * A transfer that failed on the way (name resolution, connection, TLS
 * handshake, send/receive, timeout) and may succeed when tried again;
 * whether it is safe to repeat is the caller's call.
 */
int
curl_transient(int code)
{
	switch ((CURLcode)code) {
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_RESOLVE_PROXY:
	case CURLE_COULDNT_CONNECT:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
		return 1;
	default:
		return 0;
	}
}

/* Why a transfer failed, redacted, to a new string (see util.h). */
char *
curl_why(const char *errbuf, int code)
{
	return redact_xstrdup(errbuf[0] != '\0' ? errbuf :
	    curl_easy_strerror((CURLcode)code));
}
