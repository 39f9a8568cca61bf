// SPDX-License-Identifier: MIT
// The object-storage tests' server: s3rver (npm, a local S3-compatible
// store; it checks no signature) behind a proxy of the tests' own that
//  - recomputes every request's AWS Signature V4 with @smithy/signature-v4
//    (the AWS SDK's signer) over the headers the request says it signed, and
//    answers 403 SignatureDoesNotMatch when feedd's Authorization differs,
//    or when a request is unsigned (--require-signature);
//  - enforces If-Match (s3rver ignores it): 412 when the object's ETag moved;
//  - injects faults into object GETs: latency, 503/429 at a rate, connection
//    resets mid-body, truncated bodies (a shorter Content-Length);
//  - counts requests: GET /__proxy/stats (JSON); POST /__proxy/faults sets
//    the fault rates (JSON body), so one server serves clean and faulty runs.
//   node s3proxy.mjs S3TOOLS DATADIR [--seed N] [--access-key K --secret-key S]
// Prints {"s3rver": PORT, "proxy": PORT} on one line once both listen.
import http from 'node:http';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';

const args = process.argv.slice(2);
const tools = resolve(args[0]), datadir = resolve(args[1]);
const opt = (name, dflt) => { const i = args.indexOf('--' + name); return i >= 0 ? args[i + 1] : dflt; };
const require = createRequire(join(tools, 'package.json'));
const S3rver = require('s3rver');
const { SignatureV4 } = require('@smithy/signature-v4');
const { Sha256 } = require('@aws-crypto/sha256-js');

const creds = { accessKeyId: opt('access-key', 'feeddtest'), secretAccessKey: opt('secret-key', 'feeddtestsecret') };
if (opt('session-token')) creds.sessionToken = opt('session-token');
const region = opt('region', 'us-east-1');
const requireSig = args.includes('--require-signature');
let faults = { p503: 0, p429: 0, preset: 0, ptrunc: 0, latency_ms: 0 };
const stats = { connections: 0, requests: 0, gets: 0, heads: 0, lists: 0, puts: 0, bytes: 0, sig_ok: 0, sig_bad: 0, unsigned: 0,
	injected_503: 0, injected_429: 0, injected_reset: 0, injected_trunc: 0, precondition_failed: 0,
	by_key: {} };

// A deterministic PRNG (mulberry32), so a run's faults repeat.
let seed = Number(opt('seed', '1')) >>> 0;
const rand = () => { seed = (seed + 0x6D2B79F5) >>> 0; let t = seed; t = Math.imul(t ^ (t >>> 15), t | 1);
	t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };

const s3 = new S3rver({ port: 0, address: '127.0.0.1', silent: true, directory: datadir,
	allowMismatchedSignatures: true, configureBuckets: [{ name: 'feedd' }, { name: 'other' }] });
const s3srv = await s3.run();
const s3port = s3srv.port;
const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });

async function checkSignature(req, url) {
	const auth = req.headers['authorization'];
	if (!auth) { stats.unsigned++; return !requireSig; }
	const m = /^AWS4-HMAC-SHA256 Credential=([^/]+)\/(\d{8})\/([^/]+)\/s3\/aws4_request, SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$/.exec(auth);
	if (!m || m[1] !== creds.accessKeyId || m[3] !== region) return false;
	const headers = {};
	for (const h of m[4].split(';')) {
		if (req.headers[h] === undefined) return false;
		headers[h] = String(req.headers[h]).trim();
	}
	const d = headers['x-amz-date'];
	if (!d) return false;
	const date = new Date(`${d.slice(0, 4)}-${d.slice(4, 6)}-${d.slice(6, 8)}T${d.slice(9, 11)}:${d.slice(11, 13)}:${d.slice(13, 15)}Z`);
	const query = {};
	for (const [k, v] of url.searchParams) query[k] = v;
	const signer = new SignatureV4({ credentials: creds, region, service: 's3', sha256: Sha256, uriEscapePath: false,
		applyChecksum: false });
	// What the SDK would send for this request, signed the SDK's way.
	const signed = await signer.sign({ method: req.method, protocol: 'http:', hostname: '127.0.0.1', path: url.pathname,
		query, headers, body: undefined }, { signingDate: date, signableHeaders: new Set(Object.keys(headers)) });
	const ok = signed.headers['authorization'] === auth;
	if (!ok && process.env.S3PROXY_DEBUG)
		console.error('signature mismatch', auth, signed.headers['authorization']);
	return ok;
}

function forward(req, body) {
	return new Promise((res, rej) => {
		const headers = { ...req.headers };
		delete headers['authorization'];
		delete headers['if-match'];
		headers['host'] = `127.0.0.1:${s3port}`;
		const up = http.request({ host: '127.0.0.1', port: s3port, method: req.method, path: req.url, headers, agent },
			(r) => { const chunks = []; r.on('data', (c) => chunks.push(c));
				r.on('end', () => res({ status: r.statusCode, headers: r.headers, body: Buffer.concat(chunks) })); });
		up.on('error', rej);
		up.end(body);
	});
}

const xmlError = (code, msg) => `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${code}</Code><Message>${msg}</Message></Error>`;

const proxy = http.createServer(async (req, res) => {
	const chunks = [];
	for await (const c of req) chunks.push(c);
	const body = Buffer.concat(chunks);
	const url = new URL(req.url, 'http://127.0.0.1');
	if (url.pathname === '/__proxy/stats') { res.end(JSON.stringify(stats)); return; }
	if (url.pathname === '/__proxy/faults') { faults = { ...faults, ...JSON.parse(body.toString() || '{}') };
		res.end(JSON.stringify(faults)); return; }
	stats.requests++;
	const isObjectGet = req.method === 'GET' && url.pathname.split('/').filter(Boolean).length >= 2;
	if (req.method === 'HEAD') stats.heads++;
	else if (req.method === 'PUT') stats.puts++;
	else if (isObjectGet) { stats.gets++; stats.by_key[url.pathname] = (stats.by_key[url.pathname] || 0) + 1; }
	else if (req.method === 'GET') stats.lists++;
	if (req.method !== 'PUT') {
		let ok;
		try { ok = await checkSignature(req, url); } catch (e) { ok = false; console.error(e); }
		if (!ok) { stats.sig_bad++; res.writeHead(403, { 'content-type': 'application/xml' });
			res.end(req.method === 'HEAD' ? undefined : xmlError('SignatureDoesNotMatch', 'The request signature we calculated does not match the signature you provided.'));
			return; }
		if (req.headers['authorization']) stats.sig_ok++;
	}
	if (faults.latency_ms) await new Promise((r) => setTimeout(r, faults.latency_ms));
	if (isObjectGet) {
		const x = rand();
		if (x < faults.p503) { stats.injected_503++; res.writeHead(503, { 'content-type': 'application/xml' });
			res.end(xmlError('SlowDown', 'Please reduce your request rate.')); return; }
		if (x < faults.p503 + faults.p429) { stats.injected_429++; res.writeHead(429); res.end(); return; }
	}
	let up;
	try { up = await forward(req, body); } catch (e) { res.writeHead(502); res.end(String(e)); return; }
	if (req.headers['if-match'] && up.status < 300 && up.headers['etag'] !== req.headers['if-match']) {
		stats.precondition_failed++;
		res.writeHead(412, { 'content-type': 'application/xml' });
		res.end(xmlError('PreconditionFailed', 'At least one of the pre-conditions you specified did not hold'));
		return;
	}
	const headers = { ...up.headers };
	delete headers['transfer-encoding'];
	delete headers['connection'];
	delete headers['keep-alive'];
	if (isObjectGet && up.status < 300 && up.body.length > 1) {
		const x = rand();
		if (x < faults.preset) {
			// The headers and half the body, then the connection is reset.
			stats.injected_reset++;
			res.writeHead(up.status, headers);
			res.write(up.body.subarray(0, up.body.length >> 1), () => res.socket.resetAndDestroy());
			return;
		}
		if (x < faults.preset + faults.ptrunc) {
			// A server that sends less and says so: a short body, consistent headers.
			stats.injected_trunc++;
			const short = up.body.subarray(0, up.body.length >> 1);
			headers['content-length'] = String(short.length);
			res.writeHead(up.status, headers);
			res.end(short);
			return;
		}
	}
	stats.bytes += req.method === 'HEAD' ? 0 : up.body.length;
	res.writeHead(up.status, headers);
	res.end(req.method === 'HEAD' ? undefined : up.body);
});
proxy.keepAliveTimeout = 30000;
proxy.on('connection', () => { stats.connections++; });
proxy.listen(0, '127.0.0.1', () => {
	console.log(JSON.stringify({ s3rver: s3port, proxy: proxy.address().port }));
});
const stop = async () => { proxy.close(); await s3.close(); process.exit(0); };
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
