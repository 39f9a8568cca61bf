// SPDX-License-Identifier: MIT
//
// Precomputes reference token ids with the peers, into DIR/ref/:
//   <preset>.corpus.u32   tiktoken (npm WASM) encode_ordinary of corpus.txt,
//                         little-endian uint32 ids
//   <preset>.edge.json    [{b64, ids, ids_special}] for edge-cases.mjs, where
//                         ids = encode_ordinary, ids_special = encode(text, 'all')
//   hf-<name>.small.u32   HF tokenizers of corpus-small.txt (no added specials)
//   hf-<name>.edge.json   [{b64, ids}] HF tokenizers (added tokens recognised,
//                         as HF always does)
// Presets use tiktoken's own encoders (npm registry) except llama3, which is
// built from the rebuilt rank file with Meta's pattern and specials.
// Usage: node refencode.mjs DIR
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { edgeCases } from './edge-cases.mjs';

const dir = path.resolve(process.argv[2]);
const require = createRequire(path.join(dir, 'package.json'));
const { Tiktoken, get_encoding } = require('tiktoken');
const tk = require('tokenizers');
const refDir = path.join(dir, 'ref');
fs.mkdirSync(refDir, { recursive: true });

const LLAMA3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function llama3() {
  const sp = {};
  const names = ['<|begin_of_text|>', '<|end_of_text|>', '<|reserved_special_token_0|>', '<|reserved_special_token_1|>',
    '<|reserved_special_token_2|>', '<|reserved_special_token_3|>', '<|start_header_id|>', '<|end_header_id|>',
    '<|reserved_special_token_4|>', '<|eot_id|>'];
  names.forEach((n, i) => { sp[n] = 128000 + i; });
  for (let i = 5; i < 251; i++) sp[`<|reserved_special_token_${i}|>`] = 128000 + 5 + i;
  return new Tiktoken(fs.readFileSync(path.join(dir, 'ranks/llama3.tiktoken'), 'utf8'), sp, LLAMA3);
}

function writeU32(file, ids) {
  const buf = Buffer.alloc(ids.length * 4);
  for (let i = 0; i < ids.length; i++) buf.writeUInt32LE(ids[i], i * 4);
  fs.writeFileSync(file + '.tmp', buf);
  fs.renameSync(file + '.tmp', file);
}
function writeJson(file, obj) {
  fs.writeFileSync(file + '.tmp', JSON.stringify(obj));
  fs.renameSync(file + '.tmp', file);
}

const corpus = fs.readFileSync(path.join(dir, 'corpus.txt'), 'utf8');
const small = fs.readFileSync(path.join(dir, 'corpus-small.txt'), 'utf8');

const presets = {
  gpt2: () => get_encoding('gpt2'),
  p50k_base: () => get_encoding('p50k_base'),
  cl100k_base: () => get_encoding('cl100k_base'),
  o200k_base: () => get_encoding('o200k_base'),
  llama3,
};
for (const [name, make] of Object.entries(presets)) {
  const corpusFile = path.join(refDir, `${name}.corpus.u32`);
  const edgeFile = path.join(refDir, `${name}.edge.json`);
  if (fs.existsSync(corpusFile) && fs.existsSync(edgeFile)) continue;
  const enc = make();
  const t0 = Date.now();
  const ids = enc.encode_ordinary(corpus);
  console.log(`tiktoken ${name}: ${ids.length} ids in ${(Date.now() - t0) / 1000}s`);
  writeU32(corpusFile, ids);
  writeJson(edgeFile, edgeCases.map((buf) => {
    const text = buf.toString('utf8');
    return { b64: buf.toString('base64'), ids: Array.from(enc.encode_ordinary(text)), ids_special: Array.from(enc.encode(text, 'all')) };
  }));
  enc.free();
}

for (const name of ['gpt2', 'cl100k', 'llama3', 'qwen-nfc']) {
  const smallFile = path.join(refDir, `hf-${name}.small.u32`);
  const edgeFile = path.join(refDir, `hf-${name}.edge.json`);
  if (fs.existsSync(smallFile) && fs.existsSync(edgeFile)) continue;
  const t = tk.Tokenizer.fromFile(path.join(dir, 'hf', `${name}.json`));
  const t0 = Date.now();
  const enc = await t.encode(small, null, { addSpecialTokens: false });
  console.log(`tokenizers ${name}: ${enc.getIds().length} ids in ${(Date.now() - t0) / 1000}s`);
  writeU32(smallFile, enc.getIds());
  const edge = [];
  for (const buf of edgeCases) {
    const e = await t.encode(buf.toString('utf8'), null, { addSpecialTokens: false });
    edge.push({ b64: buf.toString('base64'), ids: Array.from(e.getIds()) });
  }
  writeJson(edgeFile, edge);
}
