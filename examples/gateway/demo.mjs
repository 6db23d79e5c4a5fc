// demo.mjs — one agent on the real `openai` package, run twice: straight at
// its model provider, then with its base URL pointed at loopguard's gateway.
// Nothing else changes between the two runs.
//
// The provider is a stand-in started here (no key, no network): it speaks
// OpenAI's Chat Completions, and its model keeps asking to charge the same
// invoice while the payment service times out, each time written a little
// differently (keys in another order, 49 or 49.0) — the billing retry loop
// of tests/data/fixtures/. loopguard is started here too: `loopguard serve
// --store memory: --upstream` the stand-in, with the default policy.
//
//   cd examples/gateway && npm ci && node demo.mjs
//
//   --keep         leave loopguard and the stand-in running afterwards, to
//                  look at the run (the console, its trace); Ctrl-C ends both
//   --json         one JSON object instead of the text (scripts, the test)
//   LOOPGUARD_BIN  the loopguard binary [../../build/loopguard, else PATH]
//   STEP_CAP       the agent's own cap on model calls [10]
//
// Tested by tests/gateway/demo.sh (ctest gateway_demo).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:http';
import { fileURLToPath } from 'node:url';

const keep = process.argv.includes('--keep');
const asJson = process.argv.includes('--json');
const unknown = process.argv.slice(2).filter((a) => a !== '--keep' && a !== '--json');
if (unknown.length) {
  console.error(`demo.mjs: unknown argument ${unknown[0]} (usage: node demo.mjs [--keep] [--json])`);
  process.exit(2);
}
let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch (e) {
  if (e.code !== 'ERR_MODULE_NOT_FOUND') throw e;
  console.error("demo.mjs: the openai package is not installed beside it: run 'npm ci' in examples/gateway first");
  process.exit(1);
}
const cap = Number(process.env.STEP_CAP || 10);
if (!Number.isInteger(cap) || cap < 3) {
  console.error(`demo.mjs: STEP_CAP must be a whole number of 3 or more, not "${process.env.STEP_CAP}"`);
  process.exit(2);
}

// ---- the agent: what an application on the `openai` package looks like ----

const tools = [{
  type: 'function',
  function: {
    name: 'charge_card',
    description: "Charge the customer's card for an invoice.",
    parameters: { type: 'object', properties: { invoice: { type: 'string' }, amount: { type: 'number' } }, required: ['invoice', 'amount'] },
  },
}];

async function agent(baseURL) {
  const client = new OpenAI({ baseURL, apiKey: 'sk-demo', maxRetries: 0, timeout: 20000 });
  const messages = [
    { role: 'system', content: 'You are a billing agent.' },
    { role: 'user', content: 'Charge invoice INV-1042: $49.' },
  ];
  let charges = 0, steps = 0, runId = null;
  while (steps < cap) {
    steps++;
    const { data, response } = await client.chat.completions.create({ model: 'demo-model', messages, tools }).withResponse();
    runId ??= response.headers.get('x-loopguard-run'); // set by the gateway only
    const msg = data.choices[0].message;
    const calls = msg.tool_calls || [];
    messages.push({ role: 'assistant', content: msg.content ?? null, ...(calls.length && { tool_calls: calls }) });
    if (!calls.length) return { charges, steps, ended: 'final', final: msg.content, run_id: runId };
    for (const c of calls) {
      charges++; // the tool runs: the card is charged, the answer never comes
      messages.push({ role: 'tool', tool_call_id: c.id, content: 'Error: the payment service timed out (504).' });
    }
  }
  return { charges, steps, ended: 'step_cap', final: null, run_id: runId };
}

// ---- the stand-in provider ----

const variants = ['{"invoice":"INV-1042","amount":49}', '{"amount":49.0,"invoice":"INV-1042"}', '{"invoice": "INV-1042", "amount": 49}'];

// What OpenAI answers 400 to: a tool call without its result, a result
// without its call. loopguard must never send either.
function invalid(msgs) {
  const open = new Set();
  for (let i = 0; i < msgs.length; i++) {
    const m = msgs[i];
    if (m.role === 'tool') {
      if (!open.delete(m.tool_call_id)) return `messages.[${i}]: a tool message must answer a tool call of the assistant's message before it`;
      continue;
    }
    if (open.size) return `messages.[${i}]: an assistant message with tool_calls must be followed by a tool message for each tool_call_id`;
    for (const c of m.tool_calls || []) open.add(c.id);
  }
  return open.size ? 'an assistant message with tool_calls must be followed by a tool message for each tool_call_id' : null;
}

let answers = 0;
function answer(req) {
  const msgs = req.messages || [];
  const offered = (req.tools || []).some((t) => t.function?.name === 'charge_card') && req.tool_choice !== 'none';
  const tried = msgs.filter((m) => m.role === 'tool').length;
  const message = offered
    ? { role: 'assistant', content: null, tool_calls: [{ id: `call_demo_${++answers}`, type: 'function', function: { name: 'charge_card', arguments: variants[tried % variants.length] } }] }
    : { role: 'assistant', content: 'I could not charge INV-1042: the payment service keeps timing out. Please try again later.' };
  const prompt = JSON.stringify(msgs).length >> 2;
  return {
    id: `chatcmpl-demo-${answers}`, object: 'chat.completion', created: Math.floor(Date.now() / 1000), model: req.model,
    choices: [{ index: 0, message: { ...message, refusal: null }, logprobs: null, finish_reason: offered ? 'tool_calls' : 'stop' }],
    usage: { prompt_tokens: prompt, completion_tokens: 20, total_tokens: prompt + 20 },
  };
}

function standIn() {
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const send = (status, body) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(body));
      };
      const refuse = (message) => send(400, { error: { message, type: 'invalid_request_error', param: null, code: null } });
      if (req.method !== 'POST' || req.url !== '/v1/chat/completions')
        return send(404, { error: { message: `Unknown request URL: ${req.method} ${req.url}`, type: 'invalid_request_error', param: null, code: 'unknown_url' } });
      let body;
      try { body = JSON.parse(Buffer.concat(chunks).toString('utf8')); } catch { return refuse('We could not parse the JSON body of your request.'); }
      if (body.stream) return refuse('this stand-in does not stream');
      const bad = invalid(body.messages || []);
      if (bad) return refuse(`Invalid parameter: ${bad}`);
      send(200, answer(body));
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

// ---- loopguard ----

function loopguardBin() {
  if (process.env.LOOPGUARD_BIN) return process.env.LOOPGUARD_BIN;
  const built = fileURLToPath(new URL('../../build/loopguard', import.meta.url));
  return existsSync(built) ? built : 'loopguard';
}

// Starts `loopguard serve` on a free port; resolves to { child, url }.
function startLoopguard(upstream) {
  const bin = loopguardBin();
  const child = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--store', 'memory:', '--upstream', upstream], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '', err = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail('it did not print its address within 10 s'), 10000);
    function fail(why) {
      clearTimeout(timer);
      child.kill('SIGKILL');
      reject(new Error(`loopguard (${bin}) did not start: ${why}${err.trim() ? `\n${err.trim()}` : ''}` +
        (bin === 'loopguard' ? '\nBuild it first (make run, or make build, in the repository), or set LOOPGUARD_BIN.' : '')));
    }
    child.on('error', (e) => fail(e.code === 'ENOENT' ? 'no such program' : e.message));
    child.on('exit', (code) => fail(`it exited with status ${code}`));
    child.stderr.on('data', (d) => { err += d; });
    child.stdout.on('data', (d) => {
      out += d;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (!m) return;
      clearTimeout(timer);
      child.removeAllListeners('exit');
      child.stdout.resume();
      resolve({ child, url: m[1] });
    });
  });
}

async function getJson(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`GET ${url}: ${r.status} ${await r.text()}`);
  return r.json();
}

// ---- the two runs ----

const provider = await standIn();
const providerUrl = `http://127.0.0.1:${provider.address().port}/v1`;
let lg;
try {
  lg = await startLoopguard(providerUrl);
} catch (e) {
  console.error(`demo.mjs: ${e.message}`);
  process.exit(1);
}
const end = () => { lg.child.kill('SIGTERM'); provider.close(); };
let direct, guarded, run;
try {
  direct = await agent(providerUrl);
  guarded = await agent(`${lg.url}/v1`);
  run = guarded.run_id ? await getJson(`${lg.url}/v1/runs/${encodeURIComponent(guarded.run_id)}`) : null;
} catch (e) {
  console.error(`demo.mjs: ${e.message}`);
  end();
  process.exit(1);
}

const trace = guarded.run_id ? `${lg.url}/v1/runs/${encodeURIComponent(guarded.run_id)}/trace` : null;
if (asJson) {
  console.log(JSON.stringify({ step_cap: cap, provider: providerUrl, gateway: `${lg.url}/v1`, direct, through_gateway: { ...guarded, status: run?.status ?? null, terminal_reason: run?.terminal_reason ?? null, trace } }));
} else {
  const times = (n) => `${n} time${n === 1 ? '' : 's'}`;
  const how = (r) => r.ended === 'step_cap' ? `the agent stopped at its own step cap (${cap} model calls)` : `the agent ended after ${r.steps} model calls with the model's final answer:\n     "${r.final}"`;
  console.log(`An agent on the openai package (step cap ${cap}); its model retries a charge that times out.\n`);
  console.log(`1. Straight to the provider: new OpenAI({ baseURL: '${providerUrl}' })`);
  console.log(`   charge_card ran ${times(direct.charges)}; ${how(direct)}\n`);
  console.log(`2. Through loopguard:        new OpenAI({ baseURL: '${lg.url}/v1' })`);
  console.log(`   charge_card ran ${times(guarded.charges)}; ${how(guarded)}`);
  if (run) {
    const c = run.counters;
    console.log(`   loopguard's run ${run.run_id} (${run.status}${run.terminal_reason ? `: ${run.terminal_reason}` : ''}): the model asked for`);
    console.log(`   ${c.calls} tool calls; loopguard held ${c.blocked} back before the agent saw ${c.blocked === 1 ? 'it' : 'them'} and asked the model again.`);
  }
}
if (!keep) {
  end();
} else {
  if (!asJson) {
    console.log(`\nStill running (Ctrl-C ends both):`);
    console.log(`  the console:    ${lg.url}/${guarded.run_id ? `#/run/${encodeURIComponent(guarded.run_id)}` : ''}`);
    if (trace) console.log(`  the run's trace: curl -s ${trace} | ${loopguardBin()} replay -`);
  }
  const stop = () => { end(); process.exit(0); };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}
