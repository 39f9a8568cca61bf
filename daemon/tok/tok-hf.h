/* SPDX-License-Identifier: MIT */
/*
 * Shared by the tokenizer.json loaders: tok-hf.c (file, model, added
 * tokens, the byte-level fast path) and tok-hf-pipe.c (normalizers and
 * pre-tokenizers of the general pipeline).
 *
 * To support another normalizer, pre-tokenizer or model type, add a parse
 * function to the table in tok-hf-pipe.c (tok_hf_normalizers,
 * tok_hf_pre_tokenizers) or tok-hf.c (tok_hf_models): it gets the JSON
 * object and its path for messages ("normalizer.normalizers[1]", "model")
 * and fills a tok_norm_add()/tok_pre_add() slot, or, for a model: adds the
 * vocabulary (tok_vocab_add() per token, then tok_vocab_finish(); with
 * t->unicode_vocab set, tokens are UTF-8 strings and the 256 single bytes
 * are not required), sets t->model, t->model_scratch, t->model_data and
 * t->model_free, and marks whole_ok (tok_compute_whole_ok() runs the
 * model on each token's own text).  The model is called once per piece
 * that misses the piece caches; t->unk_id, t->byte_fallback and
 * t->fallback_id[] are there for models that want them.  Refuse (with
 * tok_unsupported_at()) every setting not implemented exactly.
 */
#pragma once

#include <jansson.h>

#include "tok-pipe.h"

bool tok_json_is_false(const json_t *v);
bool tok_json_is_empty_str(const json_t *v);

/* -EOPNOTSUPP with "name: field: unsupported value <json>". */
int tok_unsupported(const struct tok *t, char **ret_error, const char *field, const json_t *v);

/* -EOPNOTSUPP naming the first key of obj not in known (NULL-terminated). */
int tok_check_keys(const struct tok *t, const json_t *obj, const char *const *known, const char *where,
		   char **ret_error);

/* As tok_unsupported() with the field given as "%s.%s" of where and key. */
int tok_unsupported_at(const struct tok *t, char **ret_error, const char *where, const char *key, const json_t *v);

typedef int (*tok_hf_parse_fn)(struct tok *t, const json_t *obj, const char *where, char **ret_error);

struct tok_hf_parser {
	const char *type;
	tok_hf_parse_fn parse;
};

/* Fills t->norms from the "normalizer" value (null: none). */
int tok_hf_pipe_normalizer(struct tok *t, const json_t *n, char **ret_error);

/* Fills t->pres from the "pre_tokenizer" value; *ret_byte_level tells
 * whether it ends with ByteLevel (a byte-level vocabulary). */
int tok_hf_pipe_pre_tokenizer(struct tok *t, const json_t *p, bool *ret_byte_level, char **ret_error);
