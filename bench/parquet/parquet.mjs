// SPDX-License-Identifier: MIT
// DuckDB's Parquet reader on the same file as bench/pqdecode (bench/parquet/run.py):
// the text column's bytes summed, which makes DuckDB decode every value.
//   node bench/parquet/parquet.mjs PQDATA THREADS REPEAT FILE...
// prints a JSON object: {file: {"seconds": best, "bytes": N, "rows": R}}
import { join, resolve } from 'node:path';

const [pqdata, threads, repeat, ...files] = process.argv.slice(2);
const { DuckDBInstance } = await import(join(resolve(pqdata), 'node_modules/@duckdb/node-api/lib/index.js'));
const inst = await DuckDBInstance.create(':memory:');
const con = await inst.connect();
await con.run(`SET threads = ${Number(threads)}`);
await con.run('SET enable_object_cache = false');
const out = {};
for (const f of files) {
	let best = Infinity, bytes = 0, rows = 0;
	for (let k = 0; k < Number(repeat); k++) {
		const t0 = process.hrtime.bigint();
		const r = await con.runAndReadAll(`SELECT sum(strlen(text))::BIGINT, count(*)::BIGINT FROM read_parquet('${f}')`);
		const t = Number(process.hrtime.bigint() - t0) / 1e9;
		const row = r.getRows()[0];
		bytes = Number(row[0] ?? 0);
		rows = Number(row[1]);
		best = Math.min(best, t);
	}
	out[f] = { seconds: best, bytes, rows };
}
process.stdout.write(JSON.stringify(out) + '\n');
