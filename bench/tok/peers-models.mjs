// SPDX-License-Identifier: MIT
//
// HF tokenizers (npm 0.23.2, one encode at a time, RAYON_NUM_THREADS=1) on
// the Unigram and WordPiece tokenizer.json files of tests/tok/mkmodels.mjs,
// for bench-models: multi.txt cut into documents as bench-models.c cuts it
// (at the first LF after every DOC_BYTES bytes), specials recognised.
// Prints "peer NAME MB/s IDS", MB per CPU second.
// Usage: node peers-models.mjs DATA_DIR NAME DOC_BYTES
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const [dir, name, docBytes] = [path.resolve(process.argv[2]), process.argv[3], Number(process.argv[4])];
const require = createRequire(path.join(dir, 'package.json'));
const buf = fs.readFileSync(path.join(dir, 'multi.txt'));
const docs = [];
for (let off = 0; off < buf.length;) {
  let end = Math.min(off + docBytes, buf.length);
  while (end < buf.length && buf[end - 1] !== 0x0a) end++;
  docs.push(buf.subarray(off, end).toString('utf8'));
  off = end;
}
const { Tokenizer } = require('tokenizers');
const t = Tokenizer.fromFile(path.join(dir, 'hf', `${name}.json`));
const enc = async (d) => (await t.encode(d, null, { addSpecialTokens: false })).getIds().length;
for (let i = 0; i < 20; i++) await enc(docs[i]); // warm up
// CPU time of the whole process (every thread: node's and the binding's),
// so other load on the machine does not count; it over-counts HF if
// anything, never feedd's advantage.
const c0 = process.cpuUsage();
let ids = 0;
for (const d of docs) ids += await enc(d);
const c = process.cpuUsage(c0);
const s = (c.user + c.system) / 1e6;
console.log(`peer hf-tokenizers(1-thread) ${(buf.length / 1e6 / s).toFixed(2)} ${ids}`);
