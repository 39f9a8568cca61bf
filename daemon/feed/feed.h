/* SPDX-License-Identifier: MIT */
/*
 * A feed: a named dataset from the config, its shards opened and validated,
 * and the order parameters that define every rank's stream. A feed that
 * fails to load stays listed, in state FAILED with its reason, so the other
 * feeds keep serving and operators see why.
 *
 * One writer per field. What feed_load() sets (the dataset, params,
 * tokenizer, mixture, config copy) is immutable afterwards and shared
 * read-only by the workers. The rest has one writer each:
 *   - state/error/error_code: feed_fail() (and feed_check(), through it);
 *   - counters: the main thread, only through feed_count_batch() and
 *     feed_mark_bad(); anyone on the main thread may read them;
 *   - tok_docs/tok_tokens/utf8_replaced: workers, with relaxed atomic adds
 *     (read them with __atomic_load_n);
 *   - stages: workers, through stage.h.
 * Server policy state about a feed (clients, draining) is the server's
 * (struct served, daemon/server/server-internal.h).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/conf/conf.h"
#include "daemon/format/format.h"
#include "daemon/order/mix.h"
#include "daemon/order/order.h"
#include "daemon/pack/pad.h"
#include "daemon/feed/stage.h"

struct tokenize_pool;

struct tok;

enum feed_kind {
	FEED_MEGATRON, /* stored tokens */
	FEED_TEXT,     /* text tokenized on the way (format jsonl or text) */
};

enum feed_state {
	FEED_READY,
	FEED_FAILED,
};

/*
 * What a feed served and skipped. Written on the main thread only, through
 * feed_count_batch() and feed_mark_bad(); read by status and metrics.
 */
struct feed_counters {
	uint64_t tokens_served;
	uint64_t batches;
	struct pack_counters packed;     /* what the batches published so far held (docs/sample-order.md, section 13.2) */
	uint64_t source_docs[MIX_MAX_SOURCES]; /* a mixture's documents served, per source */
	uint64_t bad_records;    /* distinct records skipped (on_bad_record = skip), whatever the epoch or rank */
	uint64_t **bad_seen;     /* per shard, a bit per document once skipped (allocated on the first) */
	char last_bad[512];      /* the latest one, "file:line: why" */
	/* text: token counts. feed->n_tokens is set once every document was tokenized once. */
	uint64_t **tok_seen;     /* per shard, a bit per document once counted (freed when all are) */
	uint64_t tok_counted_docs, tok_counted;
	bool tok_done;           /* every document counted: n_tokens is known */
};

/* A measured epoch length (daemon/feed/session-epoch.c): per rank, world and epoch. */
#define FEED_EPOCH_LENS 16
struct feed_epoch_len {
	bool used;
	uint32_t rank, world;
	uint64_t state_key; /* virtual ranks: the state asked about (0: not virtual ranks) */
	uint64_t epoch, first_batch, batches, units;
};

struct feed {
	unsigned refs;
	char *name;
	struct conf_feed conf; /* a copy; strings owned by the feed */
	enum feed_state state;
	char error[512];
	int error_code;
	char *io_engine;       /* engine that read the .idx files */
	enum feed_kind kind;

	const struct format *format;     /* how documents are found in the shards (daemon/format/format.h) */
	struct shard **shards;
	struct tok *tok;                 /* the feed's tokenizer, if it names one */
	struct tokenize_pool *huge;      /* text: cursors making huge documents' ids again (tokenize.h) */
	uint64_t tok_generation;         /* tells apart toks that reuse an address, for per-thread states */
	int32_t bos_id, eos_id;          /* -1: none */
	uint32_t n_shards;
	uint32_t *shard_docs;
	struct order_params params;
	uint64_t fingerprint;
	uint64_t data_id;                /* the shards' data identity (integrity.h); cursors carry it */
	struct feed_watch *watch;        /* watching its files (integrity.h), set by the server; else NULL */
	uint32_t *watch_ids, n_watch;
	struct source_watch_prep *watch_prep; /* its files readied for the watch by the loader (feed_watch_prepare) */
	uint32_t n_watch_prep;
	uint32_t vranks;                 /* virtual streams (docs/sample-order.md, section 17); 0: one stream per rank */
	uint64_t fingerprint_plain;      /* with vranks: the fingerprint the feed has without them (section 17.7) */
	int32_t pad_id;                  /* padding token of packing bestfit and pad (docs/sample-order.md, section 15) */
	struct feed **sources;           /* a mixture's sources, each loaded as a feed of its own; NULL for one stream */
	uint32_t n_sources;
	struct mix mix;                  /* which source the k-th document comes from */
	/*
	 * text: n_nonempty = n_docs, n_tokens unknown (0), n_bytes of text; all
	 * four of the shards indexed so far (n_indexed of n_shards: a shard is
	 * indexed when its window first comes up, feed_count_shard), added to
	 * with atomics by whichever thread indexes.
	 */
	uint64_t n_docs, n_nonempty, n_tokens, n_bytes;
	uint32_t n_cached;      /* text shards indexed at load (not deferred: remote ones) whose index came from the cache */
	uint32_t n_indexed;     /* text shards counted (shard_docs[] known); n_shards for stored tokens */
	/*
	 * text with shuffle: the fingerprint section 8's old rule gave a feed
	 * some window of which could exceed shuffle_list_max (it hashed
	 * "feistel8-v1"); cursors made with it resume too (0: none).
	 */
	uint64_t fingerprint_alt;
	/* A shard's indexing failed off the main loop: folded into feed_fail() by feed_scan_poll(). */
	int lazy_code;
	char lazy_err[512];
	/* text: shards' counts kept in cache_dir (feed-counts.c): read at load, written since (main thread) */
	uint32_t counts_loaded, counts_stored;
	struct cache_pin *counts_pin;

	/* tokenizing, updated by workers only (relaxed atomics; time and bytes are in the stages) */
	uint64_t tok_docs, tok_tokens;
	uint64_t utf8_replaced;  /* invalid UTF-8 sequences replaced by U+FFFD */

	struct feed_counters counters; /* main thread, through feed_count_batch() and feed_mark_bad() */
	struct feed_epoch_len epoch_lens[FEED_EPOCH_LENS]; /* main thread, session-epoch.c: a small cache, oldest replaced */
	unsigned epoch_lens_next;

	struct feed_scan *scan;     /* stored tokens: the index validated after load (feed-scan.c); NULL when none */
	struct feed_count_pass *count_pass; /* text: the shards counted after load (feed-counts.c); NULL when none */
	struct feed_windows *windows; /* shuffled windows built ahead and shared by the walks (feed-windows.c) */

	struct feed_stages *stages; /* per-stage counters, bumped by workers (daemon/feed/stage.h) */
	bool stages_borrowed;       /* a mixture's source counts into its mixture's stages */
	uint32_t check_next;        /* checker_add() (main thread): the shard (or source) the next sweep starts at */
};

/*
 * Loads the feed described by cf. Returns 0 with a feed (possibly FAILED, with
 * the reason logged and kept in feed->error); -ENOMEM.
 */
int feed_load(const struct conf_feed *cf, struct source_reader *io, struct feed **ret);
struct feed *feed_ref(struct feed *f);
struct feed *feed_unref(struct feed *f);

/*
 * Counts a skipped bad record once, however often epochs and ranks meet it
 * (main thread); a new one becomes last_bad (`why`, "file:line: reason") and
 * the first ten are logged. Returns 1 when it was new, 0 when known, -ENOMEM.
 */
int feed_mark_bad(struct feed *f, uint64_t doc, const char *why);

/*
 * Whether the bad records skipped so far pass the feed's max_bad_fraction,
 * or cover every document. Returns 0, or -EBADMSG with the reason in msg
 * after failing the feed (feed_fail).
 */
int feed_check_bad(struct feed *f, char *msg, size_t msglen);

/*
 * Counts a published batch (main thread): its tokens, its packing counters,
 * and a mixture's documents per source (src_docs: n_sources entries, or NULL).
 */
void feed_count_batch(struct feed *f, const struct pack_counters *counts, const uint64_t *src_docs);

/*
 * Marks the feed FAILED with code and msg, and logs it; the only way a feed
 * fails. The first failure stays: later calls do nothing.
 */
void feed_fail(struct feed *f, int code, const char *msg);

/*
 * Counts a tokenized text document's tokens once, whatever the epoch or rank
 * that tokenized it (main thread); when every document has been counted, the
 * feed's n_tokens is known (status "tokens"). Returns 0, or -ENOMEM.
 */
int feed_count_tokens(struct feed *f, uint64_t doc, uint64_t tokens);

/* Re-checks that no shard changed on disk. Returns 0 or -ESTALE (the feed is then FAILED). */
int feed_check(struct feed *f);
/* The periodic check (once a second, in slices, off the main loop) is daemon/feed/checker.h. */

/*
 * Stored tokens, index work after load (daemon/feed/feed-scan.c). Shards
 * validated whole at load take at most FEED_SCAN_AT_LOAD index entries in
 * all; feed_scan_start() validates the rest on a thread of its own, and
 * feed_scan_poll() (main thread; feed_check calls it) folds its counts
 * (n_tokens, n_nonempty) in, or fails the feed with its first fault.
 */
#define FEED_SCAN_AT_LOAD (UINT64_C(1) << 22)
int feed_scan_start(struct feed *f);
void feed_scan_poll(struct feed *f);
/*
 * feed_scan_poll() for f and a mixture's sources (main thread, touches no
 * file; the tick calls it for every feed, read or not): 0, or the feed's
 * error code once FAILED (a mixture fails with its source).
 */
int feed_scan_fold(struct feed *f);
/*
 * Text, issue #22: order_params.count of a text feed. Shard `shard`'s
 * document count, indexing it now when it is not known (any thread;
 * blocking). Applies the bad-record policy to a truncated shard. On the
 * main thread (or at load) a failure fails the feed; on a thread marked
 * with feed_off_main_thread() it is kept for feed_scan_poll(). 0 or a
 * negative errno (-EBADMSG, -ESTALE, -ENOMEM); on a thread that set
 * feed_count_never_block(), -EAGAIN for a shard not counted yet (and a
 * counted one is not indexed there).
 */
int feed_count_shard(void *ctx, uint32_t shard, uint32_t *ret);
/*
 * Text: the shards' counts kept in cache_dir (daemon/feed/feed-counts.c).
 * feed_counts_load() (load) takes the counts of the shards unchanged since
 * they were written: returns how many, or -ENOMEM. feed_counts_store()
 * (main thread) writes every count known now, when there are new ones:
 * 0 or a negative errno.
 */
int feed_counts_load(struct feed *f);
int feed_counts_store(struct feed *f);
/*
 * Text: shard i has n documents and `bytes` bytes of text (any thread):
 * stored in shard_docs and added to the totals by the first to find it.
 * Returns whether this call was that first.
 */
bool feed_count_record(struct feed *f, uint32_t i, uint32_t n, uint64_t bytes);
/*
 * Text, issue #22: the background count pass (daemon/feed/feed-counts.c).
 * After load, a thread of the feed's own counts, in epoch 0's order, the
 * shards no window reached yet, one at a time, without indexing them
 * (text_count), at idle CPU and I/O priority, so that the totals (status
 * documents and bytes, and so len) and every window's start are known
 * well before epoch 0 ends, and the counts file is written. A shard it
 * cannot count (unreadable, truncated, Parquet) is left to its window's
 * walk, which fails or skips it by the policy, as before. Off with the
 * feed's count_ahead = false. feed_count_pass_free() stops and joins it
 * (the feed's free); feed_count_pass_stats() (any thread): shards it
 * counted, and whether it is running.
 */
int feed_count_pass_start(struct feed *f);
void feed_count_pass_free(struct feed *f);
uint32_t feed_count_pass_stats(const struct feed *f, bool *ret_running);
/* Text: order_params.hold (a walk enters or leaves a window of the shard: its line index is kept while held). */
void feed_hold_shard(void *ctx, uint32_t shard, bool on);
/* Marks the calling thread as not the main one, for feed_count_shard's failures. */
void feed_off_main_thread(void);
/*
 * Issue #22: while on (the calling thread's setting; the main loop's
 * sessions set it), feed_count_shard() never reads a shard: one whose count
 * or line index is missing is remembered as wanted and -EAGAIN returned,
 * so that the walk asking waits. Returns the previous setting.
 * feed_count_wanted() takes (and forgets) the shards so refused on this
 * thread since its last call (a set: each once, at most FEED_WANTED_MAX,
 * more asked for again by the next walk): up to max of them into ret
 * (NULL with max 0: forgets them), returns how many; the caller has them
 * counted off the thread (feed_count_shard() there) and walks again.
 */
bool feed_count_never_block(bool on);
struct feed_wanted {
	struct feed *feed;
	uint32_t shard;
};
#define FEED_WANTED_MAX 256
size_t feed_count_wanted(struct feed_wanted *ret, size_t max);
/*
 * Text: whether shard i's line index is in memory, for the main loop to
 * read documents' sizes from (format_doc_bytes). When not, the shard is
 * the wanted one (feed_count_wanted) and false is returned.
 */
bool feed_shard_readable(struct feed *f, uint32_t i);
/*
 * Text: counts shards, in epoch 0's window order, until the feed has at
 * least `want` documents or every shard is counted (load: at least one
 * document, V' = min(V, N); attach: at least R). Returns 1 when there are
 * at least `want`, 0 when fewer, or a negative errno (the feed FAILED).
 */
int feed_count_until(struct feed *f, uint64_t want);
/*
 * feed_nonempty_at_least() from what is known now, reading no text shard
 * (main thread): 1, 0, -EAGAIN when the text shards counted so far do not
 * decide it, or the feed's error once FAILED.
 */
int feed_docs_known_at_least(struct feed *f, uint64_t want);
/* Waits for the scan (feedd --check validates everything); 0, or the feed's error code once FAILED. */
int feed_scan_wait(struct feed *f);
bool feed_scan_pending(const struct feed *f);
uint32_t feed_scan_shards_left(const struct feed *f);
/*
 * Text: the shards indexed now (deferred: since load) whose index came from
 * cache_dir, and in *ret_in_memory (may be NULL) those whose line index is
 * in memory now (one feed, not a mixture's sum).
 */
uint64_t feed_text_cached(const struct feed *f, uint64_t *ret_in_memory);
/* Text: shards whose cache copies are open now (in use or idle), copies made and decompression passes (indexes and copies, not the count pass) since load; a mixture's sums. */
void feed_text_copies(const struct feed *f, uint64_t *ret_open, uint64_t *ret_made, uint64_t *ret_decompressions);
void feed_scan_free(struct feed *f);
/*
 * Document doc's token count (stored tokens), its index entries checked
 * first. Any thread. 0, or -EBADMSG with the fault in err.
 */
int feed_doc_tokens(struct feed *f, uint64_t doc, uint64_t *ret, char *err, size_t errlen);
/*
 * Whether the feed has at least `want` non-empty documents (main thread):
 * 1 or 0; looks only as far as that needs while the scan runs. A negative
 * errno when a fault was met (the feed is then FAILED).
 */
int feed_nonempty_at_least(struct feed *f, uint64_t want);

/*
 * Shuffled windows built ahead, shared by every walk of the feed
 * (daemon/feed/feed-windows.c); feed_windows_new() sets params.windows.
 */
struct feed_windows_stats {
	uint64_t bytes;            /* of the windows held now (4 per document) */
	uint64_t builds;           /* windows shuffled so far */
	uint64_t built_on_demand;  /* of them, by the walk that needed it (not ahead) */
	uint64_t ready_ahead;      /* walks that found their next window built ahead */
	uint64_t last_build_ns;    /* how long the latest took */
	uint64_t docs_built;       /* documents of the windows shuffled */
	uint64_t evicted;          /* built ahead, then dropped unused to make room for the next */
	uint64_t not_ready;        /* walks on the main loop that found their window not built (built on the pool meanwhile) */
	unsigned held, ahead, building; /* windows walked now; built ahead, not walked yet; being built */
};
int feed_windows_new(struct feed *f);
void feed_windows_free(struct feed *f);
/*
 * Issue #22: the main loop never builds a window nor waits for one. On a
 * thread that set feed_count_never_block() (the main loop's sessions), a
 * walk whose window is not built yet is told -EAGAIN (order_windows.get)
 * and the window noted as wanted, up to FEED_WINDOW_WANTS per thread.
 * feed_windows_wanted() takes (and forgets) them: how many, at most max.
 * The session hands them to the pool (session-window.c), where
 * feed_window_make() builds each one (or waits while the builder does):
 * 0 with the window READY and pinned in *ret (-ERANGE: no such window, a
 * want of no use: nothing pinned), or a negative errno with a message in
 * err. feed_window_unpin() (main thread) drops the pin once a walk took
 * the window since it was wanted, or when `force`: returns whether it
 * dropped it.
 */
#define FEED_WINDOW_WANTS 64
struct feed_window_want {
	struct feed *feed;
	uint64_t epoch;
	uint32_t w;
	uint64_t k; /* the window's start k_w, as the walk knows it */
	uint64_t gets; /* the feed's window gets when the walk was refused: a later get of it is a walk that took it */
};
struct feed_window_pin {
	void *entry;
	uint64_t gets; /* the want's gets */
};
unsigned feed_windows_wanted(struct feed_window_want *ret, unsigned max);
int feed_window_make(struct feed *f, const struct feed_window_want *want, struct feed_window_pin *ret, char *err,
		     size_t errlen);
bool feed_window_unpin(struct feed *f, const struct feed_window_pin *pin, bool force);
/* Whether the calling thread set feed_count_never_block() (the main loop's walks, issue #22). */
bool feed_count_never_blocks(void);
void feed_windows_stats(const struct feed *f, struct feed_windows_stats *ret);
/* The feed's (and a mixture's sources') windows, and its shards whose index is still being validated. */
void feed_work_ahead(const struct feed *f, struct feed_windows_stats *ret, uint32_t *ret_index_pending);
/* Text shards counted (indexed once, or their count read from cache_dir) and not yet; a mixture's sums. */
void feed_text_shards(const struct feed *f, uint64_t *ret_indexed, uint64_t *ret_pending);
/* The same as the status JSON's feeds[].work_ahead (docs/telemetry.md): a new object, NULL on no memory. */
struct json_t *feed_work_ahead_json(const struct feed *f);

/* The packing mode's name as the configuration spells it: "concat", "bestfit", "pad". */
const char *feed_packing_name(enum conf_packing p);

/*
 * The feed's packing and mixture counters for the status JSON
 * (docs/telemetry.md): a new object, owned by the caller; NULL on no memory.
 */
struct json_t *feed_packing_json(const struct feed *f);
