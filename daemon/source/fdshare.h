/* SPDX-License-Identifier: MIT */
/*
 * Shared file descriptors of local sources (fdshare.c): one per file
 * identity per daemon, reference-counted.
 */
#pragma once

#include <stddef.h>

#include "daemon/source/source.h"

/*
 * Takes fd, just opened on a file whose identity is id. Returns the fd to
 * read it through: fd itself, or (fd then closed) the one already open on
 * the same identity. Each call pairs with one fdshare_drop().
 */
int fdshare_take(int fd, const struct source_id *id);
/*
 * The descriptor already open on identity id, with one more reference (paired
 * with fdshare_drop()); -ENOENT when none is: lets the change watch lease a
 * file a source holds open without opening it again.
 */
int fdshare_ref(const struct source_id *id);
/* Lets go of a descriptor fdshare_take() returned; the last user closes it. */
void fdshare_drop(int fd, const struct source_id *id);
/* How many files the table holds open now. */
size_t fdshare_count(void);
