// SPDX-License-Identifier: MIT
// Writes Parquet files with a second writer, arrow-rs (npm parquet-wasm, with
// apache-arrow for the table; fetched by scripts/fetch-parquet-data.sh), from
// the same JSONL as mkparquet.mjs: {"id": N, "text": "...", "null": bool}.
// arrow-rs writes what DuckDB does not: statistics and page indexes, PLAIN
// values in v2 pages beside DELTA_BYTE_ARRAY, other page sizes.
//   node mkparquet-rs.mjs PQDATA OUTDIR SPEC... -- INPUT.jsonl...
// SPEC is compression:dict|plain:v1|v2:rowgroup; each INPUT a.jsonl gives
// OUTDIR/rs-<compression>-<dict>-<version>-<rowgroup>/a.parquet.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { basename, join, resolve } from 'node:path';

const [pqdata, outdir, ...rest] = process.argv.slice(2);
const sep = rest.indexOf('--');
const specs = rest.slice(0, sep), inputs = rest.slice(sep + 1);
const require = createRequire(join(resolve(pqdata), 'node_modules') + '/');
const pw = require('parquet-wasm/node');
const arrow = require('apache-arrow');
const codecs = { uncompressed: pw.Compression.UNCOMPRESSED, snappy: pw.Compression.SNAPPY,
	zstd: pw.Compression.ZSTD, gzip: pw.Compression.GZIP };
for (const input of inputs) {
	const rows = readFileSync(input, 'utf8').split('\n').filter((l) => l).map((l) => JSON.parse(l));
	const table = arrow.tableFromArrays({
		id: BigInt64Array.from(rows.map((r) => BigInt(r.id))),
		text: arrow.vectorFromArray(rows.map((r) => (r.null ? null : r.text)), new arrow.Utf8()),
	});
	const ipc = arrow.tableToIPC(table, 'stream');
	for (const spec of specs) {
		const [codec, dict, version, rg] = spec.split(':');
		const dir = join(outdir, `rs-${codec}-${dict}-${version}-${rg}`);
		mkdirSync(dir, { recursive: true });
		const props = new pw.WriterPropertiesBuilder().setCompression(codecs[codec])
			.setDictionaryEnabled(dict === 'dict')
			.setWriterVersion(version === 'v2' ? pw.WriterVersion.V2 : pw.WriterVersion.V1)
			.setMaxRowGroupSize(Number(rg)).setDataPageSizeLimit(64 * 1024).build();
		writeFileSync(join(dir, basename(input).replace(/\.jsonl$/, '.parquet')),
			pw.writeParquet(pw.Table.fromIPCStream(ipc), props));
	}
}
