/* SPDX-License-Identifier: MIT */
/* libfeed: the static descriptions of its codes (feed_strerror). */
#include <errno.h>

#include "client/libfeed-internal.h"

FEED_EXPORT const char *feed_strerror(int code)
{
	switch (code) {
	case 0:
		return "success";
	case -ENOENT:
		return "not found (no such feed, or no daemon socket)";
	case -ECONNREFUSED:
		return "feedd is not running (connection refused)";
	case -ECONNRESET:
		return "feedd closed the connection";
	case -ETIMEDOUT:
		return "timed out";
	case -ESHUTDOWN:
		return "feedd is stopping";
	case -ENOBUFS:
		return "every ring slot is held";
	case -EPROTO:
		return "protocol error";
	case -ENOTCONN:
		return "not attached";
	case -EINVAL:
		return "invalid argument";
	case -EALREADY:
		return "already attached";
	case -ESTALE:
		return "a shard changed on disk while being served";
	case -ENODATA:
		return "no data";
	case -EPROTONOSUPPORT:
		return "protocol version not supported";
	case -ENODEV:
		return "no GPU staging for that device (see feed_client_error)";
	case -EACCES:
		return "permission denied (the socket's mode, or feedd's allow_users / allow_groups)";
	case -EPERM:
		return "not permitted (operator commands need root, feedd's user or admin_users)";
	case -EUSERS:
		return "feedd's connection limit is reached";
	case -EDQUOT:
		return "feedd's ring memory limit is reached";
	case -EINTR:
		return "interrupted by a signal while reconnecting (call again to go on)";
	default:
		return code < 0 ? "error (see feed_client_error)" : "not an error code";
	}
}
