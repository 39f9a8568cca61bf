/* SPDX-License-Identifier: MIT */
/*
 * Tokenizing ahead (FEED_TEXT streams): the documents a text stream will
 * visit are handed to the workers in chunks, ahead of planning, and the
 * stream reads their counts and tokens from finished chunks. Planning never
 * guesses: a count not tokenized yet is -EAGAIN, and the stream it waits for
 * gets a chunk even when the look-ahead target is met (s->starved).
 *
 * Lifetime of a chunk: created by session_text_submit(), done once its
 * completion came back (session_chunk_done), freed by session_text_retire()
 * once no plan in flight or to come reads its tokens, or with the session.
 * Main thread only.
 */
#pragma once

#include <stdint.h>

struct session;
struct session_chunk;
struct session_src;

/* stream_source.doc for text streams (userdata: the session_src): -EAGAIN until tokenized. */
int session_text_doc(void *userdata, uint64_t seq, uint64_t doc, uint64_t *ret_tokens, const int32_t **ret_ids);
/* Stream positions of x known from its position on, counting up to `need`. */
uint64_t session_text_ready(struct session_src *x, uint64_t need);
/* Hands x's next documents to the workers as far as the look-ahead asks. Returns 0 or -ENOMEM. */
int session_text_submit(struct session *s, struct session_src *x);
/* Frees the chunks of x that nothing reads any more. */
void session_text_retire(struct session *s, struct session_src *x);
/* A chunk came back from a worker (main thread, from the producer). */
void session_chunk_done(struct session *s, struct session_chunk *c);
/* Frees a chunk (done or never submitted). Returns NULL. */
struct session_chunk *session_chunk_free(struct session_chunk *c);
