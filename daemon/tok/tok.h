/* SPDX-License-Identifier: MIT */
/*
 * tok: the tokenizer core of feedd.
 *
 * A struct tok is loaded once (tiktoken rank file with a named preset, or an
 * HF tokenizer.json, docs/tokenizers.md) and is then immutable: any
 * number of threads may encode with it at the same time.  Everything mutable
 * during encoding (PCRE2 match data, scratch buffers, a cache of piece ->
 * ids) lives in a struct tok_state, one per thread, created for one tok.
 *
 * Encoding follows tiktoken and HF tokenizers exactly:
 *   1. optionally split out special tokens (TOK_ENCODE_SPECIALS; HF added
 *      tokens that are not "special" are always split out, as HF does),
 *   2. replace invalid UTF-8 by U+FFFD with the maximal-subpart rule
 *      (Python's bytes.decode("utf-8", errors="replace")); NUL is text,
 *   3. the tokenizer.json's normalizers (NFC, Replace, ...),
 *   4. pre-tokenize with the model's own regex(es) (PCRE2, UTF+UCP, JIT,
 *      classes patched to Unicode 16) or pre-tokenizers,
 *   5. BPE-merge each piece by rank (lowest first, leftmost on ties).
 * Memory use does not grow with the document on the byte-level fast path:
 * text that needs rewriting (steps 2, 3) is converted in windows cut at
 * pre-token boundaries (the general pipeline normalizes the text between
 * two added tokens whole), and
 * tok_encode_stream() hands ids to a sink in batches; a BPE pre-token over
 * 256 KiB is merged 256 KiB at a time (docs/tokenizers.md, "Very long
 * words").  The text itself is the caller's: tok_part_*() below takes a
 * huge text in parts instead.
 *
 * Errors are negative errno values.  Loaders also return an error text
 * naming the file and the line or JSON field (free() it).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tok;
struct tok_state;

/* A growable array of token ids; zero-initialise, free with tok_ids_done(). */
struct tok_ids {
	int32_t *ids;
	size_t n;
	size_t cap;
};

/* One special token for tok_load_rankfile_custom(). */
struct tok_special {
	const char *name;
	int32_t id;
};

enum {
	/* Recognise special tokens written in the text (like tiktoken's
	 * encode(text, allowed_special="all")).  Without it they are
	 * ordinary text (encode_ordinary), which is what training text
	 * wants. */
	TOK_ENCODE_SPECIALS = 1u << 0,
	/* The caller vouches that the text is valid UTF-8 (its reader
	 * checked it already), so it is not checked again.  Text that is
	 * not valid UTF-8 under this flag is a caller bug. */
	TOK_ENCODE_UTF8_VALID = 1u << 1,
};

/*
 * Loads a tiktoken rank file ("base64 rank" per line) with a named preset
 * that supplies the pre-tokenizer pattern and the special tokens: "gpt2",
 * "r50k_base", "p50k_base", "cl100k_base", "o200k_base", "llama3".
 * Returns 0 and a new tok in *ret, or a negative errno and, if ret_error is
 * not NULL, a malloc'd message such as "cl100k_base.tiktoken:1234: bad base64".
 */
int tok_load_rankfile(const char *path, const char *preset, struct tok **ret, char **ret_error);

/* As tok_load_rankfile() with an explicit PCRE2 pattern and special tokens
 * (copied; n_specials may be 0). */
int tok_load_rankfile_custom(const char *path, const char *pattern,
			     const struct tok_special *specials, size_t n_specials,
			     struct tok **ret, char **ret_error);

/*
 * Loads an HF tokenizer.json: BPE models (byte-level, or over UTF-8 strings
 * with byte_fallback, unk_token/fuse_unk, affixes), Unigram and WordPiece
 * models (tok-model.h), the normalizers and
 * pre-tokenizers listed in docs/configuration.md ("Tokenizers"), added
 * tokens with normalized/lstrip/rstrip/single_word.  Plain byte-level BPE
 * behind regex splits takes the fast path; anything else the general
 * pipeline (tok-pipe.h), with HF tokenizers' semantics.  Any other setting
 * that would change the ids is refused with -EOPNOTSUPP and a message
 * naming the field.  Added tokens get the ids HF tokenizers gives them (the
 * id of the same string in model.vocab, else the next free id), not
 * added_tokens[].id.
 */
int tok_load_hf(const char *path, struct tok **ret, char **ret_error);

/* Frees a tok (NULL is fine); returns NULL.  No tok_state may outlive it. */
struct tok *tok_free(struct tok *t);

/* True when the bytes of the ids always spell the text again (the
 * byte-level fast path); false for the general pipeline (Unigram,
 * WordPiece, SentencePiece-style BPE), which may normalise the text, mark
 * word starts and give an unknown token. */
bool tok_is_lossless(const struct tok *t);

/* Largest token id + 1, specials included. */
size_t tok_vocab_size(const struct tok *t);

/* Id of a special (or added) token by its text, e.g. "<|endoftext|>";
 * -ENOENT if there is none. */
int tok_special_id(const struct tok *t, const char *name);

/* Bytes of token id (a pointer into t, valid while t lives); -ENOENT for an
 * unused id. */
int tok_token_bytes(const struct tok *t, int32_t id, const uint8_t **ret, size_t *ret_len);

/* Creates the per-thread state for encoding with t.  Returns 0 or -ENOMEM. */
int tok_state_new(const struct tok *t, struct tok_state **ret);

/* Frees a state (NULL is fine); returns NULL. */
struct tok_state *tok_state_free(struct tok_state *st);

/*
 * Called by tok_encode_stream() with consecutive batches of ids.  A negative
 * return value stops encoding and is returned by tok_encode_stream().
 */
typedef int (*tok_sink_fn)(const int32_t *ids, size_t n, void *userdata);

/*
 * Encodes text[0..len) with t, using st (which must have been created for t
 * and is used by one thread at a time).  flags: TOK_ENCODE_*.  ids go to
 * sink in batches.  On success returns 0 and, if ret_n_replaced is not NULL,
 * the number of U+FFFD substituted for invalid UTF-8.  Errors: -ENOMEM,
 * -EINVAL (st from another tok), -EIO (PCRE2 failure such as its match
 * limit), or the sink's own negative value.
 */
int tok_encode_stream(const struct tok *t, struct tok_state *st, const char *text, size_t len,
		      unsigned flags, tok_sink_fn sink, void *userdata, size_t *ret_n_replaced);

/* As tok_encode_stream(), appending the ids to out (not cleared first). */
int tok_encode(const struct tok *t, struct tok_state *st, const char *text, size_t len,
	       unsigned flags, struct tok_ids *out, size_t *ret_n_replaced);

/*
 * One text encoded as it arrives in parts (tok-part.c): a huge document
 * read and decoded a segment at a time. The ids handed to the sink over all
 * the tok_part_feed() calls are those tok_encode_stream() gives the whole
 * text (with the same flags; TOK_ENCODE_UTF8_VALID is ignored), and the
 * memory held stays about one part plus one pre-token of at most
 * TOK_PIECE_MAX (256 KiB) whatever the text's length. The parts may be cut
 * anywhere, even inside a character. Only the byte-level fast path
 * (tok_part_supported()); the general pipeline normalizes whole texts.
 */
struct tok_part;
bool tok_part_supported(const struct tok *t);
/* Returns 0, -ENOMEM, or -EOPNOTSUPP for a tok that cannot be streamed. */
int tok_part_new(const struct tok *t, unsigned flags, struct tok_part **ret);
struct tok_part *tok_part_free(struct tok_part *p);
/*
 * Hands text[0..len) to p and the ids it decides to sink (st: as for
 * tok_encode_stream()). final: this is the text's end (the part may be
 * empty); p takes no more text after it. Returns 0 or a negative errno.
 */
int tok_part_feed(struct tok_part *p, struct tok_state *st, const char *text, size_t len, bool final,
		  tok_sink_fn sink, void *userdata);
/* U+FFFD substituted for invalid UTF-8 so far. */
size_t tok_part_replaced(const struct tok_part *p);
/* Bytes of buffers p holds (for tests of the bound). */
size_t tok_part_held(const struct tok_part *p);

/* Makes room for at least n ids in v (beyond those it holds). Returns 0 or -ENOMEM. */
int tok_ids_reserve(struct tok_ids *v, size_t n);

/* Frees the ids of a struct tok_ids and zeroes it. */
void tok_ids_done(struct tok_ids *v);

/*
 * Replaces invalid UTF-8 in src[0..n) by U+FFFD (EF BF BD) as Python's
 * bytes.decode("utf-8", errors="replace") does.  Writes at most 3*n bytes
 * to dst; returns the bytes written and the count of replacements in
 * *ret_n_replaced.  Exposed for tests and for callers that log text.
 */
size_t tok_utf8_replace(const uint8_t *src, size_t n, uint8_t *dst, size_t *ret_n_replaced);

/* Length of the longest valid UTF-8 prefix of s[0..n). */
size_t tok_utf8_valid_prefix(const uint8_t *s, size_t n);
