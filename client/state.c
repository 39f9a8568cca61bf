/* SPDX-License-Identifier: MIT */
/* Elastic states (docs/sample-order.md, section 17): merging every rank's into one that any world resumes from. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/libfeed-internal.h"
#include "proto/macro.h"
#include "proto/vstate.h"

FEED_EXPORT int feed_merge_states(const char *const *states, size_t n, char *buf, size_t cap, char *err,
				  size_t errlen)
{
	char dummy[1];
	if (!err || errlen == 0) {
		err = dummy;
		errlen = sizeof(dummy);
	}
	*err = 0;
	if (!states || n == 0 || n > VSTATE_MAX_VRANKS) {
		snprintf(err, errlen, "give the states of every rank of one world (1 to %d)", VSTATE_MAX_VRANKS);
		return -EINVAL;
	}
	struct vstate *parsed = calloc(n, sizeof(*parsed)), merged = { 0 };
	if (!parsed)
		return -ENOMEM;
	int r = 0;
	for (size_t i = 0; i < n && r == 0; i++) {
		r = vstate_parse(states[i], &parsed[i]);
		if (r == -EINVAL)
			snprintf(err, errlen, "state %zu is not an elastic state (fv1-...) or is damaged (bad check digits)", i);
	}
	if (r == 0)
		r = vstate_merge(parsed, n, &merged, err, errlen);
	char *text = NULL;
	if (r == 0) {
		r = vstate_format(&merged, &text);
		if (r >= 0 && (size_t)r >= cap) {
			snprintf(err, errlen, "the merged state takes %d characters, the buffer holds %zu", r, cap ? cap - 1 : 0);
			r = -ENOBUFS;
		} else if (r >= 0) {
			memcpy(buf, text, (size_t)r + 1);
		}
	}
	free(text);
	vstate_clear(&merged);
	for (size_t i = 0; i < n; i++)
		vstate_clear(&parsed[i]);
	free(parsed);
	return r;
}
