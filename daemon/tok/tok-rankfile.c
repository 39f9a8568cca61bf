/* SPDX-License-Identifier: MIT */
/*
 * Loader for tiktoken rank files ("base64(token bytes) SP rank" per line;
 * the rank is the token id and its merge priority) and the named presets
 * that give such a file its pre-tokenizer pattern and special tokens.
 *
 * The patterns are the models' own, verbatim (tiktoken's openai_public.py
 * and Meta's llama3 tokenizer.py); tests check them token for token against
 * tiktoken.  Meta's encoder also cuts text into 400,000-character chunks and
 * runs of at most 25,000 whitespace or non-whitespace characters before
 * applying the pattern; tiktoken and HF tokenizers (the reference encoders
 * for Llama 3 here, and what transformers uses) do not, and neither does
 * this loader.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tok-internal.h"

struct tok_preset {
	const char *name;
	const char *pattern;
	const struct tok_special *specials;
	size_t n_specials;
};

#define TOK_PAT_GPT2 \
	"'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s"
#define TOK_PAT_CL100K \
	"'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|" \
	"\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s"
#define TOK_PAT_O200K \
	"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" \
	"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" \
	"\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TOK_PAT_LLAMA3 \
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
	"\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const struct tok_special tok_sp_gpt2[] = {
	{ "<|endoftext|>", 50256 },
};
static const struct tok_special tok_sp_cl100k[] = {
	{ "<|endoftext|>", 100257 },
	{ "<|fim_prefix|>", 100258 },
	{ "<|fim_middle|>", 100259 },
	{ "<|fim_suffix|>", 100260 },
	{ "<|endofprompt|>", 100276 },
};
static const struct tok_special tok_sp_o200k[] = {
	{ "<|endoftext|>", 199999 },
	{ "<|endofprompt|>", 200018 },
};

static const struct tok_preset tok_presets[] = {
	{ "gpt2", TOK_PAT_GPT2, tok_sp_gpt2, TOK_ELEMENTSOF(tok_sp_gpt2) },
	{ "r50k_base", TOK_PAT_GPT2, tok_sp_gpt2, TOK_ELEMENTSOF(tok_sp_gpt2) },
	{ "p50k_base", TOK_PAT_GPT2, tok_sp_gpt2, TOK_ELEMENTSOF(tok_sp_gpt2) },
	{ "cl100k_base", TOK_PAT_CL100K, tok_sp_cl100k, TOK_ELEMENTSOF(tok_sp_cl100k) },
	{ "o200k_base", TOK_PAT_O200K, tok_sp_o200k, TOK_ELEMENTSOF(tok_sp_o200k) },
	{ "llama3", TOK_PAT_LLAMA3, NULL, 0 },  /* specials generated below */
};

static int tok_read_file(const char *path, uint8_t **ret, size_t *ret_len) {
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat stbuf;
	uint8_t *buf;
	size_t n = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &stbuf) < 0 || !S_ISREG(stbuf.st_mode)) {
		int r = S_ISDIR(stbuf.st_mode) ? -EISDIR : -errno;
		close(fd);
		return r ? r : -EINVAL;
	}
	buf = malloc((size_t) stbuf.st_size + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	while (n < (size_t) stbuf.st_size) {
		ssize_t k = read(fd, buf + n, (size_t) stbuf.st_size - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			int r = k < 0 ? -errno : -EIO;
			free(buf);
			close(fd);
			return r;
		}
		n += (size_t) k;
	}
	close(fd);
	buf[n] = 0;
	*ret = buf;
	*ret_len = n;
	return 0;
}

static int tok_b64_val(uint8_t c) {
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

/* Strict base64 with padding; returns decoded length or -1. */
static ssize_t tok_b64_decode(const uint8_t *s, size_t n, uint8_t *out) {
	size_t o = 0;

	if (n == 0 || n % 4 != 0)
		return -1;
	for (size_t i = 0; i < n; i += 4) {
		int v[4];
		int pad = 0;
		for (int k = 0; k < 4; k++) {
			if (s[i + k] == '=' && i + 4 == n && k >= 2) {
				v[k] = 0;
				pad++;
				continue;
			}
			if (pad > 0)
				return -1;
			v[k] = tok_b64_val(s[i + k]);
			if (v[k] < 0)
				return -1;
		}
		uint32_t w = (uint32_t) v[0] << 18 | (uint32_t) v[1] << 12 | (uint32_t) v[2] << 6 | (uint32_t) v[3];
		out[o++] = (uint8_t) (w >> 16);
		if (pad < 2)
			out[o++] = (uint8_t) (w >> 8);
		if (pad < 1)
			out[o++] = (uint8_t) w;
	}
	return (ssize_t) o;
}

static int tok_parse_rankfile(struct tok *t, const uint8_t *buf, size_t len, char **ret_error) {
	_tok_cleanup_free_ uint8_t *dec = NULL;
	size_t dec_cap = 0;
	uint32_t line = 0;
	size_t n_tokens = 0;

	for (size_t pos = 0; pos < len;) {
		const uint8_t *nl = memchr(buf + pos, '\n', len - pos);
		size_t end = nl ? (size_t) (nl - buf) : len;
		const uint8_t *s = buf + pos, *e = buf + end, *sp, *p;
		uint64_t rank = 0;
		ssize_t k;
		int r;

		line++;
		pos = nl ? end + 1 : len;
		if (e > s && e[-1] == '\r')
			e--;
		if (e == s)
			continue;
		sp = memchr(s, ' ', (size_t) (e - s));
		if (!sp || sp == s || sp + 1 == e)
			return tok_errorf(ret_error, -EINVAL, "%s:%u: expected \"base64 rank\"", t->name, line);
		for (p = sp + 1; p < e; p++) {
			if (*p < '0' || *p > '9' || rank > INT32_MAX)
				return tok_errorf(ret_error, -EINVAL, "%s:%u: bad rank \"%.*s\"", t->name, line,
						  (int) (e - sp - 1 > 32 ? 32 : e - sp - 1), (const char *) sp + 1);
			rank = rank * 10 + (uint64_t) (*p - '0');
		}
		if (rank >= INT32_MAX)
			return tok_errorf(ret_error, -EINVAL, "%s:%u: rank %llu too large", t->name, line,
					  (unsigned long long) rank);
		if ((size_t) (sp - s) > dec_cap) {
			dec_cap = (size_t) (sp - s) * 2;
			free(dec);
			dec = malloc(dec_cap);
			if (!dec)
				return -ENOMEM;
		}
		k = tok_b64_decode(s, (size_t) (sp - s), dec);
		if (k <= 0)
			return tok_errorf(ret_error, -EINVAL, "%s:%u: bad base64", t->name, line);
		r = tok_vocab_add(t, (uint32_t) rank, dec, (size_t) k, line);
		if (r < 0)
			return tok_errorf(ret_error, r, "%s:%u: cannot add token: %s", t->name, line, strerror(-r));
		n_tokens++;
	}
	if (n_tokens == 0)
		return tok_errorf(ret_error, -EINVAL, "%s: no tokens", t->name);
	return 0;
}

int tok_load_rankfile_custom(const char *path, const char *pattern,
			     const struct tok_special *specials, size_t n_specials,
			     struct tok **ret, char **ret_error) {
	_tok_cleanup_free_ uint8_t *buf = NULL;
	struct tok *t;
	size_t len = 0;
	int r;

	t = tok_new(path);
	if (!t)
		return -ENOMEM;
	r = tok_read_file(path, &buf, &len);
	if (r < 0) {
		tok_errorf(ret_error, r, "%s: %s", path, strerror(-r));
		goto fail;
	}
	r = tok_parse_rankfile(t, buf, len, ret_error);
	if (r < 0)
		goto fail;
	r = tok_vocab_finish(t, ret_error);
	if (r < 0)
		goto fail;
	r = tok_pairs_from_ranks(t);
	if (r < 0)
		goto fail;
	r = tok_add_regex(t, pattern, false, ret_error);
	if (r < 0)
		goto fail;
	t->split_cl100k = strcmp(pattern, TOK_PAT_CL100K) == 0;
	t->split_digits = 3;
	t->split_end_rule = true;
	for (size_t i = 0; i < n_specials; i++) {
		if (specials[i].id < 0 ||
		    ((uint32_t) specials[i].id < t->n_ids && t->off[specials[i].id + 1] > t->off[specials[i].id])) {
			r = tok_errorf(ret_error, -EINVAL, "%s: special token %s id %d collides with a rank",
				       t->name, specials[i].name, specials[i].id);
			goto fail;
		}
		r = tok_add_special(t, specials[i].name, strlen(specials[i].name), specials[i].id, true);
		if (r < 0)
			goto fail;
	}
	r = tok_finish(t, ret_error);
	if (r < 0)
		goto fail;
	*ret = t;
	return 0;
fail:
	tok_free(t);
	return r;
}

/* Llama 3: <|begin_of_text|> 128000, <|end_of_text|> 128001, reserved 0-3,
 * <|start_header_id|>, <|end_header_id|>, reserved 4, <|eot_id|> 128009,
 * then reserved 5..250 up to 128255 (as in Meta's tokenizer.py). */
static int tok_llama3_specials(struct tok_special **ret, char ***ret_names) {
	static const char *const head[] = {
		"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
		"<|reserved_special_token_1|>", "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
		"<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>",
	};
	struct tok_special *sp = calloc(256, sizeof(*sp));
	char **names = calloc(256, sizeof(*names));

	if (!sp || !names) {
		free(sp);
		free(names);
		return -ENOMEM;
	}
	for (int i = 0; i < 256; i++) {
		if (i < (int) TOK_ELEMENTSOF(head))
			names[i] = strdup(head[i]);
		else if (asprintf(&names[i], "<|reserved_special_token_%d|>", i - 5) < 0)
			names[i] = NULL;
		if (!names[i]) {
			for (int k = 0; k < i; k++)
				free(names[k]);
			free(names);
			free(sp);
			return -ENOMEM;
		}
		sp[i] = (struct tok_special) { names[i], 128000 + i };
	}
	*ret = sp;
	*ret_names = names;
	return 0;
}

int tok_load_rankfile(const char *path, const char *preset, struct tok **ret, char **ret_error) {
	for (size_t i = 0; i < TOK_ELEMENTSOF(tok_presets); i++) {
		const struct tok_preset *p = &tok_presets[i];
		struct tok_special *sp;
		char **names;
		int r;

		if (strcmp(p->name, preset) != 0)
			continue;
		if (p->specials)
			return tok_load_rankfile_custom(path, p->pattern, p->specials, p->n_specials, ret, ret_error);
		r = tok_llama3_specials(&sp, &names);
		if (r < 0)
			return r;
		r = tok_load_rankfile_custom(path, p->pattern, sp, 256, ret, ret_error);
		for (int k = 0; k < 256; k++)
			free(names[k]);
		free(names);
		free(sp);
		return r;
	}
	return tok_errorf(ret_error, -EINVAL,
			  "unknown tokenizer preset \"%s\" (known: gpt2, r50k_base, p50k_base, cl100k_base, "
			  "o200k_base, llama3)", preset);
}
