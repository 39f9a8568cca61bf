// SPDX-License-Identifier: MIT
//
// Hand-made edge cases for the tokenizer peer tests.  Each case is raw
// bytes (a Buffer), because some are deliberately invalid UTF-8: the
// reference encoders see Buffer.toString('utf8'), which replaces invalid
// sequences with U+FFFD by the WHATWG rule (maximal subpart), the same as
// Python's bytes.decode('utf-8', errors='replace').  feedd gets the raw
// bytes and must produce the same ids.
const s = (x) => Buffer.from(x, 'utf8');
const b = (...parts) => Buffer.concat(parts.map((p) => (typeof p === 'string' ? s(p) : Buffer.from(p))));

export const edgeCases = [
  s(''),
  s('a'),
  s('Hello, world!'),
  s("I'm sure they'll say it's John's and we've re-read it; DON'T, WE'LL, IT'S"),
  s("quote ' alone, 'tis, o'clock, ''double'' 'S 'Ll"),
  s('日本語のテキストと中文文本，还有한국어 텍스트。'),
  s('emoji 👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇩🇪 keycap 1️⃣ ✨✨✨'),
  s('combining: e\u0301 a\u0300 n\u0303 \u0915\u094d\u0937 Z\u0351\u0324\u0346A\u0308\u0323L\u0312G\u030cO'),
  s('precomposed vs decomposed: \u00e9 e\u0301 \u1e9b\u0323 \u212b A\u030a'),
  s('spaces   between    words     and\ttabs\t\t\tand\u00a0nbsp\u2003em'),
  s('\n\n\n\nnewlines\r\n\r\nCRLF\r\r\n  \n  \n\t\n'),
  s('trailing spaces   '),
  s('   leading spaces'),
  s('trailing newline\n'),
  s('trailing mixed \n \n  '),
  s(' '),
  s('\n'),
  s('                                                                '),
  s('digits 0 12 123 1234 12345 123456789012 3.14159 1,000,000 ١٢٣٤ ۱۲۳ १२३४५ ⅫⅧ ²³'),
  s('code: for (int i = 0; i < n; ++i) { x[i] += y[i] >> 2; } // done\n\treturn -1;'),
  s('URLs https://example.com/a/b?c=d&e=f#g and paths /usr/share/doc/linux-doc-6.1/'),
  s('punctuation!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) ``` ~~~'),
  s('Mixed CASE camelCase PascalCase snake_case SCREAMING_CASE ÀÉÎÕÜ àéîõü ǅungla ǈ'),
  s('Ελληνικά Русский текст עברית العربية हिन्दी ไทย'),
  s('<|endoftext|> special <|fim_prefix|>x<|fim_middle|>y<|fim_suffix|> <|endofprompt|>'),
  s('<|begin_of_text|>Hi<|eot_id|><|start_header_id|>user<|end_header_id|>'),
  s('\u200b\u200d\ufeff zero width and BOM \ufeffin text'),
  s('\ud7ff\ue000\uffff\ufffd replacement char itself \ufffd\ufffd'),
  s('astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚 𠀀𠀁 \u{10ffff}'),
  b('NUL', [0], 'bytes', [0, 0], 'inside', [0]),
  b([0, 0, 0, 0]),
  b('bad ', [0xff], ' byte'),
  b('truncated ', [0xe2, 0x82], ' euro'),
  b('overlong ', [0xc0, 0xaf], ' slash ', [0xe0, 0x80, 0xaf]),
  b('surrogate ', [0xed, 0xa0, 0x80], ' end'),
  b('too big ', [0xf4, 0x90, 0x80, 0x80], ' ', [0xf5, 0x80]),
  b('lone continuation ', [0x80, 0x80, 0xbf], ' x'),
  b('cut 4-byte ', [0xf0, 0x9f, 0x98], ' and at end ', [0xf0, 0x9f]),
  b([0xe2, 0x28, 0xa1], 'x', [0xc3], 'y', [0xe1, 0x80], [0xc3, 0xa9]),
  b('mixed valid é then ', [0xfe, 0xfe], 'é', [0xef, 0xbb]),
  s('x'.repeat(3000)),
  s('ab'.repeat(1500) + ' ' + '1234567890'.repeat(200)),
  s(' '.repeat(5000) + 'end'),
  s('\n'.repeat(2000) + ' \n'.repeat(500)),
  s('α'.repeat(4000)),
  s('aaaa aaaa\taaaa\naaaa'),
  s('odd spaces: a\u0085b \u0085 c\u001cd\u001fe \u180ef\u2028g\u2029h\u000bi\u000cj \u3000k\u202f \u205fl'),
  s('NEL runs \u0085\u0085\u0085x \u0085\n\u0085 \u0085'),
];
