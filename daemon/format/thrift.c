/* SPDX-License-Identifier: MIT */
/*
 * Thrift compact protocol reader (thrift.h). The encoding, from Apache
 * Thrift's compact protocol specification:
 *   field header  one byte: (id delta << 4) | type, or (0 << 4) | type
 *                 followed by the id as a zigzag varint i16; 0 is STOP
 *   bool field    the value is the type (1 true, 2 false)
 *   i8            one byte; i16/i32/i64 zigzag ULEB128 varints
 *   double        8 bytes little-endian
 *   binary        varint length, then the bytes
 *   list/set      one byte (size << 4) | element type, size 15 meaning the
 *                 size follows as a varint; bool elements are one byte each
 *   map           varint size, then (key type << 4) | value type if size > 0
 */
#include <errno.h>
#include <string.h>

#include "daemon/format/thrift.h"

void thrift_init(struct thrift *t, const uint8_t *p, size_t n, uint64_t file_offset)
{
	*t = (struct thrift){ .p = p, .end = p + n, .base = p, .base_off = file_offset };
}

int thrift_fail(struct thrift *t, const char *why)
{
	if (!t->error) {
		t->error = why;
		t->error_at = thrift_offset(t);
	}
	t->p = t->end; /* nothing more is read */
	return -EBADMSG;
}

static int varint(struct thrift *t, uint64_t *ret)
{
	uint64_t v = 0;
	for (unsigned shift = 0; shift < 64; shift += 7) {
		if (t->p >= t->end)
			return thrift_fail(t, "Thrift varint runs past the end of its bytes");
		uint8_t b = *t->p++;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*ret = v;
			return 0;
		}
	}
	return thrift_fail(t, "Thrift varint longer than 10 bytes");
}

static int zigzag(struct thrift *t, int64_t *ret)
{
	uint64_t v;
	int r = varint(t, &v);
	if (r < 0)
		return r;
	*ret = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
	return 0;
}

int thrift_field(struct thrift *t, int16_t *last, uint8_t *type, int16_t *id)
{
	if (t->error)
		return -EBADMSG;
	if (t->p >= t->end)
		return thrift_fail(t, "Thrift struct runs past the end of its bytes (no STOP)");
	uint8_t b = *t->p++;
	if (b == 0)
		return 0;
	uint8_t ty = b & 0x0f, delta = b >> 4;
	if (ty > THRIFT_STRUCT)
		return thrift_fail(t, "unknown Thrift field type");
	int64_t fid;
	if (delta) {
		fid = *last + delta;
	} else {
		int r = zigzag(t, &fid);
		if (r < 0)
			return r;
	}
	if (fid <= 0 || fid > INT16_MAX)
		return thrift_fail(t, "Thrift field id out of range");
	*last = (int16_t)fid;
	*type = ty;
	*id = (int16_t)fid;
	return 1;
}

int thrift_bool(struct thrift *t, uint8_t type, bool *ret)
{
	if (type != THRIFT_TRUE && type != THRIFT_FALSE)
		return thrift_fail(t, "Thrift field is not a bool");
	*ret = type == THRIFT_TRUE;
	return 0;
}

int thrift_i64(struct thrift *t, uint8_t type, int64_t *ret)
{
	if (t->error)
		return -EBADMSG;
	if (type == THRIFT_I8) {
		if (t->p >= t->end)
			return thrift_fail(t, "Thrift i8 runs past the end of its bytes");
		*ret = (int8_t)*t->p++;
		return 0;
	}
	if (type != THRIFT_I16 && type != THRIFT_I32 && type != THRIFT_I64)
		return thrift_fail(t, "Thrift field is not an integer");
	return zigzag(t, ret);
}

int thrift_i32(struct thrift *t, uint8_t type, int32_t *ret)
{
	int64_t v;
	if (type == THRIFT_I64)
		return thrift_fail(t, "Thrift field is an i64 where an i32 belongs");
	int r = thrift_i64(t, type, &v);
	if (r < 0)
		return r;
	if (v < INT32_MIN || v > INT32_MAX)
		return thrift_fail(t, "Thrift i32 out of range");
	*ret = (int32_t)v;
	return 0;
}

int thrift_binary(struct thrift *t, uint8_t type, const uint8_t **ret, size_t *ret_n)
{
	if (t->error)
		return -EBADMSG;
	if (type != THRIFT_BINARY)
		return thrift_fail(t, "Thrift field is not a binary");
	uint64_t n;
	int r = varint(t, &n);
	if (r < 0)
		return r;
	if (n > (uint64_t)(t->end - t->p))
		return thrift_fail(t, "Thrift binary longer than the bytes left");
	*ret = t->p;
	*ret_n = (size_t)n;
	t->p += n;
	return 0;
}

int thrift_list(struct thrift *t, uint8_t type, uint8_t *ret_elem, uint32_t *ret_n)
{
	if (t->error)
		return -EBADMSG;
	if (type != THRIFT_LIST && type != THRIFT_SET)
		return thrift_fail(t, "Thrift field is not a list");
	if (t->p >= t->end)
		return thrift_fail(t, "Thrift list header runs past the end of its bytes");
	uint8_t b = *t->p++;
	uint64_t n = b >> 4;
	if (n == 15) {
		int r = varint(t, &n);
		if (r < 0)
			return r;
	}
	uint8_t elem = b & 0x0f;
	if (elem > THRIFT_STRUCT || elem == THRIFT_STOP)
		return thrift_fail(t, "unknown Thrift list element type");
	/* Every element takes at least a byte. */
	if (n > (uint64_t)(t->end - t->p))
		return thrift_fail(t, "Thrift list claims more elements than it has bytes");
	*ret_elem = elem;
	*ret_n = (uint32_t)n;
	return 0;
}

int thrift_struct_begin(struct thrift *t, uint8_t type)
{
	if (t->error)
		return -EBADMSG;
	if (type != THRIFT_STRUCT)
		return thrift_fail(t, "Thrift field is not a struct");
	if (t->depth >= THRIFT_MAX_DEPTH)
		return thrift_fail(t, "Thrift structs nested too deep");
	t->depth++;
	return 0;
}

void thrift_struct_end(struct thrift *t)
{
	if (t->depth)
		t->depth--;
}

static int skip(struct thrift *t, uint8_t type, bool elem)
{
	if (t->error)
		return -EBADMSG;
	uint64_t v;
	int64_t s;
	switch (type) {
	case THRIFT_TRUE:
	case THRIFT_FALSE:
		/* A bool field's value is its type; a bool list element is a byte. */
		if (elem) {
			if (t->p >= t->end)
				return thrift_fail(t, "Thrift bool runs past the end of its bytes");
			t->p++;
		}
		return 0;
	case THRIFT_I8:
		return thrift_i64(t, type, &s);
	case THRIFT_I16:
	case THRIFT_I32:
	case THRIFT_I64:
		return varint(t, &v);
	case THRIFT_DOUBLE:
		if (t->end - t->p < 8)
			return thrift_fail(t, "Thrift double runs past the end of its bytes");
		t->p += 8;
		return 0;
	case THRIFT_BINARY: {
		const uint8_t *p;
		size_t n;
		return thrift_binary(t, type, &p, &n);
	}
	case THRIFT_LIST:
	case THRIFT_SET: {
		uint8_t et;
		uint32_t n;
		int r = thrift_list(t, type, &et, &n);
		if (r < 0)
			return r;
		if (t->depth >= THRIFT_MAX_DEPTH)
			return thrift_fail(t, "Thrift values nested too deep");
		t->depth++;
		for (uint32_t i = 0; i < n && r == 0; i++)
			r = skip(t, et, true);
		t->depth--;
		return r;
	}
	case THRIFT_MAP: {
		int r = varint(t, &v);
		if (r < 0)
			return r;
		if (v == 0)
			return 0;
		if (t->p >= t->end)
			return thrift_fail(t, "Thrift map header runs past the end of its bytes");
		uint8_t kv = *t->p++;
		if (v > (uint64_t)(t->end - t->p) || (kv >> 4) > THRIFT_STRUCT || (kv & 15) > THRIFT_STRUCT ||
		    (kv >> 4) == 0 || (kv & 15) == 0)
			return thrift_fail(t, "Thrift map header is malformed");
		if (t->depth >= THRIFT_MAX_DEPTH)
			return thrift_fail(t, "Thrift values nested too deep");
		t->depth++;
		for (uint64_t i = 0; i < v && r == 0; i++) {
			r = skip(t, kv >> 4, true);
			if (r == 0)
				r = skip(t, kv & 15, true);
		}
		t->depth--;
		return r;
	}
	case THRIFT_STRUCT: {
		int r = thrift_struct_begin(t, type);
		if (r < 0)
			return r;
		int16_t last = 0, id;
		uint8_t ft;
		while ((r = thrift_field(t, &last, &ft, &id)) > 0)
			if ((r = skip(t, ft, false)) < 0)
				break;
		thrift_struct_end(t);
		return r < 0 ? r : 0;
	}
	default:
		return thrift_fail(t, "unknown Thrift type");
	}
}

int thrift_skip(struct thrift *t, uint8_t type)
{
	return skip(t, type, false);
}
