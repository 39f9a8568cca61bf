/* SPDX-License-Identifier: MIT */
/*
 * feedd.conf (docs/configuration.md): INI, parsed with inih. Every key is
 * checked; an unknown key (or any key under an unknown section), a key given
 * twice, or a bad value fails the whole
 * file with "path:line: ..." so a broken config never half-applies.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "daemon/io/reader.h"
#include "daemon/order/mix.h"

#define CONF_TOKEN_NONE INT64_C(-1)
/* shuffle_list_max's default: 2^21 documents, 12 MiB per window listed (docs/configuration.md) */
#define CONF_SHUFFLE_LIST_MAX (UINT64_C(1) << 21)
#define CONF_FEED_FORMAT "megatron" /* a feed's format when it names none */
#define CONF_FEED_TEXT_KEY "text"   /* jsonl: the member holding the text when text_key names none */

/* How a feed lays documents into rows (docs/sample-order.md, sections 5, 11, 12). */
enum conf_packing {
	CONF_PACKING_CONCAT,
	CONF_PACKING_BESTFIT,
	CONF_PACKING_PAD,
};

/* virtual_ranks when unset: any job of up to 1024 ranks can resize later (docs/sample-order.md, 17.1). */
#define CONF_VIRTUAL_RANKS_DEFAULT 1024

struct conf_feed {
	char *name;
	char *format;        /* "megatron", "jsonl" or "text" */
	char **shards;       /* globs, in config order; relative ones resolved against the config's directory */
	size_t n_shards;
	uint32_t seq_len;
	uint32_t batch_size;
	uint64_t seed;
	bool shuffle;
	uint32_t shuffle_window;
	uint64_t shuffle_list_max; /* M: a shuffled window of more documents is permuted by the bijection */
	int64_t bos, eos;    /* token id or CONF_TOKEN_NONE */
	char *bos_name, *eos_name; /* given as a special token's name instead: resolved with the tokenizer */

	/* text sources (format = jsonl | text) */
	char *text_key;            /* jsonl: the member holding the text */
	char *tokenizer;           /* tiktoken rank file or HF tokenizer.json */
	char *tokenizer_preset;    /* for rank files: gpt2, r50k_base, p50k_base, cl100k_base, o200k_base, llama3 */
	bool encode_special_tokens; /* special tokens written in the text become their ids (default: ordinary text) */
	bool skip_bad_records;     /* on_bad_record = skip (true) | fail */
	double max_bad_fraction;   /* of the feed's documents; more skipped fails the feed */
	uint64_t max_document_bytes;
	bool count_ahead;          /* count the shards no window reached yet on a background thread after load (issue #22) */
	char *cache_dir;           /* [feedd] cache_dir, copied here so a feed carries all it needs */
	uint64_t cache_max_bytes;  /* [feedd] cache_max_bytes, copied likewise (0: no cap) */

	/* packing and mixtures (docs/sample-order.md, sections 11 to 15) */
	enum conf_packing packing;
	uint64_t pack_buffer;      /* bestfit buffer, in positions; 0: 64 * seq_len */
	int64_t pad_id;            /* padding token; CONF_TOKEN_NONE: eos when it is an id, else 0 */
	uint32_t virtual_ranks;    /* elastic streams (docs/sample-order.md, section 17); 0: one stream per rank */
	bool virtual_ranks_set;    /* given in the file; unset, a first world above it is served per rank (17.1) */
	char *sources_text;        /* `sources` as written, its lines joined; parsed into mix after the file */
	struct mix_spec *mix;      /* `sources`: names and weights; NULL for a feed of one stream */
	struct conf_feed *sources; /* mix->n sources, each from its [feed.NAME.SOURCE] section; order keys copied from the feed */
	unsigned line;             /* the section's first key, and the lines of keys checked after parsing (0: absent) */
	unsigned bos_name_line, eos_name_line; /* where bos/eos name a special token */
	unsigned sources_line, order_key_line, source_key_line, pack_buffer_line, pad_id_line;
	const char *order_key, *source_key; /* a key only a feed may have (seq_len, ...), one only a source may have (shards, ...) */
	unsigned seq_len_line, batch_size_line, tokenizer_line;
	char *tokenizer_at;        /* "FILE:LINE" of the tokenizer key, for load errors; NULL: no tokenizer */
};

/* [diagnosis]: the telemetry window and the thresholds of every rule (docs/telemetry.md). */
struct conf_diagnosis {
	unsigned window_s;        /* sliding window of the percentiles and rules */
	unsigned history_s;       /* per-second samples kept per client, for feedctl report */
	unsigned min_batches;     /* fewer batches in the window: no verdict yet */
	double starved_pct;       /* a client waiting more than this share of its time is starved */
	double busy_pct;          /* workers busier than this: the feed is throughput-bound */
	double storage_pct;       /* worker time off-CPU in reads above this: storage-bound */
	double host_pct;          /* workers waiting for a CPU above this share of their runnable time: host-bound */
	double full_pct;          /* ring full more than this share of the time ... */
	double held_pct;          /* ... with the client holding this share of its slots: slow to release */
	double h2d_pct;           /* host-to-device copies above this share of the step: transfer-bound */
	double straggler_pct;     /* a rank whose mean wait or step exceeds its peers' median by this much */
	double straggler_min_ms;  /* ... and by at least this many milliseconds */
	bool stage_counters;      /* time the workers' stages (off only to measure what that costs) */
};

/* Users and groups, resolved to ids when the config is read. */
struct conf_ids {
	uint32_t *uids;
	size_t n_uids;
	uint32_t *gids;
	size_t n_gids;
};

/* watch_changes: read leases where granted, else inotify; inotify only; only the once-a-second check. */
enum conf_watch {
	CONF_WATCH_AUTO,
	CONF_WATCH_INOTIFY,
	CONF_WATCH_OFF,
};

struct conf {
	char *path;
	char *socket;        /* NULL: the default (wire_socket_path) */
	char *cache_dir;     /* text shard indexes and decompressed copies; NULL: none */
	uint64_t cache_max_bytes; /* cap on what cache_dir holds; 0: none (daemon/cache/cache.h) */
	unsigned threads;    /* 0: one per CPU */
	unsigned ring_slots;
	int log_level;
	enum io_engine io_engine;
	unsigned io_depth;
	struct conf_feed *feeds;
	size_t n_feeds;

	/* access and limits (docs/configuration.md, "Access and limits") */
	unsigned socket_mode;          /* permission bits of a socket feedd binds itself */
	int64_t socket_group;          /* gid for that socket, or -1: feedd's own group */
	struct conf_ids allow;         /* peers allowed to connect (empty: anyone the socket admits) */
	struct conf_ids admin;         /* peers allowed to reload and drain, besides root and feedd's uid */
	unsigned max_connections;      /* connections at once, all peers */
	unsigned max_connections_per_uid;
	unsigned admin_connections;    /* slots past the limits kept for root, feedd's user and admins */
	unsigned handshake_timeout_s;  /* a connection that sends no HELLO within this is closed */
	uint64_t client_memory_max;    /* bytes of ring memory per client, 0: no limit */
	uint64_t uid_memory_max;       /* ... per uid */
	uint64_t memory_max;           /* ... for all clients together */
	uint64_t gpu_memory_max;       /* device bytes of client staging per GPU, 0: no limit */
	unsigned stuck_client_s;       /* report a client that consumes nothing this long; 0: never */
	enum conf_watch watch_changes; /* how shards are watched for writes as they happen (docs/reliability.md) */
	char *metrics_listen;          /* the Prometheus endpoint's "host:port" as written; NULL: off */
	struct sockaddr_storage metrics_addr; /* ... parsed: IPv4 or IPv6, port 0 = any free port */
	socklen_t metrics_addrlen;

	struct conf_diagnosis diagnosis; /* [diagnosis] */
	unsigned socket_line;          /* where socket was set (0: not set) */
	unsigned load_timeout_s;       /* a load (start, reload, --check) that touches no new file this long fails */

	/* object storage (docs/storage.md): NULL/0 leaves it to the environment or the default */
	char *s3_endpoint;             /* "http://host:port" of an S3-compatible store */
	char *s3_region;
	bool s3_path_style;            /* endpoint/bucket/key addressing */
	char *s3_credentials_file;     /* an ~/.aws/credentials-style file */
	char *s3_profile;              /* its section */
	unsigned s3_max_requests;      /* range GETs in flight, all feeds together */
	uint64_t s3_memory_max;        /* fetched blocks held in memory */
	uint64_t s3_cache_max_bytes;   /* fetched blocks kept in cache_dir/s3 */
};

/* The [diagnosis] defaults (docs/telemetry.md), an initializer. */
#define CONF_DIAGNOSIS_DEFAULTS                                                                               \
	{ .window_s = 60, .history_s = 600, .min_batches = 3, .starved_pct = 5, .busy_pct = 80,               \
	  .storage_pct = 50, .host_pct = 25, .full_pct = 90, .held_pct = 75, .h2d_pct = 25,                   \
	  .straggler_pct = 50, .straggler_min_ms = 1, .stage_counters = true }

/*
 * Parses the file at path. Returns 0; or a negative errno with a message
 * naming the file and line in err.
 */
int conf_load(const char *path, struct conf **ret, char *err, size_t errlen);
struct conf *conf_free(struct conf *c);
const struct conf_feed *conf_find_feed(const struct conf *c, const char *name);
/*
 * The defaults of a [feed.NAME] section (docs/configuration.md) for every
 * number and flag; the strings are left NULL (CONF_FEED_FORMAT and
 * CONF_FEED_TEXT_KEY are what the parser sets them to).
 */
void conf_feed_defaults(struct conf_feed *f);
/*
 * A deep copy of a loaded feed's config (its sources included; the unparsed
 * sources text is not kept). Returns 0 or -ENOMEM, with dst left empty (free
 * to conf_feed_done or drop). Free with conf_feed_done().
 */
int conf_feed_copy(struct conf_feed *dst, const struct conf_feed *src);
/* Frees what a conf_feed owns and zeroes it; takes a half-built copy. */
void conf_feed_done(struct conf_feed *f);
/* Replaces dst with a copy of src. Returns 0, or -ENOMEM with dst unchanged. */
int conf_ids_copy(struct conf_ids *dst, const struct conf_ids *src);
/* Frees the lists and zeroes ids. */
void conf_ids_done(struct conf_ids *ids);

/* Whether a tokenizer path is an HF tokenizer.json (else a tiktoken rank file). */
bool conf_tokenizer_is_hf(const char *path);
