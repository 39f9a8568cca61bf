// SPDX-License-Identifier: MIT
// Writes Parquet files with DuckDB (npm @duckdb/node-api, fetched by
// scripts/fetch-parquet-data.sh) from JSONL files whose lines are
// {"id": N, "text": "...", "null": bool}: the rows in line order, the text
// null where "null" is true, and FineWeb-like other columns (a url, a score,
// a struct and a list, which feedd must skip).
//   node mkparquet.mjs PQDATA OUTDIR SPEC... -- INPUT.jsonl...
// SPEC is compression:dict|plain:v1|v2:rowgroup; each INPUT a.jsonl gives
// OUTDIR/<compression>-<dict>-<version>-<rowgroup>/a.parquet.
import { mkdirSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';

const [pqdata, outdir, ...rest] = process.argv.slice(2);
const sep = rest.indexOf('--');
const specs = rest.slice(0, sep), inputs = rest.slice(sep + 1);
const { DuckDBInstance } = await import(join(resolve(pqdata), 'node_modules/@duckdb/node-api/lib/index.js'));
const inst = await DuckDBInstance.create(':memory:');
const con = await inst.connect();
await con.run('SET threads = 1');
const q = (s) => "'" + s.replaceAll("'", "''") + "'";
for (const input of inputs) {
	const table = 't_' + basename(input).replace(/[^a-z0-9]/gi, '_');
	await con.run(`CREATE TABLE ${table} AS SELECT id, CASE WHEN "null" THEN NULL ELSE text END AS text,
		'https://example.com/' || id AS url, (id % 50) / 10.0 AS score, {'n': id, 'lang': 'en'} AS meta, [id, id + 1] AS tags
		FROM read_json(${q(input)}, format = 'newline_delimited', maximum_object_size = 16777216,
		columns = {id: 'BIGINT', text: 'VARCHAR', "null": 'BOOLEAN'})`);
	for (const spec of specs) {
		const [codec, dict, version, rg] = spec.split(':');
		const dir = join(outdir, `${codec}-${dict}-${version}-${rg}`);
		mkdirSync(dir, { recursive: true });
		const out = join(dir, basename(input).replace(/\.jsonl$/, '.parquet'));
		const opts = [`FORMAT parquet`, `COMPRESSION ${codec}`, `ROW_GROUP_SIZE ${rg}`,
			`PARQUET_VERSION ${version.toUpperCase()}`];
		if (dict === 'plain')
			opts.push('DICTIONARY_SIZE_LIMIT 1');
		await con.run(`COPY (SELECT * FROM ${table} ORDER BY id) TO ${q(out)} (${opts.join(', ')})`);
	}
}
