/* SPDX-License-Identifier: MIT */
/*
 * Streaming writer of NumPy .npy files (format 1.0) holding little-endian
 * int32 arrays: the header is written first with the final shape, then rows
 * are appended as they arrive.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Creates path and writes the header for an int32 array of the given shape. Returns a FILE or NULL (errno set). */
FILE *npy_create_i32(const char *path, const size_t *shape, size_t ndim);
