// SPDX-License-Identifier: MIT
//
// Peer tokenizers for bench-tok: encodes corpus.txt document by document
// (corpus.idx holds byte sizes) and prints "peer NAME MB/s IDS" per peer.
// Usage: node peers.mjs DATA_DIR ENCODING
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const [dir, enc] = [path.resolve(process.argv[2]), process.argv[3]];
const require = createRequire(path.join(dir, 'package.json'));
const buf = fs.readFileSync(path.join(dir, 'corpus.txt'));
const sizes = fs.readFileSync(path.join(dir, 'corpus.idx'), 'utf8').split('\n').filter(Boolean).map(Number);
const docs = [];
for (let off = 0, i = 0; i < sizes.length; off += sizes[i], i++) docs.push(buf.subarray(off, off + sizes[i]).toString('utf8'));
const mb = buf.length / 1e6;

async function run(name, encodeDoc) {
  for (let i = 0; i < 50; i++) await encodeDoc(docs[i]); // warm up
  const t0 = process.hrtime.bigint();
  let ids = 0;
  for (const d of docs) ids += await encodeDoc(d);
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`peer ${name} ${(mb / s).toFixed(2)} ${ids}`);
}

const { get_encoding, Tiktoken } = require('tiktoken');
let tk;
if (enc === 'llama3') {
  const LLAMA3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  tk = new Tiktoken(fs.readFileSync(path.join(dir, 'ranks/llama3.tiktoken'), 'utf8'), {}, LLAMA3);
} else tk = get_encoding(enc === 'r50k_base' ? 'gpt2' : enc);
await run('tiktoken(npm-wasm)', (d) => tk.encode_ordinary(d).length);
tk.free();

const gtMod = { gpt2: 'r50k_base', r50k_base: 'r50k_base', p50k_base: 'p50k_base', cl100k_base: 'cl100k_base', o200k_base: 'o200k_base' }[enc];
if (gtMod) {
  const gt = require(`gpt-tokenizer/cjs/encoding/${gtMod}`);
  await run('gpt-tokenizer', (d) => gt.encode(d, { disallowedSpecial: new Set() }).length);
}

const hfName = { gpt2: 'gpt2', r50k_base: 'gpt2', cl100k_base: 'cl100k', llama3: 'llama3' }[enc];
if (hfName) {
  const { Tokenizer } = require('tokenizers');
  const t = Tokenizer.fromFile(path.join(dir, 'hf', `${hfName}.json`));
  await run('hf-tokenizers(1-thread)', async (d) => (await t.encode(d, null, { addSpecialTokens: false })).getIds().length);
}
