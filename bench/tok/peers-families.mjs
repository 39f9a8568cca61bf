// SPDX-License-Identifier: MIT
//
// HF tokenizers (npm, native, one thread) on the multilingual corpus for
// bench-tok-families: encodes fam/multi.txt document by document with
// fam/NAME.json, special tokens as text (feedd's default; see
// tests/tok/reffamilies.mjs), and prints "peer NAME MB/s IDS".
// Usage: node peers-families.mjs DATA_DIR NAME...
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const dir = path.resolve(process.argv[2]);
const require = createRequire(path.join(dir, 'package.json'));
const { Tokenizer } = require('tokenizers');
const buf = fs.readFileSync(path.join(dir, 'fam/multi.txt'));
const sizes = fs.readFileSync(path.join(dir, 'fam/multi.idx'), 'utf8').split('\n').filter((x) => x !== '').map(Number);
const docs = [];
for (let off = 0, i = 0; i < sizes.length; off += sizes[i], i++) docs.push(buf.subarray(off, off + sizes[i]).toString('utf8'));

function textVariant(j) {
  const c = JSON.parse(JSON.stringify(j));
  c.added_tokens = [];
  j.added_tokens.forEach((a, i) => {
    if (!a.special) c.added_tokens.push(a);
    else if (!Object.prototype.hasOwnProperty.call(j.model.vocab, a.content))
      c.added_tokens.push({ ...a, content: `\u0001feedd-never-${i}\u0001` });
  });
  return c;
}

for (const name of process.argv.slice(3)) {
  const j = JSON.parse(fs.readFileSync(path.join(dir, 'fam', `${name}.json`), 'utf8'));
  const t = Tokenizer.fromString(JSON.stringify(textVariant(j)));
  for (let i = 0; i < 20; i++) await t.encode(docs[i] || 'x', null, { addSpecialTokens: false });
  const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
  let ids = 0;
  for (const d of docs) if (d.length) ids += (await t.encode(d, null, { addSpecialTokens: false })).getIds().length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9, c = process.cpuUsage(c0);
  const cpu = (c.user + c.system) / 1e6;
  // Wall MB/s, then CPU MB/s (the process's CPU time: robust to a loaded VM).
  console.log(`peer ${name} ${(buf.length / 1e6 / s).toFixed(3)} ${ids} ${(buf.length / 1e6 / cpu).toFixed(3)}`);
}
