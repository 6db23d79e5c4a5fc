// host.mjs PORTFILE — one node for the SDK clients a gateway test runs one
// after another (lib.bash starts it; its `client` function asks it). A
// client (agent-*.mjs, conversation.mjs) is loaded as a new module each
// run, with its own environment, so its SDK (openai, @anthropic-ai/sdk,
// LangGraph ...) is loaded once a test rather than once a run: 0.5 s of
// the 0.6 s an agent-guard.mjs run took here, 0.8 s of a LangGraph one,
// and the gateway tests run about 90.
//
// A connection a run. The request: the client's file name (in this
// folder), then NAME=VALUE items (added to the environment of the run),
// each ended by a NUL byte, and one more NUL. The answer, once the run is
// over: its exit status and a newline ("0", or "1" when it threw or left
// a promise rejected unhandled, as `node CLIENT` would exit), what it
// printed with console.log, a NUL, what it printed to stderr
// (console.error, console.warn, the error). Runs go one at a time (they
// share process.env, console and fetch, each put back after a run).
// The port goes to PORTFILE once it listens.
import net from 'node:net';
import { writeFileSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import path from 'node:path';
import { format } from 'node:util';

const dir = path.dirname(fileURLToPath(import.meta.url));
const baseEnv = { ...process.env };
let runs = 0, queue = Promise.resolve(), current = null;

// A rejection nobody handled: `node CLIENT` would exit 1 with it; here it
// fails the run it happened in (or is noted, between runs).
process.on('unhandledRejection', (e) => {
  const text = `unhandled rejection: ${(e && e.stack) || format(e)}\n`;
  if (current) {
    current.rc = 1;
    current.err.push(text);
  } else process.stderr.write(`host.mjs: between runs: ${text}`);
});

async function runOne(script, vars) {
  const run = { rc: 0, out: [], err: [] };
  const saved = { console: { ...console }, fetch: globalThis.fetch };
  console.log = console.info = (...a) => run.out.push(format(...a) + '\n');
  console.error = console.warn = console.debug = console.trace = (...a) => run.err.push(format(...a) + '\n');
  for (const k of Object.keys(process.env)) delete process.env[k];
  Object.assign(process.env, baseEnv, vars);
  current = run;
  try {
    await import(`${pathToFileURL(path.join(dir, script)).href}?run=${++runs}`);
  } catch (e) {
    run.rc = 1;
    run.err.push(`${(e && e.stack) || format(e)}\n`); // a thrown event object too, as node prints it
  }
  // A rejection of the run's last moment surfaces after a turn of the loop.
  await new Promise((resolve) => setImmediate(resolve));
  current = null;
  Object.assign(console, saved.console);
  globalThis.fetch = saved.fetch;
  for (const k of Object.keys(process.env)) delete process.env[k];
  Object.assign(process.env, baseEnv);
  return run;
}

const server = net.createServer((sock) => {
  let data = Buffer.alloc(0);
  sock.on('data', (chunk) => {
    data = Buffer.concat([data, chunk]);
    const end = data.indexOf('\0\0');
    if (end < 0) return;
    const [script, ...items] = data.subarray(0, end).toString().split('\0');
    data = Buffer.alloc(0);
    const vars = {};
    for (const it of items) {
      const eq = it.indexOf('=');
      if (eq > 0) vars[it.slice(0, eq)] = it.slice(eq + 1);
    }
    queue = queue.then(async () => {
      const r = /^[\w.-]+\.mjs$/.test(script || '')
        ? await runOne(script, vars)
        : { rc: 1, out: [], err: [`host.mjs: not a client of this folder: ${script}\n`] };
      sock.end(`${r.rc}\n${r.out.join('')}\0${r.err.join('')}`);
    });
  });
  sock.on('error', () => {});
});
server.listen(0, '127.0.0.1', () => writeFileSync(process.argv[2], `${server.address().port}\n`));
