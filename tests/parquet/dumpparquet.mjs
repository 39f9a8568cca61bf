// SPDX-License-Identifier: MIT
// Prints a Parquet file's text column with DuckDB, the reference reader: one
// JSON string per row, `null` for a null (as `feedctl parquet-info --rows`).
//   node dumpparquet.mjs PQDATA FILE [COLUMN]
import { join, resolve } from 'node:path';

const [pqdata, file, column = 'text'] = process.argv.slice(2);
const { DuckDBInstance } = await import(join(resolve(pqdata), 'node_modules/@duckdb/node-api/lib/index.js'));
const inst = await DuckDBInstance.create(':memory:');
const con = await inst.connect();
await con.run('SET threads = 1');
const r = await con.runAndReadAll(`SELECT "${column}" FROM read_parquet('${file.replaceAll("'", "''")}')`);
const out = [];
for (const row of r.getRows())
	out.push(row[0] === null ? 'null' : JSON.stringify(row[0]));
process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
