// SPDX-License-Identifier: MIT
//
// Reference token ids for a list of documents, with the npm tiktoken (WASM)
// encoder: node encode_docs.mjs TOKDATA PRESET IN.json OUT.json
// IN.json is a JSON array of strings; OUT.json gets an array of id arrays
// (encode_ordinary: special tokens in the text are plain text).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const [dir, preset, input, output] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(dir), 'package.json'));
const { get_encoding } = require('tiktoken');
const enc = get_encoding(preset);
const texts = JSON.parse(fs.readFileSync(input, 'utf8'));
fs.writeFileSync(output, JSON.stringify(texts.map((t) => Array.from(enc.encode_ordinary(t)))));
enc.free();
