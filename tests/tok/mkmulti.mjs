// SPDX-License-Identifier: MIT
//
// Builds DIR/multi.txt, the multilingual corpus (>= 5 MB) the Unigram and
// WordPiece peer tests compare on, deterministically from:
//   - linux-doc-6.1's translations (zh_CN, zh_TW, ja_JP, ko_KR, it_IT reST
//     sources), extracted by scripts/fetch-tok-data.sh into DIR/deb/multi,
//   - UI strings of every locale node's ICU has (language, region, script,
//     currency names, months, weekdays, numbers, dates, relative times),
//   - every Extended_Pictographic code point, ZWJ and skin-tone sequences,
//     flags, keycaps,
//   - NFD and NFKD forms and a full-width form of some translated text,
//     combining marks on every Latin letter (what the Precompiled charsmap
//     and BERT's strip_accents work on),
//   - odd white space (NBSP, thin and ideographic spaces, tabs, CRLF, U+0085,
//     U+2028, zero-width characters, long runs) and control characters,
//   - literal special tokens ([CLS], <pad>, </s>, <unk>, [MASK]...),
//   - then English kernel docs until the corpus reaches 5.2 MB.
// Usage: node mkmulti.mjs DIR
import fs from 'node:fs';
import path from 'node:path';

const dir = path.resolve(process.argv[2]);
const root = path.join(dir, 'deb/multi');
const parts = [];
let size = 0;
const add = (s) => { parts.push(s); size += Buffer.byteLength(s); };

function walk(d, out) {
  for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const p = path.join(d, e.name);
    if (e.isDirectory()) walk(p, out);
    else if (e.name.endsWith('.txt')) out.push(p);
  }
  return out;
}
const docs = walk(path.join(root, 'usr/share/doc'), []);
const translated = docs.filter((p) => p.includes('/translations/'));
const english = docs.filter((p) => !p.includes('/translations/'));
const read = (p) => fs.readFileSync(p, 'utf8');

for (const p of translated) add(read(p));

// UI strings.
const langs = ('aa af agq ak am ar as asa ast az bas be bem bez bg bm bn bo br brx bs ca ccp ce ceb cgg chr ckb cs cy ' +
  'da dav de dje doi dsb dua dyo dz ebu ee el en eo es et eu ewo fa ff fi fil fo fr fur fy ga gd gl gsw gu guz gv ha ' +
  'haw he hi hr hsb hu hy ia id ig ii is it ja jgo jmc jv ka kab kam kde kea kgp khq ki kk kkj kl kln km kn ko kok ks ' +
  'ksb ksf ksh ku kw ky lag lb lg lkt ln lo lrc lt lu luo luy lv mai mas mer mfe mg mgh mgo mi mk ml mn mni mr ms mt ' +
  'mua my mzn naq nb nd nds ne nl nmg nn nnh no nus nyn om or os pa pcm pl ps pt qu rm rn ro rof ru rw rwk sa sah saq ' +
  'sat sbp sc sd se seh ses sg shi si sk sl smn sn so sq sr su sv sw ta te teo tg th ti tk to tr tt twq tzm ug uk ur ' +
  'uz vai vi vun wae wo xh xog yav yi yo yrl yue zgh zh zu').split(' ');
const locales = Intl.DateTimeFormat.supportedLocalesOf(langs);
const codes = ['en', 'fr', 'de', 'zh', 'ja', 'ko', 'ar', 'hi', 'ru', 'es', 'pt', 'sw', 'am', 'th', 'he'];
for (const loc of locales) {
  const lines = [];
  const dn = (type, list) => {
    try {
      const d = new Intl.DisplayNames([loc], { type });
      lines.push(list.map((c) => d.of(c)).join(', '));
    } catch { /* this locale lacks it */ }
  };
  dn('language', codes);
  dn('region', ['US', 'FR', 'CN', 'JP', 'KR', 'IN', 'BR', 'EG', 'RU', 'ZA']);
  dn('script', ['Latn', 'Cyrl', 'Arab', 'Hans', 'Hant', 'Deva', 'Hang', 'Thai', 'Ethi']);
  dn('currency', ['USD', 'EUR', 'JPY', 'CNY', 'INR']);
  for (let m = 0; m < 12; m++)
    lines.push(new Intl.DateTimeFormat(loc, { month: 'long', timeZone: 'UTC' }).format(Date.UTC(2024, m, 1)));
  for (let d = 0; d < 7; d++)
    lines.push(new Intl.DateTimeFormat(loc, { weekday: 'long', timeZone: 'UTC' }).format(Date.UTC(2024, 0, 1 + d)));
  lines.push(new Intl.DateTimeFormat(loc, { dateStyle: 'full', timeStyle: 'long', timeZone: 'UTC' }).format(Date.UTC(2024, 1, 29, 13, 5, 9)));
  lines.push(new Intl.NumberFormat(loc).format(1234567.891), new Intl.NumberFormat(loc, { style: 'currency', currency: 'EUR' }).format(-42.5));
  lines.push(new Intl.RelativeTimeFormat(loc, { numeric: 'auto' }).format(-1, 'day'), new Intl.RelativeTimeFormat(loc).format(3, 'week'));
  lines.push(new Intl.ListFormat(loc).format(['A', 'B', 'C']));
  add(`${loc}: ${lines.join('\n')}\n\n`);
}

// Emoji and symbols.
const pict = [];
for (let cp = 0; cp <= 0x10ffff; cp++) {
  if (cp >= 0xd800 && cp <= 0xdfff) continue;
  const s = String.fromCodePoint(cp);
  if (/\p{Extended_Pictographic}/u.test(s)) pict.push(s);
}
for (let i = 0; i < pict.length; i += 16) add(pict.slice(i, i + 16).join('') + ' ' + pict.slice(i, i + 16).join(' ') + '\n');
const tones = ['\u{1f3fb}', '\u{1f3fc}', '\u{1f3fd}', '\u{1f3fe}', '\u{1f3ff}'];
for (const b of ['\u{1f44d}', '\u{1f44b}', '\u{1f9d1}', '\u{1f469}', '\u{270c}'])
  add(tones.map((t) => b + t).join(' ') + ' ' + b + '\ufe0f ' + b + '\u200d\u{1f4bb}\n');
add('\u{1f468}\u200d\u{1f469}\u200d\u{1f467}\u200d\u{1f466} \u{1f3f3}\ufe0f\u200d\u{1f308} \u{1f1fa}\u{1f1f8}\u{1f1ef}\u{1f1f5}\u{1f1e9}\u{1f1ea} 1\ufe0f\u20e3 #\ufe0f\u20e3 \u00a9\ufe0f \u2122\u200d\u2122\n');

// Normalisation forms, full width, combining marks.
const sample = translated.filter((p, i) => i % 7 === 0).map(read).join('\n').slice(0, 120000);
add(sample.normalize('NFD'));
add(sample.normalize('NFKD'));
add(Array.from(sample.slice(0, 30000), (c) => {
  const x = c.codePointAt(0);
  return x > 0x20 && x < 0x7f ? String.fromCodePoint(x + 0xfee0) : c;
}).join(''));
const marks = ['\u0300', '\u0301', '\u0302', '\u0303', '\u0308', '\u030a', '\u0327', '\u0328', '\u0336', '\u20dd', '\u0345'];
for (let c = 0x41; c <= 0x7a; c++)
  for (const m of marks) add(String.fromCharCode(c) + m + String.fromCodePoint(0xfee0 + c) + m + ' ');
add('\n\u00b5\u0301 \u00bd\u0302 \u2460\u0301 \u2122\u0301 \ufb01\u0301 \u3300 \u33ff \u2163x \u00aa\u0308 \u0130stanbul \u03a3\u039f\u03a3 \u1e9e \ufb00 \u01c4\n');

// White space and control characters.
const ws = [' ', '  ', '   ', '\t', '\n', '\r\n', '\r', '\u00a0', '\u2009', '\u200a', '\u3000', '\u0085', '\u2028', '\u2029',
  '\u200b', '\u200c', '\u200d', '\ufeff', '\u180e', '\u1680', '\u202f', '\u205f', '\u000b', '\u000c', '\u0000', '\u0007',
  '\u001f', '\u007f', '\u00ad', '\ufffd', '\u2060', '\ue000', '\u{f0000}'];
for (let i = 0; i < 600; i++) add(`word${i % 13}${ws[i % ws.length]}${['x', 'Ünïcödé', '中文', 'ａｂｃ', '٣٤'][i % 5]}${ws[(i * 7) % ws.length].repeat(1 + (i % 4))}`);
add('\n' + ' '.repeat(300) + 'x' + '\t'.repeat(50) + '\n'.repeat(20) + '\u3000'.repeat(40) + 'end\n');

// Literal special tokens.
for (const sp of ['[CLS]', '[SEP]', '[MASK]', '[UNK]', '[PAD]', '<pad>', '<unk>', '</s>', '<s>', '<|endoftext|>'])
  add(`x${sp}y ${sp} ${sp}${sp} Text${sp}\n`);
add(`${'a'.repeat(150)} ${'supercalifragilistic'.repeat(6)} ${'é'.repeat(120)}\n`);

for (const p of english) {
  if (size >= 5.2e6) break;
  add(read(p));
}

fs.writeFileSync(path.join(dir, 'multi.txt.tmp'), parts.join(''));
fs.renameSync(path.join(dir, 'multi.txt.tmp'), path.join(dir, 'multi.txt'));
console.log(`multi.txt: ${size} bytes`);
