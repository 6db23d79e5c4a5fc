// coding-tools.mjs — coding agents' shell tools, as the gateway tests'
// agents offer and answer them.
//
// Codex's own shell tool (agent-responses.mjs, agent-openai.mjs with
// SHELL_TOOLS=shell): a function tool named `shell` whose arguments are
// the command as an argv array, answered in one of the three texts Codex
// answers a command with ($SHELL_OUTPUT):
//   json (the default)  {"output": ..., "metadata": {"exit_code": N,
//                       "duration_seconds": S}}, its structured shell output
//   freeform            "Exit code: N\nWall time: S seconds\nOutput:\n...",
//                       its freeform shell output
//   exec                "Chunk ID: X\nWall time: S seconds\nProcess exited
//                       with code N\nOriginal token count: T\nOutput:\n...",
//                       its exec_command's
//   openhands           OpenHands' words for its execute_bash instead: the
//                       output, then "[The command completed with exit code
//                       N.]" and the lines after it
// the duration (and the chunk id) differing every time, as a real
// command's do. Every command fails (make's error, exit code 2), or
// succeeds when $SHELL_EXIT is 0.
//
// With SHELL_TOOLS=exec, Codex's unified exec instead: exec_command starts
// a build that is still running when it answers ("Process running with
// session ID 7" and its first line of output), and each write_stdin (a
// poll) answers the lines printed since, until the SHELL_POLLS-th poll
// [8] answers "Process exited with code 0"; SHELL_HUNG=1: the build never
// prints again nor ends (every poll's output empty); SHELL_HUNG=clock: it
// never ends, and every poll brings a line that says only the time and a
// request's id (stalled), which is no more news than silence.
export const SHELL_PARAMETERS = {
  type: 'object',
  properties: {
    command: { type: 'array', items: { type: 'string' }, description: 'The command to execute' },
    workdir: { type: 'string', description: 'The working directory to execute the command in' },
    timeout_ms: { type: 'number', description: 'The timeout for the command in milliseconds' },
  },
  required: ['command'],
  additionalProperties: false,
};
export const SHELL_DESCRIPTION = 'Runs a shell command and returns its output.';

export function shellOutput(n) {
  const code = Number(process.env.SHELL_EXIT ?? 2), secs = (0.4 + n / 10).toFixed(1);
  const out = code ? 'make: *** [Makefile:12: test] Error 2\n' : 'All 42 tests passed.\n';
  switch (process.env.SHELL_OUTPUT || 'json') {
    case 'json': return JSON.stringify({ output: out, metadata: { exit_code: code, duration_seconds: Number(secs) } });
    case 'freeform': return `Exit code: ${code}\nWall time: ${secs} seconds\nOutput:\n${out}`;
    case 'openhands': return `${out}[The command completed with exit code ${code}.]\n[Current working directory: /repo]\n[Python interpreter: /usr/bin/python3]\n[Command finished with exit code ${code}]`;
    case 'exec': return `Chunk ID: ${(0x5a17 + n).toString(16)}\nWall time: ${secs} seconds\nProcess exited with code ${code}\nOriginal token count: 9\nOutput:\n${out}`;
    default: throw new Error('SHELL_OUTPUT: json, freeform, exec or openhands');
  }
}

export const EXEC_TOOLS = [
  { name: 'exec_command', description: 'Runs a command in a PTY, returning output or a session ID for ongoing interaction.',
    parameters: { type: 'object', properties: { cmd: { type: 'string' }, workdir: { type: 'string' }, yield_time_ms: { type: 'number' }, max_output_tokens: { type: 'number' } }, required: ['cmd'], additionalProperties: false } },
  { name: 'write_stdin', description: 'Writes characters to an existing unified exec session and returns recent output.',
    parameters: { type: 'object', properties: { session_id: { type: 'number' }, chars: { type: 'string' }, yield_time_ms: { type: 'number' } }, required: ['session_id'], additionalProperties: false } },
];

const hungs = ['1', 'clock'];
// What a hung build prints at its n-th poll (SHELL_HUNG): nothing, or a
// heartbeat whose time and request id alone change, as a log line's do
function stalled(n) {
  if (process.env.SHELL_HUNG !== 'clock') return '';
  const two = (v) => String(v).padStart(2, '0'), id = (0x4bf92f35 + n * 7919).toString(16);
  return `2026-12-07 01:${two(n)}:${two((n * 7) % 60)}.${(n * 125) % 1000} waiting for the lock on .build.lock (request ${id}-e89b-12d3-a456-4266141740${two(n)})\n`;
}

// The answer of the n-th exec_command or write_stdin call (1: the
// exec_command that starts the build)
export function execOutput(n) {
  const polls = Number(process.env.SHELL_POLLS ?? 8), hung = hungs.includes(process.env.SHELL_HUNG);
  const head = `Chunk ID: ${(0x7c00 + n).toString(16)}\nWall time: ${(n === 1 ? 10 : 30) + n / 10} seconds\n`;
  if (!hung && n > polls) return head + 'Process exited with code 0\nOriginal token count: 4\nOutput:\nBuild finished.\n';
  const out = hung && n > 1 ? stalled(n) : `[${n}/${polls + 1}] cc -c src/unit${n}.c\n`;
  return head + `Process running with session ID 7\nOriginal token count: ${out.length >> 2}\nOutput:\n${out}`;
}

// Claude Code's background shell (agent-anthropic.mjs with CLAUDE_CODE=1):
// Bash with run_in_background starts the build ("Command running in
// background with ID: b2f8b9"), and each BashOutput (a poll) answers the
// lines printed since in its XML-ish words, "<status>running</status>",
// the <stdout> block, a <timestamp> that differs every time, until the
// SHELL_POLLS-th poll [8] answers "<status>completed</status>" and
// "<exit_code>0</exit_code>" (SHELL_EXIT=N: "failed" and N); SHELL_HUNG=1:
// no new output, never done (clock: only the time, as with exec).
export const CLAUDE_TOOLS = [
  { name: 'Bash', description: 'Executes a given bash command in a persistent shell session.',
    input_schema: { type: 'object', properties: { command: { type: 'string' }, description: { type: 'string' }, timeout: { type: 'number' }, run_in_background: { type: 'boolean' } }, required: ['command'], additionalProperties: false } },
  { name: 'BashOutput', description: 'Retrieves output from a running or completed background bash shell.',
    input_schema: { type: 'object', properties: { bash_id: { type: 'string' }, filter: { type: 'string' } }, required: ['bash_id'], additionalProperties: false } },
];

// The answer of the n-th Bash or BashOutput call (1: the Bash that starts the build)
export function bashOutput(n) {
  const polls = Number(process.env.SHELL_POLLS ?? 8), hung = hungs.includes(process.env.SHELL_HUNG);
  if (n === 1) return 'Command running in background with ID: b2f8b9';
  const stamp = `<timestamp>2026-12-07T01:${String(n).padStart(2, '0')}:00.000Z</timestamp>`;
  const code = Number(process.env.SHELL_EXIT ?? 0);
  if (!hung && n > polls + 1) return `<status>${code ? 'failed' : 'completed'}</status>\n\n<exit_code>${code}</exit_code>\n\n<stdout>\nBuild ${code ? 'failed' : 'finished'}.\n</stdout>\n\n${stamp}`;
  const out = hung ? stalled(n) : `[${n}/${polls + 2}] cc -c src/unit${n}.c\n`;
  return '<status>running</status>\n\n' + (out ? `<stdout>\n${out}</stdout>\n\n` : '') + stamp;
}

// OpenHands' execute_bash (agent-openai.mjs with SHELL_TOOLS=openhands): the build started ({"command": "make -j2"}) and
// polled with an empty command, each answer the lines printed since and
// "[The command has no new output after 30 seconds. ...]" (a poll's after
// "[Below is the output of the previous command.]"), until the
// SHELL_POLLS-th poll [8] ends with "[The command completed with exit code
// 0.]"; SHELL_HUNG=1: no new output, never done (clock: only the time).
export const OPENHANDS_TOOLS = [
  { name: 'execute_bash', description: 'Execute a bash command in the terminal within a persistent shell session.',
    parameters: { type: 'object', properties: { command: { type: 'string' }, is_input: { type: 'string', enum: ['true', 'false'] }, timeout: { type: 'number' } }, required: ['command'] } },
];

// The answer of the n-th execute_bash call (1: the one that starts the build)
export function openhandsOutput(n) {
  const polls = Number(process.env.SHELL_POLLS ?? 8), hung = hungs.includes(process.env.SHELL_HUNG);
  const head = n > 1 ? '[Below is the output of the previous command.]\n' : '';
  if (!hung && n > polls) return `${head}Build finished.\n[The command completed with exit code 0.]\n[Current working directory: /repo]\n[Command finished with exit code 0]`;
  const out = hung && n > 1 ? stalled(n).trimEnd() : `[${n}/${polls + 1}] cc -c src/unit${n}.c`;
  return `${head}${out}\n[The command has no new output after 30 seconds. You may wait longer to see additional output by sending empty command '', send other commands to interact with the current process, or send keys to interrupt/kill the command.]`;
}
