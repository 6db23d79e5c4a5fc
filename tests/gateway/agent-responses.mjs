// agent-responses.mjs — the agent loop on the real `openai` package's
// Responses API: each turn continues the last with previous_response_id
// and sends only the function_call_output items.
//   BASE_URL, MODEL, STREAM=1 (responses.stream().finalResponse()), STEP_CAP
//   FOLLOW_UP  after the final answer, the person writes this, continuing
//              from it (previous_response_id), to MODEL2 (default MODEL)
//   BASE_URLS  comma-separated: the requests go to each in turn (round-robin.mjs)
//   CUSTOM=1   write_record is a custom tool (free-text input): the model
//              calls it with custom_tool_call items, answered with
//              custom_tool_call_output items
//   BUILTIN    apply_patch, shell, computer or local_shell: the write is
//              that built-in tool's (MODEL=loop-builtin): apply_patch_call
//              items answered with a failed apply_patch_call_output,
//              shell_call items with a shell_call_output whose command
//              exited 1, local_shell_call items with a local_shell_call_output
//              whose command exited 1 (Codex's JSON text; CODEX=1: in a
//              function_call_output, as Codex answers one), computer_call
//              items (computer_use_preview) with the same screenshot (the
//              click on Save changed nothing), each counted as one of
//              write_record's executions; a computer call's pending safety
//              checks are acknowledged, and the person's first message
//              holds the screen before any action
//   SCREENS    (BUILTIN=computer) same (the default), new: each action
//              changes the screen (a page turned each time: progress),
//              toggle: two screens in turn (a menu opened and closed)
//   SILENT=1   (BUILTIN apply_patch or shell) the write succeeds without a
//              word: a completed patch with no output, a command that
//              exited 0 and printed nothing
//   IMAGE=1    the write answers with an image alone (a function_call_output
//              whose output is one input_image part)
//   STATELESS=1  no previous_response_id: each turn sends the whole
//              conversation (the answers' items and the outputs)
//   SHELL_TOOLS  (without BUILTIN) a coding agent's shell tools instead of
//              the write (coding-tools.mjs): shell, Codex's own shell tool
//              (a function named shell, each call answered with Codex's
//              text of a command that exited 2); exec, its exec_command
//              and write_stdin, a build polled until it ends
//   AZURE=1    the package's AzureOpenAI client, its endpoint BASE_URL
//              without /v1: its requests go to /openai/responses?api-version=...
import OpenAI, { AzureOpenAI } from 'openai';
import { roundRobin } from './round-robin.mjs';
import { SCREEN, nextScreenB64 } from './screens.mjs';
import { SHELL_PARAMETERS, SHELL_DESCRIPTION, shellOutput, EXEC_TOOLS, execOutput } from './coding-tools.mjs';

const client = process.env.AZURE === '1'
  ? new AzureOpenAI({ endpoint: process.env.BASE_URL.replace(/\/v1$/, ''), apiKey: 'azure-test-key', apiVersion: '2025-04-01-preview', maxRetries: 0, timeout: 20000 })
  : new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-test-client', maxRetries: 0, timeout: 20000, fetch: roundRobin() });
const model = process.env.MODEL || 'loop-write';
const cap = Number(process.env.STEP_CAP || 12);
const stream = process.env.STREAM === '1';
const custom = process.env.CUSTOM === '1', stateless = process.env.STATELESS === '1', builtin = process.env.BUILTIN;
const nextScreen = () => 'data:image/png;base64,' + nextScreenB64();
const builtinTool = builtin === 'computer' ? { type: 'computer_use_preview', display_width: 1024, display_height: 768, environment: 'browser' } : { type: builtin };
const shellTools = builtin ? null : process.env.SHELL_TOOLS;
const tools = shellTools === 'exec' ? EXEC_TOOLS.map((t) => ({ type: 'function', ...t, strict: false }))
  : shellTools === 'shell' ? [{ type: 'function', name: 'shell', description: SHELL_DESCRIPTION, parameters: SHELL_PARAMETERS, strict: false }]
  : builtin ? [builtinTool, { type: 'function', name: 'lookup', description: 'Look a customer up.', parameters: { type: 'object', properties: { customer_id: { type: 'string' } } } }] : [
  custom ? { type: 'custom', name: 'write_record', description: 'Apply a patch to the records.' }
    : { type: 'function', name: 'write_record', description: 'Write a record.', parameters: { type: 'object', properties: { record_id: { type: 'integer' }, value: { type: 'string' } } } },
  { type: 'function', name: 'lookup', description: 'Look a customer up.', parameters: { type: 'object', properties: { customer_id: { type: 'string' } } } },
];
const executions = { write_record: 0, lookup: 0 };
function runTool(name) {
  executions[name] = (executions[name] || 0) + 1;
  if (name === 'write_record') return 'Error: the storage is read-only; the record was not written.';
  if (name === 'shell') return shellOutput(executions.shell);
  if (name === 'exec_command' || name === 'write_stdin') return execOutput((executions.exec_command || 0) + (executions.write_stdin || 0));
  return JSON.stringify({ customer_id: 'c-1', name: 'Ada' });
}
let input = builtin === 'computer' ? [{ role: 'user', content: [{ type: 'input_text', text: 'Write record 7 with value A in the form.' }, { type: 'input_image', image_url: SCREEN }] }] : 'Write record 7 with value A.', prev;
const conv = typeof input === 'string' ? [{ role: 'user', content: input }] : [...input];
const seen = [];
let steps = 0, ended = 'step_cap', final = null;
while (steps < cap) {
  steps++;
  const req = stateless ? { model, input: conv, tools } : { model, input, tools, ...(prev ? { previous_response_id: prev } : {}) };
  let data;
  if (stream) {
    data = await client.responses.stream(req).finalResponse();
  } else {
    const r = await client.responses.create(req).withResponse();
    data = r.data;
    seen.push({ run: r.response.headers.get('x-loopguard-run'), action: r.response.headers.get('x-loopguard-action') });
  }
  prev = data.id;
  const calls = data.output.filter((it) => ['function_call', 'custom_tool_call', 'shell_call', 'apply_patch_call', 'computer_call', 'local_shell_call'].includes(it.type));
  if (!calls.length) { ended = 'final'; final = data.output_text ?? data.output.filter((m) => m.type === 'message').flatMap((m) => m.content).map((c) => c.text).join(''); break; }
  input = calls.map((c) => {
    if (process.env.SILENT === '1' && c.type === 'apply_patch_call') { runTool('write_record'); return { type: 'apply_patch_call_output', call_id: c.call_id, status: 'completed' }; }
    if (process.env.SILENT === '1' && c.type === 'shell_call') { runTool('write_record'); return { type: 'shell_call_output', call_id: c.call_id, output: [{ stdout: '', stderr: '', outcome: { type: 'exit', exit_code: 0 } }] }; }
    if (c.type === 'apply_patch_call') { runTool('write_record'); return { type: 'apply_patch_call_output', call_id: c.call_id, status: 'failed', output: 'Error: records/7: read-only file system' }; }
    if (c.type === 'computer_call') { runTool('write_record'); return { type: 'computer_call_output', call_id: c.call_id, output: { type: 'computer_screenshot', image_url: nextScreen() }, ...(c.pending_safety_checks && c.pending_safety_checks.length ? { acknowledged_safety_checks: c.pending_safety_checks } : {}) }; }
    if (c.type === 'local_shell_call') {
      runTool('write_record');
      const output = JSON.stringify({ output: 'write-record: read-only file system\n', metadata: { exit_code: 1, duration_seconds: 0.01 } });
      return process.env.CODEX === '1' ? { type: 'function_call_output', call_id: c.call_id, output } : { type: 'local_shell_call_output', id: 'lso_' + c.call_id, call_id: c.call_id, output };
    }
    if (c.type === 'shell_call') { runTool('write_record'); return { type: 'shell_call_output', call_id: c.call_id, output: [{ stdout: '', stderr: 'write-record: read-only file system\n', outcome: { type: 'exit', exit_code: 1 } }] }; }
    const out = runTool(c.name);
    if (c.name === 'write_record' && process.env.IMAGE === '1') return { type: 'function_call_output', call_id: c.call_id, output: [{ type: 'input_image', image_url: SCREEN }] };
    return { type: c.type + '_output', call_id: c.call_id, output: out };
  });
  conv.push(...data.output.map(({ status, ...it }) => it), ...input);
}
let follow = null;
if (process.env.FOLLOW_UP && ended === 'final') {
  try {
    const r = await client.responses.create({ model: process.env.MODEL2 || model, input: process.env.FOLLOW_UP, tools, previous_response_id: prev }).withResponse();
    follow = { run: r.response.headers.get('x-loopguard-run'), action: r.response.headers.get('x-loopguard-action'), text: r.data.output_text };
  } catch (e) {
    follow = { error: String(e && e.message || e) };
  }
}
console.log(JSON.stringify({ executions, steps, ended, final, seen, follow }));
