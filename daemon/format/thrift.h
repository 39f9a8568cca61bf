/* SPDX-License-Identifier: MIT */
/*
 * A reader of Thrift's compact protocol, the encoding of Parquet's footer and
 * page headers, over an untrusted byte range. Every read checks the bytes
 * left; nesting is limited to THRIFT_MAX_DEPTH; a list may not claim more
 * elements than it has bytes left. The first failure is kept (what, and the
 * absolute offset it happened at) and every later call fails the same way,
 * so a parser can check once per struct.
 *
 * A struct is read field by field:
 *
 *   int16_t last = 0; uint8_t type; int16_t id;
 *   while (thrift_field(t, &last, &type, &id) > 0)
 *           switch (id) { case 1: thrift_i32(t, type, &x); break; default: thrift_skip(t, type); }
 *
 * and unknown fields are skipped, as Thrift's evolution rules require.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define THRIFT_MAX_DEPTH 32

enum thrift_type {
	THRIFT_STOP = 0,
	THRIFT_TRUE = 1,
	THRIFT_FALSE = 2,
	THRIFT_I8 = 3,
	THRIFT_I16 = 4,
	THRIFT_I32 = 5,
	THRIFT_I64 = 6,
	THRIFT_DOUBLE = 7,
	THRIFT_BINARY = 8,
	THRIFT_LIST = 9,
	THRIFT_SET = 10,
	THRIFT_MAP = 11,
	THRIFT_STRUCT = 12,
};

struct thrift {
	const uint8_t *p, *end;
	const uint8_t *base;  /* p - base + base_off is the file offset of p */
	uint64_t base_off;
	unsigned depth;
	const char *error;    /* the first failure, static text; NULL while all is well */
	uint64_t error_at;    /* its file offset */
};

void thrift_init(struct thrift *t, const uint8_t *p, size_t n, uint64_t file_offset);

/* The file offset of the next byte. */
static inline uint64_t thrift_offset(const struct thrift *t)
{
	return t->base_off + (uint64_t)(t->p - t->base);
}

/* Records a failure at the current offset (the first one wins). Returns -EBADMSG. */
int thrift_fail(struct thrift *t, const char *why);

/*
 * The next field header of the struct being read: 1 with *type and *id set,
 * 0 at the struct's end (STOP), or -EBADMSG. *last is the previous field id
 * (0 at the start), as the compact protocol's deltas need.
 */
int thrift_field(struct thrift *t, int16_t *last, uint8_t *type, int16_t *id);

/* Values of a field (or list element) of type `type`; a type other than asked is an error. */
int thrift_bool(struct thrift *t, uint8_t type, bool *ret);
int thrift_i32(struct thrift *t, uint8_t type, int32_t *ret);
int thrift_i64(struct thrift *t, uint8_t type, int64_t *ret);
/* A binary/string: *ret points into the input, *ret_n bytes. */
int thrift_binary(struct thrift *t, uint8_t type, const uint8_t **ret, size_t *ret_n);
/* A list header: its element type and count (checked against the bytes left). */
int thrift_list(struct thrift *t, uint8_t type, uint8_t *ret_elem, uint32_t *ret_n);
/* Enters / leaves a nested struct (depth-limited). */
int thrift_struct_begin(struct thrift *t, uint8_t type);
void thrift_struct_end(struct thrift *t);
/* Skips a value of any type, nested ones included. */
int thrift_skip(struct thrift *t, uint8_t type);
